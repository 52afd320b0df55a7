"""`localspec scan` and `localspec pair`: the JSON contract, exit codes and readable tables."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from _gguf_build import synthetic_tokens, tiny_model, vocab_path
from click.testing import CliRunner

from localspec.cli import main


@pytest.fixture(autouse=True)
def _home(tmp_path, monkeypatch):
    monkeypatch.setenv("LOCALSPEC_HOME", str(tmp_path / "home"))


@pytest.fixture
def folder(tmp_path):
    d = tmp_path / "models"
    d.mkdir()
    for name in ("qwen2", "qwen35", "gpt-2", "llama-spm", "phi-3"):
        os.symlink(vocab_path(name), d / f"{name}.gguf")
    (d / "broken.gguf").write_bytes(b"this is not a gguf file at all")
    return d


def run(*args: str):
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


def test_scan_json_contract(folder):
    res = run("scan", str(folder), "--json")
    assert res.exit_code == 0
    rows = json.loads(res.output)
    by = {Path(r["path"]).name: r for r in rows}
    assert set(by) == {
        "qwen2.gguf",
        "qwen35.gguf",
        "gpt-2.gguf",
        "llama-spm.gguf",
        "phi-3.gguf",
        "broken.gguf",
    }
    for r in rows:
        assert {"path", "architecture", "n_params", "n_vocab", "fingerprint", "error"} <= set(r)
    assert by["broken.gguf"]["error"] and "bad magic" in by["broken.gguf"]["error"]
    assert by["qwen2.gguf"]["error"] is None and by["qwen2.gguf"]["n_vocab"] == 151936
    assert by["qwen2.gguf"]["fingerprint"] == by["qwen35.gguf"]["fingerprint"]
    assert by["qwen2.gguf"]["architecture"] == "qwen2"


def test_scan_table_is_readable(folder):
    res = run("scan", str(folder))
    assert res.exit_code == 0
    lines = res.output.splitlines()
    assert lines[0].split()[:3] == ["FILE", "ARCH", "PARAMS"]
    assert all(len(line) <= 110 for line in lines if not line.startswith("  ERROR"))
    assert any(line.startswith("qwen2  ") and "cfa5dd10e5f2" in line for line in lines)  # no .gguf
    assert any("ERROR" in line and "broken.gguf" in line and "bad magic" in line for line in lines)


@pytest.mark.parametrize(
    "target, draft, verdict",
    [
        ("qwen2", "qwen35", "identical"),
        ("llama-spm", "phi-3", "compatible"),
        ("gpt-2", "qwen2", "incompatible"),
    ],
)
def test_pair_two_json(target, draft, verdict):
    res = run("pair", str(vocab_path(target)), str(vocab_path(draft)), "--json")
    assert res.exit_code == (3 if verdict == "incompatible" else 0)  # a script can tell them apart
    out = json.loads(res.output)
    assert out["verdict"] == verdict and isinstance(out["reasons"], list) and out["reasons"]
    assert out["target_usable"] is False and out["draft_usable"] is False  # vocab-only files
    assert out["target"]["usable"] is False and "vocab-only" in out["target"]["unusable_reason"]
    assert out["warnings"] == []  # a vocab-only file's size says nothing about its model's


def test_pair_says_nothing_about_the_sizes_of_vocab_only_files():
    """gpt-2's vocab file is larger than refact's whatever the models: no "arguments swapped?" line."""
    small, big = sorted((vocab_path("gpt-2"), vocab_path("refact")), key=lambda p: p.stat().st_size)
    assert small.stat().st_size < big.stat().st_size
    res = run("pair", str(small), str(big))
    assert "Verdict:" in res.output and "warning" not in res.output


def test_pair_text_explains(tmp_path):
    res = run("pair", str(vocab_path("gpt-2")), str(vocab_path("refact")))
    assert res.exit_code == 3
    assert "Verdict: incompatible" in res.output and "token 19 differs" in res.output


def test_pair_ranking(tmp_path):
    d = tmp_path / "zoo"
    d.mkdir()
    toks = synthetic_tokens(200)
    tiny_model(d / "big.gguf", toks, n_embd=40, basename="Fam")
    tiny_model(d / "small.gguf", toks, n_embd=4, basename="Fam")
    res = run("pair", str(d / "big.gguf"), "--search", str(d), "--search", str(vocab_path("gpt-2")), "--json")
    assert res.exit_code == 0
    out = json.loads(res.output)
    assert [Path(x["path"]).name for x in out["drafts"]] == ["small.gguf"]
    assert out["drafts"][0]["verdict"] == "identical" and "sweet spot" in out["drafts"][0]["why"]
    assert [Path(x["path"]).name for x in out["rejected"]] == ["ggml-vocab-gpt-2.gguf"]
    text = run("pair", str(d / "big.gguf"), "--search", str(d)).output
    assert "Drafts that fit, best first:" in text and "small.gguf" in text

    (d / "small.gguf").unlink()  # nothing left that fits: the ranking as before, and exit status 3
    args = ["pair", str(d / "big.gguf"), "--search", str(d), "--search", str(vocab_path("gpt-2"))]
    res = run(*args)
    assert res.exit_code == 3 and "No draft found that fits this target" in res.output, res.output
    res = run(*args, "--json")
    assert res.exit_code == 3 and json.loads(res.output)["drafts"] == []
    assert [Path(x["path"]).name for x in json.loads(res.output)["rejected"]] == ["ggml-vocab-gpt-2.gguf"]


def test_scan_shows_the_shipped_pairs_file_names_whole(tmp_path):
    """docs/scan-and-pair.md shows the Qwen pair's names whole: the FILE column drops `.gguf`, so they
    fit."""
    d = tmp_path / "m"
    d.mkdir()
    names = ["qwen2.5-coder-0.5b-instruct-q4_k_m", "qwen2.5-coder-1.5b-instruct-q4_k_m"]
    for name in names:
        shutil.copyfile(vocab_path("qwen2"), d / f"{name}.gguf")  # copies: a link to one file is listed once
    os.symlink(vocab_path("gpt-2"), d / "sha256-0123456789abcdef0123456789abcdef")  # an Ollama blob
    lines = run("scan", str(d)).output.splitlines()
    for name in names:
        assert any(ln.startswith(name + "  qwen2 ") for ln in lines), lines
    assert any(ln.startswith("sha256-0123456789abcdef0123456789…  gpt2") for ln in lines), lines
    assert all(len(line) <= 110 for line in lines)


def test_pair_warns_when_the_draft_is_not_smaller(tmp_path):
    """Swapped arguments: the verdict (vocabulary) stays, and a line says the draft is the bigger file."""
    toks = synthetic_tokens(200)
    big = tiny_model(tmp_path / "big.gguf", toks, n_embd=40, basename="Fam")
    small = tiny_model(tmp_path / "small.gguf", toks, n_embd=4, basename="Fam")
    res = run("pair", str(small), str(big))
    assert res.exit_code == 0
    assert "Verdict: identical" in res.output
    warning = res.output.splitlines()[-1]
    assert warning.startswith("warning: the draft (") and "is larger than the target (" in warning
    assert warning.endswith("the arguments may be swapped (TARGET first, then DRAFT)")
    out = json.loads(run("pair", str(small), str(big), "--json").output)
    assert out["verdict"] == "identical" and out["warnings"] == [warning.removeprefix("warning: ")]
    assert "is about as large as the target" in run("pair", str(big), str(big)).output

    res = run("pair", str(big), str(small))  # the right way round: no warning
    assert "Verdict: identical" in res.output and "warning" not in res.output
    assert json.loads(run("pair", str(big), str(small), "--json").output)["warnings"] == []


def test_usage_and_bad_files(tmp_path):
    res = CliRunner().invoke(main, ["pair", str(tmp_path / "nope.gguf")])
    assert (
        res.exit_code == 2 and "Invalid value for 'TARGET'" in res.output and "does not exist" in res.output
    )
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF\x01\x00\x00\x00" + bytes(40))
    res = CliRunner().invoke(main, ["pair", str(bad)])
    assert res.exit_code == 1 and "version 1" in res.output and "cannot read the target" in res.output
    import os

    os.mkfifo(tmp_path / "pipe.gguf")  # named on purpose: "No GGUF models found" told nothing
    res = CliRunner().invoke(main, ["scan", str(tmp_path / "pipe.gguf")])
    assert res.exit_code == 2 and "is not a regular file or a folder" in res.output, res.output


@pytest.mark.parametrize("as_json", [False, True])
def test_pair_with_an_unreadable_draft_fails(tmp_path, as_json):
    """An unreadable DRAFT is an error (exit 1, naming the file and why), not an 'incompatible' verdict."""
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"this is not a gguf file at all")
    res = CliRunner().invoke(
        main, ["pair", str(vocab_path("qwen2")), str(junk), *(["--json"] if as_json else [])]
    )
    assert res.exit_code == 1, res.output
    assert f"Error: {junk}: cannot read the draft: not a GGUF file" in res.output
    assert "Verdict" not in res.output and "verdict" not in res.output


def test_scan_json_is_utf8_with_a_non_utf8_file_name(tmp_path):
    """A file name that is not valid UTF-8 (Linux allows any bytes) still gives valid UTF-8 JSON, and the
    path in it maps back to the file's real bytes."""
    d = tmp_path / "odd"
    d.mkdir()
    raw = os.path.join(os.fsencode(d), b"caf\xe9-\xff.gguf")
    try:
        shutil.copyfile(vocab_path("gpt-2"), raw)
    except OSError as exc:  # macOS (APFS) and Windows refuse such names
        pytest.skip(f"this file system refuses non-UTF-8 names: {exc}")
    res = CliRunner().invoke(main, ["scan", str(d), "--json"])
    assert res.exit_code == 0, (res.output, res.exception)
    rows = json.loads(res.stdout_bytes.decode("utf-8"))  # strict: raises on invalid UTF-8
    assert [os.fsencode(r["path"]) for r in rows] == [raw]
    assert rows[0]["n_vocab"] == 50257
    table = CliRunner().invoke(main, ["scan", str(d)])
    assert table.exit_code == 0, (table.output, table.exception)
    assert "caf\ufffd-\ufffd  " in table.stdout_bytes.decode("utf-8")  # the FILE column drops .gguf


def test_console_script_subprocess(folder, tmp_path):
    exe = shutil.which("localspec", path=os.path.dirname(sys.executable))
    cmd = [exe] if exe else [sys.executable, "-m", "localspec"]
    env = {**os.environ, "LOCALSPEC_HOME": str(tmp_path / "h")}
    proc = subprocess.run(
        [*cmd, "scan", str(folder), "--json"], capture_output=True, text=True, env=env, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    assert len(json.loads(proc.stdout)) == 6


def test_scan_json_names_unreadable_files_like_readable_ones(tmp_path):
    """`name` is the header's general.name, else the file name without .gguf: for a file that does not
    read too (it used to keep its extension there)."""
    (tmp_path / "broken.gguf").write_bytes(b"GGUF\x03\x00\x00\x00" + b"\x00" * 4)
    shutil.copyfile(vocab_path("gpt-2"), tmp_path / "fine.gguf")
    res = CliRunner().invoke(main, ["scan", str(tmp_path), "--json"])
    assert res.exit_code == 0, (res.output, res.exception)
    rows = {os.path.basename(r["path"]): r for r in json.loads(res.stdout)}
    assert rows["broken.gguf"]["error"] and rows["broken.gguf"]["name"] == "broken"
    assert rows["fine.gguf"]["error"] is None and not rows["fine.gguf"]["name"].endswith(".gguf")
