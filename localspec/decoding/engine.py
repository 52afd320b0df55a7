"""The speculative loop: draft, verify in one batched target pass, keep what the target agrees with.

Invariant between rounds: ``ctx`` is the prompt plus every emitted token; the target's KV cache
holds ``ctx[:-1]`` and the last token is *pending* (its logits are not computed yet). A round
decodes ``[pending] + drafts`` in one batch, asking llama.cpp for output rows at exactly those
positions, accepts the longest agreeing prefix (greedy: equal to the target's argmax; sampling:
the rejection rule in :mod:`localspec.llama.sampling`), emits one more token from the target's own row
at the first disagreement (or after the last draft), and removes the rejected drafts from the KV
cache. With no drafter the same loop is the target alone, one token per pass: the baseline.

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
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np

from localspec.constrain.grammar import Constraint, Grammar
from localspec.decoding.adaptive import AdaptiveLength
from localspec.decoding.drafters import Draft, Drafter
from localspec.decoding.stats import GenerationStats
from localspec.errors import LocalspecError, SettingsError
from localspec.llama.runtime import Model
from localspec.llama.sampling import SamplingParams, accept_or_resample, distribution, sample
from localspec.settings import DraftSettings

#: How long another thread waits for a running generation's next round before taking the models over.
HANDOVER_SECONDS = 0.25
#: Under a grammar, a draft model's proposal is judged by the exact rejection rule only when at most this
#: many tokens have a probability (top-k, top-p, min-p make it so): each of them is checked against the
#: grammar. Wider, the target's draw is compared with it instead (exact too, see _verify_constrained).
EXACT_SUPPORT = 4096
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
        self.trace: list[tuple[int, bool, int, float]] | None = None
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
        target = self.target
        me = object()
        stats.prompt_tokens = len(ctx)
        rng = np.random.default_rng(params.seed)
        controller = None
        text_out = _TextStream(target, stop)
        trace = self.trace
        n_max = settings.n_max
        t_start = time.perf_counter()
        generated = 0
        finish: str | None = None
        try:
            with self.lock:
                t0 = time.perf_counter()
                self._claim(me, ctx)  # a new generation: the cache syncs to ctx[:-1], the last token pending
                if drafter is not None:
                    drafter.begin(ctx[:-1])
                    if settings.adaptive:
                        controller = self._controller(drafter, settings, params)
                stats.prompt_seconds = time.perf_counter() - t0
                self._round_done()
            t_start = time.perf_counter()
            while finish is None:
                out: list[TokenResponse] = []
                with self.lock:
                    self._claim(me, ctx)
                    room = min(max_tokens - generated, target.n_ctx - len(ctx) + 1)
                    if room <= 0:
                        finish = stats.finish_reason = "length"
                        break
                    cap = min(room - 1, target.max_draft)
                    k = 0
                    dt = 0.0
                    draft = _EMPTY
                    if drafter is not None:
                        k = min(controller.choose() if controller else n_max, cap)
                        t = time.perf_counter()
                        if k > 0:
                            draft = drafter.draft(ctx, k, params, rng)
                        elif controller and cap > 0:
                            # the draft model sits out this round; an n-gram lookup is still free
                            draft = drafter.lookup(ctx, min(n_max, cap), params, rng)
                        dt = time.perf_counter() - t
                        stats.draft_seconds += dt
                        stats.draft_evals += draft.evals
                    drafts = draft.tokens
                    n_d = len(drafts)

                    t = time.perf_counter()
                    rows = target.decode_logits([ctx[-1], *drafts], outputs=n_d + 1)
                    tv = time.perf_counter() - t
                    stats.verify_seconds += tv
                    stats.verify_tokens += n_d + 1

                    t = time.perf_counter()
                    complete = False  # the grammar's text is done (nothing but whitespace may follow)
                    if constraint is None:
                        emitted, m = _verify(rows, draft, params, rng)
                        if trace is not None:
                            trace.extend(_margins(rows, emitted, m))
                    else:
                        emitted, m, complete = _verify_constrained(
                            rows, draft, params, rng, constraint, target.eog_ids, target.space_ids, trace
                        )
                    target.truncate(len(ctx) + m)
                    stats.sample_seconds += time.perf_counter() - t
                    if drafter is not None:
                        stats.record_round(n_d, m, [draft.source_of(i) for i in range(n_d)])
                        if controller:
                            controller.update(
                                k,
                                n_d,
                                m,
                                draft_evals=draft.evals,
                                draft_seconds=dt,
                                first_seconds=draft.first_seconds,
                                fed=draft.fed,
                                verify_seconds=tv,
                            )
                    else:
                        stats.rounds += 1

                    for i, tok in enumerate(emitted):
                        ctx.append(tok)
                        generated += 1
                        stats.generated_tokens = generated
                        stats.total_seconds = time.perf_counter() - t_start
                        source = draft.source_of(i) if i < m else None
                        if tok in target.eog_ids:
                            finish = stats.finish_reason = "stop"
                            out.append(
                                TokenResponse(text_out.flush(), tok, i < m, stats.snapshot(), finish, source)
                            )
                            break
                        piece, hit_stop = text_out.push(tok)
                        if hit_stop or (complete and i == len(emitted) - 1):
                            finish = "stop"
                        elif generated >= max_tokens:
                            finish = "length"
                        if finish:
                            piece += text_out.flush()
                            stats.finish_reason = finish
                        out.append(TokenResponse(piece, tok, i < m, stats.snapshot(), finish, source))
                        if finish:
                            break
                    self._round_done()
                yield from out  # never while holding the lock: a suspended stream blocks nobody
        finally:
            stats.total_seconds = time.perf_counter() - t_start
            stats.finish_reason = stats.finish_reason or finish or "cancelled"
            with self.lock:
                # Whatever happened (a closed stream, Ctrl-C, an error in a callback), keep the cache
                # equal to what was really accepted so the next call starts from a true state.
                if self._owner is me:
                    self._owner_thread = None  # finished: nobody need wait for it
                    self._turn.notify_all()
                    if not target.closed:
                        target.truncate(min(len(target.tokens), len(ctx) - 1))
                if drafter is not None:
                    drafter.finish(ctx)
            if constraint is not None:
                constraint.close()

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
            ctl = self._controllers[key] = AdaptiveLength(settings.n_max, settings.n_min, free=drafter.free)
            while len(self._controllers) > MAX_CONTROLLERS:
                self._controllers.popitem(last=False)
        else:
            self._controllers.move_to_end(key)
            ctl.new_generation()
        return ctl


_EMPTY = Draft()


def _verify(rows: np.ndarray, draft: Draft, params: SamplingParams, rng) -> tuple[list[int], int]:
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


def _verify_constrained(
    rows: np.ndarray,
    draft: Draft,
    params: SamplingParams,
    rng,
    constraint: Constraint,
    eog: frozenset[int],
    space: Callable[[], np.ndarray],
    trace: list[tuple[int, bool, int, float]] | None = None,
) -> tuple[list[int], int, bool]:
    """:func:`_verify` under a grammar: each position's token is the constrained one, and the grammar
    takes every emitted token in order (so no state needs rolling back: only final tokens reach it).
    A ``trace`` gets what :func:`_margins` gives, over the tokens the grammar allows there. The third
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
            trace.extend(_margins(allowed[None, :], [tok], int(ok)))
        constraint.accept(tok)
        out.append(tok)
        complete = tok not in eog and constraint.complete(eog, space)
        if not ok or complete:
            return out, i + int(ok), complete
        if tok in eog:  # an accepted end of generation: nothing after it is read
            return out, i + 1, False
    return out, len(drafts), False


def _margins(rows: np.ndarray, emitted: list[int], m: int) -> list[tuple[int, bool, int, float]]:
    out = []
    for i, tok in enumerate(emitted):
        top2 = np.partition(rows[i], -2)[-2:]
        out.append((tok, i < m, int(rows[i].argmax()), float(top2[1] - top2[0])))
    return out


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
