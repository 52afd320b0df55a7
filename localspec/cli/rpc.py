"""``localspec rpc-server``: llama.cpp's own rpc-server, built once from the vendored source, run here so that
another machine's ``localspec ... --rpc HOST:PORT`` puts a target's layers on this one (docs/rpc.md)."""

from __future__ import annotations

import errno
import signal
import socket
import subprocess

import click

from localspec import constants
from localspec.cli.options import THREADS
from localspec.errors import RpcError
from localspec.llama.rpc import DEFAULT_PORT


def _check_port_free(host: str, port: int) -> None:
    """An :class:`RpcError` naming the port when something already listens there (or the address is not
    this machine's), before the server starts and says it in its own words."""
    try:
        with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind((host, port))
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            raise RpcError(f"port {port} on {host} is in use", hint="pick another with --port") from None
        raise RpcError(
            f"cannot listen on {host}:{port} ({exc.strerror or exc})",
            hint="give an address of this machine with --host (default 127.0.0.1)",
        ) from None


@click.command("rpc-server")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", default=DEFAULT_PORT, show_default=True, type=click.IntRange(1, 65535), help="Port.")
@click.option("--threads", type=THREADS, help="CPU threads for the layers it holds (default: physical cores)")
@click.option(
    "--cache",
    is_flag=True,
    help="Keep the tensors it receives in llama.cpp's file cache, so a model loads faster the next time.",
)
@click.option(
    "--insecure-expose",
    is_flag=True,
    help="Allow a non-loopback --host. llama.cpp's RPC has NO authentication: only on a network you trust.",
)
def rpc_server(host: str, port: int, threads: int | None, cache: bool, insecure_expose: bool) -> None:
    """Run llama.cpp's rpc-server: this machine holds part of a target for another machine's --rpc.

    Built once (minutes) from the llama.cpp that llama-cpp-python vendors, with the same CPU features, so
    both ends speak the same RPC protocol. Stop it with Ctrl-C.
    """
    from localspec.bench.peer import built_rpc_server, rpc_server_binary
    from localspec.serve.exposure import check_rpc_exposure, is_loopback

    line = check_rpc_exposure(host, port, insecure_expose=insecure_expose)
    _check_port_free(host, port)
    say = lambda m: click.echo(f"localspec: {m}", err=True)  # noqa: E731
    binary = built_rpc_server() or rpc_server_binary(log=say)
    n_threads = constants.default_threads() if threads is None else threads
    click.echo(f"localspec: {line}", err=True)
    where = f"127.0.0.1:{port}" if is_loopback(host) else f"{host}:{port}"
    click.echo(f"localspec: use it with --rpc {where} (run, bench, serve, ui); Ctrl-C stops it", err=True)
    cmd = [str(binary), "-H", host, "-p", str(port), "-t", str(n_threads), *(["-c"] if cache else [])]
    rc = _run_in_foreground(cmd)
    if rc != 0:
        raise RpcError(f"rpc-server exited with status {rc}", hint="see what it printed above")


def _run_in_foreground(cmd: list[str]) -> int:
    """Run ``cmd`` until it exits; a Ctrl-C or a SIGTERM sent to this process stops it too (never an
    orphaned server left listening)."""
    proc = subprocess.Popen(cmd)

    def terminated(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, terminated)
    try:
        return proc.wait()
    finally:
        signal.signal(signal.SIGTERM, previous)
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


COMMANDS = [rpc_server]
