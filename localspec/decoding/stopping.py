"""Where a draft model's draft stops: when one more token no longer pays for itself.

The draft model says how sure it is of each token it proposes (its top probability: the confidence).
How often the target accepts a token of a given confidence is measured, not assumed
(:class:`AcceptanceByConfidence`): a small draft is over- or under-confident depending on the text.

With ``R_j`` the probability that drafts ``1..j`` are all accepted (the product of their calibrated
acceptances), a round that keeps ``i`` drafts yields ``E_i = 1 + R_1 + ... + R_i`` tokens on average
and costs ``T_i`` = its draft calls + ``V(i + 1)``, the verify pass of ``i + 1`` rows. The round's
rate is ``E_i / T_i``; a step is worth taking when what it adds per second beats that rate:

- keep the token just drafted when ``R_i / (V(i + 2) - V(i + 1)) >= E_i / T_i`` (its call is paid
  already; keeping it only widens the verify pass);
- decode one more when ``R_{i+1} a / (c + V(i + 3) - V(i + 2)) >= E_{i+1} / T_{i+1}``, ``c`` one draft
  call and ``a`` the acceptance of the token just kept (confident runs tend to go on).

Where a verify pass costs about the same for 1 or 8 rows (a big target, a GPU) this drafts long and
stops only at a token the target is unlikely to accept; where each row costs (a small target on a
CPU) it drafts short. Until the costs are measured, llama.cpp's fixed ``p_min`` cut-off applies.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Callable

#: Upper edges of the confidence buckets (the last bucket runs to 1.0).
EDGES = (0.3, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.98)
#: Before any outcome a bucket believes the draft (acceptance = its confidence) as much as this many outcomes.
PRIOR_WEIGHT = 4.0
#: The outcomes a bucket keeps (older ones fade), so the calibration follows the text.
MEMORY = 200.0


class AcceptanceByConfidence:
    """P(the target accepts a draft token | the draft's confidence in it), by confidence bucket."""

    def __init__(self) -> None:
        lows = (0.0, *EDGES)
        highs = (*EDGES, 1.0)
        self.hits = [PRIOR_WEIGHT * (lo + hi) / 2 for lo, hi in zip(lows, highs, strict=True)]
        self.seen = [PRIOR_WEIGHT] * len(self.hits)

    @staticmethod
    def bucket(confidence: float) -> int:
        """The bucket of a confidence in [0, 1]."""
        return min(bisect_right(EDGES, confidence), len(EDGES))

    def acceptance(self, confidence: float) -> float:
        """The measured acceptance of tokens drafted with about this confidence."""
        b = self.bucket(confidence)
        return self.hits[b] / self.seen[b]

    def record(self, confidence: float, accepted: bool) -> None:
        """One verified draft token: its confidence and whether the target kept it."""
        b = self.bucket(confidence)
        if self.seen[b] + 1.0 > MEMORY:
            keep = (MEMORY - 1.0) / self.seen[b]
            self.hits[b] *= keep
            self.seen[b] *= keep
        self.hits[b] += float(accepted)
        self.seen[b] += 1.0

    def record_round(self, confidences: list[float], accepted: int) -> None:
        """A verify pass's outcome: drafts ``0..accepted-1`` were kept, draft ``accepted`` (if any) was not;
        the drafts after it were never judged on the true context and are left out."""
        for i, conf in enumerate(confidences[: accepted + 1]):
            self.record(conf, i < accepted)

    def table(self) -> list[tuple[float, float, float]]:
        """(bucket's upper edge, measured acceptance, outcomes behind it) per bucket: for reports."""
        return [
            (hi, h / s, s - PRIOR_WEIGHT)
            for hi, h, s in zip((*EDGES, 1.0), self.hits, self.seen, strict=True)
        ]


class GainStop:
    """One round's stopping rule for a draft model (see the module docstring)."""

    def __init__(
        self,
        calibration: AcceptanceByConfidence,
        *,
        verify_seconds: Callable[[float], float],
        first_seconds: float,
        step_seconds: float,
        n_min: int = 0,
        model_tokens: float = 0.0,
    ) -> None:
        self.calibration = calibration
        #: drafted tokens a model round has been getting accepted on average: a free lookup draft that
        #: promises fewer (:func:`expected_accepted`) is not worth the model's place this round
        self.model_tokens = model_tokens
        self.V = verify_seconds
        self.step = step_seconds
        self.n_min = n_min
        self.kept = 0
        self.reach = 1.0  # R_i: all kept drafts accepted
        self.expected = 1.0  # E_i
        self.draft_seconds = first_seconds  # the draft calls paid so far this round
        self.last = 1.0  # calibrated acceptance of the token kept last

    def _rate(self, kept: int, expected: float, draft_seconds: float) -> float:
        return max(expected / (draft_seconds + self.V(kept + 1)), 1.0 / self.V(1))

    def keep(self, i: int, confidence: float) -> bool:
        """Keep draft token ``i`` (0-based), whose logits are already paid for?"""
        a = self.calibration.acceptance(confidence)
        gain = self.reach * a
        if i >= self.n_min:
            widen = max(self.V(i + 2) - self.V(i + 1), 1e-9)
            if gain / widen < self._rate(i, self.expected, self.draft_seconds):
                return False
        self.kept = i + 1
        self.reach, self.expected, self.last = gain, self.expected + gain, a
        return True

    def go_on(self) -> bool:
        """Decode one more draft token after the ones kept?"""
        i = self.kept
        if i < self.n_min:
            self.draft_seconds += self.step
            return True
        gain = self.reach * self.last
        cost = self.step + max(self.V(i + 2) - self.V(i + 1), 0.0)
        later = self._rate(i + 1, self.expected + gain, self.draft_seconds + self.step)
        if gain / max(cost, 1e-9) < later:
            return False
        self.draft_seconds += self.step
        return True


def expected_accepted(confidence: list[float]) -> float:
    """Drafted tokens a draft gets accepted on average, from its per-token confidence (each token counts
    only if every one before it is accepted)."""
    total, reach = 0.0, 1.0
    for c in confidence:
        reach *= c
        total += reach
    return total
