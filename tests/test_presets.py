"""Preset files: the built-in set, validation messages, user presets overriding built-in ones."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from localspec import constants
from localspec.errors import PresetError
from localspec.hub.presets import (
    MAX_VERIFIED,
    check_revision,
    dump_toml,
    get_preset,
    list_presets,
    load_file,
    load_presets,
    parse_size,
    preset_problems,
    save_user_preset,
)
from localspec.settings import DraftSettings


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
        "qwen3.5",
        "qwen3.6",
        "gemma4",
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
        assert 0 < p.draft.p_min < 1
        # the suffix cache sizes its own drafts (n_max only bounds one pass); a model's draft stays short
        assert 1 <= p.draft.n_max <= (32 if p.draft.uses_suffix else 16), p.name
    assert coder.draft.strategy.name == "auto"  # coding repeats itself: the suffix cache, the model where it
    # pays
    assert presets["qwen3.5-9b"].draft_model.repo_id == "ggml-org/Qwen3.5-0.8B-GGUF"
    assert presets["gemma-4-31b"].draft_model.repo_id == "unsloth/gemma-4-E2B-it-GGUF"


#: The families added in 2026: each of their built-in presets says what was verified about its files.
FAMILIES_2026 = {"qwen3.5", "qwen3.6", "gemma4"}


def test_builtin_presets_of_2026_families_say_what_was_verified():
    new = [p for p in list_presets() if p.family in FAMILIES_2026]
    assert {p.family for p in new} == FAMILIES_2026
    for p in new:
        assert p.source == "builtin" and p.needs_download, p.name
        assert 0 < len(p.verified) <= MAX_VERIFIED, p.name
        assert "2026" in p.verified, p.name  # when the names were seen
        # a draft's vocabulary is checked when the pair downloads; an MTP file's layers when it loads
        assert ("on download" if p.draft_model else "on load") in p.verified, p.name
        assert p.licence and p.download_bytes > 1_000_000_000 and p.ram_bytes > p.download_bytes, p.name
        assert p.as_dict()["verified"] == p.verified  # `localspec presets --json` shows it
    older = [p for p in list_presets() if p.family not in FAMILIES_2026]
    assert older and all(p.verified == "" for p in older)  # optional: the older files do not set it


def test_mtp_presets_have_no_draft_model_and_draft_with_the_target_layers():
    mtp = [p for p in list_presets() if p.family == "qwen3.6"]
    assert {p.name for p in mtp} >= {"qwen3.6-27b-mtp", "qwen3.6-35b-a3b-mtp"}
    for p in mtp:
        assert p.draft_model is None and p.draft.uses_mtp and not p.draft.uses_model, p.name
        assert p.target.kind == "hub" and "-MTP-GGUF" in p.target.repo_id, p.name


@pytest.mark.parametrize("strategy", ["mtp", "mtp+ngram", "mtp+suffix"])
def test_a_preset_without_a_draft_model_parses_with_an_mtp_strategy(tmp_path, strategy):
    path = tmp_path / "mtp.toml"
    path.write_text(
        '[[preset]]\nname = "m"\ntarget = { repo = "org/X-MTP-GGUF", file = "X-*Q4_K_M.gguf" }\n'
        'verified = "seen in two places"\n'
        f'[preset.draft]\nstrategy = "{strategy}"\nn_max = 3\nadaptive = true\n'
    )
    (p,) = load_file(path, source="user")
    assert p.draft_model is None and p.draft.strategy.name == strategy and p.draft.uses_mtp
    assert p.verified == "seen in two places" and p.target.is_pattern


def test_verified_notes_round_trip_and_are_bounded(user_config, tmp_path):
    base = get_preset("qwen3.6-27b-mtp")
    save_user_preset(base, "mine-mtp")
    again = get_preset("mine-mtp")
    assert again.verified == base.verified and again.draft == base.draft and again.draft_model is None
    for value, message in (("x" * (MAX_VERIFIED + 1), "characters long"), ("true", None), (1, "must be str")):
        path = tmp_path / "v.toml"
        literal = f'"{value}"' if isinstance(value, str) else str(value)
        path.write_text(f'[[preset]]\nname = "v"\ntarget = {{ path = "/t.gguf" }}\nverified = {literal}\n')
        if message is None:
            assert load_file(path, source="user")[0].verified == value
            continue
        with pytest.raises(PresetError, match=message) as info:
            load_file(path, source="user")
        assert "[preset v]" in str(info.value) and info.value.hint


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
        (
            '[[preset]]\nname = "x"\ntarget = { path = "m.gguf" }\n[preset.draft]\nn_max = 0\n',
            ".draft.n_max: n_max 0 is out of range",
        ),
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
        (
            '[[preset]]\nname = "x"\ntarget = { embedded = "../../../etc/x.gguf" }\n',
            "is not the name of a file shipped with localspec",
        ),
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


def test_duplicate_names_in_one_folder_are_reported_and_the_second_one_skipped(user_config):
    user_config.mkdir(parents=True)
    (user_config / "a.toml").write_text('[[preset]]\nname = "twin"\ntarget = { path = "/t.gguf" }\n')
    (user_config / "b.toml").write_text(
        '[[preset]]\nname = "twin"\ntarget = { path = "/u.gguf" }\n'
        '[[preset]]\nname = "other"\ntarget = { path = "/v.gguf" }\n'
    )
    presets = list_presets()
    twins = [p for p in presets if p.name == "twin"]
    assert [p.source for p in twins] == [str(user_config / "a.toml")]
    assert "other" in {p.name for p in presets}  # the file's other preset still loads
    (problem,) = preset_problems()
    twin = f"{user_config / 'b.toml'} [preset twin]: the name is also used in {user_config / 'a.toml'}"
    assert twin in str(problem)
    assert problem.path == str(user_config / "b.toml") and problem.preset == "twin"


def test_one_bad_preset_leaves_the_rest_of_its_file_loaded(user_config):
    user_config.mkdir(parents=True)
    (user_config / "mine.toml").write_text(
        '[[preset]]\nname = "first"\ntarget = { path = "/a.gguf" }\n'
        '[[preset]]\nname = "huge"\ntarget = { path = "/b.gguf" }\nn_ctx = 999999999\n'
        '[[preset]]\ntarget = { path = "/c.gguf" }\n'
        '[[preset]]\nname = "last"\ntarget = { path = "/d.gguf" }\n'
    )
    presets, problems = load_presets()
    names = {p.name for p in presets}
    assert {"first", "last", "tiny-embedded"} <= names and "huge" not in names
    assert [(p.preset, p.path) for p in problems] == [
        ("huge", str(user_config / "mine.toml")),
        (None, str(user_config / "mine.toml")),  # no name to report it under: "#3" in the message
    ]
    assert "[preset huge].n_ctx: 999999999 is out of range" in problems[0].message
    assert "[preset #3]: missing key 'name'" in problems[1].message
    # asking for the skipped one says why it is not there, not "no preset named"
    why = r"preset 'huge' was skipped: .*n_ctx: 999999999 is out of range"
    with pytest.raises(PresetError, match=why) as e:
        get_preset("huge")
    assert "trained context" in (e.value.hint or "")
    assert get_preset("last").target.path == Path("/d.gguf")
    with pytest.raises(PresetError, match="no preset named 'nope'"):
        get_preset("nope")


GOOD = '[[preset]]\nname = "good"\ntarget = { path = "/t.gguf" }\n'


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (GOOD.replace("good", "inf") + "download_size = inf\n", "download_size: inf is not a size"),
        (GOOD.replace("good", "nan") + "ram = nan\n", "ram: nan is not a size"),
        (GOOD.replace("good", "big") + "download_size = " + "9" * 300 + "\n", "is not a size from 0 to 1 PB"),
        (GOOD.replace("good", "ctx") + "n_ctx = " + "9" * 300 + "\n", "key 'n_ctx' holds a 300-digit number"),
        (GOOD.replace("good", "latin").encode("utf-8") + b'description = "caf\xe9"\n', "not UTF-8 text"),
        ("x = " + "[" * 5000 + "]" * 5000 + "\n", "nested too deeply"),
        (
            GOOD.replace("good", "rev").replace('{ path = "/t.gguf" }', '{ repo = "a/b", file = "m.gguf" }'),
            None,
        ),
        (
            '[[preset]]\nname = "esc"\ntarget = { repo = "a/b", file = "m.gguf", revision = "../../../x" }\n',
            "target.revision: revision '../../../x' is not a branch, tag or commit name",
        ),
    ],
)
def test_a_broken_user_file_is_reported_by_name_and_the_rest_keep_working(user_config, body, message):
    user_config.mkdir(parents=True)
    (user_config / "fine.toml").write_text(GOOD)
    bad = user_config / "broken.toml"
    bad.write_bytes(body if isinstance(body, bytes) else body.encode())
    presets, problems = load_presets()
    names = {p.name for p in presets}
    assert "good" in names and "tiny-embedded" in names  # the other user file and the built-in ones
    if message is None:  # control case: the same file without the fault loads
        assert problems == [] and "rev" in names
        return
    (problem,) = problems
    assert isinstance(problem, PresetError) and str(problem).startswith(str(bad)), str(problem)
    assert message in str(problem) and problem.hint
    assert problem.path == str(bad)  # the file it is in, for `localspec presets` to name
    assert preset_problems()[0].message == problem.message
    if problem.preset is None:  # the whole file was skipped: an unknown name points at it
        with pytest.raises(PresetError, match="1 preset file"):
            get_preset("not-there")
    else:  # only that preset was: asking for it says why
        with pytest.raises(PresetError, match=f"preset '{problem.preset}' was skipped"):
            get_preset(problem.preset)


@pytest.mark.parametrize(
    "revision",
    ["../x", "/etc", "a/../b", "a\\b", "a//b", "main/", ".hidden", "x\ny", "a.lock", "", "x" * 300],
)
def test_unsafe_revisions_are_refused_at_parse_time(tmp_path, revision):
    body = dump_toml(
        {"preset": [{"name": "r", "target": {"repo": "a/b", "file": "m.gguf", "revision": revision}}]}
    )
    path = tmp_path / "r.toml"
    path.write_text(body)
    with pytest.raises(PresetError, match=r"revision") as info:
        load_file(path, source="user")
    assert str(path) in str(info.value) and "40-hex commit" in info.value.hint


@pytest.mark.parametrize("revision", ["main", "v1.0", "refs/pr/1", "release_2024-01", "a" * 40 + "0" * 0])
def test_ordinary_revisions_pass(revision):
    assert check_revision(revision, where="x") == revision


def test_an_mtp_preset_runs_and_exports_without_a_draft_model(user_config, tmp_path):
    """A preset with no draft model and an MTP strategy loads the target's MTP layers (a tiny qwen35 file
    with an MTP block stands in for a Qwen3.6 one) and exports as llama-server's draft-mtp."""
    from _mtp_model import mtp_model
    from click.testing import CliRunner

    from localspec.cli import main

    target = mtp_model(tmp_path, "random")
    save_user_preset(
        {"name": "tiny-mtp", "target": {"path": str(target)}, "draft": {"strategy": "mtp", "n_max": 3}}
    )
    runner = CliRunner()
    res = runner.invoke(main, ["run", "--preset", "tiny-mtp", "-n", "8", "--threads", "2", "hello"])
    assert res.exit_code == 0, res.output
    assert "mtp" in res.output and "draft memory +" in res.output  # the MTP layers load as the drafter
    res = runner.invoke(main, ["export", "tiny-mtp", "--to", "llama-server"])
    assert res.exit_code == 0, res.output
    assert "--spec-type draft-mtp" in res.stdout and "--model-draft" not in res.stdout
