"""Side by side in one process: what a request's suffix-drafter calibration starts from.

Usage:
  python scripts/ab_request_start.py -t TARGET.gguf -d DRAFT.gguf [--workload NAME ...] [--repeats 3]
         [--out ab.json]

Three ways, interleaved (the order reverses every other repeat), each warm from its own run of the
workload's warm-up sessions, the target alone first in every repeat; the figure is the median over repeats of
generation tokens/s over the target alone's:

- ``carry``: what localspec does (``SuffixDrafter.begin`` starts every request from
  ``carried_calibration()``, what a store gives a new process);
- ``all kept``: what it did before 2026-12-01 (a request started from everything the process had learnt);
- ``prompt kept``: history and corpus cells afresh per request, the prompt's cells kept unscaled.

The other two replace ``SuffixDrafter.begin`` for their runs only; published in
docs/archive/bench-notebook.md.
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections.abc import Callable
from typing import Any

import localspec
from localspec.bench.session_run import BASELINE, SessionConfig, _run_once, warm_snapshot
from localspec.bench.sessions import SESSION_WORKLOADS, load_session_workload
from localspec.settings import DraftSettings
from localspec.suffix import drafter as sx
from localspec.suffix.calibration import CARRIED_SOURCES

_CARRY = sx.SuffixDrafter.begin


def _all_kept(self: sx.SuffixDrafter, context: list[int]) -> None:
    self._watches = []
    self.index.begin(context)


def _prompt_kept(self: sx.SuffixDrafter, context: list[int]) -> None:
    self._watches = []
    self.calibration = {k: v for k, v in self.calibration.items() if k[0][0] in CARRIED_SOURCES}
    self.index.begin(context)


def _use(begin: Any) -> None:
    """Make ``begin`` what every suffix drafter runs at the start of a request."""
    sx.SuffixDrafter.begin = begin  # type: ignore[method-assign]


VARIANTS: dict[str, Callable[[sx.SuffixDrafter, list[int]], None]] = {
    "carry": _CARRY,
    "all kept": _all_kept,
    "prompt kept": _prompt_kept,
}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("-t", "--target", required=True)
    ap.add_argument("-d", "--draft")
    ap.add_argument("--workload", action="append", choices=SESSION_WORKLOADS)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out")
    a = ap.parse_args()
    pipe = localspec.load(
        target=a.target, draft=a.draft or "none", n_threads=a.threads, n_ctx=4096, suffix_store=False
    )
    costs = pipe.machine_costs()
    print(f"V(2) {costs.V(2):.2f}, V(16) {costs.V(16):.2f}, V(17) {costs.V(17):.2f}", flush=True)
    suffix = SessionConfig(DraftSettings(strategy="suffix", n_max=32), warm=True)
    results: dict[str, dict] = {}
    try:
        for name in a.workload or ["edit-session", "multi-turn", "repo-code"]:
            wl = load_session_workload(name)
            if wl.corpus is not None:
                pipe.set_corpus(wl.corpus)
            warm = {}
            for label, begin in VARIANTS.items():
                _use(begin)
                warm[label], seconds = warm_snapshot(pipe, wl, wl.max_tokens)
                print(f"{name}: warm-up for {label}: {seconds:.0f} s", flush=True)
            runs: dict[str, list] = {k: [] for k in ["none", *VARIANTS]}
            for r in range(max(1, a.repeats)):
                order = list(VARIANTS) if r % 2 == 0 else list(reversed(VARIANTS))
                for label in ["none", *order]:
                    _use(VARIANTS.get(label, _CARRY))
                    if label == "none":
                        pipe.reset_suffix()
                        run = _run_once(pipe, wl, SessionConfig(BASELINE), wl.max_tokens)
                    else:
                        pipe.reset_suffix(warm[label].index, warm[label].calibration, warm[label].tokens)
                        run = _run_once(pipe, wl, suffix, wl.max_tokens)
                    runs[label].append(run)
                    src = {
                        s: f"{run.accepted_by_source.get(s, 0)}/{n}" for s, n in run.drafted_by_source.items()
                    }
                    print(
                        f"{name} repeat {r + 1}: {label}: {run.tokens} tokens, {run.gen_tps:.2f} tok/s {src}"
                    )
            results[name] = {}
            for label in VARIANTS:
                ratios = [m.gen_tps / b.gen_tps for m, b in zip(runs[label], runs["none"], strict=True)]
                results[name][label] = {"median": statistics.median(ratios), "ratios": ratios}
                print(f"{name}: {label}: {statistics.median(ratios):.3f}x {[round(x, 3) for x in ratios]}")
    finally:
        _use(_CARRY)
        pipe.close()
    if a.out:
        with open(a.out, "w", encoding="utf-8") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
