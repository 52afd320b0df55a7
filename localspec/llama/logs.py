"""What llama.cpp says, kept from the terminal: what it writes to fd 2 from C and what it logs through its
callback, as lines for an error message (:func:`llama_said`), or hidden unless ``LOCALSPEC_VERBOSE`` is set
(:func:`quiet_stderr`). A model's load and a grammar's parse both speak through here.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import re
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import llama_cpp

from localspec import constants


@contextlib.contextmanager
def quiet_stderr() -> Iterator[Said]:
    """llama.cpp prints its load log to fd 2 from C; hide it unless LOCALSPEC_VERBOSE is set (then what
    it says goes to the terminal, and the yielded :class:`Said` stays empty)."""
    if constants.verbose():
        yield Said()
        return
    with llama_said() as said:
        yield said


#: The sinks of llama.cpp's log while some :func:`llama_said` block runs (a tuple, replaced whole, so the
#: callback reads it without a lock from whichever thread llama.cpp logs on), and the callback it replaced.
_log_sinks: tuple[list[tuple[int, str]], ...] = ()
_log_replaced: tuple[Any, Any] | None = None
_log_lock = threading.Lock()


_LOG_ERROR, _LOG_CONT = 4, 5  # ggml_log_level (ggml.h)


@llama_cpp.llama_log_callback
def _log_to_sinks(level: int, text: bytes | None, user_data: Any) -> None:
    piece = text.decode("utf-8", "replace") if text else ""
    for sink in _log_sinks:
        if len(sink) < 4096:
            sink.append((level, piece))


@dataclass
class Said:
    """What llama.cpp said during a :func:`llama_said` block: every line (fd 2's, then the log's) and the
    lines it logged as errors (the reason, when something failed)."""

    lines: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


@contextlib.contextmanager
def llama_said() -> Iterator[Said]:
    """What llama.cpp says while the block runs, as lines (the first 64 KB of each channel), kept from the
    terminal: what it writes to fd 2 from C (a grammar's parse error, model loading) and its log.

    The log is taken from llama.cpp's own callback, not from llama-cpp-python's: 0.3.36 maps ggml's
    log levels from an older enum (ERROR, 4, reads as DEBUG), so without ``verbose`` it drops every
    error llama.cpp logs, such as why a model does not load (an unknown architecture) or why a grammar is
    refused (left recursion, no root rule). The callback is swapped for the block (the previous one put
    back after the last block ends); what other threads' llama.cpp calls log meanwhile joins the lines,
    which only ever feed an error message."""
    global _log_sinks, _log_replaced
    said = Said()
    logged: list[tuple[int, str]] = []
    with _log_lock:
        if not _log_sinks:
            callback, user_data = llama_cpp.llama_log_callback(), ctypes.c_void_p()
            llama_cpp.llama_log_get(ctypes.byref(callback), ctypes.byref(user_data))
            _log_replaced = (callback, user_data)
            llama_cpp.llama_log_set(_log_to_sinks, None)
        _log_sinks = (*_log_sinks, logged)
    try:
        saved = os.dup(2)
    except OSError:  # no real stderr (some notebook hosts)
        saved = -1
    try:
        with tempfile.TemporaryFile() as tmp:
            if saved >= 0:
                os.dup2(tmp.fileno(), 2)
            try:
                yield said
            finally:
                if saved >= 0:
                    os.dup2(saved, 2)
                    os.close(saved)
                tmp.seek(0)
                said.lines.extend(tmp.read(65536).decode("utf-8", "replace").splitlines())
    finally:
        with _log_lock:
            _log_sinks = tuple(sink for sink in _log_sinks if sink is not logged)
            if not _log_sinks and _log_replaced is not None:
                llama_cpp.llama_log_set(*_log_replaced)
                _log_replaced = None
        said.lines.extend("".join(piece for _, piece in logged)[:65536].splitlines())
        errors, previous = [], None
        for level, piece in logged:
            if level == _LOG_ERROR or (level == _LOG_CONT and previous == _LOG_ERROR):
                errors.append(piece)
            previous = previous if level == _LOG_CONT else level
        said.errors.extend(line.strip() for line in "".join(errors)[:65536].splitlines() if line.strip())


_CACHE_BUFFER = re.compile(r"\b(?:KV|RS) buffer size =\s*([0-9.]+) MiB")


def cache_bytes_logged(said_lines: list[str]) -> int | None:
    """The bytes of every KV-cache and recurrent-state buffer a model's load log names
    (``llama_kv_cache:        CPU KV buffer size =    56.00 MiB``), or None when it names none.

    Args:
        said_lines: the load's log lines (:class:`Said`).

    Returns:
        Their sum in bytes, or None.
    """
    sizes = [float(m.group(1)) for line in said_lines for m in _CACHE_BUFFER.finditer(line)]
    return round(sum(sizes) * 1024 * 1024) if sizes else None
