"""The target over llama.cpp's RPC backend: addresses, the handshake, the exposure rule, the delaying proxy,
and (with two rpc-servers on loopback, built once from the vendored llama.cpp) lossless greedy text, a
wrong address said within seconds, and a server killed mid-generation ending that request with an error."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import llama_cpp
import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

import localspec
from localspec.bench.rpc_local import DelayProxy, free_port, local_servers
from localspec.errors import RpcError, SettingsError
from localspec.llama import rpc
from localspec.llama.loading import rpc_placement, supports_gpu_offload
from localspec.serve.exposure import ExposureError, check_rpc_exposure

ROOT = Path(__file__).resolve().parent.parent


# Addresses, shares, placement ---------------------------------------------------------------------------
def test_endpoints_parse_and_bad_ones_say_what_to_write():
    assert rpc.parse_endpoints("127.0.0.1:50052, host-b:7000") == [
        rpc.Endpoint("127.0.0.1", 50052),
        rpc.Endpoint("host-b", 7000),
    ]
    assert rpc.parse_endpoints(["10.0.0.2:1"]) == [rpc.Endpoint("10.0.0.2", 1)]
    for bad, words in [
        ("", "names no server"),
        ("127.0.0.1", "not HOST:PORT"),
        ("[::1]:50052", "IPv6"),
        ("127.0.0.1:0", "1-65535"),
        ("127.0.0.1:http", "1-65535"),
        ("a:1,a:1", "named twice"),
        ("a:1,,b:2", "names no server"),
        ("10.0.0..2:50052", "not an IPv4 address"),  # a typo: an empty label
        ("host..lan:50052", "not a host name"),
        ("h:\u00b2", "1-65535"),  # "²".isdigit() is True
        ("h:\u0661", "1-65535"),  # an Arabic-Indic digit
        ("999.1.1.1:1", "not an IPv4 address"),
        (f"{'a' * 64}.lan:1", "not a host name"),  # a label of more than 63 characters
        (f"{'a.' * 127}a:1", "not a host name"),  # more than 253 characters
        ("h\u00e9:1", "not a host name"),  # llama.cpp's client looks names up as they are: ASCII only
        ("-h:1", "not a host name"),
        ("a\tb:1", "not HOST:PORT"),
    ]:
        with pytest.raises(SettingsError) as err:
            rpc.parse_endpoints(bad)
        assert words in str(err.value), bad


@settings(max_examples=400, deadline=None)
@given(st.text(max_size=40) | st.from_regex(r"[0-9a-z.\-]{0,12}:[0-9\u00b2]{0,6}", fullmatch=True))
def test_any_rpc_list_parses_or_is_a_settings_error(spec):
    """Whatever is typed after --rpc: endpoints llama.cpp's client can read, or a SettingsError. Never
    another exception (a UnicodeError, a ValueError from int())."""
    try:
        endpoints = rpc.parse_endpoints(spec)
    except SettingsError as exc:
        assert exc.hint
        return
    for e in endpoints:
        assert rpc.host_problem(e.host) is None and 1 <= e.port <= 65535
        assert e.host.isascii() and ":" not in e.host and str(e).count(":") == 1


def test_a_bad_host_is_an_error_naming_it_never_a_unicode_error():
    """``create_connection`` raises a UnicodeError (a ValueError) for an empty or too long label."""
    with pytest.raises(SettingsError, match="10.0.0..2"):
        localspec.load(draft="none", n_threads=1, n_ctx=256, rpc="10.0.0..2:50052")
    with pytest.raises(RpcError, match="10.0.0..2"):
        rpc.hello(rpc.Endpoint("10.0.0..2", 50052))  # an Endpoint made by hand
    from localspec.cli import main

    for bad in ("10.0.0..2:50052", "h:\u00b2"):
        result = CliRunner().invoke(main, ["run", "--rpc", bad, "x"])
        assert result.exit_code == 2 and "Traceback" not in result.output and "bug" not in result.output


def test_tensor_split_needs_one_share_per_device():
    rpc.check_tensor_split([3, 1], ["RPC0 a:1", "RPC1 b:2"])
    with pytest.raises(SettingsError, match="2 shares for 3 devices"):
        rpc.check_tensor_split([1, 1], ["RPC0 a:1", "RPC1 b:2", "RPC2 c:3"])
    for bad in ([0, 0], [1, -1], [1, float("nan")]):
        with pytest.raises(SettingsError, match="0 or more"):
            rpc.check_tensor_split(bad, ["RPC0 a:1", "RPC1 b:2"])


def test_placement_counts_the_layers_llama_cpp_assigned():
    log = [
        f"load_tensors: layer {i:3d} assigned to device {'CPU' if i < 2 else 'RPC0' if i < 20 else 'RPC1'}, "
        "is_swa = 0"
        for i in range(29)
    ]  # layer 28 is the output layer: not counted
    names = {"RPC0": "127.0.0.1:50052", "RPC1": "10.0.0.2:50052"}
    assert rpc_placement(log, names, 28) == (
        "RPC 127.0.0.1:50052 18/28, 10.0.0.2:50052 8/28 layers; this machine 2/28"
    )
    assert rpc_placement([], names, 28) == "RPC over 127.0.0.1:50052, 10.0.0.2:50052"


def test_a_cpu_build_with_rpc_is_not_a_gpu_offload():
    """llama.cpp says it can offload whenever it has the RPC backend; localspec asks for a local GPU, so a
    CPU machine's models are placed (and reported) on the CPU."""
    if llama_cpp.llama_supports_rpc() and not rpc.has_local_gpu():
        assert llama_cpp.llama_supports_gpu_offload() and not supports_gpu_offload()
    else:
        assert supports_gpu_offload() == bool(llama_cpp.llama_supports_gpu_offload())


def test_a_build_without_rpc_says_how_to_rebuild(monkeypatch):
    monkeypatch.setattr(llama_cpp, "llama_supports_rpc", lambda: False)
    with pytest.raises(RpcError) as err:
        localspec.load(draft="none", n_threads=1, n_ctx=256, rpc="127.0.0.1:50052")
    assert "-DGGML_RPC=ON" in str(err.value) and "pip install" in str(err.value)


# The handshake ------------------------------------------------------------------------------------------
def _one_shot_server(reply: bytes | None) -> tuple[socket.socket, int]:
    """A loopback listener that answers its first connection with ``reply`` (None: never answers)."""
    listener = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        conn, _ = listener.accept()
        conn.recv(64)
        if reply is not None:
            conn.sendall(reply)
        time.sleep(3)
        conn.close()

    threading.Thread(target=serve, daemon=True).start()
    return listener, listener.getsockname()[1]


def test_a_wrong_address_is_said_within_seconds():
    port = free_port()
    start = time.monotonic()
    with pytest.raises(RpcError) as err:
        rpc.hello(rpc.Endpoint("127.0.0.1", port))
    assert time.monotonic() - start < 5
    assert f"127.0.0.1:{port}" in str(err.value) and "localspec rpc-server" in str(err.value)


def test_a_silent_server_and_a_stranger_are_told_apart():
    listener, port = _one_shot_server(None)
    with listener, pytest.raises(RpcError, match="no answer within 0.5 s"):
        rpc.hello(rpc.Endpoint("127.0.0.1", port), timeout=0.5)
    listener, port = _one_shot_server(b"HTTP/1.1 400 Bad Request\r\n\r\n")
    with listener, pytest.raises(RpcError, match="not llama.cpp's rpc-server") as err:
        rpc.hello(rpc.Endpoint("127.0.0.1", port))
    said = str(err.value)  # once: an RpcError is a ConnectionError, and was wrapped in another
    assert said.count(f"127.0.0.1:{port}") == 1 and said.count("check the port") == 1, said
    old = (28).to_bytes(8, "little") + bytes([3, 0, 0, 0]) + bytes(24)  # a protocol 3.0.0 server's answer
    listener, port = _one_shot_server(old)
    with listener, pytest.raises(RpcError, match="protocol 3.0.0"):
        rpc.hello(rpc.Endpoint("127.0.0.1", port))


# Exposure -----------------------------------------------------------------------------------------------
def test_rpc_server_binds_loopback_unless_told_plainly():
    assert "only this machine" in check_rpc_exposure("127.0.0.1", 50052)
    with pytest.raises(ExposureError) as err:
        check_rpc_exposure("0.0.0.0", 50052)
    assert "no authentication" in str(err.value) and "ssh -N -L 50052" in str(err.value)
    assert "NO authentication" in check_rpc_exposure("0.0.0.0", 50052, insecure_expose=True)
    from localspec.cli import main

    result = CliRunner().invoke(main, ["rpc-server", "--host", "192.168.1.5"])
    assert result.exit_code == 1 and "--insecure-expose" in result.output


@pytest.mark.parametrize(
    "host, words",
    [
        ("localhost", "a host name"),  # llama.cpp: "Invalid host address: localhost", then exit status 0
        ("::1", "an IPv6 address"),
        ("[::1]", "an IPv6 address"),
        ("", "not an address"),
        ("10.0.0..2", "not four numbers"),
        ("127.1", "not four numbers"),
        ("255.255.255.255", "not an address a server can listen on"),
        ("224.0.0.1", "not an address a server can listen on"),
    ],
)
def test_rpc_server_host_is_an_ipv4_address_or_a_usage_error(host, words, monkeypatch):
    from localspec.cli import main
    from localspec.llama import programs

    monkeypatch.setattr(programs, "built_rpc_server", lambda: pytest.fail("started for a bad --host"))
    result = CliRunner().invoke(main, ["rpc-server", "--host", host, "--insecure-expose"])
    assert result.exit_code == 2 and words in result.output and "Traceback" not in result.output


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=24) | st.from_regex(r"[0-9a-f:.\[\]]{0,20}", fullmatch=True))
def test_any_rpc_server_host_is_an_address_or_a_usage_error(host):
    import ipaddress

    import click

    from localspec.cli.rpc import check_host

    try:
        got = check_host(None, None, host)
    except click.BadParameter as exc:
        assert "--host" in str(exc.param_hint) and exc.message
        return
    address = ipaddress.IPv4Address(got)  # what llama.cpp's inet_addr reads the same way
    assert not address.is_multicast and str(address) == got


def test_an_address_not_of_this_machine_is_a_usage_error(monkeypatch):
    from localspec.cli import main
    from localspec.llama import programs

    monkeypatch.setattr(programs, "built_rpc_server", lambda: pytest.fail("started for a foreign --host"))
    result = CliRunner().invoke(main, ["rpc-server", "--host", "192.0.2.1", "--insecure-expose"])  # TEST-NET
    assert result.exit_code == 2 and "cannot listen on 192.0.2.1" in result.output


def test_a_server_that_exits_before_serving_is_an_error_whatever_its_status():
    from localspec.cli.rpc import run_server

    endpoint = rpc.Endpoint("127.0.0.1", free_port())
    ready: list[bool] = []
    for cmd in (["true"], ["false"]):
        with pytest.raises(RpcError, match="exited with status [01] before it served"):
            run_server(cmd, endpoint, on_ready=lambda: ready.append(True))
    assert not ready


def test_run_refuses_a_malformed_rpc_list_before_loading():
    from localspec.cli import main

    result = CliRunner().invoke(main, ["run", "--rpc", "nohost", "x"])
    assert result.exit_code == 2 and "HOST:PORT" in result.output
    result = CliRunner().invoke(main, ["run", "--tensor-split", "1,1", "x"])
    assert result.exit_code == 2 and "add --rpc" in result.output


# The delaying proxy -------------------------------------------------------------------------------------
def test_the_proxy_adds_the_round_trip_and_keeps_every_byte_in_order():
    upstream = socket.create_server(("127.0.0.1", 0))

    def echo() -> None:
        conn, _ = upstream.accept()
        while data := conn.recv(65536):
            conn.sendall(data)
        conn.close()

    threading.Thread(target=echo, daemon=True).start()
    with upstream, DelayProxy(rpc.Endpoint("127.0.0.1", upstream.getsockname()[1]), 40) as proxy:
        with socket.create_connection((proxy.endpoint.host, proxy.endpoint.port)) as c:
            payload = os.urandom(3_000_000)
            start = time.monotonic()
            threading.Thread(target=c.sendall, args=(payload,), daemon=True).start()
            got = b""
            while len(got) < len(payload):
                got += c.recv(1 << 20)
            assert got == payload
            start = time.monotonic()
            c.sendall(b"x")
            assert c.recv(1) == b"x"
            assert 0.040 <= time.monotonic() - start < 0.5


# Two rpc-servers on loopback ----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def rpc_binary():
    """llama.cpp's rpc-server, built once from the vendored source into the peer's build cache (the user's
    real one, or LOCALSPEC_PEER_DIR: a build cache, not state; CI keeps it between runs)."""
    if not llama_cpp.llama_supports_rpc():
        pytest.skip("this llama-cpp-python has no RPC backend (CI builds it with -DGGML_RPC=ON)")
    from _peer_cache import peer_build_cache

    from localspec.llama.programs import rpc_server_binary

    with peer_build_cache():
        return rpc_server_binary()


@pytest.fixture(scope="module")
def two_servers(rpc_binary):
    with local_servers(rpc_binary, 2) as servers:
        yield ",".join(str(s.endpoint) for s in servers)


def test_greedy_text_over_rpc_equals_the_local_run(two_servers):
    prompts = ["def fibonacci(n):", "The capital of France is"]
    with localspec.load(n_threads=1, n_ctx=512) as local:
        expected = {
            (p, s): str(local.generate(p, max_tokens=40, strategy=s))
            for p in prompts
            for s in ("none", "model", "ngram")
        }
    with localspec.load(n_threads=1, n_ctx=512, rpc=two_servers) as pipe:
        a, b = two_servers.split(",")
        assert pipe.placement["target"].startswith(f"RPC {a} ") and f", {b} " in pipe.placement["target"]
        assert pipe.placement["draft"] == "CPU"
        for (prompt, strategy), text in expected.items():
            assert str(pipe.generate(prompt, max_tokens=40, strategy=strategy)) == text, (prompt, strategy)


def test_tensor_split_moves_the_layers(two_servers):
    with localspec.load(draft="none", n_threads=1, n_ctx=256, rpc=two_servers, tensor_split=[0, 1]) as pipe:
        a, b = two_servers.split(",")
        assert a not in pipe.placement["target"] and f"{b} 4/4" in pipe.placement["target"]


def test_a_wrong_server_among_good_ones_is_named(two_servers):
    wrong = f"127.0.0.1:{free_port()}"
    start = time.monotonic()
    with pytest.raises(RpcError, match=f"RPC server {wrong}: nothing listens there"):
        localspec.load(n_threads=1, n_ctx=256, rpc=f"{two_servers},{wrong}")
    assert time.monotonic() - start < 10


_DIES_MID_GENERATION = textwrap.dedent(
    """
    import os, sys, time
    import localspec
    from localspec.bench.rpc_local import local_servers
    from localspec.errors import RpcError
    with local_servers(sys.argv[1], 2) as servers:
        pipe = localspec.load(n_threads=1, n_ctx=512, rpc=[str(s.endpoint) for s in servers])
        got = 0
        try:
            for _ in pipe.stream("def fibonacci(n):", max_tokens=200, strategy="model"):
                got += 1
                if got == 5:
                    servers[1].proc.kill()
        except RpcError as exc:
            print("ERROR", got, exc)
        start = time.monotonic()
        try:
            pipe.generate("again", max_tokens=4)
        except RpcError as exc:
            print("AGAIN", round(time.monotonic() - start, 1), exc.hint)
        pipe.close()
    print("EXIT CLEAN")
    """
)


def test_a_server_killed_mid_generation_ends_the_request_with_an_error(rpc_binary):
    """In a child process: after a lost server llama.cpp cannot reconnect in that process."""
    done = subprocess.run(
        [sys.executable, "-c", _DIES_MID_GENERATION, str(rpc_binary)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        check=False,
    )
    out = done.stdout
    assert done.returncode == 0, done.stderr[-2000:]
    error = next(line for line in out.splitlines() if line.startswith("ERROR"))
    assert 5 <= int(error.split()[1]) < 200 and "stopped" in error and "127.0.0.1:" in error
    again = next(line for line in out.splitlines() if line.startswith("AGAIN"))
    assert float(again.split()[1]) < 5 and "restart" in again
    assert "EXIT CLEAN" in out and "Traceback" not in done.stderr


def test_run_over_rpc_with_a_dead_server_exits_with_one_message(rpc_binary):
    with local_servers(rpc_binary, 1) as servers:
        address = str(servers[0].endpoint)
        servers[0].stop()
        done = subprocess.run(
            [sys.executable, "-m", "localspec", "run", "--rpc", address, "--threads", "1", "x"],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    assert done.returncode == 1 and "nothing listens there" in done.stderr and "Traceback" not in done.stderr


_GONE_AFTER_HELLO = textwrap.dedent(
    """
    import socket, struct, sys, threading
    import localspec
    from localspec.errors import RpcError
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    def serve():  # answers localspec's handshake, and is gone before llama.cpp connects (a restart)
        conn, _ = listener.accept()
        conn.recv(64)
        listener.close()
        conn.sendall(struct.pack("<Q", 28) + bytes([%d, %d, 0, 0]) + bytes(24))
        conn.close()
    threading.Thread(target=serve, daemon=True).start()
    try:
        localspec.load(draft="none", n_threads=1, n_ctx=256, rpc=f"127.0.0.1:{port}")
    except RpcError as exc:
        print("ERROR", port, exc.message, "|", exc.hint)
    print("EXIT CLEAN")
    """
)


def test_a_server_gone_between_the_handshake_and_llama_cpp_is_an_error_not_an_abort():
    """llama.cpp's client aborts with "Failed to connect to ..." (its message names no "RPC"): the call
    ends with an RpcError naming the server instead of the process."""
    if not llama_cpp.llama_supports_rpc():
        pytest.skip("this llama-cpp-python has no RPC backend (CI builds it with -DGGML_RPC=ON)")
    script = _GONE_AFTER_HELLO % (rpc.PROTO_MAJOR, rpc.PROTO_MINOR)
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=ROOT, check=False
    )
    assert done.returncode == 0, (done.returncode, done.stderr[-2000:])
    error = next(line for line in done.stdout.splitlines() if line.startswith("ERROR"))
    port = error.split()[1]
    assert f"RPC server 127.0.0.1:{port}" in error and "restart" in error, error
    assert "EXIT CLEAN" in done.stdout and "Traceback" not in done.stderr


_SERVE_LOSES_ITS_SERVER = textwrap.dedent(
    """
    import json, sys
    from fastapi.testclient import TestClient
    import localspec
    from localspec.bench.rpc_local import local_servers
    from localspec.serve.routes import create_app
    with local_servers(sys.argv[1], 1) as servers:
        pipe = localspec.load(draft="none", n_threads=1, n_ctx=256, rpc=str(servers[0].endpoint))
        with TestClient(create_app(pipe), base_url="http://127.0.0.1") as client:
            print("HEALTH-BEFORE", client.get("/health").status_code)
            model = client.get("/v1/models").json()["data"][0]["id"]
            servers[0].proc.kill()
            servers[0].proc.wait()
            r = client.post("/v1/completions", json={"model": model, "prompt": "def f(", "max_tokens": 16})
            print("GEN", r.status_code, json.dumps(r.json()))
            h = client.get("/health")
            print("HEALTH", h.status_code, json.dumps(h.json()))
    print("EXIT CLEAN")
    """
)


def test_serve_answers_503_server_error_and_health_says_the_backend_is_lost(rpc_binary):
    done = subprocess.run(
        [sys.executable, "-c", _SERVE_LOSES_ITS_SERVER, str(rpc_binary)],
        capture_output=True,
        text=True,
        timeout=180,
        cwd=ROOT,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    lines = {line.split(" ", 1)[0]: line.split(" ", 1)[1] for line in done.stdout.splitlines() if " " in line}
    assert lines["HEALTH-BEFORE"] == "200"
    status, body = lines["GEN"].split(" ", 1)
    error = json.loads(body)["error"]
    assert status == "503" and error["type"] == "server_error" and error["code"] == "backend_lost"
    assert "127.0.0.1:" in error["message"] and "restart" in error["message"]
    status, body = lines["HEALTH"].split(" ", 1)
    health = json.loads(body)
    assert status == "503" and health["status"] == "unavailable" and "127.0.0.1:" in health["reason"]


def _rpc_server_cli(port: int, host: str = "127.0.0.2") -> subprocess.Popen:
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "localspec",
            "rpc-server",
            "--host",
            host,
            "--port",
            str(port),
            "--threads",
            "1",
        ],
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )


def _said_serving(proc: subprocess.Popen) -> str:
    """The command's lines up to its "serving" line."""
    said = ""
    deadline = time.monotonic() + 60
    while "serving" not in said:
        assert time.monotonic() < deadline and proc.poll() is None, said
        said += proc.stderr.readline()  # type: ignore[union-attr]
    return said


def _listens(endpoint: rpc.Endpoint) -> bool:
    try:
        socket.create_connection((endpoint.host, endpoint.port), timeout=1).close()
        return True
    except OSError:
        return False


@pytest.mark.parametrize("how", ["SIGTERM", "SIGKILL"])
def test_rpc_server_names_its_own_address_and_dies_with_localspec(rpc_binary, monkeypatch, how):
    """--host 127.0.0.2 listens there and says so (it said 127.0.0.1, which refused); killed, even with
    SIGKILL, the llama.cpp server under it stops too."""
    import signal

    monkeypatch.setenv("LOCALSPEC_PEER_DIR", str(rpc_binary.parents[3]))
    endpoint = rpc.Endpoint("127.0.0.2", free_port())
    proc = _rpc_server_cli(endpoint.port)
    try:
        said = _said_serving(proc)
        assert f"--rpc {endpoint}" in said and "127.0.0.1" not in said.split("serving")[1], said
        assert rpc.hello(endpoint)[0] == rpc.PROTO_MAJOR
        proc.send_signal(getattr(signal, how))
        assert proc.wait(30) != 0
        deadline = time.monotonic() + 10
        while _listens(endpoint):
            assert time.monotonic() < deadline, f"the rpc-server went on after localspec got {how}"
            time.sleep(0.1)
    finally:
        proc.kill()
        proc.wait()


# localspec export ---------------------------------------------------------------------------------------
def _flags(argv: list[str]) -> set[str]:
    return {a for a in argv if a.startswith("-")}


def test_exported_llama_server_flags_exist_in_the_peer_build(rpc_binary, tmp_path):
    """Every flag an export emits is one the vendored llama.cpp registers (common/arg.cpp), every
    ``--spec-type`` name one it knows (common/speculative.cpp: chains such as ``ngram-mod,draft-simple``
    included), and, where the peer's llama-server is built, one its --help lists."""
    from localspec.hub.export import llama_server
    from localspec.llama import programs
    from localspec.settings import DraftSettings

    target, draft = tmp_path / "t.gguf", tmp_path / "d.gguf"
    emitted: set[str] = set()
    types: set[str] = set()
    for strategy in ("model", "ngram", "suffix", "model+ngram", "model+suffix", "mtp+ngram", "auto", "none"):
        out = llama_server(
            DraftSettings(strategy=strategy, n_max=6, p_min=0.6),
            target,
            draft,
            n_ctx=2048,
            threads=2,
            rpc="127.0.0.1:50052,127.0.0.1:50053",
        )
        emitted |= _flags(out.argv)
        if "--spec-type" in out.argv:
            types |= set(out.argv[out.argv.index("--spec-type") + 1].split(","))
        assert out.argv[out.argv.index("--rpc") + 1] == "127.0.0.1:50052,127.0.0.1:50053"
    model = llama_server(
        DraftSettings(strategy="model", n_max=6, p_min=0.6), target, draft, n_ctx=2048, threads=2
    )
    assert model.argv[model.argv.index("--spec-draft-n-max") + 1] == "6"
    assert model.argv[model.argv.index("--spec-draft-p-min") + 1] == "0.6"
    common = rpc_binary.parents[2] / "src" / "common"
    source = (common / "arg.cpp").read_text(encoding="utf-8")
    assert not [f for f in emitted if f'"{f}"' not in source]
    known = (common / "speculative.cpp").read_text(encoding="utf-8")
    assert {"ngram-mod", "draft-simple", "draft-mtp"} <= types
    assert not [t for t in types if f'{{"{t}",' not in known.replace(" ", "")]
    server = rpc_binary.parent / programs.SERVER
    if server.is_file():
        helptext = subprocess.run([str(server), "--help"], capture_output=True, text=True, timeout=60).stdout
        assert not [f for f in emitted if f not in helptext]


def test_vllm_export_carries_the_method_and_length_and_says_what_it_cannot():
    import json

    from localspec.hub.export import vllm
    from localspec.settings import DraftSettings

    def config(strategy: str, draft: Path | None = Path("d.gguf"), **kw) -> tuple[dict, list[str]]:
        out = vllm(DraftSettings(strategy=strategy, n_max=5), Path("t.gguf"), draft, n_ctx=4096, **kw)
        assert json.loads(out.argv[out.argv.index("--speculative-config") + 1]) == out.speculative
        return out.speculative, out.notes

    assert config("model")[0] == {"method": "draft_model", "model": "d.gguf", "num_speculative_tokens": 5}
    assert config("ngram")[0] == {
        "method": "ngram",
        "num_speculative_tokens": 5,
        "prompt_lookup_min": 2,
        "prompt_lookup_max": 4,
    }
    assert config("suffix", None)[0] == {"method": "suffix", "num_speculative_tokens": 5}
    spec, notes = config("model+suffix", rpc="127.0.0.1:50052")
    assert spec["method"] == "draft_model" and any("one method" in n for n in notes)
    assert any("--tensor-parallel-size" in n for n in notes)
    with pytest.raises(SettingsError, match="needs a draft model"):
        config("model", None)


def test_export_command_prints_one_command_line(tmp_path):
    from localspec.cli import main
    from localspec.constants import EMBEDDED_DRAFT, EMBEDDED_TARGET

    result = CliRunner().invoke(
        main,
        [
            "export",
            str(EMBEDDED_TARGET),
            "--draft",
            str(EMBEDDED_DRAFT),
            "--to",
            "llama-server",
            "--n-max",
            "7",
        ],
    )
    assert result.exit_code == 0, result.output
    line = result.stdout.strip()
    assert line.startswith("llama-server --model ") and "--spec-draft-n-max 7" in line
    result = CliRunner().invoke(main, ["export", "tiny-embedded", "--to", "vllm", "--json"])
    assert result.exit_code == 0, result.output
    assert '"num_speculative_tokens"' in result.stdout


@pytest.mark.parametrize(
    "args, says",
    [
        (["--rpc-rtt", "0,-5"], "'-5' is not a round trip from 0 to 1000 ms"),
        (["--rpc-rtt", "5", "--strategy", "ngram"], "--strategy does not apply with --rpc-rtt"),
        (["--rpc-rtt", "5", "--peer"], "--peer does not apply with --rpc-rtt"),
        (["--rpc-rtt", "5", "--tensor-split", "1,1"], "--tensor-split does not apply with --rpc-rtt"),
        (["--rpc-rtt", "5", "--tune"], "--tune and --rpc-rtt are two benches"),
    ],
)
def test_the_rpc_bench_refuses_what_it_does_not_read_before_anything_starts(
    tmp_path, monkeypatch, args, says
):
    from localspec.bench import rpc_rtt
    from localspec.cli import main

    monkeypatch.setattr(rpc_rtt, "run_rtt_bench", lambda *a, **k: pytest.fail("ran for an invalid option"))
    res = CliRunner().invoke(main, ["bench", "-q", "--out", str(tmp_path / "out"), *args])
    assert res.exit_code == 2, res.output
    assert says in " ".join(res.output.split()), res.output


@pytest.mark.slow
def test_the_rpc_bench_runs_the_pair_local_and_over_rpc_and_renders_its_file_again(rpc_binary, tmp_path):
    """The embedded pair local and at +2 ms: every strategy on every pipeline, the texts as local, the file
    dated and naming the CPU, and --from-json prints the same table."""
    from _peer_cache import peer_build_cache

    from localspec.cli import main

    out = tmp_path / "out"
    args = ["bench", "-q", "--rpc-rtt", "2", "--limit", "1", "-w", "code", "-n", "6", "--out", str(out)]
    with peer_build_cache():
        res = CliRunner().invoke(main, args)
    assert res.exit_code == 0, res.output
    data = json.loads((out / "rpc.json").read_text())
    assert data["kind"] == "localspec-rpc-bench" and data["date"][:4].isdigit() and data["cpu"]
    rows = {(r["where"], r["strategy"]): r for r in data["summary"]}
    assert set(rows) == {(w, s) for w in ("local", "rpc 2 ms") for s in ("none", "model", "ngram")}
    assert all(r["same_text"] == "1/1" and r["tok_s"] > 0 for r in rows.values())
    assert data["placement"]["rpc 2 ms"] != data["placement"]["local"]
    again = CliRunner().invoke(main, ["bench", "--from-json", str(out / "rpc.json")])
    assert again.exit_code == 0, again.output
    assert again.output.strip() == (out / "rpc.md").read_text().strip()
