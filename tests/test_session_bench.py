"""The multi-request bench (localspec.bench.session_run) on the embedded pair, and llama.cpp's session modes.

The llama.cpp runs need ``llama-server`` from ``localspec bench --peer``: skipped where it is not built
(always in CI); the flags and the reply parsing are checked everywhere.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

import localspec
from localspec.bench import peer
from localspec.bench.session_run import (
    PeerSetup,
    SessionConfig,
    bench_workload,
    markdown,
    noise_lines,
    warm_snapshot,
)
from localspec.bench.sessions import load_session_workload
from localspec.errors import BenchError
from localspec.llama import programs
from localspec.settings import DraftSettings

WORKLOAD = {
    "workload": "tiny-chat",
    "max_tokens": 12,
    "warm": [{"id": "w", "kind": "chat", "turns": ["def add(a, b):", "and sub?"]}],
    "measured": [{"id": "m", "kind": "chat", "turns": ["def mul(a, b):", "and div?"]}],
}


@pytest.fixture(scope="module")
def pipe():
    with localspec.load(n_ctx=512, n_threads=1, suffix_store=False) as p:
        yield p


@pytest.fixture
def workload(tmp_path):
    path = tmp_path / "tiny-chat.json"
    path.write_text(json.dumps(WORKLOAD), encoding="utf-8")
    return load_session_workload(path)


def test_every_setting_runs_every_request_and_rows_compare_to_the_target_alone(pipe, workload):
    configs = [
        SessionConfig(DraftSettings(strategy="ngram", n_max=4)),
        SessionConfig(DraftSettings(strategy="suffix", n_max=8), warm=True),
        SessionConfig(DraftSettings(strategy="suffix", n_max=8), warm=True, calibration=False),
    ]
    res = bench_workload(pipe, workload, configs, repeats=2)
    rows = {r["config"]: r for r in res["rows"]}
    assert list(rows) == ["none", "ngram k=4", "suffix k=8 (warm)", "suffix k=8 (warm, calibration afresh)"]
    assert rows["none"]["speedup_generation"] == pytest.approx(1.0)
    for row in rows.values():
        assert len(row["tokens"]) == 2 and all(t > 0 for t in row["tokens"])
        assert row["vs_llama_cpp_best"] is None and row["peer"] is False
    table = markdown([res])
    assert "llama.cpp" not in table and "| suffix k=8 (warm)" in table


def _row(config, strategy, ups, speeds, acceptance=0.5, peer=False):
    return {
        "config": config,
        "strategy": strategy,
        "target_alone": strategy == "none",
        "peer": peer,
        "acceptance": acceptance,
        "speedups_generation": ups,
        "speedup_generation": sorted(ups)[len(ups) // 2],
        "tokens_per_second_repeats": speeds,
    }


def test_session_figures_a_run_cannot_vouch_for_are_flagged():
    """From runs beside a busy process: the target alone moving 11-15 tok/s between repeats, a setting
    whose repeats gave 1.2x and 2.4x, an n-gram row at 1.9x that accepted nothing."""

    def agent(*rows):
        return {"workload": "agent", "repeats": 3, "rows": list(rows)}

    busy = agent(
        _row("none", "none", [1.0, 1.0, 1.0], [11.0, 15.0, 14.0]),
        _row("suffix k=32", "suffix", [1.2, 2.4, 1.5], [16.0, 30.0, 21.0]),
        _row("ngram k=4", "ngram", [1.9, 1.9, 1.95], [25.0, 27.0, 26.0], acceptance=0.0),
        _row("ngram-mod", "ngram-mod", [1.0, 1.01, 1.02], [15.0, 15.0, 15.0], acceptance=None, peer=True),
    )
    (line,) = noise_lines([busy])
    assert "agent / none ran 11.0-15.0 tok/s across repeats" in line
    assert "agent / suffix k=32 1.20-2.40x across repeats" in line
    assert "agent / ngram k=4 1.90x with no draft accepted" in line
    assert "ngram-mod" not in line and line.startswith("warning: ")
    calm = agent(
        _row("none", "none", [1.0, 1.0, 1.0], [14.0, 15.0, 14.5]),
        _row("suffix k=32", "suffix", [1.6, 1.7, 1.65], [23.0, 25.0, 24.0]),
        _row("ngram k=4", "ngram", [1.0, 1.02, 0.99], [14.0, 15.0, 14.5], acceptance=0.0),
    )
    assert noise_lines([calm]) == []
    (note,) = noise_lines([{**calm, "repeats": 1}])
    assert note.startswith("note: one repeat") and "--repeats 3" in note


def test_a_warm_start_is_what_a_store_holds_after_the_warm_up_sessions(pipe, workload):
    warm, seconds = warm_snapshot(pipe, workload, workload.max_tokens)
    drafter = pipe.suffix_drafter()
    assert seconds > 0 and warm.index["history_tokens"].size > 0
    assert warm.calibration == drafter.carried_calibration()  # the prompt cells, scaled as a store keeps them
    assert warm.calibration and {cell[0] for cell in warm.calibration} == {"prompt"}
    assert warm.tokens and warm.tokens == drafter.carried_tokens()  # and what it learnt of each token
    pipe.reset_suffix(warm.index, warm.calibration, warm.tokens)
    fresh = pipe.suffix_drafter()
    assert fresh is not drafter and fresh.index.history_tokens == drafter.index.history_tokens
    assert fresh.carried_calibration() == warm.calibration
    assert sorted(fresh.carried_tokens()) == sorted(warm.tokens)
    pipe.reset_suffix()
    assert pipe.suffix_drafter().calibration == {} and pipe.suffix_drafter().index.history_tokens == 0
    assert pipe.suffix_drafter().tokens == {}


def test_llama_cpp_session_modes_are_sized_for_a_cpu(tmp_path):
    t, d = tmp_path / "t.gguf", tmp_path / "d.gguf"
    kw = dict(target=t, draft=d, threads=2, n_ctx=4096)
    assert "--spec-type" not in peer.session_mode_args("none", **kw)
    for mode in peer.SESSION_MODES[1:]:
        args = peer.session_mode_args(mode, **kw)
        assert args[args.index("--spec-type") + 1] == mode
        assert args[args.index("-np") + 1] == "1" and args[args.index("-c") + 1] == "4096"
    mod = peer.session_mode_args("ngram-mod", **kw)
    assert int(mod[mod.index("--spec-ngram-mod-n-max") + 1]) <= 16  # upstream's 64 is GPU-sized
    cache = peer.session_mode_args("ngram-cache", **kw, lookup_static=tmp_path / "c.bin")
    assert cache[cache.index("--lookup-cache-static") + 1] == str(tmp_path / "c.bin")
    draft = peer.session_mode_args("draft-simple", **kw)
    assert draft[draft.index("--model-draft") + 1] == str(d)
    with pytest.raises(BenchError, match="draft model"):
        peer.session_mode_args("draft-simple", **{**kw, "draft": None})
    with pytest.raises(BenchError, match="unknown llama.cpp mode"):
        peer.session_mode_args("eagle9", **kw)


def test_a_llama_server_reply_reads_as_text_and_timings():
    reply = peer.PeerReply(
        {
            "content": "x = 1",
            "timings": {"predicted_n": 7, "predicted_ms": 350.0, "draft_n": 6, "draft_n_accepted": 4},
        }
    )
    assert str(reply) == "x = 1"
    assert (reply.generated_tokens, reply.gen_seconds, reply.drafted, reply.accepted) == (7, 0.35, 6, 4)
    assert peer.PeerReply({}).generated_tokens == 0 and str(peer.PeerReply({})) == ""


@pytest.mark.slow
@pytest.mark.skipif(os.environ.get("CI") == "true", reason="the llama.cpp peer never runs in CI")
def test_llama_cpp_modes_run_the_same_sessions_interleaved_with_ours(pipe, workload, tmp_path):
    if programs.server_binary() is None:
        pytest.skip("no llama-server: set LOCALSPEC_PEER_DIR to where `localspec bench --peer` built it")
    setup = PeerSetup(
        target=Path(pipe.info.target_path),
        draft=None,
        threads=1,
        n_ctx=512,
        modes=("ngram-simple", "none"),
        work_dir=tmp_path,
    )
    configs = [SessionConfig(DraftSettings(strategy="ngram", n_max=4))]
    res = bench_workload(pipe, workload, configs, repeats=1, peer=setup)
    rows = {r["config"]: r for r in res["rows"]}
    assert list(rows) == ["none", "ngram k=4", "llama.cpp none", "llama.cpp ngram-simple"]
    assert rows["llama.cpp none"]["speedup_generation"] == pytest.approx(1.0)
    assert all(r["tokens"][0] > 0 for r in rows.values())
    assert all(r["vs_llama_cpp_best"] > 0 for r in rows.values())
    assert "tok/s / llama.cpp's best mode" in markdown([res])
