"""The speculative loop: draft, verify in one batched target pass, keep what the target agrees with.

Invariant between rounds: ``ctx`` is the prompt plus every emitted token; the target's KV cache
holds ``ctx[:-1]`` and the last token is *pending* (its logits are not computed yet). A round
decodes ``[pending] + drafts`` in one batch, asking llama.cpp for output rows at exactly those
positions, accepts the longest agreeing prefix (greedy: equal to the target's argmax; sampling:
the rejection rule in :mod:`localspec.sampling`), emits one more token from the target's own row
at the first disagreement (or after the last draft), and removes the rejected drafts from the KV
cache. With no drafter the same loop is the target alone, one token per pass: the baseline.
"""

from __future__ import annotations

import codecs
import time
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from localspec.adaptive import AdaptiveLength
from localspec.drafters import Draft
from localspec.runtime import Model
from localspec.sampling import SamplingParams, accept_or_resample, distribution, sample
from localspec.stats import GenerationStats


@dataclass
class TokenResponse:
    """One emitted token: its text, id, whether the drafter proposed it, and the running stats."""

    text: str
    token: int
    from_draft: bool
    stats: GenerationStats
    finish_reason: str | None = None


class Engine:
    """Runs generations of one target with an optional drafter. Not thread-safe: one at a time."""

    def __init__(self, target: Model) -> None:
        self.target = target
        # When a list: one (token, from_draft, argmax of the verifying row, top-2 logit margin) per
        # emitted token. For tests and diagnostics; off by default (it costs a partial sort per token).
        self.trace: list[tuple[int, bool, int, float]] | None = None
        # Adaptive draft-length controllers per drafter setting: the costs they measured (draft call,
        # verify pass by width) hold for the next generation too, and acceptance serves as a prior.
        self._controllers: dict[tuple, AdaptiveLength] = {}

    def stream(
        self,
        prompt_tokens: list[int],
        *,
        drafter=None,
        max_tokens: int,
        params: SamplingParams,
        n_max: int = 4,
        adaptive: bool = False,
        n_min: int = 0,
        stop: list[str] | None = None,
        stats: GenerationStats,
    ) -> Iterator[TokenResponse]:
        target = self.target
        if not prompt_tokens:
            raise ValueError("the prompt is empty after tokenization")
        ctx = list(prompt_tokens)
        stats.prompt_tokens = len(ctx)
        rng = np.random.default_rng(params.seed)
        controller = None
        if adaptive and drafter is not None:
            controller = self._controller(drafter, n_max, n_min, params)
        text_out = _TextStream(target, stop)
        trace = self.trace

        t0 = time.perf_counter()
        target.decode(target.sync(ctx[:-1]), outputs=0)  # the last prompt token stays pending
        if drafter is not None:
            drafter.begin(ctx[:-1])
        stats.prompt_seconds = time.perf_counter() - t0

        t_start = time.perf_counter()
        generated = 0
        finish = None
        try:
            while finish is None:
                room = min(max_tokens - generated, target.n_ctx - len(ctx) + 1)
                if room <= 0:
                    finish = "length"
                    break
                k = 0
                draft = _EMPTY
                if drafter is not None:
                    k = controller.choose() if controller else n_max
                    k = min(k, room - 1)
                    t = time.perf_counter()
                    if k > 0:
                        draft = drafter.draft(ctx, k, params, rng)
                    elif controller and room > 1 and hasattr(drafter, "lookup"):
                        # the draft model sits out this round; an n-gram lookup is still free
                        draft = drafter.lookup(ctx, min(n_max, room - 1), params, rng)
                    dt = time.perf_counter() - t
                    stats.draft_seconds += dt
                    stats.draft_evals += draft.evals
                drafts = draft.tokens
                n_d = len(drafts)

                t = time.perf_counter()
                rows = target.decode([ctx[-1], *drafts], outputs=n_d + 1)
                tv = time.perf_counter() - t
                stats.verify_seconds += tv
                stats.verify_tokens += n_d + 1

                t = time.perf_counter()
                emitted, m = _verify(rows, draft, params, rng)
                if trace is not None:
                    trace.extend(_margins(rows, emitted, m))
                target.truncate(len(ctx) + m)
                stats.sample_seconds += time.perf_counter() - t
                if drafter is not None:
                    stats.record_round(n_d, m)
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
                    if tok in target.eog_ids:
                        finish = "stop"
                        tail = text_out.flush()
                        stats.finish_reason = finish
                        yield TokenResponse(tail, tok, i < m, stats, finish)
                        break
                    piece, hit_stop = text_out.push(tok)
                    if hit_stop:
                        finish = "stop"
                    elif generated >= max_tokens:
                        finish = "length"
                    if finish:
                        piece += text_out.flush()
                        stats.finish_reason = finish
                    yield TokenResponse(piece, tok, i < m, stats, finish)
                    if finish:
                        break
        finally:
            stats.total_seconds = time.perf_counter() - t_start
            stats.finish_reason = stats.finish_reason or finish or "cancelled"
            # Whatever happened (a closed stream, Ctrl-C, an error in a callback), keep the cache
            # equal to what was really accepted so the next call starts from a true state.
            target.truncate(min(len(target.tokens), len(ctx) - 1))


    def _controller(self, drafter, n_max: int, n_min: int, params: SamplingParams) -> AdaptiveLength:
        model = getattr(drafter, "model", None)
        p_min = getattr(drafter, "p_min", getattr(model, "p_min", None))
        key = (drafter.name, n_max, n_min, p_min, params.greedy, params.temperature)
        ctl = self._controllers.get(key)
        if ctl is None:
            ctl = self._controllers[key] = AdaptiveLength(n_max, n_min, free=getattr(drafter, "free", False))
        else:
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
