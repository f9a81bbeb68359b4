"""Train a tiny GUI agent in JAX, ship it as GGUF, and let llama.cpp act on it.

The whole loop of ``runtime.train`` on a toy task: two screenshots (a red and a blue
screen), the same instruction, a different action for each — so the model has to read the
image rows to answer.  A custom-sized qwen35 model with extra vocabulary pieces
(``pyautogui.click(``) is initialised with the forge's random init, trained with AdamW on
response tokens only, exported through the forge's writer, checked against llama.cpp with
the parity check, and finally decoded greedily by kvagent's Engine on both screenshots.

    python examples/train_tiny.py            # ~1-2 min on 2 cores
"""

from __future__ import annotations

import io
import tempfile
import time
from pathlib import Path

from PIL import Image

from cachepolicy.engine import Engine, EngineConfig
from runtime.engine_setup import ModelFiles, load_engine
from cachepolicy.forge import TextSpec
from cachepolicy.forge.tokenizer import build_vocab
from runtime.train import (
    AdamW, ImagePiece, TextPiece, build_example, collate, compare_with_engine, count_params,
    export_gguf, init_params, init_state, load_gguf, make_train_step,
)
from runtime.train.gguf_io import write_mmproj_for

SPEC = TextSpec(arch="qwen35", size="toy", n_vocab=640, n_embd=128, n_layer=4, n_head=2,
                n_head_kv=1, head_dim=64, n_ff=256, full_attention_interval=2, ssm_state=32,
                ssm_groups=1, ssm_v_heads=2)
EXTRA_PIECES = ("pyautogui.click(",)
TASKS = {(200, 40, 40): "pyautogui.click(12, 34)", (40, 40, 200): "pyautogui.click(56, 78)"}
CONFIG = EngineConfig(n_ctx_per_seq=1024, n_seq_max=1, n_threads=2, decode_rows=1)


def screen(rgb: tuple[int, int, int]) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (128, 96), rgb).save(out, format="PNG")
    return out.getvalue()


HEAD = "<|im_start|>user\nclick the button on this screen:"
TAIL = "<|im_end|>\n<|im_start|>assistant\n"


def prompt(engine: Engine, png: bytes) -> list[TextPiece | ImagePiece]:
    """One user turn with the screenshot, then the assistant's turn opens."""
    return [TextPiece(engine.tokenize(HEAD)), ImagePiece(png), TextPiece(engine.tokenize(TAIL))]


def greedy(engine: Engine, png: bytes, n: int) -> str:
    """What llama.cpp answers: prefill the prompt as the runtime does, decode greedily."""
    enc = engine.encode_image(png)
    engine.prefill_tokens(0, [*engine.tokenize(HEAD), *enc.prefix_tokens], logits=False)
    engine.prefill_image(0, enc)
    logits = engine.prefill_tokens(0, [*enc.suffix_tokens, *engine.tokenize(TAIL)])
    assert logits is not None
    tokens = engine.generate(0, logits, n)
    engine.clear(0)
    return engine.detokenize(tokens, special=False)


def main() -> None:
    work = Path(tempfile.mkdtemp(prefix="kvagent-train-"))
    vocab = build_vocab(SPEC.n_vocab, EXTRA_PIECES)
    params = init_params(SPEC, seed=0)
    init_path = export_gguf(work / "init.gguf", SPEC, params, vocab=vocab).path
    mmproj = write_mmproj_for(SPEC, work / "mmproj.gguf")  # frozen, random, 128 wide
    print(f"model: {count_params(params)} params; files in {work}")

    with load_engine(ModelFiles(init_path, mmproj), CONFIG) as engine:  # the data pipeline's view of the model
        examples = []
        for rgb, answer in TASKS.items():
            pieces = prompt(engine, screen(rgb))
            response = TextPiece(engine.tokenize(answer + "<|im_end|>"), train=True)
            examples.append(build_example(engine, [*pieces, response]))
    print("rows per example:", [ex.n_rows for ex in examples],
          "trained tokens:", [ex.n_train_tokens for ex in examples])

    batch = collate(examples, 64)  # one bucket of 64 rows
    step = make_train_step(SPEC, AdamW(learning_rate=3e-3, warmup_steps=10))
    state = init_state(params)
    t0 = time.perf_counter()
    for i in range(120):
        state, metrics = step(state, batch)
        if i % 40 == 0 or i == 119:
            print(f"step {i:3d} loss {float(metrics['loss']):.4f} "
                  f"acc {float(metrics['accuracy']):.2f} ({time.perf_counter() - t0:.1f} s)")

    trained = export_gguf(work / "trained.gguf", SPEC, state.params, vocab=vocab)
    print(f"exported {trained.path} ({trained.n_bytes} bytes, sha256 {trained.sha256[:12]})")
    with load_engine(ModelFiles(trained.path, mmproj), CONFIG) as engine:
        loaded = load_gguf(trained.path)
        report = compare_with_engine(engine, SPEC, loaded.params,
                                     prompt(engine, screen((200, 40, 40))))
        print("parity:", report.summary())
        for rgb, answer in TASKS.items():
            said = greedy(engine, screen(rgb), 12)
            print(f"screen {rgb}: llama.cpp says {said!r} (trained: {answer!r})")


if __name__ == "__main__":
    main()
