"""What the installed llama.cpp build does on this CPU: the x86 features it uses, the cmake flags that
rebuild it, and whether its AMX kernels survive here. :func:`check_build` puts the whole build (features,
GPU backends and devices from ggml's registry, the RPC backend) against this machine for ``localspec
doctor``, with the rebuild that closes each gap.

llama.cpp built for a CPU with AMX (``-march=native`` on an Intel Xeon of the Sapphire Rapids kind and
later, what a plain ``pip install llama-cpp-python`` does there) moves the weights of quantized models
(Q4_0/Q4_1/Q8_0/Q4_K/Q5_K/Q6_K/IQ4_XS tensors: nearly every GGUF people run) into AMX buffers, and on
some machines its AMX matrix multiply kills the process at the first decode: SIGSEGV in
``ggml_backend_amx_mul_mat`` (llama.cpp issue 20824, open upstream; seen on this project's Xeon VM with the
llama.cpp that llama-cpp-python 0.3.36 vendors, on the Qwen2.5-Coder Q4_K_M pair) or SIGILL at
``tilezero`` on hypervisors that do not really allow AMX. A crash inside llama.cpp cannot be caught, so
:func:`check_amx` decodes once with the model in a child process before the real load (a few seconds,
once per build and model file; the verdict is kept under the cache folder) and turns a crash there into
a :class:`~localspec.errors.BuildError` with the rebuild command for this CPU. Builds without AMX, and
float models (F32/F16/BF16, which AMX does not take in this llama.cpp), are never probed.
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from localspec import constants
from localspec.errors import BuildError
from localspec.gguf.meta import read_metadata

#: The x86 CPU features ``llama_print_system_info`` reports: the ``/proc/cpuinfo`` flag that says a CPU has
#: one, and the cmake options that switch it on. A native build of the peer next to an AVX2 wheel would
#: compare builds, not engines: measured on this project's AVX-512 machine, llama-server built with
#: -march=native ran the 1.5B target 1.066x as fast as the same source built for AVX2 (46.8 against 43.9
#: tok/s, 2 threads).
CPU_FEATURES: dict[str, tuple[str, tuple[str, ...]]] = {
    "AVX": ("avx", ("GGML_AVX",)),
    "AVX_VNNI": ("avx_vnni", ("GGML_AVX_VNNI",)),
    "AVX2": ("avx2", ("GGML_AVX2",)),
    "F16C": ("f16c", ("GGML_F16C",)),
    "FMA": ("fma", ("GGML_FMA",)),
    "BMI2": ("bmi2", ("GGML_BMI2",)),
    "AVX512": ("avx512f", ("GGML_AVX512",)),
    "AVX512_VBMI": ("avx512vbmi", ("GGML_AVX512_VBMI",)),
    "AVX512_VNNI": ("avx512_vnni", ("GGML_AVX512_VNNI",)),
    "AVX512_BF16": ("avx512_bf16", ("GGML_AVX512_BF16",)),
    "AMX_INT8": ("amx_int8", ("GGML_AMX_TILE", "GGML_AMX_INT8")),
}
#: Never advised as a rebuild: llama.cpp's AMX kernels crash on some machines (see the module docstring).
NOT_ADVISED = frozenset({"AMX_INT8"})
#: ``general.file_type`` of all-float models (F32, F16, BF16): llama.cpp's AMX kernels take none of them.
FLOAT_FILE_TYPES = frozenset({0, 1, 32})
#: How long the probe may take: loading a large model from a cold disk is slow, and a probe that runs out
#: of time decides nothing (the real load goes ahead).
PROBE_TIMEOUT_S = 600.0


def installed_system_info() -> str:
    """What the installed llama-cpp-python's llama.cpp was built with (``CPU : AVX = 1 | ...``)."""
    import llama_cpp

    return llama_cpp.llama_print_system_info().decode("utf-8", "replace").strip()


def features_of(system_info: str) -> set[str]:
    """The features a llama.cpp build reports as on (``AVX2 = 1 | ...`` from ``llama_print_system_info``)."""
    return set(re.findall(r"\b([A-Z0-9_]+) = 1\b", system_info))


def cpu_flags(system_info: str, *, without: frozenset[str] = frozenset()) -> list[str]:
    """cmake flags that build llama.cpp with exactly the x86 features named in ``system_info`` (the
    installed llama-cpp-python's ``llama_print_system_info()``) less ``without``; [] when it names none
    (not x86: a native build there matches the wheel's default)."""
    return flags_for_features(features_of(system_info) - without)


def flags_for_features(present: set[str] | frozenset[str]) -> list[str]:
    """cmake flags that build llama.cpp with exactly the x86 features ``present`` (names as
    :data:`CPU_FEATURES` spells them); [] when they name none of AVX, AVX2, SSE3 (not x86)."""
    if not present & {"AVX", "AVX2", "SSE3"}:
        return []
    flags = ["-DGGML_NATIVE=OFF"]
    for feature, (_, options) in CPU_FEATURES.items():
        flags += [f"-D{opt}={'ON' if feature in present else 'OFF'}" for opt in options]
    return flags


def cpuinfo_flags(cpuinfo: str) -> set[str]:
    """The x86 flags of the first CPU in ``cpuinfo`` (the text of ``/proc/cpuinfo``); empty off x86."""
    lines = (line for line in cpuinfo.splitlines() if line.startswith("flags") and ":" in line)
    return set(next((line.split(":", 1)[1].split() for line in lines), []))


def unused_cpu_features(system_info: str, cpuinfo: str) -> list[str]:
    """The features this CPU has (``cpuinfo``: the text of ``/proc/cpuinfo``) that the llama.cpp build
    described by ``system_info`` does not use, AMX never included; [] off x86 or when nothing is missing."""
    return _unused(features_of(system_info), cpuinfo_flags(cpuinfo))


def _unused(used: set[str], has: set[str]) -> list[str]:
    """The features of :data:`CPU_FEATURES` the CPU ``has`` (its flags) and the build does not ``use``."""
    return [
        name
        for name, (flag, _) in CPU_FEATURES.items()
        if flag in has and name not in used and name not in NOT_ADVISED
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


# The whole build (``localspec doctor``) ------------------------------------------------------------------
#: GPU backends as ggml's registry names them, and the cmake option that builds each.
GPU_BACKENDS: dict[str, str] = {
    "CUDA": "-DGGML_CUDA=on",
    "ROCm": "-DGGML_HIP=on",
    "MTL": "-DGGML_METAL=on",
    "Vulkan": "-DGGML_VULKAN=on",
    "SYCL": "-DGGML_SYCL=on",
    "MUSA": "-DGGML_MUSA=on",
    "OpenCL": "-DGGML_OPENCL=on",
    "CANN": "-DGGML_CANN=on",
}
#: The cmake option that builds llama.cpp's RPC backend (``--rpc``, ``localspec rpc-server``).
RPC_FLAG = "-DGGML_RPC=ON"
#: ``enum ggml_backend_dev_type``, in order.
DEVICE_KINDS = ("cpu", "gpu", "igpu", "accel", "meta")


@dataclass(frozen=True)
class Device:
    """One device in ggml's registry: ``CUDA0``, ``CPU``..., its kind (:data:`DEVICE_KINDS`) and memory."""

    name: str
    description: str
    kind: str
    memory_bytes: int = 0  # 0: not known


@dataclass(frozen=True)
class BuildFacts:
    """What the installed llama-cpp-python is: :func:`installed_build` reads it; a test writes one by hand.

    ``system_info`` is ``llama_print_system_info()`` (``CPU : AVX2 = 1 | ...``); ``backends`` the names in
    ggml's backend registry (``CPU``, ``CUDA``, ``RPC``...), where a backend built without features to
    report (RPC) shows, unlike in ``system_info``.
    """

    version: str
    system_info: str
    backends: tuple[str, ...]
    devices: tuple[Device, ...] = ()
    ggml_version: str = ""  # llama.cpp's ggml version and commit, when it says

    @property
    def rpc(self) -> bool:
        """Whether llama.cpp's RPC backend is built (what ``llama_supports_rpc()`` asks)."""
        return "RPC" in self.backends

    @property
    def gpu_backends(self) -> list[str]:
        return [b for b in self.backends if b in GPU_BACKENDS]

    def flags(self, *, features: set[str] | None = None, add: tuple[str, ...] = ()) -> list[str]:
        """cmake flags that rebuild this build: its CPU features (or ``features``), GPU backends and RPC,
        plus ``add``."""
        cpu = features if features is not None else features_of(self.system_info)
        kept = [GPU_BACKENDS[b] for b in self.gpu_backends] + ([RPC_FLAG] if self.rpc else [])
        return [*flags_for_features(cpu), *kept, *(f for f in add if f not in kept)]


@dataclass(frozen=True)
class Finding:
    """One thing :func:`check_build` looked at.

    ``state``: ``ok``; ``note`` (works, worth knowing); ``gap`` (works, and a rebuild would give this
    machine something it can use); ``problem`` (something localspec uses does not work here). ``flags``:
    the cmake flags of the rebuild that closes a gap or fixes a problem (``fix`` is its command).
    """

    topic: str
    state: str
    text: str
    flags: tuple[str, ...] = ()
    version: str = ""

    @property
    def fix(self) -> str | None:
        return rebuild_command(list(self.flags), self.version) if self.flags else None


def check_build(
    build: BuildFacts,
    cpuinfo: str,
    *,
    pinned: str | None = None,
    amx_crashes: int = 0,
    gpus_seen: tuple[str, ...] = (),
) -> list[Finding]:
    """What works in ``build`` on this machine, what is missing, and the rebuild for each gap.

    Args:
        build: the installed build (:func:`installed_build`).
        cpuinfo: the text of ``/proc/cpuinfo`` ("" where there is none: the CPU is then not compared).
        pinned: the llama-cpp-python version localspec requires, if known.
        amx_crashes: how many of the AMX check's kept verdicts are crashes (:func:`amx_crash_count`).
        gpus_seen: GPU backends this machine's hardware could use (:func:`gpus_seen`).

    Returns:
        The findings, in the order a report shows them: version, CPU features, AMX, GPU, RPC.
    """
    version = pinned or build.version
    out = []
    if pinned and build.version != pinned:
        out.append(
            Finding(
                "llama-cpp-python",
                "problem",
                f"{build.version} is installed; localspec is built against {pinned}",
                tuple(build.flags()),
                pinned,
            )
        )
    out += _cpu_findings(build, cpuinfo_flags(cpuinfo), version)
    out += _amx_findings(build, cpuinfo_flags(cpuinfo), amx_crashes, version)
    out += _gpu_findings(build, gpus_seen, version)
    if build.rpc:
        out.append(Finding("RPC", "ok", "built: `--rpc` and `localspec rpc-server` work"))
    else:
        out.append(
            Finding(
                "RPC",
                "gap",
                "not built: `--rpc` and `localspec rpc-server` need it",
                tuple(build.flags(add=(RPC_FLAG,))),
                version,
            )
        )
    return out


def _cpu_findings(build: BuildFacts, has: set[str], version: str) -> list[Finding]:
    """The build's x86 features against the CPU's (nothing to say off x86 or without ``/proc/cpuinfo``)."""
    used = features_of(build.system_info)
    if not has or not flags_for_features(used):
        return []
    lacking = [n for n, (flag, _) in CPU_FEATURES.items() if n in used and flag not in has]
    if lacking:
        return [
            Finding(
                "CPU features",
                "problem",
                f"the build uses {', '.join(lacking)}, which this CPU lacks: llama.cpp stops at an illegal "
                "instruction",
                tuple(build.flags(features=used - set(lacking))),
                version,
            )
        ]
    unused = _unused(used, has)
    if unused:
        return [
            Finding(
                "CPU features",
                "gap",
                f"this CPU has {', '.join(unused)}, which the build does not use: wide verify passes cost "
                "more (1.3-1.5x on an AVX-512 CPU with an AVX2 build)",
                tuple(build.flags(features=used | set(unused))),
                version,
            )
        ]
    return [
        Finding(
            "CPU features",
            "ok",
            "the build uses every feature of this CPU that llama.cpp can use (AMX aside)",
        )
    ]


def _amx_findings(build: BuildFacts, has: set[str], crashes: int, version: str) -> list[Finding]:
    used = features_of(build.system_info)
    if "AMX_INT8" not in used:
        if "amx_int8" in has:
            return [
                Finding("AMX", "ok", "this CPU has AMX, the build does not use it (never advised: see below)")
            ]
        return []
    without = tuple(build.flags(features=used - NOT_ADVISED))
    if crashes:
        return [
            Finding(
                "AMX",
                "problem",
                f"llama.cpp's AMX kernels crashed in {crashes} test decode(s) on this machine (llama.cpp "
                "issue 20824): rebuild without AMX",
                without,
                version,
            )
        ]
    return [
        Finding(
            "AMX",
            "note",
            "the build uses AMX, whose kernels crash on some machines (llama.cpp issue 20824): each "
            "quantized model is first tried once in a child process; if it crashes, rebuild without AMX",
            without,
            version,
        )
    ]


def _gpu_findings(build: BuildFacts, seen: tuple[str, ...], version: str) -> list[Finding]:
    out = []
    gpus = [d for d in build.devices if d.kind in ("gpu", "igpu")]
    for backend in build.gpu_backends:
        found = [d for d in gpus if d.name.startswith(backend)]
        if found:
            names = ", ".join(f"{d.name} ({d.description})" for d in found)
            out.append(Finding(f"GPU: {backend}", "ok", f"built; devices: {names}"))
        else:
            out.append(
                Finding(f"GPU: {backend}", "note", "built, but no device found: models run on the CPU")
            )
    for backend in seen:
        if backend not in build.gpu_backends:
            out.append(
                Finding(
                    f"GPU: {backend}",
                    "gap",
                    f"this machine has a {backend} GPU, and the build has no {backend} backend: models run "
                    "on the CPU",
                    tuple(build.flags(add=(GPU_BACKENDS[backend],))),
                    version,
                )
            )
    if not out:
        out.append(Finding("GPU", "ok", "none built and none seen: models run on the CPU"))
    return out


def fix_all(build: BuildFacts, findings: list[Finding]) -> str | None:
    """One command that closes every gap and fixes every problem in ``findings`` that a rebuild of
    ``build`` fixes (what each rebuild changes, together), or None when none does. A note's rebuild (AMX off
    while it has not crashed here) goes in too when there is something else to rebuild for: the one command
    never turns back on what a note's own command leaves out (no rebuild localspec prints builds AMX)."""
    fixes = [f for f in findings if f.flags and f.state in ("gap", "problem")]
    if not fixes:
        return None
    advice = [f for f in findings if f.flags and f.state == "note"]
    base = build.flags()
    merged = {flag.split("=", 1)[0]: flag for flag in base}
    for f in [*fixes, *advice]:
        merged.update((flag.split("=", 1)[0], flag) for flag in f.flags if flag not in base)
    return rebuild_command(list(merged.values()), fixes[0].version)


def gpus_seen() -> tuple[str, ...]:
    """GPU backends this machine's hardware could use, from what its drivers show (NVIDIA: CUDA; AMD's
    compute driver: ROCm). Apple GPUs take Metal, which macOS builds have by default."""
    seen = []
    if Path("/proc/driver/nvidia/version").exists() or shutil.which("nvidia-smi"):
        seen.append("CUDA")
    if Path("/dev/kfd").exists():
        seen.append("ROCm")
    return tuple(seen)


def amx_crash_count() -> int:
    """How many of the AMX check's kept verdicts are crashes."""
    return sum(1 for path in list_verdicts() if (_read_verdict(path) or {}).get("crashed"))


def installed_build() -> BuildFacts:
    """The installed llama-cpp-python: its version, ``llama_print_system_info()``, ggml's backends and
    devices (llama.cpp's registry, read through llama_cpp's ctypes handle to ggml)."""
    import llama_cpp

    backends, devices = _registry()
    return BuildFacts(
        version=llama_cpp.__version__,
        system_info=installed_system_info(),
        backends=tuple(backends),
        devices=tuple(devices),
        ggml_version=_ggml_version(),
    )


def _ggml() -> Any:
    from llama_cpp._ggml import libggml

    size_p = ctypes.POINTER(ctypes.c_size_t)
    for name, restype, argtypes in (
        ("ggml_backend_reg_count", ctypes.c_size_t, []),
        ("ggml_backend_reg_get", ctypes.c_void_p, [ctypes.c_size_t]),
        ("ggml_backend_reg_name", ctypes.c_char_p, [ctypes.c_void_p]),
        ("ggml_backend_dev_count", ctypes.c_size_t, []),
        ("ggml_backend_dev_get", ctypes.c_void_p, [ctypes.c_size_t]),
        ("ggml_backend_dev_name", ctypes.c_char_p, [ctypes.c_void_p]),
        ("ggml_backend_dev_description", ctypes.c_char_p, [ctypes.c_void_p]),
        ("ggml_backend_dev_type", ctypes.c_int, [ctypes.c_void_p]),
        ("ggml_backend_dev_memory", None, [ctypes.c_void_p, size_p, size_p]),
    ):
        fn = getattr(libggml, name)
        fn.restype, fn.argtypes = restype, argtypes
    return libggml


def _registry() -> tuple[list[str], list[Device]]:
    """ggml's backend names and devices."""
    g = _ggml()
    names = [
        (g.ggml_backend_reg_name(g.ggml_backend_reg_get(i)) or b"?").decode()
        for i in range(g.ggml_backend_reg_count())
    ]
    devices = []
    for i in range(g.ggml_backend_dev_count()):
        dev = g.ggml_backend_dev_get(i)
        free, total = ctypes.c_size_t(0), ctypes.c_size_t(0)
        g.ggml_backend_dev_memory(dev, ctypes.byref(free), ctypes.byref(total))
        kind = g.ggml_backend_dev_type(dev)
        devices.append(
            Device(
                name=(g.ggml_backend_dev_name(dev) or b"?").decode(),
                description=(g.ggml_backend_dev_description(dev) or b"").decode("utf-8", "replace"),
                kind=DEVICE_KINDS[kind] if 0 <= kind < len(DEVICE_KINDS) else str(kind),
                memory_bytes=total.value,
            )
        )
    return names, devices


def _ggml_version() -> str:
    """ggml's version and commit (``0.9.4 (abc1234)``), "" when this build does not say."""
    from llama_cpp._ggml import libggml

    parts: list[str] = []
    for name in ("ggml_version", "ggml_commit"):
        fn = getattr(libggml, name, None)
        if fn is None:
            return " ".join(parts)
        fn.restype, fn.argtypes = ctypes.c_char_p, []
        parts.append((fn() or b"").decode())
    return f"{parts[0]} ({parts[1]})" if all(parts) else " ".join(p for p in parts if p)


# AMX ---------------------------------------------------------------------------------------------------
def rebuild_without_amx(system_info: str) -> str:
    """The command that reinstalls llama-cpp-python for this build's features less AMX."""
    import llama_cpp

    return rebuild_command(cpu_flags(system_info, without=NOT_ADVISED), llama_cpp.__version__)


def rebuild_command(flags: list[str], version: str) -> str:
    """The pip command that reinstalls llama-cpp-python ``version``, compiled with the cmake ``flags``."""
    return (
        f'CMAKE_ARGS="{" ".join(flags)}" pip install --no-cache-dir --force-reinstall --no-deps '
        f"llama-cpp-python=={version}"
    )


def probe_command(model: Path, *, n_threads: int, n_gpu_layers: int) -> list[str]:
    """The child process that loads ``model`` and decodes once, as the real load would (:func:`_probe`)."""
    return [
        sys.executable,
        "-m",
        "localspec.llama.build",
        str(model),
        str(n_threads),
        str(n_gpu_layers),
    ]


def file_type_of(model: Path) -> int | None:
    """``general.file_type`` from the model's header; None when it has none or cannot be read (the real
    load reports an unreadable file)."""
    try:
        return read_metadata(model, tensors=False, merges=False).file_type
    except (OSError, ValueError):
        return None


def _verdict_path(model: Path, system_info: str) -> Path:
    import llama_cpp

    st = model.stat()
    lib = constants.llama_cpp_lib_path() or ""
    parts = (llama_cpp.__version__, system_info, lib, model.resolve(), st.st_size, st.st_mtime_ns)
    ident = "\0".join(map(str, parts))
    return verdicts_dir() / f"{hashlib.sha256(ident.encode()).hexdigest()[:16]}.json"


def verdicts_dir() -> Path:
    """Where the AMX check keeps its verdicts (one file per build and model file)."""
    return constants.localspec_home() / "amx"


def list_verdicts() -> list[Path]:
    """The kept verdicts (``localspec cache info``)."""
    try:
        return sorted(verdicts_dir().glob("*.json"))
    except OSError:
        return []


def clear_verdicts() -> list[Path]:
    """Delete every kept verdict (and leftover temporary files): the next load of a quantized model with an
    AMX build probes again (``localspec cache clear --costs``, after a rebuild or a llama.cpp fix)."""
    return constants.delete_files(verdicts_dir(), "*.json", "*.tmp")


def check_amx(model: Path, *, n_threads: int, n_gpu_layers: int) -> None:
    """Raise :class:`BuildError` when this llama.cpp build's AMX kernels crash on ``model`` here.

    Decides at once for a build without AMX, a float model, ``LOCALSPEC_TRUST_AMX`` set, or a verdict kept
    from an earlier probe of the same build and file; else runs :func:`probe_command` once and keeps its
    verdict: a child killed by a signal is a crash; a child that ran, failed otherwise, or ran out of time
    decides nothing (the real load reports its own errors).
    """
    if constants.trust_amx():
        return
    system_info = installed_system_info()
    if "AMX_INT8" not in features_of(system_info) or file_type_of(model) in FLOAT_FILE_TYPES:
        return
    path = _verdict_path(model, system_info)
    verdict = _read_verdict(path)
    if verdict is None:
        verdict = _probe(model, n_threads=n_threads, n_gpu_layers=n_gpu_layers)
        if verdict is None:
            return
        _write_verdict(path, verdict)
    if verdict.get("crashed"):
        raise BuildError(
            f"{model.name}: this llama.cpp build's AMX kernels crash on this machine "
            f"({verdict.get('signal', 'a signal')} in a test decode, llama.cpp issue 20824)",
            hint=f"rebuild llama-cpp-python without AMX: {rebuild_without_amx(system_info)} "
            f"(README: Troubleshooting); to load it anyway, set LOCALSPEC_TRUST_AMX=1 "
            f"(the verdict is kept in {path}; `localspec cache clear --costs` has the check run again)",
        )


def _probe(model: Path, *, n_threads: int, n_gpu_layers: int) -> dict | None:
    cmd = probe_command(model, n_threads=n_threads, n_gpu_layers=n_gpu_layers)
    try:
        done = subprocess.run(cmd, capture_output=True, timeout=PROBE_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if done.returncode == 0:
        return {"crashed": False, "command": shlex.join(cmd), "when": time.strftime("%Y-%m-%dT%H:%M:%S")}
    if done.returncode < 0:
        try:
            name = signal.Signals(-done.returncode).name
        except ValueError:
            name = f"signal {-done.returncode}"
        return {"crashed": True, "signal": name, "when": time.strftime("%Y-%m-%dT%H:%M:%S")}
    return None


def _read_verdict(path: Path) -> dict | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None  # none kept, or a damaged file: probe again
    return data if isinstance(data, dict) and isinstance(data.get("crashed"), bool) else None


def _write_verdict(path: Path, verdict: dict) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")  # two processes probing at once never share one
        tmp.write_text(json.dumps(verdict), encoding="utf-8")
        tmp.replace(path)
    except OSError:
        pass  # an unwritable cache only means probing again next time


def _probe_main(argv: list[str]) -> int:
    """The child: load the model as :class:`localspec.llama.runtime.Model` does and decode a 17-token batch
    and
    then one token (both kernel paths: wide verify passes and single steps)."""
    model, n_threads, n_gpu_layers = argv[0], int(argv[1]), int(argv[2])
    import llama_cpp

    llama = llama_cpp.Llama(
        model_path=model,
        n_ctx=64,
        n_batch=32,
        n_ubatch=32,
        n_threads=n_threads,
        n_threads_batch=n_threads,
        n_gpu_layers=n_gpu_layers,
        verbose=False,
    )
    tokens = llama.tokenize(b"def add(a, b):\n    return a + b\n" * 4, add_bos=False)[:17]
    llama.eval(tokens)
    llama.eval(tokens[:1])
    return 0


if __name__ == "__main__":
    sys.exit(_probe_main(sys.argv[1:]))
