"""``localspec ui`` before it serves anything: who may reach it (the exposure rule, --auth), which port it
takes, and whether it opens a browser. The server itself is never started here (``launch`` is replaced)."""

from __future__ import annotations

import socket

import click
import pytest
from click.testing import CliRunner

from localspec.cli import main
from localspec.cli import ui as cli_ui


@pytest.fixture
def launched(monkeypatch):
    """Replaces the Gradio launch; records its keyword arguments."""
    calls: list[dict] = []
    import localspec.ui.app as app

    monkeypatch.setattr(app, "launch", lambda **kw: calls.append(kw))
    monkeypatch.delenv(cli_ui.AUTH_ENV, raising=False)
    return calls


def _invoke(args, env=None):
    return CliRunner().invoke(main, ["ui", *args], env=env)


@pytest.mark.parametrize("args", [["--host", "0.0.0.0"], ["--host", "192.168.1.20"], ["--share"]])
def test_exposed_ui_without_credentials_is_refused_with_a_hint(launched, args):
    res = _invoke(args)
    assert res.exit_code == 1 and not launched
    assert "refusing to expose the web UI" in res.output and "--auth USER:PASSWORD" in res.output
    assert "--insecure-no-auth" in res.output and "Traceback" not in res.output
    assert isinstance(res.exception, SystemExit)  # a clean exit, not an exception


def test_exposed_ui_with_auth_from_flag_or_environment_passes_it_to_gradio(launched):
    res = _invoke(["--host", "0.0.0.0", "--auth", "alice:pa:ss", "--no-browser", "--port", _free()])
    assert res.exit_code == 0, res.output
    assert "credentials are required" in res.output
    assert launched[-1]["auth"] == ("alice", "pa:ss") and launched[-1]["host"] == "0.0.0.0"

    res = _invoke(["--share", "--no-browser"], env={cli_ui.AUTH_ENV: "bob:secret"})
    assert res.exit_code == 0, res.output
    assert launched[-1]["auth"] == ("bob", "secret") and launched[-1]["share"] is True


def test_insecure_no_auth_is_allowed_and_says_so(launched):
    res = _invoke(["--host", "0.0.0.0", "--insecure-no-auth", "--no-browser"])
    assert res.exit_code == 0, res.output
    assert "WARNING" in res.output and "NO authentication" in res.output
    assert launched[-1]["auth"] is None


def test_loopback_needs_nothing_and_says_who_can_reach_it(launched):
    res = _invoke(["--no-browser"])
    assert res.exit_code == 0, res.output
    assert "only this machine can reach it" in res.output
    assert f"http://127.0.0.1:{launched[-1]['port']}" in res.output and launched[-1]["open_browser"] is False


@pytest.mark.parametrize("value", ["alice", ":pw", "alice:", ""])
def test_malformed_auth_is_a_usage_error(launched, value):
    res = _invoke(["--auth", value])
    assert res.exit_code == 2 and "USER:PASSWORD" in res.output and not launched


# ------------------------------------------------------------------------------------------ the port


def _free() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return str(s.getsockname()[1])


def _listening() -> socket.socket:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()
    return s


def test_busy_default_port_moves_to_the_next_free_one_and_prints_it(launched, monkeypatch):
    with _listening() as busy:
        port = busy.getsockname()[1]
        assert not cli_ui.port_is_free("127.0.0.1", port)
        assert cli_ui.choose_port("127.0.0.1", None, first=port) > port
        monkeypatch.setattr(cli_ui, "DEFAULT_PORT", port)
        res = _invoke(["--no-browser"])
    assert res.exit_code == 0, res.output
    got = launched[-1]["port"]
    assert port < got < port + 100 and f"http://127.0.0.1:{got}" in res.output


def test_busy_explicit_port_is_an_error_with_a_hint(launched):
    with _listening() as busy:
        port = busy.getsockname()[1]
        res = _invoke(["--port", str(port), "--no-browser"])
        with pytest.raises(click.UsageError, match="already in use"):
            cli_ui.choose_port("127.0.0.1", port)
    assert res.exit_code == 2 and not launched
    assert f"port {port}" in res.output and "Omit --port" in res.output and "Traceback" not in res.output


# ------------------------------------------------------------------------------------------ the browser


@pytest.mark.parametrize(
    ("no_browser", "env", "platform", "expected"),
    [
        (False, {"DISPLAY": ":0"}, "linux", (True, "")),
        (False, {"WAYLAND_DISPLAY": "wayland-0"}, "linux", (True, "")),
        (False, {}, "linux", (False, "no display")),
        (False, {}, "darwin", (True, "")),
        (False, {}, "win32", (True, "")),
        (True, {"DISPLAY": ":0"}, "linux", (False, "--no-browser")),
        (False, {"DISPLAY": ":0", "SSH_CONNECTION": "1.2.3.4 5 6.7.8.9 22"}, "linux", (False, "over SSH")),
        (False, {"SSH_TTY": "/dev/pts/0"}, "darwin", (False, "over SSH")),
    ],
)
def test_browser_opens_only_with_a_local_display(no_browser, env, platform, expected):
    assert cli_ui.should_open_browser(no_browser, env, platform) == expected


def test_ui_opens_the_browser_when_there_is_a_display(launched, monkeypatch):
    monkeypatch.setattr(cli_ui.sys, "platform", "linux")
    for name in ("SSH_CONNECTION", "SSH_TTY", "WAYLAND_DISPLAY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("DISPLAY", ":0")
    res = _invoke(["--port", _free()])
    assert res.exit_code == 0 and launched[-1]["open_browser"] is True
    monkeypatch.delenv("DISPLAY")
    res = _invoke(["--port", _free()])
    assert launched[-1]["open_browser"] is False and "no display" in res.output


def test_threads_reach_every_pair_the_page_loads(launched):
    """A busy 2-core machine ran the page at a few tokens/s with the default threads, and the page had no
    setting for it (a UI walkthrough): `localspec ui --threads N`, bounded as `run` bounds it."""
    res = _invoke(["--no-browser", "--port", _free(), "--threads", "1"])
    assert res.exit_code == 0, res.output
    assert launched[-1]["n_threads"] == 1
    res = _invoke(["--no-browser", "--threads", "0"])
    assert res.exit_code == 2 and "--threads" in res.output
    from localspec.ui.app import App

    app = App(lambda **kw: None, n_threads=1)
    app.build()
    v = {app.c[k]: None for k in app.c}
    v[app.c["source"]], v[app.c["preset"]], v[app.c["n_ctx"]] = "Preset", "tiny-embedded", 0
    assert app.spec(v).load_kwargs()["n_threads"] == 1


def test_ui_takes_rpc_servers_as_run_does(launched):
    """`localspec rpc-server` tells users to pass --rpc to ui: it fills the page's RPC servers box."""
    res = _invoke(["--no-browser", "--rpc", "10.0.0.2:50052, 10.0.0.3:50052"])
    assert res.exit_code == 0, res.output
    assert launched[-1]["rpc"] == "10.0.0.2:50052,10.0.0.3:50052"
    for bad in ("10.0.0..2:50052", "h:\u00b2", "nohost"):
        res = _invoke(["--no-browser", "--rpc", bad])
        assert res.exit_code == 2 and "--rpc" in res.output and "Traceback" not in res.output


def test_no_store_keeps_the_suffix_cache_of_every_pair_the_page_loads_in_memory(launched, monkeypatch):
    from localspec import constants

    monkeypatch.setenv("LOCALSPEC_NO_STORE", "")  # off, and put back as it was after the test
    res = _invoke(["--no-browser", "--port", _free()])
    assert res.exit_code == 0 and not constants.no_store(), res.output
    res = _invoke(["--no-store", "--no-browser", "--port", _free()])
    assert res.exit_code == 0, res.output
    assert constants.no_store()  # what the suffix cache of every load reads (suffix/cache.py)


def test_the_page_opens_on_the_preset_asked_for_else_the_last_one_downloaded_or_run(launched, monkeypatch):
    """After `localspec download qwen2.5-coder-1.5b` the page opened on the toy pair, and `ui` took no
    --preset: it opens on --preset, else on the preset last downloaded or run, else on the embedded pair."""
    from localspec.ui.app import App, opening_preset

    from localspec.hub.recent import last_preset_path, remember_preset

    names = ["tiny-embedded", "qwen2.5-coder-1.5b", "llama-3.2-3b"]
    last_preset_path().unlink(missing_ok=True)
    assert opening_preset(names, None) == "tiny-embedded"
    remember_preset("qwen2.5-coder-1.5b")
    assert opening_preset(names, None) == "qwen2.5-coder-1.5b"
    assert opening_preset(names, "llama-3.2-3b") == "llama-3.2-3b"
    remember_preset("a-preset-deleted-since")
    assert opening_preset(names, None) == "tiny-embedded"  # a name that is gone: the embedded pair
    last_preset_path().unlink()

    res = _invoke(["--no-browser", "--port", _free(), "--preset", "qwen2.5-coder-1.5b"])
    assert res.exit_code == 0, res.output
    assert launched[-1]["preset"] == "qwen2.5-coder-1.5b"
    res = _invoke(["--no-browser", "--preset", "qwen2.5-coder-1.5"])
    assert res.exit_code == 1 and "did you mean" in res.output and not launched[1:]
    app = App(lambda **kw: None, preset="qwen2.5-coder-1.5b")
    demo = app.build()
    assert demo is not None and app.c["preset"].value == "qwen2.5-coder-1.5b"


def test_download_and_run_remember_the_preset(monkeypatch):
    """The preset named to `run` (or `serve`) is what `ui` opens on next."""
    from localspec.cli import options
    from localspec.hub.recent import last_preset, last_preset_path

    last_preset_path().unlink(missing_ok=True)

    class Loaded:
        notify = None

    monkeypatch.setattr("localspec.load", lambda **kw: Loaded())
    opts = dict.fromkeys(
        ["target", "draft", "n_ctx", "threads", "draft_threads", "strategy", "n_max", "n_min", "p_min"]
    )
    opts |= {"preset": "tiny-embedded", "adaptive": False, "corpus": None, "no_store": True}
    opts |= {"gpu_layers": None, "draft_gpu_layers": None}
    options.load_pipeline(**opts)
    assert last_preset() == "tiny-embedded"
    last_preset_path().unlink()


def test_sigterm_stops_the_ui_with_status_0(tmp_path):
    """`serve` exits 0 on SIGTERM; `ui` died of it (status 143): Gradio's own handler is off with
    ssr_mode=False."""
    import os
    import signal
    import subprocess
    import sys
    import time
    import urllib.request

    port = _free()
    env = {**os.environ, "GRADIO_ANALYTICS_ENABLED": "False", "HF_HUB_OFFLINE": "1"}
    env |= {"LOCALSPEC_HOME": str(tmp_path / "cache"), "LOCALSPEC_CONFIG": str(tmp_path / "config")}
    cmd = [sys.executable, "-m", "localspec", "ui", "--no-browser", "--port", port]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 300  # importing Gradio on a busy 2-core machine takes a while
        while True:
            assert proc.poll() is None, proc.communicate()[0]
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=5) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            assert time.monotonic() < deadline, "the page never answered"
            time.sleep(0.3)
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, out
    assert "localspec ui stopped." in out and "Traceback" not in out
