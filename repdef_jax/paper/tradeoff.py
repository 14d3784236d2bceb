"""The utility-privacy trade-off of the defenses (Sun et al. 2021, Section 6).

For every panel (model x dataset), seed, defense and strength: utility is the
test accuracy of defended FedAvg (defense at every local step), privacy the
best of an attack suite (plain, iDLG, adaptive) on what a client shares, both
on its one-image gradient at round 0 and on its real multi-step update at
round 0, mid-training and the final round of the defended run. Every cell is
a resumable JSON file. The statistics (:mod:`repdef_jax.paper.equal_accuracy`,
:mod:`repdef_jax.paper.stats`) and the verdict rules are fixed in
``docs/evaluation.md``. Metrics are in [0, 1] pixel space.

Departures from the paper: the attacked "real update" is a client holding a
small batch (``update_attack.batch`` images) that runs ``local_steps``
full-batch SGD steps; the attacks treat ``-update / (lr * steps)`` as the
batch gradient. Labels are given to every attack but iDLG (recoverable from
the last layer for small batches).
"""

from __future__ import annotations

import dataclasses
import functools
import os
import time
from typing import Any, Iterator, Sequence

from absl import logging
import flax.serialization
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from repdef_jax import data as data_lib
from repdef_jax import fedavg
from repdef_jax import models as models_lib
from repdef_jax import storage
from repdef_jax import training
from repdef_jax.paper import batched
from repdef_jax.paper import cost
from repdef_jax.paper import equal_accuracy
from repdef_jax.paper import harness
from repdef_jax.paper import report as report_lib
from repdef_jax.paper import stats
from repdef_jax.paper import sweep

BASELINES = ("compression", "dp_gaussian", "dp_laplace")
RESULT_FILE = "tradeoff.json"
PLOT_FILE = "tradeoff.png"
PRIVACY_METRICS = ("mse_clamped", "mse", "ssim", "psnr")
# Config keys that enumerate the cells, only shape the analysis or cost
# estimates: a cell's settings (cell_settings) leave them out.
ANALYSIS_KEYS = ("seeds", "defenses", "update_attack.cells",
                 "update_attack.stages", "threshold", "thresholds",
                 "success_ssim", "dry_run", "cost_reference",
                 "unit_costs_reference", "train.data_dir", "panels_only")
# What only the attacks read (a training cell leaves them out, and its
# panel's attack suite), and what only training reads (a round-0 attack cell
# leaves it out, and its panel's training overrides).
ATTACK_KEYS = ("num_images", "attack_budgets", "give_labels", "update_attack")
TRAIN_KEYS = ("train", "accuracy_window", "update_attack")


# --------------------------------------------------------------------------
# Measurement.


def attacked_indices(seed: int, num_images: int, num_test: int) -> np.ndarray:
  """The test-split indices of the images seed ``seed`` attacks (drawn from
  its data stream without replacement)."""
  keys = harness.sweep_keys(seed)
  return np.asarray(jax.random.choice(keys.data, num_test, (num_images,),
                                      replace=False))


class _Panel:
  """What every cell of one (panel, seed) shares: model, data, keys."""

  def __init__(self, config: ml_collections.ConfigDict, name: str,
               seed: int):
    self.name, self.seed = name, seed
    spec = config.panels[name]
    self.train_config = sweep.panel_config(config, name)
    self.train_config.seed = seed
    info = data_lib.get_info(spec.dataset)
    self.model = models_lib.get_model(
        spec.model, info.image_shape, info.num_classes, init=spec.model_init,
        **spec.get("model_kwargs", ml_collections.ConfigDict()).to_dict())
    self.keys = harness.sweep_keys(seed)
    self.params0 = self.model.init(self.keys.init)
    test_x, test_y, source = data_lib.load_with_source(
        spec.dataset, "test", config.data_dir or None)
    # Which copy the cells used (copies order images differently).
    self.data = harness.data_fingerprint(source.kind,
                                         np.asarray(test_y, np.int64))
    pick = attacked_indices(seed, config.num_images, len(test_y))
    self.images = data_lib.to_float(np.asarray(test_x)[pick])
    self.labels = np.asarray(test_y, np.int32)[pick]
    self.indices = pick
    self.attacks = tuple(spec.attacks)


def _train(config, panel: _Panel, defense: str, strength: float,
           run_dir: str, rounds: int) -> dict[str, Any]:
  c = ml_collections.ConfigDict(panel.train_config.to_dict())
  c.defense = defense
  c.defense_strength = float(strength)
  c.rounds = int(rounds)
  return training.train_and_evaluate(c, run_dir)


def _snapshot_path(run_dir: str, stage: str) -> str:
  return os.path.join(run_dir, f"params_{stage}.msgpack")


def _snapshot_round(run_dir: str, stage: str) -> int | None:
  """The round a stage's snapshot holds (None: no snapshot, or one written
  before its round was recorded)."""
  if not os.path.exists(_snapshot_path(run_dir, stage)):
    return None
  return storage.read_json(_snapshot_path(run_dir, stage) + ".json",
                           {}).get("round")


def train_cell(config, panel: _Panel, defense: str, strength: float,
               run_dir: str, snapshots: bool) -> dict[str, Any]:
  """Defended FedAvg; accuracy = mean of the last ``accuracy_window`` evals.

  With ``snapshots`` the run stops at mid-training (a checkpoint), saves the
  global parameters there, and continues to the end; the final parameters
  are saved too (the real-update attacks read them).
  """
  rounds = panel.train_config.rounds
  legs = [rounds // 2, rounds] if snapshots else [rounds]
  result = None
  for stage, upto in zip(("mid", "final")[-len(legs):], legs):
    if stage == "mid" and (training.latest_checkpoint_round(run_dir) or
                           0) > upto:
      if _snapshot_round(run_dir, "mid") == upto:
        continue  # Killed in the second leg: resume that leg, not the first.
      # Past the middle with no mid snapshot of this round (a run that kept
      # none, a copied folder, or one begun with other rounds): train again
      # from round 0 (same seed, same numbers).
      logging.warning("%s: no mid snapshot of round %d; retraining.",
                      run_dir, upto)
      storage.remove_tree(run_dir)
    result = _train(config, panel, defense, strength, run_dir, upto)
    if snapshots and result.get("diverged_at_round") is None:
      storage.write_bytes(_snapshot_path(run_dir, stage),
                          flax.serialization.to_bytes(
                              jax.device_get(result["state"].params)))
      # The round it holds, written after it (no sidecar: not trusted).
      storage.write_json(_snapshot_path(run_dir, stage) + ".json",
                         {"round": upto})
  recs = result["metrics"]
  acc = [float(r["test_accuracy"]) for r in recs if "test_accuracy" in r]
  out = {"accuracy": float(np.mean(acc[-config.accuracy_window:])),
         "final_accuracy": acc[-1], "accuracy_curve": acc,
         "rounds": int(recs[-1]["round"]),
         "diverged_at_round": result.get("diverged_at_round")}
  for k, v in recs[-1].items():
    if k.startswith("defense/"):
      out[k] = float(v)
  return out


def _image_entry(suite: dict[str, Any]) -> dict[str, Any]:
  keep = ("mse", "mse_clamped", "psnr", "ssim", "diverged", "seconds",
          "iterations", "label_accuracy", "same_as")
  return {"attacks": {n: {k: m[k] for k in keep if k in m}
                      for n, m in suite["attacks"].items()},
          "best": suite["best"]}


def attack_cell(config, panel: _Panel, defense: str,
                strength: float) -> dict[str, Any]:
  """The attack suite on each image's one-image gradient at round 0.

  Every image's gradient goes through each attack in one batch
  (:func:`repdef_jax.paper.batched.attack_suite`); image i keeps the keys of
  :func:`repdef_jax.paper.harness.image_keys` ``(keys, i)``.
  """
  d = batched.get_defense(defense, float(strength), panel.model)
  n = len(panel.images)
  k_attack, k_defense = batched.image_keys(panel.keys, range(n))
  x, y = panel.images[:, None], panel.labels[:, None]
  _, shared, info = batched.defend_batch(panel.model, panel.params0, d, x, y,
                                         k_defense)
  entries, _ = batched.attack_suite(
      panel.model, panel.params0, shared, x, y, panel.attacks, k_attack,
      budgets=sweep.budgets(config, "attack"), give_labels=config.give_labels)
  return {"images": [
      {"index": int(panel.indices[i]), "label": int(y[i, 0]),
       **_image_entry(entries[i]),
       **{f"defense/{k}": float(v[i]) for k, v in info.items()}}
      for i in range(n)]}


# The training settings that decide the clients' data (training.build_data).
_DATA_KEYS = ("dataset", "max_train_examples", "partition", "num_clients",
              "classes_per_client", "samples_per_class", "samples_per_client",
              "dirichlet_alpha", "seed")


def _client_data(tc: ml_collections.ConfigDict, data_dir: str):
  """Training split and client indices exactly as the panel's training."""
  return _client_data_cached(
      tuple((k, tc.get(k)) for k in _DATA_KEYS), data_dir)


@functools.lru_cache(maxsize=8)
def _client_data_cached(settings: tuple, data_dir: str):
  tc = ml_collections.ConfigDict(dict(settings))
  images, labels = data_lib.load(tc.dataset, "train", data_dir or None,
                                 max_examples=tc.max_train_examples or None)
  idx = training.client_indices(tc, labels,
                                data_lib.get_info(tc.dataset).num_classes)
  return images, np.asarray(labels, np.int32), idx


def update_cell(config, panel: _Panel, defense: str, strength: float,
                stage: str, run_dir: str) -> dict[str, Any]:
  """The attack suite on a client's real update at a training stage."""
  ua = config.update_attack
  tc = training.default_config()  # As train_and_evaluate completes it.
  tc.update(panel.train_config.to_dict())
  rounds = {"first": 0, "mid": tc.rounds // 2, "final": tc.rounds}[stage]
  if stage == "first":
    params = panel.params0
  else:
    path = _snapshot_path(run_dir, stage)
    if not os.path.exists(path):  # Only divergence leaves no snapshot.
      return {"skipped": f"training diverged before the {stage} stage"}
    with open(path, "rb") as f:
      params = flax.serialization.from_bytes(panel.params0, f.read())
  images, labels, idx = _client_data(tc, config.data_dir)
  # The attacked client and the attacks' dummies: per (seed, stage).
  client_key, attack_key = harness.update_keys(panel.keys, rounds)
  cid = int(jax.random.randint(client_key, (), 0, len(idx)))
  pick = np.asarray(idx[cid])[:ua.batch]
  x = data_lib.to_float(images[pick])
  y = labels[pick]
  # The training's client settings (defense and its score, l2, learning
  # rate, where the defense sits), on the attacked batch's local steps.
  tc.defense, tc.defense_strength = defense, float(strength)
  fcfg = dataclasses.replace(
      training.build_fedavg_config(tc, panel.model),
      local_steps=ua.local_steps, local_epochs=0, batch_size=ua.batch)
  lr = float(tc.client_lr)  # Rescales the update to a gradient's size.
  run_keys = fedavg.key_streams(panel.seed)
  train_key, noise_key = fedavg.client_keys(run_keys, jnp.int32(rounds), cid)
  delta, info = jax.jit(functools.partial(
      fedavg.client_update, panel.model, fcfg))(
          params, jnp.asarray(x), jnp.asarray(y), jnp.ones(len(y)),
          train_key, noise_key)
  shared = jax.tree_util.tree_map(lambda u: -u / (lr * ua.local_steps), delta)
  suite = harness.attack_suite(
      panel.model, params, shared, x, y, tuple(ua.attacks),
      attack_key,
      budgets=sweep.budgets(config, "update", panel.name),
      give_labels=config.give_labels)
  return {"client": cid, "round": rounds, "labels": y.tolist(),
          **_image_entry(suite),
          **{k: float(v) for k, v in info.items() if k.startswith("defense/")}}


def cell_drops(cell: dict[str, Any]) -> tuple[str, ...]:
  """The config keys a planned cell does not depend on: a training cell
  the attacks, a round-0 attack cell the training, an update cell the
  number of round-0 images (and every cell the analysis keys)."""
  panel = cell["panel"]
  return ANALYSIS_KEYS + {
      "train": ATTACK_KEYS + (f"panels.{panel}.attacks",),
      "attack": TRAIN_KEYS + (f"panels.{panel}.train",),
      "update": ("num_images",)}[cell["kind"]]


def cell_settings(config, cell: dict[str, Any]) -> dict[str, Any]:
  """What a planned cell depends on (:func:`harness.cell_settings` less
  :func:`cell_drops`; a training cell also whether it keeps the snapshots
  the update attacks read), so a longer attack budget keeps every finished
  training run."""
  panel = cell["panel"]
  out = harness.cell_settings(config, cell_drops(cell), panel,
                              sweep_streams=cell["kind"] != "train")
  if cell["kind"] == "train":
    out["snapshots"] = ((cell["defense"], cell["strength"]) in
                        set(sweep.update_strengths(config)))
  return out


def _drop_if_snapshots_lost(store: harness.CellStore, name: str,
                            run_dir: str, snapshots: bool) -> None:
  """Forgets a finished training cell whose snapshots are gone.

  The update cells read the mid and final parameters; a workdir copied
  without them (or with a run folder removed) would otherwise turn every
  later update cell into "training diverged". The run is recomputed from
  round 0 (same seed, same numbers), its folder cleared first so that no
  checkpoint past the mid stage is restored as the mid snapshot.
  """
  done = store.get(name) if snapshots else None
  if done is None or done.get("diverged_at_round") is not None:
    return
  if all(os.path.exists(_snapshot_path(run_dir, st))
         for st in ("mid", "final")):
    return
  logging.warning("%s: snapshots missing under %s; retraining.", name,
                  run_dir)
  storage.remove_tree(run_dir)
  os.remove(store.path(name))


def _drop_if_skipped_but_trained(store: harness.CellStore, name: str,
                                 run_dir: str, stage: str) -> None:
  """Forgets an update cell stored as skipped ("training diverged") whose
  snapshot exists now (a run retrained after losing it, or one that an
  earlier version resumed past its middle without the mid snapshot)."""
  done = store.get(name)
  if (done is not None and "skipped" in done and stage != "first" and
      os.path.exists(_snapshot_path(run_dir, stage))):
    logging.warning("%s: its snapshot exists now; attacking again.", name)
    os.remove(store.path(name))


def _run_cells(config, workdir: str) -> Iterator[tuple[dict, dict]]:
  """Runs (or reads) every planned cell; yields ``(cell, result)``."""
  store = harness.CellStore(os.path.join(workdir, "cells"))
  cells = sweep.plan(config)
  progress = harness.Progress(len(cells), "tradeoff")
  upd = set(sweep.update_strengths(config))
  panels: dict[tuple[str, int], _Panel] = {}
  for cell in cells:
    key = (cell["panel"], cell["seed"])
    if key not in panels:
      panels.clear()  # One (panel, seed) at a time holds its data.
      panels[key] = _Panel(config, *key)
    panel = panels[key]
    d, s = cell["defense"], cell["strength"]
    run_dir = os.path.join(workdir, "runs", cell["panel"],
                           f"seed{cell['seed']}", harness.cell_name(d, s))
    if cell["kind"] == "train":
      _drop_if_snapshots_lost(store, sweep.cell_name(cell), run_dir,
                              (d, s) in upd)
      fn = functools.partial(train_cell, config, panel, d, s, run_dir,
                             (d, s) in upd)
    elif cell["kind"] == "attack":
      fn = functools.partial(attack_cell, config, panel, d, s)
    else:
      _drop_if_skipped_but_trained(store, sweep.cell_name(cell), run_dir,
                                   cell["stage"])
      fn = functools.partial(update_cell, config, panel, d, s, cell["stage"],
                             run_dir)
    yield cell, store.get_or_run(sweep.cell_name(cell), fn, progress,
                                 cell_settings(config, cell),
                                 drop=cell_drops(cell), data=panel.data)


# --------------------------------------------------------------------------
# Analysis (pure functions of the cells).


def _kept(entry: dict, attack: str | None) -> dict | None:
  """One image's metrics for an attack (the best-of when None), or None
  when it diverged (every attack, for the best-of)."""
  if attack is None:
    return None if entry["best"].get("all_diverged") else entry["best"]
  m = entry["attacks"][attack]
  return None if m["diverged"] else m


def _samples(entries: Sequence[dict], attack: str | None, metric: str
             ) -> tuple[list[float], list[Any]]:
  """Per-image values of one attack (or the best-of when None) and the
  seed of each, dropping diverged attacks (and images where every attack
  diverged)."""
  kept = [(_kept(e, attack), e.get("seed")) for e in entries]
  return ([float(m[metric]) for m, _ in kept if m is not None],
          [seed for m, seed in kept if m is not None])


def success_rate(entries: Sequence[dict], attack: str | None,
                 success_ssim: float) -> float | None:
  """Share of the images an attack reconstructs (SSIM >= ``success_ssim``);
  a diverged attack is a failure, never left out of the count."""
  if not entries:
    return None
  ok = [_kept(e, attack) for e in entries]
  return float(np.mean([m is not None and m["ssim"] >= success_ssim
                        for m in ok]))


def summarize_point(train: list[dict], attack_images: list[dict],
                    attacks: Sequence[str], success_ssim: float
                    ) -> dict[str, Any]:
  """One (panel, defense, strength) point over seeds: accuracy and privacy.

  Args:
    train: the point's training cells, one per seed.
    attack_images: its attacked images, each with its ``seed``.
    attacks: the suite.
    success_ssim: an attack succeeds on an image at this SSIM or above.

  Returns:
    accuracy per seed (NaN for a seed whose training diverged) and its
    interval; per attack and best-of: mean / interval over seeds / median of
    every privacy metric, the success rate over every image (a diverged
    attack counts as a failure) and the diverged count; ``privacy`` samples
    (per image, best of the suite) and their ``seeds`` for
    :mod:`repdef_jax.paper.equal_accuracy`.
  """
  acc = [float("nan") if c.get("diverged_at_round") is not None
         else c["accuracy"] for c in train]
  point = {"accuracy": acc, "accuracy_summary": stats.mean_ci(acc),
           "diverged_training": sum(c.get("diverged_at_round") is not None
                                    for c in train),
           "images": len(attack_images)}
  for metric in PRIVACY_METRICS:
    point[metric], point["seeds"] = _samples(attack_images, None, metric)
  every_seed = [e.get("seed") for e in attack_images]
  point["all_seeds"] = every_seed
  per = {}
  for name in (None, *attacks):
    per[name or "best"] = {
        **{m: batched.summary(*_samples(attack_images, name, m), every_seed)
           for m in PRIVACY_METRICS},
        "success_rate": success_rate(attack_images, name, success_ssim),
        "diverged": sum(_kept(e, name) is None for e in attack_images)}
  point["per_attack"] = per
  return point


def analyse_panel(points: dict[tuple[str, float], dict], config
                  ) -> dict[str, Any]:
  """Ratios, first protective points and accuracy drops of one panel."""
  by_defense: dict[str, list[dict]] = {}
  for (d, s), p in points.items():
    if d != "none":
      by_defense.setdefault(d, []).append({**p, "strength": s})
  none = points[("none", 0.0)]
  out = {"ratios": {}, "accuracy_drop": {}}
  sot = by_defense.get("soteria", [])
  for b in BASELINES:
    if b in by_defense and sot:
      out["ratios"][b] = {
          metric: {
              "curve": equal_accuracy.ratio_curve(sot, by_defense[b], metric),
              "at_first_protective": [
                  equal_accuracy.ratio_at_first_protective(
                      sot, by_defense[b], t, metric)
                  for t in config.thresholds]}
          for metric in ("mse_clamped", "mse")}
  for d, pts in by_defense.items():
    out["accuracy_drop"][d] = [
        equal_accuracy.accuracy_drop(none, pts, t) for t in config.thresholds]
  # "Accuracy holds until MSE 0.8": the most private Soteria point whose
  # paired accuracy drop is at most one point.
  holds = []
  for p in sot:
    drop = stats.paired_difference_ci(none["accuracy"], p["accuracy"])
    if drop["dropped"] == 0 and drop["mean"] is not None and (
        drop["mean"] <= 0.01):
      holds.append({"strength": p["strength"], "accuracy_drop": drop,
                    **{m: batched.summary(p[m], p.get("seeds"),
                                          p.get("all_seeds", ()))
                       for m in ("mse", "mse_clamped")}})
  out["accuracy_holds"] = holds
  return out


def panel_claims(name: str, panel: dict[str, Any], config) -> list[dict]:
  """The paper's trade-off claims for one panel, with verdicts by rule."""
  works = (panel["undefended_success_rate"].get("best") or 0.0) >= 0.5
  fail = None if works else "inconclusive (attacks fail undefended)"
  where = f"{name} ({panel['model']}/{panel['dataset']})"
  claims = []
  for b, r in panel["ratios"].items():
    med = r["mse_clamped"]["curve"]["median"]
    claims.append(stats.claim(
        f"{where}: Soteria's MSE / {b}'s at equal accuracy", "> 160x",
        f"median over {med['n']} measured points of the best-of-attacks "
        "clamped-MSE ratio ([0,1] pixels)", med["value"], med["low"],
        med["high"], target=160.0, rule="interval low >= 160",
        verdict_override=fail if med["value"] is not None else (
            fail or "inconclusive (no baseline point inside the common "
            "accuracy range)")))
    first = next(x for x in r["mse_clamped"]["at_first_protective"]
                 if x["threshold"] == config.threshold)
    claims.append(stats.claim(
        f"{where}: same, at {b}'s first point with SSIM <= "
        f"{config.threshold}", "> 160x",
        f"ratio at {b} strength {first['baseline_strength']}",
        first["value"], first["low"], first["high"], target=160.0,
        rule="interval low >= 160",
        verdict_override=fail if first["value"] is not None else (
            fail or f"inconclusive ({first.get('note')})")))
  for d, drops in panel["accuracy_drop"].items():
    drop = next(x for x in drops if x["threshold"] == config.threshold)
    if d == "soteria":
      claims.append(stats.claim(
          f"{where}: Soteria's accuracy drop where reconstructions become "
          f"unrecognisable (best-of SSIM <= {config.threshold})",
          "0 (no drop)", f"paired drop at strength {drop['strength']}",
          drop["mean"], drop["low"], drop["high"], target=0.01,
          higher_holds=False, rule="interval high <= 0.01",
          verdict_override=fail or (
              "did not hold (never unrecognisable)" if not drop["reached"]
              else "did not hold (training diverged)"
              if drop.get("diverged_training") else None)))
    else:
      claims.append(stats.claim(
          f"{where}: {d}'s accuracy drop at the same threshold",
          "up to 0.06 (DLG) / 0.09 (GS)",
          f"paired drop at strength {drop['strength']}" if drop["reached"]
          else "not reached in the sweep", drop["mean"], drop["low"],
          drop["high"], target=None))
  holds = panel["accuracy_holds"]
  top = max(holds, key=lambda h: h["mse"]["mean"] or 0.0, default=None)
  claims.append(stats.claim(
      f"{where}: accuracy holds until MSE 0.8", "0.8",
      "largest best-of raw MSE ([0,1]) of a Soteria point losing <= 1 "
      "accuracy point" + (f" (strength {top['strength']})" if top else ""),
      top["mse"]["mean"] if top else None, top["mse"]["low"] if top else None,
      top["mse"]["high"] if top else None, target=0.8,
      rule="interval low >= 0.8",
      verdict_override=fail or (None if top else
                                "did not hold (no point keeps accuracy)")))
  return claims


def update_claims(name: str, panel: dict[str, Any], config) -> list[dict]:
  """Soteria on a client's real update: per attacked Soteria strength and
  training stage, the best-of-suite SSIM against "unrecognisable"."""
  where = f"{name} ({panel['model']}/{panel['dataset']})"
  ua, t = config.update_attack, config.threshold
  undefended = panel["updates"].get("none/0", {})
  claims = []
  for cell, stages in panel["updates"].items():
    defense, strength = cell.split("/")
    if defense != "soteria":
      continue
    for stage, per in stages.items():
      base = undefended.get(stage, {}).get("best", {}).get("success_rate")
      ssim = per["best"]["ssim"]
      claims.append(stats.claim(
          f"{where}: Soteria {strength} % makes a client's real update "
          f"unrecognisable ({stage} stage)", f"unrecognisable (SSIM <= {t})",
          f"best-of-attacks SSIM of each update ({ua.batch} images, "
          f"{ua.local_steps} local steps; mean over its matched images, "
          "[0,1] pixels, clamped), mean and t interval over seeds",
          ssim["mean"], ssim["low"], ssim["high"],
          target=t, higher_holds=False, rule=f"interval high <= {t}",
          verdict_override=None if (base or 0.0) >= 0.5 else
          "inconclusive (attacks fail undefended)"))
  return claims


def analyse(config, cells: list[tuple[dict, dict]]) -> dict[str, Any]:
  """Every panel's points, curves and statistics from the finished cells."""
  panels = {}
  for name in config.panels:
    attacks = tuple(config.panels[name].attacks)
    points, updates = {}, {}
    for d, s in sweep.strengths(config):
      mine = [(c, r) for c, r in cells if c["panel"] == name
              and c["defense"] == d and c["strength"] == s]
      train = [r for c, r in mine if c["kind"] == "train"]
      images = [{**e, "seed": c["seed"]} for c, r in mine
                if c["kind"] == "attack" for e in r["images"]]
      points[(d, s)] = summarize_point(train, images, attacks,
                                       config.success_ssim)
      ups = [(c, r) for c, r in mine
             if c["kind"] == "update" and "skipped" not in r]
      if ups:
        updates[f"{d}/{s:g}"] = {
            st: summarize_point(
                [], [{**r, "seed": c["seed"]} for c, r in ups
                     if c["stage"] == st],
                tuple(config.update_attack.attacks), config.success_ssim
            )["per_attack"]
            for st in config.update_attack.stages}
    undefended = points[("none", 0.0)]["per_attack"]
    panels[name] = {
        **{k: config.panels[name][k] for k in ("dataset", "model",
                                               "model_init")},
        "attacks": list(attacks),
        "undefended_success_rate": {a: undefended[a]["success_rate"]
                                    for a in undefended},
        # Test-split indices of the attacked images, per seed.
        "attacked_images": {str(c["seed"]): [e["index"] for e in r["images"]]
                            for c, r in cells if c["panel"] == name
                            and c["kind"] == "attack"
                            and c["defense"] == "none"},
        # Per-image samples stay in the JSON: the statistics can be
        # recomputed from it.
        "points": [{"defense": d, "strength": s, **p}
                   for (d, s), p in points.items()],
        "updates": updates,
        **analyse_panel(points, config)}
  return panels


def _sensitivity_rows(panel: dict[str, Any]) -> list[list[Any]]:
  """Per defense and threshold: the first protective point, its accuracy
  drop and (baselines) Soteria's clamped-MSE ratio there, with intervals."""
  fmt = report_lib.fmt_interval
  rows = []
  for d, drops in panel["accuracy_drop"].items():
    ratios = panel["ratios"].get(d, {}).get("mse_clamped", {}).get(
        "at_first_protective", [])
    by_t = {r["threshold"]: r for r in ratios}
    for drop in drops:
      t = drop["threshold"]
      if not drop["reached"]:
        rows.append([d, t, "not reached", "n/a", "n/a"])
        continue
      r = by_t.get(t)
      ratio = ("n/a" if r is None else fmt(r["value"], r["low"], r["high"])
               if r.get("value") is not None else r.get("note", "n/a"))
      rows.append([d, t, drop["strength"],
                   fmt(drop["mean"], drop["low"], drop["high"]), ratio])
  return rows


def _seed_interval(summary: dict[str, Any], num_seeds: int
                   ) -> dict[str, Any]:
  """``summary`` without its interval where its values come from one seed
  of a run of ``num_seeds`` >= 2 (an interval over that seed's images)."""
  if summary.get("groups", 2) < 2 <= num_seeds:
    return {**summary, "low": None, "high": None}
  return summary


def _apply_seed_rule(tree: Any, num_seeds: int) -> Any:
  """:func:`_seed_interval` on every summary (a dict with ``mean``, ``low``,
  ``high`` and ``groups``) in a nested result."""
  if isinstance(tree, list):
    return [_apply_seed_rule(x, num_seeds) for x in tree]
  if not isinstance(tree, dict):
    return tree
  if {"mean", "low", "high", "groups"} <= set(tree):
    return _seed_interval(tree, num_seeds)
  return {k: _apply_seed_rule(v, num_seeds) for k, v in tree.items()}


def tables(panels: dict[str, Any], success_ssim: float, num_seeds: int = 1
           ) -> list[dict[str, Any]]:
  """The report's tables: every point, every attack (with its undefended
  success rate), the real updates, the verdict's threshold sensitivity;
  every mean with its interval (over seeds: none where the values of a run
  of ``num_seeds`` >= 2 seeds come from one seed)."""

  iv = lambda summary: batched.interval(  # noqa: E731
      _seed_interval(summary, num_seeds))

  # An attack's SSIM with its interval and its count of diverged runs.
  ssim = lambda a: iv(a["ssim"]) + (f" ({a['diverged']} div)"  # noqa: E731
                                    if a.get("diverged") else "")
  out = []
  for name, panel in panels.items():
    where = f"{name} ({panel['model']}/{panel['dataset']})"
    rows, per_attack = [], []
    for p in panel["points"]:
      best = p["per_attack"]["best"]
      a = p["accuracy_summary"]
      rows.append([p["defense"], p["strength"],
                   iv(a), iv(best["mse_clamped"]), iv(best["ssim"]),
                   best["mse"]["median"], best["success_rate"],
                   f"{best['diverged']}/{p['images']}"])
      per_attack.append([p["defense"], p["strength"]] + [
          ssim(p["per_attack"][at]) for at in panel["attacks"]])
    out.append({"title": f"{where}: accuracy and best-of-attacks privacy "
                         "(one-image gradients at round 0)",
                "header": ["defense", "strength", "accuracy",
                           "clamped MSE", "SSIM", "raw MSE (median)",
                           "attack success rate", "all attacks diverged"],
                "rows": rows})
    out.append({"title": f"{where}: SSIM per attack, mean [95 % interval "
                         "over seeds] (k div: k runs diverged)",
                "header": ["defense", "strength", *panel["attacks"]],
                "rows": per_attack})
    rates = panel["undefended_success_rate"]
    out.append({"title": f"{where}: undefended success rate per attack "
                         f"(share of images with SSIM >= {success_ssim:g})",
                "header": list(rates), "rows": [list(rates.values())]})
    upd = []
    for cell, stages in panel["updates"].items():
      for stage, per in stages.items():
        upd.append([cell, stage, iv(per["best"]["ssim"]),
                    iv(per["best"]["mse_clamped"]),
                    per["best"]["success_rate"]] +
                   [ssim(v) for k, v in per.items() if k != "best"])
    if upd:
      attacks = [k for k in next(iter(next(iter(
          panel["updates"].values())).values())) if k != "best"]
      out.append({"title": f"{where}: attacks on real multi-step updates "
                           "(SSIM: mean [95 % interval over seeds], k div: "
                           "k runs diverged)",
                  "header": ["cell", "stage", "best SSIM", "best clamped MSE",
                             "success rate", *[f"{a} SSIM" for a in attacks]],
                  "rows": upd})
    out.append({"title": f"{where}: threshold sensitivity: each defense's "
                         "first point with best-of-attacks mean SSIM <= the "
                         "threshold, its paired accuracy drop and Soteria's "
                         "clamped MSE over the baseline's at equal accuracy "
                         "there (mean [95 % interval])",
                "header": ["defense", "SSIM threshold", "first protective "
                           "strength", "accuracy drop", "clamped-MSE ratio "
                           "(Soteria / baseline)"],
                "rows": _sensitivity_rows(panel)})
  return out


# --------------------------------------------------------------------------
# Entry.


def run(config: ml_collections.ConfigDict, workdir: str) -> dict[str, Any]:
  """Runs (or resumes) every cell; writes ``tradeoff.json`` and the plot.

  With ``config.dry_run`` it only prints the plan and its estimated cost;
  with ``config.panels_only`` it runs and analyses those panels alone.
  """
  config = sweep.select_panels(config)
  harness.check_part_config(config)
  if config.get("dry_run"):
    return dry_run(config, workdir)
  start = time.perf_counter()
  os.makedirs(workdir, exist_ok=True)
  cells = list(_run_cells(config, workdir))
  panels = analyse(config, cells)
  result = {
      "experiment": "tradeoff",
      "config": config.to_dict(),
      "pixel_space": "[0,1] (model input space; no normalisation)",
      "interval_rule": stats.INTERVAL_RULE,
      "claims": [c for name, p in panels.items()
                 for c in (*panel_claims(name, p, config),
                           *update_claims(name, p, config))],
      "tables": tables(panels, config.success_ssim, len(config.seeds)),
      "panels": panels,
      "seconds": time.perf_counter() - start,
      "cell_seconds": sum(r.get("cell_seconds", 0.0) for _, r in cells),
      # Work and seconds of every cell: the rates of dry-run estimates.
      "cell_costs": cost.cell_costs(config, cells),
  }
  storage.write_json(os.path.join(workdir, RESULT_FILE), harness.jsonable(
      result))
  plot(result, os.path.join(workdir, PLOT_FILE))
  return result


def refresh_tables(path: str) -> dict[str, Any]:
  """Re-renders a finished run's ``tables`` from its ``panels``.

  For a report whose table layout changed after a run: only formatting is
  redone, and the interval rule of docs/evaluation.md is applied to the
  stored summaries (no interval where a run of several seeds kept values
  from one: a run older than the rule stored one over that seed's images);
  means, claims and cells stay as the run computed them.

  Args:
    path: a ``tradeoff.json``, rewritten atomically.

  Returns:
    The updated result.
  """
  result = storage.read_json(path)
  num_seeds = len(result["config"]["seeds"])
  result["panels"] = _apply_seed_rule(result["panels"], num_seeds)
  result["tables"] = tables(result["panels"],
                            result["config"]["success_ssim"], num_seeds)
  storage.write_json(path, harness.jsonable(result))
  return result


def reanalyse(path: str) -> dict[str, Any]:
  """Recomputes a finished run's statistics under the current rules.

  The ratios, first protective points, accuracy drops, claims and tables
  are recomputed from the per-image samples and per-seed accuracies its
  panels keep (``points``); the cells' numbers, the real-update summaries
  and the timings stay as the run computed them, and ``interval_rule``
  becomes the current one. For a change of a statistic's rule after a run
  (docs/evaluation.md dates each).

  Args:
    path: a ``tradeoff.json``, rewritten atomically.

  Returns:
    The updated result.
  """
  result = storage.read_json(path)
  config = ml_collections.ConfigDict(result["config"])
  panels = _apply_seed_rule(result["panels"], len(config.seeds))
  for panel in panels.values():
    points = {(p["defense"], float(p["strength"])): p
              for p in panel["points"]}
    panel.update(analyse_panel(points, config))
  result.update(
      panels=panels, interval_rule=stats.INTERVAL_RULE,
      claims=[c for name, p in panels.items()
              for c in (*panel_claims(name, p, config),
                        *update_claims(name, p, config))],
      tables=tables(panels, config.success_ssim, len(config.seeds)))
  storage.write_json(path, harness.jsonable(result))
  return result


def dry_run(config: ml_collections.ConfigDict, workdir: str
            ) -> dict[str, Any]:
  """The plan and its estimated cost, without running anything."""
  cells = sweep.plan(config)
  estimate = cost.estimate(config, cells, workdir)
  print(cost.render(estimate))
  return {"dry_run": True, "cells": len(cells), "estimate": estimate,
          "seconds": 0.0}


def report(result: dict[str, Any], workdir: str) -> None:
  """Prints every claim with its statistic, interval and verdict."""
  del workdir
  if result.get("dry_run"):
    return
  for name, p in result["panels"].items():
    print(f"{name}: undefended success rate {p['undefended_success_rate']}")
  for c in result["claims"]:
    interval = ("" if c["low"] is None else
                f" [{c['low']:.3g}, {c['high']:.3g}]")
    value = "n/a" if c["value"] is None else f"{c['value']:.3g}"
    print(f"{c['claim']}: {value}{interval} (paper {c['paper']}): "
          f"{c['verdict']}")


def plot(result: dict[str, Any], path: str) -> None:
  """Accuracy vs best-of-attacks clamped MSE (means with 95 % intervals)."""
  plt = storage.pyplot()
  panels = result["panels"]
  fig, axes = plt.subplots(1, max(len(panels), 1),
                           figsize=(4.6 * max(len(panels), 1), 3.8),
                           squeeze=False)
  for ax, (name, panel) in zip(axes[0], panels.items()):
    defenses = {p["defense"] for p in panel["points"]} - {"none"}
    none = next(p for p in panel["points"] if p["defense"] == "none")
    for d in sorted(defenses):
      pts = sorted([none] + [p for p in panel["points"] if p["defense"] == d],
                   key=lambda p: p["strength"])
      xs, ys, xerr, yerr = [], [], [], []
      for p in pts:
        m = p["per_attack"]["best"]["mse_clamped"]
        a = p["accuracy_summary"]
        if m["mean"] is None or a["mean"] is None:
          continue
        xs.append(m["mean"])
        ys.append(a["mean"])
        xerr.append(0.0 if m["low"] is None else m["mean"] - m["low"])
        yerr.append(0.0 if a["low"] is None else a["mean"] - a["low"])
      ax.errorbar(xs, ys, xerr=xerr, yerr=yerr, fmt="o-", ms=3, capsize=2,
                  label=d)
    ax.set_xlabel("best-of-attacks clamped MSE ([0,1] pixels)")
    ax.set_ylabel("test accuracy")
    ax.set_title(f"{name} ({panel['model']}/{panel['dataset']})", fontsize=9)
    ax.legend(fontsize=6)
  fig.tight_layout()
  storage.save_figure(fig, path, dpi=100)
  plt.close(fig)
