"""Suffix cache costs at a million stored tokens: lookup per round, append, memory, save and load.

    python scripts/bench_suffix_store.py [--tokens 1000000] [--rounds 3000] [--saves 100]

The stored text is real: localspec's own source files tokenized with the embedded target's tokenizer,
stored as requests that are slices of it with small edits (so lookups find many earlier occurrences,
the expensive case), plus a miss workload of random tokens. A "round" is what the engine pays per
verify pass: ``SuffixDrafter.draft`` (index lookup, walk, calibration, choose_length) after the
context grew by the tokens the previous round emitted. Prints median and p95 in microseconds. Saving:
one full save of the store, then the cost of the save after each of ``--saves`` further requests, then
two stores on the same files saving in turn (two servers on one store) for ``--saves`` requests each.
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from localspec import constants  # noqa: E402
from localspec.llama.sampling import SamplingParams  # noqa: E402
from localspec.suffix.corpus import read_corpus  # noqa: E402
from localspec.suffix.drafter import SuffixDrafter  # noqa: E402
from localspec.suffix.index import SuffixIndex  # noqa: E402
from localspec.suffix.store import SuffixStore  # noqa: E402


def _source_tokens() -> np.ndarray:
    import llama_cpp

    from localspec.llama.logs import quiet_stderr

    with quiet_stderr():
        llm = llama_cpp.Llama(model_path=str(constants.EMBEDDED_TARGET), vocab_only=True, verbose=False)
    scan = read_corpus(ROOT / "localspec")
    toks = [t for _, text in scan.files for t in llm.tokenize(text.encode(), add_bos=False, special=False)]
    llm.close()
    return np.array(toks, dtype=np.int32)


def _edited_slice(src: np.ndarray, rng: np.random.Generator, length: int) -> list[int]:
    start = int(rng.integers(0, len(src) - length))
    out = src[start : start + length].copy()
    for _ in range(int(rng.integers(0, 6))):  # a few local edits, like a revised answer
        i = int(rng.integers(0, length))
        out[i] = int(rng.integers(0, 32000))
    return out.tolist()


def _pct(xs: list[float], q: float) -> float:
    return float(np.percentile(np.array(xs), q))


def _rounds(
    drafter: SuffixDrafter, contexts: list[list[int]], n_max: int, rng, ends: list[list[int]] | None = None
) -> tuple[list[float], list[float]]:
    """Per-round cost (wall and this thread's CPU time: on a busy machine the wall clock also counts
    time spent waiting for a core): each context is a generation; rounds advance by what a round emits.
    ``ends`` (when given) gets, per context, where each round's context ended."""
    params = SamplingParams()
    times, cpu = [], []
    for ctx in contexts:
        prompt_len = len(ctx) // 2
        drafter.begin(ctx[: prompt_len - 1])
        at = prompt_len
        if ends is not None:
            ends.append([])
        while at < len(ctx):
            if ends is not None:
                ends[-1].append(at)
            cur = ctx[:at]
            c, t = time.thread_time(), time.perf_counter()
            d = drafter.draft(cur, n_max, params, rng)
            times.append(time.perf_counter() - t)
            cpu.append(time.thread_time() - c)
            # the target accepts the drafts that match the real continuation, then emits one token
            m = 0
            while m < len(d.tokens) and at + m < len(ctx) and d.tokens[m] == ctx[at + m]:
                m += 1
            at += m + 1
    return times, cpu


def _index_rounds(
    index: SuffixIndex, contexts: list[list[int]], ends: list[list[int]], n_max: int
) -> list[float]:
    """The same rounds as :func:`_rounds` measured, the index's part alone: ``SuffixIndex.propose``
    (the lookup in every source and the walk along each match), without the drafter's calibration."""
    times = []
    for ctx, at_each in zip(contexts, ends, strict=True):
        index.begin(ctx[: len(ctx) // 2 - 1])
        for at in at_each:
            cur = ctx[:at]
            t = time.perf_counter()
            index.propose(cur, n_max)
            times.append(time.perf_counter() - t)
    return times


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=1_000_000)
    ap.add_argument("--request", type=int, default=2000, help="tokens per stored request")
    ap.add_argument("--rounds", type=int, default=3000)
    ap.add_argument("--n-max", type=int, default=16)
    ap.add_argument("--saves", type=int, default=100, help="requests saved one by one after the first save")
    args = ap.parse_args()
    print(
        f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs (wall times include waiting for one)"
    )
    rng = np.random.default_rng(0)

    src = _source_tokens()
    print(f"source text: {len(src):,} tokens of localspec's own code (embedded target's tokenizer)")
    requests = [_edited_slice(src, rng, args.request) for _ in range(args.tokens // args.request)]

    ix = SuffixIndex(max_history_tokens=args.tokens + args.request)
    t = time.perf_counter()
    per = []
    for r in requests:
        t1 = time.perf_counter()
        ix.add_request(r)
        per.append(time.perf_counter() - t1)
    total = time.perf_counter() - t
    print(f"\nappend: {len(requests)} requests of {args.request} tokens -> {ix.history_tokens:,} tokens")
    print(
        f"  {total / (ix.history_tokens / 1000) * 1e3:.2f} ms per 1K tokens amortized (merges included); "
        f"per request median {statistics.median(per) * 1e3:.1f} ms, p95 {_pct(per, 95) * 1e3:.1f} ms, "
        f"max {max(per) * 1e3:.0f} ms (a merge into the base part)"
    )
    t = time.perf_counter()
    SuffixIndex(max_history_tokens=args.tokens + args.request).set_corpus(requests)
    print(f"  a 1M-token corpus built in one go: {time.perf_counter() - t:.2f} s")

    mb, per_token = ix.nbytes() / 1e6, ix.nbytes() / ix.history_tokens
    print(
        f"\nmemory: {mb:.1f} MB for {ix.history_tokens:,} tokens = {per_token:.1f} bytes per token "
        f"({per_token:.0f} MB per 1M)"
    )

    drafter = SuffixDrafter(ix)
    n_ctx = max(1, args.rounds // 100)
    hits = [_edited_slice(src, rng, 600) for _ in range(n_ctx)]
    ends: list[list[int]] = []
    times, cpu = _rounds(drafter, hits, args.n_max, rng, ends)
    print(
        f"\nlookup per round at {ix.history_tokens:,} stored tokens, contexts from the stored kind of text "
        f"(n_max {args.n_max}): {len(times)} rounds"
    )
    print(
        f"  median {statistics.median(times) * 1e6:.1f} us, p95 {_pct(times, 95) * 1e6:.1f} us, "
        f"p99 {_pct(times, 99) * 1e6:.1f} us; CPU time median {statistics.median(cpu) * 1e6:.1f} us, "
        f"p95 {_pct(cpu, 95) * 1e6:.1f} us"
    )
    alone = _index_rounds(ix, hits, ends, args.n_max)
    print(
        f"  of which the index (SuffixIndex.propose: every source's lookup and walk; the rest is the "
        f"drafter's calibration and length choice): median {statistics.median(alone) * 1e6:.1f} us, "
        f"p95 {_pct(alone, 95) * 1e6:.1f} us"
    )
    misses = [rng.integers(0, 32000, 600).tolist() for _ in range(n_ctx)]
    times, cpu = _rounds(drafter, misses, args.n_max, rng)
    print(
        f"  contexts of random tokens (misses): median {statistics.median(times) * 1e6:.1f} us, "
        f"p95 {_pct(times, 95) * 1e6:.1f} us; CPU time median {statistics.median(cpu) * 1e6:.1f} us"
    )
    t = time.perf_counter()
    for ctx in hits[:10]:
        ix.overlap(ctx)
    print(f"  overlap() of a 600-token prompt: {(time.perf_counter() - t) / 10 * 1e3:.2f} ms")

    with tempfile.TemporaryDirectory() as d:
        # a store with room to spare (no eviction during the measurement): the index as saved after a
        # request is the 1M-token one, then each further request is saved the way SuffixDrafter.finish does
        st = SuffixStore(d, "ab" * 32, max_tokens=2 * args.tokens + args.request, n_vocab=32000)
        t = time.perf_counter()
        st.save(ix)
        save = time.perf_counter() - t
        size = _store_bytes(d)
        loads = _loads(st, ix.history_tokens)
        print(
            f"\nstore of {ix.history_tokens:,} tokens: {size / 1e6:.1f} MB on disk; full save "
            f"{save * 1e3:.0f} ms (write, fsync, rename); load "
            f"median {statistics.median(loads) * 1e3:.0f} ms (read, checksum, checks; from the page cache)"
        )
        back = st.load()
        saves = []
        for _ in range(args.saves):
            back.add_request(_edited_slice(src, rng, args.request))
            t = time.perf_counter()
            assert st.save(back), st.problem
            saves.append(time.perf_counter() - t)
        if saves:
            print(
                f"  save per request ({args.saves} requests of {args.request} tokens after it): median "
                f"{statistics.median(saves) * 1e3:.1f} ms, p95 {_pct(saves, 95) * 1e3:.1f} ms, max "
                f"{max(saves) * 1e3:.0f} ms, mean {statistics.mean(saves) * 1e3:.1f} ms (amortized)"
            )
            loads = _loads(st, back.history_tokens)
            print(
                f"  then {_store_bytes(d) / 1e6:.1f} MB on disk for {back.history_tokens:,} tokens; "
                f"load median {statistics.median(loads) * 1e3:.0f} ms"
            )
            # a second process on the same files: each save follows the other's append
            other = SuffixStore(d, "ab" * 32, max_tokens=2 * args.tokens + args.request, n_vocab=32000)
            theirs = other.load()
            turns: list[float] = []
            for _ in range(args.saves):
                for store, index in ((st, back), (other, theirs)):
                    index.add_request(_edited_slice(src, rng, args.request))
                    t = time.perf_counter()
                    assert store.save(index), store.problem
                    turns.append(time.perf_counter() - t)
            print(
                f"  two stores on these files saving in turn ({args.saves} requests each): median "
                f"{statistics.median(turns) * 1e3:.1f} ms, p95 {_pct(turns, 95) * 1e3:.1f} ms, max "
                f"{max(turns) * 1e3:.0f} ms per save (each takes in the other's request first)"
            )


def _store_bytes(directory: str) -> int:
    return sum(p.stat().st_size for p in Path(directory).iterdir() if p.is_file())


def _loads(st: SuffixStore, expect: int) -> list[float]:
    loads = []
    for _ in range(5):
        gc.collect()
        t = time.perf_counter()
        back = st.load()
        loads.append(time.perf_counter() - t)
        assert st.problem is None and back.history_tokens == expect
    return loads


if __name__ == "__main__":
    main()
