"""Open an episode on a host — fresh, or rebuilt from the history a lost host had.

A cluster's front door keeps, for every step an episode took, the screenshot it sent and the
``history`` text the step left (the episode API returns it).  When the episode's host dies,
``open_episode`` on another host opens it again under the same number (so the same sampling
seed) and replays those steps through the ONE episode service (``runtime.serve.episodes``;
the requests parsed as the episode API parses them) with teacher forcing: the episode is
opened with a teacher giving each replayed step's recorded history text, so the rebuilt
episode's context is what the client's VM actually executed, whatever the new host decodes.
The replay re-prefills the episode (its cache lived on the lost host); nothing else is lost.
On the same kind of CPU the replayed decisions equal the recorded ones bitwise (the engine's
exactness); ``diverged`` counts the ones that did not (different CPU kernels, say).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

import attrs
import structlog

from runtime.serve.host import ModelHost
from runtime.serve.http.episode_bodies import created_body, parse_create, read_screenshot
from runtime.serve.owners import Owner
from runtime.session import Teacher

log = structlog.get_logger("kvagent.cluster")


@attrs.frozen
class RecordedStep:
    """One step as the front door saw it: the request's screenshot (base64, as sent) and the
    answer's ``response`` and ``history`` text."""

    screenshot: str = attrs.field(repr=False)
    response: str
    history: str | None


async def open_episode(host: ModelHost, body: Mapping[str, Any], number: int,
                       replay: Sequence[RecordedStep] = (), *, episode_id: str,
                       owner: Owner) -> dict[str, Any]:
    """Create ``owner``'s episode ``episode_id`` (number ``number``: its sampling seed) from
    a create request's ``body``; replay ``replay``'s steps (teacher-forced).  Returns the
    create answer plus ``replayed`` and ``diverged``.  On a failed replay the episode is
    closed again and the error propagates."""
    episodes, limits = host.episodes, host.config.limits
    create = parse_create(body, host.config.agent, limits)
    host.check_episode_config(create.config, create.screen)
    out = await episodes.create(create.config, create.instruction, create.screen, owner,
                                number=number, episode_id=episode_id,
                                teacher=_teacher(replay))
    created = created_body(out, create.config)
    if not replay:
        return {**created, "replayed": 0, "diverged": 0}
    diverged = 0
    try:
        for step in replay:
            arrived = time.perf_counter()
            png, size = await read_screenshot({"screenshot": step.screenshot}, limits)
            done = await episodes.step(episode_id, owner, png, size, arrived_at=arrived)
            diverged += done.step.act.response != step.response
    except Exception:
        await episodes.end(episode_id, owner)
        raise
    log.info("cluster_episode_rebuilt", episode_id=episode_id, replayed=len(replay),
             diverged=diverged)
    return {**created, "replayed": len(replay), "diverged": diverged}


def _teacher(replay: Sequence[RecordedStep]) -> Teacher | None:
    """The recorded history texts of the replayed steps, then none (the episode decides its
    own from there on)."""
    if not replay:
        return None
    texts = [step.history for step in replay]
    return lambda i: texts[i] if i < len(texts) else None
