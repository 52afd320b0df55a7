"""The suffix store's files: their paths, their formats, reading and checking them, writing them safely.

Per (target vocabulary fingerprint, namespace), next to each other:

The snapshot (``<fingerprint>-<namespace>.lsstore``) holds a :class:`localspec.suffix.index.SuffixIndex`'s
arrays (the token history, the corpus and their sorted n-gram indexes, so loading costs a read and a
checksum, not a rebuild). Layout::

    b"LSSUFFIX" | u32 version | u32 header length | u32 CRC-32 of the header | header (JSON)
    | zero padding to 64 bytes | payload (the arrays, each 64-byte aligned)

The header names the vocabulary fingerprint, the namespace, a random snapshot id, each array's dtype,
length and offset, and the CRC-32 of the payload. It is checksummed apart from the payload, so when only
the payload is damaged the header still says what is lost (:func:`localspec.suffix.store_info.what_is_lost`).

The journal (``<fingerprint>-<namespace>.lsjournal``) holds the requests finished since that snapshot, so
that the save after a request appends a few kilobytes instead of rewriting the snapshot::

    b"LSJOURNL" | u32 version | u32 header length | u32 CRC-32 of the header | header (JSON:
    fingerprint, namespace, snapshot id) | records

    record: u32 token count n | u32 CRC-32 of (the count's 4 bytes and the tokens) | n int32 tokens

(all little-endian). A journal is replayed only if it names the snapshot's id (one left behind by a writer
killed while it wrote a new snapshot is :class:`StaleJournal`), and only up to its first record that is
incomplete, fails its checksum or holds a token outside the vocabulary: a writer killed in the middle of an
append leaves a torn last record, and every complete record before it loads. It never holds more than a
share of its snapshot's tokens (:data:`JOURNAL_FRACTION`, :func:`journal_cap`).

The calibration (``<fingerprint>-<namespace>.lscal``, JSON) keeps the drafter's carried calibration and
token table (:mod:`localspec.suffix.calibration`), so that a new process (every ``localspec run`` is one)
drafts where the last one would have; the ``tokens`` field is optional (older versions ignore it).

A file that is truncated, corrupted, of another version, vocabulary or namespace, or whose arrays are out of
bounds raises :class:`BadStoreFile` with one line saying why; a store is never used for the wrong vocabulary.

Writes are crash-safe: a snapshot, a calibration, and a journal's first write go to a temp file in the same
folder (created 0600), fsync, ``os.replace``, fsync of the folder (:func:`replace_file`), so a writer
killed at any moment leaves the old file or the new one; appends are checked record by record at load. The
files hold the user's text (as token ids), hence mode 0600 and a 0700 folder; separate namespaces (one per
API key, say) keep users apart: hit timing would reveal what another user's requests contained.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import secrets
import struct
import tempfile
import time
import zlib
from collections.abc import Iterable
from pathlib import Path

import numpy as np

from localspec import constants
from localspec.errors import CacheError
from localspec.suffix.calibration import Cell, TokenCell, cells_from, token_cells_from

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


FileIdentity = tuple[int, int, int, int]  # device, inode, size, mtime (ns) of a file


def file_identity(st: os.stat_result) -> FileIdentity:
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


class BadStoreFile(Exception):
    """A store file that cannot be used (the message says why, for one line)."""


def _aligned(n: int) -> int:
    return -(-n // _ALIGN) * _ALIGN


def read_file(path: Path) -> tuple[bytes, os.stat_result]:
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0)
    fd = os.open(path, flags)
    with os.fdopen(fd, "rb") as fh:
        return fh.read(), os.fstat(fh.fileno())


def _header(data: bytes, magic: bytes, version: int, kind: str) -> tuple[dict, int]:
    """The checked JSON header of a store file or journal (``kind`` names it in errors), and where it ends."""
    if len(data) < _PREAMBLE.size:
        raise BadStoreFile("it is truncated (no header)")
    found, found_version, n, crc = _PREAMBLE.unpack_from(data)
    if found != magic:
        raise BadStoreFile(f"it is not a localspec {kind}")
    if found_version != version:
        raise BadStoreFile(f"it has format version {found_version}, this localspec reads version {version}")
    if n > MAX_HEADER or _PREAMBLE.size + n > len(data):
        raise BadStoreFile("it is truncated (header cut short)")
    blob = data[_PREAMBLE.size : _PREAMBLE.size + n]
    if zlib.crc32(blob) != crc:
        raise BadStoreFile("its header is corrupted (checksum mismatch)")
    try:
        header = json.loads(blob)
    except ValueError as exc:
        raise BadStoreFile("its header is not valid JSON") from exc
    if not isinstance(header, dict):
        raise BadStoreFile("its header is not an object")
    return header, _PREAMBLE.size + n


def check_owner(header: dict, fingerprint: str, namespace: str) -> None:
    """A file (snapshot, journal, calibration) is only ever used for the vocabulary and namespace it names."""
    if header.get("fingerprint") != fingerprint:
        raise BadStoreFile("it belongs to another vocabulary")
    if header.get("namespace") != namespace:
        raise BadStoreFile("it belongs to another namespace")


def parse_header(data: bytes, size: int, path: Path) -> dict:
    header, end = _header(data, MAGIC, VERSION, "suffix cache")
    header["_payload_at"] = _aligned(end)
    return header


def payload_arrays(data: bytes, header: dict) -> dict[str, np.ndarray]:
    """The arrays of a snapshot whose header is checked: its length, the payload's CRC-32, the table."""
    start = header["_payload_at"]
    try:
        total = int(header["payload_bytes"])
        table = header["arrays"]
        crc = int(header["payload_crc32"])
    except (KeyError, TypeError, ValueError) as exc:
        raise BadStoreFile("its header lacks the array table") from exc
    if len(data) < start + total:
        raise BadStoreFile(f"it is truncated ({len(data)} of {start + total} bytes)")
    if len(data) > start + total:
        raise BadStoreFile("it has trailing bytes")
    payload = memoryview(data)[start : start + total]
    if zlib.crc32(payload) != crc:
        raise BadStoreFile("its contents are corrupted (checksum mismatch)")
    arrays: dict[str, np.ndarray] = {}
    try:
        for name, dtype, length, offset in table:
            if ARRAYS.get(name) != dtype:
                raise BadStoreFile(f"it has an unexpected array {name!r} ({dtype})")
            nbytes = int(length) * np.dtype(dtype).itemsize
            if not (0 <= int(offset) and int(offset) + nbytes <= total and int(length) >= 0):
                raise BadStoreFile(f"array {name!r} lies outside the file")
            arrays[name] = np.frombuffer(payload, dtype=dtype, count=int(length), offset=int(offset))
    except (TypeError, ValueError) as exc:
        raise BadStoreFile("its array table is malformed") from exc
    missing = sorted(set(ARRAYS) - set(arrays))
    if missing:
        raise BadStoreFile(f"it lacks array(s) {', '.join(missing)}")
    return arrays


def check_arrays(arrays: dict[str, np.ndarray], n_vocab: int | None) -> None:
    """Structural checks a hostile file with a valid checksum could still fail (cheap: a few ms per 1M)."""
    for group in ("history", "corpus"):
        tokens, starts = arrays[f"{group}_tokens"], arrays[f"{group}_starts"]
        keys, pos = arrays[f"{group}_keys"], arrays[f"{group}_pos"]
        size = tokens.size
        if keys.size != pos.size:
            raise BadStoreFile(f"its {group} index arrays differ in length")
        if tokens.size and (int(tokens.min()) < -1 or (n_vocab is not None and int(tokens.max()) >= n_vocab)):
            raise BadStoreFile(f"its {group} holds token ids outside the vocabulary")
        if size and tokens[-1] != -1:
            raise BadStoreFile(f"its {group} does not end a request")
        if starts.size:
            if int(starts[0]) != 0 or int(starts.max()) >= size or np.any(np.diff(starts) <= 0):
                raise BadStoreFile(f"its {group} request table is inconsistent")
            if np.any(tokens[starts[1:] - 1] != -1):
                raise BadStoreFile(f"its {group} request table does not match its separators")
        elif size:
            raise BadStoreFile(f"its {group} has tokens but no requests")
        if pos.size:
            if int(pos.min()) < 2 or int(pos.max()) >= size:
                raise BadStoreFile(f"its {group} index points outside its tokens")
            if np.any(keys[1:] < keys[:-1]):
                raise BadStoreFile(f"its {group} index is not sorted")


class StaleJournal(Exception):
    """A journal of another snapshot (left behind when a new snapshot replaced its own)."""


def journal_header(fingerprint: str, namespace: str, snapshot_id: str) -> bytes:
    blob = json.dumps(
        {"fingerprint": fingerprint, "namespace": namespace, "snapshot_id": snapshot_id},
        separators=(",", ":"),
    ).encode("utf-8")
    return _PREAMBLE.pack(JOURNAL_MAGIC, JOURNAL_VERSION, len(blob), zlib.crc32(blob)) + blob


def journal_record(tokens: np.ndarray) -> bytes:
    body = np.ascontiguousarray(tokens, dtype="<i4").tobytes()
    count = struct.pack("<I", len(body) // 4)
    return count + struct.pack("<I", zlib.crc32(body, zlib.crc32(count))) + body


def journal_cap(max_tokens: int) -> int:
    """Bytes that a journal of a store of ``max_tokens`` never reaches (it holds at most a share of them,
    at 4 bytes a token and 8 a record; twice over, with room to spare)."""
    return MAX_HEADER + 2 * (_RECORD.size + 4) * (max_tokens + JOURNAL_MIN_TOKENS)


def parse_journal(
    data: bytes, fingerprint: str, namespace: str, snapshot_id: str | None, n_vocab: int | None
) -> tuple[list[np.ndarray], int]:
    """The complete records of a journal (up to the first incomplete, corrupt or out-of-vocabulary one)
    and where they end. Raises :class:`BadStoreFile` for an unusable header, :class:`StaleJournal` for a
    journal of another snapshot (``snapshot_id`` None: any)."""
    header, at = _header(data, JOURNAL_MAGIC, JOURNAL_VERSION, "suffix cache journal")
    check_owner(header, fingerprint, namespace)
    if snapshot_id is not None and header.get("snapshot_id") != snapshot_id:
        raise StaleJournal
    return parse_records(data, at, n_vocab)


def parse_records(data: bytes, at: int, n_vocab: int | None) -> tuple[list[np.ndarray], int]:
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


def fdatasync(fd: int) -> None:
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


def parse_calibration(
    data: bytes, fingerprint: str, namespace: str, n_vocab: int | None
) -> tuple[list[Cell], list[TokenCell]]:
    """The checked cells and token table of a calibration file's bytes (read up to one byte past
    :data:`MAX_CALIBRATION_BYTES`); a file without a token table, as older versions wrote it, has an empty
    one. Raises :class:`BadStoreFile` saying why it cannot be used."""
    if len(data) > MAX_CALIBRATION_BYTES:
        raise BadStoreFile("it is larger than a calibration file can be")
    try:
        doc = json.loads(data)
    except ValueError as exc:
        raise BadStoreFile("it is not valid JSON") from exc
    if not isinstance(doc, dict) or doc.get("format") != CALIBRATION_FORMAT:
        raise BadStoreFile("it is not a localspec calibration file")
    if doc.get("version") != CALIBRATION_VERSION:
        raise BadStoreFile(f"it has format version {doc.get('version')!r}, this localspec reads 1")
    check_owner(doc, fingerprint, namespace)
    rows, token_rows = doc.get("cells"), doc.get("tokens", [])
    if not isinstance(rows, list):
        raise BadStoreFile("it has no list of cells")
    if not isinstance(token_rows, list):
        raise BadStoreFile("its token table is not a list")
    try:
        return cells_from(rows), token_cells_from(token_rows, n_vocab)
    except ValueError as exc:
        raise BadStoreFile(str(exc)) from exc


def calibration_bytes(
    fingerprint: str, namespace: str, calibration: Iterable[Cell], tokens: Iterable[TokenCell]
) -> bytes:
    """A calibration file's contents."""
    doc = {
        "format": CALIBRATION_FORMAT,
        "version": CALIBRATION_VERSION,
        "fingerprint": fingerprint,
        "namespace": namespace,
        "cells": [list(cell) for cell in calibration],
        "tokens": [
            [source, token, round(reached, 4), round(min(accepted, reached), 4)]
            for source, token, reached, accepted in tokens
        ],
    }
    return json.dumps(doc, separators=(",", ":")).encode()


def snapshot_chunks(state: dict[str, np.ndarray], header: dict) -> tuple[str, list[bytes | memoryview]]:
    """A new snapshot of an index's :meth:`~localspec.suffix.index.SuffixIndex.state`: its random id and
    the file's contents, ``header``'s fields (owner, counts, corpus root) written with the array table."""
    arrays = {name: np.ascontiguousarray(a, dtype=ARRAYS[name]) for name, a in state.items()}
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
        "fingerprint": header["fingerprint"],
        "namespace": header["namespace"],
        "snapshot_id": snapshot_id,
        **header,  # (its fingerprint and namespace keep their places, first)
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
    return snapshot_id, chunks


def replace_file(path: Path, chunks: list[bytes | memoryview], siblings: Iterable[str]) -> os.stat_result:
    """Write ``path`` whole and atomically: temp file (0600), fsync, rename, fsync of the folder (created
    0700). Temp files of killed writers of ``siblings`` (file names in the same folder) older than
    :data:`STALE_TEMP_SECONDS` are removed first."""
    directory = path.parent
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    _remove_stale_temps(directory, siblings)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{path.name}.", suffix=".tmp")
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
    _fsync_dir(directory)
    return st


def _remove_stale_temps(directory: Path, names: Iterable[str]) -> None:
    now = time.time()
    for name in names:
        for p in directory.glob(f".{name}.*.tmp"):
            with contextlib.suppress(OSError):
                if now - p.stat().st_mtime > STALE_TEMP_SECONDS:
                    p.unlink()
