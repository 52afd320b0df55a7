"""``localspec bench``: speedup, acceptance, ceiling and memory per workload; tuner; llama.cpp peer."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import click

from localspec import constants
from localspec.bench.sessions import SESSION_WORKLOADS
from localspec.bench.workloads import WORKLOADS, workload_choices
from localspec.cli.bench_clients import bench_clients, print_clients_file
from localspec.cli.bench_options import (
    CLIENT_PEER_MODES,
    BenchCommand,
    BenchOptions,
    SweepList,
    check_names,
    check_out_dir,
    check_preset_name,
    check_serve_modes,
    make_out_dir,
    parse_counts,
    parse_lengths,
    parse_p_min,
    parse_rtts,
    say_build_note,
    usage_line,
)
from localspec.cli.bench_rpc import bench_rpc_rtt, print_rpc_file
from localspec.cli.bench_sessions import bench_sessions
from localspec.cli.options import COUNT, MAX_TOKENS, TEMPERATURE, shared_options
from localspec.errors import LocalspecError
from localspec.settings import (
    MAX_TUNE_SWEEP,
    N_MAX_RANGE,
    P_MIN_RANGE,
    REPEATS_RANGE,
    SPECULATIVE_STRATEGIES,
)

_N_LO, _N_HI = N_MAX_RANGE
_P_LO, _P_HI = P_MIN_RANGE
#: the defaults of --peer-n-max and --peer-p-min (localspec.bench.peer.PEER_N_MAX and PEER_P_MIN)
_PEER_N_MAX, _PEER_P_MIN = "2-8", "0,0.5,0.75"
_SESSION_ROWS = (
    "ngram-4",
    "ngram-8",
    "ngram-16",
    "ngram-32",
    "suffix-cold",
    "suffix-warm",
    "auto-warm",
    "model",
    "suffix-afresh",
    "suffix-no-token-table",
)
_DEFAULT_SESSION_ROWS = _SESSION_ROWS[:8]


@click.command("bench", cls=BenchCommand)
@click.option("--target", "-t", type=click.Path(dir_okay=False), help="Target GGUF (default: embedded pair).")
@click.option(
    "--draft", "-d", help="Draft GGUF path, 'ngram', 'none' or 'auto' (default: auto, automatic pairing)."
)
@click.option("--preset", "-p", help="A preset name (see `localspec presets`).")
@click.option(
    "--workloads",
    "-w",
    multiple=True,
    callback=lambda ctx, param, values: check_names(ctx, param, values, workload_choices(), "single-prompt"),
    help=f"Comma-separated subset of: {', '.join(workload_choices())} (default: {', '.join(WORKLOADS)}).",
)
@click.option("--prompts", type=click.Path(dir_okay=False), help="Your own prompt file (lines or JSONL).")
@click.option(
    "--sessions",
    multiple=True,
    callback=lambda ctx, param, values: check_names(ctx, param, values, SESSION_WORKLOADS, "session"),
    help=f"Multi-request workloads instead ({', '.join(SESSION_WORKLOADS)}): the suffix cache cold and warm "
    "against fixed-length n-gram lookup, each session run in order through one pipeline.",
)
@click.option(
    "--limit", type=COUNT, help="Use only the first N prompts of each workload (default: all; --tune: 2)."
)
@click.option(
    "--max-tokens",
    "-n",
    default=128,
    show_default=True,
    type=MAX_TOKENS,
    help="Tokens per prompt at most (with --sessions: a cap on each request's own length).",
)
@click.option("--temperature", default=0.0, show_default=True, type=TEMPERATURE, help="0 = greedy.")
@click.option(
    "--repeats",
    default=1,
    show_default=True,
    type=click.IntRange(*REPEATS_RANGE),
    help="Runs per prompt and setting.",
)
@shared_options("threads", "n_ctx")
@click.option(
    "--strategy",
    "strategies",
    multiple=True,
    type=click.Choice(SPECULATIVE_STRATEGIES),
    help="Strategies to measure (default: model and ngram with a draft, else ngram).",
)
@shared_options("n_max", "p_min", "rpc", "tensor_split")
@click.option(
    "--adaptive",
    is_flag=True,
    help="Also run (with --tune: sweep) each strategy with the adaptive draft length.",
)
@click.option(
    "--peer",
    is_flag=True,
    help="Also run llama.cpp's own speculative decoding (built once): its draft-simple over --peer-n-max x "
    "--peer-p-min (its defaults, n-max 3 and p-min 0, always among them), reported at its best.",
)
@click.option(
    "--peer-n-max",
    type=SweepList("lengths", parse_lengths),
    default=_PEER_N_MAX,
    show_default=True,
    metavar="LENGTHS",
    help="With --peer: the draft lengths llama.cpp's draft-simple runs at (fewer make the run shorter).",
)
@click.option(
    "--peer-p-min",
    type=SweepList("values", parse_p_min),
    default=_PEER_P_MIN,
    show_default=True,
    metavar="VALUES",
    help="With --peer: the p-min values llama.cpp's draft-simple runs at.",
)
@click.option(
    "--wide-target",
    type=click.Choice(["F16", "BF16", "Q8_0", "F32"], case_sensitive=False),
    help="Measure with the target re-encoded at this wider type by llama.cpp's llama-quantize (made once, "
    "kept in the cache): a draft token then costs a small share of a target token, as with a 7B+ target.",
)
@click.option(
    "--tune",
    is_flag=True,
    help=f"Sweep strategy x draft length x p_min and pick the best (at most {MAX_TUNE_SWEEP} settings per "
    "prompt).",
)
@click.option(
    "--tune-n-max",
    type=SweepList("lengths", parse_lengths),
    default="1-8",
    show_default=True,
    metavar="LENGTHS",
    help=f"With --tune: draft lengths to sweep, a range and/or a comma-separated list, each "
    f"{_N_LO}<=x<={_N_HI} as for --n-max (e.g. 1-8 or 2,4,6).",
)
@click.option(
    "--tune-p-min",
    type=SweepList("values", parse_p_min),
    default="0.5,0.75,0.9",
    show_default=True,
    metavar="VALUES",
    help=f"With --tune: p_min values to sweep, a comma-separated list, each {_P_LO}<=x<={_P_HI} as for "
    "--p-min (e.g. 0.5,0.75,0.9).",
)
@click.option(
    "--save-preset",
    metavar="NAME",
    callback=check_preset_name,
    help="With --tune: save the winners as user preset NAME (and NAME-<workload>), replacing user presets "
    "of those names (the output says which).",
)
@click.option(
    "--session-rows",
    multiple=True,
    callback=lambda ctx, param, values: check_names(ctx, param, values, list(_SESSION_ROWS), "session row"),
    help=f"With --sessions: the rows to run, comma-separated, of: {', '.join(_SESSION_ROWS)} (default: "
    f"{', '.join(_DEFAULT_SESSION_ROWS)}; model only with a draft model).",
)
@click.option(
    "--peer-modes",
    multiple=True,
    callback=lambda ctx, param, values: check_names(ctx, param, values, CLIENT_PEER_MODES, "llama.cpp"),
    help="With --peer and --sessions or --clients: llama.cpp's modes to run, comma-separated, of "
    f"{', '.join(CLIENT_PEER_MODES)} (draft-mtp: --clients only; default: --sessions all but draft-mtp, "
    "--clients none, ngram-mod, draft-simple with a draft model, draft-mtp with MTP layers).",
)
@click.option(
    "--serve-modes",
    multiple=True,
    callback=lambda ctx, param, values: check_serve_modes(values),
    help="With --clients: localspec's settings to run, comma-separated, each a strategy (auto, none, ngram, "
    "suffix, model, ...) optionally with a fixed draft length (model:2), all at the largest --parallel "
    "(default: the pair as `serve` runs it at each --parallel, one request at a time, and --draft none).",
)
@click.option(
    "--clients",
    type=SweepList("counts", parse_counts),
    metavar="COUNTS",
    help="Measure `localspec serve` under this many concurrent streaming clients instead, comma-separated "
    "(e.g. 1,2,4,8): throughput, latency and time to first token per count; with --peer also llama.cpp's "
    "llama-server. Writes clients.json, clients.md and clients.png.",
)
@click.option(
    "--requests",
    default=16,
    show_default=True,
    type=click.IntRange(1, 10_000),
    help="With --clients: streamed requests per client count (the prompts cycled).",
)
@click.option(
    "--parallel",
    type=SweepList("counts", parse_counts),
    metavar="COUNTS",
    help="With --clients: the servers' slots (serve --parallel, llama-server --parallel), comma-separated "
    "(default: the largest client count); serve also runs one at a time and the target alone.",
)
@click.option(
    "--rpc-rtt",
    type=SweepList("round trips", parse_rtts),
    metavar="MS",
    help="Time the target over two local rpc-servers at these added round trips in ms instead, "
    "comma-separated (e.g. 0,5,20,50), against the pair local: tokens/s and speedup per strategy. Writes "
    "rpc.json and rpc.md (default prompts: 3 each of code, edit).",
)
@click.option("--no-warmup", is_flag=True, help="Skip the uncounted warm-up runs.")
@click.option(
    "--from-json",
    "from_json",
    type=click.Path(dir_okay=False, exists=True),
    help="Print the tables of an earlier run's bench.json again (with the current ceilings); runs nothing.",
)
@click.option(
    "--out",
    "out_dir",
    default="bench-out",
    show_default=True,
    type=click.Path(file_okay=False),
    callback=check_out_dir,
    help="Folder for bench.json, bench.md and bench.png.",
)
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="Print the report (with --sessions: sessions.json) as JSON instead of tables.",
)
@click.option("--quiet", "-q", is_flag=True, help="No progress lines.")
def bench(**options: Any) -> None:
    """Measure whether speculative decoding pays off on this machine, per kind of text.

    Runs the target alone and each strategy interleaved on the same prompts, in one process, and reports
    acceptance, tokens/s, speedup (median over prompts), the theoretical ceiling, efficiency and the
    draft's memory overhead. Writes bench.json, bench.md and bench.png into --out.

    Other benches instead: --sessions (multi-request workloads), --tune (the best setting), --clients
    (`serve` under concurrent clients), --rpc-rtt (the target over rpc-servers).
    """
    o = BenchOptions(**options)  # checked together as they were parsed (BenchCommand)
    if o.from_json:
        _print_earlier(o.from_json, as_json=o.as_json)
        return
    if o.tune:
        _check_tune_grid(o)
    make_out_dir(o.out_dir)
    if o.sessions:
        bench_sessions(o)
        return
    if o.clients:
        bench_clients(o)
        return
    if o.rpc_rtt:
        bench_rpc_rtt(o)
        return
    if o.wide_target:
        o = _on_wide_target(o)
    result = _tune(o) if o.tune else _measure(o)
    if o.wide_note:
        result.wide_target = o.wide_note
    from localspec.bench import report as rep

    files = rep.write_all(result, Path(o.out_dir))
    _print_report(result, files=files, as_json=o.as_json)


def _check_tune_grid(o: BenchOptions) -> None:
    """Every swept value is in bounds already (SweepList); the grid as a whole may still be too large."""
    from localspec.bench.tune import check_sweep

    try:
        check_sweep(list(o.strategies) or None, o.tune_n_max, o.tune_p_min, o.adaptive)
    except LocalspecError as exc:
        raise click.BadParameter(usage_line(exc), param_hint=["--tune-n-max", "--tune-p-min"]) from None


def _on_wide_target(o: BenchOptions) -> BenchOptions:
    """``--wide-target``: the pair with its target re-encoded; with no --workloads (or --prompts) the
    big-target workloads, and with no --strategy (:func:`_measure`) the settings a big target is measured at
    (:data:`~localspec.bench.wide_target.WIDE_TARGET_SETTINGS`)."""
    target, draft, preset, note = _wide_pair(
        o.target, o.draft, o.preset, o.wide_target, o.threads, o.progress()
    )
    workloads = o.workloads or (() if o.prompts else ("big-target",))
    return replace(o, target=target, draft=draft, preset=preset, wide_note=note, workloads=workloads)


def _tune(o: BenchOptions) -> Any:
    from localspec.bench.tune import tune_benchmark

    result = tune_benchmark(
        **o.common(),
        limit=o.limit or 2,
        strategies=list(o.strategies) or None,
        n_max_values=o.tune_n_max,
        p_min_values=o.tune_p_min,
        adaptive=o.adaptive,
    )
    if o.save_preset and result.tuning is not None:
        from localspec.bench.tune import save_winners

        # the embedded pair is saved by its preset (files named inside the package, not by path)
        base = o.preset or (constants.EMBEDDED_PRESET if o.target is None else None)
        result.tuning.saved = save_winners(result, o.save_preset, preset=base)
    return result


def _measure(o: BenchOptions) -> Any:
    from localspec.bench.single import benchmark

    configs = None
    if o.wide_note and not o.strategies and not o.adaptive:
        from localspec.bench.wide_target import WIDE_TARGET_SETTINGS

        configs = list(WIDE_TARGET_SETTINGS)
    return benchmark(
        **o.common(),
        limit=o.limit,
        repeats=o.repeats,
        strategies=list(o.strategies) or None,
        configs=configs,
        n_max=o.n_max,
        p_min=o.p_min,
        peer=o.peer,
        peer_n_max=o.peer_n_max,
        peer_p_min=o.peer_p_min,
        adaptive=o.adaptive,
        warmup=not o.no_warmup,
        rpc=o.rpc,
        tensor_split=o.tensor_split,
    )


def _print_earlier(path: str, *, as_json: bool) -> None:
    """``--from-json``: an earlier run's tables again, from its bench.json or clients.json."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        data = None  # the bench.json reader names what is wrong with it
    from localspec.bench.clients_report import is_clients_file
    from localspec.bench.rpc_rtt import is_rtt_file

    if is_clients_file(data):
        print_clients_file(data, path, as_json=as_json)
    elif is_rtt_file(data):
        print_rpc_file(data, path, as_json=as_json)
    else:
        _print_report(_read_report(path), files=None, as_json=as_json)


def _read_report(path: str) -> Any:
    """An earlier run's bench.json, its ceilings worked out again from its cells (the model of speed may
    have changed since it was written)."""
    from localspec.bench import arithmetic
    from localspec.bench.report import read_json

    report = read_json(Path(path))
    if report.cells and not report.tuning:
        report.verify_line = arithmetic.add_ceilings(report.cells)
    return report


def _print_report(result: Any, *, files: dict[str, Path] | None, as_json: bool) -> None:
    from localspec.bench import report as rep

    if as_json:
        click.echo(rep.json_text(result))
        return
    click.echo(rep.format_text(result))
    if files is None:
        return
    say_build_note()
    saved, replaced = (result.tuning.saved, set(result.tuning.replaced)) if result.tuning else ([], set())
    for path in saved:
        click.echo(f"{'replaced' if path in replaced else 'saved'} preset {path}")
    click.echo(f"\nwrote {files['json']}, {files['markdown']}, {files['png']}")


def _wide_pair(target, draft, preset, wide_type, threads, progress) -> tuple[str, str | None, None, str]:
    """``--wide-target``: the target (given, or the preset's: one of them is, :func:`check_together`)
    re-encoded, the same draft, no preset; and the line the report prints about it."""
    from localspec.bench.wide_target import wide_target

    draft_path = draft
    if preset:
        from localspec.hub.download import ensure_preset

        pair = ensure_preset(preset)
        source = pair.target
        if draft in (None, "auto") and pair.draft:
            draft_path = str(pair.draft)
    else:
        source = Path(target)
    wide = wide_target(source, wide_type, threads=threads or constants.default_threads(), log=progress)
    note = (
        f"target {source.name} re-encoded at {wide_type.upper()} by llama.cpp's llama-quantize ({wide}): "
        "a draft token costs a small share of a target token, as with a 7B+ target"
    )
    return str(wide), draft_path, None, note


COMMANDS = [bench]
