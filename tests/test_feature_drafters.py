"""EAGLE-3 and DFlash drafter files, run by llama.cpp's own speculative loop (``llama-speculative-simple``).

The drafters are tiny files for test-llama-archs targets (a llama and the hybrid qwen35), random (drafts
rejected) or fitted in closed form to the target's greedy next-token map (drafts mostly accepted, some
rejected): tests/_feature_drafters.py. These tests check the files themselves against llama.cpp, the
reference the drafting code is built against: they load, and llama.cpp's loop accepts what their design says.
"""

from __future__ import annotations

import ctypes

import llama_cpp
import pytest
from _arch_models import write_model
from _feature_drafters import SpecRun, dflash_drafter, eagle3_drafter, llama_cpp_run

from localspec.llama.logs import quiet_stderr

TARGETS = ("llama", "qwen35")
#: Each drafter: its llama.cpp speculative type, how it is written, and how many tokens a round drafts.
DRAFTERS = {
    "eagle3-random": ("draft-eagle3", lambda folder, target: eagle3_drafter(folder, target, "random"), 4),
    "eagle3-token": ("draft-eagle3", lambda folder, target: eagle3_drafter(folder, target, "token"), 4),
    "eagle3-hidden": ("draft-eagle3", lambda folder, target: eagle3_drafter(folder, target, "hidden"), 4),
    "dflash-random": ("draft-dflash", lambda folder, target: dflash_drafter(folder, target, "random"), 7),
    "dflash-fitted": ("draft-dflash", lambda folder, target: dflash_drafter(folder, target, "fitted"), 7),
}


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return tmp_path_factory.mktemp("feature-drafters")


@pytest.fixture(scope="module")
def drafter(folder):
    """``drafter(target_arch, name)``: the target and drafter files (written once in the module)."""

    def get(arch: str, name: str):
        target = write_model(folder, arch, 1)
        return target, DRAFTERS[name][1](folder, target)

    return get


@pytest.fixture(scope="module")
def run(drafter):
    """``run(target_arch, name)``: llama.cpp's run of that pair (once in the module)."""
    done: dict[tuple[str, str], SpecRun] = {}

    def get(arch: str, name: str) -> SpecRun:
        if (arch, name) not in done:
            spec_type, _, draft_max = DRAFTERS[name]
            done[arch, name] = llama_cpp_run(*drafter(arch, name), spec_type, draft_max=draft_max)
        return done[arch, name]

    return get


@pytest.mark.parametrize("name", list(DRAFTERS))
def test_the_files_load_in_llama_cpp(drafter, name):
    _, path = drafter("llama", name)
    arch = name.split("-")[0]
    params = llama_cpp.llama_model_default_params()
    with quiet_stderr():
        model = llama_cpp.llama_model_load_from_file(str(path).encode(), params)
    assert model, f"llama.cpp refused {path.name}"
    try:
        buf = ctypes.create_string_buffer(64)
        llama_cpp.llama_model_meta_val_str(model, b"general.architecture", buf, len(buf))
        assert buf.value.decode() == arch
        assert llama_cpp.llama_model_n_embd(model) == 256  # the target's width
        assert llama_cpp.llama_model_n_layer(model) == 1
    finally:
        llama_cpp.llama_model_free(model)


@pytest.mark.parametrize("arch", TARGETS)
@pytest.mark.parametrize("name", ["eagle3-random", "dflash-random"])
def test_random_drafters_are_rejected(run, arch, name):
    got = run(arch, name)
    assert got.drafted > 0
    assert got.rate < 0.05, got


@pytest.mark.parametrize("arch", TARGETS)
def test_the_token_eagle3_drafter_runs_long_and_is_also_rejected(run, arch):
    """It answers the target's next token after each input token: right on the cycles greedy generation
    settles on, wrong for a quarter of the other tokens (and where the llama target deviates from its map)."""
    got = run(arch, "eagle3-token")
    assert got.rate > {"llama": 0.55, "qwen35": 0.75}[arch], got
    assert got.mean_run > 2.0, got  # whole drafts accepted
    assert got.accepted < got.drafted, got


@pytest.mark.parametrize("arch", TARGETS)
def test_the_hidden_eagle3_drafter_gets_the_first_token_from_the_features_of_the_position_before(run, arch):
    """It reads only the target's layer-0 input (the token embedding) of the feature row: its first draft
    token is right only when llama.cpp pairs the row of position P with the token at P + 1; the later ones
    read the same row again (chance level)."""
    got = run(arch, "eagle3-hidden")
    rounds = got.predicted - got.accepted
    assert got.accepted / rounds > 0.6, got  # the first draft token of most rounds
    assert got.mean_run <= 1.0, got  # and no more


@pytest.mark.parametrize("arch", TARGETS)
def test_the_fitted_dflash_drafter_drafts_whole_blocks(run, arch):
    got = run(arch, "dflash-fitted")
    assert got.rate > 0.6, got
    assert got.mean_run > 3.0, got
    assert got.accepted < got.drafted, got  # deliberately wrong answers: rejections too


@pytest.mark.parametrize("arch", TARGETS)
def test_every_drafter_leaves_the_target_greedy_text(run, arch):
    """Greedy speculative decoding is lossless: every drafter's run prints the target's own text (runs
    stop at the end of a round past the asked length, so the shorter is a prefix of the longer)."""
    texts = sorted((run(arch, name).text for name in DRAFTERS), key=len)
    assert all(longer.startswith(texts[0]) for longer in texts[1:])
    assert len(texts[0]) > 64  # 64 generated tokens, a piece of 1 or 2 hex digits each
