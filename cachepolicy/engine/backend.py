"""Process-wide llama.cpp set-up: backend initialisation and log silencing."""

from __future__ import annotations

import ctypes
import threading
from typing import Any

import llama_cpp
from llama_cpp import mtmd_cpp


_backend_lock = threading.Lock()
_backend_ready = False
_LOG_SINK: list[Any] = []  # keeps the ctypes log callbacks alive for the process lifetime


def init_backend(verbose: bool) -> None:
    global _backend_ready
    with _backend_lock:
        if _backend_ready:
            return
        llama_cpp.llama_backend_init()
        if not verbose:
            quiet = llama_cpp.llama_log_callback(lambda level, text, user: None)
            _LOG_SINK.append(quiet)
            llama_cpp.llama_log_set(quiet, ctypes.c_void_p(0))
            mtmd_cpp.mtmd_helper_log_set(quiet, ctypes.c_void_p(0))
        _backend_ready = True


