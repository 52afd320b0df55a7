"""``localspec cache info`` and ``localspec cache clear``: the stores in a folder, each checked as a load
checks it, and what ignoring an unusable one costs.

Listing checks each store as a load does (header, payload checksum, array table, structure) rather than
trusting its header, so a store the next run would ignore is listed as unusable, with what it held and
what to do, before the run replaces it. That costs what a load costs, once per store, so it is always done
(``info`` is a command a user runs on purpose, and every run pays the same for its load) and there is no
flag to skip it. Clearing deletes each store's files under its lock (:mod:`localspec.suffix.store_lock`).
"""

from __future__ import annotations

import contextlib
import functools
import glob
import os
import shlex
from dataclasses import dataclass
from pathlib import Path

from localspec import constants
from localspec.errors import CacheError
from localspec.suffix import store_lock
from localspec.suffix.store_files import (
    CALIBRATION_SUFFIX,
    DEFAULT_MAX_TOKENS,
    JOURNAL_SUFFIX,
    LOCK_SUFFIX,
    SUFFIX,
    BadStoreFile,
    StaleJournal,
    calibration_path,
    check_arrays,
    check_owner,
    default_dir,
    journal_cap,
    journal_path,
    parse_header,
    parse_journal,
    payload_arrays,
    read_file,
)
from localspec.suffix.store_lock import LockBusy, NoLock, release_lock, take_lock


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


def list_stores(directory: str | os.PathLike[str] | None = None) -> list[StoreInfo]:
    """Every store in ``directory`` (default :func:`default_dir`), checked as a load checks it (see the
    module docstring), with the journals' records (the requests saved
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
        data, _ = read_file(path)
    except OSError as exc:
        return StoreInfo(path, 0, problem=f"cannot read it ({exc.strerror or exc})")
    info = StoreInfo(path, len(data))
    header: dict = {}
    try:
        header = parse_header(data, len(data), path)
        prefix, _, namespace = path.name[: -len(SUFFIX)].partition("-")
        fingerprint = str(header.get("fingerprint", ""))
        check_owner(header, fingerprint if fingerprint[:16] == prefix else prefix, namespace)
        info = header_info(path, len(data), header)
        arrays = payload_arrays(data, header)
        if not isinstance(header.get("snapshot_id"), str) or not header["snapshot_id"]:
            raise BadStoreFile("its header lacks the snapshot id")
        n_vocab = header.get("n_vocab")
        check_arrays(arrays, n_vocab if isinstance(n_vocab, int) and not isinstance(n_vocab, bool) else None)
    except BadStoreFile as exc:
        info.problem = str(exc)
    del data
    if info.fingerprint:
        count_journal(info, header)
    with contextlib.suppress(OSError):
        info.size_bytes += calibration_path(path).stat().st_size
    return info


def header_info(path: Path, size: int, header: dict) -> StoreInfo:
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
    """The embedded target's vocabulary fingerprint ("" when it cannot be read): a read of its GGUF
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


def count_journal(info: StoreInfo, header: dict) -> None:
    """Add the requests of a snapshot's journal (when it has one of its own) to ``info``; a journal a load
    would not replay (a damaged or foreign header, too large) is noted in ``info.journal_problem``."""
    path = journal_path(info.path)
    try:
        st = path.stat()
        if st.st_size > journal_cap(max(DEFAULT_MAX_TOKENS, info.history_tokens)):
            info.size_bytes += st.st_size
            info.journal_problem = "it is larger than a store of this size writes"
            return
        data, _ = read_file(path)
        records, _ = parse_journal(
            data, info.fingerprint, info.namespace, str(header.get("snapshot_id", "")), header.get("n_vocab")
        )
    except BadStoreFile as exc:
        info.size_bytes += st.st_size
        info.journal_problem = str(exc)
        return
    except (OSError, StaleJournal):
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
            fd = take_lock(lock, store_lock.LOCK_WAIT_SECONDS)
        except LockBusy:
            raise CacheError(
                f"cannot clear {d / (stem + SUFFIX)}: another localspec process has been saving to it for "
                f"over {store_lock.LOCK_WAIT_SECONDS:g} s",
                hint="stop the server or run using this cache (or wait for it to finish), then clear again",
            ) from None
        except NoLock:
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
                release_lock(lock, fd)
                if left:
                    gone.append(lock)
    return gone
