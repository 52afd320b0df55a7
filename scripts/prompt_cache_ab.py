"""What the prompt cache spares: a request back on a prompt after another request took its sequence.

Two pipelines of the same pair, one with the prompt cache (the default) and one without
(``prompt_cache_mb=0``), each holding one sequence; for each repeat and prompt, interleaved: the prompt,
another prompt (it takes the sequence), the prompt again. Reported per pipeline: the median seconds from the
call to the first token of the prompt's second request, and the ratio (without / with), with the texts
compared (greedy: they must match).

    python scripts/prompt_cache_ab.py --target T.gguf [--draft D.gguf] [--repeats 3]
"""

from __future__ import annotations

import argparse
import itertools
import platform
import statistics
import time

import localspec
from localspec.bench.workloads import load_workloads


def first_token_seconds(pipe, text: str, max_tokens: int) -> tuple[float, list[int]]:
    """Seconds to the first token of ``text`` (greedy), and its tokens."""
    t0, first, tokens = time.perf_counter(), None, []
    for r in pipe.stream_tokens(pipe.tokenize(text), max_tokens=max_tokens):
        first = first if first is not None else time.perf_counter() - t0
        tokens.append(r.token)
    return first or 0.0, tokens


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", required=True)
    ap.add_argument("--draft", default="none")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--prompts", type=int, default=6, help="built-in prompts to use (cycled workloads)")
    args = ap.parse_args()
    workloads = load_workloads(None, None, None)
    mixed = [p for row in itertools.zip_longest(*(w.prompts for w in workloads)) for p in row if p]
    prompts = [p.text for p in mixed[: args.prompts]]
    load = {"n_threads": args.threads, "suffix_store": False, "parallel": 1}
    with (
        localspec.load(args.target, args.draft, **load) as cached,
        localspec.load(args.target, args.draft, prompt_cache_mb=0, **load) as plain,
    ):
        times: dict[str, list[float]] = {"cache": [], "none": []}
        same = 0
        for _, (i, text) in itertools.product(range(args.repeats), enumerate(prompts)):
            other = prompts[(i + 1) % len(prompts)]
            texts = []
            for name, pipe in (("cache", cached), ("none", plain)):
                first_token_seconds(pipe, text, 4)
                first_token_seconds(pipe, other, 4)
                seconds, tokens = first_token_seconds(pipe, text, 8)
                times[name].append(seconds)
                texts.append(tokens)
            same += texts[0] == texts[1]
    with_cache, without = statistics.median(times["cache"]), statistics.median(times["none"])
    where = platform.processor() or platform.machine()
    print(f"{where}, {args.threads} threads, {len(times['cache'])} requests")
    print(f"first token, the prompt again: {with_cache:.3f} s with the cache, {without:.3f} s without")
    print(f"ratio {without / with_cache:.1f}x; identical texts {same}/{len(times['cache'])}")


if __name__ == "__main__":
    main()
