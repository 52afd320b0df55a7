"""Benchmark runs: interleaved baseline/speculative runs of the workloads on one pipeline (and llama.cpp's).

Runs work on plain stats dicts (``GenerationStats.as_dict()``) produced by a *runner*: a callable
``runner(prompt, settings, max_tokens) -> dict``. :func:`engine_runner` makes one from a localspec pipeline;
the llama.cpp peer (``localspec.bench.peer``) produces the same dicts from llama-server. The vocabulary
(prompts,
workloads, their files) lives in ``localspec.bench.workloads``, the decoding settings in
``localspec.settings``, the
arithmetic in ``localspec.bench.arithmetic``, the tuner in ``localspec.bench.tune``, the report files in
``localspec.bench.report``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from localspec import constants
from localspec.bench import peer as peer_mod
from localspec.bench.arithmetic import interleaved_order, summarise
from localspec.bench.report import BenchReport, PeerResult, machine_info
from localspec.bench.workloads import (
    LLAMA_CPP,
    LOCALSPEC,
    Prompt,
    Runner,
    RunRecord,
    Workload,
    load_workloads,
)
from localspec.errors import BenchError
from localspec.llama import programs
from localspec.settings import BASELINE, MTP_STRATEGIES, DraftSettings, parse_strategy

if TYPE_CHECKING:
    from localspec.pipeline.pipeline import Pipeline

# ---------------------------------------------------------------------------------------------- running


def plan_configs(configs: Sequence[DraftSettings], baseline_every: int = 0) -> list[DraftSettings]:
    """The configs one prompt runs under, in order, with the baseline among them.

    ``baseline_every=0``: the baseline once, first. ``baseline_every=n``: the baseline before every ``n``
    configs and once more at the end, so a long sweep's drift reaches both sides (the tuner).
    """
    spec = [c for c in configs if c.is_speculative]
    if baseline_every <= 0:
        return [BASELINE, *spec]
    out: list[DraftSettings] = []
    for i, c in enumerate(spec):
        if i % baseline_every == 0:
            out.append(BASELINE)
        out.append(c)
    out.append(BASELINE)
    return out


def run_interleaved(
    runner: Runner,
    workloads: list[Workload],
    configs: list[DraftSettings],
    *,
    max_tokens: int,
    repeats: int = 1,
    warmup: bool = True,
    baseline_every: int = 0,
    peer: Runner | None = None,
    peer_configs: list[DraftSettings] | None = None,
    progress: Callable[[str], None] | None = None,
) -> list[RunRecord]:
    """Run every prompt under the baseline and each config, interleaved; returns the runs.

    With a ``peer`` runner (llama.cpp), its baseline and configs run right after ours on the same prompt,
    so both sides see the same state of the machine; its records' ``engine`` is ``LLAMA_CPP``.
    A sequential workload runs all its prompts in order under one config before the next config
    (``benchmath.interleaved_order``). ``baseline_every``: see :func:`plan_configs`.
    """
    plan = [(LOCALSPEC, c) for c in plan_configs(configs, baseline_every)]
    if peer is not None:
        plan += [(LLAMA_CPP, c) for c in plan_configs(peer_configs or configs, baseline_every)]
    runners = {LOCALSPEC: runner, LLAMA_CPP: peer}
    records: list[RunRecord] = []
    for wi, w in enumerate(workloads):
        order = interleaved_order(
            len(w.prompts), len(plan), repeats, warmup and wi == 0, sequential=w.sequential
        )
        for p, ci, rep in order:
            (engine, cfg), prompt = plan[ci], w.prompts[p]
            run = runners[engine]
            assert run is not None
            stats = run(prompt, cfg, max_tokens if rep >= 0 else min(8, max_tokens))
            record = RunRecord(engine, w.name, prompt.id, cfg.label, rep, stats)
            records.append(record)
            if progress and record.counted:
                progress(
                    f"{engine} {w.name} {prompt.id} {cfg.label}: {stats.get('generated_tokens', 0)} tokens, "
                    f"{stats.get('tokens_per_second') or 0:.2f} tok/s"
                )
    return records


def render(pipe: Pipeline, prompt: Prompt) -> tuple[list[int], list[str]]:
    """The exact token ids (and stop strings) a prompt becomes: chat prompts through the target's own chat
    template, others as plain text (as are chat prompts for a model without a chat template, such as the
    embedded tiny pair). Both localspec and the llama.cpp peer are fed these ids."""
    if prompt.chat and pipe.chat_template is not None:
        tokens, stops = pipe.format_chat([{"role": "user", "content": prompt.text}])
        return list(tokens), list(stops)
    return list(pipe.tokenize(prompt.text)), []


def check_prompts_fit(pipe: Pipeline, workloads: Sequence[Workload], max_tokens: int) -> None:
    """Refuse, before the first run, a prompt that with ``max_tokens`` does not fit the context: found
    mid-run it ended minutes of benchmarking without naming the prompt."""
    for w in workloads:
        for prompt in w.prompts:
            n = len(render(pipe, prompt)[0])
            if n + max_tokens > pipe.n_ctx:
                larger = "" if pipe.n_ctx_is_trained else ", or raise --n-ctx"
                raise BenchError(
                    f"prompt {prompt.id!r} of {w.name} is {n} tokens: with --max-tokens {max_tokens} it does "
                    f"not fit the context of {pipe.n_ctx} tokens{pipe.n_ctx_note()}",
                    hint=f"shorten or drop that prompt, lower --max-tokens{larger}",
                )


def engine_runner(
    pipe: Pipeline, *, temperature: float = 0.0, seed: int | None = None, top_p: float = 1.0
) -> Runner:
    """A runner on a localspec pipeline (``Pipeline.stream_tokens`` on the rendered prompt)."""
    cache: dict[str, tuple[list[int], list[str]]] = {}

    def run(prompt: Prompt, config: DraftSettings, max_tokens: int) -> dict:
        if prompt.id not in cache:
            cache[prompt.id] = render(pipe, prompt)
        tokens, stops = cache[prompt.id]
        kwargs: dict[str, Any] = {"max_tokens": max_tokens, "temperature": temperature, "stop": stops or None}
        if temperature > 0:
            kwargs["seed"] = seed if seed is not None else 1234
            kwargs["top_p"] = top_p
        if not config.is_speculative:
            kwargs["baseline"] = True
        else:
            kwargs["strategy"] = config.strategy
            kwargs["adaptive"] = config.adaptive
            kwargs["n_max"] = config.n_max
            if config.uses_model:  # n-gram lookup has no probabilities: p_min does not apply
                kwargs["p_min"] = config.p_min
        if config.uses_suffix:
            # single prompts: the suffix cache must not remember this prompt from another setting's run
            pipe.reset_suffix()
        pieces, last = [], None
        for r in pipe.stream_tokens(tokens, **kwargs):
            pieces.append(r.text)
            last = r
        stats = last.stats.as_dict() if last is not None else {}
        stats["text"] = "".join(pieces)
        return stats

    return run


# ---------------------------------------------------------------------------------------------- one call


def default_strategies(pipe: Pipeline) -> list[str]:
    """Both drafters when the pair has a draft model, n-gram lookup otherwise."""
    return ["model", "ngram"] if pipe.info.draft_path is not None else ["ngram"]


def pipe_settings(pipe: Pipeline, strategy: str, *, adaptive: bool = False) -> DraftSettings:
    """``strategy`` with the pipeline's own draft length and p_min (the pair's, preset's or user's), as a call
    with that strategy runs (:meth:`~localspec.settings.DraftSettings.switched_to`: the suffix-cache
    strategies size their own drafts)."""
    return pipe.settings.switched_to(strategy, max_draft=pipe.max_draft, n_min=0, adaptive=adaptive)


def open_pipeline(
    target: str | None = None,
    draft: str | None = None,
    preset: str | None = None,
    *,
    threads: int | None = None,
    n_ctx: int | None = None,
    n_max: int | None = None,
    p_min: float | None = None,
    rpc: str | None = None,
    tensor_split: Sequence[float] | None = None,
    strategy: str | None = None,
) -> Pipeline:
    """The pipeline a bench measures (``rpc``: the target's layers on those rpc-servers; ``strategy``: the one
    it loads for, ``"mtp"`` to load the target's MTP layers); never the user's suffix store."""
    from localspec.pipeline.loading import load

    return load(
        target=target,
        draft=draft,
        preset=preset,
        n_threads=threads,
        n_ctx=n_ctx,
        n_max=n_max,
        p_min=p_min,
        suffix_store=False,  # the bench never reads or writes the user's suffix store
        rpc=rpc,
        tensor_split=tensor_split,
        strategy=strategy,
    )


def pair_info(pipe: Pipeline) -> dict[str, Any]:
    info = pipe.info
    return {
        "target": str(info.target_path),
        "draft": str(info.draft_path) if info.draft_path else None,
        "verdict": info.verdict,
        "note": info.note,
        "n_ctx": pipe.n_ctx,
        "n_max": pipe.settings.n_max,
        "p_min": pipe.settings.p_min,
        "placement": pipe.placement,
    }


def benchmark(
    *,
    target: str | None = None,
    draft: str | None = None,
    preset: str | None = None,
    workloads: Sequence[str] | None = None,
    prompts_file: str | Path | None = None,
    limit: int | None = None,
    max_tokens: int = 128,
    temperature: float = 0.0,
    repeats: int = 1,
    threads: int | None = None,
    n_ctx: int | None = None,
    strategies: Sequence[str] | None = None,
    configs: Sequence[DraftSettings] | None = None,
    n_max: int | None = None,
    p_min: float | None = None,
    peer: bool = False,
    peer_n_max: Sequence[int] = peer_mod.PEER_N_MAX,
    peer_p_min: Sequence[float] = peer_mod.PEER_P_MIN,
    adaptive: bool = False,
    warmup: bool = True,
    progress: Callable[[str], None] | None = None,
    rpc: str | None = None,
    tensor_split: Sequence[float] | None = None,
) -> BenchReport:
    """Run the benchmark and return its report (``localspec.bench.report`` prints and writes it).

    ``configs``: the settings to measure as they are (``--wide-target``'s), instead of ``strategies`` at the
    pipeline's draft length and p_min. ``peer_n_max`` x ``peer_p_min``: the grid llama.cpp's draft-simple
    runs over (:func:`localspec.bench.peer.peer_configs`). ``rpc``/``tensor_split``: the target's layers on
    llama.cpp rpc-servers (each setting, the target alone included, then pays their round trips); the draft
    stays here.
    """
    wl = load_workloads(workloads, prompts_file, limit)
    threads = threads or constants.default_threads()
    pipe = open_pipeline(
        target,
        draft,
        preset,
        threads=threads,
        n_ctx=n_ctx,
        n_max=n_max,
        p_min=p_min,
        rpc=rpc,
        tensor_split=tensor_split,
        strategy="mtp" if any(s in MTP_STRATEGIES for s in strategies or ()) else None,
    )
    servers: dict[str, Any] = {}
    try:
        strategies, configs = _settings_to_measure(pipe, strategies, configs, adaptive)
        check_prompts_fit(pipe, wl, max_tokens)
        peer_run, peer_configs = None, []
        if peer:
            peer_configs = peer_mod.peer_configs(configs, peer_n_max, peer_p_min)
            servers, peer_run = _start_peer(pipe, peer_configs, threads, temperature, progress)
        records = run_interleaved(
            engine_runner(pipe, temperature=temperature),
            wl,
            configs,
            max_tokens=max_tokens,
            repeats=repeats,
            warmup=warmup,
            peer=peer_run,
            peer_configs=peer_configs,
            progress=progress,
        )
        settings: dict[str, Any] = dict(
            max_tokens=max_tokens, temperature=temperature, repeats=repeats, threads=threads, warmup=warmup
        )
        settings |= dict(strategies=strategies, adaptive=adaptive, rpc=rpc, workloads=[w.name for w in wl])
        settings["prompts"] = {w.name: len(w.prompts) for w in wl}
        return _report(pipe, wl, configs, records, settings, peer_configs if peer_run is not None else None)
    finally:
        for srv in servers.values():
            srv.close()
        pipe.close()


def _start_peer(
    pipe: Pipeline,
    peer_configs: list[DraftSettings],
    threads: int,
    temperature: float,
    progress: Callable[[str], None] | None,
) -> tuple[dict[str, Any], Runner]:
    """llama-server for the target alone and each of llama.cpp's settings, and a runner over them."""
    servers = peer_mod.start_servers(
        [BASELINE, *peer_configs],
        target=pipe.info.target_path,
        draft=pipe.info.draft_path,
        threads=threads,
        n_ctx=pipe.n_ctx,
        log=progress,
    )
    return servers, peer_mod.peer_runner(
        servers, render=lambda pr: render(pipe, pr)[0], temperature=temperature
    )


def _settings_to_measure(
    pipe: Pipeline, strategies: Sequence[str] | None, configs: Sequence[DraftSettings] | None, adaptive: bool
) -> tuple[list[str], list[DraftSettings]]:
    """The strategies and the settings a bench measures: ``configs`` as given, else each strategy at the
    pipeline's draft length and p_min (and adaptive too with ``adaptive``)."""
    if configs:
        chosen = [c for c in configs if c.is_speculative]
        names = list(dict.fromkeys(c.strategy.name for c in configs))
    else:
        names = list(strategies or default_strategies(pipe))
        chosen = [pipe_settings(pipe, s) for s in names if parse_strategy(s).drafts]
        if adaptive:  # the same strategies with the adaptive draft length (llama.cpp has no such mode)
            chosen += [c.with_overrides(adaptive=True) for c in list(chosen)]
    if not chosen:
        raise BenchError("nothing to compare: no speculative strategy", hint="use --strategy model or ngram")
    return names, chosen


#: What the report says llama.cpp's side ran.
PEER_NOTE = (
    "llama-server from llama-cpp-python {version}'s vendored llama.cpp ({binary}), built with this "
    "wheel's CPU features; draft model: --spec-type draft-simple over n-max x p-min (its defaults, n-max 3 "
    "and p-min 0, among them), reported at its best per workload; n-gram: ngram-simple (lookup n-gram "
    "min(3, k), draft k); same token ids, threads and context"
)


def _report(
    pipe: Pipeline,
    wl: list[Workload],
    configs: list[DraftSettings],
    records: list[RunRecord],
    settings: dict[str, Any],
    peer_configs: list[DraftSettings] | None,
) -> BenchReport:
    """The cells of our side and (when it ran) llama.cpp's, with where and how they were measured."""
    cells, line = summarise(wl, configs, records)
    result = BenchReport(
        machine=machine_info(settings["threads"]),
        settings=settings,
        pair=pair_info(pipe),
        cells=cells,
        memory=pipe.memory.as_dict(),
        verify_line=line,
        runs=records,
    )
    if peer_configs is not None:
        peer_cells, _ = summarise(wl, peer_configs, records, engine=LLAMA_CPP)
        note = PEER_NOTE.format(version=programs.installed_version(), binary=programs.server_binary())
        result.peer = PeerResult(peer_cells, note)
    return result
