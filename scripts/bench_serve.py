#!/usr/bin/env python3
"""Concurrency profile of ``localspec serve``: where speculation stops paying under load.

Starts ``localspec serve`` (a subprocess, as a user would run it) once per setting, with speculation (the
pair as chosen by ``--target/--draft/--preset``, the embedded pair by default) and without (``--draft
none``), and drives it with 1, 2, 4 and 8 concurrent clients through the official ``openai`` client,
streaming. Every level sends the same requests (the bench prompts of ``--workloads``, cycled to
``--requests``), greedy. Reported per level: throughput (completion tokens per wall-clock second, all
clients together), latency p50/p95 (request sent -> last token) and time to first token p50/p95, plus the
acceptance the server reported. localspec serialises generations, so throughput should stay flat while
latency grows with the number of clients.

``--base-url URL`` drives an endpoint that is already running instead (e.g. llama.cpp's ``llama-server
--parallel 4``, to compare), under the label ``--label``.

    python scripts/bench_serve.py                                  # embedded pair, a quick run
    python scripts/bench_serve.py -t models/target.gguf -d models/draft.gguf --requests 8 --max-tokens 64
    python scripts/bench_serve.py --base-url http://127.0.0.1:8080/v1 --label "llama-server -np 4"
"""

from __future__ import annotations

import argparse
import json
import queue
import re
import signal
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import openai

from localspec.bench import Prompt, select_workloads


@dataclass
class Result:
    prompt_id: str
    sent: float
    first: float | None = None
    done: float | None = None
    tokens: int = 0
    drafted: int = 0
    accepted: int = 0
    error: str | None = None

    @property
    def latency(self) -> float:
        return (self.done or self.sent) - self.sent

    @property
    def ttft(self) -> float:
        return (self.first or self.done or self.sent) - self.sent


@dataclass
class Level:
    label: str
    clients: int
    wall: float
    results: list[Result] = field(default_factory=list)

    def row(self) -> dict:
        ok = [r for r in self.results if r.error is None]
        tokens = sum(r.tokens for r in ok)
        drafted = sum(r.drafted for r in ok)
        return {
            "setting": self.label,
            "clients": self.clients,
            "requests": len(ok),
            "errors": len(self.results) - len(ok),
            "tokens": tokens,
            "throughput": tokens / self.wall if self.wall else 0.0,
            "latency_p50": _pct([r.latency for r in ok], 50),
            "latency_p95": _pct([r.latency for r in ok], 95),
            "ttft_p50": _pct([r.ttft for r in ok], 50),
            "ttft_p95": _pct([r.ttft for r in ok], 95),
            "acceptance": sum(r.accepted for r in ok) / drafted if drafted else None,
        }


def _pct(values: list[float], p: float) -> float:
    if not values:
        return float("nan")
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[int(p) - 1]


def one_request(client: openai.OpenAI, model: str, prompt: Prompt, max_tokens: int) -> Result:
    res = Result(prompt.id, time.perf_counter())
    try:
        stream: Any
        if prompt.chat:
            stream = client.chat.completions.create(
                model=model,
                messages=[{"role": "user", "content": prompt.text}],
                max_tokens=max_tokens,
                temperature=0,
                stream=True,
                stream_options={"include_usage": True},
            )
        else:
            stream = client.completions.create(
                model=model,
                prompt=prompt.text,
                max_tokens=max_tokens,
                temperature=0,
                stream=True,
                stream_options={"include_usage": True},
            )
        for chunk in stream:
            if chunk.choices:
                c = chunk.choices[0]
                text = c.delta.content if prompt.chat else c.text
                if text and res.first is None:
                    res.first = time.perf_counter()
            extra = chunk.model_extra or {}
            if "localspec" in extra:
                res.drafted, res.accepted = extra["localspec"]["drafted"], extra["localspec"]["accepted"]
            if chunk.usage is not None:
                res.tokens = chunk.usage.completion_tokens
        res.done = time.perf_counter()
    except openai.APIError as exc:
        res.error = str(exc)
        res.done = time.perf_counter()
    return res


def run_level(
    base_url: str, model: str, label: str, clients: int, work: list[Prompt], max_tokens: int
) -> Level:
    todo: queue.Queue[Prompt] = queue.Queue()
    for p in work:
        todo.put(p)
    results: list[Result] = []
    lock = threading.Lock()

    def client_loop() -> None:
        client = openai.OpenAI(base_url=base_url, api_key="bench", max_retries=0, timeout=3600)
        while True:
            try:
                p = todo.get_nowait()
            except queue.Empty:
                return
            r = one_request(client, model, p, max_tokens)
            with lock:
                results.append(r)

    t0 = time.perf_counter()
    threads = [threading.Thread(target=client_loop) for _ in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return Level(label, clients, time.perf_counter() - t0, results)


class LocalServer:
    """``localspec serve --port 0 ...`` in a subprocess; the address is read from its start line."""

    def __init__(self, args: list[str]) -> None:
        cmd = [sys.executable, "-m", "localspec", "serve", "--port", "0", *args]
        self.proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
        self.url = self.model = ""
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            m = re.search(r"at (http://\S+/v1)\s+model (\S+)", line)
            if m:
                self.url, self.model = m.group(1), m.group(2)
                break
        if not self.url:
            self.proc.wait()
            raise SystemExit(f"localspec serve did not start (exit {self.proc.returncode}): {' '.join(cmd)}")
        threading.Thread(target=self.proc.stderr.read, daemon=True).start()  # keep the pipe drained
        httpx.get(self.url.removesuffix("/v1") + "/health", timeout=60).raise_for_status()

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGINT)
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def markdown(rows: list[dict]) -> str:
    head = (
        "| setting | clients | requests | tokens/s (all clients) | latency p50 / p95 (s) | "
        "first token p50 / p95 (s) | acceptance |"
    )
    out = [head, "|---|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        acc = f"{r['acceptance']:.0%}" if r["acceptance"] is not None else "-"
        err = f" ({r['errors']} failed)" if r["errors"] else ""
        out.append(
            f"| {r['setting']} | {r['clients']} | {r['requests']}{err} | {r['throughput']:.1f} | "
            f"{r['latency_p50']:.2f} / {r['latency_p95']:.2f} | "
            f"{r['ttft_p50']:.2f} / {r['ttft_p95']:.2f} | {acc} |"
        )
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", "-t")
    ap.add_argument(
        "--draft", "-d", help="the speculative setting's draft (default: auto / the embedded one)"
    )
    ap.add_argument("--preset", "-p")
    ap.add_argument("--serve-arg", action="append", default=[], help="extra argument for localspec serve")
    ap.add_argument("--clients", default="1,2,4,8", help="concurrency levels (default 1,2,4,8)")
    ap.add_argument("--workloads", default="code,chat", help="bench prompt files (localspec/data/prompts)")
    ap.add_argument("--prompts", type=int, default=4, help="prompts taken from each workload")
    ap.add_argument("--requests", type=int, default=16, help="requests per level (prompts cycled)")
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--no-baseline", action="store_true", help="skip the --draft none run")
    ap.add_argument("--base-url", help="drive this running endpoint instead of starting localspec serve")
    ap.add_argument("--model", default="", help="model name for --base-url")
    ap.add_argument("--label", default="endpoint", help="label of --base-url in the table")
    ap.add_argument("--json", dest="json_out", help="also write the rows as JSON here")
    a = ap.parse_args()

    prompts = [p for w in select_workloads(a.workloads.split(","), a.prompts) for p in w.prompts]
    work = [prompts[i % len(prompts)] for i in range(a.requests)]
    levels = [int(c) for c in a.clients.split(",")]

    if a.base_url:
        targets = [(a.label, None)]
    else:
        pick = [*(["-t", a.target] if a.target else []), *(["-p", a.preset] if a.preset else [])]
        spec = pick + (["-d", a.draft] if a.draft else []) + a.serve_arg
        targets = [("speculative", spec)]
        if not a.no_baseline:
            targets.append(("target alone (--draft none)", pick + ["-d", "none"] + a.serve_arg))

    rows: list[dict] = []
    for label, args in targets:
        server = None
        if args is None:
            url, model = a.base_url, a.model
        else:
            server = LocalServer(args)
            url, model = server.url, server.model
            label = f"{label}: {model}"
        try:
            client = openai.OpenAI(base_url=url, api_key="bench", max_retries=0, timeout=3600)
            one_request(client, model, work[0], min(8, a.max_tokens))  # warm-up, not counted
            for c in levels:
                level = run_level(url, model, label, c, work, a.max_tokens)
                rows.append(level.row())
                print(markdown(rows[-1:]).splitlines()[-1], file=sys.stderr, flush=True)  # progress
        finally:
            if server is not None:
                server.stop()

    print(markdown(rows))
    if a.json_out:
        Path(a.json_out).write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
