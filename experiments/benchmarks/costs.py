"""Unit costs for the paper presets' cost table and dry-run estimates.

:func:`unit_costs` measures, on this machine, the seconds of one local
FedAvg step (plain and with Soteria at the step) for every model of the
evaluation on MNIST (28x28x1) and CIFAR-10 (32x32x3) shapes at batch 10 and
50, and the seconds of one DLG outer step (20 L-BFGS iterations) and of one
GS iteration on one image. A few repeats each: estimates, not benchmarks.
"""

from __future__ import annotations

from typing import Any, Sequence

import jax

from experiments.benchmarks import attack as attack_bench
from experiments.benchmarks import fedavg as fedavg_bench
from experiments.benchmarks import timing

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
    'gs_iteration_s': {model: s}, 'machine': {...}}``. ``soteria_scaled``
    is True where the Soteria part was timed on one chunk of features and
    scaled to all of them (ConvNet: a full step takes minutes).
  """
  out: dict[str, Any] = {"fedavg_step": {}, "dlg_outer_step_s": {},
                         "gs_iteration_s": {},
                         "backend": jax.default_backend(),
                         "cores": timing.cores()}
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
