"""The :class:`Pipeline`: a loaded target (and draft) that generates, streams, chats and compares.

:func:`localspec.pipeline.loading.load` makes one. Its suffix cache is a
:class:`localspec.suffix.cache.SuffixCache` that it holds and delegates to.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from localspec import constants
from localspec.constrain.grammar import Grammar
from localspec.decoding.batch import Batch
from localspec.decoding.costs import MachineCosts
from localspec.decoding.engine import Engine, Generation, TokenResponse
from localspec.decoding.routing import Route, Router
from localspec.decoding.stats import Comparison
from localspec.errors import SettingsError
from localspec.gguf.pairing import PairInfo
from localspec.llama.runtime import Model
from localspec.llama.sampling import SamplingParams
from localspec.pipeline.call_setup import CallSetup
from localspec.pipeline.chat_format import ChatFormat
from localspec.pipeline.chatting import Chatting
from localspec.pipeline.checks import checked_text
from localspec.pipeline.compare import compare
from localspec.pipeline.drafting import model_drafter
from localspec.pipeline.many import generate_many, start_kwargs
from localspec.pipeline.models import for_pair, load_models, use_prompt_caches
from localspec.pipeline.results import GenerationResult, collect
from localspec.pipeline.suffix_and_costs import SuffixAndCosts
from localspec.settings import DRAFT_MODEL, TARGET_ALONE, DraftSettings, Strategy
from localspec.suffix.cache import SuffixCache
from localspec.suffix.store_files import store_path


def _settings_for(info: PairInfo, settings: DraftSettings | None) -> DraftSettings:
    """A pipeline's settings: the ones given (a draft model strategy only with a draft model), else the draft
    model when the pair has one, else the target alone (each call's settings go through
    :func:`~localspec.pipeline.models.for_pair` as these do)."""
    if settings is None:
        settings = DraftSettings(strategy=DRAFT_MODEL if info.draft_path is not None else TARGET_ALONE)
    settings = for_pair(info, settings)
    if settings.uses_model and info.draft_path is None:
        raise SettingsError(
            f"strategy {settings.strategy.name!r} needs a draft model, and none was given",
            hint="give a draft model (draft=PATH; on the command line --draft PATH) or a preset with "
            "one, or use strategy 'suffix' or 'ngram'",
        )
    return settings


class Pipeline(CallSetup, Chatting, SuffixAndCosts):
    """A loaded target (and draft). Reuse it: models stay loaded, KV caches are reused across calls.

    ``settings`` is what every call runs unless it says otherwise (each call may override strategy,
    n_max, n_min, p_min and adaptive). One pipeline may be shared by threads and by interleaved streams:
    each round runs under a lock and re-syncs the caches to its own context (see
    :mod:`localspec.decoding.engine`).
    ``n_gpu_layers``/``draft_n_gpu_layers`` None means all layers when llama.cpp can offload to a GPU,
    else none; :attr:`placement` says where each model runs. ``n_ctx`` from 16 up (:class:`SettingsError`
    below), lowered to the target's trained context when it asks for more; :attr:`n_ctx` is the result.
    ``rpc`` (``HOST:PORT`` items) puts the target's layers on llama.cpp rpc-servers (all of them unless
    ``n_gpu_layers`` keeps some here; ``tensor_split`` shares them out), the draft stays local.

    Args:
        info: the checked pair (:func:`localspec.gguf.pairing.check_pair`).
        n_threads: CPU threads of the target (None: the default for this machine).
        n_gpu_layers: layers of the target on a GPU; None: all when llama.cpp can offload, else none.
        draft_n_threads: CPU threads of the draft (None: the target's).
        draft_n_gpu_layers: layers of the draft on a GPU, as ``n_gpu_layers``.
        settings: what every call runs unless it says otherwise.
        suffix_store: for the ``suffix``/``model+suffix``/``auto`` strategies, keep what earlier
            requests wrote in a store on disk (per target vocabulary and ``store_namespace``, mode 0600) so
            a new process drafts from it too; False keeps it in memory for this pipeline only.
        corpus: a folder whose text files the suffix cache drafts from (tokenized once at the first
            suffix generation).
        store_namespace: the store's namespace (1-64 letters, digits, ``.``, ``_`` or ``-``).
        rpc: llama.cpp rpc-servers (``"HOST:PORT,..."`` or a list) that hold the target's layers; the
            draft stays on this machine (docs/rpc.md). ``n_gpu_layers`` then counts layers on the servers
            (default all).
        tensor_split: each RPC device's share of those layers (default: by their free memory).
        parallel: generations that run at once in one pass (:meth:`generate_many`, ``serve --parallel``):
            the target and the draft hold that many sequences, each with ``n_ctx`` of room (the KV cache
            grows with it; the MTP layers draft for one). None: chosen (at most 4, as many as fit the free
            memory) and :attr:`parallel_reason` says why.
        prompt_cache_mb: host memory (MB) for the states of prompts the sequences held before, so that a
            later request starting the same way (a chat's next turn, an agent's system prompt) evaluates only
            what is new (0: off; not with MTP layers or a drafter file).
    """

    def __init__(
        self,
        info: PairInfo,
        *,
        n_ctx: int = constants.DEFAULT_N_CTX,
        n_threads: int | None = None,
        n_gpu_layers: int | None = None,
        draft_n_threads: int | None = None,
        draft_n_gpu_layers: int | None = None,
        settings: DraftSettings | None = None,
        suffix_store: bool = True,
        corpus: str | os.PathLike | None = None,
        store_namespace: str = "default",
        rpc: str | Sequence[str] | None = None,
        tensor_split: Sequence[float] | None = None,
        parallel: int | None = 1,
        prompt_cache_mb: float = constants.DEFAULT_PROMPT_CACHE_MB,
    ) -> None:
        self.info = info
        store_path(".", "0" * 16, store_namespace)  # a namespace no file can be named by: refused now
        corpus_folder = Path(corpus).expanduser() if corpus else None
        self._costs: MachineCosts | None = None
        self.route: Route | None = None  # the last "auto" decision and its reason
        #: told (a line of text) before a one-time wait: measuring this machine's costs (the CLI prints it)
        self.notify: Callable[[str], None] | None = None
        self.settings = settings = _settings_for(info, settings)
        loaded = load_models(
            info,
            settings,
            n_ctx=n_ctx,
            n_threads=n_threads,
            n_gpu_layers=n_gpu_layers,
            draft_n_threads=draft_n_threads,
            draft_n_gpu_layers=draft_n_gpu_layers,
            rpc=rpc,
            tensor_split=tensor_split,
            parallel=parallel,
        )
        use_prompt_caches(loaded, prompt_cache_mb)
        self._target, self._draft, self.memory = loaded.target, loaded.draft, loaded.memory
        #: generations that run at once in one pass (the sequences the models hold), and why that many
        self.parallel, self.parallel_reason = loaded.parallel, loaded.parallel_reason
        #: what the measured costs depend on: threads, and the layers of the target and the draft on a GPU
        self.load_facts = loaded.facts
        #: the n_ctx asked for, when it was lowered to the trained context (errors and the CLI say so)
        self.n_ctx_asked = loaded.n_ctx_asked
        self._engine = Engine(self._target)
        self._model_drafter = model_drafter(self._draft, self._target, info.masked_ids, settings)
        #: ``auto``'s decisions and what it measured per model drafter (:mod:`localspec.decoding.routing`)
        self.router = Router(model=self._model_drafter is not None, mtp=self._target.mtp is not None)
        self._chat: ChatFormat | None = None
        self._suffix = SuffixCache(
            self._target,
            info.target_path,
            verify_cost=self._verify_cost,
            persist=suffix_store,
            corpus=corpus_folder,
            namespace=store_namespace,
        )

    # Lifecycle --------------------------------------------------------------------------------
    def close(self) -> None:
        with self._engine.lock:  # never under a running round (another thread's)
            for m in (self._draft, self._target):
                if m is not None:
                    m.close()
            self._draft = None

    @property
    def closed(self) -> bool:
        """True once :meth:`close` ran: every later call raises."""
        return self._target.closed

    def __enter__(self) -> Pipeline:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # Facts ------------------------------------------------------------------------------------
    def n_ctx_note(self) -> str:
        """``" (n_ctx N lowered to the model's trained context)"`` when the n_ctx asked for was, else ''."""
        return (
            f" (n_ctx {self.n_ctx_asked} lowered to the model's trained context)" if self.n_ctx_asked else ""
        )

    @property
    def metadata(self) -> dict[str, str]:
        """The target's GGUF metadata (chat template, architecture, ...)."""
        return self._target.metadata

    @property
    def target(self) -> Model:
        """The loaded target model, to read (its vocabulary, tokenizer, KV cache, MTP layers); generation goes
        through the pipeline's own calls, which hold the engine's lock."""
        return self._target

    @property
    def draft(self) -> Model | None:
        """The loaded draft model, to read; None when the strategy runs none."""
        return self._draft

    @property
    def trace(self) -> list[tuple[int, bool, int, float]] | None:
        """Set to a list to record, per emitted token: (token, from_draft, argmax of the verifying row,
        top-2 logit margin). For tests and diagnostics; None (off) by default. After
        :meth:`generate_many` it holds each prompt's rows in turn, in the prompts' order."""
        return self._engine.trace

    @trace.setter
    def trace(self, value: list[tuple[int, bool, int, float]] | None) -> None:
        self._engine.trace = value

    # Generation -------------------------------------------------------------------------------
    def stream_tokens(
        self,
        tokens: list[int],
        *,
        max_tokens: int = constants.DEFAULT_MAX_TOKENS,
        temperature: float = 0.0,
        top_k: int = 0,
        top_p: float = 1.0,
        min_p: float = 0.0,
        seed: int | None = None,
        stop: list[str] | None = None,
        strategy: str | Strategy | None = None,
        n_max: int | None = None,
        n_min: int | None = None,
        p_min: float | None = None,
        adaptive: bool | None = None,
        baseline: bool = False,
        grammar: Grammar | None = None,
    ) -> Iterator[TokenResponse]:
        """Generate from already tokenized input, streamed one token at a time.

        Safe to call from several threads on one pipeline. The arguments are checked at the call, before
        the first token; the settings not given are the pipeline's (:attr:`settings`).

        Args:
            tokens: the prompt as the target's token ids (:meth:`tokenize`, :meth:`format_chat`).
            max_tokens: the most tokens to generate (the prompt and these must fit :attr:`n_ctx`).
            temperature: 0 for greedy decoding, else sampling at this temperature.
            top_k: sample from the k most likely tokens (0: all).
            top_p: sample from the smallest set of tokens this likely in all (1: all).
            min_p: drop tokens less likely than this share of the most likely one (0: none).
            seed: the sampling seed (None: a random one).
            stop: a stop string or a list of them; the text ends before the first one written.
            strategy: the drafting strategy for this call (``"auto"`` chooses per request).
            n_max: the longest draft.
            n_min: the draft model drafts at least this many tokens before ``p_min`` may stop it.
            p_min: the draft model's top probability below which its draft stops.
            adaptive: let the adaptive controller pick the draft model's lengths.
            baseline: run the target alone (what speculative decoding is compared with).
            grammar: a :class:`localspec.Grammar` the output keeps to: JSON, a JSON schema, your own GBNF.

        Yields:
            One :class:`TokenResponse` per generated token: its text, id, whether a draft proposed it, and
            the running :class:`GenerationStats`.

        Raises:
            SettingsError: an argument out of range or of the wrong type (token ids outside the
                vocabulary, an empty prompt, a strategy that needs a draft model this pipeline lacks).
            ContextOverflowError: the prompt and ``max_tokens`` do not fit the context.
        """
        gen = self._start(
            tokens,
            max_tokens=max_tokens,
            params=SamplingParams(temperature, top_k, top_p, min_p, seed),
            stop=stop,
            strategy=strategy,
            baseline=baseline,
            grammar=grammar,
            n_max=n_max,
            n_min=n_min,
            p_min=p_min,
            adaptive=adaptive,
        )
        stream = self._engine.run(gen)
        if self.router.record_for(gen.settings.strategy) is not None:
            return self._learning(stream, gen)
        return stream

    def start_tokens(self, tokens: list[int], **kwargs: Any) -> Generation:
        """One generation checked, routed and given its drafter, not yet run: what runs several at once
        (:meth:`batch`, :meth:`generate_many`, ``serve --parallel``).

        Args:
            tokens: the prompt as the target's token ids.
            **kwargs: :meth:`stream_tokens`'s keyword arguments.

        Returns:
            The generation (:meth:`localspec.decoding.engine.Engine.start`), for a :class:`Batch`.

        Raises:
            SettingsError, ContextOverflowError: as :meth:`stream_tokens`.
        """
        return self._start(tokens, **start_kwargs(dict(kwargs)))

    def batch(
        self, *, fit: bool = True, on_cleanup_error: Callable[[Generation, Exception], None] | None = None
    ) -> Batch:
        """A :class:`~localspec.decoding.batch.Batch` of this pipeline's generations: up to :attr:`parallel`
        step together, one target pass per step; what each measured feeds ``auto`` as alone.

        Args:
            fit: cut each draft to what pays for its rows in the shared pass (False: each drafter's own
                lengths, as when it runs alone).
            on_cleanup_error: as :class:`~localspec.decoding.batch.Batch` takes it.

        Returns:
            An empty batch: :meth:`Batch.add` generations from :meth:`start_tokens`, then step it.
        """
        return Batch(self._engine, fit=fit, on_end=self._learned, on_cleanup_error=on_cleanup_error)

    def generate_many(
        self,
        prompts: Sequence[str],
        *,
        on_token: Callable[[int, TokenResponse], None] | None = None,
        **kwargs: Any,
    ) -> list[GenerationResult]:
        """Several plain completions at once: up to :attr:`parallel` run together, each step one target pass
        over all of them (the rest wait for a free sequence, in order). Each text is what that prompt gives
        alone (greedy: the verifying pass's argmax at every token).

        Args:
            prompts: the texts to continue.
            on_token: called as ``on_token(i, response)`` with each token of prompt ``i`` as it comes.
            **kwargs: :meth:`stream_tokens`'s keyword arguments, for every prompt.

        Returns:
            One :class:`GenerationResult` per prompt, in order.

        Raises:
            SettingsError, ContextOverflowError: as :meth:`stream` for any prompt (before any runs).
            LocalspecError: a generation that failed while running (the others were cancelled).
        """
        return generate_many(self, prompts, on_token, kwargs)

    def _learning(self, stream: Iterator[TokenResponse], gen: Generation) -> Iterator[TokenResponse]:
        """Pass tokens through; then tell the :attr:`router` what ``gen`` measured (:meth:`_learned`)."""
        last = None
        try:
            for last in stream:
                yield last
        finally:
            if last is not None:
                self._learned(gen)

    def tokenize(self, text: str) -> list[int]:
        """The target's tokens of a plain prompt (its BOS first, as llama.cpp adds it)."""
        return self._target.tokenize(checked_text(text, "prompt"), add_bos=True, special=True)

    def stream(self, prompt: str, **kwargs) -> Iterator[TokenResponse]:
        """Stream a plain completion of ``prompt``.

        Args:
            prompt: the text to continue (the target's BOS is put before it).
            **kwargs: :meth:`stream_tokens`'s keyword arguments (``max_tokens``, ``temperature``, ...).

        Yields:
            One :class:`TokenResponse` per generated token, as :meth:`stream_tokens`.

        Raises:
            SettingsError: ``prompt`` is not text llama.cpp's tokenizer takes, or as :meth:`stream_tokens`.
            ContextOverflowError: the prompt and ``max_tokens`` do not fit the context.
        """
        return self.stream_tokens(self.tokenize(prompt), **kwargs)

    def generate(self, prompt: str, **kwargs) -> GenerationResult:
        """A whole plain completion of ``prompt``.

        Args:
            prompt: the text to continue (the target's BOS is put before it).
            **kwargs: :meth:`stream_tokens`'s keyword arguments (``max_tokens``, ``temperature``, ...).

        Returns:
            The generated text, a :class:`GenerationResult` carrying its stats, tokens and pieces.

        Raises:
            SettingsError: as :meth:`stream`.
            ContextOverflowError: the prompt and ``max_tokens`` do not fit the context.
        """
        return collect(self.stream(prompt, **kwargs))

    def compare(self, prompt: str, *, repeats: int = 1, warmup: bool = True, **kwargs) -> Comparison:
        """Target alone and speculative on the same prompt, interleaved, in this process.

        A short uncounted run of each side first, so neither pays for cold caches and page faults
        (on a small model the first call can be several times slower than the next). ``repeats`` runs
        of each side (within :data:`~localspec.settings.REPEATS_RANGE`); the speedup is the ratio of
        their medians.
        """
        return compare(self, prompt, repeats=repeats, warmup=warmup, **kwargs)
