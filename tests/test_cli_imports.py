"""What a command carries: ``kvagent serve`` (and every command but ``train``) builds its own
flags only, so JAX — which ``kvagent train``'s flags import, ~150 MiB resident — is never
loaded into a server; ``kvagent train`` still gets all of its flags."""

from __future__ import annotations

import subprocess
import sys

import pytest

from runtime.cli import build_parser, command_of

_PROBE = """
import sys
from runtime import cli
try:
    cli.main({argv!r})
except SystemExit:
    pass
print("JAX" if "jax" in sys.modules else "NO-JAX")
"""


def _imports_jax(argv: list[str]) -> bool:
    out = subprocess.run([sys.executable, "-c", _PROBE.format(argv=argv)], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip().splitlines()[-1] == "JAX"


@pytest.mark.parametrize("argv", [["serve", "--help"], ["--log-level", "info", "run", "--help"],
                                  ["bench-peer", "--help"]])
def test_a_command_other_than_train_does_not_load_jax(argv: list[str]) -> None:
    assert not _imports_jax(argv)


def test_train_still_builds_its_flags() -> None:
    args = build_parser(command_of(["train", "--steps", "7"])).parse_args(["train", "--steps", "7"])
    assert args.steps == 7 and args.command == "train"


def test_the_command_is_the_first_word_past_the_options() -> None:
    assert command_of(["--log-level", "debug", "serve", "--port", "0"]) == "serve"
    assert command_of(["--log-level=info", "bench", "peer"]) == "bench"
    assert command_of(["-h", "serve"]) is None and command_of([]) is None
    # a serve's flags parse as before, the other commands' left out
    args = build_parser("serve").parse_args(["serve", "--port", "0"])
    assert args.port == 0
