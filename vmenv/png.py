"""PNG screenshots: validation and size without trusting the bytes."""

from __future__ import annotations

import io
import struct

from PIL import Image, UnidentifiedImageError

from vmenv.errors import ScreenshotError

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
#: Refuse absurd headers before Pillow allocates anything (a 16K screen is 15360 wide).
MAX_SIDE = 16_384


def png_size(data: bytes) -> tuple[int, int]:
    """(width, height) of a PNG; raises ``ScreenshotError`` unless the whole file is valid.

    Checks the signature and the IHDR header, then lets Pillow verify every chunk (CRCs and
    truncation) — a blocking call of a few milliseconds; run it off the event loop if it matters.
    """
    if not isinstance(data, bytes | bytearray) or not data.startswith(PNG_SIGNATURE):
        raise ScreenshotError("not a PNG (bad signature)")
    if len(data) < 24 or data[12:16] != b"IHDR":
        raise ScreenshotError("truncated PNG (no IHDR header)")
    width, height = struct.unpack(">II", data[16:24])
    if not (1 <= width <= MAX_SIDE and 1 <= height <= MAX_SIDE):
        raise ScreenshotError(f"PNG size {width}x{height} outside 1..{MAX_SIDE}")
    try:
        with Image.open(io.BytesIO(data)) as img:
            img.verify()
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as exc:
        raise ScreenshotError(f"corrupt PNG: {exc}") from exc
    return width, height
