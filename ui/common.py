"""What every tab of the page shares: the error box for any exception, progress callbacks, and the bounds of
every number a user can type, checked on the server (a browser's min/max is only a hint: a request can
carry any value).

``app.py`` and ``bench_tab.py`` both import from here; this module imports neither.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from typing import Any

from localspec.errors import LocalspecError, SettingsError
from localspec.settings import N_MAX_RANGE, P_MIN_RANGE

from .render import error_html

log = logging.getLogger("localspec.ui")

#: Inclusive (lowest, highest) of each number field on the page. ``n_ctx`` 0 means "the preset's, else the
#: library default"; above the model's trained context it is refused too (see :func:`check_n_ctx`).
N_CTX_RANGE = (16, 131072)
MAX_TOKENS_RANGE = (1, 8192)
TEMPERATURE_RANGE = (0.0, 2.0)
GPU_LAYERS_RANGE = (0, 999)
BENCH_LIMIT_RANGE = (0, 1000)  # 0 = every prompt of the workload
BENCH_MAX_TOKENS_RANGE = (1, 2048)
BENCH_REPEATS_RANGE = (1, 20)
__all__ = ["N_MAX_RANGE", "P_MIN_RANGE", "friendly", "bounded_int", "bounded_float", "check_n_ctx"]


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


def bounded_int(value: Any, bounds: tuple[int, int], label: str, *, zero_ok: bool = False) -> int:
    """``value`` as a whole number within ``bounds`` (or 0 when ``zero_ok``), else a SettingsError."""
    x = _number(value, label)
    lo, hi = bounds
    if x != int(x):
        raise SettingsError(
            f"{label}: {value!r} is not a whole number", hint=f"use a value from {lo} to {hi}"
        )
    n = int(x)
    if zero_ok and n == 0:
        return 0
    if not lo <= n <= hi:
        extra = " (0 = the default)" if zero_ok else ""
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
