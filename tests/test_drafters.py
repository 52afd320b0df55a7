"""The n-gram drafter's matching rules (pure Python: no model needed)."""

from __future__ import annotations

import numpy as np

from localspec.decoding.drafters import NgramDrafter
from localspec.llama.sampling import SamplingParams

GREEDY = SamplingParams()
RNG = np.random.default_rng(0)


def _draft(ctx: list[int], n: int = 4, **kw) -> list[int]:
    d = NgramDrafter(**kw)
    d.begin(ctx[:-1])
    return d.draft(ctx, n, GREEDY, RNG).tokens


def test_proposes_what_followed_the_latest_three_gram_match():
    #      0  1  2  3  4  5  6  7  8  9 10 11 12 13 14
    ctx = [1, 2, 3, 9, 9, 9, 1, 2, 3, 7, 8, 6, 5, 1, 2, 3]
    assert _draft(ctx) == [7, 8, 6, 5]  # the later "1 2 3" (at 6) wins over the one at 0
    assert _draft(ctx, n=2) == [7, 8]


def test_prefers_the_longer_match():
    ctx = [4, 1, 2, 3, 50, 51, 52, 0, 1, 2, 3, 60, 61, 62, 0, 4, 1, 2, 3]
    assert _draft(ctx) == [50, 51, 52, 0]  # "4 1 2 3" matches at 0; "1 2 3" alone would pick 60...


def test_two_token_matches_and_short_tails_do_not_draft():
    assert _draft([1, 2, 5, 6, 7, 8, 0, 1, 2]) == []  # only a 2-gram matches
    # the latest "1 1 1" ends one token before the end: one token follows it, below min_copy
    assert _draft([1, 1, 1, 1]) == []
    assert _draft([1, 1, 1, 1], min_copy=1) == [1]


def test_index_grows_incrementally_with_the_context():
    d = NgramDrafter()
    ctx = [5, 6, 7, 8, 9, 10]
    d.begin(ctx[:-1])
    assert d.draft(ctx, 4, GREEDY, RNG).tokens == []
    ctx += [11, 5, 6, 7]
    assert d.draft(ctx, 4, GREEDY, RNG).tokens == [8, 9, 10, 11]


def test_drafters_import_without_llama_cpp():
    """The drafter interface is pure Python: type-only imports of the runtime stay under TYPE_CHECKING."""
    import subprocess
    import sys

    code = (
        "import sys; sys.modules['llama_cpp'] = None\n"
        "from localspec.decoding.drafters import NgramDrafter\nfrom localspec.decoding.draft import SOURCES\n"
        "from localspec.llama.sampling import SamplingParams\n"
        "import numpy as np\n"
        "d = NgramDrafter(); ctx = [1, 2, 3, 4, 5, 1, 2, 3]; d.begin(ctx[:-1])\n"
        "assert d.draft(ctx, 2, SamplingParams(), np.random.default_rng(0)).tokens == [4, 5]\n"
        "assert 'llama_cpp' not in {m for m in sys.modules if sys.modules[m] is not None}\n"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
