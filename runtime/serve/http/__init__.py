"""``kvagent serve``'s HTTP layer, above the serve domain (``runtime/serve``):

- ``app.py``: the Starlette app of a model host (lifespan, the guard: errors and counts);
- ``auth.py``: API keys (``Authorization: Bearer``) and the owner a request acts for;
- ``server.py``: uvicorn with the connection limits (a request head's deadline, a cap on
  open connections);
- ``routes.py``: the ONE route table, bound by this app and by the cluster's front door;
- ``handlers.py``: the model host's handler per route;
- ``body.py``: reading a request body within its limit and deadline, JSON that is safe to
  walk;
- ``images.py``: a request's images, bounded by their header before they are decoded;
- ``chat_requests.py`` / ``chat_bodies.py``: chat completions in and out (OpenAI's shapes);
- ``episode_bodies.py``: the episode API in and out;
- ``streaming.py``: chat completions as server-sent events;
- ``lease_stream.py``: an episode's lease (the heartbeat stream a client holds open);
- ``errors.py``: OpenAI-shaped errors, and the one mapping of failures to them.
"""
