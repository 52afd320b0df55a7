"""Tiny Gemma 4 (``gemma4``) targets and ``gemma4-assistant`` drafters, for llama.cpp's shared-memory MTP.

A Gemma 4 assistant is a separate file whose layers hold no K/V projections: llama.cpp makes its context
``LLAMA_CONTEXT_TYPE_MTP`` with ``ctx_other`` the target's, and its KV cache shares the target's last two
layers (its SWA layer reads the target's layer ``n_layer - 2``, its full-attention layer ``n_layer - 1``).
Its graph pre-projects ``concat(target_tok_embd[token] * sqrt(n_embd_target), h)`` (``h``: the target's
post-norm hidden row, or its own previous ``h_nextn``) to its own width, runs its layers, and answers logits
through its tied ``token_embd`` and the next ``h`` through ``nextn.post_projection``. In llama.cpp's
``draft-mtp`` loop every draft step runs at the pending token's position: step 0 feeds the pending token with
the target's row of the position before, step ``i`` the token drafted at step ``i - 1`` with the row that
step produced.

llama.cpp's ``test-llama-archs`` does not write gemma4 ("ISWA KV cache initialization needs more fixture
params"), so both files are written here with ``gguf`` and numpy (F32), with the 128-token dummy vocabulary
of a test-llama-archs model (:func:`_arch_models.write_model`):

- :func:`gemma4_target`: a random dense gemma4, 5 layers (4 sliding-window, the last full attention, so the
  assistant's SWA layer lands on an SWA layer), n_embd 128, no per-layer embeddings, no MoE, an untied
  output. Its token embeddings dominate its residual stream, so its greedy next token depends mostly on the
  current token (measured: the majority answer over random contexts in 9 cases of 10), through a random map
  (generations are not one repeated token).
- :func:`gemma4_assistant`: a 2-layer assistant (n_embd 64; one SWA layer, then one full) for a target:

  - ``"random"``: random weights; its drafts are mostly rejected.
  - ``"token"``: fitted to the target. Its attention output and FFN down projections are zero (a block adds
    nothing: its output is its input), the pre-projection keeps the token half (an orthonormal 128 -> 64
    slice), and its output rows are set, in closed form, so that for the input token ``t`` it answers the
    target's greedy next token after ``t``: right for 3 tokens in 4, deliberately wrong (answer + 1) for the
    rest, so that drafts run long and are also rejected.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import gguf
import numpy as np
from _gguf_build import Field, header_fields, tensors_of, write_gguf

#: The target's shape (test-llama-archs' gemma4 hyperparameters, per-layer embeddings off).
N_EMBD, N_HEAD, HEAD_DIM, N_FF, N_LAYER = 128, 2, 64, 192, 5
#: The assistant's shape: narrower than the target (llama.cpp requires embedding_length_out != n_embd).
ASSISTANT_EMBD, ASSISTANT_FF = 64, 128
ASSISTANT_SWA = (True, False)
N_CTX_TRAIN, SLIDING_WINDOW, RMS_EPS = 512, 32, 1e-6
ROPE_BASE, ROPE_BASE_SWA, SOFTCAP = 1_000_000.0, 10_000.0, 30.0
#: The target's scaled token embeddings' RMS, against the unit-RMS (post-normed) writes of its 10 blocks
#: (16: the next token follows the current one in 87% of contexts, 32: 91%, 64: 98%).
EMBD_RMS = 32.0


def _n_vocab(tokenizer: dict[str, Field]) -> int:
    return len(tokenizer["tokenizer.ggml.tokens"][0])


def _write(
    out: Path,
    arch: str,
    fill: Callable[[gguf.GGUFWriter], None],
    tokenizer: dict[str, Field],
    tensors: dict[str, np.ndarray],
) -> Path:
    """Write ``out``, F32: ``fill(writer)`` adds the architecture's keys, ``tokenizer`` the vocabulary."""
    f32 = {name: np.asarray(array, dtype=np.float32) for name, array in tensors.items()}
    return write_gguf(
        out,
        arch=arch,
        name=out.stem,
        file_type=gguf.LlamaFileType.ALL_F32,
        extra=fill,
        fields=tokenizer,
        tensors=f32,
    )


def _attention_keys(writer: gguf.GGUFWriter, swa: tuple[bool, ...]) -> None:
    """Keys both files share: heads, head sizes, RoPE and the sliding window (the assistant's attention
    reads the target's KV cache, so they must agree)."""
    writer.add_context_length(N_CTX_TRAIN)
    writer.add_head_count(N_HEAD)
    writer.add_head_count_kv(N_HEAD)
    writer.add_key_length(HEAD_DIM)
    writer.add_value_length(HEAD_DIM)
    writer.add_key_length_swa(HEAD_DIM)
    writer.add_value_length_swa(HEAD_DIM)
    writer.add_rope_dimension_count(HEAD_DIM)
    writer.add_rope_dimension_count_swa(HEAD_DIM)
    writer.add_rope_freq_base(ROPE_BASE)
    writer.add_rope_freq_base_swa(ROPE_BASE_SWA)
    writer.add_sliding_window(SLIDING_WINDOW)
    writer.add_sliding_window_pattern(list(swa))
    writer.add_layer_norm_rms_eps(RMS_EPS)


def gemma4_target(folder: Path, seed: int = 1, *, n_ff: int = N_FF, n_layer: int = N_LAYER) -> Path:
    """A random dense gemma4 written with ``seed`` (see the module), kept in ``folder`` and reused.

    Its norms are ones (Gemma GGUFs store the final multiplier), its matrices random (1/sqrt(fan-in)), its
    token embeddings scaled so that the current token dominates the residual stream, and its output matrix
    untied (with the tied one a token would mostly answer itself). ``n_ff`` and ``n_layer`` make it as
    costly per token as a real model (every block's writes are post-normed: the token still dominates);
    all its layers but the last use the sliding window.
    """
    shape = "" if (n_ff, n_layer) == (N_FF, N_LAYER) else f"-ff{n_ff}-l{n_layer}"
    out = folder / f"gemma4{shape}-seed{seed}.gguf"
    if out.is_file():
        return out
    folder.mkdir(parents=True, exist_ok=True)
    from _arch_models import write_model

    # a test-llama-archs llama's 128-token dummy "test" vocabulary (the same for every seed)
    tokenizer = header_fields(gguf.GGUFReader(write_model(folder, "llama", 1)), "tokenizer.ggml.")
    n_vocab = _n_vocab(tokenizer)
    rng = np.random.default_rng(seed)

    def mat(n_out: int, n_in: int) -> np.ndarray:
        return (rng.standard_normal((n_out, n_in)) / np.sqrt(n_in)).astype(np.float32)

    def ones(n: int) -> np.ndarray:
        return np.ones(n, dtype=np.float32)

    tensors = {
        # RMS 1/sqrt(n_embd), which llama.cpp scales by sqrt(n_embd): EMBD_RMS then
        "token_embd.weight": mat(n_vocab, N_EMBD) * np.float32(EMBD_RMS),
        "output_norm.weight": ones(N_EMBD),
        "output.weight": mat(n_vocab, N_EMBD) * np.float32(4.0),
        "rope_freqs.weight": ones(HEAD_DIM // 2),  # the full layers' (plain RoPE: no unrotated dims)
    }
    for i in range(n_layer):
        b = f"blk.{i}."
        tensors |= {
            b + "attn_norm.weight": ones(N_EMBD),
            b + "attn_q.weight": mat(N_HEAD * HEAD_DIM, N_EMBD),
            b + "attn_k.weight": mat(N_HEAD * HEAD_DIM, N_EMBD),
            b + "attn_v.weight": mat(N_HEAD * HEAD_DIM, N_EMBD),
            b + "attn_output.weight": mat(N_EMBD, N_HEAD * HEAD_DIM),
            b + "attn_q_norm.weight": ones(HEAD_DIM),
            b + "attn_k_norm.weight": ones(HEAD_DIM),
            b + "post_attention_norm.weight": ones(N_EMBD),
            b + "ffn_norm.weight": ones(N_EMBD),
            b + "ffn_gate.weight": mat(n_ff, N_EMBD),
            b + "ffn_up.weight": mat(n_ff, N_EMBD),
            b + "ffn_down.weight": mat(N_EMBD, n_ff),
            b + "post_ffw_norm.weight": ones(N_EMBD),
            b + "layer_output_scale.weight": ones(1),
        }

    def fill(writer: gguf.GGUFWriter) -> None:
        writer.add_embedding_length(N_EMBD)
        writer.add_block_count(n_layer)
        writer.add_feed_forward_length(n_ff)
        writer.add_embedding_length_per_layer_input(0)  # required by llama.cpp's gemma4 loader
        writer.add_shared_kv_layers(0)
        writer.add_final_logit_softcapping(SOFTCAP)
        _attention_keys(writer, (True,) * (n_layer - 1) + (False,))

    return _write(out, "gemma4", fill, tokenizer, tensors)


def gemma4_assistant(folder: Path, target: Path, kind: str, seed: int = 1) -> Path:
    """A ``gemma4-assistant`` for ``target`` (a :func:`gemma4_target` file) whose weights are ``kind``
    (``"random"`` or ``"token"``, see the module), kept in ``folder`` and reused.

    llama.cpp reads the assistant's layers as its MTP layers: ``block_count`` and ``nextn_predict_layers``
    are both 2 (it has no trunk), and ``sliding_window_pattern`` [SWA, full] picks which target layer each
    one's attention reads. ``embedding_length_out`` carries the target's width (the pre-projection's input is
    twice that, the post-projection's output that).
    """
    out = folder / f"{target.stem}-assistant-{kind}-seed{seed}.gguf"
    if out.is_file():
        return out
    if kind not in ("random", "token"):
        raise ValueError(f"unknown assistant kind {kind!r}")
    reader = gguf.GGUFReader(target)
    emb = tensors_of(reader)["token_embd.weight"]
    n_vocab, n_embd_target = emb.shape
    tokenizer = header_fields(reader, "tokenizer.ggml.")  # the target's vocabulary
    rng = np.random.default_rng(seed + 1000)
    d = ASSISTANT_EMBD

    def mat(n_out: int, n_in: int) -> np.ndarray:
        return (rng.standard_normal((n_out, n_in)) / np.sqrt(n_in)).astype(np.float32)

    def ones(n: int) -> np.ndarray:
        return np.ones(n, dtype=np.float32)

    if kind == "random":
        pre = mat(d, 2 * n_embd_target)
        head = mat(n_vocab, d) * np.float32(4.0)
    else:
        from _mtp_model import next_token_map, rms

        nxt = next_token_map(target, n_vocab)
        wrong = rng.permutation(n_vocab) < n_vocab // 4  # exactly a quarter of the tokens
        answer = np.where(wrong, (nxt + 1) % n_vocab, nxt)
        basis, _ = np.linalg.qr(rng.standard_normal((n_embd_target, d)))  # orthonormal columns
        pre = np.concatenate([basis.T, np.zeros((d, n_embd_target))], axis=1).astype(np.float32)
        # the row that reaches the output matrix for token t: the pre-projected scaled target embedding,
        # unchanged by the (silent) blocks, through output_norm
        feats = rms((emb * np.float32(np.sqrt(n_embd_target))) @ pre[:, :n_embd_target].T, RMS_EPS)
        head = np.zeros((n_vocab, d), dtype=np.float32)
        np.add.at(head, answer, feats / 4.0)  # |feat|^2 / 4 = 16: a clear argmax
    tensors = {
        "token_embd.weight": head,  # tied: its output matrix
        "output_norm.weight": ones(d),
        "rope_freqs.weight": ones(HEAD_DIM // 2),
        "nextn.pre_projection.weight": pre,
        "nextn.post_projection.weight": mat(n_embd_target, d),
    }
    silent = kind == "token"
    for i in range(len(ASSISTANT_SWA)):
        b = f"blk.{i}."
        attn_out = mat(d, N_HEAD * HEAD_DIM)
        ffn_down = mat(d, ASSISTANT_FF)
        tensors |= {
            b + "attn_norm.weight": ones(d),
            b + "attn_q.weight": mat(N_HEAD * HEAD_DIM, d),
            b + "attn_output.weight": np.zeros_like(attn_out) if silent else attn_out,
            b + "attn_q_norm.weight": ones(HEAD_DIM),
            b + "post_attention_norm.weight": ones(d),
            b + "layer_output_scale.weight": ones(1),
            b + "ffn_norm.weight": ones(d),
            b + "ffn_gate.weight": mat(ASSISTANT_FF, d),
            b + "ffn_up.weight": mat(ASSISTANT_FF, d),
            b + "ffn_down.weight": np.zeros_like(ffn_down) if silent else ffn_down,
            b + "post_ffw_norm.weight": ones(d),
        }

    def fill(writer: gguf.GGUFWriter) -> None:
        writer.add_embedding_length(d)
        writer.add_embedding_length_out(int(n_embd_target))
        writer.add_block_count(len(ASSISTANT_SWA))
        writer.add_nextn_predict_layers(len(ASSISTANT_SWA))
        writer.add_feed_forward_length(ASSISTANT_FF)
        _attention_keys(writer, ASSISTANT_SWA)

    return _write(out, "gemma4-assistant", fill, tokenizer, tensors)
