"""``localspec scan`` and ``localspec pair``: what models are here, and which drafts fit a target."""

from __future__ import annotations

import json
import os
import sys

import click

from localspec.cli import NO_FIT_EXIT
from localspec.errors import GGUFError
from localspec.gguf import scan as scanmod
from localspec.gguf.pairing import file_size_warning
from localspec.gguf.scan import ModelInfo, RankedDraft, format_params
from localspec.gguf.vocab import DRAFTER_FILES
from localspec.units import format_bytes


def _echo(text: str = "") -> None:
    """Print ``text`` as valid UTF-8: a file name that is not UTF-8 (held by Python as surrogate escapes)
    shows U+FFFD where its bad bytes are, instead of those bytes reaching the terminal or a pipe."""
    click.echo(text.encode("utf-8", "surrogateescape").decode("utf-8", "replace"))


def _json(value: object) -> None:
    """JSON that is always valid UTF-8 (ASCII, in fact): a non-UTF-8 file name is written with ``\\udcXX``
    escapes, from which ``os.fsencode(json.loads(...))`` gives the original bytes back."""
    click.echo(json.dumps(value, indent=2, ensure_ascii=True))


def _cut(text: str | None, width: int) -> str:
    text = text or "-"
    return text if len(text) <= width else text[: width - 1] + "…"


_SHORT = (
    ("an MTP assistant", "MTP assistant: a draft"),
    ("an EAGLE-3 drafter", "EAGLE-3: a draft"),
    ("a DFlash drafter", "DFlash: a draft"),
    ("vocab-only", "vocab only"),
    ("vision projector", "mmproj"),
    ("LoRA", "adapter"),
    ("shard", "shard"),
    ("no vocabulary", "no vocab"),
)


def _note(m: ModelInfo) -> str:
    """A short status for the table: the full reasons are in --json and in `localspec pair`."""
    if m.error:
        return "ERROR"
    if not m.usable:
        reason = m.unusable_reason or ""
        return next((short for key, short in _SHORT if key in reason), "not runnable")
    tags = ["hybrid" if m.memory and m.memory.startswith("hybrid") else "recurrent"] if m.memory else []
    if m.mtp_declared:
        tags.append("MTP" if m.mtp_present else "MTP dropped")
    return ", ".join(["ok", *tags])


def _table(rows: list[list[str]], widths: list[int]) -> str:
    lines = []
    for row in rows:
        cells = [_cut(c, w).ljust(w) for c, w in zip(row[:-1], widths, strict=True)]
        lines.append("  ".join([*cells, row[-1]]).rstrip())
    return "\n".join(lines)


def _file_label(path: str) -> str:
    """The FILE cell: the file name without its ``.gguf`` (every row is a GGUF), so that common names such
    as ``qwen2.5-coder-1.5b-instruct-q4_k_m`` fit the column whole; Ollama's blobs have no extension."""
    name = os.path.basename(path)
    return name[: -len(".gguf")] if name.lower().endswith(".gguf") and len(name) > len(".gguf") else name


def _model_rows(models: list[ModelInfo]) -> str:
    head = ["FILE", "ARCH", "PARAMS", "QUANT", "SIZE", "VOCAB", "FINGERPRINT", "STATUS"]
    widths = [34, 10, 6, 7, 8, 7, 12]
    rows = [head]
    for m in models:
        rows.append(
            [
                _file_label(m.path),
                m.architecture or "-",
                format_params(m.n_params),
                m.quant or "-",
                format_bytes(m.size_bytes, unknown="-"),
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
    for (
        p
    ) in paths:  # named on purpose: say why it is skipped (a folder's FIFOs and devices are skipped quietly)
        if not os.path.isdir(p) and not os.path.isfile(p):
            raise click.BadParameter(
                f"{p} is not a regular file or a folder (a FIFO or a device?)", param_hint="PATH"
            )
    models = scanmod.scan(roots, use_cache=not no_cache)
    if as_json:
        _json([m.as_dict() for m in models])
        return
    if not models:
        where = ", ".join(paths) if paths else "the default model folders (set LOCALSPEC_MODELS to add one)"
        _echo(f"No GGUF models found in {where}.")
        return
    _echo(_model_rows(models))
    bad = [m for m in models if m.error]
    _echo(
        f"\n{len(models)} file(s), {len(bad)} unreadable. Same FINGERPRINT = same vocabulary: "
        "such models can draft for each other.\n'vocab only' files serve for pairing checks only; "
        "`localspec pair TARGET` ranks the drafts for a target."
    )
    for m in bad:
        _echo(f"  ERROR {m.error}")


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
        raise _unreadable(t, "target")
    if draft is not None:
        if not _pair_two(t, scanmod.inspect(draft), as_json):
            sys.exit(NO_FIT_EXIT)
        return
    ranked = scanmod.find_drafts(target, list(search) or None)
    _print_ranking(t, ranked, as_json)
    if not any(r.fits for r in ranked):
        sys.exit(NO_FIT_EXIT)


def _print_ranking(t: ModelInfo, ranked: list[RankedDraft], as_json: bool) -> None:
    if as_json:
        _json(
            {
                "target": _side(t),
                "target_usable": t.usable,
                "drafts": [r.as_dict() for r in ranked if r.fits],
                "rejected": [r.as_dict() for r in ranked if not r.fits],
            }
        )
        return
    _print_target(t)
    fits = [r for r in ranked if r.fits]
    rejected = [r for r in ranked if not r.fits]
    if fits:
        _echo("\nDrafts that fit, best first:")
        for i, r in enumerate(fits, 1):
            _print_ranked(i, r)
    else:
        _echo(
            "\nNo draft found that fits this target. Run it with `--draft ngram` (prompt lookup, no draft "
            "model), pick a ready-made pair (`localspec presets`), or search the Hub for a draft of its "
            "family (`localspec find-draft REPO`)."
        )
    if rejected:
        _echo("\nNot usable as a draft here:")
        for r in rejected:
            _echo(f"  - {os.path.basename(r.model.path)}: {r.why}")


def _print_target(t: ModelInfo) -> None:
    _echo(f"Target: {t.path}")
    _echo(
        f"  {t.name} | {t.architecture or '-'} | {format_params(t.n_params)} params | {t.quant or '-'} | "
        f"{t.n_vocab or 0:,} tokens | fingerprint {t.fingerprint_short or '-'}"
    )
    _print_notes(t)
    if not t.usable:
        _echo(f"  cannot run as a target: {t.unusable_reason}")


def _print_notes(m: ModelInfo) -> None:
    """How a recurrent or hybrid model rolls drafts back, and its MTP layers, when it has either."""
    for note in (m.memory, m.mtp_note):
        if note:
            _echo(f"  {note}")


def _print_ranked(i: int, r: RankedDraft) -> None:
    m = r.model
    _echo(f"  {i}. {m.path}")
    size = format_bytes(m.size_bytes, unknown="-")
    _echo(f"     {format_params(m.n_params)} params, {m.quant or '-'}, {size}: {r.why}")


def _unreadable(m: ModelInfo, role: str) -> GGUFError:
    """The error for a TARGET or DRAFT that is not a readable GGUF: ``pair`` exits 1, never with a verdict."""
    reason = m.error or "unreadable"
    prefix = f"{m.path}: "
    reason = reason[len(prefix) :] if reason.startswith(prefix) else reason
    return GGUFError(m.path, f"cannot read the {role}: {reason}")


def _pair_two(t: ModelInfo, d: ModelInfo, as_json: bool) -> bool:
    """Print the verdict for ``t`` with ``d``; True when their vocabularies fit (any verdict but
    ``incompatible``)."""
    if d.error:
        raise _unreadable(d, "draft")
    verdict = scanmod.verdict_for(t, d).as_dict()
    drafter = DRAFTER_FILES.get(d.architecture or "")
    assistant = drafter is not None
    misfit = scanmod.drafter_misfit_for(t, d) if assistant else None
    if misfit:  # drafting would read the target's memory as something it is not
        verdict["verdict"], verdict["reasons"] = "incompatible", [misfit, *verdict["reasons"]]
    fits = verdict["verdict"] != "incompatible"
    d_usable = d.usable or (assistant and not misfit)
    # file sizes say something only about models that run (a vocab-only file is a few MB whatever the model)
    warning = (
        file_size_warning(t.path, d.path, order="TARGET first, then DRAFT") if t.usable and d_usable else None
    )
    if as_json:
        out = {
            **verdict,
            "warnings": [warning] if warning else [],
            "target": _side(t),
            "draft": _side(d),
            "target_usable": t.usable,
            "draft_usable": d_usable,
            "draft_is_mtp_assistant": drafter is not None and drafter.reads == "memory",
            "draft_is_drafter_file": drafter.spec_type if drafter else None,
        }
        _json(out)
        return fits
    _print_target(t)
    _echo(f"Draft:  {d.path}")
    _echo(
        f"  {d.name} | {d.architecture or '-'} | {format_params(d.n_params)} params | {d.quant or '-'} | "
        f"{d.n_vocab or 0:,} tokens | fingerprint {d.fingerprint_short or '-'}"
    )
    _print_notes(d)
    if drafter is not None and not misfit:
        reads = "KV cache" if drafter.reads == "memory" else f"layer rows ({drafter.spec_type} in llama.cpp)"
        _echo(f"  {drafter.what}: it drafts as the target's MTP layers do, reading the target's {reads}")
    elif not d_usable:
        _echo(f"  cannot run as a draft: {misfit or d.unusable_reason}")
    _echo(f"\nVerdict: {verdict['verdict']}")
    for reason in verdict["reasons"]:
        _echo(f"  - {reason}")
    if verdict.get("n_masked"):
        _echo(f"  ({verdict['n_masked']:,} draft ids will be masked)")
    if warning:
        _echo(f"warning: {warning}")
    return fits


COMMANDS = [scan, pair]
