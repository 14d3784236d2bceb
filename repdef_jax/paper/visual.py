"""Visual comparison of reconstructions under each defense (Sun et al. 2021,
Section 6, Fig. 5: GS on a CIFAR-10 image).

Every setting attacks the same one-image gradients at the same parameters
with the same attack key, so rows differ only by the defense. Writes
``visual.json`` (metrics per setting and image, [0, 1] pixel space) and
``visual.png`` (rows: original, then one row per setting; titles give the
clamped MSE and SSIM). Each setting is a resumable cell.
"""

from __future__ import annotations

import io
import os
import time
from typing import Any

import ml_collections
import numpy as np

from repdef_jax import data as data_lib
from repdef_jax import defenses as defenses_lib
from repdef_jax.paper import harness
from repdef_jax import storage
from repdef_jax import models as models_lib

RESULT_FILE = "visual.json"
PLOT_FILE = "visual.png"


def run(config: ml_collections.ConfigDict, workdir: str) -> dict[str, Any]:
  """Runs every (defense, strength) setting; writes JSON and the grid.

  Args:
    config: see ``experiments/configs/visual.py``.
    workdir: output folder.

  Returns:
    The result dict.
  """
  start = time.perf_counter()
  os.makedirs(workdir, exist_ok=True)
  store = harness.CellStore(os.path.join(workdir, "cells"))
  info = data_lib.get_info(config.dataset)
  model = models_lib.get_model(config.model, info.image_shape,
                               info.num_classes, init=config.model_init,
                               **config.model_kwargs.to_dict())
  keys = harness.sweep_keys(config.seed)
  params = model.init(keys.init)
  images, labels, source = harness.load_images(
      config.dataset, config.num_images, data_dir=config.data_dir or None,
      seed=config.seed, allow_synthetic=config.allow_synthetic)
  settings = [("none", 0.0)] + [(d, float(s)) for d, s in config.settings]
  progress = harness.Progress(len(settings), "visual")
  rows, results = [], []
  for defense, strength in settings:
    name = harness.cell_name(defense, strength)

    def fn(defense=defense, strength=strength, name=name):
      d = defenses_lib.get_defense(defense, strength, model=model)
      per_image, recs = [], []
      for i in range(len(images)):
        m, x_rec, _ = harness.defend_and_attack(
            model, params, d, images[i:i + 1], labels[i:i + 1],
            config.attack, *harness.image_keys(keys, i),
            iterations=config.attack_iterations or None,
            restarts=config.restarts or None, give_labels=config.give_labels)
        per_image.append(m)
        recs.append(x_rec[0])
      buf = io.BytesIO()
      np.save(buf, np.stack(recs).astype(np.float32))
      storage.write_bytes(os.path.join(workdir, "cells", f"{name}.npy"),
                         buf.getvalue())
      return {"defense": defense, "strength": strength, "images": per_image}

    cell = store.get_or_run(name, fn, progress)
    recs = np.load(os.path.join(workdir, "cells", f"{name}.npy"))
    rows.append((f"{defense} {strength:g}" if defense != "none" else "none",
                 list(recs), cell))
    results.append(cell)
  grid = [list(images)] + [r[1] for r in rows]
  labels_ = ["original"] + [r[0] for r in rows]
  titles = [["" for _ in images]] + [
      [f"mse {m['mse_clamped']:.3f} ssim {m['ssim']:.2f}"
       for m in r[2]["images"]] for r in rows]
  harness.save_image_grid(
      os.path.join(workdir, PLOT_FILE), grid, labels_, titles,
      suptitle=f"{config.attack} on {config.model}/{config.dataset} "
               f"({source} images); metrics on clamped [0,1] images")
  result = {"experiment": "visual", "config": config.to_dict(),
            "image_source": source, "pixel_space": "[0,1]",
            "settings": results, "seconds": time.perf_counter() - start}
  storage.write_json(os.path.join(workdir, RESULT_FILE), result)
  return result
