"""Loading a GGUF model through llama-cpp-python: the settings checked before anything loads, where the
layers go (this machine, a GPU, rpc-servers), and llama.cpp's load itself with its log kept and its refusal
said in words."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Callable, Iterator
from collections.abc import Sequence as Seq
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import llama_cpp
import llama_cpp._internals as llama_internals

from localspec import constants
from localspec.errors import GGUFError, LocalspecError, SettingsError
from localspec.llama import mtp as mtp_layers
from localspec.llama import recurrent, rpc
from localspec.llama.build import check_amx
from localspec.llama.load_hooks import replaced
from localspec.llama.logs import Said, quiet_stderr
from localspec.llama.sequence import sequences_asked
from localspec.settings import N_CTX_RANGE, max_threads


def check_load_settings(*, n_ctx: int, n_threads: int, n_gpu_layers: int, what: str = "model") -> None:
    """Refuse values llama.cpp would crash on or spend without bound, before anything loads."""
    low, high = N_CTX_RANGE
    if isinstance(n_ctx, bool) or not isinstance(n_ctx, int) or not low <= n_ctx <= high:
        raise SettingsError(
            f"n_ctx {n_ctx!r} is out of range for the {what}",
            hint=f"use a whole number from {low} to the model's trained context (4096 is usual)",
        )
    top = max_threads()
    if isinstance(n_threads, bool) or not isinstance(n_threads, int) or not 1 <= n_threads <= top:
        raise SettingsError(
            f"threads {n_threads!r} is out of range for the {what}",
            hint=f"use 1 to {top} on this machine ({os.cpu_count()} logical cores); "
            "the physical core count is usually fastest",
        )
    if isinstance(n_gpu_layers, bool) or not isinstance(n_gpu_layers, int) or n_gpu_layers < -1:
        raise SettingsError(
            f"GPU layers {n_gpu_layers!r} is not valid for the {what}",
            hint="use -1 (all layers), 0 (CPU only) or a number of layers",
        )


def supports_gpu_offload() -> bool:
    """True when this llama-cpp-python build can offload layers to a GPU here (CUDA, Metal, Vulkan...).

    llama.cpp's own ``llama_supports_gpu_offload`` is also true for a CPU build with the RPC backend, whose
    offloaded layers can only go to rpc-servers: then a local GPU device is looked for in ggml's registry.
    """
    if not llama_cpp.llama_supports_gpu_offload():
        return False
    return not rpc.supported() or rpc.has_local_gpu()


def default_gpu_layers(requested: int | None, *, offload: bool) -> int:
    """Layers to offload: an explicit ``requested`` value wins; otherwise all (-1) when the build can
    offload (``offload``), else none (0). Pure, so the decision is tested without a GPU."""
    if requested is not None:
        return requested
    return -1 if offload else 0


def check_sequences(n_seq: int, *, mtp: bool, what: str = "model") -> None:
    """Refuse a number of sequences llama.cpp cannot hold, or MTP layers asked to draft for several.

    Args:
        n_seq: sequences the context is to hold.
        mtp: whether MTP layers (or an MTP assistant) are loaded with it.
        what: the model, for the message.
    """
    top = int(llama_cpp.llama_max_parallel_sequences())
    if isinstance(n_seq, bool) or not isinstance(n_seq, int) or not 1 <= n_seq <= top:
        raise SettingsError(
            f"parallel {n_seq!r} is out of range for the {what}",
            hint=f"use 1 to {top} sequences at once",
        )
    if mtp and n_seq > 1:
        raise SettingsError(
            f"the MTP layers of {what} draft for one sequence at a time, and {n_seq} were asked for",
            hint="use parallel 1 with MTP, or draft with ngram, suffix or a draft model to run requests "
            "at once",
        )


def rpc_placement(said_lines: list[str], names: dict[str, str], n_layer: int) -> str:
    """Where llama.cpp put each repeating layer of an RPC-backed model, from its load log
    (``layer 3 assigned to device RPC1``): ``RPC 127.0.0.1:50052 14/28 layers, ...; CPU 0/28``.

    Args:
        said_lines: the load's log lines (:class:`Said`).
        names: ggml device name -> what to call it (``RPC0`` -> ``127.0.0.1:50052``).
        n_layer: the model's repeating layers (the output layer, numbered ``n_layer``, is not counted).

    Returns:
        The summary; ``RPC over ...`` without counts when the log was not captured (LOCALSPEC_VERBOSE).
    """
    counts: dict[str, int] = {}
    for line in said_lines:
        head, sep, device = line.partition(" assigned to device ")
        words = head.split()
        if sep and len(words) >= 2 and words[-2] == "layer" and words[-1].isdigit():
            if int(words[-1]) < n_layer:
                name = device.split(",")[0].strip()
                counts[name] = counts.get(name, 0) + 1
    if not counts:
        return "RPC over " + ", ".join(names.values())
    parts = [f"{names.get(name, name)} {n}/{n_layer}" for name, n in counts.items() if name in names]
    local = sum(n for name, n in counts.items() if name not in names)
    text = "RPC " + ", ".join(parts) + " layers"
    return text + (f"; this machine {local}/{n_layer}" if local else "")


def placement(n_gpu_layers: int, n_layer: int, *, offload: bool) -> str:
    """Where a model runs, for people: ``CPU``, ``GPU (all layers)`` or ``GPU 10/28 layers, rest CPU``."""
    if not offload or n_gpu_layers == 0:
        return "CPU"
    if n_gpu_layers < 0 or n_gpu_layers >= n_layer:
        return "GPU (all layers)"
    return f"GPU {n_gpu_layers}/{n_layer} layers, rest CPU"


def place_layers(
    path: Path,
    servers: list[rpc.Endpoint],
    *,
    n_threads: int,
    n_gpu_layers: int,
    tensor_split: Seq[float] | None,
) -> tuple[Any, dict[str, str]]:
    """Where a model's layers go: the rpc-servers' devices and their labels (``RPC0`` -> ``host:port``), the
    split checked; else (None, {}) after the AMX check of a local load.

    Args:
        path: the model file.
        servers: rpc-servers for its layers (none: this machine).
        n_threads: CPU threads (the AMX check asks).
        n_gpu_layers: layers offloaded.
        tensor_split: each device's share.

    Returns:
        The devices to load with (None: this machine's) and their labels.
    """
    if not servers:
        check_amx(path, n_threads=n_threads, n_gpu_layers=n_gpu_layers)  # a crash there kills us
        return None, {}
    devices = rpc.devices(servers)
    owners: list[rpc.Endpoint] = []  # the server of each device (an rpc-server may offer several)
    for server in servers:
        owners += [server] * len(rpc.devices([server]))
    labels = dict(zip(rpc.device_names(devices), map(str, owners[: len(devices)]), strict=True))
    if tensor_split:
        rpc.check_tensor_split(list(tensor_split), [f"{n} {e}" for n, e in labels.items()])
    return devices, labels


@dataclass(frozen=True)
class LoadAsk:
    """What one load asks llama.cpp for: the context of all sequences, batch, threads, layers offloaded and
    their split, state snapshots, MTP layers and sequences."""

    n_ctx: int
    n_batch: int
    n_threads: int
    n_gpu_layers: int
    tensor_split: Seq[float] | None
    rollback_depth: int
    mtp: bool
    n_seq: int


def load_llama(
    path: Path, devices: Any, ask: LoadAsk, call: Callable[[Callable[[], Any]], Any]
) -> tuple[llama_cpp.Llama, Said, bool]:
    """llama.cpp loads the file, its load log kept quiet and returned; its refusal becomes a
    :class:`GGUFError` with llama.cpp's own reason, and a Ctrl-C during the load is held until it is done.

    Args:
        path: the GGUF file.
        devices: the rpc-servers' devices for its layers (None: this machine's).
        ask: what the context asks for.
        call: runs the load where the model's llama.cpp calls run (an RPC guard's thread).

    Returns:
        llama-cpp-python's object, what llama.cpp said, and whether Ctrl-C came during the load (the caller
        frees the model and raises it).
    """
    said = Said()

    def load() -> llama_cpp.Llama:
        return llama_cpp.Llama(
            model_path=str(path),
            n_ctx=ask.n_ctx,
            n_batch=ask.n_batch,
            n_ubatch=ask.n_batch,
            n_threads=ask.n_threads,
            n_threads_batch=ask.n_threads,
            n_gpu_layers=ask.n_gpu_layers,
            tensor_split=list(ask.tensor_split) if ask.tensor_split else None,
            logits_all=False,
            verbose=constants.verbose(),  # LOCALSPEC_VERBOSE: its load log, on stderr
        )

    try:
        with (
            interrupt_after() as interrupted,
            quiet_stderr() as said,
            rpc.load_devices(devices),
            recurrent.snapshots_asked(ask.rollback_depth),
            sequences_asked(ask.n_seq),
            mtp_layers.layers_asked(ask.mtp),
            attention_as_llama_cpp(),
        ):
            llama = call(load)
    except (ValueError, RuntimeError, OSError) as exc:
        if isinstance(exc, LocalspecError):  # an RpcError: already says which server and what to do
            raise
        raise _refusal(path, said, exc) from None
    return llama, said, bool(interrupted)


@contextlib.contextmanager
def attention_as_llama_cpp() -> Iterator[None]:
    """While the block loads a model through ``llama_cpp.Llama``, its context lets llama.cpp choose flash
    attention (``AUTO``: on where the device runs it), as llama.cpp's own programs and llama-server do;
    ``Llama`` turns it off unless asked (its argument is on or off, never llama.cpp's choice). The context
    class it calls is replaced for the block, as for the sequences."""

    def with_auto(original: type) -> type:
        class WithAutoAttention(original):
            def __init__(self, *, model: Any, params: Any, verbose: bool = True) -> None:
                params.flash_attn_type = llama_cpp.LLAMA_FLASH_ATTN_TYPE_AUTO
                super().__init__(model=model, params=params, verbose=verbose)

        return WithAutoAttention

    with replaced(llama_internals, "LlamaContext", with_auto):
        yield


def _refusal(path: Path, said: Said, exc: Exception) -> GGUFError:
    """llama.cpp's own reason a load failed (an architecture this build does not know, a tensor out of
    bounds), with what to do."""
    why = next((e for e in reversed(said.errors) if "error loading model" in e), None)
    why = why or (said.errors[-1] if said.errors else str(exc))
    hint = None
    if "unknown model architecture" in why:
        hint = (
            f"llama-cpp-python {llama_cpp.__version__} does not run this architecture: a newer "
            "release may (pip install -U llama-cpp-python), or pick a model of another family"
        )
    return GGUFError(str(path), f"llama.cpp could not load this model: {why[:300]}", hint=hint)


@contextlib.contextmanager
def interrupt_after() -> Iterator[list[int]]:
    """Hold Ctrl-C while llama.cpp loads a model, for the caller to raise it after (the list is non-empty
    when it came). Python runs its SIGINT handler at the next bytecode, and during a load that is inside
    llama-cpp-python's log callback, called from C: a KeyboardInterrupt raised there is printed as
    ignored and lost, so a Ctrl-C in the load (0.3-0.7 s for a 1.5B Q4 model from the page cache, seconds
    from a cold disk) let the whole generation run. Only in the main thread with Python's own handler in
    place (a server's or a UI's handler is theirs to keep)."""
    caught: list[int] = []
    if (
        threading.current_thread() is not threading.main_thread()
        or signal.getsignal(signal.SIGINT) is not signal.default_int_handler
    ):
        yield caught
        return
    signal.signal(signal.SIGINT, lambda signum, frame: caught.append(signum))
    try:
        yield caught
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)
