"""Helpers the Colab notebooks call (logic lives here, not in cells).

* :func:`is_tiny`: whether CI asked for a tiny run (environment variable
  ``REPDEF_JAX_NOTEBOOK_TINY=1``); notebooks shrink their size parameters.
* :func:`device_summary`: which accelerator JAX uses (one line).
* :func:`attack_vs_defense`: one image, one attack, several defenses:
  reconstructions and metrics (notebook 1 and 3).
* :func:`federated_tradeoff`: a small trade-off sweep through
  :func:`repdef_jax.paper.tradeoff.run` (notebook 2).

Data: real images through :mod:`repdef_jax.data` (a prepared TFDS copy, else
a download of the original archives), the embedded sample when neither is
possible (offline); the notebooks print which. Metrics and titles: MSE
(``mse_clamped``), PSNR and SSIM of reconstructions clamped to [0, 1], the
space of :mod:`repdef_jax.metrics`.
"""

from __future__ import annotations

import math
import os
from typing import Any, Sequence

import jax
import numpy as np

import ml_collections

from repdef_jax import data as data_lib
from repdef_jax import defenses as defenses_lib
from repdef_jax.paper import harness
from repdef_jax.paper import main_job
from repdef_jax import models as models_lib
from repdef_jax.paper import settings

TINY_ENV = "REPDEF_JAX_NOTEBOOK_TINY"


def is_tiny() -> bool:
  """True when ``REPDEF_JAX_NOTEBOOK_TINY`` is set to a non-empty, non-0."""
  return os.environ.get(TINY_ENV, "") not in ("", "0")


def device_summary() -> str:
  """One line: JAX's version, backend and devices, and whether a GPU is used.

  JAX runs on the first backend it finds (GPU or TPU when its plugin is
  installed, as on Colab), so nothing else needs to be set.
  """
  devices = jax.devices()
  kind = devices[0].platform
  names = ", ".join(sorted({d.device_kind for d in devices}))
  use = (f"{kind.upper()} present, JAX uses it" if kind != "cpu" else
         "no GPU: running on the CPU (Colab: Runtime > Change runtime type "
         "> GPU)")
  return f"jax {jax.__version__}, {len(devices)} x {names}: {use}"


def attack_vs_defense(dataset: str = "cifar10", model_name: str = "lenet",
                      attack: str = "gs",
                      settings: Sequence[tuple[str, float]] = (
                          ("none", 0.0), ("soteria", 60.0),
                          ("compression", 80.0)),
                      *, iterations: int = 300, seed: int = 0,
                      model_init: str | None = None,
                      defense_kwargs: dict[str, dict] | None = None,
                      ) -> dict[str, Any]:
  """Attacks one image's gradient under each (defense, strength) setting.

  Args:
    dataset: 'mnist' or 'cifar10' (the first test image; see the module
      docstring for where it comes from).
    model_name: a model in :data:`repdef_jax.models.MODEL_NAMES`.
    attack: a registered attack.
    settings: ``(defense name, strength)`` pairs; a defense name may also be
      ``'soteria:<q>'`` to use a registered perturbation ``q``.
    iterations: attack iterations (DLG: outer steps).
    seed: seed of parameters and attack.
    model_init: 'uniform' (DLG's U(-0.5, 0.5)), 'default' (flax's), or
      None / 'auto': 'uniform' for DLG's LeNet ('lenet'), 'default' for the
      other models (DLG's init saturates their softmax and zeroes the
      gradient; :func:`repdef_jax.paper.main_job.resolve_init`).
    defense_kwargs: extra factory kwargs per setting label.

  Returns:
    ``{'image', 'label', 'source', 'rows': [(label, x_rec, metrics)]}``.
  """
  info = data_lib.get_info(dataset)
  model = models_lib.get_model(
      model_name, info.image_shape, info.num_classes,
      init=main_job.resolve_init(model_init, model_name))
  keys = harness.sweep_keys(seed)
  params = model.init(keys.init)
  x, y, source = harness.load_images(dataset, 1, seed=seed)
  rows = []
  for name, strength in settings:
    kwargs = dict((defense_kwargs or {}).get(f"{name} {strength:g}", {}))
    defense = name
    if name.startswith("soteria:"):
      defense, kwargs["q"] = "soteria", name.split(":", 1)[1]
    d = defenses_lib.get_defense(defense, strength, model=model, **kwargs)
    m, x_rec, _ = harness.defend_and_attack(
        model, params, d, x, y, attack, *harness.image_keys(keys, 0),
        iterations=iterations, restarts=1,
        give_labels=attack != "idlg")  # iDLG infers the label itself.
    rows.append((f"{name} {strength:g}", x_rec[0], m))
  return {"image": x[0], "label": int(y[0]), "source": source, "rows": rows}


def show_rows(result: dict[str, Any], path: str | None = None) -> None:
  """Displays (or saves) the original and each setting's reconstruction."""
  images = [result["image"]] + [r[1] for r in result["rows"]]
  titles = ["original"] + [
      f"{r[0]}\nmse {r[2]['mse_clamped']:.3f} ssim {r[2]['ssim']:.2f} "
      "([0,1])"
      for r in result["rows"]]
  if path is not None:
    harness.save_image_grid(path, [images], ["images"], [titles])
    return
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  fig, axes = plt.subplots(1, len(images), figsize=(2 * len(images), 2.4))
  for ax, img, t in zip(axes, images, titles):
    img = np.clip(np.nan_to_num(np.asarray(img, np.float32)), 0, 1)  # As saved.
    ax.imshow(img[..., 0] if img.shape[-1] == 1 else img,
              cmap="gray" if img.shape[-1] == 1 else None, vmin=0, vmax=1)
    ax.set_title(t, fontsize=7)
    ax.axis("off")
  plt.show()


def federated_tradeoff(workdir: str, *, rounds: int = 10,
                       num_clients: int = 20, num_images: int = 1,
                       attack: str = "gs", attack_iterations: int = 200,
                       soteria: Sequence[float] = (40.0, 80.0),
                       compression: Sequence[float] = (40.0, 90.0),
                       dp_gaussian: Sequence[float] = (1e-2, 1e-1),
                       model: str = "leakage", tiny: bool = False
                       ) -> dict[str, Any]:
  """A small trade-off sweep with :func:`repdef_jax.paper.tradeoff.run`.

  Args:
    workdir: output folder (cells are reused when rerun).
    rounds: FedAvg rounds per cell.
    num_clients: clients (2 classes x 20 samples each; half of them per
      round).
    num_images: attacked test images per cell.
    attack: 'dlg' or 'gs'.
    attack_iterations: attack iterations.
    soteria: Soteria pruning rates.
    compression: compression percentiles.
    dp_gaussian: Gaussian noise scales.
    model: model name (the default, the leakage CNN, is one both attacks
      reconstruct exactly when undefended).
    tiny: CI size (logistic regression, at most 2 rounds, 4 clients, one
      strength of Soteria and compression).

  Real MNIST when it can be read or downloaded; otherwise the embedded
  sample (256 training and 256 test images), with fewer samples per client
  so that the non-IID split fits, said in the printed data line.

  Returns:
    The trade-off result dict (see :mod:`repdef_jax.paper.tradeoff`).
  """
  from repdef_jax.paper import sweep  # pylint: disable=g-import-not-at-top
  from repdef_jax.paper import tradeoff  # pylint: disable=g-import-not-at-top
  c = sweep.default_config()
  c.seeds = (0,)
  attacks = (attack, f"{attack}_mask")
  train = dict(rounds=min(rounds, 2)) if tiny else dict(
      num_clients=num_clients, samples_per_class=20, rounds=rounds,
      clients_per_round=max(1, num_clients // 2), client_lr=0.05,
      max_train_examples=5000, max_test_examples=1000, log_every=1)
  c.panels = ml_collections.ConfigDict({
      "notebook": sweep.panel("mnist", "logreg" if tiny else model,
                              attacks, **train)})
  strengths = {"soteria": tuple(soteria), "compression": tuple(compression),
               "dp_gaussian": tuple(dp_gaussian)}
  if tiny:  # one point per defense, no DP: the fewest compilations
    strengths = {"soteria": (50.0,), "compression": (50.0,)}
  c.defenses = ml_collections.ConfigDict(strengths)
  c.num_images = num_images
  c.attack_budgets = ml_collections.ConfigDict({
      "dlg": {"outer_steps": attack_iterations},
      "gs": {"iterations": attack_iterations, "restarts": 1}})
  c.accuracy_window = 1 if tiny else max(1, rounds // 3)
  c.update_attack.cells = ml_collections.ConfigDict({})  # round 0 only
  if tiny:
    c.train = settings.federated_setting("tiny")
  else:
    c.train.log_every = 1
  c.data_dir = ""  # TFDS_DATA_DIR or tfds's default folder, then download.
  with data_lib.allow_sample():
    _, labels, source = data_lib.load_with_source("mnist", "train")
    line = f"data: {source}"
    if source.kind == "sample" and not tiny:
      clients_per_class = math.ceil(num_clients * 2 / 10)
      spc = c.panels.notebook.train.samples_per_class = int(
          min(c.panels.notebook.train.samples_per_class,
              np.bincount(labels).min() // clients_per_class))
      line += f"; {spc} samples per class and client"
    print(line, flush=True)
    return tradeoff.run(c, workdir)


def print_tradeoff(result: dict[str, Any]) -> None:
  """Prints a trade-off result: its tables, then every claim's verdict."""
  from repdef_jax.paper import report  # pylint: disable=g-import-not-at-top
  lines = []
  for t in result["tables"]:
    lines += [t["title"]] + report.table(t["header"], t["rows"])
  lines += report.claims_table(result["claims"])
  print("\n".join(lines))
