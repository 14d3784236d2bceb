r"""Main job: attack real images with and without a defense.

Command (the README's first command)::

  python -m experiments.attack --workdir=./runs/attack
  # options: --dataset=mnist|cifar10 --model=lenet --attack=dlg|idlg|gs|
  #   dlg_drop|gs_drop|dlg_mask|gs_mask --defense=soteria|none|compression|...
  #   --strength=60 --num_images=3 --seed=0 --iterations=N --data_dir=DIR

For each of ``num_images`` test images (drawn with the 'data' key stream) it
computes the true gradient of one image at a fixed random initialisation
(DLG's U(-0.5, 0.5) by default), runs the attack on that gradient
("undefended") and on the gradient after the defense ("defended"; the
defense is applied to what the client shares), then writes to ``--workdir``:

* ``results.json`` (written atomically after each image; schema below);
* ``recon_<index>.npz`` (written atomically after the image's entry):
  arrays ``original``, ``undefended``, ``defended`` ``[H, W, C]``;
* ``reconstructions.png`` (atomic): rows original | undefended | defended,
  one column per finished image (including images finished by earlier runs
  of a resumed job), redrawn from the ``recon_<index>.npz`` files; a missing
  reconstruction (an image that failed, or a kill between ``results.json``
  and its ``.npz``) is drawn mid-gray.

Schema of ``results.json``::

  {"config": {...every flag value...},
   "pixel_space": "[0,1]",     # images are fed to the model in [0, 1]
   "images": [{"index": int,   # index in the test split
               "label": int,
               "undefended": {"mse", "mse_clamped", "psnr", "ssim",
                              "seconds", "diverged", "label_correct",
                              "final_loss", "iterations"},
               "defended": {... same ...,
                            "pruned_fraction_nominal",
                            "pruned_fraction_effective"}}
              # or, when attacking the image raised ValueError or
              # FloatingPointError (e.g. a non-finite gradient), a finished
              # entry without metrics; the run goes on with the next image:
              | {"index": int, "label": int,
                 "error": "ValueError: <message>"}]}

``mse`` is the paper's raw MSE (no clamping), ``mse_clamped``/``psnr``/
``ssim`` use reconstructions clamped to [0, 1] (:mod:`repdef_jax.metrics`).
Non-finite numbers are written as JSON strings "inf"/"-inf"/"nan".
Re-running with the same config resumes (finished images, including
``error`` entries, are skipped); a different config in the same workdir is an
error. The config (including the defense and its strength) is validated
before any data is loaded.

Randomness: ``jax.random.key(seed)`` is split by ``fold_in`` into named
streams 'init', 'data', 'attack', 'defense'; images fold in their index.
Turning the defense on or off changes no other stream, and the undefended and
defended attacks of an image start from the same dummy.
"""

from __future__ import annotations

from io import BytesIO
import json
import math
import os
import time
from typing import Any

from absl import app
from absl import flags
import jax
import jax.numpy as jnp
import numpy as np

from repdef_jax import attacks
from repdef_jax import data
from repdef_jax import defenses
from repdef_jax import gradients
from repdef_jax import io
from repdef_jax import metrics
from repdef_jax import models

STREAMS = ("init", "data", "attack", "defense")
DATASETS = ("mnist", "cifar10")
POOL_SIZE = 500  # Images are drawn from the first POOL_SIZE test images.

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


def key_streams(seed: int) -> dict[str, jax.Array]:
  """Named, independent PRNG streams from one seed."""
  root = jax.random.key(seed)
  return {name: jax.random.fold_in(root, i) for i, name in enumerate(STREAMS)}


def validate_config(config: dict) -> dict:
  """Fills defaults and checks names and the defense; loads no data.

  Raises:
    ValueError: unknown keys or names (lists the valid ones), counts < 1, or
      a defense strength the defense rejects (e.g. Soteria's percent).
  """
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
  info = data.get_info(config["dataset"])
  model = models.get_model(config["model"], info.image_shape,
                           info.num_classes, init=config["init"])
  defenses.get_defense(config["defense"], config["strength"], model=model)
  if int(config["num_images"]) < 1:
    raise ValueError("num_images must be >= 1.")
  if config["iterations"] is not None and int(config["iterations"]) < 1:
    raise ValueError("iterations must be >= 1.")
  config["strength"] = float(config["strength"])
  return config


def _attack_overrides(attack: attacks.Attack, iterations: int | None) -> dict:
  if iterations is None:
    return {}
  if attack.config_cls is attacks.DLGConfig:
    return {"outer_steps": int(iterations)}
  return {"iterations": int(iterations)}


def _jsonable(v: Any) -> Any:
  if isinstance(v, dict):
    return {k: _jsonable(x) for k, x in v.items()}
  if isinstance(v, (list, tuple)):
    return [_jsonable(x) for x in v]
  if isinstance(v, (np.floating, float)):
    v = float(v)
    return v if math.isfinite(v) else str(v)
  if isinstance(v, (np.integer,)):
    return int(v)
  if isinstance(v, np.bool_):
    return bool(v)
  return v


def write_json_atomic(path: str, obj: Any) -> None:
  """Writes ``obj`` as JSON to ``path`` atomically (:func:`io.write_json`)."""
  io.write_json(path, _jsonable(obj))


def _recon_path(workdir: str, idx: int) -> str:
  return os.path.join(workdir, f"recon_{idx}.npz")


def save_recon(workdir: str, idx: int, original, undefended,
               defended) -> None:
  """Writes one image's arrays to ``recon_<idx>.npz`` atomically."""
  buf = BytesIO()
  np.savez(buf, original=np.asarray(original),
           undefended=np.asarray(undefended), defended=np.asarray(defended))
  io.write_bytes(_recon_path(workdir, idx), buf.getvalue())


def load_recon(workdir: str, idx: int, original) -> tuple[np.ndarray, ...]:
  """``(original, undefended, defended)``; NaN (gray) where none is saved."""
  path = _recon_path(workdir, idx)
  if os.path.exists(path):
    try:
      with np.load(path) as z:
        return z["original"], z["undefended"], z["defended"]
    except (OSError, ValueError, KeyError):
      pass  # Unreadable: drawn as missing.
  original = np.asarray(original)
  missing = np.full(original.shape, np.nan)
  return original, missing, missing


def attack_image(model, params, attack, defense, x, y, key_attack,
                 key_defense, overrides) -> tuple[dict, dict, np.ndarray,
                                                  np.ndarray]:
  """Attacks one image's gradient without and with the defense.

  Args:
    model: the model.
    params: its parameters.
    attack: a registered :class:`repdef_jax.attacks.Attack`.
    defense: a :class:`repdef_jax.defenses.Defense`.
    x: the image ``[1, H, W, C]`` in [0, 1].
    y: its label ``[1]`` int32.
    key_attack: the attack's key (the same for both runs).
    key_defense: the defense's key.
    overrides: attack config overrides.

  Returns:
    ``(undefended, defended, x_undefended, x_defended)``: metric dicts and
    reconstructions.
  """
  grads = gradients.batch_grad(model, params, x, y)
  shared, info = defense.apply(grads, defenses.ClientBatch(params, x, y),
                               key_defense)
  out, recs = [], []
  for g in (grads, shared):
    start = time.perf_counter()
    res = attacks.to_host(attack(model, params, g, 1, key_attack,
                                 **overrides))
    seconds = time.perf_counter() - start
    m = metrics.reconstruction_metrics(res.x_rec, np.asarray(x), match=False)
    out.append({
        "mse": m["mse"], "mse_clamped": m["mse_clamped"], "psnr": m["psnr"],
        "ssim": m["ssim"], "seconds": seconds,
        "diverged": bool(res.diverged or not m["finite"]),
        "label_correct": bool(metrics.label_accuracy(res.labels_rec, y) == 1),
        "final_loss": res.final_loss, "iterations": res.iterations,
    })
    recs.append(res.x_rec[0])
  # Nominal: what the defense was asked to prune; effective: the fraction of
  # the defended layer's rows that it zeroed and that were not zero already.
  kern_before = models.defended_params(model, grads)["kernel"]
  kern_after = models.defended_params(model, shared)["kernel"]
  zero_b = np.all(np.asarray(kern_before) == 0, axis=1)
  zero_a = np.all(np.asarray(kern_after) == 0, axis=1)
  nominal = info.get("pruned_fraction", 0.0)
  effective = info.get("effective_pruned_fraction",
                       float(np.mean(zero_a & ~zero_b)))
  out[1]["pruned_fraction_nominal"] = float(nominal)
  out[1]["pruned_fraction_effective"] = float(effective)
  return out[0], out[1], recs[0], recs[1]


def save_png(path: str, originals, undefended, defended) -> None:
  """Saves rows original | undefended | defended (clamped to [0, 1])."""
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  n = len(originals)
  fig, axes = plt.subplots(3, n, figsize=(1.6 * n + 1.2, 5), squeeze=False)
  for r, (name, row) in enumerate(zip(("original", "undefended", "defended"),
                                      (originals, undefended, defended))):
    for c in range(n):
      ax = axes[r, c]
      img = np.clip(np.nan_to_num(np.asarray(row[c], np.float64), nan=0.5),
                    0, 1)
      if img.shape[-1] == 1:
        ax.imshow(img[..., 0], cmap="gray", vmin=0, vmax=1)
      else:
        ax.imshow(img)
      ax.set_xticks([])
      ax.set_yticks([])
      if c == 0:
        ax.set_ylabel(name)
  fig.tight_layout()
  io.save_figure(fig, path, dpi=80)
  plt.close(fig)


def _fmt(v) -> str:
  return f"{v:9.3g}" if isinstance(v, float) else f"{v!s:>9}"


def run(config: dict, workdir: str, verbose: bool = True) -> dict:
  """Runs the main job (resumable) and returns the results dict.

  Args:
    config: overrides of :data:`DEFAULT_CONFIG`.
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
  path = os.path.join(workdir, "results.json")
  results = {"config": _jsonable(config), "pixel_space": metrics.PIXEL_SPACE,
             "images": []}
  if os.path.exists(path):
    with open(path) as f:
      old = json.load(f)
    if old.get("config") != results["config"]:
      raise ValueError(
          f"{path} holds results of a different config ({old.get('config')});"
          f" this run's config is {results['config']}. Use another --workdir.")
    results = old

  info = data.get_info(config["dataset"])
  images, labels = data.load(config["dataset"], config["split"],
                             config["data_dir"], max_examples=POOL_SIZE)
  if len(images) < config["num_images"]:
    raise ValueError(f"only {len(images)} images available, asked for "
                     f"{config['num_images']}.")
  model = models.get_model(config["model"], info.image_shape,
                           info.num_classes, init=config["init"])
  attack = attacks.get_attack(config["attack"])
  defense = defenses.get_defense(config["defense"], config["strength"],
                                 model=model)
  overrides = _attack_overrides(attack, config["iterations"])
  keys = key_streams(int(config["seed"]))
  params = model.init(keys["init"])
  order = np.asarray(jax.random.permutation(keys["data"], len(images)))
  chosen = [int(i) for i in order[:config["num_images"]]]

  done = {e["index"]: e for e in results["images"]}
  new = 0
  if verbose:
    print(f"{config['attack']} on {config['model']}/{config['dataset']}, "
          f"defense {config['defense']}({config['strength']:g}); "
          f"metrics in {metrics.PIXEL_SPACE}")
    print(f"{'index':>6} {'label':>5} | {'mse':>9} {'psnr':>9} {'ssim':>9} "
          f"{'div':>5} | {'def mse':>9} {'def psnr':>9} {'def ssim':>9} "
          f"{'div':>5} {'pruned':>6} | {'sec':>5}")
  for idx in chosen:
    x = jnp.asarray(data.to_float(np.asarray(images[idx:idx + 1])))
    y = jnp.asarray(labels[idx:idx + 1], jnp.int32)
    if idx in done:
      entry = done[idx]
    else:
      try:
        und, dfd, xu, xd = attack_image(
            model, params, attack, defense, x, y,
            jax.random.fold_in(keys["attack"], idx),
            jax.random.fold_in(keys["defense"], idx), overrides)
      except (ValueError, FloatingPointError) as e:
        entry = {"index": idx, "label": int(labels[idx]),
                 "error": f"{type(e).__name__}: {e}"}
        xu = xd = None
      else:
        entry = {"index": idx, "label": int(labels[idx]), "undefended": und,
                 "defended": dfd}
      results["images"].append(_jsonable(entry))
      done[idx] = entry
      new += 1
      write_json_atomic(path, results)  # results.json first: the record.
      if xu is not None:
        save_recon(workdir, idx, np.asarray(x[0]), xu, xd)
    if verbose and "error" in entry:
      print(f"{idx:6d} {entry['label']:5d} | {entry['error']}")
    elif verbose:
      u, d = entry["undefended"], entry["defended"]
      print(f"{idx:6d} {entry['label']:5d} | {_fmt(u['mse'])} "
            f"{_fmt(u['psnr'])} {_fmt(u['ssim'])} {u['diverged']!s:>5} | "
            f"{_fmt(d['mse'])} {_fmt(d['psnr'])} {_fmt(d['ssim'])} "
            f"{d['diverged']!s:>5} {d['pruned_fraction_effective']:6.2f} | "
            f"{u['seconds'] + d['seconds']:5.1f}")
  png = os.path.join(workdir, "reconstructions.png")
  finished = [i for i in chosen if i in done]
  if finished and (new or not os.path.exists(png)):
    save_png(png, *zip(*[
        load_recon(workdir, i, data.to_float(np.asarray(images[i])))
        for i in finished]))
  return results


FLAGS = flags.FLAGS


def define_flags() -> None:
  """Defines the absl flags (only when run as a program, so importing this
  module from tests or other experiments defines no flags)."""
  flags.DEFINE_enum("dataset", "cifar10", list(DATASETS), "Dataset.")
  flags.DEFINE_string("model", "lenet", "Model name.")
  flags.DEFINE_string("init", "uniform", "Model init: uniform (DLG) | default.")
  flags.DEFINE_string("attack", "dlg", "Attack name.")
  flags.DEFINE_string("defense", "soteria", "Defense name.")
  flags.DEFINE_float("strength", 60.0, "Defense strength (Soteria: percent).")
  flags.DEFINE_integer("num_images", DEFAULT_CONFIG["num_images"],
                       "Images to attack.")
  flags.DEFINE_integer("seed", 0, "Seed of every key stream.")
  flags.DEFINE_string("workdir", "./runs/attack", "Output folder.")
  flags.DEFINE_string("data_dir", None, "TFDS data dir (else TFDS_DATA_DIR).")
  flags.DEFINE_integer("iterations", None,
                       "Override: DLG outer steps / GS iterations.")


def main(argv):
  io.enable_compilation_cache()
  del argv
  start = time.perf_counter()
  config = {k: getattr(FLAGS, k) for k in
            ("dataset", "model", "init", "attack", "defense", "strength",
             "num_images", "seed", "iterations", "data_dir")}
  run(config, FLAGS.workdir)
  print(f"wrote {FLAGS.workdir}/results.json and reconstructions.png "
        f"in {time.perf_counter() - start:.1f} s")


if __name__ == "__main__":
  define_flags()
  app.run(main)
