"""Soak ``localspec serve --parallel 4``: many clients, valid and bad requests mixed, for minutes; then check
that nothing leaked.

Usage:
  python scripts/soak_serve.py [--minutes 10] [--clients 8] [--parallel 4]
                               [--target T.gguf [--draft D.gguf] | --preset NAME] [--log-dir DIR]

Starts ``localspec serve --port 0 --parallel 4`` (the embedded pair unless ``--target``/``--preset`` say
otherwise; ``--draft``, ``--strategy``, ``--n-ctx`` and ``--threads`` pass through) and runs ``--clients``
threads for ``--minutes``. Each client loops over a random mix of requests:

- valid: a whole (not streamed) completion, a stream read to its end, a stream abandoned after a few chunks
  (the connection closed mid-stream), a whole completion abandoned before its answer came;
- bad: a body that is not JSON, an unknown model, a negative ``max_tokens``, a ``json_schema`` response format
  that is not a valid schema, a prompt longer than the context.

Per kind it counts what was sent, answered (a complete 2xx; for an abandoned stream, a 2xx stream that was
cut as planned), refused as expected (a 4xx with an error message) and what was unexpected (a 5xx, no answer
within ``--timeout``, a 2xx for a bad request, a stream without its end). Some valid requests are a few fixed
greedy ones: each must get one text, whatever ran beside it. At the end it checks that ``/health`` is ok,
``/metrics`` shows no slot in use and nothing queued, the server's thread count and RSS (``/proc/PID/status``)
did not grow past a small margin from the end of the first minute, its log holds no error, warning or
traceback, and a greedy request sent alone gets the same text it got before the soak. It prints one table and
exits 0 only when every valid request was answered, nothing unexpected happened and every check passed.

The server runs with its own cache folder beside its log (``LOCALSPEC_HOME``): the soak's requests stay out of
the user's suffix store, and costs measured under its load out of the user's cache.

``run_soak`` is the same run from Python (tests/test_soak.py runs it for 20 seconds).
"""

from __future__ import annotations

import argparse
import collections
import http.client
import json
import os
import random
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

from localspec.bench.clients import ServerProcess, start_serve
from localspec.bench.workloads import builtin_workload

#: The requests a client picks from, with their weights: the valid ones first.
VALID_KINDS: dict[str, int] = {"whole": 6, "stream": 6, "abandon": 4, "abandon-whole": 2}
BAD_KINDS: dict[str, int] = {
    "bad-json": 1,
    "unknown-model": 1,
    "negative-max-tokens": 1,
    "bad-schema": 2,  # several ways to be wrong (BAD_SCHEMAS)
    "too-long": 1,  # a prompt beyond the context
}
KINDS: tuple[str, ...] = (*VALID_KINDS, *BAD_KINDS)
#: Fixed greedy requests (the first prompts, 32 tokens): each must get one text however busy the batch is.
GREEDY_POOL = 6
#: How many threads the server may end with beyond what it had at the end of the first minute.
THREAD_MARGIN = 4
#: How much its RSS may grow from the end of the first minute: this share, and at least RSS_MARGIN_BYTES.
RSS_MARGIN_SHARE = 0.10
RSS_MARGIN_BYTES = 48 * 2**20
#: Schemas that are not valid JSON Schema (or not ones a grammar can be built from): each must get a 400.
BAD_SCHEMAS: tuple[Any, ...] = (
    {"type": "nonsense"},
    {"type": "object", "properties": "not an object"},
    {"$ref": "#/definitions/nowhere"},
    {"type": "array", "items": 3},
    {"type": "integer", "minimum": 5, "maximum": 1},
    {"enum": []},
    {"type": "string", "pattern": "("},
    {"type": "string", "pattern": "^($"},
    {"type": "object", "required": "name"},
    {"type": "object", "additionalProperties": 3},
    {"anyOf": {"type": "string"}},
    "not a schema",
    [],
)
_CONTEXT = re.compile(r"context (\d+) tokens")
_OUTCOME = re.compile(r'^localspec_requests_total\{endpoint="\w+",outcome="(\w+)"\} (\S+)$', re.MULTILINE)
_TROUBLE = re.compile(r"Traceback|error|warning|exception", re.IGNORECASE)


@dataclass
class Tally:
    """One kind of request: how many were sent and how each ended; a few examples of what went wrong."""

    sent: int = 0
    answered: int = 0
    refused: int = 0
    unexpected: int = 0
    seconds: list[float] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Check:
    """One end-of-run check: its name, whether it passed and what was seen; a check not ``required`` is
    reported but does not fail the soak."""

    name: str
    ok: bool
    detail: str
    required: bool = True


@dataclass
class SoakResult:
    """A soak's counts per kind, its end checks and how long the clients ran."""

    tallies: dict[str, Tally]
    checks: list[Check]
    seconds: float

    @property
    def ok(self) -> bool:
        """Every valid request answered, nothing unexpected, every check passed."""
        valid = all(self.tallies[k].answered == self.tallies[k].sent for k in VALID_KINDS)
        return (
            valid
            and not any(t.unexpected for t in self.tallies.values())
            and all(c.ok for c in self.checks if c.required)
        )


@dataclass(frozen=True)
class Server:
    """Where the soaked server listens, the model name it answers to and its context per request."""

    host: str
    port: int
    model: str
    n_ctx: int


@dataclass
class Outcome:
    """How one request ended: "answered", "refused" or "unexpected", and why when unexpected; a complete
    answer's text."""

    how: str
    note: str = ""
    text: str | None = None


# ------------------------------------------------------------------------------------------ the requests
def _prompts() -> list[str]:
    return [p.text for name in ("chat", "creative") for p in builtin_workload(name).prompts]


def _valid_body(
    kind: str, rng: random.Random, server: Server, prompts: Sequence[str]
) -> tuple[dict[str, Any], int | None]:
    """A valid request of ``kind`` and, for one of the :data:`GREEDY_POOL` fixed greedy requests (every
    answer to it must be the same text, whatever ran beside it), its index in the pool."""
    body: dict[str, Any] = {"model": server.model, "stream": kind in ("stream", "abandon")}
    if not kind.startswith("abandon") and rng.random() < 0.3:
        key = rng.randrange(GREEDY_POOL)
        body.update(messages=[{"role": "user", "content": prompts[key]}], max_tokens=32, temperature=0)
        return body, key
    body["messages"] = [{"role": "user", "content": f"{rng.choice(prompts)} ({rng.randrange(10**6)})"}]
    # an abandoned stream would run long: the client leaves it mid-generation, in a full batch
    body["max_tokens"] = rng.randint(100, 400) if kind.startswith("abandon") else rng.randint(4, 48)
    if rng.random() < 0.5:
        body.update(temperature=0.8, seed=rng.randrange(2**31))
    else:
        body["temperature"] = 0
    if body["stream"] and rng.random() < 0.5:
        body["stream_options"] = {"include_usage": True}
    return body, None


def _bad_body(kind: str, rng: random.Random, server: Server) -> bytes:
    """The body of a bad request of ``kind`` (one of :data:`BAD_KINDS`)."""
    message = [{"role": "user", "content": "Say hello."}]
    body: dict[str, Any] = {"model": server.model, "messages": message, "max_tokens": 8}
    if kind == "bad-json":
        return rng.choice([b'{"model": ', b"not json at all", b'{"messages": [}', b"\xff\xfe{"])
    if kind == "unknown-model":
        body["model"] = f"no-such-model-{rng.randrange(1000)}"
    elif kind == "negative-max-tokens":
        body["max_tokens"] = -rng.randint(1, 100)
    elif kind == "bad-schema":
        schema = rng.choice(BAD_SCHEMAS)
        body["response_format"] = {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}
    elif kind == "too-long":
        words = " ".join(rng.choice(("apple", "river", "stone", "cloud")) for _ in range(2 * server.n_ctx))
        body["messages"] = [{"role": "user", "content": words}]
    body["stream"] = rng.random() < 0.5  # refused before anything streams, either way
    return json.dumps(body).encode()


def _post(server: Server, body: bytes, timeout_s: float) -> tuple[http.client.HTTPConnection, Any]:
    conn = http.client.HTTPConnection(server.host, server.port, timeout=timeout_s)
    conn.request("POST", "/v1/chat/completions", body=body, headers={"Content-Type": "application/json"})
    return conn, conn.getresponse()


def _refusal(status: int, raw: bytes) -> Outcome:
    """A bad request's answer: a 4xx with an OpenAI error message is what it should get."""
    if not 400 <= status < 500:
        return Outcome("unexpected", f"status {status} for a bad request: {raw[:200]!r}")
    try:
        message = json.loads(raw)["error"]["message"]
    except (ValueError, KeyError, TypeError):
        return Outcome("unexpected", f"status {status} without an error message: {raw[:200]!r}")
    return Outcome("refused") if message else Outcome("unexpected", f"status {status}, empty message")


def _whole(status: int, raw: bytes) -> Outcome:
    if status != 200:
        return Outcome("unexpected", f"status {status}: {raw[:300]!r}")
    try:
        choice = json.loads(raw)["choices"][0]
        text = choice["message"]["content"]
        ok = isinstance(text, str) and choice["finish_reason"] in ("stop", "length")
    except (ValueError, KeyError, IndexError, TypeError):
        ok = False
    if not ok:
        return Outcome("unexpected", f"a 200 that is not a completion: {raw[:300]!r}")
    return Outcome("answered", text=text)


def _stream(response: Any, deadline: float, cut_after: int | None) -> Outcome:
    """Read a 200 stream to its ``[DONE]`` (or, with ``cut_after``, stop after that many chunks)."""
    chunks, finished = 0, False
    pieces: list[str] = []
    for raw in response:
        if time.monotonic() > deadline:
            return Outcome("unexpected", "the stream ran past the timeout")
        line = raw.decode("utf-8", errors="replace").strip()
        if not line.startswith("data:"):
            continue
        if line == "data: [DONE]":
            if not finished:
                return Outcome("unexpected", "[DONE] without a finish_reason")
            return Outcome("answered", text="".join(pieces))
        chunk = json.loads(line[5:])
        if "error" in chunk:
            return Outcome("unexpected", f"an error mid-stream: {chunk['error']}")
        for choice in chunk.get("choices") or ():
            finished = finished or bool(choice.get("finish_reason"))
            pieces.append((choice.get("delta") or {}).get("content") or "")
        chunks += 1
        if cut_after is not None and chunks >= cut_after:
            return Outcome("answered")  # abandoned as planned: the caller closes the connection
    return Outcome("unexpected", f"the stream ended after {chunks} chunks without [DONE]")


def send(
    kind: str, server: Server, rng: random.Random, prompts: Sequence[str], timeout_s: float
) -> tuple[Outcome, int | None]:
    """One request of ``kind`` (one of :data:`KINDS`) and how it ended.

    Args:
        kind: what to send.
        server: where.
        rng: the client's random numbers.
        prompts: the valid requests' prompts.
        timeout_s: the longest wait for any read, and for the whole request.

    Returns:
        How it ended: "answered" (a valid request, complete), "refused" (a bad request, a 4xx with a
        message) or "unexpected" (with what happened); and its index in :data:`GREEDY_POOL` when it was one
        of the fixed greedy requests.
    """
    key = None
    if kind in VALID_KINDS:
        valid, key = _valid_body(kind, rng, server, prompts)
        body = json.dumps(valid).encode()
    else:
        body = _bad_body(kind, rng, server)
    return _exchange(kind, server, body, rng, timeout_s), key


def _exchange(kind: str, server: Server, body: bytes, rng: random.Random, timeout_s: float) -> Outcome:
    streamed = kind in ("stream", "abandon")
    deadline = time.monotonic() + timeout_s
    conn = response = None
    try:
        if kind == "abandon-whole":  # sent, then the client leaves before the answer comes
            conn = http.client.HTTPConnection(server.host, server.port, timeout=timeout_s)
            conn.request(
                "POST", "/v1/chat/completions", body=body, headers={"Content-Type": "application/json"}
            )
            time.sleep(rng.uniform(0.0, 0.2))
            return Outcome("answered")
        conn, response = _post(server, body, timeout_s)
        if kind in BAD_KINDS:
            outcome = _refusal(response.status, response.read())
            if outcome.note:
                outcome.note += f" (sent {body[:160]!r})"
            return outcome
        if not streamed or response.status != 200:
            return _whole(response.status, response.read())
        return _stream(response, deadline, rng.randint(1, 4) if kind == "abandon" else None)
    except TimeoutError:
        return Outcome("unexpected", f"no answer within {timeout_s:.0f} s (a hang)")
    except (OSError, http.client.HTTPException, ValueError) as exc:
        return Outcome("unexpected", f"{type(exc).__name__}: {exc}")
    finally:
        if response is not None:
            response.close()  # (it holds the socket open on its own)
        if conn is not None:
            conn.close()  # an abandoned stream: the server sees the client leave


# ------------------------------------------------------------------------------------------- the server
def _status(pid: int | None) -> tuple[int, int] | None:
    """The process's thread count and resident memory (bytes), from /proc; None where it cannot be read."""
    if pid is None:
        return None
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    fields = dict(line.split(":", 1) for line in text.splitlines() if ":" in line)
    return int(fields["Threads"]), int(fields["VmRSS"].split()[0]) * 1024


def _get(server: Server, path: str) -> tuple[int, str]:
    conn = http.client.HTTPConnection(server.host, server.port, timeout=30)
    try:
        conn.request("GET", path)
        response = conn.getresponse()
        return response.status, response.read().decode("utf-8", errors="replace")
    finally:
        conn.close()


def _gauge(text: str, name: str) -> float | None:
    found = re.search(rf"^localspec_{name} (\S+)$", text, re.MULTILINE)
    return float(found.group(1)) if found else None


def _idle_checks(server: Server, wait_s: float = 15.0) -> list[Check]:
    """``/health`` ok and ``/metrics`` with no slot in use, nothing queued (waiting up to ``wait_s`` for
    the last cancelled streams to end)."""
    deadline = time.monotonic() + wait_s
    while True:
        status, body = _get(server, "/health")
        health = json.loads(body) if status == 200 else {}
        metrics = _get(server, "/metrics")[1]
        gauges = {n: _gauge(metrics, n) for n in ("slots_busy", "queue_length", "busy")}
        idle = health.get("slots_busy") == 0 and health.get("queue") == 0 and not any(gauges.values())
        if idle or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    said = ", ".join(f"{k} {health.get(k)}" for k in ("status", "queue", "slots_busy"))
    outcomes: collections.Counter[str] = collections.Counter()
    for outcome, n in _OUTCOME.findall(metrics):
        outcomes[outcome] += int(float(n))
    counted = ", ".join(f"{k} {n}" for k, n in sorted(outcomes.items()))
    return [
        Check("/health ok and idle", status == 200 and health.get("status") == "ok" and idle, said),
        Check(
            "/metrics: no slot in use, nothing queued",
            gauges["slots_busy"] == 0 and gauges["queue_length"] == 0 and gauges["busy"] == 0,
            ", ".join(f"{k} {v:g}" if v is not None else f"{k} missing" for k, v in gauges.items())
            + f" (requests by outcome: {counted})",
        ),
    ]


def _growth_checks(first: tuple[int, int] | None, end: tuple[int, int] | None, peak: int) -> list[Check]:
    if first is None or end is None:
        return [Check("threads and RSS", False, "/proc/PID/status could not be read (Linux only)")]
    threads_ok = end[0] <= first[0] + THREAD_MARGIN
    allowed = first[1] + max(RSS_MARGIN_BYTES, int(first[1] * RSS_MARGIN_SHARE))
    mib = 2**20
    return [
        Check(
            "threads did not grow",
            threads_ok,
            f"{first[0]} after the first minute, {end[0]} at the end (peak {peak}; margin {THREAD_MARGIN})",
        ),
        Check(
            "RSS did not grow",
            end[1] <= allowed,
            f"{first[1] / mib:.0f} MiB after the first minute, {end[1] / mib:.0f} MiB at the end "
            f"(allowed {allowed / mib:.0f} MiB)",
        ),
    ]


def _greedy_text(server: Server) -> str:
    body = {
        "model": server.model,
        "messages": [{"role": "user", "content": "Tell me about rivers and the sea."}],
        "max_tokens": 32,
        "temperature": 0,
    }
    conn, response = _post(server, json.dumps(body).encode(), 120)
    try:
        raw = response.read()
        return (
            str(json.loads(raw)["choices"][0]["message"]["content"]) if response.status == 200 else repr(raw)
        )
    finally:
        conn.close()


def _log_check(log: Path) -> Check:
    """The server's log says nothing went wrong: no traceback, error, warning or exception (asyncio's
    "socket.send() raised exception." is a stream written on after its client left)."""
    text = log.read_text(encoding="utf-8", errors="replace")
    found = [line for line in text.splitlines() if _TROUBLE.search(line)]
    detail = f"{len(found)} found" + (f", the first: {found[0][:120]!r}" if found else "") + f" ({log})"
    return Check("no error, warning or traceback in the server's log", not found, detail)


# ------------------------------------------------------------------------------------------- the run
@dataclass
class _Shared:
    """What the client threads write: the tallies per kind and the texts of the fixed greedy requests."""

    tallies: dict[str, Tally] = field(default_factory=lambda: {k: Tally() for k in KINDS})
    greedy: dict[int, collections.Counter[str]] = field(
        default_factory=lambda: collections.defaultdict(collections.Counter)
    )
    lock: threading.Lock = field(default_factory=threading.Lock)


def _client(server: Server, seed: int, until: float, timeout_s: float, shared: _Shared) -> None:
    rng = random.Random(seed)
    prompts = _prompts()
    weights = {**VALID_KINDS, **BAD_KINDS}
    while time.monotonic() < until:
        kind = rng.choices(list(weights), weights=list(weights.values()))[0]
        t0 = time.monotonic()
        outcome, key = send(kind, server, rng, prompts, timeout_s)
        with shared.lock:
            tally = shared.tallies[kind]
            tally.sent += 1
            tally.seconds.append(time.monotonic() - t0)
            setattr(tally, outcome.how, getattr(tally, outcome.how) + 1)
            if outcome.note and len(tally.notes) < 5:
                tally.notes.append(outcome.note)
            if key is not None and outcome.text is not None:
                shared.greedy[key][outcome.text] += 1


def _greedy_check(greedy: dict[int, collections.Counter[str]]) -> Check:
    """Every fixed greedy request got one text, whatever ran beside it (streamed or not)."""
    split = {k: texts for k, texts in greedy.items() if len(texts) > 1}
    answers = sum(sum(texts.values()) for texts in greedy.values())
    detail = f"{answers} answers to {len(greedy)} requests"
    for k, texts in sorted(split.items())[:2]:
        detail += f"; request {k}: " + " | ".join(f"{n}x {t[:40]!r}" for t, n in texts.most_common(3))
    # llama.cpp's logits depend on the pass a token is verified in (its width and neighbours): a near tie may
    # go either way beside other requests, so this is reported, not required (each token is still the
    # verifying pass's argmax: the tests check that)
    return Check("each greedy request got one text", not split, detail, required=False)


def _server(proc: ServerProcess) -> Server:
    url = urlsplit(proc.url)
    found = _CONTEXT.search(proc.log.read_text(encoding="utf-8", errors="replace"))
    return Server(
        url.hostname or "127.0.0.1", url.port or 80, proc.model, int(found.group(1)) if found else 4096
    )


def _drive(
    server: Server,
    pid: int | None,
    *,
    seconds: float,
    clients: int,
    timeout_s: float,
    seed: int,
    echo: Callable,
) -> tuple[_Shared, tuple[int, int] | None, int]:
    """The clients for ``seconds``; returns what they recorded, the server's threads and RSS at the end of
    the first minute (a third of the run, when shorter) and its peak thread count."""
    shared = _Shared()
    t0 = time.monotonic()
    until = t0 + seconds
    threads = [
        threading.Thread(target=_client, args=(server, seed + i, until, timeout_s, shared), daemon=True)
        for i in range(clients)
    ]
    for t in threads:
        t.start()
    first, peak, mark, report = None, 0, min(60.0, seconds / 3), t0 + 30
    while any(t.is_alive() for t in threads):
        time.sleep(1.0)
        now = _status(pid)
        peak = max(peak, now[0] if now else 0)
        if first is None and time.monotonic() - t0 >= mark:
            first = now
        if time.monotonic() >= report:
            report += 30
            with shared.lock:
                tallies = shared.tallies.values()
                sent, bad = sum(t.sent for t in tallies), sum(t.unexpected for t in tallies)
            echo(f"  {time.monotonic() - t0:.0f} s: {sent} requests, {bad} unexpected")
        if time.monotonic() > until + timeout_s + 30:
            echo("  clients still running past their timeout: stopping the wait")
            break
    return shared, first, peak


def run_soak(
    serve_args: Sequence[str] = (),
    *,
    seconds: float = 600.0,
    clients: int = 8,
    parallel: int = 4,
    timeout_s: float = 120.0,
    seed: int = 0,
    log_dir: Path | None = None,
    echo: Callable[[str], None] = lambda line: print(line, file=sys.stderr),
) -> SoakResult:
    """Start ``localspec serve --parallel PARALLEL SERVE_ARGS``, soak it, check it, stop it.

    Args:
        serve_args: ``serve``'s model arguments (none: the embedded pair).
        seconds: how long the clients send requests.
        clients: how many client threads.
        parallel: the server's ``--parallel``.
        timeout_s: the longest a request may take (a read, or the whole request) before it counts as a hang.
        seed: the clients' random seed (client i uses seed + i).
        log_dir: where the server's log goes (default: a temporary folder).
        echo: progress lines.

    Returns:
        The counts per kind and the end checks (:attr:`SoakResult.ok` is the verdict).
    """
    folder = Path(log_dir or tempfile.mkdtemp(prefix="soak-"))
    log = folder / "serve.log"
    # its own cache: the soak's requests stay out of the user's suffix store, and costs measured under a
    # soak's load out of the user's cache (the config, with the user's own presets, is the user's)
    env = {**os.environ, "LOCALSPEC_HOME": str(folder / "home")}
    args = ["--parallel", str(parallel), *serve_args]
    echo(f"starting localspec serve {' '.join(args)} (log: {log})")
    with start_serve(args, log, env) as proc:
        server = _server(proc)
        before = _greedy_text(server)
        echo(f"soaking {server.model} with {clients} clients for {seconds:.0f} s")
        t0 = time.monotonic()
        shared, first, peak = _drive(
            server, proc.pid, seconds=seconds, clients=clients, timeout_s=timeout_s, seed=seed, echo=echo
        )
        ran = time.monotonic() - t0
        checks = [_greedy_check(shared.greedy), *_idle_checks(server)]
        checks += _growth_checks(first, _status(proc.pid), peak)
        after = _greedy_text(server)
        same = Check(
            "same greedy text alone before and after", after == before, f"{after[:60]!r}", required=False
        )
        checks.append(
            same
        )  # reported: near ties again (and `auto` may draft otherwise after what it learned)
        checks.append(_log_check(proc.log))
    return SoakResult(shared.tallies, checks, ran)


def table(result: SoakResult) -> str:
    """The summary of a soak.

    Args:
        result: what :func:`run_soak` returned.

    Returns:
        A Markdown table, one row per kind, then the end checks, what went wrong and the verdict.
    """
    rows = [
        "| kind | sent | answered | refused (expected) | unexpected | p50 / p95 s |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for kind, t in result.tallies.items():
        q = statistics.quantiles(t.seconds, n=20) if len(t.seconds) > 1 else t.seconds * 19 or [0.0] * 19
        p50 = statistics.median(t.seconds) if t.seconds else 0.0
        rows.append(
            f"| {kind} | {t.sent} | {t.answered} | {t.refused} | {t.unexpected} | {p50:.2f} / {q[18]:.2f} |"
        )
    rows.append("")
    rows += [
        f"- [{'ok' if c.ok else 'FAILED' if c.required else 'differs'}] {c.name}: {c.detail}"
        for c in result.checks
    ]
    for kind, t in result.tallies.items():
        rows += [f"- unexpected {kind}: {note}" for note in t.notes]
    verdict = "PASS" if result.ok else "FAIL"
    rows.append(
        f"\n{verdict}: {sum(t.sent for t in result.tallies.values())} requests in {result.seconds:.0f} s"
    )
    return "\n".join(rows)


def main(argv: Sequence[str] | None = None) -> int:
    """The command line (see the module docstring).

    Args:
        argv: the arguments (default: ``sys.argv[1:]``).

    Returns:
        The exit status: 0 when the soak passed, 1 when it did not.
    """
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--minutes", type=float, default=10.0, help="how long the clients run (default 10)")
    ap.add_argument("--clients", type=int, default=8, help="client threads (default 8)")
    ap.add_argument("--parallel", type=int, default=4, help="the server's --parallel (default 4)")
    ap.add_argument("--timeout", type=float, default=120.0, help="seconds before a request counts as a hang")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--log-dir", type=Path, help="where the server's log goes (default: a temporary folder)")
    ap.add_argument("-t", "--target", help="target GGUF (default: the embedded pair)")
    ap.add_argument("-d", "--draft", help="draft GGUF, 'ngram', 'none' or 'auto'")
    ap.add_argument("-p", "--preset", help="a preset name (its files in the Hugging Face cache)")
    ap.add_argument("--strategy", help="the drafting strategy (serve's --strategy)")
    ap.add_argument("--n-ctx", type=int, help="context per request (serve's --n-ctx)")
    ap.add_argument("--threads", type=int, help="CPU threads (serve's --threads)")
    a = ap.parse_args(argv)
    passed = {"--target": a.target, "--draft": a.draft, "--preset": a.preset, "--strategy": a.strategy}
    passed.update({"--n-ctx": a.n_ctx, "--threads": a.threads})
    serve_args = [str(x) for k, v in passed.items() if v is not None for x in (k, v)]
    result = run_soak(
        serve_args,
        seconds=a.minutes * 60,
        clients=a.clients,
        parallel=a.parallel,
        timeout_s=a.timeout,
        seed=a.seed,
        log_dir=a.log_dir,
    )
    print(table(result))
    return 0 if result.ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
