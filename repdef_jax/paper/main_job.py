"""The main job: attack real images with and without a defense.

For each of ``num_images`` test images it attacks the one-image gradient at a
fixed random initialisation twice, as shared without the defense and after
it, and writes ``results.json`` (schema in ``docs/main_job.md``), one
``recon_<index>.npz`` per image and ``reconstructions.png``. Resumable: a
rerun with the same config skips finished images; another config in the same
workdir is refused. Metrics are in [0, 1] pixel space
(:mod:`repdef_jax.metrics`).
"""

from __future__ import annotations

import io
import os
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from repdef_jax import attacks
from repdef_jax import data
from repdef_jax import defenses
from repdef_jax import metrics
from repdef_jax import models
from repdef_jax import storage
from repdef_jax.paper import harness

DATASETS = ("mnist", "cifar10")
POOL_SIZE = 500  # Images are drawn from the first POOL_SIZE test images.
RESULT_FILE = "results.json"
PLOT_FILE = "reconstructions.png"

DEFAULT_CONFIG = {
    "dataset": "cifar10",
    "split": "test",
    "model": "lenet",
    "init": "uniform",
    "attack": "dlg",
    "defense": "soteria",
    "strength": 60.0,
    "num_images": 3,
    "seed": 0,
    "iterations": None,
    "data_dir": None,
}
# Metrics kept per attack run (the rest of harness.attack_gradient's output
# belongs to the sweeps).
_KEPT = ("mse", "mse_clamped", "psnr", "ssim", "seconds", "diverged",
         "final_loss", "iterations")


def validate_config(config: Any) -> dict:
  """Fills defaults and checks names and the defense; loads no data.

  Args:
    config: a dict or ConfigDict of overrides of :data:`DEFAULT_CONFIG`.

  Returns:
    The complete config as a dict.

  Raises:
    ValueError: unknown keys or names (lists the valid ones), counts < 1, or
      a defense strength the defense rejects (e.g. Soteria's percent).
  """
  config = dict(config.to_dict() if hasattr(config, "to_dict") else config)
  unknown = set(config) - set(DEFAULT_CONFIG)
  if unknown:
    raise ValueError(f"Unknown config keys {sorted(unknown)}; valid: "
                     f"{sorted(DEFAULT_CONFIG)}.")
  config = {**DEFAULT_CONFIG, **config}
  if config["dataset"] not in DATASETS:
    raise ValueError(f"Unknown dataset {config['dataset']!r}; valid names: "
                     f"{', '.join(DATASETS)}.")
  attacks.get_attack(config["attack"])
  if config["defense"] not in defenses.DEFENSE_NAMES:
    raise ValueError(f"Unknown defense {config['defense']!r}; valid names: "
                     f"{', '.join(defenses.DEFENSE_NAMES)}.")
  if config["model"] not in models.MODEL_NAMES:
    raise ValueError(f"Unknown model {config['model']!r}; valid names: "
                     f"{', '.join(models.MODEL_NAMES)}.")
  # Build the defense once (cheap, no data) so a bad strength is reported
  # before a missing data directory.
  _build(config)
  if int(config["num_images"]) < 1:
    raise ValueError("num_images must be >= 1.")
  if config["iterations"] is not None and int(config["iterations"]) < 1:
    raise ValueError("iterations must be >= 1.")
  config["strength"] = float(config["strength"])
  config["data_dir"] = config["data_dir"] or None
  return config


def _build(config: dict) -> tuple[models.Model, defenses.Defense]:
  info = data.get_info(config["dataset"])
  model = models.get_model(config["model"], info.image_shape,
                           info.num_classes, init=config["init"])
  return model, defenses.get_defense(config["defense"], config["strength"],
                                     model=model)


def attack_image(model: models.Model, params: Any, attack: str,
                 defense: defenses.Defense, x: jax.Array, y: jax.Array,
                 key_attack: jax.Array, key_defense: jax.Array,
                 iterations: int | None) -> tuple[dict, dict, np.ndarray,
                                                  np.ndarray]:
  """Attacks one image's gradient without and with the defense.

  Both runs start from the same dummy (same ``key_attack``).

  Returns:
    ``(undefended, defended, x_undefended, x_defended)``: metric dicts and
    reconstructions ``[H, W, C]``.
  """
  grads, shared, info = harness.defend(model, params, defense, x, y,
                                       key_defense)
  out, recs = [], []
  for g in (grads, shared):
    m, x_rec = harness.attack_gradient(model, params, g, x, y, attack,
                                       key_attack, iterations=iterations)
    entry = {k: m[k] for k in _KEPT}
    entry["label_correct"] = m["label_accuracy"] == 1.0
    out.append(entry)
    recs.append(x_rec[0])
  # Nominal: what the defense was asked to prune; effective: the fraction of
  # the defended layer's rows that it zeroed and that were not zero already.
  zero_b, zero_a = (np.all(np.asarray(
      models.defended_params(model, g)["kernel"]) == 0, axis=1)
                    for g in (grads, shared))
  out[1]["pruned_fraction_nominal"] = info.get("pruned_fraction", 0.0)
  out[1]["pruned_fraction_effective"] = info.get(
      "effective_pruned_fraction", float(np.mean(zero_a & ~zero_b)))
  return out[0], out[1], recs[0], recs[1]


def _recon_path(workdir: str, idx: int) -> str:
  return os.path.join(workdir, f"recon_{idx}.npz")


def _save_recon(workdir: str, idx: int, *arrays: np.ndarray) -> None:
  buf = io.BytesIO()
  np.savez(buf, **dict(zip(("original", "undefended", "defended"),
                           map(np.asarray, arrays))))
  storage.write_bytes(_recon_path(workdir, idx), buf.getvalue())


def _load_recon(workdir: str, idx: int, original: np.ndarray) -> tuple:
  """``(original, undefended, defended)``; NaN (drawn gray) where missing."""
  try:
    with np.load(_recon_path(workdir, idx)) as z:
      return z["original"], z["undefended"], z["defended"]
  except (OSError, ValueError, KeyError):
    missing = np.full(original.shape, np.nan)
    return original, missing, missing


def _fmt(v: Any) -> str:
  return f"{v:9.3g}" if isinstance(v, float) else f"{v!s:>9}"


def _print_header(config: dict) -> None:
  print(f"{config['attack']} on {config['model']}/{config['dataset']}, "
        f"defense {config['defense']}({config['strength']:g}); metrics in "
        f"{metrics.PIXEL_SPACE}")
  print(f"{'index':>6} {'label':>5} | {'mse':>9} {'psnr':>9} {'ssim':>9} "
        f"{'div':>5} | {'def mse':>9} {'def psnr':>9} {'def ssim':>9} "
        f"{'div':>5} {'pruned':>6} | {'sec':>5}")


def _print_row(entry: dict) -> None:
  head = f"{entry['index']:6d} {entry['label']:5d} |"
  if "error" in entry:
    print(f"{head} {entry['error']}")
    return
  u, d = entry["undefended"], entry["defended"]
  print(f"{head} {_fmt(u['mse'])} {_fmt(u['psnr'])} {_fmt(u['ssim'])} "
        f"{u['diverged']!s:>5} | {_fmt(d['mse'])} {_fmt(d['psnr'])} "
        f"{_fmt(d['ssim'])} {d['diverged']!s:>5} "
        f"{d['pruned_fraction_effective']:6.2f} | "
        f"{u['seconds'] + d['seconds']:5.1f}")


def run(config: Any, workdir: str, verbose: bool = True) -> dict:
  """Runs the main job (resumable) and returns the results dict.

  Args:
    config: overrides of :data:`DEFAULT_CONFIG` (dict or ConfigDict).
    workdir: output folder (created).
    verbose: print the table.

  Returns:
    The results dict as written to ``results.json``.

  Raises:
    ValueError: bad config (lists valid names), or a workdir holding results
      of a different config. An image whose attack raises ValueError or
      FloatingPointError is recorded as an ``error`` entry instead.
  """
  config = validate_config(config)
  os.makedirs(workdir, exist_ok=True)
  path = os.path.join(workdir, RESULT_FILE)
  results = {"config": harness.jsonable(config),
             "pixel_space": metrics.PIXEL_SPACE, "images": []}
  old = storage.read_json(path)
  if old is not None:
    if old.get("config") != results["config"]:
      raise ValueError(
          f"{path} holds results of a different config ({old.get('config')});"
          f" this run's config is {results['config']}. Use another --workdir.")
    results = old

  images, labels = data.load(config["dataset"], config["split"],
                             config["data_dir"], max_examples=POOL_SIZE)
  if len(images) < config["num_images"]:
    raise ValueError(f"only {len(images)} images available, asked for "
                     f"{config['num_images']}.")
  model, defense = _build(config)
  keys = harness.sweep_keys(config["seed"])
  params = model.init(keys.init)
  order = np.asarray(jax.random.permutation(keys.data, len(images)))
  chosen = [int(i) for i in order[:config["num_images"]]]

  done = {e["index"]: e for e in results["images"]}
  new = 0
  if verbose:
    _print_header(config)
  for idx in chosen:
    x = jnp.asarray(data.to_float(np.asarray(images[idx:idx + 1])))
    y = jnp.asarray(labels[idx:idx + 1], jnp.int32)
    if idx not in done:
      recs = None
      try:
        und, dfd, *recs = attack_image(
            model, params, config["attack"], defense, x, y,
            jax.random.fold_in(keys.attack, idx),
            jax.random.fold_in(keys.defense, idx), config["iterations"])
        entry = {"index": idx, "label": int(labels[idx]), "undefended": und,
                 "defended": dfd}
      except (ValueError, FloatingPointError) as e:
        entry = {"index": idx, "label": int(labels[idx]),
                 "error": f"{type(e).__name__}: {e}"}
      results["images"].append(harness.jsonable(entry))
      done[idx] = results["images"][-1]
      new += 1
      storage.write_json(path, results)  # results.json first: the record.
      if recs:
        _save_recon(workdir, idx, np.asarray(x[0]), *recs)
    if verbose:
      _print_row(done[idx])
  png = os.path.join(workdir, PLOT_FILE)
  finished = [i for i in chosen if i in done]
  if finished and (new or not os.path.exists(png)):
    columns = [_load_recon(workdir, i, data.to_float(np.asarray(images[i])))
               for i in finished]
    harness.save_image_grid(png, [list(r) for r in zip(*columns)],
                            ["original", "undefended", "defended"])
  return results
