"""The speculative loop: draft, verify in one batched target pass, keep what the target agrees with.

Invariant between rounds, per generation: ``ctx`` is the prompt plus every emitted token; the generation's
sequence of the target (:class:`~localspec.llama.sequence.Sequence`) holds ``ctx[:-1]`` and the last token is
*pending* (its logits are not computed yet). A round decodes ``[pending] + drafts`` in one batch, asking
llama.cpp for output rows at exactly those positions, accepts the longest agreeing prefix (greedy: equal to
the target's argmax; sampling: the rejection rule in :mod:`localspec.llama.sampling`), emits one more token
from the target's own row at the first disagreement (or after the last draft), and removes the rejected
drafts from its sequence. With no drafter the same loop is the target alone, one token per pass: the
baseline.

A step (:meth:`Engine.step`) runs the rounds of several generations, each on its own sequence, in ONE pass:
the rows of every round (and chunks of prompts still going in) share one ``llama_decode``, and each
generation accepts or takes back its own drafts. Each sequence's logits rows are still exactly its verified
positions', so the invariant holds for each; one generation alone is a step of one (there is one loop).

A target with recurrent memory (a hybrid such as Qwen3.5, or a Mamba) takes drafts back through state
snapshots or a checkpoint saved before the pass (:meth:`Model.checkpoint`, :mod:`localspec.llama.recurrent`),
per sequence; after a checkpoint restore the accepted tokens are *owed*: the sequence holds ``ctx[:-1]`` in
name, and its next verify pass evaluates the owed tokens in front of the pending one.

A round drafts at most :attr:`Model.max_draft` tokens (one llama.cpp batch holds the pending token and
the drafts: every logits row of a verify pass comes from one decode), within its share of a shared pass,
and never past the context.

Sharing: one :class:`Engine` (one :class:`~localspec.pipeline.api.Pipeline`) may run any number of
generations, from several threads or interleaved in one thread (a stream suspended while another runs).
Each step runs under the engine's lock and never yields while holding it. A generation is placed on a free
sequence (the one holding the longest part of its prompt); with more generations than sequences they share
one by turns. Each sequence's owner marker says whose context it holds: a round that finds another
generation ran on it in between re-syncs it to its own context first (the longest common prefix stays).
Drafter state is per generation (n-gram tables are never shared; a draft model drafts on the generation's
own sequence of it and re-syncs that sequence on every draft call). So whatever the interleaving, every
output is what that generation gives alone. Scheduling: a round from another thread waits while the
sequence's owner is running (its last round ended less than :data:`HANDOVER_SECONDS` ago), so threads take
turns per generation rather than re-syncing each round; a suspended or abandoned stream holds nothing
beyond that grace, and a stream of the same thread never waits (its other streams cannot be running). This
is simpler to make airtight than holding the lock for a whole stream: an abandoned, unclosed stream can
never hang the other callers, and same-thread interleaving cannot deadlock.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
import time
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from localspec.constrain.grammar import Constraint, Grammar
from localspec.decoding import accept
from localspec.decoding.adaptive import AdaptiveLength
from localspec.decoding.drafters import Draft, Drafter
from localspec.decoding.model_draft import joint_drafting
from localspec.decoding.pass_costs import PassCosts
from localspec.decoding.prefill import PREFILL_CHUNK, keep_pace
from localspec.decoding.speed import batch_lengths
from localspec.decoding.stats import GenerationStats
from localspec.decoding.text_stream import TextStream
from localspec.errors import LocalspecError, SettingsError
from localspec.llama.runtime import Model
from localspec.llama.sampling import SamplingParams
from localspec.llama.sequence import Sequence
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
        # per sequence of the target: the generation whose context it holds, its thread, its last round's end
        self._owners = {seq.seq_id: _Owner() for seq in target.sequences}
        #: what passes of each width cost here, measured on the passes the steps ran
        self.pass_costs = PassCosts()

    def start(
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
    ) -> Generation:
        """A generation checked and ready to step (:meth:`step`) or stream (:meth:`stream`): errors raise
        here, before any pass.

        With a ``grammar`` every emitted token keeps it satisfiable (see :mod:`localspec.constrain.grammar`
        for what the target's token is then); drafts are verified against the same rule.

        Args:
            prompt_tokens: the prompt as the target's token ids.
            drafter: what proposes drafts (None: the target alone).
            max_tokens: the most tokens to generate.
            params: sampling (greedy at temperature 0).
            settings: the drafting settings (lengths, adaptive).
            stop: stop strings.
            stats: the generation's running stats, filled as it goes.
            grammar: a rule the output keeps to.

        Returns:
            The generation, not yet begun (its prompt is evaluated by its first step).
        """
        if not prompt_tokens:
            raise LocalspecError("the prompt is empty after tokenization", hint="give a non-empty prompt")
        if drafter is not None and settings.n_max > self.target.max_draft:
            raise SettingsError(
                f"n_max {settings.n_max} is more than one verify pass can check with this context "
                f"({self.target.max_draft} drafts: llama.cpp's batch is {self.target.n_batch})",
                hint=f"use n_max {self.target.max_draft} or less, or load with a larger n_ctx",
            )
        stats.prompt_tokens = len(prompt_tokens)
        return Generation(
            ctx=list(prompt_tokens),
            drafter=drafter,
            max_tokens=max_tokens,
            params=params,
            settings=settings,
            stats=stats,
            constraint=self._constraint(grammar),
            text=TextStream(self.target, stop),
            rng=np.random.default_rng(params.seed),
        )

    def _constraint(self, grammar: Grammar | None) -> Constraint | None:
        if grammar is None:
            return None
        t = self.target
        trigger = t.tokenize(grammar.trigger, add_bos=False, special=True) if grammar.trigger else []
        if grammar.trigger and len(trigger) != 1:  # a trigger no single token spells: free text
            return None
        trigger_id = trigger[0] if trigger else None
        return Constraint(t.vocab, t.n_vocab, grammar, textless=t.textless_ids(), trigger_id=trigger_id)

    def stream(self, prompt_tokens: list[int], **kwargs: Any) -> Iterator[TokenResponse]:
        """Validate now (errors raise here, not at the first ``next``), then return the token stream of one
        generation: :meth:`start`'s arguments."""
        return self.run(self.start(prompt_tokens, **kwargs))

    def run(self, gen: Generation) -> Iterator[TokenResponse]:
        """One generation (from :meth:`start`) stepped alone until it finishes, its tokens as they come; the
        lock is never held while it yields, and however the stream ends the generation is ended
        (:meth:`end`)."""
        try:
            while gen.finish is None:
                out = self.step([gen], fit=False)[0]
                if gen.error is not None:
                    raise gen.error
                yield from out  # never while holding the lock: a suspended stream blocks nobody
        finally:
            self.end(gen)

    # Sequences --------------------------------------------------------------------------------
    def _place(self, gen: Generation, taken: set[int]) -> bool:
        """Under the lock: give ``gen`` a sequence of the target that no generation of this step has: a free
        one holding the longest part of its prompt; with none free, the one idle longest, shared by turns.

        Returns:
            False when every sequence is taken by this step's generations (``gen`` waits for a later step).
        """
        now, ctx = time.monotonic(), gen.ctx
        best: tuple[bool, int, float] | None = None
        for seq in self.target.sequences:
            if seq.seq_id in taken:
                continue
            owner = self._owners[seq.seq_id]
            free = owner.thread is None or owner.round_end + HANDOVER_SECONDS < now
            key = (free, seq.common_prefix(ctx, 1), -owner.round_end)
            if best is None or key > best:
                best, gen.seq = key, seq
        return best is not None

    def _claim(self, gen: Generation) -> None:
        """Under the lock: make ``gen``'s sequence hold ``ctx[:-1]`` if another generation ran on it since."""
        assert gen.seq is not None
        owner = self._owners[gen.seq.seq_id]
        me_thread = threading.get_ident()
        while owner.owner is not gen.me and owner.thread not in (None, me_thread):
            left = owner.round_end + HANDOVER_SECONDS - time.monotonic()
            if left <= 0:
                break  # the running generation is suspended (or abandoned): take over
            self._turn.wait(left)
        if self.target.closed:
            raise LocalspecError("this pipeline was closed", hint="load it again with localspec.load()")
        if owner.owner is not gen.me:
            owner.owner, owner.thread = gen.me, me_thread
            todo = self.target.sync(gen.ctx[:-1], seq=gen.seq)
            if gen.begun:  # taken back from another generation mid-way: its context again, at once
                self.target.decode(todo, seq=gen.seq)
            else:
                gen.todo = todo

    # Steps ------------------------------------------------------------------------------------
    def step(self, gens: list[Generation], *, fit: bool = True) -> list[list[TokenResponse]]:
        """One step of every generation in ``gens`` (each on its own sequence), in ONE verify pass.

        A generation whose prompt is not in yet evaluates a chunk of it in the same pass (all of it when
        it is alone); one whose prompt is in drafts and verifies its round. With ``fit`` and several rounds
        in the pass, each draft is cut to what pays for its rows
        (:func:`localspec.decoding.speed.batch_lengths`).

        Args:
            gens: generations from :meth:`start`, not finished.
            fit: choose the draft lengths for the batch (False: each drafter's own, as when alone).

        Returns:
            Per generation, the tokens it emitted in this step (none while its prompt goes in).
        """
        with self.lock:
            taken = {g.seq.seq_id for g in gens if g.seq is not None}
            placed = []
            for gen in gens:
                if gen.seq is None and not self._place(gen, taken):
                    continue  # every sequence is busy in this step: it waits
                taken.add(_seq(gen).seq_id)
                self._claim(gen)
                placed.append(gen)
            out = dict(zip(map(id, placed), self._step(placed, fit=fit and len(placed) > 1), strict=True))
            now = time.monotonic()
            for gen in placed:
                self._owners[_seq(gen).seq_id].round_end = now
            return [out.get(id(g), []) for g in gens]

    def _step(self, gens: list[Generation], *, fit: bool) -> list[list[TokenResponse]]:
        target = self.target
        for gen in gens:
            if not gen.begun and not gen.todo:  # its prompt was cached already
                self._begin(gen)
        rounds = [g for g in gens if g.begun and g.finish is None]
        filling = [g for g in gens if not g.begun]
        if len(filling) == 1 and not rounds:  # alone: the whole prompt now, as fast as it goes
            self._prefill(filling[0])
            return [[] for _ in gens]
        chunks = self._chunks(filling, rounds)
        used = sum(target.batch_width(_seq(g), c) for g, c in chunks)
        plans = self._plans(rounds, target.n_batch - used, self._model_caps(rounds, used) if fit else {})
        if fit and len(plans) > 1:
            self._fit(plans, base=used)
        for p in plans:
            target.checkpoint(ahead=len(p.tokens), seq=p.gen.seq)  # recurrent memory: what taking back needs
            p.replayed = _seq(p.gen).owed
        parts = [(_seq(g), c, 0) for g, c in chunks]
        parts += [(_seq(p.gen), [p.gen.ctx[-1], *p.tokens], len(p.tokens) + 1) for p in plans]
        widths = [target.batch_width(seq, toks) for seq, toks, _ in parts]
        t = time.perf_counter()
        rows = target.decode_many(parts) if parts else []
        seconds = time.perf_counter() - t
        self.pass_costs.add(sum(widths), seconds)
        share = [seconds * w / max(1, sum(widths)) for w in widths]
        for (gen, chunk), spent in zip(chunks, share, strict=False):
            gen.todo = gen.todo[len(chunk) :]
            gen.stats.prompt_seconds += spent
            if not gen.todo:
                self._begin(gen)
            else:  # its draft model reads the prompt as far as the target has: no long pass when it begins
                done = gen.ctx[: len(gen.ctx) - 1 - len(gen.todo)]
                gen.stats.prompt_seconds += keep_pace(gen.drafter, _seq(gen).seq_id, done)
        n = len(chunks)
        out = {}
        for p, r, v in zip(plans, rows[n:], share[n:], strict=True):
            try:
                out[id(p.gen)] = self._finish_round(p, r, v)
            except Exception as exc:  # its grammar or sampler failed: it ends alone
                _fail(p.gen, exc)
        return [out.get(id(g), []) for g in gens]

    def _chunks(
        self, filling: list[Generation], rounds: list[Generation]
    ) -> list[tuple[Generation, list[int]]]:
        """The prompt chunks that go in this step's pass beside the running rounds: at most
        :data:`~localspec.decoding.prefill.PREFILL_CHUNK` tokens in all (a long prompt delays the running
        sequences' tokens by about one chunk's time), in what the batch leaves after every round's widest
        pass."""
        target = self.target
        widest = sum(1 + _seq(g).owed + (g.settings.n_max if g.drafter else 0) for g in rounds)
        room = min(target.n_batch - widest, PREFILL_CHUNK)
        out = []
        for gen in filling:
            take = min(len(gen.todo), room - _seq(gen).owed)
            if take <= 0:
                break
            out.append((gen, gen.todo[:take]))
            room -= take + _seq(gen).owed
        return out

    def _prefill(self, gen: Generation) -> None:
        """Evaluate what is left of ``gen``'s prompt now (in chunks of the batch), then begin it."""
        t0 = time.perf_counter()
        self.target.decode(gen.todo, seq=gen.seq)
        gen.todo = []
        gen.stats.prompt_seconds += time.perf_counter() - t0
        self._begin(gen)

    def _begin(self, gen: Generation) -> None:
        """The prompt is in: the drafter reads it, an adaptive setting gets its controller, the clock
        starts."""
        t0 = time.perf_counter()
        assert gen.seq is not None
        self.target.mark_prefix(gen.seq)  # recurrent memory: a later request on this prompt comes back here
        if gen.drafter is not None:
            gen.drafter.use_sequence(gen.seq.seq_id)
            gen.drafter.begin(gen.ctx[:-1])
            if gen.settings.adaptive and gen.controller is None:
                gen.controller = self._controller(gen.drafter, gen.settings, gen.params)
        gen.stats.prompt_seconds += time.perf_counter() - t0
        gen.begun = True
        gen.t_start = time.perf_counter()

    def _model_caps(self, rounds: list[Generation], used: int) -> dict[int, int]:
        """Before a shared pass, the most each model drafter (whose drafting costs passes, unlike a lookup's)
        may draft: what :func:`batch_lengths` keeps of ``n_max`` drafts at the generation's acceptance so far,
        so that drafting a model's tokens the shared pass would cut is not paid for (empty before two pass
        widths were measured, or with one round)."""
        verify = self.pass_costs.curve()
        models = [g for g in rounds if g.drafter is not None and not g.drafter.free]
        if verify is None or len(rounds) < 2 or not models:
            return {}
        reaches = [g.reach(Draft(tokens=[0] * g.settings.n_max)) for g in models]
        base = used + sum(1 + _seq(g).owed for g in rounds)
        ks = batch_lengths(reaches, [g.settings.n_max for g in models], base=base, verify=verify)
        return {id(g): k for g, k in zip(models, ks, strict=True)}

    def _plans(self, rounds: list[Generation], free: int, caps: dict[int, int]) -> list[_Plan]:
        """Each round's proposal, within the context left, its share of the batch's ``free`` rows and its cap
        from :meth:`_model_caps`."""
        target, out = self.target, []
        share = free // max(1, len(rounds))
        joint = joint_drafting() if len(rounds) > 1 else contextlib.nullcontext()
        t0 = time.perf_counter()
        with joint:  # the draft model's steps for every round share passes (localspec.decoding.model_draft)
            for gen in rounds:
                assert gen.seq is not None
                room = min(gen.max_tokens - gen.generated, target.n_ctx - len(gen.ctx) + 1)
                if room <= 0:
                    gen.finish = gen.stats.finish_reason = "length"
                    continue
                if gen.seq.owed + 1 > share:  # owed tokens that do not fit beside the others: first alone
                    target.decode([], seq=gen.seq)
                cap = min(room - 1, target.max_draft, share - 1 - gen.seq.owed, caps.get(id(gen), room))
                try:
                    out.append(self._propose(gen, cap=max(0, cap)))
                except Exception as exc:  # this generation's drafter failed: it ends alone
                    _fail(gen, exc)
            t_joint = time.perf_counter()
        if len(rounds) > 1:
            _share_joint(out, time.perf_counter() - t_joint, t_joint - t0)
        return out

    def _fit(self, plans: list[_Plan], base: int) -> None:
        """Cut the drafts of a shared pass to what pays for its rows, by this machine's measured pass costs
        (nothing is cut before two widths have been measured)."""
        verify = self.pass_costs.curve()
        if verify is None:
            return
        reaches = [p.gen.reach(p.draft) for p in plans]
        rows = base + sum(1 + _seq(p.gen).owed for p in plans)
        ks = batch_lengths(reaches, [len(p.tokens) for p in plans], base=rows, verify=verify)
        for p, k in zip(plans, ks, strict=True):
            if k < len(p.tokens):
                p.gen.stats.batch_cut += len(p.tokens) - k
                p.tokens = p.tokens[:k]

    def _propose(self, gen: Generation, cap: int) -> _Plan:
        """The drafter's proposal for this round (empty for the target alone), at most ``cap`` tokens."""
        drafter, controller = gen.drafter, gen.controller
        rollback_before = _seq(gen).rollback.seconds
        if drafter is None:
            return _Plan(gen, _EMPTY, 0, 0.0, [], rollback_before)
        replay = bool(_seq(gen).owed)
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
        gen.stats.draft_evals += draft.evals  # (a joint draft's are added when it ran: _share_joint)
        return _Plan(gen, draft, k, seconds, list(draft.tokens), rollback_before)

    def _finish_round(self, plan: _Plan, rows: np.ndarray, verify_seconds: float) -> list[TokenResponse]:
        """A round after its pass: accept, take back what was rejected, learn; the tokens to emit."""
        gen, target = plan.gen, self.target
        assert gen.seq is not None
        n_d = len(plan.tokens)
        draft = plan.verified_draft()
        replayed = plan.replayed
        gen.stats.verify_seconds += verify_seconds
        gen.stats.verify_tokens += n_d + 1
        if (
            plan.draft is not _EMPTY and gen.drafter is not None
        ):  # its calls and seconds (a combination's apart)
            gen.stats.record_calls(plan.draft.spent or {gen.drafter.name: plan.seconds})
        t = time.perf_counter()
        verdict = self._accept(gen, rows, draft)
        target.truncate(len(gen.ctx) + verdict.accepted, seq=gen.seq)
        gen.stats.sample_seconds += time.perf_counter() - t
        cost = _Cost(verify_seconds, gen.seq.rollback.seconds - plan.rollback_before, replayed)
        gen.stats.rollback_seconds += cost.rollback_seconds
        gen.stats.replayed_tokens += replayed
        self._learn(gen, plan, draft, verdict.accepted, cost)
        return self._emit(gen, draft, verdict)

    def _accept(self, gen: Generation, rows: np.ndarray, draft: Draft) -> _Verdict:
        """What the target keeps of the draft and the token it adds (:mod:`localspec.decoding.accept`)."""
        trace = gen.trace if gen.trace is not None else self.trace
        if gen.constraint is None:
            emitted, m = accept.verify(rows, draft, gen.params, gen.rng)
            if trace is not None:
                trace.extend(accept.margins(rows, emitted, m))
            return _Verdict(emitted, m, False)
        t = self.target
        emitted, m, complete = accept.verify_constrained(
            rows, draft, gen.params, gen.rng, gen.constraint, t.eog_ids, t.space_ids, trace
        )
        return _Verdict(emitted, m, complete)

    def _learn(self, gen: Generation, plan: _Plan, draft: Draft, accepted: int, cost: _Cost) -> None:
        """Stats of the round, and what the adaptive controller measures from it."""
        stats = gen.stats
        n_d = len(draft.tokens)
        if gen.drafter is None:
            stats.rounds += 1
            return
        stats.record_round(n_d, accepted, [draft.source_of(i) for i in range(n_d)], drafter=draft.source)
        if gen.controller:
            gen.controller.update(
                plan.asked,
                n_d,
                accepted,
                draft_evals=draft.evals,
                draft_seconds=plan.seconds,
                first_seconds=draft.first_seconds,
                fed=draft.fed,
                verify_seconds=cost.verify_seconds,
                confidence=draft.confidence,
                rollback_seconds=cost.rollback_seconds,
                replayed=cost.replayed,
            )
            stats.predicted_speedup = gen.controller.predicted_speedup()

    def _emit(self, gen: Generation, draft: Draft, verdict: _Verdict) -> list[TokenResponse]:
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

    def end(self, gen: Generation) -> None:
        """Whatever happened (a closed stream, Ctrl-C, an error in a callback, a cancelled request), keep the
        sequence equal to what was really accepted so the next call starts from a true state, free it for
        others, and let the drafter learn. Called once per generation, finished or not.

        Args:
            gen: a generation from :meth:`start`.
        """
        stats, target = gen.stats, self.target
        stats.total_seconds = time.perf_counter() - gen.t_start
        stats.finish_reason = stats.finish_reason or gen.finish or "cancelled"
        with self.lock:
            owner = self._owners[gen.seq.seq_id] if gen.seq is not None else None
            if owner is not None and owner.owner is gen.me:
                owner.thread = None  # finished: nobody need wait for it
                self._turn.notify_all()
                if not target.closed:
                    target.truncate(min(len(gen.seq.tokens), len(gen.ctx) - 1), seq=gen.seq)  # type: ignore[union-attr]
            if gen.drafter is not None and gen.begun:
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


def _share_joint(plans: list[_Plan], seconds: float, before: float) -> None:
    """After joint drafting: each plan's draft as it was filled, and its share (by passes) of the ``seconds``
    the shared draft passes took."""
    del before  # the proposals' own time (lookups) is already counted per plan
    evals = sum(p.draft.evals for p in plans if not p.tokens)
    for p in plans:
        if p.tokens or not p.draft.evals:
            continue  # a lookup's draft, or nothing drafted
        spent = seconds * p.draft.evals / max(1, evals)
        p.tokens = list(p.draft.tokens)
        p.seconds += spent
        if p.draft.spent:  # a combination: the model's part of its time
            p.draft.spent["model"] = p.draft.spent.get("model", 0.0) + spent
        p.gen.stats.draft_seconds += spent
        p.gen.stats.draft_evals += p.draft.evals


def _fail(gen: Generation, exc: Exception) -> None:
    """``gen`` ends with ``exc`` (the others in its step go on)."""
    gen.error = exc
    gen.finish = gen.stats.finish_reason = "error"


def _seq(gen: Generation) -> Sequence:
    """The sequence a placed generation runs on."""
    assert gen.seq is not None, "placed by its first step"
    return gen.seq


@dataclass
class Generation:
    """One generation's state across its steps (the engine itself holds only what generations share)."""

    ctx: list[int]  # the prompt plus every emitted token; its sequence holds ctx[:-1]
    drafter: Drafter | None
    max_tokens: int
    params: SamplingParams
    settings: DraftSettings
    stats: GenerationStats
    constraint: Constraint | None
    text: TextStream
    rng: np.random.Generator
    controller: AdaptiveLength | None = None
    seq: Sequence | None = None  # the target's sequence it runs on (placed at its first step)
    todo: list[int] = field(default_factory=list)  # prompt tokens its sequence has still to evaluate
    begun: bool = False  # its prompt is in and its drafter has read it
    error: Exception | None = None  # what ended it, when something failed in its own part of a step
    trace: list[accept.TraceRow] | None = None  # its own trace rows (else the engine's :attr:`Engine.trace`)
    generated: int = 0
    finish: str | None = None
    t_start: float = field(default_factory=time.perf_counter)
    me: object = field(default_factory=object)  # the owner marker of its sequence

    def reach(self, draft: Draft) -> list[float]:
        """The chance that the first ``i + 1`` tokens of ``draft`` are all accepted, per ``i``: each token at
        its drafter's confidence where it gives one, else at this generation's acceptance so far (one
        accepted of two drafted to start from)."""
        s = self.stats
        rate = (s.accepted + 1) / (s.drafted + 2)
        out, p = [], 1.0
        for i in range(len(draft.tokens)):
            c = draft.confidence[i] if i < len(draft.confidence) else 1.0
            p *= c if c < 1.0 else rate
            out.append(p)
        return out


@dataclass
class _Plan:
    """A round's proposal: the draft, the tokens of it that go in the pass (cut to fit a shared pass), the
    length the controller asked for, the seconds drafting took, and what was owed and spent on rollback
    before it."""

    gen: Generation
    draft: Draft
    asked: int
    seconds: float
    tokens: list[int]
    rollback_before: float
    replayed: int = 0

    def verified_draft(self) -> Draft:
        """The draft as far as it went in the pass."""
        k, d = len(self.tokens), self.draft
        if k == len(d.tokens):
            return d
        return dataclasses.replace(
            d, tokens=d.tokens[:k], probs=d.probs[:k], sources=d.sources[:k], confidence=d.confidence[:k]
        )


@dataclass
class _Owner:
    """Who a sequence of the target runs for: the generation whose context it holds, that generation's
    thread while it has not finished, and when its last step ended."""

    owner: object | None = None
    thread: int | None = None
    round_end: float = 0.0


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
