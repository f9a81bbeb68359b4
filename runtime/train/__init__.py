"""The trainer core: kvagent's text models in JAX, provably llama.cpp's, and their GGUF files.

What a training pipeline uses (each name is documented where it is defined):

* model — ``forward(params, spec, rows, options) -> logits`` for the forge's ``llama`` and
  ``qwen35`` (``TextSpec``); ``Rows`` (token ids or embedding vectors, positions, validity);
  ``ForwardOptions`` (``Numerics``, the delta-net recurrence, remat).
* parameters — ``init_params(spec, seed)`` (the forge's own random init), ``load_gguf(path)``
  → ``LoadedModel(spec, vocab, params)``, ``export_gguf(path, spec, params, vocab=, quant=)``
  (through the forge's writer: the engine loads it like any forged model).
* data — ``TextPiece`` / ``ImagePiece`` segments → ``build_example(engine, pieces)`` →
  ``Example``; ``collate(examples, n_rows)`` → padded ``Batch``; ``image_rows`` (an image's
  embedding rows and M-RoPE positions from the engine's frozen vision encoder).
* training — ``loss_fn`` (masked next-token cross-entropy), ``AdamW``, ``init_state``,
  ``make_train_step`` (jitted).
* proof — ``compare(model_path, mmproj_path, pieces) -> ParityReport``: llama.cpp's logits vs
  the JAX forward's, row by row.
* simdesk data (docs/training-data.md) — ``PromptBuilder(factory, agent_config, screen)``
  → ``StepExample`` (a step's prompt as the runtime prefills it under the config's policy and
  window, then the target); ``DatasetConfig`` / ``generate(engine, config, out)`` (shards of
  expert demonstrations with recovery, every shipped layout, K = 1..5) and ``shards(out)``
  (``Shard.pieces(e)`` for ``build_example``, ``Shard.encoded(i)`` for the engine's cache).

Only ``cachepolicy.engine`` touches llama.cpp; this package uses the ``Engine`` API.
"""

from runtime.train.dataset import DatasetConfig, generate, shards
from runtime.train.example import (
    Batch, Example, ImagePiece, Piece, TextPiece, bucket_for, build_example, collate, to_rows,
)
from runtime.train.gguf_io import ExportedModel, LoadedModel, export_gguf, load_gguf
from runtime.train.loss import loss_fn, token_losses
from runtime.train.model import ForwardOptions, Rows, forward, hidden_states, jit_forward, project
from runtime.train.numerics import Numerics
from runtime.train.optim import AdamW, TrainState, init_state, make_eval_step, make_train_step
from runtime.train.params import check_params, count_params, init_params, param_shapes
from runtime.train.parity import ParityReport, compare, compare_with_engine
from runtime.train.prompts import PastStep, PromptBuilder, StepExample
from runtime.train.vision import ImageRows, image_rows

__all__ = [
    "AdamW", "Batch", "DatasetConfig", "Example", "ExportedModel", "ForwardOptions",
    "ImagePiece", "ImageRows", "LoadedModel", "Numerics", "ParityReport", "PastStep", "Piece",
    "PromptBuilder", "Rows", "StepExample", "TextPiece", "TrainState", "bucket_for",
    "build_example", "check_params", "collate", "compare", "compare_with_engine",
    "count_params", "export_gguf", "forward", "generate", "hidden_states", "image_rows",
    "init_params", "init_state", "jit_forward", "load_gguf", "loss_fn", "make_eval_step",
    "make_train_step", "param_shapes", "project", "shards", "to_rows", "token_losses",
]
