"""What a verify pass of each width costs on this machine, measured on the passes the engine runs: the curve a
shared pass's draft lengths are chosen by (:func:`localspec.decoding.speed.batch_lengths`)."""

from __future__ import annotations

from dataclasses import dataclass

from localspec.decoding.speed import Verify


class PassCosts:
    """What a pass of each width cost on this machine, from the passes the engine ran (a running mean per
    width): the cost curve a shared pass's draft lengths are chosen by."""

    def __init__(self) -> None:
        self._seconds: dict[int, float] = {}
        self._counts: dict[int, int] = {}

    def add(self, width: int, seconds: float) -> None:
        """One pass of ``width`` rows took ``seconds``."""
        if width <= 0 or seconds <= 0:
            return
        n = self._counts.get(width, 0)
        old = self._seconds.get(width, seconds)
        weight = 1.0 / min(n + 1, 16)  # a mean at first, then a moving one (the machine's load changes)
        self._seconds[width] = old + weight * (seconds - old)
        self._counts[width] = n + 1

    def curve(self) -> Verify | None:
        """Seconds of a pass of ``b`` rows: measured where that width ran, else on the line fitted through
        the widths that ran; None before two widths have."""
        if len(self._seconds) < 2:
            return None
        points = [(float(b), s, float(min(self._counts[b], 16))) for b, s in self._seconds.items()]
        line = _SecondsLine.fit(points)
        measured = dict(self._seconds)

        def verify(b: int) -> float:
            return measured.get(b) or line(b)

        return verify


@dataclass(frozen=True)
class _SecondsLine:
    """The least-squares line through (width, seconds, weight) points, never decreasing with the width."""

    at0: float
    slope: float

    def __call__(self, b: float) -> float:
        return max(1e-9, self.at0 + self.slope * b)

    @classmethod
    def fit(cls, points: list[tuple[float, float, float]]) -> _SecondsLine:
        sw = sum(w for _, _, w in points)
        mb = sum(w * b for b, _, w in points) / sw
        ms = sum(w * s for _, s, w in points) / sw
        den = sum(w * (b - mb) ** 2 for b, _, w in points)
        slope = max(0.0, sum(w * (b - mb) * (s - ms) for b, s, w in points) / den) if den > 0 else 0.0
        return cls(ms - slope * mb, slope)
