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
