"""Summary statistics with intervals, decided before looking at results.

Every number the report quotes is a mean (or median) with a 95 % interval:
Student-t for means over seeds (few, independent runs), a percentile
bootstrap for medians and ratios (resampling the images or seeds a value was
averaged over). Host-side NumPy/SciPy only.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Sequence

import numpy as np
from scipy import stats as scipy_stats

LEVEL = 0.95
BOOTSTRAP_SAMPLES = 2000


def _finite(values: Sequence[float]) -> np.ndarray:
  v = np.asarray([float(x) for x in values], np.float64)
  return v[np.isfinite(v)]


def mean_ci(values: Sequence[float], level: float = LEVEL
            ) -> dict[str, Any]:
  """Mean and Student-t interval of the finite values.

  Args:
    values: samples (non-finite ones are dropped and counted).
    level: confidence level.

  Returns:
    ``{'mean', 'low', 'high', 'n', 'dropped'}``; low/high are None when
    fewer than two finite values exist, and equal the mean when all values
    are equal.
  """
  v = _finite(values)
  out = {"n": int(v.size), "dropped": int(len(values) - v.size)}
  if v.size == 0:
    return {**out, "mean": None, "low": None, "high": None}
  mean = float(np.mean(v))
  if v.size < 2:
    return {**out, "mean": mean, "low": None, "high": None}
  half = float(scipy_stats.t.ppf(0.5 + level / 2, v.size - 1) *
               np.std(v, ddof=1) / math.sqrt(v.size))
  return {**out, "mean": mean, "low": mean - half, "high": mean + half}


def bootstrap_ci(values: Sequence[float] | np.ndarray,
                 statistic: Callable[[np.ndarray], float] = np.median,
                 level: float = LEVEL, samples: int = BOOTSTRAP_SAMPLES,
                 seed: int = 0) -> dict[str, Any]:
  """A statistic of the finite values and its percentile bootstrap interval.

  Args:
    values: samples.
    statistic: maps a 1-D array to a number (default: the median).
    level: confidence level.
    samples: bootstrap resamples.
    seed: NumPy seed of the resampling (fixed: the interval is
      reproducible).

  Returns:
    ``{'value', 'low', 'high', 'n', 'dropped'}`` (low/high None for n < 2).
  """
  v = _finite(values)
  out = {"n": int(v.size), "dropped": int(len(values) - v.size)}
  if v.size == 0:
    return {**out, "value": None, "low": None, "high": None}
  value = float(statistic(v))
  if v.size < 2:
    return {**out, "value": value, "low": None, "high": None}
  rng = np.random.default_rng(seed)
  idx = rng.integers(0, v.size, (samples, v.size))
  boot = np.array([statistic(v[i]) for i in idx])
  lo, hi = np.quantile(boot, [0.5 - level / 2, 0.5 + level / 2])
  return {**out, "value": value, "low": float(lo), "high": float(hi)}


def ratio_ci(numerator: Sequence[float], denominator: Sequence[float],
             level: float = LEVEL, samples: int = BOOTSTRAP_SAMPLES,
             seed: int = 0) -> dict[str, Any]:
  """``mean(numerator) / mean(denominator)`` with a bootstrap interval.

  The two samples are resampled independently (they come from different
  cells). A non-positive denominator mean gives None.

  Returns:
    ``{'value', 'low', 'high', 'n_num', 'n_den'}``.
  """
  a, b = _finite(numerator), _finite(denominator)
  out = {"n_num": int(a.size), "n_den": int(b.size)}
  if a.size == 0 or b.size == 0 or np.mean(b) <= 0:
    return {**out, "value": None, "low": None, "high": None}
  value = float(np.mean(a) / np.mean(b))
  if a.size < 2 or b.size < 2:
    return {**out, "value": value, "low": None, "high": None}
  rng = np.random.default_rng(seed)
  ma = a[rng.integers(0, a.size, (samples, a.size))].mean(axis=1)
  mb = b[rng.integers(0, b.size, (samples, b.size))].mean(axis=1)
  boot = ma / np.maximum(mb, np.finfo(np.float64).tiny)
  lo, hi = np.quantile(boot, [0.5 - level / 2, 0.5 + level / 2])
  return {**out, "value": value, "low": float(lo), "high": float(hi)}


def paired_difference_ci(a: Sequence[float], b: Sequence[float],
                         level: float = LEVEL) -> dict[str, Any]:
  """Mean of ``a_i - b_i`` over pairs (e.g. seeds) with a t interval.

  Args:
    a: per-pair values (e.g. undefended accuracy per seed).
    b: per-pair values of the same pairs (e.g. defended accuracy per seed).
    level: confidence level.

  Returns:
    :func:`mean_ci` of the differences.

  Raises:
    ValueError: a and b have different lengths.
  """
  if len(a) != len(b):
    raise ValueError(f"paired samples must have equal lengths, got {len(a)} "
                     f"and {len(b)}.")
  return mean_ci([float(x) - float(y) for x, y in zip(a, b)], level)


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
