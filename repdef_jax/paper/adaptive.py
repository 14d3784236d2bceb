"""Adaptive attacks against Soteria: where the defense holds and where not.

Beyond the paper. Soteria perturbs one layer and its pruned rows are visible
(NOTES.md, section 1). Two adaptive attacks from later work
(:mod:`repdef_jax.attacks`):

* ``<family>_drop``: the defended layer left out of the objective (Balunovic
  et al., "Bayesian Framework for Gradient Leakage", ICLR 2022);
* ``<family>_mask``: the all-zero rows of the shared defended kernel applied
  to the trial gradient too (GGL, Li et al., CVPR 2022);

are run next to the plain attack on Soteria-defended one-image gradients,
for each model of ``config.models``, at several pruning rates, at two
training stages ('init': the initial global model; 'trained': the global
model after ``train.rounds`` rounds of undefended FedAvg via
:func:`repdef_jax.training.train_and_evaluate`), and for three Soteria
variants: the reference rule (``score='reference'``,
``selection='percentile'``), ``selection='count'`` (exactly the nominal
fraction pruned, inactive features last) and ``score='exact'`` (the paper's
``||r_i dX/dr_i||`` through the Jacobian's pseudo-inverse).

Verdict per cell: the defense **holds** against an attack when the mean SSIM
of its reconstructions (clamped [0, 1] images) is at most
``unrecognisable_threshold`` (and the undefended attack at that stage
exceeded it, i.e. the attack works at all); it **fails** otherwise. Writes
``adaptive.json`` and ``adaptive.png``; each cell is resumable.
"""

from __future__ import annotations

import os
import time
from typing import Any

import ml_collections
import numpy as np

from repdef_jax import data as data_lib
from repdef_jax import defenses as defenses_lib
from repdef_jax.paper import harness
from repdef_jax import fedavg
from repdef_jax import storage
from repdef_jax import models as models_lib
from repdef_jax import training

RESULT_FILE = "adaptive.json"
PLOT_FILE = "adaptive.png"
VARIANTS = {
    "reference": {},
    "count": {"selection": "count"},
    "exact": {"score": "exact"},
}


def stage_params(config: ml_collections.ConfigDict, model: models_lib.Model,
                 stage: str, workdir: str) -> Any:
  """Global parameters of ``model`` at a training stage ('init'/'trained')."""
  if stage == "init":
    return model.init(fedavg.key_streams(config.seed).init)
  if stage != "trained":
    raise ValueError(f"unknown stage {stage!r}; use 'init' or 'trained'.")
  c = training.default_config()
  c.update(config.train.to_dict())
  c.dataset = config.dataset
  c.model = model.name
  c.model_init = config.model_init
  c.defense = "none"
  c.seed = config.seed
  c.data_dir = config.data_dir
  c.plot = False
  return training.train_and_evaluate(
      c, os.path.join(workdir, "train", model.name))["state"].params


def run(config: ml_collections.ConfigDict, workdir: str) -> dict[str, Any]:
  """Runs every (model, stage, variant, rate, attack) cell; writes outputs."""
  start = time.perf_counter()
  os.makedirs(workdir, exist_ok=True)
  store = harness.CellStore(os.path.join(workdir, "cells"))
  info = data_lib.get_info(config.dataset)
  models = {name: models_lib.get_model(name, info.image_shape,
                                       info.num_classes, init=config.model_init)
            for name in config.models}
  images, labels = data_lib.load(config.dataset, "test",
                                 config.data_dir or None,
                                 max_examples=config.num_images)
  images = data_lib.to_float(np.asarray(images))
  labels = np.asarray(labels, np.int32)
  keys = harness.sweep_keys(config.seed)
  attacks = [a for fam in config.families
             for a in (fam, f"{fam}_drop", f"{fam}_mask")]
  cells_spec = []
  for name in config.models:
    for stage in config.stages:
      for fam in config.families:
        cells_spec.append((name, stage, "none", 0.0, fam))
      for variant in config.variants:
        for rate in config.rates:
          for attack in attacks:
            cells_spec.append((name, stage, variant, float(rate), attack))
  progress = harness.Progress(len(cells_spec), "adaptive")
  params_by_stage = {}
  rows = []
  for name, stage, variant, rate, attack in cells_spec:
    model = models[name]
    if (name, stage) not in params_by_stage:
      params_by_stage[(name, stage)] = stage_params(config, model, stage,
                                                    workdir)
    params = params_by_stage[(name, stage)]

    def fn(model=model, params=params, stage=stage, variant=variant,
           rate=rate, attack=attack):
      if variant == "none":
        d = defenses_lib.get_defense("none")
      else:
        d = defenses_lib.get_defense("soteria", rate, model=model,
                                     **VARIANTS[variant])
      per_image = []
      for i in range(len(images)):
        m, _, _ = harness.defend_and_attack(
            model, params, d, images[i:i + 1], labels[i:i + 1], attack,
            *harness.image_keys(keys, i),
            iterations=config.attack_iterations.get(attack.split("_")[0])
            or None, restarts=config.restarts or None,
            give_labels=config.give_labels)
        per_image.append(m)
      out = {"model": model.name, "stage": stage, "variant": variant,
             "rate": rate, "attack": attack, "images": per_image}
      for k in ("mse", "mse_clamped", "ssim", "psnr"):
        out[k] = harness.finite_or_str(
            np.mean([float(m[k]) for m in per_image]))
      for k in per_image[0]:
        if k.startswith("defense/"):
          out[k] = float(np.mean([m[k] for m in per_image]))
      return out

    rows.append(store.get_or_run(
        harness.cell_name(name, stage, variant, rate, attack), fn,
        progress))
  thr = config.unrecognisable_threshold
  works = {(r["model"], r["stage"], r["attack"]): r["ssim"] > thr
           for r in rows if r["variant"] == "none"}
  for r in rows:
    if r["variant"] == "none":
      r["verdict"] = "undefended: attack " + (
          "works" if r["ssim"] > thr else "fails")
    else:
      fam = r["attack"].split("_")[0]
      if not works.get((r["model"], r["stage"], fam), True):
        r["verdict"] = "n/a (attack fails even undefended)"
      else:
        r["verdict"] = "holds" if r["ssim"] <= thr else "fails"
  result = {"experiment": "adaptive", "config": config.to_dict(),
            "pixel_space": "[0,1]",
            "verdict_rule": f"holds when mean SSIM <= {thr}",
            "cells": [{k: v for k, v in r.items() if k != "images"}
                      for r in rows],
            "seconds": time.perf_counter() - start}
  storage.write_json(os.path.join(workdir, RESULT_FILE), result)
  plot(result, os.path.join(workdir, PLOT_FILE))
  return result


def plot(result: dict[str, Any], path: str) -> None:
  """SSIM vs pruning rate: a panel per (model, stage, variant)."""
  plt = storage.pyplot()
  cfg = result["config"]
  panel_rows = [(m, st) for m in cfg["models"] for st in cfg["stages"]]
  variants = list(cfg["variants"])
  fig, axes = plt.subplots(len(panel_rows), len(variants),
                           figsize=(3.4 * len(variants), 2.8 * len(panel_rows)),
                           squeeze=False)
  for i, (name, stage) in enumerate(panel_rows):
    cells = [c for c in result["cells"] if c["model"] == name]
    for j, variant in enumerate(variants):
      ax = axes[i, j]
      for attack in sorted({c["attack"] for c in cells
                            if c["variant"] == variant}):
        pts = sorted((c["rate"], c["ssim"]) for c in cells
                     if c["stage"] == stage and c["variant"] == variant
                     and c["attack"] == attack)
        base = [c["ssim"] for c in cells if c["stage"] == stage and
                c["variant"] == "none" and c["attack"] == attack]
        pts = [(0.0, base[0])] + pts if base else pts
        ax.plot([p[0] for p in pts], [p[1] for p in pts], "o-", ms=3,
                label=attack)
      ax.axhline(cfg["unrecognisable_threshold"], color="gray", ls=":")
      ax.set_title(f"{name}, {stage}, {variant}", fontsize=8)
      ax.set_xlabel("pruning rate (%)")
      ax.set_ylabel("SSIM")
      ax.legend(fontsize=6)
  fig.tight_layout()
  storage.save_figure(fig, path, dpi=100)
  plt.close(fig)
