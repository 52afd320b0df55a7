"""llama.cpp's RPC backend: a target's layers on other machines' ``rpc-server``, through ggml's registry.

llama-cpp-python 0.3.36 has no ``rpc_servers`` any more (llama.cpp moved RPC devices into ggml's backend
registry): :func:`devices` asks the RPC backend for ``ggml_backend_rpc_add_server`` by its registry proc
address, as llama.cpp's ``--rpc`` does (``common/arg.cpp``), through llama_cpp's ctypes handle to ggml,
and hands the devices to one model load in ``llama_model_params.devices`` (:func:`load_devices`). They
are never added to the global registry, so every other load (the draft, another pipeline) stays local.

ggml's RPC client ends the process (``GGML_ABORT``) when it cannot connect, and when a server goes away
mid-generation. So:

- :func:`parse_endpoints` refuses, as a :class:`SettingsError`, any ``HOST:PORT`` llama.cpp's client could
  not use (an empty label, a non-ASCII name, an IPv6 address, a port that is not 1-65535);
- :func:`hello` speaks the RPC handshake itself first (a TCP connect to the IPv4 address llama.cpp's
  ``gethostbyname`` gives, and ``HELLO``, a few seconds at most): a wrong address, a busy or silent server,
  or another protocol version is an :class:`RpcError` naming the address, before llama.cpp ever connects;
- every llama.cpp call of an RPC-backed model (and llama.cpp's own connect) runs on a :class:`Guard`'s
  thread. Any abort during such a call (on that thread, on ggml's RPC thread, or from ggml's RPC code:
  "Failed to connect to HOST:PORT" when a server that answered the handshake is gone before llama.cpp
  connects) goes to :func:`_on_abort` (ggml's abort callback), which records it and parks that thread
  instead of letting ``abort()`` run; the caller's wait wakes up and raises an :class:`RpcError` naming
  the server that stopped. The model's llama.cpp objects are left as they are (freeing them would talk to
  the dead server again), and llama.cpp keeps one connection per address for the whole process, so RPC
  loads are refused afterwards in this process: the fix is to restart the rpc-server, then this program.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import ipaddress
import math
import os
import queue
import re
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

import llama_cpp

from localspec.errors import RpcError, SettingsError
from localspec.llama.load_hooks import LOAD_LOCK, replaced

#: llama.cpp's rpc-server port when none is given.
DEFAULT_PORT = 50052
#: How long the handshake with one server may take before its address is called wrong.
HELLO_TIMEOUT_S = 5.0
#: The RPC protocol this llama.cpp speaks (``RPC_PROTO_MAJOR_VERSION``/``MINOR`` in ``ggml-rpc.h``).
PROTO_MAJOR, PROTO_MINOR = 7, 0
_CMD_HELLO = 14  # RPC_CMD_HELLO, fixed across versions
_CONN_CAPS = 24  # RPC_CONN_CAPS_SIZE: the capabilities a client offers (none: plain TCP)
_DEVICE_GPU, _DEVICE_IGPU = 1, 2  # enum ggml_backend_dev_type

T = TypeVar("T")


@dataclass(frozen=True)
class Endpoint:
    """One rpc-server's address, as llama.cpp writes it (``host:port``)."""

    host: str
    port: int

    def __str__(self) -> str:
        return f"{self.host}:{self.port}"


def parse_endpoints(spec: str | Iterable[str]) -> list[Endpoint]:
    """The servers of ``--rpc HOST:PORT[,HOST:PORT...]`` (or a list of ``HOST:PORT``), checked.

    Args:
        spec: comma-separated ``host:port`` items, or an iterable of them.

    Returns:
        The endpoints, in order (the order of ``tensor_split``'s shares).

    Raises:
        SettingsError: an empty list, an item without a port, a port out of range, an IPv6 address
            (llama.cpp's RPC client parses ``host:port`` at the first colon), a host that is neither an
            IPv4 address nor a host name (:func:`host_problem`), or a server named twice.
    """
    items = spec.split(",") if isinstance(spec, str) else list(spec)
    items = [item.strip() for item in items]
    if not items or not all(items):
        raise SettingsError(
            "--rpc names no server", hint=f"give HOST:PORT items, comma-separated: {_EXAMPLE}"
        )
    out: list[Endpoint] = []
    for item in items:
        endpoint = _parse_endpoint(item)
        if endpoint in out:
            raise SettingsError(f"RPC server {endpoint} is named twice", hint="name each server once")
        out.append(endpoint)
    return out


_EXAMPLE = f"127.0.0.1:{DEFAULT_PORT},192.168.1.20:{DEFAULT_PORT}"
_LABEL = re.compile(r"[A-Za-z0-9_]([A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?")


def _parse_endpoint(item: str) -> Endpoint:
    """One ``HOST:PORT`` item, checked as llama.cpp's client will read it (``gethostbyname``, IPv4)."""
    host, sep, port = item.rpartition(":")
    if not sep or not host or ":" in host or not item.isprintable() or any(c.isspace() for c in item):
        raise SettingsError(
            f"RPC server {item!r} is not HOST:PORT",
            hint=f"write each server as HOST:PORT (an IPv4 address or a name; llama.cpp's RPC client "
            f"takes no IPv6 address): {_EXAMPLE}",
        )
    if not re.fullmatch(r"[0-9]{1,5}", port) or not 1 <= int(port) <= 65535:
        raise SettingsError(f"RPC server {item!r}: port {port!r} is not 1-65535", hint=f"e.g. {_EXAMPLE}")
    problem = host_problem(host)
    if problem:
        raise SettingsError(f"RPC server {item!r}: {problem}", hint=f"e.g. {_EXAMPLE}")
    return Endpoint(host, int(port))


def host_problem(host: str) -> str | None:
    """Why ``host`` cannot name an rpc-server for llama.cpp's client, in a few words; None when it can.

    Args:
        host: an IPv4 address (four decimal numbers) or a host name (ASCII labels of 1-63 letters, digits,
            ``-`` or ``_``, 253 characters at most).

    Returns:
        The problem, or None.
    """
    if re.fullmatch(r"[0-9.]+", host):
        try:
            ipaddress.IPv4Address(host)
        except ValueError:
            return f"{host!r} is not an IPv4 address (four numbers 0-255, e.g. 192.168.1.20)"
        return None
    name = host[:-1] if host.endswith(".") else host
    if not name.isascii() or len(name) > 253 or not all(_LABEL.fullmatch(label) for label in name.split(".")):
        return (
            f"{host!r} is not a host name (dot-separated labels of 1-63 ASCII letters, digits and '-', "
            "253 characters at most)"
        )
    return None


def supported() -> bool:
    """True when the installed llama-cpp-python was built with llama.cpp's RPC backend (``GGML_RPC=ON``)."""
    return bool(llama_cpp.llama_supports_rpc())


def rebuild_command() -> str:
    """The pip command that rebuilds llama-cpp-python with the RPC backend and this build's CPU features."""
    from localspec.llama.build import cpu_flags, installed_system_info

    flags = " ".join([*cpu_flags(installed_system_info()), "-DGGML_RPC=ON"])
    return (
        f'CMAKE_ARGS="{flags}" pip install --no-cache-dir --force-reinstall --no-deps '
        f"llama-cpp-python=={llama_cpp.__version__}"
    )


def check_supported() -> None:
    """Raise :class:`RpcError` with the rebuild command when this build has no RPC backend."""
    if not supported():
        raise RpcError(
            "this llama-cpp-python was built without llama.cpp's RPC backend, which --rpc needs",
            hint=f"rebuild it with -DGGML_RPC=ON: {rebuild_command()}",
        )


#: The most a started rpc-server may take to answer its first handshake.
SERVER_READY_TIMEOUT_S = 30.0


def wait_serving(
    proc: subprocess.Popen,
    endpoint: Endpoint,
    *,
    timeout: float = SERVER_READY_TIMEOUT_S,
    hint: str = "see what it printed above",
) -> None:
    """Return once the rpc-server child ``proc`` answers the handshake at ``endpoint``.

    Args:
        proc: the server's process.
        endpoint: where it listens (or a proxy in front of it).
        timeout: seconds it may take.
        hint: where to look when it fails (its output).

    Raises:
        RpcError: it exited before it served, or did not answer within ``timeout``.
    """
    deadline = time.monotonic() + timeout
    while True:
        if proc.poll() is not None:
            raise RpcError(
                f"rpc-server on {endpoint} exited with status {proc.returncode} before it served", hint=hint
            )
        try:
            hello(endpoint, timeout=1.0)
            return
        except RpcError:
            if time.monotonic() > deadline:
                raise RpcError(
                    f"rpc-server on {endpoint} did not answer within {timeout:g} s", hint=hint
                ) from None
            time.sleep(0.1)


def hello(endpoint: Endpoint, *, timeout: float = HELLO_TIMEOUT_S) -> tuple[int, int, int]:
    """Connect to ``endpoint`` and do the RPC handshake as llama.cpp would, within ``timeout`` seconds.

    Args:
        endpoint: the server.
        timeout: seconds for the connection and for the answer each.

    Returns:
        The server's protocol version ``(major, minor, patch)``.

    Raises:
        RpcError: nothing listens there, no answer in time, a name that does not resolve, an answer
            that is not llama.cpp's RPC, or a protocol version this llama.cpp cannot talk to.
    """
    request = bytes([_CMD_HELLO]) + struct.pack("<Q", _CONN_CAPS) + bytes(_CONN_CAPS)
    problem = host_problem(endpoint.host) or (None if 1 <= endpoint.port <= 65535 else "port not 1-65535")
    if problem:  # an Endpoint built by hand: what parse_endpoints would have refused
        raise RpcError(f"RPC server {endpoint}: {problem}", hint=f"e.g. {_EXAMPLE}")
    try:
        # the address llama.cpp's client will connect to: gethostbyname's, IPv4 only
        address = socket.gethostbyname(endpoint.host)
        with socket.create_connection((address, endpoint.port), timeout=timeout) as sock:
            sock.sendall(request)
            size = struct.unpack("<Q", _recv_exactly(sock, 8))[0]
            if size != 4 + _CONN_CAPS:
                raise _not_rpc(endpoint, f"an answer of {size} bytes to HELLO")
            major, minor, patch = _recv_exactly(sock, size)[:3]
    except RpcError:  # (a ConnectionError: not to be caught again below)
        raise
    except (socket.gaierror, UnicodeError) as exc:
        why = exc.strerror if isinstance(exc, socket.gaierror) else "not a valid host name"
        raise RpcError(
            f"RPC server {endpoint}: the name {endpoint.host!r} does not resolve to an IPv4 address ({why})",
            hint="check the host name, or give its IPv4 address (llama.cpp's RPC client takes no IPv6)",
        ) from None
    except ConnectionRefusedError:
        raise RpcError(
            f"RPC server {endpoint}: nothing listens there (connection refused)",
            hint=f"start `localspec rpc-server --port {endpoint.port}` on that machine (add --host and "
            "--insecure-expose for an address other machines reach), or fix the address",
        ) from None
    except TimeoutError:
        raise RpcError(
            f"RPC server {endpoint}: no answer within {timeout:g} s",
            hint="check the address and that a firewall lets the port through; an rpc-server serves one "
            "client at a time, so another program may be using it",
        ) from None
    except OSError as exc:
        raise RpcError(
            f"RPC server {endpoint}: {exc.strerror or exc}", hint="check the address and the network"
        ) from None
    if major != PROTO_MAJOR or minor > PROTO_MINOR:
        raise RpcError(
            f"RPC server {endpoint} speaks RPC protocol {major}.{minor}.{patch}; this llama.cpp speaks "
            f"{PROTO_MAJOR}.{PROTO_MINOR}.x",
            hint=f"run the rpc-server of the same llama.cpp: `localspec rpc-server` with llama-cpp-python "
            f"{llama_cpp.__version__} on that machine",
        )
    return major, minor, patch


def _recv_exactly(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        piece = sock.recv(n - len(data))
        if not piece:
            raise ConnectionResetError("closed the connection")
        data += piece
    return data


def _not_rpc(endpoint: Endpoint, what: str) -> RpcError:
    return RpcError(
        f"{endpoint} answered with {what}: not llama.cpp's rpc-server",
        hint="check the port: it should be the one `localspec rpc-server` printed",
    )


# ggml's registry ---------------------------------------------------------------------------------------
def _ggml() -> Any:
    from llama_cpp._ggml import libggml

    for name, restype, argtypes in (
        ("ggml_backend_reg_by_name", ctypes.c_void_p, [ctypes.c_char_p]),
        ("ggml_backend_reg_get_proc_address", ctypes.c_void_p, [ctypes.c_void_p, ctypes.c_char_p]),
        ("ggml_backend_reg_dev_count", ctypes.c_size_t, [ctypes.c_void_p]),
        ("ggml_backend_reg_dev_get", ctypes.c_void_p, [ctypes.c_void_p, ctypes.c_size_t]),
        ("ggml_backend_dev_name", ctypes.c_char_p, [ctypes.c_void_p]),
        ("ggml_backend_dev_by_type", ctypes.c_void_p, [ctypes.c_int]),
        ("ggml_set_abort_callback", ctypes.c_void_p, [ctypes.c_void_p]),
    ):
        fn = getattr(libggml, name)
        fn.restype, fn.argtypes = restype, argtypes
    return libggml


_ADD_SERVER = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_char_p)
_devices: dict[Endpoint, list[int]] = {}
_registry_lock = threading.Lock()


def devices(endpoints: list[Endpoint]) -> list[int]:
    """The ggml devices (``ggml_backend_dev_t`` addresses) the servers offer, each server handshaken first.

    Args:
        endpoints: the servers, as :func:`parse_endpoints` returns them.

    Returns:
        Their devices in order (an rpc-server offers one per accelerator, or its CPU).

    Raises:
        RpcError: no RPC backend in this build, a server that fails :func:`hello`, or an earlier RPC
            failure in this process (llama.cpp cannot reconnect to it).
    """
    check_supported()
    _refuse_after_failure()
    out: list[int] = []
    for endpoint in endpoints:
        with _registry_lock:
            if endpoint not in _devices:
                hello(endpoint)
                # llama.cpp connects here: on a thread of its own, so a server lost meanwhile is an error
                guard = Guard([endpoint], "connecting")
                _devices[endpoint] = guard.call(functools.partial(_add_server, endpoint))
        out += _devices[endpoint]
    return out


def _add_server(endpoint: Endpoint) -> list[int]:
    ggml = _ggml()
    _install_abort_callback(ggml)
    reg = ggml.ggml_backend_reg_by_name(b"RPC")
    address = ggml.ggml_backend_reg_get_proc_address(reg, b"ggml_backend_rpc_add_server") if reg else None
    if not address:
        raise RpcError("this llama.cpp build has no RPC backend in its registry", hint=rebuild_command())
    server_reg = _ADD_SERVER(address)(str(endpoint).encode())
    count = ggml.ggml_backend_reg_dev_count(server_reg) if server_reg else 0
    if not count:
        raise RpcError(f"RPC server {endpoint} offers no device", hint="see what that rpc-server printed")
    return [ggml.ggml_backend_reg_dev_get(server_reg, i) for i in range(count)]


def has_local_gpu() -> bool:
    """True when ggml's registry holds a GPU of this machine (a discrete or integrated one)."""
    ggml = _ggml()
    return any(ggml.ggml_backend_dev_by_type(kind) for kind in (_DEVICE_GPU, _DEVICE_IGPU))


def device_names(devs: list[int]) -> list[str]:
    """ggml's names of ``devs`` (``RPC0``, ``RPC1``...: what llama.cpp's load log calls them)."""
    ggml = _ggml()
    return [(ggml.ggml_backend_dev_name(d) or b"?").decode() for d in devs]


def check_tensor_split(split: list[float], devices: list[str]) -> None:
    """Refuse a ``tensor_split`` llama.cpp would misread: one share per device, each finite and 0 or more,
    not all 0.

    Args:
        split: the shares, in the order of ``devices``.
        devices: what each device is called (for the message).

    Raises:
        SettingsError: a share count that is not the device count, or a share that is not a number >= 0.
    """
    if len(split) != len(devices):
        raise SettingsError(
            f"--tensor-split gives {len(split)} shares for {len(devices)} devices ({', '.join(devices)})",
            hint="give one share per RPC device, in the order of --rpc, e.g. 3,1",
        )
    if not all(math.isfinite(x) and x >= 0 for x in split) or not any(split):
        raise SettingsError(
            f"--tensor-split {','.join(map(str, split))}: shares must be numbers of 0 or more, not all 0",
            hint="e.g. 3,1 puts three quarters of the layers on the first server",
        )


@contextlib.contextmanager
def load_devices(devs: list[int] | None) -> Iterator[None]:
    """Within the block, a model llama-cpp-python loads offloads to exactly ``devs`` (None: llama.cpp's
    default choice, any local GPU).

    ``Llama()`` builds its ``llama_model_params`` from ``llama_model_default_params()`` and loads at once,
    with no argument for devices: the block hands it params with ``devices`` set
    (:func:`localspec.llama.load_hooks.replaced`). Loads take the lock even without devices, so two loads in
    two threads never see each other's params.
    """
    with LOAD_LOCK:
        if devs is None:
            yield
            return
        array = (ctypes.c_void_p * (len(devs) + 1))(*devs, None)  # NULL-terminated, alive for the load

        def with_devices(original: Callable[[], Any]) -> Callable[[], Any]:
            def params_with_devices() -> Any:
                params = original()
                params.devices = ctypes.cast(array, ctypes.c_void_p).value
                return params

            return params_with_devices

        with replaced(llama_cpp.llama_cpp, "llama_model_default_params", with_devices):
            yield


# Failures ----------------------------------------------------------------------------------------------
_failure: list[str] = []  # what ggml said when an RPC connection failed (once in a process)
_changed = threading.Condition()
_parked = threading.Event()  # never set: threads that hit an RPC failure wait on it for good
_abort_installed: list[Any] = []  # the callback, kept alive while ggml holds it


_in_guard = threading.local()  # .active on a Guard's thread
_in_flight = [0]  # Guard calls running now (under _changed)


@ctypes.CFUNCTYPE(None, ctypes.c_char_p)
def _on_abort(message: bytes | None) -> None:
    """ggml's abort callback: an abort of an RPC call (on a :class:`Guard`'s thread, on ggml's RPC thread,
    from ggml's RPC code, or on any other thread while a Guard call runs) is recorded and its thread
    parked; anything else is printed and ggml's ``abort()`` runs as it would have."""
    text = (message or b"").decode("utf-8", "replace").strip()
    if not _is_rpc_abort(text):
        print(text, file=sys.stderr, flush=True)
        return
    if threading.current_thread() is threading.main_thread():  # never parked: that would be a hang
        print(f"localspec: an RPC server was lost ({text}); restart it, then this program", file=sys.stderr)
        sys.stderr.flush()
        os._exit(1)
    with _changed:
        _failure.append(re.sub(r"^.*?\.(?:c|cpp|h):\d+:\s*", "", text))  # without the build's file path
        _changed.notify_all()
    _parked.wait()


def _is_rpc_abort(text: str) -> bool:
    """Whether ggml's abort ``text``, on this thread, comes from an RPC call."""
    if getattr(_in_guard, "active", False) or "ggml-rpc" in text or "RPC" in text:
        return True
    return _in_flight[0] > 0 and threading.current_thread() is not threading.main_thread()


def _install_abort_callback(ggml: Any) -> None:
    if not _abort_installed:
        ggml.ggml_set_abort_callback(ctypes.cast(_on_abort, ctypes.c_void_p))
        _abort_installed.append(_on_abort)


def failed() -> str | None:
    """What ggml said when an RPC connection of this process failed, or None."""
    return _failure[0] if _failure else None


def _refuse_after_failure() -> None:
    if _failure:
        raise RpcError(
            f"an RPC connection of this process failed earlier ({_failure[0]}); llama.cpp keeps its "
            "connections for the life of the process and cannot reopen them",
            hint="restart the rpc-server(s), then restart this program (localspec serve / ui / run)",
        )


def stopped(endpoints: list[Endpoint], *, timeout: float = 1.0) -> list[Endpoint]:
    """The servers of ``endpoints`` that no longer accept a connection (to name the one that went away)."""
    out = []
    for endpoint in endpoints:
        try:
            socket.create_connection((endpoint.host, endpoint.port), timeout=timeout).close()
        except OSError:
            out.append(endpoint)
    return out


@dataclass
class _Job:
    fn: Callable[[], Any]
    done: bool = False
    result: Any = None
    error: BaseException | None = None


class Guard:
    """Runs the llama.cpp calls of one RPC-backed model on a thread of its own, one at a time, so that a
    server lost mid-call ends the call with an :class:`RpcError` in the caller instead of the process."""

    def __init__(self, endpoints: list[Endpoint], what: str) -> None:
        self.endpoints = list(endpoints)
        self.what = what
        self._jobs: queue.SimpleQueue[_Job] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._work, name=f"localspec-rpc {what}", daemon=True)
        self._thread.start()

    @property
    def broken(self) -> bool:
        """True once an RPC connection of this process failed: this model can no longer be used."""
        return bool(_failure)

    def call(self, fn: Callable[[], T]) -> T:
        """``fn()`` run on the guard's thread; its result, or its exception raised here.

        Raises:
            RpcError: an RPC connection failed before or during the call.
        """
        if _failure:
            raise self.lost()
        job = _Job(fn)
        with _changed:
            _in_flight[0] += 1
        self._jobs.put(job)
        with _changed:
            _changed.wait_for(lambda: job.done or bool(_failure))
            _in_flight[0] -= 1
        if not job.done:
            raise self.lost()
        if job.error is not None:
            raise job.error
        return job.result

    def lost(self) -> RpcError:
        """The error of a call that cannot complete: which server stopped, and what to do."""
        gone = stopped(self.endpoints)
        who = (
            f"RPC server {', '.join(map(str, gone))} stopped"
            if gone
            else f"the connection to an RPC server ({', '.join(map(str, self.endpoints))}) failed"
        )
        return RpcError(
            f"{self.what}: {who} ({_failure[0] if _failure else 'no reason given'}); the model cannot be "
            "used any more in this process",
            hint="restart the rpc-server(s), then restart this program to load the model again",
        )

    def _work(self) -> None:
        _in_guard.active = True
        while True:
            job = self._jobs.get()
            try:
                job.result = job.fn()
            except BaseException as exc:  # handed to the caller, who raises it
                job.error = exc
            with _changed:
                job.done = True
                _changed.notify_all()
