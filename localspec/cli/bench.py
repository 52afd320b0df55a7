"""``localspec bench``: speedup, acceptance, ceiling and memory per workload; tuner; llama.cpp peer."""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
from click.core import ParameterSource

from localspec import constants
from localspec.bench.sessions import SESSION_WORKLOADS
from localspec.bench.workloads import WORKLOADS, workload_choices
from localspec.cli.options import (
    COUNT,
    MAX_TOKENS,
    TEMPERATURE,
    check_strategies_have_a_draft,
    shared_options,
)
from localspec.errors import LocalspecError
from localspec.settings import (
    MAX_TUNE_SWEEP,
    N_MAX_RANGE,
    P_MIN_RANGE,
    REPEATS_RANGE,
    SPECULATIVE_STRATEGIES,
)

if TYPE_CHECKING:
    from localspec.bench.session_run import PeerSetup
    from localspec.pipeline.pipeline import Pipeline


def _split(values: tuple[str, ...]) -> list[str]:
    return [v.strip() for item in values for v in item.split(",") if v.strip()]


def _check_names(
    ctx: click.Context, param: click.Parameter, values: tuple[str, ...], known: Sequence[str], what: str
) -> tuple[str, ...]:
    """``--workloads`` and ``--sessions``: every comma-separated name one of ``known``, checked as the options
    are parsed (a usage error, status 2, before anything loads; the docs' command lines are parsed by a
    test, so a wrong name there fails it)."""
    for item in values:
        for name in item.split(","):
            if not name.strip():
                raise click.UsageError(f"{param.opts[0]} has an empty name; give names separated by commas")
            if name.strip() not in known:
                raise click.BadParameter(
                    f"unknown {what} workload {name.strip()!r}; choose from {', '.join(known)}", ctx, param
                )
    return values


def _usage_line(exc: LocalspecError, drop: str = "") -> str:
    """A library error as one line of a usage error: what is wrong; what to type instead."""
    message = exc.message.removeprefix(drop)
    return f"{message}; {exc.hint}." if exc.hint else f"{message}."


class SweepList(click.ParamType):
    """A list of values the tuner sweeps, parsed and held to ``run``'s bounds while the options are read, so a
    bad one is a usage error (exit status 2) before anything loads. ``parse`` is the tuner's own parser
    (:func:`localspec.bench.tune.parse_int_range`, :func:`localspec.bench.tune.parse_p_min_list`)."""

    def __init__(self, name: str, parse: Callable[[str], list[Any]]) -> None:
        self.name = name
        self._parse = parse

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> list[Any]:
        text = ",".join(str(v) for v in value) if isinstance(value, (list, tuple)) else str(value)
        try:
            return self._parse(text)
        except LocalspecError as exc:
            self.fail(_usage_line(exc), param, ctx)


def _parse_lengths(text: str) -> list[int]:
    from localspec.bench.tune import (
        parse_int_range,  # imported when used: the tuner pulls in the bench family
    )

    return parse_int_range(text)


def _parse_p_min(text: str) -> list[float]:
    from localspec.bench.tune import parse_p_min_list

    return parse_p_min_list(text)


def _check_preset_name(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """--save-preset is written after the whole sweep: a name no preset may have is refused before it."""
    if value is None:
        return None
    from localspec.hub.presets import check_preset_name

    where = "--save-preset"
    try:  # the preset files' own rule for names
        check_preset_name(value, where)
    except LocalspecError as exc:
        raise click.BadParameter(_usage_line(exc, drop=f"{where}: "), ctx, param) from None
    from localspec.hub.presets import builtin_preset_names

    written = {value, *(f"{value}-{w}" for w in WORKLOADS)}  # what save_winners writes
    hidden = sorted(written & builtin_preset_names())
    if hidden:  # a user preset replaces a built-in one of its name: `run` with no preset would change
        raise click.BadParameter(
            f"{value!r} would hide the built-in preset {hidden[0]!r} (a user preset replaces a built-in "
            "one of its name); pick a name of your own.",
            ctx,
            param,
        )
    return value


def _check_out_dir(ctx: click.Context, param: click.Parameter, value: str) -> str:
    """--out is written after the whole run: a folder that cannot be made or written is refused before it."""
    probe = Path(value).absolute()
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    if not probe.is_dir():
        raise click.BadParameter(
            f"{value!r} cannot be made: {str(probe)!r} is a file; give --out a folder path.", ctx, param
        )
    if not os.access(probe, os.W_OK | os.X_OK):
        raise click.BadParameter(
            f"{value!r} cannot be written: {str(probe)!r} is not writable for you; give --out a folder you "
            "can write.",
            ctx,
            param,
        )
    return value


def _make_out_dir(value: str) -> None:
    """Make --out and write in it, once every usage check passed and before anything loads: access()
    says yes to root everywhere, /proc and /sys included, and a bench writes only at its end."""
    try:
        Path(value).mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=value):
            pass
    except OSError as exc:
        raise click.BadParameter(
            f"{value!r} cannot be written ({exc.strerror or exc}); give --out a folder you can write.",
            param_hint="'--out'",
        ) from None


#: What each mode leaves unread, and why: given on the command line, such an option is refused (a user would
#: believe it applied). ``--sessions`` runs its workloads' own requests, greedy, with its own settings per
#: row; ``--tune`` sweeps n_max and p_min, runs each setting once and always warms up.
NOT_READ: dict[str, dict[str, str]] = {
    "sessions": {
        "workloads": "it picks single-prompt workloads; --sessions names the session workloads",
        "prompts": "it reads single prompts; a session workload is a committed sequence of requests",
        "limit": "it cuts single-prompt workloads; every request of a session is run, in order",
        "temperature": "the session bench is greedy, so its rows are the same text verified differently",
        "strategies": "the session bench runs its own rows (target alone, n-gram lengths, suffix cache)",
        "n_max": "the session rows set their own draft lengths (fixed n-gram ones, the suffix cache's own)",
        "p_min": "the session rows set their own p_min",
        "adaptive": "the session rows set their own draft lengths",
        "tune": "the tuner sweeps single-prompt workloads",
        "no_warmup": "the session bench's warm start is part of what it measures",
        "peer_n_max": "llama.cpp runs its session modes (--peer-modes), not a draft-simple grid",
        "peer_p_min": "llama.cpp runs its session modes (--peer-modes), not a draft-simple grid",
        "wide_target": "the session bench runs the pair as it is; a big target's regime is measured on "
        "single prompts (bench --wide-target F16 with --target or --preset)",
    },
    "tune": {
        "repeats": "the tuner runs each setting once per prompt (more prompts: --limit)",
        "n_max": "the tuner sweeps draft lengths: give them with --tune-n-max",
        "p_min": "the tuner sweeps p_min: give the values with --tune-p-min",
        "no_warmup": "the tuner always warms up before it times",
    },
}


def _refuse_unread(ctx: click.Context, mode: str) -> None:
    """A usage error for the first option given on the command line that ``mode`` does not read."""
    for name, why in NOT_READ[mode].items():
        if ctx.get_parameter_source(name) is ParameterSource.COMMANDLINE:
            param = next(p for p in ctx.command.params if p.name == name)
            flag = max(param.opts, key=len)
            raise click.UsageError(f"{flag} does not apply with --{mode}: {why}; drop it")


def _check_together(ctx: click.Context) -> None:
    """The options that do not go together, refused as soon as they are parsed (usage errors, status 2)."""
    o = ctx.params
    if o["target"] and o["preset"]:
        raise click.UsageError("give either --target or --preset, not both")
    if o["save_preset"] and not o["tune"]:
        raise click.UsageError("--save-preset needs --tune")
    if o["peer"] and o["tune"]:
        raise click.UsageError("--peer compares fixed settings; run it without --tune")
    if o["rpc"] and (o["peer"] or o["tune"] or o["wide_target"]):
        raise click.UsageError(
            "--rpc measures localspec's strategies over the servers; run it without --peer, --tune and "
            "--wide-target (an rpc-server serves one client at a time)"
        )
    if o["tensor_split"] and not o["rpc"]:
        raise click.UsageError("--tensor-split shares the target's layers among --rpc servers: add --rpc")
    if (
        o["wide_target"] and not o["sessions"] and not (o["target"] or o["preset"])
    ):  # (sessions: refused below)
        raise click.UsageError(
            "--wide-target needs --target FILE or --preset NAME (the embedded pair is a toy)"
        )
    needs = {
        "tune_n_max": (("tune",), "it names what the tuner sweeps"),
        "tune_p_min": (("tune",), "it names what the tuner sweeps"),
        "peer_n_max": (("peer",), "it names the grid llama.cpp's draft-simple runs over"),
        "peer_p_min": (("peer",), "it names the grid llama.cpp's draft-simple runs over"),
        "session_rows": (("sessions",), "it names the rows of the session bench"),
        "peer_modes": (("sessions", "peer"), "it names llama.cpp's modes on the session workloads"),
    }
    for name, (modes, why) in needs.items():
        missing = [m for m in modes if not o[m]]
        if missing and ctx.get_parameter_source(name) not in (ParameterSource.DEFAULT, None):
            flag = "--" + name.replace("_", "-")
            raise click.UsageError(f"{flag} needs {' and '.join('--' + m for m in modes)} ({why})")
    if o["from_json"]:
        given = [
            p.opts[0]
            for p in ctx.command.params
            if p.name not in ("from_json", "as_json", "quiet")
            and ctx.get_parameter_source(p.name or "") is ParameterSource.COMMANDLINE
        ]
        if given:
            raise click.UsageError(f"--from-json runs nothing: {given[0]} does not apply; drop it")
    check_strategies_have_a_draft(list(o["strategies"]), o["draft"])
    if o["sessions"]:
        _refuse_unread(ctx, "sessions")
    elif o["tune"]:
        _refuse_unread(ctx, "tune")


class _Bench(click.Command):
    """``bench``, whose options are checked together as soon as they are parsed (:func:`_check_together`):
    before anything loads, and where a test that only parses a documented command line sees it too."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        rest = super().parse_args(ctx, args)
        try:
            _check_together(ctx)
        except click.UsageError as exc:
            exc.ctx = exc.ctx or ctx  # the usage line and the `--help` hint, as for any usage error
            raise
        return rest


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
_SESSION_MODES = ("none", "ngram-simple", "ngram-map-k", "ngram-mod", "ngram-cache", "draft-simple")


@click.command("bench", cls=_Bench)
@click.option("--target", "-t", type=click.Path(dir_okay=False), help="Target GGUF (default: embedded pair).")
@click.option(
    "--draft", "-d", help="Draft GGUF path, 'ngram', 'none' or 'auto' (default: auto, automatic pairing)."
)
@click.option("--preset", "-p", help="A preset name (see `localspec presets`).")
@click.option(
    "--workloads",
    "-w",
    multiple=True,
    callback=lambda ctx, param, values: _check_names(ctx, param, values, workload_choices(), "single-prompt"),
    help=f"Comma-separated subset of: {', '.join(workload_choices())} (default: {', '.join(WORKLOADS)}).",
)
@click.option("--prompts", type=click.Path(dir_okay=False), help="Your own prompt file (lines or JSONL).")
@click.option(
    "--sessions",
    multiple=True,
    callback=lambda ctx, param, values: _check_names(ctx, param, values, SESSION_WORKLOADS, "session"),
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
    type=SweepList("lengths", _parse_lengths),
    default=_PEER_N_MAX,
    show_default=True,
    metavar="LENGTHS",
    help="With --peer: the draft lengths llama.cpp's draft-simple runs at (fewer make the run shorter).",
)
@click.option(
    "--peer-p-min",
    type=SweepList("values", _parse_p_min),
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
    type=SweepList("lengths", _parse_lengths),
    default="1-8",
    show_default=True,
    metavar="LENGTHS",
    help=f"With --tune: draft lengths to sweep, a range and/or a comma-separated list, each "
    f"{_N_LO}<=x<={_N_HI} as for --n-max (e.g. 1-8 or 2,4,6).",
)
@click.option(
    "--tune-p-min",
    type=SweepList("values", _parse_p_min),
    default="0.5,0.75,0.9",
    show_default=True,
    metavar="VALUES",
    help=f"With --tune: p_min values to sweep, a comma-separated list, each {_P_LO}<=x<={_P_HI} as for "
    "--p-min (e.g. 0.5,0.75,0.9).",
)
@click.option(
    "--save-preset",
    metavar="NAME",
    callback=_check_preset_name,
    help="With --tune: save the winners as user preset NAME (and NAME-<workload>), replacing user presets "
    "of those names (the output says which).",
)
@click.option(
    "--session-rows",
    multiple=True,
    callback=lambda ctx, param, values: _check_names(ctx, param, values, list(_SESSION_ROWS), "session row"),
    help=f"With --sessions: the rows to run, comma-separated, of: {', '.join(_SESSION_ROWS)} (default: "
    f"{', '.join(_DEFAULT_SESSION_ROWS)}; model only with a draft model).",
)
@click.option(
    "--peer-modes",
    multiple=True,
    callback=lambda ctx, param, values: _check_names(ctx, param, values, _SESSION_MODES, "llama.cpp"),
    help=f"With --sessions --peer: llama.cpp's modes to run, comma-separated (default: all of "
    f"{', '.join(_SESSION_MODES)}).",
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
    callback=_check_out_dir,
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
    """
    o = BenchOptions(**options)  # checked together as they were parsed (_Bench)
    if o.from_json:
        _print_report(_read_report(o.from_json), files=None, as_json=o.as_json)
        return
    if o.tune:
        _check_tune_grid(o)
    _make_out_dir(o.out_dir)
    if o.sessions:
        _bench_sessions(o)
        return
    if o.wide_target:
        o = _on_wide_target(o)
    result = _tune(o) if o.tune else _measure(o)
    if o.wide_note:
        result.wide_target = o.wide_note
    from localspec.bench import report as rep

    files = rep.write_all(result, Path(o.out_dir))
    _print_report(result, files=files, as_json=o.as_json)


@dataclass(frozen=True)
class BenchOptions:
    """``bench``'s options as one record (the names are the command's parameters)."""

    target: str | None
    draft: str | None
    preset: str | None
    workloads: tuple[str, ...]
    prompts: str | None
    sessions: tuple[str, ...]
    limit: int | None
    max_tokens: int
    temperature: float
    repeats: int
    threads: int | None
    n_ctx: int | None
    strategies: tuple[str, ...]
    n_max: int | None
    p_min: float | None
    rpc: str | None
    tensor_split: Any
    adaptive: bool
    peer: bool
    peer_n_max: list[int]
    peer_p_min: list[float]
    wide_target: str | None
    tune: bool
    tune_n_max: list[int]
    tune_p_min: list[float]
    save_preset: str | None
    session_rows: tuple[str, ...]
    peer_modes: tuple[str, ...]
    no_warmup: bool
    from_json: str | None
    out_dir: str
    as_json: bool
    quiet: bool
    wide_note: str | None = None  # set by --wide-target: the report's line about the re-encoded target

    def progress(self) -> Callable[[str], None] | None:
        if self.quiet or self.as_json:
            return None
        return lambda m: click.echo(f"  {m}", err=True)

    def common(self) -> dict[str, Any]:
        """What a single-prompt bench and the tuner both take."""
        return dict(
            target=self.target,
            draft=self.draft,
            preset=self.preset,
            workloads=_split(self.workloads) or None,
            prompts_file=self.prompts,
            max_tokens=self.max_tokens,
            temperature=self.temperature,
            threads=self.threads,
            n_ctx=self.n_ctx,
            progress=self.progress(),
        )


def _check_tune_grid(o: BenchOptions) -> None:
    """Every swept value is in bounds already (SweepList); the grid as a whole may still be too large."""
    from localspec.bench.tune import check_sweep

    try:
        check_sweep(list(o.strategies) or None, o.tune_n_max, o.tune_p_min, o.adaptive)
    except LocalspecError as exc:
        raise click.BadParameter(_usage_line(exc), param_hint=["--tune-n-max", "--tune-p-min"]) from None


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
    _say_build_note()
    saved, replaced = (result.tuning.saved, set(result.tuning.replaced)) if result.tuning else ([], set())
    for path in saved:
        click.echo(f"{'replaced' if path in replaced else 'saved'} preset {path}")
    click.echo(f"\nwrote {files['json']}, {files['markdown']}, {files['png']}")


def _wide_pair(target, draft, preset, wide_type, threads, progress) -> tuple[str, str | None, None, str]:
    """``--wide-target``: the target (given, or the preset's: one of them is, :func:`_check_together`)
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


def _bench_sessions(o: BenchOptions) -> None:
    """``--sessions``: each session workload's requests in order through one pipeline, per row; with
    ``--peer``, llama.cpp's modes in the same repeats. Writes sessions.json and sessions.md."""
    import localspec
    from localspec.bench.session_run import markdown, noise_lines, run_bench, session_configs

    quiet = o.quiet or o.as_json
    log = (lambda line: None) if quiet else (lambda line: click.echo(f"  {line}", err=True))
    ctx = click.get_current_context()
    cap = o.max_tokens if ctx.get_parameter_source("max_tokens") is ParameterSource.COMMANDLINE else None
    with localspec.load(
        target=o.target,
        draft=o.draft,
        preset=o.preset,
        n_threads=o.threads,
        n_ctx=o.n_ctx,
        suffix_store=False,  # the bench never reads or writes the user's store
        rpc=o.rpc,
        tensor_split=o.tensor_split,
    ) as pipe:
        rows = _split(o.session_rows)
        configs = session_configs(rows, pipe.info.draft_path is not None) if rows else None
        setup = _session_peer(o, pipe, log) if o.peer else None
        results = run_bench(
            pipe, _split(o.sessions), configs=configs, repeats=o.repeats, max_tokens=cap, peer=setup, log=log
        )
    out = Path(o.out_dir)
    (out / "sessions.json").write_text(json.dumps(results, indent=1), encoding="utf-8")
    table = markdown(results)
    (out / "sessions.md").write_text(table, encoding="utf-8")
    click.echo(json.dumps(results, indent=1) if o.as_json else table)
    for line in noise_lines(results):
        click.echo(line, err=True)
    if not o.as_json:
        _say_build_note()


def _session_peer(o: BenchOptions, pipe: Pipeline, log: Callable[[str], None]) -> PeerSetup:
    """llama.cpp's side of a session bench: its modes (``--peer-modes``; draft-simple only with a draft)."""
    from localspec.bench import peer as peer_mod
    from localspec.bench.session_run import PeerSetup
    from localspec.llama.build import cpu_flags, installed_system_info

    # the same kernels on both sides: a native peer next to an AVX2 wheel compares builds
    flags = cpu_flags(installed_system_info())
    log(f"the llama.cpp peer is built with: {' '.join(flags) or 'the native CPU features'}")
    modes = _split(o.peer_modes) or list(peer_mod.SESSION_MODES)
    return PeerSetup(
        target=pipe.info.target_path,
        draft=pipe.info.draft_path,
        threads=o.threads or constants.default_threads(),
        n_ctx=pipe.n_ctx,
        modes=tuple(m for m in modes if m != "draft-simple" or pipe.info.draft_path),
        work_dir=Path(o.out_dir) / "llama.cpp",
    )


def _say_build_note() -> None:
    """After a speed report: say so when llama.cpp was built without CPU features this machine has."""
    from localspec.llama.build import build_note

    note = build_note()
    if note:
        click.echo(note, err=True)


COMMANDS = [bench]
