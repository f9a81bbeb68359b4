"""kvagent.vmenv (see ../shared/DESIGN.md)."""
