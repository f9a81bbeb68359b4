"""Hostile and broken screenshots for the fault and fuzz tests, built byte by byte."""

from __future__ import annotations

import functools
import io
import struct
import zlib

from PIL import Image

SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _chunk(kind: bytes, data: bytes) -> bytes:
    return (struct.pack(">I", len(data)) + kind + data
            + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF))


def _ihdr(width: int, height: int) -> bytes:
    return _chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0))  # 8-bit gray


@functools.cache
def bomb_png(side: int = 14000) -> bytes:
    """A valid grayscale PNG of ``side`` x ``side`` black pixels: a few hundred KB that
    decode to ``side``² bytes (14000: 196 MB, over Pillow's decompression-bomb limit)."""
    deflate = zlib.compressobj(9)
    row = bytes(side + 1)  # filter byte + pixels
    parts = [deflate.compress(row) for _ in range(side)]
    data = b"".join(parts) + deflate.flush()
    return SIGNATURE + _ihdr(side, side) + _chunk(b"IDAT", data) + _chunk(b"IEND", b"")


def header_only_png(width: int, height: int) -> bytes:
    """A PNG whose header claims ``width`` x ``height`` with (almost) no pixel data."""
    return (SIGNATURE + _ihdr(width, height) + _chunk(b"IDAT", zlib.compress(b"\x00"))
            + _chunk(b"IEND", b""))


def corrupt_png(png: bytes) -> bytes:
    """``png`` with bytes flipped inside its pixel data (the chunk CRC no longer matches)."""
    at = png.index(b"IDAT") + 8
    return png[:at] + bytes(b ^ 0xFF for b in png[at:at + 8]) + png[at + 8:]


def jpeg_of(png: bytes) -> bytes:
    with Image.open(io.BytesIO(png)) as img:
        out = io.BytesIO()
        img.convert("RGB").save(out, "JPEG", quality=90)
    return out.getvalue()


def png_of_size(width: int, height: int, color: tuple[int, int, int] = (90, 120, 200)) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (width, height), color).save(out, "PNG")
    return out.getvalue()
