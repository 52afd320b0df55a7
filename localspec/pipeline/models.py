"""The models a :class:`~localspec.pipeline.pipeline.Pipeline` loads: the target (with its MTP layers where
they may draft), the draft model, and what each costs in memory."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from localspec import constants
from localspec.decoding.stats import MemoryReport, available_bytes, rss_bytes
from localspec.errors import LocalspecError, SettingsError
from localspec.gguf.meta import read_metadata
from localspec.gguf.pairing import PairInfo
from localspec.gguf.sizes import kv_bytes_per_sequence
from localspec.gguf.vocab import mtp_layers, mtp_weights_bytes
from localspec.llama.loading import (
    check_load_settings,
    check_sequences,
    default_gpu_layers,
    supports_gpu_offload,
)
from localspec.llama.prompt_cache import PromptCache
from localspec.llama.recurrent import MAX_SNAPSHOTS
from localspec.llama.rpc import Endpoint, parse_endpoints
from localspec.llama.runtime import Model
from localspec.settings import DraftSettings
from localspec.units import format_bytes

#: The most generations :func:`choose_parallel` runs at once: past four, a CPU's pass grows with every row,
#: and a GPU user sets ``parallel`` for their card.
DEFAULT_PARALLEL = 4


@dataclass(frozen=True)
class LoadFacts:
    """What a pipeline's measured costs depend on besides the files: the target's CPU threads, and the
    layers of the target and of the draft on a GPU (or, for the target, on rpc-servers)."""

    threads: int
    gpu_layers: int
    draft_gpu_layers: int


@dataclass(frozen=True)
class LoadedModels:
    """A pipeline's models: the target, the draft model (None: none, or an MTP assistant, which drafts as
    the target's MTP layers), their memory, what their measured costs depend on, and the ``n_ctx`` asked for
    when it was lowered to the target's trained context (else None)."""

    target: Model
    draft: Model | None
    memory: MemoryReport
    facts: LoadFacts
    n_ctx_asked: int | None
    parallel: int = 1  # the sequences each model holds
    parallel_reason: str = "asked for"  # why that many


def use_prompt_caches(models: LoadedModels, mb: float) -> None:
    """Give the models prompt caches (:mod:`localspec.llama.prompt_cache`) sharing ``mb`` MB (10^6 bytes) of
    host memory, each its share by the bytes its KV cache holds (0: none). Not where a head drafts from the
    target's rows (MTP layers, a drafter file): the head's own cache would not follow a copied state."""
    if mb <= 0 or models.target.mtp is not None:
        return
    loaded = [m for m in (models.target, models.draft) if m is not None]
    sizes = [max(1, m.kv_bytes()) for m in loaded]
    for m, size in zip(loaded, sizes, strict=True):
        m.prompt_cache = PromptCache(int(mb * 1e6 * size / sum(sizes)))


def load_models(
    info: PairInfo,
    settings: DraftSettings,
    *,
    n_ctx: int,
    n_threads: int | None,
    n_gpu_layers: int | None,
    draft_n_threads: int | None,
    draft_n_gpu_layers: int | None,
    rpc: str | Sequence[str] | None,
    tensor_split: Sequence[float] | None,
    parallel: int | None = 1,
) -> LoadedModels:
    """Check the load settings, then load the target and the draft model (a failure after the target
    loaded closes it). The arguments are :class:`~localspec.pipeline.pipeline.Pipeline`'s.

    Args:
        info: the checked pair.
        settings: what the pipeline runs (an MTP strategy, or ``auto`` on a file with MTP layers, loads them;
            ``n_max`` sizes a recurrent target's snapshots and is checked against one verify pass).
        n_ctx: the context of each model, lowered to the target's trained context when it asks for more.
        n_threads: the target's CPU threads (None: this machine's default).
        n_gpu_layers: the target's layers on a GPU or the rpc-servers (None: all where they can go).
        draft_n_threads: the draft's CPU threads (None: the target's).
        draft_n_gpu_layers: the draft's layers on a GPU (None: all when llama.cpp can offload).
        rpc: rpc-servers that hold the target's layers.
        tensor_split: each RPC device's share of those layers.
        parallel: the sequences each model holds (generations at once); None: :func:`choose_parallel`.

    Returns:
        The loaded models, their memory and what their costs depend on.
    """
    servers = parse_endpoints(rpc) if rpc else []  # the target's layers there (llama/rpc.py)
    if servers and info.assistant:  # its attention would read a KV cache held on other machines
        name = info.draft_path.name if info.draft_path else "the draft"
        raise SettingsError(
            f"{name} is an MTP assistant, which reads the target's KV cache: localspec runs it only with "
            "the target on this machine",
            hint="run without --rpc, or with the target on rpc-servers draft with ngram or a draft model",
        )
    threads = constants.default_threads() if n_threads is None else n_threads
    check_load_settings(n_ctx=n_ctx, n_threads=threads, n_gpu_layers=n_gpu_layers or 0, what="target")
    # Beyond its trained context a model writes garbage, and a huge n_ctx would allocate its KV cache
    # before anything failed: lower it to what the header says, before loading.
    asked = None
    if info.n_ctx_train and n_ctx > info.n_ctx_train:
        asked, n_ctx = n_ctx, info.n_ctx_train
    parallel, reason = _sequences(info, settings, n_ctx, parallel)
    offload = supports_gpu_offload()
    facts = LoadFacts(
        threads,
        default_gpu_layers(n_gpu_layers, offload=offload or bool(servers)),  # over RPC: all layers
        default_gpu_layers(draft_n_gpu_layers, offload=offload) if info.draft_path else 0,
    )
    mem = MemoryReport(rss_baseline_bytes=rss_bytes())
    # a recurrent or hybrid model keeps state snapshots for a draft this long (longer: checkpoints)
    depth = min(settings.n_max, MAX_SNAPSHOTS) if settings.is_speculative else 0
    target = _load_target(info, settings, facts, n_ctx, servers, tensor_split, depth, mem, parallel)
    try:
        _check_n_max(settings, target, n_ctx)
        if info.draft_path is None or info.assistant:  # an assistant drafts as MTP layers
            return LoadedModels(target, None, mem, facts, asked, parallel, reason)
        draft = Model(
            info.draft_path,
            n_ctx=n_ctx,
            n_threads=threads if draft_n_threads is None else draft_n_threads,
            n_gpu_layers=default_gpu_layers(draft_n_gpu_layers, offload=offload),
            rollback_depth=depth,
            n_seq=parallel,
        )
    except BaseException:
        target.close()
        raise
    mem.rss_after_draft_bytes = rss_bytes()
    mem.draft_weights_bytes += draft.weights_bytes  # on top of MTP layers loaded for ``auto``
    mem.draft_kv_bytes += draft.kv_bytes()
    return LoadedModels(target, draft, mem, facts, asked, parallel, reason)


def _check_n_max(settings: DraftSettings, target: Model, n_ctx: int) -> None:
    """The settings' ``n_max`` within one verify pass of the loaded target, else a :class:`SettingsError`."""
    if settings.is_speculative and settings.n_max > target.max_draft:
        raise SettingsError(
            f"n_max {settings.n_max} is more than one verify pass can check at n_ctx {n_ctx} "
            f"(at most {target.max_draft} drafts: llama.cpp's batch is {target.n_batch})",
            hint=f"use n_max {target.max_draft} or less, or a larger n_ctx",
        )


def _load_target(
    info: PairInfo,
    settings: DraftSettings,
    facts: LoadFacts,
    n_ctx: int,
    servers: list[Endpoint],
    tensor_split: Sequence[float] | None,
    depth: int,
    mem: MemoryReport,
    parallel: int,
) -> Model:
    """The target (with its MTP layers for an MTP strategy, and for ``auto`` when the file has them: it
    weighs them against the draft model), and what it costs in ``mem``."""
    routed = settings.strategy.routed
    # ``auto`` weighs the MTP layers too, when they can draft (for one sequence)
    mtp = settings.uses_mtp or (routed and parallel == 1 and (info.assistant or _file_has_mtp(info)))
    target = Model(
        info.target_path,
        n_ctx=n_ctx,
        n_threads=facts.threads,
        n_gpu_layers=facts.gpu_layers,
        rpc_servers=servers,
        tensor_split=tensor_split,
        rollback_depth=depth,
        mtp=mtp,
        mtp_assistant=info.draft_path if mtp and info.assistant else None,
        n_seq=parallel,
    )
    mem.rss_after_target_bytes = rss_bytes()
    mem.target_weights_bytes = target.weights_bytes
    mem.target_kv_bytes = target.kv_bytes()
    if target.mtp is not None and info.assistant:  # a drafter file: its weights, and its own KV cache
        mem.draft_weights_bytes = target.mtp.weights_bytes
        mem.draft_kv_bytes = target.mtp_bytes()  # 0 for an MTP assistant: it reads the target's
    elif target.mtp is not None:  # the MTP layers are the drafter: their memory is the draft's
        mem.draft_weights_bytes = mtp_weights_bytes(read_metadata(info.target_path))
        mem.target_weights_bytes -= mem.draft_weights_bytes
        mem.draft_kv_bytes = target.mtp_bytes()
    return target


def _file_has_mtp(info: PairInfo) -> bool:
    """Whether the target file carries MTP layers (its header and tensor list)."""
    try:
        return mtp_layers(read_metadata(info.target_path))[1] > 0
    except LocalspecError:
        return False


def _sequences(info: PairInfo, settings: DraftSettings, n_ctx: int, parallel: int | None) -> tuple[int, str]:
    """The sequences each model holds (``parallel``, or chosen when None) and why, checked."""
    mtp = settings.uses_mtp or info.assistant
    reason = "asked for"
    if parallel is None:
        parallel, reason = choose_parallel(info, n_ctx=n_ctx, mtp=mtp)
    check_sequences(parallel, mtp=mtp, what=info.target_path.name)
    check_parallel_fits(info, n_ctx=n_ctx, parallel=parallel)
    return parallel, reason


def choose_parallel(info: PairInfo, *, n_ctx: int, mtp: bool) -> tuple[int, str]:
    """How many generations to run at once when nobody said: :data:`DEFAULT_PARALLEL`, fewer when their KV
    caches do not fit the free memory, one with MTP layers drafting (they draft for one sequence).

    Args:
        info: the pair.
        n_ctx: each sequence's room.
        mtp: whether MTP layers (or an MTP assistant) draft.

    Returns:
        The number and why, for people.
    """
    if mtp:
        return 1, "the MTP layers draft for one request at a time"
    for n in range(DEFAULT_PARALLEL, 1, -1):
        try:
            check_parallel_fits(info, n_ctx=n_ctx, parallel=n)
        except SettingsError:
            continue
        return n, "the default" if n == DEFAULT_PARALLEL else "the most whose KV caches fit the free memory"
    return 1, "one KV cache more does not fit the free memory"


def check_parallel_fits(info: PairInfo, *, n_ctx: int, parallel: int) -> None:
    """Refuse, before anything loads, ``parallel`` sequences whose KV caches (target and draft, ``n_ctx``
    tokens each) do not fit the memory this machine has free beside the weights; the message names the most
    that fit.

    Args:
        info: the pair.
        n_ctx: each sequence's room.
        parallel: the sequences asked for.

    Raises:
        SettingsError: they do not fit.
    """
    if parallel <= 1:
        return
    paths = [p for p in (info.target_path, info.draft_path) if p is not None]
    try:
        per_seq = sum(
            kv_bytes_per_sequence(read_metadata(p, tensors=False, merges=False), n_ctx) for p in paths
        )
    except LocalspecError:
        return  # an unreadable header fails the load itself, with its own message
    free = available_bytes() - sum(p.stat().st_size for p in paths)
    if per_seq <= 0 or per_seq * parallel <= free:
        return
    most = max(0, free // per_seq)
    raise SettingsError(
        f"{parallel} sequences of {n_ctx} tokens need {format_bytes(per_seq * parallel)} of KV cache, and "
        f"this machine has {format_bytes(max(0, free))} free beside the weights",
        hint=f"use parallel {most} or less, or a smaller n_ctx" if most >= 1 else "use a smaller n_ctx",
    )


def for_pair(info: PairInfo, settings: DraftSettings) -> DraftSettings:
    """``settings`` as this pair runs them: with an MTP assistant for the draft, a draft model strategy drafts
    with it as the target's MTP layers (``model+suffix`` runs ``mtp+suffix``)."""
    if info.assistant:
        return settings.with_overrides(strategy=settings.strategy.mtp_counterpart)
    return settings
