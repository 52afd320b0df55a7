"""``localspec export``: a pair's measured drafting settings as llama-server flags or vLLM's
``speculative_config`` (docs/export.md)."""

from __future__ import annotations

import json
from pathlib import Path

import click

from localspec import constants
from localspec.cli.options import shared_options
from localspec.hub.export import ENGINES, llama_server, vllm
from localspec.settings import DraftSettings


def _pair(pair_or_preset: str, draft: str | None) -> tuple[Path, Path | None, DraftSettings, int]:
    """The target, draft, drafting settings and context of a preset name or a target path."""
    from localspec.hub.presets import get_preset

    if Path(pair_or_preset).suffix.lower() == ".gguf":
        target = Path(pair_or_preset).expanduser()
        if not target.is_file():
            raise click.BadParameter(f"{target}: no such file", param_hint="PAIR_OR_PRESET")
        draft_path = Path(draft).expanduser() if draft else None
        strategy = "model" if draft_path else "ngram"
        return target, draft_path, DraftSettings(strategy=strategy), constants.DEFAULT_N_CTX
    from localspec.hub.download import ensure_preset

    preset = get_preset(pair_or_preset)  # an unknown name: a PresetError naming the known ones
    pair = ensure_preset(pair_or_preset, check=False)
    draft_path = Path(draft).expanduser() if draft else pair.draft
    return Path(pair.target), draft_path, preset.draft, preset.n_ctx


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
    them. What the engine cannot express is said on stderr.
    """
    target, draft_path, settings, preset_ctx = _pair(pair_or_preset, draft)
    settings = settings.with_overrides(strategy=strategy, n_max=n_max, n_min=n_min, p_min=p_min)
    ctx = n_ctx or preset_ctx
    if engine == "llama-server":
        threads = threads or constants.default_threads()
        out = llama_server(settings, target, draft_path, n_ctx=ctx, threads=threads, rpc=rpc)
    else:
        out = vllm(settings, target, draft_path, n_ctx=ctx, rpc=rpc)
    if as_json:
        body = {"engine": out.engine, "command": out.argv, "speculative": out.speculative, "notes": out.notes}
        click.echo(json.dumps(body, indent=1))
        return
    click.echo(out.command())
    for note in out.notes:
        click.echo(f"note: {note}", err=True)


COMMANDS = [export]
