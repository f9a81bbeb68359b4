"""The layers' import rules, read from the source (nothing is imported or run); the map of
the layers is docs/structure.md.

* ``cachepolicy/engine/`` is the closed bottom layer: its modules import nothing of
  ``cachepolicy`` outside ``cachepolicy/engine/``, nor ``scheduler``, ``runtime`` or
  ``vmenv`` — at module level, inside functions or under ``TYPE_CHECKING`` alike.
* No package has an import cycle among its modules (``cachepolicy``, ``scheduler``,
  ``runtime`` with ``runtime/serve`` and ``runtime/cluster``, ``vmenv``).  Every import
  counts — inside a function or under ``TYPE_CHECKING`` too: a lazy import only moves the
  cycle to run time.
* Nothing in ``runtime/`` imports ``runtime/commands/`` (the CLI is the top): only the CLI
  itself (``runtime.cli``) and the commands do.
* The serve domain (``runtime/serve`` outside ``runtime/serve/http``: conversations, the chat
  strategies, the episode service, the model host) imports no HTTP library and nothing of
  ``runtime/serve/http``: request parsing, bodies, streaming and the error mapping live above
  it.
* A project import inside a function says why on its line or the line above (a lazy import
  is an exception to the layering, so it explains itself) — everywhere but
  ``runtime/commands/``, where lazy imports keep ``kvagent --help`` fast.

Run as a script (``python tests/test_import_layers.py runtime/serve``) it prints the cycles
it finds.
"""

from __future__ import annotations

import ast
import io
import sys
import tokenize
from pathlib import Path

import attrs
import pytest

ROOT = Path(__file__).resolve().parent.parent
PROJECT = ("cachepolicy", "scheduler", "runtime", "vmenv")
HTTP_LIBRARIES = ("starlette", "uvicorn", "httpx", "fastapi", "aiohttp")


@attrs.frozen
class Import:
    module: str  # the importing module, dotted
    target: str  # the imported module (or module.name), dotted and absolute
    line: int
    in_function: bool


def module_name(path: Path, root: Path = ROOT) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports_of(path: Path, root: Path = ROOT) -> list[Import]:
    """Every import statement of a module, relative ones made absolute."""
    name = module_name(path, root)
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


def modules_under(package: str, root: Path = ROOT) -> list[Path]:
    return sorted((root / package.replace(".", "/")).rglob("*.py"))


def is_within(target: str, package: str) -> bool:
    return target == package or target.startswith(package + ".")


def _resolve(target: str, modules: set[str]) -> str | None:
    """The module an import names (``a.b.name`` → ``a.b`` when ``name`` is not a module)."""
    while target and target not in modules:
        target = target.rpartition(".")[0]
    return target or None


def cycles(package: str, root: Path = ROOT) -> list[list[str]]:
    """The import cycles among ``package``'s modules: Tarjan's strongly connected components
    of more than one module, each sorted."""
    paths = {module_name(p, root): p for p in modules_under(package, root)}
    graph: dict[str, set[str]] = {m: set() for m in paths}
    for m, path in paths.items():
        for i in imports_of(path, root):
            target = _resolve(i.target, set(paths))
            if target is not None and target != m:
                graph[m].add(target)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def strong(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            strong(v)
    return sorted(found)


PACKAGES = ("cachepolicy", "scheduler", "runtime", "runtime.serve", "runtime.cluster", "vmenv")


def test_the_engine_imports_nothing_from_above() -> None:
    engine = "cachepolicy.engine"
    paths = modules_under(engine)
    assert len(paths) > 10  # the rule reads the real package
    above = [f"{module_name(p)}:{i.line} imports {i.target}"
             for p in paths for i in imports_of(p)
             if any(is_within(i.target, top) for top in PROJECT)
             and not is_within(i.target, engine)]
    assert not above, "the engine must be closed below the rest of kvagent:\n" + "\n".join(above)


def test_nothing_below_the_cli_imports_the_commands() -> None:
    commands = "runtime.commands"
    below = [p for p in modules_under("runtime")
             if not is_within(module_name(p), commands) and module_name(p) != "runtime.cli"]
    assert len(below) > 40
    upward = [f"{module_name(p)}:{i.line} imports {i.target}"
              for p in below for i in imports_of(p) if is_within(i.target, commands)]
    assert not upward, "runtime/commands is the top layer:\n" + "\n".join(upward)


@pytest.mark.parametrize("package", PACKAGES)
def test_no_import_cycle(package: str) -> None:
    assert len(modules_under(package)) > 5  # the rule reads the real package
    assert not cycles(package), f"{package} has import cycles: {cycles(package)}"


def test_the_cycle_finder_finds_a_cycle(tmp_path: Path) -> None:
    """The check above can fail: modules importing each other (one lazily) are found."""
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from pkg.b import f\n")
    (pkg / "b.py").write_text("def f():\n    from pkg import c  # lazy\n")
    (pkg / "c.py").write_text("from . import a\n")
    (pkg / "d.py").write_text("import pkg.a\n")  # imports into the cycle, not part of it
    assert cycles("pkg", tmp_path) == [["pkg.a", "pkg.b", "pkg.c"]]


def test_the_serve_domain_imports_no_http() -> None:
    """Conversations, the chat strategies, the episode service and the model host know
    nothing of HTTP: no web library, nothing of ``runtime.serve.http``."""
    domain = [p for p in modules_under("runtime.serve")
              if not is_within(module_name(p), "runtime.serve.http")]
    assert len(domain) > 5
    offending = [f"{module_name(p)}:{i.line} imports {i.target}"
                 for p in domain for i in imports_of(p)
                 if any(is_within(i.target, lib) for lib in HTTP_LIBRARIES)
                 or is_within(i.target, "runtime.serve.http")]
    assert not offending, "HTTP belongs above the serve domain:\n" + "\n".join(offending)


def _comment_lines(path: Path) -> set[int]:
    tokens = tokenize.generate_tokens(io.StringIO(path.read_text()).readline)
    return {t.start[0] for t in tokens if t.type == tokenize.COMMENT}


@pytest.mark.parametrize("package", ("cachepolicy", "scheduler", "runtime", "vmenv"))
def test_lazy_project_imports_say_why(package: str) -> None:
    unexplained = []
    for path in modules_under(package):
        if is_within(module_name(path), "runtime.commands"):
            continue
        comments = _comment_lines(path)
        for i in imports_of(path):
            if (i.in_function and any(is_within(i.target, top) for top in PROJECT)
                    and not {i.line, i.line - 1} & comments):
                unexplained.append(f"{i.module}:{i.line} imports {i.target}")
    assert not unexplained, "say why an import is inside a function:\n" + "\n".join(unexplained)


if __name__ == "__main__":
    for name in sys.argv[1:] or list(PACKAGES):
        name = name.strip("/").replace("/", ".")
        print(f"{name}: {cycles(name) or 'no cycle'}")
