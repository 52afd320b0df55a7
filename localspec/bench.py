"""Benchmark workloads and runs: prompt files, decoding settings, interleaved baseline/speculative runs.

Runs work on plain stats dicts (``GenerationStats.as_dict()``) produced by a *runner*: a callable
``runner(prompt, config, max_tokens) -> dict``. :func:`engine_runner` makes one from a localspec pipeline; the
llama.cpp peer (``localspec.peer``) produces the same dicts from llama-server. The arithmetic lives in
``localspec.benchmath``, the tuner in ``localspec.tune``, the report files in ``localspec.report``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from localspec.benchmath import interleaved_order
from localspec.constants import PACKAGE_DIR
from localspec.errors import BenchError

WORKLOADS = ("code", "summarise", "chat", "translate", "edit", "creative")
WORKLOAD_TITLES = {
    "code": "code completion",
    "summarise": "summarisation",
    "chat": "open chat",
    "translate": "translation",
    "edit": "code edit",
    "creative": "creative writing",
}
STRATEGIES = ("model", "ngram", "model+ngram", "none")
PROMPTS_DIR = PACKAGE_DIR / "data" / "prompts"


@dataclass(frozen=True)
class Prompt:
    """One benchmark prompt. ``chat`` prompts go through the model's chat template."""

    id: str
    text: str
    chat: bool = True


@dataclass
class Workload:
    name: str
    prompts: list[Prompt]
    source: str = ""

    @property
    def title(self) -> str:
        return WORKLOAD_TITLES.get(self.name, self.name)


@dataclass(frozen=True)
class Config:
    """A decoding setting to measure. ``strategy="none"`` is the target alone (the baseline)."""

    strategy: str = "none"
    n_max: int | None = None
    p_min: float | None = None
    adaptive: bool = False  # draft length chosen per round (0 included) from measured acceptance and costs

    @property
    def is_baseline(self) -> bool:
        return self.strategy == "none"

    @property
    def label(self) -> str:
        if self.is_baseline:
            return "none"
        parts = [self.strategy]
        if self.n_max is not None:
            parts.append(f"k={self.n_max}")
        if self.p_min is not None and self.strategy != "ngram":
            parts.append(f"p_min={self.p_min:g}")
        if self.adaptive:
            parts.append("adaptive")
        return " ".join(parts)


BASELINE = Config("none")
Runner = Callable[[Prompt, Config, int], dict]


# ---------------------------------------------------------------------------------------------- prompts


def _line_error(path: Path, lineno: int, what: str) -> BenchError:
    return BenchError(
        f"{path}:{lineno}: {what}",
        hint='use one prompt per line, or JSONL lines like {"prompt": "..."} (optional "id", "chat")',
    )


def load_prompts(path: str | Path, name: str | None = None, *, chat_default: bool = True) -> Workload:
    """Read a prompt file: JSONL (``.jsonl``, or a first line starting with ``{``) or one prompt per line.

    A malformed line raises :class:`BenchError` naming the file and the line number.
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError as exc:
        raise BenchError(f"{path}: prompt file not found", hint="check the --prompts path") from exc
    except UnicodeDecodeError as exc:
        raise BenchError(f"{path}: not UTF-8 text", hint="save the prompt file as UTF-8") from exc
    lines = text.splitlines()
    first = next((ln.strip() for ln in lines if ln.strip()), "")
    jsonl = path.suffix.lower() in (".jsonl", ".json") or first.startswith("{")
    prompts: list[Prompt] = []
    stem = name or path.stem
    for lineno, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        if not jsonl:
            prompts.append(Prompt(f"{stem}-{len(prompts) + 1:02d}", line.strip(), chat_default))
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise _line_error(path, lineno, f"not valid JSON ({exc.msg} at column {exc.colno})") from exc
        if not isinstance(row, dict):
            raise _line_error(path, lineno, f"expected a JSON object, got {type(row).__name__}")
        prompt = row.get("prompt")
        if not isinstance(prompt, str) or not prompt.strip():
            raise _line_error(path, lineno, 'missing or empty "prompt" string')
        chat = row.get("chat", chat_default)
        if not isinstance(chat, bool):
            raise _line_error(path, lineno, '"chat" must be true or false')
        pid = row.get("id", f"{stem}-{len(prompts) + 1:02d}")
        prompts.append(Prompt(str(pid), prompt, chat))
    if not prompts:
        raise BenchError(f"{path}: no prompts in the file", hint="add one prompt per line")
    return Workload(stem, prompts, str(path))


def builtin_workload(name: str) -> Workload:
    """One of the shipped workloads (:data:`WORKLOADS`)."""
    if name not in WORKLOADS:
        raise BenchError(f"unknown workload {name!r}", hint=f"choose from: {', '.join(WORKLOADS)}")
    return load_prompts(PROMPTS_DIR / f"{name}.jsonl", name)


def select_workloads(names: Iterable[str] | None = None, limit: int | None = None) -> list[Workload]:
    out = [builtin_workload(n) for n in (names or WORKLOADS)]
    if limit:
        for w in out:
            w.prompts = w.prompts[:limit]
    return out


# ---------------------------------------------------------------------------------------------- running


def run_interleaved(
    runner: Runner,
    workloads: list[Workload],
    configs: list[Config],
    *,
    max_tokens: int,
    repeats: int = 1,
    warmup: bool = True,
    peer: Runner | None = None,
    peer_configs: list[Config] | None = None,
    progress: Callable[[str], None] | None = None,
) -> list[dict]:
    """Run every prompt under the baseline and each config, interleaved; returns run records.

    With a ``peer`` runner (llama.cpp), its baseline and configs run right after ours on the same prompt,
    so both sides see the same state of the machine. Records carry ``engine``: "localspec" | "llama.cpp".
    """
    plan = [("localspec", c) for c in (BASELINE, *[c for c in configs if not c.is_baseline])]
    if peer is not None:
        plan += [
            ("llama.cpp", c) for c in (BASELINE, *[c for c in peer_configs or configs if not c.is_baseline])
        ]
    runners = {"localspec": runner, "llama.cpp": peer}
    records: list[dict] = []
    for wi, w in enumerate(workloads):
        order = interleaved_order(len(w.prompts), len(plan), repeats, warmup and wi == 0)
        for p, ci, rep in order:
            (engine, cfg), prompt = plan[ci], w.prompts[p]
            stats = runners[engine](prompt, cfg, max_tokens if rep >= 0 else min(8, max_tokens))
            records.append(
                {"engine": engine, "workload": w.name, "prompt_id": prompt.id, "config": cfg.label,
                 "repeat": rep, "stats": stats}
            )  # fmt: skip
            if progress and rep >= 0:
                progress(
                    f"{engine} {w.name} {prompt.id} {cfg.label}: {stats.get('generated_tokens', 0)} tokens, "
                    f"{stats.get('tokens_per_second') or 0:.2f} tok/s"
                )
    return records


def render(pipe: Any, prompt: Prompt) -> tuple[list[int], list[str]]:
    """The exact token ids (and stop strings) a prompt becomes: chat prompts through the target's own chat
    template, others as plain text. Both localspec and the llama.cpp peer are fed these ids."""
    if prompt.chat and _has_chat_template(pipe):
        fmt = pipe.format_chat
        tokens, stops = fmt([{"role": "user", "content": prompt.text}])
        return list(tokens), list(stops)
    return list(pipe.tokenize(prompt.text)), []


def _has_chat_template(pipe: Any) -> bool:
    """A model without a chat template (the embedded tiny pair) gets chat prompts as plain text."""
    try:
        return bool(pipe._target.metadata.get("tokenizer.chat_template"))
    except AttributeError:
        return True


def engine_runner(pipe: Any, *, temperature: float = 0.0, seed: int | None = None) -> Runner:
    """A runner on a localspec pipeline (``Pipeline.stream_tokens`` on the rendered prompt)."""
    cache: dict[str, tuple[list[int], list[str]]] = {}

    def run(prompt: Prompt, config: Config, max_tokens: int) -> dict:
        if prompt.id not in cache:
            cache[prompt.id] = render(pipe, prompt)
        tokens, stops = cache[prompt.id]
        kwargs: dict[str, Any] = {"max_tokens": max_tokens, "temperature": temperature, "stop": stops or None}
        if temperature > 0:
            kwargs["seed"] = seed if seed is not None else 1234
        if config.is_baseline:
            kwargs["baseline"] = True
        else:
            kwargs["strategy"] = config.strategy
            kwargs["adaptive"] = config.adaptive
        if config.n_max is not None:
            kwargs["n_max"] = config.n_max
        if config.p_min is not None:
            kwargs["p_min"] = config.p_min
        pieces, last = [], None
        for r in pipe.stream_tokens(tokens, **kwargs):
            pieces.append(r.text)
            last = r
        stats = last.stats.as_dict() if last is not None else {}
        stats["text"] = "".join(pieces)
        return stats

    return run


# ---------------------------------------------------------------------------------------------- one call


def default_strategies(pipe: Any) -> list[str]:
    """Both drafters when the pair has a draft model, n-gram lookup otherwise."""
    return ["model", "ngram"] if pipe.info.draft_path is not None else ["ngram"]


def load_workloads(
    names: Sequence[str] | None = None, prompts_file: str | Path | None = None, limit: int | None = None
) -> list[Workload]:
    if prompts_file:
        w = load_prompts(prompts_file)
        w.prompts = w.prompts[:limit] if limit else w.prompts
        return [w]
    return select_workloads(names, limit)


def open_pipeline(target=None, draft=None, preset=None, *, threads=None, n_ctx=None, n_max=None, p_min=None):
    import localspec

    return localspec.load(
        target=target, draft=draft, preset=preset, n_threads=threads, n_ctx=n_ctx, n_max=n_max, p_min=p_min
    )


def pair_info(pipe: Any) -> dict[str, Any]:
    info = pipe.info
    return {
        "target": str(info.target_path),
        "draft": str(info.draft_path) if info.draft_path else None,
        "verdict": info.verdict,
        "note": info.note,
        "n_ctx": pipe.n_ctx,
        "n_max": pipe.options.n_max,
        "p_min": pipe.options.p_min,
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
    n_max: int | None = None,
    p_min: float | None = None,
    peer: bool = False,
    adaptive: bool = False,
    warmup: bool = True,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Run the benchmark and return the report dict (see ``localspec.report`` to print and write it)."""
    from localspec import constants
    from localspec.benchmath import summarise
    from localspec.report import machine_info

    wl = load_workloads(workloads, prompts_file, limit)
    threads = threads or constants.default_threads()
    pipe = open_pipeline(target, draft, preset, threads=threads, n_ctx=n_ctx, n_max=n_max, p_min=p_min)
    servers: dict[str, Any] = {}
    try:
        strategies = list(strategies or default_strategies(pipe))
        k, p = pipe.options.n_max, pipe.options.p_min
        configs = [Config(s, k, None if s == "ngram" else p) for s in strategies if s != "none"]
        if adaptive:  # the same strategies with the adaptive draft length (llama.cpp has no such mode)
            configs += [Config(c.strategy, c.n_max, c.p_min, adaptive=True) for c in list(configs)]
        if not configs:
            raise BenchError(
                "nothing to compare: no speculative strategy", hint="use --strategy model or ngram"
            )
        peer_run, peer_configs, peer_note = None, [], ""
        if peer:
            from localspec import peer as peer_mod

            peer_configs = [c for c in configs if c.strategy in ("model", "ngram") and not c.adaptive]
            servers = peer_mod.start_servers(
                [BASELINE, *peer_configs], target=pipe.info.target_path, draft=pipe.info.draft_path,
                threads=threads, n_ctx=pipe.n_ctx, log=progress,
            )  # fmt: skip
            peer_run = peer_mod.peer_runner(
                servers, render=lambda pr: render(pipe, pr)[0], temperature=temperature
            )
            peer_note = (
                f"llama-server from llama-cpp-python {peer_mod.installed_version()}'s vendored llama.cpp "
                f"({peer_mod.server_binary()}); draft model: --spec-type draft-simple, n-gram: ngram-simple "
                "(lookup n-gram min(3, k), draft k); same token ids, threads, context, k and p_min"
            )
        records = run_interleaved(
            engine_runner(pipe, temperature=temperature), wl, configs, max_tokens=max_tokens,
            repeats=repeats, warmup=warmup, peer=peer_run, peer_configs=peer_configs, progress=progress,
        )  # fmt: skip
        cells, slope = summarise(wl, configs, records)
        report: dict[str, Any] = {
            "machine": machine_info(threads),
            "settings": {"max_tokens": max_tokens, "temperature": temperature, "repeats": repeats,
                         "threads": threads, "warmup": warmup, "strategies": strategies, "adaptive": adaptive,
                         "workloads": [w.name for w in wl], "prompts": {w.name: len(w.prompts) for w in wl}},
            "pair": pair_info(pipe),
            "memory": pipe.memory.as_dict(),
            "verify_slope": slope,
            "cells": [c.as_dict() for c in cells],
            "runs": [{**r, "stats": {**r["stats"], "text": (r["stats"].get("text") or "")[:300]}}
                     for r in records],
        }  # fmt: skip
        if peer_run is not None:
            peer_cells, _ = summarise(wl, peer_configs, records, engine="llama.cpp")
            report["peer"] = {"cells": [c.as_dict() for c in peer_cells], "note": peer_note}
        return report
    finally:
        for srv in servers.values():
            srv.close()
        pipe.close()
