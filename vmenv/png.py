"""Screenshots: validation, size and conversion to PNG without trusting the bytes.

kvagent's engine takes PNG.  A VM may send other formats — OSWorld's ``PythonController``
accepts PNG or JPEG — so ``screenshot_png`` identifies the image (``image_size``) and
re-encodes anything that is not PNG.  Blocking calls of a few milliseconds (a few tens for a
1080p conversion): run them off the event loop if it matters.
"""

from __future__ import annotations

import io
import struct

from PIL import Image, UnidentifiedImageError

from vmenv.errors import ScreenshotError
from vmenv.png_stream import check_pixel_stream

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
#: Refuse absurd headers before Pillow allocates anything (a 16K screen is 15360 wide).
MAX_SIDE = 16_384
#: The formats read as screenshots: ones screen grabbers produce and Pillow decodes itself
#: (never EPS & co., which Pillow hands to an external program).  Others are refused.
SCREENSHOT_FORMATS = ("PNG", "JPEG", "WEBP", "BMP", "GIF")
#: Errors Pillow raises for bad or hostile image bytes (DecompressionBombError is a
#: subclass of Exception, listed for the reader; IndexError: a PNG without IDAT chunks).
_BAD_IMAGE = (UnidentifiedImageError, Image.DecompressionBombError, OSError, SyntaxError,
              ValueError, EOFError, struct.error, IndexError)


def png_size(data: bytes) -> tuple[int, int]:
    """(width, height) of a PNG; raises ``ScreenshotError`` unless the whole file is valid.

    Checks the signature and the IHDR header, lets Pillow verify every chunk (CRCs and
    truncation), then inflates the pixel data (bounded memory) to check that it holds every
    row the header declares (``vmenv.png_stream``: right CRCs do not make a whole image).
    """
    if not isinstance(data, bytes | bytearray) or not data.startswith(PNG_SIGNATURE):
        raise ScreenshotError("not a PNG (bad signature)")
    if len(data) < 24 or data[12:16] != b"IHDR":
        raise ScreenshotError("truncated PNG (no IHDR header)")
    width, height = struct.unpack(">II", data[16:24])
    _check_size(width, height, "PNG")
    try:
        with Image.open(io.BytesIO(data), formats=("PNG",)) as img:
            img.verify()
    except IndexError:  # Pillow's verify finds no tile: the file has no IDAT chunk
        raise ScreenshotError("truncated PNG: no pixel data (IDAT)") from None
    except _BAD_IMAGE as exc:
        raise ScreenshotError(f"corrupt PNG: {exc}") from exc
    check_pixel_stream(data)
    return width, height


def image_size(data: bytes) -> tuple[str, tuple[int, int]]:
    """(Pillow format name, (width, height)) of a screenshot in one of
    ``SCREENSHOT_FORMATS``, read from its header; raises ``ScreenshotError`` otherwise.
    The pixels are not decoded (``png_size`` / ``screenshot_png`` check them)."""
    if not isinstance(data, bytes | bytearray) or not data:
        raise ScreenshotError("no image bytes")
    try:
        with Image.open(io.BytesIO(data), formats=SCREENSHOT_FORMATS) as img:
            fmt, (width, height) = str(img.format), img.size
    except _BAD_IMAGE as exc:
        raise ScreenshotError(f"not a readable screenshot ({', '.join(SCREENSHOT_FORMATS)}): "
                              f"{exc}") from exc
    _check_size(width, height, fmt)
    return fmt, (width, height)


def screenshot_png(data: bytes) -> tuple[bytes, tuple[int, int]]:
    """The screenshot as PNG bytes and its (width, height).  PNG comes back unchanged (after
    ``png_size``'s full check); another format is decoded and re-encoded as RGB PNG.
    Raises ``ScreenshotError`` for anything that is not a whole, sane screenshot."""
    fmt, size = image_size(data)
    if fmt == "PNG":
        return bytes(data), png_size(bytes(data))
    try:
        with Image.open(io.BytesIO(data), formats=(fmt,)) as img:
            img.load()  # decodes every pixel: a truncated file raises here
            rgb = img.convert("RGB")
    except _BAD_IMAGE as exc:
        raise ScreenshotError(f"corrupt {fmt}: {exc}") from exc
    out = io.BytesIO()
    rgb.save(out, format="PNG", compress_level=1)
    return out.getvalue(), size


def _check_size(width: int, height: int, fmt: str) -> None:
    if not (1 <= width <= MAX_SIDE and 1 <= height <= MAX_SIDE):
        raise ScreenshotError(f"{fmt} size {width}x{height} outside 1..{MAX_SIDE}")
    limit = Image.MAX_IMAGE_PIXELS
    if limit is not None and width * height > limit:  # Pillow's decompression-bomb limit
        raise ScreenshotError(f"{fmt} of {width}x{height} pixels is over Pillow's limit {limit}")
