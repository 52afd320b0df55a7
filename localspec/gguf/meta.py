"""Fast, hostile-file-safe reader for a GGUF header: key/value section and tensor infos, never tensor data.

The parser works on any seekable binary file object whose size is known (a local file, or a
``huggingface_hub`` ``HfFileSystem`` file read through HTTP range requests). It reads in chunks, so a
remote read makes a handful of requests and stops at the end of the key/value section when
``tensors=False``.

Speed: ``gguf.GGUFReader`` builds a numpy view per array element (seconds for a 150K-token vocabulary).
Here a string array is parsed in a few vectorised numpy passes over the buffered bytes (see
``_fast_strings``), with a plain loop as the fallback for anything unusual.

Safety: every length and count is checked against the bytes left in the file (and against absolute
caps) *before* anything is allocated, so a malformed file raises ``GGUFError`` naming the file and the
byte offset, never ``MemoryError``, a hang or a crash.
"""

from __future__ import annotations

import os
import stat
import struct
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
from gguf.constants import (
    GGML_QUANT_SIZES,
    GGUF_DEFAULT_ALIGNMENT,
    GGUF_MAGIC,
    GGMLQuantizationType,
    GGUFValueType,
    LlamaFileType,
)

from localspec.errors import GGUFError

SUPPORTED_VERSIONS = (2, 3)
LOCAL_CHUNK = 8 << 20  # bytes per read from a local file
REMOTE_CHUNK = 1 << 20  # bytes per read from a remote (range-request) file

# Absolute caps, far above anything a real model uses, so a hostile count cannot make us allocate.
MAX_STRING = 64 << 20  # one string value (chat templates, tokenizer json: a few MB at most)
MAX_KEY = 1 << 16
MAX_ARRAY = 1 << 23  # elements in one array (vocabularies are < 1M tokens)
MAX_KV = 1 << 16  # real files hold 20-60 keys
MAX_TENSORS = 1 << 17  # the largest real models hold a few thousand tensor infos
MAX_DIMS = 4  # GGML_MAX_DIMS
MAX_DEPTH = 3  # arrays of arrays of arrays
# Totals over the whole header, so many small arrays cannot add up to what one big one may not: every
# decoded array element, key and tensor info counts once. A 262K-token vocabulary with scores and types
# plus 500K merges is about 1.3M items; each item costs tens of bytes of Python objects.
MAX_HEADER_ITEMS = 1 << 22

_SCALAR = {
    GGUFValueType.UINT8: ("B", np.uint8),
    GGUFValueType.INT8: ("b", np.int8),
    GGUFValueType.UINT16: ("H", np.uint16),
    GGUFValueType.INT16: ("h", np.int16),
    GGUFValueType.UINT32: ("I", np.uint32),
    GGUFValueType.INT32: ("i", np.int32),
    GGUFValueType.FLOAT32: ("f", np.float32),
    GGUFValueType.BOOL: ("?", np.bool_),
    GGUFValueType.UINT64: ("Q", np.uint64),
    GGUFValueType.INT64: ("q", np.int64),
    GGUFValueType.FLOAT64: ("d", np.float64),
}
_VALUE_TYPES = {int(t): t for t in GGUFValueType}
_SEPARATORS = (0, 1, 2, 3, 4, 5, 6, 7, 8, 11, 12, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27)


def model_file_stem(path: str | os.PathLike[str]) -> str:
    """What a model is called when its header names nothing: its file name without ``.gguf``."""
    return Path(path).name.removesuffix(".gguf")


@dataclass(frozen=True)
class TensorInfo:
    name: str
    shape: tuple[int, ...]  # ggml order: shape[0] is the fastest-moving dimension
    ggml_type: int
    offset: int  # relative to the start of the data section

    @property
    def n_elements(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n

    @property
    def type_name(self) -> str:
        try:
            return GGMLQuantizationType(self.ggml_type).name
        except ValueError:
            return f"type{self.ggml_type}"

    @property
    def n_bytes(self) -> int | None:
        """Bytes of tensor data, or None for a ggml type this gguf package does not know."""
        try:
            block, size = GGML_QUANT_SIZES[GGMLQuantizationType(self.ggml_type)]
        except (ValueError, KeyError):
            return None
        return self.n_elements // block * size


@dataclass
class GGUFMetadata:
    """What a GGUF header says. ``kv`` holds Python values; token arrays are ``list[str]``."""

    path: str
    version: int
    byte_order: str  # "<" little-endian (all real files) or ">"
    size_bytes: int
    n_tensors: int
    kv: dict[str, Any]
    kv_types: dict[str, GGUFValueType] = field(default_factory=dict)
    tensors: list[TensorInfo] | None = None  # None when read with tensors=False
    header_bytes: int = 0  # offset where the section read (KV, or KV + tensor infos) ended
    data_offset: int | None = None  # start of tensor data (aligned), when tensors were read

    def get(self, key: str, default: Any = None) -> Any:
        return self.kv.get(key, default)

    @property
    def architecture(self) -> str | None:
        arch = self.kv.get("general.architecture")
        return arch if isinstance(arch, str) else None

    @property
    def name(self) -> str:
        name = self.kv.get("general.name")
        if isinstance(name, str) and name.strip():
            return name.strip()
        return model_file_stem(self.path)

    @property
    def file_type(self) -> int | None:
        ft = self.kv.get("general.file_type")
        return ft if isinstance(ft, int) and not isinstance(ft, bool) else None

    @property
    def quant_label(self) -> str | None:
        """``Q4_K_M``-style label from ``general.file_type``, else the commonest weight tensor type."""
        ft = self.file_type
        if ft is not None:
            try:
                return LlamaFileType(ft).name.removeprefix("MOSTLY_").removeprefix("ALL_")
            except ValueError:
                return f"ftype{ft}"
        if self.tensors:
            counts: dict[str, int] = {}
            for t in self.tensors:
                if len(t.shape) >= 2:
                    counts[t.type_name] = counts.get(t.type_name, 0) + t.n_elements
            if counts:
                return max(counts, key=counts.__getitem__)
        return None

    @property
    def n_params(self) -> int | None:
        """Parameter count from the tensor shapes (None when tensors were not read)."""
        if self.tensors is None:
            return None
        return sum(t.n_elements for t in self.tensors)


def read_metadata(path: str | os.PathLike[str], *, tensors: bool = True, merges: bool = True) -> GGUFMetadata:
    """Read the header of a local GGUF file. Raises ``GGUFError`` for anything that is not a sound GGUF."""
    name = os.fspath(path)
    with open_regular(name) as fh:
        size = os.fstat(fh.fileno()).st_size
        return read_metadata_fileobj(fh, name, size, tensors=tensors, merges=merges, chunk_size=LOCAL_CHUNK)


def open_regular(path: str | os.PathLike[str]) -> BinaryIO:
    """Open a local file for binary reading only if it is a regular file; else raise ``GGUFError``.

    The open is non-blocking and the type is checked on the open descriptor (``fstat``), so a FIFO, a
    socket or a device named like a model (an Ollama ``sha256-...`` blob) cannot hang the reader, and
    a file swapped between a check and the open cannot slip through.
    """
    name = os.fspath(path)
    try:
        fd = os.open(name, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0))
    except IsADirectoryError as exc:
        raise GGUFError(name, "is a folder, not a GGUF file") from exc
    except OSError as exc:
        raise GGUFError(
            name, f"cannot be opened ({exc.strerror or exc})", hint="check the path and its permissions"
        ) from exc
    try:
        mode = os.fstat(fd).st_mode
        if stat.S_ISDIR(mode):
            raise GGUFError(name, "is a folder, not a GGUF file")
        if not stat.S_ISREG(mode):
            kind = "a FIFO (named pipe)" if stat.S_ISFIFO(mode) else "not a regular file"
            raise GGUFError(name, f"is {kind}, not a GGUF file", hint="give the path of a .gguf model file")
        if hasattr(os, "set_blocking"):
            os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_metadata_fileobj(
    fh: BinaryIO,
    name: str,
    size: int,
    *,
    tensors: bool = True,
    merges: bool = True,
    chunk_size: int = REMOTE_CHUNK,
) -> GGUFMetadata:
    """Parse a GGUF header from a seekable binary file object of ``size`` bytes, starting at offset 0.

    With ``tensors=False`` reading stops at the end of the key/value section (at most one chunk past
    it), which is what a remote fingerprint needs. With ``merges=False``, ``tokenizer.ggml.merges`` (only
    used to tokenize, which llama.cpp does itself) is walked but kept as a ``SkippedArray``: about twice
    as fast for a BPE vocabulary, which is what scanning and fingerprinting use.
    """
    skip = frozenset() if merges else frozenset({"tokenizer.ggml.merges"})
    return _Parser(fh, name, size, chunk_size, skip).parse(tensors)


def is_gguf_file(path: str | os.PathLike[str]) -> bool:
    """True when the file starts with the GGUF magic (used to find Ollama blobs without an extension)."""
    try:
        with open_regular(path) as fh:
            return fh.read(4) == b"GGUF"
    except (OSError, GGUFError):
        return False


@dataclass(frozen=True)
class SkippedArray:
    """An array that was walked but not decoded (``tokenizer.ggml.merges`` when read with merges=False)."""

    item_type: GGUFValueType
    count: int
    offset: int  # file offset of the first item
    nbytes: int

    def __len__(self) -> int:
        return self.count


class _Parser:
    def __init__(self, fh: BinaryIO, name: str, size: int, chunk: int, skip: frozenset[str]) -> None:
        self.skip = skip
        self.fh, self.name, self.size, self.chunk = fh, name, int(size), max(int(chunk), 1 << 16)
        self.buf = b""
        self.base = 0  # file offset of buf[0]
        self.pos = 0  # absolute file offset of the next byte to parse
        self.bo = "<"
        self.items = 0  # keys, decoded array elements and tensor infos so far (see MAX_HEADER_ITEMS)

    # -- low level -------------------------------------------------------------------------------
    def err(self, message: str, offset: int | None = None) -> GGUFError:
        return GGUFError(self.name, message, offset=self.pos if offset is None else offset)

    def left(self) -> int:
        return self.size - self.pos

    def need(self, n: int, what: str) -> int:
        """Make ``buf`` hold bytes [pos, pos+n); return the index of pos in buf."""
        if n > self.left():
            raise self.err(f"file is cut short: {what} needs {n} bytes but only {max(self.left(), 0)} remain")
        rel = self.pos - self.base
        if rel + n <= len(self.buf):
            return rel
        keep = self.buf[rel:]
        end = self.base + len(self.buf)
        want = min(max(n - len(keep), self.chunk), self.size - end)
        try:
            self.fh.seek(end)
            data = self.fh.read(want)
        except (OSError, ValueError) as exc:
            raise self.err(f"read failed ({exc})", end) from exc
        if not isinstance(data, (bytes, bytearray)) or len(data) < n - len(keep):
            got = len(data) if isinstance(data, (bytes, bytearray)) else 0
            raise self.err(
                f"file is cut short: expected {self.size} bytes, the read at byte {end} "
                f"returned {got} of {want}",
                end,
            )
        self.buf = keep + bytes(data) if keep else bytes(data)
        self.base = self.pos
        return 0

    def unpack(self, fmt: str, size: int, what: str) -> tuple:
        rel = self.need(size, what)
        out = struct.unpack_from(self.bo + fmt, self.buf, rel)
        self.pos += size
        return out

    def u32(self, what: str) -> int:
        return self.unpack("I", 4, what)[0]

    def u64(self, what: str) -> int:
        return self.unpack("Q", 8, what)[0]

    def count(self, n: int, what: str, at: int) -> None:
        """Add ``n`` items to the header's total; refuse a header that holds more than MAX_HEADER_ITEMS."""
        self.items += n
        if self.items > MAX_HEADER_ITEMS:
            raise self.err(
                f"the header holds more than {MAX_HEADER_ITEMS} keys, array items and tensor infos in "
                f"total (reached at {what})",
                at,
            )

    def string(self, what: str, cap: int = MAX_STRING) -> str:
        start = self.pos
        n = self.u64(f"length of {what}")
        if n > self.left():
            raise self.err(f"{what} claims {n} bytes but only {self.left()} remain in the file", start)
        if n > cap:
            raise self.err(f"{what} claims {n} bytes (limit {cap})", start)
        rel = self.need(n, what)
        self.pos += n
        return self.buf[rel : rel + n].decode("utf-8", "surrogateescape")

    # -- structure -------------------------------------------------------------------------------
    def parse(self, want_tensors: bool) -> GGUFMetadata:
        if self.size < 24:
            if self.size >= 4 and self._peek_magic() != b"GGUF":
                raise self.err("not a GGUF file (bad magic)", 0)
            raise self.err(f"file is cut short: {self.size} bytes is less than a GGUF header", 0)
        if self._peek_magic() != b"GGUF":
            raise self.err(f"not a GGUF file (bad magic {self._peek_magic()!r}, expected b'GGUF')", 0)
        assert struct.unpack("<I", b"GGUF")[0] == GGUF_MAGIC
        self.pos = 4
        version = self.u32("version")
        if version & 0xFFFF == 0 and version >> 16:
            self.bo = ">"
            version = struct.unpack(">I", struct.pack("<I", version))[0]
        if version not in SUPPORTED_VERSIONS:
            hint = "re-convert it with a current llama.cpp" if version == 1 else None
            raise GGUFError(
                self.name, f"GGUF version {version} is not supported (supported: 2, 3)", offset=4, hint=hint
            )
        n_tensors = self.u64("tensor count")
        n_kv = self.u64("key/value count")
        if n_tensors > min(MAX_TENSORS, self.left() // 24):
            raise self.err(f"absurd tensor count {n_tensors} for a file of {self.size} bytes", 8)
        if n_kv > min(MAX_KV, self.left() // 13):
            raise self.err(f"absurd key/value count {n_kv} for a file of {self.size} bytes", 16)

        kv: dict[str, Any] = {}
        kv_types: dict[str, GGUFValueType] = {}
        for _ in range(n_kv):
            key_at = self.pos
            key = self.string("key", MAX_KEY)
            self.count(1, f"key {key!r}", key_at)
            vtype = self.value_type(f"type of {key!r}")
            if key in kv:
                raise self.err(f"duplicate key {key!r}", key_at)
            kv[key] = self.value(vtype, key, 0)
            kv_types[key] = vtype
        meta = GGUFMetadata(
            path=self.name,
            version=version,
            byte_order=self.bo,
            size_bytes=self.size,
            n_tensors=n_tensors,
            kv=kv,
            kv_types=kv_types,
            header_bytes=self.pos,
        )
        if want_tensors:
            self.tensor_infos(meta)
        return meta

    def _peek_magic(self) -> bytes:
        saved = self.pos
        self.pos = 0
        rel = self.need(4, "magic")
        self.pos = saved
        return self.buf[rel : rel + 4]

    def value_type(self, what: str) -> GGUFValueType:
        at = self.pos
        raw = self.u32(what)
        vt = _VALUE_TYPES.get(raw)
        if vt is None:
            raise self.err(f"unknown value type {raw} ({what})", at)
        return vt

    def value(self, vtype: GGUFValueType, key: str, depth: int) -> Any:
        if vtype == GGUFValueType.STRING:
            return self.string(f"string value of {key!r}")
        if vtype == GGUFValueType.ARRAY:
            return self.array(key, depth + 1)
        fmt, dt = _SCALAR[vtype]
        size = np.dtype(dt).itemsize
        val = self.unpack(fmt, size, f"value of {key!r}")[0]
        return val

    def array(self, key: str, depth: int) -> list | SkippedArray:
        at = self.pos
        if depth > MAX_DEPTH:
            raise self.err(f"arrays nested more than {MAX_DEPTH} deep in {key!r}", at)
        itype = self.value_type(f"array item type of {key!r}")
        n = self.u64(f"array length of {key!r}")
        min_item = {GGUFValueType.STRING: 8, GGUFValueType.ARRAY: 12}.get(itype) or np.dtype(
            _SCALAR[itype][1]
        ).itemsize
        if n > MAX_ARRAY or n * min_item > self.left():
            raise self.err(
                f"array {key!r} claims {n} items, more than the {self.left()} bytes left can hold", at
            )
        if not (itype == GGUFValueType.STRING and key in self.skip):
            self.count(n, f"array {key!r}", at)
        if itype == GGUFValueType.STRING:
            return self.string_array(key, n)
        if itype == GGUFValueType.ARRAY:
            return [self.array(key, depth + 1) for _ in range(n)]
        dt = np.dtype(_SCALAR[itype][1]).newbyteorder("<" if self.bo == "<" else ">")
        nbytes = n * dt.itemsize
        rel = self.need(nbytes, f"array {key!r}")
        self.pos += nbytes
        return np.frombuffer(self.buf, dtype=dt, count=n, offset=rel).tolist()

    def string_array(self, key: str, n: int) -> list[str] | SkippedArray:
        decode = key not in self.skip
        out: list[str] = []
        done = 0
        first = self.pos
        scanned = 0  # bytes looked at by the fast path: capped so odd files cannot make it quadratic
        slow = 64
        while done < n:
            remaining = n - done
            if self.bo == "<" and remaining >= 64 and scanned <= 4 * (self.pos - first) + (16 << 20):
                rel = self.pos - self.base
                if len(self.buf) - rel < min(self.chunk, self.left()):
                    rel = self.need(min(self.chunk, self.left()), f"array {key!r}")  # refill first
                got, count, used = _fast_strings(self.buf, rel, len(self.buf), remaining, decode)
                scanned += min(len(self.buf) - rel, remaining * 20 + 4096)
                out.extend(got)
                done += count
                self.pos += used
                if count >= 64:
                    slow = 64
                    continue
            # plain loop for a few elements (long or empty strings, big-endian files, the tail...)
            for _ in range(min(n - done, slow)):
                text = self.string(f"item {done} of {key!r}")
                if decode:
                    out.append(text)
                done += 1
            slow = min(slow * 2, 1 << 16)
        return out if decode else SkippedArray(GGUFValueType.STRING, n, first, self.pos - first)

    def tensor_infos(self, meta: GGUFMetadata) -> None:
        infos: list[TensorInfo] = []
        self.count(meta.n_tensors, "the tensor infos", 8)
        for i in range(meta.n_tensors):
            at = self.pos
            name = self.string(f"name of tensor {i}", MAX_KEY)
            n_dims = self.u32(f"dimension count of tensor {name!r}")
            if n_dims > MAX_DIMS:
                raise self.err(f"tensor {name!r} has {n_dims} dimensions (at most {MAX_DIMS})", at)
            dims = self.unpack(f"{n_dims}Q", 8 * n_dims, f"shape of tensor {name!r}") if n_dims else ()
            ggml_type, offset = self.unpack("IQ", 12, f"type and offset of tensor {name!r}")
            infos.append(TensorInfo(name, tuple(int(d) for d in dims), int(ggml_type), int(offset)))
        meta.header_bytes = self.pos
        align = meta.kv.get("general.alignment", GGUF_DEFAULT_ALIGNMENT)
        if not isinstance(align, int) or isinstance(align, bool) or align <= 0 or align & (align - 1):
            raise self.err(f"general.alignment {align!r} is not a power of two", 0)
        data = (self.pos + align - 1) // align * align
        meta.data_offset = data
        meta.tensors = infos
        for t in infos:
            nb = t.n_bytes
            end = data + t.offset + (nb or 0)
            if end > self.size:
                raise GGUFError(
                    self.name,
                    f"file is cut short: tensor {t.name!r} ends at byte {end} but the "
                    f"file has {self.size} bytes",
                    offset=self.size,
                )


def _fast_strings(
    buf: bytes, start: int, stop: int, n: int, decode: bool = True
) -> tuple[list[str], int, int]:
    """Parse up to ``n`` little-endian length-prefixed strings that lie wholly inside ``buf[start:stop]``.

    Returns ``(strings, count, bytes_used)``; ``count`` may be below ``n`` (even 0: the caller then uses
    the plain loop for the next element); with ``decode=False`` the strings are only skipped.

    How: the length field of a string shorter than 64 KiB is ``lo hi 0 0 0 0 0 0`` followed by the
    first (non-zero) text byte, so candidate field starts come from vectorised compares. Candidates are
    then *verified* as a chain (``start[i+1] == start[i] + 8 + len[i]`` from the known first field), so
    a false candidate can only shorten the result, never corrupt it. The verified strings are then
    decoded in one call and split on a separator that occurs in none of them.
    """
    m = min(stop - start, n * 20 + 4096)  # do not scan far past what n strings plausibly need
    if m < 16 or n <= 0:
        return [], 0, 0
    arr = np.frombuffer(buf, dtype=np.uint8, count=m, offset=start)
    # A field start p has bytes p+2..p+7 zero and byte p+8 non-zero: p+8 ends a run of >= 6 zero bytes.
    zero = arr == 0
    ends = np.flatnonzero(zero[:-1] & ~zero[1:]) + 1  # first non-zero byte after a zero run
    ends = ends[ends >= 8]
    run6 = zero[ends - 6]
    for j in range(1, 6):
        run6 &= zero[ends - j]
    idx = ends[run6] - 8
    idx = idx[:n]
    if idx.size == 0 or idx[0] != 0:
        return [], 0, 0
    nxt = idx + 8 + arr[idx].astype(np.int64) + (arr[idx + 1].astype(np.int64) << 8)
    bad = np.flatnonzero(nxt[:-1] != idx[1:])
    k = int(bad[0]) + 1 if bad.size else int(idx.size)
    if int(nxt[k - 1]) > m:  # the last verified string runs past what we looked at
        k -= 1
    if k <= 0:
        return [], 0, 0
    end = int(nxt[k - 1])
    if not decode:
        return [], k, end
    starts = idx[:k]
    # Drop the 7 bytes after each field start, put a separator byte no text contains in the 8th,
    # then one decode and one split.
    work = arr[:end].copy()
    keep = np.ones(end, dtype=bool)
    for j in range(1, 8):
        keep[starts + j] = False
    for sep in _SEPARATORS:
        work[starts] = sep
        joined = work[keep]
        if int(np.count_nonzero(joined == sep)) == k:
            parts = joined.tobytes().decode("utf-8", "surrogateescape").split(chr(sep))
            return parts[1:], k, end
    return [], 0, 0


def iter_kv(meta: GGUFMetadata, *, max_items: int = 8) -> Iterator[tuple[str, str]]:
    """``(key, short text)`` pairs for display: long arrays are summarised."""
    for key, val in meta.kv.items():
        if isinstance(val, list) and len(val) > max_items:
            yield key, f"[{len(val)} items: {', '.join(map(repr, val[:3]))}, ...]"
        else:
            yield key, repr(val)
