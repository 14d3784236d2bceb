"""The harness every paper experiment shares: keys, attack runs, cells, images.

Host-side glue over the jitted library (attacks, defenses, metrics): named key
streams, one defend-then-attack step, resumable result cells, progress lines
and image loading. The loops here run over sweep cells and images, never
inside a computation.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import numbers
import os
import re
import sys
import time
from typing import Any, Callable, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from repdef_jax import attacks as attacks_lib
from repdef_jax import data as data_lib
from repdef_jax import defenses as defenses_lib
from repdef_jax import fedavg
from repdef_jax import gradients
from repdef_jax import host
from repdef_jax import metrics as metrics_lib
from repdef_jax import models as models_lib
from repdef_jax import storage
from repdef_jax import training
from repdef_jax.attacks import base as attacks_base
from repdef_jax.attacks import inverting
from repdef_jax.attacks import objectives

Params = Any


# --------------------------------------------------------------------------
# Randomness: one seed, named streams.


class SweepKeys(NamedTuple):
  """The named PRNG streams of an experiment (big_vision style).

  Attributes:
    init: model initialisation; the federated run's own init stream
      (:func:`repdef_jax.fedavg.key_streams`), so the attacked round-0 model
      is the one FedAvg starts from.
    data: which test images are drawn.
    attack: attack randomness (dummy images); fold in the image index.
    defense: defense randomness (noise); fold in the image index.
    update: the real-update attacks (which client, which dummies); fold in
      the round (:func:`update_keys`).
  """

  init: jax.Array
  data: jax.Array
  attack: jax.Array
  defense: jax.Array
  update: jax.Array


# The sweep's own streams are fold_in(root, FIRST_SWEEP_STREAM + i): past
# FedAvg's 0 .. len(STREAMS) - 1 and the Flower auditor's len(STREAMS). (A
# split of the root would reuse them: with JAX's partitionable threefry,
# split(key, n)[i] == fold_in(key, i).)
FIRST_SWEEP_STREAM = len(fedavg.STREAMS) + 1

# Recorded in the settings of every cell that draws from these streams, so a
# cell drawn by an older scheme is refused, never mixed in. 2: the streams
# above (1: split(root, 3), which were FedAvg's init, sampling and train
# streams, and the real-update attacks keyed on the image stream).
KEY_SCHEME = 2


def sweep_keys(seed: int) -> SweepKeys:
  """Splits ``seed`` into :class:`SweepKeys` (init shared with FedAvg, the
  others disjoint from FedAvg's and the Flower auditor's streams)."""
  root = jax.random.key(int(seed))
  return SweepKeys(fedavg.key_streams(seed).init,
                   *(jax.random.fold_in(root, FIRST_SWEEP_STREAM + i)
                     for i in range(len(SweepKeys._fields) - 1)))


def image_keys(keys: SweepKeys, index: int) -> tuple[jax.Array, jax.Array]:
  """The (attack, defense) keys of image ``index``: the same for every
  defense, so all attacks on one image start from the same dummy."""
  return (jax.random.fold_in(keys.attack, index),
          jax.random.fold_in(keys.defense, index))


def update_keys(keys: SweepKeys, rounds: int) -> tuple[jax.Array, jax.Array]:
  """The (client, attack) keys of the real-update attack at round
  ``rounds``: which client is attacked, and its attacks' dummies."""
  stage = jax.random.fold_in(keys.update, rounds)
  return jax.random.fold_in(stage, 0), jax.random.fold_in(stage, 1)


def jsonable(v: Any) -> Any:
  """``v`` with NumPy scalars as Python numbers and non-finite floats as
  the strings 'inf' / '-inf' / 'nan' (portable JSON)."""
  if isinstance(v, dict):
    return {k: jsonable(x) for k, x in v.items()}
  if isinstance(v, (list, tuple)):
    return [jsonable(x) for x in v]
  if isinstance(v, np.bool_):
    return bool(v)
  if isinstance(v, np.integer):
    return int(v)
  if isinstance(v, (np.floating, float)):
    return finite_or_str(v)
  return v


# --------------------------------------------------------------------------
# Attacks on shared gradients.


def attack_overrides(attack: attacks_lib.Attack,
                     iterations: int | None = None,
                     restarts: int | None = None) -> dict[str, int]:
  """Config overrides that shorten an attack.

  Args:
    attack: a registered attack.
    iterations: DLG-type: outer L-BFGS steps (each up to ``inner_steps``
      iterations); GS-type: Adam iterations. None keeps the default.
    restarts: GS-type only: parallel restarts. None keeps the default.

  Returns:
    Keyword overrides for ``attack(...)``.
  """
  out = {}
  if attack.config_cls is attacks_lib.DLGConfig:
    if iterations:
      out["outer_steps"] = int(iterations)
  else:
    if iterations:
      out["iterations"] = int(iterations)
    if restarts:
      out["restarts"] = int(restarts)
  return out


def finite_or_str(v: float) -> float | str:
  """``float(v)``, or its string when not finite (JSON has no inf/nan)."""
  v = float(v)
  return v if math.isfinite(v) else str(v)


def attack_gradient(model: models_lib.Model, params: Params, shared: Params,
                    x_true: Any, labels: Any, attack_name: str,
                    key: jax.Array, *, iterations: int | None = None,
                    restarts: int | None = None,
                    give_labels: bool = False,
                    overrides: dict | None = None
                    ) -> tuple[dict, np.ndarray]:
  """Runs one attack on a shared gradient and measures the reconstruction.

  Args:
    model: the attacked model.
    params: the parameters the gradient was computed at.
    shared: the (possibly defended) gradient the server received.
    x_true: the client's images ``[B, H, W, C]`` in [0, 1] (the model's input
      space), used only to score the reconstruction.
    labels: the true labels ``[B]`` (scored; passed to the attack only when
      ``give_labels``).
    attack_name: a name in :data:`repdef_jax.attacks.ATTACK_NAMES`.
    key: the attack's PRNG key.
    iterations: see :func:`attack_overrides`.
    restarts: see :func:`attack_overrides`.
    give_labels: hand the true labels to the attack (else it learns or
      infers them, as registered).
    overrides: further attack config fields (e.g. ``{'restarts': 4}``);
      ``iterations`` / ``restarts`` take precedence.

  Returns:
    ``(metrics, x_rec)``: metrics with ``mse`` (raw, unclamped, [0,1]
    space), ``mse_clamped``, ``psnr``, ``ssim``, ``finite``, ``diverged``,
    ``label_accuracy``, ``final_loss``, ``iterations``, ``seconds``,
    ``pixel_space`` and ``input_distance`` (mean ``||X - X'||_2`` per image
    after Hungarian matching); ``x_rec`` matched to ``x_true``'s order.
  """
  attack = attacks_lib.get_attack(attack_name)
  x_true = metrics_lib.as_images(x_true, "x_true").astype(np.float32)
  labels = np.asarray(labels, np.int32)
  start = time.perf_counter()
  res = attacks_lib.to_host(attack(
      model, params, shared, x_true.shape[0], key,
      labels=jnp.asarray(labels) if give_labels else None,
      **{**(overrides or {}),
         **attack_overrides(attack, iterations, restarts)}))
  return measure(res, x_true, labels, time.perf_counter() - start)


def measure(res: attacks_lib.AttackResult, x_true: Any, labels: Any,
            seconds: float) -> tuple[dict, np.ndarray]:
  """The metrics of one attack's (host) result; see :func:`attack_gradient`.

  Args:
    res: an attack's result on the host (one attack, no batch axis).
    x_true: the client's images ``[B, H, W, C]`` in [0, 1].
    labels: their labels ``[B]``.
    seconds: the attack's wall time.

  Returns:
    ``(metrics, x_rec)`` as :func:`attack_gradient`.
  """
  x_true = metrics_lib.as_images(x_true, "x_true").astype(np.float32)
  m = metrics_lib.reconstruction_metrics(res.x_rec, x_true)
  x_rec = metrics_lib.as_images(res.x_rec, "x_rec")[m["perm"]]
  with np.errstate(over="ignore", invalid="ignore"):
    dist = np.sqrt(np.sum((x_rec.astype(np.float64) - x_true) ** 2,
                          axis=(1, 2, 3)))
  out = {
      "mse": finite_or_str(m["mse"]),
      "mse_clamped": m["mse_clamped"],
      "psnr": finite_or_str(m["psnr"]),
      "ssim": m["ssim"],
      "finite": m["finite"],
      "diverged": bool(res.diverged or not m["finite"]),
      "label_accuracy": metrics_lib.label_accuracy(
          np.asarray(res.labels_rec)[m["perm"]], np.asarray(labels)),
      "final_loss": finite_or_str(res.final_loss),
      "iterations": int(res.iterations),
      "seconds": seconds,
      "input_distance": finite_or_str(np.mean(dist)),
      "pixel_space": m["pixel_space"],
  }
  return out, x_rec


def family(attack_name: str) -> str:
  """'dlg' for DLG-type attacks (dlg, idlg, dlg_*), 'gs' for GS-type."""
  return "gs" if attack_name.startswith("gs") else "dlg"


def attack_suite(model: models_lib.Model, params: Params, shared: Params,
                 x_true: Any, labels: Any, attack_names: Sequence[str],
                 key: jax.Array, *, budgets: dict[str, dict] | None = None,
                 give_labels: bool = True) -> dict[str, Any]:
  """Every attack of a suite on one shared gradient, and the best of them.

  All attacks start from the same key. A ``*_mask`` attack whose shared
  defended kernel has no all-zero row has exactly the plain attack's
  objective (its mask is all ones), so it is not rerun: its entry copies the
  plain attack's metrics with ``same_as``.

  Args:
    model: the attacked model.
    params: the parameters the gradient was computed at.
    shared: the gradient (or update, rescaled) the server received.
    x_true: the client's images ``[B, H, W, C]`` in [0, 1] (scoring only).
    labels: their labels ``[B]``.
    attack_names: registered attack names.
    key: the attacks' key.
    budgets: per family ('dlg', 'gs') attack config overrides.
    give_labels: hand the true labels to the attacks (iDLG infers its own).

  Returns:
    ``{'attacks': {name: metrics}, 'best': {...}}``: per-attack metrics of
    :func:`attack_gradient` (without reconstructions) and, over the attacks
    that did not diverge, the best ``ssim`` (max), ``mse_clamped`` (min),
    ``mse`` (min) and ``psnr`` (max) with the attack that reached each;
    ``best`` is ``{'all_diverged': True}`` when every attack diverged.
  """
  out = {}
  any_pruned = bool(np.any(np.asarray(objectives.pruned_rows(model, shared))))
  masked_last = sorted(attack_names, key=lambda n: n.endswith("_mask"))
  for name in masked_last:
    plain = name[:-len("_mask")] if name.endswith("_mask") else None
    if plain and not any_pruned and plain in out:
      out[name] = {**out[plain], "same_as": plain}
      continue
    m, _ = attack_gradient(model, params, shared, x_true, labels, name, key,
                           give_labels=give_labels and name != "idlg",
                           overrides=(budgets or {}).get(family(name)))
    out[name] = m
  out = {name: out[name] for name in attack_names}
  return {"attacks": out, "best": best_of(out)}


def best_of(per_attack: dict[str, dict]) -> dict[str, Any]:
  """The strongest result over attacks that did not diverge (see
  :func:`attack_suite`)."""
  ok = {n: m for n, m in per_attack.items() if not m["diverged"]}
  if not ok:
    return {"all_diverged": True}
  best = {"all_diverged": False}
  for metric, pick in (("ssim", max), ("mse_clamped", min), ("mse", min),
                       ("psnr", max)):
    name = pick(ok, key=lambda n: float(ok[n][metric]))
    best[metric] = float(ok[name][metric])
    best[f"{metric}_attack"] = name
  return best


def defend(model: models_lib.Model, params: Params,
           defense: defenses_lib.Defense, x: Any, y: Any,
           key: jax.Array) -> tuple[Params, Params, dict[str, float]]:
  """A client's batch gradient and what it shares after the defense.

  Args:
    model: the model.
    params: the parameters the client computes its gradient at.
    defense: the defense applied to the gradient before it is shared.
    x: the client's images ``[B, H, W, C]`` in [0, 1].
    y: labels ``[B]``.
    key: the defense's key.

  Returns:
    ``(grads, shared, info)``: the true gradient, the defended one and the
    defense's diagnostics as floats.
  """
  x = jnp.asarray(x, jnp.float32)
  y = jnp.asarray(y, jnp.int32)
  grads = gradients.batch_grad(model, params, x, y)
  shared, info = defense(grads, defenses_lib.ClientBatch(params, x, y), key)
  return grads, shared, {k: float(v) for k, v in info.items()}


def defend_and_attack(model: models_lib.Model, params: Params,
                      defense: defenses_lib.Defense, x: Any, y: Any,
                      attack_name: str, key_attack: jax.Array,
                      key_defense: jax.Array, **attack_kwargs
                      ) -> tuple[dict, np.ndarray, Params]:
  """:func:`defend`, then :func:`attack_gradient` on what is shared.

  Use the same ``key_attack`` across defenses so that every attack starts
  from the same dummy.

  Returns:
    ``(metrics, x_rec, shared)``; metrics also hold the defense's info
    (prefixed ``defense/``).
  """
  _, shared, info = defend(model, params, defense, x, y, key_defense)
  m, x_rec = attack_gradient(model, params, shared, x, y, attack_name,
                             key_attack, **attack_kwargs)
  for k, v in info.items():
    m[f"defense/{k}"] = v
  return m, x_rec, shared


# --------------------------------------------------------------------------
# Config checks every paper part shares.


def check_count(value: Any, name: str, low: int, note: str = "") -> None:
  """Raises a ValueError unless ``value`` is an int >= ``low`` (not a bool);
  ``note`` says what a boundary value means, e.g. '0: every setting'."""
  if (isinstance(value, bool) or not isinstance(value, numbers.Integral)
      or value < low):
    raise ValueError(f"{name} must be an int >= {low}"
                     f"{f' ({note})' if note else ''}, got {value!r}.")


def check_part_config(config: Any) -> None:
  """Checks the settings the paper's parts share, before any work.

  ``seeds``: a non-empty sequence of distinct integers (a repeated seed
  would count as two in every interval). When the config has them:
  ``num_images`` an integer >= 1, ``image_pool`` >= ``num_images``; attack
  names (``attacks``, each panel's
  ``attacks`` or ``family``, ``update_attack.attacks``) registered in
  :mod:`repdef_jax.attacks`; defense strengths (``defenses`` and
  ``update_attack.cells``: defense -> strengths; ``settings``: (defense,
  strength) pairs; ``rates`` and ``variants``: Soteria percents) valid;
  attack budgets' step counts (``attack_budgets``, each panel's and
  ``update_attack.budgets``) integers >= 1 and GS's ``normalization``
  a (mean, std) pair with stds > 0; SSIM levels (``threshold``,
  ``thresholds``, ``success_ssim``) in (-1, 1]; ``accuracy_window``,
  ``update_attack.batch`` and ``update_attack.local_steps`` integers >= 1,
  ``update_attack.stages`` among :data:`UPDATE_STAGES`.

  Args:
    config: a part's ConfigDict (visual, adaptive, certified, repinfer,
      tradeoff).

  Raises:
    ValueError: one line naming the setting and the accepted values.
  """
  seeds = tuple(config.seeds) if isinstance(
      config.get("seeds"), (tuple, list)) else None
  if not seeds or not all(isinstance(s, numbers.Integral) and
                          not isinstance(s, bool) for s in seeds) or len(
                              set(seeds)) != len(seeds):
    raise ValueError(f"seeds must be a non-empty sequence of distinct "
                     f"integers, e.g. (0, 1, 2); got {config.get('seeds')!r}.")
  if "num_images" in config:
    attacks_base.check_num_images(config.num_images)
  if "image_pool" in config:
    check_count(config.image_pool, "image_pool", int(config.get(
        "num_images", 1)), "the first test images the attacked ones are "
                "drawn from, at least num_images")
  named = [("attacks", a) for a in config.get("attacks", ())]
  for name, panel in (config.get("panels") or {}).items():
    named += [(f"panels.{name}.attacks", a) for a in panel.get("attacks", ())]
    if "family" in panel:
      named.append((f"panels.{name}.family", panel.family))
  update = config.get("update_attack") or {}
  named += [("update_attack.attacks", a) for a in update.get("attacks", ())]
  for where, attack in named:
    if attack not in attacks_lib.ATTACK_NAMES:
      raise ValueError(f"{where}: unknown attack {attack!r}; valid names: "
                       f"{', '.join(attacks_lib.ATTACK_NAMES)}.")
  for key, table in (("defenses", config.get("defenses")),
                     ("update_attack.cells", update.get("cells"))):
    if hasattr(table, "items"):  # convergence's 'defenses' is a list
      for name, strengths in table.items():
        for s in strengths:
          defenses_lib.check_strength(name, s, key)
  for name, strength in config.get("settings", ()):
    defenses_lib.check_strength(name, strength, "settings")
  rates = [("rates", r) for r in config.get("rates", ())]
  for variant, values in (config.get("variants") or {}).items():
    rates += [(f"variants.{variant}", r) for r in values]
  for where, rate in rates:
    defenses_lib.check_strength("soteria", rate, where)
  levels = [(k, config[k]) for k in ("threshold", "success_ssim")
            if k in config]
  levels += [("thresholds", t) for t in config.get("thresholds", ())]
  for where, level in levels:
    if (isinstance(level, bool) or not isinstance(level, numbers.Real)
        or not -1 < level <= 1):
      raise ValueError(f"{where} must be an SSIM level in (-1, 1]; got "
                       f"{level!r}.")
  if "accuracy_window" in config:
    check_count(config.accuracy_window, "accuracy_window", 1,
                "the last evaluations averaged")
  for key in ("batch", "local_steps"):
    if key in update:
      check_count(update[key], f"update_attack.{key}", 1)
  for stage in update.get("stages", ()):
    if stage not in UPDATE_STAGES:
      raise ValueError(f"update_attack.stages must be among "
                       f"{', '.join(UPDATE_STAGES)}; got {stage!r}.")
  tables = [("attack_budgets", config.get("attack_budgets")),
            ("update_attack.budgets", update.get("budgets"))]
  tables += [(f"panels.{name}.attack_budgets", panel.get("attack_budgets"))
             for name, panel in (config.get("panels") or {}).items()]
  for where, table in tables:
    for family, budget in (table or {}).items():
      for key in _COUNTED_BUDGETS:
        value = (budget or {}).get(key)
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, numbers.Integral)
            or value < 1):
          raise ValueError(f"{where}.{family}.{key} must be an integer >= 1;"
                           f" got {value!r}.")
      if (budget or {}).get("normalization") is not None:
        if family != "gs":
          raise ValueError(f"{where}.{family}.normalization: only GS takes "
                           "a normalization (the 'gs' budget).")
        try:
          inverting.check_normalization(budget["normalization"])
        except ValueError as error:
          raise ValueError(f"{where}.{family}: {error}") from None


# When a client's real update is attacked: at round 0, mid-training, after
# the last round.
UPDATE_STAGES = ("first", "mid", "final")


# Attack budget entries that count steps (an attack of 0 steps reconstructs
# nothing and would be recorded as a failed attack).
_COUNTED_BUDGETS = ("outer_steps", "inner_steps", "iterations", "restarts")


# --------------------------------------------------------------------------
# Resumable cells and progress.


def cell_name(*parts: Any) -> str:
  """A file-system-safe cell name from its coordinates, e.g. 'soteria_60'."""
  text = "_".join(f"{p:g}" if isinstance(p, float) else str(p) for p in parts)
  return re.sub(r"[^A-Za-z0-9_.+-]+", "-", text)


def merge_budgets(base: dict[str, dict], own: dict[str, dict] | None
                  ) -> dict[str, dict]:
  """Per-family attack budgets (``{'dlg': {...}, 'gs': {...}}``): ``base``
  with each family's entries updated by ``own``'s."""
  out = {family: dict(b) for family, b in base.items()}
  for family, b in (own or {}).items():
    out[family] = {**out.get(family, {}), **b}
  return out


# Settings that change no result wherever they sit in a config (progress
# lines, plots, how often checkpoints are written and how many are kept,
# the processes of a distributed run): a cell's settings leave them out.
RUNTIME_LEAVES = frozenset({"log_every", "plot", "checkpoint_every",
                            "checkpoints_to_keep", "coordinator_address",
                            "num_processes", "process_id"})


def _without_runtime(d: Any) -> Any:
  """``d`` less :data:`RUNTIME_LEAVES` and the keys of
  :data:`repdef_jax.training.ADDED_KEYS` at the value earlier runs used."""
  if not isinstance(d, dict):
    return d
  return {k: _without_runtime(v) for k, v in d.items()
          if k not in RUNTIME_LEAVES and not (
              k in training.ADDED_KEYS and v == training.ADDED_KEYS[k])}


def strip(settings: Any, drop: Sequence[str] = ()) -> Any:
  """``settings`` (a JSON-ready dict) without :data:`RUNTIME_LEAVES` at any
  depth and without ``drop`` (keys, dotted for nested ones)."""
  d = _without_runtime(settings)
  for key in drop:
    *parents, leaf = key.split(".")
    node = d
    for p in parents:
      node = node.get(p, {}) if isinstance(node, dict) else {}
    if isinstance(node, dict):
      node.pop(leaf, None)
  return d


def cell_settings(config: Any, drop: Sequence[str] = (),
                  panel: str | None = None,
                  sweep_streams: bool = True) -> dict[str, Any]:
  """What a sweep's cells depend on: ``config`` as a JSON-ready dict without
  ``data_dir``, :data:`RUNTIME_LEAVES` and ``drop`` (keys, dotted for nested
  ones, that enumerate cells, e.g. ``seeds``, or only shape the analysis,
  e.g. a threshold), and ``panels`` narrowed to ``panel`` when given, so a
  sweep can grow (more seeds, rates, panels) without touching its finished
  cells. A cell that draws from :class:`SweepKeys` past ``init``
  (``sweep_streams``) also records :data:`KEY_SCHEME`."""
  d = strip(jsonable(config.to_dict() if hasattr(config, "to_dict")
                     else config), ("data_dir", *drop))
  if panel is not None:
    d["panels"] = {panel: d["panels"][panel]}
  if sweep_streams:
    d["key_scheme"] = KEY_SCHEME
  return d


def _differences(old: Any, new: Any, prefix: str = "") -> list[str]:
  """Dotted paths where two JSON-ready values differ."""
  if isinstance(old, dict) and isinstance(new, dict):
    return [p for k in sorted(set(old) | set(new))
            for p in _differences(old.get(k), new.get(k), f"{prefix}{k}.")]
  return [] if old == new else [f"{prefix[:-1] or 'settings'}: {old!r} -> "
                                f"{new!r}"]


def data_fingerprint(source: str, *arrays: Any) -> dict[str, Any]:
  """Which copy of a dataset a cell used: the source kind ('tfds',
  'download', 'sample', ...) and a SHA-256 of ``arrays`` (a split's labels
  in order, or the attacked images: the copies order their images
  differently, docs/data.md)."""
  digest = hashlib.sha256()
  for a in arrays:
    a = np.ascontiguousarray(a)
    digest.update(f"{a.dtype.str}{a.shape}".encode())
    digest.update(a.tobytes())
  return {"source": source, "sha256": digest.hexdigest()[:16]}


@dataclasses.dataclass
class CellStore:
  """One JSON file per finished cell under ``folder``.

  A cell is written atomically when done; :meth:`get_or_run` skips cells
  whose file exists, so a sweep killed at any moment resumes without redoing
  finished work. A cell records the settings it was computed with
  (:func:`cell_settings`) and a cell file whose settings differ from the
  current ones is refused, never reused: a changed attack budget cannot mix
  with cells of the old one.

  Attributes:
    folder: where the cell files live (created on demand).
  """

  folder: str

  def path(self, name: str) -> str:
    return os.path.join(self.folder, f"{name}.json")

  def get(self, name: str) -> dict | None:
    return storage.read_json(self.path(name))

  def put(self, name: str, value: dict) -> None:
    storage.write_json(self.path(name), value)

  def get_or_run(self, name: str, fn: Callable[[], dict],
                 progress: "Progress | None" = None,
                 settings: dict[str, Any] | None = None,
                 drop: Sequence[str] = (),
                 data: dict[str, Any] | None = None) -> dict:
    """The stored cell ``name``, or ``fn()`` run, stored and returned.

    ``settings`` (from :func:`cell_settings`) are compared with the stored
    cell's after :func:`strip` with ``drop`` (the keys ``settings`` left
    out): a cell stored by a version that still recorded them (runtime
    settings, a key the cell does not read) is reused; any other key
    present on one side only is a difference. ``data`` (e.g.
    :func:`data_fingerprint`: where the images came from, and their order)
    is recorded too and compared when the stored cell has one (cells stored
    before it was recorded are reused): a run resumed on another copy of a
    dataset, whose images are in another order, refuses its finished cells.

    Raises:
      ValueError: the stored cell was computed with other ``settings`` or
        on other ``data``.
    """
    settings = jsonable(settings or {})
    data = jsonable(data) if data is not None else None
    cached = self.get(name)
    if cached is not None:
      diff = (_differences(strip(cached["settings"], drop), settings)
              if "settings" in cached else
              ["none recorded (an older repdef_jax)"] if settings else [])
      if data is not None and cached.get("data") not in (None, data):
        diff += [f"data: {cached['data']} -> {data}"]
      if diff:
        more = f"; {len(diff) - 3} more" if len(diff) > 3 else ""
        raise ValueError(
            f"{self.path(name)} was computed with other settings "
            f"({'; '.join(diff[:3])}{more}); remove it, or use another "
            "workdir, to recompute it.")
      if progress is not None:
        progress.step(name, skipped=True)
      return cached
    start = time.perf_counter()
    value = fn()
    value = {**value, "cell_seconds": time.perf_counter() - start,
             "host": host.describe(), "settings": settings,
             **({"data": data} if data is not None else {})}
    self.put(name, value)
    if progress is not None:
      progress.step(name)
    return value


class Progress:
  """Prints ``[label] i/n name (elapsed, ETA)`` after each unit of work.

  The ETA averages the wall time of the units computed in this process
  (skipped, already-finished units count as done but take no time). Quiet
  (prints nothing) when ``$REPDEF_JAX_QUIET`` is set (``--quiet``).
  """

  def __init__(self, total: int, label: str = "", stream=None):
    self.total = max(int(total), 1)
    self.label = label
    self.done = 0
    self.computed = 0
    self.start = time.perf_counter()
    self.stream = stream or sys.stdout

  def step(self, name: str = "", skipped: bool = False) -> None:
    self.done += 1
    if not skipped:
      self.computed += 1
    elapsed = time.perf_counter() - self.start
    left = self.total - self.done
    if self.computed:
      eta = f"ETA {elapsed / self.computed * left:.0f}s"
    else:
      eta = "ETA ?"
    tag = " (reused)" if skipped else ""
    if data_lib.quiet():
      return
    print(f"[{self.label}] {self.done}/{self.total} {name}{tag} "
          f"elapsed {elapsed:.0f}s {eta}", file=self.stream, flush=True)


# --------------------------------------------------------------------------
# Images: real when available, synthetic otherwise.


def synthetic_images(dataset: str, n: int, seed: int = 0
                     ) -> tuple[np.ndarray, np.ndarray]:
  """Deterministic smooth random images with the dataset's shape, in [0, 1].

  Blobs of colour on a gradient background (so that TV-regularised attacks
  and SSIM behave as on natural images, unlike white noise).

  Args:
    dataset: a name in :data:`repdef_jax.data.DATASETS` (gives the shape).
    n: number of images.
    seed: NumPy seed.

  Returns:
    ``(images float32 [n, H, W, C] in [0, 1], labels int32 [n])``.
  """
  info = data_lib.get_info(dataset)
  h, w, c = info.image_shape
  rng = np.random.default_rng(seed)
  yy, xx = np.mgrid[0:h, 0:w] / max(h, w)
  out = np.empty((n, h, w, c), np.float32)
  for i in range(n):
    img = rng.uniform(0.2, 0.6, c) * (0.5 + 0.5 * xx[..., None])
    for _ in range(3):
      cy, cx, r = rng.uniform(0.2, 0.8), rng.uniform(0.2, 0.8), rng.uniform(
          0.1, 0.3)
      blob = np.exp(-((yy - cy) ** 2 + (xx - cx) ** 2) / (2 * r * r))
      img = img + blob[..., None] * rng.uniform(-0.5, 0.5, c)
    out[i] = np.clip(img, 0.0, 1.0)
  labels = rng.integers(0, info.num_classes, n).astype(np.int32)
  return out, labels


def load_images(dataset: str, n: int, *, split: str = "test",
                data_dir: str | None = None, seed: int = 0,
                allow_synthetic: bool = True
                ) -> tuple[np.ndarray, np.ndarray, str]:
  """The first ``n`` images of a split in [0, 1]: real if possible.

  Real images come from :func:`repdef_jax.data.load_with_source` (a prepared
  TFDS copy, a download, or, when ``data_dir`` is not given, the embedded
  sample); without them, and when ``allow_synthetic``,
  :func:`synthetic_images`.

  Args:
    dataset: dataset name.
    n: number of images (the first ``n`` records of the split).
    split: dataset split.
    data_dir: TFDS data folder (else ``TFDS_DATA_DIR``).
    seed: seed of the synthetic images.
    allow_synthetic: fall back to synthetic images instead of raising.

  Returns:
    ``(images float32 [n, H, W, C], labels int32 [n], source)`` with
    source 'tfds', 'download', 'sample' or 'synthetic'.

  Raises:
    repdef_jax.data.DataNotFoundError: fewer than ``n`` real images and
      ``allow_synthetic`` is False.
  """
  try:
    images, labels, source = data_lib.load_with_source(
        dataset, split, data_dir, max_examples=n, sample=data_dir is None)
    if len(images) < n:
      raise data_lib.DataNotFoundError(
          f"only {len(images)} {dataset} {split} images ({source}); asked "
          f"for {n}.")
  except data_lib.DataNotFoundError:
    if not allow_synthetic:
      raise
    images, labels = synthetic_images(dataset, n, seed)
    return images, labels, "synthetic"
  return (data_lib.to_float(np.asarray(images)),
          np.asarray(labels, np.int32), source.kind)


def save_image_grid(path: str, rows: Sequence[Sequence[np.ndarray]],
                    row_labels: Sequence[str],
                    titles: Sequence[Sequence[str]] | None = None,
                    suptitle: str | None = None) -> None:
  """Saves a grid of images (clamped to [0, 1]) as a PNG, atomically.

  Args:
    path: output file.
    rows: ``rows[r][c]`` an image ``[H, W, C]``.
    row_labels: one label per row (left).
    titles: optional per-image titles (e.g. metrics).
    suptitle: optional figure title.
  """
  plt = storage.pyplot()
  n_rows = len(rows)
  n_cols = max(len(r) for r in rows)
  fig, axes = plt.subplots(n_rows, n_cols,
                           figsize=(1.5 * n_cols + 1.4, 1.5 * n_rows + 0.4),
                           squeeze=False)
  for r, row in enumerate(rows):
    for c in range(n_cols):
      ax = axes[r, c]
      ax.set_xticks([])
      ax.set_yticks([])
      if c >= len(row):
        ax.axis("off")
        continue
      img = np.clip(np.nan_to_num(np.asarray(row[c], np.float64), nan=0.5,
                                  posinf=1.0, neginf=0.0), 0, 1)
      if img.shape[-1] == 1:
        ax.imshow(img[..., 0], cmap="gray", vmin=0, vmax=1)
      else:
        ax.imshow(img)
      if titles is not None and titles[r] and c < len(titles[r]):
        ax.set_title(titles[r][c], fontsize=6)
      if c == 0:
        ax.set_ylabel(row_labels[r], fontsize=7)
  if suptitle:
    fig.suptitle(suptitle, fontsize=8)
  fig.tight_layout()
  storage.save_figure(fig, path, dpi=90)
  plt.close(fig)
