"""A PNG whose chunk CRCs are right but whose pixel data is not whole — a deflate stream cut
off, too few or too many rows, bytes after the stream, a bad row filter — is refused by every
intake (``vmenv.png.png_size``, which ``screenshot_png``, the env loop, ``KvAgent`` and the
server's ``read_image`` all use); whole PNGs of every colour type, depth and interlace pass.
"""

from __future__ import annotations

import base64
import io
import struct
import tracemalloc
import zlib

import anyio
import httpx
import numpy as np
import pytest
from PIL import Image

from fault_helpers import FAULT_AT, TRAJ, FaultyEnv, engine, failed_at, run_three, shot  # noqa: F401
from runtime.bench.trajectory import screenshot
from runtime.env_loop import checked_observation
from serve_helpers import kvagent_serve
from vmenv.base import Observation
from vmenv.errors import ScreenshotError
from vmenv.png import png_size, screenshot_png

SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _chunk(kind: bytes, data: bytes) -> bytes:
    return (struct.pack(">I", len(data)) + kind + data
            + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF))


def _noisy_png(width: int = 96, height: int = 64) -> bytes:
    rng = np.random.default_rng(0)
    out = io.BytesIO()
    Image.fromarray(rng.integers(0, 255, (height, width, 3), dtype=np.uint8)).save(out, "PNG")
    return out.getvalue()


def _parts(png: bytes) -> tuple[bytes, bytes]:
    """(the IHDR chunk, the inflated pixel data) of a PNG with no other ancillary chunks."""
    at, ihdr, idat = 8, b"", b""
    while at < len(png):
        (n,), kind = struct.unpack(">I", png[at:at + 4]), png[at + 4:at + 8]
        if kind == b"IHDR":
            ihdr = png[at:at + 12 + n]
        elif kind == b"IDAT":
            idat += png[at + 8:at + 8 + n]
        at += 12 + n
    return ihdr, zlib.decompress(idat)


def _rebuilt(png: bytes, stream: bytes, pieces: int = 1) -> bytes:
    """``png``'s header with ``stream`` as its IDAT data (in ``pieces`` chunks), every CRC
    right."""
    ihdr, _ = _parts(png)
    step = -(-len(stream) // pieces)
    idats = b"".join(_chunk(b"IDAT", stream[i:i + step]) for i in range(0, len(stream), step))
    return SIGNATURE + ihdr + idats + _chunk(b"IEND", b"")


def truncated_stream_png(png: bytes | None = None) -> bytes:
    """A PNG whose deflate stream stops halfway, re-chunked with good CRCs."""
    png = png or _noisy_png()
    stream = zlib.compress(_parts(png)[1])
    return _rebuilt(png, stream[:len(stream) // 2])


def _refused(data: bytes, match: str) -> None:
    with pytest.raises(ScreenshotError, match=match):
        png_size(data)
    with pytest.raises(ScreenshotError, match=match):
        screenshot_png(data)


def test_a_truncated_deflate_stream_with_good_crcs_is_refused() -> None:
    png = _noisy_png()
    bad = truncated_stream_png(png)
    with Image.open(io.BytesIO(bad)) as img:
        img.verify()  # every chunk's CRC is right: what png_size checked before
    _refused(bad, "truncated PNG")
    raw = _parts(png)[1]
    stream = zlib.compress(raw)
    # the stream cut in several chunks, and cut before its checksum only
    _refused(_rebuilt(png, stream[:len(stream) // 3], pieces=4), "truncated PNG")
    _refused(_rebuilt(png, stream[:-2]), "truncated PNG")
    # a complete stream, one row short; one row too many
    row = len(raw) // 64
    _refused(_rebuilt(png, zlib.compress(raw[:-row])), "truncated PNG")
    _refused(_rebuilt(png, zlib.compress(raw + raw[:row])), "more pixel data")
    # bytes after the stream's end, in its chunk or in a chunk of their own
    _refused(_rebuilt(png, stream + b"\x00"), "after the end")
    _refused(SIGNATURE + _parts(png)[0] + _chunk(b"IDAT", stream) + _chunk(b"IDAT", b"x")
             + _chunk(b"IEND", b""), "after the end")
    # no pixel data at all; a row filter type that does not exist
    _refused(SIGNATURE + _parts(png)[0] + _chunk(b"IEND", b""), "truncated PNG")
    _refused(_rebuilt(png, zlib.compress(b"\x07" + raw[1:])), "filter type 7")
    _refused(_rebuilt(png, b"\x78\x9c\xff\xff" + stream[4:]), "bad pixel stream")
    assert png_size(_rebuilt(png, stream, pieces=5)) == (96, 64)  # split anywhere: fine


@pytest.mark.parametrize("mode, size", [
    ("RGB", (96, 64)), ("RGBA", (33, 7)), ("L", (1, 1)), ("LA", (5, 3)), ("P", (31, 17)),
    ("1", (13, 9)), ("I;16", (7, 5)),
])
def test_whole_pngs_of_every_kind_pass(mode: str, size: tuple[int, int]) -> None:
    rng = np.random.default_rng(1)
    img = Image.fromarray(rng.integers(0, 255, (size[1], size[0], 3), dtype=np.uint8))
    img = img.convert("P", palette=Image.Palette.ADAPTIVE, colors=5) if mode in ("P",) \
        else img.convert(mode)
    for bits in ((1, 2, 4) if mode == "P" else (None,)):
        out = io.BytesIO()
        img.save(out, "PNG", **({"bits": bits} if bits else {}))
        assert png_size(out.getvalue()) == size
        data, got = screenshot_png(out.getvalue())
        assert got == size and data == out.getvalue()


def _adam7_png(pixels: np.ndarray) -> bytes:
    """An interlaced 8-bit grayscale PNG, built by hand (Pillow does not write Adam7)."""
    h, w = pixels.shape
    raw = b""
    for x0, y0, dx, dy in ((0, 0, 8, 8), (4, 0, 8, 8), (0, 4, 4, 8), (2, 0, 4, 4),
                           (0, 2, 2, 4), (1, 0, 2, 2), (0, 1, 1, 2)):
        sub = pixels[y0::dy, x0::dx]
        if sub.size:
            raw += b"".join(b"\x00" + bytes(r) for r in sub)
    ihdr = _chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 0, 0, 0, 1))
    return SIGNATURE + ihdr + _chunk(b"IDAT", zlib.compress(raw)) + _chunk(b"IEND", b"")


@pytest.mark.parametrize("size", [(1, 1), (3, 2), (9, 10), (40, 33)])
def test_interlaced_pngs_pass_whole_and_are_refused_short(size: tuple[int, int]) -> None:
    pixels = np.random.default_rng(2).integers(0, 255, (size[1], size[0]), dtype=np.uint8)
    png = _adam7_png(pixels)
    with Image.open(io.BytesIO(png)) as img:  # Pillow reads the hand-built file as meant
        assert np.array_equal(np.asarray(img), pixels)
    assert png_size(png) == size
    raw = _parts(png)[1]
    _refused(_rebuilt(png, zlib.compress(raw[:-1])), "truncated PNG")


def test_a_bomb_within_the_size_limits_is_checked_in_bounded_memory() -> None:
    """81 M pixels of one grey (within Pillow's limit): the stream is inflated 1 MiB at a time
    and dropped, never held whole."""
    side = 9000
    deflate = zlib.compressobj(9)
    stream = b"".join(deflate.compress(bytes(side + 1)) for _ in range(side)) + deflate.flush()
    png = SIGNATURE + _chunk(b"IHDR", struct.pack(">IIBBBBB", side, side, 8, 0, 0, 0, 0)) \
        + _chunk(b"IDAT", stream) + _chunk(b"IEND", b"")
    tracemalloc.start()
    try:
        assert png_size(png) == (side, side)
        cut = _rebuilt(png, stream[:len(stream) // 2])
        tracemalloc.reset_peak()
        with pytest.raises(ScreenshotError, match="truncated PNG"):
            png_size(cut)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 3 * len(png) + (8 << 20)  # the file and a few MiB, not 81 MB


def test_the_env_loop_refuses_it_as_a_screenshot_error() -> None:
    obs = Observation(screenshot=truncated_stream_png(), width=96, height=64,
                      instruction="", step=0)
    with pytest.raises(ScreenshotError, match="truncated PNG"):
        anyio.run(checked_observation, obs)


async def test_a_vm_screenshot_cut_short_fails_the_step(engine, tmp_path) -> None:
    """After a step the VM sends a PNG with good CRCs and half a pixel stream: the step fails
    with a ScreenshotError (the other episodes run on: ``run_three`` checks them)."""
    async def cut(out):
        return shot(out, truncated_stream_png(out.observation.screenshot))

    (ep0, *_), dirs = await run_three(engine, tmp_path, lambda env: FaultyEnv(env, cut))
    failed_at(ep0, FAULT_AT, "ScreenshotError", "truncated PNG")
    assert all(p.stat().st_size > 0 for p in dirs["ep0"].iterdir())


def test_the_real_server_answers_400_invalid_image(forged, tmp_path) -> None:
    good = screenshot(0, 320, 240)
    bad = truncated_stream_png(good)
    b64 = lambda png: base64.b64encode(png).decode()  # noqa: E731
    m = forged("qwen35")
    with kvagent_serve(m.model_path.parent, tmp_path, "--max-episodes", "1") as served, \
            httpx.Client(base_url=served.url, timeout=120) as c:
        ep = c.post("/v1/episodes", json={"instruction": "Click OK."}).json()["episode_id"]
        r = c.post(f"/v1/episodes/{ep}/step", json={"screenshot": b64(bad)})
        assert r.status_code == 400, r.text
        assert r.json()["error"]["code"] == "invalid_image"
        assert "truncated PNG" in r.json()["error"]["message"]
        image = {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{b64(bad)}"}}
        r = c.post("/v1/chat/completions", json={
            "model": served.model, "max_tokens": 4,
            "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}, image]}]})
        assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_image", r.text
        r = c.post(f"/v1/episodes/{ep}/step", json={"screenshot": b64(good)})
        assert r.status_code == 200, r.text  # a whole PNG still passes, on the same episode
        c.delete(f"/v1/episodes/{ep}")
