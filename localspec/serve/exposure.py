"""Who may reach a server localspec starts: the one rule, for the web UI and the HTTP API alike.

Loopback (127.0.0.0/8, ::1, ``localhost``) is the default and needs nothing. Any other address, and a
Gradio share link, reaches other machines: it is refused unless the user gives credentials (a password
or an API key) or says ``--insecure-no-auth`` explicitly. Whatever is allowed, :func:`check_exposure`
returns the line to print at start so the user sees how the server is exposed.
"""

from __future__ import annotations

import ipaddress

from localspec.errors import LocalspecError


class ExposureError(LocalspecError, ValueError):
    """A server would be reachable from other machines without credentials."""


def is_loopback(host: str) -> bool:
    """True for addresses only this machine can reach. Host names other than ``localhost`` count as
    not loopback: what they resolve to can change, so they are treated as exposed."""
    name = host.strip().strip("[]").lower()
    if name in ("localhost", "localhost.localdomain", "ip6-localhost"):
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def check_exposure(
    host: str,
    *,
    what: str,
    has_auth: bool,
    insecure_no_auth: bool = False,
    public_link: bool = False,
    auth_flag: str = "--auth USER:PASSWORD",
) -> str:
    """Refuse an exposed server without credentials; return the one line to print at start.

    ``what`` names the server ("the web UI", "the HTTP API"), ``has_auth`` says credentials were given,
    ``public_link`` is a tunnel such as Gradio's share link, ``auth_flag`` the option that gives
    credentials for this server (named in the error's hint).
    """
    exposed = public_link or not is_loopback(host)
    where = "a public share link" if public_link else f"{host}"
    if not exposed:
        return f"{what} listens on {host}: only this machine can reach it."
    if has_auth:
        return f"{what} is reachable from other machines ({where}); credentials are required."
    if insecure_no_auth:
        return (
            f"WARNING: {what} is reachable from other machines ({where}) with NO authentication "
            "(--insecure-no-auth): anyone who can reach it can run the models and read what they write."
        )
    raise ExposureError(
        f"refusing to expose {what} on {where} without credentials: anyone who could reach it could run "
        "your models",
        hint=f"keep the default 127.0.0.1, or give {auth_flag}, or pass --insecure-no-auth if this network "
        "is trusted",
    )


def check_rpc_exposure(host: str, port: int, *, insecure_expose: bool = False) -> str:
    """The rule for llama.cpp's rpc-server, which has no credentials to give: loopback by default; any other
    address only with ``insecure_expose`` (``--insecure-expose``), and then a warning saying what it means.

    Args:
        host: the address it would listen on.
        port: its port (named in the warning and the tunnel hint).
        insecure_expose: the user's explicit opt-in to an address other machines reach.

    Returns:
        The one line to print at start.

    Raises:
        ExposureError: a non-loopback ``host`` without ``insecure_expose``.
    """
    if is_loopback(host):
        return f"the RPC server listens on {host}:{port}: only this machine can reach it."
    if insecure_expose:
        return (
            f"WARNING: the RPC server listens on {host}:{port} (--insecure-expose). llama.cpp's RPC has NO "
            "authentication and no encryption: anyone who can reach this port can run computations on "
            "this machine and read or change the model weights it holds. Use it only on a network you "
            "trust, and stop it when done."
        )
    raise ExposureError(
        f"refusing to expose llama.cpp's RPC server on {host}: it has no authentication at all, so anyone "
        "who could reach the port could use this machine",
        hint=f"keep the default 127.0.0.1 and reach it through an SSH tunnel (on the main machine: ssh -N -L "
        f"{port}:127.0.0.1:{port} THIS-HOST, then --rpc 127.0.0.1:{port}), or pass --insecure-expose on a "
        "network you trust",
    )
