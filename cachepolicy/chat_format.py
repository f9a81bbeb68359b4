"""The text a model's chat template puts around turns, learned once from the template.

kvagent never re-renders the whole conversation through Jinja each step: it renders a probe
conversation with sentinel contents once, splits the result at the sentinels, and keeps the
wrapper strings.  Prompts are then concatenations of separately tokenized fixed pieces, so
they are byte-stable from step to step and identical across policies.
"""

from __future__ import annotations

import attrs

CHATML = ("{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
          "{{ message['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")

_S, _U, _A, _U2 = "\x01SYS\x01", "\x01USR\x01", "\x01AST\x01", "\x01US2\x01"


@attrs.frozen
class ChatFormat:
    """Wrapper strings around system / user / assistant contents, and the generation prompt."""

    system_prefix: str
    system_suffix: str
    user_prefix: str
    user_suffix: str
    assistant_prefix: str
    assistant_suffix: str

    @property
    def generation_prompt(self) -> str:
        """Closes the open user turn and opens the assistant's."""
        return self.user_suffix + self.assistant_prefix

    @classmethod
    def from_template(cls, template: str | None) -> ChatFormat:
        """Derive the wrappers from a Jinja chat template (ChatML when there is none)."""
        import jinja2

        env = jinja2.Environment(loader=jinja2.BaseLoader(), trim_blocks=True,
                                 lstrip_blocks=True)
        env.globals["raise_exception"] = _raise
        tpl = env.from_string(template or CHATML)
        messages = [{"role": "system", "content": _S}, {"role": "user", "content": _U},
                    {"role": "assistant", "content": _A}, {"role": "user", "content": _U2}]
        try:
            text = tpl.render(messages=messages, add_generation_prompt=True, bos_token="",
                              eos_token="")
        except (jinja2.TemplateError, ValueError, TypeError, KeyError):
            # A template that rejects a plain probe conversation: fall back to ChatML.
            if template is None:
                raise
            return cls.from_template(None)
        try:
            sys_pre, rest = text.split(_S, 1)
            sys_suf_user_pre, rest = rest.split(_U, 1)
            user_suf_ast_pre, rest = rest.split(_A, 1)
            ast_suf_user_pre, rest = rest.split(_U2, 1)
        except ValueError:
            return cls.from_template(None) if template is not None else _fail(text)
        # Split "<user suffix><assistant prefix>" where the second user turn tells us the
        # user prefix and the final generation prompt tells us the assistant prefix.
        gen_tail = rest  # "<user suffix><assistant prefix>"
        user_pre = _common_suffix(sys_suf_user_pre, ast_suf_user_pre)
        sys_suf = sys_suf_user_pre[: len(sys_suf_user_pre) - len(user_pre)]
        ast_suf = ast_suf_user_pre[: len(ast_suf_user_pre) - len(user_pre)]
        ast_pre = _common_suffix(user_suf_ast_pre, gen_tail)
        user_suf = user_suf_ast_pre[: len(user_suf_ast_pre) - len(ast_pre)]
        return cls(system_prefix=sys_pre, system_suffix=sys_suf, user_prefix=user_pre,
                   user_suffix=user_suf, assistant_prefix=ast_pre, assistant_suffix=ast_suf)


def _common_suffix(a: str, b: str) -> str:
    n = 0
    while n < min(len(a), len(b)) and a[-1 - n] == b[-1 - n]:
        n += 1
    return a[len(a) - n:] if n else ""


def _raise(message: str) -> None:
    raise ValueError(message)


def _fail(text: str) -> ChatFormat:
    raise ValueError(f"cannot derive turn wrappers from the chat template output: {text!r}")
