"""The chat API's terminal mode under the server's default policy, ``chrono-slot`` (issue 48:
the exact default at N = 4 against llama-server).

An OSWorld client's requests interleave its answers with its screenshots, so while its
window fills each request extends the previous one.  terminal-slot's layout cannot append
there — the new history line precedes the window, so the retained screenshots are prefilled
again from the second request on (the layout test says where the two prompts part) —
chrono-slot's can: each screenshot is followed by its answer's line.  On the real engine (the
forged llama and qwen35, in-process hosts): every chrono-slot answer is, token for token,
the answer a fresh conversation — the same pieces prefilled from scratch — gives to the very
same request, and during the window's growth it feeds the engine far fewer tokens than
terminal-slot (counted at the engine's own prefill calls)."""

from __future__ import annotations

import base64

import anyio
import pytest

from cachepolicy.context_log import ContextLog
from cachepolicy.engine import EngineConfig
from cachepolicy.layouts import PromptKit, chronological_steps, terminal_steps
from cachepolicy.pieces import digests
from cachepolicy.segments import SegmentFactory
from runtime.bench.chat_layout import sliding_window_messages
from runtime.bench.trajectory import screenshot
from runtime.config import AgentConfig
from runtime.serve.config import ServeConfig
from runtime.serve.host import ModelHost
from runtime.serve.messages import ChatRequest, ImagePart, Message, Sampling, TextPart
from runtime.serve.owners import ANONYMOUS
from runtime.serve.terminal import CHAT_POLICY, chat_policy

WINDOW = 3
STEPS = 5  # steps 1 and 2 grow the window, 3 and 4 slide it
SHOT = (160, 120)
SYSTEM = "You operate a desktop through screenshots."
INSTRUCTION = "Open the terminal."


def test_serve_runs_chrono_slot_only_when_no_policy_is_given() -> None:
    assert CHAT_POLICY == "chrono-slot"
    assert chat_policy(None, 0) == "chrono-slot"
    assert chat_policy("terminal-slot", 0) is None  # asked for: the chat runs it
    assert chat_policy("relocate", 0) is None
    assert chat_policy(None, 1) is None  # chrono-slot does not pin: terminal-slot does


# ------------------------------------------------------------------ the layouts, no engine


def _common(a, b) -> int:
    da, db = digests(a), digests(b)
    n = 0
    while n < min(len(da), len(db)) and da[n] == db[n]:
        n += 1
    return n


def test_while_the_window_grows_only_chrono_extends_the_last_prompt(engines) -> None:
    engine = engines("llama")
    factory = SegmentFactory(engine)
    kit = PromptKit(generation_prompt=tuple(engine.tokenize("\nAnswer:")), turn_break=())
    log = ContextLog().append(factory.preamble("You operate a desktop."),
                              factory.instruction(INSTRUCTION))
    logs = []
    for t in range(STEPS):
        if t:
            log = log.append(factory.action(t - 1, f"Step {t}: click({t}, {t})\n"))
        log = log.append(factory.screenshot(t, screenshot(t, *SHOT)))
        logs.append(log)
    for t in range(1, STEPS):
        before, now = logs[t - 1], logs[t]
        chrono_before, _ = chronological_steps(before, kit, WINDOW)
        chrono_now, region = chronological_steps(now, kit, WINDOW)
        term_before, term_region = terminal_steps(before, kit, WINDOW)
        term_now, _ = terminal_steps(now, kit, WINDOW)
        # terminal: the prompts part right after the history — no screenshot is reused
        assert _common(term_before, term_now) == term_region
        if t < WINDOW:  # growing: chrono keeps everything up to the last prompt's last image
            assert _common(chrono_before, chrono_now) == len(chrono_before) - 1
            assert chrono_before[-2].is_image
        else:  # sliding: both keep the head and the lines before the window
            assert _common(chrono_before, chrono_now) == region - 1
        # the prefetch's pieces (the next window less its screenshot) are a prefix of the
        # next step's, so the next step only adds its screenshot
        if t < STEPS - 1:
            nxt = logs[t + 1]
            ahead, _ = chronological_steps(
                now.append(factory.action(t, f"Step {t + 1}: click({t + 1}, {t + 1})\n")), kit,
                WINDOW - 1, generation_prompt=False)
            step, _ = chronological_steps(nxt, kit, WINDOW)
            assert _common(ahead, step) == len(ahead) == len(step) - 3  # label, image, gen


# ------------------------------------------------------------ real hosts, the real engine


def _config(forged, arch: str, policy: str | None, overlap: bool,
            window: int = WINDOW) -> ServeConfig:
    m = forged(arch)
    return ServeConfig(model_path=m.model_path, mmproj_path=m.mmproj_path,
                       engine=EngineConfig(n_ctx_per_seq=4096, n_seq_max=3, n_threads=1),
                       agent=AgentConfig(window=window, overlap=overlap), chat_policy=policy)


def _request(t: int, answers: list[str], *, kept: int = WINDOW - 1) -> ChatRequest:
    """Step ``t``'s request in OSWorld's layout, ``kept`` answers (and their screenshots)
    in it."""
    shots = [screenshot(i, *SHOT) for i in range(t + 1)]
    messages = []
    for m in sliding_window_messages(SYSTEM, INSTRUCTION, shots, answers[:t],
                                     kept_answers=kept):
        content = m["content"]
        if isinstance(content, str):
            messages.append(Message(m["role"], (TextPart(content),)))
            continue
        parts = []
        for p in content:
            if p["type"] == "text":
                parts.append(TextPart(p["text"]))
            else:  # a data URL of one of the PNGs
                parts.append(ImagePart(base64.b64decode(p["image_url"]["url"].split(",")[1]),
                                       SHOT))
        messages.append(Message(m["role"], tuple(parts)))
    # sampled (temperature 1, one seed): a forged model's greedy tokens hardly depend on
    # the prompt; the same logits draw the same tokens
    return ChatRequest("model", tuple(messages), Sampling(6, 1.0, 1.0, 11, ()), False, None,
                       None)


def _conversation(forged, arch: str, policy: str | None, *, overlap: bool = True,
                  fresh: bool = False, window: int = WINDOW, trim: bool = False) -> dict:
    """One sliding-window conversation of ``STEPS`` requests on a fresh in-process host:
    per step the policy that answered, the answer's tokens, the rows the engine was fed for
    it (text tokens and image embeddings, counted at the engine's prefill calls from the end
    of the previous step to the end of this one: the prefetch and the step) and the step's
    own account.  ``fresh``: then each step's request again, with every answer so far, to a
    conversation of its own whose first step prefills everything from scratch — its
    answer's tokens.  ``window``: the server's K; ``trim``: after each step (and its
    prefetch) the memory ladder's first rung cuts the conversation back to its reuse point
    (the region anchor), the bytes freed in ``trimmed``."""
    out: dict = {"steps": [], "fresh": [], "trimmed": []}

    async def main() -> None:
        async with ModelHost.running(_config(forged, arch, policy, overlap, window)) as host:
            engine = host.engine
            fed = [0]
            text, image = engine.prefill_tokens, engine.prefill_image

            def count_text(seq, tokens, **kw):
                fed[0] += len(tokens)
                return text(seq, tokens, **kw)

            def count_image(seq, img, **kw):
                fed[0] += img.embeddings.shape[0]
                return image(seq, img, **kw)

            engine.prefill_tokens, engine.prefill_image = count_text, count_image
            answers: list[str] = []
            last = 0
            for t in range(STEPS):
                got = await host.chat.complete(_request(t, answers), "agent", ANONYMOUS)
                answers.append(got.text)
                rec, m = got.step.act.record, got.step.metrics
                out["steps"].append({
                    "policy": rec.policy, "tokens": tuple(rec.output_tokens),
                    "prefill": m.prefill_tokens, "critical": m.critical_path_prefill_tokens,
                    "fed": fed[0] - last})
                last = fed[0]
                await anyio.sleep(0.2)  # the client "acts": the prefetch runs meanwhile
                if trim:  # the scheduler's own rung, as memory pressure runs it on an idle slot
                    scheduler = host.pool.scheduler
                    out["trimmed"].append(await scheduler.pressure.trim_to_reuse_point(
                        scheduler._slots[got.conversation_id]))  # noqa: SLF001
            if fresh:
                for t in range(1, STEPS):
                    # every answer so far: the lines the continued conversation keeps
                    # of the steps that left its window (a client sends only the last
                    # K-1), so that the fresh conversation's prompt is the same
                    one = await host.chat.complete(_request(t, answers, kept=t),
                                                   f"fresh-{t}", ANONYMOUS)
                    out["fresh"].append(tuple(one.step.act.record.output_tokens))
                    await host.conversations.close(one.conversation_id)

    anyio.run(main)
    return out


@pytest.mark.parametrize(("arch", "overlap"), [("llama", True), ("qwen35", True),
                                               ("qwen35", False)])
def test_chrono_slot_answers_as_from_scratch_and_appends_while_the_window_grows(
        forged, arch, overlap) -> None:
    """With overlap (the step after a prefetch) and without (a step from the checkpoints
    alone: on the hybrid, the recurrent state after the last image, then the region's)."""
    chrono = _conversation(forged, arch, "chrono-slot", overlap=overlap, fresh=True)
    slot = _conversation(forged, arch, None, overlap=overlap)  # terminal-slot
    steps, old = chrono["steps"], slot["steps"]
    print(f"{arch}, overlap {overlap}: rows fed per step, chrono-slot / terminal-slot:",
          [(c["fed"], s["fed"]) for c, s in zip(steps, old)])
    assert {s["policy"] for s in steps} == {"chrono-slot"}
    assert {s["policy"] for s in old} == {"terminal-slot"}
    # exact: each continued answer is the fresh conversation's, token for token
    assert len({s["tokens"] for s in steps}) > 1  # the answers depend on the prompt
    assert [s["tokens"] for s in steps[1:]] == chrono["fresh"]
    # every row the engine was fed is one the step accounted for (prefetch included)
    for s in steps + old:
        assert s["fed"] == s["prefill"], [(s["prefill"], s["fed"]) for s in steps + old]
    for t in range(1, WINDOW):  # growing: one screenshot and a line, not the window again
        assert steps[t]["fed"] < old[t]["fed"]
    growing = sum(s["fed"] for s in steps[1:WINDOW])
    assert growing <= 0.6 * sum(s["fed"] for s in old[1:WINDOW])
    for t in range(WINDOW, STEPS):  # sliding: the window again, and K-1 lines inside it
        assert old[t]["fed"] <= steps[t]["fed"] <= old[t]["fed"] + 64


@pytest.mark.parametrize(("arch", "window", "overlap", "trim"), [
    ("qwen35", WINDOW, True, True), ("llama", WINDOW, False, True),
    ("qwen35", 1, False, False), ("llama", 1, True, False)])
def test_chrono_slot_is_exact_after_a_trim_and_with_a_one_screenshot_window(
        forged, arch, window, overlap, trim) -> None:
    """The paths the test above does not take: the memory ladder cutting each step back to
    the region anchor (on the hybrid through the region checkpoint, leaving the checkpoint
    after the last image beyond the sequence's end), and K = 1 (no growing step; the
    prefetch holds no screenshot).  Every answer is still the fresh conversation's."""
    out = _conversation(forged, arch, "chrono-slot", overlap=overlap, fresh=True,
                        window=window, trim=trim)
    steps = out["steps"]
    assert {s["policy"] for s in steps} == {"chrono-slot"}
    if trim:  # the rung did cut back after every step
        assert len(out["trimmed"]) == STEPS and all(f > 0 for f in out["trimmed"])
    assert len({s["tokens"] for s in steps}) > 1
    assert [s["tokens"] for s in steps[1:]] == out["fresh"]


def test_bench_peer_names_the_default_policy_it_measured() -> None:
    """bench-peer's table says which policy answered when it was given none (the answers'
    ``policy``: chrono-slot behind the default server)."""
    from runtime.bench import run_peer

    arm = {"server": "kvagent", "policy": "chrono-slot"}
    assert run_peer._server_label(arm, None) == "kvagent (chrono-slot)"
    assert run_peer._server_label({"server": "llama-server"}, None) == "llama-server"
    assert run_peer._server_label({"server": "kvagent", "policy": None}, None) == "kvagent"
