"""Every GGUF file the tests write, written here (the one module that holds a ``gguf.GGUFWriter``).

- :func:`write_gguf`: a file from a vocabulary, header keys and tensors, written through a temporary file (a
  half-written file is never taken for a fixture); the foundation tests' files (vocab, scan, hostile inputs).
- :func:`tiny_model`, :func:`write_tiny_llama`, :func:`vocab_model`: small models (a parameter count and no
  weights worth running; a random llama llama.cpp loads; a vocabulary with bulk, as the fake Hub serves).
- :func:`header_fields`, :func:`grown_header`, :func:`tensors_of`: another file's header and weights, to
  write it again with more blocks (MTP blocks: ``_mtp_model``; wider and deeper copies: ``_arch_models``)
  or with its vocabulary (Gemma 4 assistants: ``_gemma4_model``).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import gguf
import numpy as np

from localspec.gguf.meta import read_metadata

VOCAB_DIR = Path(__file__).parent / "data" / "vocab"

#: One header key as the writer takes it: its value, its type and (for an array) its items' type.
Field = tuple[Any, gguf.GGUFValueType, gguf.GGUFValueType | None]


def vocab_path(name: str) -> Path:
    """A copied llama.cpp test vocabulary, e.g. ``vocab_path("qwen2")``."""
    return VOCAB_DIR / f"ggml-vocab-{name}.gguf"


def load_tokens(name: str) -> tuple[list[str], list[int]]:
    meta = read_metadata(vocab_path(name), tensors=False, merges=False)
    return list(meta.kv["tokenizer.ggml.tokens"]), list(meta.kv["tokenizer.ggml.token_type"])


def synthetic_tokens(n: int, prefix: str = "tok") -> list[str]:
    return [f"{prefix}{i}" for i in range(n)]


def ordinary_tokens(n: int) -> list[str]:
    """``n`` distinct ordinary token texts (byte-level BPE style)."""
    letters = "abcdefghijklmnopqrstuvwxyz"
    out = []
    i = 0
    while len(out) < n:
        a, b = divmod(i, 26)
        out.append(("Ġ" if a % 2 else "") + letters[b] + (letters[a % 26] * (a // 2)))
        i += 1
    return out


def write_gguf(
    path: Path,
    *,
    arch: str = "llama",
    name: str | None = None,
    tokens: Sequence[str | bytes] | None = None,
    token_types: Sequence[int] | None = None,
    model: str = "gpt2",
    pre: str | None = None,
    bos: int | None = None,
    eos: int | None = None,
    add_bos: bool | None = None,
    add_eos: bool | None = None,
    tensors: dict[str, np.ndarray] | None = None,
    file_type: int | None = None,
    extra: Callable[[gguf.GGUFWriter], None] | None = None,
    fields: dict[str, Field] | None = None,
) -> Path:
    """Write a GGUF with an optional vocabulary, optional header keys and optional tensors.

    Args:
        path: the file (written through ``<path>.<pid>.part``, then moved there).
        arch: ``general.architecture``.
        name: ``general.name``.
        tokens: the vocabulary (with ``model``'s tokenizer, ``pre``'s pre-tokenizer, ``token_types``).
        bos: the BOS token id; ``eos`` likewise; ``add_bos``/``add_eos`` whether a prompt gets them.
        tensors: the tensors, written as they are.
        file_type: ``general.file_type``.
        extra: adds more keys to the writer (after the vocabulary).
        fields: header keys copied from another file (:func:`header_fields`), after ``extra``'s.

    Returns:
        ``path``.
    """
    part = path.with_name(path.name + f".{os.getpid()}.part")
    w = gguf.GGUFWriter(str(part), arch)
    if name:
        w.add_name(name)
    if file_type is not None:
        w.add_file_type(file_type)
    if tokens is not None:
        w.add_tokenizer_model(model)
        if pre:
            w.add_tokenizer_pre(pre)
        w.add_token_list(list(tokens))
        if token_types is not None:
            w.add_token_types(list(token_types))
    for value, add in ((bos, w.add_bos_token_id), (eos, w.add_eos_token_id)):
        if value is not None:
            add(value)
    for flag, add_flag in ((add_bos, w.add_add_bos_token), (add_eos, w.add_add_eos_token)):
        if flag is not None:
            add_flag(flag)
    if extra:
        extra(w)
    for key, (value, vtype, sub) in (fields or {}).items():
        w.add_key_value(key, value, vtype, sub_type=sub)
    for tname, arr in (tensors or {}).items():
        w.add_tensor(tname, np.ascontiguousarray(arr))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    part.replace(path)
    return path


def tiny_model(
    path: Path,
    tokens: Sequence[str],
    *,
    n_embd: int = 4,
    arch: str = "llama",
    name: str = "tiny",
    basename: str | None = None,
    token_types: Sequence[int] | None = None,
    **kw,
) -> Path:
    """A 'model' whose parameter count is ``len(tokens) * n_embd * 2`` (embedding + output), f16."""
    n = len(tokens)
    tensors = {
        "token_embd.weight": np.zeros((n, n_embd), dtype=np.float16),
        "output.weight": np.zeros((n, n_embd), dtype=np.float16),
    }

    def extra(w: gguf.GGUFWriter) -> None:
        if basename:
            w.add_basename(basename)

    return write_gguf(
        path,
        arch=arch,
        name=name,
        tokens=tokens,
        token_types=token_types,
        tensors=tensors,
        file_type=gguf.LlamaFileType.MOSTLY_F16,
        extra=extra,
        **kw,
    )


def write_tiny_llama(
    path: Path,
    vocab_source: Path,
    *,
    n_embd: int = 16,
    n_layer: int = 1,
    seed: int = 0,
    arch: str = "llama",
) -> Path:
    """A small random-weight llama llama.cpp loads, with the tokenizer of ``vocab_source`` (a GGUF, e.g. a
    vocab-only file); ``arch`` names another architecture in the header (with llama's tensors: for an
    architecture llama.cpp does not know)."""
    kv = read_metadata(vocab_source, tensors=False).kv
    n_vocab = len(kv["tokenizer.ggml.tokens"])
    n_head, n_ff = 2, 2 * n_embd
    rng = np.random.default_rng(seed)

    def t(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) * 0.1).astype(np.float32)

    ones = np.ones(n_embd, dtype=np.float32)
    tensors = {
        "token_embd.weight": t(n_vocab, n_embd),
        "output_norm.weight": ones,
        "output.weight": t(n_vocab, n_embd),
    }
    for i in range(n_layer):
        b = f"blk.{i}."
        tensors[b + "attn_norm.weight"] = ones
        for part in ("attn_q", "attn_k", "attn_v", "attn_output"):
            tensors[f"{b}{part}.weight"] = t(n_embd, n_embd)
        tensors |= {
            b + "ffn_norm.weight": ones,
            b + "ffn_gate.weight": t(n_ff, n_embd),
            b + "ffn_up.weight": t(n_ff, n_embd),
            b + "ffn_down.weight": t(n_embd, n_ff),
        }

    def extra(w: gguf.GGUFWriter) -> None:
        w.add_context_length(256)
        w.add_embedding_length(n_embd)
        w.add_block_count(n_layer)
        w.add_feed_forward_length(n_ff)
        w.add_head_count(n_head)
        w.add_head_count_kv(n_head)
        w.add_layer_norm_rms_eps(1e-5)
        w.add_rope_dimension_count(n_embd // n_head)
        if "tokenizer.ggml.scores" in kv:
            w.add_token_scores(kv["tokenizer.ggml.scores"])
        if "tokenizer.ggml.merges" in kv:
            w.add_token_merges(kv["tokenizer.ggml.merges"])

    return write_gguf(
        path,
        arch=arch,
        name="tiny-test",
        file_type=gguf.LlamaFileType.ALL_F32,
        tokens=kv["tokenizer.ggml.tokens"],
        token_types=kv.get("tokenizer.ggml.token_type"),
        model=kv["tokenizer.ggml.model"],
        pre=kv.get("tokenizer.ggml.pre"),
        bos=_int_or_none(kv.get("tokenizer.ggml.bos_token_id")),
        eos=_int_or_none(kv.get("tokenizer.ggml.eos_token_id")),
        tensors=tensors,
        extra=extra,
    )


def _int_or_none(value: Any) -> int | None:
    return None if value is None else int(value)


def vocab_model(
    path: Path,
    tokens: list[str],
    *,
    control: set[int] = frozenset(),
    bos: int = 0,
    eos: int = 1,
    tensor_bytes: int = 0,
    arch: str = "llama",
    name: str = "test",
) -> Path:
    """A small GGUF with a gpt2-style vocabulary (ids in ``control`` typed CONTROL) and, optionally,
    one zero tensor of ``tensor_bytes`` bytes so the file is much larger than its header."""
    path.parent.mkdir(parents=True, exist_ok=True)
    types = [
        int(gguf.TokenType.CONTROL if i in control else gguf.TokenType.NORMAL) for i in range(len(tokens))
    ]
    return write_gguf(
        path,
        arch=arch,
        name=name,
        tokens=tokens,
        token_types=types,
        pre="default",
        bos=bos,
        eos=eos,
        add_bos=False,
        tensors={"token_embd.weight": np.zeros(tensor_bytes // 4, dtype=np.float32)}
        if tensor_bytes
        else None,
    )


def header_fields(reader: gguf.GGUFReader, prefix: str = "") -> dict[str, Field]:
    """The header keys of a file that start with ``prefix``, as :func:`write_gguf` writes them again; not the
    reader's own (``GGUF.*``), not ``general.architecture`` (the writer's argument), and no empty array (the
    writer refuses them; llama.cpp reads them as absent)."""
    out: dict[str, Field] = {}
    for name, f in reader.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture" or not name.startswith(prefix):
            continue
        vtype = f.types[0]
        if vtype == gguf.GGUFValueType.ARRAY and len(f.data) == 0:
            continue
        out[name] = (f.contents(), vtype, f.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None)
    return out


def architecture(reader: gguf.GGUFReader) -> tuple[str, int]:
    """A file's architecture and its block count."""
    arch = str(reader.fields["general.architecture"].contents())
    return arch, int(reader.fields[f"{arch}.block_count"].contents())


def grown_header(reader: gguf.GGUFReader, copies_of: Sequence[int]) -> dict[str, Field]:
    """The header of a file with blocks appended after its own, block ``k`` a copy of its layer
    ``copies_of[k]``: ``block_count`` raised, and every per-layer setting (a list of one value per layer:
    head counts, recurrent layers, FFN widths) given each copied layer's value."""
    arch, n_layer = architecture(reader)
    fields = header_fields(reader)
    for name, (value, vtype, sub) in fields.items():
        if isinstance(value, list) and len(value) == n_layer and name.startswith(f"{arch}."):
            fields[name] = ([*value, *(value[i] for i in copies_of)], vtype, sub)
    set_value(fields, f"{arch}.block_count", n_layer + len(copies_of))
    return fields


def set_value(fields: dict[str, Field], name: str, value: Any) -> None:
    """Give the header key ``name`` another value of its type."""
    _, vtype, sub = fields[name]
    fields[name] = (value, vtype, sub)


def tensors_of(reader: gguf.GGUFReader) -> dict[str, np.ndarray]:
    """A file's tensors by name, as float32 arrays (the F32 fixtures' own type)."""
    return {t.name: np.array(t.data, dtype=np.float32) for t in reader.tensors}
