"""``localspec rpc-server``: llama.cpp's own rpc-server, built once from the vendored source, run here so that
another machine's ``localspec ... --rpc HOST:PORT`` puts a target's layers on this one (docs/rpc.md).

The command says "use it with --rpc ..." only once the server answers the RPC handshake, and names the
address it listens on; a server that stops on its own (whatever its exit status) is an error.
"""

from __future__ import annotations

import errno
import ipaddress
import re
import socket
import subprocess
from collections.abc import Callable

import click

from localspec import constants
from localspec.cli.options import THREADS
from localspec.errors import RpcError
from localspec.llama.rpc import DEFAULT_PORT, Endpoint, wait_serving


def check_host(ctx: click.Context | None, param: click.Parameter | None, value: str) -> str:
    """``--host``: an address llama.cpp's rpc-server can bind, which is an IPv4 address written as four
    decimal numbers (it reads ``-H`` with ``inet_addr``: no names, no IPv6); a usage error otherwise.

    Returns:
        The address, normalized (``ipaddress``'s spelling).
    """
    text = value.strip()
    try:
        address = ipaddress.IPv4Address(text)
    except ValueError:
        try:
            ipaddress.IPv6Address(text.strip("[]").split("%")[0])
            what = "an IPv6 address"
        except ValueError:
            if re.fullmatch(r"[0-9.]+", text):
                what = "not four numbers 0-255"
            else:
                what = "a host name" if text and text.isprintable() else "not an address"
        raise click.BadParameter(
            f"{value!r} is {what}: llama.cpp's rpc-server listens on an IPv4 address only (four numbers, "
            "e.g. 127.0.0.1)",
            param_hint="'--host'",
        ) from None
    if address == ipaddress.IPv4Address("255.255.255.255") or address.is_multicast:
        raise click.BadParameter(f"{value!r} is not an address a server can listen on", param_hint="'--host'")
    return str(address)


def _check_port_free(host: str, port: int) -> None:
    """An :class:`RpcError` naming the port when something already listens there, and a usage error when
    the address is not this machine's, before the server starts and says it in its own words."""
    try:
        with socket.socket(socket.AF_INET) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind((host, port))
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            raise RpcError(f"port {port} on {host} is in use", hint="pick another with --port") from None
        raise click.BadParameter(
            f"cannot listen on {host}:{port} ({exc.strerror or exc}): give an address of this machine "
            "(default 127.0.0.1)",
            param_hint="'--host'",
        ) from None


def connect_line(host: str, port: int) -> str:
    """What the user passes to ``--rpc`` to reach a server listening on ``host``."""
    if host == "0.0.0.0":
        return f"--rpc 127.0.0.1:{port} here, --rpc ADDRESS-OF-THIS-MACHINE:{port} from another machine"
    return f"--rpc {host}:{port}"


@click.command("rpc-server")
@click.option(
    "--host",
    default="127.0.0.1",
    show_default=True,
    callback=check_host,
    help="IPv4 address to listen on (llama.cpp's rpc-server takes no host name and no IPv6).",
)
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
    from localspec.llama.programs import built_rpc_server, rpc_server_binary
    from localspec.serve.exposure import check_rpc_exposure

    line = check_rpc_exposure(host, port, insecure_expose=insecure_expose)
    _check_port_free(host, port)
    say = lambda m: click.echo(f"localspec: {m}", err=True)  # noqa: E731
    binary = built_rpc_server() or rpc_server_binary(log=say)
    n_threads = constants.default_threads() if threads is None else threads
    say(line)
    cmd = [str(binary), "-H", host, "-p", str(port), "-t", str(n_threads), *(["-c"] if cache else [])]

    def ready() -> None:
        say(f"serving; use it with {connect_line(host, port)} (run, bench, serve, ui); Ctrl-C stops it")

    rc = run_server(cmd, Endpoint("127.0.0.1" if host == "0.0.0.0" else host, port), on_ready=ready)
    raise RpcError(
        f"rpc-server on {host}:{port} stopped on its own (exit status {rc})", hint="see what it printed above"
    )


def run_server(cmd: list[str], endpoint: Endpoint, *, on_ready: Callable[[], None] | None = None) -> int:
    """Run the rpc-server ``cmd`` until it exits, and return its exit status; ``on_ready()`` once it answers
    the RPC handshake at ``endpoint``. A Ctrl-C or a SIGTERM sent to this process stops it too, and so does
    this process's death (never an orphaned server left listening).

    Raises:
        RpcError: the server exited, or did not answer within
            :data:`~localspec.llama.rpc.SERVER_READY_TIMEOUT_S`, before it served.
    """
    from localspec.llama.processes import die_with_this_process, stop, stop_on_sigterm

    proc = subprocess.Popen(cmd, **die_with_this_process())
    try:
        with stop_on_sigterm():
            wait_serving(proc, endpoint)
            if on_ready is not None:
                on_ready()
            return proc.wait()
    finally:
        stop(proc)


COMMANDS = [rpc_server]
