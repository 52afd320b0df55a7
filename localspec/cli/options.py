"""The options every command that loads a pair shares (``run``, ``serve``): declared once, with the bounds
from :mod:`localspec.settings`, and the one place that turns them into :func:`localspec.load` arguments."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, TypeVar

import click

from localspec import constants, settings

F = TypeVar("F", bound=Callable[..., Any])


class FiniteFloat(click.FloatRange):
    """A float within bounds that is also finite: click's FloatRange lets ``nan`` through (no comparison
    with nan is true) and ``inf`` where there is no upper bound."""

    def convert(self, value, param, ctx):
        rv = super().convert(value, param, ctx)
        if not math.isfinite(rv):
            self.fail(f"{value!r} is not a finite number.", param, ctx)
        return rv


N_MAX = click.IntRange(*settings.N_MAX_RANGE)
THREADS = click.IntRange(*settings.THREADS_RANGE)
_GPU_LAYERS_HELP = (
    "layers to offload to a GPU (-1: all, 0: none; default: all when llama.cpp was built with GPU "
    "offload, else 0)."
)

_MODEL_OPTIONS = [
    click.option(
        "--target", "-t", type=click.Path(dir_okay=False), help="Target GGUF (default: embedded pair)."
    ),
    click.option("--draft", "-d", help="Draft GGUF path, 'ngram', 'none' or 'auto' (default: auto)."),
    click.option("--preset", "-p", help="A preset name (see `localspec presets`); downloads on first use."),
    click.option(
        "--strategy",
        type=click.Choice(settings.STRATEGIES),
        help="Drafting strategy (default: the pair's or preset's own).",
    ),
    click.option("--n-max", type=N_MAX, help="Longest draft per round."),
    click.option(
        "--n-min",
        type=click.IntRange(0, settings.N_MAX_RANGE[1]),
        help="Draft at least this many tokens before p-min can stop it.",
    ),
    click.option(
        "--p-min",
        type=FiniteFloat(*settings.P_MIN_RANGE),
        help="Stop drafting when the draft's top probability falls below this.",
    ),
    click.option(
        "--adaptive/--fixed", default=None, help="Adapt the draft length to measured acceptance and cost."
    ),
    click.option(
        "--corpus",
        type=click.Path(exists=True, file_okay=False),
        help="A folder (your repository, notes) the suffix cache drafts from (strategies suffix/auto).",
    ),
    click.option(
        "--no-store",
        is_flag=True,
        help="Keep the suffix cache in memory only: nothing is written to disk, and it is forgotten at exit.",
    ),
    click.option(
        "--n-ctx",
        type=click.IntRange(*settings.N_CTX_RANGE),
        help=f"Context size in tokens, for each model (default {constants.DEFAULT_N_CTX} or the preset's).",
    ),
    click.option("--threads", type=THREADS, help="CPU threads for the target (default: physical cores)."),
    click.option("--draft-threads", type=THREADS, help="CPU threads for the draft (default: as target)."),
    click.option("--gpu-layers", type=click.IntRange(min=-1), help="Target " + _GPU_LAYERS_HELP),
    click.option("--draft-gpu-layers", type=click.IntRange(min=-1), help="Draft " + _GPU_LAYERS_HELP),
]


def model_options(f: F) -> F:
    """Add the pair-loading options to a command; the command receives them as keyword arguments."""
    for option in reversed(_MODEL_OPTIONS):
        f = option(f)
    return f


def load_pipeline(*, store_namespace: str = "default", **opts: Any) -> Any:
    """:func:`localspec.load` from the options of :func:`model_options` (usage errors raised first)."""
    import localspec

    if opts["target"] is not None and opts["preset"] is not None:
        raise click.UsageError("give either --target or --preset, not both (a preset names its own target)")
    n_min, n_max = opts["n_min"], opts["n_max"]
    if n_min is not None and n_max is not None and n_min > n_max:
        raise click.BadParameter(f"{n_min} is more than --n-max ({n_max}).", param_hint="'--n-min'")
    # GPU layers only when given: None lets the library decide (all layers on a GPU build of llama.cpp).
    gpu = {"n_gpu_layers": opts["gpu_layers"], "draft_n_gpu_layers": opts["draft_gpu_layers"]}
    pipe = localspec.load(
        target=opts["target"],
        draft=None if opts["draft"] in (None, "auto") else opts["draft"],
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
        **{k: v for k, v in gpu.items() if v is not None},
    )
    pipe.notify = lambda line: click.echo(f"localspec: {line}", err=True)
    return pipe
