"""The environments ``kvagent run --env NAME`` can run, by name (like the policy and profile
registries, one ``cachepolicy.registry.Registry`` shape): ``names()`` lists them,
``get(name)`` returns one.

A ``RunEnv`` adds its own options to ``kvagent run`` (``add_arguments``), checks them before
anything loads (``check``) and turns them into the run's episodes (``setup``: the run's
config, one ``EpisodeSpec`` per episode, a fresh env per episode, the teacher forcing if
any, the result layout's domain).  Adding an env is one file here and one ``register`` line
below.  Options belong to their env: ``kvagent run`` refuses another env's option that was
given (``foreign_options``).
"""

from __future__ import annotations

import argparse

from cachepolicy.registry import Registry, UnknownNameError
from runtime.run.envs.base import RunEnv, RunSetup
from runtime.run.envs.replay import ReplayRunEnv
from runtime.run.envs.simdesk import SimDeskRunEnv

__all__ = ["ENVS", "RunEnv", "RunSetup", "UnknownEnvError", "foreign_options", "get", "names",
           "register"]


class UnknownEnvError(UnknownNameError):
    """No env has that name."""


#: name -> env, in registration order (the first is the default): a
#: ``cachepolicy.registry.Registry``, the shape the policies and profiles share.
ENVS: Registry[RunEnv] = Registry("env", error=UnknownEnvError)


def register(env: RunEnv) -> RunEnv:
    """Make ``env`` available as ``kvagent run --env <env.name>`` (``DuplicateNameError``,
    a ``ValueError``, if the name is taken)."""
    return ENVS.register(env)


def names() -> tuple[str, ...]:
    """Every registered env, in registration order (the first is the default)."""
    return ENVS.names()


def get(name: str) -> RunEnv:
    """The env ``name``; ``UnknownEnvError`` listing the known ones if there is none."""
    return ENVS.get(name)


def foreign_options(args: argparse.Namespace) -> str | None:
    """The first option given that belongs to an env other than ``args.env``, as a message
    (None if there is none)."""
    for env in ENVS.values():
        if env.name == args.env:
            continue
        for dest, flag in env.options.items():
            if getattr(args, dest, None) is not None:
                return f"{flag} is only for --env {env.name}"
    return None


register(SimDeskRunEnv())
register(ReplayRunEnv())
