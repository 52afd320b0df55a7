"""``localspec run``: generate from a prompt and print a one-line measurement summary."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from localspec import constants
from localspec.cli.options import (
    MAX_TOKENS,
    TEMPERATURE,
    WARNING_LINES,
    FiniteFloat,
    load_pipeline,
    model_options,
)
from localspec.constrain.grammar import MAX_GRAMMAR_CHARS, MAX_SCHEMA_CHARS, Grammar
from localspec.errors import ContextOverflowError, GrammarError
from localspec.settings import PROMPT_LOOKUP

if TYPE_CHECKING:
    from localspec.pipeline.pipeline import Pipeline


@click.command("run")
@click.argument("prompt", required=False)
@model_options
@click.option("--chat", is_flag=True, help="Wrap the prompt as a user message in the model's chat template.")
@click.option(
    "--max-tokens",
    "-n",
    default=constants.DEFAULT_MAX_TOKENS,
    show_default=True,
    type=MAX_TOKENS,
    help="Tokens to generate at most (the prompt plus this must fit --n-ctx).",
)
@click.option("--temperature", default=0.0, show_default=True, type=TEMPERATURE, help="0 = greedy.")
@click.option(
    "--top-k",
    default=0,
    show_default=True,
    type=click.IntRange(min=0),
    help="Keep the k likeliest tokens (0: all).",
)
@click.option(
    "--top-p",
    default=1.0,
    show_default=True,
    type=FiniteFloat(0.0, 1.0, min_open=True),
    help="Nucleus, in (0, 1].",
)
@click.option(
    "--min-p",
    default=0.0,
    show_default=True,
    type=FiniteFloat(0.0, 1.0, max_open=True),
    help="Drop tokens below this share of the likeliest one's probability, in [0, 1).",
)
@click.option(
    "--seed", type=click.IntRange(min=0), help="Sampling seed (a whole number >= 0; default: random)."
)
@click.option(
    "--baseline",
    is_flag=True,
    help="Then run the target alone on the same prompt and report the speedup: one run each, the "
    "speculative one first, so a rough figure (`localspec bench` measures it over several prompts).",
)
@click.option(
    "--json-schema",
    metavar="SCHEMA",
    help="Make the output JSON matching this JSON schema: the schema itself, or a file holding it.",
)
@click.option(
    "--grammar-file",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="Make the output follow this GBNF grammar (llama.cpp's format, a 'root' rule).",
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
    json_schema,
    grammar_file,
    as_json,
    **model,
) -> None:
    """Generate a completion of PROMPT (or stdin, also as PROMPT '-') with speculative decoding.

    With no --target and no --preset it runs the small embedded pair, offline.
    """
    if prompt == "-":  # the usual spelling of "read stdin"
        prompt = None
    if prompt is None and sys.stdin.isatty():
        raise click.UsageError("give a PROMPT argument or pipe one on stdin")
    grammar = _grammar(json_schema, grammar_file)  # checked before a model loads
    pipe = load_pipeline(**model)
    if pipe.n_ctx_asked:  # past it the model writes garbage; said before the text, not only on overflow
        asked = f"the default context {pipe.n_ctx_asked}"
        if model.get("n_ctx"):
            asked = f"--n-ctx {pipe.n_ctx_asked}"
        click.echo(f"localspec: {asked} lowered to {pipe.n_ctx}, the model's trained context", err=True)
    if prompt is None:
        prompt = sys.stdin.read()
        if not prompt:  # an empty file piped in: generating from nothing would puzzle more than help
            raise click.UsageError("the prompt from stdin is empty (was the file piped in empty?)")
    kw = dict(
        max_tokens=max_tokens,
        temperature=temperature,
        top_k=top_k,
        top_p=top_p,
        min_p=min_p,
        seed=seed,
        grammar=grammar,
    )
    with pipe:
        option = "--grammar-file" if grammar_file is not None else "--json-schema"
        stream = _start(pipe, prompt, chat, option, kw)
        text, stats = _echo_stream(stream, as_json)
        if baseline and stats.strategy.drafts:
            _measure_baseline(pipe, prompt, chat, stats, kw)
        if as_json:
            _echo_json(pipe, text, stats)
        else:
            click.echo(f"[{pipe.info.note}] {stats.summary_line()}", err=True)
            if baseline and not stats.strategy.drafts:
                click.echo("note: --baseline skipped: this run was the target alone already", err=True)
            if grammar is not None and stats.finish_reason == "length":
                _echo_cut_grammar(max_tokens, schema=bool(json_schema))
            if stats.speedup is not None and stats.speedup < 1.0 and stats.strategy.drafts:
                _echo_slower(stats, adaptive=model["adaptive"])


def _start(pipe: Pipeline, prompt: str, chat: bool, option: str, kw: dict[str, Any]) -> Iterator[Any]:
    """The token stream of the run; a grammar is parsed here, with the target's vocabulary: a broken one
    is a usage error of ``option``."""
    try:
        if chat:
            return pipe.chat_stream([{"role": "user", "content": prompt}], **kw)
        return pipe.stream(prompt, **kw)
    except GrammarError as exc:
        raise click.BadParameter(str(exc), param_hint=option) from None
    except ContextOverflowError as exc:  # the same numbers, in this command's own option names
        raise exc.reworded(max_tokens="-n", n_ctx="--n-ctx", load="run again") from None


def _echo_stream(stream: Iterator[Any], as_json: bool) -> tuple[str, Any]:
    """Print each token as it comes (not with ``--json``); the whole text and the last token's stats."""
    parts = []
    last = None
    tty = sys.stdout.isatty()  # (piped, the two streams are not one line: nothing to keep apart)
    for last in stream:
        parts.append(last.text)
        if not as_json:
            click.echo(last.text, nl=False)
            if last.text:
                WARNING_LINES.mid_line = tty and not last.text.endswith("\n")
    if not as_json:
        click.echo()
        WARNING_LINES.mid_line = False
    assert last is not None, "max_tokens >= 1: the engine yields at least one token"
    return "".join(parts), last.stats


def _measure_baseline(pipe: Pipeline, prompt: str, chat: bool, stats: Any, kw: dict[str, Any]) -> None:
    """``--baseline``: the target alone on the same prompt, once; its speed sets ``stats.speedup``."""
    base = (
        pipe.chat([{"role": "user", "content": prompt}], baseline=True, **kw)
        if chat
        else pipe.generate(prompt, baseline=True, **kw)
    )
    if base.stats.tokens_per_second:
        stats.speedup = stats.tokens_per_second / base.stats.tokens_per_second


def _echo_json(pipe: Pipeline, text: str, stats: Any) -> None:
    click.echo(
        json.dumps(
            {
                "text": text,
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


def _echo_cut_grammar(max_tokens: int, *, schema: bool) -> None:
    """A constrained output cut by ``--max-tokens``: a JSON schema's grammar ends with the value, so a cut
    one is unfinished; a GBNF grammar may accept where it was cut (root ::= [a-z]*)."""
    said = (
        "before the output was complete, so it does not match the schema yet"
        if schema
        else "before the grammar ended it, so it may be unfinished"
    )
    click.echo(
        f"note: stopped at --max-tokens {max_tokens} {said}: raise -n (a small model may never "
        "finish it: the embedded toy pair can write spaces for ever)",
        err=True,
    )


def _echo_slower(stats: Any, *, adaptive: bool) -> None:
    """Drafting made this run slower than the target alone: what to try."""
    tries = [] if adaptive else ["--adaptive (drafts only when it pays)"]
    tries += ["--draft ngram"] if stats.strategy != PROMPT_LOOKUP else ["--draft none"]
    click.echo(
        f"hint: drafting made this run slower than the target alone ({stats.speedup:.2f}x, "
        f"one run each) on this machine; try {', '.join(tries)}, "
        "or `localspec bench --tune` to measure what pays over several prompts",
        err=True,
    )


def _grammar(json_schema: str | None, grammar_file: Path | None) -> Grammar | None:
    if json_schema is not None and grammar_file is not None:
        raise click.UsageError("give --json-schema or --grammar-file, not both")
    try:
        if grammar_file is not None:
            text = _read(grammar_file, MAX_GRAMMAR_CHARS, "--grammar-file")
            return Grammar.gbnf(text, what=f"grammar in {grammar_file}")
        if json_schema is not None:
            text = json_schema
            if not text.strip():
                raise click.BadParameter(
                    "is empty: give a JSON schema or a file holding one", param_hint="--json-schema"
                )
            if not text.lstrip().startswith("{"):
                path = Path(text)
                if not path.exists() and _is_json(text):  # 42, "str", [...]: meant as a schema, not a file
                    raise click.BadParameter(
                        f"{text} is JSON but not an object, and no file has that name: a schema is an "
                        'object, e.g. {"type": "object", "properties": {...}}',
                        param_hint="--json-schema",
                    )
                text = _read(path, MAX_SCHEMA_CHARS, "--json-schema")
            try:
                schema = json.loads(text)
            except ValueError as exc:
                raise click.BadParameter(f"not valid JSON: {exc}", param_hint="--json-schema") from None
            return Grammar.json_schema(schema, what="--json-schema")
    except GrammarError as exc:
        raise click.BadParameter(str(exc), param_hint=exc.param) from None
    return None


def _is_json(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return False
    return True


def _read(path: Path, limit: int, option: str) -> str:
    """A small text file, or a usage error naming the option (never a read of something huge)."""
    try:
        if path.exists() and not path.is_file():
            raise click.BadParameter(f"{path} is not a regular file", param_hint=option)
        if not path.is_file():
            raise click.BadParameter(f"{path}: no such file", param_hint=option)
        if path.stat().st_size > 4 * limit:
            raise click.BadParameter(f"{path} is larger than {4 * limit:,} bytes", param_hint=option)
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise click.BadParameter(f"{path}: cannot be read as UTF-8 text ({exc})", param_hint=option) from None


COMMANDS = [run]
