"""Test helper: a real ``kvagent serve`` process on loopback (the forged tiny model), started
the way a user starts it and stopped with SIGTERM, checked to have exited cleanly — the
plugin's ``runtime.testing.serving.kvagent_serve`` under the name the suite imports."""

from __future__ import annotations

from runtime.testing.serving import ServeProcess, kvagent_serve

Served = ServeProcess

__all__ = ["Served", "ServeProcess", "kvagent_serve"]
