"""The suffix drafter: draft from what followed the same context before, in this request or any earlier one.

:class:`SuffixDrafter` serves the engine (a :class:`localspec.decoding.drafters.Drafter`): each round it
asks the :class:`~localspec.suffix.index.SuffixIndex` for a proposal per source, calibrates each token's
confidence with what the target accepted so far (:mod:`localspec.suffix.calibration`), and drafts the
proposal and length that promise the most tokens per unit of this machine's verify cost
(:func:`~localspec.suffix.confidence.best_length`). After a request it adds the request to the index and,
with a store attached, saves it (:class:`localspec.suffix.store.SuffixStore`).

The names this module held before the suffix cache became a folder of modules are importable from here.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, NamedTuple, Protocol

import numpy as np

from localspec.decoding.draft import Draft
from localspec.llama.sampling import SamplingParams
from localspec.suffix.calibration import (
    BUCKET_END,
    POSITION_BAND,
    PRIOR_TRUST,
    SEGMENTS,
    TOKEN_WEIGHT,
    WATCHES_PER_KIND,
    Cell,
    Kind,
    TokenCell,
    TokenHazard,
    calibration_of,
    carried_cells,
    carried_token_cells,
    kind_of,
    lineage_of,
    pulled,
    token_tables,
)
from localspec.suffix.confidence import (
    DRAFT_MARGIN,
    MAX_DRAFT,
    linear_verify_cost,
)
from localspec.suffix.index import Proposal, SuffixIndex

if TYPE_CHECKING:
    from localspec.decoding.stopping import GainStop


class Saver(Protocol):
    """Something that persists the index (and the drafter's calibration and token table) after a request
    (:class:`localspec.suffix.store.SuffixStore`)."""

    def save(
        self,
        index: SuffixIndex,
        calibration: Sequence[Cell] | None = None,
        tokens: Sequence[TokenCell] = (),
    ) -> bool: ...


class SizedDraft(NamedTuple):
    """A proposal's calibrated per-token acceptances and the draft length they pay for."""

    confidence: list[float]
    length: int  # :func:`best_length`'s k: how many of the proposal's tokens to draft (0: none)
    value: float  # the expected tokens per single-pass cost of that draft (1.0: the target alone)


class _Watch:
    """A proposal being compared with what the target emits, from context position ``at`` on."""

    __slots__ = ("kinds", "kind", "at", "anchor", "tokens", "done")

    def __init__(self, kind: Kind, at: int, anchor: int, tokens: list[int]) -> None:
        self.kinds = (*lineage_of(kind), kind)  # every kind whose cells this proposal's tokens count in
        self.kind = kind
        self.at, self.anchor, self.tokens, self.done = at, anchor, tokens, 0


class SuffixDrafter:
    """Drafts from the suffix index; free (no model call), lossless under the engine's rejection rule.

    Greedy or sampling, a proposal is deterministic given the context (``probs`` entries are None when
    sampling, as for :class:`localspec.decoding.drafters.NgramDrafter`). The draft length is
    :func:`best_length`'s for calibrated per-token acceptances and ``verify_cost`` (V(b) of this machine,
    V(1) = 1).

    Calibration: copies run in bursts. Where an editor's file or an earlier answer is repeated, a proposal
    following a 16-token match is right for many tokens on end, and where it is not, it fails at once; an
    acceptance per token multiplied along the draft as if independent undervalues exactly the long drafts
    that pay on a CPU. So what is learnt is the acceptance of the i-th token *given the ones before it were
    accepted*, per :func:`kind_of` the proposal and position bucket: a run-length survival curve per kind
    (:mod:`localspec.suffix.calibration`). Evidence is free and plentiful: every round's proposals (drafted
    or not) are *watched*, compared token by token with what the target emits until one differs or the
    proposal ends (:data:`WATCHES_PER_KIND` at once).

    Token hazard: the same watches also count, per source and token id, how often a proposed token was
    reached and how often it was accepted. Some tokens are where copies break (a line the model rewrites
    starts with the same few tokens; a number, a name the answer changes), others never are. A token's
    calibrated acceptance is scaled by its :class:`~localspec.suffix.calibration.TokenHazard`. The prompt's
    table is kept from request to request (and in the store), forgetting slowly (:data:`TOKEN_TRIALS`); the
    history's and corpus' are learnt afresh in every request (see :data:`CARRIED_SOURCES`).
    """

    name = "suffix"
    free = True
    takes_stop_rule = False

    def __init__(
        self,
        index: SuffixIndex | None = None,
        *,
        verify_cost: Callable[[int], float] = linear_verify_cost,
        store: Saver | None = None,
        learn: bool = True,
        margin: float = DRAFT_MARGIN,
        prior_trust: float = PRIOR_TRUST,
        calibration: Iterable[Cell] = (),
        tokens: Iterable[TokenCell] = (),
        token_weight: float = TOKEN_WEIGHT,
    ) -> None:
        self.index = index if index is not None else SuffixIndex()
        self.token_weight = token_weight
        #: per source, per token id: [trials that reached that token in a watched proposal, of them
        #: accepted], and per source the sums (its rate); starts from ``tokens`` (see :data:`TOKEN_TRIALS`)
        self.tokens: dict[str, dict[int, list[float]]] = {}
        self.token_totals: dict[str, list[float]] = {}
        self._set_tokens(tokens)
        self.margin = margin
        self.prior_trust = prior_trust
        self.verify_cost = verify_cost
        self.store = store
        self.learn = learn
        #: per (kind, position bucket): [tokens that reached that position, of them accepted]; starts from
        #: ``calibration`` (what the store kept from the last process, see :data:`CARRIED_TRIALS`)
        self.calibration = calibration_of(calibration)
        self._watches: list[_Watch] = []
        self._costs: list[float] = []  # verify_cost(b) by b, read once per width
        self._costs_of: Callable[[int], float] | None = None
        # the pipeline's drafter this one drafts one generation for (None: this is the pipeline's)
        self._owner: SuffixDrafter | None = None

    def for_request(self) -> SuffixDrafter:
        """One generation's drafter over this suffix cache: the same history, corpus and store, with its own
        current-request tables, watches, calibration and token table, so that generations running at once
        (a batch) do not read or score each other's. What it learnt comes back to this drafter at its
        :meth:`finish`, which adds the request to the history here (as one drafter's requests in turn)."""
        child = copy.copy(self)
        child.index = self.index.request_view()
        child._watches, child._costs, child._costs_of = [], [], None
        child._owner = self
        return child

    def use_sequence(self, seq_id: int) -> None:
        """A lookup reads the context it is given, whatever sequence holds it."""

    def begin(self, context: list[int]) -> None:
        """A new request: it starts from :meth:`carried_calibration`, what a new process would start from,
        so a request drafts the same in a long-lived server as from the command line (see
        :data:`CARRIED_SOURCES`)."""
        self._watches = []
        self.calibration = calibration_of(self.carried_calibration())
        self._set_tokens(self.carried_tokens())
        self.index.begin(context)

    def draft(
        self,
        context: list[int],
        n: int,
        params: SamplingParams,
        rng: np.random.Generator,
        stop: GainStop | None = None,
    ) -> Draft:
        """The index's best proposal, sized by its calibrated acceptance (``stop`` is for model drafts)."""
        self._settle(context)
        if n <= 0:
            return Draft(source=self.name)
        chosen: Proposal | None = None
        sized = SizedDraft([], 0, 0.0)
        open_by_kind: dict[Kind, int] = {}
        for w in self._watches:
            open_by_kind[w.kind] = open_by_kind.get(w.kind, 0) + 1
        for prop in self.index.propose(context, n):
            kind = kind_of(prop)
            if open_by_kind.get(kind, 0) < WATCHES_PER_KIND and context:
                self._watches.append(_Watch(kind, len(context), context[-1], list(prop.tokens)))
                open_by_kind[kind] = open_by_kind.get(kind, 0) + 1
            this = self._calibrated_best(prop, kind)
            if this.length == 0 or this.value < 1.0 + self.margin:
                continue  # a draft that promises less than the margin is mostly estimation noise
            if chosen is None or (this.value, prop.match_length) > (sized.value, chosen.match_length):
                chosen, sized = prop, this
        if chosen is None:
            return Draft(source=self.name)
        k = sized.length
        probs: list[np.ndarray | None] = [] if params.greedy else [None] * k
        return Draft(
            tokens=chosen.tokens[:k],
            probs=probs,
            source=self.name,
            sources=[chosen.source] * k,
            confidence=sized.confidence[:k],
        )

    def lookup(self, context: list[int], n: int, params: SamplingParams, rng: np.random.Generator) -> Draft:
        """Lookup is all this drafter does, and it is free."""
        return self.draft(context, n, params, rng)

    def finish(self, context: list[int]) -> None:
        """Remember the finished request (prompt and output) and persist it when a store is attached."""
        self._settle(context)
        self._watches = []  # what a request did not emit says nothing about its proposals
        owner = self._owner
        if owner is not None:  # one generation's: what it learnt goes on in the pipeline's drafter
            owner.calibration, owner.tokens, owner.token_totals = (
                self.calibration,
                self.tokens,
                self.token_totals,
            )
            owner.finish(context)
            return
        if not self.learn or not context:
            return
        self.index.add_request(context)
        if self.store is not None:
            forgotten = self.index.forgotten
            self.store.save(self.index, self.carried_calibration(), self.carried_tokens())
            if self.index.forgotten != forgotten:  # the cache was cleared: its calibration is gone too
                self.calibration = {}
                self._set_tokens(())

    def carried_calibration(self) -> list[Cell]:
        """The calibration for the next process (:func:`~localspec.suffix.calibration.carried_cells`: the
        cells of :data:`CARRIED_SOURCES`, each scaled down to at most :data:`CARRIED_TRIALS` trials): what
        :class:`localspec.suffix.store.SuffixStore` saves after a request."""
        return carried_cells(self.calibration)

    def carried_tokens(self) -> list[TokenCell]:
        """The token table for the next request or process
        (:func:`~localspec.suffix.calibration.carried_token_cells`: per source of :data:`CARRIED_SOURCES`,
        the :data:`CARRIED_TOKENS` tokens reached most often, scaled to at most :data:`TOKEN_TRIALS`
        trials): what :class:`localspec.suffix.store.SuffixStore` saves after a request."""
        return carried_token_cells(self.tokens, self.token_totals)

    def _set_tokens(self, cells: Iterable[TokenCell]) -> None:
        self.tokens, self.token_totals = token_tables(cells)

    def overlap(self, context: list[int]) -> float:
        """Fraction of the prompt's recent 4-grams already seen in history, store or corpus (for routing)."""
        return self.index.overlap(context)

    def _calibrated_best(self, prop: Proposal, kind: Kind) -> SizedDraft:
        """The proposal's per-token acceptances through :meth:`calibrated`, and :func:`best_length`'s k and
        value for them: the same arithmetic in one loop (it runs every round), with ``verify_cost`` read
        once per width (a new curve assigned to :attr:`verify_cost` is read afresh)."""
        costs = self._costs
        if self._costs_of is not self.verify_cost:
            self._costs_of, costs = self.verify_cost, []
            self._costs = costs
        confidence = prop.confidence
        if len(costs) < len(confidence) + 2:
            costs.extend(self.verify_cost(b) for b in range(len(costs) + 1, len(confidence) + 3))
        chain = (*lineage_of(kind), kind)
        conf: list[float] = []
        hazard = self._hazard(prop.source)
        tokens = prop.tokens
        best_k, best = 0, 1.0 / costs[0]
        expected, run = 1.0, 1.0
        n, i = len(confidence), 0
        for bucket, lo, hi in SEGMENTS:  # the cells change only at bucket edges (7 over 64 positions)
            if lo >= n:
                break
            a, b = pulled(self.calibration, self.prior_trust, chain, bucket)
            for c in confidence[lo:hi]:
                i += 1  # the draft length if it ends here
                x = a + b * c
                if hazard is not None:
                    x = hazard.scaled(x, tokens[i - 1])
                conf.append(x)
                run *= x if 0.0 <= x <= 1.0 else min(max(float(x), 0.0), 1.0)
                expected += run
                value = expected / costs[i]
                if value > best + 1e-12:
                    best_k, best = i, value
        return SizedDraft(conf, best_k, best)

    # Calibration -----------------------------------------------------------------------------------
    def calibrated(self, kind: Kind, position: int, c: float, token: int | None = None) -> float:
        """The acceptance of a proposal's token at ``position`` given the ones before it were accepted: its
        smoothed frequency ``c`` (discounted by :attr:`prior_trust`) pulled towards what was measured for
        each kind of its :func:`lineage_of` in turn (coarsest first), then towards what was measured for
        its kind, at that position bucket; then, when ``token`` is given, scaled by that token's hazard
        (see the class docstring), at most 1."""
        chain = (*lineage_of(kind), kind)
        a, b = pulled(self.calibration, self.prior_trust, chain, POSITION_BAND[min(position, MAX_DRAFT)])
        x = a + b * c
        hazard = self._hazard(kind[0])
        if hazard is not None and token is not None:
            x = hazard.scaled(x, token)
        return x

    def _hazard(self, source: str) -> TokenHazard | None:
        """What a token of ``source`` is scaled by (see the class docstring); None without a table."""
        return TokenHazard.of(self.tokens, self.token_totals, source, self.token_weight)

    def _settle(self, context: Sequence[int]) -> None:
        """Compare every watched proposal with the tokens the target emitted since the last round: each
        position reached counts a trial of (kind, position), accepted while it equals the target's token;
        a watch ends at its first wrong token or its last one. A watch whose context is gone (another
        generation ran in between) is dropped unscored."""
        if not self._watches:
            return
        cells = self.calibration
        n = len(context)
        keep: list[_Watch] = []
        positions, ends = POSITION_BAND, BUCKET_END
        for w in self._watches:
            at = w.at
            if n < at or context[at - 1] != w.anchor:
                continue
            tokens, start = w.tokens, w.done
            end = n - at if n - at < len(tokens) else len(tokens)
            if start >= end:
                keep.append(w)
                continue
            # the tokens emitted since the last round, compared in C; the first wrong one (if any) by index
            stop = end
            if tokens[start:end] != context[at + start : at + end]:
                stop = start
                while tokens[stop] == context[at + stop]:
                    stop += 1
            # positions start .. stop - 1 were reached and accepted, position stop (when < end) reached
            # and wrong: the counts go to each position's bucket, a run of positions per bucket at once
            reached_to = stop + 1 if stop < end else stop
            i = start
            while i < reached_to:
                bucket = positions[i]
                j = ends[i] if ends[i] < reached_to else reached_to
                hits = (j if j < stop else stop) - i
                for kind in w.kinds:
                    cell = cells.get((kind, bucket))
                    if cell is None:
                        cell = cells[(kind, bucket)] = [0, 0]
                    cell[0] += j - i
                    cell[1] += hits
                i = j
            if self.token_weight > 0:
                source = w.kind.source
                table = self.tokens.get(source)
                if table is None:
                    table = self.tokens[source] = {}
                    self.token_totals[source] = [0.0, 0.0]
                total = self.token_totals[source]
                total[0] += reached_to - start
                total[1] += stop - start
                for p in range(start, reached_to):
                    cell = table.get(tokens[p])
                    if cell is None:
                        cell = table[tokens[p]] = [0.0, 0.0]
                    cell[0] += 1
                    if p < stop:
                        cell[1] += 1
            w.done = stop
            if stop == end and stop < len(tokens):
                keep.append(w)
        self._watches = keep
