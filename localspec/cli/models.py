"""``localspec scan`` and ``localspec pair``: what models are here, and which drafts fit a target."""

from __future__ import annotations

import json
import os

import click

from localspec import scan as scanmod
from localspec.scan import ModelInfo, RankedDraft, _params


def _size(n: int | None) -> str:
    if not n:
        return "-"
    for unit, div in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if n >= div:
            return f"{n / div:.3g} {unit}"
    return f"{n} B"


def _cut(text: str | None, width: int) -> str:
    text = text or "-"
    return text if len(text) <= width else text[: width - 1] + "…"


_SHORT = (
    ("vocab-only", "vocab only"),
    ("vision projector", "mmproj"),
    ("LoRA", "adapter"),
    ("shard", "shard"),
    ("recurrent", "recurrent"),
    ("no vocabulary", "no vocab"),
)


def _note(m: ModelInfo) -> str:
    """A short status for the table: the full reasons are in --json and in `localspec pair`."""
    if m.error:
        return "ERROR"
    if not m.usable:
        reason = m.unusable_reason or ""
        return next((short for key, short in _SHORT if key in reason), "not runnable")
    return "ok"


def _table(rows: list[list[str]], widths: list[int]) -> str:
    lines = []
    for row in rows:
        cells = [_cut(c, w).ljust(w) for c, w in zip(row[:-1], widths, strict=True)]
        lines.append("  ".join([*cells, row[-1]]).rstrip())
    return "\n".join(lines)


def _model_rows(models: list[ModelInfo]) -> str:
    head = ["FILE", "ARCH", "PARAMS", "QUANT", "SIZE", "VOCAB", "FINGERPRINT", "STATUS"]
    widths = [34, 10, 6, 7, 8, 7, 12]
    rows = [head]
    for m in models:
        rows.append(
            [
                os.path.basename(m.path),
                m.architecture or "-",
                _params(m.n_params),
                m.quant or "-",
                _size(m.size_bytes),
                f"{m.n_vocab:,}" if m.n_vocab else "-",
                m.fingerprint_short or "-",
                _note(m),
            ]
        )
    return _table(rows, widths)


@click.command("scan")
@click.argument("paths", nargs=-1, type=click.Path(exists=True))
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list instead of a table.")
@click.option("--no-cache", is_flag=True, help="Read every file again, ignoring the fingerprint cache.")
def scan(paths: tuple[str, ...], as_json: bool, no_cache: bool) -> None:
    """List GGUF models with family, size, quantisation and vocabulary fingerprint.

    With no PATH: LOCALSPEC_MODELS, the Hugging Face cache, LM Studio's and Ollama's model folders.
    """
    roots = list(paths) if paths else None
    models = scanmod.scan(roots, use_cache=not no_cache)
    if as_json:
        click.echo(json.dumps([m.as_dict() for m in models], indent=2, ensure_ascii=False))
        return
    if not models:
        where = ", ".join(paths) if paths else "the default model folders (set LOCALSPEC_MODELS to add one)"
        click.echo(f"No GGUF models found in {where}.")
        return
    click.echo(_model_rows(models))
    bad = [m for m in models if m.error]
    click.echo(
        f"\n{len(models)} file(s), {len(bad)} unreadable. Same FINGERPRINT = same vocabulary: "
        "such models can draft for each other.\n'vocab only' files serve for pairing checks only; "
        "`localspec pair TARGET` ranks the drafts for a target."
    )
    for m in bad:
        click.echo(f"  ERROR {m.error}")


def _side(m: ModelInfo) -> dict:
    d = m.as_dict()
    return {
        k: d[k]
        for k in (
            "path",
            "name",
            "architecture",
            "family",
            "n_params",
            "n_vocab",
            "quant",
            "size_bytes",
            "fingerprint",
            "usable",
            "unusable_reason",
            "error",
        )
    }


@click.command("pair")
@click.argument("target", type=click.Path(exists=True, dir_okay=False))
@click.argument("draft", required=False, type=click.Path(exists=True, dir_okay=False))
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of text.")
@click.option(
    "--search",
    "search",
    multiple=True,
    type=click.Path(exists=True),
    help="Folder or file to look for drafts in (repeatable). Default: the target's folder and "
    "the usual model folders.",
)
def pair(target: str, draft: str | None, as_json: bool, search: tuple[str, ...]) -> None:
    """Check TARGET with DRAFT, or rank the drafts that fit TARGET (best first, with reasons)."""
    t = scanmod.inspect(target)
    if t.error:
        from localspec.errors import GGUFError

        raise GGUFError(target, t.error.split(": ", 1)[-1])
    if draft is not None:
        _pair_two(t, scanmod.inspect(draft), as_json)
        return
    ranked = scanmod.find_drafts(target, list(search) or None)
    if as_json:
        click.echo(
            json.dumps(
                {
                    "target": _side(t),
                    "target_usable": t.usable,
                    "drafts": [r.as_dict() for r in ranked if r.fits],
                    "rejected": [r.as_dict() for r in ranked if not r.fits],
                },
                indent=2,
                ensure_ascii=False,
            )
        )
        return
    _print_target(t)
    fits = [r for r in ranked if r.fits]
    rejected = [r for r in ranked if not r.fits]
    if fits:
        click.echo("\nDrafts that fit, best first:")
        for i, r in enumerate(fits, 1):
            _print_ranked(i, r)
    else:
        click.echo(
            "\nNo draft found that fits this target. Try `--draft ngram` (no model needed), or "
            "download a small model of the same family (see `localspec presets`)."
        )
    if rejected:
        click.echo("\nNot usable as a draft here:")
        for r in rejected:
            click.echo(f"  - {os.path.basename(r.model.path)}: {r.why}")


def _print_target(t: ModelInfo) -> None:
    click.echo(f"Target: {t.path}")
    click.echo(
        f"  {t.name} | {t.architecture} | {_params(t.n_params)} params | {t.quant or '-'} | "
        f"{t.n_vocab or 0:,} tokens | fingerprint {t.fingerprint_short}"
    )
    if not t.usable:
        click.echo(f"  cannot run as a target: {t.unusable_reason}")


def _print_ranked(i: int, r: RankedDraft) -> None:
    m = r.model
    click.echo(f"  {i}. {m.path}")
    click.echo(f"     {_params(m.n_params)} params, {m.quant or '-'}, {_size(m.size_bytes)}: {r.why}")


def _pair_two(t: ModelInfo, d: ModelInfo, as_json: bool) -> None:
    if d.error:
        verdict = {
            "verdict": "incompatible",
            "reasons": [f"the draft is unreadable: {d.error}"],
            "masked_ids": [],
        }
    else:
        verdict = scanmod.verdict_for(t, d).as_dict()
    if as_json:
        out = {
            **verdict,
            "target": _side(t),
            "draft": _side(d),
            "target_usable": t.usable,
            "draft_usable": d.usable and not d.error,
        }
        click.echo(json.dumps(out, indent=2, ensure_ascii=False))
        return
    _print_target(t)
    click.echo(f"Draft:  {d.path}")
    if not d.error:
        click.echo(
            f"  {d.name} | {d.architecture} | {_params(d.n_params)} params | {d.quant or '-'} | "
            f"{d.n_vocab or 0:,} tokens | fingerprint {d.fingerprint_short}"
        )
    if not d.usable and not d.error:
        click.echo(f"  cannot run as a draft: {d.unusable_reason}")
    click.echo(f"\nVerdict: {verdict['verdict']}")
    for reason in verdict["reasons"]:
        click.echo(f"  - {reason}")
    if verdict.get("n_masked"):
        click.echo(f"  ({verdict['n_masked']:,} draft ids will be masked)")


COMMANDS = [scan, pair]
