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


def test_grouped_mean_ci_is_a_t_interval_over_the_group_means():
  # Three seeds of four images: the spread that counts is between seeds.
  values = [1.0, 1.1, 0.9, 1.0, 2.0, 2.1, 1.9, 2.0, 3.0, 3.1, 2.9, 3.0]
  seeds = [0] * 4 + [1] * 4 + [2] * 4
  g = stats.mean_ci(values, groups=seeds)
  assert (g["n"], g["groups"]) == (12, 3)
  assert g["mean"] == pytest.approx(2.0)
  assert g["high"] - g["mean"] == pytest.approx(4.302653 / np.sqrt(3),
                                                rel=1e-5)
  pooled = stats.mean_ci(values)
  assert pooled["high"] - pooled["mean"] < 0.6 * (g["high"] - g["mean"])
  # Unequal groups: the mean of the group means; a NaN is dropped in place.
  u = stats.mean_ci([1.0, 1.0, float("nan"), 3.0], groups=["a", "a", "b", "b"])
  assert (u["mean"], u["dropped"], u["groups"]) == (2.0, 1, 2)
  # One group: no between-seed spread, the interval is over the values.
  one = stats.mean_ci([1.0, 2.0, 3.0], groups=[5, 5, 5])
  assert one["groups"] == 1 and one["low"] == stats.mean_ci([1.0, 2.0, 3.0])[
      "low"]
  with pytest.raises(ValueError, match="groups must label every value"):
    stats.mean_ci([1.0, 2.0], groups=[0])


def test_grouped_bootstrap_covers_when_seeds_shift_every_image():
  """Images of one seed share a seed effect: the pooled bootstrap's interval
  is too narrow, the two-stage one keeps its coverage near 95 %."""
  rng = np.random.default_rng(1)
  hits = {"pooled": 0, "grouped": 0}
  trials = 150
  seeds = np.repeat(np.arange(5), 8)
  for _ in range(trials):
    values = rng.normal(0, 1, 5)[seeds] + rng.normal(0, 0.3, 40)
    for kind, groups in (("pooled", None), ("grouped", seeds)):
      b = stats.bootstrap_ci(values, np.mean, samples=300, groups=groups)
      hits[kind] += b["low"] <= 0.0 <= b["high"]
  assert hits["pooled"] / trials < 0.6
  assert hits["grouped"] / trials > 0.75  # 5 seeds: a bootstrap undercovers


def test_proportion_ci_is_clopper_pearson():
  zero = stats.proportion_ci(0, 24)
  assert (zero["value"], zero["low"]) == (0.0, 0.0)
  assert zero["high"] == pytest.approx(0.1425, abs=1e-4)
  full = stats.proportion_ci(24, 24)
  assert full["high"] == 1.0 and full["low"] == pytest.approx(0.8575, abs=1e-4)
  half = stats.proportion_ci(5, 10)
  assert (half["low"], half["high"]) == pytest.approx((0.1871, 0.8129),
                                                      abs=1e-4)
  assert stats.proportion_ci(0, 0)["value"] is None
