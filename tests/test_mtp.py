"""MTP drafting: the target's own NextN layers propose, the target verifies (:mod:`localspec.llama.mtp`).

The models are tiny qwen35 files (a hybrid: Gated DeltaNet + attention) with an MTP block whose head is random
(drafts rejected), fitted to the target (drafts mostly accepted, some rejected) or reading the target's hidden
row only (accepted only when the driver hands it the right row): tests/_mtp_model.py.
"""

from __future__ import annotations

import pytest
from _arch_models import unrendered_tables, write_model
from _chi2 import second_token_pvalue
from _dummy_runs import PROMPT, argmax_run, first_position_rate
from _mtp_model import mtp_model

import localspec
from localspec.errors import GGUFError, LocalspecError


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("mtp")
    return {kind: mtp_model(folder, kind) for kind in ("random", "token", "hidden")}


def _load(path, strategy="mtp", **kw):
    kw = {"n_max": 4, **kw}
    return localspec.load(path, "none", strategy=strategy, n_ctx=256, n_threads=2, suffix_store=False, **kw)


@pytest.mark.parametrize("kind", ["random", "token"])
def test_mtp_drafts_are_lossless_for_every_mtp_strategy(files, kind):
    got = {}
    with _load(files[kind]) as pipe:
        for strategy in ("mtp", "mtp+ngram", "mtp+suffix"):
            got[strategy], stats = argmax_run(pipe, strategy, adaptive=False, p_min=0.0)
            assert stats.drafted > 0
            if strategy == "mtp":
                assert set(stats.drafted_by_source) == {"mtp"}
        assert pipe.target.rollback.resets == 0  # every rejected draft went back through a snapshot or copy
        base, _ = argmax_run(pipe, "none", baseline=True)
    for strategy, ids in got.items():
        assert ids == base, f"{kind} {strategy}: not the target's own tokens"


def test_a_fitted_head_is_accepted_on_its_domain_and_also_rejected(files):
    with _load(files["token"]) as pipe:
        _, stats = argmax_run(pipe, "mtp", adaptive=False, p_min=0.0)
    assert first_position_rate(stats) >= 0.5
    assert stats.accepted < stats.drafted  # rejections too: the head is wrong for 1 token in 4
    assert max(i for i, a in enumerate(stats.accepted_by_position) if a) == 3  # whole drafts accepted


def test_a_random_head_is_rejected(files):
    with _load(files["random"]) as pipe:
        _, stats = argmax_run(pipe, "mtp", adaptive=False, p_min=0.0)
    assert first_position_rate(stats) < 0.2


def test_the_head_reads_the_target_hidden_row_of_the_position_before(files):
    """A head that reads only the hidden row answers right only when the driver pairs the pending token with
    the target's row of the position before it (a zero, stale or shifted row gives chance level: 1 in ~80)."""
    with _load(files["hidden"]) as pipe:
        _, stats = argmax_run(pipe, "mtp", adaptive=False, p_min=0.0)
    assert first_position_rate(stats) >= 0.25


def test_a_round_runs_one_mtp_pass_per_drafted_token(files):
    """The part of a verify pass the target kept is evaluated in the next draft's first pass, with the pending
    token: no following pass of its own (llama.cpp runs one), and none for rejected drafts."""
    with _load(files["token"]) as pipe:
        head, passes = pipe.target.mtp, []
        run = head._run

        def spy(tokens, pos0, rows, *, output):
            passes.append(len(tokens))
            return run(tokens, pos0, rows, output=output)

        head._run = spy
        ids, stats = argmax_run(pipe, "mtp", adaptive=False, p_min=0.0)
        base, _ = argmax_run(pipe, "none", baseline=True)
    assert ids == base and stats.rounds >= 5
    assert len(passes) <= stats.draft_evals + 1  # the prompt's pass, then only the drafts' own
    assert max(passes[1:]) > 1  # first passes carry the kept verify tokens


def test_other_strategies_on_an_mtp_pipeline_and_back(files):
    """Rounds without MTP do not feed the head (the baseline pays nothing for it); when MTP drafts again, the
    head evaluates what it missed and is as good as before."""
    with _load(files["token"]) as pipe:
        head = pipe.target.mtp
        _, first = argmax_run(pipe, "mtp", adaptive=False, p_min=0.0)
        followed = head.follow_passes
        base, _ = argmax_run(pipe, "none", baseline=True)
        ids, _ = argmax_run(pipe, "ngram", adaptive=False)
        assert head.follow_passes == followed and ids == base
        ids, again = argmax_run(pipe, "mtp", adaptive=False, p_min=0.0)
        assert ids == base
        assert first_position_rate(again) >= 0.5


def test_sampling_with_mtp_keeps_the_target_distribution(files):
    with _load(files["token"]) as pipe:
        assert second_token_pvalue(pipe, PROMPT, {"strategy": "mtp", "adaptive": False}) > 0.001


def test_the_memory_line_shows_the_mtp_layers_and_their_cache(files):
    with _load(files["token"]) as pipe:
        mem = pipe.memory
        assert mem.draft_weights_bytes > 0 and mem.draft_kv_bytes > 0
        assert mem.target_weights_bytes > mem.draft_weights_bytes
        assert "draft memory +" in mem.summary()


def test_a_file_without_mtp_layers_is_refused_with_what_to_do(tmp_path):
    plain = write_model(tmp_path, "qwen35", 1)
    with pytest.raises(GGUFError, match="no MTP layers") as info:
        _load(plain)
    assert "draft with a small model" in (info.value.hint or "")


def test_mtp_on_a_pipeline_loaded_without_it_says_how(files):
    with _load(files["token"], strategy="ngram") as pipe:
        assert pipe.target.mtp is None
        with pytest.raises(LocalspecError, match="MTP layers") as info:
            list(pipe.stream_tokens(PROMPT, max_tokens=4, strategy="mtp"))
    assert "strategy='mtp'" in (info.value.hint or "")


def test_export_maps_mtp_to_llama_server_and_vllm(files):
    import json

    from click.testing import CliRunner

    from localspec.cli import main

    path = str(files["token"])
    args = ["export", path, "--strategy", "mtp", "--n-max", "3", "--to", "llama-server"]
    res = CliRunner().invoke(main, args)
    assert res.exit_code == 0, res.output
    assert "--spec-type draft-mtp --spec-draft-n-max 3" in res.output and "--model-draft" not in res.output
    res = CliRunner().invoke(main, ["export", path, "--strategy", "mtp+suffix", "--to", "vllm", "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    assert out["speculative"] == {"method": "mtp", "num_speculative_tokens": 4}
    assert any("the MTP layers are kept" in note for note in out["notes"])


def test_run_with_mtp_from_the_command_line(files):
    from click.testing import CliRunner

    from localspec.cli import main

    args = ["run", "-t", str(files["token"]), "--strategy", "mtp", "-n", "16", "--threads", "2", "hello"]
    res = CliRunner().invoke(main, args)
    assert res.exit_code == 0, res.output
    assert "mtp" in res.output and "draft memory +" in res.output


def test_the_ui_loads_the_mtp_layers_when_an_mtp_strategy_is_chosen(files):
    from localspec.ui.session import PairSpec, PipelineHolder

    holder = PipelineHolder(localspec.load)
    try:
        spec = PairSpec(target=str(files["token"]), draft="none", n_ctx=256, n_threads=2, mtp=True)
        pipe = holder.get(spec)
        assert pipe.target.mtp is not None
        ids = [r.token for r in pipe.stream_tokens(PROMPT, max_tokens=8, strategy="mtp")]
        assert len(ids) == 8
        plain = holder.get(PairSpec(target=str(files["token"]), draft="none", n_ctx=256, n_threads=2))
        assert plain is not pipe and plain.target.mtp is None  # another choice, another load
    finally:
        holder.close()


def test_drafts_longer_than_the_snapshots_go_back_through_checkpoints(files):
    """Loaded for 2-token drafts (two state snapshots), drafting 6: a rejection past the snapshots restores
    a copy of the recurrent state and the kept tokens are owed; the head follows the replay too."""
    with _load(files["token"], n_max=2) as pipe:  # the pipeline's own n_max sizes the snapshots
        model = pipe.target
        assert model.n_rs_seq == 2
        ids, stats = argmax_run(pipe, "mtp", adaptive=False, p_min=0.0, n_max=6)
        assert model.rollback.saves > 0 and model.rollback.restores > 0 and stats.replayed_tokens > 0
        assert first_position_rate(stats) >= 0.5
        base, _ = argmax_run(pipe, "none", baseline=True)
    assert ids == base


def test_the_published_mtp_table_is_its_result_file():
    """docs/mtp.md's tables are what `bench_hybrid.py --from-json` prints from the committed MTP runs."""
    # the tiny models, and the same target widened to a real model's cost
    assert unrendered_tables("mtp.md", ("mtp.json", "mtp-wide.json")) == []


def test_scan_says_which_files_have_mtp_layers(files, tmp_path):
    from localspec.gguf import scan

    info = scan.inspect(files["token"])
    assert info.mtp_present == 1 and info.mtp_note == "1 MTP layer(s): --strategy mtp drafts with them"
    plain = scan.inspect(write_model(tmp_path, "qwen35", 1))
    assert not plain.mtp_present and plain.mtp_note is None


def test_auto_runs_the_mtp_layers_of_a_file_that_has_them_and_then_as_measured(files):
    """``auto`` with no draft model loads the file's MTP layers: the first request runs them (adaptive, with
    lookups) while their controller measures; later requests go as it measured. Lossless either way."""
    with _load(files["token"], strategy="auto", n_max=None) as pipe:
        assert pipe.target.mtp is not None
        first, stats = argmax_run(pipe, "auto")
        assert stats.route is not None and stats.route.strategy == stats.strategy
        assert stats.strategy.name == "mtp+suffix"
        assert "not measured yet" in stats.route.reason
        again, stats = argmax_run(pipe, "auto")
        assert stats.route is not None and "drafted tokens" in stats.route.reason  # what it measured, on what
        base, _ = argmax_run(pipe, "none", baseline=True)
    assert first == again == base


def test_chained_heads_draft_one_head_per_step(tmp_path):
    """A file with two MTP layers (mimo2) drafts as llama.cpp's chained heads: step ``i`` with head ``i``
    (head 0 answers token + 1, head 1 token + 5), at most one token per head; lossless in a run."""
    import numpy as np
    from _mtp_model import CHAIN_SHIFTS, chained_mtp_model

    from localspec.llama.runtime import Model

    path = chained_mtp_model(tmp_path)
    model = Model(path, n_ctx=128, n_threads=2, mtp=True)
    try:
        assert model.mtp is not None and model.mtp.chained and model.mtp.n_layers == 2
        model.decode_logits(PROMPT)
        last = 40
        draft = model.mtp.draft(last, len(PROMPT), 4, lambda i, row: (int(np.argmax(row)), True))
        first = last + CHAIN_SHIFTS[0]
        assert draft.tokens == [first, first + CHAIN_SHIFTS[1]]  # with the first head only: first + 1
        assert draft.evals == 2
        from localspec.gguf import scan

        assert (
            scan.inspect(path).mtp_note == "2 MTP layers: --strategy mtp drafts with them, one per draft step"
        )
    finally:
        model.close()
    with _load(path) as pipe:
        ids, stats = argmax_run(pipe, "mtp", adaptive=False, p_min=0.0)
        assert stats.drafted > 0 and max(i for i, d in enumerate(stats.drafted_by_position) if d) == 1
        base, _ = argmax_run(pipe, "none", baseline=True)
    assert ids == base


def test_auto_with_a_draft_model_weighs_the_mtp_layers_too(files, tmp_path):
    """``auto`` with a draft model on a file with MTP layers loads both, runs each until measured, then
    weighs them by speed; the memory line counts both as the draft's; lossless throughout."""
    draft = write_model(tmp_path, "qwen35", 2)
    with localspec.load(
        files["token"], draft, strategy="auto", n_ctx=256, n_threads=2, suffix_store=False
    ) as pipe:
        assert pipe.target.mtp is not None and pipe.draft is not None
        runs = [argmax_run(pipe, "auto") for _ in range(3)]
        base, _ = argmax_run(pipe, "none", baseline=True)
    assert all(ids == base for ids, _ in runs)
    chosen = [stats.strategy.name for _, stats in runs]
    assert "mtp+suffix" in chosen[:2], chosen  # the MTP layers were tried before the choice settled
    for _, stats in runs:
        assert stats.route is not None and (
            "the draft model" in stats.route.reason or "MTP" in stats.route.reason
        )
    memory = runs[0][1].memory
    assert memory.draft_weights_bytes > _weights_of(draft)


def _weights_of(path):
    from localspec.llama.runtime import Model

    m = Model(path, n_ctx=64, n_threads=1)
    try:
        return m.weights_bytes
    finally:
        m.close()
