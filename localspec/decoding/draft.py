"""What a drafter proposes: :class:`Draft` (tokens, where each came from, how sure the drafter is) and a
model drafter's :class:`Pick` of one token. The record every drafter fills and the engine verifies."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

#: Sources that are a model's predictions: a draft model's, or the target's own MTP layers'.
MODEL_SOURCES: tuple[str, ...] = ("model", "mtp")
#: Where a drafted token came from: the draft model, the target's MTP layers, the current prompt and output,
#: earlier requests of this pipeline (or the persisted store), or an indexed corpus.
SOURCES: tuple[str, ...] = (*MODEL_SOURCES, "prompt", "history", "corpus")


@dataclass
class Draft:
    tokens: list[int] = field(default_factory=list)
    # Per drafted token, the drafter's distribution q (None: a deterministic proposal). Only filled
    # when sampling; greedy verification needs no q.
    probs: list[np.ndarray | None] = field(default_factory=list)
    source: str = ""  # the drafter's name
    # Per drafted token: where it came from (one of SOURCES) and the drafter's confidence in it
    # (its probability of being accepted, as the drafter estimates it; 1.0 when it has no estimate).
    sources: list[str] = field(default_factory=list)
    confidence: list[float] = field(default_factory=list)
    evals: int = 0  # draft-model decode calls spent on this draft
    first_seconds: float = 0.0  # the first of those calls, which also fed the tokens accepted since the last
    fed: int = 0  # tokens that first call fed (more than two: it caught up after rounds without a draft)
    # Seconds per drafter asked for it, by name, where more than one was (a combination's lookup and model);
    # empty: the one drafter asked took the round's drafting time.
    spent: dict[str, float] = field(default_factory=dict)

    def add(self, pick: Pick, n_vocab: int, source: str = "model") -> None:
        """Append a drafted token (its distribution fitted to the target's ``n_vocab`` ids when sampled)."""
        self.tokens.append(pick.token)
        if pick.q is not None:
            self.probs.append(fit_to(pick.q, n_vocab))
        self.sources.append(source)
        self.confidence.append(pick.p_top)

    def source_of(self, i: int) -> str:
        """Where drafted token ``i`` came from."""
        return self.sources[i] if i < len(self.sources) else (self.source or "model")


@dataclass(frozen=True)
class Pick:
    """One token a model drafter chose: the token, the distribution it was sampled from (None: greedy) and
    the model's top probability (its confidence)."""

    token: int
    q: np.ndarray | None
    p_top: float


def fit_to(q: np.ndarray, n: int) -> np.ndarray:
    """Draft distribution over the target's id range (masked ids beyond it carry no mass)."""
    if q.shape[0] == n:
        return q
    if q.shape[0] > n:
        return q[:n]
    return np.concatenate([q, np.zeros(n - q.shape[0], dtype=q.dtype)])
