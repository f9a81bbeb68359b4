"""Open an episode on a host — fresh, or rebuilt from the history a lost host had.

A cluster's front door keeps, for every step an episode took, the screenshot it sent and the
``history`` text the step left (the episode API returns it).  When the episode's host dies,
``open_episode`` on another host opens it again under the same number (so the same sampling
seed) and replays those steps through the ONE episode API (``runtime.serve.episodes``) with
teacher forcing: each replayed step's history text is the recorded one, so the rebuilt
episode's context is what the client's VM actually executed, whatever the new host decodes.
The replay re-prefills the episode (its cache lived on the lost host); nothing else is lost.
On the same kind of CPU the replayed decisions equal the recorded ones bitwise (the engine's
exactness); ``diverged`` counts the ones that did not (different CPU kernels, say).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import attrs
import structlog

from runtime.serve import episodes
from runtime.serve.host import ModelHost

log = structlog.get_logger("kvagent.cluster")


@attrs.frozen
class RecordedStep:
    """One step as the front door saw it: the request's screenshot (base64, as sent) and the
    answer's ``response`` and ``history`` text."""

    screenshot: str = attrs.field(repr=False)
    response: str
    history: str | None


async def open_episode(host: ModelHost, body: Mapping[str, Any], number: int,
                       replay: Sequence[RecordedStep] = ()) -> dict[str, Any]:
    """Create episode ``ep-{number}`` from a create request's ``body``; replay ``replay``'s
    steps (teacher-forced).  Returns the create answer plus ``replayed`` and ``diverged``.
    On a failed replay the episode is closed again and the error propagates."""
    created = await episodes.create(host, body, number=number)
    episode_id = created["episode_id"]
    if not replay:
        return {**created, "replayed": 0, "diverged": 0}
    texts = [step.history for step in replay]
    session = host.episodes.get(episode_id).driver.session
    session.teacher = lambda i: texts[i] if i < len(texts) else None
    diverged = 0
    try:
        for step in replay:
            out = await episodes.step(host, episode_id, {"screenshot": step.screenshot})
            diverged += out["response"] != step.response
    except Exception:
        await episodes.end(host, episode_id)
        raise
    session.teacher = None
    log.info("cluster_episode_rebuilt", episode_id=episode_id, replayed=len(replay),
             diverged=diverged)
    return {**created, "replayed": len(replay), "diverged": diverged}
