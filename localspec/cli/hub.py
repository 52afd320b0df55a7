"""``localspec presets``, ``localspec download NAME``, ``localspec find-draft REPO``."""

from __future__ import annotations

import json

import click

from localspec import constants
from localspec.errors import PresetError
from localspec.hub import download as hub
from localspec.hub import search as hub_search
from localspec.hub.presets import load_presets
from localspec.settings import DraftSettings
from localspec.units import format_bytes


def _short(ref) -> str:
    if ref is None:
        return "-"
    return ref.repo_id if ref.kind == "hub" else ref.describe()


def _skipped_line(problem: PresetError) -> str:
    """One line per skipped file or preset: the message names the file (preset, key) and what is wrong."""
    line = " ".join(problem.message.split())  # a TOML parser's message may span lines
    return f"skipped: {line}" + (f" -> {problem.hint}" if problem.hint else "")


def drafting(s: DraftSettings) -> str:
    """How a preset drafts, in a few words: ``auto``, ``model+ngram, adaptive``, ``model, k=4``."""
    if s.strategy.routed or not s.is_speculative:
        return s.strategy.name
    return f"{s.strategy}, adaptive" if s.adaptive else f"{s.strategy}, k={s.n_max}"


@click.command("presets")
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="Print every preset as JSON, with its source (skipped files and presets: stderr).",
)
def presets(as_json: bool) -> None:
    """List ready-made model pairs (built-in and your own), and name the preset files and presets skipped."""
    found, problems = load_presets()
    rows = []
    for p in found:
        d = p.as_dict()
        d["cached"] = hub.is_cached(p)
        rows.append((p, d))
    if as_json:  # the same list as ever on stdout; what was skipped goes to stderr, as with the table
        click.echo(json.dumps([d for _, d in rows], indent=2, default=str))
        for problem in problems:
            click.echo(_skipped_line(problem), err=True)
        return
    header = ("NAME", "TARGET", "DRAFT", "DRAFTING", "DOWNLOAD", "RAM", "CACHED", "LICENCE", "SOURCE")
    table = [header]
    for p, d in rows:
        table.append(
            (
                p.name + (" *" if p.gated else ""),
                _short(p.target),
                _short(p.draft_model),
                drafting(p.draft),
                format_bytes(p.download_bytes) if p.download_bytes else "none",
                format_bytes(p.ram_bytes) if p.ram_bytes else "?",
                "yes" if d["cached"] else "no",
                p.licence or "-",
                p.source if p.source in ("builtin", "user") else "user",
            )
        )
    widths = [max(len(str(r[i])) for r in table) for i in range(len(header))]
    # Long repository names keep their end (the model name); a long licence keeps its start (the name of
    # the licence; `presets --json` has it all).
    limits = {1: (64, "tail"), 2: (64, "tail"), 7: (28, "head")}
    for i, (limit, _) in limits.items():
        widths[i] = min(widths[i], limit)
    for r in table:
        cells = []
        for i, (c, w) in enumerate(zip(r, widths, strict=True)):
            text = str(c)
            if len(text) > w:
                keep = limits.get(i, (w, "tail"))[1]
                text = "…" + text[-(w - 1) :] if keep == "tail" else text[: w - 1] + "…"
            cells.append(text)
        click.echo("  ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)).rstrip())
    if any(p.gated for p, _ in rows):
        click.echo("\n* gated: accept the licence on the repository page, then set HF_TOKEN (see the docs).")
    checked = sum(1 for p, _ in rows if p.verified)
    if checked:  # the notes themselves are long: --json and `download NAME` show them
        click.echo(
            f"{checked} preset(s) say how their repositories and file names were verified: "
            "`localspec presets --json` (field verified)."
        )
    click.echo(
        f"Download one with `localspec download NAME`; add your own in {constants.user_presets_dir()}."
    )
    if problems:  # on stderr, so the table itself stays the same for scripts; the exit status too
        click.echo(err=True)
        for problem in problems:
            click.echo(_skipped_line(problem), err=True)


@click.command("download")
@click.argument("name")
def download(name: str) -> None:
    """Fetch a preset's target and draft into the Hugging Face cache and check that they pair."""
    from localspec.hub.presets import get_preset
    from localspec.hub.recent import remember_preset

    preset = get_preset(name)
    for label, ref in (("target", preset.target), ("draft", preset.draft_model)):
        if ref is not None:
            click.echo(f"{label:6}  {ref.describe()}")
    if preset.gated:
        click.echo(f"note    gated: {preset.gated}")
    if preset.verified:
        click.echo(f"note    verified: {preset.verified}")
    stages_seen: set[str] = set()

    def progress(stage: str, done: int, total: int) -> None:
        if stage not in stages_seen:
            stages_seen.add(stage)
            if stage == "check":
                click.echo("checking the pair ...", err=True)
            elif done < total:
                click.echo(f"downloading {stage} ({format_bytes(total)}) ...", err=True)

    pair = hub.ensure_preset(name, progress=progress)
    remember_preset(name)
    click.echo(f"target  {pair.target}")
    if pair.draft is not None:
        click.echo(f"draft   {pair.draft}")
        click.echo(f"pair    {pair.verdict}")
        for reason in pair.reasons:
            click.echo(f"        - {reason}")
    click.echo(
        f'Run it: localspec run --preset {name} "..."  (Python: localspec.generate("...", preset="{name}"))'
    )


@click.command("find-draft")
@click.argument("repo")
@click.option(
    "--file", "filename", default=None, help="The target's GGUF file (default: its Q4_K_M or first)."
)
@click.option("--json", "as_json", is_flag=True, help="Print the candidates as JSON.")
def find_draft(repo: str, filename: str | None, as_json: bool) -> None:
    """Find draft models on the Hub for a target repository (reads only GGUF headers)."""
    found = hub_search.search_hub_drafts(repo, filename=filename)
    if as_json:
        click.echo(json.dumps([c.as_dict() for c in found], indent=2))
        return
    if not found:
        click.echo(f"No smaller GGUF model of the same author or family found for {repo}.")
        return
    header = ("VERDICT", "REPOSITORY", "FILE", "DOWNLOAD", "WHY")
    table = [header] + [
        (
            c.verdict,
            c.repo_id,
            c.filename or "-",
            format_bytes(c.download_bytes),
            (c.reasons[0] if c.reasons else ""),
        )
        for c in found
    ]
    widths = [max(len(str(r[i])) for r in table) for i in range(len(header))]
    for r in table:
        click.echo("  ".join(str(c).ljust(w) for c, w in zip(r, widths, strict=True)).rstrip())


COMMANDS = [presets, download, find_draft]
