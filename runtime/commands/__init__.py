"""Sub-commands of the ``kvagent`` CLI; each module has HELP, add_arguments(p) and run(args)."""
