"""``localspec bench``'s options: checked together as they are parsed (usage errors, status 2, before
anything loads), what each mode leaves unread, and the options as one record (:class:`BenchOptions`)."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click
from click.core import ParameterSource

from localspec.bench.workloads import WORKLOADS
from localspec.cli.options import check_strategies_have_a_draft
from localspec.errors import BenchError, LocalspecError


def split_names(values: tuple[str, ...]) -> list[str]:
    return [v.strip() for item in values for v in item.split(",") if v.strip()]


def check_names(
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


def check_serve_modes(values: tuple[str, ...]) -> tuple[str, ...]:
    """``--serve-modes``: every comma-separated item a strategy, optionally with a draft length, checked as
    the options are parsed (a usage error before anything loads)."""
    from localspec.bench.clients import parse_serve_mode

    for item in values:
        for mode in item.split(","):
            try:
                parse_serve_mode(mode)
            except LocalspecError as exc:
                raise click.UsageError(f"--serve-modes: {usage_line(exc)}") from None
    return values


def usage_line(exc: LocalspecError, drop: str = "") -> str:
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
            self.fail(usage_line(exc), param, ctx)


def parse_lengths(text: str) -> list[int]:
    from localspec.bench.tune import (
        parse_int_range,  # imported when used: the tuner pulls in the bench family
    )

    return parse_int_range(text)


def parse_p_min(text: str) -> list[float]:
    from localspec.bench.tune import parse_p_min_list

    return parse_p_min_list(text)


def check_preset_name(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """--save-preset is written after the whole sweep: a name no preset may have is refused before it."""
    if value is None:
        return None
    from localspec.hub.presets import check_preset_name

    where = "--save-preset"
    try:  # the preset files' own rule for names
        check_preset_name(value, where)
    except LocalspecError as exc:
        raise click.BadParameter(usage_line(exc, drop=f"{where}: "), ctx, param) from None
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


def check_out_dir(ctx: click.Context, param: click.Parameter, value: str) -> str:
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


def make_out_dir(value: str) -> None:
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
#: row; ``--tune`` sweeps n_max and p_min, runs each setting once and always warms up; ``--clients`` starts
#: servers of the pair as ``serve`` runs it and sends them greedy requests.
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
    "clients": {
        "temperature": "the clients bench is greedy, so every server answers the same requests alike",
        "strategies": "it runs the pair as `serve` does, and the target alone (--draft none)",
        "n_max": "`serve` sizes each step's drafts to what pays in the shared pass",
        "p_min": "`serve` sizes each step's drafts to what pays in the shared pass",
        "adaptive": "`serve` sizes each step's drafts to what pays in the shared pass",
        "rpc": "it starts its servers on this machine (an rpc-server serves one client at a time)",
        "tensor_split": "it starts its servers on this machine",
        "peer_n_max": "llama.cpp runs its modes (--peer-modes), not a draft-simple grid",
        "peer_p_min": "llama.cpp runs its modes (--peer-modes), not a draft-simple grid",
        "wide_target": "it runs the pair as it is; a big target's regime is measured on single prompts",
    },
    "rpc_rtt": {
        "temperature": "it is greedy, so every text over RPC is compared with the local run's",
        "strategies": "it runs the target alone, the draft model and n-gram lookup",
        "n_max": "it runs the pair's own draft length",
        "p_min": "it runs the pair's own p_min",
        "adaptive": "it runs the pair's own draft length",
        "repeats": "it runs each prompt once per pipeline and strategy (more prompts: --limit)",
        "no_warmup": "it always warms up each pipeline before it times",
        "rpc": "it starts its own rpc-servers on 127.0.0.1",
        "tensor_split": "it shares the target's layers evenly between its two rpc-servers",
        "peer": "it compares localspec local and over RPC",
        "peer_n_max": "it compares localspec local and over RPC",
        "peer_p_min": "it compares localspec local and over RPC",
        "wide_target": "it runs the pair as it is",
    },
}

#: The modes of ``bench`` that run instead of the single-prompt one, by parameter name.
MODES = ("sessions", "tune", "clients", "rpc_rtt")
#: llama.cpp's modes a session bench runs (the clients bench also runs ``draft-mtp``).
SESSION_PEER_MODES = ("none", "ngram-simple", "ngram-map-k", "ngram-mod", "ngram-cache", "draft-simple")
CLIENT_PEER_MODES = (*SESSION_PEER_MODES, "draft-mtp")


def _refuse_unread(ctx: click.Context, mode: str) -> None:
    """A usage error for the first option given on the command line that ``mode`` does not read."""
    for name, why in NOT_READ[mode].items():
        if ctx.get_parameter_source(name) is ParameterSource.COMMANDLINE:
            param = next(p for p in ctx.command.params if p.name == name)
            flag = max(param.opts, key=len)
            raise click.UsageError(f"{flag} does not apply with {_flag(mode)}: {why}; drop it")


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def check_together(ctx: click.Context) -> None:
    """The options that do not go together, refused as soon as they are parsed (usage errors, status 2)."""
    o = ctx.params
    if o["target"] and o["preset"]:
        raise click.UsageError("give either --target or --preset, not both")
    chosen = [m for m in MODES if o[m]]  # --sessions with --tune: the session bench refuses --tune below
    if len(chosen) > 1 and chosen[:2] != ["sessions", "tune"]:
        first, second = (_flag(m) for m in chosen[:2])
        raise click.UsageError(f"{first} and {second} are two benches: run them one at a time")
    if o["save_preset"] and not o["tune"]:
        raise click.UsageError("--save-preset needs --tune")
    if o["peer"] and o["tune"]:
        raise click.UsageError("--peer compares fixed settings; run it without --tune")
    if o["rpc"] and (o["peer"] or o["tune"] or o["wide_target"]) and not o["rpc_rtt"]:
        raise click.UsageError(
            "--rpc measures localspec's strategies over the servers; run it without --peer, --tune and "
            "--wide-target (an rpc-server serves one client at a time)"
        )
    if o["tensor_split"] and not (o["rpc"] or o["clients"] or o["rpc_rtt"]):  # (those two: refused below)
        raise click.UsageError("--tensor-split shares the target's layers among --rpc servers: add --rpc")
    if (
        o["wide_target"]
        and not (o["sessions"] or o["clients"] or o["rpc_rtt"])
        and not (o["target"] or o["preset"])
    ):  # (the other benches: refused below)
        raise click.UsageError(
            "--wide-target needs --target FILE or --preset NAME (the embedded pair is a toy)"
        )
    needs = {
        "tune_n_max": (("tune",), "it names what the tuner sweeps"),
        "tune_p_min": (("tune",), "it names what the tuner sweeps"),
        "peer_n_max": (("peer",), "it names the grid llama.cpp's draft-simple runs over"),
        "peer_p_min": (("peer",), "it names the grid llama.cpp's draft-simple runs over"),
        "session_rows": (("sessions",), "it names the rows of the session bench"),
        "requests": (("clients",), "it names the requests per client count"),
        "parallel": (("clients",), "it names the servers' slots"),
        "serve_modes": (("clients",), "it names localspec's settings under concurrent clients"),
    }
    for name, (modes, why) in needs.items():
        missing = [m for m in modes if not o[m]]
        if missing and ctx.get_parameter_source(name) not in (ParameterSource.DEFAULT, None):
            flag = "--" + name.replace("_", "-")
            raise click.UsageError(f"{flag} needs {' and '.join('--' + m for m in modes)} ({why})")
    _check_peer_modes(ctx)
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
    for mode in chosen:
        _refuse_unread(ctx, mode)


def _check_peer_modes(ctx: click.Context) -> None:
    """``--peer-modes`` goes with ``--peer`` and a bench that runs llama.cpp's modes, and names its modes."""
    o = ctx.params
    if ctx.get_parameter_source("peer_modes") in (ParameterSource.DEFAULT, None):
        return
    if not o["peer"] or not (o["sessions"] or o["clients"]):
        raise click.UsageError(
            "--peer-modes needs --peer with --sessions or --clients (it names llama.cpp's modes there)"
        )
    known = SESSION_PEER_MODES if o["sessions"] else CLIENT_PEER_MODES
    wrong = [m for m in split_names(o["peer_modes"]) if m not in known]
    if wrong:
        mode = "--sessions" if o["sessions"] else "--clients"
        raise click.UsageError(
            f"--peer-modes {wrong[0]} does not run with {mode}; choose from {', '.join(known)}"
        )


def parse_rtts(text: str) -> list[float]:
    """``--rpc-rtt``: comma-separated round trips in ms, each 0 to 1000, ascending, each once.

    Raises:
        BenchError: a value that is no number of ms or out of range.
    """
    out: set[float] = set()
    for item in text.split(","):
        try:
            value = float(item)
        except ValueError:
            value = -1.0
        if not 0 <= value <= 1000:
            raise BenchError(
                f"{item.strip()!r} is not a round trip from 0 to 1000 ms", hint="give e.g. 0,5,20,50"
            )
        out.add(value)
    return sorted(out)


def parse_counts(text: str) -> list[int]:
    """``--clients`` and ``--parallel``: comma-separated counts, each 1 to 256, ascending, each once.

    Raises:
        BenchError: a value that is no count or out of range.
    """
    out: set[int] = set()
    for item in text.split(","):
        item = item.strip()
        if not item.isdigit() or not 1 <= int(item) <= 256:
            raise BenchError(f"{item!r} is not a count from 1 to 256", hint="give counts like 1,2,4,8")
        out.add(int(item))
    return sorted(out)


class BenchCommand(click.Command):
    """``bench``, whose options are checked together as soon as they are parsed (:func:`check_together`):
    before anything loads, and where a test that only parses a documented command line sees it too."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        rest = super().parse_args(ctx, args)
        try:
            check_together(ctx)
        except click.UsageError as exc:
            exc.ctx = exc.ctx or ctx  # the usage line and the `--help` hint, as for any usage error
            raise
        return rest


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
    serve_modes: tuple[str, ...]
    clients: list[int] | None
    requests: int
    parallel: list[int] | None
    rpc_rtt: list[float] | None
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
            workloads=split_names(self.workloads) or None,
            prompts_file=self.prompts,
            max_tokens=self.max_tokens,
            temperature=self.temperature,
            threads=self.threads,
            n_ctx=self.n_ctx,
            progress=self.progress(),
        )


def say_build_note() -> None:
    """After a speed report: say so when llama.cpp was built without CPU features this machine has."""
    from localspec.llama.build import build_note

    note = build_note()
    if note:
        click.echo(note, err=True)
