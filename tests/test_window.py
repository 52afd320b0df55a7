"""``localspec ui --window``: one line, never a traceback, when no window can open; and under Xvfb a real
native window (pywebview + Qt) showing the page, which stops the server when it is closed.

The real-window test needs Xvfb (Debian ``xvfb``), the ``desktop`` extra (pywebview with Qt, in the ``test``
extra) and python-xlib (to find and close the window as a window manager would). Where one is missing it is
skipped on a developer's machine but fails under CI (``CI`` set): ``.ci/run`` installs all of them, so a skip
there would hide a broken install. It saves ``tests/artifacts/window.png``.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from localspec.cli import main, window
from localspec.cli import ui as cli_ui

ARTIFACTS = Path(__file__).resolve().parent / "artifacts"


@pytest.fixture
def launched(monkeypatch):
    calls: list[dict] = []
    import localspec.ui.app as app

    monkeypatch.setattr(app, "launch", lambda **kw: calls.append(kw))
    monkeypatch.delenv(cli_ui.AUTH_ENV, raising=False)
    return calls


def _one_clean_line(res) -> str:
    assert res.exit_code == 1, res.output
    assert "Traceback" not in res.output and isinstance(res.exception, SystemExit)
    lines = [line for line in res.output.splitlines() if line.strip()]
    assert len(lines) == 1, res.output
    return lines[0]


def test_without_a_display_it_says_so_in_one_line(launched, monkeypatch):
    monkeypatch.setattr(sys, "platform", "linux")
    env = {"DISPLAY": "", "WAYLAND_DISPLAY": ""}
    line = _one_clean_line(CliRunner().invoke(main, ["ui", "--window"], env=env))
    assert line.startswith("Error: no display to open a window on") and "without --window" in line
    assert not launched  # nothing started


def test_a_display_that_does_not_answer_is_one_line():
    problem = window.display_problem({"DISPLAY": ":987"}, "linux", answers=lambda name: False)
    assert problem and "cannot open the X display ':987'" in problem and "\n" not in problem
    assert window.display_problem({"DISPLAY": ":0"}, "linux", answers=lambda name: True) is None
    wayland = {"WAYLAND_DISPLAY": "wayland-0"}
    assert window.display_problem(wayland, "linux", wayland_answers=lambda env: True) is None
    assert window.display_problem({}, "darwin") is None and window.display_problem({}, "win32") is None


def test_a_wayland_display_without_a_compositor_is_one_line(tmp_path, launched):
    """Qt aborted (SIGABRT) after the server had started: WAYLAND_DISPLAY was taken on trust."""
    env = {"WAYLAND_DISPLAY": "wayland-9", "XDG_RUNTIME_DIR": str(tmp_path), "DISPLAY": ""}
    problem = window.display_problem(env, "linux")
    assert problem and f"no Wayland compositor answers at {tmp_path / 'wayland-9'}" in problem
    assert "\n" not in problem
    # a dead compositor next to an X display that answers: the window goes to X
    assert window.display_problem({**env, "DISPLAY": ":0"}, "linux", answers=lambda name: True) is None
    with socket.socket(socket.AF_UNIX) as compositor:  # one that answers
        compositor.bind(str(tmp_path / "wayland-9"))
        compositor.listen(1)
        assert window.display_problem(env, "linux") is None
    absolute = {"WAYLAND_DISPLAY": str(tmp_path / "gone"), "DISPLAY": ""}
    assert "no Wayland compositor answers" in (window.display_problem(absolute, "linux") or "")


def test_ui_window_with_a_dead_wayland_display_starts_nothing(tmp_path, launched, monkeypatch):
    monkeypatch.setattr(sys, "platform", "linux")
    env = {"WAYLAND_DISPLAY": "wayland-9", "XDG_RUNTIME_DIR": str(tmp_path), "DISPLAY": ""}
    line = _one_clean_line(CliRunner().invoke(main, ["ui", "--window"], env=env))
    assert "no Wayland compositor answers" in line and "without --window" in line
    assert not launched


def test_without_the_extra_it_says_how_to_install_it(launched, monkeypatch):
    monkeypatch.setattr(window, "display_problem", lambda *a, **k: None)
    monkeypatch.setitem(sys.modules, "webview", None)  # import webview -> ImportError
    line = _one_clean_line(CliRunner().invoke(main, ["ui", "--window"]))
    assert 'pip install "localspec[desktop]"' in line and 'pip install -e ".[desktop]"' in line
    assert not launched


def test_toolkit_choice_and_the_missing_qt_library():
    assert window.linux_gui(lambda name: name == "gi") is None  # GTK's bindings: pywebview's own choice
    assert window.linux_gui(lambda name: False) == "qt"
    problem = window.qt_library_problem(lambda name: None)
    assert problem and "libxcb-cursor0" in problem and "\n" not in problem
    assert window.qt_library_problem(lambda name: "/usr/lib/libxcb-cursor.so.0") is None


def test_the_window_gets_the_served_page_and_closing_it_stops_the_server(launched, monkeypatch):
    class FakeWebview:
        shown: list[str] = []

        def create_window(self, title, url, **kw):
            self.shown.append(url)

        def start(self, **kw):
            pass

    stopped: list[bool] = []
    fake = FakeWebview()
    monkeypatch.setattr(cli_ui, "check_window_possible", lambda: fake)
    monkeypatch.setattr(cli_ui, "_stop_servers", lambda: stopped.append(True))
    port = _free_port()
    res = CliRunner().invoke(
        main, ["ui", "--window", "--port", str(port), "--host", "0.0.0.0", "--insecure-no-auth"]
    )
    assert res.exit_code == 0, res.output
    assert launched[-1]["block"] is False and launched[-1].get("open_browser", False) is False
    assert fake.shown == [f"http://127.0.0.1:{port}/"] and stopped == [True]
    assert "window closed: server stopped" in res.output


def test_a_toolkit_that_fails_to_start_is_one_line():
    class Broken:
        def create_window(self, *a, **k):
            pass

        def start(self, **kw):
            raise RuntimeError("You must have either QT or GTK with Python extensions installed")

    closed: list[bool] = []
    with pytest.raises(click.ClickException, match="could not open a window: You must have either QT"):
        window.open_window(Broken(), "http://127.0.0.1:1/", on_closed=lambda: closed.append(True))
    assert closed == [True]


# --- a real window under Xvfb ---------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _need(ok: bool, what: str) -> None:
    if ok:
        return
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"{what}: .ci/run installs it, so CI must have it")
    pytest.skip(what)


def _free_display() -> int:
    for n in range(90, 200):
        if not Path(f"/tmp/.X11-unix/X{n}").exists() and not Path(f"/tmp/.X{n}-lock").exists():
            return n
    raise RuntimeError("no free X display number")


def _windows_named(disp, name: str) -> list:
    found, todo = [], [disp.screen().root]
    while todo:
        w = todo.pop()
        try:
            if (w.get_wm_name() or "") == name:
                found.append(w)
            todo.extend(w.query_tree().children)
        except Exception:  # a window that went away meanwhile
            continue
    return found


def _close(disp, win) -> None:
    """What a window manager does when the user clicks the close button: WM_DELETE_WINDOW."""
    from Xlib import X, protocol

    protocols, delete = disp.intern_atom("WM_PROTOCOLS"), disp.intern_atom("WM_DELETE_WINDOW")
    event = protocol.event.ClientMessage(
        window=win, client_type=protocols, data=(32, [delete, X.CurrentTime, 0, 0, 0])
    )
    win.send_event(event, event_mask=X.NoEventMask)
    disp.flush()


def _page_up(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=2) as r:
            return r.status == 200
    except OSError:
        return False


def _orange_pixels(image) -> int:
    """Pixels of the page's primary (Run) button, Gradio's orange: a drawn page, not a blank window."""
    rgb = image.convert("RGB").resize((image.width // 4, image.height // 4))
    return sum(1 for r, g, b in rgb.get_flattened_data() if r > 230 and 95 < g < 140 and b < 60)


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Xvfb is an X server for Linux")
def test_a_real_window_under_xvfb_shows_the_page_and_closing_it_stops_the_server(tmp_path):
    _need(shutil.which("Xvfb") is not None, "Xvfb is not installed (Debian: apt-get install xvfb)")
    try:
        import webview  # noqa: F401
        from PIL import ImageGrab
        from Xlib import display as xdisplay
    except ImportError as exc:
        _need(False, f"{exc.name} is not installed (pip install -e '.[test]')")
        raise
    _need(window.qt_library_problem() is None, "libxcb-cursor0 is not installed")

    n = _free_display()
    xvfb = subprocess.Popen(
        ["Xvfb", f":{n}", "-screen", "0", "1400x1000x24", "-nolisten", "tcp"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    port = _free_port()
    log = tmp_path / "window.log"
    env = {**os.environ, "DISPLAY": f":{n}", "HOME": str(tmp_path), "XDG_CACHE_HOME": str(tmp_path / "c")}
    env.pop("WAYLAND_DISPLAY", None)
    proc = None
    try:
        deadline = time.monotonic() + 20
        while not Path(f"/tmp/.X11-unix/X{n}").exists():
            assert xvfb.poll() is None and time.monotonic() < deadline, "Xvfb did not start"
            time.sleep(0.2)
        with log.open("w") as out:
            proc = subprocess.Popen(
                [sys.executable, "-m", "localspec", "ui", "--window", "--port", str(port)],
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
                stdin=subprocess.DEVNULL,
            )
        disp = xdisplay.Display(f":{n}")
        deadline = time.monotonic() + 180
        wins: list = []
        while not (wins and _page_up(port)):
            assert proc.poll() is None, f"exited {proc.returncode}:\n{log.read_text()}"
            assert time.monotonic() < deadline, f"no window and page in 180 s:\n{log.read_text()}"
            time.sleep(1)
            wins = _windows_named(disp, window.TITLE)
        shot = None
        while time.monotonic() < deadline:  # the web view paints a moment after the window maps
            shot = ImageGrab.grab(xdisplay=f":{n}")
            if _orange_pixels(shot) > 50:
                break
            time.sleep(2)
        assert shot is not None
        ARTIFACTS.mkdir(exist_ok=True)
        shot.save(ARTIFACTS / "window.png")
        assert _orange_pixels(shot) > 50, (
            f"the window shows no page (tests/artifacts/window.png):\n{log.read_text()}"
        )

        _close(disp, wins[0])
        proc.wait(timeout=60)
        output = log.read_text()
        assert proc.returncode == 0, output
        assert "window closed: server stopped" in output and "Traceback" not in output
        assert not _page_up(port), "the server still answers after the window closed"
    finally:
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()
        xvfb.terminate()
        xvfb.wait(timeout=10)
