"""Tiny Qwen3.5 (``qwen35``) models with an MTP block, for the MTP drafting tests.

llama.cpp's ``test-llama-archs`` writes a random 2-layer qwen35 (one Gated DeltaNet layer, one attention
layer) without MTP layers. :func:`mtp_model` appends the block that llama.cpp's qwen35 MTP graph reads
(``blk.2``: an attention layer plus ``nextn.eh_proj``, ``enorm``, ``hnorm``, ``shared_head_norm`` and
``shared_head_head``), sets ``block_count`` 3 and ``nextn_predict_layers`` 1, and sets the head's weights:

- ``"random"``: random weights; its drafts are almost all rejected.
- ``"token"``: fitted to the target. The random target's greedy next token depends on the current token only
  (measured: one answer per token over random contexts), so the head reads the token's embedding alone (the
  block's attention output and FFN down projection are zero, ``eh_proj`` keeps the token half) and its output
  rows are set, in closed form, to answer the target's next token for the token after: right for 3 tokens in
  4, deliberately wrong for the rest, so that drafts run long and are also rejected.
- ``"hidden"``: the head reads the target's hidden row alone (``eh_proj`` keeps the other half): it answers
  the target's next-but-one token only when the driver hands it the right row of the right position.
"""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
from _arch_models import write_model
from _gguf_build import architecture, grown_header, set_value, tensors_of, write_gguf

from localspec.llama.runtime import Model


def next_token_map(path: Path, n_vocab: int) -> np.ndarray:
    """The target's greedy next token after each token, measured over random contexts (majority)."""
    model = Model(path, n_ctx=256, n_threads=2)
    rng = np.random.default_rng(7)
    votes = np.zeros((n_vocab, n_vocab), dtype=np.int64)
    try:
        for _ in range(4):
            model.reset()
            tokens = [int(t) for t in rng.integers(0, n_vocab, 128)]
            answers = model.decode_logits(tokens, outputs=len(tokens)).argmax(axis=1)
            np.add.at(votes, (np.array(tokens), answers), 1)
    finally:
        model.close()
    seen = votes.sum(axis=1) > 0
    nxt = votes.argmax(axis=1)
    nxt[~seen] = np.arange(n_vocab)[~seen]  # never seen: any answer (the head is simply wrong there)
    return nxt


def rms(a: np.ndarray, eps: float = 1e-5) -> np.ndarray:
    """Rows scaled to a root mean square of 1, as a block's RMS norm does (weights of ones)."""
    return a / np.sqrt((a * a).mean(axis=-1, keepdims=True) + eps)


def mtp_model(folder: Path, kind: str, seed: int = 1, *, base: Path | None = None) -> Path:
    """A qwen35 model written with ``seed`` (or the qwen35 file ``base``, e.g. a widened one:
    ``_arch_models.widen``), with an MTP block whose head is ``kind`` (see the module)."""
    out = folder / (f"{base.stem}-mtp-{kind}.gguf" if base else f"qwen35-mtp-{kind}-seed{seed}.gguf")
    if out.is_file():
        return out
    src = base or write_model(folder, "qwen35", seed)
    reader = gguf.GGUFReader(src)
    tensors = tensors_of(reader)
    emb = tensors["token_embd.weight"]  # (n_vocab, n_embd)
    n_vocab, n_embd = emb.shape
    rng = np.random.default_rng(seed)
    eye, zero = np.eye(n_embd, dtype=np.float32), np.zeros((n_embd, n_embd), dtype=np.float32)
    if kind == "random":
        eh_proj = (rng.standard_normal((n_embd, 2 * n_embd)) / np.sqrt(2 * n_embd)).astype(np.float32)
        head = (rng.standard_normal((n_vocab, n_embd)) * 0.1).astype(np.float32)
    elif kind == "token":
        nxt = next_token_map(src, n_vocab)
        wrong = rng.random(n_vocab) < 0.25
        answer = np.where(wrong, (nxt + 1) % n_vocab, nxt)
        eh_proj = np.concatenate([eye, zero], axis=1)
        feats = rms(rms(emb))  # what the block's output row is for each token
        head = np.zeros((n_vocab, n_embd), dtype=np.float32)
        np.add.at(head, answer, feats / 32.0)
    elif kind == "hidden":
        nxt = next_token_map(src, n_vocab)
        eh_proj = np.concatenate([zero, eye], axis=1)
        out_w = tensors.get("output.weight", emb)  # the target's logits are out_w @ h
        head = np.zeros((n_vocab, n_embd), dtype=np.float32)
        np.add.at(head, nxt, out_w)  # the row for y: every token whose next one is y
    else:
        raise ValueError(kind)
    _write_with_block(reader, tensors, out, eh_proj, head.astype(np.float32))
    return out


def _write_with_block(
    reader: gguf.GGUFReader, tensors: dict[str, np.ndarray], out: Path, eh_proj: np.ndarray, head: np.ndarray
) -> None:
    """The file of ``reader`` with an MTP block after its layers (a copy of its last attention layer)."""
    arch, n_layer = architecture(reader)
    last = max(i for i in range(n_layer) if f"blk.{i}.attn_q.weight" in tensors)
    fields = grown_header(reader, [last])  # the MTP block is an attention layer
    set_value(fields, f"{arch}.nextn_predict_layers", 1)
    here, there = f"blk.{last}.", f"blk.{n_layer}."
    block = {  # the weights of a Qwen3.5 MTP block (the random layer's biases and scales are not among them)
        k.replace(here, there, 1): v
        for k, v in tensors.items()
        if k.startswith(here) and k.endswith(".weight")
    }
    block[f"{there}attn_output.weight"] = np.zeros_like(block[f"{there}attn_output.weight"])
    block[f"{there}ffn_down.weight"] = np.zeros_like(block[f"{there}ffn_down.weight"])
    block |= _nextn_weights(there, eh_proj, head)
    write_gguf(out, arch=arch, fields=fields, tensors={**tensors, **block})


def _nextn_weights(block: str, eh_proj: np.ndarray, head: np.ndarray) -> dict[str, np.ndarray]:
    """An MTP block's own weights (``block``: its ``blk.N.`` prefix): the projection of the concatenated
    embedding and hidden row, its norms (ones) and its output head."""
    ones = np.ones(eh_proj.shape[0], dtype=np.float32)
    nextn = f"{block}nextn."
    return {
        f"{nextn}eh_proj.weight": eh_proj,
        f"{nextn}enorm.weight": ones,
        f"{nextn}hnorm.weight": ones,
        f"{nextn}shared_head_norm.weight": ones,
        f"{nextn}shared_head_head.weight": head,
    }


#: The chained heads' answers: head ``k`` drafts ``(token + CHAIN_SHIFTS[k]) % n_vocab`` after ``token``.
CHAIN_SHIFTS = (1, 5)


def chained_mtp_model(folder: Path, seed: int = 1) -> Path:
    """A mimo2 model (llama.cpp drives its MTP layers as chained heads, one per draft step) with two MTP
    blocks whose heads answer by token alone: head ``k`` maps a token to ``token + CHAIN_SHIFTS[k]``, so a
    draft made with the right head at each step can be told from one made with the first head only.

    Each block reads the token's embedding alone (``eh_proj`` keeps the token half), its attention output
    and FFN down projections are zero (the block's row is the normalised embedding), and its output rows
    answer the shifted token for each token's row.
    """
    out = folder / f"mimo2-chained-mtp-seed{seed}.gguf"
    if out.is_file():
        return out
    src = write_model(folder, "mimo2", seed)
    reader = gguf.GGUFReader(src)
    tensors = tensors_of(reader)
    emb = tensors["token_embd.weight"]
    n_vocab, n_embd = emb.shape
    arch, n_layer = architecture(reader)
    heads = len(CHAIN_SHIFTS)
    fields = grown_header(reader, [n_layer - 1] * heads)  # per-layer settings: the blocks as the last layer
    set_value(fields, f"{arch}.nextn_predict_layers", heads)
    here = f"blk.{n_layer - 1}."
    feats = rms(rms(emb))  # the block's output row for each token
    eye = np.eye(n_embd, dtype=np.float32)
    blocks: dict[str, np.ndarray] = {}
    for k, shift in enumerate(CHAIN_SHIFTS):
        there = f"blk.{n_layer + k}."
        for part in ("attn_norm", "ffn_norm", "ffn_gate", "ffn_up"):
            blocks[f"{there}{part}.weight"] = tensors[f"{here}{part}.weight"]
        qkv = [tensors[f"{here}attn_{p}.weight"] for p in "qkv"]
        blocks[f"{there}attn_qkv.weight"] = np.concatenate(qkv, axis=0)  # MTP blocks read a fused QKV
        blocks[f"{there}attn_output.weight"] = np.zeros_like(tensors[f"{here}attn_output.weight"])
        blocks[f"{there}ffn_down.weight"] = np.zeros_like(tensors[f"{here}ffn_down.weight"])
        head = np.zeros((n_vocab, n_embd), dtype=np.float32)
        head[(np.arange(n_vocab) + shift) % n_vocab] = feats / 32.0
        blocks |= _nextn_weights(there, np.concatenate([eye, np.zeros_like(eye)], axis=1), head)
    return write_gguf(out, arch=arch, fields=fields, tensors={**tensors, **blocks})
