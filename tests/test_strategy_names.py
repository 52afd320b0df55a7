"""A strategy is parsed once, in ``localspec/settings.py``, and travels as a :class:`Strategy`: no code
outside it compares a strategy (or its name) with a strategy's name written out. Read from the source with
``ast``."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from localspec.settings import STRATEGIES

ROOT = Path(__file__).resolve().parent.parent
SOURCES = [ROOT / "localspec", ROOT / "ui", ROOT / "scripts"]
PARSED_HERE = ROOT / "localspec" / "settings.py"
#: An operand that holds a strategy, by what the code calls it.
STRATEGY_LIKE = re.compile(r"strateg|route|\bkind\b", re.IGNORECASE)


def _names(node: ast.expr) -> set[str]:
    """The strategy names written out in ``node``: a string, or a tuple, list or set of them."""
    items = node.elts if isinstance(node, (ast.Tuple, ast.List, ast.Set)) else [node]
    return {i.value for i in items if isinstance(i, ast.Constant) and i.value in STRATEGIES}


def name_comparisons(source: str) -> list[str]:
    """Each comparison in ``source`` of a strategy-like operand with a strategy's name written out."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Compare):
            continue
        operands = [node.left, *node.comparators]
        for i, operand in enumerate(operands):
            others = operands[:i] + operands[i + 1 :]
            if _names(operand) and any(STRATEGY_LIKE.search(ast.unparse(o)) for o in others):
                found.append(f"line {node.lineno}: {ast.unparse(node)}")
                break
    return found


def test_the_check_finds_what_it_looks_for():
    sample = 'if settings.strategy == "auto":\n    pass\nok = stats.strategy.name in ("none", "model")\n'
    assert len(name_comparisons(sample)) == 2
    assert name_comparisons('if tool_choice == "auto":\n    pass\n') == []  # not a strategy


def test_no_strategy_name_is_compared_outside_settings():
    wrong = []
    for folder in SOURCES:
        for path in sorted(folder.rglob("*.py")):
            if path == PARSED_HERE:
                continue
            for hit in name_comparisons(path.read_text(encoding="utf-8")):
                wrong.append(f"{path.relative_to(ROOT)} {hit}")
    assert wrong == [], "compare the parsed Strategy's parts (settings.py), not its name:\n" + "\n".join(
        wrong
    )


def test_the_parsed_strategy_travels_and_one_rule_sizes_the_suffix_caches_drafts():
    from localspec.settings import LOOKUP_N_MAX, STRATEGY_BY_NAME, DraftSettings

    model = DraftSettings("model", n_max=4)
    assert model.strategy is STRATEGY_BY_NAME["model"] and model.as_dict()["strategy"] == "model"
    assert model.switched_to("suffix").n_max == LOOKUP_N_MAX  # it sizes its own drafts: n_max bounds a pass
    assert model.switched_to("auto", max_draft=10).n_max == 10  # never past one verify pass of the target
    assert model.switched_to("suffix", n_max=6).n_max == 6  # asked for: kept
    assert model.switched_to("ngram").n_max == 4  # a fixed-length lookup keeps the pipeline's length
    suffix = DraftSettings("suffix", n_max=12)
    assert suffix.switched_to("auto").n_max == 12  # between suffix strategies the length stays
    assert STRATEGY_BY_NAME["model+suffix"].mtp_counterpart is STRATEGY_BY_NAME["mtp+suffix"]
    assert STRATEGY_BY_NAME["ngram"].mtp_counterpart is STRATEGY_BY_NAME["ngram"]
