"""How much a long prompt arriving delays the requests already generating (issue 53's chunked-prefill target:
with 3 sequences generating, a 4,000-token prompt arriving raises their p95 inter-token gap by at most 2x
their median gap).

Usage:
  python scripts/prefill_gap.py [--preset qwen2.5-coder-1.5b [--models DIR] | -t T.gguf [-d D.gguf]]
                                [--prompt-tokens 4000] [--n-ctx 5120] [--repeats 3] [--json PATH]

Starts ``localspec serve --parallel 4 --n-ctx N --no-store`` (the embedded pair unless ``--target`` or
``--preset`` say otherwise; its own ``LOCALSPEC_HOME`` beside its log), warms it up (four short requests at
once: the machine's costs measured, if the strategy needs them, before anything is timed), then starts 3
streaming requests with long outputs and records the arrival of every streamed token (a stream that ends is
followed at once by another). Every repeat waits ``--before`` seconds, sends one request with a
~``--prompt-tokens`` prompt (code from localspec's own source, a different part each repeat: nothing of it is
in the cache) and times it to its first token. Per repeat it reports the 3 streams' median gap in the
``--before`` seconds before the long prompt was sent, their p95 (and largest) gap while its prefill ran (the
gaps that overlap its send .. first token), and the ratio; the median of the repeats' ratios is the result.
A context smaller than the prompt (the embedded pair's 2,048 tokens) shortens the prompt, and says so.

Gaps are counted twice: between tokens, and between deliveries (a step's accepted draft tokens arrive
together: a token within ``--burst-ms`` of the one before it is part of the same delivery). With drafting the
median gap between tokens can be next to nothing, so the verdict (the target's 2x) is on deliveries; both are
printed and written.

``--models DIR``: a folder holding the preset's GGUF files under their Hub names (as
scripts/fetch_qwen_pair.py leaves them in the folder it is given): they are linked into an offline Hugging
Face cache beside the server's log, so ``--preset`` runs them without a download.
"""

from __future__ import annotations

import argparse
import datetime as dt
import hashlib
import http.client
import json
import os
import re
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from localspec.bench.clients import start_serve
from localspec.bench.report import machine_info
from localspec.constants import PACKAGE_DIR

#: The issue's bound: the p95 gap during a long prompt's prefill over the median gap before it.
TARGET_RATIO = 2.0
#: The streams' prompts (long answers; each stream keeps one).
STREAM_PROMPTS = (
    "Write a long, detailed tutorial on Python's asyncio, with many code examples and explanations.",
    "Explain step by step, at length, how a hash map works, with a full implementation in C.",
    "Write a long story about a lighthouse keeper and a storm, chapter by chapter.",
)
_CONTEXT = re.compile(r"context (\d+) tokens")


@dataclass(frozen=True)
class Server:
    """Where the measured server listens, the model name it answers to and its context per request."""

    host: str
    port: int
    model: str
    n_ctx: int


@dataclass
class Streams:
    """The generating requests: each stream's token arrivals as (request number, time), and how to stop
    them."""

    arrivals: list[list[tuple[int, float]]]
    stop: threading.Event = field(default_factory=threading.Event)
    errors: list[str] = field(default_factory=list)
    threads: list[threading.Thread] = field(default_factory=list)


# ---------------------------------------------------------------------------------- the preset's files
def offline_preset_cache(preset: str, models: Path, cache: Path) -> dict[str, str]:
    """Link the files of ``preset`` found in ``models`` into an offline Hugging Face cache at ``cache``.

    Args:
        preset: a preset name (see ``localspec presets``).
        models: a folder holding its target and draft GGUF files under their Hub names.
        cache: where the cache is made.

    Returns:
        The environment that makes ``localspec serve --preset`` read that cache, offline.

    Raises:
        SystemExit: a file of the preset is not in ``models`` (naming it and the folder).
    """
    from localspec.hub.download import select_files
    from localspec.hub.presets import HubRef, get_preset

    found = get_preset(preset)
    names = sorted(p.name for p in models.iterdir() if p.is_file())
    for ref in (found.target, found.draft_model):
        if not isinstance(ref, HubRef):
            continue  # embedded or a local path: nothing to fetch
        try:
            files = select_files(names, ref.filename)
        except LookupError as exc:
            raise SystemExit(
                f"preset {preset}: no single file matching {ref.filename} in {models} ({exc}): "
                f"fetch it (localspec download {preset}, or scripts/fetch_qwen_pair.py {models})"
            ) from None
        commit = hashlib.sha1(f"{ref.repo_id}@{ref.revision}".encode()).hexdigest()
        repo = cache / ("models--" + ref.repo_id.replace("/", "--"))
        (repo / "refs").mkdir(parents=True, exist_ok=True)
        (repo / "refs" / ref.revision).write_text(commit)
        snapshot = repo / "snapshots" / commit
        snapshot.mkdir(parents=True, exist_ok=True)
        for name in files:
            link = snapshot / name
            if not link.exists():
                link.symlink_to((models / name).resolve())
    return {"HF_HUB_CACHE": str(cache), "HF_HUB_OFFLINE": "1"}


# ------------------------------------------------------------------------------------------ requests
def _post(server: Server, path: str, body: dict[str, Any], timeout_s: float = 3600) -> tuple[Any, Any]:
    conn = http.client.HTTPConnection(server.host, server.port, timeout=timeout_s)
    conn.request("POST", path, body=json.dumps(body), headers={"Content-Type": "application/json"})
    return conn, conn.getresponse()


def _data_lines(response: Any) -> Any:
    """The JSON chunks of a server-sent event stream, up to ``[DONE]``."""
    for raw in response:
        line = raw.decode("utf-8", errors="replace").strip()
        if line == "data: [DONE]":
            return
        if line.startswith("data:"):
            chunk = json.loads(line[5:])
            if "error" in chunk:
                raise RuntimeError(f"the server said: {chunk['error'].get('message')}")
            yield chunk


def _complete(server: Server, prompt: str, max_tokens: int) -> dict[str, Any]:
    conn, response = _post(server, "/v1/completions", _body(server, prompt, max_tokens, stream=False))
    try:
        raw = response.read()
        if response.status != 200:
            raise SystemExit(f"the server answered {response.status}: {raw[:300]!r}")
        return dict(json.loads(raw))
    finally:
        conn.close()


def _body(server: Server, prompt: str, max_tokens: int, *, stream: bool) -> dict[str, Any]:
    body = {"model": server.model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0}
    return body | ({"stream": True, "stream_options": {"include_usage": True}} if stream else {})


def _stream_forever(server: Server, i: int, max_tokens: int, streams: Streams) -> None:
    """Stream ``i``: one long chat answer after another until told to stop, every token's arrival kept."""
    request = 0
    while not streams.stop.is_set():
        body = {
            "model": server.model,
            "messages": [{"role": "user", "content": STREAM_PROMPTS[i % len(STREAM_PROMPTS)]}],
            "max_tokens": max_tokens,
            "temperature": 0,
            "stream": True,
        }
        conn, response = _post(server, "/v1/chat/completions", body)
        try:
            for chunk in _data_lines(response):
                now = time.perf_counter()
                if any((c.get("delta") or {}).get("content") for c in chunk.get("choices") or ()):
                    streams.arrivals[i].append((request, now))
                if streams.stop.is_set():
                    break
        except (OSError, ValueError, RuntimeError, http.client.HTTPException) as exc:
            streams.errors.append(f"stream {i}: {type(exc).__name__}: {exc}")
            return
        finally:
            response.close()
            conn.close()
        request += 1


def _long_request(server: Server, prompt: str, max_tokens: int) -> dict[str, Any] | None:
    """The long prompt, streamed: when it was sent and its first token came, its prompt tokens; None when
    it is longer than the context (the estimate of its tokens was short)."""
    sent = time.perf_counter()
    conn, response = _post(server, "/v1/completions", _body(server, prompt, max_tokens, stream=True))
    first, prompt_tokens = None, None
    try:
        if response.status != 200:
            raw = response.read()
            if b"context_length_exceeded" in raw:
                return None
            raise SystemExit(f"the long prompt was refused ({response.status}): {raw[:300]!r}")
        for chunk in _data_lines(response):
            first = first or time.perf_counter()
            if chunk.get("usage"):
                prompt_tokens = chunk["usage"]["prompt_tokens"]
    finally:
        response.close()
        conn.close()
    return {"sent": sent, "first": first or time.perf_counter(), "prompt_tokens": prompt_tokens}


# ------------------------------------------------------------------------------------------ the text
def _corpus() -> str:
    """localspec's own source, file after file: code, none of it in any prompt the server has seen."""
    files = sorted(p for p in PACKAGE_DIR.rglob("*.py") if "data" not in p.relative_to(PACKAGE_DIR).parts)
    return "".join(f"# {p.relative_to(PACKAGE_DIR)}\n{p.read_text(encoding='utf-8')}\n" for p in files)


def _chars_per_token(server: Server, corpus: str) -> float:
    """How many characters of the corpus one token holds, as the served model tokenizes it (one request of
    1,500 characters from three places, one token out)."""
    third = len(corpus) // 3
    sample = "".join(corpus[i * third : i * third + 500] for i in range(3))
    used = _complete(server, sample, 1)["usage"]["prompt_tokens"]
    return len(sample) / max(1, int(used))


# ------------------------------------------------------------------------------------------ the gaps
def _gaps(arrivals: list[tuple[int, float]], burst_s: float) -> list[tuple[float, float]]:
    """(start, end) of each gap between two arrivals of the same request; with ``burst_s``, an arrival
    within ``burst_s`` of the one before it is part of that one's delivery (no gap of its own)."""
    out = []
    last: tuple[int, float] | None = None
    for request, t in arrivals:
        if last is not None and last[0] == request:
            if t - last[1] < burst_s:
                continue  # the same delivery: the gap is measured from its first token
            out.append((last[1], t))
        last = (request, t)
    return out


def _p95(xs: list[float]) -> float:
    return statistics.quantiles(xs, n=20, method="inclusive")[18] if len(xs) > 1 else (xs[0] if xs else 0.0)


def gap_summary(
    arrivals: Sequence[list[tuple[int, float]]], sent: float, first: float, before_s: float, burst_s: float
) -> dict[str, Any]:
    """The streams' gaps around one long prompt.

    Args:
        arrivals: each stream's token arrivals (request number, time).
        sent: when the long prompt was sent.
        first: when its first token came (its prefill is over).
        before_s: how far back before ``sent`` the median gap is taken.
        burst_s: arrivals closer than this are one delivery (0: every token counts).

    Returns:
        The median gap before (seconds), the p95 and largest gap during the prefill, their counts and the
        ratio p95 / median.
    """
    gaps = [g for stream in arrivals for g in _gaps(stream, burst_s)]
    before = [b - a for a, b in gaps if a >= sent - before_s and b <= sent]
    during = [b - a for a, b in gaps if b > sent and a < first]
    median = statistics.median(before) if before else 0.0
    p95 = _p95(during)
    return {
        "median_before_s": median,
        "p95_during_s": p95,
        "max_during_s": max(during, default=0.0),
        "n_before": len(before),
        "n_during": len(during),
        "ratio": p95 / median if median else None,
    }


# ------------------------------------------------------------------------------------------ the run
@dataclass(frozen=True)
class Plan:
    """What one measurement does (see the module docstring)."""

    prompt_tokens: int = 4000
    repeats: int = 3
    before_s: float = 5.0
    after_s: float = 1.0
    stream_tokens: int = 1024
    long_max_tokens: int = 4
    burst_s: float = 0.002


def _server_of(url: str, model: str, log: Path) -> Server:
    parts = urlsplit(url)
    found = _CONTEXT.search(log.read_text(encoding="utf-8", errors="replace"))
    n_ctx = int(found.group(1)) if found else 4096
    return Server(parts.hostname or "127.0.0.1", parts.port or 80, model, n_ctx)


def _warm_up(server: Server) -> None:
    """Four short requests at once: every slot once, the machine's costs measured if they are needed."""
    threads = [
        threading.Thread(target=_complete, args=(server, f"def f{i}(x):\n", 8), daemon=True) for i in range(4)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def _start_streams(server: Server, plan: Plan) -> Streams:
    streams = Streams(arrivals=[[] for _ in range(3)])
    tokens = max(16, min(plan.stream_tokens, server.n_ctx - 128))
    for i in range(3):
        t = threading.Thread(target=_stream_forever, args=(server, i, tokens, streams), daemon=True)
        streams.threads.append(t)
        t.start()
    deadline = time.monotonic() + 600
    while any(len(a) < 5 for a in streams.arrivals):  # all three generating
        if streams.errors or time.monotonic() > deadline:
            raise SystemExit(f"the streams did not start: {streams.errors or 'no tokens in 600 s'}")
        time.sleep(0.05)
    return streams


def _long_prompts(server: Server, plan: Plan, echo: Callable[[str], None]) -> list[str]:
    """One prompt per repeat of about ``plan.prompt_tokens`` tokens (fewer where the context is smaller)."""
    corpus = _corpus()
    per_token = _chars_per_token(server, corpus)
    room = int((server.n_ctx - plan.long_max_tokens - 16) * 0.85)  # for the estimate's error
    tokens = min(plan.prompt_tokens, room)
    if tokens < plan.prompt_tokens:
        echo(f"the context holds {server.n_ctx} tokens: the long prompt is about {tokens} tokens, not more")
    chars = int(tokens * per_token)
    prompts = []
    for r in range(plan.repeats):  # (the estimate's sample is 500 characters at a third, two thirds)
        at = (600 + r * (chars + 997)) % max(1, len(corpus) - chars)
        prompts.append(corpus[at : at + chars])
    return prompts


def run_prefill_gap(
    serve_args: Sequence[str],
    plan: Plan,
    *,
    parallel: int = 4,
    log_dir: Path | None = None,
    env: dict[str, str] | None = None,
    echo: Callable[[str], None] = lambda line: print(line, file=sys.stderr),
) -> dict[str, Any]:
    """Start ``localspec serve``, measure the streams' gaps around ``plan.repeats`` long prompts, stop it.

    Args:
        serve_args: ``serve``'s model arguments (none: the embedded pair), ``--n-ctx`` among them.
        plan: the sizes and times.
        parallel: the server's ``--parallel`` (4: three streams and the long prompt).
        log_dir: where the server's log goes (default: a temporary folder).
        env: variables added to the server's environment.
        echo: progress lines.

    Returns:
        The result: the setup, one entry per repeat (tokens and deliveries), the medians over the repeats
        and every stream's arrivals (seconds from the first).
    """
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None  # how busy the machine was already
    folder = Path(log_dir or tempfile.mkdtemp(prefix="prefill-gap-"))
    log = folder / "serve.log"
    args = ["--parallel", str(parallel), "--no-store", *serve_args]
    # its own cache folder: nothing of the user's (costs, last preset) read or written; the costs a strategy
    # needs are measured in the warm-up
    env = {**os.environ, "LOCALSPEC_HOME": str(folder / "home"), **(env or {})}
    echo(f"starting localspec serve {' '.join(args)} (log: {log})")
    with start_serve(args, log, env) as proc:
        server = _server_of(proc.url, proc.model, log)
        echo("warming up (the machine's costs are measured now if the strategy needs them)")
        _warm_up(server)
        prompts = _long_prompts(server, plan, echo)
        streams = _start_streams(server, plan)
        repeats = []
        try:
            for r, prompt in enumerate(prompts):
                time.sleep(plan.before_s)
                long = _long_request(server, prompt, plan.long_max_tokens)
                while long is None:  # longer than the context: a tenth shorter (refused at once)
                    prompt = prompt[: len(prompt) * 9 // 10]
                    long = _long_request(server, prompt, plan.long_max_tokens)
                time.sleep(plan.after_s)
                ttft = long["first"] - long["sent"]
                echo(f"repeat {r + 1}/{len(prompts)}: {long['prompt_tokens']} prompt tokens in {ttft:.2f} s")
                repeats.append(_repeat_entry(streams, long, plan))
        finally:
            streams.stop.set()
            for t in streams.threads:
                t.join(60)
    if streams.errors:
        raise SystemExit("a stream failed: " + "; ".join(streams.errors))
    result = _result(serve_args, plan, parallel, server, repeats, streams)
    result["machine"]["load_average_before"] = load
    return result


def _repeat_entry(streams: Streams, long: dict[str, Any], plan: Plan) -> dict[str, Any]:
    arrivals = [list(a) for a in streams.arrivals]
    sent, first = long["sent"], long["first"]
    return {
        "prompt_tokens": long["prompt_tokens"],
        "prefill_s": first - sent,
        "deliveries": gap_summary(arrivals, sent, first, plan.before_s, plan.burst_s),
        "tokens": gap_summary(arrivals, sent, first, plan.before_s, 0.0),
        "sent": sent,
        "first": first,
    }


def _result(
    serve_args: Sequence[str],
    plan: Plan,
    parallel: int,
    server: Server,
    repeats: list[dict[str, Any]],
    streams: Streams,
) -> dict[str, Any]:
    t0 = min((t for a in streams.arrivals for _, t in a), default=0.0)
    for r in repeats:
        r["sent"], r["first"] = r["sent"] - t0, r["first"] - t0
    medians = {}
    for kind in ("deliveries", "tokens"):
        ratios = [r[kind]["ratio"] for r in repeats if r[kind]["ratio"] is not None]
        medians[kind] = statistics.median(ratios) if ratios else None
    pairs = zip(serve_args, serve_args[1:], strict=False)
    threads = next((int(v) for k, v in pairs if k == "--threads"), None)
    return {
        "measured": dt.datetime.now(dt.timezone.utc).date().isoformat(),  # the date, as every result file
        "measured_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "machine": machine_info(threads),
        "setup": {
            "serve_args": [Path(a).name if a.endswith(".gguf") else a for a in serve_args],
            "parallel": parallel,
            "model": server.model,
            "n_ctx": server.n_ctx,
            **{k: v for k, v in plan.__dict__.items()},
        },
        "repeats": repeats,
        "median_ratio": medians,
        "target_ratio": TARGET_RATIO,
        "meets_target": medians["deliveries"] is not None and medians["deliveries"] <= TARGET_RATIO,
        "arrivals": [[[n, round(t - t0, 5)] for n, t in a] for a in streams.arrivals],
    }


def table(result: dict[str, Any]) -> str:
    """The result as a Markdown table.

    Args:
        result: what :func:`run_prefill_gap` returned (or its JSON read back).

    Returns:
        One row per repeat (deliveries, then tokens), the medians and the verdict.
    """
    s = result["setup"]
    rows = [
        f"{result['measured']}, {s['model']}, --parallel {s['parallel']}, context {s['n_ctx']}: 3 streams "
        f"generating, a long prompt every {s['before_s']:g} s; gaps in ms"
        + _load_note(result["machine"].get("load_average_before")),
        "",
        "| repeat | prompt tokens | prefill s | counted | median gap before | p95 gap during prefill "
        "| largest during | ratio |",
        "|---:|---:|---:|---|---:|---:|---:|---:|",
    ]
    for i, r in enumerate(result["repeats"], 1):
        for kind in ("deliveries", "tokens"):
            g = r[kind]
            ratio = f"{g['ratio']:.1f}x" if g["ratio"] is not None else "-"
            rows.append(
                f"| {i} | {r['prompt_tokens']} | {r['prefill_s']:.2f} | {kind} "
                f"| {g['median_before_s'] * 1e3:.1f} ({g['n_before']}) "
                f"| {g['p95_during_s'] * 1e3:.1f} ({g['n_during']}) "
                f"| {g['max_during_s'] * 1e3:.1f} | {ratio} |"
            )
    m = result["median_ratio"]
    said = {k: (f"{v:.1f}x" if v is not None else "-") for k, v in m.items()}
    verdict = "meets" if result["meets_target"] else "misses"
    rows += [
        "",
        f"median ratio over the repeats: {said['deliveries']} between deliveries, {said['tokens']} between "
        f"tokens; the target (at most {result['target_ratio']:g}x, deliveries): {verdict}",
    ]
    return "\n".join(rows)


def _load_note(load: float | None) -> str:
    if load is None:
        return ""
    return f"; load average {load:.1f} before it started" + (" (a busy machine)" if load >= 0.5 else "")


def main(argv: Sequence[str] | None = None) -> int:
    """The command line (see the module docstring).

    Args:
        argv: the arguments (default: ``sys.argv[1:]``).

    Returns:
        0 once measured (whether or not the target is met: the table says).
    """
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("-t", "--target", help="target GGUF (default: the embedded pair)")
    ap.add_argument("-d", "--draft", help="draft GGUF, 'ngram', 'none' or 'auto'")
    ap.add_argument("-p", "--preset", help="a preset name, e.g. qwen2.5-coder-1.5b")
    ap.add_argument("--models", type=Path, help="a folder with the preset's files (see above)")
    ap.add_argument("--strategy", help="the drafting strategy (serve's --strategy)")
    ap.add_argument("--threads", type=int, help="CPU threads (serve's --threads)")
    ap.add_argument("--n-ctx", type=int, default=5120, help="context per request (default 5120)")
    ap.add_argument("--prompt-tokens", type=int, default=4000, help="the long prompt's size (default 4000)")
    ap.add_argument("--repeats", type=int, default=3, help="long prompts, one after another (default 3)")
    ap.add_argument("--before", type=float, default=5.0, help="seconds of steady streams before each")
    ap.add_argument("--burst-ms", type=float, default=2.0, help="arrivals this close are one delivery")
    ap.add_argument("--stream-tokens", type=int, default=1024, help="each stream request's max_tokens")
    ap.add_argument("--log-dir", type=Path, help="where the server's log goes (default: a temporary folder)")
    ap.add_argument("--json", type=Path, help="write the result here")
    ap.add_argument("--from-json", type=Path, help="print the table of a result file and exit")
    a = ap.parse_args(argv)
    if a.from_json:
        print(table(json.loads(a.from_json.read_text(encoding="utf-8"))))
        return 0
    passed = {"--target": a.target, "--draft": a.draft, "--preset": a.preset, "--strategy": a.strategy}
    passed.update({"--threads": a.threads, "--n-ctx": a.n_ctx})
    serve_args = [str(x) for k, v in passed.items() if v is not None for x in (k, v)]
    log_dir = a.log_dir or Path(tempfile.mkdtemp(prefix="prefill-gap-"))
    env = None
    if a.models:
        if not a.preset:
            ap.error("--models links a preset's files: give --preset too (or --target FILE instead)")
        env = offline_preset_cache(a.preset, a.models, log_dir / "hf-cache")
    plan = Plan(a.prompt_tokens, a.repeats, a.before, 1.0, a.stream_tokens, 4, a.burst_ms / 1e3)
    result = run_prefill_gap(serve_args, plan, log_dir=log_dir, env=env)
    print(table(result))
    if a.json:
        a.json.parent.mkdir(parents=True, exist_ok=True)
        a.json.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
