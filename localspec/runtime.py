"""One llama.cpp model and its KV cache, driven through llama-cpp-python's low-level calls.

Why not ``Llama.generate`` or llama-cpp-python's ``draft_model=`` hook: that path forces
``logits_all=True`` (n_ctx x n_vocab float32 logits kept in host memory, 2.5 GB for a 152K vocabulary
at n_ctx 4096), computes output rows for every prompt token, and re-evaluates tokens it already holds.
Measured on the Qwen2.5-Coder 1.5B/0.5B pair on a 2-core CPU it ran at 0.24x of the target alone.
Here each decode asks for output rows only at the positions that are verified (each row of a 152K
vocabulary costs about 14 ms on that machine), and :class:`Model` tracks exactly which tokens its KV
cache holds, so nothing is evaluated twice, across rounds and across calls.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
from pathlib import Path

import llama_cpp
import numpy as np

from localspec.errors import ContextOverflowError, GGUFError, LocalspecError, ModelNotFoundError


class Model:
    """A loaded GGUF model with its own context, batch and KV bookkeeping (sequence 0 only)."""

    def __init__(
        self,
        path: str | os.PathLike,
        *,
        n_ctx: int,
        n_threads: int,
        n_gpu_layers: int = 0,
        n_batch: int = 512,
        max_verify: int = 16,
    ) -> None:
        self.path = Path(path)
        if not self.path.is_file():
            raise ModelNotFoundError(
                f"{self.path}: no such model file",
                hint="check the path, or run `localspec scan` to list the models on this machine",
            )
        try:
            with _quiet_stderr():
                self.llama = llama_cpp.Llama(
                    model_path=str(self.path),
                    n_ctx=n_ctx,
                    n_batch=n_batch,
                    n_ubatch=n_batch,
                    n_threads=n_threads,
                    n_threads_batch=n_threads,
                    n_gpu_layers=n_gpu_layers,
                    logits_all=False,
                    verbose=False,
                )
        except (ValueError, RuntimeError, OSError) as exc:
            raise GGUFError(str(self.path), f"llama.cpp could not load this model ({exc})") from None
        self.ctx = self.llama._ctx.ctx
        self.model = self.llama._model.model
        self.vocab = llama_cpp.llama_model_get_vocab(self.model)
        self.memory = llama_cpp.llama_get_memory(self.ctx)
        self.n_ctx = llama_cpp.llama_n_ctx(self.ctx)
        self.n_vocab = llama_cpp.llama_vocab_n_tokens(self.vocab)
        self.n_batch = n_batch
        self.tokens: list[int] = []  # exactly what the KV cache holds, in order
        self._cap = max(n_batch, max_verify + 1)
        self._batch = llama_cpp.llama_batch_init(self._cap, 0, 1)
        for i in range(self._cap):
            self._batch.n_seq_id[i] = 1
            self._batch.seq_id[i][0] = 0
        self._piece_buf = ctypes.create_string_buffer(64)
        self.eog_ids = frozenset(
            t for t in range(self.n_vocab) if llama_cpp.llama_vocab_is_eog(self.vocab, t)
        )

    # Facts ------------------------------------------------------------------------------------
    @property
    def metadata(self) -> dict[str, str]:
        return self.llama.metadata

    @property
    def weights_bytes(self) -> int:
        return int(llama_cpp.llama_model_size(self.model))

    def kv_bytes(self) -> int:
        """K and V cache size from n_ctx, layers, KV heads and head sizes (f16 cache: 2 bytes)."""
        meta = self.metadata
        arch = meta.get("general.architecture", "")
        n_layer = llama_cpp.llama_model_n_layer(self.model)
        n_head = max(1, llama_cpp.llama_model_n_head(self.model))
        n_head_kv = llama_cpp.llama_model_n_head_kv(self.model)
        n_embd = llama_cpp.llama_model_n_embd(self.model)
        k_len = int(meta.get(f"{arch}.attention.key_length", n_embd // n_head))
        v_len = int(meta.get(f"{arch}.attention.value_length", n_embd // n_head))
        return self.n_ctx * n_layer * n_head_kv * (k_len + v_len) * 2

    # Tokens -----------------------------------------------------------------------------------
    def tokenize(self, text: str, *, add_bos: bool = True, special: bool = True) -> list[int]:
        return self.llama.tokenize(text.encode("utf-8"), add_bos=add_bos, special=special)

    def piece(self, token: int) -> bytes:
        """Raw bytes of one token as it continues a text (special tokens render as nothing)."""
        n = llama_cpp.llama_token_to_piece(self.vocab, token, self._piece_buf, 64, 0, False)
        if n < 0:
            buf = ctypes.create_string_buffer(-n)
            n = llama_cpp.llama_token_to_piece(self.vocab, token, buf, -n, 0, False)
            return buf.raw[:n]
        return self._piece_buf.raw[:n]

    # KV cache ---------------------------------------------------------------------------------
    def truncate(self, n: int) -> None:
        """Forget every cached token from position ``n`` on."""
        if n < len(self.tokens):
            if not llama_cpp.llama_memory_seq_rm(self.memory, 0, n, -1):
                raise LocalspecError(
                    f"{self.path.name}: llama.cpp cannot roll back part of this model's memory",
                    hint="recurrent or hybrid models cannot be targets or drafts for speculative decoding",
                )
            del self.tokens[n:]

    def sync(self, context: list[int], keep_last: int = 0) -> list[int]:
        """Trim the cache to its longest common prefix with ``context`` minus ``keep_last`` tokens.

        Returns the tokens of ``context`` that still need evaluating.
        """
        limit = len(context) - keep_last
        n = 0
        mine = self.tokens
        top = min(len(mine), limit)
        while n < top and mine[n] == context[n]:
            n += 1
        self.truncate(n)
        return context[n:]

    def decode(self, tokens: list[int], *, outputs: int = 1) -> np.ndarray | None:
        """Evaluate ``tokens`` after the cached ones; return logits rows for the last ``outputs``.

        The returned array is a view into llama.cpp's buffer: valid until the next decode.
        """
        if not tokens:
            return None
        if len(self.tokens) + len(tokens) > self.n_ctx:
            raise ContextOverflowError(
                f"{self.path.name}: {len(self.tokens) + len(tokens)} tokens do not fit the context of "
                f"{self.n_ctx}",
                hint="use a shorter prompt, a smaller max_tokens, or a larger n_ctx",
            )
        start = 0
        while start < len(tokens):
            chunk = tokens[start : start + self._cap]
            last_chunk = start + len(chunk) == len(tokens)
            self._fill(chunk, len(self.tokens), outputs if last_chunk else 0)
            rc = llama_cpp.llama_decode(self.ctx, self._batch)
            if rc != 0:
                self.truncate(len(self.tokens))
                raise LocalspecError(
                    f"{self.path.name}: llama_decode failed with status {rc}",
                    hint="the context may be full: try a larger n_ctx or a shorter prompt",
                )
            self.tokens.extend(chunk)
            start += len(chunk)
        if outputs <= 0:
            return None
        n_out = min(outputs, len(tokens))
        ptr = llama_cpp.llama_get_logits(self.ctx)
        return np.ctypeslib.as_array(ptr, shape=(n_out, self.n_vocab))

    def _fill(self, chunk: list[int], pos0: int, outputs: int) -> None:
        b = self._batch
        n = len(chunk)
        b.n_tokens = n
        first_out = n - outputs
        for i, t in enumerate(chunk):
            b.token[i] = t
            b.pos[i] = pos0 + i
            b.logits[i] = 1 if i >= first_out else 0

    def reset(self) -> None:
        self.truncate(0)

    def close(self) -> None:
        if getattr(self, "_batch", None) is not None:
            llama_cpp.llama_batch_free(self._batch)
            self._batch = None
        llama = getattr(self, "llama", None)
        if llama is not None:
            llama.close()
            self.llama = None


@contextlib.contextmanager
def _quiet_stderr():
    """llama.cpp prints its load log to fd 2 from C; hide it unless LOCALSPEC_VERBOSE is set."""
    if os.environ.get("LOCALSPEC_VERBOSE"):
        yield
        return
    try:
        fd = os.dup(2)
    except OSError:  # no real stderr (some notebook hosts)
        yield
        return
    try:
        with open(os.devnull, "w") as devnull:
            os.dup2(devnull.fileno(), 2)
            yield
    finally:
        os.dup2(fd, 2)
        os.close(fd)
