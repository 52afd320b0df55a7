"""How the verify curve's estimator copes with a busy machine: the same timings, two estimators.

Usage:
  python scripts/costs_under_load.py -t TARGET.gguf [--threads 2] [--out costs-load.json]

Times every width of :data:`localspec.decoding.costs.WIDTHS` in :data:`localspec.decoding.costs.MAX_SWEEPS`
interleaved sweeps,
three times: on a quiet machine, while another process spins on one core 1.5 s out of every 3, and quiet
again. From the same timings it derives the curve two ways: the median of the first 3 sweeps (how localspec
measured before 2026-12-01) and what :func:`localspec.decoding.costs.measure` does now (the second-fastest
timing,
with sweeps until :func:`localspec.decoding.costs.is_steady`), and prints how far each lands from its own
quiet curve.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys

import localspec
from localspec.decoding import costs as C

_SPIN = "import time\nwhile True:\n t = time.time()\n while time.time() - t < 1.5: pass\n time.sleep(1.5)\n"


def sweeps(model, n: int) -> dict[int, list[float]]:
    base = model.tokenize("def f(x):\n    return x + 1\n" * 4, add_bos=True)[:48]
    filler = (base * (1 + max(C.WIDTHS) // len(base)))[: max(C.WIDTHS)]
    model.reset()
    C._time_pass(model, base, filler[:1])
    times: dict[int, list[float]] = {w: [] for w in C.WIDTHS}
    for _ in range(n):
        for w in C.WIDTHS:
            times[w].append(C._time_pass(model, base, filler[:w]))
    return times


def median_of_3(times: dict[int, list[float]]) -> dict[int, float]:
    one = statistics.median(times[1][:3])
    return {w: statistics.median(ts[:3]) / one for w, ts in times.items()}


def fastest_until_steady(times: dict[int, list[float]]) -> tuple[dict[int, float], int]:
    n = C.MIN_SWEEPS
    while n < C.MAX_SWEEPS and not C.is_steady({w: ts[:n] for w, ts in times.items()}):
        n += 1
    one = C.typical(times[1][:n])
    return {w: C.typical(ts[:n]) / one for w, ts in times.items()}, n


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("-t", "--target", required=True)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out")
    a = ap.parse_args()
    pipe = localspec.load(target=a.target, draft="none", n_threads=a.threads, n_ctx=4096, suffix_store=False)
    out: dict[str, dict] = {}
    try:
        for label, spin in (("quiet", False), ("one core busy half the time", True), ("quiet again", False)):
            load = subprocess.Popen([sys.executable, "-c", _SPIN]) if spin else None
            try:
                times = sweeps(pipe.target, C.MAX_SWEEPS)
            finally:
                if load is not None:
                    load.kill()
                    load.wait()
            new, n = fastest_until_steady(times)
            out[label] = {"median of 3": median_of_3(times), "near-fastest until steady": new, "sweeps": n}
    finally:
        pipe.close()
    print(
        "| timings | estimator | sweeps | V(2) | V(16) | V(24) | V(32) | off its quiet curve: median | max |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for label, r in out.items():
        for est in ("median of 3", "near-fastest until steady"):
            curve, quiet = r[est], out["quiet"][est]
            off = [abs(curve[w] / quiet[w] - 1) for w in C.WIDTHS if w > 1]
            n = 3 if est == "median of 3" else r["sweeps"]
            vs = " | ".join(f"{curve[w]:.2f}" for w in (2, 16, 24, 32))
            print(f"| {label} | {est} | {n} | {vs} | {statistics.median(off):.1%} | {max(off):.1%} |")
    if a.out:
        with open(a.out, "w", encoding="utf-8") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
