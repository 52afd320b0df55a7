"""The peer: llama.cpp's own speculative decoding, in the ``llama-server`` built from the llama.cpp that
llama-cpp-python vendors (:mod:`localspec.llama.programs`), so both sides run the same kernels.

``PeerServer`` runs one server per setting (target alone, draft model, n-gram lookup); ``peer_runner`` sends
one ``/completion`` request per prompt and returns stats dicts shaped like ``GenerationStats.as_dict()``
(from ``timings``: ``predicted_*``, ``draft_n``, ``draft_n_accepted``). The servers are never used by the
test suite in CI.
"""

from __future__ import annotations

import json
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from localspec.bench.workloads import Prompt, Runner
from localspec.errors import BenchError
from localspec.llama import programs
from localspec.llama.processes import die_with_this_process, stop
from localspec.settings import DRAFT_MODEL, PROMPT_LOOKUP, DraftSettings

#: The strategies llama.cpp's own speculative decoding has an equivalent for.
PEER_STRATEGIES: tuple[str, ...] = ("model", "ngram")
#: llama.cpp's own defaults for draft-simple (``common/common.h``: n_max 3, p_min 0): always measured
PEER_DEFAULT = (3, 0.0)
#: The grid llama.cpp's draft-simple runs over by default (``bench --peer-n-max``, ``--peer-p-min``), so that
#: it is compared at its best, not at our p_min: 21 settings with its defaults among them.
PEER_N_MAX: tuple[int, ...] = tuple(range(2, 9))
PEER_P_MIN: tuple[float, ...] = (0.0, 0.5, 0.75)


def lookup_static_file(target: Path, texts: list[Path], out: Path, *, threads: int) -> Path:
    """llama.cpp's static n-gram cache (``-lcs``) built from the corpus ``texts`` with the target's vocab."""
    out.parent.mkdir(parents=True, exist_ok=True)
    corpus = out.with_suffix(".txt")
    corpus.write_text(
        "\n\n".join(t.read_text(encoding="utf-8", errors="replace") for t in texts), encoding="utf-8"
    )
    binary = programs.lookup_create_binary()
    cmd = [str(binary), "-m", str(target), "-f", str(corpus), "-lcs", str(out), "-t", str(threads)]
    log = out.with_suffix(".log")
    programs.run_logged(cmd, log)
    if not out.is_file():
        raise BenchError(f"{programs.LOOKUP_CREATE} wrote no cache file", hint=f"see {log}")
    return out


#: llama.cpp's speculative modes run on the multi-request workloads (``localspec bench --sessions
#: --peer``), each sized for a CPU: the upstream defaults (ngram-simple/map-k n=12, m=48; ngram-mod
#: n_match=24, n_min=48, n_max=64) are GPU-sized, and a 48-token pass costs ~20 single passes on a
#: 2-core CPU. ``ngram-cache`` reads a static file built from the workload's corpus when it has one.
SESSION_MODES: tuple[str, ...] = (
    "none",
    "ngram-simple",
    "ngram-map-k",
    "ngram-mod",
    "ngram-cache",
    "draft-simple",
)


def session_mode_args(
    mode: str,
    *,
    target: Path,
    draft: Path | None,
    threads: int,
    n_ctx: int,
    lookup_static: Path | None = None,
    slots: int = 1,
) -> list[str]:
    """llama-server flags for one llama.cpp mode of :data:`SESSION_MODES`, or ``draft-mtp`` (the target's
    MTP layers), with ``slots`` slots sharing ``n_ctx`` tokens of context, prompt cache on."""
    args = ["--model", str(target), "--threads", str(threads), "--threads-batch", str(threads)]
    args += ["-c", str(n_ctx), "-np", str(slots), "--no-webui", "--host", "127.0.0.1"]
    if mode == "none":
        return args
    args += ["--spec-type", mode]
    if mode == "ngram-simple":
        args += ["--spec-ngram-simple-size-n", "3", "--spec-ngram-simple-size-m", "8"]
    elif mode == "ngram-map-k":
        args += ["--spec-ngram-map-k-size-n", "3", "--spec-ngram-map-k-size-m", "16"]
    elif mode == "ngram-mod":
        args += ["--spec-ngram-mod-n-match", "12", "--spec-ngram-mod-n-min", "4"]
        args += ["--spec-ngram-mod-n-max", "16"]
    elif mode == "ngram-cache":
        if lookup_static is not None:
            args += ["--lookup-cache-static", str(lookup_static)]
    elif mode == "draft-simple":
        if draft is None:
            raise BenchError("llama.cpp's draft-simple needs a draft model", hint="pass --draft PATH")
        d = DraftSettings(strategy="model")
        args += ["--model-draft", str(draft), "--spec-draft-n-max", str(d.n_max), "--spec-draft-n-min", "0"]
        args += ["--spec-draft-p-min", f"{d.p_min:g}"]
        args += ["--spec-draft-threads", str(threads), "--spec-draft-threads-batch", str(threads)]
    elif mode == "draft-mtp":
        d = DraftSettings(strategy="mtp")
        args += [
            "--spec-draft-n-max",
            str(d.n_max),
            "--spec-draft-n-min",
            "0",
            "--spec-draft-p-min",
            f"{d.p_min:g}",
        ]
    else:
        raise BenchError(
            f"unknown llama.cpp mode {mode!r}", hint=f"choose from {', '.join((*SESSION_MODES, 'draft-mtp'))}"
        )
    return args


class PeerReply:
    """One ``/completion`` answer of llama-server: ``str()`` is the text, the rest its timings."""

    def __init__(self, out: dict[str, Any]) -> None:
        t = out.get("timings") or {}
        self.text: str = out.get("content", "")
        self.generated_tokens = int(t.get("predicted_n") or 0)
        self.gen_seconds = float(t.get("predicted_ms") or 0) / 1000
        self.prompt_seconds = float(t.get("prompt_ms") or 0) / 1000
        self.drafted = int(t.get("draft_n") or 0)
        self.accepted = int(t.get("draft_n_accepted") or 0)

    def __str__(self) -> str:
        return self.text


def chat_sender(
    server: PeerServer,
    render: Callable[[list[dict]], tuple[list[int], list[str]]],
    *,
    max_tokens: int,
    seed: int = 1234,
) -> Callable[[list[dict]], PeerReply]:
    """``send(messages)`` for a session: the exact prompt tokens localspec decodes (``render``, i.e.
    ``Pipeline.format_chat``), greedy, llama-server's prompt cache on as a client would have it."""

    def send(messages: list[dict]) -> PeerReply:
        tokens, stops = render(messages)
        body = {
            "prompt": tokens,
            "n_predict": max_tokens,
            "temperature": 0.0,
            "top_k": 1,
            "seed": seed,
            "stop": stops,
            "cache_prompt": True,
            "stream": False,
        }
        return PeerReply(server.post("/completion", body))

    return send


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def peer_configs(
    ours: Sequence[DraftSettings],
    n_max_values: Sequence[int] = PEER_N_MAX,
    p_min_values: Sequence[float] = PEER_P_MIN,
) -> list[DraftSettings]:
    """The settings llama.cpp runs for ours: its draft-simple over the grid of ``n_max_values`` x
    ``p_min_values`` plus its own defaults (:data:`PEER_DEFAULT`) where we draft with the model,
    ngram-simple at our length where we look up n-grams; nothing for a strategy it has no equivalent of,
    or an adaptive one. Each setting once."""
    out: dict[str, DraftSettings] = {}
    for c in ours:
        if c.strategy.name not in PEER_STRATEGIES or c.adaptive:
            continue
        if c.strategy == DRAFT_MODEL:
            grid = {(k, float(p)) for k in n_max_values for p in p_min_values} | {PEER_DEFAULT}
            for k, p in sorted(grid):
                cfg = DraftSettings(strategy=DRAFT_MODEL, n_max=k, p_min=p)
                out.setdefault(cfg.label, cfg)
        else:
            out.setdefault(c.label, c)
    return list(out.values())


def server_args(
    config: DraftSettings, *, target: Path, draft: Path | None, threads: int, n_ctx: int
) -> list[str]:
    """llama-server flags for one setting (same pair, threads, context, draft length and p_min)."""
    args = ["--model", str(target), "--threads", str(threads), "--threads-batch", str(threads)]
    args += ["-c", str(n_ctx), "-np", "1", "--cache-ram", "0", "--no-webui", "--host", "127.0.0.1"]
    k = config.n_max
    if config.strategy == DRAFT_MODEL:
        if draft is None:
            raise BenchError("the draft-model strategy needs a draft model", hint="pass --draft PATH")
        args += ["--spec-type", "draft-simple", "--model-draft", str(draft)]
        args += ["--spec-draft-threads", str(threads), "--spec-draft-threads-batch", str(threads)]
        args += ["--spec-draft-n-max", str(k), "--spec-draft-n-min", "0"]
        args += ["--spec-draft-p-min", f"{config.p_min:g}"]
    elif config.strategy == PROMPT_LOOKUP:
        # lookup n-gram of up to 3 tokens (ours tries 4..2); draft the k tokens that followed it
        args += ["--spec-type", "ngram-simple", "--spec-ngram-simple-size-n", str(min(3, k))]
        args += ["--spec-ngram-simple-size-m", str(k)]
    elif config.is_speculative:
        raise BenchError(
            f"the llama.cpp peer has no equivalent of strategy {config.strategy.name!r}",
            hint=f"compare {' or '.join(PEER_STRATEGIES)}",
        )
    return args


class PeerServer:
    """One llama-server process for one setting; a context manager."""

    def __init__(self, binary: Path, args: list[str], log: Path) -> None:
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = log
        log.parent.mkdir(parents=True, exist_ok=True)
        self._fh = log.open("w", encoding="utf-8")
        self.proc = subprocess.Popen(
            [str(binary), *args, "--port", str(self.port)],
            stdout=self._fh,
            stderr=subprocess.STDOUT,
            **die_with_this_process(),
        )

    def wait_ready(self, timeout: float = 180.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise BenchError(f"llama-server exited with {self.proc.returncode}", hint=f"see {self.log}")
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=2) as r:
                    if r.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.25)
        raise BenchError("llama-server did not become ready", hint=f"see {self.log}")

    def post(self, path: str, body: dict[str, Any], timeout: float = 600.0) -> dict[str, Any]:
        req = urllib.request.Request(
            self.url + path, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return json.loads(r.read())

    def close(self) -> None:
        stop(self.proc, grace_s=10)
        self._fh.close()

    def __enter__(self) -> PeerServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def start_servers(
    configs: list[DraftSettings],
    *,
    target: Path,
    draft: Path | None,
    threads: int,
    n_ctx: int,
    log: Callable[[str], None] | None = None,
) -> dict[str, PeerServer]:
    """One server per config label (the baseline included). The weights are mmapped, so shared."""
    binary = programs.server_binary() or programs.build_server(log=log)
    servers: dict[str, PeerServer] = {}
    try:
        for cfg in configs:
            args = server_args(cfg, target=target, draft=draft, threads=threads, n_ctx=n_ctx)
            name = cfg.label.replace(" ", "_").replace("=", "")
            servers[cfg.label] = PeerServer(binary, args, programs.vendored_dir() / "logs" / f"{name}.log")
        for s in servers.values():
            s.wait_ready()
    except BaseException:
        for s in servers.values():
            s.close()
        raise
    return servers


def peer_runner(
    servers: dict[str, PeerServer],
    *,
    render: Callable[[Prompt], list[int]] | None = None,
    temperature: float = 0.0,
    seed: int = 1234,
    top_p: float = 1.0,
) -> Runner:
    """A runner that sends each prompt to the server of its config. Sampling is localspec's: the
    temperature and top-p given, no top-k or min-p (llama-server's own defaults would add both).

    With ``render`` (prompt -> token ids, see ``localspec.bench.single.render``) the server gets exactly the
    tokens
    localspec decodes; without it, chat prompts go through the server's own ``/apply-template``.
    """
    cache: dict[str, Any] = {}

    def run(prompt: Prompt, config: DraftSettings, max_tokens: int) -> dict:
        server = servers[config.label]
        if prompt.id not in cache:
            if render is not None:
                cache[prompt.id] = render(prompt)
            elif prompt.chat:
                messages = [{"role": "user", "content": prompt.text}]
                cache[prompt.id] = server.post("/apply-template", {"messages": messages})["prompt"]
            else:
                cache[prompt.id] = prompt.text
        body = {
            "prompt": cache[prompt.id],
            "n_predict": max_tokens,
            "temperature": temperature,
            "seed": seed,
            "cache_prompt": False,
            "stream": False,
        }
        if temperature <= 0:
            body["top_k"] = 1
        else:
            body.update(top_k=0, top_p=top_p, min_p=0.0)
        out = server.post("/completion", body)
        t = out.get("timings", {})
        drafted, accepted = int(t.get("draft_n") or 0), int(t.get("draft_n_accepted") or 0)
        return {
            "strategy": config.strategy,
            "prompt_tokens": t.get("prompt_n"),
            "generated_tokens": t.get("predicted_n") or 0,
            "prompt_seconds": (t.get("prompt_ms") or 0) / 1000,
            "total_seconds": (t.get("predicted_ms") or 0) / 1000,
            "tokens_per_second": t.get("predicted_per_second") or 0.0,
            "drafted": drafted,
            "accepted": accepted,
            "acceptance_rate": accepted / drafted if drafted else 0.0,
            "text": out.get("content", ""),
        }

    return run
