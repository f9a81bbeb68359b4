"""``kvagent bench``: cache policies side by side on one replayed trajectory."""
