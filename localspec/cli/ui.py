"""``localspec ui``: the web page, on localhost unless the user says otherwise (with credentials).

Who may reach it follows the one rule in ``localspec.serve.exposure``; the decisions here (which port, open a
browser or not, what ``--auth`` means) are pure functions so they are tested without starting a server.
"""

from __future__ import annotations

import errno
import os
import signal
import socket
import sys
from collections.abc import Mapping

import click

from localspec.cli.options import shared_options
from localspec.cli.window import check_window_possible, open_window
from localspec.llama.processes import stop_on_sigterm
from localspec.serve.exposure import check_exposure

DEFAULT_PORT = 7860
PORT_TRIES = 100  # 7860..7959 when no --port is given
AUTH_ENV = "LOCALSPEC_UI_AUTH"


def port_is_free(host: str, port: int) -> bool:
    """True when a server could listen on ``host:port`` now (as uvicorn binds: with SO_REUSEADDR)."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror:
        return True  # the name does not resolve: let the server report it
    family, kind, proto, _, addr = infos[0]
    with socket.socket(family, kind, proto) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(addr)
        except OSError as exc:
            if exc.errno in (errno.EADDRINUSE, errno.EACCES):
                return False
            raise
    return True


def choose_port(
    host: str, requested: int | None, *, first: int | None = None, tries: int = PORT_TRIES
) -> int:
    """The port to serve on: ``requested`` if given (an error if busy), else the first free one from
    ``first`` (default :data:`DEFAULT_PORT`) on."""
    first = DEFAULT_PORT if first is None else first
    if requested is not None:
        if not port_is_free(host, requested):
            raise click.UsageError(
                f"port {requested} on {host} is already in use (another localspec ui, or another server). "
                f"Omit --port to take the next free one from {first}, or choose another with --port N."
            )
        return requested
    for port in range(first, min(first + tries, 65536)):
        if port_is_free(host, port):
            return port
    raise click.UsageError(
        f"no free port from {first} to {first + tries - 1} on {host}; choose one with --port N"
    )


def should_open_browser(
    no_browser: bool, env: Mapping[str, str] | None = None, platform: str | None = None
) -> tuple[bool, str]:
    """Whether to open the default browser on the page, and why not: never with ``--no-browser``, over
    SSH (the browser would open on the far machine, if at all), or on Linux without a display."""
    env = os.environ if env is None else env
    platform = sys.platform if platform is None else platform
    if no_browser:
        return False, "--no-browser"
    if env.get("SSH_CONNECTION") or env.get("SSH_TTY"):
        return False, "over SSH"
    if platform.startswith("linux") and not (env.get("DISPLAY") or env.get("WAYLAND_DISPLAY")):
        return False, "no display"
    return True, ""


def parse_auth(text: str | None) -> tuple[str, str] | None:
    """``USER:PASSWORD`` (the password may contain ``:``) -> (user, password); None when not given."""
    if text is None:
        return None
    user, sep, password = text.partition(":")
    if not sep or not user or not password:
        raise click.BadParameter(
            "expected USER:PASSWORD, both non-empty (e.g. --auth alice:correct-horse)",
            param_hint=f"--auth / {AUTH_ENV}",
        )
    return user, password


@click.command("ui")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option(
    "--port",
    default=None,
    type=click.IntRange(1, 65535),
    help=f"Port (default: {DEFAULT_PORT}, or the next free one if it is busy).",
)
@click.option("--share", is_flag=True, help="Also open a public Gradio share link (needs --auth).")
@click.option(
    "--auth",
    metavar="USER:PASSWORD",
    envvar=AUTH_ENV,
    help=f"Ask for this login; needed for a non-local --host or --share. Also read from ${AUTH_ENV} "
    "(keeps the password out of shell history).",
)
@click.option(
    "--insecure-no-auth",
    is_flag=True,
    help="Allow a non-local --host or --share WITHOUT a login (only on a network you trust).",
)
@click.option("--no-browser", is_flag=True, help="Do not open the page in the default browser.")
@click.option(
    "--window",
    is_flag=True,
    help="Show the page in a native desktop window instead of a browser; closing it stops the server "
    '(needs the "desktop" extra: pip install "localspec[desktop]").',
)
@click.option(
    "--preset",
    "-p",
    help="The preset the page opens on (default: the one last downloaded or run, else the embedded pair).",
)
@shared_options("threads", "rpc", "no_store")
def ui(
    host: str,
    port: int | None,
    share: bool,
    auth: str | None,
    insecure_no_auth: bool,
    no_browser: bool,
    window: bool,
    preset: str | None,
    threads: int | None,
    rpc: str | None,
    no_store: bool,
) -> None:
    """Open the web UI: pick a pair, watch the draft's tokens, compare speed and memory, bench.

    It opens on --preset, else on the preset last downloaded or run, else on the embedded pair. Ctrl-C or
    SIGTERM stops it (exit status 0).
    """
    credentials = parse_auth(auth)
    if preset is not None:
        from localspec.hub.presets import get_preset

        get_preset(preset)  # an unknown name: the error names the close ones, before anything starts
    if no_store:  # every pair the page loads, as LOCALSPEC_NO_STORE=1 would (read by the suffix cache)
        os.environ["LOCALSPEC_NO_STORE"] = "1"
    exposure = check_exposure(
        host,
        what="the web UI",
        has_auth=credentials is not None,
        insecure_no_auth=insecure_no_auth,
        public_link=share,
    )
    webview = check_window_possible() if window else None  # before anything starts: one line if not
    port = choose_port(host, port)
    open_browser, why_not = should_open_browser(no_browser or window)
    from localspec.ui.app import launch

    url_host = f"[{host}]" if ":" in host else host
    url = f"http://{url_host}:{port}"
    click.echo(exposure)
    if webview is not None:
        click.echo(f"localspec UI on {url}, in a window (close it to stop)")
        launch(
            host=host,
            port=port,
            share=share,
            auth=credentials,
            block=False,
            n_threads=threads,
            rpc=rpc,
            preset=preset,
        )
        open_window(webview, _local_url(host, port), on_closed=_stop_servers)
        click.echo("window closed: server stopped")
        return
    click.echo(f"localspec UI on {url}  (Ctrl+C to stop)")
    if not open_browser:
        click.echo(f"(not opening a browser: {why_not})")
    # SIGTERM stops the page as Ctrl-C does, with exit status 0 (as serve): Gradio installs no handler of its
    # own with ssr_mode=False, so the process died of the signal (status 143)
    with stop_on_sigterm():
        try:
            launch(
                host=host,
                port=port,
                share=share,
                auth=credentials,
                open_browser=open_browser,
                n_threads=threads,
                rpc=rpc,
                preset=preset,
            )
        except KeyboardInterrupt:  # stopped before Gradio's own loop took the signal: the same stop
            _stop_servers()
        # Stopped: one more signal while the process ends would turn a clean exit into a death by signal.
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, signal.SIG_IGN)
    click.echo("localspec ui stopped.")


def _local_url(host: str, port: int) -> str:
    """The address the window opens: the server's own, or loopback when it listens on every address."""
    if host in ("0.0.0.0", "::", ""):
        host = "127.0.0.1"
    return f"http://{f'[{host}]' if ':' in host else host}:{port}/"


def _stop_servers() -> None:
    import gradio

    gradio.close_all()


COMMANDS = [ui]
