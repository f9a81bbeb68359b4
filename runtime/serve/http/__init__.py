"""``kvagent serve``'s HTTP layer: the Starlette app, request parsing, response bodies,
streaming and the mapping of failures to OpenAI-shaped errors."""
