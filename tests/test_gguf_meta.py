"""The GGUF header reader: same answers as gguf.GGUFReader, chunked/remote-style reads, hostile files."""

from __future__ import annotations

import io
import struct
import tracemalloc
from pathlib import Path

import gguf
import numpy as np
import pytest
from _gguf_build import synthetic_tokens, vocab_path, write_gguf
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from localspec.errors import GGUFError
from localspec.gguf.meta import SkippedArray, read_metadata, read_metadata_fileobj


def _rich_file(path: Path) -> Path:
    """Every value type, nested arrays, unicode and tensors of several ggml types."""

    def extra(w: gguf.GGUFWriter) -> None:
        w.add_uint8("t.u8", 200)
        w.add_int8("t.i8", -5)
        w.add_uint16("t.u16", 60000)
        w.add_int16("t.i16", -30000)
        w.add_uint32("t.u32", 4_000_000_000)
        w.add_int32("t.i32", -2_000_000_000)
        w.add_float32("t.f32", 1.5)
        w.add_uint64("t.u64", 2**63 + 5)
        w.add_int64("t.i64", -(2**62))
        w.add_float64("t.f64", 3.141592653589793)
        w.add_bool("t.bool", True)
        w.add_string("t.str", "héllo ✓ 世界")
        w.add_array("t.arr_i32", [1, -2, 3])
        w.add_array("t.arr_f32", [0.5, 2.0])
        w.add_array("t.arr_bool", [True, False, True])
        w.add_array("t.arr_str", ["a", "", "ü" * 3])
        w.add_array("t.nested", [[1, 2], [3]])
        w.add_block_count(2)

    tensors = {
        "token_embd.weight": np.zeros((70, 8), dtype=np.float16),
        "blk.0.attn_q.weight": np.ones((8, 8), dtype=np.float32),
        "blk.0.ffn_norm.weight": np.ones(8, dtype=np.float32),
    }
    return write_gguf(
        path,
        arch="llama",
        name="rich",
        tokens=synthetic_tokens(70),
        token_types=[1] * 70,
        bos=1,
        eos=2,
        add_bos=True,
        tensors=tensors,
        file_type=1,
        extra=extra,
    )


def test_rich_file_matches_gguf_reader(tmp_path):
    path = _rich_file(tmp_path / "rich.gguf")
    meta = read_metadata(path)
    ref = gguf.GGUFReader(str(path))
    for key, field in ref.fields.items():
        if key.startswith("GGUF."):
            continue
        assert key in meta.kv, key
        if key == "t.nested":  # GGUFReader has no contents() for nested arrays
            continue
        expected = field.contents()
        got = meta.kv[key]
        if isinstance(expected, float):
            assert got == pytest.approx(expected)
        elif isinstance(expected, list) and expected and isinstance(expected[0], float):
            assert got == pytest.approx(expected)
        else:
            assert got == expected, key
    assert meta.kv["t.nested"] == [[1, 2], [3]]
    assert meta.kv["t.str"] == "héllo ✓ 世界"
    assert [(t.name, t.shape, t.ggml_type) for t in meta.tensors] == [
        (t.name, tuple(int(x) for x in t.shape), int(t.tensor_type)) for t in ref.tensors
    ]
    assert meta.data_offset == ref.data_offset
    assert [meta.data_offset + t.offset for t in meta.tensors] == [t.data_offset for t in ref.tensors]
    assert meta.n_params == 70 * 8 + 64 + 8
    assert meta.quant_label == "F16"
    assert meta.architecture == "llama" and meta.name == "rich" and meta.version == 3
    assert meta.header_bytes <= meta.data_offset < meta.size_bytes


def test_real_vocab_file():
    meta = read_metadata(vocab_path("qwen2"))
    tokens = meta.kv["tokenizer.ggml.tokens"]
    assert len(tokens) == 151936
    assert tokens[:3] == ["!", '"', "#"]
    assert tokens[151643:151646] == ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    assert len(meta.kv["tokenizer.ggml.merges"]) == 151387 and meta.kv["tokenizer.ggml.merges"][0] == "Ġ Ġ"
    assert meta.n_tensors == 0 and meta.tensors == [] and meta.n_params == 0
    assert meta.header_bytes == meta.size_bytes  # a vocab-only file ends with its KV section
    fast = read_metadata(vocab_path("qwen2"), merges=False)
    assert isinstance(fast.kv["tokenizer.ggml.merges"], SkippedArray)
    assert len(fast.kv["tokenizer.ggml.merges"]) == 151387
    assert fast.kv["tokenizer.ggml.tokens"] == tokens


def test_spm_vocab_scores_and_types():
    meta = read_metadata(vocab_path("llama-spm"))
    assert meta.kv["tokenizer.ggml.model"] == "llama"
    assert meta.kv["tokenizer.ggml.tokens"][:3] == ["<unk>", "<s>", "</s>"]
    assert meta.kv["tokenizer.ggml.tokens"][13] == "<0x0A>"
    assert len(meta.kv["tokenizer.ggml.scores"]) == 32000
    assert meta.kv["tokenizer.ggml.token_type"][:4] == [2, 3, 3, 6]


class CountingFile(io.RawIOBase):
    """A seekable file that counts the bytes handed out (stands in for a remote range-request file)."""

    def __init__(self, data: bytes):
        self.data, self.pos, self.bytes_read, self.reads = data, 0, 0, 0

    def seekable(self) -> bool:
        return True

    def seek(self, off: int, whence: int = 0) -> int:
        self.pos = off if whence == 0 else (self.pos + off if whence == 1 else len(self.data) + off)
        return self.pos

    def read(self, n: int = -1) -> bytes:
        chunk = self.data[self.pos :] if n < 0 else self.data[self.pos : self.pos + n]
        self.pos += len(chunk)
        self.bytes_read += len(chunk)
        self.reads += 1
        return chunk


def test_fileobj_stops_after_kv_section(tmp_path):
    big = {"token_embd.weight": np.zeros((1000, 1024), dtype=np.float32)}  # 4 MB of tensor data
    path = write_gguf(tmp_path / "m.gguf", tokens=synthetic_tokens(5000), token_types=[1] * 5000, tensors=big)
    data = path.read_bytes()
    fh = CountingFile(data)
    meta = read_metadata_fileobj(fh, "remote://m.gguf", len(data), tensors=False, chunk_size=1 << 16)
    assert meta.tensors is None and len(meta.kv["tokenizer.ggml.tokens"]) == 5000
    assert fh.bytes_read <= meta.header_bytes + (1 << 16)
    assert fh.bytes_read < len(data) // 10
    full = read_metadata_fileobj(CountingFile(data), "remote://m.gguf", len(data), chunk_size=1 << 16)
    assert full.kv == read_metadata(path).kv and full.n_params == 1_024_000


def test_small_chunks_give_the_same_vocabulary():
    path = vocab_path("gpt-2")
    data = path.read_bytes()
    small = read_metadata_fileobj(io.BytesIO(data), "x", len(data), chunk_size=1 << 16)
    assert small.kv == read_metadata(path).kv


# -- hostile files ---------------------------------------------------------------------------------
def _base(tmp_path: Path) -> bytes:
    return write_gguf(
        tmp_path / "base.gguf",
        tokens=synthetic_tokens(100),
        token_types=[1] * 100,
        bos=0,
        tensors={"w": np.zeros((4, 4), dtype=np.float32)},
    ).read_bytes()


def _kv_start() -> int:
    return 24


def _corruptions(base: bytes) -> dict[str, bytes]:
    toks = base.index(b"tokenizer.ggml.tokens") + len(b"tokenizer.ggml.tokens")
    first_len = toks + 4 + 4 + 8  # value type, item type, count, then the first string's length
    out = {
        "empty": b"",
        "bad magic": b"GGUG" + base[4:],
        "text file": b"hello world, this is not a model\n" * 4,
        "version 1": base[:4] + struct.pack("<I", 1) + base[8:],
        "version 99": base[:4] + struct.pack("<I", 99) + base[8:],
        "truncated header": base[:20],
        "truncated in KV": base[: toks - 5],
        "truncated in tokens": base[: toks + 200],
        "truncated in tensor data": base[:-8],
        "absurd kv count": base[:16] + struct.pack("<Q", 2**60) + base[24:],
        "absurd tensor count": base[:8] + struct.pack("<Q", 2**40) + base[16:],
        "huge key length": base[:24] + struct.pack("<Q", 2**63) + base[32:],
        "huge array count": base[: toks + 8] + struct.pack("<Q", 2**62) + base[toks + 16 :],
        "string longer than file": base[:first_len] + struct.pack("<Q", len(base)) + base[first_len + 8 :],
        "unknown value type": base[:toks] + struct.pack("<I", 77) + base[toks + 4 :],
    }
    # a tensor with five dimensions: find the tensor name "w" (length 1) after the KV section
    w_at = base.rindex(struct.pack("<Q", 1) + b"w")
    out["five dims"] = base[: w_at + 9] + struct.pack("<I", 5) + base[w_at + 13 :]
    return out


def test_each_corruption_gives_a_clean_error(tmp_path):
    base = _base(tmp_path)
    assert read_metadata(tmp_path / "base.gguf").n_params == 16
    for label, blob in _corruptions(base).items():
        p = tmp_path / f"{label.replace(' ', '_')}.gguf"
        p.write_bytes(blob)
        with pytest.raises(GGUFError) as info:
            read_metadata(p)
        msg = str(info.value)
        assert str(p) in msg, label
        assert info.value.offset is not None and "at byte" in msg, label
        assert info.value.hint, label


def test_specific_messages(tmp_path):
    base = _base(tmp_path)
    cases = _corruptions(base)
    expect = {
        "bad magic": "not a GGUF file",
        "version 1": "version 1 is not supported",
        "truncated in tensor data": "cut short",
        "absurd kv count": "absurd key/value count",
        "huge array count": "claims",
        "unknown value type": "unknown value type 77",
        "five dims": "5 dimensions",
        "string longer than file": "remain in the file",
    }
    for label, needle in expect.items():
        p = tmp_path / "x.gguf"
        p.write_bytes(cases[label])
        with pytest.raises(GGUFError, match=needle):
            read_metadata(p)


def test_nesting_duplicates_alignment_and_folders(tmp_path):
    deep = write_gguf(tmp_path / "deep.gguf", extra=lambda w: w.add_array("x", [[[[1]]]]))
    with pytest.raises(GGUFError, match="nested"):
        read_metadata(deep)
    dup = write_gguf(
        tmp_path / "dup.gguf",
        extra=lambda w: w.add_uint32("general.alignment", 24),
        tensors={"w": np.zeros(4, dtype=np.float32)},
    )
    with pytest.raises(GGUFError, match="power of two"):
        read_metadata(dup)
    raw = write_gguf(tmp_path / "two.gguf", extra=lambda w: (w.add_uint32("aa", 1), w.add_uint32("ab", 2)))
    data = raw.read_bytes().replace(b"ab", b"aa")
    raw.write_bytes(data)
    with pytest.raises(GGUFError, match="duplicate key"):
        read_metadata(raw)
    with pytest.raises(GGUFError, match="folder"):
        read_metadata(tmp_path)
    with pytest.raises(GGUFError, match="cannot be opened"):
        read_metadata(tmp_path / "missing.gguf")


_ODD = [b"", b"\x00", b"\x00" * 9, b"\xff\xfe", b"\xe3\x81", "é".encode(), b"x" * 70000]


@settings(max_examples=25, deadline=3000, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(items=st.lists(st.one_of(st.binary(max_size=12), st.sampled_from(_ODD)), min_size=64, max_size=400))
def test_string_arrays_fast_path_equals_plain_decoding(tmp_path, items):
    """Any byte strings (NULs, invalid UTF-8, empty, >64 KiB) come back exactly as a per-item decode."""
    p = write_gguf(tmp_path / "s.gguf", extra=lambda w: w.add_array("s", list(items)))
    assert read_metadata(p).kv["s"] == [b.decode("utf-8", "surrogateescape") for b in items]


_FUZZ_BASE: dict[str, bytes] = {}


def _fuzz_base(tmp_path_factory) -> bytes:
    if "b" not in _FUZZ_BASE:
        d = tmp_path_factory.mktemp("fuzz")
        _FUZZ_BASE["b"] = write_gguf(
            d / "f.gguf",
            tokens=synthetic_tokens(200) + ["", "\x00x"] * 10,
            token_types=[1] * 220,
            bos=1,
            add_bos=True,
            extra=lambda w: w.add_array("n", [[1, 2], [3]]),
            tensors={"a": np.zeros((3, 5), dtype=np.float16)},
        ).read_bytes()
    return _FUZZ_BASE["b"]


_BIG = [0, 1, 2**31, 2**32 - 1, 2**62, 2**64 - 1]
mutation = st.one_of(
    st.tuples(st.just("flip"), st.integers(0, 10**6), st.integers(0, 255)),
    st.tuples(st.just("u64"), st.integers(0, 10**6), st.sampled_from(_BIG)),
    st.tuples(st.just("cut"), st.integers(0, 10**6), st.just(0)),
    st.tuples(st.just("insert"), st.integers(0, 10**6), st.integers(0, 255)),
)


@settings(max_examples=150, deadline=2000, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(mutations=st.lists(mutation, min_size=1, max_size=4))
def test_fuzzed_headers_only_raise_gguf_error(tmp_path_factory, mutations):
    data = bytearray(_fuzz_base(tmp_path_factory))
    for kind, where, value in mutations:
        at = where % max(len(data), 1)
        if kind == "flip" and data:
            data[at] = value
        elif kind == "u64":
            data[at : at + 8] = struct.pack("<Q", value)
        elif kind == "cut":
            del data[at:]
        else:
            data[at:at] = bytes([value])
    blob = bytes(data)
    tracemalloc.start()
    try:
        read_metadata_fileobj(io.BytesIO(blob), "fuzz.gguf", len(blob))
    except GGUFError as exc:
        assert "fuzz.gguf" in str(exc)
    finally:
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    assert peak < 64 * len(blob) + (8 << 20)


# -- totals over the whole header -------------------------------------------------------------------
def _raw_gguf(kv: list[tuple[str, int, bytes]], n_tensors: int = 0, tensor_bytes: bytes = b"") -> bytes:
    """A GGUF v3 built by hand: ``kv`` items are (key, value type, encoded value)."""
    out = b"GGUF" + struct.pack("<IQQ", 3, n_tensors, len(kv))
    for key, vtype, value in kv:
        out += struct.pack("<Q", len(key)) + key.encode() + struct.pack("<I", vtype) + value
    return out + tensor_bytes


def test_many_arrays_each_under_the_cap_are_refused_in_total(tmp_path):
    from localspec.gguf.meta import MAX_ARRAY, MAX_HEADER_ITEMS

    per = 1 << 20  # each array is far below MAX_ARRAY; together they pass MAX_HEADER_ITEMS
    assert per < MAX_ARRAY and 5 * per > MAX_HEADER_ITEMS
    arr = struct.pack("<IQ", int(gguf.GGUFValueType.UINT8), per) + bytes(per)
    p = tmp_path / "many.gguf"
    p.write_bytes(_raw_gguf([(f"a{i}", int(gguf.GGUFValueType.ARRAY), arr) for i in range(5)]))
    tracemalloc.start()
    try:
        with pytest.raises(GGUFError, match=r"more than \d+ keys, array items and tensor infos in total"):
            read_metadata(p)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 16 * p.stat().st_size  # refused before the lists grew to ~10x the file


def test_a_header_with_too_many_tensor_infos_is_refused_before_reading_them(tmp_path):
    n = 200_000  # 24 bytes per minimal tensor info: a 4.8 MB header
    info = struct.pack("<Q", 1) + b"t" + struct.pack("<IIQ", 0, 0, 0)  # 0-dim F32 tensor at offset 0
    p = tmp_path / "tensors.gguf"
    p.write_bytes(_raw_gguf([], n_tensors=n, tensor_bytes=info * n + bytes(64)))
    with pytest.raises(GGUFError, match="absurd tensor count 200000"):
        read_metadata(p)


def test_real_vocabularies_stay_well_under_the_totals():
    from localspec.gguf.meta import MAX_HEADER_ITEMS

    for name in ("qwen2", "llama-spm", "gpt-2"):
        meta = read_metadata(vocab_path(name))
        items = sum(len(v) for v in meta.kv.values() if isinstance(v, list)) + len(meta.kv)
        assert items * 3 < MAX_HEADER_ITEMS, name
