"""localspec.hub.download against a local Hub stand-in: real huggingface_hub, real HTTP, temporary cache."""

from __future__ import annotations

from pathlib import Path

import pytest
from _gguf_build import ordinary_tokens, vocab_model
from _hub_server import FakeHub

from localspec import constants
from localspec.errors import (
    DiskSpaceError,
    DownloadError,
    GatedRepoError,
    IncompatiblePairError,
    ModelNotFoundError,
    OfflineError,
)
from localspec.hub import download as hub
from localspec.hub import search as hub_search
from localspec.hub.presets import HubRef, save_user_preset
from localspec.units import format_bytes

SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
VOCAB = SPECIAL + ordinary_tokens(400)


@pytest.fixture
def fake_hub(tmp_path, monkeypatch):
    """A running FakeHub with HF_ENDPOINT, HF_HOME and the user presets folder pointed at tmp_path."""
    server = FakeHub(tmp_path / "served").start()
    monkeypatch.setenv("HF_ENDPOINT", server.endpoint)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("HF_HUB_DISABLE_XET", "1")
    monkeypatch.setenv("LOCALSPEC_CONFIG", str(tmp_path / "config"))
    for var in (
        "HF_HUB_CACHE",
        "HUGGINGFACE_HUB_CACHE",
        "HF_TOKEN",
        "HUGGING_FACE_HUB_TOKEN",
        "HF_HUB_OFFLINE",
    ):
        monkeypatch.delenv(var, raising=False)
    yield server
    server.stop()


@pytest.fixture
def ggufs(tmp_path) -> dict[str, Path]:
    d = tmp_path / "src"
    return {
        "target": vocab_model(d / "target.gguf", VOCAB, control={0, 1, 2}, tensor_bytes=2 << 20, name="t"),
        "draft": vocab_model(d / "draft.gguf", VOCAB, control={0, 1, 2}, tensor_bytes=512 << 10, name="d"),
        # same size, but the ordinary tokens differ from id 3 on: a different tokenizer
        "alien": vocab_model(
            d / "alien.gguf",
            SPECIAL + [t + "x" for t in ordinary_tokens(400)],
            control={0, 1, 2},
            tensor_bytes=64 << 10,
            name="a",
        ),
    }


def _pair_preset(name: str, target: tuple[str, str], draft: tuple[str, str]) -> None:
    save_user_preset(
        {
            "name": name,
            "target": {"repo": target[0], "file": target[1]},
            "draft_model": {"repo": draft[0], "file": draft[1]},
            "download_size": "3 MB",
        }
    )


def _incomplete_files(root: Path) -> list[Path]:
    return [p for p in root.rglob("*") if p.name.endswith(".incomplete")]


def test_preset_download_of_the_embedded_pair(fake_hub, tmp_path):
    # the real embedded pair (shipped in the package), served by the local Hub like any repository
    target, draft = constants.EMBEDDED_TARGET, constants.EMBEDDED_DRAFT
    fake_hub.add_repo(
        "localspec/tiny-embedded-GGUF",
        {"tiny-target.gguf": target, "tiny-draft.gguf": draft, "README.md": b"# tiny pair\n"},
    )
    _pair_preset(
        "tiny-remote",
        ("localspec/tiny-embedded-GGUF", "tiny-target*.gguf"),
        ("localspec/tiny-embedded-GGUF", "tiny-draft*.gguf"),
    )
    seen: list[tuple[str, int, int]] = []
    pair = hub.ensure_preset("tiny-remote", progress=lambda *a: seen.append(a))

    cache = tmp_path / "hf" / "hub"
    assert pair.target.is_relative_to(cache) and pair.draft.is_relative_to(cache)
    assert pair.target.read_bytes() == target.read_bytes()
    assert pair.draft.read_bytes() == draft.read_bytes()
    assert pair.verdict == "identical"
    # the standard cache layout other tools read: refs/main -> snapshots/<commit>/file -> blobs/<sha256>
    repo_dir = cache / "models--localspec--tiny-embedded-GGUF"
    commit = (repo_dir / "refs" / "main").read_text()
    assert (repo_dir / "snapshots" / commit / "tiny-target.gguf").exists()
    # progress: per-stage byte counts that end at the total, then the pair check
    t_total = target.stat().st_size
    assert ("target", t_total, t_total) in seen
    assert max(d for s, d, t in seen if s == "draft") == draft.stat().st_size
    assert seen[-1] == ("check", 1, 1)
    assert _incomplete_files(cache) == []
    # a second call finds everything in the cache: no file is fetched again
    fake_hub.log.clear()
    again = hub.ensure_preset("tiny-remote")
    assert again.target == pair.target
    assert [e for e in fake_hub.log if "/resolve/" in e.path and e.method == "GET"] == []
    # and the one-line API runs the downloaded pair from the cache
    import localspec

    text = localspec.generate("def fib(n):", preset="tiny-remote", max_tokens=8, n_threads=2, n_ctx=512)
    assert text.stats.generated_tokens == 8 and text.stats.pairing_note == "preset tiny-remote"
    assert text.stats.strategy.name == "model" and text.stats.draft_name == "tiny-draft.gguf"


def test_resume_after_the_connection_drops(fake_hub, ggufs, tmp_path):
    # huggingface_hub streams in 10 MiB chunks and resumes from the last whole chunk it wrote, so the
    # file must be larger than one chunk and the cut must come after the first chunk.
    big = vocab_model(tmp_path / "big.gguf", VOCAB, control={0, 1, 2}, tensor_bytes=24 << 20)
    fake_hub.add_repo("org/big-GGUF", {"big-q4_k_m.gguf": big})
    fake_hub.add_repo("org/small-GGUF", {"small-q4_k_m.gguf": ggufs["draft"]})
    _pair_preset("cut", ("org/big-GGUF", "*q4_k_m.gguf"), ("org/small-GGUF", "*q4_k_m.gguf"))
    cut_at = 13 << 20
    fake_hub.drop_after["org/big-GGUF/big-q4_k_m.gguf"] = cut_at

    pair = hub.ensure_preset("cut")

    assert pair.target.read_bytes() == big.read_bytes()
    gets = fake_hub.requests_for("big-q4_k_m.gguf", "GET")
    assert len(gets) == 2, gets
    first, second = gets
    assert first.range_start is None and first.bytes_sent == cut_at  # cut mid-file
    assert second.status == 206 and 0 < second.range_start <= cut_at  # resumed with a Range request
    assert second.range_start + second.bytes_sent == big.stat().st_size  # ... and finished the file
    assert second.bytes_sent < big.stat().st_size - (8 << 20)  # not a restart from zero
    assert _incomplete_files(tmp_path / "hf") == []


def test_gated_repo_without_and_with_a_token(fake_hub, ggufs, monkeypatch):
    fake_hub.add_repo("google/secret-GGUF", {"secret-q4_0.gguf": ggufs["target"]}, gated=True)
    fake_hub.add_repo("org/small-GGUF", {"small-q4_0.gguf": ggufs["draft"]})
    _pair_preset("secret", ("google/secret-GGUF", "*q4_0.gguf"), ("org/small-GGUF", "*q4_0.gguf"))

    with pytest.raises(GatedRepoError) as info:
        hub.ensure_preset("secret")
    text = str(info.value)
    assert "google/secret-GGUF is a gated repository (401)" in text
    assert f"{fake_hub.endpoint}/google/secret-GGUF" in info.value.hint  # where to accept the terms
    assert "HF_TOKEN" in info.value.hint and "hf auth login" in info.value.hint

    monkeypatch.setenv("HF_TOKEN", "hf_no_access")
    with pytest.raises(GatedRepoError, match=r"\(403\).*not been granted access"):
        hub.ensure_preset("secret")
    assert fake_hub.requests_for("secret-q4_0.gguf")[-1].authorization == "Bearer hf_no_access"

    fake_hub.tokens["hf_granted"] = {"google/secret-GGUF"}
    monkeypatch.setenv("HF_TOKEN", "hf_granted")
    pair = hub.ensure_preset("secret")
    assert pair.target.read_bytes() == ggufs["target"].read_bytes()


def test_missing_file_lists_what_the_repo_has(fake_hub, ggufs):
    fake_hub.add_repo(
        "org/m-GGUF", {"m-Q8_0.gguf": ggufs["draft"], "m-Q4_K_M.gguf": ggufs["draft"], "README.md": b"x"}
    )
    # a direct fetch of a file that is not there: the server answers 404, the message lists the repo
    with pytest.raises(DownloadError) as info:
        hub.download_file(hub.RemoteFile("org/m-GGUF", "m-Q2_K.gguf", "main", None))
    msg = str(info.value)
    assert "no file m-Q2_K.gguf (404)" in msg and "m-Q4_K_M.gguf" in msg and "m-Q8_0.gguf" in msg
    assert any(e.status == 404 for e in fake_hub.requests_for("m-Q2_K.gguf"))
    # a preset whose pattern matches nothing fails before any download, with the same listing
    _pair_preset("nomatch", ("org/m-GGUF", "*IQ1_S*.gguf"), ("org/m-GGUF", "*Q8_0.gguf"))
    with pytest.raises(DownloadError, match=r"no single model matches '\*IQ1_S\*\.gguf'.*m-Q4_K_M\.gguf"):
        hub.ensure_preset("nomatch")


def test_unknown_repository(fake_hub):
    _pair_preset("ghost", ("nobody/ghost-GGUF", "*.gguf"), ("nobody/ghost-GGUF", "*.gguf"))
    with pytest.raises(DownloadError, match="nobody/ghost-GGUF was not found"):
        hub.ensure_preset("ghost")


def test_offline_mode_uses_the_cache_and_names_missing_files(fake_hub, ggufs, monkeypatch):
    fake_hub.add_repo("org/t-GGUF", {"t-Q4_K_M.gguf": ggufs["target"]})
    fake_hub.add_repo("org/d-GGUF", {"d-Q4_K_M.gguf": ggufs["draft"]})
    _pair_preset("both", ("org/t-GGUF", "*Q4_K_M.gguf"), ("org/d-GGUF", "*Q4_K_M.gguf"))
    _pair_preset("half", ("org/t-GGUF", "*Q4_K_M.gguf"), ("org/other-GGUF", "*Q4_K_M.gguf"))
    online = hub.ensure_preset("both")

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    fake_hub.log.clear()
    offline = hub.ensure_preset("both")
    assert (offline.target, offline.draft) == (online.target, online.draft)
    assert fake_hub.log == []  # not a single request
    with pytest.raises(OfflineError) as info:
        hub.ensure_preset("half")
    assert "org/other-GGUF@main/*Q4_K_M.gguf is not in the cache" in str(info.value)
    assert "unset HF_HUB_OFFLINE and run `localspec download half`" in info.value.hint
    assert fake_hub.log == []


def test_a_user_preset_whose_path_is_missing_says_to_fix_that_file(tmp_path):
    save_user_preset({"name": "mine", "target": {"path": str(tmp_path / "gone.gguf")}, "draft_model": "none"})
    with pytest.raises(ModelNotFoundError) as info:
        hub.ensure_preset("mine", check=False)
    assert "gone.gguf does not exist" in info.value.message
    assert "reinstall" not in info.value.hint and "fix the `path`" in info.value.hint


def test_too_little_disk_space_stops_before_downloading(fake_hub, ggufs, monkeypatch, tmp_path):
    fake_hub.add_repo("org/t-GGUF", {"t-Q4_K_M.gguf": ggufs["target"]})
    fake_hub.add_repo("org/d-GGUF", {"d-Q4_K_M.gguf": ggufs["draft"]})
    _pair_preset("full-disk", ("org/t-GGUF", "*Q4_K_M.gguf"), ("org/d-GGUF", "*Q4_K_M.gguf"))
    asked: list[Path] = []
    monkeypatch.setattr(hub, "disk_free", lambda p: asked.append(p) or 1_000_000)

    with pytest.raises(DiskSpaceError) as info:
        hub.ensure_preset("full-disk")
    need = ggufs["target"].stat().st_size + ggufs["draft"].stat().st_size
    assert f"needs {format_bytes(need)} (2 file(s)) but only 1.0 MB is free" in str(info.value)
    assert "HF_HUB_CACHE" in info.value.hint
    assert asked == [tmp_path / "hf" / "hub"]
    assert [e for e in fake_hub.log if "/resolve/" in e.path] == []


def test_sharded_gguf_is_fetched_whole(fake_hub, ggufs):
    data = ggufs["target"].read_bytes()
    third = len(data) // 3
    shards = {
        "m-q4_k_m-00001-of-00003.gguf": data[:third],
        "m-q4_k_m-00002-of-00003.gguf": data[third : 2 * third],
        "m-q4_k_m-00003-of-00003.gguf": data[2 * third :],
        "m-q8_0.gguf": b"GGUF-not-this-one",
    }
    fake_hub.add_repo("org/split-GGUF", shards)
    resolved = hub.resolve_remote(HubRef(repo_id="org/split-GGUF", filename="m-q4_k_m*.gguf"))
    assert [f.filename for f in resolved.files] == sorted(n for n in shards if "q4_k_m" in n)
    first = hub._fetch_resolved(resolved, "target", None)
    assert first.name == "m-q4_k_m-00001-of-00003.gguf"
    assert b"".join((first.parent / n).read_bytes() for n in sorted(shards)[:3]) == data


def test_select_files_rules():
    names = [
        "a-Q4_K_M.gguf",
        "a-Q8_0.gguf",
        "mmproj-a-f16.gguf",
        "b-00001-of-00002.gguf",
        "b-00002-of-00002.gguf",
    ]
    assert hub.select_files(names, "*q4_k_m.gguf") == ["a-Q4_K_M.gguf"]  # case-insensitive
    assert hub.select_files(names, "b-00001-of-00002.gguf") == [
        "b-00001-of-00002.gguf",
        "b-00002-of-00002.gguf",
    ]
    with pytest.raises(LookupError, match="ambiguous"):
        hub.select_files(names, "a-*.gguf")
    with pytest.raises(LookupError, match="missing shard"):
        hub.select_files(["c-00001-of-00003.gguf", "c-00003-of-00003.gguf"], "c*.gguf")


def test_hub_search_refuses_offline_mode_before_any_request(fake_hub, tmp_path, monkeypatch):
    big = vocab_model(tmp_path / "big.gguf", VOCAB, control={0, 1, 2}, tensor_bytes=1 << 20)
    fake_hub.add_repo("org/big-GGUF", {"big-Q4_K_M.gguf": big})
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    fake_hub.log.clear()
    for search in (
        lambda: hub_search.search_hub_drafts("org/big-GGUF"),
        lambda: hub_search.remote_fingerprint("org/big-GGUF", "big-Q4_K_M.gguf"),
    ):
        with pytest.raises(OfflineError) as info:
            search()
        assert "searches the Hub" in info.value.message and "HF_HUB_OFFLINE is set" in info.value.message
        assert info.value.hint.startswith("unset HF_HUB_OFFLINE") and "HF_HUB_OFFLINE=1" not in str(
            info.value
        )
    assert fake_hub.log == []


def test_remote_fingerprint_reads_only_the_header(fake_hub, tmp_path):
    big = vocab_model(tmp_path / "big.gguf", VOCAB, control={0, 1, 2}, tensor_bytes=24 << 20)
    size = big.stat().st_size
    fake_hub.add_repo("org/big-GGUF", {"big-Q4_K_M.gguf": big})

    from localspec.gguf import meta as gguf_meta
    from localspec.gguf import vocab

    remote = hub_search.remote_fingerprint("org/big-GGUF", "big-Q4_K_M.gguf")
    local = vocab.fingerprint(gguf_meta.read_metadata(big, tensors=False))
    assert remote.fingerprint == local.fingerprint and remote.tokens == local.tokens
    reads = [e for e in fake_hub.requests_for("big-Q4_K_M.gguf", "GET")]
    assert reads and all(e.status == 206 for e in reads)  # range requests only
    furthest = max(e.range_end for e in reads)
    sent = sum(e.bytes_sent for e in reads)
    assert furthest < 3 << 20 and sent < 3 << 20, (furthest, sent, size)  # a few MB of a 24 MB file
    assert size > 8 * furthest


def test_pair_check_refuses_an_incompatible_pair(fake_hub, ggufs):
    fake_hub.add_repo("org/t-GGUF", {"t-Q4_K_M.gguf": ggufs["target"]})
    fake_hub.add_repo("other/alien-GGUF", {"alien-Q4_K_M.gguf": ggufs["alien"]})
    _pair_preset("mismatch", ("org/t-GGUF", "*Q4_K_M.gguf"), ("other/alien-GGUF", "*Q4_K_M.gguf"))
    with pytest.raises(IncompatiblePairError) as info:
        hub.ensure_preset("mismatch")
    assert "preset 'mismatch': draft alien-Q4_K_M.gguf does not fit target t-Q4_K_M.gguf" in str(info.value)
    assert info.value.reasons  # the verdict's reasons travel with the error


def test_pair_differing_only_in_special_tokens_is_used_with_a_mask(fake_hub, tmp_path):
    # like DeepSeek-R1-Distill-Qwen vs Qwen2.5: same ordinary tokens, other special tokens after them
    # (and a longer list); the pair is usable with the draft barred from the differing ids
    ordinary = ordinary_tokens(400)
    qwen = ordinary + ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    distill = ordinary + ["<|begin_of_sentence|>", "<|end_of_sentence|>", "<think>", "<|pad_0|>", "<|pad_1|>"]
    specials = set(range(400, 405))
    kw = {"bos": 400, "eos": 401, "tensor_bytes": 256 << 10}
    target = vocab_model(tmp_path / "distill.gguf", distill, control=specials, **kw)
    draft = vocab_model(tmp_path / "qwen.gguf", qwen, control=specials, **kw)
    fake_hub.add_repo("org/distill-GGUF", {"distill-Q4_K_M.gguf": target})
    fake_hub.add_repo("org/qwen-GGUF", {"qwen-Q4_K_M.gguf": draft})
    _pair_preset("masked", ("org/distill-GGUF", "*Q4_K_M.gguf"), ("org/qwen-GGUF", "*Q4_K_M.gguf"))
    pair = hub.ensure_preset("masked")
    assert pair.verdict == "compatible-with-mask", pair.reasons
    assert pair.reasons


def test_redirected_downloads_and_metadata(tmp_path, monkeypatch, ggufs):
    """The real Hub answers LFS files with a 302 to a CDN on another host; that path works too."""
    with FakeHub(tmp_path / "served", redirect_lfs=True) as server:
        monkeypatch.setenv("HF_ENDPOINT", server.endpoint)
        monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
        monkeypatch.setenv("LOCALSPEC_CONFIG", str(tmp_path / "config"))
        monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
        server.add_repo("org/t-GGUF", {"t-Q4_K_M.gguf": ggufs["target"]})
        server.add_repo("org/d-GGUF", {"d-Q4_K_M.gguf": ggufs["draft"]})
        _pair_preset("cdn", ("org/t-GGUF", "*Q4_K_M.gguf"), ("org/d-GGUF", "*Q4_K_M.gguf"))
        pair = hub.ensure_preset("cdn")
        assert pair.target.read_bytes() == ggufs["target"].read_bytes()
        assert any(e.path.startswith("/cdn-lfs/") and e.method == "GET" for e in server.log)


def test_find_drafts_ranks_candidates(fake_hub, ggufs):
    fake_hub.add_repo("Qwen/Toy-7B-Instruct-GGUF", {"toy-7b-instruct-q4_k_m.gguf": ggufs["target"]})
    fake_hub.add_repo(
        "Qwen/Toy-0.5B-Instruct-GGUF",
        {"toy-0.5b-instruct-q4_k_m.gguf": ggufs["draft"], "toy-0.5b-instruct-q8_0.gguf": ggufs["draft"]},
    )
    fake_hub.add_repo("someone/Toy-1B-GGUF", {"Toy-1B-Q4_K_M.gguf": ggufs["alien"]})
    fake_hub.add_repo(
        "Qwen/Toy-14B-Instruct-GGUF", {"toy-14b-q4_k_m.gguf": ggufs["draft"]}
    )  # larger: skipped
    fake_hub.add_repo("Qwen/Toy-0.5B-Instruct", {"model.safetensors": b"x"})  # not GGUF: skipped

    found = hub_search.search_hub_drafts("Qwen/Toy-7B-Instruct-GGUF")
    assert [c.repo_id for c in found] == ["Qwen/Toy-0.5B-Instruct-GGUF", "someone/Toy-1B-GGUF"]
    best, worst = found
    assert (best.verdict, best.filename, best.same_author) == (
        "identical",
        "toy-0.5b-instruct-q4_k_m.gguf",
        True,
    )
    assert best.download_bytes == ggufs["draft"].stat().st_size
    assert worst.verdict == "incompatible" and worst.reasons
    # only headers were read: no candidate was downloaded whole
    assert all(e.status == 206 for e in fake_hub.log if "/resolve/" in e.path and e.method == "GET")


def test_embedded_preset_needs_no_network(monkeypatch, tmp_path):
    if not (constants.EMBEDDED_TARGET.is_file() and constants.EMBEDDED_DRAFT.is_file()):
        with pytest.raises(Exception, match="does not exist"):
            hub.ensure_preset(constants.EMBEDDED_PRESET, check=False)
        return
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # nothing listens there
    pair = hub.ensure_preset(constants.EMBEDDED_PRESET)
    assert (pair.target, pair.draft) == (constants.EMBEDDED_TARGET, constants.EMBEDDED_DRAFT)


# ------------------------------------------------------------------------ what the server sends is checked


def _blobs(tmp_path: Path, repo: str) -> Path:
    return tmp_path / "hf" / "hub" / ("models--" + repo.replace("/", "--")) / "blobs"


def test_a_corrupt_download_is_deleted_and_fetched_again_next_run(fake_hub, ggufs, tmp_path):
    fake_hub.add_repo("org/t-GGUF", {"t-Q4_K_M.gguf": ggufs["target"]})
    fake_hub.add_repo("org/d-GGUF", {"d-Q4_K_M.gguf": ggufs["draft"]})
    _pair_preset("bad-mirror", ("org/t-GGUF", "*Q4_K_M.gguf"), ("org/d-GGUF", "*Q4_K_M.gguf"))
    fake_hub.corrupt.add("org/t-GGUF/t-Q4_K_M.gguf")  # right size and headers, one byte wrong

    with pytest.raises(DownloadError) as info:
        hub.ensure_preset("bad-mirror")
    text = str(info.value)
    assert "org/t-GGUF/t-Q4_K_M.gguf: the downloaded file is corrupt (SHA-256" in text
    assert "it was deleted from the cache" in text and "run the command again" in info.value.hint
    assert list(_blobs(tmp_path, "org/t-GGUF").iterdir()) == []  # no corrupt blob kept
    snapshots = _blobs(tmp_path, "org/t-GGUF").parent / "snapshots"
    assert [p for p in snapshots.rglob("*") if p.name.endswith(".gguf")] == []

    fake_hub.corrupt.clear()  # the next run fetches the file again and gets the right bytes
    pair = hub.ensure_preset("bad-mirror")
    assert pair.target.read_bytes() == ggufs["target"].read_bytes()


def test_a_corrupt_small_git_file_is_caught_by_its_git_sha1(fake_hub, tmp_path):
    fake_hub.add_repo("org/r", {"README.md": b"# a model card\n" * 50})
    fake_hub.corrupt.add("org/r/README.md")
    remote = hub.RemoteFile("org/r", "README.md", "main", 750)
    with pytest.raises(DownloadError, match=r"corrupt \(git SHA-1"):
        hub.download_file(remote)
    assert list(_blobs(tmp_path, "org/r").iterdir()) == []
    fake_hub.corrupt.clear()
    assert hub.download_file(remote).read_bytes() == b"# a model card\n" * 50


@pytest.mark.parametrize(
    "name",
    ["../../../evil.gguf", "/tmp/evil.gguf", "sub/../../evil.gguf", "a\\..\\evil.gguf", "C:/evil.gguf"],
)
def test_a_hostile_listing_cannot_point_outside_the_cache(fake_hub, ggufs, tmp_path, name):
    outside = tmp_path / "evil.gguf"
    outside.write_bytes(ggufs["target"].read_bytes())  # a local file a hostile name could resolve to
    fake_hub.add_repo("org/t-GGUF", {"t-Q4_K_M.gguf": ggufs["target"]})
    fake_hub.extra_siblings["org/t-GGUF"] = [{"rfilename": name, "size": 10}]
    ref = HubRef(repo_id="org/t-GGUF", filename="*evil.gguf")
    with pytest.raises(DownloadError, match="refusing to use it under") as info:
        hub.resolve_remote(ref)
    assert repr(name) in str(info.value) and "HF_ENDPOINT" in info.value.hint
    # the good file of the same listing still resolves
    assert [
        f.filename for f in hub.resolve_remote(HubRef(repo_id="org/t-GGUF", filename="t-*.gguf")).files
    ] == ["t-Q4_K_M.gguf"]


def test_safe_join_is_the_one_rule(tmp_path):
    assert hub.safe_join(tmp_path, "a/b.gguf") == tmp_path / "a" / "b.gguf"
    for bad in ("", ".", "..", "a/./b", "a//b", "/abs", "..\\x", "x\0y", "D:x"):
        with pytest.raises(DownloadError):
            hub.safe_join(tmp_path, bad)


def test_a_bad_revision_is_refused_before_any_request(fake_hub, ggufs, tmp_path):
    fake_hub.add_repo("org/t-GGUF", {"t-Q4_K_M.gguf": ggufs["target"]})
    fake_hub.log.clear()
    bad = HubRef(repo_id="org/t-GGUF", filename="t-Q4_K_M.gguf", revision="../../../../escaped")
    for call in (
        lambda: hub.resolve_remote(bad),
        lambda: hub.resolve_cached(bad),
        lambda: hub.download_file(hub.RemoteFile("org/t-GGUF", "t-Q4_K_M.gguf", bad.revision, None)),
        lambda: hub_search.remote_metadata("org/t-GGUF", "t-Q4_K_M.gguf", bad.revision),
    ):
        with pytest.raises(DownloadError, match="revision") as info:
            call()
        assert "40-hex commit" in info.value.hint
    assert fake_hub.log == []
    assert not any("escaped" in str(p) for p in tmp_path.rglob("*"))


def test_stale_incomplete_files_are_cleaned_and_live_ones_kept(fake_hub, ggufs, tmp_path):
    import os
    import time

    fake_hub.add_repo("org/t-GGUF", {"t-Q4_K_M.gguf": ggufs["target"]})
    fake_hub.add_repo("org/d-GGUF", {"d-Q4_K_M.gguf": ggufs["draft"]})
    _pair_preset("leftovers", ("org/t-GGUF", "*Q4_K_M.gguf"), ("org/d-GGUF", "*Q4_K_M.gguf"))
    blobs = _blobs(tmp_path, "org/t-GGUF")
    blobs.mkdir(parents=True)
    dead, live = blobs / ("a" * 64 + ".1234abcd.incomplete"), blobs / ("b" * 64 + ".5678abcd.incomplete")
    dead.write_bytes(b"x" * 1000)
    live.write_bytes(b"y" * 1000)
    old = time.time() - 2 * hub.STALE_INCOMPLETE_S
    os.utime(dead, (old, old))

    hub.ensure_preset("leftovers")
    assert not dead.exists() and live.exists()


def test_ctrl_c_stops_a_download_at_once_and_leaves_nothing(fake_hub, ggufs, tmp_path):
    big = vocab_model(tmp_path / "big.gguf", VOCAB, control={0, 1, 2}, tensor_bytes=24 << 20)
    fake_hub.add_repo("org/big-GGUF", {"big-q4_k_m.gguf": big})
    fake_hub.add_repo("org/small-GGUF", {"small-q4_k_m.gguf": ggufs["draft"]})
    _pair_preset("interrupted", ("org/big-GGUF", "*q4_k_m.gguf"), ("org/small-GGUF", "*q4_k_m.gguf"))
    calls = []

    def progress(stage, done, total):
        calls.append(done)
        if stage == "target" and 0 < done < total:
            raise KeyboardInterrupt  # what Ctrl-C raises in the main thread

    with pytest.raises(KeyboardInterrupt):
        hub.ensure_preset("interrupted", progress=progress)
    gets = fake_hub.requests_for("big-q4_k_m.gguf", "GET")
    assert len(gets) <= 1 and len(calls) == 1  # no retry, no resume, no further progress
    assert _incomplete_files(tmp_path / "hf") == []
    assert list(_blobs(tmp_path, "org/big-GGUF").iterdir()) == []


def test_xet_headers_do_not_switch_localspec_off_plain_http(fake_hub, ggufs, monkeypatch):
    import huggingface_hub.constants as hf_constants

    # as in a process where huggingface_hub was imported before anyone set HF_HUB_DISABLE_XET
    monkeypatch.setattr(hf_constants, "HF_HUB_DISABLE_XET", False)
    fake_hub.xet = True
    fake_hub.add_repo("org/t-GGUF", {"t-Q4_K_M.gguf": ggufs["target"]})
    fake_hub.add_repo("org/d-GGUF", {"d-Q4_K_M.gguf": ggufs["draft"]})
    _pair_preset("xet", ("org/t-GGUF", "*Q4_K_M.gguf"), ("org/d-GGUF", "*Q4_K_M.gguf"))

    pair = hub.ensure_preset("xet")
    assert pair.target.read_bytes() == ggufs["target"].read_bytes()
    assert [e.path for e in fake_hub.log if "xet-read-token" in e.path] == []
    assert len(fake_hub.requests_for("t-Q4_K_M.gguf", "GET")) == 1


def test_a_client_error_from_the_hub_is_not_worth_retrying_and_carries_no_mdn_link():
    import httpx
    from huggingface_hub import errors as hf

    from localspec.hub.download import translate_error

    def answered(code: int) -> str:
        r = httpx.Response(code, request=httpx.Request("GET", "http://hub.example/api/models/a/b"))
        text = f"Client error '{code}' for url 'http://hub.example'\nFor more information check: https://developer.mozilla.org/x"
        return str(translate_error(hf.HfHubHTTPError(text, response=r), "a/b", "f.gguf"))

    assert "answered 404" in answered(404) and "retrying will not change" in answered(404)
    assert "mozilla" not in answered(404) and "mozilla" not in answered(500)
    assert "try again later" in answered(500) and "try again later" in answered(429)


def test_a_search_with_the_hub_unreachable_does_not_send_the_user_to_offline_mode(monkeypatch, tmp_path):
    """download's hint (with the files cached, set HF_HUB_OFFLINE=1) led find-draft into its refusal of
    offline mode; a search needs the Hub, and `localspec pair` ranks the local drafts instead."""
    from localspec.errors import DownloadError

    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # nothing listens on the discard port
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    with pytest.raises(DownloadError) as err:
        hub_search.search_hub_drafts("Qwen/Qwen2.5-Coder-7B-Instruct-GGUF")
    assert "HF_HUB_OFFLINE=1" not in str(err.value) and "localspec pair TARGET" in (err.value.hint or "")
