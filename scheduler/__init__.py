"""kvagent.scheduler (see ../shared/DESIGN.md)."""
