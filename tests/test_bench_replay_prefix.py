"""``kvagent bench-replay-prefix`` on the shipped trained hybrid (real engine, two short
prefixes): the arms are what they claim — the exact checkpoint and a budget covering the
prefix give the full prefill's first-token logits bit for bit, a short replay from the zero
state does not (the check can fail), every arm's prefilled tokens are its replayed rows plus
the suffix — and the command's argument errors say what is wrong.  No speed is asserted:
speed claims come from the command's own side-by-side run (docs/benchmarks.md §11)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from runtime.agent_models import agent_files
from runtime.cli import main

SCREEN = (640, 360)


@pytest.fixture(scope="module")
def hybrid():
    from cachepolicy.engine import Engine, EngineConfig

    model, mmproj = agent_files("qwen35")
    engine = Engine(model, mmproj, EngineConfig(n_ctx_per_seq=2048, n_seq_max=1, n_threads=1,
                                                decode_rows=1))
    yield engine
    engine.close()


def test_the_arms_are_what_they_claim(hybrid) -> None:
    from cachepolicy.segments import SegmentFactory
    from cachepolicy.tail import ReplayBudget
    from runtime.bench import replay_prefix as rp
    from runtime.bench.agent_prefix import agent_prompt, case
    from runtime.config import AgentConfig

    factory = SegmentFactory(hybrid)
    config = AgentConfig(policy="noevict")
    prompt = agent_prompt(factory, config, SCREEN, 900)
    cases = [case(prompt, 300, "text"), case(prompt, 800, "screenshot")]
    assert cases[0].suffix_rows == 32 and cases[1].screenshots >= 1
    assert all(abs(c.prefix_rows - c.length) <= 120 for c in cases)  # half a screenshot
    budgets = [ReplayBudget.parse(b, "zero") for b in ("0", "16", "100%")]
    report = rp.run(hybrid, factory, prompt, cases, budgets, config=config, screen=SCREEN,
                    suffix="mixed", repeats=2)
    assert report.arms == ("full", "exact", "tail@0", "tail@16", "tail@100%")
    assert report.ok
    for c in report.cases:
        whole = c.prefix_rows + c.suffix_rows
        full, exact = c.summary("full"), c.summary("exact")
        assert (full["start"], full["prefill_tokens"]) == ("clear", whole)
        assert (exact["start"], exact["prefill_tokens"]) == ("truncate", c.suffix_rows)
        assert exact["bitwise"] and not exact["approximate"]
        assert exact["checkpoint_bytes"] == c.checkpoint_bytes > 0
        # r = L: the cut reaches position 0, a full prefill: the exact logits, bitwise
        everything = c.summary("tail@100%")
        assert everything["start"] == "clear" and everything["bitwise"]
        assert everything["prefill_tokens"] == whole and everything["kl"] == 0.0
        # r = 0 from the zero state: not the exact state (the bitwise check can fail)
        zero = c.summary("tail@0")
        assert (zero["start"], zero["replay_tokens"]) == ("replay", 0)
        assert zero["prefill_tokens"] == c.suffix_rows
        assert zero["approximate"] and not zero["bitwise"] and zero["kl"] > 0
        assert zero["checkpoint_bytes"] == 0 and zero["checkpoint_bytes_saved"] > 0
        short = c.summary("tail@16")
        assert short["start"] == "replay" and short["replay_tokens"] >= 16  # images whole
        assert short["prefill_tokens"] == short["replay_tokens"] + c.suffix_rows
        assert all(rp.tokens_add_up(c, a) for a in report.arms)
        assert 0 < c.top1_p <= 1
        # the arms alternate their order: forward, then backward
        firsts = [s.arm for s in c.samples]
        assert firsts[:5] == list(report.arms) and firsts[5:] == list(reversed(report.arms))
        assert all(len(c.of(a)) == 2 and c.deterministic[a] for a in report.arms)


def test_tokens_that_do_not_add_up_are_caught(hybrid) -> None:
    """The report's check reads the samples: a tail arm that prefilled one row more than
    its replay and the suffix fails it."""
    import attrs

    from runtime.bench import replay_prefix as rp

    s = rp.Sample("tail@16", 0, 0.1, prefill_tokens=50, replay_tokens=16, start="replay",
                  approximate=True, first_token=1, logits_sha="x")
    c = rp.CaseResult(100, 100, 33, 0, 1, (s,), {}, {}, {}, {})
    assert rp.tokens_add_up(c, "tail@16") is False
    assert rp.tokens_add_up(attrs.evolve(c, suffix_rows=34), "tail@16") is True


@pytest.mark.parametrize(("args", "message"), [
    (["--budgets", "0,5x"], "replay budget '5x'"),
    (["--budgets", "64,64"], "given twice"),
    (["--lengths", "1K,abc"], "'abc' is not a length"),
    (["--lengths", "9000"], "trained for 8192 positions"),
    (["--repeats", "0"], "--repeats must be 1..50"),
    (["--mmproj", "x.gguf"], "give both --model and --mmproj"),
])
def test_argument_errors_say_what_is_wrong(capsys, args: list[str], message: str) -> None:
    assert main(["bench-replay-prefix", "--threads", "1", *args]) == 2
    assert message in capsys.readouterr().err


def test_an_attention_only_model_is_refused(capsys) -> None:
    model, mmproj = agent_files("llama")
    assert main(["bench-replay-prefix", "--threads", "1", "--model", str(model),
                 "--mmproj", str(mmproj), "--lengths", "256"]) == 2
    assert "attention-only: no recurrent state to replay" in capsys.readouterr().err


def test_a_damaged_model_file_is_named_as_such(capsys, tmp_path: Path) -> None:
    # the message blames the file, not its metadata (it used to say the metadata lacked
    # the training context for any unreadable file)
    _, mmproj = agent_files("qwen35")
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF" + b"\x00" * 64)
    assert main(["bench-replay-prefix", "--threads", "1", "--model", str(bad),
                 "--mmproj", str(mmproj), "--lengths", "256"]) == 2
    err = capsys.readouterr().err
    assert "cannot read it as GGUF" in err and "does not say" not in err


def test_the_command_reports_and_writes_json(capsys, tmp_path: Path) -> None:
    out = tmp_path / "prefix.json"
    assert main(["bench-replay-prefix", "--threads", "1", "--lengths", "400",
                 "--budgets", "0,10%", "--repeats", "1", "--suffix", "text",
                 "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "full / arm" in text and "exact arm bitwise the full prefill: yes" in text
    report = json.loads(out.read_text())
    assert report["ok"] and report["n_ctx_train"] == 8192 and report["suffix"] == "text"
    (c,) = report["cases"]
    assert c["length"] == 400 and set(c["arms"]) == {"full", "exact", "tail@0", "tail@10%"}
    assert c["arms"]["tail@10%"]["replay_tokens"] >= 40
