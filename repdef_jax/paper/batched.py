"""The harness's attack suite over many shared gradients at once.

:func:`repdef_jax.paper.harness.attack_suite` attacks one gradient at a time;
here K gradients (one per attacked image or client) go through each attack of
the suite in one jitted, vmapped program (:func:`repdef_jax.attacks.
run_batch`), with the same per-image metrics ([0, 1] pixel space,
:func:`repdef_jax.paper.harness.measure`), the same ``same_as`` shortcut for
``*_mask`` attacks on unpruned gradients and the same best-of rule
(:func:`repdef_jax.paper.harness.best_of`).
"""

from __future__ import annotations

import functools
import time
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from repdef_jax import attacks as attacks_lib
from repdef_jax import defenses as defenses_lib
from repdef_jax import gradients
from repdef_jax import models as models_lib
from repdef_jax.attacks import objectives
from repdef_jax.paper import harness
from repdef_jax.paper import report
from repdef_jax.paper import stats

Params = Any


@functools.lru_cache(maxsize=64)
def get_defense(name: str, strength: float, model: models_lib.Model,
                **kwargs) -> defenses_lib.Defense:
  """:func:`repdef_jax.defenses.get_defense`, one object per setting (so
  the jitted :func:`defend_batch` compiles once per setting and model)."""
  return defenses_lib.get_defense(name, strength, model=model, **kwargs)


@functools.lru_cache(maxsize=64)
def _defend_fn(model: models_lib.Model, defense: defenses_lib.Defense):

  @jax.jit
  @functools.partial(jax.vmap, in_axes=(None, 0, 0, 0))
  def fn(params, xk, yk, key):
    g = gradients.batch_grad(model, params, xk, yk)
    shared, info = defense.apply(g, defenses_lib.ClientBatch(params, xk, yk),
                                 key)
    return g, shared, info

  return fn


def defend_batch(model: models_lib.Model, params: Params,
                 defense: defenses_lib.Defense, x: Any, y: Any,
                 keys: jax.Array
                 ) -> tuple[Params, Params, dict[str, np.ndarray]]:
  """K clients' batch gradients at ``params`` and what each shares.

  Args:
    model: the model.
    params: the parameters every client computes its gradient at.
    defense: the defense applied to each gradient (from :func:`get_defense`
      to compile once per setting).
    x: images ``[K, B, H, W, C]`` in [0, 1] (client k holds ``x[k]``).
    y: labels ``[K, B]``.
    keys: ``[K]`` defense keys.

  Returns:
    ``(grads, shared, info)`` stacked on a leading axis K; info values are
    ``[K]`` NumPy arrays.
  """
  grads, shared, info = _defend_fn(model, defense)(
      params, jnp.asarray(x, jnp.float32), jnp.asarray(y, jnp.int32), keys)
  return grads, shared, {k: np.asarray(v, np.float64) for k, v in
                         info.items()}


def attack_suite(model: models_lib.Model, params: Params, shared: Params,
                 x_true: Any, labels: Any, attack_names: Sequence[str],
                 keys: jax.Array, *, budgets: dict[str, dict] | None = None,
                 give_labels: bool = True, keep: Sequence[str] = ()
                 ) -> tuple[list[dict[str, Any]], dict[str, np.ndarray]]:
  """Every attack of a suite on K shared gradients, each in one batch.

  Args:
    model: the attacked model.
    params: the parameters every gradient was computed at.
    shared: K shared gradients stacked on a leading axis.
    x_true: the clients' images ``[K, B, H, W, C]`` in [0, 1] (scoring).
    labels: their labels ``[K, B]``.
    attack_names: registered attack names.
    keys: ``[K]`` attack keys (one per gradient; every attack of the suite
      starts from the same one).
    budgets: per family ('dlg', 'gs') attack config overrides.
    give_labels: hand the true labels to the attacks (iDLG infers its own).
    keep: attacks whose reconstructions are returned.

  Returns:
    ``(entries, recs)``: per gradient k ``{'attacks': {name: metrics},
    'best': ...}`` as :func:`repdef_jax.paper.harness.attack_suite` (the
    wall time of a batch is shared equally by its K entries), and
    ``recs[name]`` the matched reconstructions ``[K, B, H, W, C]`` of the
    attacks in ``keep``.
  """
  x_true = np.asarray(x_true, np.float32)
  labels = np.asarray(labels, np.int32)
  k_total, b = x_true.shape[:2]
  pruned = jax.vmap(lambda g: objectives.pruned_rows(model, g))(shared)
  any_pruned = bool(np.any(np.asarray(pruned)))
  per: dict[str, list[dict]] = {}
  recs: dict[str, np.ndarray] = {}
  for name in sorted(attack_names, key=lambda n: n.endswith("_mask")):
    plain = name[:-len("_mask")] if name.endswith("_mask") else None
    if plain and not any_pruned and plain in per:
      per[name] = [{**m, "same_as": plain} for m in per[plain]]
      if name in keep and plain in recs:
        recs[name] = recs[plain]
      continue
    attack = attacks_lib.get_attack(name)
    give = give_labels and name != "idlg"
    start = time.perf_counter()
    res = jax.device_get(attacks_lib.run_batch(
        attack, model, params, shared, b, keys,
        labels=jnp.asarray(labels) if give else None,
        **(budgets or {}).get(harness.family(name), {})))
    seconds = (time.perf_counter() - start) / k_total
    out, rows = [], []
    for k in range(k_total):
      one = attacks_lib.AttackResult(*(np.asarray(t)[k] for t in res))
      m, x_rec = harness.measure(one, x_true[k], labels[k], seconds)
      out.append(m)
      rows.append(x_rec)
    per[name] = out
    if name in keep or f"{name}_mask" in keep:  # A mask twin may copy it.
      recs[name] = np.stack(rows)
  entries = [{"attacks": {n: per[n][k] for n in attack_names},
              "best": harness.best_of({n: per[n][k] for n in attack_names})}
             for k in range(k_total)]
  return entries, {n: r for n, r in recs.items() if n in keep}


def image_keys(keys: harness.SweepKeys, indices: Sequence[int]
               ) -> tuple[jax.Array, jax.Array]:
  """``[K]`` attack and defense keys of images ``indices``
  (:func:`repdef_jax.paper.harness.image_keys` stacked)."""
  pairs = [harness.image_keys(keys, int(i)) for i in indices]
  return (jnp.stack([p[0] for p in pairs]), jnp.stack([p[1] for p in pairs]))


def summary(values: Sequence[float],
            seeds: Sequence[Any] | None = None,
            all_seeds: Sequence[Any] = ()) -> dict[str, Any]:
  """Mean with its Student-t 95 % interval, median and n of finite values.

  With ``seeds`` (the seed of each value) the interval is over the seeds'
  means (:func:`repdef_jax.paper.stats.mean_ci`); ``groups`` counts them.
  ``all_seeds``: the seed of every sample, those left out of ``values``
  (diverged attacks) included; when they span two or more seeds and the
  values only one, there is no interval (:func:`stats.seeds_lost`).
  """
  v = [float(x) for x in values]
  m = stats.mean_ci(v, groups=seeds)
  lost = seeds is not None and stats.seeds_lost(all_seeds, m["groups"])
  finite = [x for x in v if np.isfinite(x)]
  out = {"mean": m["mean"], "low": None if lost else m["low"],
         "high": None if lost else m["high"], "n": m["n"],
         "median": float(np.median(finite)) if finite else None}
  if seeds is not None:
    out["groups"] = m["groups"]
  return out


def interval(summary_: dict[str, Any]) -> str:
  """A :func:`summary` (or :func:`repdef_jax.paper.stats.mean_ci`) as
  ``mean [low, high]`` for a report table."""
  return report.fmt_interval(summary_["mean"], summary_["low"],
                             summary_["high"])


@functools.lru_cache(maxsize=4)
def _pool(dataset: str, data_dir: str, n: int, allow_synthetic: bool,
          seed: int) -> tuple[np.ndarray, np.ndarray, str]:
  return harness.load_images(dataset, n, data_dir=data_dir or None,
                             seed=seed, allow_synthetic=allow_synthetic)


def pick_images(dataset: str, num: int, keys: harness.SweepKeys, *,
                pool: int, data_dir: str = "", allow_synthetic: bool = False,
                seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray,
                                        str]:
  """``num`` test images drawn by the data stream from the first ``pool``.

  Args:
    dataset: dataset name.
    num: images to draw (without replacement).
    keys: the seed's streams (``keys.data`` draws).
    pool: the first ``pool`` test images are the candidates
      (:func:`repdef_jax.paper.harness.load_images`).
    data_dir: TFDS folder ('' = default).
    allow_synthetic: fall back to synthetic images.
    seed: seed of the synthetic images.

  Returns:
    ``(indices [K], images [K, 1, H, W, C], labels [K, 1], source)``: one
    image per attacked client.
  """
  images, labels, source = _pool(dataset, data_dir, int(pool),
                                 bool(allow_synthetic), int(seed))
  pick = np.asarray(jax.random.choice(keys.data, len(labels), (int(num),),
                                      replace=False))
  return pick, images[pick][:, None], labels[pick][:, None], source


def part_images(config: Any, dataset: str, seed: int
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray, str]:
  """:func:`pick_images` with a part config's settings (``num_images``,
  ``image_pool``, ``data_dir``, ``allow_synthetic``) for one seed."""
  return pick_images(dataset, config.num_images, harness.sweep_keys(seed),
                     pool=config.image_pool, data_dir=config.data_dir,
                     allow_synthetic=config.allow_synthetic, seed=seed)


def part_fingerprint(config: Any, dataset: str, seed: int) -> dict[str, Any]:
  """:func:`harness.data_fingerprint` of :func:`part_images` (the test pool
  is cached, so this draws again without reloading): which copy of the data
  a part's cells of this seed attack (cells record it)."""
  _, images, labels, source = part_images(config, dataset, seed)
  return harness.data_fingerprint(source, images, labels)
