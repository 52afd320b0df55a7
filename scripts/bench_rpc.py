"""The target over llama.cpp's RPC backend against the same pair local, in one run (docs/rpc.md's table).

Starts, on 127.0.0.1 only, one pair of rpc-servers per added round trip (--rtt, default 0 5 20 50 ms), each
server behind a delaying TCP proxy (localspec.bench.rpc_local.DelayProxy: half the round trip each way),
and loads one pipeline per round trip with the target's layers over its two servers and the draft local,
plus the pair loaded locally. Then, per prompt, every pipeline runs the target alone, the draft model and
n-gram lookup on the same token ids, greedy; the order of the pipelines turns with each prompt. Prints
per setting the median tokens/s and the median speedup over the target alone on the same pipeline, and
writes the records as JSON.

Usage: python scripts/bench_rpc.py [--target T.gguf --draft D.gguf] [--rtt 0 5 20 50] [--limit 3]
       [-n 64] [--threads 2] [--server-threads 2] [--out bench-out/rpc.json]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
from pathlib import Path
from typing import Any

from localspec.bench.report import machine_info
from localspec.bench.rpc_local import DelayProxy, local_servers
from localspec.bench.single import engine_runner, open_pipeline, pipe_settings
from localspec.bench.workloads import load_workloads
from localspec.llama.programs import rpc_server_binary
from localspec.settings import DraftSettings

STRATEGIES = ("none", "model", "ngram")


def _pipelines(args: argparse.Namespace, stack: contextlib.ExitStack) -> dict[str, Any]:
    """The local pipeline and one per round trip (its servers and proxies closed by ``stack``)."""
    binary = rpc_server_binary(log=lambda m: print(m, file=sys.stderr))
    pipes = {"local": stack.enter_context(_open(args, None))}
    for rtt in args.rtt:
        servers = stack.enter_context(local_servers(binary, 2, threads=args.server_threads))
        proxies = [stack.enter_context(DelayProxy(s.endpoint, rtt)) for s in servers]
        print(f"loading the target over two rpc-servers at {rtt:g} ms round trip ...", file=sys.stderr)
        pipes[f"rpc {rtt:g} ms"] = stack.enter_context(
            _open(args, ",".join(str(p.endpoint) for p in proxies))
        )
    return pipes


def _open(args: argparse.Namespace, rpc: str | None) -> Any:
    return open_pipeline(args.target, args.draft, None, threads=args.threads, n_ctx=1024, rpc=rpc)


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Every prompt on every pipeline and strategy, interleaved; the records and the medians."""
    prompts = [p for w in load_workloads(args.workloads, None, args.limit) for p in w.prompts]
    with contextlib.ExitStack() as stack:
        pipes = _pipelines(args, stack)
        runners = {name: engine_runner(pipe) for name, pipe in pipes.items()}
        configs: dict[str, DraftSettings] = {s: pipe_settings(pipes["local"], s) for s in STRATEGIES}
        placement = {name: pipe.placement for name, pipe in pipes.items()}
        names = list(pipes)
        for name in names:  # warm-up, uncounted: first passes, caches, the servers' buffers
            runners[name](prompts[0], configs["model"], 8)
        records = []
        for i, prompt in enumerate(prompts):
            order = names[i % len(names) :] + names[: i % len(names)]
            for name in order:
                for strategy, config in configs.items():
                    stats = runners[name](prompt, config, args.max_tokens)
                    tps = (
                        stats["generated_tokens"] / stats["total_seconds"] if stats["total_seconds"] else 0.0
                    )
                    records.append(
                        {
                            "prompt": prompt.id,
                            "where": name,
                            "strategy": strategy,
                            "tok_s": tps,
                            "text": stats.get("text", ""),
                        }
                    )
                    print(f"{prompt.id:>18} {name:>12} {strategy:>6} {tps:7.2f} tok/s", file=sys.stderr)
    return {"records": records, "placement": placement, "summary": summarise(records, names)}


def summarise(records: list[dict[str, Any]], names: list[str]) -> list[dict[str, Any]]:
    """Per pipeline and strategy: median tok/s, median speedup over its own target alone per prompt."""
    by = {(r["prompt"], r["where"], r["strategy"]): r for r in records}
    prompts = sorted({r["prompt"] for r in records})
    out = []
    for name in names:
        for strategy in STRATEGIES:
            tps = [by[p, name, strategy]["tok_s"] for p in prompts]
            speedups = [by[p, name, strategy]["tok_s"] / by[p, name, "none"]["tok_s"] for p in prompts]
            same = sum(by[p, name, strategy]["text"] == by[p, "local", strategy]["text"] for p in prompts)
            out.append(
                {
                    "where": name,
                    "strategy": strategy,
                    "tok_s": statistics.median(tps),
                    "speedup": statistics.median(speedups),
                    "same_text": f"{same}/{len(prompts)}",
                }
            )
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default=None)
    ap.add_argument("--draft", default=None)
    ap.add_argument("--rtt", type=float, nargs="+", default=[0, 5, 20, 50])
    ap.add_argument("--workloads", nargs="+", default=["code", "edit"])
    ap.add_argument("--limit", type=int, default=3)
    ap.add_argument("-n", "--max-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--server-threads", type=int, default=2)
    ap.add_argument("--out", default="bench-out/rpc.json")
    args = ap.parse_args(argv)
    result = run(args)
    result["machine"] = machine_info(args.threads)
    result["settings"] = {k: v for k, v in vars(args).items() if k != "out"}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1), encoding="utf-8")
    print("| where | strategy | tok/s (median) | speedup over target alone (median) | text as local |")
    print("| --- | --- | --- | --- | --- |")
    for row in result["summary"]:
        print(
            f"| {row['where']} | {row['strategy']} | {row['tok_s']:.2f} | {row['speedup']:.2f}x | "
            f"{row['same_text']} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
