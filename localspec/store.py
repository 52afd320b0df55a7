"""The suffix cache on disk: one file per (target vocabulary fingerprint, namespace).

A store file holds a :class:`localspec.suffix.SuffixIndex`'s arrays (the token history, the corpus and
their sorted n-gram indexes, so loading costs a read and a checksum, not a rebuild). Layout::

    b"LSSUFFIX" | u32 version | u32 header length | u32 CRC-32 of the header | header (JSON)
    | zero padding to 64 bytes | payload (the arrays, each 64-byte aligned)

The header names the vocabulary fingerprint, the namespace, each array's dtype, length and offset, and
the CRC-32 of the payload. A file that is truncated, corrupted, of another version, of another
vocabulary or namespace, or whose arrays are out of bounds is reported in one line (:attr:`SuffixStore.
problem`, and a logged warning) and ignored: the cache starts empty and the next save replaces it. It
is never used for the wrong vocabulary and never crashes the caller.

Writes are crash-safe: a temp file in the same folder (created 0600), fsync, ``os.replace``, fsync of
the folder. A writer killed at any moment leaves either the old file or the new one. The file holds
the user's text (as token ids), hence mode 0600 and a 0700 folder; separate namespaces (one per API
key, say) keep users apart: hit timing would reveal what another user's requests contained.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
import stat
import struct
import tempfile
import time
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from localspec import constants
from localspec.errors import CacheError
from localspec.suffix import SuffixIndex

log = logging.getLogger(__name__)

MAGIC = b"LSSUFFIX"
VERSION = 1
SUFFIX = ".lsstore"
_PREAMBLE = struct.Struct("<8sIII")  # magic, version, header length, header CRC-32
_ALIGN = 64
MAX_HEADER = 1 << 20
#: Default cap of a store's history in tokens (about 60 MB per million tokens on disk and in memory).
DEFAULT_MAX_TOKENS = 2_000_000
#: Temp files of killed writers older than this are removed by the next save.
STALE_TEMP_SECONDS = 600.0

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


def store_path(directory: str | os.PathLike[str], fingerprint: str, namespace: str = "default") -> Path:
    """The file of one (vocabulary, namespace) store."""
    if not isinstance(fingerprint, str) or not _FINGERPRINT.match(fingerprint):
        raise CacheError(
            f"vocabulary fingerprint {fingerprint!r} is not 16-64 lowercase hex digits",
            hint="pass localspec.vocab.fingerprint(meta).fingerprint of the target",
        )
    if not isinstance(namespace, str) or not _NAMESPACE.match(namespace):
        raise CacheError(
            f"cache namespace {namespace!r} is not usable as a file name",
            hint="use 1-64 letters, digits, '.', '_' or '-' (namespace_for_key() turns an API key into one)",
        )
    return Path(directory) / f"{fingerprint[:16]}-{namespace}{SUFFIX}"


@dataclass
class StoreInfo:
    """What ``localspec cache info`` shows about one store file (read from its header only)."""

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


class SuffixStore:
    """A persisted :class:`SuffixIndex` for one target vocabulary (and one namespace).

    ``load()`` returns the index (empty when there is no usable file; :attr:`problem` then says why);
    ``save(index)`` writes it crash-safely. A :class:`localspec.suffix.SuffixDrafter` given
    ``store=this`` saves after every finished request.
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
        self.fingerprint = fingerprint
        self.namespace = namespace
        self.max_tokens = max_tokens
        self.n_vocab = n_vocab
        self.problem: str | None = None  # why the last load or save could not use the file
        self.corpus_root = ""

    # Loading ---------------------------------------------------------------------------------------
    def load(self) -> SuffixIndex:
        """The stored index, or an empty one when the file is missing or unusable (see :attr:`problem`)."""
        self.problem = None
        fresh = SuffixIndex(max_history_tokens=self.max_tokens, n_vocab=self.n_vocab)
        try:
            data = _read(self.path)
        except FileNotFoundError:
            return fresh
        except OSError as exc:
            return self._ignore(f"cannot read it ({exc.strerror or exc})", fresh)
        try:
            header, arrays = _parse(data, self.path)
            if header.get("fingerprint") != self.fingerprint:
                raise _Bad("it belongs to another vocabulary")
            if header.get("namespace") != self.namespace:
                raise _Bad("it belongs to another namespace")
            _check(arrays, self.n_vocab)
        except _Bad as exc:
            return self._ignore(str(exc), fresh)
        self.corpus_root = str(header.get("corpus_root", ""))
        return SuffixIndex.from_state(arrays, max_history_tokens=self.max_tokens, n_vocab=self.n_vocab)

    def _ignore(self, why: str, fresh: SuffixIndex) -> SuffixIndex:
        self.problem = f"suffix cache {self.path}: {why}; ignoring it (the next save replaces it)"
        log.warning(self.problem)
        return fresh

    # Saving ----------------------------------------------------------------------------------------
    def save(self, index: SuffixIndex) -> bool:
        """Write ``index`` crash-safely. On a failure (disk full, permissions) returns False and sets
        :attr:`problem`; generation goes on without persistence."""
        try:
            self._write(index)
        except OSError as exc:
            self.problem = f"suffix cache {self.path}: cannot save ({exc.strerror or exc})"
            log.warning(self.problem)
            return False
        self.problem = None
        return True

    def _write(self, index: SuffixIndex) -> None:
        arrays = {name: np.ascontiguousarray(a, dtype=ARRAYS[name]) for name, a in index.state().items()}
        table, offset = [], 0
        for name, a in arrays.items():
            table.append([name, ARRAYS[name], int(a.size), offset])
            offset = _aligned(offset + a.nbytes)
        crc = 0
        for a in arrays.values():
            crc = zlib.crc32(a.data.cast("B"), crc)
            crc = zlib.crc32(bytes(_aligned(a.nbytes) - a.nbytes), crc)
        header = {
            "fingerprint": self.fingerprint,
            "namespace": self.namespace,
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

        self.directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        self._remove_stale_temps()
        fd, tmp = tempfile.mkstemp(dir=self.directory, prefix=f".{self.path.name}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as fh:
                os.fchmod(fh.fileno(), 0o600)
                fh.write(head)
                for a in arrays.values():
                    fh.write(a.data.cast("B"))
                    fh.write(bytes(_aligned(a.nbytes) - a.nbytes))
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, self.path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        _fsync_dir(self.directory)

    def _remove_stale_temps(self) -> None:
        now = time.time()
        for p in self.directory.glob(f".{self.path.name}.*.tmp"):
            with contextlib.suppress(OSError):
                if now - p.stat().st_mtime > STALE_TEMP_SECONDS:
                    p.unlink()


# Listing and clearing ------------------------------------------------------------------------------
def list_stores(directory: str | os.PathLike[str] | None = None) -> list[StoreInfo]:
    """Every store file in ``directory`` (default :func:`default_dir`), from headers only."""
    d = Path(directory) if directory is not None else default_dir()
    if not d.is_dir():
        return []
    out = []
    for p in sorted(d.glob(f"*{SUFFIX}")):
        try:
            size = p.stat().st_size
            with open(p, "rb") as fh:
                header = _parse_header(fh.read(_PREAMBLE.size + MAX_HEADER), size, p)
        except OSError as exc:
            out.append(StoreInfo(p, 0, problem=f"cannot read it ({exc.strerror or exc})"))
            continue
        except _Bad as exc:
            out.append(StoreInfo(p, size, problem=str(exc)))
            continue
        out.append(
            StoreInfo(
                p,
                size,
                fingerprint=str(header.get("fingerprint", "")),
                namespace=str(header.get("namespace", "")),
                history_tokens=int(header.get("history_tokens", 0)),
                history_requests=int(header.get("history_requests", 0)),
                corpus_tokens=int(header.get("corpus_tokens", 0)),
                corpus_documents=int(header.get("corpus_documents", 0)),
                corpus_root=str(header.get("corpus_root", "")),
                saved_at=float(header.get("saved_at", 0.0)),
            )
        )
    return out


def clear(directory: str | os.PathLike[str] | None = None) -> list[Path]:
    """Delete every store file (and leftover temp file) in ``directory``; returns what was deleted."""
    d = Path(directory) if directory is not None else default_dir()
    if not d.is_dir():
        return []
    gone = []
    for p in [*d.glob(f"*{SUFFIX}"), *d.glob(f".*{SUFFIX}.*.tmp")]:
        try:
            p.unlink()
        except FileNotFoundError:
            continue
        except OSError as exc:
            raise CacheError(
                f"cannot delete {p}: {exc.strerror or exc}", hint="check the folder's permissions"
            ) from exc
        gone.append(p)
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
                return CorpusScan(base, files, skipped, f"stopped at {max_files} files (--max-files)")
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


def _read(path: Path) -> bytes:
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0)
    fd = os.open(path, flags)
    with os.fdopen(fd, "rb") as fh:
        return fh.read()


def _parse_header(data: bytes, size: int, path: Path) -> dict:
    if len(data) < _PREAMBLE.size:
        raise _Bad("it is truncated (no header)")
    magic, version, n, crc = _PREAMBLE.unpack_from(data)
    if magic != MAGIC:
        raise _Bad("it is not a localspec suffix cache")
    if version != VERSION:
        raise _Bad(f"it has format version {version}, this localspec reads version {VERSION}")
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
    header["_payload_at"] = _aligned(_PREAMBLE.size + n)
    return header


def _parse(data: bytes, path: Path) -> tuple[dict, dict[str, np.ndarray]]:
    header = _parse_header(data, len(data), path)
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
    return header, arrays


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
