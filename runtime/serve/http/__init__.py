"""``kvagent serve``'s HTTP layer, above the serve domain (``runtime/serve``):

- ``app.py``: the Starlette app of a model host (lifespan, the guard: errors and counts);
- ``routes.py``: the ONE route table, bound by this app and by the cluster's front door;
- ``handlers.py``: the model host's handler per route;
- ``body.py``: reading a request body within its limit, JSON;
- ``chat_requests.py`` / ``chat_bodies.py``: chat completions in and out (OpenAI's shapes);
- ``episode_bodies.py``: the episode API in and out;
- ``streaming.py``: chat completions as server-sent events;
- ``errors.py``: OpenAI-shaped errors, and the one mapping of failures to them.
"""
