"""Drafting with EAGLE-3 and DFlash files: small drafters that read the target's own hidden rows.

Both are files of their own (``general.architecture`` ``eagle3`` or ``dflash``) that llama.cpp runs in a
context linked to the target's (``ctx_other``: they may use the target's token embeddings and output head).
After every target pass the target hands them the INPUT rows of a few of its layers (the file's
``extract_layers`` / ``target_layers``; llama.cpp's ``llama_set_embeddings_layer_inp``), as
``common/speculative.cpp`` does for ``draft-eagle3`` and ``draft-dflash``:

- **EAGLE-3** (:class:`Eagle3Head`): an encoder (``fc``) fuses the three layers' rows of each position ``P``
  into one row ``g[P]``; the one-layer decoder's input at position ``P`` is the pair ``(token[P+1], g[P])``,
  and it answers the token at ``P+2``. Following the target, every pass's pairs go into the drafter's own KV
  cache (the last position waits for its next token: the pair at the pending token's position is made by the
  draft). A draft is autoregressive: step 0 feeds the pending token with ``g`` of the position before it,
  step ``i`` the token drafted at step ``i - 1`` with the hidden row that step produced (its pre-norm row).
- **DFlash** (:class:`DFlashHead`): the target's rows of every position are projected into the drafter's
  KV cache (the "injection" pass); a draft is ONE non-causal pass over a block ``[pending, MASK x n]`` at
  the positions after the target's, whose outputs at the mask positions are the drafted tokens: ``n`` tokens
  (at most the file's ``dflash.block_size - 1``) for the cost of one drafter pass.

Both keep the :class:`localspec.llama.mtp.MtpHead` interface (``follow``, ``set_following``, ``draft``,
``valid``), so one drafter and one loop serve MTP layers, MTP assistants, EAGLE-3 and DFlash.
"""

from __future__ import annotations

import ctypes
import time
from typing import Any

import llama_cpp
import numpy as np

from localspec.errors import LocalspecError
from localspec.llama import head_calls
from localspec.llama.mtp import ROWS_KEPT, MtpDraft

_HINT = "check the pair (`localspec pair TARGET DRAFTER`), or draft with a small model of the target's family"


class FeatureHead:
    """What EAGLE-3 and DFlash share: the drafter's model and context (linked to the target's), the target's
    layer rows switched on, and the bookkeeping of the target positions followed.

    Args:
        model: the drafter's loaded ``llama_model`` (freed with the head).
        target_ctx: the target's ``llama_context``.
        n_ctx: the target's context (the drafter's cache holds as many positions).
        n_batch: the target's batch (a followed pass is at most this wide).
        n_threads: CPU threads.

    Raises:
        LocalspecError: llama.cpp could not make the context, or the drafter reads layers the target lacks.
    """

    shared = False  # it keeps a KV cache of its own, which follows the target's passes
    block = False  # one pass per drafted token (True: one pass drafts the whole block)
    kind = ""

    def __init__(self, model: Any, target_ctx: Any, *, n_ctx: int, n_batch: int, n_threads: int) -> None:
        self._batch: Any = None
        self.ctx: Any = None
        self.owned_model = model
        self.target_ctx = target_ctx
        target_model = llama_cpp.llama_get_model(target_ctx)
        self.n_layers = int(llama_cpp.llama_model_n_layer(model))
        self.n_embd = int(llama_cpp.llama_model_n_embd(model))
        self.n_embd_target = int(llama_cpp.llama_model_n_embd(target_model))
        self.n_vocab = int(llama_cpp.llama_vocab_n_tokens(llama_cpp.llama_model_get_vocab(target_model)))
        self.layer_ids = head_calls.target_layer_ids(model)
        self._check_layers(int(llama_cpp.llama_model_n_layer(target_model)))
        params = llama_cpp.llama_context_default_params()
        params.n_ctx, params.n_batch, params.n_ubatch = n_ctx, n_batch, n_batch
        params.n_threads = params.n_threads_batch = n_threads
        params.ctx_other = target_ctx
        params.n_rs_seq = 0
        self.ctx = llama_cpp.llama_init_from_model(model, params)
        if not self.ctx:
            self.close()
            raise LocalspecError(f"llama.cpp could not make the {self.kind} drafter's context", hint=_HINT)
        self.memory = llama_cpp.llama_get_memory(self.ctx)
        self._batch = llama_cpp.llama_batch_ext_init(self.ctx)
        self._pos = (llama_cpp.llama_pos * 4)()
        self.n_target_layers = int(llama_cpp.llama_model_n_layer(target_model))
        self.following = False
        self.set_following(True)
        self.follow_passes = 0
        #: target positions ``[0, valid)`` this head has followed, in order
        self.valid = 0

    def _check_layers(self, n_layer: int) -> None:
        bad = [i for i in self.layer_ids if not 0 <= i < n_layer]
        if not self.layer_ids or bad:
            self.close()
            raise LocalspecError(
                f"this {self.kind} drafter reads target layers {self.layer_ids}, and the target has "
                f"{n_layer}",
                hint="use the drafter published with this target model",
            )

    def set_following(self, on: bool) -> None:
        """Whether the target keeps the rows this head reads (off: its passes cost nothing more, and the
        positions they write are no longer followed here; see :attr:`valid`)."""
        if on != self.following:
            self.following = on
            for layer in self.layer_ids:
                head_calls.set_layer_rows(self.target_ctx, layer, on)

    def features(self, n: int) -> np.ndarray:
        """The target's last pass, ``n`` rows: each the chosen layers' input rows side by side."""
        out = np.empty((n, len(self.layer_ids) * self.n_embd_target), dtype=np.float32)
        width = self.n_embd_target
        for k, layer in enumerate(self.layer_ids):
            ptr = head_calls.layer_rows(self.target_ctx, layer)
            if ptr is None:
                raise LocalspecError(
                    f"llama.cpp gave no rows of target layer {layer} for the {self.kind} drafter",
                    hint="this target's architecture may not expose its layers' rows: " + _HINT,
                )
            out[:, k * width : (k + 1) * width] = np.ctypeslib.as_array(ptr, shape=(n, width))
        return out

    def _seen(self, pos0: int, n: int) -> None:
        if pos0 <= self.valid:  # else a gap stays: positions the head did not follow
            self.valid = pos0 + n
        self.follow_passes += 1

    def _process(self, kind: int, what: str) -> None:
        rc = llama_cpp.llama_process(self.ctx, kind, self._batch)
        if rc != 0:
            raise LocalspecError(
                f"llama.cpp's {self.kind} {what} pass failed with status {rc}",
                hint="the context may be full: try a larger n_ctx or a shorter prompt",
            )

    def _add_row(self, rows: np.ndarray, i: int, pos: int, token: int | None, *, output: bool) -> None:
        """Entry ``i`` of ``rows`` (contiguous float32) at ``pos``: with ``token`` paired, else alone."""
        b, width = self._batch, rows.shape[1]
        embd = llama_cpp.llama_embd(
            ctypes.cast(rows.ctypes.data + i * width * 4, ctypes.POINTER(ctypes.c_float)), 1, width
        )
        if token is None:
            idx = llama_cpp.llama_batch_ext_add_embd(b, 0, embd)
        else:
            idx = llama_cpp.llama_batch_ext_add_token(b, 0, int(token))
        self._set_pos(idx, pos)
        if token is not None:
            llama_cpp.llama_batch_ext_set_embd_token(b, idx, embd)
        if output:
            llama_cpp.llama_batch_ext_set_output_logits(b, idx, True)

    def _set_pos(self, idx: int, pos: int) -> None:
        self._pos[0] = self._pos[1] = self._pos[2] = pos  # M-RoPE drafters read three
        llama_cpp.llama_batch_ext_set_pos(self._batch, idx, self._pos)

    def _forget_from(self, pos: int) -> None:
        llama_cpp.llama_memory_seq_rm(self.memory, 0, max(0, pos), -1)

    def _logits(self, i: int) -> np.ndarray:
        return np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(self.ctx, i), shape=(self.n_vocab,))

    @property
    def weights_bytes(self) -> int:
        """The drafter file's weights."""
        return int(llama_cpp.llama_model_size(self.owned_model)) if self.owned_model else 0

    def close(self) -> None:
        """Free the context and the drafter's model, and stop the target keeping rows for it."""
        if self.ctx and self.layer_ids:
            self.set_following(False)
        if self._batch is not None:
            llama_cpp.llama_batch_ext_free(self._batch)
            self._batch = None
        if self.ctx:
            llama_cpp.llama_free(self.ctx)
            self.ctx = None
        if self.owned_model:
            llama_cpp.llama_model_free(self.owned_model)
            self.owned_model = None


class Eagle3Head(FeatureHead):
    """An EAGLE-3 drafter (llama.cpp's ``draft-eagle3``): see the module."""

    kind = "EAGLE-3"

    def __init__(self, model: Any, target_ctx: Any, *, n_ctx: int, n_batch: int, n_threads: int) -> None:
        super().__init__(model, target_ctx, n_ctx=n_ctx, n_batch=n_batch, n_threads=n_threads)
        from llama_cpp import llama_cpp_ext

        self._ext = llama_cpp_ext
        self._ext.llama_set_embeddings_nextn(self.ctx, True, True)  # the pre-norm rows of the outputs
        self._g = np.zeros((ROWS_KEPT, self.n_embd), dtype=np.float32)
        self._g_pos = np.full(ROWS_KEPT, -1, dtype=np.int64)
        self._zero = np.zeros(self.n_embd, dtype=np.float32)
        #: the last verify pass, ``(tokens, pos0)``, whose pairs wait for the next draft (:meth:`follow`)
        self._owed: list[tuple[list[int], int]] = []
        self._last_draft = 0  # tokens the last draft proposed: its verify pass is a round's usual one

    def _g_at(self, pos: int) -> np.ndarray | None:
        slot = pos % ROWS_KEPT
        return self._g[slot] if pos >= 0 and self._g_pos[slot] == pos else None

    def _encode(self, features: np.ndarray) -> np.ndarray:
        """``g`` of each row of ``features`` (the encoder pass, by chunks of the batch)."""
        n = len(features)
        out = np.empty((n, self.n_embd), dtype=np.float32)
        step = int(llama_cpp.llama_n_ubatch(self.ctx))
        for at in range(0, n, step):
            chunk = np.ascontiguousarray(features[at : at + step])
            llama_cpp.llama_batch_ext_clear(self._batch)
            base = int(llama_cpp.llama_memory_seq_pos_max(self.memory, 0)) + 1  # the encoder reads none
            for i in range(len(chunk)):
                self._add_row(chunk, i, base + i, None, output=True)
            self._process(llama_cpp.LLAMA_PROCESS_TYPE_ENCODE, "encoder")
            rows = self._ext.llama_get_embeddings_nextn(self.ctx)
            out[at : at + len(chunk)] = np.ctypeslib.as_array(rows, shape=(len(chunk), self.n_embd))
        return out

    def follow(self, tokens: list[int], pos0: int) -> None:
        """After the target evaluated ``tokens`` at ``pos0...``: encode its rows (``g``, kept by position),
        and put the pairs ``(token[P+1], g[P])`` of the positions before the last into the drafter's cache:
        a round's verify pass waits for the next draft, whose first pass takes the pairs of the positions
        the target kept (:meth:`_first_pass`); any other pass (a prompt, a replay) goes in now.

        Args:
            tokens: the pass's tokens, as the target evaluated them.
            pos0: the position of the first.
        """
        n = len(tokens)
        if n == 0:
            return
        self._owed = [(t[: pos0 - p], p) for t, p in self._owed if p < pos0]
        if not self.following:
            self.valid = min(self.valid, pos0)
            return
        g = self._encode(self.features(n))
        for i in range(max(0, n - ROWS_KEPT), n):
            slot = (pos0 + i) % ROWS_KEPT
            self._g[slot], self._g_pos[slot] = g[i], pos0 + i
        self._owed.append((list(tokens), pos0))
        if len(self._owed) > 1 or n > self._last_draft + 1:
            for owed_tokens, p in self._owed:
                self._decode_pairs(owed_tokens, p, output=False)
            self._owed = []
        self._seen(pos0, n)

    def _decode_pairs(self, tokens: list[int], pos0: int, *, output: bool) -> None:
        """One decoder pass of pairs: token ``i`` of ``tokens`` (the token at position ``pos0 + i``) with
        ``g`` of the position before it, at that position before (from ``pos0 - 1``; without the first pair
        when that ``g`` is no longer kept); logits for the last when ``output``."""
        rows = [self._g_at(pos0 + i - 1) for i in range(len(tokens))]
        skip = 1 if rows and rows[0] is None else 0
        if len(tokens) <= skip:
            return
        g = np.ascontiguousarray(np.stack([r if r is not None else self._zero for r in rows[skip:]]))
        first = pos0 - 1 + skip
        self._forget_from(first)
        llama_cpp.llama_batch_ext_clear(self._batch)
        for i in range(len(g)):  # every row an output: the decoder's graph keeps no output selection, so
            # llama.cpp hands out the first rows as many as were asked for, whichever were (as for DFlash)
            self._add_row(g, i, first + i, tokens[skip + i], output=output)
        self._process(llama_cpp.LLAMA_PROCESS_TYPE_DECODE, "follow" if not output else "draft")

    def _first_pass(self, last: int, pos0: int) -> None:
        """Draft step 0: the pairs owed for the positions the target kept before ``pos0``, then the pending
        token ``last`` with ``g`` of the position before it, in one decoder pass; logits for ``last``."""
        owed = [(t[: pos0 - p], p) for t, p in self._owed if p < pos0]
        self._owed = []
        for tokens, p in owed[:-1]:
            self._decode_pairs(tokens, p, output=False)
        if owed and owed[-1][1] + len(owed[-1][0]) == pos0:  # the kept verify tokens, then the pending one
            tokens, p = owed[-1]
            self._decode_pairs([*tokens, last], p, output=True)
        else:
            if owed:
                self._decode_pairs(*owed[-1], output=False)
            self._decode_pairs([last], pos0, output=True)

    def draft(self, last: int, pos0: int, n: int, choose: Any) -> MtpDraft:
        """Up to ``n`` tokens after ``last`` (the pending token, at ``pos0``; the target holds the positions
        before it). ``choose`` as :meth:`localspec.llama.mtp.MtpHead.draft` takes it."""
        out = MtpDraft()
        if n <= 0 or pos0 == 0:
            return out
        row, token = self._zero[None, :], last
        for i in range(n):
            t = time.perf_counter()
            if i == 0:
                self._first_pass(last, pos0)
                out.first_seconds = time.perf_counter() - t
            else:
                llama_cpp.llama_batch_ext_clear(self._batch)
                self._add_row(row, 0, pos0 - 1 + i, token, output=True)
                self._process(llama_cpp.LLAMA_PROCESS_TYPE_DECODE, "draft")
            out.evals += 1
            picked, go_on = choose(i, self._logits(-1))
            if picked is None:
                break
            out.tokens.append(int(picked))
            if not go_on or i + 1 == n:
                break
            prenorm = self._ext.llama_get_embeddings_nextn_ith(self.ctx, -1)
            row = np.ctypeslib.as_array(prenorm, shape=(1, self.n_embd)).copy()
            token = int(picked)
        self._last_draft = len(out.tokens)
        return out


class DFlashHead(FeatureHead):
    """A DFlash block drafter (llama.cpp's ``draft-dflash``): see the module.

    Raises:
        LocalspecError: a DFlash2 file (a selector lattice instead of logits), which is not driven here.
    """

    kind = "DFlash"
    block = True

    def __init__(self, model: Any, target_ctx: Any, *, n_ctx: int, n_batch: int, n_threads: int) -> None:
        super().__init__(model, target_ctx, n_ctx=n_ctx, n_batch=n_batch, n_threads=n_threads)
        if head_calls.selector_top_k(model) > 0:
            self.close()
            raise LocalspecError(
                "a DFlash2 drafter (a selector lattice): localspec drives DFlash and EAGLE-3 drafters",
                hint="run it with llama.cpp's --spec-type draft-dflash, or use a DFlash or EAGLE-3 drafter",
            )
        #: the trained block: the pending token and at most ``block_size - 1`` drafted ones
        self.block_size = _meta_int(model, "dflash.block_size", 16)
        self.mask_token = int(llama_cpp.llama_vocab_mask(llama_cpp.llama_model_get_vocab(model)))
        if self.block_size < 2 or self.mask_token < 0:
            self.close()
            raise LocalspecError(
                "this DFlash drafter has no usable block size or mask token in its header",
                hint="use the drafter file as published (dflash.block_size, tokenizer.ggml.mask_token_id)",
            )
        from llama_cpp import llama_cpp_ext

        llama_cpp_ext.llama_set_embeddings_nextn(self.ctx, True, True)
        causal = head_calls.meta_str(model, "dflash.attention.causal") == "true"
        llama_cpp.llama_set_causal_attn(self.ctx, causal)

    def follow(self, tokens: list[int], pos0: int) -> None:
        """After the target evaluated ``tokens`` at ``pos0...``: project its rows into the drafter's cache at
        the same positions (by chunks of the batch).

        Args:
            tokens: the pass's tokens, as the target evaluated them.
            pos0: the position of the first.
        """
        n = len(tokens)
        if n == 0:
            return
        if not self.following:
            self.valid = min(self.valid, pos0)
            return
        features = self.features(n)
        self._forget_from(pos0)
        step = int(llama_cpp.llama_n_ubatch(self.ctx))
        for at in range(0, n, step):
            chunk = np.ascontiguousarray(features[at : at + step])
            llama_cpp.llama_batch_ext_clear(self._batch)
            for i in range(len(chunk)):
                self._add_row(chunk, i, pos0 + at + i, None, output=False)
            self._process(llama_cpp.LLAMA_PROCESS_TYPE_DECODE, "injection")
        self._seen(pos0, n)

    def draft(self, last: int, pos0: int, n: int, choose: Any) -> MtpDraft:
        """Up to ``n`` tokens (at most the block's) after ``last`` (the pending token, at ``pos0``), from one
        pass over ``[last, MASK x n]``. ``choose`` as :meth:`localspec.llama.mtp.MtpHead.draft` takes it."""
        out = MtpDraft()
        n = min(n, self.block_size - 1)
        if n <= 0:
            return out
        b = self._batch
        self._forget_from(pos0)
        t = time.perf_counter()
        llama_cpp.llama_batch_ext_clear(b)
        for i in range(n + 1):
            idx = llama_cpp.llama_batch_ext_add_token(b, 0, last if i == 0 else self.mask_token)
            self._set_pos(idx, pos0 + i)
            # every entry an output, as llama.cpp: the graph keeps no output selection, so llama.cpp hands
            # out the first rows as many as were asked for, whichever entries were asked
            llama_cpp.llama_batch_ext_set_output_logits(b, idx, True)
        try:
            self._process(llama_cpp.LLAMA_PROCESS_TYPE_DECODE, "draft")
            out.first_seconds, out.evals = time.perf_counter() - t, 1
            for i in range(n):
                picked, go_on = choose(i, self._logits(i + 1))  # entry 0 is the pending token
                if picked is None:
                    break
                out.tokens.append(int(picked))
                if not go_on:
                    break
        finally:
            self._forget_from(pos0)  # the block is not the target's: its positions are the verify pass's
        return out


def _meta_int(model: Any, key: str, default: int) -> int:
    value = head_calls.meta_str(model, key)
    try:
        return int(value) if value is not None else default
    except ValueError:
        return -1


#: drafter architectures driven here, by ``general.architecture``
HEADS: dict[str, type[Eagle3Head] | type[DFlashHead]] = {"eagle3": Eagle3Head, "dflash": DFlashHead}
