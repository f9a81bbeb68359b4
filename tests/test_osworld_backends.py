"""``KvAgent`` talks to where it decides through one protocol (``AgentBackend``): both
backends implement all of it, and the agent never asks which one it holds."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest

import runtime.osworld.agent as agent_module
from runtime.osworld.agent import KvAgent, KvAgentError
from runtime.osworld.backend import AgentBackend
from runtime.osworld.episode_client import EpisodeApiError
from runtime.osworld.local import LocalBackend
from runtime.osworld.remote import RemoteBackend

MEMBERS = sorted(n for n in vars(AgentBackend) if not n.startswith("_"))


def test_the_protocol_is_what_the_agent_asks() -> None:
    assert {"server", "n_ctx", "start", "ping", "decide", "new_episode", "status",
            "close"} <= set(MEMBERS)


@pytest.mark.parametrize("backend", [LocalBackend, RemoteBackend])
def test_each_backend_implements_the_whole_protocol(backend: type) -> None:
    for name in MEMBERS:
        theirs, ours = getattr(AgentBackend, name), getattr(backend, name, None)
        assert ours is not None, f"{backend.__name__} lacks {name}"
        assert isinstance(ours, property) == isinstance(theirs, property), name
        if callable(theirs):
            assert list(inspect.signature(ours).parameters) == \
                list(inspect.signature(theirs).parameters), name


def test_the_agent_never_asks_which_backend_it_holds() -> None:
    tree = ast.parse(Path(inspect.getfile(agent_module)).read_text())
    asked = [node.lineno for node in ast.walk(tree)
             if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "isinstance"
             and "Backend" in ast.unparse(node.args[1])]
    assert not asked, f"isinstance on a backend at lines {asked}"
    # the remote class is named once, where the agent builds it (the local one lazily)
    assert ast.unparse(tree).count("RemoteBackend(") == 1


def test_a_remote_agent_answers_from_its_backend() -> None:
    agent = KvAgent(server="http://127.0.0.1:9", server_retry_s=0.0, server_timeout=1.0)
    try:
        assert agent.server == "http://127.0.0.1:9"
        with pytest.raises(KvAgentError, match="n_ctx is the server's"):
            agent.n_ctx  # noqa: B018
        with pytest.raises(EpisodeApiError, match="/health"):  # start() asks the server
            agent.start()
    finally:
        agent.close()
