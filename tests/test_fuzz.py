"""Fuzzing the two parsers that read files a user did not write by hand: GGUF headers and preset files.

Bounded: a fixed number of examples each (about 10 s in all on 2 cores), no deadline per example but a
time bound asserted per input. Each asserts only that the parser returns or raises its own clean error
(``GGUFError`` / ``PresetError``), never anything else, and never takes long.
"""

from __future__ import annotations

import io
import math
import struct
import time
from pathlib import Path

import numpy as np
import pytest
from _gguf_build import synthetic_tokens, write_gguf
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from localspec.errors import GGUFError, PresetError
from localspec.gguf.meta import GGUFMetadata, read_metadata_fileobj
from localspec.hub.presets import Preset, parse_preset, parse_text

PER_INPUT_S = 2.0
FUZZ = settings(
    max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]
)


@pytest.fixture(scope="module")
def seed_gguf(tmp_path_factory) -> bytes:
    """A small but complete GGUF: vocabulary, scores, types, nested array, tensors."""
    path = tmp_path_factory.mktemp("fuzz") / "seed.gguf"
    write_gguf(
        path,
        tokens=synthetic_tokens(200),
        token_types=[1] * 200,
        bos=0,
        eos=1,
        tensors={"a": np.zeros((4, 8), dtype=np.float32), "b": np.ones(8, dtype=np.float16)},
        extra=lambda w: (w.add_array("t.nested", [[1, 2], [3]]), w.add_string("t.s", "héllo")),
    )
    return path.read_bytes()


def _parse(blob: bytes, *, tensors: bool, merges: bool) -> None:
    start = time.perf_counter()
    try:
        meta = read_metadata_fileobj(io.BytesIO(blob), "fuzz.gguf", len(blob), tensors=tensors, merges=merges)
        assert isinstance(meta, GGUFMetadata)
    except GGUFError as exc:
        assert exc.path == "fuzz.gguf" and exc.hint
    assert time.perf_counter() - start < PER_INPUT_S


_U64_EDGES = st.sampled_from([0, 1, 2**31, 2**32 - 1, 2**32, 2**62, 2**63, 2**64 - 1])


@FUZZ
@given(data=st.data(), tensors=st.booleans(), merges=st.booleans())
def test_gguf_reader_mutations(seed_gguf, data, tensors, merges):
    blob = bytearray(seed_gguf)
    for _ in range(data.draw(st.integers(1, 6))):
        kind = data.draw(st.sampled_from(["flip", "u64", "u32", "cut", "insert", "delete"]))
        at = data.draw(st.integers(0, len(blob) - 1))
        if kind == "flip":
            blob[at] ^= data.draw(st.integers(1, 255))
        elif kind == "u64" and at + 8 <= len(blob):
            blob[at : at + 8] = struct.pack("<Q", data.draw(_U64_EDGES))
        elif kind == "u32" and at + 4 <= len(blob):
            blob[at : at + 4] = struct.pack("<I", data.draw(st.integers(0, 2**32 - 1)))
        elif kind == "cut":
            del blob[at:]
        elif kind == "insert":
            blob[at:at] = data.draw(st.binary(min_size=1, max_size=32))
        elif kind == "delete":
            del blob[at : at + data.draw(st.integers(1, 32))]
        if not blob:
            break
    _parse(bytes(blob), tensors=tensors, merges=merges)


@FUZZ
@given(
    version=st.sampled_from([2, 3, 0x03000000]),
    counts=st.tuples(_U64_EDGES | st.integers(0, 64), _U64_EDGES | st.integers(0, 64)),
    body=st.binary(max_size=2048),
)
def test_gguf_reader_random_bodies(version, counts, body):
    blob = b"GGUF" + struct.pack("<IQQ", version, *counts) + body
    _parse(blob, tensors=True, merges=True)


# -- presets -----------------------------------------------------------------------------------------

_KEYS = [
    "name",
    "description",
    "family",
    "target",
    "draft_model",
    "n_ctx",
    "draft",
    "chat_format",
    "licence",
    "gated",
    "download_size",
    "ram",
    "repo",
    "file",
    "revision",
    "path",
    "embedded",
    "n_max",
    "n_min",
    "p_min",
    "adaptive",
    "strategy",
    "bogus",
]
_scalars = (
    st.integers(min_value=-(10**30), max_value=10**30)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.booleans()
    | st.text(max_size=40)
    | st.sampled_from(
        ["model", "ngram", "none", "a/b", "*.gguf", "../x", "main", "4.7 GB", "tiny-target.gguf"]
    )
)
_edges = st.sampled_from(
    [math.inf, -math.inf, math.nan, 10**300, -1, 2**64, 1e308, "9" * 400 + " GB", "x\0y"]
)
_values = st.recursive(
    _scalars | _edges,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.sampled_from(_KEYS), inner, max_size=6),
    max_leaves=20,
)


_BASE = {
    "name": "x",
    "target": {"repo": "a/b", "file": "m.gguf", "revision": "main"},
    "draft_model": {"path": "/d.gguf"},
    "draft": {"n_max": 4, "p_min": 0.5, "strategy": "model"},
    "n_ctx": 4096,
    "download_size": "1 GB",
    "ram": 10,
}
_tables = st.dictionaries(st.sampled_from(_KEYS), _values, max_size=10)
_one_bad_value = st.tuples(st.sampled_from(sorted(_BASE)), _edges | _edges | _values).map(
    lambda kv: {**_BASE, kv[0]: kv[1]}
)


_one_bad_draft_value = st.tuples(
    st.sampled_from(sorted(_BASE["draft"]) + ["n_min", "adaptive"]), _edges | _values
).map(lambda kv: {**_BASE, "draft": {**_BASE["draft"], kv[0]: kv[1]}})


@FUZZ
@given(table=_tables | _one_bad_value | _one_bad_draft_value)
def test_preset_tables(table):
    start = time.perf_counter()
    try:
        preset = parse_preset(table, where="fuzz.toml [preset x]", source="user", base_dir=Path("/nowhere"))
        assert isinstance(preset, Preset) and isinstance(preset.name, str)
        assert 0 <= preset.download_bytes <= 10**15 and math.isfinite(preset.draft.p_min)
    except PresetError as exc:
        assert str(exc).startswith("fuzz.toml [preset x]") and exc.hint
    assert time.perf_counter() - start < PER_INPUT_S


_toml_bits = st.sampled_from(
    [
        "[[preset]]\n",
        "[preset.draft]\n",
        "[defaults]\n",
        'name = "x"\n',
        'target = { path = "/m.gguf" }\n',
        "n_ctx = 4096\n",
        "download_size = inf\n",
        "ram = nan\n",
        "n_ctx = " + "9" * 300 + "\n",
        'target = { repo = "a/b", file = "m.gguf", revision = "../../x" }\n',
        "n_max = 0\n",
        "x = [[[[1]]]]\n",
        "p_min = 1e309\n",
        'strategy = "magic"\n',
        "[[preset]\n",
        "draft = 3\n",
        "= =\n",
    ]
)


@FUZZ
@given(parts=st.lists(_toml_bits | st.text(max_size=20), max_size=12), junk=st.binary(max_size=8))
def test_preset_files(parts, junk):
    raw = "".join(parts).encode("utf-8", "surrogatepass") + junk
    start = time.perf_counter()
    try:
        presets = parse_text(raw, path=Path("/nowhere/fuzz.toml"), source="user")
        assert all(isinstance(p, Preset) for p in presets)
    except PresetError as exc:
        assert str(exc).startswith("/nowhere/fuzz.toml") and exc.hint
    assert time.perf_counter() - start < PER_INPUT_S
