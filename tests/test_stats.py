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


def test_paired_difference_and_mean_ci_honour_level_and_groups():
  """Hand values: t(0.95, 2) = 2.919986 for a 90 % interval of 3 values; with
  groups the interval is over the 3 seeds' mean differences (1, 2, 3)."""
  d = stats.paired_difference_ci([2.0, 3.0, 4.0], [1.0, 1.0, 1.0], level=0.9)
  assert d["mean"] == pytest.approx(2.0)
  assert d["high"] - d["mean"] == pytest.approx(2.919986 / np.sqrt(3),
                                                rel=1e-5)
  assert stats.mean_ci([1.0, 2.0, 3.0], level=0.9)["high"] == pytest.approx(
      2.0 + 2.919986 / np.sqrt(3), rel=1e-5)
  a = [1.0, 1.1, 0.9, 2.0, 2.1, 1.9, 3.0, 3.1, 2.9]
  g = stats.paired_difference_ci(a, [0.0] * 9, groups=[0] * 3 + [1] * 3 +
                                 [2] * 3)
  assert (g["groups"], g["n"]) == (3, 9)
  assert g["high"] - g["mean"] == pytest.approx(4.302653 / np.sqrt(3),
                                                rel=1e-5)


def test_bootstrap_level_sets_the_quantiles():
  """A 50 % interval is the bootstrap's quartiles: inside the 95 % one."""
  v = np.random.default_rng(2).normal(size=40)
  wide = stats.bootstrap_ci(v, np.mean)
  narrow = stats.bootstrap_ci(v, np.mean, level=0.5)
  assert wide["low"] < narrow["low"] < narrow["high"] < wide["high"]
  # About 0.674 / 1.960 of the width, for a near-normal bootstrap mean.
  ratio = (narrow["high"] - narrow["low"]) / (wide["high"] - wide["low"])
  assert 0.25 < ratio < 0.45


@pytest.mark.parametrize("low,high,target,higher,expected", [
    (170.0, 300.0, 160.0, True, "held"),
    (10.0, 150.0, 160.0, True, "did not hold"),
    (100.0, 200.0, 160.0, True, "inconclusive"),
    (None, 200.0, 160.0, True, "inconclusive"),
    (0.0, 0.004, 0.01, False, "held"),
    (0.02, 0.05, 0.01, False, "did not hold"),
    # A lower-is-better interval straddling the target (0.005 < 0.01 < 0.02).
    (0.005, 0.02, 0.01, False, "inconclusive"),
    # Touching the target: held from above, inconclusive from below.
    (160.0, 300.0, 160.0, True, "held"),
    (100.0, 160.0, 160.0, True, "inconclusive"),
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
  # Three seeds of which one keeps finite values: its images are not seeds,
  # so no interval (the mean is still given).
  nan = float("nan")
  lost = stats.mean_ci([1.0, 2.0, 3.0, nan, nan], groups=[5, 5, 5, 6, 7])
  assert (lost["mean"], lost["low"], lost["high"]) == (2.0, None, None)
  b = stats.bootstrap_ci([1.0, 2.0, 3.0, nan], groups=[5, 5, 5, 6])
  assert (b["value"], b["low"], b["high"]) == (2.0, None, None)
  assert stats.bootstrap_ci([1.0, 2.0, 3.0], groups=[5, 5, 5])["low"] < 2.0
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


def test_grouped_bootstrap_draws_seeds_then_images_within_them():
  """Hand-derivable two-stage draws of 3 seeds x 2 images. Seeds constant at
  0, 1, 2: only drawing seeds moves the mean, and all three draws are the
  lowest (highest) seed with probability 1/27 > 2.5 %, so the interval is
  [0, 2]. Seeds that each hold (0, 1): only drawing images within a seed
  moves the mean (always 0.5 otherwise)."""
  seeds = [0, 0, 1, 1, 2, 2]
  between = stats.bootstrap_ci([0.0, 0.0, 1.0, 1.0, 2.0, 2.0], np.mean,
                               groups=seeds)
  assert (between["low"], between["high"]) == pytest.approx((0.0, 2.0))
  within = stats.bootstrap_ci([0.0, 1.0] * 3, np.mean, groups=seeds)
  assert within["low"] < 0.5 < within["high"]


def test_ratio_ci_resamples_each_side_by_its_own_groups():
  """Grouped side: three constant seeds, the interval spans the all-lowest
  and all-highest draws (probability 1/27 each, as above); the other side is
  constant. Pooled, the extremes need all 6 draws alike (p = 1/729)."""
  seeds = [0, 0, 1, 1, 2, 2]
  den = [1.0, 1.0, 2.0, 2.0, 4.0, 4.0]
  r = stats.ratio_ci([2.0] * 4, den, denominator_groups=seeds)
  assert r["value"] == pytest.approx(2.0 / (7.0 / 3.0))
  assert (r["low"], r["high"]) == pytest.approx((0.5, 2.0))
  r = stats.ratio_ci(den, [2.0] * 4, numerator_groups=seeds)
  assert (r["low"], r["high"]) == pytest.approx((0.5, 2.0))


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


def test_ratio_ci_gives_no_interval_when_either_side_has_one_value():
  for num, den in (([4.0], [1.0, 1.1, 0.9, 1.0]),
                   ([4.0, 4.2, 3.9], [1.0])):
    r = stats.ratio_ci(num, den)
    assert r["value"] == pytest.approx(np.mean(num) / np.mean(den))
    assert r["low"] is None and r["high"] is None


def test_grouped_mean_is_the_mean_of_skewed_group_means():
  """Seed means 2 (of 1, 1, 4) and 10 (of 10, 10, 10): mean 6, t(2 dof... 1
  dof) interval over the two seed means; a median per seed would give 5.5."""
  g = stats.mean_ci([1.0, 1.0, 4.0, 10.0, 10.0, 10.0],
                    groups=[0, 0, 0, 1, 1, 1])
  assert g["mean"] == pytest.approx(6.0)
  assert g["high"] - g["mean"] == pytest.approx(
      12.706205 * np.std([2.0, 10.0], ddof=1) / np.sqrt(2), rel=1e-5)



def test_bootstrap_and_ratio_intervals_are_fixed_by_their_seed_and_level():
  rng = np.random.default_rng(3)
  v, w = rng.normal(5, 1, 25), rng.normal(1, 0.1, 25)
  a = stats.bootstrap_ci(v, np.mean)
  assert stats.bootstrap_ci(v, np.mean) == a
  assert stats.bootstrap_ci(v, np.mean, seed=1) != a
  r = stats.ratio_ci(v, w)
  assert stats.ratio_ci(v, w) == r
  assert stats.ratio_ci(v, w, seed=1) != r
  half = stats.ratio_ci(v, w, level=0.5)
  assert r["low"] < half["low"] < half["high"] < r["high"]



def test_bootstrap_of_one_value_has_no_interval():
  b = stats.bootstrap_ci([3.0, float("nan")], np.mean)
  assert (b["value"], b["low"], b["high"], b["n"]) == (3.0, None, None, 1)
