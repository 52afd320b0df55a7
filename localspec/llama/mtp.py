"""Drafting with the target's own MTP (NextN) layers: the drafter Qwen3.5/3.6, GLM-4.x and DeepSeek ship
inside the GGUF.

An MTP block predicts the token after next: it reads a token's embedding and the target's last hidden row of
the position before (``h``, what llama.cpp calls ``h_nextn``), and answers logits and a hidden row of its own.
llama.cpp runs it as a second context on the same model (``LLAMA_CONTEXT_TYPE_MTP``, linked to the target's
through ``ctx_other``), and :class:`MtpHead` drives it as ``common/speculative.cpp``'s ``draft-mtp`` does:

- **follow the target**: after every target pass (prompt chunks, verify passes, replays), the MTP context
  evaluates the same tokens at the same positions, each paired with the target's hidden row of the position
  before (:meth:`MtpHead.follow`), so its own KV cache covers what the target's does. Rows that a later pass
  replaces are simply evaluated again (the positions from the pass's first on are removed first).
- **draft**: from the pending token and the target's hidden row before it, one MTP pass per drafted token,
  each fed the token it just proposed and the hidden row it just produced (:meth:`MtpHead.draft`). The
  drafted positions are removed again by the next :meth:`follow`.

llama.cpp has three modes, all driven here. One trained head (qwen35, qwen35moe, qwen3next, glm4-moe,
deepseek): as above. Chained heads (a file with more than one MTP layer: step35, mimo2), one per draft step,
as llama.cpp's ``chain_heads``: each layer follows the target's passes in turn (they share one KV cache, each
its own layer), and draft step ``i`` runs head ``i`` over the pending token and the tokens drafted so far,
each paired with the hidden row the step before made; a draft is at most as long as there are heads. Shared
memory (Gemma 4's assistant, a file of its own): the assistant's attention reads the target's KV cache (its
last sliding-window and last full layer), so nothing follows the target's passes but its hidden rows, and
every draft step runs at the pending token's position, fed the token just drafted and the row the step
before made (as llama.cpp's ``is_mem_shared``). The calls are llama.cpp's staging API
(``llama_cpp.llama_cpp_ext``), bound by llama-cpp-python 0.3.36. :mod:`localspec.llama.heads` starts the
head of a model: its MTP layers, or a drafter file (an assistant, or EAGLE-3 and DFlash drafters:
:mod:`localspec.llama.feature_heads`).
"""

from __future__ import annotations

import contextlib
import ctypes
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import llama_cpp
import llama_cpp._internals as llama_internals
import numpy as np

from localspec.errors import LocalspecError
from localspec.llama.load_hooks import replaced

#: Target hidden rows kept per position (a ring): the row before the first token of any later pass. A pass
#: that starts further back than this (a new request on an old prefix) pairs its first token with a zero
#: row, as llama.cpp does at a sequence's start: its first draft may be worse, never wrong.
ROWS_KEPT = 64


@contextlib.contextmanager
def layers_asked(wanted: bool) -> Iterator[None]:
    """While the block loads a model through ``llama_cpp.Llama``, its MTP layers load too (``load_mtp``).

    ``Llama`` has no argument for it: the model class it calls is replaced for the block
    (:func:`localspec.llama.load_hooks.replaced`).

    Args:
        wanted: False leaves the load as it is (llama.cpp then skips the MTP tensors).
    """
    if not wanted:
        yield
        return

    def with_mtp(original: type) -> type:
        class WithMtp(original):
            def __init__(self, *, path_model: str, params: Any, verbose: bool = True) -> None:
                params.load_mtp = True
                super().__init__(path_model=path_model, params=params, verbose=verbose)

        return WithMtp

    with replaced(llama_internals, "LlamaModel", with_mtp):
        yield


def layer_count(model: Any) -> int:
    """MTP (NextN) layers llama.cpp loaded for ``model`` (a ``llama_model`` pointer); 0 when it has none."""
    return int(llama_cpp.llama_model_n_layer_nextn(model))


@dataclass
class MtpDraft:
    """What one :meth:`MtpHead.draft` call proposed, and the passes it ran."""

    tokens: list[int] = field(default_factory=list)
    evals: int = 0  # MTP passes run
    first_seconds: float = 0.0  # the first of them
    fed: int = 1  # tokens the first pass caught up on (1: a round's usual, see :meth:`MtpHead._first_pass`)


class MtpHead:
    """The MTP context of one target context (sequence 0): it follows the target's passes and drafts.

    Args:
        model: the target's ``llama_model`` pointer, loaded with its MTP layers (:func:`layers_asked`), or
            an MTP assistant's (a model of its own that reads the target's memory: :attr:`shared`).
        target_ctx: the target's ``llama_context``: its hidden rows are switched on here, for every token.
        n_ctx: the target's context (the MTP cache holds as many positions).
        n_batch: the target's batch (a followed pass is at most this wide).
        n_threads: CPU threads.

    Raises:
        LocalspecError: llama.cpp could not make the MTP context.
    """

    def __init__(
        self,
        model: Any,
        target_ctx: Any,
        *,
        n_ctx: int,
        n_batch: int,
        n_threads: int,
        owns_model: bool = False,
    ) -> None:
        from llama_cpp import llama_cpp_ext

        self._ext = llama_cpp_ext
        self._batch: Any = None
        #: an assistant's model, freed with the head (:func:`assistant_head`); None: the target's own
        self.owned_model = model if owns_model else None
        self.n_layers = layer_count(model)
        self.n_embd = int(llama_cpp.llama_model_n_embd_out(model))
        self.n_vocab = int(llama_cpp.llama_vocab_n_tokens(llama_cpp.llama_model_get_vocab(model)))
        self.target_ctx = target_ctx
        self.block = False  # one MTP pass per drafted token
        params = llama_cpp.llama_context_default_params()
        params.n_ctx, params.n_batch, params.n_ubatch = n_ctx, n_batch, n_batch
        params.n_threads = params.n_threads_batch = n_threads
        params.ctx_type = llama_cpp.LLAMA_CONTEXT_TYPE_MTP
        params.ctx_other = target_ctx
        params.n_rs_seq = 0
        self.ctx = llama_cpp.llama_init_from_model(model, params)
        if not self.ctx:
            self.close()
            raise LocalspecError(
                "llama.cpp could not make the MTP context for this model",
                hint="draft with a small model of the same family instead (--draft PATH), or with ngram",
            )
        #: the head reads the target's KV cache (an MTP assistant): it follows nothing but the hidden rows
        self.shared = self._ext.llama_get_ctx_other(self.ctx) == target_ctx
        #: one head per draft step (llama.cpp's chained heads): a draft is at most this many tokens long
        self.chained = self.n_layers > 1 and not self.shared
        target_width = int(llama_cpp.llama_model_n_embd_out(llama_cpp.llama_get_model(target_ctx)))
        if self.n_embd != target_width:
            self.close()
            raise LocalspecError(
                f"the MTP head reads hidden rows {self.n_embd} wide; the target's are {target_width} wide",
                hint="use the MTP drafter published with this target model",
            )
        self.memory = llama_cpp.llama_get_memory(self.ctx)
        self._batch = llama_cpp.llama_batch_ext_init(self.ctx)
        self._ext.llama_set_embeddings_nextn(target_ctx, True, False)  # every token's row
        self._ext.llama_set_embeddings_nextn(self.ctx, True, True)  # the output rows only
        self._rows = np.zeros((ROWS_KEPT, self.n_embd), dtype=np.float32)
        self._row_pos = np.full(ROWS_KEPT, -1, dtype=np.int64)
        self._zero = np.zeros(self.n_embd, dtype=np.float32)
        self._pos = (llama_cpp.llama_pos * 4)()
        self.follow_passes = 0  # MTP passes that followed a target pass
        #: positions ``[0, valid)`` of the MTP cache (and their hidden rows) match the target's cache, or are
        #: owed to it (:attr:`_owed`)
        self.valid = 0
        self.following = True
        #: one head of its own cache: the last verify pass, not evaluated here yet, as ``(tokens, pos0,
        #: paired rows)`` (:meth:`_owe`). The next draft evaluates the positions the target kept in its first
        #: pass, with the pending token (:meth:`_first_pass`): one MTP pass less per round than following
        #: each target pass at once, and none for drafts the target rejected
        self._owed: list[tuple[list[int], int, np.ndarray]] = []
        self._last_draft = 0  # tokens the last draft proposed: its verify pass is a round's usual catch-up

    def _row_before(self, pos: int) -> np.ndarray:
        """The target's hidden row at ``pos - 1`` (zeros at a sequence's start or when no longer kept)."""
        slot = (pos - 1) % ROWS_KEPT
        return self._rows[slot] if pos > 0 and self._row_pos[slot] == pos - 1 else self._zero

    def follow(self, tokens: list[int], pos0: int) -> None:
        """After the target evaluated ``tokens`` at ``pos0...`` in one pass: keep its hidden rows and
        evaluate the same tokens in the MTP context, each paired with the row of the position before.

        Args:
            tokens: the pass's tokens, as the target evaluated them.
            pos0: the position of the first.
        """
        n = len(tokens)
        if n == 0:
            return
        self._drop_owed_from(pos0)
        if not self.following:
            self.valid = min(self.valid, pos0)
            return
        ptr = self._ext.llama_get_embeddings_nextn(self.target_ctx)
        if not ptr:
            raise LocalspecError(
                "llama.cpp gave no hidden rows for the MTP layers after a target pass",
                hint="draft with a small model of the same family instead (--draft PATH), or with ngram",
            )
        rows = np.ctypeslib.as_array(ptr, shape=(n, self.n_embd))
        if not self.shared:  # shared: the target's pass wrote the KV cache the head reads
            paired = np.empty((n, self.n_embd), dtype=np.float32)
            paired[0] = self._row_before(pos0)  # before the rows below overwrite a slot of the ring
            paired[1:] = rows[:-1]
            if self.chained:
                for head in range(self.n_layers):
                    llama_cpp.llama_memory_seq_rm(self.memory, 0, pos0, -1)
                    with self._head(head):
                        self._run(tokens, pos0, paired, output=False)
                self.follow_passes += 1
            else:
                self._owe(list(tokens), pos0, paired)
        for i in range(max(0, n - ROWS_KEPT), n):
            slot = (pos0 + i) % ROWS_KEPT
            self._rows[slot] = rows[i]
            self._row_pos[slot] = pos0 + i
        if pos0 <= self.valid:  # else a gap stays: positions the head did not follow
            self.valid = pos0 + n

    def _owe(self, tokens: list[int], pos0: int, paired: np.ndarray) -> None:
        """Keep a target pass for the next draft's first pass when it is a round's verify pass (no longer
        than the last draft and its pending token, nothing else owed); evaluate anything else now, as the
        target's pass ran (a prompt, a replay), so that a draft's first pass costs what a round's does."""
        self._owed.append((tokens, pos0, paired))
        if len(self._owed) > 1 or len(tokens) > self._last_draft + 1:
            self._settle()

    def _drop_owed_from(self, pos: int) -> None:
        """Forget what is owed from position ``pos`` on (a later target pass replaces it)."""
        kept = []
        for tokens, p, rows in self._owed:
            if p < pos:
                kept.append((tokens[: pos - p], p, rows[: pos - p]))
        self._owed = kept

    def _first_pass(self, last: int, pos0: int) -> int:
        """Draft step 0 of one head: the positions owed before ``pos0`` (those the target kept), then the
        pending token ``last`` at ``pos0`` with the row before it, fused into the owed pass that ends at
        ``pos0`` (by chunks of the batch when a long prompt is owed); logits for ``last``. Returns the
        tokens it caught up on (1: no more than the last verify pass, which every round evaluates)."""
        self._drop_owed_from(pos0)
        owed, self._owed = self._owed, []
        llama_cpp.llama_memory_seq_rm(self.memory, 0, owed[0][1] if owed else pos0, -1)
        pending = ([last], pos0, self._row_before(pos0)[None, :])
        if owed and owed[-1][1] + len(owed[-1][0]) == pos0:  # the last pass ends where the draft starts
            tokens, p, rows = owed.pop()
            pending = ([*tokens, last], p, np.concatenate([rows, pending[2]]))
        for tokens, p, rows in owed:
            self._run_chunked(tokens, p, rows, output=False)
        self._run_chunked(*pending, output=True)
        self.follow_passes += 1 if len(pending[0]) > 1 or owed else 0
        if not owed and len(pending[0]) <= self._last_draft + 2:
            return 1  # a round's own: the kept part of the last verify pass rides with the pending token
        return sum(len(t) for t, _, _ in owed) + len(pending[0])  # catching up (a prompt, a pause)

    def _run_chunked(self, tokens: list[int], pos0: int, rows: np.ndarray, *, output: bool) -> None:
        """:meth:`_run` by chunks of the batch (logits for the very last token when ``output``)."""
        step = int(llama_cpp.llama_n_batch(self.ctx))
        for at in range(0, len(tokens), step):
            last_chunk = at + step >= len(tokens)
            self._run(tokens[at : at + step], pos0 + at, rows[at : at + step], output=output and last_chunk)

    def _settle(self) -> None:
        """Evaluate everything owed now."""
        owed, self._owed = self._owed, []
        if owed:
            llama_cpp.llama_memory_seq_rm(self.memory, 0, owed[0][1], -1)
        for tokens, p, rows in owed:
            self._run_chunked(tokens, p, rows, output=False)
            self.follow_passes += 1

    def set_following(self, on: bool) -> None:
        """Follow the target's passes (on) or not (off: the target's passes cost nothing more, and the
        positions they write are no longer valid here; see :attr:`valid`)."""
        if on != self.following:
            self.following = on
            self._ext.llama_set_embeddings_nextn(self.target_ctx, on, False)

    def draft(self, last: int, pos0: int, n: int, choose: Any) -> MtpDraft:
        """Up to ``n`` tokens after ``last`` (the pending token, at ``pos0``; the target holds the positions
        before it).

        Args:
            last: the pending token.
            pos0: its position.
            n: the most tokens to draft.
            choose: ``choose(i, logits_row) -> (token or None, go_on)``: the drafted token at step ``i``
                from the MTP logits (None ends the draft there) and whether to draft one more.

        Returns:
            The tokens and the passes run.
        """
        n = min(n, self.n_layers) if self.chained else n
        out = MtpDraft()
        if self.shared or self.chained:
            llama_cpp.llama_memory_seq_rm(self.memory, 0, pos0, -1)
        tokens, rows = [last], [self._row_before(pos0)]
        for i in range(n):
            t = time.perf_counter()
            if i == 0 and not (self.shared or self.chained):
                out.fed = self._first_pass(last, pos0)
                output_row = -1
            else:
                output_row = self._step(i, tokens, rows, pos0)
            logits = np.ctypeslib.as_array(
                llama_cpp.llama_get_logits_ith(self.ctx, -1), shape=(self.n_vocab,)
            )
            if i == 0:
                out.first_seconds = time.perf_counter() - t
            out.evals += 1
            picked, go_on = choose(i, logits)
            if picked is None:
                break
            out.tokens.append(int(picked))
            if not go_on or i + 1 == n:
                break
            rows.append(
                np.ctypeslib.as_array(
                    self._ext.llama_get_embeddings_nextn_ith(self.ctx, output_row), shape=(self.n_embd,)
                ).copy()
            )
            tokens.append(int(picked))
        self._last_draft = len(out.tokens)
        return out

    def _step(self, i: int, tokens: list[int], rows: list[np.ndarray], pos0: int) -> int:
        """Draft step ``i``'s MTP pass, token ``k`` paired with ``rows[k]``; the batch index of its output.

        One head: the newest token at its position (the MTP cache holds the ones before). Shared memory: the
        newest token at ``pos0`` (the assistant was trained so: its attention reads the target's cache, which
        holds the positions before ``pos0``). Chained heads: head ``i`` over all of them from ``pos0`` (its
        layer holds no rows of the draft region)."""
        if not self.chained:
            self._run(tokens[-1:], pos0 if self.shared else pos0 + i, rows[-1][None, :], output=True)
            return 0
        llama_cpp.llama_memory_seq_rm(self.memory, 0, pos0, -1)
        with self._head(i):
            self._run(tokens, pos0, np.stack(rows), output=True)
        return len(tokens) - 1

    @contextlib.contextmanager
    def _head(self, head: int) -> Iterator[None]:
        """Passes in the block run MTP layer ``head`` (chained heads; back to the first after)."""
        if not self.chained:
            yield
            return
        self._ext.llama_set_nextn_layer_offset(self.ctx, head)
        try:
            yield
        finally:
            self._ext.llama_set_nextn_layer_offset(self.ctx, 0)

    def _run(self, tokens: list[int], pos0: int, rows: np.ndarray, *, output: bool) -> None:
        """One MTP pass: ``tokens`` at ``pos0...``, token ``i`` paired with ``rows[i]``; logits for the last
        when ``output``."""
        b, pos = self._batch, self._pos
        llama_cpp.llama_batch_ext_clear(b)
        rows = np.ascontiguousarray(rows, dtype=np.float32)
        base = rows.ctypes.data
        step = self.n_embd * 4
        last = len(tokens) - 1
        for i, token in enumerate(tokens):
            idx = llama_cpp.llama_batch_ext_add_token(b, 0, int(token))
            pos[0] = pos0 + i
            llama_cpp.llama_batch_ext_set_pos(b, idx, pos)
            embd = llama_cpp.llama_embd(
                ctypes.cast(base + i * step, ctypes.POINTER(ctypes.c_float)), 1, self.n_embd
            )
            llama_cpp.llama_batch_ext_set_embd_token(b, idx, embd)
            if output and i == last:
                llama_cpp.llama_batch_ext_set_output_logits(b, idx, True)
        rc = llama_cpp.llama_process(self.ctx, llama_cpp.LLAMA_PROCESS_TYPE_DECODE, b)
        if rc != 0:
            llama_cpp.llama_memory_seq_rm(self.memory, 0, pos0, -1)
            raise LocalspecError(
                f"llama.cpp's MTP pass failed with status {rc}",
                hint="the context may be full: try a larger n_ctx or a shorter prompt",
            )

    @property
    def weights_bytes(self) -> int:
        """An assistant's weights (0 for the target's own MTP layers: they are part of its file)."""
        return int(llama_cpp.llama_model_size(self.owned_model)) if self.owned_model else 0

    def close(self) -> None:
        """Free the MTP context, and an assistant's model (before the target's model goes)."""
        if self._batch is not None:
            llama_cpp.llama_batch_ext_free(self._batch)
            self._batch = None
        if getattr(self, "ctx", None):
            llama_cpp.llama_free(self.ctx)
            self.ctx = None
        if self.owned_model:
            llama_cpp.llama_model_free(self.owned_model)
            self.owned_model = None
