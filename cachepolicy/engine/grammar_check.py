"""Whether a GBNF text parses in llama.cpp's dialect — asked before a request decodes with it.

A grammar a server's client sends is checked when the request is read, so a bad one is the
client's 400 rather than a failure in the middle of a step.  llama.cpp parses a grammar
without a vocabulary (token references resolve only when it is applied: one the model does
not have then allows no token, an ``EngineError`` of that step), and says why a text does
not parse on its own log (stderr).
"""

from __future__ import annotations

import llama_cpp


def gbnf_problem(text: str, root: str = "root") -> str | None:
    """None when ``text`` parses as a grammar with rule ``root``; else what is wrong."""
    if "\x00" in text:
        return "the grammar contains a NUL character"
    sampler = llama_cpp.llama_sampler_init_grammar(None, text.encode(), root.encode())
    if not sampler:
        return (f"the grammar does not parse as GBNF (llama.cpp's dialect, with a {root!r} "
                "rule; left recursion is refused)")
    llama_cpp.llama_sampler_free(sampler)
    return None
