"""Small GGUF files written with gguf.GGUFWriter for the foundation tests (vocab, scan, hostile inputs)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import gguf
import numpy as np

from localspec.gguf.meta import read_metadata

VOCAB_DIR = Path(__file__).parent / "data" / "vocab"


def vocab_path(name: str) -> Path:
    """A copied llama.cpp test vocabulary, e.g. ``vocab_path("qwen2")``."""
    return VOCAB_DIR / f"ggml-vocab-{name}.gguf"


def load_tokens(name: str) -> tuple[list[str], list[int]]:
    meta = read_metadata(vocab_path(name), tensors=False, merges=False)
    return list(meta.kv["tokenizer.ggml.tokens"]), list(meta.kv["tokenizer.ggml.token_type"])


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
) -> Path:
    """Write a GGUF with an optional vocabulary and optional tensors; returns ``path``."""
    w = gguf.GGUFWriter(str(path), arch)
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
    if bos is not None:
        w.add_bos_token_id(bos)
    if eos is not None:
        w.add_eos_token_id(eos)
    if add_bos is not None:
        w.add_add_bos_token(add_bos)
    if add_eos is not None:
        w.add_add_eos_token(add_eos)
    if extra:
        extra(w)
    for tname, arr in (tensors or {}).items():
        w.add_tensor(tname, arr)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def synthetic_tokens(n: int, prefix: str = "tok") -> list[str]:
    return [f"{prefix}{i}" for i in range(n)]


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
