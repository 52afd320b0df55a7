"""Scanning folders (HF cache, Ollama blobs, broken files), the fingerprint cache, and draft ranking."""

from __future__ import annotations

import os
import shutil

import pytest
from _gguf_build import synthetic_tokens, tiny_model, vocab_path, write_gguf

from localspec.gguf import scan as scanmod
from localspec.gguf.scan import find_drafts, inspect, rank_drafts, scan


@pytest.fixture(autouse=True)
def _home(tmp_path, monkeypatch):
    monkeypatch.setenv("LOCALSPEC_HOME", str(tmp_path / "home"))


def _hf_cache(root, blob_src):
    """models--org--repo/{blobs/<hash>, snapshots/<rev>/file.gguf -> ../../blobs/<hash>} twice over."""
    repo = root / "models--org--repo"
    (repo / "blobs").mkdir(parents=True)
    shutil.copy(blob_src, repo / "blobs" / "0123abcd")
    for rev in ("rev1", "rev2"):
        snap = repo / "snapshots" / rev
        snap.mkdir(parents=True)
        os.symlink("../../blobs/0123abcd", snap / "model-q4.gguf")
    return repo


def test_scan_layouts_dedupe_and_errors(tmp_path):
    root = tmp_path / "models"
    root.mkdir()
    shutil.copy(vocab_path("qwen2"), root / "qwen2.gguf")
    (root / "broken.gguf").write_bytes(b"GGUF\x03\x00\x00\x00" + b"\xff" * 30)  # truncated, absurd counts
    (root / "notes.txt").write_text("not a model")
    _hf_cache(root / "hub", vocab_path("gpt-2"))
    blobs = root / "ollama" / "blobs"
    blobs.mkdir(parents=True)
    shutil.copy(vocab_path("llama-spm"), blobs / "sha256-aaaa")  # a GGUF without extension
    (blobs / "sha256-bbbb").write_text('{"template": "..."}')  # an Ollama manifest/template blob

    models = scan([root])
    names = sorted(os.path.basename(m.path) for m in models)
    assert names == ["broken.gguf", "model-q4.gguf", "qwen2.gguf", "sha256-aaaa"]  # HF blob counted once
    by = {os.path.basename(m.path): m for m in models}
    assert by["broken.gguf"].error and "broken.gguf" in by["broken.gguf"].error
    assert by["qwen2.gguf"].error is None and by["qwen2.gguf"].n_vocab == 151936
    assert by["qwen2.gguf"].fingerprint_short == "cfa5dd10e5f2"
    assert by["sha256-aaaa"].architecture == "llama" and by["sha256-aaaa"].vocab_model == "llama"
    assert not by["qwen2.gguf"].usable and "vocab-only" in by["qwen2.gguf"].unusable_reason


def test_cache_is_keyed_by_size_and_mtime(tmp_path):
    d = tmp_path / "m"
    d.mkdir()
    p = tiny_model(d / "a.gguf", synthetic_tokens(50), name="first")
    assert [m.name for m in scan([d])] == ["first"]
    assert scanmod.cache_path().is_file()
    st = p.stat()
    # same size and mtime, different content: the cache answers without reading the file
    tiny_model(p, synthetic_tokens(50), name="other")
    assert p.stat().st_size == st.st_size
    os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert [m.name for m in scan([d])] == ["first"]
    assert [m.name for m in scan([d], use_cache=False)] == ["other"]
    os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))  # touched: read again
    assert [m.name for m in scan([d])] == ["other"]
    # a cache file that is garbage is ignored, not fatal
    scanmod.cache_path().write_text("{not json")
    assert [m.name for m in scan([d])] == ["other"]


def test_default_folders_from_environment(tmp_path, monkeypatch):
    extra = tmp_path / "mine"
    extra.mkdir()
    shutil.copy(vocab_path("mpt"), extra / "mpt.gguf")
    hub = tmp_path / "hf" / "hub"
    _hf_cache(hub, vocab_path("gpt-neox"))
    monkeypatch.setenv("LOCALSPEC_MODELS", str(extra))
    monkeypatch.setenv("HF_HUB_CACHE", str(hub))
    monkeypatch.setenv("HOME", str(tmp_path / "home-dir"))  # no LM Studio / Ollama folders there
    monkeypatch.delenv("OLLAMA_MODELS", raising=False)
    found = {os.path.basename(m.path): m.fingerprint_short for m in scan()}
    assert found == {"mpt.gguf": "2713180abf08", "model-q4.gguf": "2713180abf08"}  # same NeoX vocabulary


@pytest.fixture
def zoo(tmp_path):
    """A target and candidate drafts: params = 2 * n_vocab * n_embd (embedding + output)."""
    d = tmp_path / "zoo"
    d.mkdir()
    toks = synthetic_tokens(300)
    tiny_model(d / "target.gguf", toks, n_embd=40, basename="Fam", name="Fam 24K")  # 24,000 params
    tiny_model(d / "a_same_family_10x.gguf", toks, n_embd=4, basename="Fam")  # 2,400: 10x, sweet spot
    tiny_model(d / "b_other_family_10x.gguf", toks, n_embd=4, basename="Other")
    tiny_model(d / "c_same_family_2x.gguf", toks, n_embd=20, basename="Fam")  # 2x: too close in size
    tiny_model(d / "d_compatible_10x.gguf", toks + ["extra1", "extra2"], n_embd=4, basename="Fam")
    tiny_model(d / "e_other_vocab.gguf", synthetic_tokens(300, "w"), n_embd=4, basename="Fam")
    tiny_model(d / "f_bigger.gguf", toks, n_embd=80, basename="Fam")
    write_gguf(d / "g_vocab_only.gguf", tokens=toks)
    (d / "h_broken.gguf").write_bytes(b"GGUF")
    return d


def test_rank_drafts_order_and_reasons(zoo):
    target = inspect(zoo / "target.gguf")
    assert target.n_params == 24000 and target.family == "fam" and target.usable
    ranked = rank_drafts(target, scan([zoo]))
    fits = [os.path.basename(r.model.path) for r in ranked if r.fits]
    assert fits == [
        "a_same_family_10x.gguf",
        "c_same_family_2x.gguf",
        "b_other_family_10x.gguf",
        "d_compatible_10x.gguf",
    ]
    why = {os.path.basename(r.model.path): r.why for r in ranked}
    assert "identical vocabulary" in why["a_same_family_10x.gguf"]
    assert "10.0x smaller (in the 5-20x sweet spot)" in why["a_same_family_10x.gguf"]
    assert "too close in size" in why["c_same_family_2x.gguf"]
    assert "different family" in why["b_other_family_10x.gguf"]
    assert "compatible vocabulary" in why["d_compatible_10x.gguf"]
    assert "does not fit" in why["e_other_vocab.gguf"]
    assert "not smaller" in why["f_bigger.gguf"]
    assert "vocab-only" in why["g_vocab_only.gguf"]
    assert "unreadable" in why["h_broken.gguf"]
    assert "target.gguf" not in why
    assert [r.fits for r in ranked] == [True] * 4 + [False] * 4


def test_find_drafts_defaults_to_the_targets_folder(zoo, monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path / "nohome"))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "nohub"))
    monkeypatch.delenv("LOCALSPEC_MODELS", raising=False)
    monkeypatch.delenv("OLLAMA_MODELS", raising=False)
    best = find_drafts(zoo / "target.gguf")[0]
    assert best.fits and best.model.path.endswith("a_same_family_10x.gguf")
    assert best.verdict.verdict == "identical"


def test_inspect_keeps_vocab_and_reports_bad_files(tmp_path):
    info = inspect(vocab_path("phi-3"))
    assert info.vocab is not None and info.vocab.n_vocab == 32064 and info.quant == "F16"
    assert "tokens" not in info.as_dict() and "vocab" not in info.as_dict()
    bad = inspect(tmp_path / "missing.gguf")
    assert bad.error and not bad.usable


# -- hostile folders and caches -------------------------------------------------------------------------
def _no_hang(fn, seconds: float = 20.0):
    """Run ``fn`` in a thread; fail (instead of hanging the suite) if it does not return in time."""
    import threading

    box: dict = {}

    def run():
        try:
            box["value"] = fn()
        except BaseException as exc:  # handed to the test below
            box["error"] = exc

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(seconds)
    assert not t.is_alive(), f"{fn} hung"
    if "error" in box:
        raise box["error"]
    return box["value"]


@pytest.fixture
def fifo_blob(tmp_path):
    """A FIFO named like an Ollama blob, beside a real GGUF blob; unblocked afterwards if a reader hangs."""
    blobs = tmp_path / "ollama" / "blobs"
    blobs.mkdir(parents=True)
    shutil.copy(vocab_path("gpt-2"), blobs / ("sha256-" + "1" * 64))
    fifo = blobs / ("sha256-" + "f" * 64)
    os.mkfifo(fifo)
    yield fifo
    try:  # release a reader stuck in open() (the code before the fix), so the thread can end
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
    except OSError:
        pass


def test_a_fifo_named_like_a_blob_does_not_hang_anything(fifo_blob):
    from localspec.errors import GGUFError
    from localspec.gguf.meta import is_gguf_file, read_metadata
    from localspec.gguf.pairing import check_pair

    found = _no_hang(lambda: scan([fifo_blob.parent]))
    assert [os.path.basename(m.path) for m in found] == ["sha256-" + "1" * 64]
    assert _no_hang(lambda: is_gguf_file(fifo_blob)) is False
    info = _no_hang(lambda: inspect(fifo_blob))
    assert f"{fifo_blob}: is a FIFO (named pipe), not a GGUF file" in info.error
    with pytest.raises(GGUFError, match="is a FIFO"):
        _no_hang(lambda: read_metadata(fifo_blob))
    with pytest.raises(GGUFError, match="is a FIFO"):
        _no_hang(lambda: check_pair(fifo_blob, None, label="x"))
    with pytest.raises(GGUFError, match="is a FIFO"):
        _no_hang(lambda: find_drafts(fifo_blob))


def test_a_cached_error_does_not_outlive_its_cause(tmp_path, monkeypatch):
    # as root a chmod cannot deny a read, so the "Permission denied" comes from the reader itself
    from localspec.errors import GGUFError

    root = tmp_path / "m"
    root.mkdir()
    shutil.copy(vocab_path("qwen2"), root / "a.gguf")
    real_read = scanmod.read_metadata

    def denied(path, **kw):
        raise GGUFError(os.fspath(path), "cannot be opened (Permission denied)")

    monkeypatch.setattr(scanmod, "read_metadata", denied)
    (first,) = scan([root])
    assert "Permission denied" in first.error
    monkeypatch.setattr(scanmod, "read_metadata", real_read)  # chmod fixed it: same size, same mtime
    (second,) = scan([root])
    assert second.error is None and second.n_vocab == first_vocab(root / "a.gguf")


def first_vocab(path) -> int:
    return inspect(path).n_vocab


@pytest.mark.parametrize(
    "content",
    [
        "{",
        "[" * 100_000 + "]" * 100_000,
        '{"version": VERSION, "files": []}',
        '{"version": VERSION, "files": {"REAL": "not an entry"}}',
        '{"version": VERSION, "files": {"REAL": {"size": SIZE, "mtime_ns": MTIME, "mode": MODE, '
        '"info": "x"}}}',
        '{"version": VERSION, "files": {"REAL": {"size": SIZE, "mtime_ns": MTIME, "mode": MODE, '
        '"info": {"n": 1}}}}',
        '{"version": VERSION, "files": {"REAL": {"size": SIZE, "mtime_ns": MTIME, "mode": MODE, '
        '"info": {"path": "p", "n_vocab": "many", "usable": "yes"}}}}',
    ],
)
def test_a_malformed_scan_cache_is_discarded(tmp_path, content):
    root = tmp_path / "m"
    root.mkdir()
    shutil.copy(vocab_path("qwen2"), root / "a.gguf")
    real = os.path.realpath(root / "a.gguf")
    st = os.stat(real)
    text = (
        content.replace("REAL", real.replace("\\", "\\\\"))
        .replace("SIZE", str(st.st_size))
        .replace("MTIME", str(st.st_mtime_ns))
        .replace("MODE", str(st.st_mode))
        .replace("VERSION", str(scanmod.CACHE_VERSION))
    )
    scanmod.cache_path().parent.mkdir(parents=True, exist_ok=True)
    scanmod.cache_path().write_text(text)
    (info,) = scan([root])
    assert info.error is None and info.n_vocab == inspect(root / "a.gguf").n_vocab
    assert scan([root])[0].fingerprint == info.fingerprint  # and the cache was rewritten sound
