"""Intervals of repdef_jax.paper.stats: coverage at fixed seeds, edge cases."""

import numpy as np
import pytest

from repdef_jax.paper import stats


def test_mean_ci_covers_the_true_mean_about_95_percent():
  rng = np.random.default_rng(0)
  hits = 0
  trials = 2000
  for _ in range(trials):
    s = stats.mean_ci(rng.normal(3.0, 2.0, 4))
    hits += s["low"] <= 3.0 <= s["high"]
  assert 0.93 <= hits / trials <= 0.97


def test_mean_ci_small_samples_and_non_finite():
  assert stats.mean_ci([]) == {"n": 0, "dropped": 0, "mean": None,
                               "low": None, "high": None}
  one = stats.mean_ci([2.0, float("nan"), float("inf")])
  assert (one["mean"], one["low"], one["n"], one["dropped"]) == (2.0, None,
                                                                   1, 2)
  flat = stats.mean_ci([1.5, 1.5, 1.5])
  assert flat["low"] == flat["high"] == flat["mean"] == 1.5
  # t with 2 degrees of freedom: half-width t(0.975, 2) * s / sqrt(3).
  s = stats.mean_ci([1.0, 2.0, 3.0])
  assert s["high"] - s["mean"] == pytest.approx(4.302653 * 1.0 / np.sqrt(3),
                                                rel=1e-5)


def test_bootstrap_median_interval_contains_the_median_and_shrinks():
  rng = np.random.default_rng(1)
  small = stats.bootstrap_ci(rng.exponential(1.0, 20))
  large = stats.bootstrap_ci(rng.exponential(1.0, 2000))
  assert small["low"] <= small["value"] <= small["high"]
  assert (large["high"] - large["low"]) < (small["high"] - small["low"]) / 4
  assert large["low"] <= np.log(2) <= large["high"]  # true median ln 2
  # Reproducible: a fixed seed gives the same interval.
  v = rng.normal(size=30)
  assert stats.bootstrap_ci(v) == stats.bootstrap_ci(v)


def test_ratio_ci():
  r = stats.ratio_ci([4.0, 4.2, 3.8, 4.0], [1.0, 1.1, 0.9, 1.0])
  assert r["value"] == pytest.approx(4.0)
  assert r["low"] < 4.0 < r["high"]
  assert stats.ratio_ci([1.0, 2.0], [0.0, 0.0])["value"] is None
  assert stats.ratio_ci([1.0], [2.0])["low"] is None


def test_paired_difference():
  d = stats.paired_difference_ci([0.9, 0.8, 0.85], [0.8, 0.7, 0.75])
  assert d["mean"] == pytest.approx(0.1)
  assert d["low"] == pytest.approx(0.1) and d["high"] == pytest.approx(0.1)
  with pytest.raises(ValueError, match="equal lengths"):
    stats.paired_difference_ci([1.0], [1.0, 2.0])


@pytest.mark.parametrize("low,high,target,higher,expected", [
    (170.0, 300.0, 160.0, True, "held"),
    (10.0, 150.0, 160.0, True, "did not hold"),
    (100.0, 200.0, 160.0, True, "inconclusive"),
    (None, 200.0, 160.0, True, "inconclusive"),
    (0.0, 0.004, 0.01, False, "held"),
    (0.02, 0.05, 0.01, False, "did not hold"),
])
def test_verdict(low, high, target, higher, expected):
  assert stats.verdict(low, high, target, higher) == expected
