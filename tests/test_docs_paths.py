"""The user docs name code where it is: every ``localspec/...`` path quoted in README.md and docs/
(docs/archive/ aside) exists, and every dotted name that starts with one of the package's modules
(``hub.download.safe_join``, ``localspec.decoding.engine``, ``report.noise_lines``) imports and resolves.

The package moved from flat modules into folders (gguf, hub, llama, decoding, suffix, pipeline, bench, serve,
...); a page that still says ``localspec/engine.py`` or ``session_bench.noise_lines`` sends a reader to a file
that is not there. Only code spans and fenced blocks are read, as in test_docs.py.
"""

from __future__ import annotations

import importlib
import re
from functools import cache
from pathlib import Path

import pytest
from test_docs import DOCS, ROOT, code_segments

PACKAGE = ROOT / "localspec"
# a path inside the package as the docs quote it: not a user folder such as ~/.config/localspec/presets
_PATH = re.compile(r"(?<![\w./~-])localspec/[\w./-]*\w/?")
_DOTTED = re.compile(r"(?<![\w./-])((?:localspec\.)?[a-z_][a-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)+)")
# file names, not attributes: bench.json, llama.cpp, engine.py
_FILE_SUFFIXES = {"json", "md", "png", "cpp", "toml", "gguf", "py", "txt", "jsonl", "log"}
# module names that are also the names of attributes the docs quote: ``r.stats.memory`` is a result's field
_ATTRIBUTE_NAMES = {"stats"}


@cache
def module_names() -> dict[str, list[str]]:
    """Each module's last name -> its dotted names (``report`` -> ``localspec.bench.report``)."""
    names: dict[str, list[str]] = {}
    for path in PACKAGE.rglob("*.py"):
        rel = path.relative_to(ROOT).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__init__":
            parts.pop()
        if len(parts) > 1:
            names.setdefault(parts[-1], []).append(".".join(parts))
    return names


def _resolves(dotted: str) -> bool:
    """Whether ``dotted`` is a module, or a module and attributes (``a.b.C.meth``)."""
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for attr in parts[i:]:
            if not hasattr(obj, attr):
                return False
            obj = getattr(obj, attr)
        return True
    return False


def dotted_problem(ref: str) -> str | None:
    """None when ``ref`` resolves, or does not start with one of localspec's modules; else why not (an old
    flat path such as ``localspec.engine`` does not resolve)."""
    parts = ref.split(".")
    if parts[-1] in _FILE_SUFFIXES:
        return None
    if parts[0] == "localspec":
        return None if _resolves(ref) else f"`{ref}` does not resolve"
    if parts[0] in _ATTRIBUTE_NAMES:
        return None
    candidates = module_names().get(parts[0])
    if not candidates:
        return None  # not one of ours: os.pathsep, general.name (a GGUF key), response_format.type (JSON)
    rest = ".".join(parts[1:])
    if any(_resolves(f"{c}.{rest}") for c in candidates):
        return None
    if _resolves(ref):  # another library of the same name: gguf.GGUFReader is the gguf package's
        return None
    return f"`{ref}`: no such name in {', '.join(candidates)}"


def problems_in(text: str, name: str) -> list[str]:
    found = []
    for n, code in code_segments(text):
        for m in _PATH.finditer(code):
            path = m.group(0).rstrip(".")
            if code[m.end() : m.end() + 1] == "\u2026":  # a path cut short in a quoted table
                continue
            if not (ROOT / path).exists():
                found.append(f"{name}:{n}: {path} does not exist")
        for m in _DOTTED.finditer(code):
            why = dotted_problem(m.group(1))
            if why:
                found.append(f"{name}:{n}: {why}")
    return found


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_docs_name_only_real_modules_and_paths(doc):
    problems = problems_in(doc.read_text(encoding="utf-8"), str(doc.relative_to(ROOT)))
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize(
    "text",
    [
        "see `localspec/engine.py`",  # the flat module before the move into folders
        "`localspec.serve.exposure.no_such_function`",
        "`hub.download.no_such_thing`",
        "`localspec.engine`",
    ],
)
def test_the_check_catches_an_old_or_wrong_name(text):
    assert problems_in(text, "planted")


@pytest.mark.parametrize(
    "text",
    [
        "`localspec/decoding/engine.py`",
        "`localspec/serve/app.py`",
        "`~/.config/localspec/presets/my-pairs.toml`",
        "`report.noise_lines`",
        "`localspec.decoding.engine`",
        "`chat_tokens.chat_segments`",
        "`r.stats.memory`",
        "`see localspec/embedded/NOTI\u2026`",
        "`bench.json`",
        "`os.pathsep`",
        "`general.name`",
    ],
)
def test_the_check_passes_real_names(text):
    assert not problems_in(text, "fine")


_LINK = re.compile(r"\]\(([^)\s]+)\)")
_FENCED = re.compile(r"^(```|~~~).*?^\1", re.S | re.M)


def heading_anchors(text: str) -> set[str]:
    """GitHub's anchors for a page's headings: lower case, punctuation dropped, spaces as hyphens."""
    text = _FENCED.sub("", text)
    return {
        re.sub(r"[^\w\- ]", "", m.group(1).strip().lower()).replace(" ", "-")
        for m in re.finditer(r"^#+\s+(.*)$", text, re.M)
    }


def link_problems(path: Path, root: Path = ROOT) -> list[str]:
    """Relative links in ``path`` whose file, or whose #anchor in a Markdown file, does not exist (pages
    named relative to ``root``)."""
    found = []
    text = _FENCED.sub("", path.read_text(encoding="utf-8"))
    for m in _LINK.finditer(text):
        link = m.group(1)
        if re.match(r"^[a-z]+:", link):
            continue  # https:, mailto:
        file, _, anchor = link.partition("#")
        target = (path.parent / file).resolve() if file else path
        if not target.exists():
            found.append(f"{path.relative_to(root)}: {link}: no such file")
        elif anchor and target.suffix == ".md" and anchor not in heading_anchors(target.read_text("utf-8")):
            found.append(f"{path.relative_to(root)}: {link}: no such heading in {target.name}")
    return found


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_links_between_pages_resolve(doc):
    problems = link_problems(doc)
    assert not problems, "\n".join(problems)


ARCHIVE = sorted((ROOT / "docs" / "archive").rglob("*.md"))


@pytest.mark.parametrize("page", ARCHIVE, ids=lambda p: str(p.relative_to(ROOT)))
def test_links_in_the_archive_resolve(page):
    """The archive keeps its pages as written, but a link in them still reaches its page and picture."""
    problems = link_problems(page)
    assert not problems, "\n".join(problems)


_DOCS_PATH = re.compile(r"(?<![\w/.-])docs/[\w./-]+\.(?:md|png|json)")


def code_doc_paths() -> list[str]:
    """``file:line: path`` for each docs/ path the code, scripts and tests name that does not exist (a page
    split or moved leaves its old name in a docstring, an error's hint or a test's message)."""
    missing = []
    for folder in ("localspec", "scripts", "tests"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            if path == Path(__file__).resolve():  # its own examples below
                continue
            for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
                for m in _DOCS_PATH.finditer(line):
                    if not (ROOT / m.group(0)).exists():
                        missing.append(f"{path.relative_to(ROOT)}:{n}: {m.group(0)}")
    return missing


def test_the_code_names_only_docs_pages_that_exist():
    assert not code_doc_paths(), "\n".join(code_doc_paths())
    assert _DOCS_PATH.findall("see docs/bench.md, localspec/docs/x.md and docs/results/a.json") == [
        "docs/bench.md",
        "docs/results/a.json",
    ]


def test_the_link_check_catches_a_missing_page_and_heading(tmp_path):
    (tmp_path / "b.md").write_text("# Title\n\n## A big target: `--wide-target`\n", encoding="utf-8")
    page = tmp_path / "a.md"
    page.write_text("[x](b.md#a-big-target---wide-target) [y](https://example.org/z)\n", encoding="utf-8")
    assert not link_problems(page, tmp_path)
    page.write_text("[x](b.md#gone) [y](c.md)\n", encoding="utf-8")
    assert len(link_problems(page, tmp_path)) == 2
