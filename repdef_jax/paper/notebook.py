"""Helpers the Colab notebooks call (logic lives here, not in cells).

* :func:`is_tiny`: whether CI asked for a tiny run (environment variable
  ``REPDEF_JAX_NOTEBOOK_TINY=1``); notebooks shrink their size parameters.
* :func:`attack_vs_defense`: one image, one attack, several defenses:
  reconstructions and metrics (notebook 1 and 3).
* :func:`federated_tradeoff`: a small trade-off sweep through
  :func:`repdef_jax.paper.tradeoff.run` (notebook 2); real data when
  ``TFDS_DATA_DIR`` is set, otherwise ``tfds.testing.mock_data``.

Images come from :func:`repdef_jax.harness.load_images` (real data when
``TFDS_DATA_DIR`` is set, synthetic otherwise).
"""

from __future__ import annotations

import contextlib
import os
from typing import Any, Sequence

import ml_collections

from repdef_jax import data as data_lib
from repdef_jax import defenses as defenses_lib
from repdef_jax.paper import harness
from repdef_jax import models as models_lib
from repdef_jax.paper import settings

TINY_ENV = "REPDEF_JAX_NOTEBOOK_TINY"


def is_tiny() -> bool:
  """True when ``REPDEF_JAX_NOTEBOOK_TINY`` is set to a non-empty, non-0."""
  return os.environ.get(TINY_ENV, "") not in ("", "0")


def attack_vs_defense(dataset: str = "cifar10", model_name: str = "lenet",
                      attack: str = "gs",
                      settings: Sequence[tuple[str, float]] = (
                          ("none", 0.0), ("soteria", 60.0),
                          ("compression", 80.0)),
                      *, iterations: int = 300, seed: int = 0,
                      model_init: str = "uniform",
                      defense_kwargs: dict[str, dict] | None = None,
                      ) -> dict[str, Any]:
  """Attacks one image's gradient under each (defense, strength) setting.

  Args:
    dataset: 'mnist' or 'cifar10' (shape; real images if TFDS_DATA_DIR).
    model_name: a model in :data:`repdef_jax.models.MODEL_NAMES`.
    attack: a registered attack.
    settings: ``(defense name, strength)`` pairs; a defense name may also be
      ``'soteria:<q>'`` to use a registered perturbation ``q``.
    iterations: attack iterations (DLG: outer steps).
    seed: seed of parameters and attack.
    model_init: 'uniform' (DLG) or 'default'.
    defense_kwargs: extra factory kwargs per setting label.

  Returns:
    ``{'image', 'label', 'source', 'rows': [(label, x_rec, metrics)]}``.
  """
  info = data_lib.get_info(dataset)
  model = models_lib.get_model(model_name, info.image_shape,
                               info.num_classes, init=model_init)
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
        give_labels=True)
    rows.append((f"{name} {strength:g}", x_rec[0], m))
  return {"image": x[0], "label": int(y[0]), "source": source, "rows": rows}


def show_rows(result: dict[str, Any], path: str | None = None) -> None:
  """Displays (or saves) the original and each setting's reconstruction."""
  images = [result["image"]] + [r[1] for r in result["rows"]]
  titles = ["original"] + [
      f"{r[0]}\nmse {r[2]['mse_clamped']:.3f} ssim {r[2]['ssim']:.2f}"
      for r in result["rows"]]
  if path is not None:
    harness.save_image_grid(path, [images], ["images"], [titles])
    return
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  fig, axes = plt.subplots(1, len(images), figsize=(2 * len(images), 2.4))
  for ax, img, t in zip(axes, images, titles):
    ax.imshow(img[..., 0] if img.shape[-1] == 1 else img.clip(0, 1),
              cmap="gray" if img.shape[-1] == 1 else None)
    ax.set_title(t, fontsize=7)
    ax.axis("off")
  plt.show()


@contextlib.contextmanager
def data_context(num_examples: int = 120):
  """Real TFDS data when ``TFDS_DATA_DIR`` is set, else tfds mock data."""
  if os.environ.get("TFDS_DATA_DIR"):
    yield os.environ["TFDS_DATA_DIR"]
    return
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
  with tfds.testing.mock_data(num_examples=num_examples):
    yield "/tmp/repdef_jax_mock_data"


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
    tiny: CI size (logistic regression, 1 round, 4 clients, one strength
      of Soteria and compression).

  Returns:
    The trade-off result dict (see :mod:`repdef_jax.paper.tradeoff`).
  """
  from repdef_jax.paper import tradeoff  # pylint: disable=g-import-not-at-top
  c = ml_collections.ConfigDict()
  c.seed = 0
  c.datasets = ("mnist",)
  c.attacks = (attack,)
  c.model = "logreg" if tiny else model
  c.model_init = "default"
  sweep = {"soteria": tuple(soteria), "compression": tuple(compression),
           "dp_gaussian": tuple(dp_gaussian)}
  if tiny:  # one point per defense, no DP: the fewest compilations
    sweep = {"soteria": (50.0,), "compression": (50.0,)}
  c.defenses = ml_collections.ConfigDict(sweep)
  c.num_images = num_images
  c.attack_iterations = ml_collections.ConfigDict({attack: attack_iterations})
  c.gs_restarts = 1
  c.give_labels = True
  c.accuracy_window = 1 if tiny else max(1, rounds // 3)
  c.equal_accuracy_tol = 0.01
  c.unrecognisable_metric = "ssim"
  c.unrecognisable_threshold = 0.2
  c.train = (settings.federated_setting("tiny") if tiny else
             settings.federated_setting(
                 "paper", num_clients=num_clients, samples_per_class=20,
                 rounds=rounds, clients_per_round=max(1, num_clients // 2),
                 client_lr=0.05, max_train_examples=5000,
                 max_test_examples=1000, log_every=1))
  with data_context() as data_dir:
    c.data_dir = data_dir
    return tradeoff.run(c, workdir)

