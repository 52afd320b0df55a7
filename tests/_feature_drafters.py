"""Tiny EAGLE-3 (``eagle3``) and DFlash (``dflash``) drafter files for test-llama-archs targets, and
llama.cpp's own speculative loop (``llama-speculative-simple``) to run them.

Both are separate files that read the target's features: llama.cpp extracts the inputs of the target layers
named in ``<arch>.target_layers`` (layer 0's input is the token embedding; ``n_layer`` means the final
hidden row), concatenates them and hands them to the drafter's ``fc`` projection. A random test-llama-archs
target's greedy next token depends (almost) only on the current token (:func:`_mtp_model.next_token_map`
measures the map ``nxt``), so each fitted drafter is written in closed form from ``nxt``, with F32 weights
and the target's "test" vocabulary (ids only; a text prompt is hashed 5 bytes to a token).

:func:`eagle3_drafter` (n_embd 256 as the target, 1 layer, 4 heads of 64): llama.cpp's decoder input at
position ``P`` is ``(token[P+1], g[P])`` (``g = fc(features[P])``); each later draft step feeds the drafted
token with the previous step's pre-norm row. The attention input is ``concat(rms(embd), hidden_norm(g))``,
RoPE is NORM (adjacent pairs).

- ``"random"``: random weights, no own ``token_embd``/``output`` (llama.cpp takes the target's through
  ``ctx_other``); its drafts are almost all rejected.
- ``"token"``: answers the target's next token after the INPUT token, right for 3 tokens in 4 and
  deliberately wrong (answer + 1) for the rest, so that drafts run long and are also rejected.
  ``hidden_norm`` is 0 (``g`` contributes nothing) and ``norm_before_residual`` true (the residual is that
  zero row), V is the token half (``rms(embd)``) and ``attn_output`` the identity, ``ffn_down`` 0. Q and K
  read the token half through a 16-dim code (a distance-4 binary lexicode, +-1: a token's code scores 16
  against itself, at most 8 against any other) placed in the last quarter of each head, which RoPE with
  ``freq_base`` 1e30 leaves unrotated: a position attends only to the positions holding its own token, whose
  V is its own, so the attention output is the input token's normalised embedding. The own ``output`` rows
  are solved exactly (least norm) so that every token's row gives the answer a logit :data:`LOGIT` above
  zero and every other token zero.
- ``"hidden"``: reads the target features only: ``target_layers`` starts with layer 0 (the token
  embedding), ``fc`` keeps that block, ``attn_output`` and ``ffn_down`` are 0 and ``norm_before_residual``
  false (the row is ``g`` itself), and the output rows answer ``nxt(nxt(t))`` for the token ``t`` whose
  features they read: the first draft token is right only when the driver pairs the row of position ``P``
  with the token at ``P + 1`` (each later step reads the same row again: chance level).

:func:`dflash_drafter`: DFlash drafts a whole block in ONE non-causal pass over ``[id_last, MASK x
(block_size-1)]`` at positions ``pos0..`` that attends to the draft KV cache (the target features, injected
at the earlier positions through ``fc``, ``enc.output_norm``, ``attn_k``/``attn_v``) and to the block itself;
block index ``i`` answers the token ``i`` places after ``id_last``. NEOX RoPE.

- ``"random"``: random weights, no own ``token_embd``/``output``.
- ``"fitted"``: block index ``i`` answers ``nxt^i(id_last)``, deliberately wrong (answer + 1) for ~15% of the
  (token, i) pairs. One layer, n_embd 256 as the target, ``block_size - 1`` heads of :data:`DFLASH_HEAD`:

  * own ``token_embd``: a one-hot token channel ``T`` (128), a bias channel ``B`` on every token and a flag
    ``F`` on every token but the mask token (``tokenizer.ggml.mask_token_id``: a token the target's greedy
    map never answers), whose row is ``B`` only; own ``output`` reads ``T``;
  * ``enc.output_norm`` is 0: the injected cache K and V are 0 (score 0, value 0);
  * head ``h`` attends from position ``p`` to ``p - h`` only: Q and K come from ``B`` (the same for every
    block position), in the first :data:`ROPE_PAIRS` rope pairs with q turned by ``-h * theta`` against k,
    plus an unrotated dimension (``rope.dimension_count`` below the head size) holding a negative constant:
    the score is ``c + sum cos((dp - h) theta)`` scaled, :data:`SCORE_MARGIN` or more at ``dp = h`` and
    -:data:`SCORE_MARGIN` or less at every other offset in ``[-2 block, 2 block]`` (cache: 0);
    :func:`_dflash_attention` checks it numerically;
  * V copies ``T`` and ``F``; ``attn_output`` writes ``T`` back to ``T`` (only the anchor has a token, so only
    the head that reaches it writes one) and head ``h``'s ``F`` to its own offset channel ``G_h``;
  * a SwiGLU FFN with one unit per (token t, offset i), on when ``T_t`` and ``G_i`` both are (``B`` is the
    bias), writing a large one-hot of the answer into ``T``.
"""

from __future__ import annotations

import functools
import re
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import gguf
import numpy as np
import pytest
from _gguf_build import Field, architecture, header_fields, tensors_of, write_gguf

#: The logit the fitted heads give their answer (every other token: about 0).
LOGIT = 12.0
#: EAGLE-3 drafters' shape: heads, head size, FFN width; the "token" kind's code length (a quarter head).
EAGLE3_HEADS, EAGLE3_HEAD, EAGLE3_FF, CODE_BITS = 4, 64, 256, 16
#: The "token" EAGLE-3 drafter's RoPE base: the last quarter of each head (its codes) does not turn.
EAGLE3_TOKEN_ROPE_BASE = 1e30
#: The target layers the EAGLE-3 drafters read (layer 0's input: the token embedding).
EAGLE3_LAYERS = (0, 1, 1)
#: DFlash drafters: target layers read, rope pairs used for position, head size (the 128 token channels
#: and the flag fit in V), RoPE base of the position pairs, the fitted head's least score margin.
DFLASH_LAYERS = (0, 1)
ROPE_PAIRS, DFLASH_HEAD, DFLASH_ROPE_BASE, SCORE_MARGIN = 16, 136, 2.0, 30.0
#: Share of the fitted DFlash drafter's (token, offset) answers that are deliberately wrong.
DFLASH_WRONG = 0.15


class _Target(NamedTuple):
    """What a drafter needs of its target: the header keys of its vocabulary, its token embeddings (its
    vocabulary size and width), its layer count and its RMS epsilon."""

    tokenizer: dict[str, Field]
    emb: np.ndarray
    n_layer: int
    eps: float

    @property
    def n_vocab(self) -> int:
        return int(self.emb.shape[0])

    @property
    def n_embd(self) -> int:
        return int(self.emb.shape[1])


def _target(path: Path) -> _Target:
    reader = gguf.GGUFReader(path)
    arch, n_layer = architecture(reader)
    emb = tensors_of(reader)["token_embd.weight"]
    eps = float(reader.fields[f"{arch}.attention.layer_norm_rms_epsilon"].contents())
    return _Target(header_fields(reader, "tokenizer.ggml."), emb, n_layer, eps)


@functools.lru_cache(maxsize=8)
def next_tokens(target: Path) -> np.ndarray:
    """The target's greedy next token after each token (:func:`_mtp_model.next_token_map`), measured once
    per target file in a session."""
    from _mtp_model import next_token_map

    return next_token_map(target, _target(target).n_vocab)


def _rms(a: np.ndarray, eps: float) -> np.ndarray:
    """Rows scaled to a root mean square of 1, as llama.cpp's RMS norm (weights of ones)."""
    return a / np.sqrt((a * a).mean(axis=-1, keepdims=True) + eps)


def _exact_head(feats: np.ndarray, answer: np.ndarray) -> np.ndarray:
    """Output rows (n_vocab, width) that give each row of ``feats`` (one per token) the logit :data:`LOGIT`
    for its ``answer`` and 0 for every other token: the least-norm solution (the rows are independent)."""
    n_vocab = len(answer)
    wanted = np.zeros((n_vocab, n_vocab))
    wanted[np.arange(n_vocab), answer] = LOGIT  # wanted[t] = the logits of row t
    head = wanted.T @ np.linalg.pinv(feats.astype(np.float64)).T
    return head.astype(np.float32)


def cycle_tokens(nxt: np.ndarray) -> np.ndarray:
    """Whether each token lies on a cycle of the map ``nxt`` (where greedy generation settles)."""
    on = np.zeros(len(nxt), dtype=bool)
    for t in range(len(nxt)):
        seen: list[int] = []
        while t not in seen:
            seen.append(t)
            t = int(nxt[t])
        on[seen[seen.index(t) :]] = True
    return on


def _wrong(rng: np.random.Generator, nxt: np.ndarray, share: float, columns: int = 1) -> np.ndarray:
    """Which of the (token, column) answers of a fitted drafter are deliberately wrong: ``share`` of them, at
    random among the tokens off the cycles of ``nxt``. Greedy generation settles on a cycle, where drafts
    then run long; the wrong answers reject drafts on the way there (the prompt's continuation, the
    target's context-dependent deviations)."""
    off = np.repeat(~cycle_tokens(nxt), columns)
    picked = rng.permutation(np.flatnonzero(off))[: round(share * len(off))]
    wrong = np.zeros(len(off), dtype=bool)
    wrong[picked] = True
    return wrong.reshape(len(nxt), columns)


def _write(
    out: Path, arch: str, keys: Callable[[gguf.GGUFWriter], None], target: _Target, tensors: dict
) -> Path:
    """Write ``out``, F32, with the target's vocabulary: ``keys(writer)`` adds the architecture's keys."""
    f32 = {name: np.asarray(array, dtype=np.float32) for name, array in tensors.items()}
    return write_gguf(
        out,
        arch=arch,
        name=out.stem,
        file_type=gguf.LlamaFileType.ALL_F32,
        extra=keys,
        fields=target.tokenizer,
        tensors=f32,
    )


def _shape_keys(
    w: gguf.GGUFWriter, target: _Target, *, n_ff: int, heads: int, head: int, rope: tuple[int, float]
) -> None:
    """The keys every drafter has: one layer of ``heads`` heads of ``head``, RoPE ``(dimensions, base)``."""
    w.add_context_length(512)
    w.add_embedding_length(target.n_embd)
    w.add_block_count(1)
    w.add_feed_forward_length(n_ff)
    w.add_head_count(heads)
    w.add_head_count_kv(heads)
    w.add_key_length(head)
    w.add_value_length(head)
    w.add_layer_norm_rms_eps(target.eps)
    w.add_rope_dimension_count(rope[0])
    w.add_rope_freq_base(rope[1])


def lexicode(n: int, bits: int = CODE_BITS, distance: int = 4) -> np.ndarray:
    """``n`` +-1 codes of ``bits`` whose Hamming distances are all ``distance`` or more (the greedy
    lexicode: for 16 bits and distance 4, the extended Hamming code): self score ``bits``, cross score at
    most ``bits - 2 * distance``."""
    words: list[int] = []
    for word in range(1 << bits):
        if all(bin(word ^ other).count("1") >= distance for other in words):
            words.append(word)
            if len(words) == n:
                break
    if len(words) < n:
        raise ValueError(f"no {n} codes of {bits} bits at distance {distance}")
    table = (np.array(words)[:, None] >> np.arange(bits)) & 1
    return (2.0 * table - 1.0).astype(np.float32)


def eagle3_drafter(folder: Path, target: Path, kind: str, seed: int = 1) -> Path:
    """An EAGLE-3 drafter for ``target`` (a test-llama-archs model) whose weights are ``kind`` (``"random"``,
    ``"token"`` or ``"hidden"``, see the module), kept in ``folder`` and reused."""
    out = folder / f"{target.stem}-eagle3-{kind}-seed{seed}.gguf"
    if out.is_file():
        return out
    tgt = _target(target)
    if max(EAGLE3_LAYERS) >= tgt.n_layer:
        raise ValueError(f"{target}: {tgt.n_layer} layers, the drafter reads {EAGLE3_LAYERS}")
    rng = np.random.default_rng(seed + 3000)
    builders = {"random": _eagle3_random, "token": _eagle3_token, "hidden": _eagle3_hidden}
    if kind not in builders:
        raise ValueError(f"unknown EAGLE-3 drafter kind {kind!r}")
    tensors, freq_base, norm_before_residual = builders[kind](tgt, target, rng)

    def keys(w: gguf.GGUFWriter) -> None:
        rope = (EAGLE3_HEAD, freq_base)
        _shape_keys(w, tgt, n_ff=EAGLE3_FF, heads=EAGLE3_HEADS, head=EAGLE3_HEAD, rope=rope)
        w.add_array("eagle3.target_layers", list(EAGLE3_LAYERS))
        w.add_uint32("eagle3.target_hidden_size", tgt.n_embd)
        w.add_bool("eagle3.norm_before_residual", norm_before_residual)

    return _write(out, "eagle3", keys, tgt, tensors)


def _mat(rng: np.random.Generator, n_out: int, n_in: int) -> np.ndarray:
    return (rng.standard_normal((n_out, n_in)) / np.sqrt(n_in)).astype(np.float32)


def _eagle3_layer(tgt: _Target, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """A random EAGLE-3 drafter's tensors (no own token embeddings or output matrix)."""
    d, width = tgt.n_embd, EAGLE3_HEADS * EAGLE3_HEAD
    ones = np.ones(d, dtype=np.float32)
    return {
        "fc.weight": _mat(rng, d, len(EAGLE3_LAYERS) * tgt.n_embd),
        "output_norm.weight": ones,
        "blk.0.attn_norm.weight": ones,
        "blk.0.attn_norm_2.weight": ones,
        "blk.0.attn_q.weight": _mat(rng, width, 2 * d),
        "blk.0.attn_k.weight": _mat(rng, width, 2 * d),
        "blk.0.attn_v.weight": _mat(rng, width, 2 * d),
        "blk.0.attn_output.weight": _mat(rng, d, width),
        "blk.0.ffn_norm.weight": ones,
        "blk.0.ffn_gate.weight": _mat(rng, EAGLE3_FF, d),
        "blk.0.ffn_up.weight": _mat(rng, EAGLE3_FF, d),
        "blk.0.ffn_down.weight": _mat(rng, d, EAGLE3_FF),
    }


def _eagle3_random(tgt: _Target, _path: Path, rng: np.random.Generator) -> tuple[dict, float, bool]:
    return _eagle3_layer(tgt, rng), 10000.0, False


def _eagle3_token(tgt: _Target, path: Path, rng: np.random.Generator) -> tuple[dict, float, bool]:
    """The "token" drafter: attention that copies the input token's normalised embedding (see the module),
    output rows that answer the target's next token after it (a quarter deliberately wrong)."""
    tensors = _eagle3_layer(tgt, rng)
    d, n_vocab = tgt.n_embd, tgt.n_vocab
    nxt = next_tokens(path)
    answer = np.where(_wrong(rng, nxt, 0.25)[:, 0], (nxt + 1) % n_vocab, nxt)
    embd = _rms(tgt.emb, tgt.eps)  # the token half of the attention input, for each token
    codes = lexicode(n_vocab)
    proj = codes.T @ np.linalg.pinv(embd.T)  # (CODE_BITS, d): proj @ embd[t] = codes[t]
    # score = (s * code_t) . (s * code_u) / sqrt(head): 16 s^2/8 against itself, 8 s^2/8 or less otherwise
    scale = np.sqrt(64.0 * np.sqrt(EAGLE3_HEAD) / (CODE_BITS - 8))  # self - other >= 64
    qk = np.zeros((EAGLE3_HEADS * EAGLE3_HEAD, 2 * d), dtype=np.float32)
    for h in range(EAGLE3_HEADS):
        last = (h + 1) * EAGLE3_HEAD - CODE_BITS  # the head's last quarter: pairs RoPE leaves unturned
        qk[last : last + CODE_BITS, :d] = proj * scale
    _check_codes(qk[:, :d], embd, freq_base=EAGLE3_TOKEN_ROPE_BASE)
    eye = np.eye(d, dtype=np.float32)
    tensors |= {
        "blk.0.attn_norm_2.weight": np.zeros(d, dtype=np.float32),  # g contributes nothing
        "blk.0.attn_q.weight": qk,
        "blk.0.attn_k.weight": qk,
        "blk.0.attn_v.weight": np.concatenate([eye, np.zeros_like(eye)], axis=1),
        "blk.0.attn_output.weight": eye,
        "blk.0.ffn_down.weight": np.zeros((d, EAGLE3_FF), dtype=np.float32),
        # the row reaching the output: rms(embd) through output_norm
        "output.weight": _exact_head(_rms(embd, tgt.eps), answer),
    }
    return tensors, EAGLE3_TOKEN_ROPE_BASE, True


def _check_codes(qk: np.ndarray, embd: np.ndarray, freq_base: float) -> None:
    """The "token" drafter's scores, as llama.cpp computes them from each token's normalised embedding
    (``embd``) through the Q/K rows ``qk`` (both the same) in every head: 64 or more above any other token's
    (each position is turned by at most 512 * its pairs' rotation, which ``freq_base`` makes negligible)."""
    hd = EAGLE3_HEAD
    turn = 512 * freq_base ** (-2 * ((hd - CODE_BITS) // 2) / hd)  # NORM: pair i turns by base^(-2i/hd)
    for h in range(EAGLE3_HEADS):
        x = embd @ qk[h * hd : (h + 1) * hd].T  # (n_vocab, hd)
        scores = x @ x.T / np.sqrt(hd)
        margin = np.diag(scores) - np.where(np.eye(len(x), dtype=bool), -np.inf, scores).max(axis=1)
        if margin.min() < 63.0 or turn > 1e-6:
            raise AssertionError(f"head {h}: score margin {margin.min()}, turn {turn}")


def _eagle3_hidden(tgt: _Target, path: Path, rng: np.random.Generator) -> tuple[dict, float, bool]:
    """The "hidden" drafter: the row is ``g`` = the token embedding of the feature's position; the output
    rows answer the target's next-but-one token after that token."""
    tensors = _eagle3_layer(tgt, rng)
    d = tgt.n_embd
    nxt = next_tokens(path)
    fc = np.zeros((d, len(EAGLE3_LAYERS) * tgt.n_embd), dtype=np.float32)
    fc[:, : tgt.n_embd] = np.eye(d, tgt.n_embd)  # EAGLE3_LAYERS[0] == 0: the token embedding
    tensors |= {
        "fc.weight": fc,
        "blk.0.attn_output.weight": np.zeros((d, EAGLE3_HEADS * EAGLE3_HEAD), dtype=np.float32),
        "blk.0.ffn_down.weight": np.zeros((d, EAGLE3_FF), dtype=np.float32),
        "output.weight": _exact_head(_rms(tgt.emb, tgt.eps), nxt[nxt]),
    }
    return tensors, 10000.0, False


def dflash_drafter(folder: Path, target: Path, kind: str, seed: int = 1, block_size: int = 8) -> Path:
    """A DFlash drafter for ``target`` (a test-llama-archs model) whose weights are ``kind`` (``"random"`` or
    ``"fitted"``, see the module) and whose blocks hold ``block_size`` positions (the anchor, then
    ``block_size - 1`` masks: at most that many draft tokens), kept in ``folder`` and reused."""
    out = folder / f"{target.stem}-dflash-{kind}-b{block_size}-seed{seed}.gguf"
    if out.is_file():
        return out
    tgt = _target(target)
    if max(DFLASH_LAYERS) >= tgt.n_layer:
        raise ValueError(f"{target}: {tgt.n_layer} layers, the drafter reads {DFLASH_LAYERS}")
    rng = np.random.default_rng(seed + 4000)
    nxt = next_tokens(target)
    unanswered = sorted(set(range(tgt.n_vocab)) - set(nxt.tolist()))
    mask = unanswered[-1] if unanswered else tgt.n_vocab - 1  # a token the target's greedy map never gives
    if kind == "random":
        tensors, heads, head, n_ff = _dflash_random(tgt, rng), 4, 64, 512
        rope = (64, 10000.0)
    elif kind == "fitted":
        tensors, heads, head, n_ff = _dflash_fitted(tgt, nxt, mask, block_size, rng)
        rope = (2 * ROPE_PAIRS, DFLASH_ROPE_BASE)
    else:
        raise ValueError(f"unknown DFlash drafter kind {kind!r}")

    def keys(w: gguf.GGUFWriter) -> None:
        _shape_keys(w, tgt, n_ff=n_ff, heads=heads, head=head, rope=rope)
        w.add_array("dflash.target_layers", list(DFLASH_LAYERS))
        w.add_uint32("dflash.block_size", block_size)
        w.add_mask_token_id(mask)

    return _write(out, "dflash", keys, tgt, tensors)


def _dflash_random(tgt: _Target, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """A random DFlash drafter's tensors (4 heads of 64, FFN 512; no own token embeddings or output)."""
    d, width, n_ff = tgt.n_embd, 4 * 64, 512
    ones = np.ones(d, dtype=np.float32)
    return {
        "fc.weight": _mat(rng, d, len(DFLASH_LAYERS) * tgt.n_embd),
        "enc.output_norm.weight": ones,
        "output_norm.weight": ones,
        "blk.0.attn_norm.weight": ones,
        "blk.0.attn_q.weight": _mat(rng, width, d),
        "blk.0.attn_k.weight": _mat(rng, width, d),
        "blk.0.attn_v.weight": _mat(rng, width, d),
        "blk.0.attn_output.weight": _mat(rng, d, width),
        "blk.0.attn_q_norm.weight": np.ones(64, dtype=np.float32),
        "blk.0.attn_k_norm.weight": np.ones(64, dtype=np.float32),
        "blk.0.ffn_norm.weight": ones,
        "blk.0.ffn_gate.weight": _mat(rng, n_ff, d),
        "blk.0.ffn_up.weight": _mat(rng, n_ff, d),
        "blk.0.ffn_down.weight": _mat(rng, d, n_ff),
    }


class _Channels(NamedTuple):
    """The fitted DFlash drafter's residual channels: tokens ``0..n_vocab-1`` (T), then the bias B, the flag
    F and the offset channels G_1.. (``g(i)``)."""

    n_vocab: int

    @property
    def bias(self) -> int:
        return self.n_vocab

    @property
    def flag(self) -> int:
        return self.n_vocab + 1

    def g(self, i: int) -> int:
        return self.n_vocab + 1 + i


def _dflash_fitted(
    tgt: _Target, nxt: np.ndarray, mask: int, block_size: int, rng: np.random.Generator
) -> tuple[dict[str, np.ndarray], int, int, int]:
    """The fitted DFlash drafter's tensors, its head count, head size and FFN width (see the module)."""
    d, n_vocab, heads = tgt.n_embd, tgt.n_vocab, block_size - 1
    ch = _Channels(n_vocab)
    if ch.g(heads) >= d or n_vocab + 1 >= DFLASH_HEAD:
        raise ValueError(f"a block of {block_size} does not fit n_embd {d} with {n_vocab} tokens")
    embd = np.zeros((n_vocab, d), dtype=np.float32)
    embd[np.arange(n_vocab), np.arange(n_vocab)] = 1.0
    embd[:, ch.bias] = 1.0
    embd[:, ch.flag] = 1.0
    embd[mask] = 0.0
    embd[mask, ch.bias] = 1.0
    # each block position's answer for the anchor t at offset i: nxt^i(t), some deliberately wrong
    answer = np.zeros((n_vocab, heads), dtype=np.int64)
    step = np.arange(n_vocab)
    for i in range(heads):
        step = nxt[step]
        answer[:, i] = step
    wrong = _wrong(rng, nxt, DFLASH_WRONG, heads)
    answer = np.where(wrong, (answer + 1) % n_vocab, answer)
    output = np.zeros((n_vocab, d), dtype=np.float32)
    output[np.arange(n_vocab), np.arange(n_vocab)] = 1.0  # logits: the T channels (after output_norm)
    ones = np.ones(d, dtype=np.float32)
    tensors = {
        "token_embd.weight": embd,
        "output.weight": output,
        "fc.weight": np.zeros((d, len(DFLASH_LAYERS) * tgt.n_embd), dtype=np.float32),
        "enc.output_norm.weight": np.zeros(d, dtype=np.float32),  # injected K and V: 0
        "output_norm.weight": ones,
        "blk.0.attn_norm.weight": ones,
        "blk.0.ffn_norm.weight": ones,
        **_dflash_attention(ch, d, heads),
        **_dflash_ffn(ch, d, answer),
    }
    return tensors, heads, DFLASH_HEAD, int(answer.size)


def _theta() -> np.ndarray:
    """The rotation per position of the fitted DFlash drafter's rope pairs (NEOX: pair ``i`` is dims ``i``
    and ``i + ROPE_PAIRS``, turned by ``pos * base^(-i / ROPE_PAIRS)``)."""
    return DFLASH_ROPE_BASE ** (-np.arange(ROPE_PAIRS) / ROPE_PAIRS)


def _dflash_attention(ch: _Channels, d: int, heads: int) -> dict[str, np.ndarray]:
    """Head ``h`` (``1..heads``) attends from each block position to the one ``h`` before it and copies its
    token and flag (see the module); the scores are checked numerically (:func:`_check_scores`)."""
    hd, theta, unrotated = DFLASH_HEAD, _theta(), 2 * ROPE_PAIRS
    span = np.arange(-2 * (heads + 1), 2 * (heads + 1) + 1)
    sums = np.cos(np.outer(span, theta)).sum(axis=1)  # sum_i cos(d theta_i) per offset d
    peak, side = ROPE_PAIRS, sums[span != 0].max()
    # after the q/k norms a head's vector u (17 ones-sized entries) is u * sqrt(hd / 17), times the norm
    # weights; the score is that dot product / sqrt(hd): s * (w^2 sum cos - wc^2)
    s = np.sqrt(hd) / (ROPE_PAIRS + 1)
    w2 = 2 * SCORE_MARGIN / (s * (peak - side))  # (peak - side) / 2 above and below the midpoint
    wc2 = w2 * (peak + side) / 2  # the constant: the midpoint down to 0
    qk_norm = np.zeros(hd, dtype=np.float32)
    qk_norm[:unrotated] = np.sqrt(w2)
    qk_norm[unrotated] = np.sqrt(wc2)
    wq = np.zeros((heads * hd, d), dtype=np.float32)
    wk = np.zeros_like(wq)
    wv = np.zeros_like(wq)
    wo = np.zeros((d, heads * hd), dtype=np.float32)
    gain = np.sqrt(3.0) / 16.0  # the anchor's normalised channels (3 of them: T, B, F) back to 1
    for h in range(1, heads + 1):
        row = (h - 1) * hd
        wk[row : row + ROPE_PAIRS, ch.bias] = 1.0
        wk[row + unrotated, ch.bias] = 1.0
        wq[row : row + ROPE_PAIRS, ch.bias] = np.cos(h * theta)  # q turned by -h theta against k
        wq[row + ROPE_PAIRS : row + unrotated, ch.bias] = -np.sin(h * theta)
        wq[row + unrotated, ch.bias] = -1.0
        tokens = np.arange(ch.n_vocab)
        wv[row + tokens, tokens] = 1.0
        wv[row + ch.n_vocab, ch.flag] = 1.0
        wo[tokens, row + tokens] = gain
        wo[ch.g(h), row + ch.n_vocab] = gain
    tensors = {
        "blk.0.attn_q.weight": wq,
        "blk.0.attn_k.weight": wk,
        "blk.0.attn_v.weight": wv,
        "blk.0.attn_output.weight": wo,
        "blk.0.attn_q_norm.weight": qk_norm,
        "blk.0.attn_k_norm.weight": qk_norm.copy(),
    }
    _check_scores(tensors, ch, heads, span)
    return tensors


def _rope_neox(x: np.ndarray, pos: int) -> np.ndarray:
    """llama.cpp's NEOX RoPE of one head vector at ``pos`` (dims past ``2 * ROPE_PAIRS`` unrotated)."""
    angle = pos * _theta()
    a, b = x[:ROPE_PAIRS], x[ROPE_PAIRS : 2 * ROPE_PAIRS]
    out = x.copy()
    out[:ROPE_PAIRS] = a * np.cos(angle) - b * np.sin(angle)
    out[ROPE_PAIRS : 2 * ROPE_PAIRS] = a * np.sin(angle) + b * np.cos(angle)
    return out


def _check_scores(tensors: dict[str, np.ndarray], ch: _Channels, heads: int, span: np.ndarray) -> None:
    """Each head's score, as llama.cpp computes it for two block positions ``dp`` apart (anchor or mask
    rows, any position up to 512): :data:`SCORE_MARGIN` or more at ``dp = h``, -:data:`SCORE_MARGIN` or
    less at every other ``dp`` in ``span`` (an injected cache position scores 0)."""
    hd = DFLASH_HEAD
    anchor, blank = np.zeros(ch.n_vocab + 2), np.zeros(ch.n_vocab + 2)
    anchor[[0, ch.bias, ch.flag]] = 16.0 / np.sqrt(3.0)  # attn_norm's output rows
    blank[ch.bias] = 16.0

    def head(name: str, row: np.ndarray, h: int) -> np.ndarray:
        x = tensors[f"blk.0.attn_{name}.weight"][(h - 1) * hd : h * hd, : len(row)] @ row
        return _rms(x, 1e-5) * tensors[f"blk.0.attn_{name}_norm.weight"]

    for h in range(1, heads + 1):
        for q_row in (anchor, blank):
            for k_row in (anchor, blank):
                for base in (span.max(), 500):
                    q = head("q", q_row, h)
                    scores = np.array(
                        [_rope_neox(q, base) @ _rope_neox(head("k", k_row, h), base - dp) for dp in span]
                    ) / np.sqrt(hd)
                    hit = scores[span == h][0]
                    others = scores[span != h]
                    if hit < SCORE_MARGIN * 0.99 or others.max() > -SCORE_MARGIN * 0.99:
                        raise AssertionError(f"head {h}: score {hit} at {h}, up to {others.max()} elsewhere")


def _dflash_ffn(ch: _Channels, d: int, answer: np.ndarray) -> dict[str, np.ndarray]:
    """One SwiGLU unit per (token t, offset i), on when the position holds T_t and G_i (B the bias): it
    writes a one-hot of ``answer[t, i - 1]`` 8 times the other channels into the T channels."""
    n_vocab, heads = answer.shape
    v0 = 16.0 / np.sqrt(3.0)  # ffn_norm's output for the 3 channels a mask position holds (B, T_t, G_i)
    k = 40.0  # gate: +k/2 when both are on, -k/2 or less otherwise (silu: 20 against -4e-8)
    gate = np.zeros((n_vocab * heads, d), dtype=np.float32)
    up = np.zeros_like(gate)
    down = np.zeros((d, n_vocab * heads), dtype=np.float32)
    unit = np.arange(n_vocab * heads).reshape(n_vocab, heads)
    for i in range(1, heads + 1):
        units = unit[:, i - 1]
        gate[units, np.arange(n_vocab)] = k / v0
        gate[units, ch.g(i)] = k / v0
        gate[units, ch.bias] = -1.5 * k / v0
        up[units, ch.bias] = 1.0 / v0
        down[answer[:, i - 1], units] = 8.0 / (k / 2)
    return {"blk.0.ffn_gate.weight": gate, "blk.0.ffn_up.weight": up, "blk.0.ffn_down.weight": down}


def speculative_program() -> Path:
    """The built ``llama-speculative-simple`` (skips the test when it cannot be built here)."""
    from _peer_cache import peer_build_cache

    from localspec.errors import BuildError
    from localspec.llama import programs

    try:
        with peer_build_cache():
            return programs.speculative_simple_binary()
    except BuildError as exc:
        pytest.skip(f"llama.cpp's llama-speculative-simple could not be built: {exc.message}")


class SpecRun(NamedTuple):
    """What one ``llama-speculative-simple`` run logs: tokens drafted and accepted, the text it printed (the
    prompt's pieces, then the generated ones: the "test" vocabulary writes a token as its id in hex, without
    separators) and the tokens generated (a round generates its accepted tokens plus the target's own)."""

    drafted: int
    accepted: int
    text: str
    predicted: int

    @property
    def rate(self) -> float:
        """Accepted tokens per drafted token."""
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def mean_run(self) -> float:
        """Accepted draft tokens per verification round."""
        rounds = self.predicted - self.accepted
        return self.accepted / rounds if rounds else 0.0


#: A prompt for the "test" vocabulary (5 bytes hash to one token id): 8 tokens, whose greedy continuation
#: by either target settles on a cycle of its next-token map after a few tokens.
PROMPT = "Once upon a time there was a tiny model"


def llama_cpp_run(
    target: Path, draft: Path, spec_type: str, prompt: str = PROMPT, n_predict: int = 64, draft_max: int = 4
) -> SpecRun:
    """Run llama.cpp's ``llama-speculative-simple`` greedily (``--temp 0``) on ``target`` with the drafter
    ``draft`` (``spec_type``: ``"draft-eagle3"`` or ``"draft-dflash"``), drafting up to ``draft_max`` tokens a
    round, with 2 threads and a 256-token context; its counts parsed from its log.

    llama.cpp logs through a worker thread that can drop lines at exit (most often on a busy machine): a run
    whose counts are missing runs again (the run is deterministic), up to 8 times.

    Raises:
        AssertionError: the program failed, or logged no counts 8 times (its log's end in the message).
    """
    cmd = [
        str(speculative_program()),
        *("-m", str(target), "-md", str(draft), "--spec-type", spec_type),
        *("--spec-draft-n-max", str(draft_max), "--temp", "0", "-n", str(n_predict), "-p", prompt),
        *("-c", "256", "-t", "2", "-td", "2", "-fit", "off"),
    ]
    for _ in range(8):
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        log = res.stdout + res.stderr
        found = [re.search(rf"\b{key}\s*=\s*(\d+)", log) for key in ("n_drafted", "n_accept", "n_predict")]
        if res.returncode != 0:
            break
        if all(found):
            drafted, accepted, predicted = (int(m.group(1)) for m in found if m)
            return SpecRun(drafted, accepted, res.stdout.strip(), predicted)
    raise AssertionError(f"{' '.join(cmd)} (exit {res.returncode}):\n{log[-3000:]}")
