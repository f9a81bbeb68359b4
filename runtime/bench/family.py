"""The benches as one family: ``kvagent bench NAME [options]``.

A ``Bench`` is a name, a one-line help, the options it adds to its parser and the run that
measures, prints its report and returns the exit status.  ``BenchFamily`` holds the benches in
one ``cachepolicy.registry.Registry`` and puts them on the command line
(``BenchFamily.add_to``):

* ``kvagent bench NAME [options]`` for every bench;
* ``kvagent bench [options]`` — no name — is the default bench (the policy arms), so every
  older ``kvagent bench --scenario study`` / ``--decode-arms`` / ``--compare-replay-rung``
  line means what it did;
* a bench's older spelling as a command of its own (``kvagent bench-peer``) stays, hidden
  from the command list, built from the same ``Bench`` (the same options, the same run).

A *mode* of a bench (``study``, ``decode-arms``, ``rung`` of the arms bench) is a ``Bench`` of
its own that shares the bench's options and run; its ``defaults`` set the option that selects
the mode, as the older flag spelling does.

The benches themselves are registered by the command line (``runtime/commands/bench.py``):
their options are the CLI's shared ones (``runtime/commands/options.py``), which nothing below
the CLI imports.  What each bench measures and reports lives beside this module
(``runtime/bench/run_*.py``, ``study.py``).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import attrs

from cachepolicy.registry import Registry, UnknownNameError

__all__ = ["Bench", "BenchFamily", "FamilyParser", "UnknownBenchError"]


class UnknownBenchError(UnknownNameError):
    """No bench has that name."""


@attrs.frozen
class Bench:
    """One bench of ``kvagent bench``.  ``add_arguments(parser)`` adds its options;
    ``run(args)`` checks them, measures, prints (and with ``--json`` writes) its report and
    returns the exit status (2: bad arguments).  ``alias``: its older spelling as a command
    of its own (``bench-peer``), or None.  ``defaults``: option values its parser starts
    from (a mode: ``(("scenario", "study"),)``)."""

    name: str
    help: str
    add_arguments: Callable[[argparse.ArgumentParser], None] = attrs.field(eq=False)
    run: Callable[[argparse.Namespace], int] = attrs.field(eq=False)
    alias: str | None = None
    defaults: tuple[tuple[str, Any], ...] = ()

    def add_parser(self, commands: Any, name: str, *, listed: bool) -> argparse.ArgumentParser:
        """This bench's parser as the sub-command ``name`` of ``commands`` (an argparse
        sub-parsers action); ``listed``: shown in its parent's help."""
        # argparse %-formats a sub-command's help ("95% CI" would break --help)
        listing = {"help": self.help.replace("%", "%%")} if listed else {}
        p = commands.add_parser(name, description=self.help, **listing)
        self.add_arguments(p)
        p.set_defaults(bench=self.name, run=self.run, **dict(self.defaults))
        return p


class FamilyParser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose sub-command may be left out: with ``default_command`` set,
    arguments that do not start with one of ``command_names`` (or ``-h``) go to that
    sub-command (``kvagent bench --steps 6`` is ``kvagent bench arms --steps 6``).  Parsers
    without ``default_command`` (every other one) parse as argparse does."""

    default_command: str | None = None
    command_names: frozenset[str] = frozenset()

    def parse_known_args(self, args: Sequence[str] | None = None,  # type: ignore[override]
                         namespace: argparse.Namespace | None = None,
                         ) -> tuple[argparse.Namespace, list[str]]:
        if self.default_command is not None:
            given = list(sys.argv[1:] if args is None else args)
            if not given or (given[0] not in self.command_names
                             and given[0] not in ("-h", "--help")):
                given.insert(0, self.default_command)
            args = given
        return super().parse_known_args(args, namespace)


class BenchFamily:
    """The benches by name (a ``Registry``, in registration order) and the default one."""

    def __init__(self, benches: Iterable[Bench], *, default: str) -> None:
        self.benches: Registry[Bench] = Registry("bench", error=UnknownBenchError)
        for bench in benches:
            self.benches.register(bench)
        self.default = self.benches.get(default).name
        aliases = [b.alias for b in self.benches.values() if b.alias is not None]
        if len(set(aliases)) != len(aliases) or set(aliases) & set(self.benches.names()):
            raise ValueError(f"bench aliases must be unique and no bench's name: {aliases}")

    def get(self, name: str) -> Bench:
        """The bench ``name`` (``UnknownBenchError``, the names listed, if none)."""
        return self.benches.get(name)

    def names(self) -> tuple[str, ...]:
        return self.benches.names()

    def aliases(self) -> dict[str, str]:
        """Older spelling → bench name (``bench-peer`` → ``peer``)."""
        return {b.alias: b.name for b in self.benches.values() if b.alias is not None}

    def add_to(self, commands: Any, name: str = "bench") -> FamilyParser:
        """Add ``kvagent bench [NAME] [options]`` and the hidden older spellings to
        ``commands`` (the top parser's sub-parsers action, whose parsers are
        ``FamilyParser``s); returns the family's parser."""
        old = "\n".join(f"  kvagent {a:<22} = kvagent {name} {n}"
                        for a, n in self.aliases().items())
        parser = commands.add_parser(
            name, help=f"measure kvagent: {name} NAME runs one bench ({', '.join(self.names())}"
                       f"; default {self.default}); kvagent {name} --help lists them",
            description=f"The benches; kvagent {name} NAME --help for a bench's options.\n"
                        f"Without a NAME: the {self.default} bench, as before.",
            epilog=f"older spellings, still accepted:\n{old}",
            formatter_class=argparse.RawDescriptionHelpFormatter)
        if not isinstance(parser, FamilyParser):
            raise TypeError("the top parser's sub-commands must be FamilyParsers "
                            "(argparse.ArgumentParser.add_subparsers(parser_class=...))")
        benches = parser.add_subparsers(dest="bench", metavar="NAME")
        for bench in self.benches.values():
            bench.add_parser(benches, bench.name, listed=True)
        parser.default_command = self.default
        parser.command_names = frozenset(self.names())
        for bench in self.benches.values():
            if bench.alias is not None:
                bench.add_parser(commands, bench.alias, listed=False)
        return parser
