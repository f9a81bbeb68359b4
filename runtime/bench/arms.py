"""One bench arm: a cache policy (with or without overlap; an approximate one with its replay
budget) replaying a trajectory through the loop that ships — ``run_agents`` → ``run_episode``
→ ``EpisodeDriver`` → ``Scheduler`` — as one episode on a ``ReplayEnv``.

Teacher forcing: every arm appends the trajectory's recorded action texts to its history,
whatever it decoded, so all arms see the same content and their outputs compare step by step.
The critical path of every arm starts when the screenshot's bytes are in hand: decoding and
encoding the image are on it (a screenshot cannot be encoded before it arrives).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import attrs

from cachepolicy.engine import Engine
from cachepolicy.errors import PolicyRefusedError
from cachepolicy.policies import POLICIES
from runtime.config import POLICY_SEPARATOR, AgentConfig, PolicyChoice
from runtime.metrics import EpisodeResult
from runtime.run.agents import EpisodeEvent
from runtime.run.replay import replay_run_config, run_replay
from vmenv.trajectory import Trajectory

OVERLAP_SUFFIX = "+overlap"
#: ``<policy>@<budget>``: ``runtime.config.PolicyChoice``'s spelling (a replay budget or an
#: option: ``tail-replay@5%``, ``kamera@m32``)
BUDGET_SEPARATOR = POLICY_SEPARATOR


@attrs.frozen
class ArmSpec:
    """An arm's name read back: ``<policy>[@<replay budget or option>][+overlap]`` (the
    policy part is ``PolicyChoice``'s spelling)."""

    policy: str
    overlap: bool = False
    budget: str | None = None  # None: the agent config's replay budget
    option: str | None = None  # None: the agent config's policy option

    @classmethod
    def parse(cls, arm: str) -> ArmSpec:
        """The arm ``arm`` names; ValueError for an unknown policy, or a replay budget that
        does not parse or is given to an exact policy."""
        rest, overlap = arm.strip(), False
        if rest.endswith(OVERLAP_SUFFIX):
            rest, overlap = rest[: -len(OVERLAP_SUFFIX)], True
        choice = PolicyChoice.parse(rest, what="arm")
        return cls(choice.policy, overlap, choice.budget, choice.option)

    def agent(self, agent: AgentConfig) -> AgentConfig:
        """``agent`` running this arm: its policy, overlap and replay budget.  Raises
        PolicyRefusedError (the arm is refused, the others run) when ``agent`` pins
        screenshots and the arm's layout cannot."""
        problem = POLICIES[self.policy].pinning_problem(agent.window, agent.pinned)
        if problem is not None:
            raise PolicyRefusedError(f"{problem} (--pin-first {agent.pinned})")
        return PolicyChoice(self.policy, self.budget, self.option).agent(
            agent, overlap=self.overlap)


def split_arm(arm: str) -> tuple[str, bool]:
    """``terminal-slot+overlap`` → (``terminal-slot``, True); ``tail-replay@5%`` →
    (``tail-replay``, False)."""
    rest, overlap = (arm[: -len(OVERLAP_SUFFIX)], True) if arm.endswith(OVERLAP_SUFFIX) \
        else (arm, False)
    return rest.partition(BUDGET_SEPARATOR)[0], overlap


@attrs.frozen
class ArmResult:
    arm: str
    policy: str
    overlap: bool
    refused: str | None
    episode: EpisodeResult | None  # None when refused
    wall_s: float
    ledger_peak_bytes: int

    @property
    def steps(self) -> tuple[dict[str, Any], ...]:
        return tuple(s.as_dict() for s in self.episode.steps) if self.episode else ()

    @property
    def output_sha256(self) -> str | None:
        return self.episode.output_sha256 if self.episode is not None else None


async def run_arm(engine: Engine, arm: str, traj: Trajectory, agent: AgentConfig, *,
                  vm_seconds: float = 0.0,
                  on_event: Callable[[EpisodeEvent], None] | None = None) -> ArmResult:
    """Replay ``traj`` through the arm's policy (``<policy>+overlap``: with overlap;
    ``<policy>@<budget>``: with that replay budget)."""
    spec = ArmSpec.parse(arm)
    policy, overlap = spec.policy, spec.overlap
    engine.clear_image_cache()  # every arm starts cold, as an episode on a fresh host would
    try:
        config = replay_run_config(spec.agent(agent), traj, vm_seconds=vm_seconds)
        run = await run_replay(engine, config, traj, prefix=f"bench-{arm}", on_event=on_event)
    except PolicyRefusedError as exc:
        return ArmResult(arm, policy, overlap, str(exc), None, 0.0, 0)
    (episode,) = run.episodes
    return ArmResult(arm, policy, overlap, None, episode, run.wall_s, run.ledger_peak_bytes)


def run_arms(engine: Engine, arms: Sequence[str], traj: Trajectory, agent: AgentConfig, *,
             vm_seconds: float = 0.0,
             on_event: Callable[[str, EpisodeEvent], None] | None = None) -> list[ArmResult]:
    """Every arm in turn, on one engine (blocking: runs its own event loop)."""
    import anyio

    async def main() -> list[ArmResult]:
        out = []
        for arm in arms:
            def event(e: EpisodeEvent, arm: str = arm) -> None:
                if on_event is not None:
                    on_event(arm, e)
            out.append(await run_arm(engine, arm, traj, agent, vm_seconds=vm_seconds,
                                     on_event=event))
        return out

    return anyio.run(main)
