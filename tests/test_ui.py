"""The web UI: presentation functions, the pipeline holder on the embedded pair, and a real browser run.

The browser test starts ``localspec ui`` on a free local port and drives headless Chromium (Debian's package,
through Playwright) on the embedded pair: run a prompt, see highlighted draft tokens, Compare, read the
speedup and memory values from the page, and get readable messages for bad input.
"""

from __future__ import annotations

import html
import json
import math
import re
import time
from dataclasses import replace
from pathlib import Path

import pytest
from _browser import STALL_SECONDS, STEP_MS, browser_page, ui_server, wait_on_page
from localspec.ui.render import error_html, memory_rows, result_panel_html, tokens_html

from localspec import constants
from localspec.errors import ContextOverflowError, GGUFError

ARTIFACTS = Path(__file__).parent / "artifacts"
EMBEDDED = constants.EMBEDDED_TARGET.is_file() and constants.EMBEDDED_DRAFT.is_file()
needs_embedded = pytest.mark.skipif(not EMBEDDED, reason="the embedded pair is not built yet")


# ------------------------------------------------------------------------------------------ presentation


def test_tokens_html_escapes_text_and_marks_draft_tokens():
    html = tokens_html([("<script>", True), ("a & b", None), ("", "model"), ('"x"', "history")])
    assert "<script>" not in html
    assert '<span class="ls-t ls-d ls-src-model">&lt;script&gt;</span>' in html  # True: the draft model
    assert '<span class="ls-t">a &amp; b</span>' in html
    assert '<span class="ls-t ls-d ls-src-history">&quot;x&quot;</span>' in html  # coloured by its source
    assert html.count("ls-d") == 2  # the empty piece (half a UTF-8 char) is not drawn


def test_error_html_shows_message_and_next_step_without_traceback():
    exc = ContextOverflowError("the prompt (3000 tokens) exceeds the context", hint="lower max_tokens")
    html = error_html(exc)
    assert "exceeds the context" in html and "lower max_tokens" in html
    assert "Traceback" not in html
    assert "&lt;b&gt;" in error_html(GGUFError("<b>.gguf", "bad magic"))


def test_result_panel_puts_speedup_next_to_memory_with_readable_numbers():
    stats = {
        "tokens_per_second": 30.0,
        "acceptance_rate": 0.5,
        "mean_accepted_length": 1.5,
        "tokens_per_round": 2.5,
        "drafted": 10,
        "accepted": 5,
        "acceptance_by_position": [0.75, 0.25],
        "drafted_by_position": [4, 4],
        "strategy": "model",
    }
    memory = {
        "target_weights_bytes": 90 * 10**6,
        "target_kv_bytes": 10 * 10**6,
        "draft_weights_bytes": 20 * 10**6,
        "draft_kv_bytes": 5 * 10**6,
        "draft_overhead_bytes": 25 * 10**6,
        "draft_overhead_pct": 25.0,
        "draft_rss_delta_bytes": 30 * 10**6,
        "rss_baseline_bytes": 100 * 10**6,
        "rss_after_target_bytes": 200 * 10**6,
    }
    html = result_panel_html(stats, baseline={"tokens_per_second": 20.0}, speedup=1.5, memory=memory)

    def value(eid: str) -> float:
        return float(re.search(rf'id="{eid}" data-value="([^"]*)"', html).group(1))

    assert value("ls-speedup") == 1.5
    assert value("ls-base-tps") == 20.0 and value("ls-spec-tps") == 30.0
    assert value("ls-acceptance") == 50.0
    assert value("ls-overhead-mb") == 25.0 and value("ls-overhead-pct") == 25.0
    assert value("ls-rss-mb") == 30.0 and value("ls-rss-pct") == 30.0  # 30 MB over a 100 MB target RSS
    assert 'style="height:75.0%"' in html and 'style="height:25.0%"' in html
    rows = {eid: raw for _, eid, raw, _ in memory_rows(memory)}
    assert rows["ls-target-mb"] == 100.0
    # nothing drafted: no acceptance rate (it read "0.0 %"); auto says what it chose and why
    routed = {**stats, "drafted": 0, "accepted": 0, "acceptance_rate": 0.0, "strategy": "suffix"}
    routed["route"] = "auto -> suffix: the prompt overlaps the store"
    html = result_panel_html(routed, memory=memory)
    assert (
        'id="ls-acceptance" data-value=""' in html
        and "strategy: auto -&gt; suffix: the prompt overlaps" in html
    )
    assert 'id="ls-draft-unused"' in html  # the draft model is loaded, this run did not use it
    assert 'id="ls-draft-unused"' not in result_panel_html(stats, memory=memory)  # strategy model used it
    said = result_panel_html(stats, speedup=24.1, memory=memory, caution="Caution: <noise>")
    assert 'id="ls-caution">Caution: &lt;noise&gt;</div>' in said


def test_compare_flags_a_speedup_no_drafting_can_produce():
    """Seen on a busy machine: 24.11x at 4 tokens per pass, 1.16x with nothing drafted."""
    from types import SimpleNamespace

    from localspec.ui.generate import noise_caution

    def cmp(speedup, per_pass, accepted):
        stats = SimpleNamespace(tokens_per_round=per_pass, accepted=accepted)
        return SimpleNamespace(speedup=speedup, speculative=SimpleNamespace(stats=stats))

    assert "24.11x is more than the 4.00 tokens each target pass gave" in noise_caution(cmp(24.11, 4.0, 30))
    assert "1.35x with no draft accepted" in noise_caution(cmp(1.35, 1.0, 0))
    assert noise_caution(cmp(1.6, 4.0, 30)) == "" and noise_caution(cmp(1.1, 1.0, 0)) == ""


# ------------------------------------------------------------------------------------------ pipeline holder


class _Counted:
    """A real pipeline, with its close() calls counted."""

    def __init__(self, pipe):
        self.pipe, self.closed = pipe, 0

    def __getattr__(self, name):
        return getattr(self.pipe, name)

    def close(self):
        self.closed += 1
        self.pipe.close()


@needs_embedded
def test_holder_reuses_the_pipeline_closes_it_on_switch_and_stop_leaves_it_consistent():
    from localspec.ui.session import PairSpec, PipelineHolder

    import localspec

    loaded: list[_Counted] = []

    def loader(**kw):
        loaded.append(_Counted(localspec.load(**kw)))
        return loaded[-1]

    holder = PipelineHolder(loader)
    pair = PairSpec(target=str(constants.EMBEDDED_TARGET), draft=str(constants.EMBEDDED_DRAFT))
    pipe = holder.get(pair)
    assert holder.get(pair) is pipe and len(loaded) == 1

    full = pipe.generate("def add(a, b):", max_tokens=24)
    got = []
    for tr in holder.stream(lambda: pipe.stream("def add(a, b):", max_tokens=24)):
        got.append(tr.text)
        if len(got) == 3:
            holder.request_stop()
    assert len(got) == 3 and holder.was_stopped()
    assert "".join(got) == full[: len("".join(got))]
    assert pipe.generate("def add(a, b):", max_tokens=24) == full  # the early stop left it consistent

    other = holder.get(PairSpec(target=str(constants.EMBEDDED_TARGET), draft="ngram"))
    assert other is not pipe and loaded[0].closed == 1 and loaded[1].closed == 0
    holder.close()
    assert loaded[1].closed == 1 and holder.pipe is None


# ------------------------------------------------------------------------------------------ browser


@pytest.fixture(scope="module")
def ui(tmp_path_factory):
    if not EMBEDDED:
        pytest.skip("the embedded pair is not built yet")
    home = tmp_path_factory.mktemp("ui")
    env = {
        "LOCALSPEC_HOME": str(home / "cache"),
        "LOCALSPEC_CONFIG": str(home / "config"),
        "HF_HOME": str(home / "hf"),
        "LOCALSPEC_MODELS": str(home / "models"),
    }
    (home / "models").mkdir()
    with browser_page() as page, ui_server(env, home / "server.log") as url:
        page.goto(url)
        page.wait_for_selector("#ls-run", timeout=STEP_MS)
        yield page, home
        assert page.external == [], f"the page fetched from outside localhost: {page.external[:5]}"


def _number(page, elem_id: str) -> float:
    raw = page.get_attribute(f"#{elem_id}", "data-value")
    assert raw not in (None, ""), f"#{elem_id} has no value"
    value = float(raw)
    assert math.isfinite(value)
    return value


def _settled_text(page, selector: str, quiet: float = 0.6, timeout: float = 30.0) -> str:
    """The text of ``selector`` once it has not changed for ``quiet`` seconds (Gradio updates the output and
    the stats panel separately: the panel may change first)."""
    deadline = time.monotonic() + timeout
    text, since = page.inner_text(selector), time.monotonic()
    while time.monotonic() < deadline:
        page.wait_for_timeout(100)
        now = page.inner_text(selector)
        if now != text:
            text, since = now, time.monotonic()
        elif time.monotonic() - since >= quiet:
            break
    return text


def _shown(page, selector: str) -> None:
    """Wait until ``selector`` is on the page, for as long as the page keeps changing (a run's end)."""
    wait_on_page(page, "(s) => !!document.querySelector(s)", arg=selector, what=selector)


def _run(page, prompt: str) -> None:
    page.fill("#ls-prompt textarea", prompt)
    page.click("#ls-run")


@pytest.mark.browser
def test_browser_run_highlights_draft_tokens_and_compare_shows_speed_and_memory(ui):
    page, _ = ui
    assert "tiny-embedded" in page.input_value("#ls-preset input")  # the default selection
    assert "ready" in page.inner_text("#ls-preset-facts")

    _run(page, "def fibonacci(n):")
    _shown(page, "#ls-result-box #ls-acceptance")
    assert page.locator("#ls-error-box .ls-err").count() == 0
    n_tokens = page.locator("#ls-output .ls-t").count()
    n_draft = page.locator("#ls-output .ls-t.ls-d").count()
    assert n_tokens > 0 and 0 < n_draft <= n_tokens
    assert page.locator("#ls-output .ls-t.ls-d").first.is_visible()
    assert page.get_attribute("#ls-speedup", "data-value") == ""  # only Compare measures the speedup

    page.click("#ls-compare")
    _shown(page, '#ls-speedup:not([data-value=""])')
    speedup = _number(page, "ls-speedup")
    base, spec = _number(page, "ls-base-tps"), _number(page, "ls-spec-tps")
    assert speedup > 0 and base > 0 and spec > 0
    assert speedup == pytest.approx(spec / base, rel=0.05)
    overhead_mb, overhead_pct = _number(page, "ls-overhead-mb"), _number(page, "ls-overhead-pct")
    assert overhead_mb > 0 and overhead_pct > 0
    assert _number(page, "ls-draft-weights-mb") > 0
    _number(page, "ls-rss-mb")  # measured: any finite number (RSS can even shrink)
    assert 0 <= _number(page, "ls-acceptance") <= 100
    assert page.locator("#ls-bars .ls-bar").count() >= 1
    # at temperature 0 the texts are the same, or part at a near-tie (llama.cpp's batched rounding), never
    # blamed on sampling
    said = page.inner_text("#ls-result-box")
    assert "same text with and without the draft: yes" in said or "part at a near-tie" in said, said
    assert page.locator("#ls-output .ls-t.ls-d").count() > 0  # Compare's text shows the draft's tokens too

    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "ui.png"), full_page=True)


@pytest.mark.browser
def test_browser_bad_input_shows_a_message_and_the_app_keeps_serving(ui):
    page, home = ui
    # A prompt longer than the context window.
    _run(page, "x = 1\n" * 600)  # about 3,000 tokens: over the 2,048 of the preset
    _shown(page, "#ls-error-box .ls-err")
    err = page.locator("#ls-error-box .ls-err").first
    text = err.inner_text()
    assert "context" in text and "Traceback" not in text

    # A file that is not a GGUF, typed as the target.
    bad = home / "models" / "not-a-model.gguf"
    bad.write_bytes(b"this is not a GGUF file\n" * 10)
    page.click("#ls-source label:has-text('My models')")
    page.fill("#ls-target input", str(bad))
    page.keyboard.press("Enter")
    page.click("#ls-prompt textarea")
    _run(page, "def f():")
    wait_on_page(
        page,
        "() => (document.querySelector('#ls-error-box .ls-err') || {}).innerText"
        "?.includes('not-a-model.gguf')",
    )
    text = page.inner_text("#ls-error-box .ls-err")
    assert "Traceback" not in text

    # The server is still there, and the embedded pair still runs.
    page.click("#ls-source label:has-text('Preset')")
    _run(page, "import os")
    wait_on_page(
        page,
        "() => !document.querySelector('#ls-error-box .ls-err') && "
        "document.querySelectorAll('#ls-output .ls-t').length > 0",
    )


# ------------------------------------------------------------------------------------- the App's handlers


class _Token:
    def __init__(self, text: str, last: bool) -> None:
        self.text, self.from_draft = text, False
        self.stats = None
        self.finish_reason = "length" if last else None


class _FakePipe:
    """Streams ten tokens; ``during`` (if set) runs after the third one, as if a click arrived meanwhile.
    Its context is ``n_ctx`` tokens and it tokenizes as a BOS then one token per byte."""

    def __init__(self, n_ctx: int = 512, trained: int | None = 1024) -> None:
        from types import SimpleNamespace

        self.n_ctx = n_ctx
        self.info = SimpleNamespace(n_ctx_train=trained)
        self.during = None
        self.pending = False  # costs_pending(): the next run measures this machine's costs first
        self.measured = 0
        self.cleaned = 0  # streams whose cleanup ran (the engine's: KV cache, suffix cache fed)

    def costs_pending(self, strategy=None) -> bool:
        return self.pending

    def machine_costs(self) -> None:
        self.measured += 1
        self.pending = False

    def tokenize(self, text: str) -> list[int]:
        return [1, *text.encode("utf-8")]

    def stream(self, prompt, **opts):
        self.opts = opts
        try:
            for i in range(10):
                yield _Token(f"t{i} ", i == 9)
                if i == 2 and self.during is not None:
                    self.during()
        finally:
            self.cleaned += 1

    def chat_stream(self, messages, **opts):
        self.messages = messages
        return self.stream("", **opts)

    def close(self) -> None:
        pass


def _session(name: str):
    from types import SimpleNamespace

    return SimpleNamespace(session_hash=name)


@pytest.fixture
def app():
    from localspec.ui.app import App

    loads: list[dict] = []
    pipe = _FakePipe()

    def loader(**kw):
        loads.append(kw)
        return pipe

    a = App(loader)
    a.build()
    a.loads, a.fake = loads, pipe
    return a


def _values(app, **changes) -> dict:
    c = app.c
    v = {
        "source": "Preset",
        "preset": constants.EMBEDDED_PRESET,
        "target": None,
        "draft": None,
        "n_ctx": 0,
        "threads": 0,
        "ngl_t": 0,
        "ngl_d": 0,
        "rpc": "",
        "mode": "Prompt",
        "prompt": "def f():",
        "chat": [],
        "max_tokens": 16,
        "temperature": 0.0,
        "n_max": 4,
        "p_min": 0.75,
        "adaptive": False,
        "strategy": "pair default",
        "format": "Text",
        "schema": "",
    }
    v.update(changes)
    return {c[k]: val for k, val in v.items()}


def _last_output(app, v, session: str) -> tuple[str, str]:
    updates = list(app.on_run(v, _session(session), progress=lambda *a, **k: None))
    final = updates[-1]
    return final.get(app.c["output"], ""), html.unescape(final.get(app.c["error"], ""))


def test_the_load_options_take_rpc_servers_as_run_does(app):
    """The RPC servers box: loaded with them as --rpc would be, refused with --rpc's own words."""
    from localspec.errors import SettingsError
    from localspec.llama.rpc import parse_endpoints

    _last_output(app, _values(app, rpc=" 127.0.0.1:50052 , host-b:7000"), "A")
    assert app.loads[-1]["rpc"] == "127.0.0.1:50052,host-b:7000"
    _last_output(app, _values(app), "A")
    assert "rpc" not in app.loads[-1]  # an empty box: this machine only
    for bad in ("10.0.0..2:50052", "nohost", "h:\u00b2", "[::1]:50052"):
        with pytest.raises(SettingsError) as expected:
            parse_endpoints(bad)
        out, err = _last_output(app, _values(app, rpc=bad), "A")
        assert expected.value.message in err and expected.value.hint in err, (bad, err)
    loads = len(app.loads)
    own = app.spec(_values(app, source="My models", target="t.gguf", rpc="10.0.0.2:50052"))
    assert own.load_kwargs()["rpc"] == "10.0.0.2:50052"
    assert app.spec(_values(app, rpc="10.0.0.2:1")).rpc == "10.0.0.2:1" and len(app.loads) == loads


def test_stop_ends_only_the_run_of_the_session_that_pressed_it(app):
    app.fake.during = lambda: app.on_stop(_session("B"))  # another browser presses Stop mid-run
    out, err = _last_output(app, _values(app), "A")
    assert err == "" and out.count('class="ls-t"') == 10 and "stopped" not in out
    assert "cut at Max tokens" in out  # the fake's last token ends by length: JSON cut there is not JSON

    app.fake.during = lambda: app.on_stop(_session("A"))  # the same browser presses Stop
    out, err = _last_output(app, _values(app), "A")
    # Stop arrived while the 4th token was being made: it is shown, then the run ends
    assert err == "" and out.count('class="ls-t"') == 4 and "stopped" in out and "cut at" not in out

    out, _ = _last_output(app, _values(app), "B")  # an earlier Stop does not cut the next run short
    assert out.count('class="ls-t"') == 10


def test_stop_while_a_run_waits_in_the_queue_cancels_it_and_only_it(app):
    """A Stop before the queued run starts (nothing of this session running yet) cancels that run; a
    Stop with nothing queued leaves the next click alone."""
    app.on_request(_session("B"))  # B clicks Run while A's run holds the engine: B's waits in the queue
    app.on_stop(_session("B"))  # then presses Stop
    out, err = _last_output(app, _values(app), "B")
    assert "stopped before it started" in out and "t0 " not in out and err == ""
    app.on_stop(_session("B"))  # a Stop with nothing running or waiting...
    app.on_request(_session("B"))
    out, _ = _last_output(app, _values(app), "B")  # ...does not cut the next run short
    assert out.count('class="ls-t"') == 10
    app.on_request(_session("A"))  # the click arriving after its run started: nothing left to cancel
    out, _ = _last_output(app, _values(app), "A")
    app.on_stop(_session("A"))
    out, _ = _last_output(app, _values(app), "A")
    assert out.count('class="ls-t"') == 10


def test_the_bench_stops_between_runs_on_its_own_pages_stop(app, monkeypatch):
    from localspec.ui import bench_tab

    seen: list[str] = []

    def fake_benchmark(progress, **kw):
        try:
            for i in range(50):
                progress(f"code #{i}: model k=4: 12.0 tok/s")
                seen.append("run")
                if i == 2:
                    app.on_stop(_session("other"))  # someone else's Stop: no effect
                    app.on_stop(_session("A"))
            return {}
        finally:
            seen.append("closed")  # the benchmark closes its pipeline on the way out

    monkeypatch.setattr(bench_tab.bench, "benchmark", fake_benchmark)
    c = app.c
    v = _values(app)
    v.update({c["bench_workloads"]: ["code"], c["bench_limit"]: 1, c["bench_repeats"]: 1})
    v.update({c["bench_max_tokens"]: 8, c["bench_strategies"]: []})
    msg, table, png, data = app.on_bench(v, _session("A"), progress=lambda *a, **k: None)
    assert seen == ["run", "run", "run", "closed"], seen
    assert "stopped after 3 of" in html.unescape(msg) and "nothing was written" in html.unescape(msg)
    assert table == "" and png is None and data is None


def test_a_closed_page_stops_its_run_and_drops_everything_it_has_queued(app):
    """A Stop cancels queued runs only when nothing runs (its page can press Stop again); a page that is
    closed or reloaded cannot, so all of its session ends: the run, and every queued one."""
    app.on_request(_session("A"))  # the run below
    app.on_request(_session("A"))  # two more clicks, waiting in the queue behind it
    app.on_request(_session("A"))
    app.on_request(_session("B"))  # another page's click: left alone
    app.fake.during = lambda: app.on_unload(_session("A"))  # the page reloads mid-run
    out, err = _last_output(app, _values(app), "A")
    assert err == "" and out.count('class="ls-t"') == 4 and "stopped" in out
    app.fake.during = None
    for _ in range(2):
        out, _ = _last_output(app, _values(app), "A")
        assert "stopped before it started" in out and "t0 " not in out
    out, _ = _last_output(app, _values(app), "B")
    assert out.count('class="ls-t"') == 10
    app.on_request(_session("A"))  # a click after that (the same session hash again): runs
    out, _ = _last_output(app, _values(app), "A")
    assert out.count('class="ls-t"') == 10


@pytest.mark.parametrize(
    ("field", "value", "says"),
    [
        ("n_ctx", 10**12, "Context: 1000000000000 is out of range"),
        ("n_ctx", 8, "Context: 8 is out of range"),
        ("n_ctx", 1.5, "not a whole number"),
        ("max_tokens", 10**9, "Max tokens"),
        ("n_max", 10**6, "Draft length n_max"),
        ("p_min", 7, "p_min"),
        ("temperature", float("nan"), "Temperature"),
        ("temperature", "hot", "not a number"),
        ("strategy", "magic", "strategy 'magic'"),
        ("format", "XML", "output 'XML'"),
    ],
)
def test_every_number_is_bounded_before_anything_is_loaded(app, field, value, says):
    out, err = _last_output(app, _values(app, **{field: value}), "A")
    assert says in err and "Traceback" not in err
    assert app.loads == []  # refused before a 14 GB context (or anything) was allocated


@pytest.mark.parametrize(
    ("schema", "says"),
    [
        ("", "the JSON schema box is empty"),
        ("{not json", "not valid JSON"),
        ('{"type": "array", "minItems": 99999}', "minItems 99999"),
        ("[1, 2]", "must be an object"),
    ],
)
def test_a_bad_json_schema_is_refused_before_anything_is_loaded(app, schema, says):
    _, err = _last_output(app, _values(app, format="JSON schema", schema=schema), "A")
    assert says in err and "Traceback" not in err and app.loads == []


def test_a_warning_toast_shows_the_message_as_text_not_markup(app, monkeypatch):
    """Gradio renders a toast as HTML (its sanitiser keeps <img src> and styles): a schema, a path or a
    file name in a message must reach it escaped, as the error box already had it."""
    toasts: list[str] = []
    monkeypatch.setattr("localspec.ui.app.gr.Warning", toasts.append)
    schema = '{"type": "<img src=http://example.com/pixel.gif>"}'
    _last_output(app, _values(app, format="JSON schema", schema=schema), "A")
    (toast,) = toasts
    assert "<img" not in toast and "&lt;img src=http://example.com/pixel.gif&gt;" in toast
    toasts.clear()
    app.on_compare(
        _values(app, format="JSON schema", schema=schema), _session("A"), progress=lambda *a, **k: None
    )
    assert toasts and "<img" not in toasts[0]


def test_the_output_setting_becomes_the_generation_s_grammar(app):
    from localspec import Grammar

    _last_output(app, _values(app), "A")
    assert "grammar" not in app.fake.opts
    _last_output(app, _values(app, format="JSON"), "A")
    assert app.fake.opts["grammar"] == Grammar.json_object()
    schema = '{"type": "object", "properties": {"ok": {"type": "boolean"}}}'
    _last_output(app, _values(app, format="JSON schema", schema=schema), "A")
    assert app.fake.opts["grammar"].text == Grammar.json_schema(json.loads(schema)).text


def test_context_above_the_models_trained_length_is_refused(app):
    from localspec.ui.controls import trained_context

    trained = trained_context(str(constants.EMBEDDED_TARGET))
    assert trained and trained > 16
    v = _values(app, source="My models", target=str(constants.EMBEDDED_TARGET), n_ctx=trained + 1)
    _, err = _last_output(app, v, "A")
    assert f"more than the model was trained for ({trained})" in err and app.loads == []
    v = _values(app, source="My models", target=str(constants.EMBEDDED_TARGET), n_ctx=trained)
    _, err = _last_output(app, v, "A")
    assert err == "" and app.loads[-1]["n_ctx"] == trained


@pytest.mark.parametrize("strategy", ["ngram", "model+ngram", "none", "model"])
def test_picking_a_preset_sets_its_strategy_too(app, tmp_path, monkeypatch, strategy):
    monkeypatch.setenv("LOCALSPEC_CONFIG", str(tmp_path))
    from localspec.hub import presets

    presets.save_user_preset(
        {
            "name": "mine",
            "target": {"path": str(constants.EMBEDDED_TARGET)},
            "draft": {"strategy": strategy, "n_max": 6, "p_min": 0.5, "adaptive": True},
        }
    )
    _, n_max, p_min, adaptive, chosen = app.on_preset("mine")
    assert (n_max["value"], p_min["value"], adaptive["value"]) == (6, 0.5, True)
    assert chosen["value"] == strategy


def test_the_preset_the_page_opens_with_sets_the_settings_too(app):
    """The embedded pair's preset says p_min 0.3; the page opened with the controls' 0.75 and ran that
    until another preset was picked (a UI walkthrough: 7/7 drafted where `localspec run` drafts 17)."""
    from localspec.hub import presets

    app.build()
    d = presets.get_preset(constants.EMBEDDED_PRESET).draft
    assert app.c["preset"].value == constants.EMBEDDED_PRESET
    assert (app.c["n_max"].value, app.c["p_min"].value, app.c["adaptive"].value) == (
        d.n_max,
        d.p_min,
        d.adaptive,
    )


def test_preset_facts_use_the_one_byte_formatter_and_the_hubs_cache_check(monkeypatch):
    from localspec.ui import pairs

    from localspec.hub import download as hub
    from localspec.hub import presets
    from localspec.units import format_bytes

    p = presets.get_preset(constants.EMBEDDED_PRESET)
    html = pairs.preset_info_html(p.name)
    assert format_bytes(p.ram_bytes) in html and "yes, ready" in html
    label = dict((v, k) for k, v in pairs.preset_choices([p]))[p.name]
    assert label == f"{p.name} · no download · {format_bytes(p.ram_bytes)} RAM"  # short: not under the arrow
    hubbed = replace(p, download_bytes=1_500_000_000)
    monkeypatch.setattr(hub, "is_cached", lambda preset: False)
    assert "not yet: press Download" in pairs.preset_info_html(p.name)
    assert "· 1.5 GB to download ·" in pairs.preset_choices([hubbed])[0][0]
    monkeypatch.setattr(hub, "is_cached", lambda preset: True)
    assert "· cached ·" in pairs.preset_choices([hubbed])[0][0]


def test_preset_facts_say_the_drafts_memory_share_from_the_files_here():
    from localspec.ui import pairs

    from localspec.hub import presets
    from localspec.units import format_bytes

    p = presets.get_preset(constants.EMBEDDED_PRESET)
    target, draft = p.target.path.stat().st_size, p.draft_model.path.stat().st_size
    html = pairs.preset_info_html(p.name)
    assert f"{format_bytes(draft)} of weights, {draft / target:.0%} of the target&#x27;s" in html
    missing = replace(p, draft_model=replace(p.draft_model, path=p.draft_model.path.with_name("gone.gguf")))
    assert pairs.draft_share_text(missing).startswith("known once downloaded")
    assert pairs.draft_share_text(replace(p, draft_model=None)).startswith("none")


@pytest.mark.browser
def test_browser_stop_in_another_tab_leaves_this_run_alone(ui):
    page, _ = ui
    page.click("#ls-source label:has-text('Preset')")
    page.click("#ls-settings .label-wrap")  # open the accordion (the max tokens slider is inside)
    other = page.context.browser.new_page()  # a second browser tab: its own Gradio session
    other.goto(page.url)
    other.wait_for_selector("#ls-stop", timeout=STEP_MS)

    def run_and_stop(stopper, max_tokens: int) -> str:
        box = page.locator("#ls-max-tokens input[type=number]")
        box.fill(str(max_tokens))
        box.press("Enter")
        before, shown = page.inner_html("#ls-result-box"), page.inner_html("#ls-output")
        _run(page, "def fibonacci(n):")
        wait_on_page(  # this run's first tokens are on the page: it is running now
            page,
            "(s) => { const o = document.querySelector('#ls-output');"
            " return o.innerHTML !== s && o.querySelector('.ls-t') && !o.innerText.includes('loading'); }",
            arg=shown,
        )
        stopper.click("#ls-stop")
        wait_on_page(  # the run is over when its stats reach the panel
            page, "(b) => document.querySelector('#ls-result-box').innerHTML !== b", arg=before
        )
        return _settled_text(page, "#ls-output")  # its last text may reach the page a moment later

    assert "[stopped]" not in run_and_stop(other, 200)  # the other tab's Stop: this run goes on to its end
    # this tab's own Stop ends it (1800 tokens: usually still running when Stop arrives; prompt + 1800 fit in
    # 2048). The tiny pair can write 1800 tokens in half a second when its drafts copy a repetitive run, so a
    # Stop that lands after the end is a lost race, not a failure: try again, up to three times.
    outputs = [run_and_stop(page, 1800)]
    while "[stopped]" not in outputs[-1] and len(outputs) < 3:
        outputs.append(run_and_stop(page, 1800))
    assert "[stopped]" in outputs[-1], f"Stop never landed while running in {len(outputs)} tries"
    other.close()


def test_a_first_run_that_measures_this_machines_costs_says_so_first(app):
    """The suffix cache and auto need the measured verify curve; the first run measures it (20-30 s on a
    CPU) and the page says so before the pause, not a silent 'loading' that seems to hang."""
    app.fake.pending = True
    updates = list(app.on_run(_values(app), _session("A"), progress=lambda *a, **k: None))
    said = [u.get(app.c["output"], "") for u in updates]
    at = next(i for i, o in enumerate(said) if "measuring this machine" in o)
    assert 0 < at < len(said) - 1 and "t9" not in said[at] and app.fake.measured == 1
    list(app.on_run(_values(app), _session("A"), progress=lambda *a, **k: None))
    assert app.fake.measured == 1  # kept: the next run goes straight to generating


def test_the_whole_answer_is_on_the_page_before_the_stream_is_cleaned_up(app):
    """After the last token the engine puts its cache right and feeds the suffix cache (at times a second
    with millions of stored tokens): the page gets the whole answer first."""
    run = app.on_run(_values(app), _session("A"), progress=lambda *a, **k: None)
    for update in run:
        if "t9" in update.get(app.c["output"], ""):
            assert app.fake.cleaned == 0
            break
    else:
        raise AssertionError("the answer never reached the page")
    assert list(run) == [] and app.fake.cleaned == 1


@pytest.mark.browser
def test_browser_the_bench_tabs_stop_ends_a_long_bench(ui):
    """A bench of hundreds of runs had no Stop: only killing the server ended it."""
    page, _ = ui
    page.click("button[role=tab]:has-text('Bench')")
    page.wait_for_selector("#ls-bench-run", timeout=STEP_MS)
    for name in ("chat", "translate"):  # more workloads: hundreds of runs on the embedded pair
        page.click(f"#ls-bench-workloads label:has-text('{name}')")
    page.click("#ls-bench-run")
    wait_on_page(page, "() => document.body.innerText.includes('runs')")  # running: the bar counts runs
    page.click("#ls-bench-stop")
    wait_on_page(page, "() => document.querySelector('#ls-bench-msg').innerText.includes('stopped after')")
    said = page.inner_text("#ls-bench-msg")
    assert "nothing was written" in said and "Traceback" not in said
    page.screenshot(path=str(ARTIFACTS / "ui-bench-stopped.png"), full_page=True)
    page.click("button[role=tab]:has-text('Generate')")


@pytest.mark.browser
def test_browser_a_reloaded_page_stops_its_bench(ui):
    """A bench of hundreds of runs went on after its page was reloaded: the new page had no Stop for it,
    and its own Run waited in the queue behind it for minutes."""
    page, home = ui
    log = home / "server.log"
    stopped = "the benchmark was stopped after"
    seen_before = log.read_text(errors="replace").count(stopped)
    page.click("button[role=tab]:has-text('Bench')")
    page.wait_for_selector("#ls-bench-run", timeout=STEP_MS)
    for name in ("chat", "translate"):  # hundreds of runs on the embedded pair
        page.click(f"#ls-bench-workloads label:has-text('{name}')")
    page.click("#ls-bench-run")
    clicked = time.monotonic()
    wait_on_page(  # the progress says "N / TOTAL runs" once a run has been counted
        page, r"() => /[1-9][0-9,]*\s*\/\s*[0-9,]+\s*runs/.test(document.body.innerText)"
    )
    first_run = time.monotonic() - clicked  # the pair's load and at least one run, on this machine, now
    page.reload()
    page.wait_for_selector("#ls-run", timeout=STEP_MS)
    # The bench stops after the run in progress, which takes less than everything up to the first counted
    # run. Only the server's "stopped" line passes: a bench that went on to its end never writes it, so a
    # generous limit (a busy machine) cannot let a bench that did not stop through; it only bounds the wait.
    deadline = time.monotonic() + max(STALL_SECONDS, 20 * first_run)
    while log.read_text(errors="replace").count(stopped) == seen_before:  # the server's own line
        assert time.monotonic() < deadline, "the bench went on after its page was reloaded"
        time.sleep(0.5)
    before = page.inner_html("#ls-result-box")
    _run(page, "def fibonacci(n):")  # the engine is free again: this page's run goes through to its end
    wait_on_page(  # (its stats reach the panel: nothing left running for the next test)
        page, "(b) => document.querySelector('#ls-result-box').innerHTML !== b", arg=before
    )
    assert "[stopped]" not in _settled_text(page, "#ls-output")


@pytest.mark.browser
def test_browser_json_output_is_json_and_a_bad_schema_says_so(ui):
    page, _ = ui
    fmt = page.locator("#ls-format")
    if not fmt.is_visible():
        page.click("#ls-settings .label-wrap")
    try:
        fmt.get_by_label("JSON schema", exact=True).check()
        broken = '{"type": "object", "properties": {"ok": {"type": "boolean"}}'  # one } short
        page.fill("#ls-schema textarea", broken)
        _run(page, "Is it?")
        _shown(page, "#ls-error-box .ls-err")  # after a bench that stops
        assert "not valid JSON" in page.inner_text("#ls-error-box")

        fmt.get_by_label("JSON", exact=True).check()
        _run(page, "A cat, as JSON:")
        wait_on_page(  # the error went with the new run, and its answer is on the page
            page,
            "() => !document.querySelector('#ls-error-box .ls-err')"
            " && document.querySelector('#ls-output').innerText.trim().startsWith('{')",
        )
        _shown(page, "#ls-result-box #ls-acceptance")
        ARTIFACTS.mkdir(exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "ui-json.png"), full_page=True)
    finally:
        fmt.get_by_label("Text", exact=True).check()


def test_a_typed_target_is_offered_the_drafts_next_to_it(app, tmp_path, monkeypatch):
    """Without a Scan, a target typed into My models found no draft although a fitting one sat next to it
    (a UI walkthrough; `localspec pair TARGET` looks there): its folder is looked at too."""
    from _gguf_build import write_tiny_llama

    monkeypatch.setenv("LOCALSPEC_HOME", str(tmp_path / "home"))
    vocab = next((Path(__file__).parent / "data" / "vocab").glob("*gpt-2*.gguf"))
    big = write_tiny_llama(tmp_path / "big.gguf", vocab, n_embd=32)
    small = write_tiny_llama(tmp_path / "small.gguf", vocab, n_embd=16)
    msg, drafts, table = app.on_target(str(big))
    values = [v for _, v in drafts["choices"]]
    assert msg == {"__type__": "update"} and values[0] == str(small) and values[-2:] == ["ngram", "none"]
    assert "| yes | tiny-test" in table and "identical" in table


def test_a_scan_offers_the_largest_model_as_the_target_with_its_drafts_and_says_so(app, tmp_path):
    """It offered the smallest (a 0.5B target with no draft); its "found N" was wiped by the target's
    change at once, and an unchanged target left the candidates table blank."""
    from _gguf_build import write_tiny_llama

    vocab = next((Path(__file__).parent / "data" / "vocab").glob("*gpt-2*.gguf"))
    small = write_tiny_llama(tmp_path / "a-small.gguf", vocab, n_embd=16)  # first by name
    big = write_tiny_llama(tmp_path / "b-big.gguf", vocab, n_embd=32)
    for _ in range(2):  # the second scan: the same target, so no change event fills the table
        msg, target, drafts, table = app.on_scan(str(tmp_path))
        assert "found 2 model(s)" in msg and target["value"] == str(big)
        assert [v for _, v in drafts["choices"]][0] == str(small) and "identical" in table
    msg, _, _, _ = app.on_scan(str(tmp_path / "nowhere"))
    assert "no such folder" in msg and str(tmp_path / "nowhere") in msg and "then Scan" in msg
    msg, _, _, _ = app.on_scan(str(tmp_path / "a-small.gguf") + "x")
    assert "Nothing found" in msg


# ------------------------------------------------------------------- Max tokens and the pair's context


def _note(update) -> str:
    """The Settings note's text from its update ('' when it is hidden)."""
    if not update.get("visible"):
        return ""
    return html.unescape(re.sub(r"<[^>]+>", "", update["value"]))


def _run_updates(app, v) -> dict:
    """Every update one Run sent, merged in order (the last value of each output wins)."""
    merged: dict = {}
    for update in app.on_run(v, _session("A"), progress=lambda *a, **k: None):
        merged.update(update)
    return merged


def test_max_tokens_follows_the_loaded_pairs_context_and_is_lowered_with_a_note(app):
    """The slider went to 8192 whatever the pair's context: a run that loads a pair sets its top to what the
    context leaves after the shortest prompt (the fake: 512 tokens, BOS + 1 for it) and lowers a value above,
    saying so; the same pair, once loaded, refuses more before anything runs, naming the range."""
    c = app.c
    assert app.on_pair_choice(_values(app, max_tokens=600))[0]["maximum"] == 8192  # nothing loaded yet

    got = _run_updates(app, _values(app, max_tokens=600, prompt="a"))  # the shortest prompt: 2 tokens
    assert got[c["max_tokens"]]["maximum"] == 510 and got[c["max_tokens"]]["value"] == 510
    note = _note(got[c["settings_note"]])
    assert "Max tokens lowered from 600 to 510" in note and "context is 512 tokens" in note, note
    assert "a larger Context in Load options allows more" in note  # trained on 1024: there is more
    assert app.fake.opts["max_tokens"] == 510 and html.unescape(got[c["error"]]) == ""

    _, err = _last_output(app, _values(app, max_tokens=600), "A")  # a script (or a stale tab) sends 600
    assert "Max tokens: 600 is out of range" in err and "use a value from 1 to 510" in err, err
    assert "the loaded pair's context is 512 tokens" in err and len(app.loads) == 1

    got = _run_updates(app, _values(app, max_tokens=510, prompt="a"))  # the top itself is fine, says nothing
    assert got[c["max_tokens"]]["maximum"] == 510 and c["settings_note"] not in got
    assert app.fake.opts["max_tokens"] == 510 and len(app.loads) == 1

    # choosing that pair again lowers a value above its top; another pair (another context) is not loaded
    slider, note = app.on_pair_choice(_values(app, max_tokens=4000))
    assert (slider["maximum"], slider["value"]) == (510, 510) and "from 4000 to 510" in _note(note)
    slider, note = app.on_pair_choice(_values(app, max_tokens=4000, n_ctx=1024))
    assert slider["maximum"] == 8192 and "value" not in slider and _note(note) == ""


def test_max_tokens_past_what_this_prompt_leaves_is_lowered_for_this_run(app):
    """The page's top (510 here) is for the shortest prompt; Run with it and a real prompt was refused
    ("lower max_tokens to 503 or less"), right after the page had set it. Now that run is lowered, said."""
    c = app.c
    _run_updates(app, _values(app, max_tokens=16))  # loads the pair
    got = _run_updates(app, _values(app, max_tokens=510, prompt="def f():"))  # BOS + 8 bytes: 9 tokens
    note = _note(got[c["settings_note"]])
    assert "Max tokens 510 lowered to 503 for this run: the prompt takes 9 of the context's 512" in note
    assert app.fake.opts["max_tokens"] == 503 and "value" not in got[c["max_tokens"]]  # the page keeps 510
    got = _run_updates(app, _values(app, max_tokens=100, prompt="def f():"))
    assert app.fake.opts["max_tokens"] == 100 and c["settings_note"] not in got


def test_a_failed_run_clears_the_last_runs_numbers(app):
    from localspec.ui.render import empty_panel_html

    updates = list(app.on_run(_values(app, format="JSON schema", schema="{"), _session("A"), progress=print))
    assert updates[-1][app.c["result"]] == empty_panel_html()


def test_a_chat_message_answered_leaves_the_box_empty_for_the_next_one(app):
    c = app.c
    final = list(
        app.on_run(_values(app, mode="Chat", prompt="hi"), _session("A"), progress=lambda *a, **k: None)
    )
    last = final[-1]
    assert last[c["prompt"]] == "" and [m["role"] for m in last[c["chat"]]] == ["user", "assistant"]
    assert app.fake.messages == [{"role": "user", "content": "hi"}]
    plain = list(app.on_run(_values(app, prompt="hi"), _session("A"), progress=lambda *a, **k: None))
    assert c["prompt"] not in plain[-1]  # a plain prompt stays, to be run again or edited


def test_the_threads_in_load_options_reach_the_loader_bounded(app):
    """Threads were set once, by `localspec ui --threads`; Load options now has them per pair."""
    from localspec.settings import max_threads

    _run_updates(app, _values(app, threads=1, max_tokens=4, prompt="a"))
    assert app.loads[-1]["n_threads"] == 1
    _run_updates(app, _values(app, threads=0, max_tokens=4, prompt="a"))  # 0: the page's default
    assert "n_threads" not in app.loads[-1]
    _, err = _last_output(app, _values(app, threads=max_threads() + 1), "A")
    assert f"CPU threads: {max_threads() + 1} is out of range" in err and len(app.loads) == 2


def test_a_context_loaded_other_than_asked_is_said(app):
    """A preset's Context 4096 loaded as its trained 2048, and 16 as 256, without a word."""
    c = app.c
    got = _run_updates(app, _values(app, n_ctx=300, max_tokens=16, prompt="a"))  # the fake loads 512
    assert "Context 300 loaded as 512 tokens (llama.cpp's steps of 256)" in _note(got[c["settings_note"]])
    app.fake.n_ctx = 256
    got = _run_updates(app, _values(app, n_ctx=1000, max_tokens=16, prompt="a"))
    assert "Context 1000 loaded as 256 tokens (the model's trained context)" in _note(got[c["settings_note"]])
    got = _run_updates(app, _values(app, max_tokens=16, prompt="a"))  # none asked: nothing to say
    assert c["settings_note"] not in got


def test_a_pair_at_its_trained_context_says_no_larger_context_helps(app):
    app.fake.info.n_ctx_train = app.fake.n_ctx
    got = _run_updates(app, _values(app, max_tokens=1000))
    note = _note(got[app.c["settings_note"]])
    assert "its model was trained on no more" in note and "Load options" not in note, note


def test_a_value_typed_out_of_range_gets_a_note_naming_the_setting_and_its_range(app):
    """Gradio's slider puts a typed 99999 back to its top when the box loses focus, without a word: the
    release handler says what happened, and what the box holds now."""
    slider, note = app.on_max_tokens_typed(_values(app, max_tokens=99999))
    said = _note(note)
    assert "Max tokens: 99999 is out of range: use a value from 1 to 8192" in said, said
    assert "until a pair is loaded" in said and "it is set to 8192" in said and slider["value"] == 8192
    slider, note = app.on_max_tokens_typed(_values(app, max_tokens=None))  # the box emptied
    assert slider["value"] == 1 and "Max tokens: no value" in _note(note)
    slider, note = app.on_max_tokens_typed(_values(app, max_tokens=12.5))
    assert "value" not in slider and "12.5 is not a whole number" in _note(note)
    slider, note = app.on_max_tokens_typed(_values(app, max_tokens=300))
    assert slider["value"] == 300 and _note(note) == ""

    _run_updates(app, _values(app))  # loads the fake pair (512 tokens): its range from now on
    slider, note = app.on_max_tokens_typed(_values(app, max_tokens=4000))
    assert slider["value"] == 510 and "use a value from 1 to 510 (the loaded pair's context" in _note(note)

    value, note = app.on_typed("temperature")(7)
    assert value["value"] == 2.0 and "Temperature: 7 is out of range: use a value from 0 to 2" in _note(note)
    value, note = app.on_typed("n_max")(0)
    assert value["value"] == 1 and "Draft length n_max: 0 is out of range" in _note(note)
    value, note = app.on_typed("p_min")(0.5)
    assert "value" not in value and _note(note) == ""


def test_every_handler_taking_a_slider_gets_its_value_as_sent():
    """Gradio checks a slider's range before any handler runs and refuses with "Value 9000 is greater than
    maximum value 8192." (no setting named, no next step): every listener with a slider among its inputs
    leaves that out, so the page's own check (the setting and its range) answers."""
    import gradio as gr
    from localspec.ui.app import App

    demo = App(lambda **kw: _FakePipe()).build()
    with_sliders = [fn for fn in demo.fns.values() if any(isinstance(b, gr.Slider) for b in fn.inputs)]
    assert len(with_sliders) >= 10  # run, submit, compare, bench, the pair choice, every slider's release
    assert [fn.name for fn in with_sliders if fn.preprocess] == []


def _open(page, box: str, accordion: str) -> None:
    """Open the accordion ``accordion`` (its id) unless ``box`` inside it is visible already."""
    if not page.locator(box).is_visible():
        page.click(f"{accordion} .label-wrap")
        page.wait_for_selector(box, state="visible", timeout=STEP_MS)


def _max_tokens(page) -> tuple[str, str]:
    """The Max tokens slider's (top, value) as the browser holds them."""
    top = page.get_attribute("#ls-max-tokens input[type=range]", "max")
    return top or "", page.input_value("#ls-max-tokens input[type=number]")


def _wait_max_tokens(page, top: str, value: str | None = None) -> None:
    wait_on_page(
        page,
        "([top, value]) => { const r = document.querySelector('#ls-max-tokens input[type=range]');"
        " const b = document.querySelector('#ls-max-tokens input[type=number]');"
        " return r.max === top && (value === null || b.value === value); }",
        arg=[top, value],
        what="the Max tokens slider",
    )


def _settings_note(page, has: str | None, timeout: float = 30_000) -> str:
    """The Settings note's text once it contains ``has`` (None: once it is gone)."""
    if has is None:
        page.wait_for_selector("#ls-settings-note-text", state="detached", timeout=timeout)
        return ""
    page.wait_for_function(
        "(has) => (document.querySelector('#ls-settings-note-text') || {}).innerText?.includes(has)",
        arg=has,
        timeout=timeout,
    )
    return page.inner_text("#ls-settings-note-text")


def _run_and_wait(page, prompt: str, click=None, stop: bool = False) -> None:
    """Run (``click``: how, else the prompt's Run) and wait for the run's own numbers in the panel, or an
    error box (the panel's HTML changes as soon as its spinner shows: not the end of a run), for as long as
    the page keeps changing. ``stop``: press Stop once the run's first tokens are on the page (a thousand
    tokens are minutes of streaming on a busy machine, and what the test checks is said before them)."""
    tps = page.locator("#ls-spec-tps")
    before = tps.get_attribute("data-value") if tps.count() else "none"
    shown = page.inner_html("#ls-output")
    if click is None:
        _run(page, prompt)
    else:
        click()
    if stop:
        wait_on_page(
            page,
            "(s) => { const o = document.querySelector('#ls-output');"
            " return o.innerHTML !== s && o.querySelector('.ls-t') && !o.innerText.includes('loading'); }",
            arg=shown,
            what="the run's first tokens",
        )
        page.click("#ls-stop")
    wait_on_page(
        page,
        "(b) => document.querySelector('#ls-error-box .ls-err') || "
        "((document.querySelector('#ls-spec-tps') || {}).dataset?.value ?? b) !== b",
        arg=before,
        what="the run's numbers in the stats panel",
    )


@pytest.mark.browser
def test_browser_max_tokens_follows_the_pairs_context_and_says_when_it_moves(ui):
    """Max tokens went to 8192 whatever the pair's context, and a number typed above the slider's top was set
    back to it without a word: now its top follows the loaded pair, a value above is lowered with a note,
    and a typed one out of range gets a note naming the setting and its range."""
    page, _ = ui
    page.click("#ls-source label:has-text('Preset')")
    _open(page, "#ls-max-tokens", "#ls-settings")
    _open(page, "#ls-n-ctx", "#ls-load-options")
    box = page.locator("#ls-max-tokens input[type=number]")
    ctx = page.locator("#ls-n-ctx input")
    try:
        ctx.fill("1024")  # the embedded pair at another context: not the loaded one (if any is)
        ctx.press("Tab")
        _wait_max_tokens(page, "8192")

        box.fill("99999")
        box.press("Tab")  # leaving the box: Gradio's slider sets it back to its top
        note = _settings_note(page, "99999")
        assert "Max tokens: 99999 is out of range: use a value from 1 to 8192" in note, note
        assert "it is set to 8192" in note and _max_tokens(page) == ("8192", "8192")
        box.fill("4000")
        box.press("Tab")
        _settings_note(page, None)  # a value inside the range: the note goes

        _run_and_wait(page, "a", stop=True)  # the shortest prompt: it and the new top fit 1024 tokens
        note = _settings_note(page, "lowered")
        top, value = _max_tokens(page)
        # 1024 less the prompt "a": one token, and a BOS when the model takes one
        assert top == value and int(top) in (1022, 1023), (top, value)
        assert f"Max tokens lowered from 4000 to {top}" in note and "context is 1024 tokens" in note, note
        assert page.locator("#ls-error-box .ls-err").count() == 0  # prompt + Max tokens fit the context
        ARTIFACTS.mkdir(exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "ui-max-tokens.png"), full_page=True)

        # straight from the typed box to Run: the note says so, and the click still runs
        box.fill("99999")
        _run_and_wait(page, "a", click=lambda: page.click("#ls-run"), stop=True)
        note = _settings_note(page, "99999")
        assert f"use a value from 1 to {top} (the loaded pair's context is 1024 tokens" in note, note
        assert _max_tokens(page) == (top, top) and page.locator("#ls-error-box .ls-err").count() == 0
        page.wait_for_selector("#ls-settings-note-text")
        page.locator("#ls-settings-note").screenshot(path=str(ARTIFACTS / "ui-max-tokens-note.png"))
    finally:
        ctx.fill("0")  # the other tests' pair: the preset's own context
        ctx.press("Tab")
        _wait_max_tokens(page, "8192")
        box.fill("128")
        box.press("Tab")


@pytest.mark.browser
def test_a_script_sending_an_out_of_range_value_is_told_the_setting_and_its_range(ui):
    """Through Gradio's API, a value above a slider's top was refused by Gradio before the page's own check,
    as "Value 99999 is greater than maximum value 8192.": no setting named, no next step."""
    from gradio_client import Client

    page, _ = ui
    client = Client(page.url, verbose=False)
    params = client.view_api(return_format="dict", print_info=False)["named_endpoints"]["/on_compare"]
    args = {p["parameter_name"]: p["parameter_default"] for p in params["parameters"]}
    by_label = {p["label"]: p["parameter_name"] for p in params["parameters"]}
    for label, value, says in [
        ("Max tokens", 99999, "Max tokens: 99999 is out of range"),
        ("Temperature", 5, "Temperature: 5 is out of range"),
    ]:
        sent = {**args, by_label[label]: value}
        sent[by_label["Prompt"]] = "def f():"
        out = client.predict(**sent, api_name="/on_compare")
        text = html.unescape(" ".join(str(x) for x in out))
        assert says in text and "use a value from" in text and "Traceback" not in text, text[:600]


@pytest.mark.browser
def test_browser_an_mtp_strategy_loads_the_mtp_layers_and_shows_what_they_cost(ui, tmp_path):
    """A file with MTP layers, no draft model, strategy mtp: the run drafts with the target's own layers and
    the memory card shows what they cost."""
    from _mtp_model import mtp_model

    page, _ = ui
    target = mtp_model(tmp_path, "token")
    page.click("#ls-source label:has-text('My models')")
    page.fill("#ls-target input", str(target))
    page.keyboard.press("Enter")
    page.fill("#ls-draft input", "none")
    page.keyboard.press("Enter")
    _open(page, "#ls-strategy", "#ls-settings")
    page.check("#ls-strategy input[value='mtp']")
    try:
        _run(page, "hello world")
        # the box still shows the last run's result while the MTP target loads: wait for this run's
        wait_on_page(
            page,
            "() => (document.querySelector('#ls-result-box')?.innerText || '').includes('strategy: mtp')",
        )
        assert page.locator("#ls-error-box .ls-err").count() == 0
        said = _settled_text(page, "#ls-result-box")
        assert "strategy: mtp" in said, said
        assert page.locator("#ls-output .ls-t.ls-d.ls-src-mtp").count() > 0  # drafted by the MTP layers
        assert _number(page, "ls-overhead-mb") > 0 and _number(page, "ls-draft-weights-mb") > 0
        ARTIFACTS.mkdir(exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "ui-mtp.png"), full_page=True)
    finally:
        page.check("#ls-strategy input[value='pair default']")
        page.click("#ls-source label:has-text('Preset')")


def test_a_slow_page_gets_fewer_pushes_so_the_run_keeps_its_speed():
    """Each push of the streaming output sends it all and the browser lays it out again, on the cores the
    models use: on a busy 2-core machine the embedded pair wrote 11-14 tok/s on the page (77 from `localspec
    run`) and a thousand-token run took over 120 s. Pushes are spaced by their size and by what they take."""
    from localspec.ui.generate import PUSH_BYTES_PER_SECOND, PUSH_SPACING, REFRESH_SECONDS, Pushes

    pushes = Pushes()
    assert pushes.due(0.0)
    pushes.pushed(0.0, 0.001)  # a quick page: every REFRESH_SECONDS
    assert not pushes.due(REFRESH_SECONDS / 2) and pushes.due(REFRESH_SECONDS)
    pushes.pushed(1.0, 0.5)  # a push that held generation back half a second
    assert pushes.interval == PUSH_SPACING * 0.5
    assert not pushes.due(1.0 + PUSH_SPACING * 0.5 - 0.01) and pushes.due(1.0 + PUSH_SPACING * 0.5)
    pushes.pushed(3.0, 0.0)  # the page keeps up again
    assert pushes.interval == REFRESH_SECONDS
    pushes.pushed(4.0, 0.0, size=PUSH_BYTES_PER_SECOND // 2)  # a long output: half a second a push
    assert pushes.interval == 0.5
