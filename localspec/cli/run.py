"""``localspec run``: generate from a prompt and print a one-line measurement summary."""

from __future__ import annotations

import json
import math
import sys

import click

from localspec import constants, settings


class _FiniteFloat(click.FloatRange):
    """A float within bounds that is also finite: click's FloatRange lets ``nan`` through (no comparison
    with nan is true) and ``inf`` where there is no upper bound."""

    def convert(self, value, param, ctx):
        rv = super().convert(value, param, ctx)
        if not math.isfinite(rv):
            self.fail(f"{value!r} is not a finite number.", param, ctx)
        return rv


_N_MAX = click.IntRange(*settings.N_MAX_RANGE)
_THREADS = click.IntRange(*settings.THREADS_RANGE)
_GPU_LAYERS_HELP = (
    "layers to offload to a GPU (-1: all, 0: none; default: all when llama.cpp was built with GPU "
    "offload, else 0)."
)


@click.command("run")
@click.argument("prompt", required=False)
@click.option("--target", "-t", type=click.Path(dir_okay=False), help="Target GGUF (default: embedded pair).")
@click.option("--draft", "-d", help="Draft GGUF path, 'ngram', 'none' or 'auto' (default: auto).")
@click.option("--preset", "-p", help="A preset name (see `localspec presets`); downloads on first use.")
@click.option("--chat", is_flag=True, help="Wrap the prompt as a user message in the model's chat template.")
@click.option(
    "--max-tokens",
    "-n",
    default=constants.DEFAULT_MAX_TOKENS,
    show_default=True,
    type=click.IntRange(min=1),
    help="Tokens to generate at most (the prompt plus this must fit --n-ctx).",
)
@click.option("--temperature", default=0.0, show_default=True, type=_FiniteFloat(min=0.0), help="0 = greedy.")
@click.option("--top-k", default=0, type=click.IntRange(min=0), help="Keep the k likeliest tokens (0: all).")
@click.option("--top-p", default=1.0, type=_FiniteFloat(0.0, 1.0, min_open=True), help="Nucleus, in (0, 1].")
@click.option("--min-p", default=0.0, type=_FiniteFloat(0.0, 1.0, max_open=True), help="In [0, 1).")
@click.option("--seed", type=click.IntRange(min=0), help="Sampling seed (a whole number >= 0).")
@click.option(
    "--strategy",
    type=click.Choice(settings.STRATEGIES),
    help="Override the drafting strategy for this run.",
)
@click.option("--n-max", type=_N_MAX, help="Longest draft per round.")
@click.option(
    "--corpus",
    type=click.Path(exists=True, file_okay=False),
    help="A folder (your repository, notes) the suffix cache drafts from (strategies suffix/auto).",
)
@click.option(
    "--no-store",
    is_flag=True,
    help="Keep the suffix cache in memory only: nothing of this run is written to disk.",
)
@click.option(
    "--n-min",
    type=click.IntRange(0, settings.N_MAX_RANGE[1]),
    help="Draft at least this many tokens before p-min can stop it.",
)
@click.option(
    "--p-min",
    type=_FiniteFloat(*settings.P_MIN_RANGE),
    help="Stop drafting when the draft's top probability falls below this.",
)
@click.option(
    "--adaptive/--fixed", default=None, help="Adapt the draft length to measured acceptance and cost."
)
@click.option(
    "--n-ctx",
    type=click.IntRange(*settings.N_CTX_RANGE),
    help=f"Context size in tokens, for each model (default {constants.DEFAULT_N_CTX} or the preset's).",
)
@click.option("--threads", type=_THREADS, help="CPU threads for the target (default: physical cores).")
@click.option("--draft-threads", type=_THREADS, help="CPU threads for the draft (default: as target).")
@click.option("--gpu-layers", type=click.IntRange(min=-1), help="Target " + _GPU_LAYERS_HELP)
@click.option("--draft-gpu-layers", type=click.IntRange(min=-1), help="Draft " + _GPU_LAYERS_HELP)
@click.option(
    "--baseline",
    is_flag=True,
    help="Then run the target alone on the same prompt and report the speedup: one run each, the "
    "speculative one first, so a rough figure (`localspec bench` measures it over several prompts).",
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object (text + stats) instead.")
def run(
    prompt,
    target,
    draft,
    preset,
    chat,
    max_tokens,
    temperature,
    top_k,
    top_p,
    min_p,
    seed,
    strategy,
    n_max,
    corpus,
    no_store,
    n_min,
    p_min,
    adaptive,
    n_ctx,
    threads,
    draft_threads,
    gpu_layers,
    draft_gpu_layers,
    baseline,
    as_json,
) -> None:
    """Generate a completion of PROMPT (or stdin) with speculative decoding.

    With no --target and no --preset it runs the small embedded pair, offline.
    """
    import localspec

    if target is not None and preset is not None:
        raise click.UsageError("give either --target or --preset, not both (a preset names its own target)")
    if n_min is not None and n_max is not None and n_min > n_max:
        raise click.BadParameter(f"{n_min} is more than --n-max ({n_max}).", param_hint="'--n-min'")
    if prompt is None:
        if sys.stdin.isatty():
            raise click.UsageError("give a PROMPT argument or pipe one on stdin")
        prompt = sys.stdin.read()
    # GPU layers only when given: None lets the library decide (all layers on a GPU build of llama.cpp).
    gpu = {"n_gpu_layers": gpu_layers, "draft_n_gpu_layers": draft_gpu_layers}
    pipe = localspec.load(
        target=target,
        draft=None if draft in (None, "auto") else draft,
        preset=preset,
        n_ctx=n_ctx,
        n_threads=threads,
        draft_n_threads=draft_threads,
        strategy=strategy,
        n_max=n_max,
        n_min=n_min,
        p_min=p_min,
        adaptive=adaptive,
        corpus=corpus,
        suffix_store=not no_store,
        **{k: v for k, v in gpu.items() if v is not None},
    )
    kw = dict(
        max_tokens=max_tokens,
        temperature=temperature,
        top_k=top_k,
        top_p=top_p,
        min_p=min_p,
        seed=seed,
    )
    with pipe:
        if chat:
            stream = pipe.chat_stream([{"role": "user", "content": prompt}], **kw)
        else:
            stream = pipe.stream(prompt, **kw)
        parts = []
        last = None
        for last in stream:
            parts.append(last.text)
            if not as_json:
                click.echo(last.text, nl=False)
        if not as_json:
            click.echo()
        assert last is not None, "max_tokens >= 1: the engine yields at least one token"
        stats = last.stats
        if baseline:
            base = (
                pipe.chat([{"role": "user", "content": prompt}], baseline=True, **kw)
                if chat
                else pipe.generate(prompt, baseline=True, **kw)
            )
            if base.stats.tokens_per_second:
                stats.speedup = stats.tokens_per_second / base.stats.tokens_per_second
        if as_json:
            click.echo(
                json.dumps(
                    {
                        "text": "".join(parts),
                        "stats": stats.as_dict(),
                        "pair": {
                            "target": str(pipe.info.target_path),
                            "draft": str(pipe.info.draft_path) if pipe.info.draft_path else None,
                            "verdict": pipe.info.verdict,
                            "note": pipe.info.note,
                        },
                    },
                    indent=2,
                )
            )
        else:
            click.echo(f"[{pipe.info.note}] {stats.summary_line()}", err=True)
            if stats.speedup is not None and stats.speedup < 1.0 and stats.strategy != "none":
                tries = [] if adaptive else ["--adaptive (drafts only when it pays)"]
                tries += ["--draft ngram"] if stats.strategy != "ngram" else ["--draft none"]
                click.echo(
                    f"hint: drafting made this run slower than the target alone ({stats.speedup:.2f}x, "
                    f"one run each) on this machine; try {', '.join(tries)}, "
                    "or `localspec bench --tune` to measure what pays over several prompts",
                    err=True,
                )


COMMANDS = [run]
