"""kvagent.runtime (see ../shared/DESIGN.md)."""
