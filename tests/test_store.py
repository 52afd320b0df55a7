"""The persisted suffix cache: round trip, crash safety, corruption, other vocabularies, privacy."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import textwrap
import time
import zlib

import numpy as np
import pytest

from localspec import store as storemod
from localspec.errors import CacheError
from localspec.store import SuffixStore, list_stores, namespace_for_key, store_path
from localspec.suffix import SuffixIndex

FP = "0123456789abcdef" * 4
OTHER = "fedcba9876543210" * 4


def _index(n_requests=20, length=300, seed=0, vocab=1000) -> SuffixIndex:
    rng = np.random.default_rng(seed)
    ix = SuffixIndex()
    for _ in range(n_requests):
        ix.add_request(rng.integers(0, vocab, length).tolist())
    ix.set_corpus([rng.integers(0, vocab, 200).tolist() for _ in range(3)])
    return ix


def _same(a: SuffixIndex, b: SuffixIndex) -> None:
    sa, sb = a.state(), b.state()
    assert sa.keys() == sb.keys()
    for k in sa:
        np.testing.assert_array_equal(sa[k], sb[k])


def test_round_trip_mode_0600_and_lookups(tmp_path):
    ix = _index()
    s = SuffixStore(tmp_path / "c", FP, n_vocab=1000)
    assert s.save(ix)
    assert stat.S_IMODE(os.stat(s.path).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(tmp_path / "c").st_mode) == 0o700
    back = s.load()
    assert s.problem is None
    _same(ix, back)
    seq = ix.history.tokens[:40].tolist()
    back.begin(seq[:20])
    assert [p.tokens for p in back.propose(seq[:20], 8)] == [p.tokens for p in ix.propose(seq[:20], 8)]
    # appending after a load works (the loaded arrays are read-only views) and survives another save
    back.add_request([1, 2, 3, 4, 5])
    assert s.save(back)
    assert s.load().history_requests == ix.history_requests + 1
    assert not list(s.directory.glob("*.tmp")), "no temp file is left behind"


def test_missing_store_is_empty_and_quiet(tmp_path):
    s = SuffixStore(tmp_path, FP)
    ix = s.load()
    assert ix.history_tokens == 0 and s.problem is None


def test_other_vocabulary_is_never_used(tmp_path):
    SuffixStore(tmp_path, FP).save(_index())
    # the same file name for another fingerprint cannot happen (the name carries it), so force it
    other = SuffixStore(tmp_path, FP[:16] + OTHER[16:])
    assert other.path == SuffixStore(tmp_path, FP).path
    ix = other.load()
    assert ix.history_tokens == 0 and "another vocabulary" in (other.problem or "")
    # and a different fingerprint is a different file altogether
    assert SuffixStore(tmp_path, OTHER).load().history_tokens == 0


def test_namespaces_are_separate_files(tmp_path):
    a = SuffixStore(tmp_path, FP, namespace="alice")
    b = SuffixStore(tmp_path, FP, namespace=namespace_for_key("secret-key"))
    assert a.path != b.path and "secret" not in b.path.name
    a.save(_index())
    assert b.load().history_tokens == 0 and b.problem is None
    with pytest.raises(CacheError):
        SuffixStore(tmp_path, FP, namespace="../escape")
    with pytest.raises(CacheError):
        store_path(tmp_path, "not-hex")


@pytest.mark.parametrize(
    "damage",
    ["truncate-half", "truncate-header", "flip-payload", "flip-header", "empty", "garbage", "trailing"],
)
def test_damaged_file_is_reported_in_one_line_and_ignored(tmp_path, damage, caplog):
    s = SuffixStore(tmp_path, FP)
    s.save(_index())
    data = bytearray(s.path.read_bytes())
    if damage == "truncate-half":
        data = data[: len(data) // 2]
    elif damage == "truncate-header":
        data = data[:20]
    elif damage == "flip-payload":
        data[-100] ^= 0x40
    elif damage == "flip-header":
        data[30] ^= 0x01
    elif damage == "empty":
        data = bytearray()
    elif damage == "garbage":
        data = bytearray(os.urandom(5000))
    elif damage == "trailing":
        data += b"x"
    s.path.write_bytes(bytes(data))
    ix = s.load()
    assert ix.history_tokens == 0
    assert s.problem and "\n" not in s.problem and str(s.path) in s.problem
    assert s.problem in caplog.text
    # the next save replaces it with a good file
    assert s.save(_index(seed=1))
    assert s.load().history_tokens > 0 and s.problem is None


def _rewrite(path, mutate):
    """Change arrays or header of a store file and fix its checksums (a hostile but well-formed file)."""
    raw = path.read_bytes()
    magic, version, n, _ = storemod._PREAMBLE.unpack_from(raw)
    header = json.loads(raw[storemod._PREAMBLE.size : storemod._PREAMBLE.size + n])
    start = storemod._aligned(storemod._PREAMBLE.size + n)
    payload = bytearray(raw[start:])
    arrays = {
        name: np.frombuffer(payload, dtype=dt, count=length, offset=off)
        for name, dt, length, off in header["arrays"]
    }
    mutate(header, {k: v.copy() for k, v in arrays.items()}, payload)
    header["payload_crc32"] = zlib.crc32(payload)
    blob = json.dumps(header).encode()
    head = storemod._PREAMBLE.pack(magic, version, len(blob), zlib.crc32(blob)) + blob
    head += bytes(storemod._aligned(len(head)) - len(head))
    path.write_bytes(head + bytes(payload))


def _put(header, payload, name, values):
    for n, dt, _length, off in header["arrays"]:
        if n == name:
            payload[off : off + values.nbytes] = values.astype(dt).tobytes()


@pytest.mark.parametrize("attack", ["pos-out-of-range", "token-out-of-vocab", "unsorted", "array-outside"])
def test_well_formed_hostile_file_is_refused(tmp_path, attack):
    s = SuffixStore(tmp_path, FP, n_vocab=1000)
    s.save(_index())

    def mutate(header, arrays, payload):
        if attack == "pos-out-of-range":
            pos = arrays["history_pos"]
            pos[0] = 10**8
            _put(header, payload, "history_pos", pos)
        elif attack == "token-out-of-vocab":
            t = arrays["history_tokens"]
            t[5] = 5000
            _put(header, payload, "history_tokens", t)
        elif attack == "unsorted":
            k = arrays["history_keys"]
            k[0], k[-1] = k[-1], k[0]
            _put(header, payload, "history_keys", k)
        elif attack == "array-outside":
            header["arrays"][0][3] = 10**9

    _rewrite(s.path, mutate)
    ix = s.load()
    assert ix.history_tokens == 0 and s.problem


def test_history_is_bounded_oldest_first(tmp_path):
    s = SuffixStore(tmp_path, FP, max_tokens=1000)
    ix = s.load()
    for i in range(10):
        ix.add_request([i] * 300)
    assert ix.history_tokens <= 1000
    assert ix.history.tokens[0] == 9 - ix.history_requests + 1  # the newest requests are the ones kept
    s.save(ix)
    assert s.load().history_tokens == ix.history_tokens


_WRITER = textwrap.dedent(
    """
    import sys, numpy as np
    from localspec.store import SuffixStore
    from localspec.suffix import SuffixIndex
    s = SuffixStore(sys.argv[1], sys.argv[2])
    rng = np.random.default_rng(0)
    ix = SuffixIndex()
    for _ in range(8):
        ix.add_request(rng.integers(0, 30000, 30000).tolist())
    print("ready", flush=True)
    while True:  # most of the time is now spent writing a 15 MB file
        ix.add_request(rng.integers(0, 30000, 100).tolist())
        s.save(ix)
    """
)


def test_killed_writer_never_leaves_a_store_that_fails_to_load(tmp_path):
    """Kill a process that saves as fast as it can at many moments; every time, the file loads."""
    loaded = set()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    for delay in (0.02, 0.07, 0.13, 0.2, 0.29, 0.37, 0.5, 0.66):
        proc = subprocess.Popen(
            [sys.executable, "-c", _WRITER, str(tmp_path), FP], stdout=subprocess.PIPE, env=env
        )
        assert proc.stdout is not None and proc.stdout.readline().strip() == b"ready"
        time.sleep(delay)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        s = SuffixStore(tmp_path, FP)
        ix = s.load()
        assert s.problem is None, s.problem
        loaded.add(ix.history_requests)
    assert max(loaded) > 0, "the writer never finished a save: the test would prove nothing"
    assert len(loaded) > 1, "every kill found the same state: the kills did not land mid-run"


class _Killed(BaseException):
    pass


def test_writer_dying_mid_write_leaves_the_previous_store(tmp_path, monkeypatch):
    """Deterministic version of the test above: the writer dies after writing part of the file."""
    s = SuffixStore(tmp_path, FP)
    s.save(_index(n_requests=5))
    real_fdopen = os.fdopen

    class Dying:
        def __init__(self, fh):
            self.fh, self.writes = fh, 0

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.fh.close()  # a dead process's descriptors close; nothing is flushed beyond this point

        def fileno(self):
            return self.fh.fileno()

        def write(self, data):
            self.writes += 1
            if self.writes == 3:
                self.fh.write(bytes(data)[: len(data) // 2])
                self.fh.flush()
                raise _Killed
            return self.fh.write(data)

        def flush(self):
            self.fh.flush()

    def fdopen(fd, mode="r", *a, **kw):
        fh = real_fdopen(fd, mode, *a, **kw)
        return Dying(fh) if "w" in mode else fh

    monkeypatch.setattr(os, "fdopen", fdopen)
    with pytest.raises(_Killed):
        s.save(_index(n_requests=9))
    monkeypatch.undo()
    ix = s.load()
    assert s.problem is None and ix.history_requests == 5


def test_stale_temp_files_of_killed_writers_are_cleaned(tmp_path):
    s = SuffixStore(tmp_path, FP)
    s.save(_index())
    stale = tmp_path / f".{s.path.name}.abc123.tmp"
    stale.write_bytes(b"half a store")
    old = time.time() - 3600
    os.utime(stale, (old, old))
    fresh = tmp_path / f".{s.path.name}.def456.tmp"
    fresh.write_bytes(b"another writer's file in progress")
    s.save(_index())
    assert not stale.exists() and fresh.exists()


def test_list_and_clear(tmp_path):
    SuffixStore(tmp_path, FP).save(_index())
    SuffixStore(tmp_path, OTHER, namespace="b").save(_index(n_requests=3))
    (tmp_path / "junk.lsstore").write_bytes(b"nope")
    infos = {i.path.name: i for i in list_stores(tmp_path)}
    assert len(infos) == 3
    good = infos[store_path(tmp_path, FP).name]
    assert good.fingerprint == FP and good.history_requests == 20 and good.history_tokens == 6000
    assert good.corpus_documents == 3 and good.size_bytes > 0 and good.problem is None
    assert infos["junk.lsstore"].problem
    gone = storemod.clear(tmp_path)
    assert len(gone) == 3 and list_stores(tmp_path) == []
    assert storemod.clear(tmp_path / "none") == []


def test_save_failure_is_reported_not_raised(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    s = SuffixStore(blocker / "sub", FP)  # a folder that cannot be created
    assert s.save(_index()) is False
    assert s.problem and "cannot save" in s.problem


# The commands --------------------------------------------------------------------------------------
def _cli():
    from localspec.cli import _FriendlyGroup
    from localspec.cli import cache as cachecli

    group = _FriendlyGroup("localspec")  # the real one registers the same COMMANDS
    for command in cachecli.COMMANDS:
        group.add_command(command)
    return group


def test_read_corpus_skips_what_is_not_text(tmp_path):
    src = tmp_path / "repo"
    (src / "pkg").mkdir(parents=True)
    (src / "pkg" / "a.py").write_text("def a():\n    return 1\n")
    (src / "notes.md").write_text("# notes\n")
    (src / ".git").mkdir()
    (src / ".git" / "config").write_text("[core]\n")
    (src / "node_modules").mkdir()
    (src / "node_modules" / "x.js").write_text("x")
    (src / "blob.bin").write_bytes(b"\x00\x01\x02" * 10)
    (src / "latin1.txt").write_bytes("caf\xe9".encode("latin-1"))
    (src / "big.txt").write_text("x" * 2000)
    (src / "link.py").symlink_to(tmp_path / "outside.py")
    (tmp_path / "outside.py").write_text("secret = 1\n")
    scan = storemod.read_corpus(src, max_file_bytes=1000)
    assert [p for p, _ in scan.files] == ["notes.md", os.path.join("pkg", "a.py")]
    assert scan.skipped["binary"] == 1 and scan.skipped["not UTF-8 text"] == 1
    assert scan.skipped["symlink or special file"] == 1 and scan.skipped["hidden or build folder"] == 2
    assert storemod.read_corpus(src, max_files=1).stopped
    with pytest.raises(CacheError):
        storemod.read_corpus(tmp_path / "missing")
    with pytest.raises(CacheError):
        storemod.read_corpus(src / "notes.md")


def test_index_info_clear_commands(tmp_path):
    from click.testing import CliRunner

    src = tmp_path / "repo"
    src.mkdir()
    (src / "util.py").write_text("def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n    return a - b\n")
    cache_dir = tmp_path / "cache"
    runner = CliRunner()
    cli = _cli()
    r = runner.invoke(cli, ["index", str(src), "--dir", str(cache_dir)])
    assert r.exit_code == 0, r.output
    assert "Indexed 1 file(s)" in r.output
    (info,) = list_stores(cache_dir)
    assert info.corpus_documents == 1 and info.corpus_tokens > 10 and info.corpus_root == str(src.resolve())
    # the indexed corpus drafts for the target's tokens
    from localspec import constants
    from localspec.gguf_meta import read_metadata
    from localspec.vocab import fingerprint

    fp = fingerprint(read_metadata(constants.EMBEDDED_TARGET)).fingerprint
    assert info.fingerprint == fp
    ix = SuffixStore(cache_dir, fp).load()
    doc = ix.corpus.tokens[:12].tolist()
    ix.begin(doc[:6])
    (prop,) = ix.propose(doc[:6], 4)
    assert prop.source == "corpus" and prop.tokens == doc[6:10]

    out = runner.invoke(cli, ["cache", "info", "--dir", str(cache_dir)]).output
    assert str(info.path) in out and "corpus" in out and "1 files" in out
    assert (
        "Nothing deleted"
        in runner.invoke(cli, ["cache", "clear", "--dir", str(cache_dir)], input="n\n").output
    )
    assert info.path.exists()
    assert (
        "Deleted 1 file(s)" in runner.invoke(cli, ["cache", "clear", "--dir", str(cache_dir), "--yes"]).output
    )
    assert not info.path.exists()

    # errors are one clear line with a next step, never a traceback
    for args in (
        ["index", str(tmp_path / "nope")],
        ["index", str(src), "--target", str(tmp_path / "x.gguf")],
    ):
        r = runner.invoke(cli, [*args, "--dir", str(cache_dir)])
        assert r.exit_code == 1 and "Error:" in r.output and "->" in r.output and "Traceback" not in r.output
    empty = tmp_path / "empty"
    empty.mkdir()
    r = runner.invoke(cli, ["index", str(empty), "--dir", str(cache_dir)])
    assert r.exit_code == 1 and "no text files" in r.output
