"""The docs quote only what exists: every ``localspec COMMAND ... --flag`` in README.md and docs/ (its folders
too, docs/archive/ aside) names a
command of ``localspec --help`` and flags of that command's ``--help``, and every preset name quoted
(``--preset NAME``, ``localspec download NAME``, ``preset="NAME"``) is one ``localspec presets`` lists.
Each command line is also parsed by the command's real click parser (paths taken as written, placeholder
values such as ``NAME`` or ``...`` left out), so a value out of range, a wrong choice, a required option
left out, an extra argument or options that do not go together (``bench``'s, checked as they are parsed)
fail here; what a command checks only once it runs is not seen.

Only code is read (fenced blocks and inline code spans), so prose such as "localspec makes ..." is not taken
for a command. A command the docs quote but the CLI lacks is reported with the list of known commands and
where to register it: a page written for a command that lands later fails here until the command is there.
"""

from __future__ import annotations

import contextlib
import re
import shlex
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from unittest import mock

import click
import pytest
from click.testing import CliRunner

from localspec.cli import main
from localspec.hub.presets import list_presets

ROOT = Path(__file__).resolve().parents[1]
# every page a user reads: docs/ and its folders, but not docs/archive/ (the lab notebook and earlier runs,
# kept as they were written: commands there are history, not instructions)
DOCS = [
    ROOT / "README.md",
    *sorted(p for p in (ROOT / "docs").rglob("*.md") if "archive" not in p.relative_to(ROOT / "docs").parts),
]

_FENCE = re.compile(r"^(```|~~~)")
_INLINE = re.compile(r"`([^`\n]+)`")
# "localspec" as a program name: not part of a path (localspec/cli), a module (localspec.load) or a word
_PROGRAM = re.compile(r"(?<![\w./~-])localspec(?=\s+\S)")
_STOP = {"#", "|", "||", "&&", ";", ">", "2>&1", "&"}
_PLACEHOLDER = re.compile(r"^(?:[A-Z][A-Z_]*|\.\.\.|<.*>|\{.*\}|\$.*)$")


@dataclass(frozen=True)
class Quote:
    where: str  # file:line
    words: tuple[str, ...]  # what follows "localspec"

    def __str__(self) -> str:
        return f"{self.where}: `localspec {' '.join(self.words)}`"


def code_segments(text: str) -> list[tuple[int, str]]:
    """(line number, code) per line of a fenced block (continuation lines joined) and per inline span."""
    out: list[tuple[int, str]] = []
    in_block = False
    pending: tuple[int, str] | None = None
    for n, line in enumerate(text.splitlines(), 1):
        if _FENCE.match(line.strip()):
            in_block = not in_block
            pending = None
            continue
        if in_block:
            start, acc = pending if pending else (n, "")
            acc += line.rstrip()
            if acc.endswith("\\"):
                pending = (start, acc[:-1] + " ")
                continue
            pending = None
            out.append((start, acc))
        else:
            if not line.strip():
                pending = None
            if pending:  # an inline span broken over two lines
                line = pending[1] + " " + line
                n = pending[0]
                pending = None
            if line.count("`") % 2:
                pending = (n, line)
                continue
            out.extend((n, m.group(1)) for m in _INLINE.finditer(line))
    return out


def quotes(text: str, name: str) -> list[Quote]:
    found = []
    for n, code in code_segments(text):
        for m in _PROGRAM.finditer(code):
            words: list[str] = []
            for word in code[m.end() :].split("`")[0].split():  # a quote inside an output block
                if word in _STOP or word.startswith(("#", "(")):  # "(": prose after a printed command
                    break
                words.append(word.strip("[]()"))
            found.append(Quote(f"{name}:{n}", tuple(w for w in words if w)))
    return found


def _flags(word: str) -> list[str]:
    """The flag a word names, if it is one: ``--n-ctx=64`` -> ``--n-ctx``; ``-1`` is a number, not a flag."""
    if not word.startswith("-") or re.match(r"^-\d", word) or word in ("-", "--"):
        return []
    return [word.split("=", 1)[0]]


@cache
def _help_flags(path: tuple[str, ...]) -> frozenset[str]:
    """Every flag in the Options section of ``localspec PATH... --help``."""
    res = CliRunner().invoke(main, [*path, "--help"], prog_name="localspec")
    assert res.exit_code == 0, (path, res.output)
    flags: set[str] = set()
    in_options = False
    for line in res.output.splitlines():
        if line.strip().endswith("Options:"):
            in_options = True
            continue
        if in_options and line.lstrip().startswith("-"):
            column = re.split(r"\s{2,}", line.strip())[0]
            flags.update(re.findall(r"(?<![\w-])--?[A-Za-z][\w-]*", column))
    return frozenset(flags)


def _known_commands(group: click.Group) -> list[str]:
    return sorted(group.list_commands(click.Context(group)))


def check_quote(q: Quote, preset_names: set[str]) -> list[str]:
    """What is wrong with one quoted command line: an unknown command, unknown flags, unknown presets."""
    problems = []
    words = list(q.words)
    path: list[str] = []
    group: click.Group = main
    while words and _flags(words[0]):  # group options such as --traceback, --version
        flag = _flags(words.pop(0))[0]
        if flag not in _help_flags(tuple(path)):
            problems.append(f"{q}: `localspec` has no option {flag}")
    while words and not words[0].startswith("-"):
        name = words.pop(0)
        cmd = group.get_command(click.Context(group), name)
        if cmd is None:
            problems.append(
                f"{q}: no command {' '.join([*path, name])!r} in `localspec {' '.join(path)} --help` "
                f"(known: {', '.join(_known_commands(group))}); whoever documents it must also register "
                "it (localspec/cli/__init__.py, COMMAND_MODULES)"
            )
            return problems
        path.append(name)
        if not isinstance(cmd, click.Group):
            break
        group = cmd
    if not path:
        return problems
    known = _help_flags(tuple(path))
    command = group.get_command(click.Context(group), path[-1]) if isinstance(group, click.Group) else None
    preset_flags = {opt for p in (command.params if command else []) if p.name == "preset" for opt in p.opts}
    for i, word in enumerate(words):
        for flag in _flags(word):
            if flag not in known:
                problems.append(f"{q}: `localspec {' '.join(path)}` has no option {flag}")
            if flag in preset_flags and i + 1 < len(words):
                problems.extend(_check_preset(q, words[i + 1], preset_names))
    if path == ["download"] and words:
        problems.extend(_check_preset(q, words[0], preset_names))
    return problems


def _check_preset(q: Quote, name: str, preset_names: set[str]) -> list[str]:
    name = name.strip("\"'")
    if _PLACEHOLDER.match(name) or name in preset_names:
        return []
    return [f"{q}: no preset named {name!r} (`localspec presets` lists them)"]


_PY_PRESET = re.compile(r"""preset\s*=\s*["']([^"']+)["']""")


def python_presets(text: str, name: str, preset_names: set[str]) -> list[str]:
    """``preset="NAME"`` in Python examples."""
    problems = []
    for n, code in code_segments(text):
        for m in _PY_PRESET.finditer(code):
            problems.extend(_check_preset(Quote(f"{name}:{n}", ("(Python)",)), m.group(1), preset_names))
    return problems


@contextlib.contextmanager
def _paths_unchecked() -> Iterator[None]:
    """Paths in the docs are examples (``~/models``, ``T.gguf``): the parser takes them as written."""
    with mock.patch.object(click.Path, "convert", lambda self, value, param, ctx: value):
        yield


def parse_problem(q: Quote) -> str | None:
    """What the real parser says of the quoted command line (an option it lacks, a value out of range, a
    missing required option or argument), or None when it parses. A bare command (``localspec pair`` in
    prose) names the command only and is not parsed; what a command checks after parsing is not seen."""
    try:
        args = shlex.split(" ".join(q.words))
    except ValueError:  # an unbalanced quote: as the words were read
        args = list(q.words)
    while args and args[0].startswith("-"):  # the group's own options (--traceback)
        if args.pop(0) in ("--help", "--version"):
            return None
    cmd: click.Command = main
    path: list[str] = []
    while isinstance(cmd, click.Group) and args and not args[0].startswith("-"):
        sub = cmd.get_command(click.Context(cmd), args[0])
        if sub is None:
            return None  # check_quote reports it
        path.append(args.pop(0))
        cmd = sub
    if not args or isinstance(cmd, click.Group):
        return None
    dropped: set[str] = set()  # options whose value is a placeholder (``--rpc ...``, ``--save-preset NAME``)
    while True:
        try:
            with _paths_unchecked():
                cmd.make_context(f"localspec {' '.join(path)}", list(args))
        except click.exceptions.Exit:  # --help
            return None
        except click.BadParameter as exc:
            if not isinstance(exc.param, click.Option) or not _drop_placeholder(args, exc.param, dropped):
                if not (isinstance(exc, click.MissingParameter) and exc.param and exc.param.name in dropped):
                    return f"{q}: the parser refuses it: {exc.format_message()}"
                return None
        except click.ClickException as exc:
            return f"{q}: the parser refuses it: {exc.format_message()}"
        else:
            return None


def _drop_placeholder(args: list[str], option: click.Option, dropped: set[str]) -> bool:
    """Take ``option`` out of ``args`` when the value it was refused for is a placeholder; False otherwise."""
    for i, word in enumerate(args[:-1]):
        if word in option.opts and _PLACEHOLDER.match(args[i + 1]):
            del args[i : i + 2]
            dropped.add(option.name or "")
            return True
    return False


def check_text(text: str, name: str) -> tuple[list[Quote], list[str]]:
    names = {p.name for p in list_presets()}
    found = quotes(text, name)
    problems = [p for q in found for p in check_quote(q, names)]
    parsed = [p for q in found if (p := parse_problem(q))]
    return found, problems + parsed + python_presets(text, name, names)


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_docs_quote_only_real_commands_flags_and_presets(doc):
    found, problems = check_text(doc.read_text(encoding="utf-8"), doc.relative_to(ROOT).as_posix())
    assert not problems, "\n".join(problems)


def test_every_user_page_is_checked_and_the_archive_is_not():
    names = {p.relative_to(ROOT).as_posix() for p in DOCS}
    assert {"README.md", "docs/cli.md", "docs/install.md", "docs/configuration.md", "docs/serve.md"} <= names
    assert not any(n.startswith("docs/archive/") for n in names)


def test_the_readme_is_checked_at_all():
    """The extraction finds the README's commands (a regex that matched nothing would pass everything)."""
    found, _ = check_text((ROOT / "README.md").read_text(encoding="utf-8"), "README.md")
    commands = {q.words[0] for q in found if q.words and not q.words[0].startswith("-")}
    assert {"run", "scan", "pair", "presets", "download", "find-draft", "bench", "ui"} <= commands
    flags = {w for q in found for w in q.words if w.startswith("--")}
    assert {"--preset", "--baseline", "--chat", "--window", "--tune"} <= flags
    found, _ = check_text((ROOT / "docs" / "cli.md").read_text(encoding="utf-8"), "docs/cli.md")
    assert {"--draft", "--json", "--n-ctx", "--json-schema"} <= {w for q in found for w in q.words}


@pytest.mark.parametrize(
    "planted, expected",
    [
        ('Run `localspec run --no-such-flag "hi"`.', "`localspec run` has no option --no-such-flag"),
        ("```console\n$ localspec scan ~/m --jsn\n```", "`localspec scan` has no option --jsn"),
        ("```bash\nlocalspec bench -t a.gguf \\\n    --limit 3 --bogus\n```", "has no option --bogus"),
        ("`localspec teleport --port 8000`", "no command 'teleport' in `localspec  --help` (known: "),
        ('`localspec run --preset qwen9-99b "x"`', "no preset named 'qwen9-99b'"),
        ("`localspec download qwen9-99b`", "no preset named 'qwen9-99b'"),
        (
            "Get it with `localspec\ndownload qwen9-99b` first.",
            "planted.md:1: `localspec download qwen9-99b`",
        ),
        ('```python\nlocalspec.generate("x", preset="qwen9-99b")\n```', "no preset named 'qwen9-99b'"),
        ("`localspec --verbose run x`", "`localspec` has no option --verbose"),
        # what the real parser refuses: a value out of range or not a choice, a required option left out
        ('`localspec run -n 0 "x"`', "the parser refuses it: Invalid value for '--max-tokens' / '-n'"),
        ("`localspec bench --sessions edit`", "unknown session workload 'edit'"),
        ("`localspec bench -t T.gguf --wide-target F99`", "Invalid value for '--wide-target'"),
        ("`localspec bench --wide-target F16`", "--wide-target needs --target FILE or --preset NAME"),
        ("`localspec export target.gguf -d d.gguf`", "Missing option '--to'"),
        ('`localspec run --rpc 10.0.0.2 "x"`', "is not HOST:PORT"),
        ("```console\n$ localspec cache clear --yes all\n```", "unexpected extra argument (all)"),
    ],
)
def test_the_check_catches_a_planted_mistake(planted, expected):
    _, problems = check_text(planted, "planted.md")
    assert any(expected in p for p in problems), problems


@pytest.mark.parametrize(
    "fine",
    [
        '`localspec run --preset qwen2.5-coder-1.5b --chat "Write a binary search"`',
        '`localspec run --gpu-layers -1 --n-ctx=8192 -t t.gguf -d d.gguf "..."`',
        "`localspec download NAME`, `localspec run --preset NAME`",
        "localspec makes speculative decoding easy; see `localspec/cli/run.py` and `localspec.load()`.",
        "```bash\npip uninstall localspec && rm -rf ~/.cache/localspec\n```",
        "`localspec --help`",
        "`localspec pair` ranks the drafts",  # a bare command in prose: no TARGET needed
        "`localspec bench --tune --save-preset NAME`, `localspec serve --rpc ...`",  # placeholders
        '`localspec run --preset qwen2.5-coder-1.5b --chat "Write a binary search in Python"`',
    ],
)
def test_the_check_passes_real_usage(fine):
    _, problems = check_text(fine, "fine.md")
    assert problems == []


def _leaf_commands(
    group: click.Group, path: tuple[str, ...] = ()
) -> list[tuple[tuple[str, ...], click.Command]]:
    out = []
    for name in _known_commands(group):
        cmd = group.get_command(click.Context(group), name)
        assert cmd is not None
        if isinstance(cmd, click.Group):
            out += _leaf_commands(cmd, (*path, name))
        else:
            out.append(((*path, name), cmd))
    return out


def _sections(text: str) -> dict[str, str]:
    """Each ``## `` section of a page by every word of its heading (``## index, cache``: both), with the
    sections it borrows from: one that says "options of `run`" names run's too."""
    parts = re.split(r"^## ", text, flags=re.M)[1:]
    by_word = {w: part for part in parts for w in re.split(r"[\s,]+", part.splitlines()[0]) if w}
    return {
        w: part + "".join(by_word.get(o, "") for o in re.findall(r"options of `(\w[\w-]*)`", part))
        for w, part in by_word.items()
    }


def cli_page_gaps(text: str) -> list[str]:
    """What docs/cli.md, which claims every command and flag, leaves out: a command without a section of its
    own (``## run``, ``## index, cache``), a long option its section's code spans do not name (another
    command's section naming the same flag does not count: `bench --threads` is not `run --threads`; a
    subcommand's, its paragraphs: `cache clear --dir` is not `index --dir`)."""
    sections = _sections(text)
    gaps = []
    for path, cmd in _leaf_commands(main):
        if path[0] not in sections:
            gaps.append(f"`localspec {' '.join(path)}` has no section (## {path[0]})")
            continue
        where = sections[path[0]]
        if len(path) > 1:  # a subcommand's options: in the paragraphs that name it (`cache clear`)
            paragraphs = re.split(r"\n\s*\n", where)
            where = "\n\n".join(p for p in paragraphs if " ".join(path) in p)
        spans = " ".join(code for _, code in code_segments(where))
        for param in cmd.params:
            for opt in (o for o in param.opts if o.startswith("--") and o != "--help"):
                if not re.search(rf"{re.escape(opt)}(?![\w-])", spans):
                    gaps.append(f"`localspec {' '.join(path)} {opt}` is not named")
    return gaps


def test_the_cli_page_names_every_command_and_option():
    gaps = cli_page_gaps((ROOT / "docs" / "cli.md").read_text(encoding="utf-8"))
    assert not gaps, "docs/cli.md claims every command and flag; add:\n" + "\n".join(gaps)


def test_the_cli_page_check_finds_what_is_left_out():
    text = (ROOT / "docs" / "cli.md").read_text(encoding="utf-8")
    gaps = cli_page_gaps(text.replace("## doctor", "## diagnostics").replace("`--no-warmup`", "no warm-up"))
    assert "`localspec doctor` has no section (## doctor)" in gaps
    assert "`localspec bench --no-warmup` is not named" in gaps


def session_table_names(text: str) -> list[str]:
    """The first cell of each row of every table headed ``| sessions |``: session workload names."""
    names, in_table = [], False
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")] if line.startswith("|") else []
        if not cells:
            in_table = False
        elif cells[0] == "sessions":
            in_table = True
        elif in_table and not set(cells[0]) <= {"-", " ", ":"}:
            names.append(cells[0])
    return names


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_session_tables_name_the_workloads_bench_sessions_takes(doc):
    from localspec.bench.sessions import SESSION_WORKLOADS

    names = session_table_names(doc.read_text(encoding="utf-8"))
    assert set(names) <= set(SESSION_WORKLOADS), (
        f"{doc.name}: not --sessions names: {set(names) - set(SESSION_WORKLOADS)}"
    )


def test_session_tables_are_found():
    text = (ROOT / "docs" / "archive" / "measured-2026-12.md").read_text(encoding="utf-8")
    assert {"edit-session", "agent", "multi-turn", "repo-code"} <= set(session_table_names(text))
    assert session_table_names("| sessions | x |\n| --- | --- |\n| edit | 1 |\n") == ["edit"]


_QUOTIENT = re.compile(r"\b(\d+(?:\.\d+)?) / (\d+(?:\.\d+)?) = (\d+(?:\.\d+)?)x")


def wrong_quotients(text: str) -> list[str]:
    """Each ``A / B = Cx`` (a ceiling worked out in the prose) whose C is not A / B to its printed digits."""
    wrong = []
    for m in _QUOTIENT.finditer(text):
        a, b, c = m.groups()
        digits = len(c.partition(".")[2])
        if round(float(a) / float(b), digits) != float(c):
            wrong.append(f"{m.group(0)} (it is {float(a) / float(b):.{digits}f}x)")
    return wrong


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_worked_ceilings_are_right(doc):
    assert not wrong_quotients(doc.read_text(encoding="utf-8"))


def test_a_wrong_ceiling_is_caught():
    assert wrong_quotients("at most 16 / 8.5 = 2.28x, or 16 / 11 = 1.45x") == [
        "16 / 8.5 = 2.28x (it is 1.88x)"
    ]
    worked = _QUOTIENT.findall((ROOT / "docs" / "performance.md").read_text(encoding="utf-8"))
    assert ("16", "8.5", "1.88") in worked and ("16", "11", "1.45") in worked  # the ceilings are read


# strategy lists --------------------------------------------------------------------------------------------
# a run of quoted strategy names (`auto`, "model+ngram" ...) joined by commas, "and", "or" or "|"
_NAME = r"[`\"](?:auto|model\+ngram|model\+suffix|mtp\+ngram|mtp\+suffix|model|ngram|suffix|mtp|none)[`\"]"
_LIST = re.compile(rf"{_NAME}(?:\s*(?:,|\||\band\b|\bor\b|,\s*and|,\s*or)\s*{_NAME})+")


def strategy_list_problems(text: str) -> list[str]:
    """Each list of strategy names in ``text`` that claims a set settings.py defines and leaves a name out:
    a list naming ``none`` or seven names or more claims every strategy; one made only of the suffix cache's
    strategies, those of :data:`~localspec.settings.SUFFIX_STRATEGIES`; one made only of MTP ones, those of
    :data:`~localspec.settings.MTP_STRATEGIES`."""
    from localspec import settings

    problems = []
    for match in _LIST.finditer(text):
        names = set(re.findall(r"[`\"]([a-z+]+)[`\"]", match.group(0)))
        if len(names) < 3:
            continue
        if "none" in names or len(names) >= 7:
            claimed = set(settings.STRATEGIES)
        elif names <= set(settings.SUFFIX_STRATEGIES):
            claimed = set(settings.SUFFIX_STRATEGIES)
        elif names <= set(settings.MTP_STRATEGIES):
            claimed = set(settings.MTP_STRATEGIES)
        else:
            continue
        if names != claimed:
            problems.append(f"{match.group(0)!r} leaves out {', '.join(sorted(claimed - names))}")
    return problems


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_strategy_lists_are_the_ones_settings_defines(doc):
    problems = strategy_list_problems(doc.read_text(encoding="utf-8"))
    assert not problems, f"{doc.name}: strategy lists that differ from localspec/settings.py: {problems}"


def test_the_strategy_list_check_finds_a_list_left_short():
    assert strategy_list_problems("Only with the strategies `suffix`, `model+suffix` and `auto`.")
    assert strategy_list_problems('strategy = "model" # "auto" | "model" | "ngram" | "none"')
    assert not strategy_list_problems("strategies `suffix`, `model+suffix`, `mtp+suffix` and `auto`")
    assert not strategy_list_problems("`model` runs `mtp`, `model+suffix` runs `mtp+suffix`")
