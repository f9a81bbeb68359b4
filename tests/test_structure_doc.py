"""docs/structure.md lists every module of the four packages, one line each, and nothing
that is gone: the map of the modules stays true."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("cachepolicy", "scheduler", "runtime", "vmenv")
LINE = re.compile(r"^- `([\w/.]+\.py)` — \S")


def listed() -> list[str]:
    text = (ROOT / "docs" / "structure.md").read_text(encoding="utf-8")
    return [m[1] for line in text.splitlines() if (m := LINE.match(line))]


def modules() -> set[str]:
    return {p.relative_to(ROOT).as_posix() for pkg in PACKAGES
            for p in (ROOT / pkg).rglob("*.py")}


def test_every_module_has_its_line_and_every_line_a_module() -> None:
    lines, present = listed(), modules()
    assert len(present) > 150  # the check reads the real tree
    assert len(lines) == len(set(lines)), "a module is listed twice"
    missing = sorted(present - set(lines))
    gone = sorted(set(lines) - present)
    assert not missing, "add a line to docs/structure.md for:\n" + "\n".join(missing)
    assert not gone, "docs/structure.md lists modules that are gone:\n" + "\n".join(gone)


def test_the_check_can_fail(tmp_path: Path, monkeypatch) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "structure.md").write_text("- `runtime/a.py` — one.\n")
    (tmp_path / "runtime").mkdir()
    for name in ("a.py", "b.py"):
        (tmp_path / "runtime" / name).write_text("")
    monkeypatch.setattr(f"{__name__}.ROOT", tmp_path)
    assert listed() == ["runtime/a.py"]
    assert modules() - set(listed()) == {"runtime/b.py"}
