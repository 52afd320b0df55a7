"""``localspec run`` and the command group: every user error is a short message and an exit status, never a
traceback; the flags say what they do (GPU layers left to the library, --baseline not "interleaved")."""

from __future__ import annotations

import errno
import os
import subprocess
import sys

import pytest
from click.testing import CliRunner

import localspec
from localspec.cli import main
from localspec.errors import ModelNotFoundError
from localspec.settings import max_threads


def invoke(*args: str, **kw):
    return CliRunner().invoke(main, list(args), prog_name="localspec", **kw)


def _no_traceback(res) -> None:
    assert "Traceback" not in res.output
    # click turns a usage error into SystemExit; anything else in res.exception is an escaped error
    assert res.exception is None or isinstance(res.exception, SystemExit), repr(res.exception)


@pytest.mark.parametrize(
    "args, message",
    [
        (["-n", "0"], "Invalid value for '--max-tokens' / '-n': 0 is not in the range x>=1"),
        (["--temperature", "-1"], "Invalid value for '--temperature': -1.0 is not in the range x>=0.0"),
        (["--temperature", "nan"], "Invalid value for '--temperature': 'nan' is not a finite number"),
        (["--temperature", "inf"], "Invalid value for '--temperature': 'inf' is not a finite number"),
        (["--top-p", "2"], "Invalid value for '--top-p': 2.0 is not in the range 0.0<x<=1.0"),
        (["--top-p", "0"], "Invalid value for '--top-p': 0.0 is not in the range 0.0<x<=1.0"),
        (["--min-p", "1"], "Invalid value for '--min-p': 1.0 is not in the range 0.0<=x<1.0"),
        (["--top-k", "-1"], "Invalid value for '--top-k': -1 is not in the range x>=0"),
        (["--seed", "-5"], "Invalid value for '--seed': -5 is not in the range x>=0"),
        (
            ["--threads", "100000"],
            f"Invalid value for '--threads': 100000 is not in the range 1<=x<={max_threads()}",
        ),
        (["--threads", "0"], f"Invalid value for '--threads': 0 is not in the range 1<=x<={max_threads()}"),
        (
            ["--draft-threads", "0"],
            f"Invalid value for '--draft-threads': 0 is not in the range 1<=x<={max_threads()}",
        ),
        (["--n-ctx", "1"], "Invalid value for '--n-ctx': 1 is not in the range 16<=x<=1048576"),
        (
            ["--n-ctx", str(10**12)],
            f"Invalid value for '--n-ctx': {10**12} is not in the range 16<=x<=1048576",
        ),
        (["--n-max", "0"], "Invalid value for '--n-max': 0 is not in the range 1<=x<=64"),
        (["--n-max", "1000"], "Invalid value for '--n-max': 1000 is not in the range 1<=x<=64"),
        (["--n-min", "5", "--n-max", "2"], "Invalid value for '--n-min': 5 is more than --n-max (2)"),
        (["--p-min", "1.5"], "Invalid value for '--p-min': 1.5 is not in the range 0.0<=x<=1.0"),
        (["--p-min", "nan"], "Invalid value for '--p-min': 'nan' is not a finite number"),
        (["--strategy", "fast"], "Invalid value for '--strategy': 'fast' is not one of 'auto', 'model'"),
        (["--gpu-layers", "-2"], "Invalid value for '--gpu-layers': -2 is not in the range x>=-1"),
        (
            ["--target", "t.gguf", "--preset", "tiny-embedded"],
            "give either --target or --preset, not both",
        ),
        (
            ["--strategy", "model+ngram", "--draft", "ngram"],
            "--strategy model+ngram drafts with a model, and --draft ngram gives none",
        ),
        (["--strategy", "model", "--draft", "none"], "give --draft PATH (or 'auto')"),
        (
            ["--strategy", "ngram", "--corpus", "."],
            "--corpus feeds the suffix cache, and --strategy ngram does not",
        ),
    ],
)
def test_bad_values_are_usage_errors(args, message, monkeypatch):
    def never(**kw):
        raise AssertionError("a bad value reached localspec.load")

    monkeypatch.setattr(localspec, "load", never)
    res = invoke("run", *args, "def fib(n):")
    _no_traceback(res)
    assert res.exit_code == 2, res.output
    assert message in res.output, res.output
    assert "Try 'localspec run --help' for help." in res.output


def _load_raising(exc: BaseException, seen: dict | None = None):
    def load(**kw):
        if seen is not None:
            seen.update(kw)
        raise exc

    return load


def test_library_errors_exit_1_with_the_next_step(monkeypatch):
    monkeypatch.setattr(
        localspec,
        "load",
        _load_raising(ModelNotFoundError("target model x.gguf: no such file", hint="check it")),
    )
    res = invoke("run", "-t", "x.gguf", "hi")
    _no_traceback(res)
    assert res.exit_code == 1
    assert res.output.splitlines() == ["Error: target model x.gguf: no such file", "  -> check it"]


@pytest.mark.parametrize(
    "exc, shown",
    [
        (
            ValueError("max_tokens must be >= 1, got 0"),
            "Error: max_tokens must be >= 1, got 0 (ValueError at ",
        ),
        (
            PermissionError(errno.EACCES, "Permission denied", "/models/x.gguf"),
            "Error: [Errno 13] Permission denied: '/models/x.gguf' (PermissionError at ",
        ),
    ],
)
def test_plain_value_and_os_errors_are_one_line(monkeypatch, exc, shown):
    monkeypatch.setattr(localspec, "load", _load_raising(exc))
    res = invoke("run", "hi")
    _no_traceback(res)
    assert res.exit_code == 1
    first, second = res.output.splitlines()
    assert first.startswith(shown) and first.endswith(")") and "test_cli_run.py:" in first
    assert "localspec --traceback" in second


def test_a_full_disk_is_the_machine_not_a_bug(monkeypatch):
    monkeypatch.setattr(localspec, "load", _load_raising(OSError(errno.ENOSPC, "No space left on device")))
    res = invoke("run", "hi")
    _no_traceback(res)
    assert res.exit_code == 1 and res.output.splitlines() == [
        "Error: No space left on device",
        "  -> free some disk space, or send the output somewhere with room",
    ]


def test_traceback_flag_shows_the_real_error(monkeypatch):
    monkeypatch.setattr(localspec, "load", _load_raising(ValueError("boom")))
    res = invoke("--traceback", "run", "hi")
    assert isinstance(res.exception, ValueError) and str(res.exception) == "boom"


def test_a_real_bug_is_not_hidden(monkeypatch):
    """A TypeError is a bug in localspec: it keeps its traceback (not reduced to a one-line 'Error')."""
    monkeypatch.setattr(localspec, "load", _load_raising(TypeError("unexpected keyword")))
    res = invoke("run", "hi")
    assert isinstance(res.exception, TypeError)
    assert "Error:" not in res.output


def test_ctrl_c_is_exit_130(monkeypatch):
    monkeypatch.setattr(localspec, "load", _load_raising(KeyboardInterrupt()))
    res = invoke("run", "hi")
    assert res.exit_code == 130 and res.output.strip() == "Interrupted."


def test_gpu_layers_are_left_to_the_library_unless_given(monkeypatch) -> None:
    stop = ModelNotFoundError("stop here")
    seen: dict = {}
    monkeypatch.setattr(localspec, "load", _load_raising(stop, seen))
    invoke("run", "hi")
    assert "n_gpu_layers" not in seen and "draft_n_gpu_layers" not in seen, seen
    seen.clear()
    invoke("run", "--gpu-layers", "0", "--draft-gpu-layers", "-1", "hi")
    assert seen["n_gpu_layers"] == 0 and seen["draft_n_gpu_layers"] == -1


def _option_help(name: str) -> str:
    text = invoke("run", "--help").output
    flat = " ".join(text.split())
    start = flat.index(name + " ")
    nxt = flat.find(" --", start + len(name) + 1)
    return flat[start:nxt]


def test_help_says_what_the_flags_do():
    assert "interleaved" not in _option_help("--baseline")
    assert "one run each" in _option_help("--baseline")
    gpu = _option_help("--gpu-layers")
    assert "default: all when llama.cpp was built with GPU offload, else 0" in gpu
    strategies = _option_help("--strategy")
    assert all(s in strategies for s in localspec.settings.STRATEGIES)


def test_run_end_to_end_on_the_embedded_pair():
    """The real thing once: the embedded pair generates, and the summary line names the pair."""
    res = invoke("run", "-n", "8", "--threads", "2", "--n-ctx", "256", "def fib(n):")
    assert res.exit_code == 0, res.output
    assert "[embedded default pair]" in res.output and "8 tokens" in res.output


def test_the_one_time_cost_measurement_is_announced_once(monkeypatch, tmp_path):
    """The suffix cache sizes drafts from this machine's measured verify curve: the first run measures it
    (a pause of seconds, more on a big model) and says so; the next run reads it from the cache, silently."""
    monkeypatch.setenv("LOCALSPEC_HOME", str(tmp_path / "home"))
    monkeypatch.setattr("localspec.decoding.costs.UNSTEADY_TRIES", 1)  # kept even if this machine is busy now
    args = ("run", "-n", "4", "--threads", "2", "--n-ctx", "256", "--strategy", "suffix", "--no-store", "x=1")
    first, second = invoke(*args), invoke(*args)
    assert first.exit_code == 0 and second.exit_code == 0, first.output + second.output
    said = "localspec: measuring this machine's decoding costs once"
    assert said in first.output and said not in second.output
    assert len(list((tmp_path / "home" / "costs").glob("*.json"))) == 1


def test_the_first_run_that_stores_says_what_it_keeps_once_and_no_store_keeps_nothing(monkeypatch, tmp_path):
    """The suffix cache keeps prompts and outputs on disk: the first run that writes it says where, and how to
    turn it off or clear it, in one line on stderr; later runs say nothing; ``--no-store`` writes nothing."""
    home = tmp_path / "home"
    monkeypatch.setenv("LOCALSPEC_HOME", str(home))
    monkeypatch.setattr("localspec.decoding.costs.UNSTEADY_TRIES", 1)
    args = ("run", "-n", "4", "--threads", "2", "--n-ctx", "256", "--strategy", "suffix", "x=1")
    off = invoke(*args, "--no-store")
    assert off.exit_code == 0 and not (home / "suffix").exists(), off.output
    monkeypatch.setenv("LOCALSPEC_NO_STORE", "1")  # the same for every command, the web UI and Python
    env_off = invoke(*args)
    assert env_off.exit_code == 0 and not (home / "suffix").exists(), env_off.output
    monkeypatch.delenv("LOCALSPEC_NO_STORE")
    said = f"localspec: the suffix cache keeps your prompts and outputs in {home / 'suffix'}"
    assert said not in off.output + env_off.output
    first, second = invoke(*args), invoke(*args)
    assert first.exit_code == 0 and second.exit_code == 0, first.output + second.output
    lines = [line for line in first.output.splitlines() if said in line]
    assert len(lines) == 1 and "`localspec cache clear`" in lines[0]
    assert "--no-store" in lines[0] and "LOCALSPEC_NO_STORE=1" in lines[0]
    assert said not in second.output


def test_json_schema_and_grammar_files_constrain_the_output(tmp_path):
    import json

    schema = tmp_path / "answer.json"
    schema.write_text('{"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}')
    for value in (str(schema), schema.read_text()):  # a file, or the schema itself
        res = invoke("run", "Is it?", "-n", "200", "--json-schema", value, "--json")
        assert res.exit_code == 0, res.output
        assert isinstance(json.loads(json.loads(res.output)["text"])["ok"], bool)
    gbnf = tmp_path / "yn.gbnf"
    gbnf.write_text('root ::= "yes" | "no"\n')
    res = invoke("run", "Is it?", "-n", "20", "--grammar-file", str(gbnf), "--json")
    assert res.exit_code == 0 and json.loads(res.output)["text"] in ("yes", "no")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--json-schema", "{not json"], "--json-schema: not valid JSON"),
        (["--json-schema", "missing.json"], "missing.json: no such file"),
        (["--json-schema", '{"type": "array", "maxItems": 99999}'], "maxItems 99999 is more than"),
        (["--json-schema", "{}", "--grammar-file", "pyproject.toml"], "not both"),
        (["--grammar-file", "pyproject.toml"], "llama.cpp could not parse the grammar"),
    ],
)
def test_bad_schemas_and_grammars_are_one_line_errors(args, message):
    res = invoke("run", "x", "-n", "4", *args)
    assert res.exit_code != 0 and message in res.output, res.output
    _no_traceback(res)


def test_output_cut_before_its_grammar_is_complete_says_so_and_baseline_of_the_target_alone_is_skipped():
    schema = '{"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}'
    res = invoke("run", "x", "-n", "3", "--json-schema", schema)
    assert res.exit_code == 0, res.output
    assert "stopped at --max-tokens 3 before the output was complete" in res.output
    res = invoke("run", "x", "-n", "4", "--draft", "none", "--baseline")
    assert res.exit_code == 0 and "--baseline skipped: this run was the target alone" in res.output
    assert "speedup" not in res.output, res.output


def test_a_model_path_that_is_no_file_says_what_it_is(tmp_path):
    """Path.is_file() is False for a folder and a symlink loop (the message said "no such file"), and
    raises for a name too long for the file system (that went down the "this is a bug" path)."""
    import os

    (tmp_path / "folder.gguf").mkdir()
    os.symlink(tmp_path / "loop-b.gguf", tmp_path / "loop-a.gguf")
    os.symlink(tmp_path / "loop-a.gguf", tmp_path / "loop-b.gguf")
    os.mkfifo(tmp_path / "pipe.gguf")
    for path, said in (
        (tmp_path / "folder.gguf", "is a folder, not a GGUF file"),
        (tmp_path / "loop-a.gguf", "is a symlink loop"),
        (tmp_path / "pipe.gguf", "is not a regular file"),
        (tmp_path / ("n" * 300 + ".gguf"), "the path is too long for this file system"),
        (tmp_path / "missing.gguf", "no such file"),
    ):
        res = invoke("run", "x", "-n", "2", "--draft", str(path))
        assert res.exit_code == 1 and f"draft model {tmp_path}" in res.output and said in res.output, (
            res.output
        )
        _no_traceback(res)


def test_library_warnings_are_lines_of_their_own_after_streamed_text(tmp_path, monkeypatch):
    """A store that cannot be saved warns at the end of a generation, while the streamed text's last line
    has no newline yet: the warning started mid-line, glued to the text."""
    import logging

    from localspec.cli.options import WARNING_LINES

    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("LOCALSPEC_HOME", str(blocker / "home"))
    res = invoke("run", "-n", "4", "--strategy", "suffix", "--n-ctx", "256", "def f():")
    assert res.exit_code == 0, res.output
    assert "\nlocalspec: suffix cache" in res.output and "Point LOCALSPEC_HOME at a folder" in res.output
    seen = []
    monkeypatch.setattr("click.echo", lambda text, err=False: seen.append(text))
    WARNING_LINES.mid_line = True  # a terminal's stdout in the middle of a line
    WARNING_LINES.emit(
        logging.LogRecord("localspec.suffix.store", logging.WARNING, "", 0, "it failed", (), None)
    )
    assert seen == ["\nlocalspec: it failed"] and not WARNING_LINES.mid_line


def test_every_command_module_is_in_the_lazy_table_and_importing_the_cli_loads_no_model_code():
    """The table names each command once; `import localspec.cli` must not import llama.cpp or numpy,
    or a Ctrl-C during that import (a second on two cores) printed a traceback instead of Interrupted."""
    import importlib
    import subprocess
    import sys

    from localspec.cli import COMMAND_MODULES

    declared = {}
    for module in set(COMMAND_MODULES.values()):
        for command in importlib.import_module(f"localspec.cli.{module}").COMMANDS:
            declared[command.name] = module
    assert declared == COMMAND_MODULES
    probe = "import sys, localspec.cli; print(sorted(m for m in ('numpy', 'llama_cpp') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]", out


def test_ctrl_c_while_the_command_line_is_imported_is_interrupted_not_a_traceback():
    import subprocess
    import sys

    probe = (
        "import sys\n"
        "class Stop:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'localspec.cli':\n"
        "            raise KeyboardInterrupt\n"
        "sys.meta_path.insert(0, Stop())\n"
        "from localspec.__main__ import entry\n"
        "entry()\n"
    )
    res = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    assert res.returncode == 130 and res.stderr == "Interrupted.\n", res.stderr


def test_an_n_ctx_past_the_trained_context_is_said_when_lowered():
    res = invoke("run", "-n", "4", "--n-ctx", "100000", "x")
    assert res.exit_code == 0 and "--n-ctx 100000 lowered to 2048, the model's trained context" in res.output


def test_a_dash_prompt_reads_stdin():
    piped = invoke("run", "-n", "4", "--json", "-", input="def fib(n):")
    given = invoke("run", "-n", "4", "--json", "def fib(n):")
    assert piped.exit_code == 0 and given.exit_code == 0, piped.output
    import json

    assert json.loads(piped.output)["text"] == json.loads(given.output)["text"]
    assert (
        json.loads(piped.output)["stats"]["prompt_tokens"]
        == json.loads(given.output)["stats"]["prompt_tokens"]
    )


def test_a_request_past_the_context_is_refused_in_the_command_lines_own_option_names():
    """The numbers the API reports, with the CLI's -n and --n-ctx for its max_tokens and n_ctx."""
    res = invoke("run", "--n-ctx", "256", "-n", "4000", "def f():")
    assert res.exit_code == 1, res.output
    assert "plus -n 4000 exceeds the context window of 256 tokens" in res.output, res.output
    assert "lower -n to" in res.output and "run again with a larger --n-ctx" in res.output
    assert "max_tokens" not in res.output and "n_ctx " not in res.output
    res = invoke("run", "-n", "4000", "--n-ctx", "100000", "def f():")  # lowered to the trained 2048
    assert res.exit_code == 1 and "(--n-ctx 100000 lowered to the model's trained context)" in res.output
    assert "trained on 2048 tokens" in res.output and "larger --n-ctx" not in res.output


def test_localspec_verbose_lets_llama_cpps_load_log_through():
    """The README's LOCALSPEC_VERBOSE showed nothing: the model was loaded with verbose=False."""
    env = {**os.environ, "LOCALSPEC_VERBOSE": "1"}
    res = subprocess.run(
        [sys.executable, "-m", "localspec", "run", "-n", "2", "x"], capture_output=True, text=True, env=env
    )
    assert res.returncode == 0 and "llama_model_loader" in res.stderr, res.stderr[-500:]
    quiet = subprocess.run(
        [sys.executable, "-m", "localspec", "run", "-n", "2", "x"], capture_output=True, text=True
    )
    assert quiet.returncode == 0 and "llama_model_loader" not in quiet.stderr


def test_an_empty_stdin_prompt_is_a_usage_error():
    res = invoke("run", "-n", "4", input="")
    assert res.exit_code == 2 and "the prompt from stdin is empty" in res.output


def test_the_default_context_lowered_is_not_called_an_option_the_user_gave():
    res = invoke("run", "-n", "2", "-t", str(localspec.constants.EMBEDDED_TARGET), "--draft", "none", "x")
    assert res.exit_code == 0 and "the default context 4096 lowered to 2048" in res.output, res.output
    assert "--n-ctx 4096" not in res.output
