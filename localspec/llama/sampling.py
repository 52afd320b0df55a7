"""Turning logits into the target's next-token distribution, and the lossless acceptance rules.

One function, :func:`distribution`, defines what "the target's distribution" is for given sampling
parameters; the target alone and every speculative path draw from it, so both produce the same
output distribution by construction. Acceptance of drafted tokens follows Leviathan et al. (2023):
accept a drafted token ``x`` with probability ``min(1, p(x)/q(x))``, otherwise sample from the
normalised residual ``max(0, p - q)``. A deterministic drafter (n-gram lookup) has ``q`` one-hot,
which makes this "accept with probability p(x), else sample from p with x removed".
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from localspec.errors import SettingsError

_TOP_P_CANDIDATES = 1024  # partial sort first; fall back to a full sort only if these lack the mass


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    seed: int | None = None

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0

    def validate(self) -> None:
        """Refuse values that would sample garbage (NaN, inf) or nothing at all, naming the value."""
        t = self.temperature
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t) or t < 0:
            raise SettingsError(
                f"temperature must be a finite number >= 0, got {t!r}",
                hint="0 is greedy (deterministic); 0.7-1.0 is usual for sampling",
            )
        k = self.top_k
        if isinstance(k, bool) or not isinstance(k, int) or k < 0:
            raise SettingsError(f"top_k must be a whole number >= 0, got {k!r}", hint="0 turns top-k off")
        p = self.top_p
        if (
            isinstance(p, bool)
            or not isinstance(p, (int, float))
            or not (math.isfinite(p) and 0.0 < p <= 1.0)
        ):
            raise SettingsError(
                f"top_p must be in (0, 1], got {p!r}", hint="1.0 turns top-p off; 0.9 is usual"
            )
        m = self.min_p
        if (
            isinstance(m, bool)
            or not isinstance(m, (int, float))
            or not (math.isfinite(m) and 0.0 <= m < 1.0)
        ):
            raise SettingsError(
                f"min_p must be in [0, 1), got {m!r}", hint="0 turns min-p off; 0.05 is usual"
            )
        seed = self.seed
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or seed < 0):
            raise SettingsError(f"seed must be a whole number >= 0, got {seed!r}", hint="e.g. seed=42")


def distribution(logits: np.ndarray, params: SamplingParams) -> np.ndarray:
    """Probabilities (float64, sums to 1) after temperature, top-k, top-p and min-p."""
    x = logits.astype(np.float64) / params.temperature
    n = x.shape[0]
    if 0 < params.top_k < n:
        kth = np.argpartition(x, n - params.top_k)[: n - params.top_k]
        x[kth] = -np.inf
    x -= x.max()
    p = np.exp(x)
    p /= p.sum()
    if params.top_p < 1.0:
        p = _top_p(p, params.top_p)
    if params.min_p > 0.0:
        p[p < params.min_p * p.max()] = 0.0
        p /= p.sum()
    return p


def _top_p(p: np.ndarray, top_p: float) -> np.ndarray:
    n = p.shape[0]
    m = min(_TOP_P_CANDIDATES, n)
    cand = np.argpartition(p, n - m)[n - m :] if m < n else np.arange(n)
    order = cand[np.argsort(-p[cand], kind="stable")]
    csum = np.cumsum(p[order])
    if csum[-1] < top_p and m < n:  # rare: a very flat distribution; sort everything
        order = np.argsort(-p, kind="stable")
        csum = np.cumsum(p[order])
    keep = order[: int(np.searchsorted(csum, top_p)) + 1]
    out = np.zeros_like(p)
    out[keep] = p[keep]
    return out / out.sum()


def sample(p: np.ndarray, rng: np.random.Generator) -> int:
    """Draw one id from probabilities ``p``."""
    c = np.cumsum(p)
    return int(min(np.searchsorted(c, rng.random() * c[-1], side="right"), p.shape[0] - 1))


def accept_or_resample(
    p: np.ndarray, q: np.ndarray | None, token: int, rng: np.random.Generator
) -> tuple[bool, int]:
    """Speculative acceptance of drafted ``token`` under target ``p`` and draft ``q``.

    ``q`` None means a deterministic proposal (q one-hot at ``token``). Returns (accepted, token
    to emit): the drafted token itself, or a sample from the normalised residual.
    """
    px = float(p[token])
    qx = 1.0 if q is None else float(q[token])
    if qx > 0.0 and rng.random() * qx < px:  # u < p/q without dividing
        return True, token
    if q is None:
        r = p.copy()
        r[token] = 0.0
    else:
        r = np.maximum(p - q, 0.0)
    total = r.sum()
    if total <= 0.0:  # p == q exactly: the residual is empty, any draw from p is exact
        return False, sample(p, rng)
    return False, sample(r, rng)
