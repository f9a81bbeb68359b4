"""The examples use kvagent as a library: none imports the command line (``runtime.commands``,
``runtime.cli``) — what an example needs lives below it.  Read from the source, nothing run;
an example may still *run* the CLI as a user would (``python -m runtime.cli serve``)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CLI = ("runtime.commands", "runtime.cli")


def _names(node: ast.AST) -> list[str]:
    """The modules (and module.name pairs) an import statement names, dotted."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    if isinstance(node, ast.ImportFrom) and not node.level and node.module:
        return [node.module] + [f"{node.module}.{a.name}" for a in node.names]
    return []


def cli_imports(root: Path) -> list[str]:
    """``path:line imports name`` for every import of the CLI layer under ``root`` (at module
    level, inside functions and under ``TYPE_CHECKING`` alike)."""
    found = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            for name in _names(node):
                if any(name == cli or name.startswith(cli + ".") for cli in CLI):
                    found.append(f"{path.relative_to(root)}:{node.lineno} imports {name}")
                    break
    return found


def test_no_example_imports_the_cli() -> None:
    examples = ROOT / "examples"
    assert len(list(examples.rglob("*.py"))) >= 5  # the rule reads the real examples
    offending = cli_imports(examples)
    assert not offending, "examples must not import the CLI layer:\n" + "\n".join(offending)


def test_the_check_can_fail(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    (tmp_path / "a.py").write_text("from runtime.commands.options import bench_agent_defaults\n")
    (tmp_path / "sub" / "b.py").write_text("def main():\n    import runtime.cli\n")
    (tmp_path / "c.py").write_text("from runtime import cli\n"
                                   "from runtime.bench.agent_defaults import x\n"
                                   "import runtime.clinic\n")  # only the first is the CLI
    assert cli_imports(tmp_path) == [
        "a.py:1 imports runtime.commands.options",
        "c.py:1 imports runtime.cli",
        "sub/b.py:2 imports runtime.cli",
    ]
