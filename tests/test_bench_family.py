"""The benches as one family (``runtime.bench.family``, ``runtime/commands/bench.py``):
``kvagent bench NAME`` and every older spelling reach the same ``Bench``; every ``kvagent
bench…`` line in the docs still parses; the one model/mmproj check.  Parsing only: the
benches themselves run in tests/test_bench*.py."""

from __future__ import annotations

import argparse
import re
import shlex
from pathlib import Path

import pytest

from runtime.bench.family import Bench, BenchFamily, FamilyParser, UnknownBenchError
from runtime.cli import build_parser, main
from runtime.commands.bench import FAMILY
from runtime.engine_setup import ModelChoiceError, check_model_choice

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
#: a usage synopsis, not a command line: optional parts, elisions, alternatives, placeholders
SYNOPSIS = re.compile(r"[\[\]…<>|]|(?<![\w/.-])(N|B|F|WxH|KIND|R|NAME)(?![\w/.-])")


def doc_command_lines() -> list[tuple[str, str]]:
    """(where, command line) of every ``kvagent bench…`` in the docs: in fenced code blocks
    (continuation lines joined, comments dropped) and in inline code."""
    found = []
    for path in DOCS:
        text = path.read_text()
        blocks = re.findall(r"^```[^\n]*\n(.*?)^```", text, flags=re.S | re.M)
        for block in blocks:
            for line in block.replace("\\\n", " ").splitlines():
                line = line.split(" #")[0].strip().removeprefix("$ ")
                if line.startswith("kvagent bench"):
                    found.append((f"{path.name} (code block)", line))
        prose = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
        for span in re.findall(r"`(kvagent bench[^`]*)`", prose):
            found.append((f"{path.name} (inline)", span.replace("\\", " ").strip()))
    return found


def test_the_docs_have_bench_lines_of_every_spelling() -> None:
    lines = [line for _, line in doc_command_lines()]
    assert len(lines) > 40
    for alias in FAMILY.aliases():
        assert any(line.startswith(f"kvagent {alias}") for line in lines), alias
    assert any("--scenario study" in line for line in lines)
    assert any("--decode-arms" in line for line in lines)
    assert any("--compare-replay-rung" in line for line in lines)


@pytest.mark.parametrize(("where", "line"), doc_command_lines())
def test_every_bench_line_in_the_docs_parses(where: str, line: str) -> None:
    if SYNOPSIS.search(line):
        pytest.skip("a synopsis (placeholders), not a command line")
    argv = shlex.split(line)[1:]  # without "kvagent"
    if "inline" in where and not any(a.startswith("-") for a in argv):  # a bench named in
        assert argv[0] == "bench" or argv[0] in FAMILY.aliases()        # prose: it exists
        assert argv[0] != "bench" or len(argv) == 1 or argv[1] in FAMILY.names()
        return
    if "inline" in where and argv[-1].startswith("--"):  # an option named in prose
        argv.append("1")  # a value for it (every such option takes a number)
    args = build_parser().parse_args(argv)  # SystemExit (argparse's error) fails the test
    assert isinstance(args.bench, str) and args.bench in FAMILY.names()
    assert args.run is FAMILY.get(args.bench).run


def parsed(*argv: str) -> dict[str, object]:
    args = vars(build_parser().parse_args(list(argv)))
    args.pop("command")
    return args


@pytest.mark.parametrize("alias", sorted(FAMILY.aliases()))
def test_an_older_spelling_is_the_same_bench(alias: str) -> None:
    """``kvagent bench-peer …`` and ``kvagent bench peer …`` parse to the same namespace (the
    same options, defaults and run), and only ``bench NAME`` is listed in --help."""
    name = FAMILY.aliases()[alias]
    extra = ["--llama-server", "/bin/true"] if name == "peer" else []
    old, new = parsed(alias, *extra, "--threads", "1"), parsed("bench", name, *extra,
                                                               "--threads", "1")
    assert old == new and new["bench"] == name
    assert new["run"] is FAMILY.get(name).run


def test_the_arms_modes_and_their_older_flags() -> None:
    """``kvagent bench`` alone is the arms bench; its modes by name set what the older flag
    spellings set, and all reach the one run."""
    plain = parsed("bench")
    assert plain == parsed("bench", "arms") | {"bench": "arms"}
    assert plain["bench"] == "arms" and plain["scenario"] is None
    for name, flags in (("study", ["--scenario", "study"]), ("decode-arms", ["--decode-arms"]),
                        ("rung", ["--compare-replay-rung"])):
        by_name, by_flag = parsed("bench", name), parsed("bench", *flags)
        assert by_flag["bench"] == "arms" and by_name["bench"] == name
        assert by_name | {"bench": "arms"} == by_flag, name
        assert by_name["run"] is plain["run"]
    assert parsed("bench", "--steps", "6")["steps"] == 6 == parsed("bench", "arms", "--steps",
                                                                   "6")["steps"]


def test_help_lists_the_family_not_the_aliases(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--help"])
    top = capsys.readouterr().out
    assert "bench-peer" not in top and "    bench " in top
    with pytest.raises(SystemExit):
        build_parser().parse_args(["bench", "--help"])
    family = capsys.readouterr().out
    for name in FAMILY.names():
        assert f"\n    {name}" in family, name
    assert "kvagent bench-peer" in family and "= kvagent bench peer" in family
    with pytest.raises(SystemExit):
        build_parser().parse_args(["bench", "--steps", "6", "--help"])
    assert "--image-tokens" in capsys.readouterr().out  # the arms bench's own options


def test_a_family_refuses_clashing_names() -> None:
    def run(args: argparse.Namespace) -> int:
        return 0

    a = Bench("a", "one", lambda p: None, run, alias="bench-a")
    with pytest.raises(UnknownBenchError, match="known: a"):
        BenchFamily([a], default="b")
    with pytest.raises(ValueError, match="aliases"):
        BenchFamily([a, Bench("b", "two", lambda p: None, run, alias="bench-a")], default="a")
    with pytest.raises(ValueError, match="registered already"):
        BenchFamily([a, a], default="a")
    top = FamilyParser(prog="x")
    family = BenchFamily([a, Bench("b", "two", lambda p: p.add_argument("--n", type=int),
                                   run)], default="b")
    family.add_to(top.add_subparsers(dest="command"))
    assert vars(top.parse_args(["bench", "--n", "3"]))["n"] == 3
    assert vars(top.parse_args(["bench-a"]))["bench"] == "a"
    with pytest.raises(SystemExit):
        top.parse_args(["bench", "a", "--n", "3"])  # a has no --n


@pytest.mark.parametrize(("model", "mmproj", "vision", "ok"), [
    (None, None, True, True), ("m.gguf", "p.gguf", True, True), ("m.gguf", None, False, True),
    ("m.gguf", None, True, False), (None, "p.gguf", True, False), (None, "p.gguf", False, False),
])
def test_one_model_check(model: str | None, mmproj: str | None, vision: bool, ok: bool) -> None:
    if ok:
        check_model_choice(model, mmproj, vision=vision)
        return
    with pytest.raises(ModelChoiceError) as err:
        check_model_choice(model, mmproj, vision=vision)
    assert str(err.value) == ("give both --model and --mmproj (the model's vision projector), "
                              "or neither (the default model)")


@pytest.mark.parametrize("command", ["run", "serve", "bench", "bench-encode", "bench-eval",
                                     "bench-replay-prefix", "bench-serve", "bench-peer"])
def test_every_command_says_the_one_model_check(command: str, tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    """A model without its projector: exit 2 with the one wording, before anything loads."""
    extra = ["--llama-server", "/bin/true"] if command == "bench-peer" else []
    rc = main([command, *extra, "--model", str(tmp_path / "m.gguf")])
    assert rc == 2
    assert "give both --model and --mmproj" in capsys.readouterr().err
