"""``localspec ui --window``: the same page in a native desktop window, through pywebview.

pywebview is the optional extra ``desktop`` (``pip install "localspec[desktop]"``, in a clone
``pip install -e ".[desktop]"``); it draws with the system's own web view where it has one: Edge WebView2 on
Windows, WebKit (Cocoa) on macOS, GTK or Qt on Linux (the extra brings Qt, the route that installs from
PyPI alone). The web server runs in a thread as for ``localspec ui``; the window shows its page, and closing
the window stops the server and ends the command.

Everything that can go wrong before a window exists is said in one line, without a traceback: pywebview not
installed, no display (a server, an SSH session), an X display or a Wayland compositor that does not answer
(Qt aborts the process when it cannot connect to the one it picks). The checks are plain functions so they
are tested without a display.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import importlib.util
import os
import socket
import sys
from collections.abc import Callable, Mapping
from types import ModuleType
from typing import Any

import click

from localspec import constants

TITLE = "localspec"
SIZE = (1280, 900)
INSTALL_HINT = (
    'the desktop window needs pywebview, the "desktop" extra: pip install "localspec[desktop]" '
    '(in a clone: pip install -e ".[desktop]"); or run `localspec ui` and use a browser'
)


def import_webview() -> ModuleType:
    """pywebview, or a one-line error saying how to install it (exit status 1, no traceback)."""
    try:
        import webview
    except ImportError as exc:
        raise click.ClickException(INSTALL_HINT) from exc
    return webview


def _x_display_answers(name: str) -> bool:
    """Whether the X server ``name`` accepts a connection (False when libX11 is missing: Qt needs it too)."""
    path = ctypes.util.find_library("X11")
    if path is None:
        return False
    x11 = ctypes.CDLL(path)
    x11.XOpenDisplay.restype = ctypes.c_void_p
    x11.XOpenDisplay.argtypes = [ctypes.c_char_p]
    x11.XCloseDisplay.argtypes = [ctypes.c_void_p]
    display = x11.XOpenDisplay(name.encode())
    if not display:
        return False
    x11.XCloseDisplay(display)
    return True


def wayland_socket(env: Mapping[str, str]) -> str:
    """The socket of the Wayland compositor ``WAYLAND_DISPLAY`` names: the name itself when it is a path,
    else the name in ``XDG_RUNTIME_DIR`` (as libwayland-client finds it)."""
    name = env.get("WAYLAND_DISPLAY", "")
    if os.path.isabs(name):
        return name
    return os.path.join(env.get("XDG_RUNTIME_DIR", ""), name)


def _wayland_answers(env: Mapping[str, str]) -> bool:
    """Whether a Wayland compositor accepts a connection on :func:`wayland_socket` (within a second)."""
    path = wayland_socket(env)
    if not hasattr(socket, "AF_UNIX") or not os.path.isabs(path):  # no XDG_RUNTIME_DIR: nowhere to look
        return False
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(1.0)
        try:
            s.connect(path)
        except OSError:
            return False
    return True


def display_problem(
    env: Mapping[str, str] | None = None,
    platform: str | None = None,
    answers: Callable[[str], bool] = _x_display_answers,
    wayland_answers: Callable[[Mapping[str, str]], bool] = _wayland_answers,
) -> str | None:
    """Why no window can open here, in one line; None when one can (Windows and macOS always have a
    desktop when a user runs this; on Linux it needs a Wayland compositor or an X display that answers).

    Args:
        env: the environment (default: this process's).
        platform: ``sys.platform`` (default: this one).
        answers: whether the X display of that name accepts a connection.
        wayland_answers: whether the Wayland compositor ``env`` names accepts a connection.

    Returns:
        The problem and what to do, or None.
    """
    env = os.environ if env is None else env
    platform = sys.platform if platform is None else platform
    if not platform.startswith("linux"):
        return None
    wayland = env.get("WAYLAND_DISPLAY")
    if wayland and wayland_answers(env):
        return None
    x_display = env.get("DISPLAY")
    if not x_display:
        if wayland:
            return (
                f"no Wayland compositor answers at {wayland_socket(env)} (WAYLAND_DISPLAY={wayland!r}) and "
                "DISPLAY is not set; run `localspec ui` without --window and open the page in a browser"
            )
        return (
            "no display to open a window on (neither DISPLAY nor WAYLAND_DISPLAY is set: a server or an SSH "
            "session?); run `localspec ui` without --window and open the page in a browser"
        )
    if not answers(x_display):
        return (
            f"cannot open the X display {x_display!r} (no X server answers there, or it refuses this user); "
            "run `localspec ui` without --window and open the page in a browser"
        )
    return None


def linux_gui(has_module: Callable[[str], bool] | None = None) -> str | None:
    """The toolkit to ask pywebview for on Linux: GTK when its Python bindings are there (pywebview's own
    first choice), else Qt (what the extra installs). Naming it keeps pywebview from logging the failed
    GTK import as a traceback before it falls back."""
    has = has_module or (lambda name: importlib.util.find_spec(name) is not None)
    if has("gi"):
        return None
    return "qt"


def qt_library_problem(find_library: Callable[[str], str | None] = ctypes.util.find_library) -> str | None:
    """Qt 6.5+ draws on X11 only with libxcb-cursor; without it Qt aborts with a page of advice. One line."""
    if find_library("xcb-cursor") is None:
        return (
            "Qt needs the system library libxcb-cursor to open a window on X11: install it "
            "(Debian/Ubuntu: apt-get install libxcb-cursor0; Fedora: dnf install xcb-util-cursor)"
        )
    return None


def check_window_possible(env: Mapping[str, str] | None = None, platform: str | None = None) -> ModuleType:
    """Before the server starts: pywebview importable and a display to draw on, else a one-line error."""
    problem = display_problem(env, platform)
    if problem:
        raise click.ClickException(problem)
    webview = import_webview()
    own_env = env is None
    env = os.environ if env is None else env
    platform = sys.platform if platform is None else platform
    if not platform.startswith("linux") or (env.get("WAYLAND_DISPLAY") and _wayland_answers(env)):
        return webview
    if own_env and env.get("WAYLAND_DISPLAY"):  # a compositor that does not answer: draw on X instead
        os.environ.setdefault("QT_QPA_PLATFORM", "xcb")
        os.environ.setdefault("GDK_BACKEND", "x11")
    if linux_gui() == "qt":
        problem = qt_library_problem()
        if problem:
            raise click.ClickException(problem)
    return webview


def open_window(webview: Any, url: str, *, on_closed: Callable[[], None] | None = None) -> None:
    """Show ``url`` in a native window and return when the user closes it (pywebview runs the GUI loop
    on this, the main, thread)."""
    if sys.platform.startswith("linux") and hasattr(os, "geteuid") and os.geteuid() == 0:
        # Qt's Chromium refuses to start as root unless its sandbox is off (containers, CI)
        os.environ.setdefault("QTWEBENGINE_DISABLE_SANDBOX", "1")
    if not constants.verbose():  # Qt's Chromium logs its GPU and D-Bus probing; LOCALSPEC_VERBOSE shows it
        os.environ.setdefault("QTWEBENGINE_CHROMIUM_FLAGS", "--log-level=3")
        os.environ.setdefault("QT_LOGGING_RULES", "*.debug=false;qt.*=false")
    webview.create_window(TITLE, url, width=SIZE[0], height=SIZE[1], min_size=(640, 480))
    try:
        webview.start(gui=linux_gui() if sys.platform.startswith("linux") else None)
    except Exception as exc:  # no usable GUI toolkit: pywebview says which it tried
        raise click.ClickException(f"could not open a window: {exc}") from exc
    finally:
        if on_closed is not None:
            on_closed()
