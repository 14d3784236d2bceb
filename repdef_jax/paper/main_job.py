"""The main job: attack real images with and without a defense.

For each of ``num_images`` test images (or the user's own, ``images=PATH``)
it attacks the one-image gradient at a fixed random initialisation (by
default DLG's U(-0.5, 0.5) for DLG's LeNet, flax's for the other models:
:func:`resolve_init`) twice, as shared without the defense and after it,
and writes ``results.json`` (schema in ``docs/main_job.md``), one
``recon_<index>.npz`` per image and ``reconstructions.png``; an image whose
true gradient is all zeros or not finite gets an ``error`` entry instead.
Images come from :func:`repdef_jax.data.load` with the embedded sample as
the last resort; ``results.json`` records which source. Resumable: a rerun
with the same config skips finished images; another config or data source
in the same workdir is refused. Metrics are in [0, 1] pixel space
(:mod:`repdef_jax.metrics`).
"""

from __future__ import annotations

import dataclasses
import io
import os
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from repdef_jax import attacks
from repdef_jax import data
from repdef_jax import defenses
from repdef_jax import gradients
from repdef_jax import host
from repdef_jax import metrics
from repdef_jax import models
from repdef_jax import storage
from repdef_jax.attacks import base as attacks_base
from repdef_jax.paper import harness

DATASETS = ("mnist", "cifar10")
# Images are drawn from the first POOL_SIZE test images: all of them are in
# the embedded sample, so a seed picks the same images from a prepared TFDS
# copy and from the sample.
POOL_SIZE = data.SAMPLE_SIZE
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg")
RESULT_FILE = "results.json"
PLOT_FILE = "reconstructions.png"

# DLG's U(-0.5, 0.5) initialisation is right for DLG's LeNet only: on the
# other models it saturates the softmax (ConvNet64's logits ~1e7, LeNet5's
# ~1e2), and the gradient of an image at the label the model predicts is then
# exactly 0 (ConvNet64; tests/test_attack_main.py). 'auto' (the default)
# resolves per model (:func:`resolve_init`).
UNIFORM_INIT_MODELS = ("lenet",)
AUTO_INIT = "auto"

DEFAULT_CONFIG = {
    "dataset": "cifar10",
    "split": "test",
    "model": "lenet",
    "init": AUTO_INIT,
    "attack": "dlg",
    "defense": "soteria",
    "strength": 60.0,
    "num_images": 3,
    "seed": 0,
    "iterations": None,
    # DLG-type attacks: L-BFGS with a backtracking line search. The paper's
    # rule ('torch': torch.optim.LBFGS without line search) fails on one of
    # the three default images undefended (docs/main_job.md).
    "dlg_optimizer": "linesearch",
    "data_dir": None,
    "images": None,
}
# Metrics kept per attack run (the rest of harness.attack_gradient's output
# belongs to the sweeps).
_KEPT = ("mse", "mse_clamped", "psnr", "ssim", "seconds", "diverged",
         "final_loss", "iterations")


def resolve_init(init: str | None, model: str) -> str:
  """The init scheme of ``model``: 'auto' (or None) is 'uniform' (DLG's
  U(-0.5, 0.5)) for DLG's LeNet ('lenet') and 'default' (flax's) otherwise.

  Args:
    init: 'auto', None or one of :data:`repdef_jax.models.INITS`.
    model: a name in :data:`repdef_jax.models.MODEL_NAMES`.

  Returns:
    A name in :data:`repdef_jax.models.INITS`.

  Raises:
    ValueError: any other ``init``.
  """
  if init is None or init == AUTO_INIT:
    return "uniform" if model in UNIFORM_INIT_MODELS else "default"
  if init not in models.INITS:
    raise ValueError(f"init must be one of {AUTO_INIT}, "
                     f"{', '.join(models.INITS)}; got {init!r}.")
  return init


def _attack_fits(attack: str, model: models.Model, ones: Any) -> bool:
  """Whether ``attack``'s gradient view leaves ``model`` an entry to match."""
  try:
    attacks_base.check_view_keeps_entries(
        model, ones, attacks.get_attack(attack).make_config().view)
  except ValueError:
    return False
  return True


def _check_attack_fits_model(config: dict, model: models.Model) -> None:
  """Raises a ValueError when the attack's gradient view drops every
  parameter of the model (``dlg_drop`` / ``gs_drop`` on ``logreg``).

  The check runs on an all-ones gradient: a drop view depends on the model
  alone; a mask view depends on the defended gradient and is checked per
  image by the attack.
  """
  if attacks.get_attack(config["attack"]).make_config().view.is_plain:
    return
  ones = jax.tree_util.tree_map(lambda s: jnp.ones(s.shape, s.dtype),
                                jax.eval_shape(model.init, jax.random.key(0)))
  if not _attack_fits(config["attack"], model, ones):
    fits = [a for a in attacks.ATTACK_NAMES if _attack_fits(a, model, ones)]
    raise ValueError(
        f"attack {config['attack']!r} leaves no gradient entry of model "
        f"{config['model']!r} to match (its view drops the defended layer, "
        f"the model's only one); valid attacks for this model: "
        f"{', '.join(fits)}.")


def validate_config(config: Any) -> dict:
  """Fills defaults and checks names and the defense; loads no data.

  Args:
    config: a dict or ConfigDict of overrides of :data:`DEFAULT_CONFIG`.

  Returns:
    The complete config as a dict; ``init`` resolved (:func:`resolve_init`).

  Raises:
    ValueError: unknown keys or names (lists the valid ones), counts < 1, a
      defense strength the defense rejects (e.g. Soteria's percent), or an
      attack whose gradient view leaves the model nothing to match.
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
  config["init"] = resolve_init(config["init"], config["model"])
  # A bad strength is reported before a missing data directory: its check
  # and the build of the model and defense need no data.
  defenses.check_strength(config["defense"], config["strength"])
  model, _ = _build(config)
  _check_attack_fits_model(config, model)
  if int(config["num_images"]) < 1:
    raise ValueError("num_images must be >= 1.")
  if config["iterations"] is not None and int(config["iterations"]) < 1:
    raise ValueError("iterations must be >= 1.")
  if config["dlg_optimizer"] not in attacks.DLG_OPTIMIZERS:
    raise ValueError(f"dlg_optimizer must be one of "
                     f"{', '.join(attacks.DLG_OPTIMIZERS)}; got "
                     f"{config['dlg_optimizer']!r}.")
  config["strength"] = float(config["strength"])
  config["data_dir"] = config["data_dir"] or None
  config["images"] = config["images"] or None
  if config["images"] is not None and not os.path.exists(config["images"]):
    raise ValueError(f"images={config['images']!r} does not exist; pass a "
                     "folder of PNG/JPEG files or an .npz with 'x' (and "
                     "optionally 'y').")
  return config


def _build(config: dict) -> tuple[models.Model, defenses.Defense]:
  info = data.get_info(config["dataset"])
  model = models.get_model(config["model"], info.image_shape,
                           info.num_classes, init=config["init"])
  return model, defenses.get_defense(config["defense"], config["strength"],
                                     model=model)


def progress_every(attack: str, iterations: int | None,
                   lines: int = 4) -> int:
  """Attack iterations between progress lines: ``lines`` per run, 0 when
  ``$REPDEF_JAX_QUIET`` is set or the attack reports no progress."""
  attack_ = attacks.get_attack(attack)
  config = {f.name: f.default for f in dataclasses.fields(attack_.config_cls)}
  if ("progress_every" not in config or
      os.environ.get(data.QUIET_ENV, "") not in ("", "0")):
    return 0
  config.update(harness.attack_overrides(attack_, iterations))
  total = (config["outer_steps"] * config["inner_steps"]
           if "outer_steps" in config else config["iterations"])
  return max(1, total // lines)


def attack_image(model: models.Model, params: Any, attack: str,
                 defense: defenses.Defense, x: jax.Array, y: jax.Array,
                 key_attack: jax.Array, key_defense: jax.Array,
                 iterations: int | None, every: int = 0,
                 dlg_optimizer: str = DEFAULT_CONFIG["dlg_optimizer"]
                 ) -> tuple[dict, dict, np.ndarray, np.ndarray]:
  """Attacks one image's gradient without and with the defense.

  Both runs start from the same dummy (same ``key_attack``); with
  ``every > 0`` each prints a progress line every ``every`` iterations
  (:mod:`repdef_jax.attacks.progress`); a DLG-type attack runs
  ``dlg_optimizer`` (:data:`repdef_jax.attacks.DLG_OPTIMIZERS`).

  Returns:
    ``(undefended, defended, x_undefended, x_defended)``: metric dicts and
    reconstructions ``[H, W, C]``.

  Raises:
    ValueError: the image's true gradient is all zeros or not finite
      (:func:`true_gradient_problem`); nothing is attacked.
  """
  grads, shared, info = harness.defend(model, params, defense, x, y,
                                       key_defense)
  problem = true_gradient_problem(grads)
  if problem:
    raise ValueError(problem)
  overrides = {"progress_every": every} if every else {}
  if attacks.get_attack(attack).config_cls is attacks.DLGConfig:
    overrides["optimizer"] = dlg_optimizer
  out, recs = [], []
  for g in (grads, shared):
    m, x_rec = harness.attack_gradient(
        model, params, g, x, y, attack, key_attack, iterations=iterations,
        overrides=overrides)
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


def true_gradient_problem(grads: Any) -> str | None:
  """Why an image's true gradient leaves nothing to attack, or None.

  An all-zero gradient (a softmax saturated at the image's label, e.g. DLG's
  uniform init on a model other than 'lenet') or a non-finite one would
  give a meaningless row; the main job records an error entry instead.
  """
  try:
    gradients.check_finite(grads, "the image's true gradient")
  except ValueError as error:
    return f"{error} Nothing to attack (an overflow in the model)."
  if not any(np.any(np.asarray(g) != 0)
             for g in jax.tree_util.tree_leaves(grads)):
    return ("the image's true gradient is all zeros (the softmax is "
            "saturated at the image's label, e.g. init 'uniform' on a model "
            "other than 'lenet'); nothing to attack.")
  return None


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


def load_own_images(path: str, image_shape: tuple[int, int, int]
                    ) -> tuple[np.ndarray, np.ndarray | None, list[str]]:
  """The user's images, fitted to the model's input.

  ``path`` is a folder of PNG/JPEG files (sorted by name), one such file,
  or an ``.npz`` holding ``x`` (``[N, h, w]`` or ``[N, h, w, c]``, uint8 or
  floats in [0, 1]) and optionally integer labels ``y``. An image that is not
  already ``image_shape`` is centre-cropped to a square (its shorter side),
  resized with Pillow (area averaging, ``BOX``, when shrinking; ``BILINEAR``
  when enlarging) and converted to grayscale (Pillow's ``L``: ITU-R 601-2
  luma) for a 1-channel model or RGB for a 3-channel one. 16-bit grayscale
  files are scaled to 8 bits first (Pillow's conversion would saturate them).

  Returns:
    ``(x float32 [N, H, W, C] in [0, 1], y int32 [N] or None, names)``;
    names are file names, or ``x[i]`` for an ``.npz``.

  Raises:
    ValueError: no images, an unreadable file, or bad ``x`` / ``y``.
  """
  from PIL import Image  # pylint: disable=g-import-not-at-top

  labels = None
  if os.path.isdir(path) or path.lower().endswith(IMAGE_SUFFIXES):
    if os.path.isdir(path):
      folder = path
      names = sorted(f for f in os.listdir(path)
                     if f.lower().endswith(IMAGE_SUFFIXES))
    else:
      folder, names = os.path.dirname(path), [os.path.basename(path)]
    if not names:
      raise ValueError(f"images={path!r} holds no {'/'.join(IMAGE_SUFFIXES)} "
                       "files.")
    raw = []
    for name in names:
      try:
        with Image.open(os.path.join(folder, name)) as img:
          img.load()
          raw.append(_eight_bit(img.copy(), path, name))
      except OSError as error:
        raise ValueError(f"images={path!r}: cannot read {name} "
                         f"({error}).") from None
  else:
    try:
      with np.load(path, allow_pickle=False) as z:
        x = np.asarray(z["x"])
        labels = np.asarray(z["y"]) if "y" in z.files else None
    except (OSError, ValueError, KeyError) as error:
      raise ValueError(f"images={path!r} must be a folder or file of "
                       "PNG/JPEG images or an .npz holding 'x' (optionally "
                       f"'y'): {error}") from None
    if x.ndim == 3:
      x = x[..., None]
    if (x.ndim != 4 or min(x.shape[:3]) < 1 or x.shape[-1] not in (1, 3, 4)
        or not (x.dtype == np.uint8 or np.issubdtype(x.dtype, np.floating))):
      raise ValueError(f"images={path!r}: x must be uint8 or float images "
                       f"[N, h, w(, 1|3|4)], got {x.dtype}{list(x.shape)}.")
    if x.dtype != np.uint8:
      if not np.all(np.isfinite(x)) or x.min() < 0 or x.max() > 1:
        raise ValueError(f"images={path!r}: float x must lie in [0, 1].")
      x = np.round(x * 255).astype(np.uint8)
    names = [f"x[{i}]" for i in range(len(x))]
    raw = [Image.fromarray(a[..., 0] if a.shape[-1] == 1 else a) for a in x]
    if labels is not None and (labels.shape != (len(x),) or
                               not np.issubdtype(labels.dtype, np.integer)):
      raise ValueError(f"images={path!r}: y must be {len(x)} integer labels, "
                       f"got {labels.dtype}{list(labels.shape)}.")
  h, w, c = image_shape
  out = np.empty((len(raw), h, w, c), np.float32)
  for i, img in enumerate(raw):
    if min(img.size) < 1:
      raise ValueError(f"images={path!r}: {names[i]} has no pixels "
                       f"({img.size[0]}x{img.size[1]}).")
    img = img.convert("L" if c == 1 else "RGB")
    if img.size != (w, h):
      side = min(img.size)
      left, top = (img.size[0] - side) // 2, (img.size[1] - side) // 2
      img = img.crop((left, top, left + side, top + side))
      img = img.resize((w, h), Image.Resampling.BOX if side >= max(h, w)
                       else Image.Resampling.BILINEAR)
    out[i] = np.asarray(img, np.float32).reshape(h, w, c) / 255.0
  return out, None if labels is None else labels.astype(np.int32), names


def _eight_bit(img: Any, path: str, name: str) -> Any:
  """``img`` with 8-bit channels: 16-bit grayscale (Pillow's 'I;16', or 'I'
  with values in [0, 65535], as older Pillows read such PNGs) scaled by
  1/257 and rounded; other integer or float pixels refused."""
  from PIL import Image  # pylint: disable=g-import-not-at-top

  if not (img.mode.startswith("I") or img.mode == "F"):
    return img
  a = np.asarray(img, np.float64)
  if img.mode == "F" or a.min() < 0 or a.max() > 65535:
    raise ValueError(f"images={path!r}: {name} has {img.mode!r} pixels "
                     f"outside 16 bits ({a.min():g} to {a.max():g}); save "
                     "it as an 8- or 16-bit PNG or a JPEG.")
  return Image.fromarray(np.round(a / 257).astype(np.uint8))


def table_header(config: dict) -> list[str]:
  """The two header lines of the main job's table."""
  return [f"{config['attack']} on {config['model']}/{config['dataset']}, "
          f"defense {config['defense']}({config['strength']:g}); metrics in "
          f"{metrics.PIXEL_SPACE}",
          f"{'index':>6} {'label':>5} | {'mse':>9} {'psnr':>9} {'ssim':>9} "
          f"{'div':>5} | {'def mse':>9} {'def psnr':>9} {'def ssim':>9} "
          f"{'div':>5} {'pruned':>6} | {'sec':>5} {'eta':>5}"]


def table_row(entry: dict, eta: str = "") -> str:
  """One image's line of the table (``results.json`` entry)."""
  head = f"{entry['index']:6d} {entry['label']:5d} |"
  tail = f" {entry['file']}" if "file" in entry else ""
  if "error" in entry:
    return f"{head} {entry['error']}{tail}"
  u, d = entry["undefended"], entry["defended"]
  return (f"{head} {_fmt(u['mse'])} {_fmt(u['psnr'])} {_fmt(u['ssim'])} "
          f"{u['diverged']!s:>5} | {_fmt(d['mse'])} {_fmt(d['psnr'])} "
          f"{_fmt(d['ssim'])} {d['diverged']!s:>5} "
          f"{d['pruned_fraction_effective']:6.2f} | "
          f"{u['seconds'] + d['seconds']:5.1f} {eta:>5}{tail}").rstrip()


README_BEGIN = "<!-- main-job:begin (generated by repdef_jax.paper.main_job) -->"
README_END = "<!-- main-job:end -->"


def computed_on(results: dict) -> str:
  """Where the images of ``results`` were attacked: each distinct
  ``host`` record as 'CPU, N cores, backend', or 'not recorded' for
  entries written before the record existed."""
  hosts = []
  for e in results["images"]:
    h = e.get("host")
    text = (f"{h['cpu']}, {h['cores']} cores, {h['backend']}" if h else
            "not recorded")
    if text not in hosts:
      hosts.append(text)
  return "; ".join(hosts)


def readme_block(results: dict) -> str:
  """The README's example output: the table of a committed ``results.json``
  (its data line and the ETA column are not stored, so they are left out),
  then where it was computed."""
  lines = table_header(results["config"]) + [
      table_row(e) for e in results["images"]]
  return "\n".join([README_BEGIN, "```", *lines, "```",
                    f"Computed on: {computed_on(results)}.", README_END])


def _images(config: dict, model: models.Model, params: Any,
            keys: harness.SweepKeys) -> tuple[np.ndarray, np.ndarray,
                                              list[int], str, str, dict]:
  """``(x [N, H, W, C] in [0, 1], labels, chosen indices, source kind,
  one-line description, extra fields per index)``."""
  if config["images"] is not None:
    x, labels, names = load_own_images(config["images"], model.input_shape)
    given = labels is not None
    if not given:  # The class the model predicts: the label a client uses.
      labels = np.asarray(jnp.argmax(model.apply(params, jnp.asarray(x)),
                                     axis=-1), np.int32)
    elif labels.min() < 0 or labels.max() >= model.num_classes:
      raise ValueError(f"images={config['images']!r}: labels must lie in "
                       f"[0, {model.num_classes}).")
    chosen = list(range(min(config["num_images"], len(x))))
    extra = {i: {"file": names[i],
                 "label_source": "given" if given else "predicted"}
             for i in chosen}
    line = (f"{len(chosen)} of {len(x)} own images from {config['images']} "
            f"(centre crop, Pillow resize to {model.input_shape}; labels "
            f"{'given' if given else 'predicted by the model'})")
    return x, labels, chosen, "images", line, extra
  images, labels, source = data.load_with_source(
      config["dataset"], config["split"], config["data_dir"],
      max_examples=POOL_SIZE, sample=config["data_dir"] is None)
  if len(images) < config["num_images"]:
    raise ValueError(f"only {len(images)} images available, asked for "
                     f"{config['num_images']}.")
  order = np.asarray(jax.random.permutation(keys.data, len(images)))
  chosen = [int(i) for i in order[:config["num_images"]]]
  return (data.to_float(np.asarray(images)), np.asarray(labels, np.int32),
          chosen, source.kind, source.detail, {})


def run(config: Any, workdir: str, verbose: bool = True) -> dict:
  """Runs the main job (resumable) and returns the results dict.

  Args:
    config: overrides of :data:`DEFAULT_CONFIG` (dict or ConfigDict).
    workdir: output folder (created).
    verbose: print the data source, the table and an ETA.

  Returns:
    The results dict as written to ``results.json``.

  Raises:
    ValueError: bad config (lists valid names), bad own images, or a workdir
      holding results of a different config or data source. An image whose
      attack raises ValueError or FloatingPointError, or whose true
      gradient is all zeros or not finite, is recorded as an ``error``
      entry instead.
    repdef_jax.data.DataNotFoundError: no data at all (not even the
      embedded sample, e.g. a broken installation).
  """
  config = validate_config(config)
  model, defense = _build(config)
  keys = harness.sweep_keys(config["seed"])
  params = model.init(keys.init)
  x_all, labels, chosen, kind, line, extra = _images(config, model, params,
                                                     keys)
  if verbose:
    print(f"data: {line}", flush=True)

  os.makedirs(workdir, exist_ok=True)
  path = os.path.join(workdir, RESULT_FILE)
  results = {"config": harness.jsonable(config), "data_source": kind,
             "key_scheme": harness.KEY_SCHEME,
             "pixel_space": metrics.PIXEL_SPACE, "images": []}
  old = storage.read_json(path)
  if old is not None:
    for field in ("config", "data_source", "key_scheme"):
      if old.get(field) != results[field]:
        raise ValueError(
            f"{path} holds results of a different {field} "
            f"({old.get(field)}); this run's is {results[field]}. Use another"
            " --workdir.")
    results = old

  done = {e["index"]: e for e in results["images"]}
  every = progress_every(config["attack"], config["iterations"]) if (
      verbose) else 0
  durations = []  # Of images computed now; the first includes compilation.
  if verbose:
    print("\n".join(table_header(config)), flush=True)
  for n, idx in enumerate(chosen):
    x = jnp.asarray(x_all[idx:idx + 1])
    y = jnp.asarray(labels[idx:idx + 1], jnp.int32)
    if idx not in done:
      recs = None
      start = time.perf_counter()
      entry = {"index": idx, "label": int(labels[idx]), **extra.get(idx, {})}
      try:
        und, dfd, *recs = attack_image(
            model, params, config["attack"], defense, x, y,
            *harness.image_keys(keys, idx), config["iterations"],
            every, config["dlg_optimizer"])
        entry.update(undefended=und, defended=dfd)
      except (ValueError, FloatingPointError) as e:
        entry["error"] = f"{type(e).__name__}: {e}"
      entry["host"] = host.describe()
      # The reconstruction first, then the record that marks the image
      # done: a kill in between recomputes the image, losing nothing.
      if recs:
        _save_recon(workdir, idx, np.asarray(x[0]), *recs)
      results["images"].append(harness.jsonable(entry))
      done[idx] = results["images"][-1]
      storage.write_json(path, results)
      durations.append(time.perf_counter() - start)
    if verbose:
      per_image = np.mean(durations[1:] or durations) if durations else 0.0
      eta = "" if data.quiet() else (
          f"{per_image * (len(chosen) - n - 1):.0f}s")
      print(table_row(done[idx], eta), flush=True)
  png = os.path.join(workdir, PLOT_FILE)
  finished = [i for i in chosen if i in done]
  if finished and (durations or not os.path.exists(png)):
    columns = [_load_recon(workdir, i, x_all[i]) for i in finished]
    harness.save_image_grid(png, [list(r) for r in zip(*columns)],
                            ["original", "undefended", "defended"])
  return results
