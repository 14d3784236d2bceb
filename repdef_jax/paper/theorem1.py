"""Theorem 1's certified bound vs pruning rate, beside what attacks reach.

References:
  Sun et al., "Provable Defense against Privacy Leakage in Federated Learning
  from Representation Perspective", CVPR 2021, Theorem 1; the bound is
  computed by :func:`repdef_jax.defenses.certify.certified_bound` (first
  order, under Assumption 1; see that module).

For each panel (model x dataset), seed, pruning rate and image: Soteria
defends the one-image gradient; the keep-mask is read off the shared gradient
(the all-zero rows of the defended kernel, exactly what was applied); the
certified lower bound on ``||X - X'||_2`` is computed for that mask; every
attack of the panel runs on the shared gradient (all images of a cell in one
batch) and we record the distance it reached, ``||X - X'||_2`` (L2 over all
pixels, [0, 1] space, the reconstruction clamped to [0, 1]: never farther
from X than the raw one, which is kept as ``distance_raw``), its SSIM, and
the first-order bound implied by its reconstruction's representation
(:func:`repdef_jax.defenses.certify.empirical_bound`). Rate 0 is the
undefended reference: a bound can only be tested on images that the attack
reconstructs undefended (SSIM >= the success threshold), so the claim's
fraction of (image, rate) pairs at or above the bound counts only those
(docs/evaluation.md). Writes
``certified.json`` (with ``claims``) and ``certified.png``; each (panel,
seed, rate) is a resumable cell.
"""

from __future__ import annotations

import os
import time
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from repdef_jax import data as data_lib
from repdef_jax import models as models_lib
from repdef_jax import storage
from repdef_jax.attacks import objectives
from repdef_jax.defenses import certify
from repdef_jax.paper import batched
from repdef_jax.paper import harness
from repdef_jax.paper import stats

# Jitted once per model (the model is static).
_certified_bound = jax.jit(certify.certified_bound, static_argnums=0)
_empirical_bound = jax.jit(certify.empirical_bound, static_argnums=0)
_sigma = jax.jit(lambda model, params, x: certify.jacobian_spectral_norms(
    model.feature_fn(params), x)[1], static_argnums=0)
RESULT_FILE = "certified.json"
PLOT_FILE = "certified.png"
PIXEL_SPACE = ("[0,1]; distances are L2 norms over all pixels of the "
               "reconstruction clamped to [0,1]")


class _Panel:
  """What every cell of one (panel, seed) shares: model, parameters, images."""

  def __init__(self, config: ml_collections.ConfigDict, name: str,
               seed: int):
    spec = config.panels[name]
    info = data_lib.get_info(spec.dataset)
    self.model = models_lib.get_model(
        spec.model, info.image_shape, info.num_classes, init=spec.model_init,
        **spec.get("model_kwargs", ml_collections.ConfigDict()).to_dict())
    self.keys = harness.sweep_keys(seed)
    self.params = self.model.init(self.keys.init)
    self.indices, self.images, self.labels, self.source = (
        batched.part_images(config, spec.dataset, seed))
    self.attacks = tuple(spec.attacks)
    # ||J||_2 of each image: every rate and attack of the panel reuses it.
    self.sigma = _sigma(self.model, self.params,
                        jnp.asarray(self.images[:, 0]))


def rate_cell(config: ml_collections.ConfigDict, panel: _Panel,
              rate: float) -> dict[str, Any]:
  """Every image of a (panel, seed) at one pruning rate: bound and attacks."""
  model, params = panel.model, panel.params
  d = batched.get_defense("soteria", rate, model)
  k_attack, k_defense = batched.image_keys(panel.keys,
                                           range(len(panel.indices)))
  _, shared, _ = batched.defend_batch(model, params, d, panel.images,
                                      panel.labels, k_defense)
  keep = ~jax.vmap(lambda g: objectives.pruned_rows(model, g))(shared)
  x = jnp.asarray(panel.images[:, 0])
  bound = np.asarray(_certified_bound(model, params, x,
                                      keep.astype(jnp.float32),
                                      sigma=panel.sigma))
  entries, recs = batched.attack_suite(
      model, params, shared, panel.images, panel.labels, panel.attacks,
      k_attack, budgets=config.attack_budgets.to_dict(),
      give_labels=config.give_labels, keep=panel.attacks)
  images = []
  for i, entry in enumerate(entries):
    images.append({"index": int(panel.indices[i]),
                   "certified_bound": float(bound[i]),
                   "pruned_fraction": float(1 - np.mean(np.asarray(keep[i]))),
                   "attacks": {}})
  for name in panel.attacks:
    # The attacker's image clamped to the pixel box: never farther from X
    # than the raw one, so the stronger test of a lower bound.
    x_rec = np.clip(np.nan_to_num(recs[name][:, 0], nan=0.5), 0.0, 1.0)
    dist = np.sqrt(np.sum((x_rec - panel.images[:, 0]) ** 2,
                          axis=(1, 2, 3)))
    emp = np.asarray(_empirical_bound(model, params, x,
                                      jnp.asarray(x_rec, jnp.float32),
                                      sigma=panel.sigma))
    for i, entry in enumerate(entries):
      m = entry["attacks"][name]
      images[i]["attacks"][name] = {
          "distance": float(dist[i]), "distance_raw": m["input_distance"],
          "empirical_bound": float(emp[i]),
          "mse": m["mse"], "mse_clamped": m["mse_clamped"], "ssim": m["ssim"],
          "diverged": m["diverged"], "seconds": m["seconds"]}
  return {"rate": float(rate), "source": panel.source, "images": images}


def _plan(config: ml_collections.ConfigDict):
  if 0.0 not in [float(r) for r in config.rates]:
    raise ValueError(f"rates must include 0 (the undefended reference the "
                     f"attacks are checked on); got {tuple(config.rates)}.")
  return [(p, int(s), float(r)) for p in config.panels for s in config.seeds
          for r in config.rates]


def analyse_panel(config: ml_collections.ConfigDict, name: str,
                  cells: dict[tuple[int, float], dict]) -> dict[str, Any]:
  """Per rate: bound and distances with intervals; per attack: undefended
  success and the fraction of (image, rate) pairs at or above the bound."""
  attacks = tuple(config.panels[name].attacks)
  rates = sorted({r for _, r in cells})
  seeds = sorted({s for s, _ in cells})
  base = 0.0  # _plan checked that the rates include it.
  ok = {}  # (seed, image position, attack) -> succeeded undefended
  for s in seeds:
    for i, e in enumerate(cells[(s, base)]["images"]):
      for a in attacks:
        m = e["attacks"][a]
        ok[(s, i, a)] = (not m["diverged"]) and m["ssim"] >= config.success_ssim
  out = {"dataset": config.panels[name].dataset,
         "model": config.panels[name].model, "attacks": list(attacks),
         "reference_rate": base, "rates": [], "bound_holds": {}}
  for r in rates:
    entries = [{**e, "seed": s} for s in seeds for e in cells[(s, r)]["images"]]
    row = {"rate": r,
           "certified_bound": batched.summary(
               [e["certified_bound"] for e in entries],
               [e["seed"] for e in entries]),
           "pruned_fraction": float(np.mean([e["pruned_fraction"]
                                             for e in entries]))}
    for a in attacks:
      kept = [e for e in entries if not e["attacks"][a]["diverged"]]
      ms, ss = [e["attacks"][a] for e in kept], [e["seed"] for e in kept]
      every = [e["seed"] for e in entries]
      row[a] = {"distance": batched.summary([float(m["distance"]) for m in ms],
                                            ss, every),
                "empirical_bound": batched.summary(
                    [m["empirical_bound"] for m in ms], ss, every),
                "ssim": batched.summary([m["ssim"] for m in ms], ss, every),
                "diverged": len(entries) - len(ms)}
    out["rates"].append(row)
  for a in attacks:
    above, diverged = [], 0
    for s in seeds:
      for r in rates:
        if r == base:
          continue
        for i, e in enumerate(cells[(s, r)]["images"]):
          m = e["attacks"][a]
          if not ok[(s, i, a)]:
            continue
          if m["diverged"]:
            diverged += 1
            continue
          above.append(float(float(m["distance"]) >= e["certified_bound"]))
    succ = [ok[(s, i, a)] for s in seeds
            for i in range(len(cells[(s, base)]["images"]))]
    out["bound_holds"][a] = {
        "undefended_success_rate": float(np.mean(succ)),
        "pairs": len(above), "diverged_pairs": diverged,
        "fraction_above": stats.proportion_ci(int(sum(above)), len(above))}
  return out


def claims(config: ml_collections.ConfigDict,
           panels: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
  """One row per (panel, attack): held when every tested pair is at or above
  the bound; inconclusive when the attack never succeeds undefended."""
  rows = []
  for name, p in panels.items():
    for a, h in p["bound_holds"].items():
      f = h["fraction_above"]
      if h["pairs"] == 0:
        v = "inconclusive (attack fails undefended)"
      else:
        v = "held" if f["value"] == 1.0 else "did not hold"
      rows.append(stats.claim(
          f"Theorem 1 bound holds ({name}, {a})",
          "Theorem 1 certifies a lower bound on ||X - X'||; the paper gives "
          "no numbers",
          f"fraction of {h['pairs']} (image, rate > 0) pairs, over images "
          f"the attack reconstructs undefended (SSIM >= "
          f"{config.success_ssim}; undefended success rate "
          f"{h['undefended_success_rate']:.2f}), whose ||X - X'||_2 "
          "([0,1] pixels, clamped) is at least the certified bound",
          f["value"], f["low"], f["high"], target=1.0,
          rule="held when every such pair is at or above the bound (one "
               "pair below refutes the certificate); inconclusive without "
               "pairs", verdict_override=v))
  return rows


def tables(panels: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
  """Per panel: bound and each attack's distance per rate (report tables)."""
  out = []
  for name, p in panels.items():
    header = ["rate %", "pruned", "certified bound"]
    for a in p["attacks"]:
      header += [f"{a} ||X - X'||", f"{a} SSIM", f"{a} diverged"]
    rows = []
    for r in p["rates"]:
      row = [r["rate"], r["pruned_fraction"],
             batched.interval(r["certified_bound"])]
      for a in p["attacks"]:
        row += [batched.interval(r[a]["distance"]),
                batched.interval(r[a]["ssim"]), r[a]["diverged"]]
      rows.append(row)
    out.append({"title": f"{name} ({p['model']}/{p['dataset']}): bound vs "
                         "attack distance, mean [95 % interval] over images "
                         "x seeds, [0,1] pixels",
                "header": header, "rows": rows})
  return out


def run(config: ml_collections.ConfigDict, workdir: str) -> dict[str, Any]:
  """Runs every (panel, seed, rate); writes ``certified.json`` / ``.png``."""
  harness.check_part_config(config)
  start = time.perf_counter()
  os.makedirs(workdir, exist_ok=True)
  store = harness.CellStore(os.path.join(workdir, "cells"))
  plan = _plan(config)
  progress = harness.Progress(len(plan), "certified")
  cells: dict[str, dict] = {}
  built: dict[tuple[str, int], _Panel] = {}

  def panel(name: str, seed: int) -> _Panel:
    if (name, seed) not in built:
      built.clear()  # One (panel, seed) at a time holds its model and images.
      built[(name, seed)] = _Panel(config, name, seed)
    return built[(name, seed)]

  for name, seed, rate in plan:
    cells.setdefault(name, {})[(seed, rate)] = store.get_or_run(
        harness.cell_name(name, f"seed{seed}", "rate", rate),
        lambda name=name, seed=seed, rate=rate: rate_cell(
            config, panel(name, seed), rate), progress,
        harness.cell_settings(config, ("seeds", "rates", "success_ssim"),
                              name),
        data=batched.part_fingerprint(config, config.panels[name].dataset,
                                      seed))
  panels = {name: analyse_panel(config, name, c) for name, c in cells.items()}
  result = harness.jsonable({
      "experiment": "certified", "config": config.to_dict(),
      "pixel_space": PIXEL_SPACE, "interval_rule": stats.INTERVAL_RULE,
      "image_source": sorted({c["source"] for v in cells.values()
                              for c in v.values()}),
      "panels": panels, "claims": claims(config, panels),
      "tables": tables(panels),
      "seconds": time.perf_counter() - start})
  storage.write_json(os.path.join(workdir, RESULT_FILE), result)
  plot(result, os.path.join(workdir, PLOT_FILE))
  return result


def report(result: dict[str, Any], workdir: str) -> None:
  """Prints the bound and distances per rate and the claims rows."""
  del workdir
  for name, p in result["panels"].items():
    print(f"{name}:")
    for row in p["rates"]:
      text = " ".join(f"{a} {row[a]['distance']['mean']:.3g} (ssim "
                      f"{row[a]['ssim']['mean']:.2f})" for a in p["attacks"]
                      if row[a]["distance"]["mean"] is not None)
      print(f"  rate {row['rate']:g}: bound "
            f"{row['certified_bound']['mean']:.3g}; ||X - X'||: {text}")
  for row in result["claims"]:
    print(f"{row['claim']}: {row['value']} -> {row['verdict']}")
  print(f"total {result['seconds']:.0f}s")


def plot(result: dict[str, Any], path: str) -> None:
  """Certified bound and attack distances vs pruning rate (means, 95 %)."""
  plt = storage.pyplot()
  panels = result["panels"]
  fig, axes = plt.subplots(1, max(len(panels), 1),
                           figsize=(5 * max(len(panels), 1), 3.8),
                           squeeze=False)

  def errorbar(ax, rows, get, fmt, label):
    pts = [(r["rate"], get(r)) for r in rows if get(r)["mean"] is not None]
    ax.errorbar([p[0] for p in pts], [p[1]["mean"] for p in pts],
                yerr=[[p[1]["mean"] - (p[1]["low"] if p[1]["low"] is not None
                                       else p[1]["mean"]) for p in pts],
                      [(p[1]["high"] if p[1]["high"] is not None
                        else p[1]["mean"]) - p[1]["mean"] for p in pts]],
                fmt=fmt, capsize=2, ms=3, label=label)

  for ax, (name, p) in zip(axes[0], panels.items()):
    errorbar(ax, p["rates"], lambda r: r["certified_bound"], "k-o",
             "Theorem 1 bound")
    for a in p["attacks"]:
      errorbar(ax, p["rates"], lambda r, a=a: r[a]["distance"], "o--",
               f"{a}: ||X - X'||")
      errorbar(ax, p["rates"], lambda r, a=a: r[a]["empirical_bound"], ":",
               f"{a}: ||f(X)-f(X')|| / ||J||")
    ax.set_xlabel("Soteria pruning rate (%)")
    ax.set_ylabel("L2 distance ([0,1] pixels)")
    ax.set_yscale("symlog", linthresh=1e-3)
    ax.set_title(f"{name} ({p['model']}/{p['dataset']})", fontsize=9)
    ax.legend(fontsize=6)
  fig.tight_layout()
  storage.save_figure(fig, path, dpi=100)
  plt.close(fig)
