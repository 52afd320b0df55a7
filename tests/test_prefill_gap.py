"""scripts/prefill_gap.py's arithmetic and its offline cache (the measurement itself runs a server: run the
script)."""

from __future__ import annotations

import pytest
from _scripts import script


@pytest.fixture(scope="module")
def pg():
    with script("prefill_gap") as module:
        yield module


def test_gaps_are_taken_within_a_request_around_the_long_prompt(pg):
    # one stream: a token every 10 ms, bursts of 3 tokens 0.1 ms apart, a 300 ms gap once the long prompt is
    # sent at t=1.0 (first token at 1.3); a new request of the stream starts at 2.0 (no gap across requests)
    stream = []
    for i in range(50):  # the last burst at 0.99
        t = 0.5 + i * 0.01
        stream += [(0, t), (0, t + 0.0001), (0, t + 0.0002)]
    stream += [(0, 1.3), (0, 1.31), (1, 2.0), (1, 2.01)]
    deliveries = pg.gap_summary([stream], sent=1.0, first=1.3, before_s=0.4, burst_s=0.002)
    assert deliveries["median_before_s"] == pytest.approx(0.01)
    assert deliveries["max_during_s"] == pytest.approx(0.31)  # from the last delivery's first token
    assert deliveries["n_during"] == 1  # 1.3 -> 1.31 ends after the first token; 1.31 -> 2.0 is no gap
    assert deliveries["ratio"] == pytest.approx(31)
    tokens = pg.gap_summary([stream], sent=1.0, first=1.3, before_s=0.4, burst_s=0.0)
    assert tokens["median_before_s"] == pytest.approx(0.0001)  # bursts: most gaps are next to nothing
    assert tokens["max_during_s"] == pytest.approx(0.3098)
    assert tokens["ratio"] == pytest.approx(3098)


def test_a_preset_s_files_in_a_folder_load_offline(pg, tmp_path, monkeypatch):
    from localspec.hub.download import resolve_cached
    from localspec.hub.presets import get_preset

    models = tmp_path / "models"
    models.mkdir()
    for name in ("qwen2.5-coder-1.5b-instruct-q4_k_m.gguf", "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"):
        (models / name).write_bytes(b"GGUF")
    env = pg.offline_preset_cache("qwen2.5-coder-1.5b", models, tmp_path / "hf")
    assert env["HF_HUB_OFFLINE"] == "1"
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    preset = get_preset("qwen2.5-coder-1.5b")
    for ref, name in ((preset.target, "1.5b"), (preset.draft_model, "0.5b")):
        [path] = resolve_cached(ref, preset.name)
        assert name in path.name and path.resolve().parent == models.resolve()
    (models / "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf").unlink()
    with pytest.raises(SystemExit, match="no single file matching"):
        pg.offline_preset_cache("qwen2.5-coder-1.5b", models, tmp_path / "hf2")
