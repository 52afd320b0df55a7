"""The ``"auto"`` strategy: per request, which drafters are worth running on this machine.

Lookup drafting (the suffix cache: the prompt, earlier requests, the corpus) costs microseconds a
round and sizes each draft from its confidence and the machine's verify curve, so a round with nothing
worth proposing is a plain target step: it is always on. A model drafter (a draft model, or the target's
MTP layers) costs real time per token whether or not its tokens are accepted, so it runs only where it
pays. The :class:`Router` keeps, per model drafter, a :class:`DrafterRecord` of what it measured on this
pipeline's requests, and decides from it:

- Measured: the speed the drafter's adaptive controller predicted at the end of each request that ran it
  (from acceptance per draft position, the draft calls and verify widths its rounds really took, and their
  measured seconds), averaged with each request weighted by the tokens it drafted, older requests fading.
  An :class:`Estimate` carries its uncertainty, one standard error of ``SPREAD / sqrt(tokens)``: a request
  that drafted nothing teaches nothing, and one that drafted a handful of tokens teaches little. For a draft
  model the prediction below (at the measured acceptance) weighs in like ``PREDICTION_TOKENS`` tokens.
- Predicted, for a draft model not measured yet: the formula of the one model of speed
  (:mod:`localspec.decoding.speed`) on the machine's measured costs, at the acceptance measured so far
  (else a prior), with draft length ``k`` chosen for the most expected tokens per unit of time:

      speed(k) = (1 - a^(k+1)) / (1 - a)  /  (k * c/T + V(k + 1) + R(k))

  ``c/T``: a draft token's cost in target tokens; ``R(k)``: a recurrent target's rollback per round (0 for
  a transformer). The MTP layers' costs are not in the machine's costs: they run until measured.
- Not measured and not predictable: the drafter runs (adaptive, with lookups) to be measured.

A drafter that pays by its estimate (``MIN_GAIN`` over the target alone) runs, adaptive, with lookups; with
both loaded, the one estimated fastest. One that does not pay is not given up: while paying lies within one
standard error of its estimate it runs again at the next request, to measure more (unless the machine's costs
predict it does not pay either: then it waits as one surely not paying does); one predicted not to pay
and never run runs once after ``RETRY_FIRST`` requests; one measured surely not paying runs again after
``RETRY_FIRST`` requests, then after a wait that doubles each time it confirms it (up to ``RETRY_MAX``), and
after at most ``RETRY_FIRST`` while the costs' prediction says it pays where the measurement says not. So one
bad or empty sample cannot lock a drafter out, and one that stopped paying on a busy machine is looked at
again.

A request that looks like earlier ones (a high overlap of its prompt with the store) leans on lookups
anyway: the model then only fills rounds where lookup finds nothing, and the adaptive controller keeps
it out of rounds where it does not pay. The decision and its reason (what was measured, on how many tokens)
are reported with the results.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from localspec.decoding import speed
from localspec.decoding.costs import MachineCosts
from localspec.decoding.drafters import ModelDrafter, MtpDrafter
from localspec.settings import LOOKUPS_ONLY, MODEL_WITH_LOOKUPS, MTP_WITH_LOOKUPS, Strategy

#: Acceptance per token assumed for a draft model before any is measured (same-family drafts at
#: greedy decoding measured 0.7-0.95 on the Qwen pair).
PRIOR_ACCEPTANCE = 0.8
#: The prior acceptance weighs like this many drafted tokens against the measured ones.
PRIOR_TOKENS = 8
#: The model must promise at least this speedup over the target alone to be worth its memory and risk.
MIN_GAIN = 1.05
#: One standard error of a measured speed is this over the square root of the drafted tokens it was measured
#: on: the acceptance of n tokens is known to about 0.5/sqrt(n) and a speed moves 2-3 times as much as it,
#: and the first rounds' timings (a cold draft call, one verify width) add as much again.
SPREAD = 2.0
#: Where the machine's costs predict a draft model's speed, the prediction weighs like this many drafted
#: tokens against the measured ones: a handful of tokens measured slow does not outweigh it.
PREDICTION_TOKENS = 16
#: Each new request's measurement weighs the earlier ones down by this factor, so the estimate follows a
#: machine whose load changes.
FADE = 0.8
#: Requests before a drafter that was not run (predicted not to pay), or that its costs predict to pay where
#: it measured not, runs again; a drafter whose estimate is unsure runs again at the next request.
RETRY_FIRST = 4
#: The longest wait between retries of a drafter that keeps measuring as not paying.
RETRY_MAX = 32


@dataclass(frozen=True)
class Route:
    strategy: Strategy  # LOOKUPS_ONLY, MODEL_WITH_LOOKUPS or MTP_WITH_LOOKUPS (settings.py)
    reason: str
    model_speed: float | None = None  # the expected speed of the model drafter weighed, target alone = 1.0

    @property
    def label(self) -> str:
        """What ``auto`` chose, without the reason: ``auto -> suffix``."""
        return f"auto -> {self.strategy.name}"

    def __str__(self) -> str:
        return f"{self.label}: {self.reason}"


def model_speed(costs: MachineCosts, acceptance: float, n_max: int) -> tuple[float, int]:
    """The best expected speed of draft-model drafting (target alone = 1.0) and the length that gives it
    (0 and 1.0 when no length beats the target alone): :func:`localspec.decoding.speed.best_length` on the
    measured verify curve and rollback cost, at i.i.d. acceptance ``acceptance``."""
    ratio = costs.draft_ratio
    if ratio is None:
        return 0.0, 0
    a = min(max(acceptance, 0.0), 0.999)
    k, best = speed.best_length(
        speed.iid_reach(a, max(1, n_max)),
        max(1, n_max),
        draft=ratio,
        verify=costs.V,
        rollback=lambda k: costs.rollback_passes(k, a),
        k_min=0,
    )
    return best, k


@dataclass(frozen=True)
class Estimate:
    """A drafter's measured speed (target alone = 1.0), one standard error of it, and what it stands on."""

    speed: float
    spread: float
    tokens: int  # drafted tokens behind it (all requests, before fading)
    rounds: int  # rounds the drafter drafted in
    requests: int  # requests that drafted with it

    @property
    def pays(self) -> bool:
        return self.speed >= MIN_GAIN

    @property
    def unsure(self) -> bool:
        """Paying lies within one standard error."""
        return self.speed + self.spread >= MIN_GAIN

    def __str__(self) -> str:
        requests = f"{self.requests} request{'s' if self.requests != 1 else ''}"
        return (
            f"{self.speed:.2f}x (± {self.spread:.2f}) measured on {self.tokens} drafted tokens in "
            f"{self.rounds} rounds over {requests}"
        )


@dataclass
class DrafterRecord:
    """What one model drafter (the draft model, or the target's MTP layers) measured on this pipeline's
    requests: the ``auto`` router's memory of it."""

    what: str  # "the draft model", "the MTP layers": for the reasons
    source: str  # the drafter's name: the source of its tokens in the stats
    strategy: Strategy  # what runs it with lookups
    weight: float = 0.0  # drafted tokens behind the speed figure, faded
    speed_sum: float = 0.0  # their measured speeds weighted by those tokens, faded alike
    drafted: float = 0.0  # drafted and accepted tokens of every request that ran it, faded (the acceptance)
    accepted: float = 0.0
    tokens: int = 0  # drafted tokens, rounds and requests behind the speed figure, in all
    rounds: int = 0
    requests: int = 0
    last_run: int = 0  # the router's request number when it last drafted (0: never)
    wait: int = RETRY_FIRST  # requests before it runs again while measured as not paying
    predicted: float | None = None  # what the machine's costs predicted when it was last weighed

    def estimate(self) -> Estimate | None:
        """The measured speed and its uncertainty; None until a request drafted with it and measured."""
        if self.weight <= 0:
            return None
        spread = SPREAD / math.sqrt(self.tokens)
        return Estimate(self.speed_sum / self.weight, spread, self.tokens, self.rounds, self.requests)

    def acceptance(self) -> float:
        """Accepted per drafted token: the measured counts with the prior weighing :data:`PRIOR_TOKENS`."""
        return (self.accepted + PRIOR_ACCEPTANCE * PRIOR_TOKENS) / (self.drafted + PRIOR_TOKENS)

    def record(self, request: int, *, drafted: int, accepted: int, rounds: int, speed: float | None) -> None:
        """One request that ran this drafter: ``drafted``/``accepted`` tokens in ``rounds`` rounds, and the
        speed its adaptive controller measured (None: not adaptive, or its costs not measured yet). A request
        that drafted nothing measured nothing: the drafter stays as it was (and due to run again); one without
        a speed counts for the acceptance only."""
        if drafted <= 0:
            return
        self.drafted, self.accepted = FADE * self.drafted + drafted, FADE * self.accepted + accepted
        if speed is None:
            return
        self.weight = FADE * self.weight + drafted
        self.speed_sum = FADE * self.speed_sum + drafted * speed
        self.tokens += drafted
        self.rounds += rounds
        self.requests += 1
        self.last_run = request
        est = self.estimate()
        if est is None or est.pays:
            self.wait = RETRY_FIRST
        elif est.unsure and (self.predicted is None or self.predicted >= MIN_GAIN):
            self.wait = 1  # too few tokens to say, and nothing else says no: measure more at the next request
        else:  # not paying, and sure of it: look again later each time
            self.wait = RETRY_FIRST if self.wait < RETRY_FIRST else min(2 * self.wait, RETRY_MAX)


@dataclass(frozen=True)
class _Weighed:
    """One loaded drafter as the router weighs it for a request."""

    record: DrafterRecord
    speed: float | None  # measured, else predicted; None: neither (it runs to be measured)
    why: str
    measured: bool
    predicted_pays: bool = False  # the costs' formula at the measured acceptance says it pays


class Router:
    """``auto``'s decisions for one pipeline and what it learnt from them (see the module docstring).

    Args:
        model: a draft model is loaded.
        mtp: the target's MTP layers are loaded (with the target, or an MTP assistant).
    """

    def __init__(self, *, model: bool, mtp: bool) -> None:
        self.model = (
            DrafterRecord("the draft model", ModelDrafter.name, MODEL_WITH_LOOKUPS) if model else None
        )
        self.mtp = DrafterRecord("the MTP layers", MtpDrafter.name, MTP_WITH_LOOKUPS) if mtp else None
        self.requests = 0  # requests routed so far

    def record_for(self, strategy: Strategy) -> DrafterRecord | None:
        """The record of the model drafter ``strategy`` drafts with (None: none that is loaded)."""
        return self.mtp if strategy.mtp else self.model if strategy.model else None

    def route(self, *, costs: Callable[[], MachineCosts | None], n_max: int, overlap: float = 0.0) -> Route:
        """The strategy for the next request and why.

        Args:
            costs: the machine's measured verify curve and draft cost (called only when a draft model is
                weighed; None: not measured).
            n_max: the longest draft a round may ask for.
            overlap: the share of the prompt's n-grams the suffix cache has seen before.

        Returns:
            Lookups alone, or a model drafter (adaptive) with lookups, with the reason.
        """
        self.requests += 1
        loaded = [r for r in (self.model, self.mtp) if r is not None]
        if not loaded:
            return Route(
                LOOKUPS_ONLY, "no draft model loaded: lookups only (prompt, earlier requests, corpus)"
            )
        weighed = [self._weigh(r, costs, n_max) for r in loaded]
        chosen, why = self._choose(weighed)
        if chosen is None:
            best = max(weighed, key=lambda w: w.speed or 0.0)
            return Route(LOOKUPS_ONLY, f"{best.why}: lookups only{_others(weighed, best)}", best.speed)
        reason = why
        if overlap >= 0.5:
            reason += f"; {overlap:.0%} of the prompt's n-grams were seen before, so lookups lead"
        return Route(chosen.record.strategy, reason + _others(weighed, chosen), chosen.speed)

    def _choose(self, weighed: list[_Weighed]) -> tuple[_Weighed | None, str]:
        """The drafter to run (None: lookups only) and the reason."""
        for w in weighed:  # never measured nor predictable: it runs to be measured
            if w.speed is None:
                return w, f"{w.why}: running {w.record.what}, adaptive, with lookups"
        for w in weighed:  # predicted to pay, not measured yet: it runs to be measured
            if not w.measured and w.speed is not None and w.speed >= MIN_GAIN:
                return w, f"{w.why} should give {w.speed:.2f}x"
        best = max(weighed, key=lambda w: w.speed or 0.0)
        if best.measured and best.speed is not None and best.speed >= MIN_GAIN:
            return best, f"{best.why}: it pays"
        due = [w for w in weighed if self._due(w)]
        if not due:
            return None, ""
        w = min(due, key=lambda w: w.record.last_run)
        ago = self.requests - w.record.last_run
        since = (
            f"it last drafted {ago} request{'s' if ago > 1 else ''} ago"
            if w.record.last_run
            else "not run yet"
        )
        return w, f"{w.why}: tried again ({since}), adaptive, with lookups"

    def _due(self, w: _Weighed) -> bool:
        """Whether a drafter that does not pay by its estimate runs again now (see the module docstring)."""
        r = w.record
        wait = min(r.wait, RETRY_FIRST) if w.predicted_pays else r.wait
        return self.requests - r.last_run >= wait

    def _weigh(self, r: DrafterRecord, costs: Callable[[], MachineCosts | None], n_max: int) -> _Weighed:
        """What the router knows of drafter ``r``'s speed: measured, else predicted, else nothing."""
        est = r.estimate()
        c = costs() if r is self.model else None  # the MTP layers' costs are not in the machine's
        ratio = c.draft_ratio if c is not None else None
        if est is not None:
            if c is None or ratio is None:
                return _Weighed(r, est.speed, f"{r.what}: {est}", measured=True)
            predicted = r.predicted = model_speed(c, r.acceptance(), n_max)[0]
            both = (predicted * PREDICTION_TOKENS + est.speed * r.weight) / (PREDICTION_TOKENS + r.weight)
            why = (
                f"{r.what}: {est}; with the costs' prediction at its acceptance {r.acceptance():.2f} "
                f"({predicted:.2f}x): {both:.2f}x"
            )
            pays = predicted >= MIN_GAIN and both < MIN_GAIN  # the two disagree: measure again soon
            return _Weighed(r, both, why, measured=True, predicted_pays=pays)
        if c is None or ratio is None:
            return _Weighed(r, None, f"{'costs ' if r is self.model else ''}not measured yet", measured=False)
        a = r.acceptance()
        best, k = model_speed(c, a, n_max)
        r.predicted = best
        where = f"a draft token costs {ratio:.2f} of a target token here"
        if not c.steady:  # measured while something else used the CPU: said with the decision
            where += " (measured on a busy machine; `localspec cache clear --costs` measures again)"
        basis = "prior" if r.drafted == 0 else "measured"
        if best >= MIN_GAIN:
            return _Weighed(r, best, f"{where}; at {basis} acceptance {a:.2f} drafting {k} tokens", False)
        why = f"{where}; at {basis} acceptance {a:.2f} {r.what} would not pay (best {best:.2f}x)"
        return _Weighed(r, best, why, measured=False)


def _others(weighed: list[_Weighed], chosen: _Weighed) -> str:
    """What the router knows of the drafters it did not choose: `` (the MTP layers at 1.40x)``."""
    notes = []
    for w in weighed:
        if w is not chosen:
            at = "not measured yet" if w.speed is None else f"at {w.speed:.2f}x"
            notes.append(f"{w.record.what} {at}{'' if w.measured or w.speed is None else ' predicted'}")
    return f" ({'; '.join(notes)})" if notes else ""
