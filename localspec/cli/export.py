"""``localspec export``: a pair's measured drafting settings as llama-server flags or vLLM's
``speculative_config`` (docs/export.md)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import click

from localspec import constants
from localspec.cli.options import shared_options
from localspec.hub.export import ENGINES, llama_server, vllm
from localspec.settings import DraftSettings

if TYPE_CHECKING:
    from localspec.hub.presets import ModelRef, Preset


def _pair(pair_or_preset: str, draft: str | None) -> tuple[Path, Path | None, DraftSettings, int, list[str]]:
    """The target, draft, drafting settings and context of a preset name or a target path, and what could
    not be read (a preset's file not downloaded yet). Nothing is downloaded: an export only writes a
    command line."""
    from localspec.hub.presets import get_preset

    if Path(pair_or_preset).suffix.lower() == ".gguf":
        target = Path(pair_or_preset).expanduser()
        if not target.is_file():
            raise click.BadParameter(f"{target}: no such file", param_hint="PAIR_OR_PRESET")
        draft_path = Path(draft).expanduser() if draft else None
        strategy = "model" if draft_path else "ngram"
        return target, draft_path, DraftSettings(strategy=strategy), constants.DEFAULT_N_CTX, []
    preset = get_preset(pair_or_preset)  # an unknown name: a PresetError naming the known ones
    notes: list[str] = []
    preset_target = _present_file(preset, "target", preset.target, notes)
    assert preset_target is not None  # (a preset always has a target)
    if draft:
        preset_draft: Path | None = Path(draft).expanduser()
    else:
        preset_draft = _present_file(preset, "draft", preset.draft_model, notes)
    return preset_target, preset_draft, preset.draft, preset.n_ctx, notes


def _present_file(preset: Preset, stage: str, ref: ModelRef | None, notes: list[str]) -> Path | None:
    """Where the preset's ``stage`` file is on this machine (its path, or the Hub cache's copy), without
    downloading; when it is not there, a stand-in naming it, and a note saying so in ``notes``."""
    from localspec.errors import LocalspecError
    from localspec.hub.download import resolve_cached

    if ref is None:
        return None
    if ref.path is not None:
        if not ref.path.is_file():
            notes.append(f"the preset's {stage} {ref.path} does not exist: the command names it anyway")
        return Path(ref.path)
    try:
        return resolve_cached(ref, preset.name)[0]
    except (LocalspecError, OSError):
        stand_in = Path(f"{ref.repo_id}/{ref.filename}")
        notes.append(
            f"the {stage} ({ref.repo_id}@{ref.revision}, {ref.filename}) is not downloaded, so its path "
            f"could not be read: the command names it {stand_in}; `localspec download {preset.name}` "
            "fetches it (then export again for its path)"
        )
        return stand_in


@click.command("export")
@click.argument("pair_or_preset")
@click.option("--to", "engine", type=click.Choice(ENGINES), required=True, help="The serving engine.")
@click.option(
    "--draft", "-d", type=click.Path(dir_okay=False, exists=True), help="Draft GGUF (with a target)."
)
@shared_options("strategy", "n_max", "n_min", "p_min", "threads", "n_ctx", "rpc")
@click.option("--json", "as_json", is_flag=True, help="Print the configuration and notes as JSON.")
def export(
    pair_or_preset, engine, draft, strategy, n_max, n_min, p_min, threads, n_ctx, rpc, as_json
) -> None:
    """Print how to serve PAIR_OR_PRESET (a preset name, or a target .gguf with --draft) with the same
    drafting settings on llama-server or vLLM.

    A preset carries the settings `localspec bench --tune --save-preset NAME` measured; options override
    them. Nothing is downloaded: a preset's file not on this machine yet is named by its Hub reference.
    What the engine cannot express, and what could not be read, is said on stderr.
    """
    target, draft_path, settings, preset_ctx, missing = _pair(pair_or_preset, draft)
    settings = settings.with_overrides(strategy=strategy, n_max=n_max, n_min=n_min, p_min=p_min)
    ctx = n_ctx or preset_ctx
    if engine == "llama-server":
        threads = threads or constants.default_threads()
        out = llama_server(settings, target, draft_path, n_ctx=ctx, threads=threads, rpc=rpc)
    else:
        out = vllm(settings, target, draft_path, n_ctx=ctx, rpc=rpc)
    out.notes[:0] = missing
    if as_json:
        body = {"engine": out.engine, "command": out.argv, "speculative": out.speculative, "notes": out.notes}
        click.echo(json.dumps(body, indent=1))
        return
    click.echo(out.command())
    for note in out.notes:
        click.echo(f"note: {note}", err=True)


COMMANDS = [export]
