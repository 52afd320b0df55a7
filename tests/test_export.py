"""``localspec export`` carries the setting this machine measured best (a tuned preset), else the preset's
route with the draft length the cost model predicts, never a lookup cap as a draft length (docs/export.md)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from click.testing import CliRunner

from localspec.bench.exported import ROUTED_MODEL_N_MAX, export_setting, pair_costs_key, tuned_preset
from localspec.cli import main
from localspec.constants import EMBEDDED_DRAFT, EMBEDDED_TARGET
from localspec.decoding.costs import MachineCosts, linear_costs, write_costs
from localspec.hub.export import llama_server, vllm
from localspec.hub.presets import get_preset, list_presets, save_user_preset, user_preset_path
from localspec.settings import LOOKUP_N_MAX, DraftSettings

AUTO = DraftSettings(strategy="auto", n_max=LOOKUP_N_MAX, p_min=0.7, adaptive=True)


def _costs(draft_ratio: float, slope: float = 0.1) -> MachineCosts:
    """A verify curve ``1 + slope (b - 1)`` with a draft token costing ``draft_ratio`` of a target token."""
    return replace(linear_costs(slope), draft_token_seconds=draft_ratio, measured="2026-12-01T10:00:00")


def test_auto_where_the_draft_model_pays_carries_the_predicted_length_not_the_lookup_cap():
    out = export_setting(AUTO, origin="preset p's setting", draft=Path("d.gguf"), costs=_costs(0.05))
    assert out.settings.strategy.name == "model+suffix"
    assert 1 <= out.settings.n_max <= ROUTED_MODEL_N_MAX < LOOKUP_N_MAX
    assert out.lookup_max == LOOKUP_N_MAX
    assert f"drafting {out.settings.n_max} tokens should give" in out.source
    assert "costs 0.05 of a target token" in out.source and "2026-12-01" in out.source


def test_auto_where_the_draft_model_does_not_pay_carries_lookups_alone():
    out = export_setting(AUTO, origin="preset p's setting", draft=Path("d.gguf"), costs=_costs(0.6, 0.42))
    assert out.settings.strategy.name == "suffix" and out.lookup_max is None
    assert "would not pay" in out.source
    flags = llama_server(out.settings, Path("t.gguf"), Path("d.gguf"), n_ctx=4096, threads=2).argv
    assert "--model-draft" not in flags and flags[flags.index("--spec-type") + 1] == "ngram-mod"


def test_auto_without_measured_costs_says_so_and_drafts_the_default_length():
    out = export_setting(AUTO, origin="preset p's setting", draft=Path("d.gguf"), costs=None)
    assert out.settings.strategy.name == "model+suffix"
    assert out.settings.n_max == DraftSettings().n_max
    assert "not measured yet" in out.source and "the fixed 4 tokens" in out.source


def test_an_adaptive_model_strategy_carries_the_predicted_length_and_a_fixed_one_its_own():
    adaptive = DraftSettings(strategy="model+ngram", n_max=8, adaptive=True)
    out = export_setting(adaptive, origin="o", draft=Path("d.gguf"), costs=_costs(0.05))
    assert out.settings.strategy.name == "model+ngram" and out.lookup_max == 8
    assert "should give" in out.source
    fixed = DraftSettings(strategy="model", n_max=6)
    kept = export_setting(fixed, origin="o", draft=Path("d.gguf"), costs=_costs(0.05))
    assert kept.settings == fixed and kept.lookup_max is None
    given = export_setting(adaptive, origin="o", draft=Path("d.gguf"), costs=_costs(0.05), length_given=True)
    assert given.settings.n_max == 8 and "length given" in given.source


def test_llama_server_chains_ngram_mod_before_the_draft_model_and_the_mtp_layers():
    for strategy, drafter in (("model+suffix", "draft-simple"), ("mtp+ngram", "draft-mtp")):
        out = llama_server(
            DraftSettings(strategy=strategy, n_max=3),
            Path("t.gguf"),
            Path("d.gguf"),
            n_ctx=4096,
            threads=2,
            lookup_max=32,
        )
        argv = out.argv
        assert argv[argv.index("--spec-type") + 1] == f"ngram-mod,{drafter}"
        assert argv[argv.index("--spec-draft-n-max") + 1] == "3"
        assert argv[argv.index("--spec-ngram-mod-n-max") + 1] == "32"
        assert any("ngram-mod" in n for n in out.notes)


def test_tuned_preset_is_found_for_its_pair_and_the_workload_ones_are_not(tmp_path):
    base = get_preset("qwen2.5-coder-1.5b")
    tuned = DraftSettings(strategy="model", n_max=3, p_min=0.6)
    names = ["newcomer-tuned", "newcomer-tuned-code"]
    try:
        save_user_preset(
            replace(
                base,
                name=names[1],
                description="tuned by localspec bench on the code prompts: x",
                draft=tuned,
            )
        )
        assert tuned_preset(base, Path("t.gguf"), None) is None  # one workload's winner is not the pair's
        save_user_preset(
            replace(
                base, name=names[0], description="tuned by localspec bench: model k=3 (1.40x)", draft=tuned
            )
        )
        found = tuned_preset(base, Path("t.gguf"), None)
        assert found is not None and found.name == names[0] and found.draft == tuned
        workload = next(p for p in list_presets() if p.name == names[1])
        assert tuned_preset(workload, Path("t.gguf"), None) == workload  # exported itself: its own
        result = CliRunner().invoke(main, ["export", "qwen2.5-coder-1.5b", "--to", "llama-server"])
        assert result.exit_code == 0, result.output
        assert "--spec-draft-n-max 3 " in result.stdout and "--spec-draft-p-min 0.6" in result.stdout
        assert "setting: measured best by `localspec bench --tune`" in result.stderr
        assert f"preset {names[0]}" in result.stderr
    finally:
        for name in names:
            user_preset_path(name).unlink(missing_ok=True)


def test_export_of_the_embedded_pair_on_auto_reads_this_machines_kept_costs():
    key = pair_costs_key(EMBEDDED_TARGET, EMBEDDED_DRAFT, 2)
    costs = replace(_costs(0.05), key=key)
    path = write_costs(costs)
    try:
        args = [
            "export",
            str(EMBEDDED_TARGET),
            "-d",
            str(EMBEDDED_DRAFT),
            "--strategy",
            "auto",
            "--threads",
            "2",
        ]
        result = CliRunner().invoke(main, [*args, "--to", "llama-server", "--json"])
        assert result.exit_code == 0, result.output
        body = json.loads(result.stdout)
        setting = body["setting"]
        assert setting["strategy"] == "model+suffix" and setting["n_max"] <= ROUTED_MODEL_N_MAX
        assert "costs 0.05 of a target token" in setting["source"]
        cmd = body["command"]
        assert cmd[cmd.index("--spec-draft-n-max") + 1] == str(setting["n_max"])
    finally:
        path.unlink()


@pytest.mark.parametrize("engine", ["llama-server", "vllm"])
def test_no_shipped_preset_exports_the_lookup_cap_as_a_draft_length(engine):
    """No costs are kept in the test's home and no model is downloaded: each preset says which setting it
    carries, and no model drafter drafts the suffix cache's cap."""
    for preset in (p for p in list_presets() if p.source == "builtin"):
        result = CliRunner().invoke(main, ["export", preset.name, "--to", engine, "--json"])
        assert result.exit_code == 0, (preset.name, result.output)
        body = json.loads(result.stdout)
        assert body["setting"]["source"] and body["setting"]["strategy"] != "auto", preset.name
        if engine == "llama-server" and "--spec-draft-n-max" in body["command"]:
            k = int(body["command"][body["command"].index("--spec-draft-n-max") + 1])
            assert k < LOOKUP_N_MAX, preset.name
        if engine == "vllm" and body["speculative"].get("method") in ("draft_model", "mtp"):
            assert body["speculative"]["num_speculative_tokens"] < LOOKUP_N_MAX, preset.name


def test_vllm_takes_one_method_for_a_chain_and_says_so():
    out = vllm(DraftSettings(strategy="mtp+suffix", n_max=3), Path("t.gguf"), None, n_ctx=4096)
    assert out.speculative == {"method": "mtp", "num_speculative_tokens": 3}
    assert any("one method" in n for n in out.notes)


def test_a_model_strategy_over_a_suffix_presets_cap_does_not_draft_the_cap():
    """`export qwen2.5-coder-1.5b --strategy model+suffix`: the preset's n_max 32 caps its lookups."""
    over = AUTO.with_overrides(strategy="model+suffix")
    out = export_setting(over, origin="o", draft=Path("d.gguf"), costs=None)
    assert out.settings.n_max == DraftSettings().n_max and out.lookup_max == LOOKUP_N_MAX
    assert "not measured yet" in out.source and f"adaptive ceiling {LOOKUP_N_MAX}" in out.source
    predicted = export_setting(over, origin="o", draft=Path("d.gguf"), costs=_costs(0.05))
    assert "should give" in predicted.source


def test_export_md_names_every_flag_the_export_emits_for_each_strategy():
    """export.md's `model` row lacked --spec-draft-threads, which every model export carries."""
    text = (Path(__file__).resolve().parent.parent / "docs" / "export.md").read_text(encoding="utf-8")
    rows = {line.split("|")[1].strip(): line for line in text.splitlines() if line.startswith("| `")}
    for strategy, row in (
        ("model", "`model` (draft length k, n_min, p_min)"),
        ("suffix", "`suffix` (lookups up to L)"),
    ):
        argv = llama_server(
            DraftSettings(strategy=strategy), Path("t.gguf"), Path("d.gguf"), n_ctx=64, threads=2
        ).argv
        spec = argv[argv.index("--spec-type") :]
        missing = [a for a in spec if a.startswith("--") and a not in rows[row]]
        assert not missing, (strategy, missing)
    chained = llama_server(
        DraftSettings(strategy="model+suffix"), Path("t.gguf"), Path("d.gguf"), n_ctx=64, threads=2
    )
    kinds = chained.argv[chained.argv.index("--spec-type") + 1]
    assert f"`--spec-type {kinds}`" in rows["`model+ngram`, `model+suffix`"]


def test_costs_measured_on_a_busy_machine_are_said_so():
    busy = replace(_costs(0.05), details={"steady": False})
    out = export_setting(AUTO, origin="o", draft=Path("d.gguf"), costs=busy)
    assert "on a busy machine" in out.source and "cache clear --costs" in out.source
