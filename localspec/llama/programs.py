"""llama.cpp's own programs (``llama-server``, ``rpc-server``, ``llama-quantize``, ...), built once from the
llama.cpp that the installed llama-cpp-python vendors.

The first program asked for downloads the sdist of the installed llama-cpp-python (``pip download
--no-binary :all:``), extracts ``vendor/llama.cpp`` into :func:`vendored_dir` and configures it with the
CPU features the installed llama-cpp-python was built with (:func:`build_flags`), so both sides run the
same kernels and speak the same RPC protocol; each program is then built once into that build folder, one
build at a time across processes (:func:`build_lock`). ``localspec rpc-server`` runs ``rpc-server`` from
here; ``localspec bench --peer`` runs ``llama-server``.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shlex
import shutil
import sys
import tarfile
from collections.abc import Callable, Iterator
from pathlib import Path

from localspec import constants
from localspec.errors import BuildError
from localspec.llama.build import cpu_flags, installed_system_info
from localspec.llama.processes import call_as_group

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
#: llama.cpp's example speculative decoding loop (``examples/speculative-simple``: one target, one draft).
SPECULATIVE_SIMPLE = "llama-speculative-simple"
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

#: A progress callback: one line for the user at a time.
Say = Callable[[str], None]


def build_flags() -> list[str]:
    """Everything the programs are configured with: :data:`CMAKE_FLAGS`, the wheel's CPU features, then
    ``CMAKE_ARGS`` (a GPU build's flags, as for pip's build of llama-cpp-python)."""
    return [*CMAKE_FLAGS, *cpu_flags(installed_system_info()), *shlex.split(os.environ.get("CMAKE_ARGS", ""))]


def build_dir(version: str | None = None, flags: list[str] | None = None) -> Path:
    """One build folder per set of flags: a wheel rebuilt with other features gets its own programs."""
    digest = hashlib.sha256("\0".join(build_flags() if flags is None else flags).encode()).hexdigest()[:10]
    return vendored_dir(version) / f"build-{digest}"


def installed_version() -> str:
    """The installed llama-cpp-python's version (whose vendored llama.cpp is built).

    Raises:
        BuildError: llama-cpp-python is not installed.
    """
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("llama-cpp-python")
    except PackageNotFoundError as exc:
        raise BuildError("llama-cpp-python is not installed", hint="pip install llama-cpp-python") from exc


def vendored_dir(version: str | None = None) -> Path:
    """The folder of one llama-cpp-python version's llama.cpp: its source, builds, build log and lock."""
    return constants.peer_dir() / f"llama.cpp-{version or installed_version()}"


def built(name: str, version: str | None = None) -> Path | None:
    """The built program ``name`` (one of this module's program names) for the installed llama-cpp-python,
    or None when it is not built yet."""
    path = build_dir(version) / "bin" / name
    return path if path.is_file() and os.access(path, os.X_OK) else None


def server_binary(version: str | None = None) -> Path | None:
    """The built ``llama-server`` for the installed llama-cpp-python, or None when not built yet."""
    return built(SERVER, version)


def built_rpc_server() -> Path | None:
    """The built ``rpc-server`` for the installed llama-cpp-python, or None when not built yet."""
    return built(RPC_SERVER)


def run_logged(cmd: list[str], log: Path, cwd: Path | None = None) -> None:
    """Run one build step (or another llama.cpp tool) with its output appended to ``log``.

    Args:
        cmd: the program and its arguments.
        log: the log file its command line and output are appended to.
        cwd: where it runs (None: here).

    Raises:
        BuildError: it exited with a failure (the message names the command and the log).
    """
    with log.open("a", encoding="utf-8") as fh:
        fh.write(f"\n$ {shlex.join(cmd)}\n")
        fh.flush()
        rc = call_as_group(cmd, cwd=cwd, stdout=fh)
    if rc != 0:
        raise BuildError(
            f"building llama.cpp's programs failed (exit {rc}): {shlex.join(cmd[:4])} ...",
            hint=f"see the log {log}; cmake, a C++ compiler and network access to PyPI are needed",
        )


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
        raise BuildError(f"{sdist}: no vendor/llama.cpp inside", hint="is this a llama-cpp-python sdist?")
    return dest


def build_server(*, jobs: int = 2, log: Say | None = None) -> Path:
    """Build ``llama-server`` once (minutes) and return its path; later calls return the cached binary."""
    return _program(SERVER, [], jobs=jobs, log=log)


@contextlib.contextmanager
def build_lock(say: Say) -> Iterator[None]:
    """One build at a time in the programs' folder, across processes (two ``localspec rpc-server`` started
    at once on a machine that has none built yet): ``fcntl.flock`` on ``build.lock`` there. A second process
    says it waits, then finds the program built. Where there is no ``fcntl`` (Windows): no lock."""
    if fcntl is None:
        yield
        return
    root = vendored_dir()
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


def _configured(say: Say) -> tuple[Path, Path]:
    """The vendored llama.cpp source downloaded, extracted and configured (each step once); returns the
    build folder and the build log."""
    version = installed_version()
    root = vendored_dir(version)
    root.mkdir(parents=True, exist_ok=True)
    logfile = root / "build.log"
    sdists = sorted(root.glob("llama_cpp_python-*.tar.gz"))
    src = root / "src"
    if not sdists and not (src / "CMakeLists.txt").is_file():
        say(f"downloading the llama-cpp-python {version} source (sdist) ...")
        pip = [sys.executable, "-m", "pip", "download", "--no-binary", ":all:", "--no-deps"]
        run_logged([*pip, f"llama-cpp-python=={version}", "-d", str(root)], logfile)
        sdists = sorted(root.glob("llama_cpp_python-*.tar.gz"))
    if not (src / "CMakeLists.txt").is_file():
        say("extracting vendor/llama.cpp ...")
        _extract_vendor(sdists[-1], src)
    flags = build_flags()
    build = build_dir(version, flags)
    if not (build / "CMakeCache.txt").is_file():
        say(f"configuring llama.cpp (log: {logfile}) ...")
        run_logged(["cmake", "-S", str(src), "-B", str(build), *flags], logfile)
    return build, logfile


def lookup_create_binary(*, jobs: int = 2, log: Say | None = None) -> Path:
    """Build ``llama-lookup-create`` (llama.cpp's static n-gram cache builder) next to the server, once."""
    return _program(LOOKUP_CREATE, ["-DLLAMA_BUILD_EXAMPLES=ON"], jobs=jobs, log=log)


def quantize_binary(*, jobs: int = 2, log: Say | None = None) -> Path:
    """Build ``llama-quantize`` (llama.cpp's own re-encoder of GGUF weights) next to the server, once."""
    return _program(QUANTIZE, ["-DLLAMA_BUILD_TOOLS=ON"], jobs=jobs, log=log)


def rpc_server_binary(*, jobs: int = 2, log: Say | None = None) -> Path:
    """Build llama.cpp's ``rpc-server`` (``tools/rpc``: serves this machine's CPU, or GPU with a GPU build,
    to another machine's llama.cpp over TCP) in the programs' build folder, once; it needs no
    llama-server."""
    return _program(RPC_SERVER, ["-DLLAMA_BUILD_TOOLS=ON", "-DGGML_RPC=ON"], jobs=jobs, log=log)


def archs_binary(*, jobs: int = 2, log: Say | None = None) -> Path:
    """Build llama.cpp's ``test-llama-archs`` (``tests/``: writes a tiny random model of any architecture,
    ``-a ARCH -s SEED -o DIR``) in the programs' build folder, once; the test suite's recurrent and hybrid
    fixtures come from it."""
    return _program(ARCHS, ["-DLLAMA_BUILD_TESTS=ON"], jobs=jobs, log=log)


def speculative_simple_binary(*, jobs: int = 2, log: Say | None = None) -> Path:
    """Build llama.cpp's ``llama-speculative-simple`` (``examples/``: its own speculative decoding loop over
    a target and a draft, ``--spec-type`` draft-simple, draft-eagle3, draft-dflash, ...; it logs how many
    tokens were drafted and accepted) in the programs' build folder, once; the test suite checks its
    EAGLE-3 and DFlash drafter fixtures against it."""
    return _program(SPECULATIVE_SIMPLE, ["-DLLAMA_BUILD_EXAMPLES=ON"], jobs=jobs, log=log)


def _program(name: str, configure: list[str], *, jobs: int, log: Say | None) -> Path:
    """Build one llama.cpp program in the programs' build folder once (``configure``: the cmake options it
    needs beyond :func:`build_flags`); its path."""
    found = built(name)
    if found:
        return found
    say = log or (lambda _m: None)
    with build_lock(say):
        found = built(name)  # built by another process while this one waited
        if found:
            return found
        build, logfile = _configured(say)
        say(f"building {name} with {jobs} jobs (minutes, once) ...")
        if configure:
            run_logged(["cmake", "-S", str(vendored_dir() / "src"), "-B", str(build), *configure], logfile)
        run_logged(["cmake", "--build", str(build), "--target", name, "-j", str(jobs)], logfile)
    found = built(name)
    if not found:
        raise BuildError(f"{name} was not produced by the build", hint=f"see the log {logfile}")
    return found


def clean(version: str | None = None) -> None:
    """Remove the cached source and builds of llama.cpp's programs."""
    shutil.rmtree(vendored_dir(version), ignore_errors=True)
