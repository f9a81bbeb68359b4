"""A request's images: bounded by their header before a pixel is decoded.

Every image a request carries — a chat message's ``image_url`` part, an episode step's
screenshot — is identified from its first bytes (Pillow's lazy open reads the header only:
``vmenv.png.image_size``) and refused (413, ``image_too_large``) when its size is over
``Limits.max_image_pixels``, or when it would bring the request's images over
``Limits.max_request_pixels``.  Only then is it decoded and checked whole
(``vmenv.png.screenshot_png``: PNG verified, other formats converted to PNG).

Refused, not downscaled: shrinking a PNG needs its whole bitmap decoded first — exactly the
work being bounded (a flat 16000x4000 PNG is a few KB on the wire and a minute of CPU) — and
the client knows better than the server which size it wants.  The limits default to the
largest screen kvagent's agents are sized for (a 3840x2160 4K screen per image) and 16
1920x1080 screenshots per request; ``kvagent serve --max-image-pixels`` /
``--max-request-pixels`` change them.
"""

from __future__ import annotations

import base64
import binascii

from runtime.actions import Screen
from runtime.serve.config import Limits
from runtime.serve.http.errors import ApiError, bad_request, too_large
from vmenv.errors import ScreenshotError
from vmenv.png import image_size, screenshot_png


class PixelBudget:
    """The pixels a request's images may still take (``Limits.max_request_pixels``)."""

    def __init__(self, limits: Limits) -> None:
        self.limits = limits
        self.left = limits.max_request_pixels

    def take(self, size: Screen, where: str, param: str) -> None:
        w, h = size
        cap = self.limits.max_image_pixels
        if w * h > cap:
            raise ApiError(413, f"{where}: an image of {w}x{h} = {w * h} pixels; this server "
                                f"takes at most {cap} pixels per image (resize it first)",
                           "invalid_request_error", param, "image_too_large")
        if w * h > self.left:
            raise ApiError(413, f"{where}: the request's images are over "
                                f"{self.limits.max_request_pixels} pixels in all",
                           "invalid_request_error", param, "image_too_large")
        self.left -= w * h


def decode_base64(payload: str, where: str, param: str, limits: Limits) -> bytes:
    """An image's bytes from base64 (bounded by ``Limits.max_image_bytes`` first)."""
    if len(payload) * 3 // 4 > limits.max_image_bytes:
        raise too_large(f"{where}: an image of ~{len(payload) * 3 // 4} bytes; the limit is "
                        f"{limits.max_image_bytes}", param=param)
    try:
        return base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        raise bad_request(f"{where}: the image is not valid base64", param=param,
                          code="invalid_image") from None


def read_image(data: bytes, budget: PixelBudget, where: str, param: str) -> tuple[bytes, Screen]:
    """``data`` as PNG bytes and its size, checked against ``budget`` from its header before
    anything is decoded (blocking: run it off the event loop)."""
    try:
        _, size = image_size(data)
        budget.take(size, where, param)
        return screenshot_png(data)
    except ScreenshotError as exc:
        raise bad_request(f"{where}: {exc}", param=param, code="invalid_image") from None
