"""What a store knows the files hold for its index, and what another writer appended to the journal since.

Steps 2 and 3 of the protocol in :mod:`localspec.suffix.store` read from here: after every load and write a
store notes a :class:`Synced`; before a save, :func:`read_appended` reads the records another writer
appended after the part of the journal that note covers.
"""

from __future__ import annotations

import os
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import numpy as np

from localspec.suffix.index import SuffixIndex
from localspec.suffix.store_files import (
    BadStoreFile,
    FileIdentity,
    StaleJournal,
    parse_journal,
    parse_records,
)


@dataclass
class Synced:
    """What the files on disk hold, as this store last wrote or loaded them."""

    history: Callable[[], object | None]  # weak references: the index's groups at that time
    corpus: Callable[[], object | None]
    corpus_root: str
    added: int  # the history's added / dropped counters the files account for
    dropped: int
    snapshot_id: str
    snapshot: FileIdentity | None  # None: there was no snapshot (this index started empty, or was cleared)
    snapshot_tokens: int
    journal: tuple[int, int] | None = None  # device and inode of our journal; None: there is none yet
    journal_end: int = 0  # its bytes that are ours (complete records)
    journal_tokens: int = 0


def synced_with(
    index: SuffixIndex, corpus_root: str = "", snapshot_id: str = "", snapshot: FileIdentity | None = None
) -> Synced:
    """In sync with files that hold ``index`` as it is now: the snapshot ``snapshot`` (named
    ``snapshot_id``) of it whole and no journal, or, with ``snapshot`` None, no files at all (``index``,
    empty or forgotten after a clear, was never saved)."""
    return Synced(
        weakref.ref(index.history),
        weakref.ref(index.corpus),
        corpus_root,
        index.history_added,
        index.history_dropped,
        snapshot_id,
        snapshot,
        index.history_tokens if snapshot is not None else 0,
    )


class _Appended(NamedTuple):
    """Records another writer appended to the journal (:func:`read_appended`)."""

    records: list[np.ndarray]
    journal: tuple[int, int]  # the journal's device and inode
    end: int  # where its complete records end


def read_appended(
    journal_path: Path, s: Synced, cap: int, fingerprint: str, namespace: str, n_vocab: int | None
) -> _Appended | None:
    """The complete records after the part of the journal ``s`` knows (the whole journal when it knew
    none: the other writer started it after that snapshot, and its header must name it), checked as at
    load; None unless the journal is simply longer, ending in a complete record: a journal that is another
    file, shorter than the part ``s`` knows, larger than ``cap``, or ending in a torn or damaged record
    goes to the full reload."""
    try:
        fd = os.open(journal_path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except OSError:
        return None
    with os.fdopen(fd, "rb") as fh:
        st = os.fstat(fh.fileno())
        if st.st_size > cap:
            return None
        if s.journal is None:
            start = 0
        elif (st.st_dev, st.st_ino) == s.journal and st.st_size > s.journal_end:
            start = s.journal_end  # always the end of a complete record, or of the header
        else:
            return None  # replaced (a new inode) or truncated
        fh.seek(start)
        data = fh.read()
    try:
        if start == 0:
            records, end = parse_journal(data, fingerprint, namespace, s.snapshot_id, n_vocab)
        else:
            records, end = parse_records(data, 0, n_vocab)
    except (BadStoreFile, StaleJournal):
        return None
    if end != len(data):
        return None  # a torn or damaged record: the reload keeps the complete ones
    return _Appended(records, (st.st_dev, st.st_ino), start + end)
