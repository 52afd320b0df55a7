"""Chi-square test of two samples of outcomes: do they come from the same distribution?"""

from __future__ import annotations

import numpy as np


def chi2_pvalue(a: list, b: list) -> float:
    """p-value of a chi-square test of homogeneity; outcomes seen fewer than 10 times are pooled."""
    from scipy.stats import chi2_contingency

    keys = sorted(set(a) | set(b))
    ca = np.array([a.count(k) for k in keys], dtype=float)
    cb = np.array([b.count(k) for k in keys], dtype=float)
    big = (ca + cb) >= 10
    table = np.array([np.append(ca[big], ca[~big].sum()), np.append(cb[big], cb[~big].sum())])
    table = table[:, table.sum(axis=0) > 0]
    return float(chi2_contingency(table)[1])


def second_token_pvalue(pipe, prompt: list[int], spec: dict, n: int = 300) -> float:
    """:func:`chi2_pvalue` of the second sampled token after ``prompt`` (temperature 1, seeds ``0..n-1``),
    from the target alone and with drafting as ``spec`` (``stream_tokens`` keywords) says: the first may be
    an accepted draft, the second comes after a rejection as often as not."""
    samples: dict[str, list[int]] = {"base": [], "spec": []}
    for mode, kw in (("base", {"baseline": True}), ("spec", spec)):
        for seed in range(n):
            out = list(pipe.stream_tokens(prompt, max_tokens=2, temperature=1.0, seed=seed, **kw))
            samples[mode].append(out[-1].token)
    return chi2_pvalue(samples["base"], samples["spec"])
