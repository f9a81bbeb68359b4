"""The grammar worker: a child process that matches the grammars a server's clients send,
so that the engine's process can stop one that costs too much — by ending the process.

llama.cpp's grammar matcher keeps one pushdown stack per way the text so far can be parsed,
and one call (the mask over the vocabulary, or accepting a token) follows every stack through
every candidate's characters: on an ambiguous grammar the stacks multiply with each character,
and a single call can run for hours or allocate gigabytes.  No reading of a grammar's text
bounds that (ambiguity is undecidable), and a call in C cannot be interrupted, so a client's
grammar runs here: the parent (``grammar_isolation.GrammarWorker``) waits for each answer
with a deadline and kills this process when it passes; this process caps its own address
space, so a grammar that allocates without end fails here, not in the server.

Protocol (stdin → stdout, little-endian): a request is ``<B op><I grammar id><i arg><I n>``
and ``n`` payload bytes; an answer is ``<B status><I n>`` and ``n`` bytes (status 0: done,
1: refused, the bytes a UTF-8 reason).  Nothing else is written to stdout; llama.cpp's own
log goes to stderr, which the parent discards (a grammar's text never reaches the server's
log).  Run as ``python -m cachepolicy.engine.grammar_worker MODEL MEMORY_BYTES``: only the
model's vocabulary is loaded.
"""

from __future__ import annotations

import os
import resource
import struct
import sys
from typing import BinaryIO

import llama_cpp
import numpy as np

from cachepolicy.engine.grammar_state import CharTokens, GrammarParseError, LocalGrammar

REQUEST = struct.Struct("<BIiI")
ANSWER = struct.Struct("<BI")

HELLO, OPEN, MASK, ACCEPT, FORCED, CLOSE = range(6)


def _read_exact(stream: BinaryIO, n: int) -> bytes | None:
    """``n`` bytes, or None at the end of the input (the parent closed it: exit)."""
    chunks = bytearray()
    while len(chunks) < n:
        chunk = stream.read(n - len(chunks))
        if not chunk:
            return None
        chunks += chunk
    return bytes(chunks)


def _cap_address_space(extra_bytes: int) -> None:
    """Let the process grow by ``extra_bytes`` beyond what it maps now (the interpreter,
    numpy, libllama and the vocabulary): more and llama.cpp's allocation fails here."""
    with open("/proc/self/status") as f:
        size_kb = next(int(line.split()[1]) for line in f if line.startswith("VmSize:"))
    limit = size_kb * 1024 + extra_bytes
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


def serve(model_path: str, memory_bytes: int, inp: BinaryIO, out: BinaryIO) -> None:
    llama_cpp.llama_backend_init()
    params = llama_cpp.llama_model_default_params()
    params.vocab_only = True
    model = llama_cpp.llama_model_load_from_file(model_path.encode(), params)
    if not model:
        raise SystemExit(f"cannot load the vocabulary of {model_path}")
    vocab = llama_cpp.llama_model_get_vocab(model)
    n_vocab = llama_cpp.llama_vocab_n_tokens(vocab)
    _cap_address_space(memory_bytes)
    grammars: dict[int, LocalGrammar] = {}
    chars: CharTokens | None = None

    def answer(status: int, payload: bytes = b"") -> None:
        out.write(ANSWER.pack(status, len(payload)) + payload)
        out.flush()

    while True:
        head = _read_exact(inp, REQUEST.size)
        if head is None:
            return
        op, gid, arg, n = REQUEST.unpack(head)
        payload = _read_exact(inp, n) if n else b""
        if payload is None:
            return
        if op == HELLO:
            answer(0, struct.pack("<I", n_vocab))
        elif op == OPEN:
            root, _, text = payload.partition(b"\0")
            try:
                grammars[gid] = LocalGrammar(vocab, n_vocab, text.decode(), root.decode())
            except (GrammarParseError, UnicodeDecodeError) as exc:
                answer(1, str(exc).encode())
            else:
                answer(0)
        elif gid not in grammars:
            answer(1, f"no grammar {gid} here".encode())
        elif op == MASK:
            answer(0, np.packbits(grammars[gid].allowed()).tobytes())
        elif op == ACCEPT:
            for token in np.frombuffer(payload, dtype="<i4"):
                grammars[gid].accept(int(token))
            answer(0)
        elif op == FORCED:
            if chars is None:
                chars = CharTokens.of(vocab, n_vocab)
            answer(0, grammars[gid].forced_text(chars, arg))
        elif op == CLOSE:
            grammars.pop(gid).close()
            answer(0)
        else:
            answer(1, f"unknown operation {op}".encode())


def main() -> None:
    model_path, memory = sys.argv[1], int(sys.argv[2])
    # stdout carries answers only: whatever else writes to fd 1 (a library's print) is
    # sent to stderr instead
    answers = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    serve(model_path, memory, sys.stdin.buffer, answers)


if __name__ == "__main__":
    main()
