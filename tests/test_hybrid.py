"""Recurrent and hybrid targets and drafts (Qwen3.5, Qwen3-Next, Mamba-2, LFM2, Nemotron-H, Granite-4 H...):
drafts taken back through state snapshots or checkpoints, lossless for every strategy.

The models are tiny random ones written by llama.cpp's own test-llama-archs (tests/_arch_models.py): a second
seed is a draft of the same vocabulary whose tokens are mostly rejected, the target as its own draft has them
mostly accepted, and a prompt that repeats itself gives n-gram and suffix lookups their long copies.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
from _arch_models import (
    RECURRENT_FIXTURES,
    archs_program,
    unrendered_tables,
    vendored_arch_source,
    write_model,
)
from _chi2 import second_token_pvalue
from _dummy_runs import MAX_TOKENS, PROMPT

import localspec
from localspec.gguf import vocab
from localspec.llama.runtime import Model


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    folder = tmp_path_factory.mktemp("archs")
    return {arch: (write_model(folder, arch, 1), write_model(folder, arch, 2)) for arch in RECURRENT_FIXTURES}


def _switch_cases(source: str, function: str) -> set[str]:
    body = source[source.index(f"bool {function}(const llm_arch & arch)") :]
    body = body[: body.index("default:")]
    return set(re.findall(r"case (LLM_ARCH_\w+):", body))


def test_recurrent_lists_match_vendored_llama_cpp():
    """The header-level lists that decide before loading are llama.cpp's own, so they never fall behind."""
    source = vendored_arch_source()
    names = dict(re.findall(r'\{\s*(LLM_ARCH_\w+),\s*"([^"]+)"\s*\}', source))
    for function, ours in (
        ("llm_arch_is_recurrent", vocab.RECURRENT_ARCHS),
        ("llm_arch_is_hybrid", vocab.HYBRID_ARCHS),
        ("llm_arch_supports_rs_rollback", vocab.SNAPSHOT_ARCHS),
    ):
        theirs = {names[case] for case in _switch_cases(source, function)}
        assert theirs == set(ours), f"{function}: llama.cpp has {sorted(theirs ^ set(ours))} different"
    # the drafter files' architectures (and an assistant's target's) are llama.cpp's names
    assistants = vocab.MTP_ASSISTANT_ARCHS
    for arch in (*vocab.DRAFTER_FILES, *assistants.values()):
        assert f'"{arch}"' in source, arch
    # the targets that hand out their layers' rows (EAGLE-3 and DFlash read them): the models whose graph
    # sets them, by the architectures whose model class it is
    src = archs_program().parents[2] / "src" / "src"  # the vendored source, beside the build folder
    classes = set()
    for model in (src / "models").glob("*.cpp"):
        text = model.read_text(encoding="utf-8")
        if "t_layer_inp[" in text:
            classes |= set(re.findall(r"(llama_model_\w+)::", text))
    made = (src / "llama-model.cpp").read_text(encoding="utf-8")
    built = re.findall(r"((?:case LLM_ARCH_\w+:\s*)+)return new (llama_model_\w+)", made)
    rows = {names[a] for cases, cls in built if cls in classes for a in re.findall(r"LLM_ARCH_\w+", cases)}
    assert rows == set(vocab.LAYER_ROWS_ARCHS), (
        f"llama.cpp has {sorted(rows ^ vocab.LAYER_ROWS_ARCHS)} different"
    )


def _run(pipe, strategy, **kw):
    pipe.trace = trace = []
    try:
        out = list(pipe.stream_tokens(PROMPT, max_tokens=MAX_TOKENS, strategy=strategy, **kw))
    finally:
        pipe.trace = None
    return [r.token for r in out], trace, out[-1].stats


def _assert_argmax(trace, what):
    assert trace and all(tok == argmax for tok, _, argmax, _ in trace), (
        f"{what}: every emitted token must be the verifying pass's argmax"
    )


@pytest.mark.parametrize("arch", RECURRENT_FIXTURES)
def test_hybrid_target_is_lossless_for_every_strategy(models, arch):
    target, other = models[arch]
    with localspec.load(target, other, n_ctx=256, n_threads=2, n_max=4, suffix_store=False) as pipe:
        model = pipe.target
        assert model.memory_kind in ("hybrid", "recurrent"), arch
        assert (model.n_rs_seq > 0) == (arch in vocab.SNAPSHOT_ARCHS), arch
        base, base_trace, _ = _run(pipe, "none", baseline=True)
        _assert_argmax(base_trace, f"{arch} alone")
        for strategy in ("model", "ngram", "suffix", "model+ngram", "model+suffix"):
            ids, trace, stats = _run(pipe, strategy, adaptive=False, p_min=0.0)
            _assert_argmax(trace, f"{arch} {strategy}")
            assert ids == base, f"{arch} {strategy}: not the target's own tokens"
            assert stats.drafted > 0, f"{arch} {strategy}: nothing drafted, nothing rolled back"
        assert model.rollback.resets == 0, f"{arch}: a rollback fell back to evaluating everything again"


@pytest.mark.parametrize("arch", ["qwen35", "qwen3next", "mamba2"])
def test_target_as_its_own_draft_has_long_accepts(models, arch):
    target, _ = models[arch]
    with localspec.load(target, target, n_ctx=256, n_threads=2, n_max=4, suffix_store=False) as pipe:
        base, _, _ = _run(pipe, "none", baseline=True)
        ids, trace, stats = _run(pipe, "model", adaptive=False, p_min=0.0)
        _assert_argmax(trace, arch)
        assert ids == base
        assert stats.accepted >= 0.8 * stats.drafted > 0


def test_a_hybrid_draft_for_a_transformer_target_and_the_reverse(models, tmp_path):
    from _arch_models import write_model as write

    qwen3 = write(tmp_path, "qwen3", 1)  # a transformer with the same dummy vocabulary
    hybrid, _ = models["qwen35"]
    for target, draft in ((qwen3, hybrid), (hybrid, qwen3)):
        with localspec.load(target, draft, n_ctx=256, n_threads=2, n_max=4, suffix_store=False) as pipe:
            base, _, _ = _run(pipe, "none", baseline=True)
            ids, trace, stats = _run(pipe, "model", adaptive=False, p_min=0.0)
            _assert_argmax(trace, f"{target.name} with {draft.name}")
            assert ids == base and stats.drafted > 0


def test_checkpoint_rollback_and_its_cost_are_counted(models):
    """An architecture without snapshots (Qwen3-Next) copies its state out before each verify pass and back
    after a rejection; the tokens kept are owed and evaluated in front of the next pass."""
    target, other = models["qwen3next"]
    with localspec.load(target, other, n_ctx=256, n_threads=2, n_max=4, suffix_store=False) as pipe:
        model = pipe.target
        assert model.n_rs_seq == 0 and model.seq0.state_bytes() > 0
        ids, _, stats = _run(pipe, "model", adaptive=False, p_min=0.0)
        assert model.rollback.saves > 0 and model.rollback.restores > 0
        assert stats.rollback_seconds > 0 and stats.replayed_tokens > 0
        # as llama.cpp does, the pass that evaluates the owed tokens drafts nothing: with most drafts
        # rejected, drafting rounds and replay rounds alternate (a drafting round takes 4 tokens)
        drafting_rounds = stats.drafted / 4
        assert stats.drafted % 4 == 0 and drafting_rounds <= stats.rounds / 2 + 1, stats.as_dict()


def test_snapshots_take_drafts_back_without_a_copy(models):
    target, other = models["qwen35"]
    with localspec.load(target, other, n_ctx=256, n_threads=2, n_max=4, suffix_store=False) as pipe:
        model = pipe.target
        assert model.n_rs_seq == 4
        _run(pipe, "model", adaptive=False, p_min=0.0)
        # the one copy is the prompt's (a later request on it comes back there); no round copied anything
        assert model.rollback.saves == 1 and model.rollback.restores == 0 and model.rollback.resets == 0


def test_truncate_past_every_checkpoint_starts_over_and_stays_right(models):
    target, _ = models["qwen3next"]
    m = Model(target, n_ctx=256, n_threads=2)
    try:
        row = m.decode_logits(PROMPT, outputs=1)[0].copy()
        m.checkpoint(ahead=4)
        m.decode_logits([3, 4, 5], outputs=3)
        m.truncate(5)  # before the checkpoint: nothing to restore, the sequence starts over
        assert m.tokens == PROMPT[:5] and m.owed == 5 and m.rollback.resets == 1
        again = m.decode_logits(PROMPT[5:], outputs=1)[0]
        assert m.owed == 0 and m.tokens == PROMPT
        assert int(np.argmax(again)) == int(np.argmax(row))
    finally:
        m.close()


def test_sampling_from_a_hybrid_target_keeps_its_distribution(models):
    """The second sampled token after a prompt (the first may be an accepted draft, the second comes after
    a rollback as often as not), with drafting and without: the same distribution."""
    target, other = models["qwen35"]
    with localspec.load(target, other, n_ctx=256, n_threads=2, n_max=3, suffix_store=False) as pipe:
        assert second_token_pvalue(pipe, PROMPT, {"strategy": "model", "adaptive": False}) > 0.001


def test_scan_pair_and_the_pair_card_say_how_drafts_roll_back(models):
    from click.testing import CliRunner
    from localspec.ui import pairs

    from localspec.cli import main
    from localspec.gguf import scan

    target, other = models["qwen3next"]
    res = CliRunner().invoke(main, ["scan", "--no-cache", str(target)], catch_exceptions=False)
    assert res.exit_code == 0 and "ok, hybrid" in res.output
    res = CliRunner().invoke(main, ["pair", str(target), str(other)], catch_exceptions=False)
    assert "hybrid (recurrent layers): drafts roll back through state checkpoints" in res.output
    view = pairs.ScanView({str(other): scan.inspect(other)})
    _, card = pairs.draft_options(scan.inspect(target), view)
    assert card.startswith("**Target:** hybrid (recurrent layers): drafts roll back through state checkpoint")


def test_auto_measures_what_a_rollback_costs(models):
    """``auto``'s measured costs carry the state copies of a checkpoint target (none within snapshots), and
    its model speed counts them; the request stays the target's own tokens."""
    target, other = models["qwen3next"]
    with localspec.load(target, other, n_ctx=256, n_threads=2, n_max=4, suffix_store=False) as pipe:
        costs = pipe.machine_costs()
        rollback = costs.details["rollback"]
        assert rollback["snapshots"] == 0 and rollback["save"] > 0 and rollback["restore"] > 0
        assert costs.rollback_passes(4, 1.0) == pytest.approx(rollback["save"])  # nothing to take back
        # a round that may be rejected pays a restore on top of the save (the ordering across acceptances
        # depends on the measured widths, so tests/test_speed.py checks it on a fixed curve)
        assert (
            costs.rollback_passes(4, 0.3) > rollback["save"]
            and costs.rollback_passes(4, 0.9) > rollback["save"]
        )
        base, _, _ = _run(pipe, "none", baseline=True)
        ids, trace, _ = _run(pipe, "auto")
        _assert_argmax(trace, "qwen3next auto")
        assert ids == base
    snapshots, _ = models["qwen35"]
    with localspec.load(snapshots, other, n_ctx=256, n_threads=2, n_max=4, suffix_store=False) as pipe:
        assert pipe.machine_costs().rollback_passes(4, 0.3) == 0.0  # four snapshots cover a 4-token draft


def test_the_memory_line_counts_recurrent_states_and_their_snapshots(models):
    """A hybrid's context memory is llama.cpp's own (KV cache + recurrent states), snapshots included,
    not the formula that counts every layer as attention."""
    from localspec.llama.logs import cache_bytes_logged

    assert cache_bytes_logged(["llama_kv_cache:        CPU KV buffer size =    56.00 MiB"]) == 56 * 2**20
    both = ["x: CPU KV buffer size = 1.50 MiB", "y: CPU RS buffer size = 0.50 MiB"]
    assert cache_bytes_logged(both) == 2**21
    assert cache_bytes_logged(["no buffers here"]) is None
    target, _ = models["qwen35"]
    sizes = []
    for depth in (0, 4):
        m = Model(target, n_ctx=256, n_threads=2, rollback_depth=depth)
        try:
            sizes.append(m.kv_bytes())
        finally:
            m.close()
    assert 0 < sizes[0] < sizes[1]  # four snapshots of the recurrent state cost memory too


def test_the_published_rollback_table_is_its_result_file():
    """docs/hybrid-models.md's tables are what `bench_hybrid.py --from-json` prints from its runs."""
    # the tiny models, and the same target widened to a real model's cost
    assert unrendered_tables("hybrid-models.md", ("hybrid-rollback.json", "hybrid-wide.json")) == []


def test_a_widened_target_computes_what_the_narrow_one_does(tmp_path):
    """scripts/bench_hybrid.py --wide: wider FFNs and copied blocks whose residual writes are zero cost
    more per token and leave every logit as it was (a narrow twin is a draft whose tokens are all right)."""
    from _arch_models import widen

    for arch in ("qwen35", "granitehybrid"):
        narrow = write_model(tmp_path, arch, 1)
        wide = widen(narrow, tmp_path / f"{arch}-wide.gguf", n_ff=1024, copies=1)
        rows = []
        for path in (narrow, wide):
            m = Model(path, n_ctx=128, n_threads=2)
            try:
                rows.append(m.decode_logits(list(range(3, 40)), outputs=37).copy())
            finally:
                m.close()
        assert wide.stat().st_size > 2 * narrow.stat().st_size
        np.testing.assert_allclose(rows[0], rows[1], atol=1e-5)
