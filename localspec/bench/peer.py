"""The peer: llama.cpp's own speculative decoding, built from the llama.cpp that llama-cpp-python vendors.

``build_server()`` downloads the sdist of the installed llama-cpp-python (``pip download --no-binary :all:``),
extracts ``vendor/llama.cpp`` and builds ``llama-server`` once into ``peer_dir()/llama.cpp-<version>``,
with the CPU features the installed llama-cpp-python was built with (:func:`build_flags`), so both sides run
the same kernels. ``PeerServer`` runs one server per setting (target alone, draft model,
n-gram lookup); ``peer_runner`` sends one ``/completion`` request per prompt and returns stats dicts shaped
like ``GenerationStats.as_dict()`` (from ``timings``: ``predicted_*``, ``draft_n``, ``draft_n_accepted``).
The servers are never used by the test suite in CI; llama.cpp's ``rpc-server`` (:func:`rpc_server_binary`,
built without llama-server) is, by tests/test_rpc.py, from the same cached build folder.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from localspec import constants
from localspec.bench.workloads import Prompt, Runner
from localspec.errors import BenchError
from localspec.llama.build import cpu_flags, installed_system_info, unused_cpu_features
from localspec.settings import DRAFT_MODEL, PROMPT_LOOKUP, DraftSettings

try:
    import fcntl
except ImportError:  # Windows: no advisory locks; builds go on unlocked
    fcntl = None  # type: ignore[assignment]

SERVER = "llama-server"
LOOKUP_CREATE = "llama-lookup-create"
QUANTIZE = "llama-quantize"
#: llama.cpp's RPC server (``tools/rpc``; the cmake target and the program are named so).
RPC_SERVER = "ggml-rpc-server"
#: llama.cpp's test program that writes tiny random models of any architecture (the test suite's fixtures).
ARCHS = "test-llama-archs"
#: The strategies llama.cpp's own speculative decoding has an equivalent for.
PEER_STRATEGIES: tuple[str, ...] = ("model", "ngram")
#: llama.cpp's own defaults for draft-simple (``common/common.h``: n_max 3, p_min 0): always measured
PEER_DEFAULT = (3, 0.0)
#: The grid llama.cpp's draft-simple runs over by default (``bench --peer-n-max``, ``--peer-p-min``), so that
#: it is compared at its best, not at our p_min: 21 settings with its defaults among them.
PEER_N_MAX: tuple[int, ...] = tuple(range(2, 9))
PEER_P_MIN: tuple[float, ...] = (0.0, 0.5, 0.75)
CMAKE_FLAGS = [
    "-DCMAKE_BUILD_TYPE=Release",  # what scikit-build-core uses for llama-cpp-python
    "-DBUILD_SHARED_LIBS=ON",
    "-DLLAMA_CURL=OFF",
    "-DLLAMA_OPENSSL=OFF",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DLLAMA_BUILD_UI=OFF",
    "-DLLAMA_USE_PREBUILT_UI=OFF",  # no download of the web UI at build time
]


def build_note(cpuinfo: Path = Path("/proc/cpuinfo")) -> str | None:
    """A line for speed reports when the installed llama-cpp-python leaves out CPU features this machine
    has (a prebuilt wheel, or a build for AVX2 only): measured on this project's AVX-512 VM, the AVX2 build
    made wide verify passes ~1.5x dearer (V(16) 9.9 against 6.6 single passes) and the edit session 1.32x
    instead of 1.70x. None when nothing is missing or this is not Linux on x86."""
    try:
        text = cpuinfo.read_text(encoding="utf-8", errors="replace")
        missing = unused_cpu_features(installed_system_info(), text)
    except (OSError, AttributeError, ImportError):
        return None
    if not missing:
        return None
    return (
        f"note: this llama.cpp build does not use {', '.join(missing)}, which this CPU has; wide verify "
        "passes cost more than they need to, and speculation pays less. Rebuild llama-cpp-python for this "
        "CPU (README: Troubleshooting)."
    )


def build_flags() -> list[str]:
    """Everything the peer is configured with: :data:`CMAKE_FLAGS`, the wheel's CPU features, then
    ``CMAKE_ARGS`` (a GPU build's flags, as for pip's build of llama-cpp-python)."""
    return [*CMAKE_FLAGS, *cpu_flags(installed_system_info()), *shlex.split(os.environ.get("CMAKE_ARGS", ""))]


def build_dir(version: str | None = None, flags: list[str] | None = None) -> Path:
    """One build folder per set of flags: a wheel rebuilt with other features gets its own peer."""
    digest = hashlib.sha256("\0".join(build_flags() if flags is None else flags).encode()).hexdigest()[:10]
    return peer_dir(version) / f"build-{digest}"


def installed_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("llama-cpp-python")
    except PackageNotFoundError as exc:
        raise BenchError("llama-cpp-python is not installed", hint="pip install llama-cpp-python") from exc


def peer_dir(version: str | None = None) -> Path:
    return constants.peer_dir() / f"llama.cpp-{version or installed_version()}"


def server_binary(version: str | None = None) -> Path | None:
    """The built ``llama-server`` for the installed llama-cpp-python, or None when not built yet."""
    path = build_dir(version) / "bin" / SERVER
    return path if path.is_file() and os.access(path, os.X_OK) else None


def _run(cmd: list[str], log: Path, cwd: Path | None = None) -> None:
    with log.open("a", encoding="utf-8") as fh:
        fh.write(f"\n$ {shlex.join(cmd)}\n")
        fh.flush()
        rc = call_as_group(cmd, cwd=cwd, stdout=fh)
    if rc != 0:
        raise BenchError(
            f"building the llama.cpp peer failed (exit {rc}): {shlex.join(cmd[:4])} ...",
            hint=f"see the log {log}; cmake, a C++ compiler and network access to PyPI are needed",
        )


def die_with_this_process() -> dict[str, Any]:
    """``subprocess.Popen`` keywords that make a child end when this process ends, however it ends: on
    Linux the kernel sends it SIGTERM (``PR_SET_PDEATHSIG``) when this process dies, even of a SIGKILL that
    leaves no time to stop it. Only for a child started from the main thread: the signal follows the thread
    that started the child, and a worker thread ending would take a long-lived child with it. Elsewhere:
    no keywords (the caller stops its children itself)."""
    if not sys.platform.startswith("linux") or threading.current_thread() is not threading.main_thread():
        return {}
    import ctypes

    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return {}
    prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    parent = os.getpid()

    def in_child() -> None:
        prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
        if os.getppid() != parent:  # this process died between the fork and now
            os._exit(1)

    return {"preexec_fn": in_child}


_PR_SET_PDEATHSIG = 1


def stop_on_sigterm() -> contextlib.AbstractContextManager[None]:
    """Within the block (on the main thread), a SIGTERM (``timeout``, a supervisor) raises
    ``KeyboardInterrupt`` like a Ctrl-C, so the ``finally:`` blocks that stop this process's children run;
    elsewhere it changes nothing."""
    if os.name != "posix" or threading.current_thread() is not threading.main_thread():
        return contextlib.nullcontext()
    return _sigterm_raises()


@contextlib.contextmanager
def _sigterm_raises() -> Iterator[None]:
    def interrupted(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupted)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def call_as_group(cmd: list[str], *, cwd: Path | None, stdout: Any) -> int:
    """Run a build step (or another tool, such as llama-quantize) in its own process group and wait for it;
    its exit status. Interrupted (Ctrl-C, or SIGTERM from ``timeout`` or a supervisor, which reach this
    process alone), take the whole group down with it: ``subprocess.call`` kills only its child (cmake),
    and make and the compilers under it went on at full CPU for minutes, re-parented to init, slowing every
    later measurement. Killed outright (SIGKILL, the OOM killer), this process cannot do that: then the
    kernel's signal (:func:`die_with_this_process`) reaches a shell in front of ``cmd``, which passes it to
    the whole group."""
    dies_with = die_with_this_process()
    if dies_with:
        cmd = ["sh", "-c", _GROUP_ON_TERM, "sh", *cmd]
    proc = subprocess.Popen(
        cmd,
        cwd=cwd,
        stdout=stdout,
        stderr=subprocess.STDOUT,
        start_new_session=os.name == "posix",
        **dies_with,
    )
    try:
        with stop_on_sigterm():
            return proc.wait()
    except BaseException:
        _stop_group(proc)
        raise


#: The shell in front of a group's command: runs it, returns its exit status, and on SIGTERM (the kernel's,
#: when this process dies) sends SIGTERM to the whole process group, itself included.
_GROUP_ON_TERM = 'trap "trap - TERM; kill -TERM 0" TERM; "$@" & wait $!'


def _stop_group(proc: subprocess.Popen) -> None:
    """SIGTERM to the build's process group, SIGKILL after 10 s."""
    if os.name != "posix":
        proc.kill()
        return
    for sig, wait in ((signal.SIGTERM, 10), (signal.SIGKILL, 5)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(wait)
            return
        except subprocess.TimeoutExpired:
            continue


def _extract_vendor(sdist: Path, dest: Path) -> Path:
    """Extract only ``<sdist>/vendor/llama.cpp`` into ``dest``; refuses unsafe member paths."""
    with tarfile.open(sdist) as tar:
        members = []
        for m in tar.getmembers():
            parts = Path(m.name).parts
            if len(parts) > 2 and parts[1:3] == ("vendor", "llama.cpp"):
                if m.name.startswith("/") or ".." in parts or m.islnk() or m.issym():
                    continue
                m.name = str(Path(*parts[3:])) if len(parts) > 3 else "."
                members.append(m)
        dest.mkdir(parents=True, exist_ok=True)
        for m in members:
            if m.name != ".":
                tar.extract(m, dest)
    if not (dest / "CMakeLists.txt").is_file():
        raise BenchError(f"{sdist}: no vendor/llama.cpp inside", hint="is this a llama-cpp-python sdist?")
    return dest


def build_server(*, jobs: int = 2, log: Callable[[str], None] | None = None) -> Path:
    """Build ``llama-server`` once (minutes) and return its path; later calls return the cached binary."""
    found = server_binary()
    if found:
        return found
    say = log or (lambda _m: None)
    with build_lock(say):
        found = server_binary()  # built by another process while this one waited
        if found:
            return found
        build, logfile = _configured(say)
        say(f"building {SERVER} with {jobs} jobs (several minutes, once) ...")
        _run(["cmake", "--build", str(build), "--target", SERVER, "-j", str(jobs)], logfile)
    found = server_binary()
    if not found:
        raise BenchError(f"{SERVER} was not produced by the build", hint=f"see the log {logfile}")
    return found


@contextlib.contextmanager
def build_lock(say: Callable[[str], None]) -> Iterator[None]:
    """One build at a time in the peer's folder, across processes (two ``localspec rpc-server`` started at
    once on a machine that has none built yet): ``fcntl.flock`` on ``build.lock`` there. A second process
    says it waits, then finds the program built. Where there is no ``fcntl`` (Windows): no lock."""
    if fcntl is None:
        yield
        return
    root = peer_dir()
    root.mkdir(parents=True, exist_ok=True)
    fd = os.open(root / "build.lock", os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            say(f"waiting for another localspec building llama.cpp in {root} ...")
            fcntl.flock(fd, fcntl.LOCK_EX)  # a Ctrl-C ends the wait
        yield
    finally:
        os.close(fd)  # (closing lets go of the lock)


def _configured(say: Callable[[str], None]) -> tuple[Path, Path]:
    """The vendored llama.cpp source downloaded, extracted and configured (each step once); returns the
    build folder and the build log."""
    version = installed_version()
    root = peer_dir(version)
    root.mkdir(parents=True, exist_ok=True)
    logfile = root / "build.log"
    sdists = sorted(root.glob("llama_cpp_python-*.tar.gz"))
    src = root / "src"
    if not sdists and not (src / "CMakeLists.txt").is_file():
        say(f"downloading the llama-cpp-python {version} source (sdist) ...")
        pip = [sys.executable, "-m", "pip", "download", "--no-binary", ":all:", "--no-deps"]
        _run([*pip, f"llama-cpp-python=={version}", "-d", str(root)], logfile)
        sdists = sorted(root.glob("llama_cpp_python-*.tar.gz"))
    if not (src / "CMakeLists.txt").is_file():
        say("extracting vendor/llama.cpp ...")
        _extract_vendor(sdists[-1], src)
    flags = build_flags()
    build = build_dir(version, flags)
    if not (build / "CMakeCache.txt").is_file():
        say(f"configuring llama.cpp (log: {logfile}) ...")
        _run(["cmake", "-S", str(src), "-B", str(build), *flags], logfile)
    return build, logfile


def lookup_create_binary(*, jobs: int = 2, log: Callable[[str], None] | None = None) -> Path:
    """Build ``llama-lookup-create`` (llama.cpp's static n-gram cache builder) next to the server, once."""
    return _extra_binary(LOOKUP_CREATE, ["-DLLAMA_BUILD_EXAMPLES=ON"], jobs=jobs, log=log)


def quantize_binary(*, jobs: int = 2, log: Callable[[str], None] | None = None) -> Path:
    """Build ``llama-quantize`` (llama.cpp's own re-encoder of GGUF weights) next to the server, once."""
    return _extra_binary(QUANTIZE, ["-DLLAMA_BUILD_TOOLS=ON"], jobs=jobs, log=log)


def rpc_server_binary(*, jobs: int = 2, log: Callable[[str], None] | None = None) -> Path:
    """Build llama.cpp's ``rpc-server`` (``tools/rpc``: serves this machine's CPU, or GPU with a GPU build,
    to another machine's llama.cpp over TCP) in the peer's build folder, once; it needs no llama-server."""
    return _extra_binary(RPC_SERVER, ["-DLLAMA_BUILD_TOOLS=ON", "-DGGML_RPC=ON"], jobs=jobs, log=log)


def archs_binary(*, jobs: int = 2, log: Callable[[str], None] | None = None) -> Path:
    """Build llama.cpp's ``test-llama-archs`` (``tests/``: writes a tiny random model of any architecture,
    ``-a ARCH -s SEED -o DIR``) in the peer's build folder, once; the test suite's recurrent and hybrid
    fixtures come from it."""
    return _extra_binary(ARCHS, ["-DLLAMA_BUILD_TESTS=ON"], jobs=jobs, log=log)


def built_rpc_server() -> Path | None:
    """The built ``rpc-server`` for the installed llama-cpp-python, or None when not built yet."""
    path = build_dir() / "bin" / RPC_SERVER
    return path if path.is_file() and os.access(path, os.X_OK) else None


def _extra_binary(name: str, configure: list[str], *, jobs: int, log: Callable[[str], None] | None) -> Path:
    """Build one more llama.cpp program in the peer's build folder, once."""
    build = build_dir()
    path = build / "bin" / name
    if path.is_file() and os.access(path, os.X_OK):
        return path
    say = log or (lambda _m: None)
    with build_lock(say):
        if path.is_file() and os.access(path, os.X_OK):  # built by another process while this one waited
            return path
        build, logfile = _configured(say)
        say(f"building {name} (once) ...")
        _run(["cmake", "-S", str(peer_dir() / "src"), "-B", str(build), *configure], logfile)
        _run(["cmake", "--build", str(build), "--target", name, "-j", str(jobs)], logfile)
    if not path.is_file():
        raise BenchError(f"{name} was not produced by the build", hint=f"see the log {logfile}")
    return path


def lookup_static_file(target: Path, texts: list[Path], out: Path, *, threads: int) -> Path:
    """llama.cpp's static n-gram cache (``-lcs``) built from the corpus ``texts`` with the target's vocab."""
    out.parent.mkdir(parents=True, exist_ok=True)
    corpus = out.with_suffix(".txt")
    corpus.write_text(
        "\n\n".join(t.read_text(encoding="utf-8", errors="replace") for t in texts), encoding="utf-8"
    )
    binary = lookup_create_binary()
    cmd = [str(binary), "-m", str(target), "-f", str(corpus), "-lcs", str(out), "-t", str(threads)]
    _run(cmd, out.with_suffix(".log"))
    if not out.is_file():
        raise BenchError(f"{LOOKUP_CREATE} wrote no cache file", hint=f"see {out.with_suffix('.log')}")
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
) -> list[str]:
    """llama-server flags for one llama.cpp mode of :data:`SESSION_MODES` (one slot, prompt cache on)."""
    args = ["--model", str(target), "--threads", str(threads), "--threads-batch", str(threads)]
    args += ["-c", str(n_ctx), "-np", "1", "--no-webui", "--host", "127.0.0.1"]
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
    else:
        raise BenchError(f"unknown llama.cpp mode {mode!r}", hint=f"choose from {', '.join(SESSION_MODES)}")
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
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
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
    binary = server_binary() or build_server(log=log)
    servers: dict[str, PeerServer] = {}
    try:
        for cfg in configs:
            args = server_args(cfg, target=target, draft=draft, threads=threads, n_ctx=n_ctx)
            name = cfg.label.replace(" ", "_").replace("=", "")
            servers[cfg.label] = PeerServer(binary, args, peer_dir() / "logs" / f"{name}.log")
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


def clean(version: str | None = None) -> None:
    """Remove the cached peer build."""
    shutil.rmtree(peer_dir(version), ignore_errors=True)
