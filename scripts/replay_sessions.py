"""Record the multi-request workloads once with the target alone, then replay free drafters on them offline.

Usage:
  python scripts/replay_sessions.py record -t TARGET.gguf --out trace.json [--workload NAME ...] [--threads 2]
  python scripts/replay_sessions.py replay trace.json [--workload NAME ...] [--n-max 32] [--ceilings]
         [--per-request] [--costs $LOCALSPEC_HOME/costs/KEY.json]

``record`` runs every warm-up and measured session of each workload (localspec/data/sessions) with the
target alone, greedy, and keeps each request's prompt tokens and reply tokens, the corpus tokens, this
machine's V(b) and its seconds per target token. ``replay`` plays fixed-length prompt lookup and the
suffix cache (cold, warm) over the measured requests and prints what their rounds would cost
(:mod:`localspec.bench.replay`): a design tool, in seconds; published figures come from
``localspec bench --sessions``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from typing import Any

from localspec.bench.replay import (
    Recorded,
    Replayed,
    any_copy_ceiling,
    matched,
    recorded,
    replay,
    replay_request,
)
from localspec.bench.sessions import SESSION_WORKLOADS, load_session_workload, run_session
from localspec.decoding.costs import MachineCosts
from localspec.decoding.drafters import Draft, NgramDrafter
from localspec.suffix.calibration import PRIOR_TRUST, TOKEN_WEIGHT
from localspec.suffix.confidence import DRAFT_MARGIN
from localspec.suffix.drafter import SuffixDrafter
from localspec.suffix.index import SuffixIndex


def record(a: argparse.Namespace) -> int:
    import localspec

    pipe = localspec.load(
        target=a.target, draft="none", n_threads=a.threads, n_ctx=a.n_ctx, suffix_store=False
    )
    costs = pipe.machine_costs()
    out: dict[str, Any] = {
        "verify": {str(b): v for b, v in costs.verify.items()},
        "target_token_seconds": costs.target_token_seconds,
        "workloads": {},
    }
    for name in [] if a.only_single else a.workload or SESSION_WORKLOADS:
        wl = load_session_workload(name)
        corpus: list[list[int]] = []
        if wl.corpus is not None:
            pipe.set_corpus(wl.corpus)
            buf = pipe.suffix_drafter().index.corpus.tokens.tolist()
            doc: list[int] = []
            for t in buf:
                if t < 0:
                    corpus.append(doc)
                    doc = []
                else:
                    doc.append(t)
        parts: dict[str, list[list[dict[str, list[int]]]]] = {"warm": [], "measured": []}
        for part, sessions in (("warm", wl.warm), ("measured", wl.measured)):
            for session in sessions:
                rows: list[dict[str, list[int]]] = []

                def send(messages: list[dict[str, str]], rows: list = rows, cap: int = wl.max_tokens) -> Any:
                    reply = pipe.chat(messages, max_tokens=cap, strategy="none")
                    rows.append({"prompt": pipe.format_chat(messages)[0], "output": list(reply.tokens)})
                    return reply

                run_session(wl, session, send, clock=time.perf_counter)
                parts[part].append(rows)
                print(f"{name} {part} {session.id}: {sum(len(r['output']) for r in rows)} tokens", flush=True)
        out["workloads"][name] = {**parts, "corpus": corpus}
    if a.single or a.only_single:
        from localspec.bench.single import render
        from localspec.bench.workloads import select_workloads

        out["single"] = {}
        for w in select_workloads(limit=a.limit):
            rows = []
            for prompt in w.prompts:
                tokens, stops = render(pipe, prompt)
                stream = pipe.stream_tokens(
                    tokens, max_tokens=a.max_tokens, stop=stops or None, baseline=True
                )
                rows.append({"prompt": tokens, "output": [r.token for r in stream]})
            out["single"][w.name] = rows
            print(f"single {w.name}: {sum(len(r['output']) for r in rows)} tokens", flush=True)
    with open(a.out, "w") as f:
        json.dump(out, f)
    pipe.close()
    return 0


class NgramModLike:
    """llama.cpp's ``ngram-mod`` as the session bench runs it (n_match 12, n_min 4, n_max 16): a table from
    every 12 tokens seen (prompts and outputs of every request, shared across requests) to the token that
    followed them last; a draft rolls forward through it. Exact keys instead of its 4M-entry hash table, and
    no reset after a streak of low acceptance: a reference for the replay, not a drafter of localspec."""

    name = "ngram-mod"
    free = True
    takes_stop_rule = False

    def __init__(self, n_match: int = 12, n_min: int = 4, n_max: int = 16) -> None:
        self.n, self.n_min, self.n_max = n_match, n_min, n_max
        self.table: dict[tuple[int, ...], int] = {}
        self.last = 0

    def _add(self, ctx: list[int], upto: int) -> None:
        for i in range(self.last, upto - self.n):
            self.table[tuple(ctx[i : i + self.n])] = ctx[i + self.n]

    def use_sequence(self, seq_id: int) -> None:
        """A replay runs no model."""

    def begin(self, context: list[int]) -> None:
        self.last = 0
        self._add(context, len(context))
        self.last = max(0, len(context) - self.n)

    def draft(self, context: list[int], n: int, params: Any, rng: Any, stop: Any = None) -> Draft:
        if self.last + 32 < len(context):
            self._add(context, len(context))
            self.last = len(context) - self.n
        out: list[int] = list(context[-self.n :])
        for i in range(min(n, self.n_max)):
            tok = self.table.get(tuple(out[-self.n :]))
            if tok is None:
                if i < self.n_min:
                    return Draft(source="prompt")
                break
            out.append(tok)
        return Draft(tokens=out[self.n :], source="prompt")

    def lookup(self, context: list[int], n: int, params: Any, rng: Any) -> Draft:
        return self.draft(context, n, params, rng)

    def finish(self, context: list[int]) -> None:
        """The table is kept for the next request (llama.cpp's pool is shared across requests)."""


class OracleLength:
    """The suffix index's proposals, each cut at exactly the length the target will accept (it reads the
    recording): the ceiling of any length rule for these proposals on this curve."""

    name = "oracle"
    free = True
    takes_stop_rule = False

    def __init__(
        self, index: SuffixIndex, requests: list[Recorded], verify_cost: Callable[[int], float]
    ) -> None:
        self.index = index
        self.outputs = {r.prompt[:-1]: r for r in requests}
        self.V = verify_cost
        self.req: Recorded | None = None

    def use_sequence(self, seq_id: int) -> None:
        """A replay runs no model."""

    def begin(self, context: list[int]) -> None:
        self.req = self.outputs[tuple(context)]
        self.index.begin(context)

    def draft(self, context: list[int], n: int, params: Any, rng: Any, stop: Any = None) -> Draft:
        assert self.req is not None
        truth = self.req.output[len(context) - len(self.req.prompt) :]
        best, value = 0, 1.0
        for prop in self.index.propose(context, n):
            r = matched(prop.tokens, truth)
            if r and (r + 1) / self.V(r + 1) > value:
                best, value = r, (r + 1) / self.V(r + 1)
        return Draft(tokens=list(truth[:best]), source="history")

    def lookup(self, context: list[int], n: int, params: Any, rng: Any) -> Draft:
        return self.draft(context, n, params, rng)

    def finish(self, context: list[int]) -> None:
        self.index.add_request(context)


class EveryOccurrence(OracleLength):
    """Every earlier occurrence of the longest matched suffix in every source (not only the most frequent
    path), the best one chosen and cut with knowledge of the recording: the ceiling of choosing among the
    index's candidates, e.g. by verifying several of them in one tree-shaped pass (a tree costs more rows)."""

    name = "every-occurrence"

    def draft(self, context: list[int], n: int, params: Any, rng: Any, stop: Any = None) -> Draft:
        assert self.req is not None
        truth = self.req.output[len(context) - len(self.req.prompt) :]
        best, value = 0, 1.0
        for match in self.index.matches(context, n):
            for window in match.windows:
                r = matched(window, truth)
                if r and (r + 1) / self.V(r + 1) > value:
                    best, value = r, (r + 1) / self.V(r + 1)
        return Draft(tokens=list(truth[:best]), source="history")


_BAND_NAMES = ((4, "2-3"), (8, "4-7"), (12, "8-11"), (16, "12-15"))


def runs_by_match(index: SuffixIndex, requests: list[Recorded], k: int = 32) -> None:
    """How far each source's proposal runs along what the target emitted, by match length (every token
    position, as if a proposal were asked for there): does a long match predict a long run?"""
    stats: dict[tuple[str, str], list[int]] = {}
    for req in requests:
        ctx = list(req.prompt)
        index.begin(ctx[:-1])
        for g in range(len(req.output)):
            truth = req.output[g:]
            for prop in index.propose(ctx, k):
                lm = prop.match_length
                band = next((b for edge, b in _BAND_NAMES if lm < edge), "16+")
                uni = "unanimous" if prop.counts and prop.counts[0][0] == prop.counts[0][1] else "split"
                stats.setdefault((prop.source, f"{band} {uni}"), []).append(matched(prop.tokens, truth))
            ctx.append(req.output[g])
        index.add_request(ctx)
    print("| source | match | n | P(r>=1) | P(r>=4) | P(r>=8) | P(r>=16) | P(r>=16 given r>=1) | mean r |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for (src, band), rs in sorted(stats.items()):
        n = len(rs)
        p = [sum(r >= j for r in rs) / n for j in (1, 4, 8, 16)]
        g1 = sum(r >= 16 for r in rs) / max(1, sum(r >= 1 for r in rs))
        cells = " | ".join(f"{x:.2f}" for x in p)
        print(f"| {src} | {band} | {n} | {cells} | {g1:.2f} | {sum(rs) / n:.1f} |")


def _row(label: str, r: Replayed, token_seconds: float) -> str:
    acc = f"{r.acceptance:.2f}" if r.acceptance is not None else "-"
    return (
        f"| {label} | {r.speedup(token_seconds):.3f} | {acc} | {r.accepted_per_round:.2f} | "
        f"{r.drafted} | {1e6 * r.drafter_seconds / max(r.rounds, 1):.0f} |"
    )


def _index(corpus: list[list[int]], warm: list[Recorded]) -> SuffixIndex:
    """A suffix index over a recording's corpus and (prompt and reply of) the given warm-up requests."""
    index = SuffixIndex()
    if corpus:
        index.set_corpus(corpus)
    for r in warm:
        index.add_request([*r.prompt, *r.output])
    return index


def warm_drafter(
    corpus: list[list[int]],
    warm: list[Recorded],
    V: Callable[[int], float],
    n_max: int,
    margin: float = DRAFT_MARGIN,
    prior_trust: float = PRIOR_TRUST,
    token_weight: float = TOKEN_WEIGHT,
    carry_tokens: bool = True,
) -> SuffixDrafter:
    """A drafter starting where the session bench's *warm* setting starts: the warm-up requests played
    through one drafter, then a new one over that index with the calibration and token table a store
    keeps (``carry_tokens=False``: the token table learnt afresh); ``margin``, ``prior_trust`` and
    ``token_weight`` are :class:`SuffixDrafter`'s, for both."""
    before = SuffixDrafter(
        _index(corpus, []), verify_cost=V, margin=margin, prior_trust=prior_trust, token_weight=token_weight
    )
    replay(before, warm, n_max=n_max, verify_cost=V)
    return SuffixDrafter(
        before.index,
        verify_cost=V,
        margin=margin,
        prior_trust=prior_trust,
        token_weight=token_weight,
        calibration=before.carried_calibration(),
        tokens=before.carried_tokens() if carry_tokens else (),
    )


def per_request(
    corpus: list[list[int]],
    warm: list[Recorded],
    requests: list[Recorded],
    V: Callable[[int], float],
    n_max: int,
    carry: bool,
) -> Replayed:
    """The warm-up requests, then ``requests``, each through a new drafter over one growing index, as a new
    process per request (the command line) runs them (``scripts/bench_per_request.py`` measures the same);
    with ``carry`` each starts from the calibration and token table the previous one saved
    (:meth:`SuffixDrafter.carried_calibration`, :meth:`~SuffixDrafter.carried_tokens`), else it learns
    afresh. Only ``requests`` are counted."""
    index = _index(corpus, [])
    calibration: list = []
    tokens: list = []
    out = Replayed()
    for reqs, into in ((warm, Replayed()), (requests, out)):
        for req in reqs:
            drafter = SuffixDrafter(
                index,
                verify_cost=V,
                calibration=calibration if carry else (),
                tokens=tokens if carry else (),
            )
            replay_request(drafter, req, n_max=n_max, verify_cost=V, into=into)
            calibration, tokens = drafter.carried_calibration(), drafter.carried_tokens()
    return out


def replay_cmd(a: argparse.Namespace) -> int:
    data = json.load(open(a.trace))
    costs = MachineCosts(data["target_token_seconds"], {int(b): v for b, v in data["verify"].items()})
    if a.costs:  # another curve: a stored measurement (``$LOCALSPEC_HOME/costs/*.json``)
        costs = MachineCosts.from_json(json.load(open(a.costs)))
    V: Callable[[int], float] = costs.V
    T = costs.target_token_seconds
    if not a.workload:
        replay_single(data, V, T, a.n_max)
    for name, wl in data["workloads"].items():
        if a.workload and name not in a.workload:
            continue
        measured = [recorded(s) for s in wl["measured"]]
        flat: list[Recorded] = [r for s in measured for r in s]
        warm = [r for s in wl["warm"] for r in recorded(s)]
        print(f"\n{name}: {len(flat)} requests, {sum(len(r.output) for r in flat)} tokens")
        print("| drafter | replayed speedup | acceptance | accepted/round | drafted | drafter us/round |")
        print("| --- | --- | --- | --- | --- | --- |")
        for k in (4, 8, 16, 32):
            print(_row(f"ngram k={k}", replay(NgramDrafter(), flat, n_max=k, verify_cost=V), T))
        print(
            _row("llama.cpp ngram-mod (emulated)", replay(NgramModLike(), flat, n_max=16, verify_cost=V), T)
        )
        for warm_start in (False, True):
            drafter = (
                warm_drafter(wl["corpus"], warm, V, a.n_max)
                if warm_start
                else SuffixDrafter(_index(wl["corpus"], []), verify_cost=V)
            )
            label = f"suffix k={a.n_max} ({'warm' if warm_start else 'cold'})"
            print(_row(label, replay(drafter, flat, n_max=a.n_max, verify_cost=V), T))
        for margin in a.margin or ():
            for trust in a.trust or (PRIOR_TRUST,):
                drafter = warm_drafter(wl["corpus"], warm, V, a.n_max, margin=margin, prior_trust=trust)
                label = f"suffix k={a.n_max} (warm), margin {margin}, prior trust {trust}"
                print(_row(label, replay(drafter, flat, n_max=a.n_max, verify_cost=V), T))
        for weight in a.token_weight or ():
            for carry in (False, True):
                drafter = warm_drafter(
                    wl["corpus"], warm, V, a.n_max, token_weight=weight, carry_tokens=carry
                )
                label = f"suffix k={a.n_max} (warm), token weight {weight}{'' if carry else ', table afresh'}"
                print(_row(label, replay(drafter, flat, n_max=a.n_max, verify_cost=V), T))
        oracle = OracleLength(_index(wl["corpus"], warm), flat, V)
        print(
            _row(
                f"suffix k={a.n_max}, oracle length (warm)",
                replay(oracle, flat, n_max=a.n_max, verify_cost=V),
                T,
            )
        )
        if a.ceilings:
            every_occurrence = EveryOccurrence(_index(wl["corpus"], warm), flat, V)
            every = replay(every_occurrence, flat, n_max=a.n_max, verify_cost=V)
            print(_row("every occurrence, oracle choice and length (warm)", every, T))
            seen = [list(doc) for doc in wl["corpus"]]
            for label, docs in (("cold", seen), ("warm", [*seen, *([*r.prompt, *r.output] for r in warm)])):
                ceiling = any_copy_ceiling(docs, flat, V, n_max=a.n_max)
                print(_row(f"any copy of seen text, oracle ({label})", ceiling, T))
        if a.per_request:
            for label, carry in (("learnt again per request", False), ("kept with the store", True)):
                run = per_request(wl["corpus"], warm, flat, V, a.n_max, carry)
                print(_row(f"suffix warm, a new process per request, calibration {label}", run, T))
        if a.runs:
            print()
            runs_by_match(_index(wl["corpus"], warm), flat)
    return 0


def replay_single(data: dict, V: Callable[[int], float], T: float, n_max: int) -> None:
    """Single prompts as ``localspec bench`` runs them: every suffix run starts from an empty cache."""
    print("\n| single-prompt workload | ngram k=4 | suffix (empty cache per prompt) |")
    print("| --- | --- | --- |")
    for name, rows in data.get("single", {}).items():
        ng, sx = Replayed(), Replayed()
        for req in recorded(rows):
            replay_request(NgramDrafter(), req, n_max=4, verify_cost=V, into=ng)
            replay_request(
                SuffixDrafter(SuffixIndex(), verify_cost=V), req, n_max=n_max, verify_cost=V, into=sx
            )
        print(f"| {name} | {ng.speedup(T):.3f} | {sx.speedup(T):.3f} |")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    rec = sub.add_parser("record", help="run the workloads with the target alone and keep their tokens")
    rec.add_argument("-t", "--target", required=True)
    rec.add_argument("--out", required=True)
    rec.add_argument("--workload", action="append", choices=SESSION_WORKLOADS)
    rec.add_argument("--threads", type=int, default=2)
    rec.add_argument("--n-ctx", type=int, default=4096)
    rec.add_argument(
        "--single", action="store_true", help="also the single-prompt workloads, each prompt alone"
    )
    rec.add_argument("--only-single", action="store_true", help="only the single-prompt workloads")
    rec.add_argument("--limit", type=int, help="single prompts: at most this many per workload")
    rec.add_argument("--max-tokens", type=int, default=96, help="single prompts: tokens per answer")
    rep = sub.add_parser("replay", help="replay free drafters on a recording")
    rep.add_argument("trace")
    rep.add_argument("--workload", action="append", choices=SESSION_WORKLOADS)
    rep.add_argument("--n-max", type=int, default=32)
    rep.add_argument("--runs", action="store_true", help="also: run lengths of proposals by match length")
    rep.add_argument(
        "--ceilings",
        action="store_true",
        help="also: the best choice among every occurrence, and the best copy of any seen text (oracles)",
    )
    rep.add_argument(
        "--per-request",
        action="store_true",
        help="also: a new process per request (warm-up requests first), its calibration learnt again or kept",
    )
    rep.add_argument(
        "--margin",
        type=float,
        action="append",
        help=f"also: the warm suffix cache with this draft margin (default {DRAFT_MARGIN}; repeatable)",
    )
    rep.add_argument(
        "--trust",
        type=float,
        action="append",
        help=f"with --margin: each of these prior trusts (default {PRIOR_TRUST}; repeatable)",
    )
    rep.add_argument(
        "--token-weight",
        type=float,
        action="append",
        help=f"also: the warm suffix cache with this token weight (default {TOKEN_WEIGHT}; 0: none)",
    )
    rep.add_argument("--costs", help="a stored cost measurement (JSON) to use instead of the recording's")
    a = ap.parse_args()
    return record(a) if a.cmd == "record" else replay_cmd(a)


if __name__ == "__main__":
    sys.exit(main())
