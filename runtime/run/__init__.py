"""``kvagent run``'s machinery: N agents through one engine (``agents``), recorded in
OSWorld's result layout (``recording``, ``result_dir``), with live progress (``progress``)
and a per-step plot (``plot``)."""
