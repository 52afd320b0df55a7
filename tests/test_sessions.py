"""Multi-request workloads: files load, requests are built from the replies so far, bad files are named."""

from __future__ import annotations

import json

import pytest

from localspec.bench.sessions import (
    SESSION_WORKLOADS,
    last_code_block,
    load_session_workload,
    n_requests,
    requests,
    run_session,
)
from localspec.errors import BenchError


@pytest.mark.parametrize("name", SESSION_WORKLOADS)
def test_shipped_workloads_load_and_keep_warm_and_measured_apart(name):
    w = load_session_workload(name)
    assert w.measured and w.warm
    assert not {s.id for s in w.warm} & {s.id for s in w.measured}
    warm_steps = {step for s in w.warm for step in s.steps}
    assert not warm_steps & {step for s in w.measured for step in s.steps}


def test_multi_request_workloads_are_long_enough_to_measure_memory():
    assert load_session_workload("edit-session").n_measured_requests >= 5
    assert load_session_workload("agent").n_measured_requests >= 8
    assert all(len(s.steps) == 4 for s in load_session_workload("multi-turn").measured)
    assert load_session_workload("repo-code").corpus.is_dir()


def test_edit_requests_carry_the_previous_answers_code():
    w = load_session_workload("edit-session")
    gen = requests(w, w.measured[0])
    first = next(gen)
    assert w.measured[0].code in first.messages[0]["content"]
    first.reply = "Here it is:\n```python\nNEW_VERSION = 2\n```\nDone."
    second = next(gen)
    assert "NEW_VERSION = 2" in second.messages[0]["content"]
    assert w.measured[0].code not in second.messages[0]["content"]
    second.reply = "no code this time"
    third = next(gen)  # an answer without code keeps the last version
    assert "NEW_VERSION = 2" in third.messages[0]["content"]


def test_agent_and_chat_requests_grow_with_the_models_own_replies():
    for name in ("agent", "multi-turn"):
        w = load_session_workload(name)
        session = w.measured[0]
        sent = run_session(w, session, lambda msgs: f"reply to {len(msgs)}", clock=iter(range(1000)).__next__)
        assert len(sent) == n_requests(session)
        last = sent[-1].messages
        replies = [m["content"] for m in last if m["role"] == "assistant"]
        assert replies == [f"reply to {len(r.messages)}" for r in sent[:-1]]
        assert all(r.seconds == 1 for r in sent)


def test_last_code_block():
    assert last_code_block("a\n```py\nx = 1\n```\nb\n```\ny = 2\n```") == "y = 2\n"
    assert last_code_block("```python\ncut = sho") == "cut = sho\n"
    assert last_code_block("no code") is None


@pytest.mark.parametrize(
    "doc, what",
    [
        ({"measured": []}, "no measured sessions"),
        ({"measured": [{"id": "a", "kind": "poem", "turns": ["x"]}]}, "kind 'poem'"),
        ({"measured": [{"id": "a", "kind": "chat", "turns": []}]}, "'turns' must hold"),
        ({"max_tokens": 0, "measured": [{"id": "a", "kind": "chat", "turns": ["x"]}]}, "max_tokens"),
        (
            {
                "warm": [{"id": "a", "kind": "chat", "turns": ["x"]}],
                "measured": [{"id": "a", "kind": "chat", "turns": ["y"]}],
            },
            "unique",
        ),
    ],
)
def test_a_malformed_session_file_is_named_with_what_is_wrong(tmp_path, doc, what):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(BenchError, match="bad.json") as exc:
        load_session_workload(path)
    assert what in str(exc.value)


def test_not_json_and_missing_files(tmp_path):
    path = tmp_path / "x.json"
    path.write_bytes(b"\xff\xfe not json")
    with pytest.raises(BenchError, match="not a JSON session file"):
        load_session_workload(path)
    with pytest.raises(BenchError, match="no such session file"):
        load_session_workload(tmp_path / "missing.json")
