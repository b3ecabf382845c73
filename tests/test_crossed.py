"""The paired test over queries and seeds (dprflow.evaluation.crossed) on tables whose answer is
known: the paired t-test where the seeds add nothing, a wide p where one seed carries the
difference, and a detectable difference whose power is what it says."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from dprflow.evaluation.crossed import crossed_test, detectable_difference


def test_one_seed_is_the_paired_t_test():
    rng = np.random.default_rng(0)
    a, b = rng.normal(0.5, 0.2, 300), rng.normal(0.48, 0.2, 300)
    test = crossed_test((a - b)[:, None])
    assert test.p == pytest.approx(stats.ttest_rel(a, b).pvalue, rel=1e-9)
    assert test.df == 299 and test.var_seed == 0


def test_seeds_that_agree_give_the_t_test_of_the_seed_averaged_differences():
    rng = np.random.default_rng(1)
    d = rng.normal(0.02, 0.15, (300, 3))
    d += d.mean() - d.mean(axis=0)  # every seed's mean difference the same: no seed term
    test = crossed_test(d)
    assert test.var_seed == 0
    assert test.p == pytest.approx(stats.ttest_1samp(d.mean(axis=1), 0).pvalue, rel=1e-9)
    assert test.df == pytest.approx(299)


def test_no_query_or_seed_effect_is_the_t_test_of_every_difference():
    """Seeds and queries that explain nothing beyond the noise: the Q x S differences are tested
    as independent draws."""
    d = np.array([[0.1, 0.2], [0.2, 0.0], [0.0, 0.3]])
    test = crossed_test(d)
    assert test.var_query == test.var_seed == 0
    assert test.p == pytest.approx(stats.ttest_1samp(d.ravel(), 0).pvalue, rel=1e-9)
    assert test.df == pytest.approx(5)


def test_a_difference_one_seed_makes_is_not_significant():
    """Seeds 0.10, 0.0, -0.01 apart: averaged over seeds each query gains 0.03, a clear paired
    t-test over 300 queries; over queries and seeds the 3 seeds' spread decides."""
    rng = np.random.default_rng(2)
    d = rng.normal(0, 0.05, (300, 3)) + np.array([0.10, 0.0, -0.01])
    assert stats.ttest_1samp(d.mean(axis=1), 0).pvalue < 1e-20
    test = crossed_test(d)
    assert test.p > 0.05
    assert test.df < 3  # the seed term's 2 degrees of freedom dominate
    assert test.var_seed == pytest.approx(np.var([0.10, 0.0, -0.01], ddof=1), rel=0.1)


def test_a_difference_every_seed_shows_is_significant():
    rng = np.random.default_rng(3)
    d = rng.normal(0, 0.05, (300, 3)) + np.array([0.030, 0.031, 0.029])
    # the seeds' means agree up to their noise, but 3 seeds leave the seed term 2 degrees of
    # freedom: far less certainty than the queries-only test's (p about 1e-20 here)
    assert crossed_test(d).p < 0.01


def test_the_detectable_difference_has_the_power_it_says():
    """A true difference of detectable_difference is rejected in about 80% of draws of the same
    design (queries' and seeds' spreads as measured)."""
    rng = np.random.default_rng(4)
    Q, S, sd_query, sd_seed, sd_residual = 60, 3, 0.1, 0.01, 0.05

    def draw(mu):
        return (
            mu
            + rng.normal(0, sd_query, (Q, 1))
            + rng.normal(0, sd_seed, (1, S))
            + rng.normal(0, sd_residual, (Q, S))
        )

    delta = np.median([detectable_difference(crossed_test(draw(0.0))) for _ in range(50)])
    rejected = np.mean([crossed_test(draw(delta)).p < 0.05 for _ in range(1000)])
    assert 0.72 < rejected < 0.88
    # and at no difference the level is kept
    assert np.mean([crossed_test(draw(0.0)).p < 0.05 for _ in range(1000)]) < 0.08


def test_bad_tables_are_refused():
    with pytest.raises(ValueError, match="queries x seeds"):
        crossed_test(np.zeros((1, 3)))
    with pytest.raises(ValueError, match="queries x seeds"):
        crossed_test(np.array([[0.1, np.nan], [0.2, 0.3]]))
