"""kvagent.runtime: the episode loop and its surfaces (run, OSWorld agent, serve, cluster, bench,
command line); the map of its modules is docs/structure.md."""
