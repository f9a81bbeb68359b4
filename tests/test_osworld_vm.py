"""The loopback VM server (``python -m vmenv.osworld_vm``) over HTTP, as OSWorld's controllers
call it, and the screenshot formats kvagent accepts.  No OSWorld code needed here (see
test_osworld_desktopenv for the real DesktopEnv)."""

from __future__ import annotations

import io
import json
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from fake_desktop_env import FakeDesktopEnv
from PIL import Image

from vmenv.actions import to_pyautogui
from vmenv.errors import ScreenshotError
from vmenv.osworld_vm import (
    CHECK_FAIL, CHECK_PASS, VmServerError, check_command, simdesk_example, start_command,
    vm_server,
)
from vmenv.osworld_vm.machine import action_record
from vmenv.png import image_size, png_size, screenshot_png
from vmenv.pyautogui_parse import OSWORLD_PRELUDE
from vmenv.simdesk.tasks import default_tasks

SCREEN = (320, 240)


def _call(url: str, method: str = "GET", body: Any = None) -> tuple[int, str, bytes]:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method,
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, r.headers.get("Content-Type", ""), r.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers.get("Content-Type", ""), exc.read()


def _json(url: str, method: str = "GET", body: Any = None) -> Any:
    status, _, data = _call(url, method, body)
    assert status == 200, data
    return json.loads(data)


def _python(code: str) -> dict[str, Any]:
    """An /execute body as PythonController.execute_python_command sends it."""
    return {"command": ["python", "-c", f"{OSWORLD_PRELUDE}; {code}"], "shell": False}


def test_the_server_reads_code_and_answers_like_a_vm(tmp_path: Path) -> None:
    task = default_tasks()["save-note"]
    fake = FakeDesktopEnv(width=SCREEN[0], height=SCREEN[1])
    fake.reset(simdesk_example("save-note"))
    with vm_server("open-terminal", SCREEN) as vm:
        url = vm.url
        # the setup step switches the task; the screen then is the fake's, byte for byte
        assert _json(f"{url}/setup/execute", "POST",
                     {"command": start_command("save-note"), "shell": False})["returncode"] == 0
        status, ctype, shot = _call(f"{url}/screenshot")
        assert status == 200 and ctype == "image/png" and shot == fake._screenshot()
        assert _json(f"{url}/execute", "POST", {"command": check_command()})["output"] \
            .startswith(CHECK_FAIL)
        assert _json(f"{url}/start_recording", "POST")["status"] == "success"
        for action in task.solve(fake.state):  # each as OSWorld sends it
            fake.step(to_pyautogui(action), 0)
            out = _json(f"{url}/execute", "POST", _python(to_pyautogui(action)))
            assert out == {"status": "success", "output": "", "error": "", "returncode": 0}
        state = _json(f"{url}/simdesk/status")
        assert state["actions"] == [action_record(a) for a in fake.applied]
        assert state["solved"] and state["task"] == "save-note"
        assert _json(f"{url}/execute", "POST", {"command": check_command()})["output"] \
            .startswith(CHECK_PASS)
        assert _json(f"{url}/cursor_position") == list(fake.state.pointer)
        assert _json(f"{url}/screen_size", "POST") == {"width": SCREEN[0], "height": SCREEN[1]}
        assert _call(f"{url}/platform")[2] == b"Linux"
        assert _json(f"{url}/execute", "POST", _python(
            "import platform; print(platform.system())"))["output"] == "Linux\n"
        at = _json(f"{url}/accessibility")["AT"]
        assert 'name="notes.save"' in at and at.startswith("<desktop-frame")
        # the recording: the state at start, then one frame per executed action
        status, ctype, video = _call(f"{url}/end_recording", "POST")
        assert status == 200 and ctype == "image/apng"
        with Image.open(io.BytesIO(video)) as img:
            assert img.n_frames == 1 + len(fake.applied) and img.size == SCREEN
        assert _call(f"{url}/end_recording", "POST")[0] == 400  # none running now

        # refused: anything but pyautogui calls with literals; nothing runs, nothing changes
        marker = tmp_path / "ran"
        for code in ("import os", f"open({str(marker)!r}, 'w')",
                     f"pyautogui.click(x=__import__('os').system('touch {marker}'))",
                     "pyautogui.screenshot('/tmp/x.png')", "pyautogui.click(1, 2); import os"):
            out = _json(f"{url}/execute", "POST", _python(code))
            assert out["returncode"] == 1 and "UnsupportedCodeError" in out["error"], code
        for command in (["ls", "-la"], "rm -rf /", ["bash", "-c", "true"]):
            out = _json(f"{url}/execute", "POST", {"command": command, "shell": True})
            assert out["returncode"] == 127
        out = _json(f"{url}/run_python", "POST", {"code": "print(1)"})
        assert out["status"] == "error"
        assert not marker.exists()
        assert _json(f"{url}/simdesk/status")["actions"] == state["actions"]
        assert _call(f"{url}/execute", "POST", ["not", "an", "object"])[0] == 400
        assert _call(f"{url}/no_such_endpoint")[0] == 404
        # the provider's snapshot revert: back to the task's start
        assert _json(f"{url}/simdesk/revert", "POST")["task"] == "save-note"
        fake.reset(simdesk_example("save-note"))
        assert _call(f"{url}/screenshot")[2] == fake._screenshot()


def test_screenshots_at_another_size_and_as_jpeg() -> None:
    with vm_server("click-ok", SCREEN, screenshot_size=(640, 480), fmt="jpeg") as vm:
        status, ctype, shot = _call(f"{vm.url}/screenshot")
        assert status == 200 and ctype == "image/jpeg" and shot[:3] == b"\xff\xd8\xff"
        assert image_size(shot) == ("JPEG", (640, 480))
        # pyautogui's screen stays what it is
        assert _json(f"{vm.url}/screen_size", "POST") == {"width": 320, "height": 240}


def test_a_server_that_cannot_start_is_a_typed_error() -> None:
    with pytest.raises(VmServerError, match="no-such-task"):
        with vm_server("no-such-task", SCREEN):
            pass


def _encoded(fmt: str, size: tuple[int, int] = (64, 48)) -> bytes:
    img = Image.new("RGB", size, (200, 30, 90))
    img.paste((10, 240, 10), (0, 0, size[0] // 2, size[1] // 2))
    buf = io.BytesIO()
    img.save(buf, format=fmt)
    return buf.getvalue()


@pytest.mark.filterwarnings("ignore::PIL.Image.DecompressionBombWarning")
def test_screenshot_png_accepts_safe_formats_and_refuses_the_rest(
        monkeypatch: pytest.MonkeyPatch) -> None:
    png = _encoded("PNG")
    assert screenshot_png(png) == (png, (64, 48))  # PNG passes through untouched
    for fmt in ("JPEG", "WEBP", "BMP", "GIF"):
        data = _encoded(fmt)
        out, size = screenshot_png(data)
        assert image_size(data) == (fmt, (64, 48)) and size == (64, 48)
        assert png_size(out) == size
        with Image.open(io.BytesIO(out)) as a, Image.open(io.BytesIO(data)) as b:
            assert a.convert("RGB").tobytes() == b.convert("RGB").tobytes()  # same pixels
    jpeg = _encoded("JPEG", (256, 256))
    eps = b"%!PS-Adobe-3.0 EPSF-3.0\n%%BoundingBox: 0 0 10 10\n"  # Pillow would run Ghostscript
    for bad in (jpeg[: len(jpeg) // 2], jpeg[:-40], eps, b"", b"GIF89a"):
        with pytest.raises(ScreenshotError):
            screenshot_png(bad)
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 256 * 256 - 1)  # the bomb limit holds
    with pytest.raises(ScreenshotError, match="limit"):
        screenshot_png(jpeg)
