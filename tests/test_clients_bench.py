"""``localspec bench --clients``: servers under concurrent streaming clients, its result file, its
refusals."""

from __future__ import annotations

import json
import math

import pytest
from click.testing import CliRunner

from localspec.bench.clients import LevelRun, Reply, peer_settings, serve_settings
from localspec.bench.clients_report import ClientsResult, markdown
from localspec.cli import main


def _run(setting: str, clients: int, repeat: int, wall: float, replies: list[Reply]) -> LevelRun:
    return LevelRun(setting, "localspec", clients, repeat, wall, tuple(replies))


def test_a_row_takes_the_median_rate_over_repeats_and_pools_the_latencies():
    def reply(t0: float, first: float, done: float, tokens: int, drafted: int = 0, taken: int = 0) -> Reply:
        return Reply(sent=t0, first=first, done=done, tokens=tokens, drafted=drafted, accepted=taken)

    runs = [
        _run("pair", 2, 0, 2.0, [reply(0, 0.5, 1.0, 10, 8, 4), reply(0, 1.0, 2.0, 10, 8, 2)]),
        _run("pair", 2, 1, 4.0, [reply(0, 1.0, 3.0, 10), Reply(sent=0, done=4.0, error="refused")]),
        _run("pair", 2, 2, 1.0, [reply(0, 0.2, 1.0, 10)]),
        _run("alone", 1, 0, 1.0, [reply(0, 0.1, 1.0, 5)]),
        _run("pair", 1, 0, 1.0, [reply(0, 0.1, 1.0, 5)]),
    ]
    result = ClientsResult("2026-12-07T00:00:00+00:00", {"cpu": "test CPU"}, {"threads": 2}, runs)
    rows = result.rows()
    assert [(r.setting, r.clients) for r in rows] == [("pair", 1), ("pair", 2), ("alone", 1)]
    pair = rows[1]
    assert pair.throughput == 10.0  # the rates 10, 2.5 and 10 tokens/s: their median
    assert (pair.requests, pair.errors) == (4, 1)
    assert pair.latency_p50 == pytest.approx(1.5)  # 1, 2, 3, 1: the failed request left out
    assert pair.ttft_p50 == pytest.approx(0.75)
    assert pair.acceptance == pytest.approx(6 / 16)
    assert rows[2].acceptance is None  # nothing drafted: no acceptance, not 0%
    failed = ClientsResult("d", {}, {}, [_run("x", 1, 0, 1.0, [Reply(0, 1, error="e")])])
    assert math.isnan(failed.rows()[0].ttft_p50)
    assert "| pair | 2 | 4 (1 failed) | 10.0 |" in markdown(result)


def test_the_settings_are_the_pair_at_each_parallel_one_at_a_time_and_the_target_alone():
    got = serve_settings(["--threads", "2"], "d.gguf", [2, 4])
    assert [s.label for s in got] == [
        "localspec --parallel 2",
        "localspec --parallel 4",
        "localspec --parallel 1 (one at a time)",
        "localspec --draft none --parallel 4",
    ]
    assert got[0].serve_args == ("--threads", "2", "--draft", "d.gguf", "--parallel", "2")
    assert got[-1].serve_args == ("--threads", "2", "--draft", "none", "--parallel", "4")
    assert [s.label for s in serve_settings([], None, [1])] == [
        "localspec --parallel 1",
        "localspec --draft none --parallel 1",
    ]
    peers = peer_settings(["none", "ngram-mod"], [4])
    assert [(s.slots, s.mode) for s in peers] == [(4, "none"), (4, "ngram-mod")]


def _sse_server(chunks: list[dict]):
    """A one-endpoint HTTP server that streams ``chunks`` as server-sent events, then ``[DONE]``."""
    import http.server
    import threading

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self):
            self.rfile.read(int(self.headers["Content-Length"]))
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()
            for chunk in [*map(json.dumps, chunks), "[DONE]"]:
                self.wfile.write(f"data: {chunk}\n\n".encode())

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


@pytest.mark.parametrize(
    "last, drafted",
    [
        ({"localspec": {"drafted": 6, "accepted": 4}}, (6, 4)),  # localspec serve's own field
        ({"timings": {"draft_n": 5, "draft_n_accepted": 2}}, (5, 2)),  # llama-server's timings
        ({}, (0, 0)),
    ],
)
def test_a_stream_is_read_for_its_first_text_usage_and_drafts(last, drafted):
    from localspec.bench.clients import stream_one
    from localspec.bench.workloads import Prompt

    chunks = [
        {"choices": [{"index": 0, "delta": {"role": "assistant"}}]},  # no text yet
        {"choices": [{"index": 0, "delta": {"content": "def"}}]},
        {"choices": [], "usage": {"completion_tokens": 7}, **last},
    ]
    server = _sse_server(chunks)
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/v1"
        got = stream_one(url, "m", Prompt("p", "hi", chat=True), 8)
    finally:
        server.shutdown()
    assert got.error is None and got.tokens == 7 and (got.drafted, got.accepted) == drafted
    assert got.first is not None and got.sent <= got.first <= got.done


def test_a_refused_request_is_a_failed_reply_not_an_exception():
    from localspec.bench.clients import stream_one
    from localspec.bench.workloads import Prompt

    server = _sse_server([])
    server.RequestHandlerClass.do_POST = lambda self: self.send_error(429, "queue full")
    try:
        got = stream_one(f"http://127.0.0.1:{server.server_address[1]}/v1", "m", Prompt("p", "x", False), 4)
    finally:
        server.shutdown()
    assert got.error is not None and "429" in got.error and got.tokens == 0


@pytest.mark.parametrize(
    "args, says",
    [
        (["--clients", "1,2", "--temperature", "0.7"], "--temperature does not apply with --clients"),
        (["--clients", "2", "--n-max", "4"], "--n-max does not apply with --clients"),
        (["--clients", "2", "--peer", "--peer-n-max", "2-4"], "--peer-n-max does not apply with --clients"),
        (["--clients", "0,2"], "'0' is not a count from 1 to 256"),
        (["--clients", "2", "--parallel", "x"], "'x' is not a count from 1 to 256"),
        (["--requests", "4"], "--requests needs --clients"),
        (["--parallel", "4"], "--parallel needs --clients"),
        (["--clients", "2", "--sessions", "agent"], "--sessions and --clients are two benches"),
        (["--clients", "2", "--peer-modes", "none"], "--peer-modes needs --peer with --sessions"),
        (["--clients", "2", "--peer", "--peer-modes", "draft-ngram"], "unknown llama.cpp workload"),
        (["--clients", "2", "--peer", "-d", "none", "--peer-modes", "draft-simple"], "needs a draft model"),
        (["--clients", "2", "--peer", "--peer-modes", "draft-mtp"], "has none: drop draft-mtp"),
    ],
)
def test_the_clients_bench_refuses_what_it_does_not_read_before_any_server_starts(
    tmp_path, monkeypatch, args, says
):
    from localspec.bench import clients

    def no_start(*a, **k):
        raise AssertionError("a server was started for an invalid option")

    monkeypatch.setattr(clients, "start_serve", no_start)
    monkeypatch.setattr(clients, "start_llama_server", no_start)
    res = CliRunner().invoke(main, ["bench", "-q", "--out", str(tmp_path / "out"), *args])
    assert res.exit_code == 2, res.output
    assert says in " ".join(res.output.split()), res.output


def test_a_clients_file_that_is_not_readable_is_named(tmp_path):
    bad = tmp_path / "clients.json"
    bad.write_text(json.dumps({"kind": "localspec-clients-bench", "date": "d", "setup": {}}))
    res = CliRunner().invoke(main, ["bench", "--from-json", str(bad)])
    assert res.exit_code == 1, res.output
    assert "is not a readable clients bench result" in res.output
    assert "Traceback" not in res.output


@pytest.mark.slow
def test_the_clients_bench_runs_serve_end_to_end_and_renders_its_file_again(tmp_path):
    """The embedded pair under 1 and 2 clients: every setting answers every request, the file says when and
    on what, and --from-json prints the same table."""
    out = tmp_path / "out"
    args = ["bench", "-q", "--clients", "1,2", "--requests", "2", "--max-tokens", "4", "--out", str(out)]
    res = CliRunner().invoke(main, args)
    assert res.exit_code == 0, res.output
    data = json.loads((out / "clients.json").read_text())
    assert data["kind"] == "localspec-clients-bench" and data["date"][:4].isdigit() and data["cpu"]
    assert data["setup"]["target"] == "tiny-target.gguf", "a published result names files, not folders"
    rows = data["rows"]
    assert [(r["setting"], r["clients"]) for r in rows] == [
        (s, c)
        for s in (
            "localspec --parallel 2",
            "localspec --parallel 1 (one at a time)",
            "localspec --draft none --parallel 2",
        )
        for c in (1, 2)
    ]
    assert all(r["requests"] == 2 and r["errors"] == 0 and r["throughput"] > 0 for r in rows)
    assert all(x["tokens"] > 0 for run in data["runs"] for x in run["replies"])
    assert (out / "clients.png").stat().st_size > 0
    again = CliRunner().invoke(main, ["bench", "--from-json", str(out / "clients.json")])
    assert again.exit_code == 0, again.output
    assert again.output.strip() == (out / "clients.md").read_text().strip()


@pytest.mark.slow
def test_the_clients_bench_drives_llama_server_beside_serve(tmp_path):
    """With --peer, llama.cpp's llama-server (built from the vendored source) answers the same streamed
    requests: its completion tokens and drafts are read from its own stream."""
    from _peer_cache import peer_build_cache

    from localspec.llama import programs

    out = tmp_path / "out"
    args = ["bench", "-q", "--clients", "2", "--requests", "2", "-n", "4", "--out", str(out)]
    with peer_build_cache():
        if programs.server_binary() is None:
            pytest.skip("llama-server is not built (the first `localspec bench --peer` builds it)")
        res = CliRunner().invoke(main, [*args, "--peer", "--peer-modes", "none,draft-simple"])
    assert res.exit_code == 0, res.output
    rows = {r["setting"]: r for r in json.loads((out / "clients.json").read_text())["rows"]}
    for mode in ("none", "draft-simple"):
        row = rows[f"llama-server --parallel 2 {mode}"]
        assert row["requests"] == 2 and row["errors"] == 0 and row["throughput"] > 0, row
    assert rows["llama-server --parallel 2 none"]["acceptance"] is None
