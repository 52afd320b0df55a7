"""Picking a pair: preset facts (size, RAM, cached?) and the scanner's view of the user's own models.

Only reads localspec's public modules (``presets``, ``hub``, ``scan``); every function returns
plain data or Markdown for the page.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from localspec import constants
from localspec.errors import LocalspecError, UnusableModelError
from localspec.gguf import scan
from localspec.hub import download as hub
from localspec.hub import presets
from localspec.units import format_bytes

from .render import error_html, esc, markdown_table

EMBEDDED = constants.EMBEDDED_PRESET


# ----------------------------------------------------------------------------------------- presets


def preset_cached(preset: Any) -> bool:
    """True when every file of the preset is on this machine (``hub.is_cached``: cache lookups only)."""
    return bool(hub.is_cached(preset))


def list_presets() -> list[Any]:
    """All presets, the embedded pair first."""
    found = list(presets.list_presets())
    return sorted(found, key=lambda p: (p.name != EMBEDDED, p.name))


def preset_choices(found: list[Any]) -> list[tuple[str, str]]:
    """Dropdown (label, value) pairs: name, what it takes to get (nothing, cached, or the download's size)
    and the RAM it needs; short, so that the label does not run under the dropdown's arrow."""
    out = []
    for p in found:
        if not p.download_bytes:
            fetch = "no download"
        else:
            fetch = "cached" if preset_cached(p) else f"{format_bytes(p.download_bytes)} to download"
        out.append((f"{p.name} · {fetch} · {format_bytes(p.ram_bytes)} RAM", p.name))
    return out


def preset_info_html(name: str | None) -> str:
    """Facts for one preset: what it pairs, cost to fetch and run, draft settings, licence."""
    if not name:
        return '<div class="ls-note">Pick a preset.</div>'
    try:
        p = presets.get_preset(name)
    except LocalspecError as exc:
        return error_html(exc)
    cached = preset_cached(p)
    draft = p.draft_model.describe() if p.draft_model else "none (n-gram lookup or target alone)"
    d = p.draft
    rows = [
        ("Target", p.target.describe()),
        ("Draft", draft),
        ("Download", "none needed" if not p.download_bytes else format_bytes(p.download_bytes)),
        ("RAM needed", format_bytes(p.ram_bytes)),
        ("Draft's memory", draft_share_text(p)),
        ("On this machine", "yes, ready" if cached else "not yet: press Download"),
        (
            "Draft settings",
            f"n_max {d.n_max}, p_min {d.p_min:g}, adaptive {'on' if d.adaptive else 'off'}, "
            f"strategy {d.strategy}",
        ),
        ("Context", f"{p.n_ctx} tokens"),
    ]
    if p.licence:
        rows.append(("Licence", p.licence))
    if p.gated:
        rows.append(("Access", p.gated))
    cells = "".join(f"<tr><th>{esc(k)}</th><td>{esc(v)}</td></tr>" for k, v in rows)
    desc = f'<div class="ls-note">{esc(p.description)}</div>' if p.description else ""
    state = "ls-cached" if cached else "ls-missing"
    return f'<div id="ls-preset-facts" class="{state}">{desc}<table class="ls-kv">{cells}</table></div>'


def draft_share_text(preset: Any) -> str:
    """The draft model's weights as a share of the target's, from the files on this machine: the memory a
    draft costs, said next to what it buys (Compare measures both, with the KV caches)."""
    if preset.draft_model is None:
        return "none: no draft model to hold"
    target, draft = hub.cached_bytes(preset.target), hub.cached_bytes(preset.draft_model)
    if not target or draft is None:
        return "known once downloaded; Compare shows it next to the speedup"
    return (
        f"{format_bytes(draft)} of weights, {draft / target:.0%} of the target's; "
        "Compare shows it next to the speedup"
    )


def download(name: str, progress: Any = None) -> Any:
    """Fetch a preset through the hub (progress(stage, done, total)); returns the resolved pair."""
    return hub.ensure_preset(name, progress=progress)


# ----------------------------------------------------------------------------------------- own models


@dataclass
class ScanView:
    """What the scanner found, keyed by path, with labels for the dropdowns."""

    models: dict[str, Any]

    def target_choices(self) -> list[tuple[str, str]]:
        """The usable models, largest first: the one a new user means as the target (a draft is smaller)."""

        def size(m: Any) -> int:
            return int(getattr(m, "n_params", None) or getattr(m, "size_bytes", 0) or 0)

        usable = [(p, m) for p, m in self.models.items() if getattr(m, "usable", True)]
        usable.sort(key=lambda pm: -size(pm[1]))
        return [(model_label(m), p) for p, m in usable]


def model_path(m: Any) -> str:
    return str(m.path)


def model_label(m: Any) -> str:
    """``name (architecture, quant, size)`` for a scanned ModelInfo."""
    name = m.name or Path(m.path).name
    bits = [b for b in (m.architecture, m.quant, format_bytes(m.size_bytes) if m.size_bytes else "") if b]
    return f"{name} ({', '.join(bits)})" if bits else str(name)


def scan_folders(folders: str) -> list[str]:
    """The folders typed in the box (one per line or separated by ``;``); empty: the scanner's defaults."""
    return [f.strip() for f in folders.replace(";", "\n").splitlines() if f.strip()] if folders else []


def scan_models(folders: str) -> ScanView:
    """Run the scanner on the given folders (:func:`scan_folders`), or its defaults."""
    found = scan.scan(scan_folders(folders) or None)
    return ScanView({model_path(m): m for m in found})


def inspect_model(path: str) -> Any:
    return scan.inspect(path)


def draft_options(target: Any, view: ScanView) -> tuple[list[tuple[str, str]], str]:
    """Compatible drafts for ``target`` (best first, then n-gram and none) and a Markdown table of every
    candidate with its verdict and why it fits or was refused."""
    if getattr(target, "error", None) or not getattr(target, "usable", True):
        raise UnusableModelError(
            target.error or f"{model_path(target)}: {target.unusable_reason or 'cannot be used as a model'}",
            hint="pick a complete, text-only .gguf model as the target",
        )
    tpath = model_path(target)
    found = dict(view.models)
    if tpath not in found:  # a typed path: look next to it too, as `localspec pair TARGET` does
        found.update({model_path(m): m for m in scan.scan([str(Path(tpath).resolve().parent)])})
    candidates = [m for p, m in found.items() if p != tpath and Path(p).resolve() != Path(tpath).resolve()]
    ranked = scan.rank_drafts(target, candidates) if candidates else []
    choices: list[tuple[str, str]] = []
    rows = []
    for r in ranked:
        verdict = r.verdict.verdict if r.verdict is not None else "-"
        if r.fits:
            choices.append((f"{model_label(r.model)} ({verdict})", model_path(r.model)))
        rows.append(("yes" if r.fits else "no", model_label(r.model), verdict, r.why))
    choices += [("n-gram lookup (no draft model)", "ngram"), ("none (target alone)", "none")]
    md = (
        markdown_table(["fits", "candidate", "verdict", "why"], rows)
        if rows
        else "No other models found to draft with (next to the target, or by the last Scan); n-gram lookup "
        "still works."
    )
    notes = [n for n in (getattr(target, "memory", None), getattr(target, "mtp_note", None)) if n]
    if notes:  # a hybrid's rollback and MTP layers, as `localspec pair` prints them
        md = f"**Target:** {'; '.join(notes)}.\n\n{md}"
    return choices, md
