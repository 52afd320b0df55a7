"""What every tab of the page shares: the error box for any exception, progress callbacks, and the bounds of
every number a user can type, checked on the server (a browser's min/max is only a hint: a request can
carry any value), Max tokens' among them, whose top follows the loaded pair's context (:class:`Room`), and the
Settings note that says when a value was moved into its range.

``app.py`` and ``bench_tab.py`` both import from here; this module imports neither.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import gradio as gr

from localspec.errors import LocalspecError, SettingsError
from localspec.settings import N_MAX_RANGE, P_MIN_RANGE

from .render import error_html, esc

if TYPE_CHECKING:
    from localspec.pipeline.pipeline import Pipeline

log = logging.getLogger("localspec.ui")

#: Inclusive (lowest, highest) of each number field on the page. ``n_ctx`` 0 means "the preset's, else the
#: library default"; above the model's trained context it is refused too (see :func:`check_n_ctx`).
N_CTX_RANGE = (16, 131072)
#: Max tokens before a pair is loaded; a loaded pair's context sets its top instead (:class:`Room`).
MAX_TOKENS_RANGE = (1, 8192)
TEMPERATURE_RANGE = (0.0, 2.0)
GPU_LAYERS_RANGE = (0, 999)
BENCH_LIMIT_RANGE = (0, 1000)  # 0 = every prompt of the workload
BENCH_MAX_TOKENS_RANGE = (1, 2048)
BENCH_REPEATS_RANGE = (1, 20)
#: The shortest prompt the page runs (it refuses an empty one): what a pair's context leaves after it is the
#: most Max tokens can be (:class:`Room`).
SHORTEST_PROMPT = "a"
__all__ = [
    "N_MAX_RANGE",
    "P_MIN_RANGE",
    "Room",
    "friendly",
    "bounded_int",
    "bounded_float",
    "check_n_ctx",
    "check_max_tokens",
]


def friendly(exc: BaseException) -> str:
    """The error box for any exception: localspec errors as they are, others without a traceback."""
    if isinstance(exc, LocalspecError):
        return error_html(exc)
    log.exception("unexpected error in the UI", exc_info=exc)
    return error_html(f"{type(exc).__name__}: {exc}", title="Unexpected error (details in the server log)")


def progress_adapter(progress: Any) -> Callable[[str, int, int], None]:
    """A ``progress(stage, done, total)`` callback (as ``localspec.load`` and the hub call it) on a
    ``gr.Progress``."""

    def report(stage: str, done: int, total: int) -> None:
        try:
            progress((done, total) if total else None, desc=f"{stage}", unit="bytes")
        except Exception:  # progress display is best effort
            pass

    return report


def _number(value: Any, label: str) -> float:
    if value is None or value == "":
        raise SettingsError(f"{label}: no value", hint="type a number")
    if isinstance(value, bool):
        raise SettingsError(f"{label}: {value!r} is not a number", hint="type a number")
    try:
        x = float(value)
    except (TypeError, ValueError, OverflowError):
        raise SettingsError(f"{label}: {value!r} is not a number", hint="type a number") from None
    if not math.isfinite(x):
        raise SettingsError(f"{label}: {value!r} is not a finite number", hint="type a number")
    return x


def bounded_float(value: Any, bounds: tuple[float, float], label: str) -> float:
    """``value`` as a float within ``bounds`` (inclusive), else a :class:`SettingsError` naming the field."""
    x = _number(value, label)
    lo, hi = bounds
    if not lo <= x <= hi:
        raise SettingsError(f"{label}: {x:g} is out of range", hint=f"use a value from {lo:g} to {hi:g}")
    return x


def bounded_int(
    value: Any, bounds: tuple[int, int], label: str, *, zero_ok: bool = False, why: str = ""
) -> int:
    """``value`` as a whole number within ``bounds`` (or 0 when ``zero_ok``), else a SettingsError; ``why``
    (where the range comes from) is added to its hint."""
    x = _number(value, label)
    lo, hi = bounds
    extra = (" (0 = the default)" if zero_ok else "") + (f" ({why})" if why else "")
    if x != int(x):
        raise SettingsError(
            f"{label}: {value!r} is not a whole number", hint=f"use a value from {lo} to {hi}{extra}"
        )
    n = int(x)
    if zero_ok and n == 0:
        return 0
    if not lo <= n <= hi:
        raise SettingsError(f"{label}: {n} is out of range", hint=f"use a value from {lo} to {hi}{extra}")
    return n


def check_n_ctx(value: Any, trained: int | None = None) -> int | None:
    """The Context field: None for 0 (the preset's or the default), else a size within :data:`N_CTX_RANGE`
    and not above the model's trained context ``trained`` (when known)."""
    n = bounded_int(value, N_CTX_RANGE, "Context", zero_ok=True)
    if n and trained and n > trained:
        raise SettingsError(
            f"Context: {n} tokens is more than the model was trained for ({trained})",
            hint=f"use at most {trained}, or 0 for the default",
        )
    return n or None


# -- Max tokens and the loaded pair's context ---------------------------------------------------------------


@dataclass(frozen=True)
class Room:
    """What a loaded pair leaves for an answer. The engine refuses a prompt plus ``max_tokens`` over the
    context (``Pipeline.stream_tokens`` raises :class:`~localspec.errors.ContextOverflowError`), so Max tokens
    is at most the real context (``Pipeline.n_ctx``) less the tokens of the shortest prompt, BOS included."""

    n_ctx: int
    max_tokens: int
    trained: int | None = None  # the target's trained context, when its header says

    @classmethod
    def of(cls, pipe: Pipeline) -> Room:
        n_ctx = int(pipe.n_ctx)
        shortest = len(pipe.tokenize(SHORTEST_PROMPT))
        trained = getattr(pipe.info, "n_ctx_train", None)
        return cls(n_ctx, max(MAX_TOKENS_RANGE[0], n_ctx - shortest), int(trained) if trained else None)

    def why(self) -> str:
        return f"the loaded pair's context is {self.n_ctx} tokens, the prompt included"

    def more(self) -> str:
        """How to get a longer answer, if there is a way."""
        if self.trained and self.n_ctx >= self.trained:
            return "its model was trained on no more"
        return "a larger Context in Load options allows more"


#: Why Max tokens stops at the top of :data:`MAX_TOKENS_RANGE` while no pair is loaded.
NOT_LOADED = "the most until a pair is loaded; a first Run loads it, then its context sets the limit"


def max_tokens_range(room: Room | None) -> tuple[int, int]:
    """Max tokens' (lowest, highest): the loaded pair's :class:`Room`, else :data:`MAX_TOKENS_RANGE`."""
    return (MAX_TOKENS_RANGE[0], room.max_tokens if room is not None else MAX_TOKENS_RANGE[1])


def check_max_tokens(value: Any, room: Room | None) -> int:
    """The Max tokens field within :func:`max_tokens_range`, else a SettingsError saying where the top
    comes from."""
    why = room.why() if room is not None else NOT_LOADED
    return bounded_int(value, max_tokens_range(room), "Max tokens", why=why)


def lowered_note(old: Any, new: int, room: Room | None) -> str:
    """The note when Max tokens was lowered to fit (a pair loaded, or another one chosen)."""
    was = f"{float(old):g}" if isinstance(old, (int, float)) else str(old)
    if room is None:
        return f"Max tokens lowered from {was} to {new}: {NOT_LOADED}."
    return f"Max tokens lowered from {was} to {new}: {room.why()} ({room.more()})."


def typed_note(exc: SettingsError, now: float | None) -> str:
    """The note for a value a slider refused: the setting, its range (the error's hint), and what the box
    holds now (``now``, None when it was left as typed)."""
    text = f"{exc.message}: {exc.hint}" if exc.hint else exc.message
    if now is not None:
        text += f"; it is set to {now:g}"
    return text + "."


def clamped(value: Any, bounds: tuple[float, float]) -> float | None:
    """Where a slider puts a value out of ``bounds`` (the nearest end; the lowest for no value); None when the
    value is inside them (a fraction where a whole number is due is left as typed, and refused)."""
    lo, hi = bounds
    if value is None or value == "" or isinstance(value, bool):
        return lo
    try:
        x = float(value)
    except (TypeError, ValueError, OverflowError):
        return lo
    if math.isnan(x):
        return lo
    if x < lo:
        return lo
    if x > hi:
        return hi
    return None


def note_html(text: str) -> str:
    """The Settings note's markup (empty text: none)."""
    if not text:
        return ""
    style = (
        "border-left: 3px solid #f5a524; padding: 2px 0 2px 8px; margin: 0; font-size: 0.88rem; "
        "color: var(--body-text-color);"
    )
    return f'<div class="ls-note" id="ls-settings-note-text" style="{style}">{esc(text)}</div>'


def note_update(text: str) -> Any:
    """The Settings note (under the Run settings) showing ``text``, or hidden for none (no empty gap)."""
    return gr.update(value=note_html(text), visible=bool(text))


def session_key(request: Any) -> str:
    """The browser session a call came from (one per page load, a ``gr.Request``), so Stop stops only
    that session's runs."""
    return str(getattr(request, "session_hash", None) or "")
