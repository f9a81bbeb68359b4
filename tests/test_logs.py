"""The log configuration follows ``sys.stderr`` as it is when a line is written."""

from __future__ import annotations

import io
import sys

import pytest
import structlog

from runtime.logs import configure_logging


def test_a_log_line_after_the_configured_stderr_closed_goes_to_the_current_one(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # configured while stderr was a stream that is later closed (a command run under a
    # test's capture, a daemon that redirects stderr): later lines must not raise
    first = io.StringIO()
    monkeypatch.setattr(sys, "stderr", first)
    configure_logging("warning", json=True)
    first.close()
    second = io.StringIO()
    monkeypatch.setattr(sys, "stderr", second)
    structlog.get_logger("test").warning("after_the_switch", n=1)
    assert '"event": "after_the_switch"' in second.getvalue()
    structlog.get_logger("test").info("below_the_level")
    assert "below_the_level" not in second.getvalue()
