"""The clients bench (``localspec bench --clients``): an OpenAI-compatible server under 1, 2, 4, 8 ...
concurrent streaming clients.

Each setting is one server started fresh: ``localspec serve`` (a child process, as a user runs it) or
llama.cpp's ``llama-server --parallel N`` with one of its speculative modes (built from the llama.cpp that
llama-cpp-python vendors, :mod:`localspec.llama.programs`). After an uncounted warm-up (a short request
per client of the largest count, all at once), every client count sends the same requests (the prompts
cycled to ``requests``), greedy, each client taking the next request when its last one finished. A
level's throughput is the completion tokens of all its requests over its wall-clock seconds; a request's
latency runs from sending it to its last token, its time to first token to its first streamed text.
Settings alternate repeat after repeat (:func:`run_clients_bench`); :mod:`localspec.bench.clients_report`
turns the runs into rows, tables and the result file.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from localspec.bench import peer
from localspec.bench.workloads import LLAMA_CPP, LOCALSPEC, Prompt
from localspec.errors import BenchError
from localspec.llama import programs
from localspec.llama.processes import die_with_this_process, stop

#: llama.cpp's modes the clients bench can run: the session modes and its MTP layers' (``draft-mtp``).
CLIENT_MODES: tuple[str, ...] = (*peer.SESSION_MODES, "draft-mtp")
#: How long a server may take to load its models and answer ``/health``.
START_TIMEOUT_S = 600.0
#: How long one streamed request may take.
REQUEST_TIMEOUT_S = 3600.0


@dataclass(frozen=True)
class Reply:
    """One streamed request, its times on this process's ``perf_counter`` clock."""

    sent: float
    done: float
    first: float | None = None  # the first chunk with text
    tokens: int = 0  # completion tokens, as the server's usage says
    drafted: int = 0
    accepted: int = 0
    error: str | None = None

    @property
    def latency(self) -> float:
        """Seconds from sending the request to its last token."""
        return self.done - self.sent

    @property
    def ttft(self) -> float:
        """Seconds from sending the request to its first text (its latency when none came)."""
        return (self.first if self.first is not None else self.done) - self.sent


@dataclass(frozen=True)
class LevelRun:
    """One client count of one setting in one repeat: its wall-clock seconds and every request's reply."""

    setting: str
    engine: str  # LOCALSPEC or LLAMA_CPP
    clients: int
    repeat: int
    wall: float
    replies: tuple[Reply, ...]

    def as_dict(self) -> dict[str, Any]:
        """The run as the result file keeps it."""
        return {**asdict(self), "replies": [asdict(r) for r in self.replies]}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> LevelRun:
        """A run read back from :meth:`as_dict`."""
        replies = tuple(Reply(**r) for r in d["replies"])
        return cls(d["setting"], d["engine"], int(d["clients"]), int(d["repeat"]), float(d["wall"]), replies)


@dataclass(frozen=True)
class ClientsSetting:
    """One server to measure: ``localspec serve`` with ``serve_args``, or ``llama-server`` with ``slots``
    slots and speculative ``mode`` (one of :data:`CLIENT_MODES`)."""

    label: str
    engine: str  # LOCALSPEC or LLAMA_CPP
    serve_args: tuple[str, ...] = ()
    slots: int = 1
    mode: str = "none"


@dataclass(frozen=True)
class PeerFiles:
    """What llama-server runs: the target, the draft model (``draft-simple``), threads, context per slot."""

    target: Path
    draft: Path | None
    threads: int
    n_ctx: int


def serve_settings(
    model_args: Sequence[str], draft: str | None, parallel: Sequence[int]
) -> list[ClientsSetting]:
    """``localspec serve``'s settings: the pair at each of ``parallel``, the pair one request at a time, and
    the target alone (``--draft none``) at the largest of ``parallel``.

    Args:
        model_args: ``serve``'s arguments that pick the target and its running (target or preset, threads,
            context), without ``--draft``.
        draft: the pair's ``--draft`` (None: the automatic one).
        parallel: the ``--parallel`` values of the pair.

    Returns:
        The settings, in the order they run.
    """
    pair = [*model_args, *(["--draft", draft] if draft else [])]
    out = [
        ClientsSetting(f"localspec --parallel {p}", LOCALSPEC, (*pair, "--parallel", str(p)))
        for p in parallel
    ]
    if 1 not in parallel:
        out.append(
            ClientsSetting("localspec --parallel 1 (one at a time)", LOCALSPEC, (*pair, "--parallel", "1"))
        )
    most = str(max(parallel))
    alone = (*model_args, "--draft", "none", "--parallel", most)
    out.append(ClientsSetting(f"localspec --draft none --parallel {most}", LOCALSPEC, alone))
    return out


def parse_serve_mode(mode: str) -> tuple[str, int | None]:
    """A ``--serve-modes`` item: a strategy of ``serve --strategy`` (``none`` included), optionally with a
    fixed draft length (``model:2``).

    Raises:
        BenchError: an unknown strategy or a length that is not 1 to 64.
    """
    from localspec.settings import STRATEGY_BY_NAME

    name, _, k = mode.strip().partition(":")
    if name not in STRATEGY_BY_NAME:
        names = ", ".join(STRATEGY_BY_NAME)
        raise BenchError(f"unknown serve mode {mode!r}", hint=f"use a strategy ({names}), e.g. model:2")
    if not k:
        return name, None
    if not k.isdigit() or not 1 <= int(k) <= 64:
        raise BenchError(f"serve mode {mode!r}: the draft length must be 1 to 64", hint="e.g. model:4")
    return name, int(k)


def mode_settings(model_args: Sequence[str], modes: Sequence[str], parallel: int) -> list[ClientsSetting]:
    """``localspec serve``'s settings named by ``--serve-modes``, each at ``parallel``: a strategy as ``serve
    --strategy`` runs it, or with a fixed draft length (``model:2``: ``--n-max 2 --fixed``).

    Args:
        model_args: ``serve``'s arguments that pick the pair and its running (with ``--draft``).
        modes: the modes (:func:`parse_serve_mode`).
        parallel: ``serve``'s ``--parallel``.

    Returns:
        The settings, in the order given.
    """
    out = []
    for mode in modes:
        name, k = parse_serve_mode(mode)
        args = [*model_args, "--strategy", name, "--parallel", str(parallel)]
        args += ["--n-max", str(k), "--fixed"] if k else []
        out.append(ClientsSetting(f"localspec --parallel {parallel} {mode}", LOCALSPEC, tuple(args)))
    return out


def peer_settings(modes: Sequence[str], parallel: Sequence[int]) -> list[ClientsSetting]:
    """llama-server's settings: each of ``modes`` at each slot count of ``parallel``."""
    return [
        ClientsSetting(f"llama-server --parallel {p} {mode}", LLAMA_CPP, slots=p, mode=mode)
        for p in parallel
        for mode in modes
    ]


class ServerProcess:
    """A started server: its ``/v1`` address, the model name it answers to, its log, how to stop it, and its
    process id (None when unknown: what a soak reads its threads and memory from). A context manager that
    stops it."""

    def __init__(
        self, url: str, model: str, log: Path, close: Callable[[], None], pid: int | None = None
    ) -> None:
        self.url, self.model, self.log, self.close, self.pid = url, model, log, close, pid

    def __enter__(self) -> ServerProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


_LISTENING = re.compile(r"at (http://\S+/v1)\s+model (\S+)")


def start_serve(args: Sequence[str], log: Path, env: Mapping[str, str] | None = None) -> ServerProcess:
    """``localspec serve --port 0 ARGS`` in a child process, once it answers ``/health``.

    Args:
        args: ``serve``'s arguments.
        log: where its output goes.
        env: its environment (default: this process's).

    Returns:
        The running server.

    Raises:
        BenchError: it exited or did not listen within :data:`START_TIMEOUT_S` (naming its log).
    """
    log.parent.mkdir(parents=True, exist_ok=True)
    fh = log.open("w", encoding="utf-8")
    cmd = [sys.executable, "-m", "localspec", "serve", "--port", "0", *args]
    proc = subprocess.Popen(
        cmd,
        stdout=fh,
        stderr=subprocess.STDOUT,
        env=None if env is None else dict(env),
        **die_with_this_process(),
    )

    def close() -> None:
        stop(proc, grace_s=30)
        fh.close()

    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while not (found := _LISTENING.search(log.read_text(encoding="utf-8", errors="replace"))):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise BenchError(f"localspec serve {' '.join(args)} did not start", hint=f"see {log}")
            time.sleep(0.2)
        _wait_healthy(found.group(1).removesuffix("/v1"), proc, log, deadline)
    except BaseException:
        close()
        raise
    return ServerProcess(found.group(1), found.group(2), log, close, proc.pid)


def start_llama_server(setting: ClientsSetting, files: PeerFiles, log: Path) -> ServerProcess:
    """llama.cpp's ``llama-server`` for one setting (built first when it is not), once it answers.

    Raises:
        BenchError: it exited or did not become ready (naming its log).
    """
    binary = programs.server_binary() or programs.build_server()
    args = peer.session_mode_args(
        setting.mode,
        target=files.target,
        draft=files.draft,
        threads=files.threads,
        n_ctx=files.n_ctx * setting.slots,  # llama-server shares its context among its slots
        slots=setting.slots,
    )
    server = peer.PeerServer(binary, args, log)
    try:
        server.wait_ready(START_TIMEOUT_S)
        with urllib.request.urlopen(server.url + "/v1/models", timeout=30) as r:
            model = json.loads(r.read())["data"][0]["id"]
    except BaseException:
        server.close()
        raise
    return ServerProcess(server.url + "/v1", model, log, server.close)


def _wait_healthy(base: str, proc: subprocess.Popen, log: Path, deadline: float) -> None:
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            break
        try:
            with urllib.request.urlopen(base + "/health", timeout=5) as r:
                if r.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.2)
    raise BenchError(f"the server at {base} did not answer /health", hint=f"see {log}")


def stream_one(url: str, model: str, prompt: Prompt, max_tokens: int) -> Reply:
    """One greedy streamed request (chat or plain completion, as ``prompt`` is), timed.

    Args:
        url: the server's ``/v1`` address.
        model: the model name it answers to.
        prompt: the request's text.
        max_tokens: its completion tokens at most.

    Returns:
        Its times, its completion tokens (the server's usage) and what was drafted and accepted (localspec's
        ``localspec`` field, llama-server's ``timings``); ``error`` set when it failed.
    """
    path = "/chat/completions" if prompt.chat else "/completions"
    body: dict[str, Any] = {"model": model, "max_tokens": max_tokens, "temperature": 0, "stream": True}
    body["stream_options"] = {"include_usage": True}
    body.update(
        {"messages": [{"role": "user", "content": prompt.text}]} if prompt.chat else {"prompt": prompt.text}
    )
    request = urllib.request.Request(
        url + path, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    sent = time.perf_counter()
    seen: dict[str, Any] = {"first": None, "tokens": 0, "drafted": 0, "accepted": 0}
    try:
        with urllib.request.urlopen(request, timeout=REQUEST_TIMEOUT_S) as r:
            for raw in r:
                line = raw.decode("utf-8", errors="replace").strip()
                if not line.startswith("data:") or line == "data: [DONE]":
                    continue
                _read_chunk(json.loads(line[5:]), prompt.chat, seen)
    except (urllib.error.URLError, OSError, ValueError) as exc:
        return Reply(sent, time.perf_counter(), error=str(exc) or type(exc).__name__)
    return Reply(sent, time.perf_counter(), **seen)


def _read_chunk(chunk: dict[str, Any], chat: bool, seen: dict[str, Any]) -> None:
    """What one streamed chunk says: its first text's time, the usage, the drafted and accepted tokens."""
    for choice in chunk.get("choices") or ():
        text = (choice.get("delta") or {}).get("content") if chat else choice.get("text")
        if text and seen["first"] is None:
            seen["first"] = time.perf_counter()
    if chunk.get("usage"):
        seen["tokens"] = int(chunk["usage"].get("completion_tokens") or 0)
    ours, theirs = chunk.get("localspec") or {}, chunk.get("timings") or {}
    if ours:
        seen["drafted"], seen["accepted"] = int(ours.get("drafted") or 0), int(ours.get("accepted") or 0)
    elif theirs:
        seen["drafted"] = int(theirs.get("draft_n") or 0)
        seen["accepted"] = int(theirs.get("draft_n_accepted") or 0)


def run_level(
    server: ServerProcess, clients: int, work: Sequence[Prompt], max_tokens: int
) -> tuple[float, list[Reply]]:
    """``work`` sent by ``clients`` concurrent clients, each taking the next request when its last one
    finished. Returns the wall-clock seconds and the replies, in the order they finished."""
    todo = list(reversed(work))
    replies: list[Reply] = []
    lock = threading.Lock()

    def client() -> None:
        while True:
            with lock:
                if not todo:
                    return
                prompt = todo.pop()
            reply = stream_one(server.url, server.model, prompt, max_tokens)
            with lock:
                replies.append(reply)

    t0 = time.perf_counter()
    threads = [threading.Thread(target=client, daemon=True) for _ in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return time.perf_counter() - t0, replies


@dataclass(frozen=True)
class ClientsPlan:
    """What a clients bench runs: the settings, the client counts, the requests of each level."""

    settings: tuple[ClientsSetting, ...]
    clients: tuple[int, ...]
    work: tuple[Prompt, ...]
    max_tokens: int
    repeats: int = 1
    warmup: bool = True


def run_clients_bench(
    plan: ClientsPlan,
    *,
    peer_files: PeerFiles | None,
    log_dir: Path,
    log: Callable[[str], None] = lambda line: None,
) -> list[LevelRun]:
    """Every setting of ``plan`` at every client count, repeat after repeat (the settings alternate within a
    repeat, so a machine's drift spreads over all of them); one server per setting and repeat.

    Args:
        plan: what to run.
        peer_files: llama-server's files and sizes (needed when a setting is llama-server's).
        log_dir: where each server's log is written.
        log: progress lines.

    Returns:
        One :class:`LevelRun` per setting, client count and repeat.
    """
    runs: list[LevelRun] = []
    for repeat in range(plan.repeats):
        for setting in plan.settings:
            log(f"repeat {repeat + 1}/{plan.repeats}: starting {setting.label}")
            with _start(setting, peer_files, log_dir) as server:
                if plan.warmup:  # every slot once, uncounted: the batched path warm too
                    burst = plan.work[: max(plan.clients)]
                    run_level(server, len(burst), burst, min(8, plan.max_tokens))
                for c in plan.clients:
                    wall, replies = run_level(server, c, plan.work, plan.max_tokens)
                    runs.append(LevelRun(setting.label, setting.engine, c, repeat, wall, tuple(replies)))
                    tokens = sum(r.tokens for r in replies)
                    log(f"  {c} clients: {tokens / wall if wall else 0:.1f} tokens/s")
    return runs


def _start(setting: ClientsSetting, peer_files: PeerFiles | None, log_dir: Path) -> ServerProcess:
    name = re.sub(r"[^\w.-]+", "_", setting.label).strip("_")
    if setting.engine == LOCALSPEC:
        return start_serve(setting.serve_args, log_dir / f"{name}.log")
    if peer_files is None:
        raise BenchError(
            f"{setting.label} needs the target's file", hint="pass --target FILE or --preset NAME"
        )
    return start_llama_server(setting, peer_files, log_dir / f"{name}.log")
