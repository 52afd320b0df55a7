"""``localspec bench --rpc-rtt 0,5,20,50``: the target over local rpc-servers at added round trips against the
pair local (:mod:`localspec.bench.rpc_rtt`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from localspec import constants
from localspec.cli.bench_options import BenchOptions, say_build_note, split_names


def bench_rpc_rtt(o: BenchOptions) -> None:
    """Run the RPC bench of ``o`` and write rpc.json and rpc.md into ``--out``."""
    from localspec.bench.rpc_rtt import RttPlan, markdown, run_rtt_bench
    from localspec.bench.workloads import load_workloads

    names = split_names(o.workloads) or ["code", "edit"]
    prompts = [p for w in load_workloads(names, o.prompts, o.limit or 3) for p in w.prompts]
    plan = RttPlan(
        target=o.target,
        draft=o.draft,
        preset=o.preset,
        rtts=tuple(o.rpc_rtt or ()),
        prompts=tuple(prompts),
        max_tokens=o.max_tokens,
        threads=o.threads or constants.default_threads(),
        n_ctx=o.n_ctx or 1024,
    )
    out = Path(o.out_dir)
    result = run_rtt_bench(plan, logs=out / "servers", log=o.progress() or (lambda line: None))
    (out / "rpc.json").write_text(json.dumps(result, indent=1), encoding="utf-8")
    table = markdown(result)
    (out / "rpc.md").write_text(table + "\n", encoding="utf-8")
    if o.as_json:
        click.echo(json.dumps(result, indent=1))
        return
    click.echo(table)
    say_build_note()
    click.echo(f"\nwrote {out / 'rpc.json'}, {out / 'rpc.md'}")


def print_rpc_file(data: dict[str, Any], where: str, *, as_json: bool) -> None:
    """``--from-json`` on an rpc.json: its table again (or the document, with ``--json``)."""
    from localspec.bench.rpc_rtt import markdown

    table = markdown(data, where)  # (checks the document)
    click.echo(json.dumps(data, indent=1) if as_json else table)
