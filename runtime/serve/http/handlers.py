"""The model host's HTTP handlers: one method per route of ``routes.ROUTES`` (by name).

Each reads and parses its request, calls the serve domain (``ModelHost``'s ``episodes``,
``chat``, ``status``, ``metrics``) on behalf of the request's owner (the API key the auth
middleware found: ``auth.owner_of``) and builds the answer; failures propagate as exceptions
for the app's guard to map (``errors.api_error``).  The host exists only while the app's
lifespan runs it (``attach``).
"""

from __future__ import annotations

import time
from itertools import chain

import anyio.to_thread
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response

from runtime.serve.host import ModelHost
from runtime.serve.http.auth import owner_of
from runtime.serve.http.body import read_json
from runtime.serve.http.body_budget import budget_of
from runtime.serve.http.chat_bodies import completion_body
from runtime.serve.http.chat_requests import conversation_key, read_chat
from runtime.serve.http.episode_bodies import (created_body, listing_body, parse_create,
                                               read_screenshot, step_body, view_body)
from runtime.serve.http.lease_stream import LeaseStream
from runtime.serve.http.streaming import ChatStream


class HostHandlers:
    def __init__(self) -> None:
        self._host: ModelHost | None = None

    def attach(self, host: ModelHost) -> None:
        self._host = host

    @property
    def host(self) -> ModelHost:
        if self._host is None:
            raise RuntimeError("the model host is not running")
        return self._host

    async def health(self, request: Request) -> Response:
        return JSONResponse(self.host.status())

    async def models(self, request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [
            {"id": self.host.model_name, "object": "model", "created": 0,
             "owned_by": "kvagent"}]})

    async def metrics(self, request: Request) -> Response:
        host = self.host
        budget = budget_of(request, host.config.limits)
        budget.check_integrity()  # (its two counts agree, within its capacity)
        gauges = [("kvagent_request_body_bytes", "The budget for request bodies being read.",
                   {"kind": kind}, value) for kind, value in (
                       ("budget", budget.capacity), ("reserved", budget.reserved),
                       ("peak", budget.peak))]
        gauges.append(("kvagent_request_bodies_refused", "Requests refused (503) because "
                       "their body did not fit the budget in time.", {}, budget.num_refused))
        return PlainTextResponse(host.metrics.exposition(chain(host.gauges(), gauges)),
                                 media_type="text/plain; version=0.0.4")

    async def chat(self, request: Request) -> Response:
        host = self.host
        body = await read_json(request, host.config.limits)
        req = await read_chat(body, host.config.limits, host.model_name)
        key = conversation_key(request.headers, req, host.config.limits)
        owner = owner_of(request.scope)
        created = int(time.time())
        if req.stream:
            return ChatStream(host, req, key, owner, created)  # type: ignore[return-value]
        out = await host.chat.complete(req, key, owner)
        return JSONResponse(completion_body(host.model_name, out, created))

    async def episode_create(self, request: Request) -> Response:
        host = self.host
        create = await anyio.to_thread.run_sync(
            parse_create, await read_json(request, host.config.limits), host.config.agent,
            host.config.limits)
        await anyio.to_thread.run_sync(host.check_episode_config, create.config, create.screen)
        out = await host.episodes.create(create.config, create.instruction, create.screen,
                                         owner_of(request.scope))
        return JSONResponse(created_body(out, create.config), status_code=201)

    async def episode_step(self, request: Request) -> Response:
        host = self.host
        episode_id = request.path_params["episode_id"]
        owner = owner_of(request.scope)
        host.episodes.get(episode_id, owner)  # unknown or not yours: 404 before the body
        body = await read_json(request, host.config.limits)
        arrived = time.perf_counter()  # the screenshot's bytes are in hand
        png, size = await read_screenshot(body, host.config.limits)
        out = await host.episodes.step(episode_id, owner, png, size, arrived_at=arrived)
        return JSONResponse(step_body(out))

    async def episode_list(self, request: Request) -> Response:
        return JSONResponse(listing_body(self.host.episodes.listing(owner_of(request.scope))))

    async def episode_get(self, request: Request) -> Response:
        return JSONResponse(view_body(self.host.episodes.describe(
            request.path_params["episode_id"], owner_of(request.scope))))

    async def episode_end(self, request: Request) -> Response:
        await self.host.episodes.end(request.path_params["episode_id"],
                                     owner_of(request.scope))
        return Response(status_code=204)

    async def episode_lease(self, request: Request) -> Response:
        episode_id = request.path_params["episode_id"]
        self.host.episodes.get(episode_id, owner_of(request.scope))  # 404 before the stream
        return LeaseStream(self.host, episode_id)  # type: ignore[return-value]
