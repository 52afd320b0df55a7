"""Adaptive draft length: each round, draft as many tokens as the measurements say pay, or none.

A round that asks the drafter for k tokens yields ``1 + sum_{i<k} P(m > i)`` tokens, m being the
number of drafts the target accepts. A draft that ``p_min`` or a missing n-gram match cut short counts
as not accepted: asking for it bought nothing. The round costs the draft calls it really made plus
one verify pass as wide as the drafts it really got. Every input is measured as the generation goes
(moving averages that weigh the first few observations equally, so one wrong prior does not linger),
so the choice follows the machine and the text:

- ``reach[i]``: P(m > i) over rounds that asked for more than i tokens; a position asked for only a
  few times leans on the one before it (``reach[i-1] * reach[0]``, as if acceptance were i.i.d.),
  and positions not asked for drift towards that extension of the ones that were, so one early
  rejection does not rule a length out for good;
- the draft's first call per round (which also feeds the one or two tokens accepted since the last
  round) and each further call, in seconds; a first call that caught up after rounds without a
  draft gives the cost per token of catching up instead, which the next round's choice adds to
  drafting while the draft is behind (so the choice does not flip back and forth on noise);
- per asked length, the draft calls and drafted tokens it really led to;
- the target's verify pass per width, in seconds;
- for a target with recurrent memory (:mod:`localspec.llama.recurrent`), what taking drafts back costs per
  drafting round: copying the state out and back, and the accepted tokens a restore leaves to be evaluated
  again in front of the next pass (their share of that pass, from the verify costs). It is added to every
  round that drafts; for a transformer it is 0.

Length 0 (the target alone this round) is always a candidate. While it wins, the draft sits out,
and a draft model that sat out n rounds must later catch up on n tokens before it can draft again.
That costs more than it looks: measured with the Qwen 0.5B draft on 2 cores, 13 ms per token in
one batched call, a seventh of a target token. So a probe round in mid-generation (after 8 rounds
without a draft, then 16 and 32, then no more) happens only while catching up costs under 5% of
the target's time per token (a GPU, say) or has not been measured yet. The cheap moment to look
again is the start of a generation, when the draft has just read the prompt: a generation that
follows one which stopped drafting opens with a probe.

Where a draft-model draft stops within the round is the expected-gain rule of
:mod:`localspec.decoding.stopping` once the costs are measured (:meth:`AdaptiveLength.stop_rule`): the
round then asks for the full length and the rule ends the draft at the token that no longer pays, from
the draft's confidence in it, calibrated on what the target accepted.

An n-gram lookup costs next to nothing, so a drafter without a model (``free``) always asks for the
full length: a miss costs nothing, and a longer copy is checked in the same pass (on the Qwen bench,
choosing shorter lookups measured slower). With the draft model and n-gram lookup combined, a round in
which the model sits out still gets the lookup's proposals (the engine asks for them).
"""

from __future__ import annotations

from localspec.decoding import speed
from localspec.decoding.stopping import AcceptanceByConfidence, GainStop

PRIOR_REACH = 0.7  # optimistic enough to try drafting before anything is measured
PROBE_FIRST, PROBE_MAX = 8, 32  # probe after 8 idle rounds, then 16 and 32, then give up
CARRY_OVER = 5  # a new generation weighs what the last ones saw like 5 rounds
NORMAL_FEED = 2  # a first draft call that fed more tokens than this was catching up after a pause
PROBE_BUDGET = 0.05  # mid-generation probes only while catching up costs less per token than this
ALONE_ROUNDS = (1, 5)  # rounds that run the target alone to time it (more than once: the first is often slow)
ALONE_KEPT = 3  # the target-alone timings kept; their minimum is the cost of a plain step
ALONE_REFRESH = 96  # rounds after which the next generation times the target alone again (in its third round)


class AdaptiveLength:
    """Picks the draft length per round (0 = no draft) from running acceptance and measured costs."""

    def __init__(
        self, n_max: int, n_min: int = 0, decay: float = 0.9, free: bool = False, gain_stop: bool = False
    ) -> None:
        self.n_max = max(0, n_max)
        self.free = free  # a drafter without a model (n-gram lookup): always ask for n_max
        self.gain_stop = gain_stop  # the drafter stops where the next token stops paying (stop_rule)
        self.calibration = AcceptanceByConfidence()
        self.n_min = n_min
        self.decay = decay
        self.reach = [PRIOR_REACH] * self.n_max  # observed P(m > i) (moving averages)
        self._seen = [0] * self.n_max
        self.first_s: float | None = None  # the draft's first call in a round
        self.step_s: float | None = None  # each further draft call
        self.catch_up_s: float | None = None  # each token a first call feeds beyond the usual
        self._behind = 0  # tokens emitted since the draft model last ran: the next call feeds them
        self.evals = {k: float(k) for k in range(self.n_max + 1)}  # draft calls a request for k makes
        self.drafted = {k: float(k) for k in range(self.n_max + 1)}  # tokens a request for k yields
        self._asked = dict.fromkeys(range(self.n_max + 1), 0)
        self.verify: dict[int, float] = {}  # seconds of a verify pass, by width
        self._alone: list[float] = []  # the latest timings of a one-row pass (the target alone)
        self._alone_at = 0  # the round of the latest of them
        self.rollback_s: float | None = None  # a drafting round's rollback cost (recurrent memory)
        self.rounds = 0
        self._gen_rounds = 0  # rounds of the current generation
        self._idle = 0
        self._probe_every = PROBE_FIRST
        self._probe_start = False
        self._probing = False  # this round is a probe: its draft keeps at least one token

    # ------------------------------------------------------------------------------------ model
    def expected_tokens(self, k: int, optimistic: bool = False) -> float:
        """Tokens a round asking for k drafts yields on average (the target's own token included)."""
        return speed.expected_tokens(self.reach_estimate(optimistic), k)

    def reach_estimate(self, optimistic: bool = False) -> list[float]:
        """P(m > i) per position: observed averages, leaning on an i.i.d. extension while observed little.

        ``optimistic`` adds one standard error: the choice drafts while drafting *might* pay, so that a
        few unlucky rejections do not stop the measurements that would show it does.
        """
        out: list[float] = []
        window = 1.0 / (1.0 - self.decay)
        for i, observed in enumerate(self.reach):
            prior = PRIOR_REACH if i == 0 else out[i - 1] * out[0]
            w = 1.0 / (self._seen[i] + 1)  # the prior weighs like one observation
            p = w * prior + (1.0 - w) * observed
            if optimistic:
                p += (p * (1.0 - p) / min(self._seen[i] + 1, window)) ** 0.5
            out.append(min(p, 1.0, out[i - 1] if i else 1.0))
        return out

    def round_seconds(self, k: int) -> float | None:
        """Expected cost of a round asking for k drafts; None while a needed cost is unmeasured."""
        width = 1.0 + (self.drafted[k] if k else 0.0)
        v = self.verify_seconds(width)
        if v is None:
            return None
        if k == 0:
            return v
        calls = self.evals[k]
        if calls <= 0:  # a drafter without a model (n-gram lookup): drafting costs no draft calls
            return v + (self.rollback_s or 0.0)
        if self.first_s is None:
            return None
        catch_up = (self.catch_up_s or 0.0) * self._behind * min(1.0, calls)
        drafting = self.first_s + max(0.0, calls - 1.0) * (self.step_s or self.first_s)
        return v + (self.rollback_s or 0.0) + catch_up + drafting

    def verify_seconds(self, width: float) -> float | None:
        """Measured verify cost at ``width`` rows, interpolated between measured widths, and never more than
        a wider pass was measured to cost (one slow pass at a width drafts rarely reach, seen at 3x the
        steady cost, would otherwise make every longer draft look dear until that width is measured again)."""
        v = self._interpolated(width)
        if v is None:
            return None
        wider = [t for w, t in self.verify.items() if w >= width]
        return min(v, *wider) if wider else v

    def _interpolated(self, width: float) -> float | None:
        if not self.verify:
            return None
        known = sorted(self.verify)
        lo = max((w for w in known if w <= width), default=None)
        hi = min((w for w in known if w >= width), default=None)
        if lo is not None and hi is not None:
            if hi == lo:
                return self.verify[lo]
            t = (width - lo) / (hi - lo)
            return self.verify[lo] * (1 - t) + self.verify[hi] * t
        if hi is None:  # wider than anything measured: the slope of the two widest, else a quarter a row
            assert lo is not None  # self.verify is not empty
            return self.verify[lo] + self._slope(known) * (width - lo)
        return self.verify[hi] / (1 + 0.25 * (hi - width))  # narrower than anything measured

    def _slope(self, known: list[int]) -> float:
        """Seconds per extra verify row past the widest measured width (at least 2% of a pass)."""
        widest = self.verify[known[-1]]
        if len(known) < 2:
            return 0.25 * widest
        w0, w1 = known[-2], known[-1]
        slope = (self.verify[w1] - self.verify[w0]) / (w1 - w0)
        return min(max(slope, 0.02 * widest), widest)

    def rates(self, optimistic: bool = False) -> dict[int, float] | None:
        """Expected tokens per second for every length 0..n_max; None until the costs are measured."""
        out = {}
        tokens = speed.expected_tokens_by_length(self.reach_estimate(optimistic), self.n_max)
        for k in range(self.n_max + 1):
            s = self.round_seconds(k)
            if s is None or s <= 0:
                return None
            out[k] = tokens[k] / s
        return out

    # ----------------------------------------------------------------------------------- policy
    def new_generation(self) -> None:
        """Start another generation on the same models: costs carry over, acceptance only as a prior."""
        self._idle = 0
        self._gen_rounds = 0
        self._probe_start = True  # the draft has just read the prompt: no catching up to pay for
        self._behind = 0
        self._forget(CARRY_OVER)

    def _forget(self, n: int) -> None:
        self._seen = [min(c, n) for c in self._seen]
        self._asked = {k: min(c, n) for k, c in self._asked.items()}

    def choose(self) -> int:
        """The draft length for the next round."""
        start, self._probe_start = self._probe_start, False
        self._probing = False
        if self.free:
            return self.n_max
        if self.rounds == 0 or self.n_max == 0:
            return min(2, self.n_max)  # measure a draft call, a further one and a wider verify first
        if self._times_alone():
            return 0  # the target alone, to know what a round without a draft costs
        rates = self.rates(optimistic=True)
        if rates is None:
            return self.n_max
        floor = max(1, self.n_min)
        best = max(rates, key=rates.__getitem__)
        if best >= floor:
            self._idle = 0
            if not start:  # drafting pays beyond the first round: probe soon again if that changes
                self._probe_every = PROBE_FIRST
            return self.n_max if self.stop_rule() is not None else best
        self._idle += 1
        if start:
            self._probing = True
            return max(range(floor, self.n_max + 1), key=rates.__getitem__)
        if self._idle < self._probe_every or self._probe_every > PROBE_MAX or not self._probe_affordable():
            return 0
        self._idle = 0
        self._probe_every *= 2
        self._probing = True
        return max(range(floor, self.n_max + 1), key=rates.__getitem__)

    def _times_alone(self) -> bool:
        """Is this round one that times the target alone? Twice early in the first generation; later once
        per generation whose latest such timing is :data:`ALONE_REFRESH` rounds old (the first timings,
        taken while the machine warms up to the models, can be a third slower than the steady cost)."""
        if len(self._alone) < len(ALONE_ROUNDS):
            return self.rounds in ALONE_ROUNDS
        return self._gen_rounds == 2 and self.rounds - self._alone_at >= ALONE_REFRESH

    def stop_rule(self) -> GainStop | None:
        """This round's expected-gain stopping rule for a draft model; None while its costs are unmeasured
        (the draft then stops at ``p_min``) or for a drafter that does not take one."""
        if not self.gain_stop or self.first_s is None or 1 not in self.verify or len(self.verify) < 2:
            return None
        v = self.verify_seconds

        def verify_seconds(width: float) -> float:
            return v(width) or 0.0

        return GainStop(
            self.calibration,
            verify_seconds=verify_seconds,
            first_seconds=self.first_s,
            step_seconds=self.step_s or self.first_s,
            # a probe drafts at least one token whatever the costs say: a rule that refused every token
            # would never measure again the verify pass that made it refuse
            n_min=max(self.n_min, 1) if self._probing else self.n_min,
            model_tokens=self.expected_tokens(self.n_max) - 1.0,
        )

    def predicted_speedup(self) -> float | None:
        """What the measurements predict for drafting at its best length, in target-alone units: the one
        model of speed (:func:`localspec.decoding.speed.speedup`) on the measured reach and round seconds."""
        rates = self.rates()
        alone = self.round_seconds(0)
        if rates is None or rates[0] <= 0 or not alone:
            return None
        if self.stop_rule() is not None:  # every drafting round asks for n_max; the rule ends the draft
            best = self.n_max
        else:
            tried = [k for k in range(1, self.n_max + 1) if self._asked[k]]  # lengths never asked: no data
            best = max(tried, key=rates.__getitem__, default=0)
        tokens = speed.expected_tokens(self.reach_estimate(), best)
        cost = self.round_seconds(best)
        return speed.speedup(tokens, cost, alone) if cost else None

    def _probe_affordable(self) -> bool:
        v1 = self.verify.get(1)
        return self.catch_up_s is None or v1 is None or self.catch_up_s <= PROBE_BUDGET * v1

    def update(
        self,
        asked: int,
        drafted: int,
        accepted: int,
        *,
        draft_evals: int,
        draft_seconds: float,
        first_seconds: float,
        fed: int,
        verify_seconds: float,
        confidence: list[float] | None = None,
        rollback_seconds: float = 0.0,
        replayed: int = 0,
    ) -> None:
        """Record one round: what was asked, drafted and accepted, and what each part cost; with the
        drafts' ``confidence``, what the target accepted at each confidence.

        Args:
            rollback_seconds: copying a recurrent target's state out and back this round (0: a transformer).
            replayed: owed tokens the verify pass evaluated in front of its own (an earlier restore's).
        """
        d = self.decay
        if confidence and draft_evals:  # a draft model's tokens (lookups carry no calibrated confidence)
            self.calibration.record_round(confidence[:drafted], accepted)
        self.rounds += 1
        self._gen_rounds += 1
        self._behind = 0 if draft_evals else self._behind + accepted + 1
        for i in range(asked):
            w = self._weight(self._seen, i)
            self.reach[i] += w * ((1.0 if i < accepted else 0.0) - self.reach[i])
        if 0 < asked < self.n_max:
            # Positions not asked for drift towards the i.i.d. extension of those that were, so that a
            # longer draft gets tried again when the shorter ones turn out better than first thought.
            est = self.reach_estimate()
            q = est[asked - 1] ** (1.0 / asked)
            for i in range(asked, self.n_max):
                self.reach[i] += (1 - d) * (est[i - 1] * q - self.reach[i])
                est[i] = self.reach[i]
        if asked:
            w = self._weight(self._asked, asked)
            self.evals[asked] += w * (draft_evals - self.evals[asked])
            self.drafted[asked] += w * (drafted - self.drafted[asked])
        if draft_evals and fed <= NORMAL_FEED:
            self.first_s = _ema(self.first_s, first_seconds, d)
        elif draft_evals and self.first_s is not None:
            extra = max(0.0, first_seconds - self.first_s) / (fed - 1)
            self.catch_up_s = _ema(self.catch_up_s, extra, d)
        if draft_evals > 1:
            self.step_s = _ema(self.step_s, (draft_seconds - first_seconds) / (draft_evals - 1), d)
        replay = 0.0
        if replayed:  # the owed rows' share of this pass (never measured apart from it)
            own = self.verify_seconds(drafted + 1)
            replay = max(0.0, verify_seconds - own) if own is not None else 0.0
        if drafted:
            self.rollback_s = _ema(self.rollback_s, rollback_seconds + replay, d)
        elif replayed:  # a replay pass of its own (it drafts nothing): the cost of the round before it
            self.rollback_s = (self.rollback_s or 0.0) + (1 - d) * replay
        width = drafted + 1 + replayed  # the pass as llama.cpp ran it
        self.verify[width] = _ema(self.verify.get(width), verify_seconds, d)
        if width == 1:  # a load or a cold start only slows a pass down: the fastest of the latest
            self._alone = [*self._alone[-(ALONE_KEPT - 1) :], verify_seconds]
            self._alone_at = self.rounds
            self.verify[1] = min(self._alone)

    def _weight(self, counts, key) -> float:
        """Weight of the n-th observation: 1/n for the first ones (a plain mean), then 1 - decay."""
        counts[key] += 1
        return max(1.0 - self.decay, 1.0 / counts[key])


def _ema(old: float | None, new: float, d: float) -> float:
    return new if old is None else d * old + (1 - d) * new
