"""Drafters propose the next few tokens; the target verifies them. The interface: :class:`Drafter`.

- :class:`ModelDrafter`: a small GGUF model with its own KV cache, reused across rounds and calls.
- :class:`NgramDrafter`: prompt lookup, no model: if the last few tokens occurred before in the
  prompt or the output, propose what followed them then (strong for edits and summaries).
- :class:`CombinedDrafter`: n-gram lookup first, the draft model when lookup finds nothing.

A new drafter implements :class:`Drafter` (a type checker checks it) and says, per proposed token,
where it came from (one of :data:`SOURCES`) and how confident it is, so stats, the UI and the HTTP
API can report acceptance by source.
"""

from __future__ import annotations

import copy
import time
from typing import TYPE_CHECKING, Protocol

import numpy as np

from localspec.decoding.draft import Draft
from localspec.decoding.model_draft import DraftJob, Limits, pick, submit
from localspec.decoding.stopping import expected_accepted
from localspec.llama.sampling import SamplingParams

if TYPE_CHECKING:
    from localspec.decoding.stopping import GainStop
    from localspec.llama.runtime import Model


class Drafter(Protocol):
    """What the engine asks of a drafter. ``context`` is always the prompt plus every emitted token.

    - ``use_sequence(seq_id)``: the generation runs on this sequence of the target (before ``begin``); a
      drafter with a model of its own drafts on the same sequence of it, so that generations running at
      once never share a draft cache.
    - ``begin(context)``: a generation starts (prefill, index the prompt).
    - ``draft(context, n, ...)``: propose up to ``n`` tokens.
    - ``lookup(context, n, ...)``: only what can be proposed for free (no model call); an adaptive round
      that keeps the draft model out still asks this.
    - ``finish(context)``: the generation ended (any way: done, stopped, cancelled); a drafter may learn
      from the finished request here.
    - ``name``: the strategy it implements; ``free``: True when proposing costs next to nothing.
    - ``takes_stop_rule``: True for a drafter that runs a model: the engine then hands ``draft`` the round's
      stopping rule when it has one (:class:`localspec.decoding.stopping.GainStop`: keep a token, decode one
      more); a lookup drafter says False and is given None.
    """

    name: str
    free: bool
    takes_stop_rule: bool

    def use_sequence(self, seq_id: int) -> None: ...

    def begin(self, context: list[int]) -> None: ...

    def draft(
        self,
        context: list[int],
        n: int,
        params: SamplingParams,
        rng: np.random.Generator,
        stop: GainStop | None = None,
    ) -> Draft: ...

    def lookup(
        self, context: list[int], n: int, params: SamplingParams, rng: np.random.Generator
    ) -> Draft: ...

    def finish(self, context: list[int]) -> None: ...


class ModelDrafter:
    """Greedy (or sampled) drafting with llama.cpp's knobs: n_min and p_min.

    The draft model's KV cache is shared by every generation of a pipeline, one sequence of it per
    generation running at once (:meth:`use_sequence`); each call re-syncs that sequence to the context it is
    given (longest common prefix), so a drafter never trusts what an earlier call left. ``n_min``/``p_min``
    belong to one generation: :meth:`with_limits` gives a drafter of its own over the same model.
    """

    name = "model"
    free = False  # every draft costs draft-model calls
    takes_stop_rule = True  # where to stop can come from the measured costs (decoding.stopping)

    def __init__(
        self,
        model: Model,
        *,
        target_n_vocab: int,
        masked_ids: list[int] | None = None,
        n_min: int = 0,
        p_min: float = 0.75,
    ) -> None:
        self.model = model
        self.seq = model.seq0  # the sequence of the draft model it drafts on
        self.target_n_vocab = target_n_vocab
        self.n_min = n_min
        self.p_min = p_min
        # Ids the draft must never propose: beyond the target's vocabulary, or special tokens that
        # mean something else to the target (a compatible-with-mask pair).
        bad = set(masked_ids or [])
        bad.update(range(target_n_vocab, model.n_vocab))
        self._mask = np.array(sorted(bad), dtype=np.int64) if bad else None

    def with_limits(self, *, n_min: int, p_min: float) -> ModelDrafter:
        """A drafter of its own (one generation's) over the same draft model and mask, with these
        ``n_min``/``p_min`` (this drafter is unchanged)."""
        other = copy.copy(self)
        other.n_min, other.p_min = n_min, p_min
        return other

    def use_sequence(self, seq_id: int) -> None:
        """Draft on the draft model's sequence ``seq_id`` (its first when it holds fewer)."""
        seqs = self.model.sequences
        self.seq = seqs[seq_id] if seq_id < len(seqs) else seqs[0]

    def begin(self, context: list[int]) -> None:
        """Evaluate the prompt once (prefill), reusing whatever prefix the cache already holds."""
        model, seq = self.model, self.seq
        model.decode(model.sync(context, keep_last=0, seq=seq), seq=seq)
        model.mark_prefix(seq)  # recurrent memory: a later request on this prompt comes back here

    def draft(
        self,
        context: list[int],
        n: int,
        params: SamplingParams,
        rng: np.random.Generator,
        stop: GainStop | None = None,
    ) -> Draft:
        """Up to ``n`` tokens, greedy or sampled. Without ``stop`` a token under ``p_min`` ends the draft
        (after ``n_min``), as in llama.cpp; with it, the measured expected gain decides."""
        job = DraftJob(
            self.model, self.seq, context, n, params, rng, stop, self._limits(), self.target_n_vocab
        )
        return submit(job)

    def _limits(self) -> Limits:
        return Limits(self.n_min, self.p_min, self._mask)

    def lookup(self, context: list[int], n: int, params: SamplingParams, rng: np.random.Generator) -> Draft:
        """A draft model has nothing to propose without calling the model."""
        return Draft(source=self.name)

    def finish(self, context: list[int]) -> None:
        """Nothing to learn: the KV cache already holds what the next call can reuse."""


class MtpDrafter:
    """Drafting with the target's own MTP (NextN) layers (:mod:`localspec.llama.mtp`): no second model.

    The MTP head follows every target pass by itself, so a draft starts from the pending token and the
    target's hidden row before it; the knobs are the draft model's (``n_min``, ``p_min``, the round's
    stopping rule).
    """

    name = "mtp"
    free = False  # every drafted token costs an MTP pass
    takes_stop_rule = True

    def __init__(self, target: Model, *, n_min: int = 0, p_min: float = 0.75) -> None:
        if target.mtp is None:
            raise ValueError("the target was loaded without its MTP layers (Model(..., mtp=True))")
        self.target = target
        self.head = target.mtp
        self.n_min = n_min
        self.p_min = p_min

    def use_sequence(self, seq_id: int) -> None:
        """Nothing to choose: the MTP layers draft for a target of one sequence
        (:func:`~localspec.llama.loading.check_sequences`)."""

    def begin(self, context: list[int]) -> None:
        """The head follows the target from here; positions of ``context`` (the target's cache) it did not
        follow (an earlier generation of another strategy) are evaluated again, followed. A head that reads
        the target's own cache (an MTP assistant) needs no such pass: only its first draft may be worse."""
        target = self.target
        target.follow_mtp(True)
        if not self.head.shared and self.head.valid < len(context):
            target.truncate(self.head.valid)
            target.decode(target.sync(context))

    def draft(
        self,
        context: list[int],
        n: int,
        params: SamplingParams,
        rng: np.random.Generator,
        stop: GainStop | None = None,
    ) -> Draft:
        """Up to ``n`` tokens after ``context`` (whose last token is pending: the target holds the rest)."""
        out = Draft(source=self.name)
        if n <= 0:
            return out
        limits = Limits(self.n_min, self.p_min, None)

        def choose(i: int, logits: np.ndarray) -> tuple[int | None, bool]:
            chosen = pick(logits, i, params, rng, stop, limits)
            if chosen is None:
                return None, False
            out.add(chosen, self.target.n_vocab, "mtp")
            # a block drafter's next token is already paid for: only keeping it costs (a wider verify)
            return chosen.token, stop is None or self.head.block or stop.go_on()

        made = self.target.call(lambda: self.head.draft(context[-1], len(context) - 1, n, choose))
        out.evals, out.first_seconds, out.fed = made.evals, made.first_seconds, made.fed
        return out

    def lookup(self, context: list[int], n: int, params: SamplingParams, rng: np.random.Generator) -> Draft:
        """The MTP head has nothing to propose without a pass."""
        return Draft(source=self.name)

    def finish(self, context: list[int]) -> None:
        """Nothing to learn."""


class NgramDrafter:
    """Prompt-lookup drafting: the longest recent n-gram match proposes what followed it.

    A wrong n-gram draft costs a wider verification pass (5 tokens cost about 2 single passes on a small
    CPU), so precision matters more than recall: like llama.cpp's ``ngram-simple`` it matches at least 3
    tokens and proposes only when at least ``min_copy`` tokens follow the match. Measured on the Qwen 1.5B
    bench, also accepting 2-token matches lowered acceptance (code 30%, summaries 32%) and the speedup.
    """

    name = "ngram"
    free = True  # a lookup costs next to nothing: asking is always worth it
    takes_stop_rule = False

    def __init__(self, *, n_gram_max: int = 4, n_gram_min: int = 3, min_copy: int = 3) -> None:
        if not 1 <= n_gram_min <= n_gram_max:
            raise ValueError("need 1 <= n_gram_min <= n_gram_max")
        self.sizes = list(range(n_gram_max, n_gram_min - 1, -1))
        self.min_copy = min_copy
        self._tables: dict[int, dict[tuple[int, ...], int]] = {}
        self._indexed = 0

    def use_sequence(self, seq_id: int) -> None:
        """A lookup reads the context it is given, whatever sequence holds it."""

    def begin(self, context: list[int]) -> None:
        self._tables = {n: {} for n in self.sizes}
        self._indexed = 0
        self._index(context)

    def _index(self, context: list[int]) -> None:
        # Record, for every n-gram that is followed by a token, where that token is (latest wins).
        for i in range(max(self._indexed, 1), len(context)):
            for n, table in self._tables.items():
                if i >= n:
                    table[tuple(context[i - n : i])] = i
        self._indexed = len(context)

    def draft(
        self,
        context: list[int],
        n: int,
        params: SamplingParams,
        rng: np.random.Generator,
        stop: GainStop | None = None,
    ) -> Draft:
        """What followed the longest recent match, when enough follows it (``stop`` is for model drafts)."""
        self._index(context)
        out = Draft(source=self.name)
        if n <= 0:
            return out
        for size in self.sizes:
            if len(context) < size:
                continue
            j = self._tables[size].get(tuple(context[-size:]))
            if j is not None:
                if len(context) - j < min(self.min_copy, n):
                    continue  # too little follows the match to be worth a wider pass
                out.tokens = context[j : j + n]
                out.sources = ["prompt"] * len(out.tokens)
                out.confidence = [1.0] * len(out.tokens)
                if not params.greedy:
                    out.probs = [None] * len(out.tokens)
                return out
        return out

    def lookup(self, context: list[int], n: int, params: SamplingParams, rng: np.random.Generator) -> Draft:
        """Lookup is all this drafter does, and it is free."""
        return self.draft(context, n, params, rng)

    def finish(self, context: list[int]) -> None:
        """Prompt lookup forgets each request (the suffix drafter is the one that remembers)."""


class CombinedDrafter:
    """Lookup (n-gram or suffix cache) when it finds a match, otherwise the draft model (or the MTP layers).

    With the round's stopping rule (the model's costs measured), a lookup draft must also promise as many
    accepted tokens as model rounds have been getting: where draft tokens are cheap (a big target) a
    short, unsure lookup would otherwise take the place of a longer model draft."""

    free = False
    takes_stop_rule = True  # passed on to the draft model

    def __init__(self, model: ModelDrafter | MtpDrafter, lookup: Drafter, *, min_lookup: int = 2) -> None:
        self.model = model
        self.lookup_drafter = lookup
        self.min_lookup = min_lookup
        self.name = f"{model.name}+{lookup.name}"

    def use_sequence(self, seq_id: int) -> None:
        self.lookup_drafter.use_sequence(seq_id)
        self.model.use_sequence(seq_id)

    def begin(self, context: list[int]) -> None:
        self.lookup_drafter.begin(context)
        self.model.begin(context)

    def lookup(self, context: list[int], n: int, params: SamplingParams, rng: np.random.Generator) -> Draft:
        """The lookup part alone: what a round can still propose for free while the draft model sits out."""
        t = time.perf_counter()
        d = self.lookup_drafter.draft(context, n, params, rng)
        d.spent = {self.lookup_drafter.name: time.perf_counter() - t}
        return d

    def draft(
        self,
        context: list[int],
        n: int,
        params: SamplingParams,
        rng: np.random.Generator,
        stop: GainStop | None = None,
    ) -> Draft:
        t = time.perf_counter()
        d = self.lookup_drafter.draft(context, n, params, rng)
        looked = time.perf_counter() - t
        if len(d.tokens) >= min(self.min_lookup, n) and (
            stop is None or expected_accepted(d.confidence[: len(d.tokens)]) >= stop.model_tokens
        ):
            d.spent = {self.lookup_drafter.name: looked}
            return d
        t = time.perf_counter()
        made = self.model.draft(context, n, params, rng, stop)
        made.spent = {self.lookup_drafter.name: looked, self.model.name: time.perf_counter() - t}
        return made

    def finish(self, context: list[int]) -> None:
        self.lookup_drafter.finish(context)
        self.model.finish(context)


def draft_model_of(drafter: Drafter | None) -> ModelDrafter | None:
    """The draft model ``drafter`` drafts with (itself, or a combination's), whose reading of a prompt costs
    passes of its own; None for lookups and MTP layers (which follow the target's passes)."""
    if isinstance(drafter, ModelDrafter):
        return drafter
    if isinstance(drafter, CombinedDrafter) and isinstance(drafter.model, ModelDrafter):
        return drafter.model
    return None
