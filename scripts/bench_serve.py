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

``--setting "LABEL=ARGS"`` (repeatable) adds more ``localspec serve`` settings, e.g. ``"suffix=--strategy
suffix"``. ``--llama-server "N:MODE,..."`` also starts llama.cpp's own ``llama-server`` (the peer build of
``localspec bench --peer``, same target, draft, threads) with ``--parallel N`` slots and speculative MODE
(``none``, ``draft-simple``, ``ngram-simple``, ``ngram-mod``, ...; sized as in ``localspec.bench.peer``),
each slot
with the same context as ``localspec serve``. ``--base-url URL`` drives an endpoint that is already running
instead, under the label ``--label``. ``--png`` draws throughput and p50 latency against clients.

    python scripts/bench_serve.py                                  # embedded pair, a quick run
    python scripts/bench_serve.py -t models/target.gguf -d models/draft.gguf --requests 8 --max-tokens 64 \
        --llama-server 1:none,1:draft-simple,4:none,4:draft-simple --png serve.png
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

from localspec.bench import peer
from localspec.bench.workloads import Prompt, select_workloads
from localspec.llama import programs


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


class LlamaServer:
    """llama.cpp's ``llama-server``: ``--parallel`` slots, one speculative mode as in
    ``localspec.bench.peer``."""

    def __init__(self, target: Path, draft: Path | None, slots: int, mode: str, threads: int, n_ctx: int):
        args = peer.session_mode_args(mode, target=target, draft=draft, threads=threads, n_ctx=n_ctx * slots)
        args[args.index("-np") + 1] = str(slots)
        binary = programs.server_binary() or programs.build_server(log=lambda m: print(m, file=sys.stderr))
        log = programs.vendored_dir() / "logs" / f"serve-np{slots}-{mode}.log"
        self.server = peer.PeerServer(binary, args, log)
        self.server.wait_ready()
        self.url = self.server.url + "/v1"
        self.model = httpx.get(self.url + "/models", timeout=30).json()["data"][0]["id"]

    def stop(self) -> None:
        self.server.close()


def write_png(rows: list[dict], path: Path) -> None:
    """Two panels against clients: throughput (tokens/s, all clients) and p50 latency, a line per setting."""
    from PIL import Image, ImageDraw, ImageFont

    settings = list(dict.fromkeys(r["setting"] for r in rows))
    clients = sorted({r["clients"] for r in rows})
    colours = [
        (52, 101, 164),
        (115, 210, 22),
        (245, 121, 0),
        (117, 80, 123),
        (193, 125, 17),
        (204, 0, 0),
        (46, 52, 54),
        (6, 152, 154),
        (173, 127, 168),
        (143, 89, 2),
    ]
    try:
        font = ImageFont.load_default(size=13)
    except TypeError:  # Pillow < 10.1
        font = ImageFont.load_default()
    panel_w, panel_h, pad = 470, 300, 55
    legend_h = 18 * len(settings) + 10
    img = Image.new("RGB", (2 * panel_w + 40, panel_h + 2 * pad + legend_h), "white")
    d = ImageDraw.Draw(img)
    for p, (key, title) in enumerate(
        [
            ("throughput", "tokens/s, all clients together"),
            ("latency_p50", "latency p50 (s), request to last token"),
        ]
    ):
        x0, y0 = 20 + p * (panel_w + 10) + pad, pad
        w, h = panel_w - pad - 10, panel_h - 20
        vmax = max((r[key] for r in rows if r[key] == r[key]), default=1.0) * 1.1 or 1.0
        d.text((x0 - pad + 10, 15), title, fill="black", font=font)
        d.rectangle([x0, y0, x0 + w, y0 + h], outline=(160, 160, 160))
        for i in range(5):
            v = vmax * i / 4
            y = y0 + h - h * i / 4
            d.line([x0 - 4, y, x0, y], fill="black")
            d.text((x0 - 45, y - 7), f"{v:.1f}", fill="black", font=font)
        x_of = {c: x0 + w * (i + 0.5) / len(clients) for i, c in enumerate(clients)}
        for c, x in x_of.items():
            d.text((x - 4, y0 + h + 5), str(c), fill="black", font=font)
        d.text((x0 + w / 2 - 20, y0 + h + 22), "clients", fill="black", font=font)
        for k, setting in enumerate(settings):
            pts = [(x_of[r["clients"]], y0 + h - h * r[key] / vmax) for r in rows if r["setting"] == setting]
            col = colours[k % len(colours)]
            if len(pts) > 1:
                d.line(pts, fill=col, width=2)
            for x, y in pts:
                d.ellipse([x - 3, y - 3, x + 3, y + 3], fill=col)
    for k, setting in enumerate(settings):
        y = panel_h + 2 * pad - 10 + 18 * k
        d.rectangle([30, y + 3, 44, y + 12], fill=colours[k % len(colours)])
        d.text((52, y), setting, fill="black", font=font)
    img.save(path)


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
    ap.add_argument(
        "--setting", action="append", default=[], help='another localspec serve setting: "LABEL=ARGS"'
    )
    ap.add_argument("--llama-server", default="", help='llama.cpp settings "SLOTS:MODE,..." (needs -t)')
    ap.add_argument("--threads", type=int, default=2, help="threads (llama-server and localspec serve)")
    ap.add_argument("--n-ctx", type=int, default=4096, help="context per request / per llama-server slot")
    ap.add_argument("--png", help="also draw throughput and latency against clients here")
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

    common = ["--threads", str(a.threads), "--n-ctx", str(a.n_ctx)]
    targets: list[tuple[str, Any]] = []
    if a.base_url:
        targets = [(a.label, None)]
    else:
        pick = [*(["-t", a.target] if a.target else []), *(["-p", a.preset] if a.preset else [])]
        spec = pick + (["-d", a.draft] if a.draft else []) + common + a.serve_arg
        targets = [("speculative", spec)]
        for setting in a.setting:
            label, _, extra = setting.partition("=")
            targets.append((label, spec + extra.split()))
        if not a.no_baseline:
            targets.append(("target alone (--draft none)", pick + ["-d", "none"] + common + a.serve_arg))
    for item in filter(None, a.llama_server.split(",")):
        if not a.target:
            raise SystemExit("--llama-server needs --target (and --draft for draft-simple)")
        slots, _, mode = item.partition(":")
        targets.append((f"llama-server -np {slots} {mode}", ("llama", int(slots), mode)))

    rows: list[dict] = []
    for label, args in targets:
        server: LocalServer | LlamaServer | None = None
        if args is None:
            url, model = a.base_url, a.model
        elif isinstance(args, tuple):
            _, slots, mode = args
            draft = Path(a.draft) if a.draft and a.draft not in ("none", "ngram", "auto") else None
            server = LlamaServer(Path(a.target), draft, slots, mode, a.threads, a.n_ctx)
            url, model = server.url, server.model
        else:
            server = LocalServer(args)
            url, model = server.url, server.model
            label = f"localspec {label}"
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
    if a.png:
        write_png(rows, Path(a.png))
    if a.json_out:
        Path(a.json_out).write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
