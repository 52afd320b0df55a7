"""``localspec export``: a pair's measured drafting settings as llama-server flags or vLLM's
``speculative_config`` (docs/export.md)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from localspec import constants
from localspec.cli.options import shared_options
from localspec.hub.export import ENGINES, llama_server, vllm
from localspec.settings import DraftSettings

if TYPE_CHECKING:
    from localspec.bench.exported import ExportSetting
    from localspec.hub.presets import ModelRef, Preset


def _pair(
    pair_or_preset: str, draft: str | None
) -> tuple[Preset | None, Path, Path | None, DraftSettings, int, list[str]]:
    """The preset (None for a target path), target, draft, drafting settings and context of a preset name or
    a target path, and what could not be read (a preset's file not downloaded yet). Nothing is downloaded:
    an export only writes a command line."""
    from localspec.hub.presets import get_preset

    if Path(pair_or_preset).suffix.lower() == ".gguf":
        target = Path(pair_or_preset).expanduser()
        if not target.is_file():
            raise click.BadParameter(f"{target}: no such file", param_hint="PAIR_OR_PRESET")
        draft_path = Path(draft).expanduser() if draft else None
        strategy = "model" if draft_path else "ngram"
        return None, target, draft_path, DraftSettings(strategy=strategy), constants.DEFAULT_N_CTX, []
    preset = get_preset(pair_or_preset)  # an unknown name: a PresetError naming the known ones
    notes: list[str] = []
    preset_target = _present_file(preset, "target", preset.target, notes)
    assert preset_target is not None  # (a preset always has a target)
    if draft:
        preset_draft: Path | None = Path(draft).expanduser()
    else:
        preset_draft = _present_file(preset, "draft", preset.draft_model, notes)
    return preset, preset_target, preset_draft, preset.draft, preset.n_ctx, notes


def _setting(
    preset: Preset | None,
    target: Path,
    draft: Path | None,
    base: DraftSettings,
    threads: int,
    overrides: dict[str, Any],
) -> ExportSetting:
    """The setting to carry: the tuned one for the pair if ``bench --tune`` saved one, else ``base``; the
    command's options over it; ``auto`` routed and the model's length predicted from this machine's costs."""
    from localspec.bench.exported import export_setting, stored_costs, tuned_preset

    tuned = tuned_preset(preset, target, draft)
    if tuned is not None:
        base, origin = tuned.draft, f"measured best by `localspec bench --tune` here (preset {tuned.name}):"
    elif preset is not None:
        origin = f"preset {preset.name}'s setting"
    else:
        origin = "the pair's default"
    settings = base.with_overrides(**overrides)
    if any(v is not None for v in overrides.values()):
        origin += " with the options given"
    costs = stored_costs(target, draft, threads)
    return export_setting(
        settings, origin=origin, draft=draft, costs=costs, length_given=overrides["n_max"] is not None
    )


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
    """Print how to serve PAIR_OR_PRESET (a preset name, or a target .gguf with --draft) on llama-server or
    vLLM with the drafting setting this machine measured best for it.

    That is the setting `localspec bench --tune --save-preset` saved for the pair, else the preset's own with
    `auto` routed and the draft model's length predicted from this machine's measured costs; options
    override it. Which one it is goes to stderr (`setting:`), with what the engine cannot express and what
    could not be read (`note:`). Nothing is downloaded: a file not on this machine yet is named by its Hub
    reference.
    """
    preset, target, draft_path, base, preset_ctx, missing = _pair(pair_or_preset, draft)
    threads = threads or constants.default_threads()
    overrides = {"strategy": strategy, "n_max": n_max, "n_min": n_min, "p_min": p_min}
    chosen = _setting(preset, target, draft_path, base, threads, overrides)
    ctx = n_ctx or preset_ctx
    if engine == "llama-server":
        out = llama_server(
            chosen.settings,
            target,
            draft_path,
            n_ctx=ctx,
            threads=threads,
            rpc=rpc,
            lookup_max=chosen.lookup_max,
        )
    else:
        out = vllm(chosen.settings, target, draft_path, n_ctx=ctx, rpc=rpc)
    out.notes[:0] = missing
    if as_json:
        body = {
            "engine": out.engine,
            "command": out.argv,
            "speculative": out.speculative,
            "setting": {
                **chosen.settings.as_dict(),
                "lookup_max": chosen.lookup_max,
                "source": chosen.source,
            },
            "notes": out.notes,
        }
        click.echo(json.dumps(body, indent=1))
        return
    click.echo(out.command())
    click.echo(f"setting: {chosen.source}", err=True)
    for note in out.notes:
        click.echo(f"note: {note}", err=True)


COMMANDS = [export]
