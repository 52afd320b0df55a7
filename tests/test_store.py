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
from pathlib import Path

import numpy as np
import pytest

from localspec.errors import CacheError
from localspec.suffix import corpus, store_files, store_info, store_lock
from localspec.suffix.calibration import CARRIED_TOKENS, CARRIED_TRIALS, TOKEN_TRIALS, cells_from
from localspec.suffix.drafter import SuffixDrafter
from localspec.suffix.index import SuffixIndex
from localspec.suffix.store import SuffixStore
from localspec.suffix.store_files import namespace_for_key, store_path
from localspec.suffix.store_info import list_stores

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
    magic, version, n, _ = store_files._PREAMBLE.unpack_from(raw)
    header = json.loads(raw[store_files._PREAMBLE.size : store_files._PREAMBLE.size + n])
    start = store_files._aligned(store_files._PREAMBLE.size + n)
    payload = bytearray(raw[start:])
    arrays = {
        name: np.frombuffer(payload, dtype=dt, count=length, offset=off)
        for name, dt, length, off in header["arrays"]
    }
    mutate(header, {k: v.copy() for k, v in arrays.items()}, payload)
    header["payload_crc32"] = zlib.crc32(payload)
    blob = json.dumps(header).encode()
    head = store_files._PREAMBLE.pack(magic, version, len(blob), zlib.crc32(blob)) + blob
    head += bytes(store_files._aligned(len(head)) - len(head))
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


# The journal ----------------------------------------------------------------------------------------
def _files(directory):
    return sorted(p.name for p in Path(directory).iterdir())


def _journaled(tmp_path, n_appended=4, **kw):
    """A store saved once whole, then after each of ``n_appended`` more requests (appended)."""
    s = SuffixStore(tmp_path, FP, n_vocab=1000, **kw)
    ix = s.load()
    rng = np.random.default_rng(5)
    for _ in range(3):
        ix.add_request(rng.integers(0, 1000, 200).tolist())
    assert s.save(ix)
    requests = []
    for _ in range(n_appended):
        requests.append(rng.integers(0, 1000, int(rng.integers(1, 60))).tolist())
        ix.add_request(requests[-1])
        assert s.save(ix) and s.problem is None
    return s, ix, requests


def _same_lookups(a: SuffixIndex, b: SuffixIndex) -> None:
    rng = np.random.default_rng(9)
    tokens = a.history.tokens
    for _ in range(20):
        at = int(rng.integers(16, max(17, tokens.size - 8)))
        context = [int(t) for t in tokens[at - 16 : at] if t >= 0]
        a.begin(context)
        b.begin(context)
        assert a.propose(context, 8) == b.propose(context, 8)


def test_saves_after_the_first_append_to_a_journal_and_load_the_same_index(tmp_path):
    s, ix, requests = _journaled(tmp_path)
    snapshot = os.stat(s.path)
    assert _files(tmp_path) == sorted([s.path.name, s.journal_path.name])
    for p in (s.path, s.journal_path):
        assert stat.S_IMODE(os.stat(p).st_mode) == 0o600
    # the journal holds the requests (4 bytes a token), the snapshot was not rewritten
    head = len(store_files.journal_header(FP, "default", "0" * 16))
    assert s.journal_path.stat().st_size == head + sum(8 + 4 * len(r) for r in requests)
    assert os.stat(s.path).st_mtime_ns == snapshot.st_mtime_ns
    back = SuffixStore(tmp_path, FP, n_vocab=1000).load()
    _same(ix, back)
    _same_lookups(ix, back)
    assert back.history_requests == 3 + len(requests)
    # nothing new: nothing written
    size = s.journal_path.stat().st_size
    assert s.save(ix) and s.journal_path.stat().st_size == size
    # the store and its journal are listed as one, and cleared together
    (info,) = list_stores(tmp_path)
    assert info.history_requests == back.history_requests and info.history_tokens == back.history_tokens
    assert info.size_bytes == s.path.stat().st_size + size
    assert len(store_info.clear(tmp_path)) == 2 and _files(tmp_path) == []


def test_a_loaded_store_appends_to_its_journal(tmp_path):
    s, ix, requests = _journaled(tmp_path, n_appended=2)
    again = SuffixStore(tmp_path, FP, n_vocab=1000)
    back = again.load()
    back.add_request([7, 8, 9])
    size = again.journal_path.stat().st_size
    assert again.save(back)
    assert again.journal_path.stat().st_size == size + 8 + 12  # one record appended
    assert SuffixStore(tmp_path, FP, n_vocab=1000).load().history_requests == 3 + 2 + 1


def test_torn_last_record_loads_every_complete_record(tmp_path, caplog):
    """A writer killed in the middle of an append, at every byte of the last record (and with garbage
    after it): the store loads, quietly, with every complete record; the next save starts afresh."""
    s, ix, requests = _journaled(tmp_path, n_appended=3)
    data = s.journal_path.read_bytes()
    last = len(data) - (8 + 4 * len(requests[-1]))
    s.journal_path.write_bytes(data[:last])
    want = SuffixStore(tmp_path, FP, n_vocab=1000).load()  # every record but the last one
    assert want.history_requests == 3 + len(requests) - 1
    for cut in range(last, len(data)):
        s.journal_path.write_bytes(data[:cut])
        st = SuffixStore(tmp_path, FP, n_vocab=1000)
        back = st.load()
        assert st.problem is None and back.history_requests == want.history_requests, cut
        _same(want, back)
    # the last token one off (still in the vocabulary: only the checksum tells), or garbage after it
    one_off = data[last:-4] + bytes([data[-4] ^ 1]) + data[-3:]
    for tail in (one_off, os.urandom(7), os.urandom(300), bytes(50)):
        s.journal_path.write_bytes(data[:last] + tail)
        st = SuffixStore(tmp_path, FP, n_vocab=1000)
        back = st.load()
        assert st.problem is None and back.history_requests == 3 + len(requests) - 1
    # a record whose checksum fails in the middle ends the replay there (what follows cannot be trusted)
    flipped = bytearray(data)
    flipped[last - 4] ^= 0x01  # the lowest byte of the previous record's last token
    s.journal_path.write_bytes(bytes(flipped))
    assert SuffixStore(tmp_path, FP, n_vocab=1000).load().history_requests == 3 + len(requests) - 2
    # after a torn load, the next save does not append after the garbage: it writes a new snapshot
    s.journal_path.write_bytes(data[: len(data) - 3])
    st = SuffixStore(tmp_path, FP, n_vocab=1000)
    back = st.load()
    back.add_request([1, 2, 3])
    assert st.save(back)
    assert _files(tmp_path) == [s.path.name]
    again = SuffixStore(tmp_path, FP, n_vocab=1000).load()
    assert again.history_requests == 3 + len(requests) - 1 + 1
    _same(back, again)
    assert "Traceback" not in caplog.text


def test_journal_of_a_replaced_snapshot_is_ignored(tmp_path):
    """Killed after writing a new snapshot and before deleting the journal: the journal names the old
    snapshot, and its requests (already in the new one) are not added twice."""
    s, ix, requests = _journaled(tmp_path, n_appended=3)
    old_journal = s.journal_path.read_bytes()
    ix.set_corpus([[1, 2, 3, 4]])  # a new corpus: the next save writes a snapshot
    assert s.save(ix) and not s.journal_path.exists()
    s.journal_path.write_bytes(old_journal)
    st = SuffixStore(tmp_path, FP, n_vocab=1000)
    back = st.load()
    assert st.problem is None and back.history_requests == 3 + len(requests)
    _same(ix, back)
    # and the next save replaces it
    back.add_request([5, 6])
    assert st.save(back)
    assert SuffixStore(tmp_path, FP, n_vocab=1000).load().history_requests == 3 + len(requests) + 1


@pytest.mark.parametrize("damage", ["magic", "header-crc", "other-namespace", "version"])
def test_damaged_journal_header_is_reported_and_the_snapshot_loads(tmp_path, damage):
    s, ix, requests = _journaled(tmp_path, n_appended=2)
    data = bytearray(s.journal_path.read_bytes())
    if damage == "magic":
        data[0:8] = b"NOTAJRNL"
    elif damage == "header-crc":
        data[_PREAMBLE_SIZE + 3] ^= 0x01
    elif damage == "version":
        data[8] = 9
    else:
        blob = json.dumps({"fingerprint": FP, "namespace": "other", "snapshot_id": "x"}).encode()
        data = bytearray(
            store_files._PREAMBLE.pack(store_files.JOURNAL_MAGIC, 1, len(blob), zlib.crc32(blob)) + blob
        )
    s.journal_path.write_bytes(bytes(data))
    st = SuffixStore(tmp_path, FP, n_vocab=1000)
    back = st.load()
    assert back.history_requests == 3  # the snapshot's
    assert st.problem and "journal" in st.problem and "\n" not in st.problem
    back.add_request([4, 4, 4])
    assert st.save(back) and st.problem is None
    assert SuffixStore(tmp_path, FP, n_vocab=1000).load().history_requests == 4


_PREAMBLE_SIZE = store_files._PREAMBLE.size


def test_journal_is_folded_into_the_snapshot_and_eviction_bounds_the_files(tmp_path, monkeypatch):
    """Appends until the journal would pass its share of the snapshot, then a new snapshot; with a
    history cap, eviction writes a new snapshot too: the files stay bounded however many requests."""
    monkeypatch.setattr(store_files, "JOURNAL_MIN_TOKENS", 500)
    s = SuffixStore(tmp_path, FP, max_tokens=3000)
    ix = s.load()
    rng = np.random.default_rng(2)
    snapshots = set()
    largest = 0
    for i in range(300):
        ix.add_request(rng.integers(0, 30000, int(rng.integers(20, 120))).tolist())
        assert s.save(ix) and s.problem is None
        snapshots.add((os.stat(s.path).st_ino, os.stat(s.path).st_mtime_ns))
        total = sum(p.stat().st_size for p in tmp_path.iterdir())
        largest = max(largest, total)
        journal = s.journal_path.stat().st_size if s.journal_path.exists() else 0
        assert journal <= 200 + 8 * 50 + 4 * 500  # header, records: never past JOURNAL_MIN_TOKENS
        for p in tmp_path.iterdir():
            assert stat.S_IMODE(p.stat().st_mode) == 0o600, p
        if i % 50 == 49:
            back = SuffixStore(tmp_path, FP, max_tokens=3000).load()
            _same(ix, back)
    assert ix.history_tokens <= 3000 and len(snapshots) > 5
    one = store_files.store_path(tmp_path, FP)
    assert largest < 2 * 60 * 3000 + 10_000  # ~60 bytes a token in the snapshot, at most the cap
    assert one == s.path


def _held(ix: SuffixIndex) -> list[list[int]]:
    """The requests an index holds, oldest first."""
    return [a.tolist() for a in ix.history_since(ix.history_dropped)]


def test_two_writers_on_one_store_keep_each_others_requests(tmp_path):
    """Two processes on one store (a server and a ``localspec run``, say): each appends only to files it
    wrote or loaded; when the other saved meanwhile, it loads what that one left and adds its own, so no
    request is lost, none is stored twice, and the store loads."""
    a, ix_a, appended = _journaled(tmp_path, n_appended=1)
    first = _held(ix_a)
    b = SuffixStore(tmp_path, FP, n_vocab=1000)
    ix_b = b.load()
    ix_a.add_request([1, 1, 1])
    assert a.save(ix_a)  # appended: a's journal grew
    ix_b.add_request([2, 2, 2, 2])
    assert b.save(ix_b)  # the journal is not the one b loaded: b takes in a's request, then adds its own
    assert _held(ix_b) == [*first, [1, 1, 1], [2, 2, 2, 2]]
    ix_a.add_request([3])
    assert a.save(ix_a)
    assert _held(ix_a) == [*first, [1, 1, 1], [2, 2, 2, 2], [3]]
    back = SuffixStore(tmp_path, FP, n_vocab=1000).load()
    _same(ix_a, back)
    _same_lookups(ix_a, back)
    # with nothing new from the other writer, a save only appends
    size = a.journal_path.stat().st_size
    ix_a.add_request([5, 5])
    assert a.save(ix_a) and a.journal_path.stat().st_size == size + 8 + 8


def test_a_corpus_indexed_by_another_process_is_kept_by_a_running_one(tmp_path):
    """``localspec index DIR`` while a server runs: the server's next save keeps that corpus (and drafts
    from it), instead of writing back its own index without it."""
    server = SuffixStore(tmp_path, FP, n_vocab=1000)
    running = server.load()  # nothing stored yet
    running.add_request(list(range(50)))
    assert server.save(running)
    indexer = SuffixStore(tmp_path, FP, n_vocab=1000)
    ix = indexer.load()
    docs = [list(range(100, 180)), list(range(300, 340))]
    ix.set_corpus(docs)
    indexer.corpus_root = "/src/project"
    assert indexer.save(ix)
    running.add_request(list(range(60, 90)))
    assert server.save(running)
    assert running.corpus_documents == 2 and server.corpus_root == "/src/project"
    context = list(range(100, 120))
    running.begin(context)
    assert [p.source for p in running.propose(context, 8)] == ["corpus"]
    back = SuffixStore(tmp_path, FP, n_vocab=1000).load()
    assert back.corpus_documents == 2 and _held(back) == [list(range(50)), list(range(60, 90))]
    # the same when the running process started from no store at all
    store_info.clear(tmp_path)
    fresh = SuffixStore(tmp_path, FP, n_vocab=1000)
    empty = fresh.load()
    indexer = SuffixStore(tmp_path, FP, n_vocab=1000)  # another `localspec index` run
    ix = indexer.load()
    ix.set_corpus(docs)
    assert indexer.save(ix)
    empty.add_request([7, 7, 7])
    assert fresh.save(empty)
    assert empty.corpus_documents == 2 and _held(empty) == [[7, 7, 7]]
    # a corpus set in this process since (``load(corpus=...)``) is the newer one and wins
    running = fresh.load()
    running.set_corpus([[9, 9, 9, 9]])
    ix.add_request([1, 2, 3])
    assert indexer.save(ix)
    running.add_request([8, 8])
    assert fresh.save(running)
    back = SuffixStore(tmp_path, FP, n_vocab=1000).load()
    assert back.corpus_tokens == 4 and _held(back) == [[7, 7, 7], [1, 2, 3], [8, 8]]


def test_a_cleared_cache_is_forgotten_by_a_running_process_too(tmp_path):
    """``localspec cache clear`` while a server runs: the server forgets what it held at its next save
    (the request just finished included) and writes nothing of it back; later requests are stored."""
    s, ix, _ = _journaled(tmp_path, n_appended=2)
    store_info.clear(tmp_path)
    ix.add_request([4, 4])
    assert s.save(ix) and s.problem is None
    assert _files(tmp_path) == [] and ix.history_requests == 0 and ix.corpus_tokens == 0
    context = ix.history.tokens.tolist()[:16] or [1, 2, 3]
    ix.begin(context)
    assert ix.propose(context, 8) == []
    ix.add_request([6, 6, 6])
    assert s.save(ix)
    assert _held(SuffixStore(tmp_path, FP, n_vocab=1000).load()) == [[6, 6, 6]]


def test_files_another_writer_damaged_are_replaced_by_the_running_index(tmp_path):
    s, ix, _ = _journaled(tmp_path, n_appended=1)
    s.path.write_bytes(b"LSSUFFIX" + b"\0" * 40)
    ix.add_request([3, 3, 3])
    assert s.save(ix)
    _same(ix, SuffixStore(tmp_path, FP, n_vocab=1000).load())


def test_writer_dying_mid_append_leaves_a_store_that_loads(tmp_path, monkeypatch):
    """Deterministic: the append writes half its bytes, then the process dies."""
    s, ix, requests = _journaled(tmp_path, n_appended=2)
    real_write = os.write

    def dying_write(fd, data):
        real_write(fd, bytes(data)[: len(data) // 2])
        raise _Killed

    ix.add_request(list(range(100)))
    monkeypatch.setattr(os, "write", dying_write)
    with pytest.raises(_Killed):
        s.save(ix)
    monkeypatch.undo()
    st = SuffixStore(tmp_path, FP, n_vocab=1000)
    assert st.load().history_requests == 3 + 2 and st.problem is None


# Two writers on one store --------------------------------------------------------------------------
class _Counting(SuffixStore):
    """A store that counts its loads (the first one included): a save that takes in another writer's
    files whole does it with :meth:`SuffixStore.load`."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.loads = 0

    def load(self):
        self.loads += 1
        return super().load()


def _in_sync(s: SuffixStore, ix: SuffixIndex) -> None:
    """A store's bookkeeping matches its files: the snapshot is the one it knows, the journal ends where it
    says, and the journal's records are the index's last requests."""
    synced = s._synced
    assert synced is not None and synced.history() is ix.history and synced.added == ix.history_added
    assert store_files.file_identity(os.stat(s.path)) == synced.snapshot
    if synced.journal is None:
        assert not s.journal_path.exists() and synced.journal_tokens == 0
        return
    st = os.stat(s.journal_path)
    assert (st.st_dev, st.st_ino) == synced.journal and st.st_size == synced.journal_end
    records, end = store_files.parse_journal(
        s.journal_path.read_bytes(), FP, "default", synced.snapshot_id, 1000
    )
    assert end == st.st_size and synced.journal_tokens == sum(r.size for r in records)
    held = _held(ix)
    assert [r.tolist() for r in records] == held[len(held) - len(records) :]


def test_a_save_after_another_writers_append_reads_only_its_new_records(tmp_path):
    """Two servers on one store, each saving after the other's append: the records after the ones a store
    knows are read and added (no load of the whole store, the snapshot is not rewritten), its own request
    is appended once after them, and each index is what a fresh load of the files gives."""
    a = _Counting(tmp_path, FP, n_vocab=1000)
    ix_a = a.load()
    ix_a.add_request(list(range(100, 300)))
    assert a.save(ix_a)  # a snapshot, no journal yet: b starts the journal's read from its header
    b = _Counting(tmp_path, FP, n_vocab=1000)
    ix_b = b.load()
    snapshot = os.stat(a.path)
    on_disk = [list(range(100, 300))]
    head = len(store_files.journal_header(FP, "default", "0" * 16))
    rng = np.random.default_rng(3)
    for _ in range(6):
        for s, ix in ((a, ix_a), (b, ix_b)):
            request = rng.integers(0, 1000, int(rng.integers(1, 40))).tolist()
            ix.add_request(request)
            # the size before, or the header's when this save starts the journal
            before = s.journal_path.stat().st_size if s.journal_path.exists() else head
            assert s.save(ix) and s.problem is None
            on_disk.append(request)
            assert s.journal_path.stat().st_size == before + 8 + 4 * len(request), (
                "this request's record, once, and none of the other writer's again"
            )
            _in_sync(s, ix)
            assert _held(ix) == on_disk  # theirs first, then this one's: the disk order
            back = SuffixStore(tmp_path, FP, n_vocab=1000).load()
            _same(ix, back)
    assert a.loads == 1 and b.loads == 1, "no save loaded the store again"
    assert os.stat(a.path).st_ino == snapshot.st_ino and os.stat(a.path).st_mtime_ns == snapshot.st_mtime_ns
    _same_lookups(ix_a, SuffixStore(tmp_path, FP, n_vocab=1000).load())
    assert _files(tmp_path) == sorted([a.path.name, a.journal_path.name]), "no lock file is left"


def test_interleaved_saves_of_two_writers_keep_every_request_in_disk_order(tmp_path, monkeypatch):
    """Any interleaving of two writers' saves (none, one or two requests each time, journals folded into
    snapshots now and then, a corpus set): a fresh load holds every request of both in the order they
    reached the files, and equals the last saver's index; a store loads the files whole only after the
    other wrote a snapshot."""
    monkeypatch.setattr(store_files, "JOURNAL_MIN_TOKENS", 300)  # a new snapshot every ten requests or so
    stores = [_Counting(tmp_path, FP, n_vocab=1000) for _ in range(2)]
    indexes = [s.load() for s in stores]
    pending: list[list[list[int]]] = [[], []]
    on_disk: list[list[int]] = []
    loads, stale = [1, 1], [False, False]  # stale: the other one wrote a snapshot since
    rng = np.random.default_rng(11)
    snapshots = 0
    for step in range(150):
        w = int(rng.integers(0, 2))
        s, ix = stores[w], indexes[w]
        for _ in range(int(rng.integers(0, 3))):
            request = rng.integers(0, 1000, int(rng.integers(1, 50))).tolist()
            ix.add_request(request)
            pending[w].append(request)
        if step % 37 == 36:
            ix.set_corpus([rng.integers(0, 1000, 30).tolist()])  # `localspec index`: a new snapshot
        before = store_files.file_identity(os.stat(s.path)) if s.path.exists() else None
        assert s.save(ix) and s.problem is None
        on_disk += pending[w]
        pending[w] = []
        loads[w] += stale[w]
        stale[w] = False
        if store_files.file_identity(os.stat(s.path)) != before:
            stale[1 - w] = True
            snapshots += 1
        assert s.loads == loads[w], step
        back = SuffixStore(tmp_path, FP, n_vocab=1000).load()
        assert _held(back) == on_disk == _held(ix), step
        _same(ix, back)
        _in_sync(s, ix)
    # a reload per snapshot at most (14 snapshots, 13 reloads in 150 saves): the rest read appends only
    assert 5 < snapshots < 30 and sum(loads) - 2 <= snapshots


@pytest.mark.parametrize("change", ["snapshot", "journal-replaced", "journal-truncated"])
def test_files_another_writer_rewrote_are_loaded_whole(tmp_path, change):
    """Anything but an append since this store was in sync (a new snapshot, a journal that is another file
    or shorter than what this store knows of it): the files are loaded whole, as before."""
    a = _Counting(tmp_path, FP, n_vocab=1000)
    ix_a = a.load()
    ix_a.add_request(list(range(50)))
    assert a.save(ix_a)
    ix_a.add_request([1, 1, 1])
    assert a.save(ix_a)  # the journal starts
    b = _Counting(tmp_path, FP, n_vocab=1000)
    ix_b = b.load()
    ix_a.add_request([2, 2])
    if change == "snapshot":
        ix_a.set_corpus([[9, 9, 9, 9]])
        assert a.save(ix_a) and not a.journal_path.exists()
        want = [list(range(50)), [1, 1, 1], [2, 2]]
    elif change == "journal-replaced":  # the same bytes and a record more, under another inode
        data = a.journal_path.read_bytes() + store_files.journal_record(np.array([2, 2]))
        tmp = tmp_path / "swap"
        tmp.write_bytes(data)
        os.chmod(tmp, 0o600)
        os.replace(tmp, a.journal_path)
        want = [list(range(50)), [1, 1, 1], [2, 2]]
    else:  # cut back to the snapshot's requests alone
        data = a.journal_path.read_bytes()
        a.journal_path.write_bytes(data[: len(data) - 8 - 12])
        want = [list(range(50))]
    ix_b.add_request([3, 3, 3, 3])
    assert b.save(ix_b) and b.problem is None
    assert b.loads == 2, "loaded whole"
    assert _held(ix_b) == [*want, [3, 3, 3, 3]]
    back = SuffixStore(tmp_path, FP, n_vocab=1000).load()
    _same(ix_b, back)
    _in_sync(b, ix_b)
    assert back.corpus_tokens == (4 if change == "snapshot" else 0)


@pytest.mark.parametrize("damage", ["torn", "flipped"])
def test_a_damaged_record_another_writer_appended_is_handled_as_at_load(tmp_path, monkeypatch, damage):
    """The other writer died in the middle of an append (a torn last record), or its record fails its
    checksum: the next save of this store loads the files whole, keeps every complete record before it
    (the other writer's good one included), and writes a new snapshot instead of appending after it."""
    a, ix_a, requests = _journaled(tmp_path, n_appended=1)
    b = _Counting(tmp_path, FP, n_vocab=1000)
    ix_b = b.load()
    ix_a.add_request([4, 4, 4])
    assert a.save(ix_a)  # a good record b does not know yet
    ix_a.add_request(list(range(100)))
    if damage == "torn":
        real_write = os.write

        def dying_write(fd, data):
            real_write(fd, bytes(data)[: len(data) // 2])
            raise _Killed

        monkeypatch.setattr(os, "write", dying_write)
        with pytest.raises(_Killed):
            a.save(ix_a)
        monkeypatch.undo()
    else:
        assert a.save(ix_a)
        data = bytearray(a.journal_path.read_bytes())
        data[-7] ^= 0x01  # a token of the last record: only its checksum tells
        a.journal_path.write_bytes(bytes(data))
    assert not a.lock_path.exists()  # the dying save let go of the lock
    ix_b.add_request([5, 5])
    assert b.save(ix_b) and b.problem is None
    assert b.loads == 2
    first = _held(SuffixStore(tmp_path, FP, n_vocab=1000).load())[:-2]
    assert _held(ix_b) == [*first, [4, 4, 4], [5, 5]] and len(first) == 3 + len(requests)
    assert not b.journal_path.exists(), "a new snapshot, nothing appended after the damaged record"
    _same(ix_b, SuffixStore(tmp_path, FP, n_vocab=1000).load())
    _in_sync(b, ix_b)


def _save_many(directory: str, who: int, n: int, start, out) -> None:
    """One of two processes saving at once (:func:`test_two_processes_saving_at_once_lose_nothing`)."""
    store_files.JOURNAL_MIN_TOKENS = 400  # snapshots under contention too, every ten requests or so
    s = SuffixStore(directory, FP, n_vocab=1000)
    ix = s.load()
    start.wait()
    failed = 0
    for i in range(n):
        ix.add_request([who, i, *range(10, 10 + 20 + i % 17)])
        failed += not s.save(ix)
    out.put((who, failed, _held(ix)))


def test_two_processes_saving_at_once_lose_nothing(tmp_path):
    """Two processes (spawned: nothing shared but the files) saving after each of many requests at once:
    they take turns under the lock, so the store ends with every request of both, each once, in each
    one's order, loads without a problem, and is what the last saver held."""
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")
    start, out = ctx.Event(), ctx.Queue()
    n = 40
    procs = [ctx.Process(target=_save_many, args=(str(tmp_path), who, n, start, out)) for who in (1, 2)]
    for p in procs:
        p.start()
    start.set()
    results = {}
    for _ in procs:
        who, failed, held = out.get(timeout=60)
        results[who] = held
        assert failed == 0
    for p in procs:
        p.join(timeout=30)
        assert p.exitcode == 0
    st = SuffixStore(tmp_path, FP, n_vocab=1000)
    back = st.load()
    assert st.problem is None
    held = _held(back)
    assert len(held) == 2 * n
    for who in (1, 2):
        assert [r[1] for r in held if r[0] == who] == list(range(n)), "each one's requests, once, in order"
    assert held in (results[1], results[2])
    assert set(_files(tmp_path)) <= {st.path.name, st.journal_path.name}, "no lock file is left"


# The lock ------------------------------------------------------------------------------------------
@pytest.mark.skipif(sys.platform == "win32", reason="no fcntl: saves go on unlocked")
def test_a_save_waits_a_bounded_time_for_a_held_lock_then_skips(tmp_path, monkeypatch, caplog):
    """A lock held past the wait (a stuck process): the save is skipped, reported in one line, and the
    generation goes on; later saves only try once until they get it; the next save that does writes the
    requests the skipped ones did not."""
    import fcntl

    monkeypatch.setattr(store_lock, "LOCK_WAIT_SECONDS", 0.5)
    s = SuffixStore(tmp_path, FP, n_vocab=1000)
    ix = s.load()
    ix.add_request([1, 2, 3])
    assert s.save(ix)
    assert not s.lock_path.exists()  # it exists only while a save holds it
    fd = os.open(s.lock_path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # another process's save, stuck
        ix.add_request([4, 5, 6])
        t = time.monotonic()
        assert s.save(ix) is False
        assert 0.5 <= time.monotonic() - t < 3
        assert s.problem and "lock" in s.problem and "\n" not in s.problem and s.problem in caplog.text
        ix.add_request([7, 7])
        t = time.monotonic()
        assert s.save(ix) is False
        assert time.monotonic() - t < 0.25, "once stuck, a save tries only once"
    finally:
        os.close(fd)  # the holder is done (its lock file stays, as a killed holder's does)
    ix.add_request([8])
    assert s.save(ix) and s.problem is None
    assert _held(SuffixStore(tmp_path, FP, n_vocab=1000).load()) == [[1, 2, 3], [4, 5, 6], [7, 7], [8]]
    assert not s.lock_path.exists()


@pytest.mark.skipif(sys.platform == "win32", reason="no fcntl: saves go on unlocked")
def test_clear_waits_for_a_save_in_flight_and_deletes_what_it_wrote(tmp_path):
    """``localspec cache clear`` beside a running server: a save holding the lock finishes first, and
    the snapshot it writes goes with the rest (deleting under its feet let its rename land after the
    delete and bring the whole store back)."""
    import threading

    s = SuffixStore(tmp_path, FP, n_vocab=1000)
    ix = s.load()
    ix.add_request([1, 2, 3])
    assert s.save(ix)
    fd = store_lock.take_lock(s.lock_path, 1.0)  # a save in flight
    assert fd is not None
    result: list[list[Path]] = []
    clearing = threading.Thread(target=lambda: result.append(store_info.clear(tmp_path)))
    clearing.start()
    time.sleep(0.3)
    assert clearing.is_alive() and s.path.exists(), "clear waits for the save"
    s.journal_path.write_bytes(b"written by the save in flight")
    store_lock.release_lock(s.lock_path, fd)
    clearing.join(5)
    assert not clearing.is_alive()
    assert s.journal_path in result[0] and _files(tmp_path) == []


@pytest.mark.skipif(sys.platform == "win32", reason="no fcntl: saves go on unlocked")
def test_clear_refuses_a_store_locked_past_the_wait_naming_it(tmp_path, monkeypatch):
    import fcntl

    monkeypatch.setattr(store_lock, "LOCK_WAIT_SECONDS", 0.2)
    s = SuffixStore(tmp_path, FP, n_vocab=1000)
    ix = s.load()
    ix.add_request([1, 2, 3])
    assert s.save(ix)
    fd = os.open(s.lock_path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # a stuck process
        with pytest.raises(CacheError) as err:
            store_info.clear(tmp_path)
        assert s.path.name in str(err.value) and err.value.hint and "stop" in err.value.hint
        assert s.path.exists()
    finally:
        os.close(fd)
    assert s.path in store_info.clear(tmp_path) and _files(tmp_path) == []


@pytest.mark.skipif(sys.platform == "win32", reason="no fcntl: saves go on unlocked")
def test_lock_file_is_0600_never_followed_and_not_a_store(tmp_path, caplog):
    modes = []

    class Spy(SuffixStore):
        def _take_in(self, index):
            modes.append(stat.S_IMODE(os.lstat(self.lock_path).st_mode))
            return super()._take_in(index)

    s = Spy(tmp_path, FP, n_vocab=1000)
    ix = s.load()
    ix.add_request([1, 2, 3])
    assert s.save(ix)
    assert modes == [0o600]
    # a symlink where the lock file goes is not followed: the save goes on unlocked, and says so once
    target = tmp_path / "elsewhere"
    target.write_text("keep")
    s.lock_path.symlink_to(target)
    for request in ([4], [5]):
        ix.add_request(request)
        assert s.save(ix) and s.problem is None
    assert caplog.text.count("without the lock") == 1
    assert target.read_text() == "keep" and s.lock_path.is_symlink()
    assert _held(SuffixStore(tmp_path, FP, n_vocab=1000).load()) == [[1, 2, 3], [4], [5]]
    # a lock file left by a writer killed while it saved is not a store, and clear deletes it
    s.lock_path.unlink()
    target.unlink()
    s.lock_path.write_bytes(b"")
    (info,) = list_stores(tmp_path)
    assert info.path == s.path and info.problem is None
    assert s.lock_path in store_info.clear(tmp_path) and _files(tmp_path) == []


def test_version_1_store_is_ignored_with_a_clear_reason(tmp_path):
    s = SuffixStore(tmp_path, FP)
    s.save(_index())
    raw = bytearray(s.path.read_bytes())
    raw[8:12] = (1).to_bytes(4, "little")  # what localspec wrote before the journal
    s.path.write_bytes(bytes(raw))
    ix = s.load()
    assert ix.history_tokens == 0
    assert s.problem and "format version 1" in s.problem and "reads version 2" in s.problem
    assert s.save(_index(seed=1)) and s.load().history_tokens > 0 and s.problem is None


_WRITER = textwrap.dedent(
    """
    import sys, numpy as np
    from localspec.suffix import store_files
    from localspec.suffix.store import SuffixStore
    from localspec.suffix.calibration import CARRIED_TRIALS, cells_from
    from localspec.suffix.drafter import SuffixDrafter
    from localspec.suffix.index import SuffixIndex
    store_files.JOURNAL_MIN_TOKENS = 2000  # a new snapshot every 20 saves, appends to the journal between
    s = SuffixStore(sys.argv[1], sys.argv[2])
    rng = np.random.default_rng(0)
    ix = SuffixIndex()
    for _ in range(8):
        ix.add_request(rng.integers(0, 30000, 30000).tolist())
    print("ready", flush=True)
    while True:  # most of the time is spent writing snapshots; kills land in appends too
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
    SuffixStore(tmp_path, FP).save(_index(), CELLS)
    SuffixStore(tmp_path, OTHER, namespace="b").save(_index(n_requests=3))
    (tmp_path / "junk.lsstore").write_bytes(b"nope")
    infos = {i.path.name: i for i in list_stores(tmp_path)}
    assert len(infos) == 3
    good = infos[store_path(tmp_path, FP).name]
    assert good.fingerprint == FP and good.history_requests == 20 and good.history_tokens == 6000
    assert good.corpus_documents == 3 and good.size_bytes > 0 and good.problem is None
    assert infos["junk.lsstore"].problem
    assert (
        good.size_bytes == good.path.stat().st_size + store_files.calibration_path(good.path).stat().st_size
    )
    gone = store_info.clear(tmp_path)
    assert len(gone) == 4 and list_stores(tmp_path) == [] and not list(tmp_path.iterdir())
    assert store_info.clear(tmp_path / "none") == []


CELLS = [("history", 4, True, 0, 3, 12.0, 11.0), ("prompt", 0, False, 2, 0, 40.0, 9.0)]


def test_calibration_round_trip_and_a_new_drafter_starts_from_it(tmp_path):
    s = SuffixStore(tmp_path, FP, n_vocab=1000)
    assert s.save(_index(), CELLS)
    path = s.calibration_path
    assert path.name.endswith(".lscal") and stat.S_IMODE(os.stat(path).st_mode) == 0o600
    again = SuffixStore(tmp_path, FP, n_vocab=1000)
    again.load()
    assert again.problem is None and sorted(again.calibration) == sorted(CELLS)
    drafter = SuffixDrafter(SuffixIndex(), calibration=again.calibration)
    assert drafter.calibration[(("history", 4, True, 0), 3)] == [12.0, 11.0]
    assert drafter.carried_calibration() == [CELLS[1]]  # the prompt's cells carry on, see CARRIED_SOURCES
    # a save without a calibration (``localspec index``) leaves the saved one alone
    assert again.save(_index(n_requests=2))
    third = SuffixStore(tmp_path, FP)
    third.load()
    assert sorted(third.calibration) == sorted(CELLS)
    # other namespaces and vocabularies have their own (none here)
    other = SuffixStore(tmp_path, FP, namespace="b")
    other.load()
    assert other.calibration == [] and other.problem is None


TOKENS = [("prompt", 17, 30.0, 27.0), ("history", 999, 4.5, 0.0)]


def test_token_table_round_trip_and_files_without_one(tmp_path):
    """The drafter's token table is saved with the calibration; a file from before it existed (no
    ``tokens`` field) loads with an empty table and its cells intact."""
    s = SuffixStore(tmp_path, FP, n_vocab=1000)
    assert s.save(_index(), CELLS, TOKENS)
    again = SuffixStore(tmp_path, FP, n_vocab=1000)
    again.load()
    assert again.problem is None and sorted(again.tokens) == sorted(TOKENS)
    drafter = SuffixDrafter(SuffixIndex(), calibration=again.calibration, tokens=again.tokens)
    assert drafter.tokens["prompt"][17] == [30.0, 27.0] and drafter.token_totals["history"] == [4.5, 0.0]
    assert drafter.carried_tokens() == [TOKENS[0]]  # the prompt's table carries on, see CARRIED_SOURCES
    doc = json.loads(s.calibration_path.read_bytes())
    del doc["tokens"]
    s.calibration_path.write_text(json.dumps(doc))
    old = SuffixStore(tmp_path, FP, n_vocab=1000)
    old.load()
    assert old.problem is None and old.tokens == [] and sorted(old.calibration) == sorted(CELLS)
    # what a drafter saves after a request, a load accepts
    drafter = SuffixDrafter(old.load(), store=old, tokens=TOKENS)
    drafter.begin([1, 2, 3])
    drafter.finish([1, 2, 3, 4])
    third = SuffixStore(tmp_path, FP, n_vocab=1000)
    third.load()
    assert third.problem is None and third.tokens == [TOKENS[0]]


def test_the_largest_token_table_a_drafter_carries_fits_a_calibration_file(tmp_path):
    n_vocab = 151_936
    big = [
        (source, n_vocab - 1 - t, TOKEN_TRIALS / 3 - t * 1e-4, TOKEN_TRIALS / 3 - t * 2e-4)
        for source in ("prompt", "history", "corpus")
        for t in range(CARRIED_TOKENS)
    ]
    drafter = SuffixDrafter(SuffixIndex(), tokens=big)
    carried = drafter.carried_tokens()
    assert len(carried) == CARRIED_TOKENS  # the prompt's table alone carries on
    s = SuffixStore(tmp_path, FP, n_vocab=n_vocab)
    assert s.save(_index(), CELLS, big)  # even every source's (as a file may hold) fits
    assert s.calibration_path.stat().st_size < store_files.MAX_CALIBRATION_BYTES
    again = SuffixStore(tmp_path, FP, n_vocab=n_vocab)
    again.load()
    assert again.problem is None and len(again.tokens) == len(big)


def test_a_running_drafter_forgets_its_calibration_when_the_cache_is_cleared(tmp_path):
    """``localspec cache clear`` deletes the calibration file too; a server running beside it used to write
    the calibration it held back at its next request."""
    s = SuffixStore(tmp_path, FP, n_vocab=1000)
    drafter = SuffixDrafter(s.load(), store=s, calibration=CELLS, tokens=TOKENS)
    drafter.begin([1, 2, 3])
    drafter.finish([1, 2, 3, 4])
    kept = SuffixStore(tmp_path, FP)
    kept.load()
    assert kept.calibration == [CELLS[1]]
    store_info.clear(tmp_path)
    drafter.begin([5, 6])
    drafter.finish([5, 6, 7])
    assert drafter.calibration == {} and drafter.index.forgotten == 1 and _files(tmp_path) == []
    assert drafter.tokens == {} and drafter.carried_tokens() == []
    drafter.begin([8, 9])
    drafter.finish([8, 9, 9])
    again = SuffixStore(tmp_path, FP)
    assert _held(again.load()) == [[8, 9, 9]] and again.calibration == [] and again.tokens == []


def test_carried_calibration_is_the_prompts_scaled_down_to_a_few_trials_keeping_acceptance():
    d = SuffixDrafter(SuffixIndex())
    d.calibration = {
        (("prompt", 5, True, 1), 4): [1000, 900],
        (("prompt", 1, True, 0), 0): [3, 1],
        (("prompt", 0, True, 0), 1): [0, 0],
        (("history", 4, True, 0), 3): [40, 30],  # how related the next request is: learnt afresh
        (("corpus", 0, True, 0), 1): [8, 2],
    }
    carried = {c[:5]: c[5:] for c in d.carried_calibration()}
    assert carried == {
        ("prompt", 5, True, 1, 4): (CARRIED_TRIALS, 0.9 * CARRIED_TRIALS),
        ("prompt", 1, True, 0, 0): (3.0, 1.0),
    }
    assert cells_from(d.carried_calibration())  # what it saves, it can read
    d.calibration = {(("prompt", 4, True, 0), b): [r, r - 1] for b, r in enumerate(range(65, 72))}
    d.calibration |= {(("prompt", 3, True, 0), b): [r, r] for b, r in enumerate(range(3001, 3008))}
    assert len(cells_from(d.carried_calibration())) == 14  # every count scales into what a load accepts


def _calibration_file(**changes) -> bytes:
    doc = {"format": store_files.CALIBRATION_FORMAT, "version": 1, "fingerprint": FP, "namespace": "default"}
    return json.dumps(doc | {"cells": []} | changes).replace('"NaN"', "NaN").encode()


@pytest.mark.parametrize(
    "content",
    [
        b"{not json",
        b"[]",
        _calibration_file(format="something else"),
        _calibration_file(version=9),
        _calibration_file(fingerprint=OTHER),
        _calibration_file(namespace="x"),
        _calibration_file(cells={}),
        b" " * (store_files.MAX_CALIBRATION_BYTES + 1),
    ]
    + [
        _calibration_file(cells=[cell])
        for cell in (
            ["history", 4, True, 0, 3, 5, 6],  # more accepted than reached
            ["history", 4, True, 0, 3, 1e9, 1],  # more trials than a saved cell holds
            ["history", 4, True, 0, 3, -1, 0],
            ["history", 4, True, 0, 3, "NaN", 0],
            ["model", 4, True, 0, 3, 5, 1],  # the draft model is never calibrated here
            ["history", 99, True, 0, 3, 5, 1],
            ["history", 4, 1, 0, 3, 5, 1],
            ["history", 4, True, 0, 7, 5, 1],
            ["history", 4, True, 0],
            "history",
        )
    ]
    + [_calibration_file(tokens={})]
    + [
        _calibration_file(tokens=[row])
        for row in (
            ["prompt", 17, 3, 4],  # more accepted than reached
            ["prompt", 17, 1e9, 1],  # more trials than a saved table holds
            ["prompt", 17, -1, 0],
            ["prompt", 17, "NaN", 0],
            ["prompt", 1000, 3, 1],  # not a token of this vocabulary
            ["prompt", -1, 3, 1],
            ["prompt", 1.5, 3, 1],
            ["prompt", True, 3, 1],
            ["model", 17, 3, 1],
            ["prompt", 17, 3],
            17,
        )
    ],
)
def test_damaged_or_hostile_calibration_is_reported_and_drafting_learns_afresh(tmp_path, content, caplog):
    s = SuffixStore(tmp_path, FP, n_vocab=1000)
    assert s.save(_index(), CELLS)
    s.calibration_path.write_bytes(content)
    again = SuffixStore(tmp_path, FP, n_vocab=1000)
    index = again.load()
    assert again.calibration == [] and again.tokens == []
    assert index.history_requests == 20  # the requests still load
    assert again.problem and "calibration" in again.problem and "\n" not in again.problem
    assert "learns afresh" in caplog.text


def test_calibration_behind_a_symlink_is_not_followed(tmp_path):
    s = SuffixStore(tmp_path / "c", FP)
    assert s.save(_index(), CELLS)
    target = tmp_path / "elsewhere.lscal"
    s.calibration_path.rename(target)
    s.calibration_path.symlink_to(target)
    again = SuffixStore(tmp_path / "c", FP)
    again.load()
    assert again.calibration == [] and again.problem and "cannot read" in again.problem


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
    scan = corpus.read_corpus(src, max_file_bytes=1000)
    assert [p for p, _ in scan.files] == ["notes.md", os.path.join("pkg", "a.py")]
    assert scan.skipped["binary"] == 1 and scan.skipped["not UTF-8 text"] == 1
    assert scan.skipped["symlink or special file"] == 1 and scan.skipped["hidden or build folder"] == 2
    assert corpus.read_corpus(src, max_files=1).stopped
    with pytest.raises(CacheError):
        corpus.read_corpus(tmp_path / "missing")
    with pytest.raises(CacheError):
        corpus.read_corpus(src / "notes.md")


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
    from localspec.gguf.meta import read_metadata
    from localspec.gguf.vocab import fingerprint

    fp = fingerprint(read_metadata(constants.EMBEDDED_TARGET)).fingerprint
    assert info.fingerprint == fp
    ix = SuffixStore(cache_dir, fp).load()
    doc = ix.corpus.tokens[:12].tolist()
    ix.begin(doc[:6])
    (prop,) = ix.propose(doc[:6], 4)
    assert prop.source == "corpus" and prop.tokens == doc[6:10]

    out = runner.invoke(cli, ["cache", "info", "--dir", str(cache_dir)]).output
    assert str(info.path) in out and "corpus" in out and "1 files" in out
    assert f"`localspec cache clear --dir {cache_dir}` deletes them" in out  # the folder listed, not another
    assert (
        "Nothing deleted"
        in runner.invoke(cli, ["cache", "clear", "--dir", str(cache_dir)], input="n\n").output
    )
    # no answer (stdin at its end, as in a script): a usage error naming --yes, not a bare "Aborted!"
    r = runner.invoke(cli, ["cache", "clear", "--dir", str(cache_dir)], input="")
    assert r.exit_code == 2 and "add --yes" in r.output and "Aborted" not in r.output, r.output
    # --costs clears the measured costs, which --dir does not name: refused rather than ignored
    r = runner.invoke(cli, ["cache", "clear", "--costs", "--dir", str(cache_dir)])
    assert r.exit_code == 2 and "drop --dir" in r.output, r.output
    assert info.path.exists()
    assert (
        "Deleted 1 file(s)" in runner.invoke(cli, ["cache", "clear", "--dir", str(cache_dir), "--yes"]).output
    )
    assert not info.path.exists()

    # errors are one clear line with a next step, never a traceback
    r = runner.invoke(cli, ["index", str(src), "--target", str(tmp_path / "x.gguf"), "--dir", str(cache_dir)])
    assert r.exit_code == 1 and "Error:" in r.output and "->" in r.output and "Traceback" not in r.output
    # a folder that is not one, or a namespace that is no file name: usage errors, as scan's and --corpus's
    for args, said in (
        (["index", str(tmp_path / "nope")], "does not exist"),
        (["index", str(next(src.iterdir()))], "is a file"),
        (["index", str(src), "--namespace", "../escape"], "use 1-64 letters, digits"),
    ):
        r = runner.invoke(cli, [*args, "--dir", str(cache_dir)])
        assert r.exit_code == 2 and said in r.output and "Traceback" not in r.output, r.output
    assert not list(tmp_path.glob("*escape*"))
    empty = tmp_path / "empty"
    empty.mkdir()
    r = runner.invoke(cli, ["index", str(empty), "--dir", str(cache_dir)])
    assert r.exit_code == 1 and "no text files" in r.output


# A damaged store: what `cache info` shows, and what the load says is lost --------------------------------
def _flip_middle(path: Path) -> None:
    """Two bytes flipped in the middle of the payload (of the file, for a store of some size): the header,
    checksummed apart, stays intact."""
    data = bytearray(path.read_bytes())
    _, _, n, _ = store_files._PREAMBLE.unpack_from(data)
    mid = (store_files._aligned(store_files._PREAMBLE.size + n) + len(data)) // 2
    data[mid] ^= 0xFF
    data[mid + 1] ^= 0xFF
    path.write_bytes(bytes(data))


def test_a_damaged_payload_is_listed_as_unusable_and_the_load_names_the_corpus_it_loses(tmp_path, caplog):
    """What a walkthrough found: `cache info` listed such a store as fine, and the next run dropped the
    indexed corpus saying only "ignoring it (the next save replaces it)"."""
    proj = tmp_path / "proj"
    s = SuffixStore(tmp_path / "c", FP, n_vocab=1000)
    s.corpus_root = str(proj)
    assert s.save(_index())
    _flip_middle(s.path)
    (info,) = list_stores(tmp_path / "c")
    assert info.problem == "its contents are corrupted (checksum mismatch)"
    assert info.corpus_root == str(proj) and info.corpus_documents == 3 and info.history_requests == 20
    back = SuffixStore(tmp_path / "c", FP, n_vocab=1000)
    assert back.load().history_tokens == 0 and back.load().corpus_tokens == 0
    problem = back.problem or ""
    assert "\n" not in problem and problem in caplog.text and str(s.path) in problem
    assert (
        "checksum mismatch" in problem
        and f"the corpus indexed from {proj} (600 tokens in 3 files)" in problem
    )
    assert "is gone, and its 20 earlier request(s) (6,000 tokens) with it" in problem
    # not the embedded target's vocabulary, not the default folder: the command says -t and --dir
    assert f"run `localspec index {proj} -t TARGET.gguf --dir {tmp_path / 'c'}` again" in problem
    assert back.unusable is not None and back.unusable.corpus_root == str(proj)
    assert back.save(_index(seed=1)) and back.load().history_tokens > 0 and back.problem is None
    assert back.unusable is None and list_stores(tmp_path / "c")[0].problem is None


def test_a_damaged_store_without_a_corpus_or_a_readable_header_starts_empty(tmp_path):
    s = SuffixStore(tmp_path, FP, n_vocab=1000)
    assert s.save(_index(n_requests=2))
    _flip_middle(s.path)
    s.load()
    assert s.problem and "checksum mismatch" in s.problem and "corpus indexed" not in s.problem
    assert "the cache starts empty, without its 2 earlier request(s) (600 tokens)" in s.problem
    data = bytearray(s.path.read_bytes())
    data[30] ^= 0x01  # the header: what the store held cannot be read
    s.path.write_bytes(bytes(data))
    s.load()
    assert s.problem and "its header is corrupted" in s.problem
    assert "the cache starts empty (what it held cannot be read; if a folder was indexed" in s.problem
    (info,) = list_stores(tmp_path)
    assert info.problem == "its header is corrupted (checksum mismatch)" and info.fingerprint == ""


def test_list_stores_checks_what_a_load_checks(tmp_path):
    """A well-formed file with a valid checksum that a load refuses (an index past its tokens), and a
    store renamed to another namespace, are listed as unusable too; a damaged journal is noted."""
    bad = SuffixStore(tmp_path, FP, n_vocab=1000)
    bad.save(_index())

    def mutate(header, arrays, payload):
        pos = arrays["history_pos"]
        pos[0] = 10**8
        _put(header, payload, "history_pos", pos)

    _rewrite(bad.path, mutate)
    moved = SuffixStore(tmp_path, OTHER, namespace="a", n_vocab=1000)
    moved.save(_index(n_requests=3))
    os.replace(moved.path, tmp_path / moved.path.name.replace("-a.", "-b."))
    s, _, requests = _journaled(tmp_path / "j")
    raw = bytearray(s.journal_path.read_bytes())
    raw[store_files._PREAMBLE.size + 2] ^= 0x01  # the journal's header
    s.journal_path.write_bytes(bytes(raw))
    infos = {i.path.name: i for i in list_stores(tmp_path)}
    assert infos[bad.path.name].problem == "its history index points outside its tokens"
    assert infos[f"{OTHER[:16]}-b.lsstore"].problem == "it belongs to another namespace"
    (journaled,) = list_stores(tmp_path / "j")
    assert journaled.problem is None and journaled.history_requests == 3  # the snapshot's, as a load gets
    assert journaled.journal_problem == "its header is corrupted (checksum mismatch)"


def test_the_embedded_targets_store_in_the_default_folder_is_indexed_again_by_the_plain_command(
    tmp_path, monkeypatch
):
    monkeypatch.setenv("LOCALSPEC_HOME", str(tmp_path / "home"))
    fp = store_info._embedded_fingerprint()
    assert fp
    info = store_info.StoreInfo(
        store_path(store_files.default_dir(), fp), 1, fingerprint=fp, namespace="default"
    )
    info.corpus_root = str(tmp_path / "my proj")
    assert store_info.reindex_command(info) == f"localspec index '{tmp_path / 'my proj'}'"
    info.namespace = "key-0123456789abcdef"
    assert store_info.reindex_command(info).endswith(" --namespace key-0123456789abcdef")


def test_cache_info_and_index_on_a_damaged_store(tmp_path):
    from click.testing import CliRunner

    src = tmp_path / "repo"
    src.mkdir()
    (src / "util.py").write_text("def add(a, b):\n    return a + b\n")
    cache_dir = tmp_path / "cache"
    runner, cli = CliRunner(), _cli()
    assert runner.invoke(cli, ["index", str(src), "--dir", str(cache_dir)]).exit_code == 0
    (info,) = list_stores(cache_dir)
    _flip_middle(info.path)
    out = runner.invoke(cli, ["cache", "info", "--dir", str(cache_dir)]).output
    assert "unusable: its contents are corrupted (checksum mismatch)" in out and "Traceback" not in out
    assert f"it held history 0 tokens in 0 requests; corpus {info.corpus_tokens} tokens in 1 files" in out
    assert f"-> the next run ignores it: the cache starts empty, so the corpus indexed from {src}" in out
    assert f"run `localspec index {src} --dir {cache_dir}` again" in out  # the embedded target: no -t
    # indexing again says what it replaces, once (not the load's "run `localspec index` again" as well)
    r = runner.invoke(cli, ["index", str(src), "--dir", str(cache_dir)])
    assert r.exit_code == 0 and "Indexed 1 file(s)" in r.output
    assert (
        r.output.count("checksum mismatch") == 1
        and "starting it afresh with this folder's corpus" in r.output
    )
    assert list_stores(cache_dir)[0].problem is None


def test_the_first_store_written_in_a_folder_says_what_it_keeps_and_how_to_stop_it_once(tmp_path, caplog):
    folder = tmp_path / "c"
    s = SuffixStore(folder, FP, n_vocab=1000)
    s.load()
    assert "keeps your prompts" not in caplog.text  # loading writes nothing, and says nothing
    assert s.save(_index())
    said = [r.getMessage() for r in caplog.records if "keeps your prompts" in r.getMessage()]
    assert len(said) == 1 and "\n" not in said[0]
    assert str(folder) in said[0] and "--no-store" in said[0] and "localspec cache clear" in said[0]
    assert s.save(_index(n_requests=25))  # later saves, and another vocabulary's first: nothing more
    assert SuffixStore(folder, OTHER, n_vocab=1000).save(_index(seed=2))
    assert sum("keeps your prompts" in r.getMessage() for r in caplog.records) == 1
    store_info.clear(folder)  # cleared: the next first write says it again
    assert SuffixStore(folder, FP, n_vocab=1000).save(_index(seed=3))
    assert sum("keeps your prompts" in r.getMessage() for r in caplog.records) == 2
