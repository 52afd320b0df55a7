"""User pages a user reads: none over 12 KB, and no measured table that no result file stands behind.

Every page of README.md and docs/ (docs/archive/ aside, where dated runs are kept as they were written) is at
most 12 KB; reference material goes to docs/reference/, dated narratives to docs/archive/.

A table of measured figures (speedups, tokens/s, milliseconds, acceptance percentages) in a user page is
rendered from a result file committed in docs/results/, and a named test renders it again and compares: a
table typed by hand drifts from the run it came from. Tables whose raw results were not kept live in
docs/archive/ with their dates. The README's summary table is the one exception: each of its figures must be
one that performance.md or the archived tables print.
"""

from __future__ import annotations

import re

import pytest
from test_docs import DOCS, ROOT

MAX_PAGE_BYTES = 12 * 1024

# page -> (the result file it is rendered from, the test that renders it again and compares)
RENDERED = {
    "docs/batching.md": (
        "docs/results/clients.json",
        "tests/test_batch.py::test_the_published_clients_table_is_its_result_file",
    ),
    "docs/hybrid-models.md": (
        "docs/results/hybrid-rollback.json",
        "tests/test_hybrid.py::test_the_published_rollback_table_is_its_result_file",
    ),
    "docs/mtp.md": (
        "docs/results/mtp.json",
        "tests/test_mtp.py::test_the_published_mtp_table_is_its_result_file",
    ),
    "docs/eagle3-dflash.md": (
        "docs/results/dflash-wide.json",
        "tests/test_eagle3_dflash.py::test_the_published_tables_are_their_result_files",
    ),
}
# the README's "What to expect" sums up the archived tables; its figures are checked against them below
SUMMARY = "README.md"
SUMMARY_SOURCES = ("docs/performance.md", "docs/archive/measured-2026-12.md")

_FENCED = re.compile(r"^(```|~~~).*?^\1", re.S | re.M)
# a cell that opens with a figure and its unit: **1.53x**, 0.5-0.7x (...), 13.9 tok/s, 0.06 ms, 74%; not prose
# that names a figure (more than 5% of the ids) or a shape (4 x 160 x 5)
_MEASURED_CELL = re.compile(r"^\**(?:\d+(?:\.\d+)?-)?\d+(?:\.\d+)?(?:x\b|\s*(?:%|tok/s|tokens/s|ms\b))")
# or a bare number under a header that names what was measured (tokens/s, latency, V(2), ...)
_MEASURED_HEADER = re.compile(r"tok/s|tokens/s|speedup|latency|\bms\b|V\(\d|acceptance|accepted", re.I)
_NUMBER_CELL = re.compile(r"^\**\d+(?:\.\d+)?\**(?: s)?$")


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_user_page_is_over_12_kb(doc):
    size = doc.stat().st_size
    assert size <= MAX_PAGE_BYTES, (
        f"{doc.relative_to(ROOT)} is {size} bytes (at most {MAX_PAGE_BYTES}): move reference material to "
        "docs/reference/ (or the code's docstrings) and dated runs to docs/archive/, and link them"
    )


def measured_tables(text: str) -> list[tuple[int, str]]:
    """(line number, header row) of each Markdown table with a cell of measured figures, code blocks aside."""
    text = _FENCED.sub(lambda m: "\n" * m.group(0).count("\n"), text)
    found: list[tuple[int, str]] = []
    start, header, measured = 0, "", False
    for n, line in enumerate([*text.splitlines(), ""], 1):
        if line.lstrip().startswith("|"):
            if not header:
                start, header, measured = n, line.strip(), False
            else:
                cells = line.strip().strip("|").split("|")
                measured = measured or any(
                    _MEASURED_CELL.search(c.strip())
                    or _MEASURED_HEADER.search(header)
                    and _NUMBER_CELL.match(c.strip())
                    for c in cells
                )
            continue
        if header and measured:
            found.append((start, header))
        header = ""
    return found


def test_every_user_page_with_a_measured_table_is_rendered_from_its_result_file():
    unrendered = []
    for doc in DOCS:
        name = doc.relative_to(ROOT).as_posix()
        if name in RENDERED or name == SUMMARY:
            continue
        for n, header in measured_tables(doc.read_text(encoding="utf-8")):
            unrendered.append(f"{name}:{n}: {header[:80]}")
    assert not unrendered, (
        "measured tables with no result file behind them: commit the run's result file in docs/results/ "
        "and a test that renders the table from it (add the page to RENDERED), or move the table to "
        "docs/archive/ with its date:\n" + "\n".join(unrendered)
    )


@pytest.mark.parametrize("page", sorted(RENDERED))
def test_a_rendered_page_names_its_result_file_and_a_test_that_renders_it(page):
    result, test = RENDERED[page]
    assert measured_tables((ROOT / page).read_text(encoding="utf-8")), f"{page} has no measured table left"
    assert (ROOT / result).is_file(), result
    path, _, function = test.partition("::")
    assert re.search(rf"^def {function}\(", (ROOT / path).read_text(encoding="utf-8"), re.M), test


def _figures(text: str) -> set[str]:
    """Every number of a ratio, percentage or range in ``text``: ``0.93-1.96x`` gives 0.93 and 1.96."""
    return set(re.findall(r"\d+\.\d+", text))


def test_the_readme_summary_prints_only_figures_of_its_sources():
    readme = (ROOT / SUMMARY).read_text(encoding="utf-8")
    tables = measured_tables(readme)
    assert len(tables) == 1, f"the README has one summary table, not {tables}"
    lines = readme.splitlines()[tables[0][0] - 1 :]
    table = "\n".join(line for line in lines[: next(i for i, x in enumerate(lines) if not x.startswith("|"))])
    sources = "\n".join((ROOT / s).read_text(encoding="utf-8") for s in SUMMARY_SOURCES)
    stray = sorted(_figures(table) - _figures(sources))
    assert not stray, f"README figures that neither {' nor '.join(SUMMARY_SOURCES)} prints: {stray}"


def test_the_table_check_finds_measured_tables_and_passes_others():
    page = (
        "| kind | speedup |\n| --- | --- |\n| code | 1.53x |\n\n"
        "| status | when |\n| --- | --- |\n| 0 | done, more than 5% of ids, 4 x 160 x 5 |\n\n"
        "```\n| a | b |\n| --- | --- |\n| x | 3 ms |\n```\n"
        "| arch | tok/s |\n|---|---|\n| qwen3 | 350 tok/s |\n\n"
        "| target | V(2) |\n|---|---|\n| F16 | 1.57 |\n\n| flag | default |\n|---|---|\n| `--port` | 8000 |\n"
    )
    assert [n for n, _ in measured_tables(page)] == [1, 14, 18]
    hybrid = (ROOT / "docs" / "hybrid-models.md").read_text(encoding="utf-8")
    assert measured_tables(hybrid), "the rollback table is not seen as measured"
    assert not measured_tables((ROOT / "docs" / "cli.md").read_text(encoding="utf-8"))


def _when_and_where(result: dict) -> tuple[str, str]:
    """A result file's date (``measured``, at the top or in its ``machine``) and its machine, as text."""
    machine = result.get("machine")
    inner = machine if isinstance(machine, dict) else {}
    when = str(result.get("measured") or inner.get("measured") or "")
    where = str(inner.get("cpu") if inner else machine or "")
    return when, where


@pytest.mark.parametrize("result", sorted((ROOT / "docs" / "results").glob("*.json")), ids=lambda p: p.name)
def test_every_result_file_the_docs_render_says_when_and_on_what_it_was_measured(result):
    import json

    when, where = _when_and_where(json.loads(result.read_text(encoding="utf-8")))
    assert re.fullmatch(r"20\d\d-\d\d-\d\d", when), f"{result.name}: no `measured` date (YYYY-MM-DD)"
    assert where.strip(), f"{result.name}: no machine"


def test_the_bench_writes_the_date_it_measured():
    from localspec.bench.report import machine_info, machine_label

    info = machine_info(2)
    assert _when_and_where({"machine": info})[0] == info["measured"]
    assert f"measured {info['measured']}" in machine_label(info)


def test_the_readme_summary_dates_every_column():
    """Each machine's column says when it was measured (the README's table once had no date at all)."""
    readme = (ROOT / SUMMARY).read_text(encoding="utf-8")
    start = measured_tables(readme)[0][0]
    header = readme.splitlines()[start - 1]
    columns = [c.strip() for c in header.strip().strip("|").split("|")][1:]
    undated = [c for c in columns if not re.search(r"20\d\d-\d\d-\d\d", c)]
    assert not undated, f"README summary columns without a date: {undated}"
