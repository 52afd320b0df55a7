"""``localspec presets``, ``download`` and ``find-draft`` end to end against the local Hub."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from _gguf_build import ordinary_tokens, vocab_model
from _hub_server import FakeHub
from click.testing import CliRunner

from localspec.cli import main
from localspec.hub.presets import save_user_preset

VOCAB = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"] + ordinary_tokens(300)


@pytest.fixture
def env(tmp_path, monkeypatch):
    server = FakeHub(tmp_path / "served").start()
    monkeypatch.setenv("HF_ENDPOINT", server.endpoint)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("LOCALSPEC_CONFIG", str(tmp_path / "config"))
    for var in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_TOKEN", "HF_HUB_OFFLINE"):
        monkeypatch.delenv(var, raising=False)
    t = vocab_model(tmp_path / "t.gguf", VOCAB, control={0, 1, 2}, tensor_bytes=1 << 20)
    d = vocab_model(tmp_path / "d.gguf", VOCAB, control={0, 1, 2}, tensor_bytes=256 << 10)
    server.add_repo("org/Toy-7B-GGUF", {"toy-7b-q4_k_m.gguf": t})
    server.add_repo("org/Toy-0.5B-GGUF", {"toy-0.5b-q4_k_m.gguf": d})
    save_user_preset(
        {
            "name": "toy",
            "target": {"repo": "org/Toy-7B-GGUF", "file": "*q4_k_m.gguf"},
            "draft_model": {"repo": "org/Toy-0.5B-GGUF", "file": "*q4_k_m.gguf"},
            "download_size": "1.3 MB",
            "ram": "2 MB",
            "licence": "Toy Licence 1.0",
        }
    )
    yield server
    server.stop()


def test_presets_table_and_json(env):
    runner = CliRunner()
    res = runner.invoke(main, ["presets"])
    assert res.exit_code == 0, res.output
    lines = res.output.splitlines()
    assert lines[0].split() == [
        "NAME", "TARGET", "DRAFT", "DRAFTING", "DOWNLOAD", "RAM", "CACHED", "LICENCE", "SOURCE"
    ]  # fmt: skip
    drafting = {ln.split()[0]: ln for ln in lines[1:] if ln.strip()}
    assert "  auto  " in drafting["qwen2.5-coder-1.5b"]  # how each preset drafts, from its [draft] table
    assert "  model, k=4  " in drafting["tiny-embedded"]
    assert "  model+ngram, adaptive  " in drafting["llama-3.1-8b"]
    line = next(ln for ln in lines if ln.startswith("toy "))
    assert "org/Toy-7B-GGUF" in line and "org/Toy-0.5B-GGUF" in line and " no " in line and "user" in line
    assert "Toy Licence 1.0" in line
    # a long licence is cut at its end, keeping the licence's name
    line = next(ln for ln in lines if ln.startswith("llama-3.1-8b "))
    assert "Llama 3.1 Community License…" in line
    assert any(ln.startswith("qwen2.5-coder-1.5b ") for ln in res.output.splitlines())
    # the presets that say how their files were verified are counted under the table; --json has the notes
    assert any("were verified: `localspec presets --json` (field verified)" in ln for ln in lines)

    res = runner.invoke(main, ["presets", "--json"])
    rows = {r["name"]: r for r in json.loads(res.output)}
    assert rows["toy"]["source"].endswith("toy.toml") and rows["toy"]["cached"] is False
    assert rows["qwen2.5-coder-1.5b"]["source"] == "builtin"
    assert rows["toy"]["target"] == {"repo": "org/Toy-7B-GGUF", "file": "*q4_k_m.gguf"}
    assert rows["toy"]["verified"] == "" and "on download" in rows["qwen3.5-9b"]["verified"]
    assert rows["qwen3.6-27b-mtp"]["draft_model"] is None
    assert rows["qwen2.5-coder-1.5b"]["draft"]["strategy"] == "auto"  # the strategy by its name


def test_download_then_cached(env):
    runner = CliRunner()
    res = runner.invoke(main, ["download", "toy"])
    assert res.exit_code == 0, res.output
    assert "pair    identical" in res.output
    assert 'Run it: localspec run --preset toy "..."' in res.output
    target_line = next(ln for ln in res.output.splitlines() if ln.startswith("target  /"))
    assert target_line.endswith("toy-7b-q4_k_m.gguf")
    from localspec.hub.recent import last_preset

    assert last_preset() == "toy"  # what `localspec ui` opens on next
    res = runner.invoke(main, ["presets", "--json"])
    assert {r["name"]: r for r in json.loads(res.output)}["toy"]["cached"] is True


def test_download_errors_exit_1_with_the_next_step(env):
    res = CliRunner().invoke(main, ["download", "toyy"])
    assert res.exit_code == 1 and "did you mean: toy" in res.output


def test_find_draft(env):
    res = CliRunner().invoke(main, ["find-draft", "org/Toy-7B-GGUF", "--json"])
    assert res.exit_code == 0, res.output
    found = json.loads(res.output)
    assert [c["repo_id"] for c in found] == ["org/Toy-0.5B-GGUF"] and found[0]["verdict"] == "identical"
    res = CliRunner().invoke(main, ["find-draft", "org/Toy-7B-GGUF"])
    assert "identical  org/Toy-0.5B-GGUF" in res.output


def test_presets_names_the_files_it_skipped(env, tmp_path):
    folder = tmp_path / "config" / "presets"
    (folder / "bad.toml").write_text('[[preset]]\nname = "bad"\nn_ctx = inf\n', encoding="utf-8")
    (folder / "broken.toml").write_text("[[preset\nname =", encoding="utf-8")
    runner = CliRunner()
    res = runner.invoke(main, ["presets"])
    assert res.exit_code == 0, res.output  # the others are listed as usual
    assert any(ln.startswith("toy ") for ln in res.stdout.splitlines())
    skipped = [ln for ln in res.stderr.splitlines() if ln.startswith("skipped: ")]
    assert len(skipped) == 2, res.stderr  # one line per file, with what is wrong and the fix
    assert f"{folder / 'bad.toml'} [preset bad]: missing key 'target' -> add `target = ...`" in skipped[0]
    assert str(folder / "broken.toml") in skipped[1] and "not valid TOML" in skipped[1]
    assert "skipped" not in res.stdout  # the table on stdout is unchanged

    res = runner.invoke(main, ["presets", "--json"])
    assert res.exit_code == 0 and "toy" in {p["name"] for p in json.loads(res.stdout)}
    assert [ln for ln in res.stderr.splitlines() if ln.startswith("skipped: ")] == skipped

    # the error for an unknown preset sends the user here; the files it names are the ones listed above
    res = runner.invoke(main, ["download", "nope"])
    assert res.exit_code == 1 and "localspec presets" in res.output and "broken.toml" in res.output
    # a preset that is there but does not load says so, and what to fix
    res = runner.invoke(main, ["download", "bad"])
    assert res.exit_code == 1 and "preset 'bad' was skipped" in res.output and "bad.toml" in res.output
    assert "add `target = ...`" in res.output


@pytest.mark.parametrize("how", ["env", "huggingface_hub"])
def test_find_draft_offline_says_it_needs_the_hub(env, monkeypatch, how):
    if how == "env":
        monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    else:  # huggingface_hub's own offline switch (it also follows TRANSFORMERS_OFFLINE), read per request
        import huggingface_hub.constants

        monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")
        monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    variable = "HF_HUB_OFFLINE" if how == "env" else "TRANSFORMERS_OFFLINE"
    before = len(env.log)
    res = CliRunner().invoke(main, ["find-draft", "org/Toy-7B-GGUF"])
    assert res.exit_code == 1, res.output
    assert "find-draft searches the Hub" in res.output and f"{variable} is set" in res.output
    assert f"unset {variable}" in res.output and "localspec pair TARGET" in res.output
    assert "HF_HUB_OFFLINE=1" not in res.output  # the old advice, to set what is set already
    assert len(env.log) == before  # nothing was asked of the Hub


def test_export_never_downloads_and_says_what_it_could_not_read(env):
    """`export PRESET` downloaded the preset's models (47.9 GB for a 72B) just to print a command line."""
    runner = CliRunner()
    res = runner.invoke(main, ["export", "toy", "--to", "llama-server"])
    assert res.exit_code == 0, res.output
    assert env.log == []  # not one request to the Hub
    assert res.stdout.startswith("llama-server --model 'org/Toy-7B-GGUF/*q4_k_m.gguf' ")
    assert "--model-draft 'org/Toy-0.5B-GGUF/*q4_k_m.gguf'" in res.stdout
    notes = [line for line in res.stderr.splitlines() if "not downloaded" in line]
    assert len(notes) == 2 and all("localspec download toy" in n for n in notes)
    assert runner.invoke(main, ["download", "toy"]).exit_code == 0
    served = len(env.log)
    res = runner.invoke(main, ["export", "toy", "--to", "vllm", "--json"])
    assert res.exit_code == 0 and len(env.log) == served  # the cached files, read without the Hub
    body = json.loads(res.stdout)
    assert body["command"][2].endswith("toy-7b-q4_k_m.gguf") and Path(body["command"][2]).is_file()
    assert not [n for n in body["notes"] if "not downloaded" in n]
