"""Visual comparison of reconstructions under each defense (Sun et al. 2021,
Section 6, Fig. 5: GS on a CIFAR-10 image).

For every seed and setting (undefended, Soteria / compression at several
rates, DP), the same one-image gradients of ``num_images`` test images, at
the same parameters, are defended and attacked by the same attacks from the
same keys, so settings differ only by the defense; all images of a cell go
in one batch (:mod:`repdef_jax.paper.batched`). Per setting: mean best-of
SSIM and clamped MSE over images x seeds with 95 % intervals, each attack's
success rate and diverged count. The claim ("unrecognisable after Soteria
prunes 50-60 %; compression 80 % still recognisable") is decided by the rule
of docs/evaluation.md. Writes ``visual.json`` (with ``claims``; metrics in
[0, 1] pixel space) and ``visual.png`` (the first seed: originals, then one
row per setting with the best-of reconstruction; titles give clamped MSE and
SSIM). Each (seed, setting) is a resumable cell.
"""

from __future__ import annotations

import io
import os
import time
from typing import Any, Sequence

import ml_collections
import numpy as np

from repdef_jax import data as data_lib
from repdef_jax import models as models_lib
from repdef_jax import storage
from repdef_jax.paper import batched
from repdef_jax.paper import harness
from repdef_jax.paper import report as report_lib
from repdef_jax.paper import stats

RESULT_FILE = "visual.json"
PLOT_FILE = "visual.png"
PIXEL_SPACE = "[0,1] (model input space; SSIM and clamped MSE on clamped " \
              "images)"
# Config keys that enumerate the cells or only shape the analysis: a cell's
# settings (harness.cell_settings) leave them out.
ANALYSIS_KEYS = ("seeds", "settings", "success_ssim", "unrecognisable",
                 "claim_soteria_rate", "claim_compression_rate")


def settings(config: ml_collections.ConfigDict) -> list[tuple[str, float]]:
  """``[(defense, strength)]``: undefended first, then the config's."""
  return [("none", 0.0)] + [(d, float(s)) for d, s in config.settings]


def setting_cell(config: ml_collections.ConfigDict, model: models_lib.Model,
                 params: Any, keys: harness.SweepKeys, images: np.ndarray,
                 labels: np.ndarray, defense: str, strength: float,
                 rec_path: str) -> dict[str, Any]:
  """Every image under one setting; the best-of reconstructions go to
  ``rec_path`` (``.npy``, ``[K, H, W, C]``)."""
  d = batched.get_defense(defense, strength, model)
  k_attack, k_defense = batched.image_keys(keys, range(len(images)))
  _, shared, _ = batched.defend_batch(model, params, d, images, labels,
                                      k_defense)
  attacks = tuple(config.attacks)
  entries, recs = batched.attack_suite(
      model, params, shared, images, labels, attacks, k_attack,
      budgets=config.attack_budgets.to_dict(),
      give_labels=config.give_labels, keep=attacks)
  best = []
  for k, e in enumerate(entries):
    name = e["best"].get("ssim_attack", attacks[0])
    best.append(recs[name][k, 0])
  buf = io.BytesIO()
  np.save(buf, np.stack(best).astype(np.float32))
  storage.write_bytes(rec_path, buf.getvalue())
  keep = ("mse", "mse_clamped", "psnr", "ssim", "diverged", "seconds",
          "same_as")
  return {"defense": defense, "strength": strength,
          "images": [{"attacks": {n: {k: m[k] for k in keep if k in m}
                                  for n, m in e["attacks"].items()},
                      "best": e["best"]} for e in entries]}


def summarize(config: ml_collections.ConfigDict, defense: str,
              strength: float, cells: list[dict[str, Any]]
              ) -> dict[str, Any]:
  """One setting over seeds: best-of and per-attack metrics with intervals
  over the seeds (each cell carries its ``seed``); the success rate counts
  a diverged attack as a failure."""
  images = [{**e, "seed": c.get("seed")} for c in cells for e in c["images"]]
  out = {"defense": defense, "strength": strength, "images": len(images),
         "per_attack": {}}
  for name in (None, *config.attacks):
    ms = [(e["best"] if name is None else e["attacks"][name], e["seed"])
          for e in images]
    ok = [(m, seed) for m, seed in ms
          if not (m.get("all_diverged") or m.get("diverged"))]
    seeds, every = [seed for _, seed in ok], [seed for _, seed in ms]
    out["per_attack"][name or "best"] = {
        "ssim": batched.summary([float(m["ssim"]) for m, _ in ok], seeds,
                                every),
        "mse_clamped": batched.summary([float(m["mse_clamped"])
                                        for m, _ in ok], seeds, every),
        "success_rate": (float(np.mean([m["ssim"] >= config.success_ssim
                                        for m, _ in ok] + [False] * (
                                            len(ms) - len(ok))))
                         if ms else None),
        "diverged": len(ms) - len(ok)}
  return out


def claims(config: ml_collections.ConfigDict,
           points: list[dict[str, Any]]) -> list[dict[str, Any]]:
  """The paper's visual claim as rows (docs/evaluation.md): Soteria against
  the paper's attack (the suite's first, GS) and, when the suite has more
  (the adaptive variants), against the best of it; compression against the
  best of the suite."""
  by = {(p["defense"], p["strength"]): p["per_attack"] for p in points}
  base = by[("none", 0.0)]
  paper = ("GS on CIFAR-10: unrecognisable after Soteria prunes 50-60 % of "
           "the FC layer; GC still recognisable after pruning 80 % of the "
           "whole model")
  suite = "/".join(config.attacks)
  rows = []
  for (d, s), target, higher, words, rule in (
      (("soteria", config.claim_soteria_rate), config.unrecognisable, False,
       "unrecognisable", f"held when the mean SSIM interval is <= "
       f"{config.unrecognisable}"),
      (("compression", config.claim_compression_rate), config.success_ssim,
       True, "still recognisable", f"held when the mean SSIM interval is >= "
       f"{config.success_ssim}")):
    per = by.get((d, float(s)))
    if per is None:
      continue
    against = [("best", f"best of {suite}")]
    if d == "soteria" and len(config.attacks) > 1:
      against.insert(0, (config.attacks[0],
                         f"{config.attacks[0]} alone, the paper's attack"))
    for attack, label in against:
      ssim, undefended = per[attack]["ssim"], base[attack]
      works = (undefended["success_rate"] or 0.0) >= 0.5
      rows.append(stats.claim(
          f"{d} {s:g} %: reconstructions {words} ({label}; "
          f"{config.model}/{config.dataset})", paper,
          f"mean SSIM over {ssim['n']} images x seeds, interval over seeds "
          f"([0,1] pixels); undefended: "
          f"{report_lib.fmt(undefended['ssim']['mean'])}",
          ssim["mean"], ssim["low"], ssim["high"], target=target,
          higher_holds=higher,
          rule=rule + "; inconclusive when the attack succeeds on fewer "
               "than half of the undefended images (diverged = failed)",
          verdict_override=None if works else
          "inconclusive (attacks fail undefended)"))
  return rows


def table(config: ml_collections.ConfigDict,
          points: list[dict[str, Any]]) -> dict[str, Any]:
  """Per setting: best-of SSIM / clamped MSE (95 % intervals), success
  rate and diverged count per attack (a report table)."""
  header = ["setting", "best-of SSIM", "best-of clamped MSE"]
  header += [f"{a} success / diverged" for a in config.attacks]
  rows = []
  for p in points:
    b = p["per_attack"]["best"]
    row = [p["defense"] if p["defense"] == "none" else
           f"{p['defense']} {p['strength']:g}", batched.interval(b["ssim"]),
           batched.interval(b["mse_clamped"])]
    row += [f"{report_lib.fmt(p['per_attack'][a]['success_rate'])} / "
            f"{p['per_attack'][a]['diverged']}" for a in config.attacks]
    rows.append(row)
  return {"title": f"{'/'.join(config.attacks)} on {config.model}/"
                   f"{config.dataset}, mean [95 % interval] over images x "
                   "seeds, [0,1] pixels",
          "header": header, "rows": rows}


def run(config: ml_collections.ConfigDict, workdir: str) -> dict[str, Any]:
  """Runs every (seed, setting); writes ``visual.json`` and the grid."""
  harness.check_part_config(config)
  start = time.perf_counter()
  os.makedirs(workdir, exist_ok=True)
  cell_dir = os.path.join(workdir, "cells")
  store = harness.CellStore(cell_dir)
  cell_settings = harness.cell_settings(config, ANALYSIS_KEYS)
  info = data_lib.get_info(config.dataset)
  model = models_lib.get_model(config.model, info.image_shape,
                               info.num_classes, init=config.model_init,
                               **config.model_kwargs.to_dict())
  plan = [(int(seed), d, s) for seed in config.seeds
          for d, s in settings(config)]
  progress = harness.Progress(len(plan), "visual")
  cells: dict[tuple[str, float], list[dict]] = {}
  first: dict[str, Any] = {}
  sources = set()
  for seed, d, s in plan:
    keys = harness.sweep_keys(seed)
    params = model.init(keys.init)
    _, images, labels, source = batched.part_images(config, config.dataset,
                                                    seed)
    sources.add(source)
    name = harness.cell_name(f"seed{seed}", d, s)
    rec_path = os.path.join(cell_dir, f"{name}.npy")
    cell = store.get_or_run(
        name, lambda d=d, s=s, keys=keys, params=params, images=images,
        labels=labels, rec_path=rec_path: setting_cell(
            config, model, params, keys, images, labels, d, s, rec_path),
        progress, cell_settings,
        data=harness.data_fingerprint(source, images, labels))
    cells.setdefault((d, s), []).append({**cell, "seed": seed})
    if seed == int(config.seeds[0]):
      first.setdefault("original", images[:, 0])
      first[(d, s)] = (np.load(rec_path), cell)
  points = [summarize(config, d, s, cells[(d, s)]) for d, s in settings(config)]
  result = harness.jsonable({
      "experiment": "visual", "config": config.to_dict(),
      "image_source": sorted(sources), "pixel_space": PIXEL_SPACE,
      "interval_rule": stats.INTERVAL_RULE,
      "settings": points, "claims": claims(config, points),
      "tables": [table(config, points)],
      "seconds": time.perf_counter() - start})
  storage.write_json(os.path.join(workdir, RESULT_FILE), result)
  _grid(config, first, sorted(sources), os.path.join(workdir, PLOT_FILE))
  return result


def _grid(config: ml_collections.ConfigDict, first: dict[Any, Any],
          sources: list[str], path: str) -> None:
  rows, labels, titles = [list(first["original"])], ["original"], [[]]
  for d, s in settings(config):
    recs, cell = first[(d, s)]
    rows.append(list(recs))
    labels.append(d if d == "none" else f"{d} {s:g}")
    titles.append([_tile_title(e, config.attacks) for e in cell["images"]])
  harness.save_image_grid(
      path, rows, labels, titles,
      suptitle=f"best by SSIM of {'/'.join(config.attacks)} on "
               f"{config.model}/{config.dataset}\n({', '.join(sources)} "
               f"images, seed {config.seeds[0]}); tiles: the attack, its MSE "
               "and SSIM on clamped [0,1] images")


def _tile_title(entry: dict[str, Any], attacks: Sequence[str]) -> str:
  """The shown reconstruction's attack (the SSIM-best, as saved by
  :func:`setting_cell`) and that attack's own clamped MSE and SSIM."""
  name = entry["best"].get("ssim_attack", attacks[0])
  m = entry["attacks"].get(name, {})
  return (f"{name} mse {m.get('mse_clamped', float('nan')):.3f} "
          f"ssim {m.get('ssim', float('nan')):.2f}")


def report(result: dict[str, Any], workdir: str) -> None:
  """Prints the per-setting mean SSIM and the claims rows."""
  del workdir
  for p in result["settings"]:
    b = p["per_attack"]["best"]
    print(f"{p['defense']} {p['strength']:g}: best-of SSIM "
          f"{b['ssim']['mean']} [{b['ssim']['low']}, {b['ssim']['high']}] "
          f"success {b['success_rate']} diverged {b['diverged']}")
  for row in result["claims"]:
    print(f"{row['claim']}: {row['value']} -> {row['verdict']}")
  print(f"total {result['seconds']:.0f}s")
