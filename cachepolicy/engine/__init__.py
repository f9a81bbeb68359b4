"""The llama.cpp engine: the only code in kvagent that imports ``llama_cpp``.

Numerical contract (see ../shared/notes/llama-cpp.md, and ``kvagent check-exact``):
* flash attention is OFF and n_ubatch == n_batch, so splitting a prefill into several calls
  gives bitwise the same logits as one call;
* no prefill ever sends a 1-token batch when it has more than one token (a 1-token batch takes
  another kernel); a 1-token prefill call is refused unless explicitly allowed;
* each sequence has its own KV stream (``kv_unified=False``), so a sequence's KV cells sit at
  the same indices whether it was prefilled from scratch or restored from a checkpoint;
* edits that llama.cpp would accept but that silently corrupt a recurrent state (a middle-range
  removal, a tail trim without a recurrent checkpoint) are refused with ``UnsafeEditError``.

Every public method takes the engine's lock: one llama context is not thread-safe.  The class
is synchronous; the scheduler runs its calls in worker threads (``anyio.to_thread``).
"""

from cachepolicy.engine.core import Engine
from cachepolicy.engine.records import EngineConfig, MemoryReport, SeqInfo, chunk_sizes
from cachepolicy.engine.sampler import Sampler

__all__ = ["Engine", "EngineConfig", "MemoryReport", "Sampler", "SeqInfo", "chunk_sizes"]
