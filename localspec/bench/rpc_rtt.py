"""The RPC bench (``localspec bench --rpc-rtt``): the target over llama.cpp's RPC backend, at added round
trips, against the same pair local, in one run.

Starts, on 127.0.0.1 only, two rpc-servers per round trip, each behind a delaying TCP proxy
(:class:`localspec.bench.rpc_local.DelayProxy`: half the round trip each way), and loads one pipeline per
round trip with the target's layers over its two servers and the draft local, plus the pair loaded
locally. Then, per prompt, every pipeline runs the target alone, the draft model (with a draft) and n-gram
lookup on the same token ids, greedy; the order of the pipelines turns with each prompt. Per pipeline and
strategy: the median tokens/s, the median speedup over the target alone on the same pipeline and prompt,
and how many texts equal the local run's.
"""

from __future__ import annotations

import contextlib
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

from localspec.bench.report import machine_info
from localspec.bench.rpc_local import DelayProxy, local_servers
from localspec.bench.single import engine_runner, open_pipeline, pipe_settings
from localspec.bench.workloads import Prompt
from localspec.errors import BenchError
from localspec.llama.programs import rpc_server_binary

if TYPE_CHECKING:
    from localspec.pipeline.pipeline import Pipeline

#: What the result file says it is (``bench --from-json`` tells it from others by this).
KIND = "localspec-rpc-bench"
#: The pipeline with no RPC.
LOCAL = "local"


@dataclass(frozen=True)
class RttPlan:
    """What an RPC bench runs: the pair, the round trips in ms, the prompts and their length."""

    target: str | None
    draft: str | None
    preset: str | None
    rtts: tuple[float, ...]
    prompts: tuple[Prompt, ...]
    max_tokens: int
    threads: int
    n_ctx: int = 1024


def run_rtt_bench(plan: RttPlan, *, logs: Path, log: Callable[[str], None] = lambda line: None) -> dict:
    """Every prompt on every pipeline and strategy, interleaved (one uncounted warm-up per pipeline).

    Args:
        plan: what to run.
        logs: a folder for the rpc-servers' logs.
        log: progress lines.

    Returns:
        The result file's document: ``kind``, ``date``, ``cpu``, ``machine``, ``setup``, ``placement`` (the
        layers where each pipeline put them), ``records`` and ``summary``.
    """
    with contextlib.ExitStack() as stack:
        pipes = _pipelines(plan, stack, logs, log)
        runners = {name: engine_runner(pipe) for name, pipe in pipes.items()}
        strategies = ["none", "model", "ngram"] if pipes[LOCAL].info.draft_path else ["none", "ngram"]
        configs = {s: pipe_settings(pipes[LOCAL], s) for s in strategies}
        names = list(pipes)
        for name in names:  # warm-up, uncounted: first passes, caches, the servers' buffers
            runners[name](plan.prompts[0], configs[strategies[-1]], 8)
        records = []
        for i, prompt in enumerate(plan.prompts):
            for name in names[i % len(names) :] + names[: i % len(names)]:
                for strategy, config in configs.items():
                    stats = runners[name](prompt, config, plan.max_tokens)
                    secs = stats["total_seconds"]
                    tps = stats["generated_tokens"] / secs if secs else 0.0
                    records.append(
                        {
                            "prompt": prompt.id,
                            "where": name,
                            "strategy": strategy,
                            "tok_s": tps,
                            "text": stats.get("text", ""),
                        }
                    )
                    log(f"{prompt.id} {name} {strategy}: {tps:.2f} tok/s")
        placement = {name: pipe.placement for name, pipe in pipes.items()}
    setup = {k: v for k, v in vars(plan).items() if k != "prompts"} | {
        "prompts": [p.id for p in plan.prompts]
    }
    machine = machine_info(plan.threads)
    return {
        "kind": KIND,
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "cpu": machine.get("cpu"),
        "machine": machine,
        "setup": setup,
        "placement": placement,
        "records": records,
        "summary": summarise(records, names, strategies),
    }


def _pipelines(
    plan: RttPlan, stack: contextlib.ExitStack, logs: Path, log: Callable[[str], None]
) -> dict[str, Pipeline]:
    """The local pipeline and one per round trip (its servers and proxies closed by ``stack``)."""

    def open_one(rpc: str | None) -> Pipeline:
        pipe = open_pipeline(
            plan.target, plan.draft, plan.preset, threads=plan.threads, n_ctx=plan.n_ctx, rpc=rpc
        )
        return stack.enter_context(pipe)

    binary = rpc_server_binary(log=log)
    pipes = {LOCAL: open_one(None)}
    for rtt in plan.rtts:
        servers = stack.enter_context(
            local_servers(binary, 2, threads=plan.threads, logs=logs / f"rtt-{rtt:g}ms")
        )
        proxies = [stack.enter_context(DelayProxy(s.endpoint, rtt)) for s in servers]
        log(f"loading the target over two rpc-servers at {rtt:g} ms round trip ...")
        pipes[f"rpc {rtt:g} ms"] = open_one(",".join(str(p.endpoint) for p in proxies))
    return pipes


def summarise(records: list[dict[str, Any]], names: Sequence[str], strategies: Sequence[str]) -> list[dict]:
    """Per pipeline and strategy: median tok/s, median speedup over its own target alone per prompt, and
    the texts equal to the local run's of the same strategy."""
    by = {(r["prompt"], r["where"], r["strategy"]): r for r in records}
    prompts = sorted({r["prompt"] for r in records})
    out = []
    for name in names:
        for strategy in strategies:
            tps = [by[p, name, strategy]["tok_s"] for p in prompts]
            base = [by[p, name, "none"]["tok_s"] for p in prompts]
            same = sum(by[p, name, strategy]["text"] == by[p, LOCAL, strategy]["text"] for p in prompts)
            out.append(
                {
                    "where": name,
                    "strategy": strategy,
                    "tok_s": statistics.median(tps),
                    "speedup": statistics.median(
                        [t / b if b else 0.0 for t, b in zip(tps, base, strict=True)]
                    ),
                    "same_text": f"{same}/{len(prompts)}",
                }
            )
    return out


def is_rtt_file(data: Any) -> bool:
    """Whether a read JSON document is an RPC bench's result file."""
    return isinstance(data, dict) and data.get("kind") == KIND


def markdown(data: dict[str, Any], where: str = "the result") -> str:
    """The result's table, under a line saying when and on what.

    Raises:
        BenchError: the document lacks its summary (naming ``where``).
    """
    try:
        lines = [
            f"{data['date']}, {data.get('cpu')}, {data['setup']['threads']} threads\n",
            "| where | strategy | tok/s (median) | speedup over target alone (median) | text as local |",
            "| --- | --- | --- | --- | --- |",
        ]
        for row in data["summary"]:
            lines.append(
                f"| {row['where']} | {row['strategy']} | {row['tok_s']:.2f} | {row['speedup']:.2f}x | "
                f"{row['same_text']} |"
            )
    except (KeyError, TypeError, ValueError) as exc:
        raise BenchError(
            f"{where} is not a readable RPC bench result ({type(exc).__name__}: {exc})",
            hint="give the rpc.json a `localspec bench --rpc-rtt` run wrote",
        ) from None
    return "\n".join(lines)
