"""What ``kvagent serve`` runs: the model, the engine's sizes, the memory budget, the
episodes' defaults, the chat mode and what one request may ask for.  Plain values, read by
the model host and by the HTTP layer alike (see ``runtime/commands/serve.py`` for the
flags)."""

from __future__ import annotations

from pathlib import Path

import attrs

from cachepolicy.engine import EngineConfig
from cachepolicy.engine.sampling import GrammarBudget
from cachepolicy.policies import POLICIES
from runtime.actions import Screen
from runtime.config import DEFAULT_SCREEN, AgentConfig
from runtime.engine_setup import check_model_choice
from scheduler.release import STALL_TIMEOUT_S
from scheduler.sizes import UNLIMITED_BYTES


@attrs.frozen
class Limits:
    """What one request (and one connection) may ask for: the server's settings, checked
    before the work they bound is done (docs/serving.md, "Security")."""

    max_body_bytes: int = 64 << 20
    max_image_bytes: int = 16 << 20
    max_images: int = 16
    #: pixels of one image, read from its header before it is decoded (a 4K screen)
    max_image_pixels: int = 3840 * 2160
    #: pixels of all of a request's images (16 1920x1080 screenshots)
    max_request_pixels: int = 16 * 1920 * 1080
    max_messages: int = 256
    max_text_chars: int = 200_000
    #: an episode's ``system_prompt`` option (a chat's system text counts in max_text_chars)
    max_system_prompt_chars: int = 32_000
    #: a conversation's name (its header or ``user``), a model name
    max_name_chars: int = 256
    #: a request's GBNF grammar
    max_grammar_chars: int = 64_000
    #: elements llama.cpp's parser allocates for a grammar (a grammar's or JSON schema's),
    #: repetitions expanded (``runtime/serve/gbnf_cost.py``: the measurement behind it)
    max_grammar_elements: int = 50_000
    #: stacks one step of llama.cpp's grammar matcher may make from one (its ambiguity)
    max_grammar_branching: int = 256
    #: seconds matching a client's grammar (or JSON schema) may take for one token, and
    #: for a whole completion: it runs in a worker process that is ended when either passes
    #: (its cost follows its ambiguity, which no reading of its text bounds)
    grammar_call_s: float = GrammarBudget().call_s
    grammar_total_s: float = GrammarBudget().total_s
    #: nesting of a JSON body (deeper: 400, before anything reads it)
    max_json_depth: int = 64
    #: values in a JSON body (counted by its commas, before it is parsed)
    max_json_items: int = 200_000
    #: seconds a connection may take to send a request's head, and its body
    header_timeout_s: float = 10.0
    body_timeout_s: float = 60.0
    #: seconds an idle keep-alive connection stays open
    keep_alive_s: float = 5.0
    #: open connections.  At the cap a new connection closes the one that has waited
    #: longest for its request head (a half-sent or idle one: never one whose request is
    #: being served), so connections held open without a request cannot lock others out;
    #: with none to close, the new one is closed as it is accepted
    max_connections: int = 512
    #: connections from one peer (an IPv4 address, an IPv6 /64) waiting for their request
    #: head; one more closes that peer's longest-waiting one (http/connection_cap.py)
    max_waiting_per_peer: int = 128
    #: bytes of a request's head (request line and headers), however it arrives; more: 431
    max_head_bytes: int = 16 << 10
    #: bytes of request bodies being read at once, server-wide (http/body_budget.py): a
    #: body that does not fit waits up to ``body_budget_wait_s``, then 503; one larger
    #: than the whole budget is a 413
    body_budget_bytes: int = 256 << 20
    body_budget_wait_s: float = 5.0
    #: a completion decodes at most this many tokens: a larger ``max_tokens`` (OSWorld's
    #: Qwen3-VL agent asks for 32768) is capped to it, as llama-server caps to its context
    max_tokens: int = 4096
    #: ``max_tokens`` above this is refused (a typo, not a budget)
    max_tokens_refused_over: int = 1 << 20
    max_stop: int = 4
    max_stop_chars: int = 64


MODES = ("terminal", "faithful")


@attrs.frozen
class ServeConfig:
    """What ``kvagent serve`` runs (see ``runtime/commands/serve.py`` for the flags)."""

    model_path: Path | None = attrs.field(default=None,
                                          converter=attrs.converters.optional(Path))
    mmproj_path: Path | None = attrs.field(default=None,
                                           converter=attrs.converters.optional(Path))
    model_name: str | None = None  # the id clients send as "model" (default: the file stem)
    #: the engine's sizes: one sequence per episode slot (``n_seq_max`` is
    #: ``max_episodes``), ``n_ctx_per_seq`` context positions each
    engine: EngineConfig = attrs.field(
        default=EngineConfig(n_ctx_per_seq=16384, n_seq_max=4),
        validator=lambda _s, _a, e: check_slots(e.n_seq_max))
    memory_budget: int = attrs.field(default=UNLIMITED_BYTES, validator=attrs.validators.ge(1))
    agent: AgentConfig = attrs.Factory(AgentConfig)  # episodes' defaults
    mode: str = attrs.field(default="terminal", validator=attrs.validators.in_(MODES))
    #: the cache policy of the chat API's terminal mode; None: the episodes'
    #: (``agent.policy``).  ``kvagent serve`` without ``--policy`` sets ``chrono-slot``
    #: (``runtime/serve/terminal.py``: an OSWorld client's window appended while it fills)
    chat_policy: str | None = attrs.field(
        default=None, validator=attrs.validators.optional(lambda _s, _a, v: POLICIES.get(v)))
    limits: Limits = attrs.Factory(Limits)
    wait_s: float = STALL_TIMEOUT_S  # the scheduler's wait for memory: its stall timeout
    #: an episode idle this long gives its slot to a new one when every slot is taken (its
    #: client is gone, or thinks longer than any VM action takes)
    idle_s: float = attrs.field(default=300.0, validator=attrs.validators.gt(0))
    #: an episode whose client's lease dropped is ended this long after (``leases.py``)
    lease_grace_s: float = attrs.field(default=10.0, validator=attrs.validators.ge(0))
    #: the profile whose action grammar constrains chat completions that bring no
    #: constraint of their own (None: free text)
    chat_action_grammar: str | None = None
    #: the screen an episode's prompt assumes until its first screenshot (the episode API's
    #: default), the one the policy is checked for at startup and the pool's default steps
    #: are sized for
    screen: Screen = DEFAULT_SCREEN
    #: a server without API keys takes requests only from its own origin and for a
    #: loopback or its own address (http/local_only.py); these add host names (``Host``)
    #: and origins (``Origin``, ``scheme://host[:port]``) it also takes
    allow_hosts: tuple[str, ...] = ()
    allow_origins: tuple[str, ...] = ()

    def __attrs_post_init__(self) -> None:
        check_model_choice(self.model_path, self.mmproj_path)

    @property
    def max_episodes(self) -> int:
        """Episodes (and chat conversations) held at once: one engine sequence each."""
        return self.engine.n_seq_max


#: More episode slots than this on one host is a typo (each holds a sequence's KV cache).
MAX_EPISODE_SLOTS = 64


def check_slots(n: int) -> None:
    if not 1 <= n <= MAX_EPISODE_SLOTS:
        raise ValueError(f"--max-episodes must be 1..{MAX_EPISODE_SLOTS}, got {n}")
