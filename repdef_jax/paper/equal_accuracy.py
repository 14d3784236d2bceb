"""The trade-off statistics: privacy at equal accuracy, from measured points.

Sun et al. 2021 (Section 6) claim that Soteria's reconstruction MSE is more
than 160x the baselines' at equal accuracy, and that at the "unrecognisable"
threshold Soteria loses no accuracy while the baselines lose up to 6-9 %.
These statistics were fixed before any result was looked at
(``docs/evaluation.md``):

* A *point* is one (defense, strength) cell: ``accuracy`` per seed and
  ``privacy`` samples (one per attacked image and seed, best of the attack
  suite; images on which every attack diverged are left out and counted).
* The *frontier* of a defense at accuracy ``a`` is its measured point with the
  highest mean privacy among those whose mean accuracy is at least ``a``
  (what a user can buy while keeping accuracy ``a``). No interpolation.
* The *ratio curve* against a baseline: for each measured baseline point
  ``q`` inside the accuracy range both defenses cover, Soteria's frontier at
  ``accuracy(q)`` over ``q``'s privacy. Headline numbers: the median ratio
  over the curve and the ratio at the baseline's first *protective* point
  (the lowest strength whose mean SSIM is at most a threshold), each with a
  bootstrap interval (seeds, then images within a seed, of the cells
  involved). Never a maximum.
* The *accuracy drop* at a threshold: undefended accuracy minus the accuracy
  of the defense's first protective point, paired by seed, t interval.

Pixel space: the privacy metrics are the points' own (the trade-off part
records ``mse_clamped`` and ``ssim`` of reconstructions clamped to [0, 1],
:mod:`repdef_jax.metrics`). The paper's MSE is against the raw image and
unclamped (a diverged reconstruction makes it unbounded), so its 160x and
these ratios are ratios of different statistics.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np

from repdef_jax.paper import stats

Point = dict[str, Any]


def mean_accuracy(point: Point) -> float:
  return float(np.mean(point["accuracy"]))


def mean_of(point: Point, metric: str) -> float:
  """Mean of a point's finite per-image samples of ``metric`` as the tables
  report it (:func:`repdef_jax.paper.stats.mean_ci`: the mean of the seeds'
  means when the seeds are recorded, which differs from the pooled mean
  when divergence leaves seeds with unequal counts); NaN when none."""
  m = stats.mean_ci(point[metric], groups=_seeds(point, metric))["mean"]
  return float("nan") if m is None else float(m)


def frontier(points: Sequence[Point], accuracy: float,
             metric: str = "mse_clamped") -> Point | None:
  """The most private measured point with mean accuracy >= ``accuracy``.

  Args:
    points: the defense's points (dicts with ``strength``, ``accuracy``
      (per seed) and ``metric`` (per-image samples, higher = more private)).
    accuracy: the accuracy floor.
    metric: the privacy metric.

  Returns:
    The point, or None when no point reaches ``accuracy``. Ties go to the
    lower strength.
  """
  ok = [p for p in points if mean_accuracy(p) >= accuracy
        and np.isfinite(mean_of(p, metric))]
  if not ok:
    return None
  return max(sorted(ok, key=lambda p: p["strength"]),
             key=lambda p: mean_of(p, metric))


def first_protective(points: Sequence[Point], threshold: float,
                     metric: str = "ssim") -> Point | None:
  """The lowest-strength point whose mean ``metric`` is <= ``threshold``."""
  for p in sorted(points, key=lambda p: p["strength"]):
    if mean_of(p, metric) <= threshold:
      return p
  return None


def _seeds(point: Point, metric: str) -> list[Any] | None:
  """The seed of each of ``point[metric]``'s samples (None: not recorded)."""
  seeds = point.get("seeds")
  return seeds if seeds is not None and len(seeds) == len(point[metric]) \
      else None


def _seeds_lost(point: Point, metric: str) -> bool:
  """Whether ``point``'s samples keep one seed of the two or more its
  images had (``all_seeds``): its interval would be over images."""
  seeds = _seeds(point, metric)
  return seeds is not None and stats.seeds_lost(
      point.get("all_seeds"), len({str(s) for s in seeds}))


def ratio_ci(num: Point, den: Point, metric: str) -> dict[str, Any]:
  """:func:`repdef_jax.paper.stats.ratio_ci` of two points' samples, each
  resampled by seed (no interval when either kept a single seed's)."""
  out = stats.ratio_ci(num[metric], den[metric],
                       numerator_groups=_seeds(num, metric),
                       denominator_groups=_seeds(den, metric))
  if _seeds_lost(num, metric) or _seeds_lost(den, metric):
    out = {**out, "low": None, "high": None}
  return out


def _median_ratio_ci(pairs: list[tuple[Point, Point]], metric: str,
                     samples: int = stats.BOOTSTRAP_SAMPLES,
                     seed: int = 0) -> dict[str, Any]:
  """Median over pairs of mean(num)/mean(den).

  Interval, with two or more seeds shared by every cell: the median over
  the pairs within each seed (of the seed's means) gives one value per
  seed, and :func:`repdef_jax.paper.stats.log_t_interval` of those around
  the median. One seed: a bootstrap over images, in which a point in
  several pairs (one Soteria point is the frontier for several baseline
  points) is resampled once per replicate, so its pairs move together."""
  if not pairs:
    return {"value": None, "low": None, "high": None, "n": 0}
  cells = {id(p): p for pair in pairs for p in pair}
  values = {}
  for key, p in cells.items():
    v, split = stats.finite_groups(p[metric], _seeds(p, metric))
    values[key] = (v, split)
  mean = {key: stats.center(v, split) for key, (v, split) in values.items()}
  value = float(np.median([mean[id(a)] / mean[id(b)] for a, b in pairs]))
  out = {"value": value, "low": None, "high": None, "n": len(pairs)}
  if any(v.size < 2 for v, _ in values.values()) or any(
      _seeds_lost(p, metric) for p in cells.values()):
    return out  # As ratio_ci: no interval from one value or one seed.
  if all(split is not None and len(split) >= 2
         for _, split in values.values()):
    by_seed = {key: stats.group_means(p[metric], _seeds(p, metric))
               for key, p in cells.items()}
    shared = set.intersection(*(set(m) for m in by_seed.values()))
    per_seed = [np.median([by_seed[id(a)][s] / by_seed[id(b)][s]
                           for a, b in pairs]) for s in sorted(shared)]
    out["low"], out["high"] = stats.log_t_interval(value, per_seed)
    return out
  rng = np.random.default_rng(seed)
  draws = {key: stats.center_resampler(v, split, rng)
           for key, (v, split) in values.items()}
  boot = np.empty(samples)
  for i in range(samples):
    m = {key: draw() for key, draw in draws.items()}
    boot[i] = np.median([m[id(a)] / max(m[id(b)], 1e-300) for a, b in pairs])
  lo, hi = np.quantile(boot, [0.025, 0.975])
  return {**out, "low": float(lo), "high": float(hi)}


def ratio_curve(soteria: Sequence[Point], baseline: Sequence[Point],
                metric: str = "mse_clamped") -> dict[str, Any]:
  """Soteria's frontier privacy over each baseline point's, at equal accuracy.

  Args:
    soteria: Soteria's points (strength > 0).
    baseline: the baseline's points (strength > 0).
    metric: privacy metric (higher = more private).

  Returns:
    ``{'range': [lo, hi] | None, 'per_point': [...], 'median': {value, low,
    high, n}}``; each per-point row has the baseline strength and accuracy,
    the chosen Soteria strength and accuracy, both privacies, the ratio with
    its interval, and ``in_range`` (used for the median). Every value is a
    measured point; nothing is interpolated.
  """
  # A point whose training diverged on some seed has no accuracy (NaN): it
  # stays out of the range (min / max with NaN depend on the order).
  s_acc = [a for a in map(mean_accuracy, soteria) if math.isfinite(a)]
  b_acc = [a for a in map(mean_accuracy, baseline) if math.isfinite(a)]
  if not s_acc or not b_acc:
    return {"range": None, "per_point": [], "median": _median_ratio_ci(
        [], metric)}
  lo, hi = max(min(s_acc), min(b_acc)), min(max(s_acc), max(b_acc))
  rows, pairs = [], []
  for q in sorted(baseline, key=lambda p: p["strength"]):
    a = mean_accuracy(q)
    s = frontier(soteria, a, metric)
    privacy = mean_of(q, metric)
    # A baseline point without a finite privacy sample (every attack
    # diverged on every image) has no ratio: out of the median.
    row = {"baseline_strength": q["strength"], "baseline_accuracy": a,
           "baseline_privacy": privacy,
           "in_range": bool(lo <= a <= hi) and s is not None
                       and math.isfinite(privacy)}
    if s is not None:
      r = ratio_ci(s, q, metric)
      row.update({"soteria_strength": s["strength"],
                  "soteria_accuracy": mean_accuracy(s),
                  "soteria_privacy": mean_of(s, metric),
                  "ratio": r["value"], "ratio_low": r["low"],
                  "ratio_high": r["high"]})
      if row["in_range"]:
        pairs.append((s, q))
    rows.append(row)
  return {"range": [lo, hi] if lo <= hi else None, "per_point": rows,
          "median": _median_ratio_ci(pairs, metric)}


def ratio_at_first_protective(soteria: Sequence[Point],
                              baseline: Sequence[Point], threshold: float,
                              metric: str = "mse_clamped") -> dict[str, Any]:
  """The ratio at the baseline's first point with mean SSIM <= threshold."""
  q = first_protective(baseline, threshold)
  if q is None:
    return {"threshold": threshold, "baseline_strength": None,
            "value": None, "low": None, "high": None,
            "note": "baseline never protective in the sweep"}
  if not math.isfinite(mean_accuracy(q)):
    return {"threshold": threshold, "baseline_strength": q["strength"],
            "value": None, "low": None, "high": None,
            "note": "the baseline's training diverged (no accuracy)"}
  s = frontier(soteria, mean_accuracy(q), metric)
  if s is None:
    return {"threshold": threshold, "baseline_strength": q["strength"],
            "value": None, "low": None, "high": None,
            "note": "no Soteria point reaches the baseline's accuracy"}
  r = ratio_ci(s, q, metric)
  return {"threshold": threshold, "baseline_strength": q["strength"],
          "baseline_accuracy": mean_accuracy(q),
          "soteria_strength": s["strength"],
          "soteria_accuracy": mean_accuracy(s), "value": r["value"],
          "low": r["low"], "high": r["high"]}


def accuracy_drop(undefended: Point, points: Sequence[Point],
                  threshold: float) -> dict[str, Any]:
  """Undefended accuracy minus that of the first protective point.

  Args:
    undefended: the strength-0 point (accuracy per seed).
    points: the defense's points, same seeds in the same order.
    threshold: mean SSIM at or below which reconstructions count as
      unrecognisable.

  Returns:
    ``{'threshold', 'strength', 'reached', 'mean', 'low', 'high', 'n',
    'diverged_training'}``: the paired (by seed) accuracy drop in accuracy
    points (fractions) with a t interval over the seeds whose training did
    not diverge (their count in ``diverged_training``); ``reached`` False
    when no point of the sweep protects.
  """
  p = first_protective(points, threshold)
  if p is None:
    return {"threshold": threshold, "strength": None, "reached": False,
            "mean": None, "low": None, "high": None, "n": 0}
  d = stats.paired_difference_ci(undefended["accuracy"], p["accuracy"])
  return {"threshold": threshold, "strength": p["strength"], "reached": True,
          "mean": d["mean"], "low": d["low"], "high": d["high"], "n": d["n"],
          # A seed whose training diverged has accuracy NaN: no drop for it.
          "diverged_training": int(np.sum(~np.isfinite(
              np.asarray(p["accuracy"], np.float64))))}
