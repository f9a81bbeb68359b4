"""Errors raised by the model forge."""

from __future__ import annotations


class ForgeError(ValueError):
    """A forge request was invalid (unknown arch/size, bad seed, unusable output path)."""
