"""The layers' import rules, read from the source (nothing is imported or run).

* ``cachepolicy/engine/`` is the closed bottom layer: its modules import nothing of
  ``cachepolicy`` outside ``cachepolicy/engine/``, nor ``scheduler``, ``runtime`` or
  ``vmenv`` — at module level, inside functions or under ``TYPE_CHECKING`` alike.
* ``cachepolicy/`` has no import cycle (imports inside functions count: they only move the
  cycle to run time).
* A project import inside a function in ``cachepolicy/`` says why on its line or the line
  above (a lazy import is an exception to the layering, so it explains itself).
"""

from __future__ import annotations

import ast
import io
import tokenize
from pathlib import Path

import attrs
import pytest

ROOT = Path(__file__).resolve().parent.parent
PROJECT = ("cachepolicy", "scheduler", "runtime", "vmenv")


@attrs.frozen
class Import:
    module: str  # the importing module, dotted
    target: str  # the imported module (or module.name), dotted and absolute
    line: int
    in_function: bool


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports_of(path: Path) -> list[Import]:
    """Every import statement of a module, relative ones made absolute."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: list[Import] = []

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            inner = in_function or isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef)
            if isinstance(child, ast.Import):
                found.extend(Import(name, a.name, child.lineno, in_function)
                             for a in child.names)
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    anchor = package.split(".")[: len(package.split(".")) - child.level + 1]
                    base = ".".join(anchor + ([base] if base else []))
                found.extend(Import(name, f"{base}.{a.name}", child.lineno, in_function)
                             for a in child.names)
            visit(child, inner)

    visit(ast.parse(path.read_text(), str(path)), False)
    return found


def modules_under(package: str) -> list[Path]:
    return sorted((ROOT / package.replace(".", "/")).rglob("*.py"))


def is_within(target: str, package: str) -> bool:
    return target == package or target.startswith(package + ".")


def test_the_engine_imports_nothing_from_above() -> None:
    engine = "cachepolicy.engine"
    paths = modules_under(engine)
    assert len(paths) > 10  # the rule reads the real package
    above = [f"{module_name(p)}:{i.line} imports {i.target}"
             for p in paths for i in imports_of(p)
             if any(is_within(i.target, top) for top in PROJECT)
             and not is_within(i.target, engine)]
    assert not above, "the engine must be closed below the rest of kvagent:\n" + "\n".join(above)


def _resolve(target: str, modules: set[str]) -> str | None:
    """The module an import names (``a.b.name`` → ``a.b`` when ``name`` is not a module)."""
    while target and target not in modules:
        target = target.rpartition(".")[0]
    return target or None


def cycles(package: str) -> list[list[str]]:
    """The import cycles among ``package``'s modules (Tarjan's strongly connected components
    of more than one module)."""
    paths = {module_name(p): p for p in modules_under(package)}
    graph = {m: set() for m in paths}
    for m, path in paths.items():
        for i in imports_of(path):
            target = _resolve(i.target, set(paths))
            if target is not None and target != m:
                graph[m].add(target)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def strong(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while (w := stack.pop()) != v:
                component.append(w)
            if component:
                found.append(sorted([v, *component]))

    for v in graph:
        if v not in index:
            strong(v)
    return found


def test_cachepolicy_has_no_import_cycle() -> None:
    assert not cycles("cachepolicy")


def test_the_cycle_finder_finds_a_cycle(tmp_path: Path, monkeypatch) -> None:
    """The check above can fail: two modules importing each other (one lazily) are found."""
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from pkg.b import f\n")
    (pkg / "b.py").write_text("def f():\n    from pkg import a  # lazy\n")
    monkeypatch.setattr(f"{__name__}.ROOT", tmp_path)
    assert cycles("pkg") == [["pkg.a", "pkg.b"]]


def _comment_lines(path: Path) -> set[int]:
    tokens = tokenize.generate_tokens(io.StringIO(path.read_text()).readline)
    return {t.start[0] for t in tokens if t.type == tokenize.COMMENT}


@pytest.mark.parametrize("package", ["cachepolicy"])
def test_lazy_project_imports_say_why(package: str) -> None:
    unexplained = []
    for path in modules_under(package):
        comments = _comment_lines(path)
        for i in imports_of(path):
            if (i.in_function and any(is_within(i.target, top) for top in PROJECT)
                    and not {i.line, i.line - 1} & comments):
                unexplained.append(f"{i.module}:{i.line} imports {i.target}")
    assert not unexplained, "say why an import is inside a function:\n" + "\n".join(unexplained)
