"""The options every command that loads a pair shares (``run``, ``serve``; ``bench`` takes some of them):
declared once, with the bounds from :mod:`localspec.settings`, and the one place that turns them into
:func:`localspec.load` arguments."""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

import click

from localspec import constants, settings

if TYPE_CHECKING:
    from localspec.pipeline.pipeline import Pipeline

F = TypeVar("F", bound=Callable[..., Any])


class WarningLines(logging.Handler):
    """The library's warnings (a store that cannot be saved, a damaged file ignored) on stderr as
    ``localspec: ...`` lines, each on a line of its own: ``run`` streams text to stdout without a final
    newline until the end, and a warning logged meanwhile was glued to the middle of that line."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.setFormatter(logging.Formatter("localspec: %(message)s"))
        self.mid_line = False  # set by whoever writes text to a terminal's stdout without a newline

    def emit(self, record: logging.LogRecord) -> None:
        try:
            text = self.format(record)
            click.echo(("\n" if self.mid_line else "") + text, err=True)
            self.mid_line = False
        except Exception:
            self.handleError(record)


#: The one handler the command line puts on the ``localspec`` logger (:func:`install_warning_lines`).
WARNING_LINES = WarningLines()


def install_warning_lines() -> None:
    logger = logging.getLogger("localspec")
    if WARNING_LINES not in logger.handlers:
        logger.addHandler(WARNING_LINES)


class FiniteFloat(click.FloatRange):
    """A float within bounds that is also finite: click's FloatRange lets ``nan`` through (no comparison
    with nan is true) and ``inf`` where there is no upper bound."""

    def convert(self, value, param, ctx):
        rv = super().convert(value, param, ctx)
        if not math.isfinite(rv):
            self.fail(f"{value!r} is not a finite number.", param, ctx)
        return rv


N_MAX = click.IntRange(*settings.N_MAX_RANGE)
N_MIN = click.IntRange(0, settings.N_MAX_RANGE[1])
P_MIN = FiniteFloat(*settings.P_MIN_RANGE)
N_CTX = click.IntRange(*settings.N_CTX_RANGE)
#: CPU threads per model: up to four per logical core of this machine (llama.cpp's ceiling is 512).
THREADS = click.IntRange(settings.THREADS_RANGE[0], settings.max_threads())
#: A count of something that must happen at least once: tokens to generate, prompts, repeats.
COUNT = click.IntRange(min=1)
#: Tokens to generate at most (``run``'s and ``bench``'s ``--max-tokens``).
MAX_TOKENS = COUNT
#: Sampling temperature: 0 is greedy; no upper bound, but always finite.
TEMPERATURE = FiniteFloat(min=0.0)
_DEFAULTS = settings.DraftSettings()  # what a pair named without a preset drafts with
_GPU_LAYERS_HELP = (
    "layers to offload to a GPU (-1: all, 0: none; default: all when llama.cpp was built with GPU "
    "offload, else 0)."
)


def _check_rpc(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """``--rpc``: the servers parsed now, so a malformed list is a usage error before anything loads."""
    if value is None:
        return None
    from localspec.errors import SettingsError
    from localspec.llama.rpc import parse_endpoints

    try:
        return ",".join(map(str, parse_endpoints(value)))
    except SettingsError as exc:
        raise click.BadParameter(f"{exc.message}; {exc.hint}") from None


class Shares(click.ParamType):
    """``--tensor-split 3,1``: comma-separated shares, each a finite number of 0 or more."""

    name = "shares"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> list[float]:
        if isinstance(value, list):
            return value
        try:
            shares = [float(x) for x in str(value).split(",")]
        except ValueError:
            self.fail(f"{value!r} is not comma-separated numbers (e.g. 3,1)", param, ctx)
        if not all(math.isfinite(x) and x >= 0 for x in shares) or not any(shares):
            self.fail(f"{value!r}: each share is a number of 0 or more, not all 0 (e.g. 3,1)", param, ctx)
        return shares


_OPTIONS: dict[str, Callable[[Any], Any]] = {
    "target": click.option(
        "--target", "-t", type=click.Path(dir_okay=False), help="Target GGUF (default: embedded pair)."
    ),
    "draft": click.option(
        "--draft", "-d", help="Draft GGUF path, 'ngram', 'none' or 'auto' (default: auto)."
    ),
    "preset": click.option(
        "--preset", "-p", help="A preset name (see `localspec presets`); downloads on first use."
    ),
    "strategy": click.option(
        "--strategy",
        type=click.Choice(settings.STRATEGIES),
        help="Drafting strategy (default: the pair's or preset's own).",
    ),
    "n_max": click.option(
        "--n-max",
        type=N_MAX,
        help=f"Longest draft per round (default: the preset's, else {_DEFAULTS.n_max}; the suffix cache "
        f"sizes its own drafts up to {settings.LOOKUP_N_MAX}).",
    ),
    "n_min": click.option(
        "--n-min",
        type=N_MIN,
        help=f"Draft at least this many tokens before p-min can stop it (default: {_DEFAULTS.n_min}).",
    ),
    "p_min": click.option(
        "--p-min",
        type=P_MIN,
        help="Stop drafting when the draft's top probability falls below this (default: the preset's, "
        f"else {_DEFAULTS.p_min}).",
    ),
    "adaptive": click.option(
        "--adaptive/--fixed",
        default=None,
        help="Adapt the draft length to measured acceptance and cost (default: the preset's, else fixed).",
    ),
    "corpus": click.option(
        "--corpus",
        type=click.Path(exists=True, file_okay=False),
        help="A folder (your repository, notes) the suffix cache drafts from (strategies "
        f"{', '.join(settings.SUFFIX_STRATEGIES)}); it replaces the corpus `localspec index` stored for this "
        "model's vocabulary.",
    ),
    "no_store": click.option(
        "--no-store",
        is_flag=True,
        help="Keep the suffix cache in memory only: nothing is written to disk, and it is forgotten at exit.",
    ),
    "n_ctx": click.option(
        "--n-ctx",
        type=N_CTX,
        help=f"Context size in tokens, for each model (default {constants.DEFAULT_N_CTX} or the preset's).",
    ),
    "threads": click.option(
        "--threads", type=THREADS, help="CPU threads for the target (default: physical cores)."
    ),
    "draft_threads": click.option(
        "--draft-threads", type=THREADS, help="CPU threads for the draft (default: as target)."
    ),
    "gpu_layers": click.option(
        "--gpu-layers", type=click.IntRange(min=-1), help="Target " + _GPU_LAYERS_HELP
    ),
    "draft_gpu_layers": click.option(
        "--draft-gpu-layers", type=click.IntRange(min=-1), help="Draft " + _GPU_LAYERS_HELP
    ),
    "rpc": click.option(
        "--rpc",
        metavar="HOST:PORT[,...]",
        callback=_check_rpc,
        help="Put the target's layers on llama.cpp rpc-servers (`localspec rpc-server` on each); the draft "
        "stays here. --gpu-layers then counts the layers on the servers (default: all). docs/rpc.md",
    ),
    "tensor_split": click.option(
        "--tensor-split",
        type=Shares(),
        metavar="N0,N1,...",
        help="With --rpc: each server's share of the target's layers, in --rpc order (default: by free "
        "memory).",
    ),
}


def model_options(f: F) -> F:
    """Add the pair-loading options to a command; the command receives them as keyword arguments."""
    return shared_options(*_OPTIONS)(f)


def shared_options(*names: str) -> Callable[[F], F]:
    """Add some of :func:`model_options`' options by parameter name (``"n_max"``, ``"threads"``, ...), with
    the same types, bounds and help, so a command that takes only a few of them refuses what ``run``
    refuses, the same way (a usage error naming the accepted range, exit status 2)."""
    unknown = [n for n in names if n not in _OPTIONS]
    if unknown:
        raise KeyError(f"no shared option {', '.join(unknown)}; known: {', '.join(_OPTIONS)}")

    def add(f: F) -> F:
        for name in reversed(names):
            f = _OPTIONS[name](f)
        return f

    return add


def check_strategies_have_a_draft(strategies: list[str], draft: str | None) -> None:
    """A usage error when a strategy drafts with a model and ``--draft`` names no model."""
    for strategy in strategies:
        if strategy in settings.MODEL_STRATEGIES and draft in settings.DRAFT_WORDS:
            raise click.UsageError(
                f"--strategy {strategy} drafts with a model, and --draft {draft} gives none: "
                "give --draft PATH (or 'auto'), or a strategy without 'model' (ngram, suffix, auto)"
            )


def load_pipeline(*, store_namespace: str = "default", **opts: Any) -> Pipeline:
    """:func:`localspec.load` from the options of :func:`model_options` (usage errors raised first)."""
    import localspec

    if opts["target"] is not None and opts["preset"] is not None:
        raise click.UsageError("give either --target or --preset, not both (a preset names its own target)")
    n_min, n_max = opts["n_min"], opts["n_max"]
    if n_min is not None and n_max is not None and n_min > n_max:
        raise click.BadParameter(f"{n_min} is more than --n-max ({n_max}).", param_hint="'--n-min'")
    check_strategies_have_a_draft([opts["strategy"]] if opts["strategy"] else [], opts["draft"])
    if opts.get("corpus") and opts["strategy"] and opts["strategy"] not in settings.SUFFIX_STRATEGIES:
        raise click.UsageError(
            f"--corpus feeds the suffix cache, and --strategy {opts['strategy']} does not use it: "
            f"use --strategy {' or '.join(settings.SUFFIX_STRATEGIES)}, or drop --corpus"
        )
    if opts.get("tensor_split") and not opts.get("rpc"):
        raise click.UsageError("--tensor-split shares the target's layers among --rpc servers: add --rpc")
    # GPU layers only when given: None lets the library decide (all layers on a GPU build of llama.cpp).
    gpu = {"n_gpu_layers": opts["gpu_layers"], "draft_n_gpu_layers": opts["draft_gpu_layers"]}
    pipe = localspec.load(
        target=opts["target"],
        draft=opts["draft"],
        preset=opts["preset"],
        n_ctx=opts["n_ctx"],
        n_threads=opts["threads"],
        draft_n_threads=opts["draft_threads"],
        strategy=opts["strategy"],
        n_max=n_max,
        n_min=n_min,
        p_min=opts["p_min"],
        adaptive=opts["adaptive"],
        corpus=opts["corpus"],
        suffix_store=not opts["no_store"],
        store_namespace=store_namespace,
        rpc=opts.get("rpc"),
        tensor_split=opts.get("tensor_split"),
        parallel=opts.get("parallel", 1),
        prompt_cache_mb=opts.get("prompt_cache_mb", constants.DEFAULT_PROMPT_CACHE_MB),
        **{k: v for k, v in gpu.items() if v is not None},
    )
    pipe.notify = lambda line: click.echo(f"localspec: {line}", err=True)
    if opts["preset"] is not None:
        from localspec.hub.recent import remember_preset

        remember_preset(opts["preset"])  # what `localspec ui` opens on next
    return pipe
