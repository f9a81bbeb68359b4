"""``KvAgent(server=URL)``: the agent's steps decided by a ``kvagent serve`` host.

The episode lives on the server (its cache, its overlapped prefetch, the server's memory
budget shared with every other client); this side keeps only its id.  The server's answer is
data: ``action`` is read back into a record with kvagent's strict parser (an answer that does
not parse is a protocol error, not a model error) and ``KvAgent`` generates the code from it
as it does in-process — text from the network is never run.

While an episode is open the backend holds its lease (``lease.py``: one long request on a
thread the backend owns), so when this process ends — even with ``os._exit``, as OSWorld's
workers do — the server ends the episode within seconds rather than holding its slot.
``close`` (and ``reset``) end the episode outright.

An episode can disappear on the server (it restarted, or the episode sat idle past the
server's ``--idle-seconds`` while another client needed the slot): the step is then sent to
a fresh episode of the same instruction, which starts without the lost history; the step's
``notes`` say so.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import structlog

from runtime.actions import parse_action_strict
from runtime.config import AgentConfig
from runtime.osworld.backend import Decision
from runtime.osworld.episode_client import EpisodeApiError, EpisodeClient
from runtime.osworld.errors import AgentClosedError, AgentStepError, KvAgentError
from runtime.osworld.lease import LeaseKeeper
from vmenv.actions import ActionError, NoOp

log = structlog.get_logger("kvagent.osworld")

#: The ``AgentConfig`` fields a client chooses per episode (the server's episode options).
REMOTE_OPTIONS = ("profile", "policy", "window", "pinned", "overlap", "temperature", "seed",
                  "grammar", "convention", "decode_tokens", "system_prompt")
#: Ending an episode at close or reset should not hold a runner up for long.
END_TIMEOUT_S = 10.0


def remote_options(agent: AgentConfig) -> dict[str, Any]:
    """The episode options that make the server's episode decide like ``agent`` would."""
    options = {k: getattr(agent, k) for k in REMOTE_OPTIONS}
    options["convention"] = agent.convention.value
    if options["system_prompt"] is None:
        del options["system_prompt"]
    return options


class RemoteBackend:
    def __init__(self, client: EpisodeClient, options: Mapping[str, Any], *, name: str,
                 lease: bool = True) -> None:
        self.client, self.options, self.name = client, dict(options), name
        self._episode_id: str | None = None
        self._closed = False
        #: holds the open episode's lease (None: no lease, e.g. a server without leases)
        self.leases = LeaseKeeper(client.base_url, client.headers, name=name) if lease else None

    @property
    def server(self) -> str:
        return self.client.base_url

    @property
    def n_ctx(self) -> int:
        raise KvAgentError("n_ctx is the server's (kvagent serve flags)")

    def start(self) -> None:
        self._check_open()  # nothing to load: the episode opens with the first step

    def ping(self) -> None:
        self._check_open()
        self.client.health()

    def new_episode(self) -> str | None:
        self._check_open()
        self._end_current()
        return None  # the server names the episode when it starts (first decide)

    def decide(self, instruction: str, png: bytes, size: tuple[int, int],
               screen: tuple[int, int], arrived_at: float) -> Decision:
        self._check_open()
        notes: list[str] = []
        try:
            if self._episode_id is None:
                self._start(instruction, screen)
            assert self._episode_id is not None
            try:
                answer = self.client.step(self._episode_id, png)
            except EpisodeApiError as exc:
                if not exc.episode_gone:
                    raise
                lost = self._episode_id
                log.warning("episode_lost", agent=self.name, episode_id=lost,
                            reason=str(exc))
                if self.leases is not None:
                    self.leases.release()
                notes.append(f"episode {lost} was gone on the server (restarted, or idle "
                             "past its --idle-seconds); continued in a fresh episode "
                             "without the earlier history")
                self._episode_id = None
                self._start(instruction, screen)
                answer = self.client.step(self._episode_id, png)
        except EpisodeApiError as exc:
            raise AgentStepError(f"the server {self.client.base_url} could not decide the "
                                 f"step: {exc}") from exc
        decided = time.perf_counter()
        return self._decision(answer, size, notes, decided - arrived_at)

    def status(self) -> dict[str, Any]:
        """The server's view of the current episode (``GET /v1/episodes/{id}``)."""
        self._check_open()
        if self._episode_id is None:
            return {"episode_id": None, "server": self.client.base_url}
        try:
            return {**self.client.describe(self._episode_id), "server": self.client.base_url}
        except EpisodeApiError as exc:
            raise AgentStepError(str(exc)) from exc

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self._end_current()
        finally:
            try:
                if self.leases is not None:
                    self.leases.close()  # the lease thread joined
            finally:
                self.client.close()

    # ------------------------------------------------------------------ internals

    def _start(self, instruction: str, screen: tuple[int, int]) -> None:
        self._episode_id = self.client.create(instruction, screen=screen,
                                              options=self.options)
        if self.leases is not None:
            self.leases.hold(self._episode_id)
        log.info("remote_episode_started", agent=self.name, episode_id=self._episode_id,
                 server=self.client.base_url)

    def _end_current(self) -> None:
        episode_id, self._episode_id = self._episode_id, None
        if self.leases is not None:
            self.leases.release()
        if episode_id is None:
            return
        try:
            self.client.end(episode_id, timeout=END_TIMEOUT_S)
        except EpisodeApiError as exc:  # the server frees it when idle (--idle-seconds)
            log.warning("remote_episode_end_failed", agent=self.name, episode_id=episode_id,
                        reason=str(exc))

    def _decision(self, answer: Mapping[str, Any], size: tuple[int, int], notes: list[str],
                  round_trip_s: float) -> Decision:
        try:
            episode_id, index = str(answer["episode_id"]), int(answer["step"])
            response, text = str(answer["response"]), answer["action"]
            info = dict(answer["info"])
            if list(answer["screenshot_size"]) != list(size):
                raise ValueError(f"it decided on a {answer['screenshot_size']} screenshot, "
                                 f"this one is {list(size)}")
            why = "; ".join(map(str, info.get("notes") or ())) or "unparsable output"
            action = (NoOp(reason=why, raw=response)
                      if text is None else parse_action_strict(str(text), screen=size))
        except (KeyError, TypeError, ValueError, ActionError) as exc:
            raise AgentStepError(f"the server {self.client.base_url} answered a step this "
                                 f"client cannot read ({type(exc).__name__}: {exc})") from exc
        self._episode_id = episode_id
        info["notes"] = [*info.get("notes", []), *notes]
        info["round_trip_s"] = round_trip_s  # the critical path as this client sees it
        info["server"] = self.client.base_url
        return Decision(episode_id, index, response, action, info, round_trip_s)

    def _check_open(self) -> None:
        if self._closed:
            raise AgentClosedError("the agent is closed")
