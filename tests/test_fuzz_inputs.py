"""Fuzzing the runtime's other inputs with hypothesis (the action parsers are fuzzed in
test_fuzz_parsers.py): arbitrary bytes as screenshots, arbitrary task ids through the result
directory, arbitrary instructions and model text through the prompt and the recorder.

Contracts: screenshot readers raise only their documented error types (``ScreenshotError``,
``ImageError``); a task id either is refused (``UnsafePathError``) or names a directory
strictly inside the result dir, and recording there writes nothing outside it; any
instruction tokenizes into the prompt, and any model text round-trips through traj.jsonl.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import anyio
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from bad_images import SIGNATURE, bomb_png, corrupt_png, header_only_png, jpeg_of, png_of_size
from cachepolicy.errors import ImageError
from cachepolicy.engine.images import decode_png
from runtime.env_loop import checked_observation
from runtime.run.recording import EpisodeRecorder, ResultLayout, UnsafePathError
from runtime.run.result_dir import plan_resume
from vmenv.base import Observation
from vmenv.errors import ScreenshotError
from vmenv.png import image_size, png_size, screenshot_png

FUZZ = settings(max_examples=200, deadline=None, suppress_health_check=list(HealthCheck))
SMALL = png_of_size(40, 30)
# bytes that look like an image at first: real headers followed by anything
HEADERS = st.sampled_from([SIGNATURE, SIGNATURE + SMALL[8:33], b"\xff\xd8\xff", b"GIF89a",
                           b"BM", b"RIFF\x00\x00\x00\x00WEBPVP8 ", b"%!PS-Adobe-3.0 EPSF",
                           b"II*\x00", b""])
SCREENSHOT_BYTES = st.one_of(
    st.binary(max_size=600),
    st.builds(lambda h, tail: h + tail, HEADERS, st.binary(max_size=400)),
    st.builds(lambda cut: SMALL[:cut], st.integers(0, len(SMALL))),  # truncations
    st.builds(lambda at, b: SMALL[:at] + bytes([b]) + SMALL[at + 1:],
              st.integers(0, len(SMALL) - 1), st.integers(0, 255)),  # one byte changed
)


@FUZZ
@given(SCREENSHOT_BYTES)
@example(b"")
@example(corrupt_png(SMALL))
@example(header_only_png(20000, 10))
@example(header_only_png(16000, 16000))
@example(jpeg_of(SMALL))
def test_arbitrary_bytes_as_a_screenshot(data: bytes) -> None:
    for read, errors in ((png_size, ScreenshotError), (image_size, ScreenshotError),
                         (screenshot_png, ScreenshotError), (decode_png, ImageError)):
        try:
            out = read(data)
        except errors:
            continue
        if read is screenshot_png:  # what it accepts is a whole PNG the engine can decode
            png, size = out
            assert png.startswith(SIGNATURE) and decode_png(png).width == size[0]


def test_a_decompression_bomb_is_refused_from_its_header() -> None:
    bomb = bomb_png()
    assert len(bomb) < 1 << 20  # a few hundred KB ...
    with pytest.raises(ScreenshotError, match="over Pillow's limit"):
        png_size(bomb)  # ... refused before 196 MB of pixels are allocated
    with pytest.raises(ImageError):
        decode_png(bomb)


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.one_of(st.none(), st.integers(), SCREENSHOT_BYTES))
def test_arbitrary_observations_enter_the_loop_as_pngs_or_not_at_all(shot) -> None:
    obs = Observation(screenshot=shot, width=1, height=1, instruction="", step=0)
    try:
        checked = anyio.run(checked_observation, obs)
    except ScreenshotError:
        return
    assert checked.screenshot.startswith(SIGNATURE)
    assert png_size(checked.screenshot) == checked.size


TEXT = st.text(st.characters(codec="utf-8"), max_size=40)
ADVERSARIAL_IDS = ["..", ".", "../x", "a/b", "a\\b", "/abs", "\x00", "a\nb", " ", "",
                   "~", "~root", "$HOME", "%2e%2e", "..\u2215x", "con", "nul", "a" * 300]


@settings(max_examples=80, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.one_of(TEXT, st.sampled_from(ADVERSARIAL_IDS)))
def test_arbitrary_task_ids_stay_inside_the_result_dir(task_id: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "results"
        layout = ResultLayout(root, "model", "domain")
        try:
            path = layout.task_dir(task_id)
        except UnsafePathError:
            return
        assert path.is_relative_to(root.resolve()) and path != root.resolve()
        assert path.parent == layout.domain_dir.resolve()
        plan_resume(layout, {"run": 1}, [task_id]).apply()
        try:
            recorder = EpisodeRecorder.create(layout, task_id)
        except OSError:  # the file system's own limits (e.g. a name over 255 bytes)
            return
        with recorder:
            recorder.record_step(step_num=1, action="WAIT", response=task_id, reward=0.0,
                                 done=False, info={"id": task_id}, screenshot=SMALL,
                                 metrics={})
            recorder.finish(0.0)
        written = [p for p in Path(tmp).rglob("*")
                   if p.is_file() and p.parent != layout.domain_dir]  # (the manifest)
        assert written and all(p.resolve().is_relative_to(path) for p in written)
        assert plan_resume(layout, {"run": 1}, [task_id]).finished == (task_id,)


@pytest.fixture(scope="module")
def factory(engines):
    from cachepolicy.segments import SegmentFactory

    return SegmentFactory(engines("qwen35"))


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(instruction=st.text(max_size=200), response=st.text(max_size=200))
def test_arbitrary_instructions_and_model_text(factory, instruction: str,
                                               response: str) -> None:
    from runtime.config import AgentConfig
    from runtime.config import system_prompt

    seg = factory.instruction(instruction)
    assert seg.n_tokens >= 1
    prompt = system_prompt(AgentConfig(), (640, 360))
    assert factory.preamble(prompt).n_tokens >= 1
    with tempfile.TemporaryDirectory() as tmp:
        layout = ResultLayout(Path(tmp), "model", "domain")
        with EpisodeRecorder.create(layout, "task") as rec:
            rec.record_step(step_num=1, action="WAIT", response=response, reward=0.0,
                            done=False, info={"instruction": instruction}, screenshot=SMALL,
                            metrics={"note": response})
        line = json.loads((rec.directory / "traj.jsonl").read_text())
        assert line["response"] == response and line["info"]["instruction"] == instruction
