"""The speculative loop: draft, verify in one batched target pass, keep what the target agrees with.

Invariant between rounds: ``ctx`` is the prompt plus every emitted token; the target's KV cache
holds ``ctx[:-1]`` and the last token is *pending* (its logits are not computed yet). A round
decodes ``[pending] + drafts`` in one batch, asking llama.cpp for output rows at exactly those
positions, accepts the longest agreeing prefix (greedy: equal to the target's argmax; sampling:
the rejection rule in :mod:`localspec.llama.sampling`), emits one more token from the target's own row
at the first disagreement (or after the last draft), and removes the rejected drafts from the KV
cache. With no drafter the same loop is the target alone, one token per pass: the baseline.

A target with recurrent memory (a hybrid such as Qwen3.5, or a Mamba) takes drafts back through state
snapshots or a checkpoint saved before the pass (:meth:`Model.checkpoint`, :mod:`localspec.llama.recurrent`);
after a checkpoint restore the accepted tokens are *owed*: the cache holds ``ctx[:-1]`` in name, and the next
verify pass evaluates the owed tokens in front of the pending one. Its logits rows are still exactly the
verified positions', so the invariant holds as stated.

A round drafts at most :attr:`Model.max_draft` tokens (one llama.cpp batch holds the pending token and
the drafts: every logits row of a verify pass comes from one decode) and never past the context.

Sharing: one :class:`Engine` (one :class:`~localspec.pipeline.api.Pipeline`) may run any number of
generations,
from several threads or interleaved in one thread (a stream suspended while another runs). Each round
runs under the engine's lock and never yields while holding it. The owner marker says whose context the
target's KV cache holds: a round that finds another generation ran in between re-syncs the cache to its
own context first (the longest common prefix stays). Drafter state is per generation (the pipeline builds
a fresh drafter for each call, so n-gram tables are never shared), and the draft model's cache re-syncs
to the given context on every draft call. So whatever the interleaving, every output is what that
generation gives alone. Scheduling: a round from another thread waits while the owning generation is
running (its last round ended less than :data:`HANDOVER_SECONDS` ago), so threads take turns per
generation rather than re-syncing each round; a suspended or abandoned stream holds nothing beyond that
grace, and a stream of the same thread never waits (its other streams cannot be running). This is
simpler to make airtight than holding the lock for a whole stream: an abandoned, unclosed stream can
never hang the other callers, and same-thread interleaving cannot deadlock.
"""

from __future__ import annotations

import codecs
import threading
import time
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np

from localspec.constrain.grammar import Constraint, Grammar
from localspec.decoding import accept
from localspec.decoding.adaptive import AdaptiveLength
from localspec.decoding.drafters import Draft, Drafter
from localspec.decoding.stats import GenerationStats
from localspec.errors import LocalspecError, SettingsError
from localspec.llama.runtime import Model
from localspec.llama.sampling import SamplingParams
from localspec.settings import DraftSettings

#: How long another thread waits for a running generation's next round before taking the models over.
HANDOVER_SECONDS = 0.25
#: Adaptive controllers kept per engine (one per distinct drafter setting; least recently used dropped).
MAX_CONTROLLERS = 8


@dataclass
class TokenResponse:
    """One emitted token: its text, id, whether the drafter proposed it, and the stats at that token.

    ``stats`` is a snapshot: the counts as they stood when this token was emitted. ``source`` is where a
    drafted token came from (one of :data:`localspec.decoding.drafters.SOURCES`), None for the target's own.
    """

    text: str
    token: int
    from_draft: bool
    stats: GenerationStats
    finish_reason: str | None = None
    source: str | None = None


class Engine:
    """Runs generations of one target with an optional drafter; safe to share (see the module docstring)."""

    def __init__(self, target: Model) -> None:
        self.target = target
        # When a list: one (token, from_draft, argmax of the verifying row, top-2 logit margin) per
        # emitted token. For tests and diagnostics; off by default (it costs a partial sort per token).
        self.trace: list[accept.TraceRow] | None = None
        # Adaptive draft-length controllers per drafter setting: the costs they measured (draft call,
        # verify pass by width) hold for the next generation too, and acceptance serves as a prior.
        self._controllers: OrderedDict[tuple, AdaptiveLength] = OrderedDict()
        # Re-entrant: a stream abandoned without close() runs its cleanup when collected, which may happen
        # inside another round of the same thread.
        self.lock = threading.RLock()
        self._turn = threading.Condition(self.lock)
        self._owner: object | None = None  # the generation whose context the target's KV cache holds
        self._owner_thread: int | None = None  # its thread, while it has not finished
        self._owner_round_end = 0.0  # when its last round ended

    def stream(
        self,
        prompt_tokens: list[int],
        *,
        drafter: Drafter | None = None,
        max_tokens: int,
        params: SamplingParams,
        settings: DraftSettings,
        stop: list[str] | None = None,
        stats: GenerationStats,
        grammar: Grammar | None = None,
    ) -> Iterator[TokenResponse]:
        """Validate now (errors raise here, not at the first ``next``), then return the token stream.

        With a ``grammar`` every emitted token keeps it satisfiable (see :mod:`localspec.constrain.grammar`
        for what
        the target's token is then); drafts are verified against the same rule."""
        if not prompt_tokens:
            raise LocalspecError("the prompt is empty after tokenization", hint="give a non-empty prompt")
        if drafter is not None and settings.n_max > self.target.max_draft:
            raise SettingsError(
                f"n_max {settings.n_max} is more than one verify pass can check with this context "
                f"({self.target.max_draft} drafts: llama.cpp's batch is {self.target.n_batch})",
                hint=f"use n_max {self.target.max_draft} or less, or load with a larger n_ctx",
            )
        constraint = None
        if grammar is not None:
            t = self.target
            trigger = t.tokenize(grammar.trigger, add_bos=False, special=True) if grammar.trigger else []
            if not grammar.trigger or len(trigger) == 1:  # a trigger no single token spells: free text
                trigger_id = trigger[0] if trigger else None
                constraint = Constraint(
                    t.vocab, t.n_vocab, grammar, textless=t.textless_ids(), trigger_id=trigger_id
                )
        return self._run(list(prompt_tokens), drafter, max_tokens, params, settings, stop, stats, constraint)

    def _claim(self, me: object, ctx: list[int]) -> None:
        """Under the lock: make the target's cache hold ``ctx[:-1]`` if another generation ran since."""
        target = self.target
        me_thread = threading.get_ident()
        while self._owner is not me and self._owner_thread not in (None, me_thread):
            left = self._owner_round_end + HANDOVER_SECONDS - time.monotonic()
            if left <= 0:
                break  # the running generation is suspended (or abandoned): take over
            self._turn.wait(left)
        if target.closed:
            raise LocalspecError("this pipeline was closed", hint="load it again with localspec.load()")
        if self._owner is not me:
            self._owner, self._owner_thread = me, me_thread
            target.decode(target.sync(ctx[:-1]))

    def _round_done(self) -> None:
        self._owner_round_end = time.monotonic()

    def _run(
        self,
        ctx: list[int],
        drafter: Drafter | None,
        max_tokens: int,
        params: SamplingParams,
        settings: DraftSettings,
        stop: list[str] | None,
        stats: GenerationStats,
        constraint: Constraint | None,
    ) -> Iterator[TokenResponse]:
        """The generation: begin, then rounds (claim, propose, verify, accept, learn, emit) until a finish."""
        gen = _Generation(
            ctx=ctx,
            drafter=drafter,
            max_tokens=max_tokens,
            params=params,
            settings=settings,
            stats=stats,
            constraint=constraint,
            text=_TextStream(self.target, stop),
            rng=np.random.default_rng(params.seed),
        )
        stats.prompt_tokens = len(ctx)
        try:
            with self.lock:
                self._begin(gen)
                self._round_done()
            gen.t_start = time.perf_counter()
            while gen.finish is None:
                with self.lock:
                    self._claim(gen.me, gen.ctx)
                    out = self._round(gen)
                    self._round_done()
                yield from out  # never while holding the lock: a suspended stream blocks nobody
        finally:
            self._end(gen)

    def _begin(self, gen: _Generation) -> None:
        """A new generation: the cache syncs to ``ctx[:-1]`` (the last token pending), the drafter reads the
        prompt, and an adaptive setting gets its controller."""
        t0 = time.perf_counter()
        self._claim(gen.me, gen.ctx)
        self.target.mark_prefix()  # recurrent memory: a later request on this prompt comes back here
        if gen.drafter is not None:
            gen.drafter.begin(gen.ctx[:-1])
            if gen.settings.adaptive:
                gen.controller = self._controller(gen.drafter, gen.settings, gen.params)
        gen.stats.prompt_seconds = time.perf_counter() - t0

    def _round(self, gen: _Generation) -> list[TokenResponse]:
        """One round under the lock: propose, verify in one pass, accept, learn; the tokens to emit."""
        target = self.target
        room = min(gen.max_tokens - gen.generated, target.n_ctx - len(gen.ctx) + 1)
        if room <= 0:
            gen.finish = gen.stats.finish_reason = "length"
            return []
        proposal = self._propose(gen, cap=min(room - 1, target.max_draft))
        n_d = len(proposal.draft.tokens)
        rollback_before, replayed = target.rollback.seconds, target.owed
        target.checkpoint(ahead=n_d)  # recurrent memory: what taking the drafts back needs
        t = time.perf_counter()
        rows = target.decode_logits([gen.ctx[-1], *proposal.draft.tokens], outputs=n_d + 1)
        verify_seconds = time.perf_counter() - t
        gen.stats.verify_seconds += verify_seconds
        gen.stats.verify_tokens += n_d + 1
        t = time.perf_counter()
        verdict = self._accept(gen, rows, proposal.draft)
        target.truncate(len(gen.ctx) + verdict.accepted)
        gen.stats.sample_seconds += time.perf_counter() - t
        cost = _Cost(verify_seconds, target.rollback.seconds - rollback_before, replayed)
        gen.stats.rollback_seconds += cost.rollback_seconds
        gen.stats.replayed_tokens += replayed
        self._learn(gen, proposal, verdict.accepted, cost)
        return self._emit(gen, proposal.draft, verdict)

    def _propose(self, gen: _Generation, cap: int) -> _Proposal:
        """The drafter's proposal for this round (empty for the target alone), at most ``cap`` tokens."""
        drafter, controller = gen.drafter, gen.controller
        if drafter is None:
            return _Proposal(_EMPTY, 0, 0.0)
        replay = bool(self.target.owed)
        # a restored checkpoint's kept tokens are evaluated again first: as llama.cpp does, that pass drafts
        # nothing (it yields a token at a narrow width; rejected drafts would restore and widen it again)
        k = 0 if replay else min(controller.choose() if controller else gen.settings.n_max, cap)
        t = time.perf_counter()
        draft = _EMPTY
        if k > 0:
            rule = controller.stop_rule() if controller else None  # only for a drafter that takes one
            draft = drafter.draft(gen.ctx, k, gen.params, gen.rng, stop=rule)
        elif controller and cap > 0 and not replay:
            # the draft model sits out this round; an n-gram lookup is still free
            draft = drafter.lookup(gen.ctx, min(gen.settings.n_max, cap), gen.params, gen.rng)
        seconds = time.perf_counter() - t
        gen.stats.draft_seconds += seconds
        gen.stats.draft_evals += draft.evals
        if draft is not _EMPTY:  # the drafter was asked: its calls and seconds (a combination's parts apart)
            gen.stats.record_calls(draft.spent or {drafter.name: seconds})
        return _Proposal(draft, k, seconds)

    def _accept(self, gen: _Generation, rows: np.ndarray, draft: Draft) -> _Verdict:
        """What the target keeps of the draft and the token it adds (:mod:`localspec.decoding.accept`)."""
        if gen.constraint is None:
            emitted, m = accept.verify(rows, draft, gen.params, gen.rng)
            if self.trace is not None:
                self.trace.extend(accept.margins(rows, emitted, m))
            return _Verdict(emitted, m, False)
        t = self.target
        emitted, m, complete = accept.verify_constrained(
            rows, draft, gen.params, gen.rng, gen.constraint, t.eog_ids, t.space_ids, self.trace
        )
        return _Verdict(emitted, m, complete)

    def _learn(self, gen: _Generation, proposal: _Proposal, accepted: int, cost: _Cost) -> None:
        """Stats of the round, and what the adaptive controller measures from it."""
        draft, stats = proposal.draft, gen.stats
        n_d = len(draft.tokens)
        if gen.drafter is None:
            stats.rounds += 1
            return
        stats.record_round(n_d, accepted, [draft.source_of(i) for i in range(n_d)], drafter=draft.source)
        if gen.controller:
            gen.controller.update(
                proposal.asked,
                n_d,
                accepted,
                draft_evals=draft.evals,
                draft_seconds=proposal.seconds,
                first_seconds=draft.first_seconds,
                fed=draft.fed,
                verify_seconds=cost.verify_seconds,
                confidence=draft.confidence,
                rollback_seconds=cost.rollback_seconds,
                replayed=cost.replayed,
            )
            stats.predicted_speedup = gen.controller.predicted_speedup()

    def _emit(self, gen: _Generation, draft: Draft, verdict: _Verdict) -> list[TokenResponse]:
        """Append the round's tokens to the context and turn them into responses; sets the finish."""
        out: list[TokenResponse] = []
        stats, m = gen.stats, verdict.accepted
        last = len(verdict.emitted) - 1
        for i, tok in enumerate(verdict.emitted):
            gen.ctx.append(tok)
            gen.generated += 1
            stats.generated_tokens = gen.generated
            stats.total_seconds = time.perf_counter() - gen.t_start
            source = draft.source_of(i) if i < m else None
            if tok in self.target.eog_ids:
                gen.finish = stats.finish_reason = "stop"
                out.append(TokenResponse(gen.text.flush(), tok, i < m, stats.snapshot(), "stop", source))
                break
            piece, hit_stop = gen.text.push(tok)
            if hit_stop or (verdict.complete and i == last):
                gen.finish = "stop"
            elif gen.generated >= gen.max_tokens:
                gen.finish = "length"
            if gen.finish:
                piece += gen.text.flush()
                stats.finish_reason = gen.finish
            out.append(TokenResponse(piece, tok, i < m, stats.snapshot(), gen.finish, source))
            if gen.finish:
                break
        return out

    def _end(self, gen: _Generation) -> None:
        """Whatever happened (a closed stream, Ctrl-C, an error in a callback), keep the cache equal to what
        was really accepted so the next call starts from a true state, and let the drafter learn."""
        stats, target = gen.stats, self.target
        stats.total_seconds = time.perf_counter() - gen.t_start
        stats.finish_reason = stats.finish_reason or gen.finish or "cancelled"
        with self.lock:
            if self._owner is gen.me:
                self._owner_thread = None  # finished: nobody need wait for it
                self._turn.notify_all()
                if not target.closed:
                    target.truncate(min(len(target.tokens), len(gen.ctx) - 1))
            if gen.drafter is not None:
                gen.drafter.finish(gen.ctx)
        if gen.constraint is not None:
            gen.constraint.close()

    def _controller(
        self, drafter: Drafter, settings: DraftSettings, params: SamplingParams
    ) -> AdaptiveLength:
        key = (
            drafter.name,
            settings.n_max,
            settings.n_min,
            settings.p_min,
            params.greedy,
            params.temperature,
        )
        ctl = self._controllers.get(key)
        if ctl is None:
            ctl = self._controllers[key] = AdaptiveLength(
                settings.n_max,
                settings.n_min,
                free=drafter.free,
                gain_stop=drafter.takes_stop_rule,
            )
            while len(self._controllers) > MAX_CONTROLLERS:
                self._controllers.popitem(last=False)
        else:
            self._controllers.move_to_end(key)
            ctl.new_generation()
        return ctl


_EMPTY = Draft()


@dataclass
class _Generation:
    """One generation's state across its rounds (the engine itself holds only what generations share)."""

    ctx: list[int]  # the prompt plus every emitted token; the target's cache holds ctx[:-1]
    drafter: Drafter | None
    max_tokens: int
    params: SamplingParams
    settings: DraftSettings
    stats: GenerationStats
    constraint: Constraint | None
    text: _TextStream
    rng: np.random.Generator
    controller: AdaptiveLength | None = None
    generated: int = 0
    finish: str | None = None
    t_start: float = field(default_factory=time.perf_counter)
    me: object = field(default_factory=object)  # the owner marker of the target's KV cache


@dataclass(frozen=True)
class _Proposal:
    """A round's draft, the length the controller asked for, and the seconds drafting took."""

    draft: Draft
    asked: int
    seconds: float


@dataclass(frozen=True)
class _Cost:
    """What a round's target side cost: the verify pass (with the ``replayed`` tokens an earlier rollback
    left owed in front of it), and copying recurrent state out and back (0 for a transformer)."""

    verify_seconds: float
    rollback_seconds: float
    replayed: int


@dataclass(frozen=True)
class _Verdict:
    """A verify pass's outcome: the tokens to emit, how many are accepted drafts, and whether the last one
    completed the grammar's text."""

    emitted: list[int]
    accepted: int
    complete: bool


class _TextStream:
    """Bytes to text, token by token: holds back partial UTF-8 and text that may start a stop string."""

    def __init__(self, model: Model, stop: list[str] | None) -> None:
        self.model = model
        self.stop = [s for s in (stop or []) if s]
        self.hold = max((len(s) for s in self.stop), default=1) - 1
        self.decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self.pending = ""
        self.done = False

    def push(self, token: int) -> tuple[str, bool]:
        self.pending += self.decoder.decode(self.model.piece(token))
        if self.stop:
            cut = min((i for i in (self.pending.find(s) for s in self.stop) if i >= 0), default=-1)
            if cut >= 0:
                out, self.pending = self.pending[:cut], ""
                self.done = True
                return out, True
        if self.hold and len(self.pending) > self.hold:
            out, self.pending = self.pending[: -self.hold], self.pending[-self.hold :]
            return out, False
        if self.hold:
            return "", False
        out, self.pending = self.pending, ""
        return out, False

    def flush(self) -> str:
        if self.done:
            return ""
        out = self.pending + self.decoder.decode(b"", final=True)
        self.pending = ""
        return out
