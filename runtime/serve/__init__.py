"""``kvagent serve``: one model host (engine, scheduler, memory ledger) for many agents.

Two HTTP APIs on one Starlette app (``app.py``): an OpenAI-compatible chat completions API
(``chat.py``: existing agents keep their prompts — faithful mode — or get kvagent's terminal
layout — terminal mode) and an episode API (``episodes.py``) that ``KvAgent(server=URL)``
speaks, so OSWorld's parallel workers share one model and one budget.  ``host.py`` owns the
running parts; ``requests.py`` turns request bodies into validated records; ``errors.py``
gives every failure OpenAI's error shape and the right status.
"""
