"""The serve domain without HTTP: ``ModelHost``'s episode service, chat service and
conversations driven directly on the forged tiny model (what the HTTP layer and the
cluster's host actor both build on)."""

from __future__ import annotations

import time

import anyio

from cachepolicy.engine import EngineConfig
from runtime.bench.trajectory import screenshot
from runtime.serve.config import ServeConfig
from runtime.serve.host import ModelHost
from runtime.serve.messages import ChatRequest, ImagePart, Message, Sampling, TextPart
from runtime.serve.owners import ANONYMOUS

SHOT = (320, 240)


def _config(forged) -> ServeConfig:
    m = forged("qwen35")
    return ServeConfig(model_path=m.model_path, mmproj_path=m.mmproj_path,
                       engine=EngineConfig(n_ctx_per_seq=4096, n_seq_max=2, n_threads=1))


def _request(messages: list[Message]) -> ChatRequest:
    return ChatRequest("model", tuple(messages), Sampling(6, 0.0, 1.0, None, ()), False, None,
                       None)


def _image(i: int) -> ImagePart:
    return ImagePart(screenshot(i, *SHOT), SHOT)


def test_episodes_and_conversations_without_http(forged) -> None:
    async def main() -> None:
        async with ModelHost.running(_config(forged)) as host:
            # an episode opened with a teacher (a cluster's replay): the forced history text
            # is the step's, then the episode's own
            created = await host.episodes.create(
                host.config.agent, "Open the terminal.", None, ANONYMOUS,
                teacher=lambda i: "wait()" if i == 0 else None)
            eid = created.episode_id
            assert eid.startswith("ep-") and created.number == 1
            first = await host.episodes.step(eid, ANONYMOUS, screenshot(0, *SHOT), SHOT,
                                             arrived_at=time.perf_counter())
            assert first.history == "wait()" and first.screen == SHOT
            second = await host.episodes.step(eid, ANONYMOUS, screenshot(1, *SHOT), SHOT,
                                              arrived_at=time.perf_counter())
            assert second.step.act.index == 1 and second.history is not None

            # a terminal-mode chat: the second request continues the first's conversation
            system = Message("system", (TextPart("You operate a desktop."),))
            user = Message("user", (TextPart("Open the terminal."), _image(0)))
            one = await host.chat.complete(_request([system, user]), None, ANONYMOUS)
            two = await host.chat.complete(_request([
                system, user, Message("assistant", (TextPart(one.text),)),
                Message("user", (_image(1),))]), None, ANONYMOUS)
            assert one.mode == two.mode == "terminal"
            assert two.conversation_id == one.conversation_id
            assert two.step.metrics.reused_tokens > 0
            assert {(v.episode_id, v.kind) for v in host.episodes.listing(ANONYMOUS)} == {
                (eid, "episode"), (one.conversation_id, "chat")}
            assert host.episodes.listing("key-2") == []  # another key sees none of them

            # every slot taken (an episode, the conversation): a new conversation takes the
            # idle one's slot (chats have no end; an episode's is not taken before
            # --idle-seconds), and the conversations forget the one closed
            await host.episodes.end(eid, ANONYMOUS)
            other = (await host.episodes.create(host.config.agent, "x", None,
                                                ANONYMOUS)).episode_id
            mine = await host.chat.complete(_request([Message("user", (TextPart("hi"),))]),
                                            "mine", ANONYMOUS)
            assert mine.mode == "faithful" and mine.conversation_id.startswith("chat-")
            assert host.conversations.named(ANONYMOUS, "mine") is not None
            assert host.conversations.named("key-2", "mine") is None  # names are per key
            host.conversations.prune()
            assert one.conversation_id not in host.conversations
            assert {(v.episode_id, v.kind) for v in host.episodes.listing(ANONYMOUS)} == {
                (other, "episode"), (mine.conversation_id, "chat")}
            for e in (other, mine.conversation_id):
                await host.episodes.end(e, ANONYMOUS)
            assert host.status()["episodes"]["open"] == 0

    anyio.run(main)
