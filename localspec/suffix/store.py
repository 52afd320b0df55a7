"""The suffix cache on disk: per (target vocabulary fingerprint, namespace), a snapshot and a journal.

The snapshot (``<fingerprint>-<namespace>.lsstore``) holds a :class:`localspec.suffix.drafter.SuffixIndex`'s
arrays (the token history, the corpus and their sorted n-gram indexes, so loading costs a read and a
checksum, not a rebuild). Layout::

    b"LSSUFFIX" | u32 version | u32 header length | u32 CRC-32 of the header | header (JSON)
    | zero padding to 64 bytes | payload (the arrays, each 64-byte aligned)

The header names the vocabulary fingerprint, the namespace, a random snapshot id, each array's dtype,
length and offset, and the CRC-32 of the payload.

The journal (``<fingerprint>-<namespace>.lsjournal``) holds the requests finished since that snapshot,
so that the save after a request appends a few kilobytes instead of rewriting tens of megabytes::

    b"LSJOURNL" | u32 version | u32 header length | u32 CRC-32 of the header | header (JSON:
    fingerprint, namespace, snapshot id) | records

    record: u32 token count n | u32 CRC-32 of (the count's 4 bytes and the tokens) | n int32 tokens

(all little-endian). Loading reads the snapshot and replays the journal's records in order, as the
writer added them (:meth:`SuffixIndex.add_request`), if the journal names the snapshot's id (a journal
left behind by a writer killed while it compacted belongs to the previous snapshot and is ignored).
Replay stops at the first record that is incomplete, fails its checksum or holds a token outside the
vocabulary: a writer killed in the middle of an append leaves a torn last record, and every complete
record before it loads. Saving appends the requests finished since the last save (one write and an
fsync). It writes a new snapshot instead (and deletes the journal) when the journal would pass
:data:`JOURNAL_FRACTION` of the snapshot's tokens (at least :data:`JOURNAL_MIN_TOKENS`; replaying costs
about 1 ms per 1K tokens at load), when requests were evicted (the history passed its cap), when the
corpus changed, or when the journal holds a torn record. Nothing is ever appended to a file it did
not check. So the files stay bounded: the snapshot by the history cap, the journal by a fraction of it
(4 bytes per token).

Other processes on the same store (a server running while ``localspec index`` or ``localspec run`` save,
two servers): before a save, a store whose files were changed by another writer since it last loaded or
wrote them takes in what that writer saved, adds the requests its own index learnt since, and the index
holds the result (:meth:`SuffixStore.save`): nobody's requests are lost and a corpus indexed meanwhile is
kept and drafted from. When the other writer only appended to the journal (the usual case: two servers
saving after each request), only its new records are read and added, and this process's own come after
them, in memory as on disk (so a fresh load of the files is the same index); when it wrote a snapshot,
or anything else changed, the files are loaded again whole (60-170 ms at a million tokens, 264 ms at 4M).
With nothing new from another writer, checking costs two ``stat`` calls. A store whose snapshot was
deleted (``localspec cache clear``) forgets what its index held, and writes nothing of it back. Saves of
one store take turns under an advisory lock (``fcntl.flock`` on ``<fingerprint>-<namespace>.lslock``,
which exists only while a save holds it), so two processes saving at once never interleave appends or
lose each other's requests to a snapshot; a save that cannot get it within :data:`LOCK_WAIT_SECONDS` is
skipped (reported, and the next save writes its requests), and where there is no ``fcntl`` (Windows)
saves go on unlocked. ``localspec cache clear`` deletes each store's files under the same lock, so a save
in flight finishes first and its files go too (it used to be able to land right after the delete).

The calibration (``<fingerprint>-<namespace>.lscal``, JSON) keeps what the drafter learnt about how far
copies of a request's own prompt run (:meth:`localspec.suffix.drafter.SuffixDrafter.carried_calibration`)
and how
often each token it proposed from such copies held (its token table, ``carried_tokens``: an optional
``tokens`` field, which older versions ignore), so that a new process (every
``localspec run`` is one) drafts where the last one would have, instead of learning again while long
copies go by undrafted. It is rewritten whole after every request (a few kilobytes and 0.5 ms for a few
hundred tokens; at most 4,096 tokens, about 150 KB), the same crash-safe way; anything wrong
with it (damaged, hostile, another vocabulary) is reported in one line and drafting learns afresh.

A snapshot that is truncated, corrupted, of another version (version 1 had no journal; it is ignored
and replaced), of another vocabulary or namespace, or whose arrays are out of bounds is reported in one
line (:attr:`SuffixStore.problem`, and a logged warning) and ignored: the cache starts empty and the
next save replaces it. The header is checksummed apart from the payload, so when only the payload is
damaged (bytes flipped in the middle of the file) the header still says what is lost: the line names the
corpus folder it was indexed from and the ``localspec index`` command that indexes it again (the user's
corpus would otherwise be gone without a word after that save), or says that the cache starts empty (and
how many earlier requests went with it). A journal whose header is damaged or foreign is reported the
same way, and the snapshot loads without it. A store is never used for the wrong vocabulary and never
crashes the caller.

``localspec cache info`` (:func:`list_stores`) checks each store as a load does (header, payload
checksum, array table, structure) rather than trusting its header, so a store the next run would ignore
is listed as unusable, with what it held and what to do, before the run replaces it. That costs what a
load costs, once per store: at a million tokens (a 60 MB file) 27 ms to read it, 28 ms of CRC-32 and 10 ms
of structural checks (66 ms listed, against 0.6 ms for the header alone; 131 ms at the 2M-token default
cap; a 2-core machine, the file in the page cache), so it is always done (``info`` is a command a user runs
on purpose, and every run pays the same for its load) and there is no flag to skip it.

Writes are crash-safe: a snapshot, and a journal's first write, go to a temp file in the same folder
(created 0600), fsync, ``os.replace``, fsync of the folder, so a writer killed at any moment leaves the
old file or the new one; appends are checked record by record at load. The files hold the user's text
(as token ids), hence mode 0600 and a 0700 folder; separate namespaces (one per API key, say) keep
users apart: hit timing would reveal what another user's requests contained.
"""

from __future__ import annotations

import contextlib
import functools
import glob
import hashlib
import json
import logging
import os
import re
import secrets
import shlex
import stat
import struct
import tempfile
import time
import weakref
import zlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from localspec import constants
from localspec.errors import CacheError
from localspec.suffix.drafter import Cell, SuffixIndex, TokenCell, cells_from, token_cells_from

try:
    import fcntl
except ImportError:  # Windows: no advisory locks; saves go on unlocked, as they did before there was one
    fcntl = None  # type: ignore[assignment]

log = logging.getLogger(__name__)

MAGIC = b"LSSUFFIX"
#: 2: the header carries a snapshot id, and a journal may follow the snapshot (1: a snapshot alone).
VERSION = 2
SUFFIX = ".lsstore"
JOURNAL_MAGIC = b"LSJOURNL"
JOURNAL_VERSION = 1
JOURNAL_SUFFIX = ".lsjournal"
CALIBRATION_FORMAT = "localspec suffix calibration"
CALIBRATION_VERSION = 1
CALIBRATION_SUFFIX = ".lscal"
#: A calibration file is a few kilobytes (at most a few hundred cells) plus the token table (about 150 KB at
#: its largest, CARRIED_TOKENS tokens; 460 KB if every source's were written); a larger one is not read.
MAX_CALIBRATION_BYTES = 1 << 20
#: A save writes a new snapshot instead of appending once the journal would hold more than this share of
#: the snapshot's history tokens (or :data:`JOURNAL_MIN_TOKENS`, whichever is more).
JOURNAL_FRACTION = 0.125
JOURNAL_MIN_TOKENS = 65_536
_PREAMBLE = struct.Struct("<8sIII")  # magic, version, header length, header CRC-32
_RECORD = struct.Struct("<II")  # token count, CRC-32 of (the count's 4 bytes and the tokens)
_ALIGN = 64
MAX_HEADER = 1 << 20
#: Default cap of a store's history in tokens (about 60 MB per million tokens on disk and in memory).
DEFAULT_MAX_TOKENS = 2_000_000
#: Temp files of killed writers older than this are removed by the next save.
STALE_TEMP_SECONDS = 600.0
LOCK_SUFFIX = ".lslock"
#: How long a save waits for another writer's save to finish. The longest a save holds the lock is a full
#: reload and a new snapshot at the 2M-token default cap: 0.4 s and 0.7 s measured (a 2-core machine, a
#: 430 KB journal), so this is over four times that. Past it the save is skipped (its requests stay in
#: memory and go with the next save that gets the lock) and, until one does, saves only try once.
LOCK_WAIT_SECONDS = 5.0

_NAMESPACE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
_FINGERPRINT = re.compile(r"^[0-9a-f]{16,64}$")
#: Every array a store holds, with its dtype.
ARRAYS: dict[str, str] = {
    f"{group}_{name}": dtype
    for group in ("history", "corpus")
    for name, dtype in (("tokens", "<i4"), ("starts", "<i8"), ("keys", "<u4"), ("pos", "<i4"))
}


def default_dir() -> Path:
    """Where stores live unless told otherwise: ``suffix/`` in localspec's cache folder."""
    return constants.localspec_home() / "suffix"


def namespace_for_key(secret: str) -> str:
    """A namespace for a credential (an API key) that does not reveal it: 16 hex digits of its SHA-256."""
    return "key-" + hashlib.sha256(secret.encode("utf-8")).hexdigest()[:16]


def journal_path(path: str | os.PathLike[str]) -> Path:
    """The journal next to a snapshot file."""
    return Path(path).with_suffix(JOURNAL_SUFFIX)


def lock_path(path: str | os.PathLike[str]) -> Path:
    """The lock file next to a snapshot file (it exists only while a save holds it)."""
    return Path(path).with_suffix(LOCK_SUFFIX)


def calibration_path(path: str | os.PathLike[str]) -> Path:
    """The drafter's calibration next to a snapshot file."""
    return Path(path).with_suffix(CALIBRATION_SUFFIX)


def store_path(directory: str | os.PathLike[str], fingerprint: str, namespace: str = "default") -> Path:
    """The file of one (vocabulary, namespace) store."""
    if not isinstance(fingerprint, str) or not _FINGERPRINT.match(fingerprint):
        raise CacheError(
            f"vocabulary fingerprint {fingerprint!r} is not 16-64 lowercase hex digits",
            hint="pass localspec.gguf.vocab.fingerprint(meta).fingerprint of the target",
        )
    if not isinstance(namespace, str) or not _NAMESPACE.match(namespace):
        raise CacheError(
            f"cache namespace {namespace!r} is not usable as a file name",
            hint="use 1-64 letters, digits, '.', '_' or '-', starting with a letter or digit",
        )
    return Path(directory) / f"{fingerprint[:16]}-{namespace}{SUFFIX}"


@dataclass
class StoreInfo:
    """What ``localspec cache info`` shows about one store file, checked as a load checks it. A store that
    cannot be used has ``problem`` (why) and, when its header still reads, the header's counts: what it
    held, for :func:`what_is_lost`."""

    path: Path
    size_bytes: int
    fingerprint: str = ""
    namespace: str = ""
    history_tokens: int = 0
    history_requests: int = 0
    corpus_tokens: int = 0
    corpus_documents: int = 0
    corpus_root: str = ""
    saved_at: float = 0.0
    problem: str | None = None
    journal_problem: str | None = None  # why its journal is not loaded (the snapshot loads without it)


_Identity = tuple[int, int, int, int]  # device, inode, size, mtime (ns) of a file


def _identity(st: os.stat_result) -> _Identity:
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


@dataclass
class _Synced:
    """What the files on disk hold, as this store last wrote or loaded them."""

    history: Callable[[], object | None]  # weak references: the index's groups at that time
    corpus: Callable[[], object | None]
    corpus_root: str
    added: int  # the history's added / dropped counters the files account for
    dropped: int
    snapshot_id: str
    snapshot: _Identity | None  # None: there was no snapshot (this index started empty, or was cleared)
    snapshot_tokens: int
    journal: tuple[int, int] | None = None  # device and inode of our journal; None: there is none yet
    journal_end: int = 0  # its bytes that are ours (complete records)
    journal_tokens: int = 0


def _nothing_on_disk(index: SuffixIndex) -> _Synced:
    """In sync with no files at all: ``index`` (empty, or forgotten after a clear) was never saved."""
    return _Synced(
        weakref.ref(index.history),
        weakref.ref(index.corpus),
        "",
        index.history_added,
        index.history_dropped,
        "",
        None,
        0,
    )


class SuffixStore:
    """A persisted :class:`SuffixIndex` for one target vocabulary (and one namespace).

    ``load()`` returns the index (empty when there is no usable file; :attr:`problem` then says why);
    ``save(index)`` writes it crash-safely: after a load or a save of the same index, it appends the
    requests finished since to the journal (see the module docstring). A
    :class:`localspec.suffix.drafter.SuffixDrafter` given ``store=this`` saves after every finished request.
    """

    def __init__(
        self,
        directory: str | os.PathLike[str] | None,
        fingerprint: str,
        *,
        namespace: str = "default",
        max_tokens: int = DEFAULT_MAX_TOKENS,
        n_vocab: int | None = None,
    ) -> None:
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
            raise CacheError(f"max_tokens must be a positive whole number, got {max_tokens!r}")
        self.directory = Path(directory) if directory is not None else default_dir()
        self.path = store_path(self.directory, fingerprint, namespace)
        self.journal_path = journal_path(self.path)
        self.calibration_path = calibration_path(self.path)
        self.lock_path = lock_path(self.path)
        self.fingerprint = fingerprint
        self.namespace = namespace
        self.max_tokens = max_tokens
        self.n_vocab = n_vocab
        self.problem: str | None = None  # why the last load or save could not use the file
        #: the snapshot the last load could not use (why, and what its header says it held), or None
        self.unusable: StoreInfo | None = None
        #: the drafter's calibration as the last process saved it (:meth:`load` reads it), for
        #: :class:`localspec.suffix.drafter.SuffixDrafter`'s ``calibration``
        self.calibration: list[Cell] = []
        #: the drafter's token table as the last process saved it, for its ``tokens``
        self.tokens: list[TokenCell] = []
        self.corpus_root = ""
        self._synced: _Synced | None = None
        self._lock_stuck = False  # the last save found the lock held past LOCK_WAIT_SECONDS
        self._unlocked_said = False  # the lock file could not be used (said once)

    # Loading ---------------------------------------------------------------------------------------
    def load(self) -> SuffixIndex:
        """The stored index, or an empty one when the file is missing or unusable (see :attr:`problem`)."""
        self.problem = None
        self.unusable = None
        self._synced = None
        self.calibration, self.tokens = self._load_calibration()
        fresh = SuffixIndex(max_history_tokens=self.max_tokens, n_vocab=self.n_vocab)
        try:
            data, st = _read(self.path)
        except FileNotFoundError:
            self._synced = _nothing_on_disk(fresh)
            return fresh
        except OSError as exc:
            return self._ignore(
                StoreInfo(self.path, 0, problem=f"cannot read it ({exc.strerror or exc})"), fresh
            )
        held = StoreInfo(self.path, len(data))
        try:
            header = _parse_header(data, len(data), self.path)
            _check_owner(header, self.fingerprint, self.namespace)
            held = _header_info(self.path, len(data), header)  # ours, and it reads: it says what is lost
            arrays = _payload(data, header)
            snapshot_id = header.get("snapshot_id")
            if not isinstance(snapshot_id, str) or not snapshot_id:
                raise _Bad("its header lacks the snapshot id")
            _check(arrays, self.n_vocab)
        except _Bad as exc:
            held.problem = str(exc)
            if held.fingerprint:
                _count_journal(held, header)  # its journal's requests are lost with it
            return self._ignore(held, fresh)
        self.corpus_root = str(header.get("corpus_root", ""))
        index = SuffixIndex.from_state(arrays, max_history_tokens=self.max_tokens, n_vocab=self.n_vocab)
        synced = _Synced(
            weakref.ref(index.history),
            weakref.ref(index.corpus),
            self.corpus_root,
            index.history_added,
            index.history_dropped,
            snapshot_id,
            _identity(st),
            index.history_tokens,
        )
        # a journal is never larger than a share of its snapshot: one far larger is not replayed
        self._replay(index, synced, _journal_cap(max(self.max_tokens, int(header.get("history_tokens", 0)))))
        # requests evicted while loading (a smaller cap than the writer's): the next save writes it all
        self._synced = synced if index.history_dropped == 0 else None
        return index

    def _replay(self, index: SuffixIndex, synced: _Synced, cap: int) -> None:
        """Add the journal's complete records to ``index`` (and note how much of the journal is ours)."""
        try:
            fd = os.open(self.journal_path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
        except FileNotFoundError:
            return
        except OSError as exc:
            self._warn(f"cannot read its journal ({exc.strerror or exc}); loaded without it")
            return
        with os.fdopen(fd, "rb") as fh:
            st = os.fstat(fh.fileno())
            if st.st_size > cap:
                self._warn("its journal is larger than a store of this size writes; loaded without it")
                return
            data = fh.read()
        try:
            records, end = _parse_journal(
                data, self.fingerprint, self.namespace, synced.snapshot_id, self.n_vocab
            )
        except _Stale:
            return  # left behind by a writer killed while it wrote a new snapshot: the snapshot has it all
        except _Bad as exc:
            self._warn(f"its journal {self.journal_path.name}: {exc}; loaded without it")
            return
        for tokens in records:
            index.add_request(tokens)
        if end < len(data):
            log.info(
                "suffix cache %s: ignored %d bytes after %d complete records (a save that did not finish)",
                self.journal_path,
                len(data) - end,
                len(records),
            )
        synced.added = index.history_added
        synced.journal = (st.st_dev, st.st_ino)
        synced.journal_end = end
        synced.journal_tokens = sum(r.size for r in records)

    def _load_calibration(self) -> tuple[list[Cell], list[TokenCell]]:
        """The saved calibration and token table, or none when the file is missing or unusable (a warning
        says why; a file without a token table, as older versions wrote it, has an empty one)."""
        try:
            fd = os.open(self.calibration_path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
        except FileNotFoundError:
            return [], []
        except OSError as exc:
            self._warn_calibration(f"cannot read it ({exc.strerror or exc})")
            return [], []
        with os.fdopen(fd, "rb") as fh:
            data = fh.read(MAX_CALIBRATION_BYTES + 1)
        try:
            if len(data) > MAX_CALIBRATION_BYTES:
                raise _Bad("it is larger than a calibration file can be")
            try:
                doc = json.loads(data)
            except ValueError as exc:
                raise _Bad("it is not valid JSON") from exc
            if not isinstance(doc, dict) or doc.get("format") != CALIBRATION_FORMAT:
                raise _Bad("it is not a localspec calibration file")
            if doc.get("version") != CALIBRATION_VERSION:
                raise _Bad(f"it has format version {doc.get('version')!r}, this localspec reads 1")
            _check_owner(doc, self.fingerprint, self.namespace)
            rows, token_rows = doc.get("cells"), doc.get("tokens", [])
            if not isinstance(rows, list):
                raise _Bad("it has no list of cells")
            if not isinstance(token_rows, list):
                raise _Bad("its token table is not a list")
            try:
                return cells_from(rows), token_cells_from(token_rows, self.n_vocab)
            except ValueError as exc:
                raise _Bad(str(exc)) from exc
        except _Bad as exc:
            self._warn_calibration(str(exc))
            return [], []

    def _warn_calibration(self, why: str) -> None:
        self.problem = (
            f"suffix cache calibration {self.calibration_path}: {why}; drafting learns afresh "
            "(the next save replaces it)"
        )
        log.warning(self.problem)

    def _ignore(self, held: StoreInfo, fresh: SuffixIndex) -> SuffixIndex:
        """Start from ``fresh``: the snapshot cannot be used (``held.problem`` says why; ``held`` has its
        header's counts when the header reads). :attr:`problem` says what is lost and what to do."""
        self.unusable = held
        self.problem = (
            f"suffix cache {self.path}: {held.problem}; ignoring it: {what_is_lost(held)}; "
            "the next save replaces the file"
        )
        log.warning(self.problem)
        return fresh

    def _warn(self, why: str) -> None:
        self.problem = f"suffix cache {self.path}: {why} (the next save replaces it)"
        log.warning(self.problem)

    # Saving ----------------------------------------------------------------------------------------
    def save(
        self,
        index: SuffixIndex,
        calibration: Sequence[Cell] | None = None,
        tokens: Sequence[TokenCell] = (),
    ) -> bool:
        """Write ``index`` crash-safely: append the requests finished since the last load or save of it
        to the journal, or write a new snapshot (see the module docstring), after taking in what another
        process saved meanwhile (``index`` then holds it too; a cleared cache is forgotten, and nothing
        is written); then ``calibration``, when given, replaces the calibration file with it and
        the token table ``tokens`` (a whole small file, written the same crash-safe way). On a
        failure (disk full, permissions, the lock held by another process for over
        :data:`LOCK_WAIT_SECONDS`) returns False and sets :attr:`problem`; generation goes on without
        persistence (the requests not saved go with the next save).

        Taking in, appending or writing a snapshot happen under an advisory lock (:meth:`_locked`), so
        two processes saving at once do it one after the other: without it both could pass
        :meth:`_append`'s check of the journal's size and append (records interleaved, or one's lost to
        the other's snapshot). The calibration is written after the lock is released (one whole file,
        replaced atomically: the last writer's wins, as before)."""
        try:
            with self._locked() as held:
                if not held:
                    self.problem = (
                        f"suffix cache {self.path}: another process has held its lock for over "
                        f"{LOCK_WAIT_SECONDS:g} s; not saved this time (the next save writes these requests)"
                    )
                    log.warning(self.problem)
                    return False
                if not self._take_in(index):
                    return True  # the cache was cleared: nothing of what this index held is written back
                if not self._append(index):
                    self._write(index)
            if calibration is not None:
                doc = {
                    "format": CALIBRATION_FORMAT,
                    "version": CALIBRATION_VERSION,
                    "fingerprint": self.fingerprint,
                    "namespace": self.namespace,
                    "cells": [list(cell) for cell in calibration],
                    "tokens": [
                        [source, token, round(reached, 4), round(min(accepted, reached), 4)]
                        for source, token, reached, accepted in tokens
                    ],
                }
                self._replace(self.calibration_path, [json.dumps(doc, separators=(",", ":")).encode()])
        except OSError as exc:
            self.problem = (
                f"suffix cache {self.path}: cannot save ({exc.strerror or exc}); this process still "
                "remembers its requests. Point LOCALSPEC_HOME at a folder you can write, or keep it in "
                "memory (--no-store, suffix_store=False)"
            )
            log.warning(self.problem)
            return False
        self.problem = None
        return True

    @contextlib.contextmanager
    def _locked(self) -> Iterator[bool]:
        """Hold the store's lock (``fcntl.flock`` on :attr:`lock_path`) for the duration; yields False
        when another process held it past :data:`LOCK_WAIT_SECONDS` (once that happened, only one try
        until the lock is got again: a stuck holder, a stopped ``localspec run`` say, must not cost
        every request the wait). Without ``fcntl`` (Windows), or with a lock file that cannot be used
        (a symlink, which is never followed; a file system without locks), it goes on unlocked, as saves
        did before, and says so once.

        The lock file is created (0600, in the store's folder) by whoever takes the lock and deleted
        by it before it lets go, so that the folder holds only the store's files between saves (what
        ``localspec cache info`` and ``clear`` see, and a cleared cache stays empty). A process that
        waited on the file meanwhile finds it deleted (or replaced) once it gets its lock, and starts
        over with the path's current file: a lock on a deleted file excludes nobody.
        """
        try:
            fd = self._lock()
        except _Busy:
            yield False
            return
        try:
            yield True
        finally:
            if fd is not None:
                _release_lock(self.lock_path, fd)

    def _lock(self) -> int | None:
        """The descriptor of the held lock file, or None: no lock to be had here (see :meth:`_locked`).
        Raises :class:`_Busy` when another process held it past the wait."""
        try:
            fd = _take_lock(self.lock_path, 0.0 if self._lock_stuck else LOCK_WAIT_SECONDS)
        except _Busy:
            self._lock_stuck = True
            raise
        except _NoLock as exc:
            self._unlocked(str(exc))
            return None
        self._lock_stuck = False
        return fd

    def _unlocked(self, why: str) -> None:
        if not self._unlocked_said:
            self._unlocked_said = True
            log.warning("suffix cache %s: %s; saving without the lock", self.path, why)

    def _take_in(self, index: SuffixIndex) -> bool:
        """Before saving ``index``: if another process changed the files since this store last loaded or
        wrote them for this index, take in what it saved; False when there is nothing to write now.

        - The snapshot is gone (``localspec cache clear``, or its file deleted): the user asked to forget,
          so ``index`` forgets its history and corpus too (this request's included), and the drafter its
          calibration (:meth:`SuffixIndex.forget`); nothing is written back; the next request starts the
          store again.
        - Only the journal grew (the usual case with two servers on one store, or a server while
          ``localspec run`` commands save): the records after the ones this store knows are read and
          added (:meth:`_catch_up`): a save after another writer's took 10-14 ms at a million tokens
          (2,000-token requests, the append's sync included; a 2-core machine) instead of 156-340 ms
          with a reload of the whole store.
        - Otherwise, the snapshot or its journal is not the one this store knows (another process wrote a
          snapshot, or replaced or truncated the journal, or appended records that do not check): the
          files are loaded as that process left them, the requests this index added since it was last in
          sync are added, and ``index`` holds the result (:meth:`SuffixIndex.adopt`), so nobody's
          requests are lost and a corpus indexed meanwhile is kept (this process's own corpus wins only
          if it was set here since). Files that do not load (damaged, another version) are replaced by
          this index, as at a first save. That reload costs 60-170 ms at a million tokens (264 ms at 4M).

        Either way ``index`` then holds the other writer's requests first and this process's own after
        them, the order the files will hold them in once this save appended its own: a fresh load of the
        files gives the same index (the same arrays, so the same drafts).
        """
        s = self._synced
        if s is None or s.history() is not index.history:
            return True  # files this index never held, or unusable ones: the save replaces them
        try:
            now: _Identity | None = _identity(os.stat(self.path, follow_symlinks=False))
        except FileNotFoundError:
            now = None
        except OSError:
            return True  # the save reports what is wrong
        if now == s.snapshot and (now is None or not self._journal_moved(s)):
            return True  # the files are as this store left them (or there are still none)
        if now is None:  # there was a snapshot, and it is gone
            index.forget()
            self.corpus_root, self.calibration, self.tokens = "", [], []
            self._synced = _nothing_on_disk(index)
            log.info("suffix cache %s was cleared; this process forgot what it held too", self.path)
            return False
        if now == s.snapshot and self._catch_up(index, s):
            return True
        ours = index.history_since(max(s.added, index.history_dropped))
        corpus_here, root = s.corpus() is not index.corpus, self.corpus_root
        disk = self.load()
        if self._synced is None:
            return True  # another writer left files that do not load: this index replaces them
        if corpus_here:
            disk.corpus, self.corpus_root = index.corpus, root
        for tokens in ours:
            disk.add_request(tokens)
        index.adopt(disk)
        log.info(
            "suffix cache %s: another process saved it since; kept its %d requests (and corpus), added "
            "this process's %d",
            self.path,
            disk.history_requests - len(ours),
            len(ours),
        )
        return True

    def _catch_up(self, index: SuffixIndex, s: _Synced) -> bool:
        """Take in the records another writer appended to the journal since this store was in sync (the
        snapshot is still the one it knows); False when that is not all that happened, and the caller
        reloads everything.

        Read are the journal's bytes after :attr:`_Synced.journal_end` (always the end of a complete
        record, or of the header: this store only ever counts those), or the whole journal when this
        store knew none (the other writer started it after this store's snapshot; its header must name
        that snapshot). They are checked as at load (:func:`_parse_records`: counts, checksums, the
        vocabulary) and must be complete records to the last byte: a torn or damaged record, a journal
        that is another file or shorter than this store's part of it, or one larger than a store of this
        size writes, goes to the full reload, which handles each as a load does (a torn record: the
        complete ones are kept, and this save writes a new snapshot). So does a history that evicted
        requests since (the save writes a snapshot then anyway, which costs far more than the reload).

        This process's own requests since (usually one: the request just finished) are taken back out of
        ``index`` (:meth:`SuffixIndex.withdraw`), the other writer's added, and its own added again after
        them: the order the journal holds them in once :meth:`_append` wrote them. That takes them out of the
        history's recent part (the last 64K tokens or more, since it is merged into the rest only past
        max(64K, a quarter of the history)); when the request just finished was the one that merged it
        (one request in 33 of 2,000 tokens, one in 125 at a million tokens), taking it back would cost a
        pass over the whole index, and the full reload is done instead. Adding costs 1.2 ms per 1K
        tokens, so the exact order costs this process's own requests added twice: about 2.5 ms for a
        2,000-token request.
        """
        if index.history_dropped != s.dropped or index.history_added < s.added:
            return False
        try:
            fd = os.open(self.journal_path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
        except OSError:
            return False
        with os.fdopen(fd, "rb") as fh:
            st = os.fstat(fh.fileno())
            if st.st_size > _journal_cap(max(self.max_tokens, s.snapshot_tokens)):
                return False
            if s.journal is None:
                start = 0
            elif (st.st_dev, st.st_ino) == s.journal and st.st_size > s.journal_end:
                start = s.journal_end
            else:
                return False  # replaced (a new inode) or truncated
            fh.seek(start)
            data = fh.read()
        try:
            if start == 0:
                records, end = _parse_journal(
                    data, self.fingerprint, self.namespace, s.snapshot_id, self.n_vocab
                )
            else:
                records, end = _parse_records(data, 0, self.n_vocab)
        except (_Bad, _Stale):
            return False
        if end != len(data):
            return False  # a torn or damaged record: the reload keeps the complete ones
        ours = [np.array(a) for a in index.history_since(s.added)]  # copies: buf is reused below
        if ours and not index.withdraw(len(ours)):
            return False
        for tokens in records:
            index.add_request(tokens)
        s.journal = (st.st_dev, st.st_ino)
        s.journal_end = start + end
        s.journal_tokens += sum(r.size for r in records)
        s.added = index.history_added  # the files hold these; this save appends ours after them
        for tokens in ours:
            index.add_request(tokens)
        log.info(
            "suffix cache %s: another process appended %d requests since; took them in, this process's %d "
            "follow them",
            self.path,
            len(records),
            len(ours),
        )
        return True

    def _journal_moved(self, s: _Synced) -> bool:
        """True when the journal is not the one this store last wrote or loaded (another writer appended
        to it, or replaced it); a journal that is gone is not (the next save writes a snapshot anyway)."""
        try:
            st = os.stat(self.journal_path, follow_symlinks=False)
        except OSError:
            return False
        return s.journal is None or (st.st_dev, st.st_ino) != s.journal or st.st_size != s.journal_end

    def _append(self, index: SuffixIndex) -> bool:
        """Append the requests added to ``index`` since the files were in sync with it; False when a new
        snapshot must be written instead (another index or corpus, evictions, a journal past its share,
        files that are not the ones this store wrote or loaded)."""
        s = self._synced
        if (
            s is None
            or s.history() is not index.history
            or s.corpus() is not index.corpus
            or s.corpus_root != self.corpus_root
            or index.history_dropped != s.dropped
            or index.history_added < s.added
        ):
            return False
        try:
            if _identity(os.stat(self.path, follow_symlinks=False)) != s.snapshot:
                return False  # replaced (another process saved) or deleted (the cache was cleared)
        except OSError:
            return False
        new = index.history_since(s.added)
        if not new:
            return True
        n_new = sum(a.size for a in new)
        if s.journal_tokens + n_new > max(JOURNAL_MIN_TOKENS, int(s.snapshot_tokens * JOURNAL_FRACTION)):
            return False  # fold the journal into a new snapshot: replaying it would make loading slow
        records = b"".join(_record(a) for a in new)
        if s.journal is None:  # the first append after a snapshot: create the journal whole
            head = _journal_header(self.fingerprint, self.namespace, s.snapshot_id)
            st = self._replace(self.journal_path, [head, records])
            s.journal, s.journal_end = (st.st_dev, st.st_ino), len(head) + len(records)
        else:
            try:
                fd = os.open(self.journal_path, os.O_WRONLY | os.O_APPEND | getattr(os, "O_NOFOLLOW", 0))
            except FileNotFoundError:
                return False
            try:
                st = os.fstat(fd)
                if (st.st_dev, st.st_ino) != s.journal or st.st_size != s.journal_end:
                    return False  # a torn record, or another writer's: start over from a snapshot
                view = memoryview(records)
                while view:
                    view = view[os.write(fd, view) :]
                _fdatasync(fd)
            finally:
                os.close(fd)
            s.journal_end += len(records)
        s.added = index.history_added
        s.journal_tokens += n_new
        return True

    def _write(self, index: SuffixIndex) -> None:
        """A new snapshot of ``index`` (and no journal)."""
        arrays = {name: np.ascontiguousarray(a, dtype=ARRAYS[name]) for name, a in index.state().items()}
        table, offset = [], 0
        for name, a in arrays.items():
            table.append([name, ARRAYS[name], int(a.size), offset])
            offset = _aligned(offset + a.nbytes)
        crc = 0
        for a in arrays.values():
            crc = zlib.crc32(a.data.cast("B"), crc)
            crc = zlib.crc32(bytes(_aligned(a.nbytes) - a.nbytes), crc)
        snapshot_id = secrets.token_hex(8)
        header = {
            "fingerprint": self.fingerprint,
            "namespace": self.namespace,
            "snapshot_id": snapshot_id,
            "n_vocab": self.n_vocab,
            "saved_at": time.time(),
            "history_tokens": index.history_tokens,
            "history_requests": index.history_requests,
            "corpus_tokens": index.corpus_tokens,
            "corpus_documents": index.corpus_documents,
            "corpus_root": self.corpus_root,
            "arrays": table,
            "payload_bytes": offset,
            "payload_crc32": crc,
        }
        blob = json.dumps(header, separators=(",", ":")).encode("utf-8")
        head = _PREAMBLE.pack(MAGIC, VERSION, len(blob), zlib.crc32(blob)) + blob
        head += bytes(_aligned(len(head)) - len(head))
        chunks: list[bytes | memoryview] = [head]
        for a in arrays.values():
            chunks += [a.data.cast("B"), bytes(_aligned(a.nbytes) - a.nbytes)]
        st = self._replace(self.path, chunks)
        # the journal's requests are in the snapshot now (a journal left behind by a kill right here names
        # the previous snapshot's id and is ignored)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.journal_path)
        self._synced = _Synced(
            weakref.ref(index.history),
            weakref.ref(index.corpus),
            self.corpus_root,
            index.history_added,
            index.history_dropped,
            snapshot_id,
            _identity(st),
            index.history_tokens,
        )

    def _replace(self, path: Path, chunks: list[bytes | memoryview]) -> os.stat_result:
        """Write ``path`` whole and atomically: temp file (0600), fsync, rename, fsync of the folder."""
        self.directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        self._remove_stale_temps()
        fd, tmp = tempfile.mkstemp(dir=self.directory, prefix=f".{path.name}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as fh:
                os.fchmod(fh.fileno(), 0o600)
                for chunk in chunks:
                    fh.write(chunk)
                fh.flush()
                os.fsync(fh.fileno())
                st = os.fstat(fh.fileno())
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        _fsync_dir(self.directory)
        return st

    def _remove_stale_temps(self) -> None:
        now = time.time()
        for name in (self.path.name, self.journal_path.name, self.calibration_path.name):
            for p in self.directory.glob(f".{name}.*.tmp"):
                with contextlib.suppress(OSError):
                    if now - p.stat().st_mtime > STALE_TEMP_SECONDS:
                        p.unlink()


# Listing and clearing ------------------------------------------------------------------------------
def list_stores(directory: str | os.PathLike[str] | None = None) -> list[StoreInfo]:
    """Every store in ``directory`` (default :func:`default_dir`), checked as a load checks it (see the
    module docstring: 66 ms a store at a million tokens), with the journals' records (the requests saved
    since each snapshot are counted, their bytes included). A store a load would ignore has ``problem``
    and, when its header reads, what it held."""
    d = Path(directory) if directory is not None else default_dir()
    if not d.is_dir():
        return []
    return [_check_store(p) for p in sorted(d.glob(f"*{SUFFIX}"))]


def _check_store(path: Path) -> StoreInfo:
    """One store as :meth:`SuffixStore.load` would find it: the vocabulary and namespace are those its
    file name carries (:func:`store_path`), the vocabulary size the one its header names."""
    try:
        data, _ = _read(path)
    except OSError as exc:
        return StoreInfo(path, 0, problem=f"cannot read it ({exc.strerror or exc})")
    info = StoreInfo(path, len(data))
    header: dict = {}
    try:
        header = _parse_header(data, len(data), path)
        prefix, _, namespace = path.name[: -len(SUFFIX)].partition("-")
        fingerprint = str(header.get("fingerprint", ""))
        _check_owner(header, fingerprint if fingerprint[:16] == prefix else prefix, namespace)
        info = _header_info(path, len(data), header)
        arrays = _payload(data, header)
        if not isinstance(header.get("snapshot_id"), str) or not header["snapshot_id"]:
            raise _Bad("its header lacks the snapshot id")
        n_vocab = header.get("n_vocab")
        _check(arrays, n_vocab if isinstance(n_vocab, int) and not isinstance(n_vocab, bool) else None)
    except _Bad as exc:
        info.problem = str(exc)
    del data
    if info.fingerprint:
        _count_journal(info, header)
    with contextlib.suppress(OSError):
        info.size_bytes += calibration_path(path).stat().st_size
    return info


def _header_info(path: Path, size: int, header: dict) -> StoreInfo:
    """What a checked snapshot header says its store holds (a field of the wrong type counts as absent)."""

    def number(key: str, kind: type = int) -> float:
        value = header.get(key, 0)
        return kind(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else kind(0)

    return StoreInfo(
        path,
        size,
        fingerprint=str(header.get("fingerprint", "")),
        namespace=str(header.get("namespace", "")),
        history_tokens=int(number("history_tokens")),
        history_requests=int(number("history_requests")),
        corpus_tokens=int(number("corpus_tokens")),
        corpus_documents=int(number("corpus_documents")),
        corpus_root=str(header.get("corpus_root", "") or ""),
        saved_at=float(number("saved_at", float)),
    )


def what_is_lost(info: StoreInfo | None) -> str:
    """What ignoring an unusable store costs and what to do, after "ignoring it: " (the load's line,
    ``localspec cache info``): the corpus folder its header names, with the ``localspec index`` command
    that indexes it again (:func:`reindex_command`), or that the cache starts empty and without how many
    earlier requests; when the header does not read, that what it held is unknown."""
    if info is None or not info.fingerprint:
        return (
            "the cache starts empty (what it held cannot be read; if a folder was indexed into it, run "
            "`localspec index FOLDER` again)"
        )
    held = (
        f"{info.history_requests:,} earlier request(s) ({info.history_tokens:,} tokens)"
        if info.history_requests
        else ""
    )
    if not info.corpus_root:
        return "the cache starts empty" + (f", without its {held}" if held else "")
    command = reindex_command(info)
    return (
        f"the cache starts empty, so the corpus indexed from {info.corpus_root} ({info.corpus_tokens:,} "
        f"tokens in {info.corpus_documents:,} files) is gone"
        + (f", and its {held} with it" if held else "")
        + f": run `{command}` again"
        + (" (TARGET.gguf: the target model it drafts for)" if " -t " in command else "")
    )


def reindex_command(info: StoreInfo) -> str:
    """The command that indexes ``info``'s corpus folder into the same store again: with ``-t`` unless the
    store is the embedded target's vocabulary (what ``localspec index`` indexes for without it), and
    ``--namespace`` and ``--dir`` when they are not the defaults."""
    parts = ["localspec index", shlex.quote(info.corpus_root)]
    if info.fingerprint != _embedded_fingerprint():
        parts.append("-t TARGET.gguf")
    if info.namespace and info.namespace != "default":
        parts.append(f"--namespace {shlex.quote(info.namespace)}")
    if not _same_folder(info.path.parent, default_dir()):
        parts.append(f"--dir {shlex.quote(str(info.path.parent))}")
    return " ".join(parts)


@functools.lru_cache(maxsize=1)
def _embedded_fingerprint() -> str:
    """The embedded target's vocabulary fingerprint ("" when it cannot be read): 3-4 ms to read its GGUF
    header, asked only when a message names a corpus to index again."""
    try:
        from localspec.gguf.meta import read_metadata
        from localspec.gguf.vocab import fingerprint

        return fingerprint(read_metadata(constants.EMBEDDED_TARGET, merges=False)).fingerprint or ""
    except Exception:  # any failure: the command then says -t, which is right for any model
        return ""


def _same_folder(a: Path, b: Path) -> bool:
    try:
        return a.resolve() == b.resolve()
    except OSError:
        return a == b


def _count_journal(info: StoreInfo, header: dict) -> None:
    """Add the requests of a snapshot's journal (when it has one of its own) to ``info``; a journal a load
    would not replay (a damaged or foreign header, too large) is noted in ``info.journal_problem``."""
    path = journal_path(info.path)
    try:
        st = path.stat()
        if st.st_size > _journal_cap(max(DEFAULT_MAX_TOKENS, info.history_tokens)):
            info.size_bytes += st.st_size
            info.journal_problem = "it is larger than a store of this size writes"
            return
        data, _ = _read(path)
        records, _ = _parse_journal(
            data, info.fingerprint, info.namespace, str(header.get("snapshot_id", "")), header.get("n_vocab")
        )
    except _Bad as exc:
        info.size_bytes += st.st_size
        info.journal_problem = str(exc)
        return
    except (OSError, _Stale):
        return
    info.size_bytes += st.st_size
    info.history_tokens += sum(r.size for r in records)
    info.history_requests += len(records)
    if records:
        info.saved_at = max(info.saved_at, st.st_mtime)


def clear(directory: str | os.PathLike[str] | None = None) -> list[Path]:
    """Delete every store file, journal, calibration, lock file (left by a process killed while it saved)
    and leftover temp file in ``directory``; returns what was deleted. Each store's files go under its
    lock, so a save running meanwhile (a server beside ``localspec cache clear``) finishes first and its
    snapshot goes too, rather than landing after the delete and bringing the store back."""
    d = Path(directory) if directory is not None else default_dir()
    if not d.is_dir():
        return []
    suffixes = (SUFFIX, JOURNAL_SUFFIX, CALIBRATION_SUFFIX, LOCK_SUFFIX)

    def files(stem: str = "*") -> list[Path]:
        return [
            p
            for suffix in suffixes
            for kind in (f"{stem}{suffix}", f".{stem}{suffix}.*.tmp")
            for p in d.glob(kind)
        ]

    stems = set()
    for p in files():
        suffix = next(x for x in suffixes if x in p.name)
        stems.add(p.name[: -len(suffix)] if p.name.endswith(suffix) else p.name[1:].split(suffix)[0])
    gone = []
    for stem in sorted(stems):
        lock = d / f"{stem}{LOCK_SUFFIX}"
        left = lock.exists()  # by a writer killed while it saved (or one saving now, which is waited for)
        try:
            fd = _take_lock(lock, LOCK_WAIT_SECONDS)
        except _Busy:
            raise CacheError(
                f"cannot clear {d / (stem + SUFFIX)}: another localspec process has been saving to it for "
                f"over {LOCK_WAIT_SECONDS:g} s",
                hint="stop the server or run using this cache (or wait for it to finish), then clear again",
            ) from None
        except _NoLock:
            fd = None  # no lock to be had here: delete as saves go on, unlocked
        try:
            for p in files(glob.escape(stem)):  # what is there now the lock is held
                if p == lock and fd is not None:
                    continue  # the lock file this holds: deleted as it lets go
                try:
                    p.unlink()
                except FileNotFoundError:
                    continue
                except OSError as exc:
                    raise CacheError(
                        f"cannot delete {p}: {exc.strerror or exc}", hint="check the folder's permissions"
                    ) from exc
                gone.append(p)
        finally:
            if fd is not None:
                _release_lock(lock, fd)
                if left:
                    gone.append(lock)
    return gone


# A corpus folder -------------------------------------------------------------------------------------
#: Folders never read for a corpus (besides hidden ones): build output, dependencies, caches.
SKIP_DIRS = frozenset({"node_modules", "__pycache__", "build", "dist", "target", "venv", "site-packages"})
MAX_CORPUS_FILES = 5000
MAX_CORPUS_FILE_BYTES = 1_000_000
MAX_CORPUS_BYTES = 50_000_000


@dataclass
class CorpusScan:
    """Text files found under a folder for the corpus, and what was skipped (reason -> count)."""

    root: Path
    files: list[tuple[str, str]]  # (path relative to root, text)
    skipped: dict[str, int]
    stopped: str | None = None  # why the walk stopped early (a limit), if it did

    @property
    def n_bytes(self) -> int:
        return sum(len(t.encode("utf-8")) for _, t in self.files)


def read_corpus(
    root: str | os.PathLike[str],
    *,
    max_files: int = MAX_CORPUS_FILES,
    max_file_bytes: int = MAX_CORPUS_FILE_BYTES,
    max_bytes: int = MAX_CORPUS_BYTES,
) -> CorpusScan:
    """Text files under ``root`` for the corpus: hidden entries, ``.git``, :data:`SKIP_DIRS`, symlinks,
    binary files (a NUL byte or not UTF-8) and files over ``max_file_bytes`` are skipped; the walk stops
    at ``max_files`` files or ``max_bytes`` bytes. Files come in path order (stable across runs)."""
    base = Path(root).expanduser()
    if not base.exists():
        raise CacheError(f"{base} does not exist", hint="pass the folder of a repository, notes or docs")
    if not base.is_dir():
        raise CacheError(f"{base} is not a folder", hint="pass the folder that holds the files to index")
    skipped: dict[str, int] = {}
    files: list[tuple[str, str]] = []
    total = 0

    def skip(why: str) -> None:
        skipped[why] = skipped.get(why, 0) + 1

    for here, dirs, names in os.walk(base, followlinks=False, onerror=lambda e: skip("unreadable")):
        keep = []
        for d in sorted(dirs):
            if d.startswith(".") or d in SKIP_DIRS:
                skip("hidden or build folder")
            elif os.path.islink(os.path.join(here, d)):
                skip("symlink")
            else:
                keep.append(d)
        dirs[:] = keep
        for name in sorted(names):
            path = os.path.join(here, name)
            rel = os.path.relpath(path, base)
            if name.startswith("."):
                skip("hidden")
                continue
            try:
                st = os.lstat(path)
            except OSError:
                skip("unreadable")
                continue
            if not stat.S_ISREG(st.st_mode):
                skip("symlink or special file")
                continue
            if st.st_size > max_file_bytes:
                skip(f"over {max_file_bytes // 1000} KB")
                continue
            if st.st_size == 0:
                skip("empty")
                continue
            if len(files) >= max_files:
                plural = "s" if max_files > 1 else ""
                return CorpusScan(base, files, skipped, f"stopped at {max_files} file{plural} (--max-files)")
            if total + st.st_size > max_bytes:
                return CorpusScan(base, files, skipped, f"stopped at {max_bytes // 1_000_000} MB (--max-mb)")
            try:
                with open(path, "rb") as fh:
                    raw = fh.read(max_file_bytes + 1)
            except OSError:
                skip("unreadable")
                continue
            if b"\0" in raw[:8192]:
                skip("binary")
                continue
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError:
                skip("not UTF-8 text")
                continue
            files.append((rel, text))
            total += len(raw)
    return CorpusScan(base, files, skipped)


# File format ---------------------------------------------------------------------------------------
class _Bad(Exception):
    """A store file that cannot be used (the message says why, for one line)."""


def _aligned(n: int) -> int:
    return -(-n // _ALIGN) * _ALIGN


def _read(path: Path) -> tuple[bytes, os.stat_result]:
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0)
    fd = os.open(path, flags)
    with os.fdopen(fd, "rb") as fh:
        return fh.read(), os.fstat(fh.fileno())


def _header(data: bytes, magic: bytes, version: int, kind: str) -> tuple[dict, int]:
    """The checked JSON header of a store file or journal (``kind`` names it in errors), and where it ends."""
    if len(data) < _PREAMBLE.size:
        raise _Bad("it is truncated (no header)")
    found, found_version, n, crc = _PREAMBLE.unpack_from(data)
    if found != magic:
        raise _Bad(f"it is not a localspec {kind}")
    if found_version != version:
        raise _Bad(f"it has format version {found_version}, this localspec reads version {version}")
    if n > MAX_HEADER or _PREAMBLE.size + n > len(data):
        raise _Bad("it is truncated (header cut short)")
    blob = data[_PREAMBLE.size : _PREAMBLE.size + n]
    if zlib.crc32(blob) != crc:
        raise _Bad("its header is corrupted (checksum mismatch)")
    try:
        header = json.loads(blob)
    except ValueError as exc:
        raise _Bad("its header is not valid JSON") from exc
    if not isinstance(header, dict):
        raise _Bad("its header is not an object")
    return header, _PREAMBLE.size + n


def _check_owner(header: dict, fingerprint: str, namespace: str) -> None:
    """A file (snapshot, journal, calibration) is only ever used for the vocabulary and namespace it names."""
    if header.get("fingerprint") != fingerprint:
        raise _Bad("it belongs to another vocabulary")
    if header.get("namespace") != namespace:
        raise _Bad("it belongs to another namespace")


def _parse_header(data: bytes, size: int, path: Path) -> dict:
    header, end = _header(data, MAGIC, VERSION, "suffix cache")
    header["_payload_at"] = _aligned(end)
    return header


def _payload(data: bytes, header: dict) -> dict[str, np.ndarray]:
    """The arrays of a snapshot whose header is checked: its length, the payload's CRC-32, the table."""
    start = header["_payload_at"]
    try:
        total = int(header["payload_bytes"])
        table = header["arrays"]
        crc = int(header["payload_crc32"])
    except (KeyError, TypeError, ValueError) as exc:
        raise _Bad("its header lacks the array table") from exc
    if len(data) < start + total:
        raise _Bad(f"it is truncated ({len(data)} of {start + total} bytes)")
    if len(data) > start + total:
        raise _Bad("it has trailing bytes")
    payload = memoryview(data)[start : start + total]
    if zlib.crc32(payload) != crc:
        raise _Bad("its contents are corrupted (checksum mismatch)")
    arrays: dict[str, np.ndarray] = {}
    try:
        for name, dtype, length, offset in table:
            if ARRAYS.get(name) != dtype:
                raise _Bad(f"it has an unexpected array {name!r} ({dtype})")
            nbytes = int(length) * np.dtype(dtype).itemsize
            if not (0 <= int(offset) and int(offset) + nbytes <= total and int(length) >= 0):
                raise _Bad(f"array {name!r} lies outside the file")
            arrays[name] = np.frombuffer(payload, dtype=dtype, count=int(length), offset=int(offset))
    except (TypeError, ValueError) as exc:
        raise _Bad("its array table is malformed") from exc
    missing = sorted(set(ARRAYS) - set(arrays))
    if missing:
        raise _Bad(f"it lacks array(s) {', '.join(missing)}")
    return arrays


def _check(arrays: dict[str, np.ndarray], n_vocab: int | None) -> None:
    """Structural checks a hostile file with a valid checksum could still fail (cheap: a few ms per 1M)."""
    for group in ("history", "corpus"):
        tokens, starts = arrays[f"{group}_tokens"], arrays[f"{group}_starts"]
        keys, pos = arrays[f"{group}_keys"], arrays[f"{group}_pos"]
        size = tokens.size
        if keys.size != pos.size:
            raise _Bad(f"its {group} index arrays differ in length")
        if tokens.size and (int(tokens.min()) < -1 or (n_vocab is not None and int(tokens.max()) >= n_vocab)):
            raise _Bad(f"its {group} holds token ids outside the vocabulary")
        if size and tokens[-1] != -1:
            raise _Bad(f"its {group} does not end a request")
        if starts.size:
            if int(starts[0]) != 0 or int(starts.max()) >= size or np.any(np.diff(starts) <= 0):
                raise _Bad(f"its {group} request table is inconsistent")
            if np.any(tokens[starts[1:] - 1] != -1):
                raise _Bad(f"its {group} request table does not match its separators")
        elif size:
            raise _Bad(f"its {group} has tokens but no requests")
        if pos.size:
            if int(pos.min()) < 2 or int(pos.max()) >= size:
                raise _Bad(f"its {group} index points outside its tokens")
            if np.any(keys[1:] < keys[:-1]):
                raise _Bad(f"its {group} index is not sorted")


def _take_lock(path: Path, wait: float) -> int | None:
    """Take the advisory lock ``path`` (created 0600 in an existing or new 0700 folder, never followed
    if a symlink), waiting up to ``wait`` seconds; its descriptor, or None where there is no ``fcntl``.
    Raises :class:`_Busy` past the wait and :class:`_NoLock` (why) when the file cannot be used.
    The holder deletes the file before it lets go (:func:`_release_lock`): a waiter that then gets its
    lock on the deleted file starts over with the path's current one."""
    if fcntl is None:
        return None
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)  # failing: the caller reports it
    deadline = time.monotonic() + wait
    delay = 0.001
    while True:
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o600)
        except OSError as exc:
            raise _NoLock(f"cannot open its lock file ({exc.strerror or exc})") from exc
        try:
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() >= deadline:
                        raise _Busy from None
                    time.sleep(delay)
                    delay = min(2 * delay, 0.05)  # most saves hold it for a millisecond or two
            held = os.fstat(fd)
            try:
                now = os.stat(path, follow_symlinks=False)
            except FileNotFoundError:
                now = None
        except OSError as exc:
            os.close(fd)
            raise _NoLock(f"cannot lock it ({exc.strerror or exc})") from exc
        except BaseException:
            os.close(fd)
            raise
        if now is not None and (now.st_dev, now.st_ino) == (held.st_dev, held.st_ino):
            return fd
        os.close(fd)  # the holder deleted it as it let go: lock the path's file now


def _release_lock(path: Path, fd: int) -> None:
    """Delete the lock file ``path`` if it is still the one ``fd`` holds, then let go of the lock."""
    with contextlib.suppress(OSError):
        held = os.fstat(fd)
        now = os.stat(path, follow_symlinks=False)
        if (now.st_dev, now.st_ino) == (held.st_dev, held.st_ino):
            os.unlink(path)
    os.close(fd)  # releases the lock


class _NoLock(Exception):
    """A store's lock file cannot be used here (the message says why); saves go on without it."""


class _Busy(Exception):
    """Another process held a store's lock past :data:`LOCK_WAIT_SECONDS`."""


class _Stale(Exception):
    """A journal of another snapshot (left behind when a new snapshot replaced its own)."""


def _journal_header(fingerprint: str, namespace: str, snapshot_id: str) -> bytes:
    blob = json.dumps(
        {"fingerprint": fingerprint, "namespace": namespace, "snapshot_id": snapshot_id},
        separators=(",", ":"),
    ).encode("utf-8")
    return _PREAMBLE.pack(JOURNAL_MAGIC, JOURNAL_VERSION, len(blob), zlib.crc32(blob)) + blob


def _record(tokens: np.ndarray) -> bytes:
    body = np.ascontiguousarray(tokens, dtype="<i4").tobytes()
    count = struct.pack("<I", len(body) // 4)
    return count + struct.pack("<I", zlib.crc32(body, zlib.crc32(count))) + body


def _journal_cap(max_tokens: int) -> int:
    """Bytes that a journal of a store of ``max_tokens`` never reaches (it holds at most a share of them,
    at 4 bytes a token and 8 a record; twice over, with room to spare)."""
    return MAX_HEADER + 2 * (_RECORD.size + 4) * (max_tokens + JOURNAL_MIN_TOKENS)


def _parse_journal(
    data: bytes, fingerprint: str, namespace: str, snapshot_id: str | None, n_vocab: int | None
) -> tuple[list[np.ndarray], int]:
    """The complete records of a journal (up to the first incomplete, corrupt or out-of-vocabulary one)
    and where they end. Raises :class:`_Bad` for an unusable header, :class:`_Stale` for a journal of
    another snapshot (``snapshot_id`` None: any)."""
    header, at = _header(data, JOURNAL_MAGIC, JOURNAL_VERSION, "suffix cache journal")
    _check_owner(header, fingerprint, namespace)
    if snapshot_id is not None and header.get("snapshot_id") != snapshot_id:
        raise _Stale
    return _parse_records(data, at, n_vocab)


def _parse_records(data: bytes, at: int, n_vocab: int | None) -> tuple[list[np.ndarray], int]:
    """The complete records of journal bytes from ``at`` on (up to the first incomplete, corrupt or
    out-of-vocabulary one) and where they end."""
    view = memoryview(data)
    records: list[np.ndarray] = []
    while at + _RECORD.size <= len(data):
        count, crc = _RECORD.unpack_from(data, at)
        end = at + _RECORD.size + 4 * count
        if count == 0 or end > len(data):
            break
        if zlib.crc32(view[at + _RECORD.size : end], zlib.crc32(view[at : at + 4])) != crc:
            break
        tokens = np.frombuffer(data, dtype="<i4", count=count, offset=at + _RECORD.size)
        if int(tokens.min()) < 0 or (n_vocab is not None and int(tokens.max()) >= n_vocab):
            break
        records.append(tokens)
        at = end
    return records, at


def _fdatasync(fd: int) -> None:
    getattr(os, "fdatasync", os.fsync)(fd)


def _fsync_dir(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass  # some file systems cannot sync a folder; the rename is still atomic
    finally:
        os.close(fd)
