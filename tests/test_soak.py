"""scripts/soak_serve.py for 20 seconds on the embedded pair: 8 clients mixing valid, streamed, abandoned and
bad requests against ``localspec serve --parallel 4``, and its verdict (every valid request answered,
nothing unexpected, nothing leaked)."""

from __future__ import annotations

import pytest
from _scripts import script


@pytest.fixture(scope="module")
def soak():
    with script("soak_serve") as module:
        yield module


@pytest.mark.slow
def test_a_short_soak_answers_every_valid_request_and_leaks_nothing(soak, tmp_path):
    # one thread: on a busy machine a llama.cpp pass of two threads waits for the slower one (CI has 2 cores)
    args = ["--threads", "1"]
    result = soak.run_soak(
        args, seconds=20, clients=8, parallel=4, timeout_s=60, log_dir=tmp_path, echo=print
    )
    print(soak.table(result))
    assert result.ok, soak.table(result)
    sent = {kind: t.sent for kind, t in result.tallies.items()}
    assert all(sent[kind] for kind in soak.VALID_KINDS), sent  # every valid kind ran
    assert sum(sent[kind] for kind in soak.BAD_KINDS) > 0, sent
