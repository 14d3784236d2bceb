"""Unit costs for the paper presets' cost table and dry-run estimates.

:func:`unit_costs` measures, on this machine, the seconds of one local
FedAvg step (plain and with Soteria at the step) for every model of the
evaluation on MNIST (28x28x1) and CIFAR-10 (32x32x3) shapes at batch 10 and
50, and the seconds of one DLG outer step (20 L-BFGS iterations) and of one
GS iteration on one image. A few repeats each: estimates, not benchmarks.
"""

from __future__ import annotations

import os
from typing import Any, Sequence

import jax

from experiments.benchmarks import attack as attack_bench
from experiments.benchmarks import fedavg as fedavg_bench
from repdef_jax import host

DATASETS = {"mnist": (28, 28, 1), "cifar10": (32, 32, 3)}
# name -> (registry name, model kwargs).
MODELS = {
    "lenet": ("lenet", {}),
    "leakage": ("leakage", {}),
    "convnet16": ("convnet64", {"width": 16}),
    "convnet64": ("convnet64", {"width": 64}),
    "mlp": ("mlp", {}),
}
ATTACK_MODELS = ("lenet", "leakage", "convnet64")


def unit_costs(models: Sequence[str] = tuple(MODELS),
               datasets: Sequence[str] = tuple(DATASETS),
               batches: Sequence[int] = (10, 50),
               attack_models: Sequence[str] = ATTACK_MODELS,
               repeats: int = 1, verbose: bool = False) -> dict[str, Any]:
  """Measured seconds per unit of work, for cost tables and ETAs.

  Args:
    models: keys of :data:`MODELS` ('convnet16' / 'convnet64' are the
      ConvNet at width 16 / 64).
    datasets: keys of :data:`DATASETS`.
    batches: local batch sizes.
    attack_models: models (keys of :data:`MODELS`) of the attack costs;
      attacks run on CIFAR-10 shapes, one image.
    repeats: timed repeats per number (after one compile run).
    verbose: print each number as it is measured.

  Returns:
    ``{'fedavg_step': {model: {dataset: {batch: {'plain_s', 'soteria_s',
    'soteria_scaled'}}}}, 'dlg_outer_step_s': {model: s},
    'gs_iteration_s': {model: s}, 'dlg_inner_steps': 20, 'models': {model:
    {'name', 'kwargs'}}, 'backend', 'cores'}``. ``soteria_scaled``
    is True where the Soteria part was timed on one chunk of features and
    scaled to all of them (ConvNet: a full step takes minutes).
  """
  out: dict[str, Any] = {"fedavg_step": {}, "dlg_outer_step_s": {},
                         "gs_iteration_s": {}, "dlg_inner_steps": 20,
                         "models": {k: {"name": MODELS[k][0],
                                        "kwargs": MODELS[k][1]}
                                    for k in (*models, *attack_models)},
                         "backend": jax.default_backend(),
                         "cores": host.usable_cores()}
  for key in models:
    name, kwargs = MODELS[key]
    per_model = out["fedavg_step"].setdefault(key, {})
    for ds in datasets:
      for b in batches:
        plain = fedavg_bench.local_step_seconds(
            name, DATASETS[ds], b, False, repeats, **kwargs)
        sot = fedavg_bench.local_step_seconds(
            name, DATASETS[ds], b, True, repeats, **kwargs)
        per_model.setdefault(ds, {})[b] = {
            "plain_s": plain["seconds"], "soteria_s": sot["seconds"],
            "soteria_scaled": sot["scaled"]}
        if verbose:
          print(f"[unit costs] {key} {ds} batch {b}: plain "
                f"{plain['seconds']:.4f} s, soteria {sot['seconds']:.4f} s",
                flush=True)
  for key in attack_models:
    name, kwargs = MODELS[key]
    out["dlg_outer_step_s"][key] = attack_bench.dlg_outer_step_seconds(
        name, repeats, **kwargs)
    out["gs_iteration_s"][key] = attack_bench.gs_iteration_seconds(
        name, repeats, **kwargs)
    if verbose:
      print(f"[unit costs] {key}: DLG outer step "
            f"{out['dlg_outer_step_s'][key]:.3f} s, GS iteration "
            f"{out['gs_iteration_s'][key]:.4f} s", flush=True)
  return out


MEASURED_MEDIUM = "docs/results/tradeoff/tradeoff.json"


def preset_costs(unit: dict[str, Any],
                 presets: Sequence[str] = ("medium", "full")
                 ) -> list[dict[str, Any]]:
  """Trade-off preset costs priced from unit costs only.

  Every cell of each preset's plan is priced by
  :func:`repdef_jax.paper.cost.estimate` from ``unit`` (no finished cells),
  so the medium estimate can be checked against the committed medium run.

  Returns:
    One ``{'preset', 'cells', 'cpu_h', 'gpu_h', 'gpu_model', 'by_model_h',
    'by_kind_h', 'measured_h', 'measured_by_kind_h', 'measured_cpus',
    'unknown', 'extrapolated'}`` per preset; ``measured_h`` and
    ``measured_by_kind_h`` are the committed run's cell time in all and by
    kind of cell, ``measured_cpus`` its cells per CPU model ('not recorded'
    for cells of runs before the model was stored) (medium only, else
    None).
  """
  # The paper package is above the library; imported here, not at the top,
  # so that the other benchmark parts do not load it.
  from experiments.configs import tradeoff as tradeoff_cfg  # pylint: disable=g-import-not-at-top
  from repdef_jax import storage  # pylint: disable=g-import-not-at-top
  from repdef_jax.paper import cost  # pylint: disable=g-import-not-at-top
  from repdef_jax.paper import sweep  # pylint: disable=g-import-not-at-top
  out = []
  for preset in presets:
    config = tradeoff_cfg.get_config(preset)
    est = cost.estimate(config, sweep.plan(config), None, reference="",
                        units=unit)
    measured, by_kind, cpus = None, None, None
    if preset == "medium" and os.path.exists(MEASURED_MEDIUM):
      run = storage.read_json(MEASURED_MEDIUM)
      measured = run.get("cell_seconds")
      by_kind, cpus = {}, {}
      for c in run.get("cell_costs", []):
        by_kind[c["kind"]] = by_kind.get(c["kind"], 0.0) + c["seconds"] / 3600
        cpu = c.get("cpu") or "not recorded"
        cpus[cpu] = cpus.get(cpu, 0) + 1
    out.append({
        "preset": preset, "cells": est["cells"],
        "cpu_h": est["seconds"] / 3600,
        "gpu_h": est["gpu_seconds"] / 3600,
        "gpu_model": (f"{cost.GPU_FLOPS / 1e12:g} TFLOP/s, at least "
                      f"{cost.GPU_STEP_FLOOR_S * 1e3:g} ms per step or "
                      "iteration"),
        "by_model_h": {k: v / 3600 for k, v in est["by_model"].items()},
        "by_kind_h": {k: v / 3600 for k, v in est["by_kind"].items()},
        "measured_h": measured / 3600 if measured else None,
        "measured_by_kind_h": by_kind or None,
        "measured_cpus": cpus or None,
        "unknown": est["unknown"], "extrapolated": est["extrapolated"]})
  return out
