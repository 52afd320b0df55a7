"""Helpers for the UI's browser test: find Chromium, start ``localspec ui`` on a free port, drive it.

Debian's ``chromium`` package is driven through Playwright's Python API with ``executable_path`` (Playwright's
own browser download is never used). Missing Chromium or Playwright skips locally and fails when ``CI=true``.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def _missing(what: str) -> None:
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"{what} is missing, and CI=true needs the browser test to run (.ci/run installs it)")
    pytest.skip(f"{what} is missing (apt-get install chromium; pip install playwright)")


def chromium_path() -> str:
    """The system Chromium (``LOCALSPEC_CHROMIUM`` overrides), or skip/fail."""
    for candidate in (
        os.environ.get("LOCALSPEC_CHROMIUM"),
        "/usr/bin/chromium",
        shutil.which("chromium"),
        shutil.which("chromium-browser"),
    ):
        if candidate and Path(candidate).is_file():
            return candidate
    _missing("Chromium")
    raise AssertionError("unreachable")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def ui_server(env_extra: dict[str, str], log_path: Path, timeout: float = 300.0) -> Iterator[str]:
    """Run ``python -m localspec ui --port N`` and yield its URL once it answers; stop it afterwards."""
    port = free_port()
    env = {**os.environ, "GRADIO_ANALYTICS_ENABLED": "False", "HF_HUB_OFFLINE": "1", **env_extra}
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "localspec", "ui", "--port", str(port), "--no-browser"],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
        )
        url = f"http://127.0.0.1:{port}/"
        try:
            deadline = time.monotonic() + timeout
            while True:
                if proc.poll() is not None:
                    raise AssertionError(
                        f"`localspec ui` exited with {proc.returncode}:\n{log_path.read_text()}"
                    )
                try:
                    with urllib.request.urlopen(url, timeout=2) as r:
                        if r.status == 200:
                            break
                except OSError:
                    pass
                if time.monotonic() > deadline:
                    raise AssertionError(
                        f"`localspec ui` did not answer in {timeout:.0f}s:\n{log_path.read_text()}"
                    )
                time.sleep(0.3)
            yield url
        finally:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


#: How long a page may show no change at all while a test waits for it: the slowest legitimate step between
#: two changes (a model's load, a first run that measures this machine's costs) on a busy 2-core machine.
STALL_SECONDS = 180.0
#: The same for one Playwright wait on a step that shows no progress of its own (a page's load, a pair's
#: load), in ms: never shorter than the slowest legitimate step.
STEP_MS = int(STALL_SECONDS * 1000)
#: What shows progress: the page's text (a run's streamed output and stats, a bench's progress bar).
_PROGRESS = "() => document.body.innerText"


def wait_on_page(page, condition: str, *, arg=None, what: str = "", stall: float = STALL_SECONDS) -> None:
    """Wait until the JavaScript ``condition`` (called with ``arg``) holds on ``page``, for as long as the
    page keeps changing: a run streaming a thousand tokens on a busy machine takes minutes, and a deadline
    short of that failed tests that were only slow. Fails when nothing on the page changed for ``stall`` s."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    seen, since = page.evaluate(_PROGRESS), time.monotonic()
    while True:
        try:
            page.wait_for_function(condition, arg=arg, timeout=5_000)
            return
        except PlaywrightTimeout:
            now = page.evaluate(_PROGRESS)
            if now != seen:
                seen, since = now, time.monotonic()
            elif time.monotonic() - since > stall:
                said = f"the page did not change for {stall:.0f} s waiting for {what or condition}"
                raise AssertionError(said) from None


@contextmanager
def browser_page(width: int = 1280, height: int = 1000):
    """A fresh headless Chromium page; records every request that leaves 127.0.0.1 in ``page.external``."""
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _missing("Playwright")
    path = chromium_path()
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=path, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": width, "height": height})
            external: list[str] = []
            page.on(
                "request",
                lambda r: (
                    external.append(r.url)
                    if not r.url.startswith(("http://127.0.0.1", "data:", "blob:"))
                    else None
                ),
            )
            page.external = external  # type: ignore[attr-defined]
            yield page
        finally:
            browser.close()
