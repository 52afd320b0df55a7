"""The docs' command lines that run offline in seconds are run, as written, and exit 0.

tests/test_docs.py parses every ``localspec ...`` line of README.md and docs/ with the real click parser; this
file runs the ones the embedded pair can run (a ``run`` line without ``-n`` generates 8 tokens): the files a
line names (``target.gguf``, ``T.gguf``, ``qwen-1.5b.gguf``, ``~/models/qwen-7b.gguf``...) are copies of the
embedded target and draft in a scratch folder and home, the Hub is off (``HF_HUB_OFFLINE=1``) and the caches
are scratch folders; the lines that download (the README's quick start among them) run against a local
stand-in for the Hub whose Qwen2.5-Coder repositories hold the embedded pair. Every other line is parsed only,
for a reason this file names (it downloads, runs until stopped, needs rpc-servers or minutes of a real model);
a line that is neither run nor given a reason fails here, so every new line is decided.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from _hub_server import FakeHub
from click.testing import CliRunner
from test_docs import DOCS, ROOT, Quote, quotes

from localspec.cli import main
from localspec.constants import EMBEDDED_DRAFT, EMBEDDED_TARGET

# the lines that run, as the docs write them (what follows ``localspec``), and the stdin a line reads
RUN: dict[str, str | None] = {
    "--help": None,
    "--version": None,
    "run --help": None,
    'run "def fib(n):"': None,
    'run --baseline "def fib(n):"': None,
    'run --json "def fib(n):"': None,
    "--traceback run ...": None,
    'run -t qwen-1.5b.gguf -d qwen-0.5b.gguf --baseline "def quicksort(xs):"': None,
    'run -t qwen-1.5b.gguf --draft ngram "Shorten: ..."': None,
    'run -t qwen-1.5b.gguf --strategy suffix "..."': None,
    'run -t qwen-1.5b.gguf --strategy auto "..."': None,  # measures the embedded pair's costs first: seconds
    'run -t qwen-1.5b.gguf --chat --json-schema person.json "Who is Ada?"': None,
    "run -t qwen-1.5b.gguf --n-ctx 8192 -n 512": "notes: a line of text to continue\n",
    'run -t target.gguf --draft ngram "..."': None,
    'run -t target.gguf -d draft.gguf "..."': None,
    'run --gpu-layers 20 --draft-gpu-layers 0 -t target.gguf -d draft.gguf "..."': None,
    'run -t ~/models/qwen-7b.gguf -d ~/models/qwen-0.5b.gguf --baseline "def quicksort(xs):"': None,
    "run --json-schema schema.json": "Who is Ada?",
    "presets": None,
    "presets --json": None,
    "scan ~/models": None,
    "pair ~/models/qwen-7b.gguf": None,
    "pair T.gguf D.gguf": None,
    "pair target.gguf draft.gguf": None,
    "export target.gguf --draft draft.gguf --to vllm": None,
    "export target.gguf --draft draft.gguf --to vllm --json": None,
    "export qwen2.5-coder-1.5b --to llama-server": None,
    "index ~/src/myproject -t qwen-1.5b.gguf": None,
    "cache info": None,
    "cache clear --yes": None,
    "doctor": None,
    "doctor --json": None,
}

# the lines that run against a local stand-in for the Hub (tests/_hub_server.py), whose Qwen2.5-Coder
# repositories hold the embedded pair under the real file names: the download, the pair check and the first
# run of the README's quick start, for real, in seconds
HUB_RUN = [
    "download qwen2.5-coder-1.5b",
    'run --preset qwen2.5-coder-1.5b --chat "Write a binary search in Python"',
    "download qwen2.5-coder-7b",
    "find-draft Qwen/Qwen2.5-Coder-7B-Instruct-GGUF",
    "find-draft Qwen/Qwen2.5-Coder-14B-Instruct-GGUF",
]
_HUB_REPOS = {  # repository -> (file, the embedded model standing in for it)
    "Qwen/Qwen2.5-Coder-0.5B-Instruct-GGUF": ("qwen2.5-coder-0.5b-instruct-q4_k_m.gguf", EMBEDDED_DRAFT),
    "Qwen/Qwen2.5-Coder-1.5B-Instruct-GGUF": ("qwen2.5-coder-1.5b-instruct-q4_k_m.gguf", EMBEDDED_TARGET),
    "Qwen/Qwen2.5-Coder-7B-Instruct-GGUF": ("qwen2.5-coder-7b-instruct-q4_k_m.gguf", EMBEDDED_TARGET),
    "Qwen/Qwen2.5-Coder-14B-Instruct-GGUF": ("qwen2.5-coder-14b-instruct-q4_k_m.gguf", EMBEDDED_TARGET),
}

_NETWORK = "needs the Hugging Face Hub"
_STOPPED = "runs until stopped (its start-up is tested in test_server.py, test_cli_ui.py, test_rpc.py)"
_DOWNLOAD = "needs a preset's download (GBs)"
_RPC = "needs rpc-servers on other machines"
_MINUTES = "minutes (the embedded pair's whole bench too), real models or llama.cpp's own build"
_FILES = "names model files of the reader's own (other architectures or sizes than the embedded pair)"
_PLACEHOLDER = "a placeholder stands for the reader's value (NAME, PATH, ...)"


def parsed_only(words: tuple[str, ...]) -> str | None:
    """Why a quoted line is parsed but not run; None when this file has no reason for it."""
    line = " ".join(words)
    command = next((w for w in words if not w.startswith("-")), "")
    if words == ("bench",):
        return _MINUTES
    if len(words) <= 1:
        return "a command named in prose, no line to run"
    if command in ("download", "find-draft"):
        return _NETWORK
    if command in ("serve", "ui", "rpc-server"):
        return _STOPPED
    if "--rpc" in words:
        return _RPC
    if any(w in ("NAME", "PRESET", "PATH...", "SCHEMA", "TARGET", "DRAFT", "...") for w in words[1:]) and (
        command != "run" or "..." not in words[-1:]
    ):
        return _PLACEHOLDER
    if "--preset" in words or command == "export":
        return (
            _DOWNLOAD
            if "my-tuned-preset" not in words
            else "exports a preset the reader saved with bench --tune"
        )
    if command == "bench":
        return _MINUTES
    if command == "cache" and "--costs" in words:
        return "measures this machine's costs again (the first run of auto does that: test_costs.py)"
    if any(w.endswith(".gguf") for w in words):
        return _FILES
    if line == "cache clear":
        return "asks on the terminal before it deletes (`cache clear --yes` is run)"
    if "\\|" in words:
        return "a pipe written in a table cell (`scan | head`)"
    return None


def _all_quotes() -> list[Quote]:
    return [
        q for doc in DOCS for q in quotes(doc.read_text(encoding="utf-8"), doc.relative_to(ROOT).as_posix())
    ]


def test_every_docs_line_is_run_or_has_a_reason():
    ran = set(RUN) | set(HUB_RUN)
    undecided = sorted(
        {str(q) for q in _all_quotes() if " ".join(q.words) not in ran and parsed_only(q.words) is None}
    )
    assert not undecided, "run these in RUN, or give parsed_only a reason:\n" + "\n".join(undecided)


def test_the_run_lines_are_in_the_docs():
    """A line edited in the docs is no longer run here: this names it, so RUN follows the docs."""
    quoted = {" ".join(q.words) for q in _all_quotes()}
    gone = (set(RUN) | set(HUB_RUN)) - quoted
    assert not gone, sorted(gone)


@pytest.fixture(scope="module")
def docs_world(tmp_path_factory) -> Iterator[Path]:
    """A scratch working folder and home with the files the docs' lines name: the embedded pair's copies."""
    root = tmp_path_factory.mktemp("docs-world")
    home, cwd = root / "home", root / "cwd"
    (home / "models").mkdir(parents=True)
    (home / "src" / "myproject").mkdir(parents=True)
    cwd.mkdir()
    for name in ("target.gguf", "T.gguf", "qwen-1.5b.gguf"):
        os.symlink(EMBEDDED_TARGET, cwd / name)
    for name in ("draft.gguf", "D.gguf", "qwen-0.5b.gguf"):
        os.symlink(EMBEDDED_DRAFT, cwd / name)
    # copies, not links: scan lists a file reached through two links once
    shutil.copyfile(EMBEDDED_TARGET, home / "models" / "qwen-7b.gguf")
    shutil.copyfile(EMBEDDED_DRAFT, home / "models" / "qwen-0.5b.gguf")
    (home / "src" / "myproject" / "ledger.py").write_text("def total(xs):\n    return sum(xs)\n")
    schema = json.dumps({"type": "object", "properties": {"name": {"type": "string"}}})
    for name in ("schema.json", "person.json"):
        (cwd / name).write_text(schema)
    saved = os.getcwd()
    env = {
        "HOME": str(home),
        "HF_HOME": str(root / "hf"),
        "HF_HUB_OFFLINE": "1",
        "LOCALSPEC_HOME": str(root / "cache"),
        "LOCALSPEC_CONFIG": str(root / "config"),
    }
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    os.chdir(cwd)
    try:
        yield home
    finally:
        os.chdir(saved)
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _invoke(line: str, stdin: str | None = None):
    args = [os.path.expanduser(a) if a.startswith("~/") else a for a in shlex.split(line)]
    if "run" in args and not {"-n", "--max-tokens", "--help"} & set(args):
        args += ["-n", "8"]  # a few tokens show the line works; the default 256 take seconds on a busy CPU
    res = CliRunner().invoke(main, args, prog_name="localspec", input=stdin)
    assert res.exit_code == 0, f"`localspec {line}` exited {res.exit_code}:\n{res.output[-2000:]}"
    return res


@pytest.mark.parametrize("line", list(RUN))
def test_a_docs_line_runs(line, docs_world):
    _invoke(line, RUN[line])


@pytest.fixture(scope="module")
def local_hub(docs_world, tmp_path_factory) -> Iterator[FakeHub]:
    hub = FakeHub(tmp_path_factory.mktemp("hub")).start()
    for repo, (name, model) in _HUB_REPOS.items():
        hub.add_repo(repo, {name: model})
    saved = {k: os.environ.get(k) for k in ("HF_ENDPOINT", "HF_HUB_OFFLINE")}
    os.environ["HF_ENDPOINT"] = hub.endpoint
    os.environ.pop("HF_HUB_OFFLINE")
    try:
        yield hub
    finally:
        hub.stop()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@pytest.mark.parametrize("line", HUB_RUN)
def test_a_docs_line_runs_against_a_local_hub(line, local_hub):
    res = _invoke(line)
    if line.startswith("download"):
        assert "pair    identical" in res.output, res.output
    if line.startswith("find-draft"):
        assert "Qwen/Qwen2.5-Coder-0.5B-Instruct-GGUF" in res.output, res.output


# sample outputs in the docs, against what the code prints -------------------------------------------------
def _sample(page: str, command: str) -> list[str]:
    """The lines a ```console block of ``page`` shows after ``$ localspec COMMAND``, up to the next prompt."""
    lines = (ROOT / "docs" / page).read_text(encoding="utf-8").splitlines()
    start = lines.index(f"$ localspec {command}") + 1
    end = next(i for i in range(start, len(lines)) if lines[i].startswith(("$ ", "```")))
    return lines[start:end]


def _shape(lines: list[str]) -> list[str]:
    """What a download prints, line by line, without what differs by machine, model and cache: each line's
    first word (``target``, ``pair``...) and the ``Run it:`` line whole; the ``downloading`` lines and their
    progress bars (only for files not in the cache yet) and the verdict's reasons left out."""
    out = []
    for line in lines:
        if "%|" in line or line.startswith("downloading ") or line.strip().startswith("- "):
            continue
        out.append(line if line.startswith("Run it:") else line.split(" ", 1)[0])
    return out


def test_the_download_sample_is_what_download_prints(local_hub):
    """models-and-pairing.md showed a download's output the code never printed (its last line differed)."""
    shown = _sample("models-and-pairing.md", "download qwen2.5-coder-7b")
    res = _invoke("download qwen2.5-coder-7b")
    printed = res.output.splitlines()
    said = f"the page shows:\n{chr(10).join(shown)}\nthe code prints:\n{res.output}"
    assert _shape(shown) == _shape(printed), said


def test_the_scan_sample_counts_its_rows_as_scan_does(tmp_path):
    """scan-and-pair.md's sample said "3 file(s), 1 unreadable" under four rows (scan counts every row)."""
    block = _sample("scan-and-pair.md", "scan ~/models")
    header, rows = block[0], block[1 : block.index("")]
    counted = next(line for line in block if "file(s)" in line)
    # what the code prints for a folder with a model, a vocabulary-only file and a file that is no GGUF
    shutil.copyfile(EMBEDDED_TARGET, tmp_path / "model.gguf")
    shutil.copyfile(ROOT / "tests" / "data" / "vocab" / "ggml-vocab-llama-spm.gguf", tmp_path / "vocab.gguf")
    (tmp_path / "broken.gguf").write_bytes(b"junk" * 4)
    printed = CliRunner().invoke(main, ["scan", str(tmp_path), "--no-cache"]).output.splitlines()
    assert printed[0].split() == header.split()  # the same columns
    said = next(line for line in printed if "file(s)" in line)
    assert said.startswith("3 file(s), 1 unreadable.")  # the code counts every row, the unreadable one too
    errors = sum(1 for row in rows if row.split()[-1] == "ERROR")
    assert counted.startswith(f"{len(rows)} file(s), {errors} unreadable."), (counted, len(rows), errors)
