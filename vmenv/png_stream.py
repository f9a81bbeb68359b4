"""A PNG's pixel data is whole: the check CRCs cannot make.

A PNG's chunk CRCs (what Pillow's ``verify`` checks) say each chunk arrived as written, not
that the image is complete: an encoder cut off mid-stream, or a client that re-chunks a
truncated deflate stream with fresh CRCs, gives a file whose every CRC is right and whose
pixels end early.  ``check_pixel_stream`` inflates the IDAT data and requires exactly one
complete zlib stream (``eof``, nothing after it) holding exactly the rows the header declares
— ``height × (1 + row bytes)`` for its colour type, bit depth and interlace — each starting
with a valid filter type (0–4).

Memory stays bounded whatever the header claims: the stream is inflated ``WINDOW`` bytes at a
time (``max_length``) and the output dropped at once, so a decompression bomb costs CPU time
proportional to the pixels the caller's size limits already allow, never their memory.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Iterator

from vmenv.errors import ScreenshotError

#: Inflated bytes held at once (then dropped): the check's whole memory.
WINDOW = 1 << 20
#: channels per colour type (PNG spec §11.2.2) and the bit depths each allows
_CHANNELS = {0: 1, 2: 3, 3: 1, 4: 2, 6: 4}
_DEPTHS = {0: (1, 2, 4, 8, 16), 2: (8, 16), 3: (1, 2, 4, 8), 4: (8, 16), 6: (8, 16)}
#: Adam7's seven passes: (x0, y0, dx, dy)
_ADAM7 = ((0, 0, 8, 8), (4, 0, 8, 8), (0, 4, 4, 8), (2, 0, 4, 4), (0, 2, 2, 4),
          (1, 0, 2, 2), (0, 1, 1, 2))
_MAX_FILTER = 4


def row_layout(width: int, height: int, depth: int, colour: int,
               interlace: int) -> list[tuple[int, int]]:
    """The inflated data's rows as (row length with its filter byte, rows) per pass."""
    if colour not in _CHANNELS or depth not in _DEPTHS[colour]:
        raise ScreenshotError(f"corrupt PNG: colour type {colour} with bit depth {depth}")
    if interlace not in (0, 1):
        raise ScreenshotError(f"corrupt PNG: unknown interlace method {interlace}")
    bits = _CHANNELS[colour] * depth
    passes = _ADAM7 if interlace else ((0, 0, 1, 1),)
    layout = []
    for x0, y0, dx, dy in passes:
        cols, rows = -(-(width - x0) // dx), -(-(height - y0) // dy)
        if cols > 0 and rows > 0:  # an empty pass has no rows, not even filter bytes
            layout.append((1 + -(-cols * bits // 8), rows))
    return layout


def check_pixel_stream(data: bytes) -> None:
    """Raise ``ScreenshotError`` unless ``data``'s IDAT chunks inflate to exactly the rows its
    IHDR declares, in one complete zlib stream.  ``data`` is a PNG whose signature, chunk
    structure and CRCs were checked already (``vmenv.png.png_size``)."""
    width, height, depth, colour, _, _, interlace = struct.unpack(">IIBBBBB", data[16:29])
    layout = row_layout(width, height, depth, colour, interlace)
    expected = sum(length * rows for length, rows in layout)
    starts = _row_starts(layout)
    next_start = next(starts, None)
    inflate = zlib.decompressobj()
    total = 0
    try:
        for body in _idat_bodies(data):
            pending = body
            while True:
                if inflate.eof:  # anything left over is in unused_data (checked below)
                    if pending:
                        raise ScreenshotError("corrupt PNG: data after the end of the "
                                              "pixel stream")
                    break
                out = inflate.decompress(pending, WINDOW)
                pending = inflate.unconsumed_tail
                if total + len(out) > expected:
                    raise ScreenshotError(f"corrupt PNG: more pixel data than the "
                                          f"{width}x{height} header declares")
                while next_start is not None and next_start < total + len(out):
                    if out[next_start - total] > _MAX_FILTER:
                        raise ScreenshotError(f"corrupt PNG: row filter type "
                                              f"{out[next_start - total]}")
                    next_start = next(starts, None)
                total += len(out)
                # zlib stops short of max_length only when it needs more input
                if not pending and len(out) < WINDOW:
                    break
            if inflate.unused_data:
                raise ScreenshotError("corrupt PNG: data after the end of the pixel stream")
    except zlib.error as exc:
        raise ScreenshotError(f"corrupt PNG: bad pixel stream ({exc})") from None
    if not inflate.eof or total != expected:
        raise ScreenshotError(f"truncated PNG: the pixel stream ends after {total} of "
                              f"{expected} bytes")


def _row_starts(layout: list[tuple[int, int]]) -> Iterator[int]:
    """Offsets of every row's filter byte in the inflated data."""
    at = 0
    for length, rows in layout:
        for _ in range(rows):
            yield at
            at += length


def _idat_bodies(data: bytes) -> Iterator[bytes]:
    """The IDAT chunks' data in order (the chunk walk stops at IEND or the end of ``data``)."""
    at = 8
    while at + 8 <= len(data):
        length, kind = struct.unpack(">I4s", data[at:at + 8])
        if kind == b"IEND":
            return
        if kind == b"IDAT":
            yield data[at + 8:at + 8 + length]
        at += 12 + length
