"""The public API: ``generate`` (one line) over ``load`` (a reusable :class:`Pipeline`).

Resolving what to run happens here: a preset (downloaded on first use), explicit paths, or the
embedded pair; the draft as a path, ``"ngram"``, ``"none"`` or ``None`` (automatic pairing: the best
compatible draft the scanner finds). A pair is checked from the GGUF headers before anything loads.
"""

from __future__ import annotations

import errno
import operator
import os
import stat
import statistics
from collections.abc import Callable, Iterable, Iterator
from dataclasses import fields
from pathlib import Path
from typing import Any

from localspec import constants
from localspec.constrain.grammar import Grammar, reply_grammar
from localspec.decoding.costs import MachineCosts, machine_costs, stored_costs
from localspec.decoding.drafters import CombinedDrafter, Drafter, ModelDrafter, NgramDrafter
from localspec.decoding.engine import Engine, TokenResponse
from localspec.decoding.routing import Route, route
from localspec.decoding.stats import Comparison, GenerationStats, MemoryReport, rss_bytes
from localspec.errors import (
    ContextOverflowError,
    GrammarError,
    LocalspecError,
    ModelNotFoundError,
    SettingsError,
)
from localspec.gguf.pairing import PairInfo, check_pair
from localspec.llama.chat_tokens import ChatTokenizer, chat_segments
from localspec.llama.runtime import Model, check_load_settings, default_gpu_layers, supports_gpu_offload
from localspec.llama.sampling import SamplingParams
from localspec.pipeline.tool_calls import ChatResponse, ToolUse, chat_messages, tool_use
from localspec.settings import (
    LOOKUP_N_MAX,
    MODEL_STRATEGIES,
    REPEATS_RANGE,
    SUFFIX_STRATEGIES,
    UTF8_HINT,
    DraftSettings,
    utf8_problem,
)
from localspec.suffix.drafter import TOKEN_WEIGHT, Cell, SuffixDrafter, SuffixIndex, TokenCell
from localspec.suffix.store import SuffixStore, store_path
from localspec.units import format_bytes


class GenerationResult(str):
    """The generated text (a ``str``), carrying ``.stats``, ``.tokens``, ``.from_draft`` and ``.pieces``.

    ``pieces`` is the text as it was streamed, one string per token (``"".join(pieces)`` is the text);
    ``sources`` says where each drafted token came from (None for the target's own). It copies and
    pickles like any value (``copy.copy``, ``pickle``), and prints as its text.
    """

    stats: GenerationStats
    tokens: list[int]
    from_draft: list[bool]
    pieces: list[str]
    sources: list[str | None]
    #: a chat reply's calls (:meth:`Pipeline.chat` with ``tools``), in OpenAI's shape
    tool_calls: list[dict]
    #: a chat reply's text outside its calls (OpenAI's ``message.content``); the whole text otherwise
    content: str

    def __new__(
        cls,
        text: str = "",
        stats: GenerationStats | None = None,
        tokens: list[int] | None = None,
        from_draft: list[bool] | None = None,
        pieces: list[str] | None = None,
        sources: list[str | None] | None = None,
    ) -> GenerationResult:
        obj = super().__new__(cls, text)
        obj.stats = stats if stats is not None else GenerationStats()
        obj.tokens = tokens if tokens is not None else []
        obj.from_draft = from_draft if from_draft is not None else []
        obj.pieces = pieces if pieces is not None else []
        obj.sources = sources if sources is not None else []
        obj.tool_calls = []
        obj.content = str(obj)
        return obj

    def __getnewargs__(self) -> tuple[str]:  # copy and pickle: the text; the attributes follow as state
        return (str(self),)

    @property
    def text(self) -> str:
        return str(self)


class Pipeline:
    """A loaded target (and draft). Reuse it: models stay loaded, KV caches are reused across calls.

    ``settings`` is what every call runs unless it says otherwise (each call may override strategy,
    n_max, n_min, p_min and adaptive). One pipeline may be shared by threads and by interleaved streams:
    each round runs under a lock and re-syncs the caches to its own context (see
    :mod:`localspec.decoding.engine`).
    ``n_gpu_layers``/``draft_n_gpu_layers`` None means all layers when llama.cpp can offload to a GPU,
    else none; :attr:`placement` says where each model runs. ``n_ctx`` from 16 up (:class:`SettingsError`
    below), lowered to the target's trained context when it asks for more; :attr:`n_ctx` is the result.
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
    ) -> None:
        self.info = info
        store_path(".", "0" * 16, store_namespace)  # a namespace no file can be named by: refused now
        self._suffix_options = (suffix_store, Path(corpus).expanduser() if corpus else None, store_namespace)
        self._suffix: SuffixDrafter | None = None
        self._store: SuffixStore | None = None
        self._costs: MachineCosts | None = None
        self._model_acceptance: float | None = None  # measured by generations that ran the draft model
        self._model_speed: float | None = None  # what their adaptive controllers predicted, for ``auto``
        self.route: Route | None = None  # the last "auto" decision and its reason
        #: told (a line of text) before a one-time wait: measuring this machine's costs (the CLI prints it)
        self.notify: Callable[[str], None] | None = None
        if settings is None:
            settings = DraftSettings(strategy="model" if info.draft_path is not None else "none")
        if settings.uses_model and info.draft_path is None:
            raise SettingsError(
                f"strategy {settings.strategy!r} needs a draft model, and none was given",
                hint="give a draft model (draft=PATH; on the command line --draft PATH) or a preset with "
                "one, or use strategy 'suffix' or 'ngram'",
            )
        self.settings = settings
        # Beyond its trained context a model writes garbage, and a huge n_ctx would allocate its KV cache
        # before anything failed: lower it to what the header says, before loading. ``n_ctx`` tells.
        threads = constants.default_threads() if n_threads is None else n_threads
        check_load_settings(n_ctx=n_ctx, n_threads=threads, n_gpu_layers=n_gpu_layers or 0, what="target")
        #: the n_ctx asked for, when it was lowered to the trained context (errors and the CLI say so)
        self.n_ctx_asked: int | None = None
        if info.n_ctx_train and n_ctx > info.n_ctx_train:
            self.n_ctx_asked, n_ctx = n_ctx, info.n_ctx_train
        offload = supports_gpu_offload()
        # what the measured costs depend on: threads, and GPU layers of the target and the draft
        self._load_facts = (
            threads,
            default_gpu_layers(n_gpu_layers, offload=offload),
            default_gpu_layers(draft_n_gpu_layers, offload=offload) if info.draft_path else 0,
        )
        mem = MemoryReport(rss_baseline_bytes=rss_bytes())
        self._target = Model(
            info.target_path,
            n_ctx=n_ctx,
            n_threads=threads,
            n_gpu_layers=default_gpu_layers(n_gpu_layers, offload=offload),
        )
        mem.rss_after_target_bytes = rss_bytes()
        mem.target_weights_bytes = self._target.weights_bytes
        mem.target_kv_bytes = self._target.kv_bytes()
        self._draft: Model | None = None
        try:
            if settings.is_speculative and settings.n_max > self._target.max_draft:
                raise SettingsError(
                    f"n_max {settings.n_max} is more than one verify pass can check at n_ctx {n_ctx} "
                    f"(at most {self._target.max_draft} drafts: llama.cpp's batch is {self._target.n_batch})",
                    hint=f"use n_max {self._target.max_draft} or less, or a larger n_ctx",
                )
            if info.draft_path is not None:
                self._draft = Model(
                    info.draft_path,
                    n_ctx=n_ctx,
                    n_threads=threads if draft_n_threads is None else draft_n_threads,
                    n_gpu_layers=default_gpu_layers(draft_n_gpu_layers, offload=offload),
                )
                mem.rss_after_draft_bytes = rss_bytes()
                mem.draft_weights_bytes = self._draft.weights_bytes
                mem.draft_kv_bytes = self._draft.kv_bytes()
        except BaseException:
            self._target.close()
            raise
        self.memory = mem
        self._engine = Engine(self._target)
        self._model_drafter = (
            ModelDrafter(
                self._draft,
                target_n_vocab=self._target.n_vocab,
                masked_ids=info.masked_ids,
                n_min=settings.n_min,
                p_min=settings.p_min,
            )
            if self._draft
            else None
        )
        self._chat: tuple | None = None

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
    def options(self) -> DraftSettings:
        """Old name of :attr:`settings` (read-only)."""
        return self.settings

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
    def trace(self) -> list[tuple[int, bool, int, float]] | None:
        """Set to a list to record, per emitted token: (token, from_draft, argmax of the verifying row,
        top-2 logit margin). For tests and diagnostics; None (off) by default."""
        return self._engine.trace

    @trace.setter
    def trace(self, value: list[tuple[int, bool, int, float]] | None) -> None:
        self._engine.trace = value

    # Generation -------------------------------------------------------------------------------
    def _drafter(self, s: DraftSettings) -> Drafter | None:
        """A drafter for one generation. N-gram tables belong to that generation only; the suffix cache
        is the pipeline's (it remembers every request; the engine's lock serialises its rounds, and its
        live part re-syncs to whichever context asks)."""
        if not s.is_speculative:
            return None
        lookup: Drafter = self.suffix_drafter() if s.uses_suffix else NgramDrafter()
        if not s.uses_model:
            return lookup
        if self._model_drafter is None:
            raise LocalspecError(
                f"strategy {s.strategy!r} needs a draft model, and this pipeline has none",
                hint="load with a draft model (draft=PATH; on the command line --draft PATH) or a preset "
                "with one, or use strategy 'suffix' or 'ngram'",
            )
        model = self._model_drafter.with_limits(n_min=s.n_min, p_min=s.p_min)
        return CombinedDrafter(model, lookup) if "+" in s.strategy else model

    # The suffix cache and the machine's costs ----------------------------------------------------
    def machine_costs(self) -> MachineCosts:
        """This machine's measured verify curve V(b) and token costs for these models (measured once per
        machine, build, model files, threads and offload, then read from the cache)."""
        if self._costs is None:
            threads, gpu, draft_gpu = self._load_facts
            self._costs = machine_costs(
                self._target,
                self._draft,
                threads=threads,
                gpu_layers=gpu,
                draft_gpu_layers=draft_gpu,
                notify=self.notify,
            )
        return self._costs

    def costs_pending(self, strategy: str | None = None) -> bool:
        """True when a generation with ``strategy`` (default: the pipeline's) will first measure this
        machine's costs (:meth:`machine_costs`: 20-30 s for a 1.5B model on two CPU cores): the suffix
        cache and ``auto`` need them, and they are neither loaded nor stored yet. A caller that shows
        progress (the web UI) says so and calls :meth:`machine_costs` itself first."""
        if (strategy or self.settings.strategy) not in SUFFIX_STRATEGIES or self._costs is not None:
            return False
        threads, gpu, draft_gpu = self._load_facts
        found = stored_costs(
            self._target, self._draft, threads=threads, gpu_layers=gpu, draft_gpu_layers=draft_gpu
        )
        return found is None

    @property
    def store_problem(self) -> str | None:
        """Why the suffix store on disk is not being used, or its last save failed; None while it works
        (or before the suffix cache first ran, or with ``suffix_store=False``)."""
        return self._store.problem if self._store is not None else None

    def suffix_drafter(self) -> SuffixDrafter:
        """The pipeline's suffix cache: earlier requests, the store on disk (unless off), the corpus."""
        if self._suffix is None:
            persist, corpus, namespace = self._suffix_options
            from localspec.gguf.meta import read_metadata
            from localspec.gguf.vocab import fingerprint

            # a store is never shared across vocabularies: its file is named by the target's fingerprint
            vocab_id = fingerprint(read_metadata(self.info.target_path, merges=False)).fingerprint or "none"
            n_vocab = self._target.n_vocab
            if persist:
                self._store = SuffixStore(None, vocab_id, namespace=namespace, n_vocab=n_vocab)
                index = self._store.load()
            else:
                index = SuffixIndex(n_vocab=n_vocab)
            if corpus is not None:
                self._set_corpus(index, corpus)
            with self._engine.lock:  # measuring uses the target's cache
                costs = self.machine_costs()
            # the calibration the last process saved with the store: drafting starts where it left off
            store = self._store
            self._suffix = SuffixDrafter(
                index,
                verify_cost=costs.V,
                store=store,
                calibration=store.calibration if store is not None else (),
                tokens=store.tokens if store is not None else (),
            )
        return self._suffix

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
        drafter = self.suffix_drafter()
        corpus = drafter.index.corpus
        index = (
            SuffixIndex.from_state(state, n_vocab=self._target.n_vocab)
            if state
            else SuffixIndex(n_vocab=self._target.n_vocab)
        )
        index.corpus = corpus
        self._suffix = SuffixDrafter(
            index,
            verify_cost=drafter.verify_cost,
            store=drafter.store,
            calibration=calibration,
            tokens=tokens,
            token_weight=token_weight,
        )

    def set_corpus(self, folder: str | os.PathLike) -> None:
        """Draft from the text files of ``folder`` too (replaces the corpus; tokenized now)."""
        self._set_corpus(self.suffix_drafter().index, Path(folder).expanduser())

    def _set_corpus(self, index: SuffixIndex, folder: Path) -> None:
        """``folder``'s text files as ``index``'s corpus, tokenized by the target; the store (when on)
        names the folder, as ``localspec index`` does (``localspec cache info`` shows it)."""
        from localspec.suffix.store import read_corpus

        scan = read_corpus(folder)
        root = str(scan.root.resolve())
        before = self._store.corpus_root if self._store is not None else None
        if self.notify is not None:  # a pause of seconds per MB of text, and the store's corpus changes
            replaced = (
                f"; it replaces the corpus from {before} in the store" if before and before != root else ""
            )
            self.notify(
                f"indexing {len(scan.files):,} files ({format_bytes(scan.n_bytes)}) of {root} as the suffix "
                f"cache's corpus{replaced}"
            )
        tokenize = self._target.tokenize
        index.set_corpus([tokenize(text, add_bos=False, special=False) for _, text in scan.files])
        if self._store is not None:
            self._store.corpus_root = root

    def _route(self, s: DraftSettings, tokens: list[int]) -> tuple[DraftSettings, Route]:
        """``auto``: suffix alone, or the draft model (adaptive) with the suffix cache, for this request."""
        has_model = self._model_drafter is not None
        costs = self.machine_costs() if has_model else None
        overlap = self.suffix_drafter().overlap(tokens)
        r = route(
            has_model=has_model,
            costs=costs,
            model_acceptance=self._model_acceptance,
            n_max=min(s.n_max, 8),
            overlap=overlap,
            measured_speed=self._model_speed,
        )
        adaptive = True if r.strategy == "model+suffix" else s.adaptive
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
        strategy: str | None = None,
        n_max: int | None = None,
        n_min: int | None = None,
        p_min: float | None = None,
        adaptive: bool | None = None,
        baseline: bool = False,
        grammar: Grammar | None = None,
    ) -> Iterator[TokenResponse]:
        """Generate from already tokenized input. One :class:`TokenResponse` per token.

        ``grammar`` (a :class:`localspec.Grammar`) constrains the output: JSON, a JSON schema, your own GBNF.
        Safe to call from several threads on one pipeline; errors in the arguments raise here.
        """
        if grammar is not None and not isinstance(grammar, Grammar):
            raise SettingsError(
                f"grammar must be a localspec.Grammar, got {type(grammar).__name__}",
                hint="e.g. Grammar.json_object(), Grammar.json_schema({...}) or Grammar.gbnf(text)",
            )
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
            raise SettingsError(
                f"max_tokens must be a whole number >= 1, got {max_tokens!r}", hint="e.g. 256"
            )
        tokens = self._checked_tokens(tokens)
        stop = _checked_stop(stop)
        n = len(tokens)
        self._check_fits(n, max_tokens)
        params = SamplingParams(temperature, top_k, top_p, min_p, seed)
        params.validate()
        if strategy is not None and n_max is None and strategy in SUFFIX_STRATEGIES:
            if not self.settings.uses_suffix:  # switching to the suffix cache: it sizes its own drafts
                n_max = min(LOOKUP_N_MAX, self.max_draft)
        settings = self.settings.with_overrides(
            strategy="none" if baseline else strategy,
            n_max=n_max,
            n_min=n_min,
            p_min=p_min,
            adaptive=adaptive,
        )
        chosen: Route | None = None
        if settings.strategy == "auto":
            settings, chosen = self._route(settings, tokens)
            self.route = chosen
        drafter = self._drafter(settings)
        stats = GenerationStats(
            strategy=settings.strategy,
            draft_name=(self.info.draft_path.name if self.info.draft_path and settings.uses_model else None),
            pairing_note=self.info.note,
            memory=self.memory,
            placement=self.placement,
        )
        if chosen is not None:
            stats.route = f"auto -> {chosen.strategy}: {chosen.reason}"
        stream = self._engine.stream(
            tokens,
            drafter=drafter,
            max_tokens=max_tokens,
            params=params,
            settings=settings,
            stop=stop,
            stats=stats,
            grammar=grammar,
        )
        return self._learning(stream) if settings.uses_model else stream

    def _check_fits(self, n: int, max_tokens: int) -> None:
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

    def _checked_tokens(self, tokens: Any) -> list[int]:
        """``tokens`` as a list of the target's token ids; llama.cpp would refuse an id outside its
        vocabulary only with a decode status that reads like a full context."""
        if isinstance(tokens, (str, bytes)):
            raise SettingsError(
                "stream_tokens takes token ids, got text", hint="use stream()/generate() for a text prompt"
            )
        try:
            ids = [operator.index(t) for t in tokens]
        except TypeError:
            raise SettingsError(
                "tokens must be a list of token ids (whole numbers)",
                hint="use pipe.tokenize(text) to get them, or stream()/generate() with the text",
            ) from None
        if not ids:
            raise SettingsError(
                "tokens is empty: there is nothing to continue", hint="give at least one token"
            )
        n_vocab = self._target.n_vocab
        bad = next((i for i, t in enumerate(ids) if not 0 <= t < n_vocab), None)
        if bad is not None:
            raise SettingsError(
                f"token id {ids[bad]} at position {bad} is outside {self.info.target_path.name}'s vocabulary "
                f"(0 to {n_vocab - 1})",
                hint="tokenize with this pipeline's target (pipe.tokenize(text))",
            )
        return ids

    def _learning(self, stream: Iterator[TokenResponse]) -> Iterator[TokenResponse]:
        """Pass tokens through; remember the draft model's acceptance and the speed its adaptive controller
        predicted, for the ``auto`` router."""
        last = None
        try:
            for last in stream:
                yield last
        finally:
            if last is not None:
                drafted = last.stats.drafted_by_source.get("model", 0)
                if drafted >= 8:
                    rate = last.stats.accepted_by_source.get("model", 0) / drafted
                    self._model_acceptance = _blend(self._model_acceptance, rate)
                    if last.stats.predicted_speedup is not None:
                        self._model_speed = _blend(self._model_speed, last.stats.predicted_speedup)

    def tokenize(self, text: str) -> list[int]:
        """The target's tokens of a plain prompt (its BOS first, as llama.cpp adds it)."""
        return self._target.tokenize(_checked_text(text, "prompt"), add_bos=True, special=True)

    def stream(self, prompt: str, **kwargs) -> Iterator[TokenResponse]:
        """Stream a plain completion of ``prompt``."""
        return self.stream_tokens(self.tokenize(prompt), **kwargs)

    def generate(self, prompt: str, **kwargs) -> GenerationResult:
        return _collect(self.stream(prompt, **kwargs))

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
        """A whole reply to ``messages``; with ``tools``, ``result.tool_calls`` holds the calls it made
        (OpenAI's shape: ``id``, ``type``, ``function.name``, ``function.arguments`` as a JSON string) and
        ``result.content`` the text outside them (the result itself is the text as the model wrote it).
        ``response_format={"type": "json_object"}`` (or ``json_schema``) makes the reply that JSON."""
        stream, use = self._chat_reply(messages, tools, tool_choice, response_format, kwargs)
        result = _collect(stream)
        result.content, result.tool_calls = use.split(result.text)
        return result

    def _chat_reply(
        self, messages: list[dict], tools: Any, tool_choice: Any, response_format: Any, kwargs: dict
    ) -> tuple[Iterator[TokenResponse], ToolUse]:
        use = tool_use(tools, tool_choice, self.chat_template)
        # never both: response_format is refused where calls are read
        grammar = reply_grammar(response_format, reads_calls=use.read_calls) or use.grammar
        if grammar is not None:
            if kwargs.get("grammar") is not None:
                raise GrammarError(
                    "a grammar cannot be given with response_format or tools (they bring their own)",
                    param="grammar",
                    hint="drop one",
                )
            kwargs["grammar"] = grammar
        messages = chat_messages(messages)  # checked; earlier calls' arguments as objects, as templates want
        tokens, stops = self.format_chat(messages, tools=use.tools)
        kwargs["stop"] = list(kwargs.get("stop") or []) + stops
        return self.stream_tokens(tokens, **kwargs), use

    def format_chat(
        self, messages: list[dict], *, tools: list[dict] | None = None, reply_prefix: str = ""
    ) -> tuple[list[int], list[str]]:
        """``messages`` rendered with the target's own chat template: (prompt tokens, stop strings).

        ``tools`` (OpenAI's shape, checked by :func:`localspec.pipeline.tool_calls.check_tools`) are
        rendered by the
        template too; ``reply_prefix`` is the start of the assistant's reply, written after the
        template's generation prompt as the caller's text (what ``tool_choice`` forces, see
        :func:`localspec.pipeline.tool_calls.reply_prefix`)."""
        from llama_cpp.llama_chat_format import Jinja2ChatFormatter

        template = self.chat_template
        if not template:
            raise LocalspecError(
                f"{self.info.target_path.name} has no chat template in its metadata",
                hint="use generate()/stream() with a plain prompt instead of chat()",
            )
        if self._chat is None:
            llama = self._target.llama
            bos = llama._model.token_get_text(llama.token_bos()) if llama.token_bos() >= 0 else ""
            eos = llama._model.token_get_text(llama.token_eos()) if llama.token_eos() >= 0 else ""
            target = self._target
            chat_tok = ChatTokenizer(target.vocab, lambda s: target.tokenize(s, add_bos=False, special=False))
            self._chat = (Jinja2ChatFormatter(template=template, eos_token=eos, bos_token=bos), bos, chat_tok)
        formatter, bos, chat_tok = self._chat
        payload = {"messages": messages, "tools": tools or None}
        # The template's own text only becomes control tokens: "<|im_start|>" typed in a message (or a tool's
        # description) stays text.
        render = lambda p: formatter(messages=p["messages"], tools=p["tools"]).prompt  # noqa: E731
        prompt = render(payload)
        segments = chat_segments(prompt, render, payload, chat_tok.control_texts)
        if reply_prefix:
            segments = [*segments, (reply_prefix, False)]
        add_bos = not (bos and prompt.startswith(bos))
        tokens = chat_tok.tokenize(segments, add_special=add_bos)
        return tokens, [formatter.eos_token] if formatter.eos_token else []

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
        low, high = REPEATS_RANGE
        if isinstance(repeats, bool) or not isinstance(repeats, int) or not low <= repeats <= high:
            raise SettingsError(
                f"repeats must be a whole number from {low} to {high}, got {repeats!r:.40}",
                hint="e.g. repeats=3 (each repeat runs both sides once more)",
            )
        kwargs.pop("baseline", None)
        strategy = kwargs.get("strategy")
        if (strategy if strategy is not None else self.settings.strategy) == "none":
            raise SettingsError(
                "nothing to compare: this runs the target alone, which is the other side already",
                hint="load a draft, or pass strategy='ngram' (or 'suffix') to compare prompt lookup",
            )
        max_tokens = kwargs.get("max_tokens", constants.DEFAULT_MAX_TOKENS)
        counted = isinstance(max_tokens, int) and not isinstance(max_tokens, bool)  # (else the run says)
        if counted:
            self._check_fits(len(self.tokenize(prompt)), max_tokens)  # the request's, not the warm-up's
        if warmup:
            short = {**kwargs, "max_tokens": min(8, max_tokens) if counted else max_tokens}
            self.generate(prompt, baseline=True, **short)
            self.generate(prompt, **short)
        base_runs, spec_runs = [], []
        for _ in range(repeats):
            base_runs.append(self.generate(prompt, baseline=True, **kwargs))
            spec_runs.append(self.generate(prompt, **kwargs))
        b_tps = [r.stats.tokens_per_second for r in base_runs]
        s_tps = [r.stats.tokens_per_second for r in spec_runs]
        speedup = statistics.median(s_tps) / statistics.median(b_tps) if statistics.median(b_tps) else 0.0
        spec = spec_runs[-1]
        spec.stats.speedup = speedup
        return Comparison(
            baseline=base_runs[-1],
            speculative=spec,
            speedup=speedup,
            baseline_tps=b_tps,
            speculative_tps=s_tps,
            same_text=str(base_runs[-1]) == str(spec),
        )


def _checked_stop(stop: Any) -> list[str] | None:
    """``stop`` as a list of strings: one string is one stop string, as in OpenAI's API (iterated, it
    would stop at each of its characters)."""
    if stop is None or isinstance(stop, str):
        return None if stop is None else [stop]
    if isinstance(stop, (list, tuple)) and all(isinstance(s, str) for s in stop):
        return list(stop)
    raise SettingsError(
        f"stop must be a string or a list of strings, got {stop!r:.60}", hint='e.g. stop=["\\n\\n"]'
    )


def _checked_text(text: Any, what: str) -> str:
    """``text`` when it is a ``str`` llama.cpp's tokenizer takes (:func:`localspec.settings.utf8_problem`)."""
    if not isinstance(text, str):
        hint = "decode it first (text.decode('utf-8'))" if isinstance(text, bytes) else "pass a str"
        if isinstance(text, (list, tuple)):
            hint = "pass one str; for token ids use stream_tokens()"
        raise SettingsError(f"the {what} must be text (a str), got {type(text).__name__}", hint=hint)
    if problem := utf8_problem(text):
        raise SettingsError(f"the {what} {problem}", hint=UTF8_HINT)
    return text


def _collect(stream: Iterator[TokenResponse]) -> GenerationResult:
    parts, tokens, flags, sources = [], [], [], []
    stats = None
    for r in stream:
        parts.append(r.text)
        tokens.append(r.token)
        flags.append(r.from_draft)
        sources.append(r.source)
        stats = r.stats
    if stats is None:  # pragma: no cover - the engine always yields at least one token
        stats = GenerationStats()
    return GenerationResult("".join(parts), stats, tokens, flags, parts, sources)


# Resolution -----------------------------------------------------------------------------------
def _check_file(path: str | os.PathLike, role: str) -> Path:
    """``path`` when it names a regular file; else what it is instead (``Path.is_file`` says False for a
    folder or a symlink loop, and raises for a name too long for the file system)."""
    p = Path(path).expanduser()
    scan_hint = "check the path, or run `localspec scan` to list the GGUF models on this machine"
    try:
        mode = p.stat().st_mode
    except OSError as exc:
        problem = {
            errno.ENOENT: "no such file",
            errno.ENOTDIR: "no such file (a part of the path is not a folder)",
            errno.ELOOP: "is a symlink loop (a link that points back to itself)",
            errno.ENAMETOOLONG: "the path is too long for this file system",
        }.get(exc.errno or 0, f"cannot be read ({exc.strerror or exc})")
        raise ModelNotFoundError(f"{role} model {_short(p)}: {problem}", hint=scan_hint) from None
    if stat.S_ISDIR(mode):
        raise ModelNotFoundError(
            f"{role} model {_short(p)} is a folder, not a GGUF file",
            hint=f"give the .gguf file inside it (`localspec scan {_short(p)}` lists them)",
        )
    if not stat.S_ISREG(mode):
        raise ModelNotFoundError(
            f"{role} model {_short(p)} is not a regular file (a FIFO, socket or device)", hint=scan_hint
        )
    return p


def _short(p: Path) -> str:
    """A path for a message: a very long one shortened in the middle."""
    text = str(p)
    return text if len(text) <= 200 else f"{text[:90]}...{text[-90:]}"


def _auto_draft(target: Path) -> tuple[Path | None, str]:
    """The best compatible draft the scanner finds for ``target``, or None, with the reason."""
    if target.resolve() == constants.EMBEDDED_TARGET.resolve():
        return constants.EMBEDDED_DRAFT, "embedded pair: its own draft"
    try:
        from localspec.gguf.scan import find_drafts

        ranked = [r for r in find_drafts(target) if r.fits]
    except (LocalspecError, OSError) as exc:
        return None, f"automatic pairing failed ({exc}); running the target alone"
    if not ranked:
        folders = [str(d) for d in constants.default_scan_dirs()] + [f"{target.parent} (the target's)"]
        return None, (
            f"no compatible draft found in {', '.join(folders)}; running the target alone: "
            "n-gram lookup needs no draft model (--draft ngram, or draft='ngram' in Python)"
        )
    best = ranked[0]
    return Path(best.model.path), f"automatic pairing picked {Path(best.model.path).name}: {best.why}"


def _preset_settings(ds: object) -> DraftSettings:
    """A preset's ``[draft]`` table as :class:`DraftSettings` (same field names), validated."""
    if isinstance(ds, DraftSettings):
        return ds
    return DraftSettings(
        **{f.name: getattr(ds, f.name) for f in fields(DraftSettings) if hasattr(ds, f.name)}
    )


def load(
    target: str | os.PathLike | None = None,
    draft: str | os.PathLike | None = None,
    preset: str | None = None,
    *,
    n_ctx: int | None = None,
    n_threads: int | None = None,
    n_gpu_layers: int | None = None,
    draft_n_threads: int | None = None,
    draft_n_gpu_layers: int | None = None,
    strategy: str | None = None,
    n_max: int | None = None,
    n_min: int | None = None,
    p_min: float | None = None,
    adaptive: bool | None = None,
    progress: Callable[[str, int, int], None] | None = None,
    suffix_store: bool = True,
    corpus: str | os.PathLike | None = None,
    store_namespace: str = "default",
) -> Pipeline:
    """Load a target and a draft (or a model-free drafter) into a reusable :class:`Pipeline`.

    ``suffix_store`` (the ``suffix``/``model+suffix``/``auto`` strategies): keep what earlier requests
    wrote in a store on disk (per target vocabulary and ``store_namespace``, mode 0600) so a new process
    drafts from it too; False keeps it in memory for this pipeline only. ``corpus``: a folder whose text
    files the suffix cache drafts from (tokenized once at the first suffix generation).

    The draft settings come from the preset (its ``[draft]`` table, strategy included), then ``draft``
    (``"ngram"`` or ``"none"`` name a strategy; ``"auto"`` is the same as None: the preset's draft, else
    automatic pairing), then the explicit arguments, each overriding the one before. A draft model is loaded
    only when the resulting strategy uses it. ``n_gpu_layers`` None: all layers on a GPU when llama.cpp can
    offload, else the CPU.
    """
    settings = DraftSettings()
    note = ""
    for name, value in (("target", target), ("draft", draft), ("preset", preset)):
        if isinstance(value, str) and not value.strip():  # Path("") is ".", the current folder
            raise SettingsError(
                f"{name} is an empty string",
                hint="give a path" + (", 'ngram', 'none' or 'auto'" if name == "draft" else "")
                if name != "preset"
                else "give a preset name (`localspec presets` lists them)",
            )
    if preset is None and target is None:  # the embedded pair, with its preset's draft settings
        preset = constants.EMBEDDED_PRESET
    preset_draft: Path | None = None
    if preset is not None:
        if target is not None:
            raise ValueError("give either preset= or target=, not both")
        from localspec.hub.download import ensure_preset

        pair = ensure_preset(preset, progress=progress, check=False)  # checked once, below
        settings = _preset_settings(pair.preset.draft)
        if settings.uses_model and pair.draft is None:  # a preset without a draft model cannot use one
            settings = settings.with_overrides(strategy="ngram" if "ngram" in settings.strategy else "none")
        target_path = Path(pair.target)
        preset_draft = pair.draft
        if n_ctx is None:
            n_ctx = pair.preset.n_ctx
        note = "embedded default pair" if preset == constants.EMBEDDED_PRESET else f"preset {preset}"
    else:
        assert target is not None
        target_path = _check_file(target, "target")
    if not target_path.is_file():
        raise ModelNotFoundError(
            f"target model {target_path}: no such file",
            hint="reinstall localspec, or name a model with target=PATH",
        )

    draft_path: Path | None = None
    if draft is not None and str(draft) == "auto":  # the word every command's --draft takes
        draft = None
    if draft is not None and str(draft) in ("none", "ngram"):
        settings = settings.with_overrides(strategy=str(draft))
        note = note or ("target alone" if draft == "none" else "n-gram prompt lookup, no draft model")
    elif draft is not None:
        draft_path = _check_file(draft, "draft")
        if not settings.may_use_model:
            settings = settings.with_overrides(strategy="model")
        note = note or f"draft {draft_path.name}"
    elif preset is not None:
        draft_path = preset_draft
    elif (strategy or settings.strategy) in (*MODEL_STRATEGIES, "auto"):  # auto may choose the model
        draft_path, note = _auto_draft(target_path)
        if draft_path is None and strategy is None:
            settings = settings.with_overrides(strategy="none")
    if n_max is None and strategy in SUFFIX_STRATEGIES and not settings.uses_suffix:
        n_max = LOOKUP_N_MAX  # the suffix cache sizes its own drafts; n_max only bounds one pass
    settings = settings.with_overrides(
        strategy=strategy, n_max=n_max, n_min=n_min, p_min=p_min, adaptive=adaptive
    )
    if not settings.may_use_model and draft_path is not None:
        note += f" (strategy {settings.strategy}: draft model not loaded)"
        draft_path = None  # a strategy without the draft model must not pay for loading it
    if not note:
        note = (
            "target alone" if not settings.is_speculative else f"strategy {settings.strategy}, no draft model"
        )

    info = check_pair(target_path, draft_path, label=f"preset '{preset}'" if preset else "")
    info.note = note + "".join(f"; warning: {w}" for w in info.warnings)  # (a swapped pair, say)
    return Pipeline(
        info,
        n_ctx=constants.DEFAULT_N_CTX if n_ctx is None else n_ctx,
        n_threads=n_threads,
        n_gpu_layers=n_gpu_layers,
        draft_n_threads=draft_n_threads,
        draft_n_gpu_layers=draft_n_gpu_layers,
        settings=settings,
        suffix_store=suffix_store,
        corpus=corpus,
        store_namespace=store_namespace,
    )


_LOAD_KEYS = {
    "n_ctx",
    "n_threads",
    "n_gpu_layers",
    "draft_n_threads",
    "draft_n_gpu_layers",
    "progress",
    "suffix_store",
    "corpus",
    "store_namespace",
}
_CACHE: dict[tuple, Pipeline] = {}


def generate(
    prompt: str,
    *,
    target: str | os.PathLike | None = None,
    draft: str | os.PathLike | None = None,
    preset: str | None = None,
    max_tokens: int = constants.DEFAULT_MAX_TOKENS,
    temperature: float = 0.0,
    **opts,
) -> GenerationResult:
    """Generate text in one line. The loaded pipeline is kept for the next call with the same models."""
    load_kw = {k: opts.pop(k) for k in list(opts) if k in _LOAD_KEYS}
    key = (str(target), str(draft), preset, tuple(sorted((k, str(v)) for k, v in load_kw.items())))
    pipe = _CACHE.get(key)
    if pipe is None or pipe.closed:  # (a caller may have closed the one it was handed)
        for old in _CACHE.values():  # one pair in memory at a time
            old.close()
        _CACHE.clear()
        pipe = load(target, draft, preset, **load_kw)
        _CACHE[key] = pipe
    return pipe.generate(prompt, max_tokens=max_tokens, temperature=temperature, **opts)


def _blend(old: float | None, new: float) -> float:
    """The running value the ``auto`` router reads: the newest measurement weighs half."""
    return new if old is None else 0.5 * old + 0.5 * new
