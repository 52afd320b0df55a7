"""``localspec run``: generate from a prompt and print a one-line measurement summary."""

from __future__ import annotations

import json
import sys

import click

from localspec import constants


@click.command("run")
@click.argument("prompt", required=False)
@click.option("--target", "-t", type=click.Path(dir_okay=False), help="Target GGUF (default: embedded pair).")
@click.option("--draft", "-d", help="Draft GGUF path, 'ngram', 'none' or 'auto' (default: auto).")
@click.option("--preset", "-p", help="A preset name (see `localspec presets`); downloads on first use.")
@click.option("--chat", is_flag=True, help="Wrap the prompt as a user message in the model's chat template.")
@click.option("--max-tokens", "-n", default=constants.DEFAULT_MAX_TOKENS, show_default=True, type=int)
@click.option("--temperature", default=0.0, show_default=True, type=float, help="0 = greedy.")
@click.option("--top-k", default=0, type=int)
@click.option("--top-p", default=1.0, type=float)
@click.option("--min-p", default=0.0, type=float)
@click.option("--seed", type=int)
@click.option(
    "--strategy",
    type=click.Choice(["model", "ngram", "model+ngram", "none"]),
    help="Override the drafting strategy for this run.",
)
@click.option("--n-max", type=int, help="Longest draft per round.")
@click.option("--n-min", type=int, help="Draft at least this many tokens before p-min can stop it.")
@click.option("--p-min", type=float, help="Stop drafting when the draft's top probability falls below this.")
@click.option(
    "--adaptive/--fixed", default=None, help="Adapt the draft length to measured acceptance and cost."
)
@click.option("--n-ctx", type=int, help=f"Context size (default {constants.DEFAULT_N_CTX} or the preset's).")
@click.option("--threads", type=int, help="CPU threads for the target (default: physical cores).")
@click.option("--draft-threads", type=int, help="CPU threads for the draft (default: as target).")
@click.option("--gpu-layers", default=0, type=int, help="Target layers to offload to a GPU (-1: all).")
@click.option("--draft-gpu-layers", default=0, type=int, help="Draft layers to offload to a GPU (-1: all).")
@click.option(
    "--baseline", is_flag=True, help="Also run the target alone, interleaved, and report the speedup."
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

    if prompt is None:
        if sys.stdin.isatty():
            raise click.UsageError("give a PROMPT argument or pipe one on stdin")
        prompt = sys.stdin.read()
    pipe = localspec.load(
        target=target,
        draft=None if draft in (None, "auto") else draft,
        preset=preset,
        n_ctx=n_ctx,
        n_threads=threads,
        draft_n_threads=draft_threads,
        n_gpu_layers=gpu_layers,
        draft_n_gpu_layers=draft_gpu_layers,
        n_max=n_max,
        n_min=n_min,
        p_min=p_min,
        adaptive=adaptive,
    )
    kw = dict(
        max_tokens=max_tokens,
        temperature=temperature,
        top_k=top_k,
        top_p=top_p,
        min_p=min_p,
        seed=seed,
        strategy=strategy,
    )
    with pipe:
        if chat:
            stream = pipe.chat_stream([{"role": "user", "content": prompt}], **kw)
        else:
            stream = pipe.stream(prompt, **kw)
        parts = []
        stats = None
        for r in stream:
            parts.append(r.text)
            stats = r.stats
            if not as_json:
                click.echo(r.text, nl=False)
        if not as_json:
            click.echo()
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
