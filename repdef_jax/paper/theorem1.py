"""Theorem 1's certified bound vs pruning rate, beside what attacks reach.

References:
  Sun et al., "Provable Defense against Privacy Leakage in Federated Learning
  from Representation Perspective", CVPR 2021, Theorem 1; the bound is
  computed by :func:`repdef_jax.defenses.certify.certified_bound` (first
  order, under Assumption 1; see that module).

For each pruning rate and image: Soteria defends the one-image gradient; the
keep-mask is read off the shared gradient (the all-zero rows of the defended
kernel, exactly what was applied); the certified lower bound on
``||X - X'||_2`` is computed for that mask; each attack runs on the shared
gradient and we record the distance it actually reached,
``||X - X'||_2`` (L2 over all pixels, [0, 1] space), and the first-order
bound implied by its reconstruction's representation
(:func:`repdef_jax.defenses.certify.empirical_bound`). Writes
``certified.json`` and ``certified.png``; each rate is a resumable cell.
"""

from __future__ import annotations

import os
import time
from typing import Any

import jax.numpy as jnp
import ml_collections
import numpy as np

from repdef_jax import data as data_lib
from repdef_jax import defenses as defenses_lib
from repdef_jax.paper import harness
from repdef_jax import storage
from repdef_jax import models as models_lib
from repdef_jax.attacks import objectives
from repdef_jax.defenses import certify

RESULT_FILE = "certified.json"
PLOT_FILE = "certified.png"


def run(config: ml_collections.ConfigDict, workdir: str) -> dict[str, Any]:
  """Runs every pruning rate; writes ``certified.json`` / ``certified.png``."""
  start = time.perf_counter()
  os.makedirs(workdir, exist_ok=True)
  store = harness.CellStore(os.path.join(workdir, "cells"))
  info = data_lib.get_info(config.dataset)
  model = models_lib.get_model(config.model, info.image_shape,
                               info.num_classes, init=config.model_init)
  keys = harness.sweep_keys(config.seed)
  params = model.init(keys.init)
  images, labels, source = harness.load_images(
      config.dataset, config.num_images, data_dir=config.data_dir or None,
      seed=config.seed, allow_synthetic=config.allow_synthetic)
  rates = [float(r) for r in config.rates]
  progress = harness.Progress(len(rates), "certified")
  cells = []
  for rate in rates:
    def fn(rate=rate):
      d = defenses_lib.get_defense("soteria", rate, model=model)
      per_image = []
      for i in range(len(images)):
        x, y = images[i:i + 1], labels[i:i + 1]
        entry = {"index": i}
        for attack in config.attacks:
          m, x_rec, shared = harness.defend_and_attack(
              model, params, d, x, y, attack,
              *harness.image_keys(keys, i),
              iterations=config.attack_iterations.get(attack) or None,
              restarts=config.restarts or None,
              give_labels=config.give_labels)
          x_rec = np.nan_to_num(x_rec, nan=0.5, posinf=1e6, neginf=-1e6)
          emp = certify.empirical_bound(model, params, jnp.asarray(x),
                                        jnp.asarray(x_rec, jnp.float32))
          entry[attack] = {"distance": m["input_distance"],
                           "empirical_bound": float(emp[0]),
                           "mse": m["mse"], "mse_clamped": m["mse_clamped"],
                           "ssim": m["ssim"]}
        keep = ~objectives.pruned_rows(model, shared)
        bound = certify.certified_bound(model, params, jnp.asarray(x),
                                        keep.astype(jnp.float32))
        entry["certified_bound"] = float(bound[0])
        entry["pruned_fraction"] = float(1 - jnp.mean(keep))
        per_image.append(entry)
      summary = {"certified_bound": float(np.mean(
          [e["certified_bound"] for e in per_image]))}
      for attack in config.attacks:
        summary[f"{attack}_distance"] = float(np.mean(
            [float(e[attack]["distance"]) for e in per_image]))
        summary[f"{attack}_empirical_bound"] = float(np.mean(
            [e[attack]["empirical_bound"] for e in per_image]))
      return {"rate": rate, "images": per_image, **summary}

    cells.append(store.get_or_run(harness.cell_name("rate", rate), fn,
                                  progress))
  holds = {}
  for attack in config.attacks:
    pairs = [(e["certified_bound"], float(e[attack]["distance"]))
             for c in cells for e in c["images"]]
    holds[attack] = float(np.mean([dist >= b for b, dist in pairs]))
  result = {"experiment": "certified", "config": config.to_dict(),
            "image_source": source,
            "pixel_space": "[0,1]; distances are L2 norms over all pixels",
            "rates": cells,
            "fraction_attack_distance_above_bound": holds,
            "seconds": time.perf_counter() - start}
  storage.write_json(os.path.join(workdir, RESULT_FILE), result)
  plot(result, os.path.join(workdir, PLOT_FILE))
  return result


def plot(result: dict[str, Any], path: str) -> None:
  """Certified bound and attack distances vs pruning rate."""
  plt = storage.pyplot()
  cells = result["rates"]
  rates = [c["rate"] for c in cells]
  fig, ax = plt.subplots(figsize=(5, 3.6))
  ax.plot(rates, [c["certified_bound"] for c in cells], "k-o",
          label="Theorem 1 bound")
  for attack in result["config"]["attacks"]:
    ax.plot(rates, [c[f"{attack}_distance"] for c in cells], "o--",
            label=f"{attack}: ||X - X'||")
    ax.plot(rates, [c[f"{attack}_empirical_bound"] for c in cells], ":",
            label=f"{attack}: ||f(X)-f(X')|| / ||J||")
  ax.set_xlabel("Soteria pruning rate (%)")
  ax.set_ylabel("L2 distance ([0,1] pixels)")
  ax.set_yscale("symlog", linthresh=1e-3)
  ax.legend(fontsize=6)
  fig.tight_layout()
  storage.save_figure(fig, path, dpi=100)
  plt.close(fig)
