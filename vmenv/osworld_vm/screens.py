"""What the simulated VM shows: screenshots, recordings and the accessibility tree.

A screenshot is the desktop rendered at the screen's size (``simdesk_render``), then, if
``ScreenshotSpec.size`` differs, resized to it — a VM whose screenshots are not in screen
pixels (HiDPI), where pyautogui coordinates still are — and encoded as PNG or JPEG (the two
formats OSWorld's PythonController accepts).  At the screen's size as PNG the bytes are
exactly ``render_png``'s, the same as ``SimDesk`` / ``FakeDesktopEnv`` screenshots.

Rendering is CPU work of a few milliseconds: the server calls these in a worker thread.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from typing import Literal
from xml.etree import ElementTree

import attrs
from PIL import Image

from vmenv.simdesk.render import render, render_png
from vmenv.simdesk.state import DeskState
from vmenv.simdesk.widgets import widgets

ImageFormat = Literal["png", "jpeg"]
MEDIA_TYPES: dict[str, str] = {"png": "image/png", "jpeg": "image/jpeg"}
JPEG_QUALITY = 90
#: Shown per frame of a recording, in milliseconds.
FRAME_MS = 500


@attrs.frozen
class ScreenshotSpec:
    """How screenshots are made: ``size`` (None: the screen's) and ``fmt``."""

    size: tuple[int, int] | None = None
    fmt: ImageFormat = attrs.field(default="png", validator=attrs.validators.in_(MEDIA_TYPES))

    @property
    def media_type(self) -> str:
        return MEDIA_TYPES[self.fmt]


def _image(state: DeskState, size: tuple[int, int] | None) -> Image.Image:
    img = render(state)
    if size is not None and size != img.size:
        img = img.resize(size, Image.Resampling.BILINEAR)
    return img


def screenshot(state: DeskState, spec: ScreenshotSpec) -> bytes:
    """The screen as ``spec`` says (deterministic: same state and spec, same bytes)."""
    screen = (state.metrics.width, state.metrics.height)
    if spec.fmt == "png" and spec.size in (None, screen):
        return render_png(state)
    buf = io.BytesIO()
    img = _image(state, spec.size)
    if spec.fmt == "png":
        img.save(buf, format="PNG", compress_level=1)
    else:
        img.save(buf, format="JPEG", quality=JPEG_QUALITY)
    return buf.getvalue()


def recording(frames: Sequence[DeskState], size: tuple[int, int] | None) -> bytes:
    """The frames as one animated PNG (APNG).  OSWorld's runner saves whatever
    /end_recording returns as ``recording.mp4``; an MP4 encoder is not worth its weight for a
    stand-in, so the file holds APNG (``image/apng``), which browsers and Pillow play."""
    if not frames:
        raise ValueError("a recording needs at least one frame")
    images = [_image(s, size) for s in frames]
    buf = io.BytesIO()
    images[0].save(buf, format="PNG", save_all=True, append_images=images[1:],
                   duration=FRAME_MS, loop=0, compress_level=1)
    return buf.getvalue()


def accessibility_tree(state: DeskState) -> str:
    """The on-screen widgets as XML, top-most first, in screen pixels (a small tree in the
    spirit of OSWorld's AT-SPI dump, not its schema)."""
    root = ElementTree.Element("desktop-frame", name="simdesk", width=str(state.metrics.width),
                               height=str(state.metrics.height))
    for w in widgets(state):
        r = w.rect
        ElementTree.SubElement(root, "widget", name=w.name, x=str(r.x0), y=str(r.y0),
                               width=str(r.width), height=str(r.height))
    return ElementTree.tostring(root, encoding="unicode")
