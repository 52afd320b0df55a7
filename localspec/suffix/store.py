"""The persisted suffix index: a :class:`SuffixStore` per (target vocabulary, namespace), shared by every
process that drafts for that vocabulary (the files: :mod:`localspec.suffix.store_files`).

Loading reads the snapshot and replays its journal's records in order, as the writer added them
(:meth:`SuffixIndex.add_request`). Saving after a request appends the requests finished since the last save
(one write and an fsync); it writes a new snapshot instead (and deletes the journal) when the journal would
pass :data:`JOURNAL_FRACTION` of the snapshot's tokens (at least :data:`JOURNAL_MIN_TOKENS`: replaying costs
time at every load), when requests were evicted (the history passed its cap), when the corpus changed, or
when the journal holds a torn record. Nothing is ever appended to a file it did not check, so the files stay
bounded: the snapshot by the history cap, the journal by a fraction of it. A file that cannot be used is
reported in one line (:attr:`SuffixStore.problem`, and a logged warning) and ignored: the cache starts empty
and the next save replaces it. A store never crashes its caller. The first store written in a folder says
what it keeps, where, and how to turn it off or clear it (:func:`first_write_notice`, a logged warning: the
command line prints it as one line on stderr).

Several writers
---------------
Several processes may save to one store: a server while ``localspec index`` or ``localspec run`` save, two
servers. Nobody's requests are lost, a corpus indexed meanwhile is kept and drafted from, and a fresh load
of the files always gives the index the last writer holds. The protocol, per save:

1. **Take turns.** A save holds the store's advisory lock (:mod:`localspec.suffix.store_lock`) while it
   checks, takes in and writes, so two saves never interleave appends or lose each other's requests to a
   snapshot. A save that cannot get it within :data:`LOCK_WAIT_SECONDS` is skipped (reported; the next
   save writes its requests; until one gets the lock, saves try only once); without ``fcntl`` (Windows)
   saves go on unlocked. ``localspec cache clear`` deletes a store's files under the same lock, so a save
   in flight finishes first and its files go too.
2. **Know what the files hold.** After every load and write a store notes what the files hold for its
   index (:class:`~localspec.suffix.store_sync.Synced`): the snapshot's identity (device, inode, size,
   mtime), how many bytes of the journal are complete records it knows, and the index's request counters
   at that point.
3. **Take in what another writer saved** (:meth:`SuffixStore._take_in`):

   - the files are as this store left them (two ``stat`` calls): nothing to do;
   - the snapshot is gone (``localspec cache clear``): the user asked to forget, so the index forgets its
     history and corpus too (this request's included) and the drafter its calibration; nothing is written
     back, and the next request starts the store again;
   - only the journal grew (the usual case): the other writer's new records are read and added
     (:meth:`SuffixStore._catch_up`), this process's own requests since are taken back out and added again
     after them;
   - anything else (another snapshot; a journal replaced, truncated or ending in a damaged record): the
     files are loaded again whole, this process's requests since are added, and the index adopts the
     result (a corpus indexed meanwhile is kept unless this process set its own since); files that do not
     load are replaced by this index, as at a first save.

   Either way the index then holds the other writer's requests first and this process's own after them,
   the order the files hold them in once this save appended its own: a fresh load gives the same index
   (the same arrays, so the same drafts).
4. **Write**: append to the journal, or a new snapshot (above). The calibration file is replaced after the
   lock is released (one whole file, replaced atomically: the last writer's wins).

The names this module held before the store became several modules are importable from here.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np

from localspec.errors import CacheError
from localspec.suffix import store_files, store_lock
from localspec.suffix.calibration import Cell, TokenCell
from localspec.suffix.index import SuffixIndex
from localspec.suffix.store_files import (
    DEFAULT_MAX_TOKENS,
    MAX_CALIBRATION_BYTES,
    BadStoreFile,
    FileIdentity,
    StaleJournal,
    calibration_bytes,
    calibration_path,
    check_arrays,
    check_owner,
    default_dir,
    fdatasync,
    file_identity,
    journal_cap,
    journal_header,
    journal_path,
    journal_record,
    lock_path,
    parse_calibration,
    parse_header,
    parse_journal,
    payload_arrays,
    read_file,
    replace_file,
    snapshot_chunks,
    store_path,
)
from localspec.suffix.store_info import (
    StoreInfo,
    count_journal,
    header_info,
    what_is_lost,
)
from localspec.suffix.store_lock import LockBusy, NoLock, release_lock, take_lock
from localspec.suffix.store_sync import Synced, read_appended, synced_with

log = logging.getLogger(__name__)


def first_write_notice(directory: Path) -> str:
    """What the first store written in ``directory`` says (once: a folder with a store says nothing more):
    what is kept, where, and how to turn it off or clear it."""
    return (
        f"the suffix cache keeps your prompts and outputs in {directory} to draft from them later; "
        "`localspec cache clear` deletes them; --no-store (run, serve, ui) or LOCALSPEC_NO_STORE=1 keeps "
        "them in memory only"
    )


class SuffixStore:
    """A persisted :class:`SuffixIndex` for one target vocabulary (and one namespace).

    ``load()`` returns the index (empty when there is no usable file; :attr:`problem` then says why);
    ``save(index)`` writes it crash-safely: after a load or a save of the same index, it appends the
    requests finished since to the journal, after taking in what other writers saved (see the module
    docstring). A
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
        self._synced: Synced | None = None
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
            data, st = read_file(self.path)
        except FileNotFoundError:
            self._synced = synced_with(fresh)
            return fresh
        except OSError as exc:
            return self._ignore(
                StoreInfo(self.path, 0, problem=f"cannot read it ({exc.strerror or exc})"), fresh
            )
        held = StoreInfo(self.path, len(data))
        try:
            header = parse_header(data, len(data), self.path)
            check_owner(header, self.fingerprint, self.namespace)
            held = header_info(self.path, len(data), header)  # ours, and it reads: it says what is lost
            arrays = payload_arrays(data, header)
            snapshot_id = header.get("snapshot_id")
            if not isinstance(snapshot_id, str) or not snapshot_id:
                raise BadStoreFile("its header lacks the snapshot id")
            check_arrays(arrays, self.n_vocab)
        except BadStoreFile as exc:
            held.problem = str(exc)
            if held.fingerprint:
                count_journal(held, header)  # its journal's requests are lost with it
            return self._ignore(held, fresh)
        self.corpus_root = str(header.get("corpus_root", ""))
        index = SuffixIndex.from_state(arrays, max_history_tokens=self.max_tokens, n_vocab=self.n_vocab)
        synced = synced_with(index, self.corpus_root, snapshot_id, file_identity(st))
        # a journal is never larger than a share of its snapshot: one far larger is not replayed
        self._replay(index, synced, journal_cap(max(self.max_tokens, int(header.get("history_tokens", 0)))))
        # requests evicted while loading (a smaller cap than the writer's): the next save writes it all
        self._synced = synced if index.history_dropped == 0 else None
        return index

    def _replay(self, index: SuffixIndex, synced: Synced, cap: int) -> None:
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
            records, end = parse_journal(
                data, self.fingerprint, self.namespace, synced.snapshot_id, self.n_vocab
            )
        except StaleJournal:
            return  # left behind by a writer killed while it wrote a new snapshot: the snapshot has it all
        except BadStoreFile as exc:
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
            return parse_calibration(data, self.fingerprint, self.namespace, self.n_vocab)
        except BadStoreFile as exc:
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
        """Write ``index`` crash-safely (steps 1 to 4 of the module docstring): take in what another process
        saved meanwhile (``index`` then holds it too; a cleared cache is forgotten, and nothing is written),
        then append the requests finished since the last load or save of it to the journal, or write a new
        snapshot; then ``calibration``, when given, and the token table ``tokens`` replace the calibration
        file (after the lock is released: one whole file, replaced atomically, the last writer's wins).
        On a failure (disk full, permissions, the lock held by another process for over
        :data:`LOCK_WAIT_SECONDS`) returns False and sets :attr:`problem`; generation goes on without
        persistence (the requests not saved go with the next save)."""
        try:
            with self._locked() as held:
                if not held:
                    self.problem = (
                        f"suffix cache {self.path}: another process has held its lock for over "
                        f"{store_lock.LOCK_WAIT_SECONDS:g} s; not saved this time (the next save writes "
                        "these requests)"
                    )
                    log.warning(self.problem)
                    return False
                if not self._take_in(index):
                    return True  # the cache was cleared: nothing of what this index held is written back
                if not self._append(index):
                    self._write(index)
            if calibration is not None:
                doc = calibration_bytes(self.fingerprint, self.namespace, calibration, tokens)
                self._replace(self.calibration_path, [doc])
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
        """Hold the store's lock (:mod:`localspec.suffix.store_lock`) for the duration; yields False when
        another process held it past :data:`LOCK_WAIT_SECONDS` (once that happened, only one try until the
        lock is got again: a stuck holder, a stopped ``localspec run`` say, must not cost every request the
        wait). Without ``fcntl`` (Windows), or with a lock file that cannot be used (a symlink, which is never
        followed; a file system without locks), it goes on unlocked, as saves did before, and says so once.
        """
        try:
            fd = self._lock()
        except LockBusy:
            yield False
            return
        try:
            yield True
        finally:
            if fd is not None:
                release_lock(self.lock_path, fd)

    def _lock(self) -> int | None:
        """The descriptor of the held lock file, or None: no lock to be had here (see :meth:`_locked`).
        Raises :class:`LockBusy` when another process held it past the wait."""
        try:
            wait = 0.0 if self._lock_stuck else store_lock.LOCK_WAIT_SECONDS
            fd = take_lock(self.lock_path, wait)
        except LockBusy:
            self._lock_stuck = True
            raise
        except NoLock as exc:
            self._unlocked(str(exc))
            return None
        self._lock_stuck = False
        return fd

    def _unlocked(self, why: str) -> None:
        if not self._unlocked_said:
            self._unlocked_said = True
            log.warning("suffix cache %s: %s; saving without the lock", self.path, why)

    def _take_in(self, index: SuffixIndex) -> bool:
        """Before saving ``index``: take in what another process saved since this store last loaded or
        wrote the files for this index (step 3 of the module docstring); False when there is nothing to
        write now (the cache was cleared)."""
        s = self._synced
        if s is None or s.history() is not index.history:
            return True  # files this index never held, or unusable ones: the save replaces them
        try:
            now: FileIdentity | None = file_identity(os.stat(self.path, follow_symlinks=False))
        except FileNotFoundError:
            now = None
        except OSError:
            return True  # the save reports what is wrong
        if now == s.snapshot and (now is None or not self._journal_moved(s)):
            return True  # the files are as this store left them (or there are still none)
        if now is None:  # there was a snapshot, and it is gone
            self._forget(index)
            return False
        if now == s.snapshot and self._catch_up(index, s):
            return True
        self._reload(index, s)
        return True

    def _forget(self, index: SuffixIndex) -> None:
        """The snapshot was deleted (``localspec cache clear``): the user asked to forget, so ``index``
        forgets its history and corpus too (this request's included), and the drafter its calibration
        (:meth:`SuffixIndex.forget`); the next request starts the store again."""
        index.forget()
        self.corpus_root, self.calibration, self.tokens = "", [], []
        self._synced = synced_with(index)
        log.info("suffix cache %s was cleared; this process forgot what it held too", self.path)

    def _reload(self, index: SuffixIndex, s: Synced) -> None:
        """The files are not the ones this store knows (another process wrote a snapshot, or replaced,
        truncated or damaged the journal): load them as that process left them, add the requests this
        index added since it was last in sync, and make ``index`` hold the result
        (:meth:`SuffixIndex.adopt`). A corpus indexed meanwhile is kept unless this process set its own
        since; files that do not load are left for this index to replace."""
        ours = index.history_since(max(s.added, index.history_dropped))
        corpus_here, root = s.corpus() is not index.corpus, self.corpus_root
        disk = self.load()
        if self._synced is None:
            return  # another writer left files that do not load: this index replaces them
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

    def _catch_up(self, index: SuffixIndex, s: Synced) -> bool:
        """Take in the records another writer appended to the journal since this store was in sync (the
        snapshot is still the one it knows); False when that is not all that happened, and the caller
        reloads everything (:meth:`_reload`, which handles each case as a load does).

        This process's own requests since (usually one: the request just finished) are taken back out of
        ``index`` (:meth:`SuffixIndex.withdraw`), the other writer's added, and its own added again after
        them: the order the journal holds them in once :meth:`_append` wrote them."""
        if index.history_dropped != s.dropped or index.history_added < s.added:
            return False  # evicted since: the save writes a snapshot anyway, which costs more than a reload
        cap = journal_cap(max(self.max_tokens, s.snapshot_tokens))
        appended = read_appended(self.journal_path, s, cap, self.fingerprint, self.namespace, self.n_vocab)
        if appended is None:
            return False
        ours = [np.array(a) for a in index.history_since(s.added)]  # copies: buf is reused below
        if ours and not index.withdraw(len(ours)):
            # the request just finished merged the history's recent part into the rest: taking it back
            # would cost a pass over the whole index
            return False
        for tokens in appended.records:
            index.add_request(tokens)
        s.journal, s.journal_end = appended.journal, appended.end
        s.journal_tokens += sum(r.size for r in appended.records)
        s.added = index.history_added  # the files hold these; this save appends ours after them
        for tokens in ours:
            index.add_request(tokens)
        log.info(
            "suffix cache %s: another process appended %d requests since; took them in, this process's %d "
            "follow them",
            self.path,
            len(appended.records),
            len(ours),
        )
        return True

    def _journal_moved(self, s: Synced) -> bool:
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
            if file_identity(os.stat(self.path, follow_symlinks=False)) != s.snapshot:
                return False  # replaced (another process saved) or deleted (the cache was cleared)
        except OSError:
            return False
        new = index.history_since(s.added)
        if not new:
            return True
        n_new = sum(a.size for a in new)
        share = max(store_files.JOURNAL_MIN_TOKENS, int(s.snapshot_tokens * store_files.JOURNAL_FRACTION))
        if s.journal_tokens + n_new > share:
            return False  # fold the journal into a new snapshot: replaying it would make loading slow
        records = b"".join(journal_record(a) for a in new)
        if s.journal is None:  # the first append after a snapshot: create the journal whole
            head = journal_header(self.fingerprint, self.namespace, s.snapshot_id)
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
                fdatasync(fd)
            finally:
                os.close(fd)
            s.journal_end += len(records)
        s.added = index.history_added
        s.journal_tokens += n_new
        return True

    def _write(self, index: SuffixIndex) -> None:
        """A new snapshot of ``index`` (and no journal)."""
        facts = {
            "fingerprint": self.fingerprint,
            "namespace": self.namespace,
            "n_vocab": self.n_vocab,
            "saved_at": time.time(),
            "history_tokens": index.history_tokens,
            "history_requests": index.history_requests,
            "corpus_tokens": index.corpus_tokens,
            "corpus_documents": index.corpus_documents,
            "corpus_root": self.corpus_root,
        }
        snapshot_id, chunks = snapshot_chunks(index.state(), facts)
        first = not any(self.directory.glob(f"*{store_files.SUFFIX}"))
        st = self._replace(self.path, chunks)
        if first:
            log.warning(first_write_notice(self.directory))
        # the journal's requests are in the snapshot now (a journal left behind by a kill right here names
        # the previous snapshot's id and is ignored)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.journal_path)
        self._synced = synced_with(index, self.corpus_root, snapshot_id, file_identity(st))

    def _replace(self, path: Path, chunks: list[bytes | memoryview]) -> os.stat_result:
        """Write one of this store's files whole and atomically (:func:`replace_file`)."""
        names = (self.path.name, self.journal_path.name, self.calibration_path.name)
        return replace_file(path, chunks, names)
