"""Utility-privacy trade-off of the defenses (Sun et al. 2021, Section 6).

References:
  Sun et al., "Provable Defense against Privacy Leakage in Federated Learning
  from Representation Perspective", CVPR 2021, arXiv 2012.06043, Section 6
  (Fig. 4/5: accuracy vs MSE of DLG and GS reconstructions on MNIST and
  CIFAR-10, Soteria vs gradient compression, DP-Gaussian and DP-Laplace).

For every dataset, defense and strength of a sweep this module measures

* **utility**: the test accuracy of the global model after defended FedAvg
  (:func:`repdef_jax.training.train_and_evaluate`, the defense applied to
  every local gradient), averaged over the last ``accuracy_window``
  evaluations (non-IID FedAvg's accuracy swings from round to round), one
  resumable run per (dataset, defense, strength);
* **privacy**: the reconstruction error of each attack (DLG, GS, ...) on the
  gradient a client shares at the run's initial global model (round 0, the
  most exposed point; same parameters as the run's FedAvg initialisation),
  one image per gradient, averaged over ``num_images`` test images. Every
  metric is in the models' input space, [0, 1] (no normalisation): ``mse`` is
  the paper's raw, unclamped MSE, ``mse_clamped`` clamps the reconstruction
  to [0, 1] first; PSNR / SSIM use clamped images.

Each (dataset, defense, strength) training cell and each (dataset, attack,
defense, strength) attack cell is a JSON file written atomically under
``workdir/cells`` and skipped when present (:class:`repdef_jax.paper.harness.
CellStore`): a killed sweep resumes.

Definitions used by the summary (documented in the JSON and the report):

* **MSE ratio at equal accuracy** (the paper's ">160x"): for every baseline
  point ``(a_b, m_b)`` with strength > 0, Soteria's MSE "at the same
  accuracy" is the largest MSE on Soteria's curve (points in order of
  strength, linearly interpolated between consecutive strengths, the
  undefended point included as strength 0) whose accuracy is at least
  ``a_b - tol`` (``tol`` = ``equal_accuracy_tol``, default 0.01 = one
  point). The ratio is that MSE over ``m_b``; we report every ratio, their
  maximum (the paper's "as much as") and median. A baseline point Soteria
  cannot match in accuracy gets no ratio.
* **Unrecognisable threshold**: the mean reconstruction is unrecognisable
  when its SSIM (clamped [0, 1] images) is at most ``threshold`` (default
  0.2); configurable to ``mse_clamped`` at least a threshold. For each
  defense the first crossing along increasing strength is found by linear
  interpolation in strength and the accuracy there (interpolated the same
  way) is compared with the undefended accuracy: ``accuracy_drop =
  acc(none) - acc(crossing)``, in accuracy points (fraction). Not reached in
  the sweep -> ``None``.
"""

from __future__ import annotations

import math
import os
import time
from typing import Any, Sequence

import ml_collections
import numpy as np

from repdef_jax import data as data_lib
from repdef_jax import defenses as defenses_lib
from repdef_jax.paper import harness
from repdef_jax import storage
from repdef_jax import models as models_lib
from repdef_jax import training

BASELINES = ("compression", "dp_gaussian", "dp_laplace")
RESULT_FILE = "tradeoff.json"
PLOT_FILE = "tradeoff.png"
PLOT_RAW_FILE = "tradeoff_raw_mse.png"


# --------------------------------------------------------------------------
# Analysis (pure functions of the measured points).


def _num(v: Any) -> float:
  """JSON number or 'inf'/'nan' string -> float."""
  return float(v)


def sorted_curve(points: Sequence[dict], metric: str) -> list[tuple]:
  """``[(strength, accuracy, metric value)]`` sorted by strength."""
  out = [(float(p["strength"]), float(p["accuracy"]), _num(p[metric]))
         for p in points]
  return sorted(out)


def best_metric_at_accuracy(curve: Sequence[tuple], acc_min: float
                            ) -> float | None:
  """Largest metric value on a piecewise-linear curve with accuracy >= acc_min.

  Args:
    curve: ``[(strength, accuracy, value)]`` sorted by strength.
    acc_min: the accuracy floor.

  Returns:
    The maximum value (None if no point of the curve reaches ``acc_min``).
  """
  best = None

  def consider(v):
    nonlocal best
    if math.isnan(v):
      return
    best = v if best is None else max(best, v)

  for _, a, v in curve:
    if a >= acc_min:
      consider(v)
  for (_, a0, v0), (_, a1, v1) in zip(curve[:-1], curve[1:]):
    if a0 == a1 or (a0 >= acc_min) == (a1 >= acc_min):
      continue
    t = (acc_min - a0) / (a1 - a0)  # where the segment crosses acc_min
    if math.isinf(v0) or math.isinf(v1):
      consider(v0 if a0 >= acc_min else v1)
    else:
      consider(v0 + t * (v1 - v0))
  return best


def mse_ratios(soteria: Sequence[dict], baseline: Sequence[dict], *,
               metric: str = "mse", tol: float = 0.01) -> dict[str, Any]:
  """Soteria / baseline MSE at (approximately) equal accuracy.

  Args:
    soteria: Soteria's points (dicts with strength, accuracy, ``metric``),
      the undefended point included as strength 0.
    baseline: the baseline's points, same form.
    metric: 'mse' (raw) or 'mse_clamped'.
    tol: accuracy tolerance (fraction; 0.01 = one point).

  Returns:
    ``{'per_point': [{strength, accuracy, baseline, soteria, ratio}],
    'max': float|None, 'median': float|None}``.
  """
  s_curve = sorted_curve(soteria, metric)
  rows = []
  for strength, acc, m_b in sorted_curve(baseline, metric):
    if strength == 0:
      continue
    m_s = best_metric_at_accuracy(s_curve, acc - tol)
    ratio = None
    if m_s is not None and m_b > 0 and math.isfinite(m_b):
      ratio = m_s / m_b
    rows.append({"strength": strength, "accuracy": acc, "baseline": m_b,
                 "soteria": m_s, "ratio": ratio})
  ratios = [r["ratio"] for r in rows
            if r["ratio"] is not None and math.isfinite(r["ratio"])]
  return {"per_point": rows,
          "max": max(ratios) if ratios else None,
          "median": float(np.median(ratios)) if ratios else None}


def threshold_crossing(points: Sequence[dict], *, metric: str = "ssim",
                       threshold: float = 0.2, below: bool = True
                       ) -> dict[str, Any]:
  """Where a defense's curve first becomes "unrecognisable".

  Args:
    points: the defense's points (strength, accuracy, ``metric``), the
      undefended point included as strength 0.
    metric: 'ssim' (unrecognisable when <= threshold) or an MSE (when >=).
    threshold: the threshold.
    below: True: crossing when value <= threshold; False: >=.

  Returns:
    ``{'strength', 'accuracy', 'accuracy_drop', 'reached'}``; strength and
    accuracy linearly interpolated between the bracketing sweep points;
    ``accuracy_drop`` relative to the strength-0 point (None when the sweep
    has no strength-0 point or never crosses).
  """
  curve = sorted_curve(points, metric)
  ok = (lambda v: v <= threshold) if below else (lambda v: v >= threshold)
  base_acc = next((a for s, a, _ in curve if s == 0), None)
  prev = None
  for s, a, v in curve:
    if ok(v):
      if prev is None or not math.isfinite(v) or not math.isfinite(prev[2]):
        cs, ca = s, a
      else:
        ps, pa, pv = prev
        t = (threshold - pv) / (v - pv) if v != pv else 1.0
        t = min(max(t, 0.0), 1.0)
        cs, ca = ps + t * (s - ps), pa + t * (a - pa)
      drop = None if base_acc is None else base_acc - ca
      return {"strength": cs, "accuracy": ca, "accuracy_drop": drop,
              "reached": True}
    prev = (s, a, v)
  return {"strength": None, "accuracy": None, "accuracy_drop": None,
          "reached": False}


def summarize(curves: dict[str, list[dict]], *, tol: float,
              unrec_metric: str, unrec_threshold: float) -> dict[str, Any]:
  """Ratios and threshold crossings for one (dataset, attack) panel."""
  out = {"ratios": {}, "unrecognisable": {}}
  if "soteria" in curves:
    for b in BASELINES:
      if b in curves:
        out["ratios"][b] = {
            m: mse_ratios(curves["soteria"], curves[b], metric=m, tol=tol)
            for m in ("mse", "mse_clamped")}
  below = unrec_metric in ("ssim", "psnr")
  for name, pts in curves.items():
    out["unrecognisable"][name] = threshold_crossing(
        pts, metric=unrec_metric, threshold=unrec_threshold, below=below)
  return out


# --------------------------------------------------------------------------
# Measurement.


def train_config(config: ml_collections.ConfigDict, dataset: str,
                 defense: str, strength: float) -> ml_collections.ConfigDict:
  """The :func:`repdef_jax.training.train_and_evaluate` config of a cell."""
  c = training.default_config()
  c.update(config.train.to_dict())
  c.dataset = dataset
  c.model = config.model
  c.model_init = config.model_init
  c.defense = defense
  c.defense_strength = float(strength)
  c.seed = config.seed
  c.data_dir = config.data_dir
  c.plot = False
  return c


def _train_cell(config, dataset, defense, strength, run_dir) -> dict:
  c = train_config(config, dataset, defense, strength)
  result = training.train_and_evaluate(c, run_dir)
  recs = result["metrics"]
  last = recs[-1]
  # Non-IID FedAvg's test accuracy swings by several points from round to
  # round; the mean of the last evaluations is a steadier utility measure.
  window = [float(r["test_accuracy"]) for r in recs[-config.accuracy_window:]]
  out = {"dataset": dataset, "defense": defense, "strength": strength,
         "accuracy": float(np.mean(window)),
         "final_accuracy": float(last["test_accuracy"]),
         "test_loss": float(last.get("test_loss", float("nan"))),
         "rounds": int(last["round"]),
         "accuracy_curve": [float(r["test_accuracy"]) for r in recs],
         # Non-finite loss/params: training stopped there (None: finished).
         "diverged_at_round": result.get("diverged_at_round")}
  for k, v in last.items():
    if k.startswith("defense/"):
      out[k] = float(v)
  return out


def _attack_cell(config, dataset, attack, defense, strength, model, params,
                 images, labels, keys) -> dict:
  d = defenses_lib.get_defense(defense, strength, model=model)
  per_image = []
  for i in range(len(images)):
    m, _, _ = harness.defend_and_attack(
        model, params, d, images[i:i + 1], labels[i:i + 1], attack,
        *harness.image_keys(keys, i),
        iterations=config.attack_iterations.get(attack) or None,
        restarts=config.gs_restarts or None,
        give_labels=config.give_labels)
    per_image.append(m)
  out = {"dataset": dataset, "attack": attack, "defense": defense,
         "strength": strength, "images": per_image}
  for k in ("mse", "mse_clamped", "psnr", "ssim", "input_distance"):
    vals = np.array([float(m[k]) for m in per_image])
    out[k] = harness.finite_or_str(np.mean(vals))
    out[k + "_median"] = harness.finite_or_str(np.median(vals))
  out["diverged_fraction"] = float(np.mean([m["diverged"] for m in per_image]))
  for k in per_image[0]:
    if k.startswith("defense/"):
      out[k] = float(np.mean([m[k] for m in per_image]))
  return out


def sweep_cells(config: ml_collections.ConfigDict) -> list[tuple[str, float]]:
  """``[(defense, strength)]``: the undefended cell, then every sweep point."""
  cells = [("none", 0.0)]
  for name, strengths in config.defenses.items():
    cells += [(name, float(s)) for s in strengths]
  return cells


def run(config: ml_collections.ConfigDict, workdir: str) -> dict[str, Any]:
  """Runs (or resumes) the sweep; writes ``tradeoff.json`` and the plots.

  Args:
    config: see ``experiments/configs/tradeoff.py``.
    workdir: output folder.

  Returns:
    The result dict written to ``tradeoff.json``.
  """
  start = time.perf_counter()
  os.makedirs(workdir, exist_ok=True)
  store = harness.CellStore(os.path.join(workdir, "cells"))
  cells = sweep_cells(config)
  n_total = len(config.datasets) * len(cells) * (1 + len(config.attacks))
  progress = harness.Progress(n_total, "tradeoff")
  panels = {}
  train_cells = {}
  for dataset in config.datasets:
    info = data_lib.get_info(dataset)
    model = models_lib.get_model(config.model, info.image_shape,
                                 info.num_classes, init=config.model_init)
    # The attacked parameters: the federated run's initial global model.
    params = model.init(harness.sweep_keys(config.seed).init)
    images, labels = data_lib.load(dataset, "test", config.data_dir or None,
                                   max_examples=config.num_images)
    images = data_lib.to_float(np.asarray(images))
    labels = np.asarray(labels, np.int32)
    keys = harness.sweep_keys(config.seed)
    accuracy = {}
    for defense, strength in cells:
      name = harness.cell_name(dataset, "train", defense, strength)
      cell = store.get_or_run(
          name, lambda d=defense, s=strength, n=name: _train_cell(
              config, dataset, d, s, os.path.join(workdir, "runs", n)),
          progress)
      accuracy[(defense, strength)] = cell["accuracy"]
      train_cells[name] = {k: v for k, v in cell.items()
                           if k != "accuracy_curve"}
    for attack in config.attacks:
      curves: dict[str, list[dict]] = {}
      for defense, strength in cells:
        name = harness.cell_name(dataset, attack, defense, strength)
        cell = store.get_or_run(
            name, lambda a=attack, d=defense, s=strength: _attack_cell(
                config, dataset, a, d, s, model, params, images, labels,
                keys), progress)
        point = {k: v for k, v in cell.items() if k != "images"}
        point["accuracy"] = accuracy[(defense, strength)]
        if defense == "none":
          for d in config.defenses:
            curves.setdefault(d, []).append({**point, "strength": 0.0})
        else:
          curves.setdefault(defense, []).append(point)
      panels[f"{dataset}/{attack}"] = {
          "dataset": dataset, "attack": attack, "curves": curves,
          **summarize(curves, tol=config.equal_accuracy_tol,
                      unrec_metric=config.unrecognisable_metric,
                      unrec_threshold=config.unrecognisable_threshold)}
  result = {
      "experiment": "tradeoff",
      "config": config.to_dict(),
      "pixel_space": "[0,1] (model input space; no normalisation)",
      "definitions": {
          "accuracy": "test accuracy of the global model after defended "
                      "FedAvg (defense at every local step), mean of the "
                      f"last {config.accuracy_window} evaluations (every "
                      f"{config.train.log_every} rounds)",
          "mse": "raw MSE, no clamping, [0,1] space (the paper's metric)",
          "mse_clamped": "MSE after clamping the reconstruction to [0,1]",
          "attack_point": "one-image gradient at the run's initial global "
                          "model (round 0)",
          "equal_accuracy": f"Soteria's largest MSE on its curve (linear "
                            f"interpolation in strength) with accuracy >= "
                            f"baseline accuracy - {config.equal_accuracy_tol}",
          "unrecognisable": f"mean {config.unrecognisable_metric} "
                            f"{'<=' if config.unrecognisable_metric in ('ssim', 'psnr') else '>='} "
                            f"{config.unrecognisable_threshold}, first "
                            "crossing along strength (linear interpolation)",
      },
      "train_cells": train_cells,
      "panels": panels,
      "seconds": time.perf_counter() - start,
  }
  storage.write_json(os.path.join(workdir, RESULT_FILE), result)
  plot(result, os.path.join(workdir, PLOT_FILE), metric="mse_clamped")
  plot(result, os.path.join(workdir, PLOT_RAW_FILE), metric="mse")
  return result


def report(result: dict, workdir: str) -> None:
  """Prints the MSE ratios and the accuracy drops at the threshold."""
  del workdir
  for key, panel in result["panels"].items():
    for b, r in panel["ratios"].items():
      print(f"{key}: MSE ratio soteria/{b} at equal accuracy: max "
            f"{r['mse']['max']} (raw), {r['mse_clamped']['max']} (clamped)")
    for d, u in panel["unrecognisable"].items():
      print(f"{key}: {d} unrecognisable at strength {u['strength']}, "
            f"accuracy drop {u['accuracy_drop']}")


def plot(result: dict[str, Any], path: str, metric: str = "mse_clamped"
         ) -> None:
  """Accuracy vs MSE, one panel per (dataset, attack), one line per defense."""
  plt = storage.pyplot()
  panels = result["panels"]
  n = max(len(panels), 1)
  fig, axes = plt.subplots(1, n, figsize=(4.2 * n, 3.6), squeeze=False)
  for ax, (key, panel) in zip(axes[0], panels.items()):
    for name, pts in panel["curves"].items():
      curve = sorted_curve(pts, metric)
      xs = [min(v, 1e12) if math.isfinite(v) else 1e12 for _, _, v in curve]
      ax.plot(xs, [a for _, a, _ in curve], "o-", label=name, ms=3)
      for (s, a, _), xv in zip(curve, xs):
        ax.annotate(f"{s:g}", (xv, a), fontsize=5)
    if metric == "mse":  # raw MSE spans decades; clamped MSE is in [0, 1].
      ax.set_xscale("log")
    ax.set_xlabel(f"{metric} ([0,1] space)")
    ax.set_ylabel("test accuracy")
    ax.set_title(key, fontsize=9)
    ax.legend(fontsize=6)
  fig.tight_layout()
  storage.save_figure(fig, path, dpi=100)
  plt.close(fig)
