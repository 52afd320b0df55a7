"""The page with a big target (opt-in: the real Qwen pair, its target re-encoded at F16, 3.6 GB).

A user's own 7B+ target is several GB: the page must load it, keep answering while Compare runs it twice
(target alone, then with the draft), and show the draft's memory share next to the speedup. The F16
re-encoding is made once by llama.cpp's own llama-quantize (``localspec bench --wide-target F16``'s cache).
Run: ``LOCALSPEC_QWEN_DIR=models pytest -m qwen tests/test_ui_big_target.py``;
``LOCALSPEC_BIG_TARGET=F16.gguf``
reuses an F16 made before (the tests run with a fresh cache, where it is made again in about a minute).
"""

from __future__ import annotations

import os
import time
import urllib.request
from pathlib import Path

import pytest
from _browser import STEP_MS, browser_page, ui_server
from conftest import QWEN_DRAFT, QWEN_TARGET, qwen_dir

ARTIFACTS = Path(__file__).parent / "artifacts"

pytestmark = [pytest.mark.qwen, pytest.mark.browser]


@pytest.fixture(scope="module")
def big_pair():
    from localspec.bench.wide_target import wide_target

    folder = qwen_dir()
    assert folder is not None  # the qwen marker skips the module otherwise
    made = os.environ.get("LOCALSPEC_BIG_TARGET")  # an F16 made before (the tests' cache is a fresh one)
    target = Path(made) if made else wide_target(folder / QWEN_TARGET, "F16")
    return target, folder / QWEN_DRAFT


def _value(page, elem_id: str) -> float:
    raw = page.get_attribute(f"#{elem_id}", "data-value")
    assert raw not in (None, ""), f"#{elem_id} has no value"
    return float(raw)


def test_a_big_target_loads_compare_stays_responsive_and_shows_memory_next_to_speed(big_pair, tmp_path):
    target, draft = big_pair
    assert target.stat().st_size > 3_000_000_000  # the F16 re-encoding of the 1.5B target
    env = {"LOCALSPEC_CONFIG": str(tmp_path / "config"), "LOCALSPEC_MODELS": str(tmp_path)}
    with browser_page() as page, ui_server(env, tmp_path / "server.log") as url:
        page.goto(url)
        page.wait_for_selector("#ls-run", timeout=STEP_MS)
        page.click("#ls-source label:has-text('My models')")
        page.fill("#ls-target input", str(target))
        page.keyboard.press("Enter")
        # the target's draft candidates come back (a verdict per model next to it, or none): then the draft
        page.wait_for_function(
            "() => document.querySelector('#ls-candidates').innerText.trim().length > 0", timeout=STEP_MS
        )
        page.wait_for_timeout(1000)
        page.fill("#ls-draft input", str(draft))
        page.keyboard.press("Enter")
        page.wait_for_timeout(500)
        shown = page.input_value("#ls-draft input")  # a path among the candidates shows as its label
        assert shown == str(draft) or "0.5B" in shown, shown
        page.fill("#ls-prompt textarea", "Explain how a hash map works and when its operations are slow.")
        page.click("#ls-compare")

        # While the pair loads and Compare runs: the page reacts and the server answers at once.
        page.wait_for_function(  # Compare's progress names the files being loaded and their sizes
            "() => document.body.innerText.includes('loading the pair (target')", timeout=STEP_MS
        )
        waits = []
        for _ in range(3):
            t0 = time.monotonic()
            with urllib.request.urlopen(url + "config", timeout=10) as r:
                assert r.status == 200
            waits.append(time.monotonic() - t0)
            t0 = time.monotonic()
            page.click("#ls-settings .label-wrap")  # open/close an accordion: handled in the page
            page.wait_for_timeout(50)
            waits.append(time.monotonic() - t0)
            page.wait_for_timeout(1000)
        assert max(waits) < 2.0, waits

        page.wait_for_selector('#ls-speedup:not([data-value=""])', timeout=300_000)
        assert page.locator("#ls-error-box .ls-err").count() == 0
        base, spec = _value(page, "ls-base-tps"), _value(page, "ls-spec-tps")
        assert _value(page, "ls-speedup") == pytest.approx(spec / base, rel=0.05)
        draft_mb, share = _value(page, "ls-overhead-mb"), _value(page, "ls-overhead-pct")
        # the draft's weights and KV against a 3.6 GB target: a small share, said next to the speedup
        assert 300 < draft_mb < 1000 and 5 < share < 30, (draft_mb, share)
        ARTIFACTS.mkdir(exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "ui-big-target.png"), full_page=True)
