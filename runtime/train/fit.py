"""Training one agent on a generated dataset: shards in, a GGUF text model out.

``fit(model, data, config)`` walks the dataset's examples in a seeded order (every example once
per epoch), one sequence per update (no padding wasted: sequences are padded only up to their
row bucket, one compilation per bucket), with AdamW on response tokens only, and returns the
trained parameters. Image rows come from the dataset's stored encodings (``StoredImages``): the
bits llama.cpp's encoder produced when the dataset was written, so training never runs the
vision encoder and never needs an engine.

Deterministic: the same dataset, config and initial parameters give the same parameters (XLA's
CPU kernels are deterministic for a fixed program; the order comes from ``config.seed``).
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path

import attrs
import numpy as np
import structlog

from cachepolicy.engine.images import EncodedImage
from cachepolicy.forge import TextSpec
from runtime.train.dataset import load_manifest, shards
from runtime.train.example import Example, build_example, bucket_for, collate
from runtime.train.grounding import Grounding, query_targets
from runtime.train.model import ForwardOptions, Params
from runtime.train.optim import AdamW, init_state, make_eval_step, make_train_step
from runtime.train.shards import Shard

__all__ = ["FitConfig", "FitReport", "StoredImages", "fit", "row_buckets"]

log = structlog.get_logger("kvagent.train")

BUCKET = 256  # sequences are padded to a multiple of this many rows

def row_buckets(longest: int) -> tuple[int, ...]:
    """Multiples of ``BUCKET`` up to one that holds ``longest`` rows."""
    return tuple(range(BUCKET, longest + BUCKET, BUCKET))

@attrs.frozen
class FitConfig:
    """How long and how hard to train (the defaults: the shipped agents' base training but for
    its draw groups, ``recipe_config.CLICK_WEIGHTS``, which ``RecipeConfig.fit`` adds)."""

    #: 4000 (seventeenth session; 3000 and 2500 before): held out on 210 instances the hybrid
    #: 185 against 171 and 168, the llama agent 174 against 165 and 145; one model's training
    #: then takes 25 (hybrid) to 30 (llama) minutes on one core (docs/training.md)
    steps: int = attrs.field(default=4000, validator=attrs.validators.ge(1))
    learning_rate: float = 3e-4  # the designed lookup survives it (docs/training.md)
    warmup_steps: int = 100
    min_lr_ratio: float = 0.05
    weight_decay: float = 0.01
    seed: int = 0
    log_every: int = 50
    checkpoint_every: int = 1000
    #: (kind, weight) pairs: a kind's share of updates against 1 for each kind not named
    #: (empty: equal shares, the order the base agents were trained in)
    kind_weights: tuple[tuple[str, float], ...] = ()
    #: (``CLASS`` or ``KIND/CLASS``, weight) pairs: the examples whose click's lookup names
    #: that class (``dataset`` meta ``clicked``; ``marked``: marked-launch's look-back click),
    #: of that kind if named, drawn as a group of their own with that weight, apart from their
    #: kind's — a step a hundred examples teach gets updates of its own instead of a fifth of
    #: its kind's, and the step it must be told from (``marked-launch/notes.save``: the Save
    #: before it, the same instruction and screens) as many (empty: the kinds alone)
    clicked_weights: tuple[tuple[str, float], ...] = ()

@attrs.frozen
class FitReport:
    """What a run did: updates, examples seen, the loss / token accuracy of the last
    ``log_every`` updates, seconds of wall and CPU time."""

    steps: int
    examples: int
    loss: float
    accuracy: float
    wall_seconds: float
    cpu_seconds: float

class StoredImages:
    """The dataset's stored encodings as ``build_example``'s image source (by pixel digest)."""

    def __init__(self, loaded: Sequence[Shard], *, uses_mrope: bool, n_embd: int) -> None:
        self._by_digest: dict[bytes, tuple[Shard, int]] = {}
        for shard in loaded:
            for i in range(shard.n_images):
                self._by_digest[hashlib.sha1(shard.png(i)).digest()] = (shard, i)
        self._uses_mrope, self._n_embd = uses_mrope, n_embd

    @property
    def uses_mrope(self) -> bool:
        return self._uses_mrope

    @property
    def n_embd(self) -> int:
        return self._n_embd

    def encode_image(self, png: bytes) -> EncodedImage:
        """The stored encoding of ``png`` (KeyError: not in the dataset), placed as this
        model places image rows: a dataset written with an M-RoPE model serves a model
        without it with the same embeddings on a line (``on_a_line``)."""
        shard, i = self._by_digest[hashlib.sha1(png).digest()]
        enc = shard.encoded(i)
        return enc if self._uses_mrope else on_a_line(enc)


def on_a_line(enc: EncodedImage) -> EncodedImage:
    """``enc`` as mtmd places an image for a text model without M-RoPE: row ``r`` at
    ``start + r``, the image advancing the position by its row count (the embeddings do not
    depend on the text model: the projector alone makes them)."""
    if enc.positions0.shape[0] == 1:
        return enc
    n = enc.n_tokens
    return attrs.evolve(enc, positions0=np.arange(n, dtype=np.int32)[None, :],
                        pos_step=np.ones(1, dtype=np.int32), n_pos=n)

def _groups(index: Sequence[tuple[Shard, int]], kinds: Sequence[str],
            clicked_weights: Sequence[tuple[str, float]]) -> list[int]:
    """Each example's draw group: its kind's index, or ``len(kinds) + j`` for the first j-th
    entry of ``clicked_weights`` it matches — ``CLASS``: its click names CLASS; ``KIND/CLASS``:
    and it is an example of KIND.  ValueError if an entry matches no example (a misspelt class
    would otherwise weigh nothing, silently)."""
    keys = [(k.split("/", 1) if "/" in k else (None, k)) for k, _ in clicked_weights]
    groups = []
    for s, e in index:
        meta = s.meta(e)
        kind, clicked = kinds[int(meta["kind"])], str(meta["clicked"])
        groups.append(next((len(kinds) + j for j, (want_kind, want_class) in enumerate(keys)
                            if want_class == clicked and want_kind in (None, kind)),
                           int(meta["kind"])))
    absent = [k for j, (k, _) in enumerate(clicked_weights) if len(kinds) + j not in groups]
    if absent:
        raise ValueError(f"clicked_weights names {absent}: no example of the dataset matches")
    return groups

def _order(kinds: Sequence[int], seed: int,
           weights: Mapping[int, float] | None = None) -> Iterator[int]:
    """Example indices (``kinds[i]``: example i's task kind), the kind drawn at each update —
    uniformly, or in proportion to ``weights`` (1 for a kind not in it) —, then that kind's
    next example (each kind's examples once per its own epoch, reshuffled): without weights
    every kind gets the same share of updates however many steps its episodes have (a
    one-step kind has a sixth of a six-step kind's examples)."""
    rng = np.random.default_rng(seed)
    groups = {k: np.flatnonzero(np.asarray(kinds) == k) for k in sorted(set(kinds))}
    streams = {k: iter(()) for k in groups}
    labels = list(groups)
    share = None
    if weights:  # the uniform draw below stays as it was: the base agents' order
        w = np.array([weights.get(k, 1.0) for k in labels], np.float64)
        share = w / w.sum()
    while True:
        k = labels[int(rng.integers(len(labels)) if share is None
                       else rng.choice(len(labels), p=share))]
        nxt = next(streams[k], None)
        if nxt is None:
            streams[k] = iter(rng.permutation(groups[k]).tolist())
            nxt = next(streams[k])
        yield int(nxt)

def fit(spec: TextSpec, params: Params, data: Path, config: FitConfig = FitConfig(), *,
        progress: Callable[[str], None] | None = None,
        checkpoint: Callable[[int, Params], None] | None = None,
        options: ForwardOptions = ForwardOptions(),
        grounding: Grounding | None = None,
        frozen: Mapping[str, np.ndarray] | None = None) -> tuple[Params, FitReport]:
    """Train ``params`` (a ``spec`` model) on the dataset in ``data``; returns the trained
    parameters and a report.  ``checkpoint(step, params)`` is called every
    ``config.checkpoint_every`` updates (not at the end).  ``grounding``: add its query
    scaffold to the loss (``grounding.query_targets``, from each example's clicked class).
    ``frozen``: masks of the entries training keeps exactly (the designed slices,
    ``optim.apply_updates``).  ValueError if the dataset was made for another width."""
    manifest = load_manifest(data)
    if manifest["model"]["n_embd"] != spec.n_embd or manifest["model"]["n_vocab"] != spec.n_vocab:
        raise ValueError(f"{data} was generated with a model of width "
                         f"{manifest['model']['n_embd']} and vocabulary "
                         f"{manifest['model']['n_vocab']}; this model has {spec.n_embd} / "
                         f"{spec.n_vocab}: generate the dataset with this model")
    loaded = list(shards(data))
    images = StoredImages(loaded, uses_mrope=spec.is_hybrid, n_embd=spec.n_embd)
    index = [(shard, e) for shard in loaded for e in range(len(shard))]
    buckets = row_buckets(max(int(s.meta(e)["rows"]) for s, e in index))
    opt = AdamW(learning_rate=config.learning_rate, warmup_steps=config.warmup_steps,
                decay_steps=max(1, config.steps - config.warmup_steps),
                min_lr_ratio=config.min_lr_ratio, weight_decay=config.weight_decay)
    step = make_train_step(spec, opt, options, frozen)
    state = init_state(params)
    names = list(manifest["config"]["kinds"])
    unknown = [k for k, _ in config.kind_weights if k not in names]
    if unknown:
        raise ValueError(f"kind_weights names {unknown}, not kinds of {data}: {names}")
    order = _order(_groups(index, names, config.clicked_weights), config.seed,
                   {names.index(k): w for k, w in config.kind_weights}
                   | {len(names) + j: w for j, (_, w) in enumerate(config.clicked_weights)})
    t0, c0 = time.perf_counter(), time.process_time()
    window: list[tuple[float, float]] = []
    report_loss = report_acc = float("nan")
    for i in range(config.steps):
        shard, e = index[next(order)]
        example = build_example(images, shard.pieces(e))
        scaffold = None if grounding is None else [query_targets(
            example.targets, example.loss_mask, str(shard.meta(e)["clicked"]), grounding)]
        state, metrics = step(state, collate([example], bucket_for(example.n_rows, buckets),
                                             scaffold))
        window.append((float(metrics["loss"]), float(metrics["accuracy"]),
                       float(metrics["scaffold"])))
        if checkpoint is not None and (i + 1) % config.checkpoint_every == 0 \
                and i + 1 < config.steps:
            checkpoint(i + 1, state.params)
        if len(window) == config.log_every or i == config.steps - 1:
            report_loss = float(np.mean([w[0] for w in window]))
            report_acc = float(np.mean([w[1] for w in window]))
            report_scaffold = float(np.mean([w[2] for w in window]))
            window.clear()
            elapsed = time.perf_counter() - t0
            log.info("train_progress", step=i + 1, steps=config.steps, loss=round(report_loss, 4),
                     accuracy=round(report_acc, 3), scaffold=round(report_scaffold, 4),
                     seconds=round(elapsed, 1))
            if progress is not None:
                eta = elapsed / (i + 1) * (config.steps - i - 1)
                extra = "" if grounding is None else f", query scaffold {report_scaffold:.3f}"
                progress(f"step {i + 1}/{config.steps}: loss {report_loss:.3f}, token accuracy "
                         f"{report_acc:.3f}{extra}, {elapsed:.0f} s, about {eta:.0f} s left")
    report = FitReport(steps=config.steps, examples=len(index), loss=report_loss,
                       accuracy=report_acc, wall_seconds=time.perf_counter() - t0,
                       cpu_seconds=time.process_time() - c0)
    return state.params, report

def evaluate(spec: TextSpec, params: Params, data: Path, *, limit: int | None = None,
             options: ForwardOptions = ForwardOptions()) -> dict[str, float]:
    """Mean response-token loss and accuracy, and the share of examples whose every response
    token is the argmax (teacher-forced exact match), over ``data``'s first ``limit`` examples."""
    loaded = list(shards(data))
    images = StoredImages(loaded, uses_mrope=spec.is_hybrid, n_embd=spec.n_embd)
    index = [(shard, e) for shard in loaded for e in range(len(shard))][:limit]
    buckets = row_buckets(max(int(s.meta(e)["rows"]) for s, e in index))
    evaluate_step = make_eval_step(spec, options)
    losses, accs, exact = [], [], []
    for shard, e in index:
        example: Example = build_example(images, shard.pieces(e))
        m = evaluate_step(params, collate([example], bucket_for(example.n_rows, buckets)))
        losses.append(float(m["loss"]))
        accs.append(float(m["accuracy"]))
        exact.append(float(m["accuracy"]) == 1.0)
    return {"examples": len(index), "loss": float(np.mean(losses)),
            "accuracy": float(np.mean(accs)), "exact": float(np.mean(exact))}
