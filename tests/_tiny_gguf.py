"""Write small random-weight llama-architecture GGUF models for tests (real files llama.cpp loads)."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np

from localspec.gguf.meta import read_metadata


def write_tiny_llama(
    path: Path,
    vocab_source: Path,
    *,
    n_embd: int = 16,
    n_layer: int = 1,
    seed: int = 0,
    arch: str = "llama",
) -> Path:
    """A 1-layer llama with the tokenizer of ``vocab_source`` (a GGUF, e.g. a vocab-only file); ``arch``
    names another architecture in the header (with llama's tensors: for an architecture llama.cpp
    does not know)."""
    meta = read_metadata(vocab_source, tensors=False)
    tokens = meta.kv["tokenizer.ggml.tokens"]
    n_vocab = len(tokens)
    n_head, n_ff = 2, 2 * n_embd
    rng = np.random.default_rng(seed)

    w = gguf.GGUFWriter(str(path), arch)
    w.add_name("tiny-test")
    w.add_context_length(256)
    w.add_embedding_length(n_embd)
    w.add_block_count(n_layer)
    w.add_feed_forward_length(n_ff)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_head)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_dimension_count(n_embd // n_head)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    w.add_tokenizer_model(meta.kv["tokenizer.ggml.model"])
    if "tokenizer.ggml.pre" in meta.kv:
        w.add_tokenizer_pre(meta.kv["tokenizer.ggml.pre"])
    w.add_token_list(tokens)
    if "tokenizer.ggml.token_type" in meta.kv:
        w.add_token_types(meta.kv["tokenizer.ggml.token_type"])
    if "tokenizer.ggml.scores" in meta.kv:
        w.add_token_scores(meta.kv["tokenizer.ggml.scores"])
    if "tokenizer.ggml.merges" in meta.kv:
        w.add_token_merges(meta.kv["tokenizer.ggml.merges"])
    for key, add in (
        ("tokenizer.ggml.bos_token_id", w.add_bos_token_id),
        ("tokenizer.ggml.eos_token_id", w.add_eos_token_id),
    ):
        if key in meta.kv:
            add(int(meta.kv[key]))

    def t(*shape):
        return (rng.standard_normal(shape) * 0.1).astype(np.float32)

    w.add_tensor("token_embd.weight", t(n_vocab, n_embd))
    w.add_tensor("output_norm.weight", np.ones(n_embd, dtype=np.float32))
    w.add_tensor("output.weight", t(n_vocab, n_embd))
    for i in range(n_layer):
        w.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(n_embd, dtype=np.float32))
        for name in ("attn_q", "attn_k", "attn_v", "attn_output"):
            w.add_tensor(f"blk.{i}.{name}.weight", t(n_embd, n_embd))
        w.add_tensor(f"blk.{i}.ffn_norm.weight", np.ones(n_embd, dtype=np.float32))
        w.add_tensor(f"blk.{i}.ffn_gate.weight", t(n_ff, n_embd))
        w.add_tensor(f"blk.{i}.ffn_up.weight", t(n_ff, n_embd))
        w.add_tensor(f"blk.{i}.ffn_down.weight", t(n_embd, n_ff))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
