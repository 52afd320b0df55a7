"""The accept rules of one verify pass: which drafted tokens the target keeps, and the token it adds.

Greedy: the longest prefix of the drafts equal to the target's argmax row by row, then the argmax at the
first disagreement (or after the last draft). Sampling: the rejection rule of
:func:`localspec.llama.sampling.accept_or_resample` per position, which emits exactly the target's
distribution. Under a grammar each position's token is the constrained one (:func:`verify_constrained`).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from localspec.constrain.grammar import Constraint
from localspec.decoding.draft import Draft
from localspec.llama.sampling import SamplingParams, accept_or_resample, distribution, sample

#: Under a grammar, a draft model's proposal is judged by the exact rejection rule only when at most this
#: many tokens have a probability (top-k, top-p, min-p make it so): each of them is checked against the
#: grammar. Wider, the target's draw is compared with it instead (exact too, see verify_constrained).
EXACT_SUPPORT = 4096
#: One emitted token as a trace records it: (token, from the draft, argmax of its row, top-2 logit margin).
TraceRow = tuple[int, bool, int, float]


def verify(rows: np.ndarray, draft: Draft, params: SamplingParams, rng) -> tuple[list[int], int]:
    """Tokens to emit for one round and how many of them are accepted drafts."""
    drafts = draft.tokens
    if params.greedy:
        best = rows.argmax(axis=1)
        m = 0
        while m < len(drafts) and drafts[m] == best[m]:
            m += 1
        return [*drafts[:m], int(best[m])], m
    for i, tok in enumerate(drafts):
        p = distribution(rows[i], params)
        q = draft.probs[i] if draft.probs else None
        ok, out = accept_or_resample(p, q, tok, rng)
        if not ok:
            return [*drafts[:i], out], i
    return [*drafts, sample(distribution(rows[len(drafts)], params), rng)], len(drafts)


def verify_constrained(
    rows: np.ndarray,
    draft: Draft,
    params: SamplingParams,
    rng,
    constraint: Constraint,
    eog: frozenset[int],
    space: Callable[[], np.ndarray],
    trace: list[TraceRow] | None = None,
) -> tuple[list[int], int, bool]:
    """:func:`verify` under a grammar: each position's token is the constrained one, and the grammar
    takes every emitted token in order (so no state needs rolling back: only final tokens reach it).
    A ``trace`` gets what :func:`margins` gives, over the tokens the grammar allows there. The third
    value says the last emitted token completed the text (:meth:`Constraint.complete`: only whitespace
    or the end may follow): the reply ends there, a prefix of the target's own constrained text."""
    drafts = draft.tokens
    out: list[int] = []
    for i in range(len(drafts) + 1):
        proposed = drafts[i] if i < len(drafts) else None
        allowed = constraint.masked(rows[i]) if trace is not None else None
        p = full = None
        if params.greedy:
            tok = constraint.best(rows[i])
            ok = tok == proposed
        else:
            full = distribution(rows[i], params)  # once per position, whichever rule uses it
            if proposed is not None and draft.probs:
                p = constraint.distribution(rows[i], params, max_support=EXACT_SUPPORT, unconstrained=full)
        if p is not None and proposed is not None:
            ok, tok = accept_or_resample(p, draft.probs[i], proposed, rng)
        elif not params.greedy:
            # Draw from the constrained distribution and compare. For a deterministic proposal (q one-hot)
            # this is the rejection rule itself ("accept with probability p(x), else draw from p without
            # x" emits a draw from p); for a draft model's q it accepts less often than min(1, p/q) but
            # emits the same distribution, without checking every token of a wide support.
            tok = constraint.sample(rows[i], params, rng, unconstrained=full)
            ok = tok == proposed
        if allowed is not None and trace is not None:
            trace.extend(margins(allowed[None, :], [tok], int(ok)))
        constraint.accept(tok)
        out.append(tok)
        complete = tok not in eog and constraint.complete(eog, space)
        if not ok or complete:
            return out, i + int(ok), complete
        if tok in eog:  # an accepted end of generation: nothing after it is read
            return out, i + 1, False
    return out, len(drafts), False


def margins(rows: np.ndarray, emitted: list[int], m: int) -> list[TraceRow]:
    out = []
    for i, tok in enumerate(emitted):
        top2 = np.partition(rows[i], -2)[-2:]
        out.append((tok, i < m, int(rows[i].argmax()), float(top2[1] - top2[0])))
    return out
