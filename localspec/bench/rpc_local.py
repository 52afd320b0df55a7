"""llama.cpp rpc-servers on this machine, and a TCP proxy on loopback that delays what passes through it:
what ``localspec bench --rpc-rtt`` and the RPC tests measure a target over RPC with.

:class:`RpcServer` runs the ``rpc-server`` built from the vendored llama.cpp
(:func:`localspec.llama.programs.rpc_server_binary`) on ``127.0.0.1`` and waits for its handshake.
:class:`DelayProxy` listens on a loopback port and forwards every connection to one server, holding each
chunk for half the round trip in each direction (the order of bytes and the throughput are kept: chunks
queue, only their release is late), so a loopback server behaves like one a network away without touching
the machine's network settings.
"""

from __future__ import annotations

import contextlib
import heapq
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from localspec.llama import rpc
from localspec.llama.processes import die_with_this_process, stop


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class RpcServer:
    """One llama.cpp ``rpc-server`` on ``127.0.0.1``; a context manager that stops it on exit."""

    def __init__(self, binary: Path, *, threads: int = 1, port: int | None = None, log: Path | None = None):
        """Start the server (:meth:`wait_ready` waits for it).

        Args:
            binary: the built rpc-server.
            threads: its CPU threads.
            port: its port (default: a free one).
            log: where its output goes (default: discarded).
        """
        self.endpoint = rpc.Endpoint("127.0.0.1", port or free_port())
        self.log = log
        out = log.open("w", encoding="utf-8") if log else subprocess.DEVNULL
        cmd = [str(binary), "-H", self.endpoint.host, "-p", str(self.endpoint.port), "-t", str(threads)]
        try:
            self.proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, **die_with_this_process())
        finally:
            if log:
                out.close()  # type: ignore[union-attr]

    def wait_ready(self, timeout: float = rpc.SERVER_READY_TIMEOUT_S) -> None:
        """Return once the server answers the RPC handshake; :class:`RpcError` if it exits or is silent."""
        rpc.wait_serving(
            self.proc,
            self.endpoint,
            timeout=timeout,
            hint=f"see {self.log}" if self.log else "is the port taken?",
        )

    def stop(self) -> None:
        """Stop the server (SIGTERM, then SIGKILL after 5 s)."""
        stop(self.proc)

    def __enter__(self) -> RpcServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


@contextlib.contextmanager
def local_servers(
    binary: Path, count: int, *, threads: int = 1, logs: Path | None = None
) -> Iterator[list[RpcServer]]:
    """``count`` rpc-servers on loopback, ready, stopped when the block ends.

    Args:
        binary: the built rpc-server.
        count: how many.
        threads: CPU threads of each.
        logs: a folder for their logs (default: discarded).

    Yields:
        The servers, each answering its handshake.
    """
    servers: list[RpcServer] = []
    try:
        for i in range(count):
            log = logs / f"rpc-server-{i}.log" if logs else None
            if log:
                log.parent.mkdir(parents=True, exist_ok=True)
            servers.append(RpcServer(binary, threads=threads, log=log))
        for server in servers:
            server.wait_ready()
        yield servers
    finally:
        for server in servers:
            server.stop()


class DelayProxy:
    """Forwards ``127.0.0.1:<port>`` to ``upstream``, adding ``rtt_ms`` of round trip (half each way).

    A context manager; :attr:`endpoint` is where to connect. Connections are served until :meth:`close`.
    """

    def __init__(self, upstream: rpc.Endpoint, rtt_ms: float) -> None:
        """Listen on a free loopback port.

        Args:
            upstream: the server connections go to.
            rtt_ms: the round trip added, in milliseconds (0: none, the proxy's own cost only).
        """
        if rtt_ms < 0:
            raise ValueError(f"rtt_ms must be 0 or more, got {rtt_ms}")
        self.upstream = upstream
        self.one_way_s = rtt_ms / 2000
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.endpoint = rpc.Endpoint("127.0.0.1", int(self._listener.getsockname()[1]))
        self._closed = threading.Event()
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, name="delay-proxy accept", daemon=True).start()

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            try:
                server = socket.create_connection((self.upstream.host, self.upstream.port), timeout=5)
            except OSError:
                client.close()
                continue
            server.settimeout(None)
            for s in (client, server):
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with self._lock:
                self._sockets += [client, server]
            self._pump(client, server)
            self._pump(server, client)

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        """Two threads for one direction: one reads and stamps each chunk, one sends it when due."""
        due: list[tuple[float, int, bytes]] = []
        ready = threading.Condition()

        def read() -> None:
            n = 0
            while True:
                try:
                    data = src.recv(1 << 18)
                except OSError:
                    data = b""
                with ready:
                    heapq.heappush(due, (time.monotonic() + self.one_way_s, n, data))
                    ready.notify()
                n += 1
                if not data:
                    return

        def write() -> None:
            while True:
                with ready:
                    ready.wait_for(lambda: bool(due))
                    when, _, data = heapq.heappop(due)
                wait = when - time.monotonic()
                if wait > 0:
                    time.sleep(wait)
                if not data:
                    _shut(dst)
                    return
                try:
                    dst.sendall(data)
                except OSError:
                    _shut(src)
                    return

        threading.Thread(target=read, name="delay-proxy read", daemon=True).start()
        threading.Thread(target=write, name="delay-proxy write", daemon=True).start()

    def close(self) -> None:
        """Stop accepting and end every connection."""
        self._closed.set()
        self._listener.close()
        with self._lock:
            for s in self._sockets:
                _shut(s)
                s.close()

    def __enter__(self) -> DelayProxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _shut(s: socket.socket) -> None:
    with contextlib.suppress(OSError):
        s.shutdown(socket.SHUT_RDWR)
