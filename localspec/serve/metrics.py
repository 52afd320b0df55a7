"""The server's counters: :class:`Metrics` (kept by the worker and the handlers) and the Prometheus text
``/metrics`` answers."""

from __future__ import annotations

import threading
from typing import Any, Protocol

from localspec.decoding.stats import GenerationStats
from localspec.llama.prompt_cache import PromptCache


class QueueState(Protocol):
    """What ``/metrics`` reads of the worker (:class:`localspec.serve.worker.Worker`): its queue, whether a
    generation runs, and the requests generating at once. A protocol, so the counters below the worker do
    not import it."""

    @property
    def waiting(self) -> int: ...

    @property
    def busy(self) -> bool: ...

    slots: int  # requests that generate at once

    def slot_stats(self) -> list[GenerationStats]: ...

    def prompt_caches(self) -> dict[str, PromptCache]: ...


class Metrics:
    """Counters for ``/metrics`` and ``/health``; updated by the worker and the handlers."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.requests: dict[tuple[str, str], int] = {}
        self.prompt_tokens = 0
        self.generated_tokens = 0
        self.drafted = 0
        self.accepted = 0
        self.generation_seconds = 0.0
        self.last_tokens_per_second = 0.0
        self.recent_job_seconds = 0.0  # moving average, for Retry-After

    def count(self, endpoint: str, outcome: str) -> None:
        with self._lock:
            key = (endpoint, outcome)
            self.requests[key] = self.requests.get(key, 0) + 1

    def finished(self, stats: dict[str, Any], seconds: float) -> None:
        with self._lock:
            self.prompt_tokens += int(stats.get("prompt_tokens") or 0)
            self.generated_tokens += int(stats.get("generated_tokens") or 0)
            self.drafted += int(stats.get("drafted") or 0)
            self.accepted += int(stats.get("accepted") or 0)
            self.generation_seconds += float(stats.get("total_seconds") or 0.0)
            self.last_tokens_per_second = float(stats.get("tokens_per_second") or 0.0)
            a = 0.3
            self.recent_job_seconds = (
                seconds if not self.recent_job_seconds else (a * seconds + (1 - a) * self.recent_job_seconds)
            )

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            return {
                "requests": dict(self.requests),
                "prompt_tokens": self.prompt_tokens,
                "generated_tokens": self.generated_tokens,
                "drafted": self.drafted,
                "accepted": self.accepted,
                "generation_seconds": self.generation_seconds,
                "last_tokens_per_second": self.last_tokens_per_second,
                "recent_job_seconds": self.recent_job_seconds,
            }


def generation_endpoint(path: str) -> str | None:
    """The ``/metrics`` endpoint label of a generation path, None for any other path."""
    if path.endswith("/chat/completions"):
        return "chat"
    return "completions" if path.endswith("/completions") else None


def prometheus_text(metrics: Metrics, worker: QueueState, model_id: str) -> str:
    snap = metrics.snapshot()
    lines: list[str] = []

    def metric(name: str, kind: str, help: str, samples: list[tuple[str, float]]) -> None:
        lines.append(f"# HELP localspec_{name} {help}")
        lines.append(f"# TYPE localspec_{name} {kind}")
        for labels, value in samples:
            lines.append(f"localspec_{name}{labels} {value!r}")

    model = model_id.replace("\\", "\\\\").replace('"', '\\"')
    reqs = sorted(snap["requests"].items())
    metric(
        "requests_total",
        "counter",
        "Queued generations by endpoint and outcome (ok, error, cancelled), requests refused "
        "because the queue was full (rejected) and requests refused before queueing, a 4xx (refused).",
        [(f'{{endpoint="{e}",outcome="{o}"}}', n) for (e, o), n in reqs]
        or [('{endpoint="chat",outcome="ok"}', 0)],
    )
    metric(
        "prompt_tokens_total",
        "counter",
        "Prompt tokens of finished generations.",
        [("", snap["prompt_tokens"])],
    )
    metric("generated_tokens_total", "counter", "Tokens generated.", [("", snap["generated_tokens"])])
    metric("drafted_tokens_total", "counter", "Tokens proposed by the drafter.", [("", snap["drafted"])])
    metric(
        "accepted_tokens_total", "counter", "Drafted tokens the target accepted.", [("", snap["accepted"])]
    )
    acceptance = snap["accepted"] / snap["drafted"] if snap["drafted"] else 0.0
    metric("acceptance_ratio", "gauge", "Accepted / drafted tokens since start.", [("", float(acceptance))])
    metric(
        "generation_seconds_total",
        "counter",
        "Time spent generating.",
        [("", float(snap["generation_seconds"]))],
    )
    metric(
        "tokens_per_second",
        "gauge",
        "Generation speed of the last finished request.",
        [("", float(snap["last_tokens_per_second"]))],
    )
    metric("queue_length", "gauge", "Requests waiting for the worker.", [("", worker.waiting)])
    metric("busy", "gauge", "1 while a generation runs.", [("", int(worker.busy))])
    running = worker.slot_stats()
    metric("slots", "gauge", "Requests that can generate at once (--parallel).", [("", worker.slots)])
    metric("slots_busy", "gauge", "Requests generating now.", [("", len(running))])
    metric(
        "slot_acceptance_ratio",
        "gauge",
        "Accepted / drafted tokens of each request generating now.",
        [(f'{{slot="{i}"}}', float(s.acceptance_rate)) for i, s in enumerate(running)],
    )
    metric(
        "slot_batch_cut_tokens",
        "gauge",
        "Drafted tokens of each running request left out of passes shared with others (they would not pay).",
        [(f'{{slot="{i}"}}', s.batch_cut) for i, s in enumerate(running)],
    )
    caches = worker.prompt_caches()
    metric(
        "prompt_cache_bytes",
        "gauge",
        "Host memory the prompt cache holds (states of earlier prompts), per model.",
        [(f'{{model="{m}"}}', c.nbytes) for m, c in caches.items()],
    )
    metric(
        "prompt_cache_restored_tokens_total",
        "counter",
        "Prompt tokens copied back from the prompt cache instead of evaluated, per model.",
        [(f'{{model="{m}"}}', c.stats.restored_tokens) for m, c in caches.items()],
    )
    metric("info", "gauge", "The served model.", [(f'{{model="{model}"}}', 1)])
    return "\n".join(lines) + "\n"
