"""``localspec run``: generate from a prompt and print a one-line measurement summary."""

from __future__ import annotations

import json
import sys

import click

from localspec import constants
from localspec.cli.options import FiniteFloat, load_pipeline, model_options


@click.command("run")
@click.argument("prompt", required=False)
@model_options
@click.option("--chat", is_flag=True, help="Wrap the prompt as a user message in the model's chat template.")
@click.option(
    "--max-tokens",
    "-n",
    default=constants.DEFAULT_MAX_TOKENS,
    show_default=True,
    type=click.IntRange(min=1),
    help="Tokens to generate at most (the prompt plus this must fit --n-ctx).",
)
@click.option("--temperature", default=0.0, show_default=True, type=FiniteFloat(min=0.0), help="0 = greedy.")
@click.option("--top-k", default=0, type=click.IntRange(min=0), help="Keep the k likeliest tokens (0: all).")
@click.option("--top-p", default=1.0, type=FiniteFloat(0.0, 1.0, min_open=True), help="Nucleus, in (0, 1].")
@click.option("--min-p", default=0.0, type=FiniteFloat(0.0, 1.0, max_open=True), help="In [0, 1).")
@click.option("--seed", type=click.IntRange(min=0), help="Sampling seed (a whole number >= 0).")
@click.option(
    "--baseline",
    is_flag=True,
    help="Then run the target alone on the same prompt and report the speedup: one run each, the "
    "speculative one first, so a rough figure (`localspec bench` measures it over several prompts).",
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object (text + stats) instead.")
def run(
    prompt,
    chat,
    max_tokens,
    temperature,
    top_k,
    top_p,
    min_p,
    seed,
    baseline,
    as_json,
    **model,
) -> None:
    """Generate a completion of PROMPT (or stdin) with speculative decoding.

    With no --target and no --preset it runs the small embedded pair, offline.
    """
    if prompt is None and sys.stdin.isatty():
        raise click.UsageError("give a PROMPT argument or pipe one on stdin")
    pipe = load_pipeline(**model)
    if prompt is None:
        prompt = sys.stdin.read()
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
                tries = [] if model["adaptive"] else ["--adaptive (drafts only when it pays)"]
                tries += ["--draft ngram"] if stats.strategy != "ngram" else ["--draft none"]
                click.echo(
                    f"hint: drafting made this run slower than the target alone ({stats.speedup:.2f}x, "
                    f"one run each) on this machine; try {', '.join(tries)}, "
                    "or `localspec bench --tune` to measure what pays over several prompts",
                    err=True,
                )


COMMANDS = [run]
