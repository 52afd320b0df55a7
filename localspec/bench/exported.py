"""The drafting setting ``localspec export`` carries to another engine: the one this machine measured best
for the pair, else the one its measured costs predict (docs/export.md).

In order:

1. the setting ``localspec bench --tune --save-preset`` measured best here: the preset exported when the tuner
   wrote it, else the newest preset it wrote for the same target and draft;
2. the preset's own setting, ``auto`` routed as it routes a request it knows nothing about yet (the draft
   model with lookups where this machine's measured costs say it pays, else lookups alone), with the draft
   model's length the cost model predicts best (:func:`localspec.decoding.routing.model_speed`), never the
   cap on a lookup draft (a suffix-cache preset's ``n_max = 32``);
3. where the pair's costs are not measured on this machine yet, a fixed length: the preset's own for a
   strategy that names one, else the length a named pair drafts with (:class:`DraftSettings`' default).

Every choice comes with one line saying which of these it is (:attr:`ExportSetting.source`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from localspec.bench.tune import TUNED
from localspec.decoding.costs import MachineCosts, costs_key, read_costs
from localspec.decoding.routing import MIN_GAIN, PRIOR_ACCEPTANCE, model_speed
from localspec.hub.presets import LocalRef, ModelRef, Preset, list_presets
from localspec.settings import LOOKUPS_ONLY, MODEL_WITH_LOOKUPS, DraftSettings

#: ``auto`` weighs the draft model at lengths up to this (the pipeline routes with ``min(n_max, 8)``).
ROUTED_MODEL_N_MAX = 8


@dataclass(frozen=True)
class ExportSetting:
    """The one setting an export carries, and where it came from.

    ``settings.strategy`` is never ``auto`` and ``settings.n_max`` is the draft model's (or the MTP layers')
    length, or the lookups' cap when lookups draft alone; ``lookup_max`` caps the lookups chained before a
    model drafter (None without them).
    """

    settings: DraftSettings
    lookup_max: int | None
    source: str


def tuned_preset(preset: Preset | None, target: Path, draft: Path | None) -> Preset | None:
    """The preset ``bench --tune --save-preset`` wrote for this pair, if any.

    Args:
        preset: the preset exported (None for a pair named by its files).
        target: the target file (how a pair named by its files is matched).
        draft: the draft file, if any.

    Returns:
        ``preset`` itself when the tuner wrote it; else the newest preset the tuner wrote for the same
        target and draft (its overall winner, not a per-workload one); else None.
    """
    if (
        preset is not None
        and preset.source not in ("builtin", "user")
        and preset.description.startswith(TUNED)
    ):
        return preset  # an overall winner, or one workload's
    if preset is not None:
        same = [
            p for p in list_presets() if p.target == preset.target and p.draft_model == preset.draft_model
        ]
    else:
        same = [p for p in list_presets() if _is_file(p.target, target) and _is_file(p.draft_model, draft)]
    tuned = [p for p in same if _is_tuned(p)]
    return max(tuned, key=_written, default=None)


def _is_tuned(preset: Preset) -> bool:
    """The overall winner ``bench --tune --save-preset`` wrote (a user preset; not one workload's)."""
    return preset.source not in ("builtin", "user") and preset.description.startswith(f"{TUNED}:")


def _is_file(ref: ModelRef | None, path: Path | None) -> bool:
    if ref is None or path is None:
        return ref is None and path is None
    return isinstance(ref, LocalRef) and ref.path.resolve() == path.resolve()


def _written(preset: Preset) -> float:
    try:
        return os.stat(preset.source).st_mtime
    except OSError:
        return 0.0


def pair_costs_key(target: Path, draft: Path | None, threads: int) -> str:
    """The key a run of the pair at ``threads``, offloading as it does by default, keeps its costs under
    (:func:`localspec.decoding.costs.costs_key`; the files must exist)."""
    from localspec.llama.loading import default_gpu_layers, supports_gpu_offload

    layers = default_gpu_layers(None, offload=supports_gpu_offload())
    return costs_key(
        target, draft, threads=threads, gpu_layers=layers, draft_gpu_layers=layers if draft else 0
    )


def stored_costs(target: Path, draft: Path | None, threads: int) -> MachineCosts | None:
    """This machine's measured costs for the pair at ``threads`` (what a run measured and kept), or None.

    Args:
        target: the target file.
        draft: the draft file, if any.
        threads: the CPU threads the pair runs with.

    Returns:
        The kept measurement, or None when none was kept (or a file is not on this machine).
    """
    if not target.is_file() or (draft is not None and not draft.is_file()):
        return None
    return read_costs(pair_costs_key(target, draft, threads))


def export_setting(
    settings: DraftSettings,
    *,
    origin: str,
    draft: Path | None,
    costs: MachineCosts | None,
    length_given: bool = False,
) -> ExportSetting:
    """What an export carries for ``settings``: ``auto`` routed and a model's length predicted.

    Args:
        settings: the setting to carry (a preset's, a tuned one, or with the command's overrides).
        origin: where ``settings`` came from, for the source line (``the preset's``, ``tuned by ...``).
        draft: the draft file, if any.
        costs: this machine's measured costs for the pair (None: not measured here).
        length_given: the draft length was given on the command line: carried as it is.

    Returns:
        The :class:`ExportSetting`, with the line that says which setting it is and why.
    """
    kind = settings.strategy
    if kind.routed:
        return _routed(settings, origin=origin, draft=draft, costs=costs, length_given=length_given)
    lookup_max = settings.n_max if kind.combined else None
    if not ((kind.model or kind.mtp) and settings.adaptive) or length_given:
        line = f"{origin} {settings.label}" + (", at the length given" if length_given else "")
        return ExportSetting(settings, lookup_max, line)
    fixed = min(settings.n_max, DraftSettings().n_max)
    if fixed == settings.n_max:
        default = f"the draft drafts its adaptive ceiling, {fixed} tokens"
    else:
        default = (
            f"the draft drafts the fixed {fixed} tokens a named pair drafts by default, not its adaptive "
            f"ceiling {settings.n_max}"
        )
    if kind.mtp:
        why = f"the MTP layers' costs are measured per request, not ahead, so {default}"
    elif costs is None or costs.draft_ratio is None:
        why = (
            f"this machine's costs for the pair are not measured yet, so {default} (a run of the pair "
            "measures them once; export again then)"
        )
    else:
        k, _, why = _predicted(settings, costs, settings.n_max)
        if k:
            return ExportSetting(
                settings.with_overrides(n_max=k), lookup_max, f"{origin} {settings.label}; {why}"
            )
        why += f": the draft model does not pay here; {default}"
    return ExportSetting(
        settings.with_overrides(n_max=fixed), lookup_max, f"{origin} {settings.label}: {why}"
    )


def _predicted(settings: DraftSettings, costs: MachineCosts, n_max: int) -> tuple[int, float, str]:
    """The draft model's best length by the cost model at the prior acceptance, that speed, and a line."""
    speed, k = model_speed(costs, PRIOR_ACCEPTANCE, n_max)
    ratio = costs.draft_ratio
    measured = f", measured {costs.measured[:10]}" if costs.measured else ""
    if not costs.steady:  # as auto says it: a busy machine's figures may mis-size the draft
        measured += " on a busy machine (`localspec cache clear --costs` measures again)"
    if ratio is None:
        return 0, 1.0, "the draft model's cost is not in this machine's measured costs"
    line = (
        f"a draft token costs {ratio:.2f} of a target token here{measured}; at acceptance "
        f"{PRIOR_ACCEPTANCE:.2f} (the prior) "
    )
    if k == 0:
        return 0, speed, line + "no draft length beats the target alone"
    return k, speed, line + f"drafting {k} tokens should give {speed:.2f}x (the best length up to {n_max})"


def _routed(
    settings: DraftSettings,
    *,
    origin: str,
    draft: Path | None,
    costs: MachineCosts | None,
    length_given: bool,
) -> ExportSetting:
    """``auto``: the route it takes for a request it knows nothing about, with the predicted length."""
    cap = settings.n_max
    if draft is None:
        lookups = settings.with_overrides(strategy=LOOKUPS_ONLY)
        return ExportSetting(lookups, None, f"{origin} auto, with no draft model: lookups alone (suffix)")
    if costs is None or costs.draft_ratio is None:
        k = cap if length_given else DraftSettings().n_max
        length = (
            "the length given" if length_given else f"the fixed {k} tokens a named pair drafts by default"
        )
        why = (
            f"{origin} auto: this machine's costs for the pair are not measured yet, so as auto's first "
            f"request runs: the draft model after lookups, at {length} (a run of the pair measures the costs "
            "once; export again then)"
        )
        return ExportSetting(settings.with_overrides(strategy=MODEL_WITH_LOOKUPS, n_max=k), cap, why)
    k, speed, why = _predicted(settings, costs, min(cap, ROUTED_MODEL_N_MAX))
    if k == 0 or speed < MIN_GAIN:  # as auto routes a request it has measured nothing for
        lookups = settings.with_overrides(strategy=LOOKUPS_ONLY)
        line = f"{origin} auto -> {LOOKUPS_ONLY.name}; {why}: the draft model would not pay, so lookups alone"
        return ExportSetting(lookups, None, line)
    with_model = settings.with_overrides(strategy=MODEL_WITH_LOOKUPS)
    if length_given:
        return ExportSetting(with_model, cap, f"{origin} auto -> {MODEL_WITH_LOOKUPS.name}; the length given")
    line = f"{origin} auto -> {MODEL_WITH_LOOKUPS.name}; {why}"
    return ExportSetting(with_model.with_overrides(n_max=k), cap, line)
