"""The speculative engine through real llama.cpp on the embedded pair: lossless, measured, robust."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
from _chi2 import chi2_pvalue
from _gguf_build import write_tiny_llama
from _lossless import assert_lossless, traced

import localspec
from localspec import constants
from localspec.errors import (
    ContextOverflowError,
    GGUFError,
    IncompatiblePairError,
    ModelNotFoundError,
    SettingsError,
    UnusableModelError,
)
from localspec.llama import sampling

PROMPTS = [
    "def fib(n):",
    "import os\n\n\ndef read_lines(path):\n",
    "class Stack:\n    def __init__(self):\n        self.items = []\n\n    def push(self, item):\n",
]


@pytest.mark.parametrize("strategy", ["model", "ngram", "model+ngram"])
@pytest.mark.parametrize("adaptive", [False, True])
def test_greedy_is_lossless(embedded_pipe, strategy, adaptive):
    drafted = 0
    for prompt in PROMPTS:
        base, bt = traced(embedded_pipe, prompt, max_tokens=48, baseline=True)
        spec, st = traced(embedded_pipe, prompt, max_tokens=48, strategy=strategy, adaptive=adaptive, n_max=4)
        assert_lossless(base, bt, spec, st)
        assert base.stats.drafted == 0 and base.stats.strategy.name == "none"
        drafted += spec.stats.drafted
    assert drafted > 0, "the drafter never proposed anything: the test would prove nothing"


def test_target_alone_equals_llama_cpp_pythons_own_greedy(embedded_pipe):
    """The baseline is the reference for losslessness, so check it against an independent one."""
    import llama_cpp

    llm = llama_cpp.Llama(str(constants.EMBEDDED_TARGET), n_ctx=512, n_threads=2, verbose=False)
    try:
        for prompt in [*PROMPTS, "x = 1\ny ="]:
            ref = llm.create_completion(prompt, max_tokens=24, temperature=0.0)["choices"][0]["text"]
            ours = embedded_pipe.generate(prompt, max_tokens=24, baseline=True)
            again = embedded_pipe.generate(prompt, max_tokens=24, baseline=True)  # reusing the cache
            assert str(ours) == ref == str(again), prompt
    finally:
        llm.close()


def test_stats_invariants(embedded_pipe):
    r = embedded_pipe.generate(PROMPTS[0], max_tokens=40, strategy="model", n_max=3, p_min=0.0)
    s = r.stats
    assert s.generated_tokens == len(r.tokens) == 40
    assert 0 <= s.accepted <= s.drafted
    assert sum(s.accepted_by_position) == s.accepted
    assert sum(s.drafted_by_position) == s.drafted
    assert all(a <= d for a, d in zip(s.accepted_by_position, s.drafted_by_position, strict=True))
    assert len(s.drafted_by_position) <= 3
    # each round emits its accepted drafts plus one token; only the last round may be cut short
    assert s.rounds <= s.generated_tokens <= s.accepted + s.rounds
    assert s.accepted + s.rounds - s.generated_tokens <= 3
    assert sum(r.from_draft) <= s.accepted
    assert s.verify_tokens == s.drafted + s.rounds
    assert s.tokens_per_second > 0 and s.draft_seconds > 0 and s.verify_seconds > 0
    assert s.acceptance_rate == pytest.approx(s.accepted / s.drafted)
    d = s.as_dict()
    assert d["memory"]["draft_overhead_bytes"] == s.memory.draft_weights_bytes + s.memory.draft_kv_bytes
    assert s.memory.target_weights_bytes > s.memory.draft_weights_bytes > 0
    assert s.memory.draft_overhead_pct > 0
    line = s.summary_line()
    assert "acceptance" in line and "tok/s" in line


def test_acceptance_is_visible_on_embedded_pair(embedded_pipe):
    """With the embedded preset's own draft settings the draft's work shows: many tokens come from it."""
    r = embedded_pipe.generate(PROMPTS[0], max_tokens=64, strategy="model")
    assert r.stats.accepted >= 8 and r.stats.acceptance_rate > 0.5, r.stats.as_dict()
    assert sum(r.from_draft) == r.stats.accepted
    assert len(r.pieces) == len(r.tokens) == len(r.from_draft) and "".join(r.pieces) == r


def test_closed_stream_leaves_pipeline_consistent(embedded_pipe):
    prompt = PROMPTS[2]
    fresh = embedded_pipe.generate(prompt, max_tokens=32, strategy="model")
    stream = embedded_pipe.stream(prompt + "        pass\n", max_tokens=32, strategy="model")
    for i, _ in enumerate(stream):
        if i == 5:
            break
    stream.close()
    with pytest.raises(RuntimeError):  # an exception raised by the consumer mid-stream
        for i, _ in enumerate(embedded_pipe.stream(PROMPTS[1], max_tokens=32, strategy="model+ngram")):
            if i == 7:
                raise RuntimeError("callback failed")
    again = embedded_pipe.generate(prompt, max_tokens=32, strategy="model")
    assert again.tokens == fresh.tokens


def test_stop_strings_and_finish_reason(embedded_pipe):
    full = embedded_pipe.generate(PROMPTS[0], max_tokens=48)
    assert full.stats.finish_reason in ("length", "stop")
    # the first piece of text that is not blank, wherever it is: the test never depends on what was written
    start = next(i for i, ch in enumerate(full) if not ch.isspace())
    stop = full[start : start + 3]
    cut = embedded_pipe.generate(PROMPTS[0], max_tokens=48, stop=[stop])
    assert str(cut) == full[: full.index(stop)]
    assert cut.stats.finish_reason == "stop"


def test_context_overflow_is_refused_before_work(embedded_pipe):
    long_prompt = "x = 1\n" * 2000
    with pytest.raises(ContextOverflowError, match="context window"):
        embedded_pipe.generate(long_prompt, max_tokens=16)
    with pytest.raises(ContextOverflowError):
        embedded_pipe.generate("def f():", max_tokens=embedded_pipe.n_ctx)


def test_chat_uses_the_models_template(embedded_pipe):
    messages = [{"role": "user", "content": "write a function that adds two numbers"}]
    tokens, stops = embedded_pipe.format_chat(messages)
    rendered = "".join(embedded_pipe.target.piece(t).decode("utf-8", "replace") for t in tokens)
    plain = embedded_pipe.tokenize(messages[0]["content"])
    assert messages[0]["content"] in rendered and len(tokens) > len(plain)  # wrapped by the template
    r = embedded_pipe.chat(messages, max_tokens=24)
    assert r.stats.prompt_tokens == len(tokens)  # the chat call sent exactly the templated prompt
    assert isinstance(r, str) and r.stats.generated_tokens > 0


def test_one_line_api_runs_the_embedded_pair():
    text = localspec.generate("def fib(n):", max_tokens=16, n_threads=2, n_ctx=512)
    assert isinstance(text, str) and len(text) > 0
    assert text.stats.strategy.name == "model" and "embedded" in text.stats.pairing_note
    assert localspec.generate("def fib(n):", max_tokens=16, n_threads=2, n_ctx=512) == text


def test_missing_and_corrupt_files_name_the_file(tmp_path):
    with pytest.raises(ModelNotFoundError, match="nope.gguf"):
        localspec.load(target=tmp_path / "nope.gguf")
    assert issubclass(ModelNotFoundError, FileNotFoundError)
    cut = tmp_path / "cut.gguf"
    data = constants.EMBEDDED_TARGET.read_bytes()
    cut.write_bytes(data[: len(data) // 3])
    with pytest.raises(GGUFError, match="cut.gguf"):
        localspec.load(target=cut, draft="none", n_ctx=256)
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"not a model at all" * 10)
    with pytest.raises(GGUFError, match="junk.gguf"):
        localspec.load(target=junk, draft="none", n_ctx=256)


def test_ctrl_c_while_llama_cpp_loads_is_raised_once_the_load_returns(monkeypatch):
    """A SIGINT handled inside a callback from C (llama-cpp-python's log callback, during a load) used to
    be printed as ignored and lost, and the whole generation ran: it is raised when the load is done."""
    import ctypes
    import os
    import signal

    import llama_cpp

    from localspec.llama.runtime import Model

    real = llama_cpp.Llama

    def loading(**kw):
        def in_the_callback() -> None:  # Python runs the signal handler here, inside the C call
            os.kill(os.getpid(), signal.SIGINT)
            for _ in range(1000):
                pass

        ctypes.CFUNCTYPE(None)(in_the_callback)()
        return real(**kw)

    monkeypatch.setattr(llama_cpp, "Llama", loading)
    # Python's own Ctrl-C handler, as a terminal's Python has it (a test run in the background of a
    # non-interactive shell, `pytest &`, inherits SIGINT ignored, and then no Ctrl-C comes at all)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt):
            Model(constants.EMBEDDED_DRAFT, n_ctx=64, n_threads=1)
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    finally:
        signal.signal(signal.SIGINT, previous)


def test_a_model_llama_cpp_refuses_gets_llama_cpps_reason(tmp_path):
    """The header reads fine, llama.cpp refuses the model: its own reason is the message (llama-cpp-python
    drops llama.cpp's logged errors unless verbose), not a bare "failed to load"."""
    vocab = next((__import__("pathlib").Path(__file__).parent / "data" / "vocab").glob("*gpt-2*.gguf"))
    odd = write_tiny_llama(tmp_path / "odd.gguf", vocab, arch="nosucharch")
    with pytest.raises(GGUFError, match="unknown model architecture: 'nosucharch'") as err:
        localspec.load(target=odd, draft="none", n_ctx=256)
    assert "odd.gguf" in err.value.message and "llama-cpp-python" in (err.value.hint or "")


def test_incompatible_and_unusable_drafts_are_refused_before_loading(tmp_path):
    vocab = __import__("pathlib").Path(__file__).parent / "data" / "vocab"
    gpt2_vocab = next(vocab.glob("*gpt-2*.gguf"))
    other = write_tiny_llama(tmp_path / "other-vocab.gguf", gpt2_vocab)
    with pytest.raises(IncompatiblePairError) as exc:
        localspec.load(target=constants.EMBEDDED_TARGET, draft=other)
    assert exc.value.reasons and "other-vocab.gguf" in str(exc.value)
    vocab_only = tmp_path / "vocab-only.gguf"
    shutil.copy(gpt2_vocab, vocab_only)
    with pytest.raises(UnusableModelError, match="vocab-only.gguf"):
        localspec.load(target=constants.EMBEDDED_TARGET, draft=vocab_only)


# Sampling -------------------------------------------------------------------------------------
def test_rejection_rule_is_exact_on_paper():
    """The accept/residual rule reproduces p exactly for any q (computed, not sampled)."""
    rng = np.random.default_rng(0)
    for _ in range(50):
        p = rng.dirichlet(np.ones(7))
        q = rng.dirichlet(np.ones(7) * 0.3)
        accept = np.minimum(1.0, p / q)
        residual = np.maximum(p - q, 0)
        residual /= residual.sum()
        out = q * accept + (1 - (q * accept).sum()) * residual
        np.testing.assert_allclose(out, p, atol=1e-12)
        x = 3  # deterministic proposal (n-gram): accept with p(x), else p without x
        r = p.copy()
        r[x] = 0
        out = np.eye(7)[x] * p[x] + (1 - p[x]) * r / r.sum()
        np.testing.assert_allclose(out, p, atol=1e-12)


def test_accept_or_resample_monte_carlo():
    rng = np.random.default_rng(1)
    p = np.array([0.5, 0.3, 0.15, 0.05])
    q = np.array([0.1, 0.6, 0.1, 0.2])
    counts = np.zeros(4)
    for _ in range(20000):
        tok = sampling.sample(q, rng)
        _, out = sampling.accept_or_resample(p, q, tok, rng)
        counts[out] += 1
    assert np.abs(counts / counts.sum() - p).max() < 0.015


def _first_two(pipe, prompt, n, **kw):
    out = []
    for seed in range(n):
        r = pipe.generate(prompt, max_tokens=2, temperature=1.0, seed=seed, **kw)
        out.append(tuple(r.tokens[:2]))
    return out


@pytest.mark.slow
@pytest.mark.parametrize(
    "strategy,prompt,adaptive",
    [("model", "def ", False), ("ngram", "a = b\nc = d\na = b\nc =", False), ("model", "def ", True)],
)
def test_sampling_distribution_matches_target(embedded_pipe, strategy, prompt, adaptive):
    """Adaptive model drafts stop where the expected gain says (decoding.stopping): still the target's law."""
    n = 1500
    base = _first_two(embedded_pipe, prompt, n, baseline=True)
    spec = _first_two(embedded_pipe, prompt, n, strategy=strategy, n_max=3, p_min=0.0, adaptive=adaptive)
    assert len(set(base)) > 5, "the distribution is too peaked for the test to mean anything"
    assert chi2_pvalue(base, spec) > 1e-3


@pytest.mark.slow
def test_sampling_test_detects_a_biased_sampler(embedded_pipe, monkeypatch):
    """The chi-square test above has teeth: accepting every draft (no rejection) is caught.

    Shown with n-gram drafts (deterministic proposals), where accepting everything is far from the target's
    distribution; with the distilled model draft the same bug shifts the output only by the draft/target
    difference, which a sample this size may not reveal."""
    monkeypatch.setattr("localspec.decoding.accept.accept_or_resample", lambda p, q, tok, rng: (True, tok))
    n = 1500
    prompt = "a = b\nc = d\na = b\nc ="
    base = _first_two(embedded_pipe, prompt, n, baseline=True)
    biased = _first_two(embedded_pipe, prompt, n, strategy="ngram", n_max=3, p_min=0.0)
    assert chi2_pvalue(base, biased) < 1e-3


def test_compare_reports_the_median_ratio_of_interleaved_runs(embedded_pipe):
    cmp = embedded_pipe.compare(PROMPTS[1], max_tokens=16, repeats=3, strategy="model")
    assert len(cmp.baseline_tps) == len(cmp.speculative_tps) == 3
    assert cmp.speedup == pytest.approx(float(np.median(cmp.speculative_tps) / np.median(cmp.baseline_tps)))
    assert cmp.baseline.stats.strategy.name == "none" and cmp.speculative.stats.strategy.name == "model"
    assert cmp.speculative.stats.speedup == cmp.speedup
    assert cmp.same_text == (str(cmp.baseline) == str(cmp.speculative))
    assert cmp.as_dict()["speedup"] == round(cmp.speedup, 4)


def test_run_command_prints_text_summary_and_speedup():
    import json

    from click.testing import CliRunner

    from localspec.cli.run import run

    res = CliRunner().invoke(run, ["-n", "16", "--threads", "2", "--baseline", "def fib(n):"])
    assert res.exit_code == 0, res.output
    assert "embedded default pair" in res.output and "acceptance" in res.output
    assert "speedup" in res.output and "vs target alone" in res.output
    speedup = float(res.output.split("speedup ")[1].split("x")[0])
    assert ("hint: drafting made this run slower" in res.output) == (speedup < 1.0)

    res = CliRunner().invoke(run, ["-n", "8", "--threads", "2", "-d", "none", "--json", "def fib(n):"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.output)
    assert data["stats"]["strategy"] == "none" and data["stats"]["generated_tokens"] == 8
    assert data["text"] and data["pair"]["draft"] is None

    from localspec.cli import main  # through the command group: a library error becomes one message

    res = CliRunner().invoke(main, ["run", "-t", "missing.gguf", "x"])
    assert res.exit_code == 1
    assert "missing.gguf: no such file" in res.output and "Traceback" not in res.output


@pytest.mark.parametrize("repeats", ["x", 2.5, 0, -3, True, 101])
def test_compare_refuses_repeats_it_cannot_run(embedded_pipe, repeats):
    with pytest.raises(SettingsError, match="repeats must be a whole number from 1 to 100"):
        embedded_pipe.compare("def f():", max_tokens=4, repeats=repeats)


def test_compare_of_the_target_alone_says_there_is_nothing_to_compare(embedded_pipe):
    with pytest.raises(SettingsError, match="nothing to compare") as exc:
        embedded_pipe.compare("def f():", max_tokens=4, strategy="none")
    assert "strategy='ngram'" in (exc.value.hint or "")


def test_compare_of_a_prompt_past_the_context_names_the_requests_max_tokens(embedded_pipe):
    """It named the 8 tokens of its own warm-up run."""
    long_prompt = "word " * 3000
    with pytest.raises(ContextOverflowError, match=r"plus max_tokens 64 exceeds"):
        embedded_pipe.compare(long_prompt, max_tokens=64, strategy="ngram")
