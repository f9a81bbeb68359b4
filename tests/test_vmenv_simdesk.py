"""The simulated desktop: determinism, tasks and checkers, focus rules, latency, misuse."""

from __future__ import annotations

import io
import time

import anyio
import pytest
from PIL import Image

from runtime.actions import (
    Click, Done, DragTo, Fail, Hotkey, MoveTo, NoOp, Press, Scroll, TypeText, Wait, parse_action,
)
from vmenv import (
    EnvBusyError, EnvClosedError, Env, EpisodeOverError, NotResetError, SimDesk, SimDeskConfig,
    UnknownTaskError, UnknownWidgetError,
)
from vmenv.simdesk.widgets import hit

TASKS = ["open-terminal", "type-in-field", "click-ok", "save-note"]


async def _run(env: SimDesk, task: str, actions) -> list:
    outs = [await env.reset(task)]
    for a in actions:
        outs.append(await env.step(a))
    return outs


def _png(o) -> bytes:
    return o.screenshot if hasattr(o, "screenshot") else o.observation.screenshot


# ---------------------------------------------------------------- determinism

async def test_same_actions_give_byte_identical_screenshots() -> None:
    a, b = SimDesk(), SimDesk()
    script = [Click(76, 696), MoveTo(100, 100), TypeText("x"), Wait(1.0), Click(28, 696),
              TypeText("echo hi\n"), Scroll(0, -3, 5, 5)]
    ra = await _run(a, "save-note", script)
    rb = await _run(b, "save-note", script)
    assert [_png(o) for o in ra] == [_png(o) for o in rb]
    assert len({_png(o) for o in ra}) == len(ra)  # and every screen differs from the others


async def test_consecutive_screens_differ_even_when_nothing_changes() -> None:
    env = SimDesk()
    first = await env.reset("open-terminal")
    outs = [await env.step(a) for a in (Wait(1.0), NoOp("junk", "???"), Scroll(0, 3))]
    shots = [first.screenshot, *(o.observation.screenshot for o in outs)]
    assert len(set(shots)) == len(shots)  # the taskbar clock moves with the step index
    assert env.state.windows == () and [o.observation.step for o in outs] == [1, 2, 3]


async def test_a_still_clock_repeats_the_screen_of_a_step_that_changed_nothing() -> None:
    """``clock_step_s=0`` (``kvagent bench-eval --clock-step 0``): on a sampled layout, a
    step that changed nothing shows the previous screen's pixels; one that changed
    something does not — and the run's config carries the clock to each episode's desk."""
    from runtime.run.agents import RunConfig, simdesk_env

    for env in (SimDesk(SimDeskConfig(width=640, height=384, clock_step_s=0)),
                simdesk_env(RunConfig(screen=(640, 384), vm_seconds=0.0, clock_step_s=0))(
                    None)):  # type: ignore[arg-type]
        first = await env.reset("dialog-button@56")
        outs = [await env.step(a) for a in (Click(5, 5), Click(5, 5), Wait(1.0),
                                            Click(304, 80))]
        shots = [first.screenshot, *(o.observation.screenshot for o in outs)]
        assert shots[1] == shots[2] == shots[3]  # the pointer moved once, then nothing
        assert len({shots[0], shots[1], shots[4]}) == 3
    moving = SimDesk(SimDeskConfig(width=640, height=384))
    await moving.reset("dialog-button@56")
    a, b = [(await moving.step(Click(5, 5))).observation.screenshot for _ in range(2)]
    assert a != b


async def test_observation_record() -> None:
    env = SimDesk(SimDeskConfig(width=800, height=600))
    assert isinstance(env, Env)
    obs = await env.reset("click-ok")
    assert (obs.width, obs.height, obs.step, obs.size) == (800, 600, 0, (800, 600))
    assert "OK" in obs.instruction
    assert Image.open(io.BytesIO(obs.screenshot)).size == (800, 600)
    assert "screenshot" not in repr(obs)


# ---------------------------------------------------------------- tasks

@pytest.mark.parametrize("size", [(1280, 720), (640, 480)])
@pytest.mark.parametrize("task", TASKS)
async def test_each_task_is_solved_by_its_script(task: str, size: tuple[int, int]) -> None:
    # the stop-on-success rule: the episode ends at the step whose state passes the checker
    env = SimDesk(SimDeskConfig(width=size[0], height=size[1], done_on_success=True))
    await env.reset(task)
    script = env.solution()
    outs = [await env.step(a) for a in script]
    assert [o.done for o in outs] == [False] * (len(script) - 1) + [True]
    assert [o.reward for o in outs][-1] == 1.0 and outs[-1].info["success"] is True
    assert all(o.reward == 0.0 for o in outs[:-1])


@pytest.mark.parametrize(("task", "wrong"), [
    ("open-terminal", [Click(76, 696), Click(640, 300), Press("enter")]),  # notes icon, desktop
    ("open-terminal", [Hotkey(("ctrl", "alt", "n"))]),
    ("type-in-field", [TypeText("kvagent")]),  # never focused the field
    ("type-in-field", [Click(840, 228), TypeText("kvagen")]),  # a typo
    ("click-ok", [Click(676, 376), Click(789, 376)]),  # Cancel, then where OK was
    ("click-ok", [Press("escape")]),
    ("click-ok", [Press("enter"), Click(28, 696)]),  # modal: enter and the taskbar do nothing
    ("save-note", [Click(76, 696), TypeText("hello"), Click(1055, 276)]),  # typed unfocused
])
async def test_wrong_sequences_do_not_solve(task: str, wrong: list) -> None:
    env = SimDesk()
    outs = await _run(env, task, [*wrong, Done()])
    assert all(o.reward == 0.0 for o in outs[1:])
    assert outs[-1].done and outs[-1].info["success"] is False
    assert [o.done for o in outs[1:-1]] == [False] * len(wrong)


async def test_reward_is_evaluated_at_done_and_episode_ends_on_done_or_fail() -> None:
    env = SimDesk(SimDeskConfig(done_on_success=False))
    await env.reset("open-terminal")
    out = await env.step(Click(*env.locate("icon.terminal")))
    assert (out.reward, out.done) == (1.0, False)  # solved, but the agent has not said so
    out = await env.step(Done())
    assert (out.reward, out.done) == (1.0, True)
    with pytest.raises(EpisodeOverError):
        await env.step(Wait(1.0))
    await env.reset("open-terminal")
    out = await env.step(Fail())
    assert (out.reward, out.done) == (0.0, True)


async def test_by_default_only_the_agent_ends_the_episode_and_undoing_scores_zero() -> None:
    """OSWorld's rule (the default): solving the task does not end the episode; the score is
    the checker on the final state, so typing the word and then deleting it scores 0, and a
    final fail() scores 0 even on a solved screen.  done_on_success (the old rule) ends the
    same episode the moment it is solved, with reward 1."""
    env = SimDesk()
    await env.reset("type-in-field@9")
    solve = env.solution()
    outs = [await env.step(a) for a in solve]
    assert (outs[-1].reward, outs[-1].done) == (1.0, False)
    undo = [await env.step(Press("backspace")) for _ in range(3)]
    assert [(o.reward, o.done) for o in undo] == [(0.0, False)] * 3
    out = await env.step(Done())
    assert (out.reward, out.done, out.info["success"]) == (0.0, True, False)

    await env.reset("type-in-field@9")
    for a in solve:
        out = await env.step(a)
    out = await env.step(Fail())
    assert (out.reward, out.done) == (0.0, True)

    old = SimDesk(SimDeskConfig(done_on_success=True))
    await old.reset("type-in-field@9")
    outs = [await old.step(a) for a in solve]
    assert (outs[-1].reward, outs[-1].done) == (1.0, True)
    with pytest.raises(EpisodeOverError):
        await old.step(Press("backspace"))


async def test_max_steps_truncates() -> None:
    env = SimDesk(SimDeskConfig(max_steps=2))
    await env.reset("open-terminal")
    assert not (await env.step(Wait(1.0))).done
    out = await env.step(Wait(1.0))
    assert out.done and out.info["truncated"] and out.reward == 0.0


# ---------------------------------------------------------------- focus and widgets

async def test_typing_only_goes_to_a_focused_field() -> None:
    env = SimDesk()
    await env.reset("type-in-field")  # notes open, field not focused
    await env.step(TypeText("lost"))
    assert env.state.notes.text == "" and env.state.focus is None
    await env.step(Click(*env.locate("notes.field")))
    await env.step(TypeText("abc"))
    await env.step(Press("backspace"))
    await env.step(Press("space"))
    assert env.state.notes.text == "ab "
    await env.step(Click(640, 600))  # bare desktop: focus dropped
    await env.step(TypeText("zzz"))
    assert env.state.notes.text == "ab " and env.state.focus is None
    await env.step(Click(*env.locate("icon.terminal")))  # a new terminal takes the focus
    await env.step(TypeText("echo hi\nfoo\n"))
    assert env.state.notes.text == "ab "
    assert env.state.terminal.lines == ("$ echo hi", "hi", "$ foo", "foo: command not found")
    await env.step(Press("escape"))
    await env.step(TypeText("nowhere"))
    assert env.state.terminal.command == ""


async def test_dialog_is_modal() -> None:
    env = SimDesk(SimDeskConfig(done_on_success=False))
    await env.reset("click-ok")
    for a in (Click(*env.locate("icon.terminal")), TypeText("x"), Hotkey(("ctrl", "alt", "t")),
              DragTo(10, 10, 100, 100), Press("enter")):
        await env.step(a)
    assert env.state.windows == () and env.state.dialog is not None
    out = await env.step(Click(*env.locate("dialog.ok")))
    assert out.reward == 1.0 and env.state.dialog is None
    with pytest.raises(UnknownWidgetError):
        env.locate("dialog.ok")


async def test_windows_raise_close_and_drag() -> None:
    env = SimDesk()
    await env.reset("save-note")
    await env.step(Click(*env.locate("icon.notes")))
    await env.step(Click(*env.locate("icon.terminal")))
    assert [w.app for w in env.state.windows] == ["notes", "terminal"]
    await env.step(Click(*env.locate("notes.title")))
    assert env.state.top is not None and env.state.top.app == "notes"
    before = env.state.window("terminal").rect
    x, y = env.locate("terminal.title")
    x -= 100  # grab the title bar left of the (covered) centre
    assert hit(env.state, x, y).name == "terminal.title"
    await env.step(DragTo(x, y, x + 30, y + 40))
    assert env.state.window("terminal").rect == before.moved(30, 40)
    assert env.state.top.app == "terminal"
    await env.step(Hotkey(("alt", "f4")))
    assert not env.state.is_open("terminal")
    await env.step(Click(*env.locate("notes.close")))
    assert env.state.windows == ()
    await env.step(Hotkey(("ctrl", "alt", "t")))
    assert env.state.is_open("terminal") and env.state.focus == "terminal"


async def test_parsed_model_text_drives_the_desktop() -> None:
    env = SimDesk()
    obs = await env.reset("click-ok")
    x, y = env.locate("dialog.ok")
    out = await env.step(parse_action(f"Action: click({x}, {y})", screen=obs.size))
    assert out.reward == 1.0 and out.info["action"] == f"click({x}, {y})"
    await env.reset("open-terminal")
    out = await env.step(parse_action("rm -rf /", screen=obs.size))
    assert out.info["noop_reason"] and out.reward == 0.0 and not out.done


# ---------------------------------------------------------------- latency and misuse

async def test_latency_knob_is_awaited() -> None:
    requested: list[float] = []

    async def fake_sleep(s: float) -> None:
        requested.append(s)

    env = SimDesk(SimDeskConfig(action_latency_s=2.5), sleep=fake_sleep)
    await env.reset("open-terminal")
    await env.step(Wait(1.0))
    await env.step(MoveTo(1, 1))
    assert requested == [2.5, 2.5]

    real = SimDesk(SimDeskConfig(action_latency_s=0.05))
    await real.reset("open-terminal")
    t0 = time.monotonic()
    await real.step(Wait(1.0))
    assert time.monotonic() - t0 >= 0.05


async def test_cancelled_step_leaves_the_desktop_unchanged() -> None:
    entered = anyio.Event()

    async def stuck(_s: float) -> None:
        entered.set()
        await anyio.sleep_forever()

    env = SimDesk(sleep=stuck)
    await env.reset("open-terminal")
    before = env.state
    async with anyio.create_task_group() as tg:
        tg.start_soon(env.step, Click(*env.locate("icon.terminal")))
        await entered.wait()
        with pytest.raises(EnvBusyError):
            await env.step(Wait(1.0))
        tg.cancel_scope.cancel()
    assert env.state is before and not env.done


async def test_misuse_raises_typed_errors() -> None:
    env = SimDesk()
    with pytest.raises(NotResetError):
        await env.step(Wait(1.0))
    with pytest.raises(UnknownTaskError, match="known: click-ok"):
        await env.reset("make-coffee")
    await env.reset()  # default task
    assert env.task is not None and env.task.name == "open-terminal"
    async with env:
        pass
    with pytest.raises(EnvClosedError):
        await env.step(Wait(1.0))
    with pytest.raises(EnvClosedError):
        await env.reset()
    with pytest.raises(ValueError):
        SimDeskConfig(width=100)
