"""The one model of speculative decoding's speed: every speedup localspec predicts or bounds is computed here.

A round that drafts ``k`` tokens yields ``E(k) = 1 + sum_{i<k} reach[i]`` tokens, ``reach[i]`` being the
chance that the first ``i + 1`` drafts are all accepted (measured per position, or ``a^(i+1)`` for an i.i.d.
acceptance ``a``: then ``E(k) = (1 - a^(k+1)) / (1 - a)``, Leviathan et al. 2023, eq. 1). It costs

    k c + V(k + 1) + R(k)

in one-token target passes: ``c`` a draft token (0 for a lookup), ``V(b)`` a verify pass of ``b`` rows and
``R(k)`` what taking the rejected drafts back costs on a target with recurrent memory (state copies, and the
kept tokens evaluated again in front of the next pass; 0 for a transformer). The speedup over the target
alone (``V(1)`` per token) is ``E(k) V(1) / cost(k)``; the ceiling is that at the best length.

``V(b)`` comes from a measured curve where there is one (:class:`~localspec.decoding.costs.MachineCosts`,
every width timed), else from :class:`VerifyLine`, a line fitted through passes of two rows and more: it is
not forced through ``V(1) = 1``, because going from one row to two costs more than each further row (a
matrix-vector product becomes a matrix product); a line through 1 promised 1.17x at k=1 on explanations where
k=1 measured 0.89x.

Pure arithmetic: no models, no files, nothing of localspec imported.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

#: A cost of a ``b``-row verify pass, in one-token passes.
Verify = Callable[[int], float]


def iid_reach(a: float, n: int) -> list[float]:
    """``reach[i] = a^(i+1)`` for ``i < n``: the first ``i + 1`` drafts all accepted, each with chance
    ``a``."""
    a = min(max(a, 0.0), 1.0)
    return [a ** (i + 1) for i in range(max(0, n))]


def expected_tokens(reach: Sequence[float], k: int) -> float:
    """Tokens a round drafting ``k`` yields on average, the target's own token included:
    ``1 + sum reach[:k]``. Positions past the measured ones count as never accepted."""
    return 1.0 + float(sum(reach[: max(0, k)]))


def expected_tokens_by_length(reach: Sequence[float], k_max: int) -> list[float]:
    """:func:`expected_tokens` for every length ``0..k_max``, summed as it goes (it runs every round)."""
    out, tokens = [1.0], 1.0
    for k in range(1, k_max + 1):
        tokens += reach[k - 1] if k <= len(reach) else 0.0
        out.append(tokens)
    return out


def fit_acceptance(mean_accepted: float, k: float) -> float:
    """Per-token acceptance ``a`` of the i.i.d. model that yields ``mean_accepted`` of ``k`` drafts per round.

    The raw rate accepted/drafted counts the drafts after the first rejection as rejected too, which
    understates ``a``. Solves ``a (1 - a^k) / (1 - a) = mean_accepted`` (``k`` may be fractional: a mean
    draft length)."""
    if k <= 0 or mean_accepted <= 0:
        return 0.0
    if mean_accepted >= k:
        return 1.0

    def accepted(a: float) -> float:
        return (1.0 - a ** (k + 1.0)) / (1.0 - a) - 1.0

    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        if accepted(mid) < mean_accepted:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


@dataclass(frozen=True)
class VerifyLine:
    """``V(1) = 1`` and ``V(b) = v2 + slope (b - 2)`` for ``b >= 2``, in one-token passes."""

    v2: float  # a pass of two rows, in one-row passes (at least 1)
    slope: float  # each further row (not negative)

    def __call__(self, b: int | float) -> float:
        return 1.0 if b <= 1 else self.v2 + self.slope * (b - 2)

    @classmethod
    def fit(cls, points: Iterable[tuple[float, float, float]]) -> VerifyLine | None:
        """The weighted least-squares line through ``(mean width, cost in one-row passes, weight)`` points
        of passes of two rows and more (narrower means are left out); None without a usable point.

        A pass of 2 rows costs at least one row, and a wider pass never less than a narrower one (the slope
        is held at 0 or more)."""
        pts = [(b, v, w) for b, v, w in points if _finite(b, v, w) and b >= 2.0 and w > 0]
        sw = sum(w for _, _, w in pts)
        if sw <= 0:
            return None
        mb = sum(w * b for b, _, w in pts) / sw
        mv = sum(w * v for _, v, w in pts) / sw
        den = sum(w * (b - mb) ** 2 for b, _, w in pts)
        slope = max(0.0, sum(w * (b - mb) * (v - mv) for b, v, w in pts) / den) if den > 1e-12 else 0.0
        return cls(v2=max(1.0, mv + slope * (2.0 - mb)), slope=slope)


def _finite(*xs: float) -> bool:
    return all(isinstance(x, (int, float)) and math.isfinite(x) for x in xs)


def rollback_passes(
    k: int, a: float, *, save: float, restore: float, snapshots: int, verify: Verify
) -> float:
    """What taking back the rejected part of a ``k``-token draft costs per round on a target with recurrent
    memory, in one-token passes (0 within its ``snapshots``).

    Past the snapshots every round copies the state out (``save``) before its verify pass; a round with a
    rejection (chance ``1 - a^k``) copies it back (``restore``), and the tokens it kept (the pending token and
    the accepted drafts) are evaluated again in front of the next token, in a pass that drafts nothing (as
    llama.cpp does): that pass yields its token at ``V(1 + kept)`` instead of ``V(1)``."""
    if k <= snapshots:
        return 0.0
    a = min(max(a, 0.0), 1.0)
    reject = 1.0 - a**k
    if reject <= 0.0:
        return save
    kept = sum(a**m * (1.0 - a) * (m + 1) for m in range(k)) / reject
    replay = verify(round(1 + kept)) - verify(1)
    return save + reject * (restore + max(0.0, replay))


def round_cost(k: int, *, draft: float, verify: Verify, rollback: float = 0.0) -> float:
    """A round drafting ``k`` tokens: ``k`` draft tokens of cost ``draft`` each, a ``k + 1``-row verify pass,
    and (when it drafts) the rollback's cost; the target alone (``k = 0``) is ``V(1)``."""
    if k <= 0:
        return verify(1)
    return k * draft + verify(k + 1) + rollback


def stopped_round_cost(
    reach: Sequence[float], k: int, *, draft: float, verify: Verify, rollback: float = 0.0
) -> float:
    """A round whose draft of at most ``k`` stops at its first rejected token (the best any stopping rule can
    do: a ``p_min`` stop, the adaptive length, a lookup's match): it drafts ``E(k - 1) = E[min(m + 1, k)]``
    tokens on average and verifies one row more. ``verify`` is read at that mean width (:func:`at_width`),
    exact for a line (every drafting pass has two rows or more)."""
    if k <= 0:
        return verify(1)
    drafted = expected_tokens(reach, k - 1)
    return drafted * draft + at_width(verify, 1 + drafted) + rollback


def at_width(verify: Verify, b: float) -> float:
    """``verify`` at a mean width ``b``: straight between the whole widths around it."""
    lo = math.floor(b)
    frac = b - lo
    return verify(lo) if frac == 0 else (1 - frac) * verify(lo) + frac * verify(lo + 1)


def speedup(tokens: float, cost: float, alone: float = 1.0) -> float:
    """Tokens per unit of cost over the target alone's (one token per ``alone``); nan for a free round."""
    return tokens * alone / cost if cost > 0 else float("nan")


def speedup_at(
    reach: Sequence[float], k: int, *, draft: float, verify: Verify, rollback: float = 0.0
) -> float:
    """The speedup of drafting ``k`` tokens a round: ``E(k) V(1) / (k c + V(k + 1) + R)``."""
    cost = round_cost(k, draft=draft, verify=verify, rollback=rollback)
    return speedup(expected_tokens(reach, k), cost, verify(1))


def best_length(
    reach: Sequence[float],
    k_max: int,
    *,
    draft: float,
    verify: Verify,
    rollback: Callable[[int], float] | float = 0.0,
    k_min: int = 1,
    stops: bool = False,
) -> tuple[int, float]:
    """The ceiling: the draft length in ``k_min..k_max`` with the highest :func:`speedup_at`, and that speedup
    (ties go to the shorter length). ``k_min = 0`` lets the target alone (1x) win; ``stops``: each round's
    draft stops at its first rejected token (:func:`stopped_round_cost`).

    Summed as it goes: the suffix cache's length choice calls it."""
    at = _per_round(rollback)
    alone = verify(1)
    best_k, best = (0, 1.0) if k_min <= 0 else (k_min, -math.inf)
    tokens = 1.0
    for k in range(1, k_max + 1):
        drafted = tokens if stops else float(k)  # E(k - 1): the mean draft that stops where first wrong
        tokens += reach[k - 1] if k <= len(reach) else 0.0
        if k < k_min:
            continue
        width = at_width(verify, 1 + drafted) if stops else verify(k + 1)
        s = speedup(tokens, drafted * draft + width + at(k), alone)
        if s > best + 1e-12:
            best_k, best = k, s
    return best_k, best


def _per_round(rollback: Callable[[int], float] | float) -> Callable[[int], float]:
    if callable(rollback):
        return rollback
    value = float(rollback)
    return lambda _k: value


def batch_lengths(
    reaches: Sequence[Sequence[float]], lengths: Sequence[int], *, base: int, verify: Verify
) -> list[int]:
    """How much of each sequence's draft one shared verify pass should carry, for the most tokens per second
    of the whole batch (goodput, as SmartSpec defines it).

    A pass over several sequences checks each one's pending token and its first ``k_i`` drafts: it yields
    ``sum_i E_i(k_i)`` tokens (:func:`expected_tokens`) and costs ``V(base + sum_i k_i)``, ``base`` being the
    rows every sequence brings anyway (its pending token, tokens owed after a rollback, a prompt's chunk).
    The drafts are in hand, so only the width is chosen: the draft token least likely to be reached goes
    first, and cutting goes on while it raises tokens per cost. As the batch fills and a wider pass stops
    being free, drafts shrink, down to none; where a wider pass costs nothing more (a GPU) nothing is cut.

    Args:
        reaches: per sequence, ``reach[i]``: the chance its first ``i + 1`` drafts are all accepted.
        lengths: per sequence, the drafts in hand (at most ``len(reach)`` count).
        base: the rows of the pass that are not drafts.
        verify: the cost of a pass of ``b`` rows (any unit).

    Returns:
        Per sequence, the drafts to verify (a prefix of each draft).
    """
    ks = [max(0, min(k, len(r))) for k, r in zip(lengths, reaches, strict=True)]
    tokens = sum(expected_tokens(r, k) for r, k in zip(reaches, ks, strict=True))
    width = base + sum(ks)
    while True:
        cut = [(reaches[i][k - 1], i) for i, k in enumerate(ks) if k > 0]
        if not cut:
            return ks
        gain, i = min(cut)
        cost, cheaper = verify(width), verify(width - 1)
        if cheaper <= 0 or (tokens - gain) * cost <= tokens * cheaper:
            return ks  # the last draft token pays for its row
        ks[i] -= 1
        tokens -= gain
        width -= 1
