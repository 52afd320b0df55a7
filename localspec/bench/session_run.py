"""Bench of the multi-request workloads (:mod:`localspec.bench.sessions`): what remembering requests buys.

Each drafting setting runs every measured session of a workload in order through one pipeline, the
requests built from its own replies. The suffix cache is reset before each run: *cold* starts empty,
*warm* starts from what a store would hold after the workload's warm-up sessions (other sessions of
the same kind, never the measured ones) ran once through the pipeline: the index, and the calibration
of prompt copies that a store keeps for the next process (:meth:`SuffixDrafter.carried_calibration`).
The store on disk is not touched (the pipeline is loaded with ``suffix_store=False``). Runs of
different settings alternate, repeat after repeat, and each figure is a median over repeats of the
whole session's tokens per second:

- *generation*: emitted tokens / seconds from the first round to the last;
- *end to end*: emitted tokens / wall seconds of the whole calls, prompt processing and the suffix
  cache's bookkeeping (indexing each finished request) included.

Speedups are ratios to the target alone measured in the same repeat.

With ``peer`` (:class:`PeerSetup`), llama.cpp's own speculative modes
(:data:`localspec.bench.peer.SESSION_MODES`)
run the same sessions in the same repeats, interleaved with ours: one fresh ``llama-server`` per mode and
run (so ``ngram-mod``'s cross-request pool starts empty like our cold cache), fed exactly the prompt tokens
localspec decodes, its prompt cache on. Their speedups are over llama.cpp without speculation, and every
row also reports its generation tokens/s over llama.cpp's best mode of the same repeat.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from localspec.bench.report import NOISE_MARGIN
from localspec.bench.sessions import SessionWorkload, corpus_files, load_session_workload, run_session
from localspec.settings import DraftSettings
from localspec.suffix.calibration import TOKEN_WEIGHT, Cell, TokenCell

if TYPE_CHECKING:
    from localspec.pipeline.pipeline import Pipeline


BASELINE = DraftSettings(strategy="none")


@dataclass(frozen=True)
class SessionConfig:
    """A drafting setting plus whether the suffix cache starts warm, whether a warm start keeps the
    calibration and token table the store kept (``calibration=False``: learnt afresh, as before stores
    kept them), and the suffix drafter's token weight (0: no token table, as before it had one)."""

    settings: DraftSettings
    warm: bool = False
    calibration: bool = True
    token_weight: float = TOKEN_WEIGHT

    @property
    def label(self) -> str:
        if self.settings.uses_suffix:
            start = "cold" if not self.warm else "warm" if self.calibration else "warm, calibration afresh"
            if self.token_weight != TOKEN_WEIGHT:
                start += f", token weight {self.token_weight:g}"
            return f"{self.settings.label} ({start})"
        return self.settings.label


@dataclass(frozen=True)
class PeerConfig:
    """One llama.cpp mode (``localspec.bench.peer.SESSION_MODES``) run through ``llama-server``."""

    mode: str

    @property
    def label(self) -> str:
        return f"llama.cpp {self.mode}"

    @property
    def warm(self) -> bool:
        return False


@dataclass(frozen=True)
class PeerSetup:
    """What it takes to start llama-server for the session bench: the pair's files and threads."""

    target: Path
    draft: Path | None
    threads: int
    n_ctx: int
    modes: tuple[str, ...]
    work_dir: Path


@dataclass
class SessionRun:
    tokens: int = 0
    gen_seconds: float = 0.0
    wall_seconds: float = 0.0
    drafted: int = 0
    accepted: int = 0
    rounds: int = 0
    drafted_by_source: dict[str, int] = field(default_factory=dict)
    accepted_by_source: dict[str, int] = field(default_factory=dict)
    routes: list[str] = field(default_factory=list)

    @property
    def gen_tps(self) -> float:
        return self.tokens / self.gen_seconds if self.gen_seconds else 0.0

    @property
    def e2e_tps(self) -> float:
        return self.tokens / self.wall_seconds if self.wall_seconds else 0.0


def _run_once(
    pipe: Pipeline, workload: SessionWorkload, config: SessionConfig, max_tokens: int
) -> SessionRun:
    run = SessionRun()
    s = config.settings
    kw: dict[str, Any] = {
        "max_tokens": max_tokens,
        "strategy": s.strategy.name,
        "n_max": s.n_max,
        "n_min": s.n_min,
        "p_min": s.p_min,
        "adaptive": s.adaptive,
    }

    def send(messages: list[dict[str, str]]) -> Any:
        reply = pipe.chat(messages, **kw)
        st = reply.stats
        run.tokens += st.generated_tokens
        run.gen_seconds += st.total_seconds
        run.drafted += st.drafted
        run.accepted += st.accepted
        run.rounds += st.rounds
        for src, n in st.drafted_by_source.items():
            run.drafted_by_source[src] = run.drafted_by_source.get(src, 0) + n
        for src, n in st.accepted_by_source.items():
            run.accepted_by_source[src] = run.accepted_by_source.get(src, 0) + n
        if st.route:
            run.routes.append(st.route.label)
        return reply

    for session in workload.measured:
        for req in run_session(workload, session, send, clock=time.perf_counter):
            run.wall_seconds += req.seconds
    return run


def _run_peer_once(
    pipe: Pipeline, workload: SessionWorkload, config: PeerConfig, setup: PeerSetup, max_tokens: int
) -> SessionRun:
    from localspec.bench import peer
    from localspec.llama import programs

    static = None
    if config.mode == "ngram-cache" and workload.corpus is not None:
        static = setup.work_dir / f"{workload.name}-lookup-static.bin"
        if not static.is_file():
            texts = corpus_files(workload.corpus)
            peer.lookup_static_file(setup.target, texts, static, threads=setup.threads)
    args = peer.session_mode_args(
        config.mode,
        target=setup.target,
        draft=setup.draft,
        threads=setup.threads,
        n_ctx=setup.n_ctx,
        lookup_static=static,
    )
    binary = programs.server_binary() or programs.build_server()
    run = SessionRun()
    with peer.PeerServer(binary, args, setup.work_dir / "logs" / f"{config.mode}.log") as server:
        server.wait_ready()
        send = peer.chat_sender(server, pipe.format_chat, max_tokens=max_tokens)
        server.post("/completion", {"prompt": "warm up", "n_predict": 2, "cache_prompt": False})

        def timed(messages: list[dict[str, str]]) -> Any:
            reply = send(messages)
            run.tokens += reply.generated_tokens
            run.gen_seconds += reply.gen_seconds
            run.drafted += reply.drafted
            run.accepted += reply.accepted
            return reply

        for session in workload.measured:
            for req in run_session(workload, session, timed, clock=time.perf_counter):
                run.wall_seconds += req.seconds
    return run


@dataclass(frozen=True)
class WarmStore:
    """What a store holds after the warm-up sessions: the index and the drafter's carried calibration and
    token table."""

    index: dict
    calibration: list[Cell]
    tokens: list[TokenCell]


def warm_snapshot(pipe: Pipeline, workload: SessionWorkload, max_tokens: int) -> tuple[WarmStore, float]:
    """Run the warm-up sessions once with the suffix cache; return what a store would then hold (the
    index, and the calibration and token table it keeps for the next process) and the seconds it took."""
    pipe.reset_suffix()
    t = time.perf_counter()
    for session in workload.warm:
        run_session(
            workload,
            session,
            lambda m: pipe.chat(m, max_tokens=max_tokens, strategy="suffix"),
            clock=time.perf_counter,
        )
    drafter = pipe.suffix_drafter()
    warm = WarmStore(drafter.index.state(), drafter.carried_calibration(), drafter.carried_tokens())
    return warm, time.perf_counter() - t


def bench_workload(
    pipe: Pipeline,
    workload: SessionWorkload,
    configs: list[SessionConfig],
    *,
    repeats: int = 3,
    max_tokens: int | None = None,
    peer: PeerSetup | None = None,
    log: Callable[[str], None] = lambda line: None,
) -> dict[str, Any]:
    """Every config (the target alone first) over the workload's measured sessions, ``repeats`` times;
    with ``peer``, llama.cpp's modes too (llama.cpp without speculation first among them)."""
    cap = min(workload.max_tokens, max_tokens or workload.max_tokens)
    if workload.corpus is not None:
        pipe.set_corpus(workload.corpus)
    warm: WarmStore | None = None
    if any(c.warm for c in configs):
        warm, seconds = warm_snapshot(pipe, workload, cap)
        log(f"{workload.name}: warm-up sessions took {seconds:.0f} s")
    plan: list[SessionConfig | PeerConfig] = [
        SessionConfig(BASELINE),
        *[c for c in configs if c.settings.is_speculative],
    ]
    peer_plan = [PeerConfig(m) for m in (peer.modes if peer else ())]
    peer_plan.sort(key=lambda c: c.mode != "none")
    runs: dict[str, list[SessionRun]] = {c.label: [] for c in [*plan, *peer_plan]}
    for r in range(max(1, repeats)):
        order: list[SessionConfig | PeerConfig] = [*plan, *peer_plan]
        if r % 2:
            order = [plan[0], *reversed(order[1:])]
        for config in order:
            t = time.perf_counter()
            if isinstance(config, PeerConfig):
                assert peer is not None
                run = _run_peer_once(pipe, workload, config, peer, cap)
            else:
                _start_suffix(pipe, config, warm)
                run = _run_once(pipe, workload, config, cap)
            runs[config.label].append(run)
            log(
                f"{workload.name} repeat {r + 1}: {config.label}: {run.tokens} tokens, "
                f"{run.gen_tps:.2f} tok/s generation, {run.e2e_tps:.2f} end to end "
                f"({time.perf_counter() - t:.0f} s)"
            )
    rows = _rows(runs, plan, peer_plan)
    return {
        "workload": workload.name,
        "requests": workload.n_measured_requests,
        "max_tokens": cap,
        "repeats": repeats,
        "rows": rows,
    }


def _start_suffix(pipe: Pipeline, config: SessionConfig, warm: WarmStore | None) -> None:
    """The suffix cache as ``config`` starts: warm from the snapshot (with or without its calibration and
    token table), or empty."""
    weight = config.token_weight
    if config.warm and warm is not None:
        kept = config.calibration
        pipe.reset_suffix(
            warm.index,
            warm.calibration if kept else (),
            warm.tokens if kept and weight > 0 else (),
            token_weight=weight,
        )
    else:
        pipe.reset_suffix(token_weight=weight)


def _rows(
    runs: dict[str, list[SessionRun]], plan: list[SessionConfig | PeerConfig], peer_plan: list[PeerConfig]
) -> list[dict[str, Any]]:
    """One row per config: its speedups over its own side's target alone (median over repeats), and over
    llama.cpp's best mode in each repeat."""
    peer_best: list[float] = []
    peer_modes = [c.label for c in peer_plan if c.mode != "none"]
    if peer_modes:
        n = len(runs[plan[0].label])
        peer_best = [max(runs[lbl][i].gen_tps for lbl in peer_modes) for i in range(n)]
    rows = []
    for config in [*plan, *peer_plan]:
        mine = runs[config.label]
        is_peer = isinstance(config, PeerConfig)
        base = runs[(peer_plan[0] if is_peer else plan[0]).label]
        gen = [m.gen_tps / b.gen_tps for m, b in zip(mine, base, strict=True) if b.gen_tps]
        e2e = [m.e2e_tps / b.e2e_tps for m, b in zip(mine, base, strict=True) if b.e2e_tps]
        vs_peer = [m.gen_tps / p for m, p in zip(mine, peer_best, strict=True) if p] if peer_best else []
        last = mine[-1]
        rows.append(
            {
                "config": config.label,
                "strategy": config.mode if isinstance(config, PeerConfig) else config.settings.strategy.name,
                "target_alone": (
                    config.mode == "none"
                    if isinstance(config, PeerConfig)
                    else not config.settings.is_speculative
                ),
                "warm": config.warm,
                "peer": is_peer,
                "speedup_generation": statistics.median(gen) if gen else None,
                "speedup_end_to_end": statistics.median(e2e) if e2e else None,
                "vs_llama_cpp_best": statistics.median(vs_peer) if vs_peer else None,
                "speedups_generation": gen,
                "tokens_per_second": statistics.median(m.gen_tps for m in mine),
                "tokens_per_second_repeats": [m.gen_tps for m in mine],
                "tokens_per_second_end_to_end": statistics.median(m.e2e_tps for m in mine),
                "tokens": [m.tokens for m in mine],
                "acceptance": last.accepted / last.drafted if last.drafted else None,
                "mean_accepted_length": last.accepted / last.rounds if last.rounds else None,
                "accepted_by_source": {
                    src: f"{last.accepted_by_source.get(src, 0)}/{n}"
                    for src, n in last.drafted_by_source.items()
                },
                "routes": sorted(set(last.routes)),
            }
        )
    return rows


def noise_lines(results: list[dict[str, Any]]) -> list[str]:
    """Warnings for figures a run cannot vouch for: the target alone's speed moving between repeats by
    more than :data:`~localspec.bench.report.NOISE_MARGIN` (the machine's speed changed under the run), one
    setting's per-repeat speedups spread wider than that around their median, a speedup that far from
    1x with no draft accepted, or a single repeat (nothing to tell noise by)."""
    odd = []
    for res in results:
        name = res["workload"]
        for row in res["rows"]:
            label = f"{name} / {row['config']}"
            speeds = [x for x in row.get("tokens_per_second_repeats", []) if x]
            moved = len(speeds) > 1 and max(speeds) > (1 + NOISE_MARGIN) * min(speeds)
            if row["target_alone"] and moved:
                odd.append(f"{label} ran {min(speeds):.1f}-{max(speeds):.1f} tok/s across repeats")
            ups = row.get("speedups_generation") or []
            median = row.get("speedup_generation")
            if median and len(ups) > 1 and (max(ups) - min(ups)) > NOISE_MARGIN * median:
                odd.append(f"{label} {min(ups):.2f}-{max(ups):.2f}x across repeats")
            elif (
                median
                and not row["peer"]
                and not row["target_alone"]
                and not row.get("acceptance")
                and abs(median - 1) > NOISE_MARGIN
            ):
                odd.append(f"{label} {median:.2f}x with no draft accepted")
    lines = []
    if odd:
        lines.append(
            "warning: timings this run cannot vouch for (" + "; ".join(odd) + "): the machine was busy "
            "or changed speed. Rerun on an idle machine; each figure is a median of per-repeat ratios."
        )
    if any(res["repeats"] < 2 for res in results):
        lines.append("note: one repeat: no second run to tell noise by; --repeats 3 for figures to publish.")
    return lines


#: The rows ``bench --sessions --session-rows`` names (what scripts/bench_sessions.py's options chose):
#: fixed-length prompt lookup, the suffix cache cold and warm, ``auto`` warm, the draft model alone at k=4,
#: and two side-by-side checks of a warm start (its calibration learnt afresh; no token table).
SESSION_ROWS: dict[str, SessionConfig] = {
    **{f"ngram-{k}": SessionConfig(DraftSettings(strategy="ngram", n_max=k)) for k in (4, 8, 16, 32)},
    "suffix-cold": SessionConfig(DraftSettings(strategy="suffix", n_max=32)),
    "suffix-warm": SessionConfig(DraftSettings(strategy="suffix", n_max=32), warm=True),
    "auto-warm": SessionConfig(DraftSettings(strategy="auto", n_max=32), warm=True),
    "model": SessionConfig(DraftSettings(strategy="model", n_max=4)),
    "suffix-afresh": SessionConfig(DraftSettings(strategy="suffix", n_max=32), warm=True, calibration=False),
    "suffix-no-token-table": SessionConfig(
        DraftSettings(strategy="suffix", n_max=32), warm=True, token_weight=0.0
    ),
}
#: The rows run when none are named (``model`` only with a draft model).
DEFAULT_SESSION_ROWS: tuple[str, ...] = (
    "ngram-4",
    "ngram-8",
    "ngram-16",
    "ngram-32",
    "suffix-cold",
    "suffix-warm",
    "auto-warm",
    "model",
)


def default_configs(has_model: bool) -> list[SessionConfig]:
    """Fixed-length prompt lookup at 4, 8, 16 and 32; the suffix cache cold and warm; ``auto`` warm; the
    draft model at k=4 when there is one."""
    return session_configs(DEFAULT_SESSION_ROWS, has_model)


def session_configs(names: Sequence[str], has_model: bool) -> list[SessionConfig]:
    """The :data:`SESSION_ROWS` named, in order; ``model`` left out without a draft model."""
    return [SESSION_ROWS[n] for n in names if has_model or not SESSION_ROWS[n].settings.uses_model]


def markdown(results: list[dict[str, Any]]) -> str:
    """One table per workload: speedup over the target alone (generation, end to end) and acceptance."""
    lines = []
    for res in results:
        lines.append(
            f"**{res['workload']}** ({res['requests']} requests, up to {res['max_tokens']} tokens each, "
            f"median of {res['repeats']} repeat(s))"
        )
        lines.append("")
        vs = any(row.get("vs_llama_cpp_best") is not None for row in res["rows"])
        lines.append(
            "| drafting | speedup (generation) | speedup (end to end) | tok/s | "
            + ("tok/s / llama.cpp's best mode | " if vs else "")
            + "acceptance | mean accepted length | accepted by source |"
        )
        lines.append("| --- " * (8 if vs else 7) + "|")
        for row in res["rows"]:

            def f(x: float | None, spec: str = ".2f", suffix: str = "") -> str:
                return "-" if x is None else f"{x:{spec}}{suffix}"

            by = ", ".join(f"{k} {v}" for k, v in sorted(row["accepted_by_source"].items())) or "-"
            route = f" ({', '.join(row['routes'])})" if row["routes"] else ""
            lines.append(
                f"| {row['config']}{route} | {f(row['speedup_generation'], '.2f', 'x')} | "
                f"{f(row['speedup_end_to_end'], '.2f', 'x')} | {row['tokens_per_second']:.2f} | "
                + (f"{f(row.get('vs_llama_cpp_best'), '.2f')} | " if vs else "")
                + f"{f(row['acceptance'], '.0%')} | {f(row['mean_accepted_length'])} | {by} |"
            )
        lines.append("")
    return "\n".join(lines)


def run_bench(
    pipe: Pipeline,
    names: list[str],
    *,
    configs: list[SessionConfig] | None = None,
    repeats: int = 3,
    max_tokens: int | None = None,
    peer: PeerSetup | None = None,
    log: Callable[[str], None] = lambda line: None,
) -> list[dict[str, Any]]:
    configs = configs or default_configs(pipe.info.draft_path is not None)
    return [
        bench_workload(
            pipe,
            load_session_workload(n),
            configs,
            repeats=repeats,
            max_tokens=max_tokens,
            peer=peer,
            log=log,
        )
        for n in names
    ]
