"""The trained agents kvagent ships (``kvagent train`` makes them; docs/training.md).

Files: ``agent-qwen35.gguf`` (hybrid: Gated DeltaNet + attention), ``agent-llama.gguf``
(attention only), the readable frozen projector both read screenshots through
(``mmproj.gguf``), and ``recipe.json`` (the configuration, the dataset, each model's sha256,
final loss and training time). They are the only binaries in the repository.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["AGENT_DIR", "MissingAgentError", "agent_files"]

AGENT_DIR = Path(__file__).resolve().parent


class MissingAgentError(FileNotFoundError):
    """This install has no trained agent of that arch."""


def agent_files(arch: str, *, vision: bool = True) -> tuple[Path, Path | None]:
    """The shipped text model of ``arch`` and (if ``vision``) the projector."""
    model = AGENT_DIR / f"agent-{arch}.gguf"
    mmproj = AGENT_DIR / "mmproj.gguf"
    missing = [p for p in (model, mmproj if vision else None) if p is not None and not p.is_file()]
    if missing:
        raise MissingAgentError(f"the trained {arch} agent is not installed here (missing "
                                f"{', '.join(str(p) for p in missing)}); run kvagent train "
                                f"--out {AGENT_DIR} or pass --model/--mmproj")
    return model, mmproj if vision else None
