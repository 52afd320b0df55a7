"""``localspec presets``, ``download`` and ``find-draft`` end to end against the local Hub."""

from __future__ import annotations

import json

import pytest
from _hub_server import FakeHub, make_gguf, ordinary_tokens
from click.testing import CliRunner

from localspec.cli import main
from localspec.presets import save_user_preset

VOCAB = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"] + ordinary_tokens(300)


@pytest.fixture
def env(tmp_path, monkeypatch):
    server = FakeHub(tmp_path / "served").start()
    monkeypatch.setenv("HF_ENDPOINT", server.endpoint)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("LOCALSPEC_CONFIG", str(tmp_path / "config"))
    for var in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_TOKEN", "HF_HUB_OFFLINE"):
        monkeypatch.delenv(var, raising=False)
    t = make_gguf(tmp_path / "t.gguf", VOCAB, control={0, 1, 2}, tensor_bytes=1 << 20)
    d = make_gguf(tmp_path / "d.gguf", VOCAB, control={0, 1, 2}, tensor_bytes=256 << 10)
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
    assert lines[0].split() == ["NAME", "TARGET", "DRAFT", "DOWNLOAD", "RAM", "CACHED", "LICENCE", "SOURCE"]
    line = next(ln for ln in lines if ln.startswith("toy "))
    assert "org/Toy-7B-GGUF" in line and "org/Toy-0.5B-GGUF" in line and " no " in line and "user" in line
    assert "Toy Licence 1.0" in line
    # a long licence is cut at its end, keeping the licence's name
    line = next(ln for ln in lines if ln.startswith("llama-3.1-8b "))
    assert "Llama 3.1 Community License…" in line
    assert any(ln.startswith("qwen2.5-coder-1.5b ") for ln in res.output.splitlines())

    res = runner.invoke(main, ["presets", "--json"])
    rows = {r["name"]: r for r in json.loads(res.output)}
    assert rows["toy"]["source"].endswith("toy.toml") and rows["toy"]["cached"] is False
    assert rows["qwen2.5-coder-1.5b"]["source"] == "builtin"
    assert rows["toy"]["target"] == {"repo": "org/Toy-7B-GGUF", "file": "*q4_k_m.gguf"}


def test_download_then_cached(env):
    runner = CliRunner()
    res = runner.invoke(main, ["download", "toy"])
    assert res.exit_code == 0, res.output
    assert "pair    identical" in res.output
    assert 'Run it: localspec run --preset toy "..."' in res.output
    target_line = next(ln for ln in res.output.splitlines() if ln.startswith("target  /"))
    assert target_line.endswith("toy-7b-q4_k_m.gguf")
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
