"""Replay a recorded session against a free drafter, without the model: what its drafts would cost.

With greedy decoding the target's output does not depend on the drafter (lossless), so a session's
requests and the target's replies, recorded once (``scripts/replay_sessions.py record``), fix every
round a free drafter (n-gram lookup, the suffix cache) would play: each round drafts from the context,
the target accepts the longest prefix that matches its own next tokens and adds one, and the round costs
one verify pass of width ``drafted + 1``, ``V(drafted + 1)`` single passes on this machine's measured
curve. The replayed speedup is ``tokens / (sum of V over rounds + drafter seconds / T)``: what the engine
would measure if its rounds cost exactly V and nothing else. It is a design tool (a length rule is tried
in seconds instead of an hour of bench), never a published figure: ``localspec bench --sessions`` is.

Limits: logits depend on how a context is batched, so a real run may pick another token at a near tie
and part from the recording; the replay does not model the engine's own per-round overhead beyond V.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from localspec.decoding import speed
from localspec.decoding.drafters import Drafter
from localspec.llama.sampling import SamplingParams

GREEDY = SamplingParams(temperature=0.0)


@dataclass(frozen=True)
class Recorded:
    """One request as the target alone ran it: the prompt's tokens and the reply's tokens."""

    prompt: tuple[int, ...]
    output: tuple[int, ...]


@dataclass
class Replayed:
    """What a drafter's rounds over a sequence of requests would have cost."""

    tokens: int = 0
    rounds: int = 0
    passes: float = 0.0  # sum of V(width) over rounds, in single passes
    drafted: int = 0
    accepted: int = 0
    drafter_seconds: float = 0.0
    runs: list[tuple[int, int]] = field(default_factory=list)  # (drafted, accepted) per round that drafted

    def speedup(self, token_seconds: float) -> float:
        """Tokens per single-pass cost, drafter time counted in passes of ``token_seconds``."""
        cost = self.passes + (self.drafter_seconds / token_seconds if token_seconds > 0 else 0.0)
        return self.tokens / cost if cost else 0.0

    @property
    def acceptance(self) -> float | None:
        return self.accepted / self.drafted if self.drafted else None

    @property
    def accepted_per_round(self) -> float:
        return self.accepted / self.rounds if self.rounds else 0.0


def matched(draft: Sequence[int], truth: Sequence[int]) -> int:
    """How many leading tokens of ``draft`` equal ``truth``'s (the greedy acceptance rule)."""
    m = 0
    for a, b in zip(draft, truth, strict=False):
        if a != b:
            break
        m += 1
    return m


def replay_request(
    drafter: Drafter,
    request: Recorded,
    *,
    n_max: int,
    verify_cost: Callable[[int], float],
    into: Replayed | None = None,
    max_draft: int = 64,
) -> Replayed:
    """Play one request's rounds as the engine would (:meth:`localspec.decoding.engine.Engine._run`)."""
    out = into if into is not None else Replayed()
    ctx = list(request.prompt)
    truth = request.output
    rng = np.random.default_rng(0)
    drafter.begin(ctx[:-1])
    g = 0
    while g < len(truth):
        room = len(truth) - g
        k = min(n_max, room - 1, max_draft)
        t = time.perf_counter()
        draft = drafter.draft(ctx, k, GREEDY, rng).tokens if k > 0 else []
        out.drafter_seconds += time.perf_counter() - t
        m = matched(draft, truth[g:])
        emitted = min(m + 1, room)
        ctx.extend(truth[g : g + emitted])
        g += emitted
        out.rounds += 1
        out.passes += verify_cost(len(draft) + 1)
        out.tokens += emitted
        if draft:
            out.drafted += len(draft)
            out.accepted += m
            out.runs.append((len(draft), m))
    t = time.perf_counter()
    drafter.finish(ctx)
    out.drafter_seconds += time.perf_counter() - t
    return out


def replay(
    drafter: Drafter,
    requests: Sequence[Recorded],
    *,
    n_max: int,
    verify_cost: Callable[[int], float],
) -> Replayed:
    """Every request in order through one drafter (it keeps what it remembers between them)."""
    out = Replayed()
    for req in requests:
        replay_request(drafter, req, n_max=n_max, verify_cost=verify_cost, into=out)
    return out


def any_copy_ceiling(
    seen: list[list[int]], requests: list[Recorded], verify_cost: Callable[[int], float], n_max: int = 32
) -> Replayed:
    """How far any drafter that copies text it has seen could go: each round drafts the longest prefix of
    what the target will emit that occurs anywhere in ``seen`` (corpus, warm-up requests), in the earlier
    requests or in this request so far, whatever precedes it there, cut where (r + 1) / V(r + 1) is best.

    It knows the recording, so no drafter gets there; and each round takes its own best cut, so it is a
    per-round ceiling rather than a bound proven over a whole session (on a curve with dips a shorter cut
    now can, rarely, pay later). ``requests`` are played in order, each one seen by the next.
    """
    out = Replayed()

    def text(tokens: Sequence[int]) -> str:  # one character per token: str.find keeps token boundaries
        return "".join(chr(0x100 + t) for t in tokens)

    base = "\x00".join(text(doc) for doc in seen)
    for req in requests:
        truth = req.output
        g = 0
        while g < len(truth):
            here = text([*req.prompt, *truth[:g]])
            room = len(truth) - g
            lo, hi = 0, min(n_max, room - 1)
            while lo < hi:  # a prefix that occurs has every shorter prefix occurring too
                mid = (lo + hi + 1) // 2
                want = text(truth[g : g + mid])
                if want in here or want in base:
                    lo = mid
                else:
                    hi = mid - 1
            r, _ = speed.best_length(speed.iid_reach(1.0, lo), lo, draft=0.0, verify=verify_cost, k_min=0)
            out.rounds += 1
            out.passes += verify_cost(r + 1)
            out.tokens += r + 1
            out.drafted += r
            out.accepted += r
            g += r + 1
        base += "\x00" + text([*req.prompt, *truth])
    return out


def recorded(rows: Sequence[dict[str, Any]]) -> list[Recorded]:
    """Requests from their JSON form (``{"prompt": [...], "output": [...]}``)."""
    return [Recorded(tuple(int(t) for t in r["prompt"]), tuple(int(t) for t in r["output"])) for r in rows]
