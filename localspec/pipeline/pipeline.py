"""The :class:`Pipeline`: a loaded target (and draft) that generates, streams, chats and compares.

:func:`localspec.pipeline.loading.load` makes one. Its suffix cache is a
:class:`localspec.suffix.cache.SuffixCache` that it holds and delegates to.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

from localspec import constants
from localspec.constrain.grammar import Grammar
from localspec.decoding.batch import Batch
from localspec.decoding.costs import MachineCosts, machine_costs, stored_costs
from localspec.decoding.engine import Engine, Generation, TokenResponse
from localspec.decoding.routing import Route, Router
from localspec.decoding.stats import Comparison, GenerationStats
from localspec.errors import ContextOverflowError, LocalspecError, SettingsError
from localspec.gguf.pairing import PairInfo
from localspec.llama.runtime import Model
from localspec.llama.sampling import SamplingParams
from localspec.pipeline.chat_format import ChatFormat
from localspec.pipeline.chat_turns import chat_messages
from localspec.pipeline.checks import checked_grammar_and_length, checked_stop, checked_text, checked_tokens
from localspec.pipeline.compare import compare
from localspec.pipeline.drafting import drafter_for, model_drafter
from localspec.pipeline.many import generate_many, start_kwargs
from localspec.pipeline.models import load_models
from localspec.pipeline.results import GenerationResult, collect
from localspec.pipeline.tool_calls import ChatResponse, ToolUse, tool_use
from localspec.settings import DRAFT_MODEL, TARGET_ALONE, DraftSettings, Strategy, parse_strategy
from localspec.suffix.cache import SuffixCache
from localspec.suffix.calibration import TOKEN_WEIGHT, Cell, TokenCell
from localspec.suffix.drafter import SuffixDrafter
from localspec.suffix.store_files import store_path


def _settings_for(info: PairInfo, settings: DraftSettings | None) -> DraftSettings:
    """A pipeline's settings: the ones given (a draft model strategy only with a draft model), else the draft
    model when the pair has one, else the target alone (each call's settings go through
    :func:`_for_pair` as these do)."""
    if settings is None:
        settings = DraftSettings(strategy=DRAFT_MODEL if info.draft_path is not None else TARGET_ALONE)
    settings = _for_pair(info, settings)
    if settings.uses_model and info.draft_path is None:
        raise SettingsError(
            f"strategy {settings.strategy.name!r} needs a draft model, and none was given",
            hint="give a draft model (draft=PATH; on the command line --draft PATH) or a preset with "
            "one, or use strategy 'suffix' or 'ngram'",
        )
    return settings


def _for_pair(info: PairInfo, settings: DraftSettings) -> DraftSettings:
    """``settings`` as this pair runs them: with an MTP assistant for the draft, a draft model strategy drafts
    with it as the target's MTP layers (``model+suffix`` runs ``mtp+suffix``)."""
    if info.assistant:
        return settings.with_overrides(strategy=settings.strategy.mtp_counterpart)
    return settings


class Pipeline:
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
    @property
    def n_ctx(self) -> int:
        """The context llama.cpp really gave (it rounds up what was asked)."""
        return self._target.n_ctx

    @property
    def n_ctx_is_trained(self) -> bool:
        """Whether the context is the model's trained one, so a larger n_ctx would be lowered to it again."""
        trained = self.info.n_ctx_train
        return trained is not None and trained > 0 and self.n_ctx >= trained

    def n_ctx_note(self) -> str:
        """``" (n_ctx N lowered to the model's trained context)"`` when the n_ctx asked for was, else ''."""
        return (
            f" (n_ctx {self.n_ctx_asked} lowered to the model's trained context)" if self.n_ctx_asked else ""
        )

    @property
    def max_draft(self) -> int:
        """The longest draft one verify pass can check (see
        :attr:`localspec.llama.runtime.Model.max_draft`)."""
        return self._target.max_draft

    @property
    def placement(self) -> dict[str, str]:
        """Where each loaded model runs, e.g. ``{"target": "CPU", "draft": "GPU (all layers)"}``."""
        out = {"target": self._target.placement}
        if self._draft is not None:
            out["draft"] = self._draft.placement
        return out

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
    # The suffix cache and the machine's costs ----------------------------------------------------
    def machine_costs(self) -> MachineCosts:
        """This machine's measured verify curve V(b) and token costs for these models (measured once per
        machine, build, model files, threads and offload, then read from the cache)."""
        if self._costs is None:
            facts = self.load_facts
            self._costs = machine_costs(
                self._target,
                self._draft,
                threads=facts.threads,
                gpu_layers=facts.gpu_layers,
                draft_gpu_layers=facts.draft_gpu_layers,
                notify=self.notify,
            )
        return self._costs

    def costs_pending(self, strategy: str | Strategy | None = None) -> bool:
        """True when a generation with ``strategy`` (default: the pipeline's) will first measure this
        machine's costs (:meth:`machine_costs`, which takes seconds on a CPU): the suffix
        cache and ``auto`` need them, and they are neither loaded nor stored yet. A caller that shows
        progress (the web UI) says so and calls :meth:`machine_costs` itself first."""
        kind = self.settings.strategy if strategy is None else parse_strategy(strategy)
        if not kind.sizes_own_drafts or self._costs is not None:
            return False
        f = self.load_facts
        found = stored_costs(
            self._target,
            self._draft,
            threads=f.threads,
            gpu_layers=f.gpu_layers,
            draft_gpu_layers=f.draft_gpu_layers,
        )
        return found is None

    def _verify_cost(self) -> Callable[[int], float]:
        """This machine's verify-cost curve V(b), for the suffix cache (measuring uses the target's cache)."""
        with self._engine.lock:
            return self.machine_costs().V

    @property
    def store_problem(self) -> str | None:
        """Why the suffix store on disk is not being used, or its last save failed; None while it works
        (or before the suffix cache first ran, or with ``suffix_store=False``)."""
        return self._suffix.problem

    def suffix_drafter(self) -> SuffixDrafter:
        """The pipeline's suffix cache: earlier requests, the store on disk (unless off), the corpus."""
        return self._suffix.drafter(self.notify)

    def reset_suffix(
        self,
        state: dict | None = None,
        calibration: Iterable[Cell] = (),
        tokens: Iterable[TokenCell] = (),
        token_weight: float = TOKEN_WEIGHT,
    ) -> None:
        """Start the suffix cache over: empty, or from an index :meth:`SuffixIndex.state` snapshot (the
        corpus is kept), with the drafter's calibration and token table learnt afresh or starting from
        ``calibration`` and ``tokens`` (what a store keeps: :meth:`SuffixDrafter.carried_calibration`,
        :meth:`SuffixDrafter.carried_tokens`); ``token_weight`` is the drafter's (0: no token table).
        For benchmarks; the store on disk is not touched unless the next request saves."""
        self._suffix.reset(state, calibration, tokens, token_weight, notify=self.notify)

    def set_corpus(self, folder: str | os.PathLike) -> None:
        """Draft from the text files of ``folder`` too (replaces the corpus; tokenized now)."""
        self._suffix.set_corpus(folder, notify=self.notify)

    def _route(self, s: DraftSettings, tokens: list[int]) -> tuple[DraftSettings, Route]:
        """``auto``: suffix alone, or a model drafter (adaptive) with the suffix cache, for this request, as
        the :attr:`router` decides from what the loaded drafters measured."""
        r = self.router.route(
            costs=self.machine_costs, n_max=min(s.n_max, 8), overlap=self.suffix_drafter().overlap(tokens)
        )
        adaptive = True if r.strategy.combined else s.adaptive  # a model drafter runs adaptive
        return s.with_overrides(strategy=r.strategy, adaptive=adaptive), r

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

    def _start(
        self,
        tokens: list[int],
        *,
        max_tokens: int,
        params: SamplingParams,
        stop: list[str] | None,
        strategy: str | Strategy | None,
        baseline: bool,
        grammar: Grammar | None,
        **overrides: Any,
    ) -> Generation:
        """:meth:`start_tokens` with the sampling parameters made."""
        tokens, stop = self._checked_call(tokens, max_tokens, stop, grammar, params)
        settings, chosen = self._call_settings(tokens, strategy, baseline, **overrides)
        return self._engine.start(
            tokens,
            drafter=drafter_for(settings, self._target, self._model_drafter, self.suffix_drafter),
            max_tokens=max_tokens,
            params=params,
            settings=settings,
            stop=stop,
            stats=self._new_stats(settings, chosen),
            grammar=grammar,
        )

    def _checked_call(
        self,
        tokens: list[int],
        max_tokens: int,
        stop: list[str] | None,
        grammar: Grammar | None,
        params: SamplingParams,
    ) -> tuple[list[int], list[str] | None]:
        """A call's arguments checked before its first token: the tokens and stop strings as the engine
        takes them, or the :class:`SettingsError` / :class:`ContextOverflowError` that says what is wrong."""
        checked_grammar_and_length(grammar, max_tokens)
        tokens = checked_tokens(tokens, self._target.n_vocab, self.info.target_path.name)
        stop = checked_stop(stop)
        self.check_fits(len(tokens), max_tokens)
        params.validate()
        return tokens, stop

    def _call_settings(
        self,
        tokens: list[int],
        strategy: str | Strategy | None,
        baseline: bool,
        *,
        n_max: int | None,
        **overrides: Any,
    ) -> tuple[DraftSettings, Route | None]:
        """The settings one call runs: the pipeline's with the call's overrides, and ``auto`` resolved to a
        strategy for this request (with its :class:`Route`; None when a strategy was named)."""
        switched = self.settings.switched_to(
            TARGET_ALONE if baseline else strategy, n_max=n_max, max_draft=self.max_draft, **overrides
        )
        settings = _for_pair(self.info, switched)
        if not settings.strategy.routed:
            return settings, None
        settings, chosen = self._route(settings, tokens)
        self.route = chosen
        return settings, chosen

    def _new_stats(self, settings: DraftSettings, chosen: Route | None) -> GenerationStats:
        """The running stats of one generation, before its first token."""
        return GenerationStats(
            strategy=settings.strategy,
            draft_name=self._draft_name(settings),
            pairing_note=self.info.note,
            memory=self.memory,
            placement=self.placement,
            route=chosen,
        )

    def _draft_name(self, settings: DraftSettings) -> str | None:
        """The draft file ``settings`` draft with: the draft model's, or an MTP assistant's."""
        path, assistant = self.info.draft_path, self.info.assistant
        drafts = settings.uses_model or (settings.uses_mtp and assistant)
        return path.name if path is not None and drafts else None

    def check_fits(self, n: int, max_tokens: int) -> None:
        """A prompt of ``n`` tokens plus ``max_tokens`` within the context, else ContextOverflowError."""
        if n + max_tokens > self.n_ctx:
            raise ContextOverflowError.before_generating(
                prompt_tokens=n,
                max_tokens=max_tokens,
                n_ctx=self.n_ctx,
                n_ctx_train=self.info.n_ctx_train,
                at_trained_limit=self.n_ctx_is_trained,
                lowered_from=self.n_ctx_asked or None,
            )

    def _learning(self, stream: Iterator[TokenResponse], gen: Generation) -> Iterator[TokenResponse]:
        """Pass tokens through; then tell the :attr:`router` what ``gen`` measured (:meth:`_learned`)."""
        last = None
        try:
            for last in stream:
                yield last
        finally:
            if last is not None:
                self._learned(gen)

    def _learned(self, gen: Generation) -> None:
        """Tell the :attr:`router` what the model drafter of a generation measured: its drafted and accepted
        tokens, its rounds, and the speed its adaptive controller predicted."""
        record = self.router.record_for(gen.settings.strategy)
        stats = gen.stats
        if record is None or not stats.generated_tokens:
            return
        counts = stats.by_drafter.get(record.source)
        record.record(
            self.router.requests,
            drafted=stats.drafted_by_source.get(record.source, 0),
            accepted=stats.accepted_by_source.get(record.source, 0),
            rounds=counts.rounds if counts else 0,
            speed=stats.predicted_speedup,
        )

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

    def chat_stream(
        self,
        messages: list[dict],
        *,
        tools: list[dict] | None = None,
        tool_choice: Any = None,
        response_format: Any = None,
        **kwargs,
    ) -> Iterator[ChatResponse]:
        """Stream a reply to ``messages`` formatted with the model's own chat template, one
        :class:`ChatResponse` per token: ``.text`` as the model wrote it, ``.content`` and ``.tool_calls``
        as a chat client shows them (the calls' markup read out, their names and arguments streamed as
        they are written). ``tools``, ``tool_choice`` and ``response_format`` as in OpenAI's API (see
        :func:`localspec.pipeline.tool_calls.tool_use` and
        :func:`localspec.constrain.grammar.response_format_grammar`)."""
        stream, use = self._chat_reply(messages, tools, tool_choice, response_format, kwargs)
        return use.responses(stream)

    def chat(
        self,
        messages: list[dict],
        *,
        tools: list[dict] | None = None,
        tool_choice: Any = None,
        response_format: Any = None,
        **kwargs,
    ) -> GenerationResult:
        """A whole reply to ``messages``, formatted with the model's own chat template.

        Args:
            messages: the conversation, in OpenAI's shape (``role``, ``content``; earlier tool calls and
                their results too).
            tools: functions the model may call, in OpenAI's shape.
            tool_choice: as in OpenAI's API: ``"auto"``, ``"none"``, ``"required"`` or one function.
            response_format: ``{"type": "json_object"}`` (or ``json_schema``) makes the reply that JSON.
            **kwargs: :meth:`stream_tokens`'s keyword arguments (``max_tokens``, ``temperature``, ...).

        Returns:
            The reply as the model wrote it, a :class:`GenerationResult`; with ``tools``,
            ``result.tool_calls`` holds the calls it made (OpenAI's shape: ``id``, ``type``,
            ``function.name``, ``function.arguments`` as a JSON string) and ``result.content`` the text
            outside them.

        Raises:
            LocalspecError: the target has no chat template.
            MessageError: ``messages`` that are not a list of chat turns.
            ToolCallError: malformed ``tools`` or ``tool_choice``.
            GrammarError: a ``grammar`` given with ``response_format`` or ``tools``, or a
                ``response_format`` that cannot be followed.
            SettingsError: arguments out of range, as :meth:`stream_tokens`.
            ContextOverflowError: the formatted prompt and ``max_tokens`` do not fit the context.
        """
        stream, use = self._chat_reply(messages, tools, tool_choice, response_format, kwargs)
        result = collect(stream)
        result.content, result.tool_calls = use.split(result.text)
        return result

    def _chat_reply(
        self, messages: list[dict], tools: Any, tool_choice: Any, response_format: Any, kwargs: dict
    ) -> tuple[Iterator[TokenResponse], ToolUse]:
        use = tool_use(tools, tool_choice, self.chat_template)
        kwargs["grammar"] = use.request_grammar(response_format, kwargs.get("grammar"))
        messages = chat_messages(messages)  # checked; earlier calls' arguments as objects, as templates want
        tokens, stops = self.format_chat(messages, tools=use.tools)
        kwargs["stop"] = list(kwargs.get("stop") or []) + stops
        return self.stream_tokens(tokens, **kwargs), use

    def format_chat(
        self, messages: list[dict], *, tools: list[dict] | None = None, reply_prefix: str = ""
    ) -> tuple[list[int], list[str]]:
        """``messages`` rendered with the target's own chat template: (prompt tokens, stop strings).

        ``tools`` (OpenAI's shape, checked by :func:`localspec.pipeline.tool_calls.check_tools`) are
        rendered by the template too; ``reply_prefix`` is the start of the assistant's reply, written
        after the template's generation prompt as the caller's text (what ``tool_choice`` forces, see
        :func:`localspec.pipeline.tool_calls.reply_prefix`)."""
        template = self.chat_template
        if not template:
            raise LocalspecError(
                f"{self.info.target_path.name} has no chat template in its metadata",
                hint="use generate()/stream() with a plain prompt instead of chat()",
            )
        if self._chat is None:
            self._chat = ChatFormat(self._target, template)
        return self._chat.tokens(messages, tools, reply_prefix)

    @property
    def chat_template(self) -> str | None:
        """The target's chat template (``tokenizer.chat_template`` in its GGUF), or None."""
        return self._target.metadata.get("tokenizer.chat_template") or None

    def compare(self, prompt: str, *, repeats: int = 1, warmup: bool = True, **kwargs) -> Comparison:
        """Target alone and speculative on the same prompt, interleaved, in this process.

        A short uncounted run of each side first, so neither pays for cold caches and page faults
        (on a small model the first call can be several times slower than the next). ``repeats`` runs
        of each side (within :data:`~localspec.settings.REPEATS_RANGE`); the speedup is the ratio of
        their medians.
        """
        return compare(self, prompt, repeats=repeats, warmup=warmup, **kwargs)
