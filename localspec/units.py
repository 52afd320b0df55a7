"""How localspec writes sizes for people: one formatter, decimal units (1 GB = 10^9 bytes, as the Hub and
disk vendors count), so the CLI, the UI and the stats never disagree about the same file."""

from __future__ import annotations

import math


def format_bytes(n: float | int | None, *, unknown: str = "?") -> str:
    """``1.1 GB``, ``463 MB``, ``12.0 kB``, ``512 B``; ``unknown`` when the size is not known."""
    if n is None or (isinstance(n, float) and not math.isfinite(n)):
        return unknown
    sign = "-" if n < 0 else ""
    n = abs(n)
    for unit, size in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= size:
            value = n / size
            return f"{sign}{value:.1f} {unit}" if value < 100 else f"{sign}{value:.0f} {unit}"
    return f"{sign}{int(n)} B"
