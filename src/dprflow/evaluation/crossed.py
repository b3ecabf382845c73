"""A paired test over queries and fine-tuning seeds (issue 54, item 2).

Two fine-tuned rows scored on the same ``Q`` test queries, each fine-tuned with the same ``S``
seeds, give a ``Q x S`` table of per-query differences ``d[q, s]``. The compare stage's paired
test averages each query's differences over the seeds and tests over the queries: it counts the
queries' spread only, so a difference that one lucky seed made looks as sure as one every seed
shows. Here the differences follow the two-way crossed random-effects model without replication
(Searle, Casella and McCulloch 1992, *Variance Components*, section 4.7)::

    d[q, s] = mu + a[q] + b[s] + e[q, s],   a ~ (0, var_query), b ~ (0, var_seed), e ~ (0, var_residual)

and ``mu``, the mean difference, is tested with the variance of its estimate (the grand mean)::

    Var(mean) = var_query / Q + var_seed / S + var_residual / (Q S)

from the ANOVA mean squares (``E[MS_query] = var_residual + S var_query``, ``E[MS_seed] =
var_residual + Q var_seed``, ``E[MS_residual] = var_residual``), each component's estimate floored
at 0, and the degrees of freedom of that combination of mean squares by Satterthwaite (1946). With
one seed it is the paired t-test over queries; when the seeds' means agree (``var_seed``'s
estimate 0) it is the paired t-test of the seed-averaged differences, the compare stage's test;
when the seeds disagree, the seed term dominates and its ``S - 1`` degrees of freedom decide.

:func:`detectable_difference` is the design's power: the smallest true mean difference the test
rejects with probability ``power`` at level ``alpha`` (two-sided), for the measured spreads.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class CrossedTest:
    mean: float  # the mean difference over queries and seeds
    se: float  # the standard error of the mean
    df: float  # Satterthwaite's degrees of freedom
    p: float  # two-sided p-value of mean = 0
    var_query: float
    var_seed: float
    var_residual: float
    queries: int
    seeds: int


def crossed_test(diff: np.ndarray) -> CrossedTest:
    """Test the mean of a ``queries x seeds`` table of paired differences (see the module)."""
    from scipy import stats  # only the tests need scipy (as in evaluation.compare)

    d = np.asarray(diff, dtype=float)
    if d.ndim != 2 or d.shape[0] < 2 or d.shape[1] < 1 or not np.isfinite(d).all():
        raise ValueError(f"need a finite queries x seeds table with 2 or more queries, got shape {d.shape}")
    Q, S = d.shape
    grand = d.mean()
    by_query, by_seed = d.mean(axis=1), d.mean(axis=0)
    ms_query = S * ((by_query - grand) ** 2).sum() / (Q - 1)
    if S == 1:  # no seed term: the paired t-test over the queries
        var_query, var_seed, var_residual = ms_query, 0.0, 0.0
        terms = [(ms_query, Q - 1)]  # (coefficient x mean square, its degrees of freedom)
    else:
        ms_seed = Q * ((by_seed - grand) ** 2).sum() / (S - 1)
        residual = d - by_query[:, None] - by_seed[None, :] + grand
        ms_residual = (residual**2).sum() / ((Q - 1) * (S - 1))
        var_query = max(0.0, (ms_query - ms_residual) / S)
        var_seed = max(0.0, (ms_seed - ms_residual) / Q)
        var_residual = ms_residual
        # Q S Var(mean) = S var_query + Q var_seed + var_residual, as mean squares: both kept,
        # MS_query + MS_seed - MS_residual; one floored at 0, the other's mean square (the
        # residual and the floored term estimate the same variance); both floored, the three
        # pooled: the t-test of all Q S differences as independent draws
        if var_query > 0 and var_seed > 0:
            terms = [(ms_query, Q - 1), (ms_seed, S - 1), (-ms_residual, (Q - 1) * (S - 1))]
        elif var_query > 0:
            terms = [(ms_query, Q - 1)]
        elif var_seed > 0:
            terms = [(ms_seed, S - 1)]
        else:
            var_residual = float(((d - grand) ** 2).sum() / (Q * S - 1))
            terms = [(var_residual, Q * S - 1)]
    total = sum(c for c, _ in terms)
    se = math.sqrt(max(total, 0.0) / (Q * S))
    denominator = sum(c * c / df for c, df in terms)
    df = total * total / denominator if denominator > 0 else float(Q - 1)
    if se == 0:
        p = 1.0 if grand == 0 else 0.0
    else:
        p = float(2 * stats.t.sf(abs(grand) / se, df))
    return CrossedTest(float(grand), se, float(df), p, var_query, var_seed, var_residual, Q, S)


def detectable_difference(test: CrossedTest, alpha: float = 0.05, power: float = 0.8) -> float:
    """The smallest true mean difference that ``test``'s design rejects with probability ``power``
    at two-sided level ``alpha``, for its measured spreads: ``(t[1 - alpha/2] + t[power]) x se``
    at its degrees of freedom (the usual normal-shift approximation of the noncentral t)."""
    from scipy import stats

    if not (0 < alpha < 1 and 0 < power < 1):
        raise ValueError(f"alpha and power must be in (0, 1), got {alpha}, {power}")
    return float((stats.t.ppf(1 - alpha / 2, test.df) + stats.t.ppf(power, test.df)) * test.se)
