"""The embedded default pair: real GGUF files that llama.cpp loads, one tokenizer, readable greedy output."""

from __future__ import annotations

from pathlib import Path

import gguf
import llama_cpp
import numpy as np
import pytest
from _scripts import script
from conftest import missing_embedded

from localspec.constants import EMBEDDED_DRAFT, EMBEDDED_TARGET

PAIR = {"target": EMBEDDED_TARGET, "draft": EMBEDDED_DRAFT}
MAX_BYTES = {"target": 4 * 1024 * 1024, "draft": 1024 * 1024}
SNIPPETS = [
    "def fib(n):\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n",
    "class A:\n\tdef f(self):  # tab indent\n\t\treturn {'a': [1, 2.5e-3, None]}\n\n\n\nx = A()\n",
    "   leading spaces, trailing spaces   \n\n",
    'print(f"{x!r:>10} \\n caf\u00e9 \u00fcber \u65e5\u672c \U0001f600")\r\n',
    "it's, they're; a ,b ; c .d ' e ' x?!",
]


@pytest.fixture(scope="module")
def models():
    loaded = {
        k: llama_cpp.Llama(str(p), n_ctx=512, n_threads=1, seed=0, verbose=False) for k, p in PAIR.items()
    }
    yield loaded
    for m in loaded.values():
        m.close()


def _vocab(llm: llama_cpp.Llama):
    return llm._model.vocab


def _token_texts(llm: llama_cpp.Llama) -> list[bytes]:
    vocab = _vocab(llm)
    return [llama_cpp.llama_vocab_get_text(vocab, i) for i in range(llama_cpp.llama_vocab_n_tokens(vocab))]


@pytest.mark.parametrize("kind", ["target", "draft"])
def test_file_is_a_small_llama_gguf(kind):
    path = PAIR[kind]
    assert path.is_file(), path
    assert path.stat().st_size <= MAX_BYTES[kind], (kind, path.stat().st_size)
    r = gguf.GGUFReader(str(path))
    assert r.fields["general.architecture"].contents() == "llama"
    assert r.fields["tokenizer.ggml.model"].contents() == "gpt2"
    assert r.fields["llama.context_length"].contents() >= 1024
    assert "<|assistant|>" in r.fields["tokenizer.chat_template"].contents()
    assert r.fields["general.license"].contents()


@pytest.mark.parametrize("kind", ["target", "draft"])
def test_vocab_only_load(kind):
    llm = llama_cpp.Llama(str(PAIR[kind]), vocab_only=True, verbose=False)
    try:
        assert llm.n_vocab() == 2048
        assert llm.tokenize(b"def", add_bos=True, special=False)[0] == llm.token_bos()
    finally:
        llm.close()


def test_one_shared_tokenizer(models):
    target, draft = models["target"], models["draft"]
    assert _token_texts(target) == _token_texts(draft)
    assert target.token_bos() == draft.token_bos() != target.token_eos() == draft.token_eos()
    for text in SNIPPETS:
        assert target.tokenize(text.encode(), special=True) == draft.tokenize(text.encode(), special=True)


def test_special_tokens_are_single_control_tokens(models):
    llm = models["target"]
    vocab = _vocab(llm)
    ids = llm.tokenize(b"<|user|>\nhi<|end|>\n<|assistant|>\n", add_bos=False, special=True)
    texts = [llama_cpp.llama_vocab_get_text(vocab, i) for i in ids]
    assert texts[0] == b"<|user|>" and b"<|end|>" in texts and b"<|assistant|>" in texts
    end = texts.index(b"<|end|>")
    assert llama_cpp.llama_vocab_is_eog(vocab, ids[end])
    assert llama_cpp.llama_vocab_is_eog(vocab, llm.token_eos())
    # without special parsing the same text is ordinary bytes
    assert len(llm.tokenize(b"<|user|>", add_bos=False, special=False)) > 1


@pytest.mark.parametrize("text", SNIPPETS)
def test_tokenize_detokenize_round_trip(models, text):
    llm = models["target"]
    ids = llm.tokenize(text.encode(), add_bos=False, special=False)
    assert llm.detokenize(ids).decode() == text
    # byte pieces concatenate back to the text too (what a streaming engine does)
    pieces = b"".join(llm.detokenize([i]) for i in ids)
    assert pieces.decode() == text


def test_code_compresses_into_merged_tokens(models):
    text = SNIPPETS[0]
    n = len(models["target"].tokenize(text.encode(), add_bos=False))
    assert n < len(text) / 2, n  # a trained BPE (2,048 tokens, digits split), not bytes


def _greedy(llm: llama_cpp.Llama, prompt: str, n: int) -> str:
    out = llm.create_completion(prompt, max_tokens=n, temperature=0.0, top_k=1, seed=0)
    assert isinstance(out, dict)  # not a stream
    return out["choices"][0]["text"]


@pytest.mark.parametrize("kind", ["target", "draft"])
def test_greedy_fib_is_readable_code(models, kind):
    text = _greedy(models[kind], "def fib(n):", 48)
    assert text == _greedy(models[kind], "def fib(n):", 48)  # greedy is deterministic
    assert len(text) >= 40, text
    printable = sum(c.isascii() and (c.isprintable() or c in "\n\t") for c in text)
    assert printable / len(text) > 0.97, text
    assert "\n" in text and "    " in text, text  # lines and indentation
    assert any(kw in text for kw in ("return", "if ", "for ", "self", " = ")), text


def test_target_and_draft_agree_often(models):
    """The draft was distilled from the target: it often predicts the target's own greedy tokens."""
    target = models["target"]
    prompt = target.tokenize(b"def fib(n):", add_bos=True)
    target.reset()
    cont = []
    for tok in target.generate(prompt, temp=0.0, top_k=1, reset=True):
        if llama_cpp.llama_vocab_is_eog(_vocab(target), tok) or len(cont) == 40:
            break
        cont.append(tok)
    seq = prompt + cont
    llm = llama_cpp.Llama(str(EMBEDDED_DRAFT), n_ctx=512, n_threads=1, logits_all=True, verbose=False)
    try:
        llm.eval(seq)
        guesses = llm.scores[len(prompt) - 1 : len(seq) - 1].argmax(-1).tolist()
    finally:
        llm.close()
    agree = sum(g == t for g, t in zip(guesses, cont, strict=True)) / len(cont)
    assert 0.3 <= agree <= 1.0, agree


def test_chat_path_uses_the_template(models):
    llm = models["target"]
    assert llm.chat_format == "chat_template.default"
    out = llm.create_chat_completion(
        [{"role": "user", "content": "Write a Python function add: Return a + b."}],
        max_tokens=32,
        temperature=0.0,
        top_k=1,
        seed=0,
    )
    choice = out["choices"][0]
    assert choice["finish_reason"] in ("stop", "length")
    assert isinstance(choice["message"]["content"], str) and choice["message"]["content"].strip()


def test_a_missing_embedded_file_stops_the_session(tmp_path):
    """conftest stops the whole session (exit status 1) when a file of the pair is missing, instead of
    letting the tests that need it skip: a packaging loss must fail."""
    assert missing_embedded(list(PAIR.values())) is None
    gone = tmp_path / "tiny-target.gguf"
    problem = missing_embedded([gone, EMBEDDED_DRAFT])
    assert problem is not None and str(gone) in problem and str(EMBEDDED_DRAFT) not in problem
    assert "reinstall" in problem


# ------------------------------------------------------------------------------ the script that made them
# scripts/make_embedded_pair.py needs torch to train and to verify; what follows runs without it: the
# verdict on an export check, the exit status built from it, and the recipe the docs quote.


@pytest.fixture(scope="module")
def maker():
    with script("make_embedded_pair") as module:
        yield module


def _logits(rows: int = 6, vocab: int = 50) -> np.ndarray:
    return np.random.default_rng(0).normal(size=(rows, vocab)).astype(np.float32) * 5


def test_export_check_passes_matching_logits(maker):
    ref = _logits()
    check = maker.compare_logits("t.gguf", ref, ref + 0.002, True)
    assert check.positions == 6 and check.argmax_agreement == 1.0 and check.problems() == []


@pytest.mark.parametrize(
    "change, expected",
    [
        (lambda out: out + 0.5, "logits differ by up to 0.5000"),
        (lambda out: out * np.nan, "logits differ by up to nan"),
        (lambda out: -out, "pick the same next token at only"),
        (lambda out: out[:3], "only 0 position(s) compared"),
    ],
)
def test_export_check_catches_a_bad_export(maker, change, expected):
    ref = _logits()
    problems = maker.compare_logits("t.gguf", ref, change(ref.copy()), None).problems()
    assert any(expected in p for p in problems), problems


def test_export_check_catches_a_tokenizer_mismatch(maker):
    ref = _logits()
    problems = maker.compare_logits("t.gguf", ref, ref, False).problems()
    assert problems == ["t.gguf: llama.cpp's tokenizer and the training tokenizer give different ids"]


@pytest.mark.parametrize("good", [True, False])
def test_script_exit_status_follows_the_export_check(maker, monkeypatch, tmp_path, capsys, good):
    """`--verify-only` (and a full run) exits 1 when the export check fails; it used to exit 0."""
    ref = _logits()

    def fake_verify(path, prompt, log, tok=None):
        return maker.compare_logits(path.name, ref, ref if good else ref + 1.0, None)

    monkeypatch.setattr(maker, "verify", fake_verify)
    assert maker.main(["--verify-only", "--out", str(tmp_path)]) == (0 if good else 1)
    err = capsys.readouterr().err
    assert ("verification FAILED: tiny-target.gguf: torch and llama.cpp logits differ" in err) != good


def test_documented_recipe_is_the_scripts_default(maker):
    """docs/embedded-pair.md names the recipe of the shipped files; the script's defaults are that recipe."""
    args = maker.parser().parse_args([])
    assert (args.steps, args.distil_steps, args.batch) == (700, 100, 16)
    doc = (Path(__file__).resolve().parents[1] / "docs" / "embedded-pair.md").read_text(encoding="utf-8")
    assert "--steps 700 --distil-steps 100" in doc
    assert "python scripts/make_embedded_pair.py\n" in doc  # the command runs the defaults
