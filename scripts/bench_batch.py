#!/usr/bin/env python3
"""Throughput of many requests at once, in one process: the load-aware choice against fixed ones.

For each client count (the requests run together through ``Pipeline.generate_many`` on a pipeline loaded with
``parallel`` = the largest count) and each setting, the same prompts are generated greedily and the aggregate
completion tokens per second is measured; settings are interleaved within each repeat, and the table gives
each setting's median over repeats as a ratio to the target alone at the same client count. The settings:

- ``none``: the target alone, batched;
- ``ngram``, ``model k=2``, ``model k=4``: fixed drafts, each request drafting as it would alone;
- ``auto (load-aware)``: the adaptive draft model after n-gram lookups, with each step's drafts cut to what
  pays in the shared pass (what ``serve --parallel`` runs);
- ``one at a time``: the same load-aware setting, one request after another (``serve --parallel 1``).

    python scripts/bench_batch.py -t models/target.gguf -d models/draft.gguf --clients 1,2,4,8 --json out.json
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from datetime import date
from pathlib import Path

import localspec
from localspec.bench.workloads import select_workloads

SETTINGS: dict[str, dict] = {
    "none": {"strategy": "none"},
    "ngram": {"strategy": "ngram", "n_max": 4},
    "model k=2": {"strategy": "model", "n_max": 2, "adaptive": False, "p_min": 0.0},
    "model k=4": {"strategy": "model", "n_max": 4, "adaptive": False, "p_min": 0.0},
    "auto (load-aware)": {"strategy": "model+ngram", "n_max": 4, "adaptive": True},
}


def _cpu() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def _run(pipe, prompts: list[str], kw: dict, *, fit: bool, alone: bool, max_tokens: int) -> float:
    """Aggregate completion tokens per second of ``prompts`` run together (or one after another)."""
    t = time.perf_counter()
    if alone:
        tokens = sum(len(pipe.generate(p, max_tokens=max_tokens, **kw).tokens) for p in prompts)
    else:
        batch = pipe.batch(fit=fit)
        gens = [pipe.start_tokens(pipe.tokenize(p), max_tokens=max_tokens, **kw) for p in prompts]
        for g in gens:
            batch.add(g)
        tokens = 0
        while not batch.idle:
            tokens += sum(len(e.tokens) for e in batch.step())
    return tokens / (time.perf_counter() - t)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", "-t", required=True)
    ap.add_argument("--draft", "-d", required=True)
    ap.add_argument("--clients", default="1,2,4,8")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", dest="json_out")
    a = ap.parse_args()
    levels = [int(c) for c in a.clients.split(",")]
    prompts = [p.text for w in select_workloads(["code", "chat"], 4) for p in w.prompts]
    rows: dict[tuple[int, str], list[float]] = {}
    with localspec.load(
        a.target, a.draft, parallel=max(levels), n_ctx=1024, n_threads=a.threads, suffix_store=False
    ) as pipe:
        pipe.generate(prompts[0], max_tokens=8)  # warm-up
        for r in range(a.repeats):
            for c in levels:
                group = [prompts[(r + i) % len(prompts)] for i in range(c)]
                for name, kw in SETTINGS.items():
                    fit = name.startswith("auto")
                    rows.setdefault((c, name), []).append(
                        _run(pipe, group, kw, fit=fit, alone=False, max_tokens=a.max_tokens)
                    )
                kw = SETTINGS["auto (load-aware)"]
                rows.setdefault((c, "one at a time"), []).append(
                    _run(pipe, group, kw, fit=True, alone=True, max_tokens=a.max_tokens)
                )
                print(f"repeat {r + 1} clients {c} done", flush=True)
    names = [*SETTINGS, "one at a time"]
    out = {"date": date.today().isoformat(), "cpu": _cpu(), "threads": a.threads, "rows": []}
    print("| clients | " + " | ".join(names) + " |")
    print("| --- " * (len(names) + 1) + "|")
    for c in levels:
        base = statistics.median(rows[(c, "none")])
        cells = []
        for n in names:
            med = statistics.median(rows[(c, n)])
            cells.append(f"{med:.1f} tok/s ({med / base:.2f}x)")
            out["rows"].append({"clients": c, "setting": n, "tok_s": rows[(c, n)], "median": med})
        print(f"| {c} | " + " | ".join(cells) + " |")
    if a.json_out:
        Path(a.json_out).write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
