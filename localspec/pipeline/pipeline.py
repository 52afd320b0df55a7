"""The :class:`Pipeline`: a loaded target (and draft) that generates, streams, chats and compares.

:func:`localspec.pipeline.loading.load` makes one. Its suffix cache is a
:class:`localspec.suffix.cache.SuffixCache` that it holds and delegates to.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

from localspec import constants
from localspec.constrain.grammar import Grammar, reply_grammar
from localspec.decoding.costs import MachineCosts, machine_costs, stored_costs
from localspec.decoding.drafters import (
    CombinedDrafter,
    Drafter,
    ModelDrafter,
    MtpDrafter,
    NgramDrafter,
)
from localspec.decoding.engine import Engine, TokenResponse
from localspec.decoding.routing import Route, pick_drafter, route
from localspec.decoding.stats import Comparison, GenerationStats, MemoryReport, rss_bytes
from localspec.errors import ContextOverflowError, GrammarError, LocalspecError, SettingsError
from localspec.gguf.meta import read_metadata
from localspec.gguf.pairing import PairInfo
from localspec.gguf.vocab import mtp_layers, mtp_weights_bytes
from localspec.llama.recurrent import MAX_SNAPSHOTS
from localspec.llama.rpc import Endpoint, parse_endpoints
from localspec.llama.runtime import Model, check_load_settings, default_gpu_layers, supports_gpu_offload
from localspec.llama.sampling import SamplingParams
from localspec.pipeline.chat_format import ChatFormat
from localspec.pipeline.chat_turns import chat_messages
from localspec.pipeline.checks import checked_stop, checked_text, checked_tokens
from localspec.pipeline.compare import compare
from localspec.pipeline.results import GenerationResult, collect
from localspec.pipeline.tool_calls import ChatResponse, ToolUse, tool_use
from localspec.settings import (
    LOOKUP_N_MAX,
    SUFFIX_STRATEGIES,
    DraftSettings,
    mtp_counterpart,
)
from localspec.suffix.cache import SuffixCache
from localspec.suffix.calibration import TOKEN_WEIGHT, Cell, TokenCell
from localspec.suffix.drafter import SuffixDrafter
from localspec.suffix.store_files import store_path


def _settings_for(info: PairInfo, settings: DraftSettings | None) -> DraftSettings:
    """A pipeline's settings: the ones given (a draft model strategy only with a draft model), else the draft
    model when the pair has one, else the target alone. With an MTP assistant for the draft, a draft model
    strategy drafts with it as the target's MTP layers (``model+suffix`` runs ``mtp+suffix``)."""
    if settings is None:
        settings = DraftSettings(strategy="model" if info.draft_path is not None else "none")
    if info.assistant:
        settings = settings.with_overrides(strategy=mtp_counterpart(settings.strategy))
    if settings.uses_model and info.draft_path is None:
        raise SettingsError(
            f"strategy {settings.strategy!r} needs a draft model, and none was given",
            hint="give a draft model (draft=PATH; on the command line --draft PATH) or a preset with "
            "one, or use strategy 'suffix' or 'ngram'",
        )
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
    ) -> None:
        self.info = info
        servers = parse_endpoints(rpc) if rpc else []  # the target's layers there (llama/rpc.py)
        if servers and info.assistant:  # its attention would read a KV cache held on other machines
            name = info.draft_path.name if info.draft_path else "the draft"
            raise SettingsError(
                f"{name} is an MTP assistant, which reads the target's KV cache: localspec runs it only with "
                "the target on this machine",
                hint="run without --rpc, or with the target on rpc-servers draft with ngram or a draft model",
            )
        store_path(".", "0" * 16, store_namespace)  # a namespace no file can be named by: refused now
        corpus_folder = Path(corpus).expanduser() if corpus else None
        self._costs: MachineCosts | None = None
        # per model drafter ("model", "mtp"): the acceptance generations that ran it measured, and the speed
        # its adaptive controller predicted, for ``auto``
        self._acceptance: dict[str, float | None] = {"model": None, "mtp": None}
        self._speed: dict[str, float | None] = {"model": None, "mtp": None}
        self.route: Route | None = None  # the last "auto" decision and its reason
        #: told (a line of text) before a one-time wait: measuring this machine's costs (the CLI prints it)
        self.notify: Callable[[str], None] | None = None
        self.settings = settings = _settings_for(info, settings)
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
            default_gpu_layers(n_gpu_layers, offload=offload or bool(servers)),  # over RPC: all layers
            default_gpu_layers(draft_n_gpu_layers, offload=offload) if info.draft_path else 0,
        )
        mem = MemoryReport(rss_baseline_bytes=rss_bytes())
        # a recurrent or hybrid model keeps state snapshots for a draft this long (longer: checkpoints)
        depth = min(settings.n_max, MAX_SNAPSHOTS) if settings.is_speculative else 0
        self._target = self._load_target(n_ctx, servers, tensor_split, depth, mem)
        self._draft: Model | None = self._load_draft(
            n_ctx, draft_n_threads, draft_n_gpu_layers, offload, depth, mem
        )
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
        self._chat: ChatFormat | None = None
        self._suffix = SuffixCache(
            self._target,
            info.target_path,
            verify_cost=self._verify_cost,
            persist=suffix_store,
            corpus=corpus_folder,
            namespace=store_namespace,
        )

    def _load_target(
        self,
        n_ctx: int,
        servers: list[Endpoint],
        tensor_split: Sequence[float] | None,
        depth: int,
        mem: MemoryReport,
    ) -> Model:
        """The target (with its MTP layers for an MTP strategy, and for ``auto`` when the file has them: it
        weighs them against the draft model), and what it costs in ``mem``."""
        threads, gpu_layers, _ = self._load_facts
        info = self.info
        routed = self.settings.kind.routed
        mtp = self.settings.uses_mtp or (routed and (info.assistant or self._file_has_mtp()))
        target = Model(
            self.info.target_path,
            n_ctx=n_ctx,
            n_threads=threads,
            n_gpu_layers=gpu_layers,
            rpc_servers=servers,
            tensor_split=tensor_split,
            rollback_depth=depth,
            mtp=mtp,
            mtp_assistant=info.draft_path if mtp and info.assistant else None,
        )
        mem.rss_after_target_bytes = rss_bytes()
        mem.target_weights_bytes = target.weights_bytes
        mem.target_kv_bytes = target.kv_bytes()
        if target.mtp is not None and info.assistant:  # its weights only: it reads the target's KV cache
            mem.draft_weights_bytes = target.mtp.weights_bytes
        elif target.mtp is not None:  # the MTP layers are the drafter: their memory is the draft's
            mem.draft_weights_bytes = mtp_weights_bytes(read_metadata(self.info.target_path))
            mem.target_weights_bytes -= mem.draft_weights_bytes
            mem.draft_kv_bytes = target.mtp_bytes()
        return target

    def _file_has_mtp(self) -> bool:
        """Whether the target file carries MTP layers (its header and tensor list)."""
        try:
            return mtp_layers(read_metadata(self.info.target_path))[1] > 0
        except LocalspecError:
            return False

    def _load_draft(
        self,
        n_ctx: int,
        draft_n_threads: int | None,
        draft_n_gpu_layers: int | None,
        offload: bool,
        depth: int,
        mem: MemoryReport,
    ) -> Model | None:
        """The draft model, if the pair has one, and what it costs in ``mem``; first, the settings' n_max
        checked against one verify pass of the loaded target. A failure closes the target."""
        settings, target = self.settings, self._target
        try:
            if settings.is_speculative and settings.n_max > target.max_draft:
                raise SettingsError(
                    f"n_max {settings.n_max} is more than one verify pass can check at n_ctx {n_ctx} "
                    f"(at most {target.max_draft} drafts: llama.cpp's batch is {target.n_batch})",
                    hint=f"use n_max {target.max_draft} or less, or a larger n_ctx",
                )
            if self.info.draft_path is None or self.info.assistant:  # an assistant drafts as MTP layers
                return None
            draft = Model(
                self.info.draft_path,
                n_ctx=n_ctx,
                n_threads=self._load_facts[0] if draft_n_threads is None else draft_n_threads,
                n_gpu_layers=default_gpu_layers(draft_n_gpu_layers, offload=offload),
                rollback_depth=depth,
            )
            mem.rss_after_draft_bytes = rss_bytes()
            mem.draft_weights_bytes += draft.weights_bytes  # on top of MTP layers loaded for ``auto``
            mem.draft_kv_bytes += draft.kv_bytes()
            return draft
        except BaseException:
            target.close()
            raise

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
        if not s.uses_mtp:  # the target's passes need not feed its MTP layers
            self._target.follow_mtp(False)
        if not s.is_speculative:
            return None
        lookup: Drafter = self.suffix_drafter() if s.uses_suffix else NgramDrafter()
        if s.uses_mtp:
            mtp = self._mtp_drafter(s)
            return CombinedDrafter(mtp, lookup) if s.kind.combined else mtp
        if not s.uses_model:
            return lookup
        if self._model_drafter is None:
            raise LocalspecError(
                f"strategy {s.strategy!r} needs a draft model, and this pipeline has none",
                hint="load with a draft model (draft=PATH; on the command line --draft PATH) or a preset "
                "with one, or use strategy 'suffix' or 'ngram'",
            )
        model = self._model_drafter.with_limits(n_min=s.n_min, p_min=s.p_min)
        return CombinedDrafter(model, lookup) if s.kind.combined else model

    def _mtp_drafter(self, s: DraftSettings) -> MtpDrafter:
        """The target's MTP layers as the drafter of strategy ``s`` (loaded with the target for an MTP
        strategy)."""
        if self._target.mtp is None:
            raise LocalspecError(
                f"strategy {s.strategy!r} drafts with the target's MTP layers, and this pipeline was loaded "
                "without them",
                hint="load with strategy='mtp' (on the command line --strategy mtp) to load them",
            )
        return MtpDrafter(self._target, n_min=s.n_min, p_min=s.p_min)

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
        machine's costs (:meth:`machine_costs`, which takes seconds on a CPU): the suffix
        cache and ``auto`` need them, and they are neither loaded nor stored yet. A caller that shows
        progress (the web UI) says so and calls :meth:`machine_costs` itself first."""
        if (strategy or self.settings.strategy) not in SUFFIX_STRATEGIES or self._costs is not None:
            return False
        threads, gpu, draft_gpu = self._load_facts
        found = stored_costs(
            self._target, self._draft, threads=threads, gpu_layers=gpu, draft_gpu_layers=draft_gpu
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
        """``auto``: suffix alone, or a model drafter (adaptive) with the suffix cache, for this request: the
        draft model and the target's MTP layers, whichever are loaded, weighed by what they measured."""
        here = {"model": self._model_drafter is not None, "mtp": self._target.mtp is not None}
        loaded = {d: self._speed[d] for d, there in here.items() if there}
        overlap = self.suffix_drafter().overlap(tokens)

        def weigh(drafter: str) -> Route:
            return route(
                has_model=bool(loaded),
                costs=self.machine_costs() if drafter == "model" and loaded else None,
                model_acceptance=self._acceptance["model"],
                n_max=min(s.n_max, 8),
                overlap=overlap,
                measured_speed=self._speed[drafter],
                drafter=drafter,
            )

        if len(loaded) < 2:
            r = weigh(next(iter(loaded), "model"))
        else:  # both: each runs once to be measured (the draft model first, if the costs say it may pay)
            first = weigh("model") if loaded["model"] is None else None
            if (
                first is not None and first.strategy == "suffix"
            ):  # it would not pay: weighed by that prediction
                loaded["model"] = first.model_speed
            drafter, others = pick_drafter(loaded)
            r = weigh(drafter)
            r = dataclasses.replace(r, reason=f"{r.reason} ({others})")
        adaptive = True if r.strategy in ("model+suffix", "mtp+suffix") else s.adaptive
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
        params = SamplingParams(temperature, top_k, top_p, min_p, seed)
        tokens, stop = self._checked_call(tokens, max_tokens, stop, grammar, params)
        settings, chosen = self._call_settings(
            tokens, strategy, baseline, n_max=n_max, n_min=n_min, p_min=p_min, adaptive=adaptive
        )
        drafter = self._drafter(settings)
        stream = self._engine.stream(
            tokens,
            drafter=drafter,
            max_tokens=max_tokens,
            params=params,
            settings=settings,
            stop=stop,
            stats=self._new_stats(settings, chosen),
            grammar=grammar,
        )
        if settings.uses_model or settings.uses_mtp:
            return self._learning(stream, "mtp" if settings.uses_mtp else "model")
        return stream

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
        if grammar is not None and not isinstance(grammar, Grammar):
            raise SettingsError(
                f"grammar must be a localspec.Grammar, got {type(grammar).__name__}",
                hint="e.g. Grammar.json_object(), Grammar.json_schema({...}) or Grammar.gbnf(text)",
            )
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
            raise SettingsError(
                f"max_tokens must be a whole number >= 1, got {max_tokens!r}", hint="e.g. 256"
            )
        tokens = checked_tokens(tokens, self._target.n_vocab, self.info.target_path.name)
        stop = checked_stop(stop)
        self.check_fits(len(tokens), max_tokens)
        params.validate()
        return tokens, stop

    def _call_settings(
        self, tokens: list[int], strategy: str | None, baseline: bool, *, n_max: int | None, **overrides: Any
    ) -> tuple[DraftSettings, Route | None]:
        """The settings one call runs: the pipeline's with the call's overrides, and ``auto`` resolved to a
        strategy for this request (with its :class:`Route`; None when a strategy was named)."""
        if strategy is not None and n_max is None and strategy in SUFFIX_STRATEGIES:
            if not self.settings.uses_suffix:  # switching to the suffix cache: it sizes its own drafts
                n_max = min(LOOKUP_N_MAX, self.max_draft)
        if strategy is not None and self.info.assistant:  # the assistant drafts as MTP layers
            strategy = mtp_counterpart(strategy)
        settings = self.settings.with_overrides(
            strategy="none" if baseline else strategy, n_max=n_max, **overrides
        )
        if settings.strategy != "auto":
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

    def _learning(self, stream: Iterator[TokenResponse], drafter: str) -> Iterator[TokenResponse]:
        """Pass tokens through; remember ``drafter``'s (``"model"`` or ``"mtp"``) acceptance and the speed
        its adaptive controller predicted, for the ``auto`` router."""
        last = None
        try:
            for last in stream:
                yield last
        finally:
            if last is not None:
                drafted = last.stats.drafted_by_source.get(drafter, 0)
                if drafted >= 8:
                    rate = last.stats.accepted_by_source.get(drafter, 0) / drafted
                    self._acceptance[drafter] = _blend(self._acceptance[drafter], rate)
                # kept even from a few drafts: a controller that stopped drafting early measured why, and
                # ``auto`` then moves on to the other drafter instead of trying this one again
                if last.stats.predicted_speedup is not None:
                    self._speed[drafter] = _blend(self._speed[drafter], last.stats.predicted_speedup)

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


def _blend(old: float | None, new: float) -> float:
    """The running value the ``auto`` router reads: the newest measurement weighs half."""
    return new if old is None else 0.5 * old + 0.5 * new
