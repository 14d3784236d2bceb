"""Summary statistics with intervals, decided before looking at results.

Every number the report quotes is a mean (or median) with a 95 % interval:
Student-t for means over seeds (few, independent runs), a percentile
bootstrap for medians and ratios, Clopper-Pearson for proportions.

Samples of one seed are not independent (one model, one partition, one
draw of images), so a statistic over images x seeds takes ``groups`` (the
seed of each sample): its interval is then Student-t over the seeds' means
(seeds - 1 degrees of freedom) and its bootstrap resamples seeds, then
images within each drawn seed. With a single seed (the ``quick`` smoke
preset) there is no between-seed spread and the interval is over the
images; ``groups`` in the output says how many seeds there were.
Host-side NumPy/SciPy only.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Sequence

import numpy as np
from scipy import stats as scipy_stats

LEVEL = 0.95
BOOTSTRAP_SAMPLES = 2000
# Recorded in every part's result JSON (``interval_rule``) and printed by
# the report; parts written before it existed pooled images x seeds.
INTERVAL_RULE = ("over seeds: Student-t over the seeds' means (seeds - 1 "
                 "degrees of freedom); ratios Student-t on the log scale over "
                 "the seeds' own ratios; proportions Clopper-Pearson")
# The rule before 2026-12-07 (ratios by a bootstrap of seeds, then images),
# which the results of that date and earlier record.
BOOTSTRAP_RATIO_RULE = ("over seeds: Student-t over the seeds' means (seeds "
                        "- 1 degrees of freedom); bootstraps resample seeds, "
                        "then images within a seed; proportions "
                        "Clopper-Pearson")


def _finite(values: Sequence[float]) -> np.ndarray:
  v = np.asarray([float(x) for x in values], np.float64)
  return v[np.isfinite(v)]


def finite_groups(values: Sequence[float], groups: Sequence[Any] | None
                   ) -> tuple[np.ndarray, list[np.ndarray] | None]:
  """Finite values, and (with ``groups``) their split by group label."""
  if groups is None:
    return _finite(values), None
  if len(groups) != len(values):
    raise ValueError(f"groups must label every value: {len(groups)} labels "
                     f"for {len(values)} values.")
  v = np.asarray([float(x) for x in values], np.float64)
  labels = np.asarray([str(g) for g in groups])
  keep = np.isfinite(v)
  v, labels = v[keep], labels[keep]
  return v, [v[labels == g] for g in dict.fromkeys(labels.tolist())]


def group_means(values: Sequence[float], groups: Sequence[Any]
                ) -> dict[str, float]:
  """``{group label: mean of its finite values}`` (groups without a finite
  value left out)."""
  _, split = finite_groups(values, groups)
  labels = [str(g) for g, x in zip(groups, values)
            if math.isfinite(float(x))]
  return {g: float(part.mean()) for g, part in
          zip(dict.fromkeys(labels), split)}


def log_t_interval(value: float, per_seed: Sequence[float],
                   level: float = LEVEL) -> tuple[float | None,
                                                  float | None]:
  """``value * exp(-+ t sd(log per_seed) / sqrt(S))``, t with S - 1
  degrees of freedom: a ratio's interval from its per-seed values (S >= 2,
  all finite and > 0; else ``(None, None)``)."""
  r = np.asarray(per_seed, np.float64)
  if r.size < 2 or not np.all(np.isfinite(r) & (r > 0)) or not value > 0:
    return None, None
  half = float(scipy_stats.t.ppf(0.5 + level / 2, r.size - 1) *
               np.std(np.log(r), ddof=1) / math.sqrt(r.size))
  return value * math.exp(-half), value * math.exp(half)


def seeds_lost(groups: Sequence[Any] | None, kept: int | None) -> bool:
  """True when ``groups`` name two or more seeds but fewer than two of
  them (``kept``) keep a value: an interval over the one left would be
  over its images, not over seeds."""
  return (groups is not None and kept is not None and kept < 2 and
          len({str(g) for g in groups}) >= 2)


def mean_ci(values: Sequence[float], level: float = LEVEL,
            groups: Sequence[Any] | None = None) -> dict[str, Any]:
  """Mean and Student-t interval of the finite values.

  Args:
    values: samples (non-finite ones are dropped and counted).
    level: confidence level.
    groups: optional label of each value (its seed). With two or more
      groups the mean is the mean of the group means (the plain mean for
      groups of equal size) and the interval is over the group means.

  Returns:
    ``{'mean', 'low', 'high', 'n', 'dropped'}`` (and ``'groups'``, the
    number of groups with a finite value, when given); low/high are None
    when fewer than two finite values exist or when only one of two or more
    groups keeps finite values (:func:`seeds_lost`), and equal the mean when
    all values are equal.
  """
  v, split = finite_groups(values, groups)
  out = {"n": int(v.size), "dropped": int(len(values) - v.size)}
  if split is not None:
    out["groups"] = len(split)
    if len(split) >= 2:
      v = np.array([g.mean() for g in split])
  if v.size == 0:
    return {**out, "mean": None, "low": None, "high": None}
  mean = float(np.mean(v))  # As center(): the mean of the group means.
  if v.size < 2 or seeds_lost(groups, out.get("groups")):
    return {**out, "mean": mean, "low": None, "high": None}
  half = float(scipy_stats.t.ppf(0.5 + level / 2, v.size - 1) *
               np.std(v, ddof=1) / math.sqrt(v.size))
  return {**out, "mean": mean, "low": mean - half, "high": mean + half}


def center(v: np.ndarray, split: list[np.ndarray] | None) -> float:
  """The mean :func:`mean_ci` reports: of the group means with two or more
  groups, else of the values."""
  if split is not None and len(split) >= 2:
    return float(np.mean([g.mean() for g in split]))
  return float(np.mean(v))


def _group_draws(v: np.ndarray, split: list[np.ndarray] | None,
                 rng: np.random.Generator
                 ) -> Callable[[], list[np.ndarray]]:
  """One two-stage bootstrap draw as a list of groups: the groups, then
  the values within each drawn group; one group (or none): the values."""
  groups = [v] if split is None or len(split) < 2 else split

  def draw():
    picked = (rng.integers(0, len(groups), len(groups)) if len(groups) > 1
              else [0])
    return [groups[g][rng.integers(0, groups[g].size, groups[g].size)]
            for g in picked]
  return draw


def resampler(v: np.ndarray, split: list[np.ndarray] | None,
              rng: np.random.Generator) -> Callable[[], np.ndarray]:
  """Draws one bootstrap sample of ``v``: of its groups, then of the values
  within each drawn group (two-stage), or of the values (one group)."""
  draw = _group_draws(v, split, rng)
  return lambda: np.concatenate(draw())


def center_resampler(v: np.ndarray, split: list[np.ndarray] | None,
                     rng: np.random.Generator) -> Callable[[], float]:
  """Draws one bootstrap replicate of :func:`center`: the mean of the drawn
  groups' means (one group: the mean of the resampled values), so that a
  replicate estimates what the point estimate does when groups differ in
  size."""
  draw = _group_draws(v, split, rng)
  return lambda: float(np.mean([g.mean() for g in draw()]))


def bootstrap_ci(values: Sequence[float] | np.ndarray,
                 statistic: Callable[[np.ndarray], float] = np.median,
                 level: float = LEVEL, samples: int = BOOTSTRAP_SAMPLES,
                 seed: int = 0, groups: Sequence[Any] | None = None
                 ) -> dict[str, Any]:
  """A statistic of the finite values and its percentile bootstrap interval.

  Args:
    values: samples.
    statistic: maps a 1-D array to a number (default: the median).
    level: confidence level.
    samples: bootstrap resamples.
    seed: NumPy seed of the resampling (fixed: the interval is
      reproducible).
    groups: optional label of each value (its seed): resample groups, then
      values within each drawn group.

  Returns:
    ``{'value', 'low', 'high', 'n', 'dropped'}`` (low/high None for n < 2
    and when :func:`seeds_lost`).
  """
  v, split = finite_groups(values, groups)
  out = {"n": int(v.size), "dropped": int(len(values) - v.size)}
  if split is not None:
    out["groups"] = len(split)
  if v.size == 0:
    return {**out, "value": None, "low": None, "high": None}
  value = float(statistic(v))
  if v.size < 2 or seeds_lost(groups, out.get("groups")):
    return {**out, "value": value, "low": None, "high": None}
  draw = resampler(v, split, np.random.default_rng(seed))
  boot = np.array([statistic(draw()) for _ in range(samples)])
  lo, hi = np.quantile(boot, [0.5 - level / 2, 0.5 + level / 2])
  return {**out, "value": value, "low": float(lo), "high": float(hi)}


def proportion_ci(successes: int, n: int, level: float = LEVEL
                  ) -> dict[str, Any]:
  """A proportion with its Clopper-Pearson (exact binomial) interval.

  Unlike a bootstrap it does not collapse at 0 / n or n / n (0 of 24 gives
  [0, 0.14]). It treats the n trials as independent.

  Returns:
    ``{'value', 'low', 'high', 'n'}`` (all None but n when n = 0).
  """
  if n == 0:
    return {"value": None, "low": None, "high": None, "n": 0}
  alpha = 1 - level
  low = (0.0 if successes == 0 else
         float(scipy_stats.beta.ppf(alpha / 2, successes, n - successes + 1)))
  high = (1.0 if successes == n else
          float(scipy_stats.beta.ppf(1 - alpha / 2, successes + 1,
                                     n - successes)))
  return {"value": successes / n, "low": low, "high": high, "n": int(n)}


def ratio_ci(numerator: Sequence[float], denominator: Sequence[float],
             level: float = LEVEL, samples: int = BOOTSTRAP_SAMPLES,
             seed: int = 0, numerator_groups: Sequence[Any] | None = None,
             denominator_groups: Sequence[Any] | None = None
             ) -> dict[str, Any]:
  """``mean(numerator) / mean(denominator)`` with its interval (each mean
  as :func:`mean_ci` reports it: over the groups' means).

  With two or more groups (seeds) on both sides: the seeds' own ratios
  (the seed's mean over the seed's mean, paired: a seed's cells share its
  images and initialisation) give a Student-t interval on the log scale,
  :func:`log_t_interval`, no interval when fewer than two seeds are shared.
  Otherwise (one seed, or no groups): a bootstrap over the values of each
  sample, resampled independently. A non-positive denominator mean gives None.

  Returns:
    ``{'value', 'low', 'high', 'n_num', 'n_den'}``.
  """
  a, split_a = finite_groups(numerator, numerator_groups)
  b, split_b = finite_groups(denominator, denominator_groups)
  out = {"n_num": int(a.size), "n_den": int(b.size)}
  if a.size == 0 or b.size == 0 or center(b, split_b) <= 0:
    return {**out, "value": None, "low": None, "high": None}
  value = center(a, split_a) / center(b, split_b)
  if a.size < 2 or b.size < 2:
    return {**out, "value": value, "low": None, "high": None}
  if len(split_a or ()) >= 2 and len(split_b or ()) >= 2:
    ma = group_means(numerator, numerator_groups)
    mb = group_means(denominator, denominator_groups)
    low, high = log_t_interval(value, [ma[g] / mb[g] for g in ma if g in mb
                                       and mb[g] > 0], level)
    return {**out, "value": value, "low": low, "high": high}
  rng = np.random.default_rng(seed)
  draw_a = center_resampler(a, split_a, rng)
  draw_b = center_resampler(b, split_b, rng)
  boot = np.array([draw_a() / max(draw_b(), np.finfo(np.float64).tiny)
                   for _ in range(samples)])
  lo, hi = np.quantile(boot, [0.5 - level / 2, 0.5 + level / 2])
  return {**out, "value": value, "low": float(lo), "high": float(hi)}


def paired_difference_ci(a: Sequence[float], b: Sequence[float],
                         level: float = LEVEL,
                         groups: Sequence[Any] | None = None
                         ) -> dict[str, Any]:
  """Mean of ``a_i - b_i`` over pairs (e.g. seeds) with a t interval.

  Args:
    a: per-pair values (e.g. undefended accuracy per seed).
    b: per-pair values of the same pairs (e.g. defended accuracy per seed).
    level: confidence level.
    groups: optional label (seed) of each pair, as in :func:`mean_ci`.

  Returns:
    :func:`mean_ci` of the differences.

  Raises:
    ValueError: a and b have different lengths.
  """
  if len(a) != len(b):
    raise ValueError(f"paired samples must have equal lengths, got {len(a)} "
                     f"and {len(b)}.")
  return mean_ci([float(x) - float(y) for x, y in zip(a, b)], level,
                 groups=groups)


def verdict(low: float | None, high: float | None, target: float,
            higher_holds: bool = True) -> str:
  """'held' / 'did not hold' / 'inconclusive' for a claim about a statistic.

  The claim holds when the whole interval is on the claimed side of
  ``target``, does not hold when the whole interval is on the other side,
  and is inconclusive when the interval straddles it (or is missing).

  Args:
    low: interval low end.
    high: interval high end.
    target: the paper's number.
    higher_holds: the claim is "statistic >= target" (else "<= target").
  """
  if low is None or high is None:
    return "inconclusive"
  if not higher_holds:
    low, high, target = -high, -low, -target
  if low >= target:
    return "held"
  if high < target:
    return "did not hold"
  return "inconclusive"


def claim(name: str, paper: str, statistic: str, value: float | None,
          low: float | None, high: float | None, *, target: float | None,
          higher_holds: bool = True, rule: str = "",
          verdict_override: str | None = None) -> dict[str, Any]:
  """One row of the report's claims table, with its verdict by rule.

  Every experiment returns a list of these under ``claims``; the report and
  the README table render them as they are.

  Args:
    name: the claim, in words.
    paper: what the paper says (its number).
    statistic: what we measured, in words (with its pixel space).
    value: the statistic.
    low: its 95 % interval's low end.
    high: its high end.
    target: the paper's number the verdict compares with (None: no verdict,
      the row is reported only).
    higher_holds: the claim is "statistic >= target" (else "<=").
    rule: the verdict rule in words (from docs/evaluation.md).
    verdict_override: a verdict decided otherwise (e.g. 'inconclusive
      (attacks fail undefended)'); replaces the interval rule.

  Returns:
    ``{'claim', 'paper', 'statistic', 'value', 'low', 'high', 'target',
    'rule', 'verdict'}``.
  """
  if verdict_override is not None:
    v = verdict_override
  elif target is None:
    v = "reported"
  else:
    v = verdict(low, high, target, higher_holds)
  return {"claim": name, "paper": paper, "statistic": statistic,
          "value": value, "low": low, "high": high, "target": target,
          "rule": rule, "verdict": v}
