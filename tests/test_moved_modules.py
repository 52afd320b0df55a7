"""The flat layout's module paths keep working for a release: old imports resolve to the moved modules (the
same objects), with a warning that names the new path; results pickled by localspec 0.1 still load."""

from __future__ import annotations

import importlib
import pickle
import sys
import warnings
from pathlib import Path

import pytest

import localspec
from localspec import _moved

PICKLE_0_1 = Path(__file__).parent / "data" / "generation_result_0.1.pickle"


@pytest.mark.parametrize("old", sorted(_moved.MOVED))
def test_an_old_module_path_is_the_moved_module(old):
    sys.modules.pop(old, None)
    with pytest.warns(DeprecationWarning, match=_moved.MOVED[old].replace(".", r"\.")):
        module = importlib.import_module(old)
    assert module is importlib.import_module(_moved.MOVED[old])


def test_old_names_of_the_modules_that_became_folders():
    from localspec.bench.single import benchmark
    from localspec.suffix.drafter import SuffixDrafter

    with pytest.warns(DeprecationWarning, match="localspec.suffix.drafter"):
        from localspec.suffix import SuffixDrafter as old_drafter  # type: ignore[attr-defined]
    with pytest.warns(DeprecationWarning, match="localspec.bench.single"):
        from localspec.bench import benchmark as old_benchmark  # type: ignore[attr-defined]
    with pytest.warns(DeprecationWarning, match="localspec.hub.download"):
        from localspec.hub import ensure_preset  # type: ignore[attr-defined]
    assert old_drafter is SuffixDrafter and old_benchmark is benchmark
    assert ensure_preset is importlib.import_module("localspec.hub.download").ensure_preset
    with pytest.raises(AttributeError, match="no attribute 'nothing_here'"):
        localspec.suffix.nothing_here  # noqa: B018


def test_a_result_pickled_by_the_flat_layout_still_loads():
    data = PICKLE_0_1.read_bytes()
    assert b"localspec.api" in data and b"localspec.stats" in data  # written by localspec 0.1
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        result = pickle.loads(data)
    assert isinstance(result, localspec.GenerationResult)
    assert result == "abc" and result.tokens == [1, 2, 3] and result.from_draft == [False, True, True]
    assert result.stats.generated_tokens == 3 and result.stats.accepted == 2
    assert isinstance(result.stats, localspec.GenerationStats)
