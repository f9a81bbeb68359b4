"""The engine is closed as an object, as ``tests/test_import_layers.py`` closes it for
imports: read from the source (nothing imported or run), in every module of ``runtime/``,
``scheduler/``, ``vmenv/``, ``cachepolicy/`` outside ``cachepolicy/engine/``, and
``examples/``:

* nothing reaches the engine's parts — no attribute ``batcher``, ``decoder`` or
  ``image_cache`` (nor their private spellings, nor by ``getattr``) on anything: what callers
  need is a method of ``Engine`` (``decode_stats``, ``decode_lanes``, ``generating``,
  ``raw_decode``, ``yield_decode_round``, ``image_cache_stats``, ``clear_image_cache``,
  ``set_image_cache_bytes``, ``shrink_image_cache``);
* exactly one ``Engine(...)`` construction: ``load_engine`` in ``runtime/engine_setup.py``,
  the one engine home (run, serve, bench and the trainer load through it).

Run as a script (``python tests/test_engine_closed.py [ROOT]``) it prints what it finds in
another checkout.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCANNED = ("runtime", "scheduler", "vmenv", "cachepolicy", "examples")
ENGINE_PACKAGE = Path("cachepolicy", "engine")
PARTS = frozenset({"batcher", "decoder", "image_cache"})
HOME = Path("runtime", "engine_setup.py")


def modules(root: Path = ROOT) -> Iterator[Path]:
    """Every module of the scanned trees outside the engine package, relative to ``root``."""
    for top in SCANNED:
        for path in sorted((root / top).rglob("*.py")):
            rel = path.relative_to(root)
            if rel.parts[:2] != ENGINE_PACKAGE.parts:
                yield rel


def _dotted_root(node: ast.expr) -> str | None:
    while isinstance(node, ast.Attribute):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


def reaches(root: Path = ROOT) -> list[str]:
    """``path:line: .name`` for every reach into the engine's parts."""
    found: list[tuple[str, int, str]] = []
    for rel in modules(root):
        tree = ast.parse((root / rel).read_text(), str(rel))
        for node in ast.walk(tree):
            name = None
            if isinstance(node, ast.Attribute) and node.attr.lstrip("_") in PARTS:
                # ``cachepolicy.engine.decoder`` as a dotted module path is an import's
                # business (test_import_layers), not a reach into an object
                if _dotted_root(node) != "cachepolicy":
                    name = node.attr
            elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                  and node.func.id in ("getattr", "setattr", "hasattr") and len(node.args) > 1
                  and isinstance(node.args[1], ast.Constant)
                  and str(node.args[1].value).lstrip("_") in PARTS):
                name = f"{node.func.id}(..., {node.args[1].value!r})"
            if name is not None:
                found.append((str(rel), node.lineno, name))
    return [f"{path}:{line}: .{name}" for path, line, name in sorted(found)]


def constructions(root: Path = ROOT) -> list[str]:
    """``path:line`` of every ``Engine(...)`` call (also ``engine.Engine(...)``)."""
    found: list[str] = []
    for rel in modules(root):
        tree = ast.parse((root / rel).read_text(), str(rel))
        for node in ast.walk(tree):
            if isinstance(node, ast.Call):
                func = node.func
                name = func.id if isinstance(func, ast.Name) else (
                    func.attr if isinstance(func, ast.Attribute) else None)
                if name == "Engine":
                    found.append(f"{rel}:{node.lineno}")
    return found


def test_nothing_outside_the_engine_reaches_its_parts() -> None:
    assert reaches() == []


def test_one_engine_construction_outside_the_engine_package() -> None:
    found = constructions()
    assert len(found) == 1 and found[0].startswith(f"{HOME}:"), found


def test_the_rules_see_a_reach_and_a_construction(tmp_path: Path) -> None:
    """The scan finds what it forbids (a rule that finds nothing could be blind)."""
    (tmp_path / "scheduler").mkdir()
    (tmp_path / "scheduler" / "bad.py").write_text(
        "import cachepolicy.engine.decoder\n"
        "from cachepolicy.engine import Engine\n"
        "def f(engine, sched):\n"
        "    engine.batcher.yield_round()\n"
        "    sched.image_cache.snapshot()\n"
        "    getattr(engine, '_decoder')\n"
        "    return Engine('m.gguf'), cachepolicy.engine.decoder.Decoder\n")
    assert reaches(tmp_path) == ["scheduler/bad.py:4: .batcher",
                                 "scheduler/bad.py:5: .image_cache",
                                 "scheduler/bad.py:6: .getattr(..., '_decoder')"]
    assert constructions(tmp_path) == ["scheduler/bad.py:7"]


def test_the_engine_has_no_public_parts(engines) -> None:
    """The object itself: its parts are private, so a new caller finds only methods."""
    engine = engines("llama")
    assert not PARTS & set(dir(engine))
    stats = engine.image_cache_stats()
    assert stats.nbytes == stats.entry_bytes <= stats.max_bytes
    lanes = engine.decode_lanes()
    assert lanes == tuple(range(lanes[0], lanes[0] + len(lanes)))  # consecutive ids
    assert 1 <= engine.decode_shape.lanes <= len(lanes)


if __name__ == "__main__":
    where = Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT
    for line in reaches(where):
        print(line)
    print("Engine( constructions:", *constructions(where), sep="\n  ")
