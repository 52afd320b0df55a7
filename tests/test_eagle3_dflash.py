"""EAGLE-3 and DFlash drafter files: given as the draft, they draft from the target's layer rows
(:mod:`localspec.llama.feature_heads`), as llama.cpp's ``draft-eagle3`` and ``draft-dflash`` do.

The targets are tiny test-llama-archs models, a transformer (``llama``) and a hybrid (``qwen35``: Gated
DeltaNet + attention); the drafters are written for them (tests/_feature_drafters.py): random (drafts
rejected) and fitted in closed form to the target (long runs accepted, some rejected). Beside losslessness,
the drafts themselves are compared with llama.cpp's own loop, round by round, on the same files.
"""

from __future__ import annotations

import re
import subprocess

import gguf
import pytest
from _arch_models import unrendered_tables, write_model
from _chi2 import second_token_pvalue
from _dummy_runs import PROMPT, argmax_run, first_position_rate
from _feature_drafters import dflash_drafter, eagle3_drafter
from _gguf_build import header_fields
from click.testing import CliRunner

import localspec
from localspec.cli import main
from localspec.errors import IncompatiblePairError, LocalspecError, UnusableModelError
from localspec.gguf.pairing import check_pair
from localspec.gguf.scan import find_drafts, inspect
from localspec.llama.feature_heads import DFlashHead, Eagle3Head

TARGETS = ("llama", "qwen35")
DRAFTERS = {"eagle3": ("random", "token"), "dflash": ("random", "fitted")}


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("feature-drafters")
    out = {}
    for arch in TARGETS:
        target = write_model(folder, arch, 1)
        out[arch] = target
        for kind in DRAFTERS["eagle3"]:
            out[arch, "eagle3", kind] = eagle3_drafter(folder, target, kind)
        for kind in DRAFTERS["dflash"]:
            out[arch, "dflash", kind] = dflash_drafter(folder, target, kind)
    return out


def _load(files, arch, drafter, kind, **kw):
    kw = {"n_max": 4, **kw}
    path = files[arch, drafter, kind]
    return localspec.load(files[arch], path, n_ctx=256, n_threads=2, suffix_store=False, **kw)


@pytest.mark.parametrize("arch", TARGETS)
@pytest.mark.parametrize(("drafter", "kind"), [(d, k) for d, kinds in DRAFTERS.items() for k in kinds])
def test_drafts_are_lossless_for_every_strategy_that_runs_the_drafter(files, arch, drafter, kind):
    got = {}
    with _load(files, arch, drafter, kind) as pipe:
        assert pipe.settings.strategy.name == "mtp"  # a drafter file drafts as the target's MTP layers do
        head = pipe.target.mtp
        assert isinstance(head, Eagle3Head if drafter == "eagle3" else DFlashHead)
        for strategy in ("mtp", "mtp+ngram", "mtp+suffix", "model"):  # "model" runs the drafter file too
            got[strategy], stats = argmax_run(pipe, strategy, adaptive=False, p_min=0.0)
            assert stats.drafted > 0 and stats.draft_name == files[arch, drafter, kind].name
            if strategy in ("mtp", "model"):
                assert set(stats.drafted_by_source) == {"mtp"}
        assert head.follow_passes > 0  # it follows every target pass
        base, _ = argmax_run(pipe, "none", baseline=True)
    for strategy, ids in got.items():
        assert ids == base, f"{arch} {drafter} {kind} {strategy}: not the target's own tokens"


@pytest.mark.parametrize("arch", TARGETS)
def test_fitted_drafters_are_accepted_in_long_runs_and_random_ones_rejected(files, arch):
    with _load(files, arch, "eagle3", "token") as pipe:
        _, stats = argmax_run(pipe, "mtp", adaptive=False, p_min=0.0)
    assert first_position_rate(stats) >= 0.5 and stats.accepted < stats.drafted
    assert stats.accepted_by_position[3] > 0  # whole drafts accepted
    with _load(files, arch, "dflash", "fitted", n_max=7) as pipe:
        _, stats = argmax_run(pipe, "mtp", adaptive=False, p_min=0.0)
        assert stats.draft_evals <= stats.rounds  # one drafter pass per round, whatever the draft's length
    assert first_position_rate(stats) >= 0.5 and stats.accepted < stats.drafted
    assert stats.accepted_by_position[5] > 0  # blocks of 6 and more accepted
    for drafter, kind in (("eagle3", "random"), ("dflash", "random")):
        with _load(files, arch, drafter, kind) as pipe:
            _, stats = argmax_run(pipe, "mtp", adaptive=False, p_min=0.0)
        assert first_position_rate(stats) < 0.2, drafter


def _llama_cpp_drafts(binary, target, drafter, spec, prompt: str, n: int) -> tuple[list[list[int]], str]:
    """llama.cpp's own loop (``llama-speculative-simple -v``) on the same files: each round's draft (the
    top candidate per position it logs), and its log."""
    cmd = [str(binary), "-m", str(target), "-md", str(drafter), "--spec-type", spec]
    cmd += ["--spec-draft-n-max", "4", "--spec-draft-p-min", "0", "--temp", "0", "-n", str(n), "-p", prompt]
    cmd += ["-t", "2", "-c", "256", "-v"]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    log = run.stdout + run.stderr
    assert run.returncode == 0, log[-2000:]
    rounds: list[list[int]] = []
    for pos, token in re.findall(r"draft candidate\s+0, pos\s+(\d+):\s+(\d+)", log):
        if int(pos) == 0:
            rounds.append([])
        rounds[-1].append(int(token))
    return rounds, log


@pytest.mark.parametrize("arch", TARGETS)
@pytest.mark.parametrize("drafter", ["eagle3", "dflash"])
def test_the_drafts_are_llama_cpps_own_round_by_round(files, arch, drafter):
    """The same random drafter proposes, every round, exactly the tokens it proposes in llama.cpp's loop:
    the rows it reads, their pairing with tokens and positions, and the block layout are llama.cpp's."""
    from _feature_drafters import speculative_program

    binary = speculative_program()
    path = files[arch, drafter, "random"]
    with _load(files, arch, drafter, "random") as pipe:
        head, got = pipe.target.mtp, []
        draft = head.draft

        def spy(last, pos0, n, choose):
            made = draft(last, pos0, n, choose)
            got.append(list(made.tokens))
            return made

        head.draft = spy
        ids = pipe.target.tokenize("hello world")
        list(pipe.stream_tokens(ids, max_tokens=24, strategy="mtp", adaptive=False, p_min=0.0))
    full = [g for g in got if len(g) == 4]  # the last rounds are cut to the tokens still wanted
    for _ in range(3):  # llama.cpp's log is written by a thread: an exit now and then loses lines of it
        rounds, _ = _llama_cpp_drafts(binary, files[arch], path, f"draft-{drafter}", "hello world", 24)
        n = min(len(full), len(rounds))
        if n >= 10 and full[:n] == rounds[:n]:
            return
    pytest.fail(f"llama.cpp drafted {rounds}, localspec {full}")


@pytest.mark.parametrize("arch", TARGETS)
def test_a_round_runs_the_passes_llama_cpp_runs_less_one(files, arch):
    """EAGLE-3: an encoder pass per target pass and one decoder pass per drafted token (the verify pass's
    kept pairs ride with the first); DFlash: an injection pass per target pass and one pass per draft."""
    for drafter, kind in (("eagle3", "token"), ("dflash", "fitted")):
        with _load(files, arch, drafter, kind) as pipe:
            head, passes = pipe.target.mtp, []
            process = head._process

            def spy(kind_, what, process=process, passes=passes):
                passes.append(what)
                return process(kind_, what)

            head._process = spy
            _, stats = argmax_run(pipe, "mtp", adaptive=False, p_min=0.0)
        drafts = passes.count("draft")
        assert drafts == stats.draft_evals and stats.rounds >= 5, drafter
        followed = len(passes) - drafts - passes.count("encoder" if drafter == "eagle3" else "injection")
        assert followed <= 1, f"{drafter}: {passes}"  # the prompt's pairs only


def test_sampling_keeps_the_target_distribution(files):
    with _load(files, "llama", "dflash", "fitted") as pipe:
        assert second_token_pvalue(pipe, PROMPT, {"strategy": "mtp", "adaptive": False}) > 0.001
    with _load(files, "llama", "eagle3", "token") as pipe:
        assert second_token_pvalue(pipe, PROMPT, {"strategy": "mtp", "adaptive": False}) > 0.001


def test_auto_weighs_the_drafter_and_stays_lossless(files):
    with _load(files, "llama", "dflash", "fitted", n_max=7) as pipe:
        assert pipe.settings.strategy.routed or pipe.settings.strategy.name == "mtp"
        ids, stats = argmax_run(pipe, "auto", p_min=0.0)
        base, _ = argmax_run(pipe, "none", baseline=True)
    assert ids == base


def test_the_memory_line_counts_the_drafter_and_its_cache(files):
    with _load(files, "llama", "eagle3", "token") as pipe:
        mem = pipe.memory
        assert mem.draft_weights_bytes > 0 and mem.draft_kv_bytes > 0
        assert "draft memory +" in mem.summary()


def test_pairing_says_what_the_file_is_and_what_it_fits(files, tmp_path):
    for drafter, kinds in DRAFTERS.items():
        path = files["llama", drafter, kinds[1]]
        assert check_pair(files["llama"], path).assistant
        with pytest.raises(UnusableModelError, match="--draft"):
            check_pair(path, None)  # as a model of its own
        info = inspect(path)
        assert not info.usable and "give it as the draft of its target" in (info.unusable_reason or "")
    ranked = find_drafts(files["llama"], [files["llama"].parent.parent])  # the folder the drafters are in
    assert ranked[0].fits and "drafter fitting this target" in ranked[0].why
    # a target of another width: refused before anything loads, saying why
    wide = write_model(tmp_path, "qwen3", 1)
    width = header_fields(gguf.GGUFReader(files["llama"]))["llama.embedding_length"][0]
    other = header_fields(gguf.GGUFReader(wide))["qwen3.embedding_length"][0]
    if other == width:  # the same width: the layers still have to fit
        assert check_pair(wide, files["llama", "eagle3", "token"]).assistant
    else:
        with pytest.raises(IncompatiblePairError, match="wide"):
            check_pair(wide, files["llama", "eagle3", "token"])


def test_a_target_that_does_not_hand_out_its_layer_rows_is_refused_before_loading(files, tmp_path):
    plain = write_model(tmp_path, "qwen2", 1)  # qwen2's graph keeps no layer rows in this llama.cpp
    with pytest.raises(IncompatiblePairError, match="layer rows") as info:
        check_pair(plain, files["llama", "dflash", "fitted"])
    assert "drafter published with this target" in (info.value.hint or "")


def test_pair_and_export_from_the_command_line(files):
    target, path = str(files["llama"]), str(files["llama", "dflash", "fitted"])
    res = CliRunner().invoke(main, ["scan", str(files["llama", "dflash", "fitted"].parent)])
    assert res.exit_code == 0, res.output
    assert "DFlash: a draft" in res.output and "EAGLE-3: a draft" in res.output
    res = CliRunner().invoke(main, ["pair", target, path])
    assert res.exit_code == 0, res.output
    assert "a DFlash drafter: it drafts as the target's MTP layers do" in res.output
    args = ["export", target, "--draft", path, "--n-max", "7", "--to", "llama-server"]
    res = CliRunner().invoke(main, args)
    assert res.exit_code == 0, res.output
    assert "--spec-type draft-dflash --spec-draft-n-max 7" in res.output
    assert f"--model-draft {path}" in res.output
    eagle = str(files["llama", "eagle3", "token"])
    res = CliRunner().invoke(main, ["export", target, "--draft", eagle, "--to", "llama-server"])
    assert res.exit_code == 0 and "--spec-type draft-eagle3" in res.output, res.output


def test_run_from_the_command_line(files):
    target, path = str(files["llama"]), str(files["llama", "eagle3", "token"])
    res = CliRunner().invoke(main, ["run", "-t", target, "-d", path, "-n", "16", "--threads", "2", "hello"])
    assert res.exit_code == 0, res.output
    assert "mtp" in res.output and "draft memory +" in res.output


def test_a_drafter_file_with_parallel_sequences_is_refused_with_what_to_do(files):
    with pytest.raises(LocalspecError, match="one") as info:
        _load(files, "llama", "dflash", "fitted", parallel=2)
    assert info.value.hint


def test_the_published_tables_are_their_result_files():
    """docs/eagle3-dflash.md's tables: what `bench_hybrid.py --from-json` prints from the committed runs."""
    assert unrendered_tables("eagle3-dflash.md", ("eagle3-wide.json", "dflash-wide.json")) == []
