"""How sure the suffix cache is of a continuation, and how much of it is worth drafting.

The confidence of the i-th drafted token after a match of length L is how often that token followed that
context (child count / parent count along the path, as in SuffixDecoding), smoothed so that one
observation is not certainty: ``(count + a * prior(L + i)) / (parent + a)`` with ``a = 1`` and a prior
that grows with the context length (a 2-token context is a weak predictor, a 16-token one a strong one).
:func:`choose_length` then keeps only as many tokens as pay for the wider verify pass on this machine.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from localspec.decoding import speed
from localspec.suffix.hashing import LEVELS, MIN_MATCH

#: Smoothing strength ``a`` (pseudo-observations at the prior).
SMOOTHING = 1.0
#: A draft must promise this much more than the target alone (expected tokens per unit of cost) to be
#: proposed: the confidences are estimates, and where a 2-token pass costs two single passes a marginal
#: bet loses more often than the estimate says (docs/archive/bench-notebook.md).
DRAFT_MARGIN = 0.1
#: Drafts never run past this many tokens, whatever the caller allows.
MAX_DRAFT = 64


def linear_verify_cost(b: int) -> float:
    """A default verify-cost curve: a b-token pass costs 1 + 0.42 (b - 1) single passes."""
    return 1.0 + 0.42 * (b - 1)


def choose_length(confidence: Sequence[float], verify_cost: Callable[[int], float]) -> int:
    """How many of the proposed tokens to draft: the k that maximises expected tokens per unit cost.

    ``confidence[i]`` is the probability that token i is accepted given that all before it were. A
    k-token draft is a verify pass of width k + 1 costing ``verify_cost(k + 1)`` single passes
    (``verify_cost(1) == 1``) and yields ``1 + sum_{i<k} prod_{j<=i} confidence[j]`` tokens on average.
    Returns 0 (no draft) when no length beats the target alone; ties go to the shorter draft.
    """
    return best_length(confidence, verify_cost)[0]


def best_length(confidence: Sequence[float], verify_cost: Callable[[int], float]) -> tuple[int, float]:
    """:func:`choose_length`'s k and its expected tokens per single-pass cost (1.0 for the target alone):
    :func:`localspec.decoding.speed.best_length` for free drafts whose reach is the running product of the
    confidences."""
    reach, run = [], 1.0
    for c in confidence:
        run *= min(max(float(c), 0.0), 1.0)
        reach.append(run)
    return speed.best_length(reach, len(reach), draft=0.0, verify=verify_cost, k_min=0)


def prior(context_len: int) -> float:
    """Prior probability that a continuation seen once after a context of this length repeats."""
    return 1.0 - 0.6 * 0.8 ** max(context_len - MIN_MATCH, 0)


PRIORS = [prior(n) for n in range(LEVELS[-1] + MAX_DRAFT + 1)]


def smoothed(count: int, parent: int, context_len: int) -> float:
    """A frequency with :data:`SMOOTHING` pseudo-observations at :func:`prior` (one sighting: not certain)."""
    return (count + SMOOTHING * prior(context_len)) / (parent + SMOOTHING)


_UNANIMOUS: dict[int, list[float]] = {}


def unanimous(c: int) -> list[float]:
    """By context length: the smoothed frequency of a token all ``c`` occurrences continue with."""
    row = _UNANIMOUS.get(c)
    if row is None:
        row = _UNANIMOUS[c] = [(c + SMOOTHING * p) / (c + SMOOTHING) for p in PRIORS]
    return row
