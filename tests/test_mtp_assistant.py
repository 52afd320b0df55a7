"""MTP assistants: Gemma 4's drafter file, run as its target's MTP layers reading the target's KV cache
(llama.cpp's shared-memory ``draft-mtp``, :mod:`localspec.llama.mtp`).

The models are a tiny random gemma4 and two gemma4-assistant files for it, one random (drafts rejected), one
fitted to the target (drafts mostly accepted, some rejected): tests/_gemma4_model.py.
"""

from __future__ import annotations

import json

import pytest
from _arch_models import unrendered_tables
from _chi2 import second_token_pvalue
from _dummy_runs import PROMPT, argmax_run, first_position_rate
from _gemma4_model import gemma4_assistant, gemma4_target
from click.testing import CliRunner

import localspec
from localspec.cli import main
from localspec.errors import IncompatiblePairError, SettingsError, UnusableModelError
from localspec.gguf.pairing import check_pair
from localspec.gguf.scan import find_drafts, inspect
from localspec.hub.export import llama_server
from localspec.settings import DraftSettings


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("gemma4")
    target = gemma4_target(folder)
    assistants = {kind: gemma4_assistant(folder, target, kind) for kind in ("random", "token")}
    return {"target": target, **assistants}


def _load(files, kind, **kw):
    kw = {"n_max": 4, **kw}
    return localspec.load(files["target"], files[kind], n_ctx=256, n_threads=2, suffix_store=False, **kw)


@pytest.mark.parametrize("kind", ["random", "token"])
def test_assistant_drafts_are_lossless_for_every_mtp_strategy(files, kind):
    got = {}
    with _load(files, kind) as pipe:
        assert pipe.settings.strategy.name == "mtp"  # an assistant given as the draft drafts as MTP layers
        head = pipe.target.mtp
        assert head is not None and head.shared and not head.chained
        for strategy in ("mtp", "mtp+ngram", "mtp+suffix", "model"):  # "model" runs the assistant too
            got[strategy], stats = argmax_run(pipe, strategy, adaptive=False, p_min=0.0)
            assert stats.drafted > 0 and stats.draft_name == files[kind].name
            if strategy in ("mtp", "model"):
                assert stats.strategy.name == "mtp" and set(stats.drafted_by_source) == {"mtp"}
        assert head.follow_passes == 0  # it reads the target's own cache: nothing follows the passes
        base, _ = argmax_run(pipe, "none", baseline=True)
    for strategy, ids in got.items():
        assert ids == base, f"{kind} {strategy}: not the target's own tokens"


def test_a_fitted_assistant_is_accepted_and_a_random_one_rejected(files):
    with _load(files, "token") as pipe:
        _, stats = argmax_run(pipe, "mtp", adaptive=False, p_min=0.0)
    assert first_position_rate(stats) >= 0.5
    assert stats.accepted < stats.drafted  # rejections too: the assistant is wrong for 1 token in 4
    assert max(i for i, a in enumerate(stats.accepted_by_position) if a) == 3  # whole drafts accepted
    with _load(files, "random") as pipe:
        _, stats = argmax_run(pipe, "mtp", adaptive=False, p_min=0.0)
    assert first_position_rate(stats) < 0.2


def test_every_draft_step_runs_at_the_pending_tokens_position(files):
    """As the assistant was trained (and llama.cpp runs it): each step at the pending token's position, fed
    the token drafted before and the row that step made, reading the target's cache of the positions
    before."""
    with _load(files, "token") as pipe:
        head = pipe.target.mtp
        passes: list[tuple[int, int, int]] = []  # (tokens, position, the draft's pending position)
        run, draft = head._run, head.draft
        pending = [-1]

        def spy_draft(last, pos0, n, choose):
            pending[0] = pos0
            return draft(last, pos0, n, choose)

        def spy_run(tokens, pos0, rows, *, output):
            passes.append((len(tokens), pos0, pending[0]))
            run(tokens, pos0, rows, output=output)

        head.draft, head._run = spy_draft, spy_run
        _, stats = argmax_run(pipe, "mtp", adaptive=False, p_min=0.0)
    assert len(passes) == stats.draft_evals > stats.rounds  # drafts of several steps, and no other passes
    assert all(n == 1 and pos == at for n, pos, at in passes), "every step at the pending position"


def test_sampling_with_an_assistant_keeps_the_target_distribution(files):
    with _load(files, "token") as pipe:
        assert second_token_pvalue(pipe, PROMPT, {"strategy": "mtp", "adaptive": False}) > 0.001


def test_the_memory_line_counts_the_assistant_and_no_cache_of_its_own(files):
    with _load(files, "token") as pipe:
        mem = pipe.memory
        assert 0 < mem.draft_weights_bytes <= files["token"].stat().st_size
        assert mem.draft_kv_bytes == 0  # it reads the target's KV cache
        assert mem.target_weights_bytes > mem.draft_weights_bytes
        assert "draft memory +" in mem.summary()


def test_pairing_says_what_an_assistant_is_and_what_it_fits(files, tmp_path):
    from _arch_models import write_model

    assert check_pair(files["target"], files["token"]).assistant
    assert not check_pair(files["target"], None).assistant
    with pytest.raises(UnusableModelError, match="MTP assistant") as exc:
        check_pair(files["token"], None)  # as a target
    assert "--draft" in str(exc.value)
    other = write_model(tmp_path, "qwen35", 1)  # the same dummy vocabulary, another architecture
    with pytest.raises(IncompatiblePairError, match="an MTP assistant for gemma4 targets, and this target"):
        check_pair(other, files["token"])
    wide = gemma4_target(tmp_path, n_ff=256, n_layer=5)  # another gemma4: the assistant's width still fits
    assert check_pair(wide, files["token"]).assistant
    info = inspect(files["token"])
    assert not info.usable and "give it as the draft of its target" in (info.unusable_reason or "")
    ranked = find_drafts(files["target"], [files["target"].parent])
    assert ranked[0].fits and ranked[0].model.path in {str(files["random"]), str(files["token"])}
    assert "an MTP assistant fitting this target" in ranked[0].why
    assert not [r for r in find_drafts(other, [files["target"].parent]) if r.fits and "assistant" in r.why]


def test_an_assistant_with_the_target_on_rpc_servers_is_refused_before_anything_loads(files):
    with pytest.raises(SettingsError, match="MTP assistant, which reads the target's KV cache") as exc:
        _load(files, "token", rpc="127.0.0.1:9")  # nothing listens there: refused before connecting
    assert "--rpc" in (exc.value.hint or "")


def test_auto_pairing_finds_the_assistant_and_auto_routes_to_it(files):
    with localspec.load(files["target"], n_ctx=256, n_threads=2, suffix_store=False, strategy="auto") as pipe:
        assert pipe.info.assistant and pipe.target.mtp is not None and pipe.draft is None
        out = list(pipe.stream_tokens(PROMPT, max_tokens=16))
        assert pipe.route is not None and pipe.route.strategy.mtp
        assert out[-1].stats.draft_name == pipe.info.draft_path.name


def test_export_gives_llama_server_the_assistant_file(files):
    out = llama_server(
        DraftSettings(strategy="model", n_max=3), files["target"], files["token"], n_ctx=256, threads=2
    )
    spec = " ".join(out.speculative)
    assert "--spec-type draft-mtp --spec-draft-n-max 3" in spec and f"--model-draft {files['token']}" in spec
    assert any("MTP assistant" in note for note in out.notes)
    args = ["export", str(files["target"]), "-d", str(files["token"]), "--to", "vllm"]
    res = CliRunner().invoke(main, args)
    assert res.exit_code == 0, res.output
    assert '"method":"mtp"' in res.output


def test_the_published_assistant_tables_are_their_result_files():
    """docs/mtp.md's assistant tables are what `bench_hybrid.py --from-json` prints from the committed
    runs."""
    assert unrendered_tables("mtp.md", ("mtp-assistant.json", "mtp-assistant-wide.json")) == []


def test_run_and_pair_with_an_assistant_from_the_command_line(files):
    target, assistant = str(files["target"]), str(files["token"])
    args = ["run", "-t", target, "-d", assistant, "-n", "16", "--threads", "2", "hello"]
    res = CliRunner().invoke(main, args)
    assert res.exit_code == 0, res.output
    assert "mtp" in res.output and "draft memory +" in res.output
    res = CliRunner().invoke(main, ["pair", target, assistant, "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    assert out["draft_is_mtp_assistant"] and out["draft_usable"] and out["verdict"] == "identical"
    res = CliRunner().invoke(main, ["pair", target, assistant])
    assert res.exit_code == 0 and "an MTP assistant: it drafts as the target's MTP layers" in res.output
    assert "2 MTP layers reading a gemma4 target's memory" in res.output and "dropped" not in res.output
    res = CliRunner().invoke(main, ["pair", assistant, target])  # swapped: it says the assistant cannot
    assert "cannot run as a target: an MTP assistant" in res.output
