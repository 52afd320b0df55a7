"""Preset files: the built-in set, validation messages, user presets overriding built-in ones."""

from __future__ import annotations

from dataclasses import replace

import pytest

from localspec import constants
from localspec.errors import PresetError
from localspec.presets import DraftSettings, get_preset, list_presets, load_file, parse_size, save_user_preset


@pytest.fixture(autouse=True)
def user_config(tmp_path, monkeypatch):
    monkeypatch.setenv("LOCALSPEC_CONFIG", str(tmp_path / "config"))
    return tmp_path / "config" / "presets"


def test_builtin_presets_cover_the_families():
    presets = {p.name: p for p in list_presets()}
    families = {p.family for p in presets.values()}
    assert {
        "qwen2.5-coder",
        "qwen2.5",
        "qwen3",
        "llama3",
        "gemma3",
        "smollm2",
        "deepseek-r1-distill-qwen",
        "tiny",
    } <= families
    coder = presets["qwen2.5-coder-1.5b"]
    assert coder.target.repo_id == "Qwen/Qwen2.5-Coder-1.5B-Instruct-GGUF"
    assert coder.draft_model.repo_id == "Qwen/Qwen2.5-Coder-0.5B-Instruct-GGUF"
    assert coder.source == "builtin" and coder.download_bytes > 1_000_000_000
    for size in ("3b", "7b", "14b", "32b"):
        assert presets[f"qwen2.5-coder-{size}"].draft_model == coder.draft_model
    assert presets["gemma-3-4b"].gated and presets["gemma-3-12b"].gated
    assert presets["qwen3-8b"].draft_model.repo_id == "Qwen/Qwen3-0.6B-GGUF"
    assert presets["llama-3.1-8b"].draft_model.repo_id.endswith("Llama-3.2-1B-Instruct-GGUF")
    assert "Qwen2.5-0.5B" in presets["deepseek-r1-distill-qwen-7b"].draft_model.repo_id
    tiny = presets[constants.EMBEDDED_PRESET]
    assert tiny.target.kind == "embedded" and tiny.target.path == constants.EMBEDDED_TARGET
    assert tiny.draft_model.path == constants.EMBEDDED_DRAFT and not tiny.needs_download
    for p in presets.values():  # every Hub file pattern names GGUF files, every draft setting is sane
        for ref in (p.target, p.draft_model):
            assert ref is None or ref.kind != "hub" or ref.filename.lower().endswith(".gguf")
        assert 1 <= p.draft.n_max <= 16 and 0 < p.draft.p_min < 1


def test_unknown_name_suggests_close_matches():
    with pytest.raises(PresetError) as info:
        get_preset("qwen2.5-coder-7")
    assert "qwen2.5-coder-7b" in str(info.value) and "localspec presets" in info.value.hint


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ('[[preset]]\nname = "x"\n', "missing key 'target'"),
        ('[[preset]]\nname = "x"\ntarget = { repo = "a/b", file = "m.bin" }\n', "does not name a .gguf"),
        ('[[preset]]\nname = "x"\ntarget = { repo = "nope", file = "m.gguf" }\n', "not a Hub repository id"),
        ('[[preset]]\nname = "x"\ntarget = { path = "m.gguf" }\n[preset.draft]\nn_max = 0\n', "n_max: 0"),
        (
            '[[preset]]\nname = "x"\ntarget = { path = "m.gguf" }\n[preset.draft]\nstrategy = "magic"\n',
            "strategy",
        ),
        ('[[preset]]\nname = "x"\ntarget = { path = "m.gguf" }\nn_ctx = "big"\n', "key 'n_ctx' must be int"),
        (
            '[[preset]]\nname = "x"\ntarget = { path = "m.gguf" }\nram = "lots"\n',
            ".ram: 'lots' is not a size",
        ),
        ('[[preset]]\nname = "x"\ntarget = { path = "m.gguf" }\ncolour = 1\n', "unknown key(s) colour"),
        ('[[preset]]\nname = "Bad Name"\ntarget = { path = "m.gguf" }\n', "name 'Bad Name'"),
        ("[[preset]\n", "not valid TOML"),
    ],
)
def test_validation_names_the_file_and_the_key(tmp_path, body, message):
    path = tmp_path / "bad.toml"
    path.write_text(body)
    with pytest.raises(PresetError) as info:
        load_file(path, source="user")
    assert str(path) in str(info.value) and message in str(info.value)
    assert info.value.hint


def test_sizes():
    assert parse_size("4.7 GB", where="x") == 4_700_000_000
    assert parse_size("900MiB", where="x") == 900 * 2**20
    assert parse_size(123, where="x") == 123


def test_user_presets_override_builtin_and_round_trip(user_config):
    base = get_preset("qwen2.5-coder-1.5b")
    tuned = replace(
        base, draft=DraftSettings(n_max=3, n_min=1, p_min=0.5, adaptive=True, strategy="model+ngram")
    )
    path = save_user_preset(tuned, "qwen2.5-coder-1.5b")
    assert path == user_config / "qwen2.5-coder-1.5b.toml"
    again = get_preset("qwen2.5-coder-1.5b")
    assert again.draft == tuned.draft and again.target == base.target and again.source == str(path)
    assert sum(p.name == "qwen2.5-coder-1.5b" for p in list_presets()) == 1

    save_user_preset(
        {"name": "mine", "target": {"path": "/models/t.gguf"}, "draft_model": {"path": "d.gguf"}}
    )
    mine = get_preset("mine")
    assert mine.target.kind == "path" and str(mine.draft_model.path) == str(user_config / "d.gguf")
    with pytest.raises(PresetError, match="n_max"):
        save_user_preset({"name": "broken", "target": {"path": "/t.gguf"}, "draft": {"n_max": 999}})
    assert not (user_config / "broken.toml").exists()


def test_duplicate_names_in_one_folder_are_an_error(user_config):
    user_config.mkdir(parents=True)
    for f in ("a.toml", "b.toml"):
        (user_config / f).write_text('[[preset]]\nname = "twin"\ntarget = { path = "/t.gguf" }\n')
    with pytest.raises(PresetError, match="also defined in"):
        list_presets()
