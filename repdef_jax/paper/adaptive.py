"""Adaptive attacks against Soteria: where the defense holds and where not.

Beyond the paper. Soteria perturbs one layer and its pruned rows are visible
(NOTES.md, section 1). Two adaptive attacks from later work
(:mod:`repdef_jax.attacks`):

* ``<family>_drop``: the defended layer left out of the objective (Balunovic
  et al., "Bayesian Framework for Gradient Leakage", ICLR 2022);
* ``<family>_mask``: the all-zero rows of the shared defended kernel applied
  to the trial gradient too (GGL, Li et al., CVPR 2022);

are run next to the plain attack on Soteria-defended one-image gradients,
for each panel (model x dataset x attack family), seed, training stage
('init': the initial global model; 'trained': the global model after
undefended FedAvg, :func:`repdef_jax.training.train_and_evaluate`), Soteria
variant (the reference rule; ``selection='count'``: exactly the nominal
fraction pruned; ``score='exact'``: the paper's ``||r_i dX/dr_i||``) and
pruning rate. All images of a cell are attacked in one batch
(:mod:`repdef_jax.paper.batched`).

Verdict per (panel, stage, variant, rate, attack), over images x seeds
(docs/evaluation.md): **n/a** when the same attack succeeds on fewer than
half of the undefended images (SSIM >= ``success_ssim``); otherwise the
defense **holds** when the 95 % interval of the mean SSIM (clamped [0, 1]
images) is at or below ``unrecognisable`` (0.2), **fails** when it is above,
**inconclusive** when it straddles it. Writes ``adaptive.json`` (with a
summary ``claims`` row, reported without a paper target) and
``adaptive.png``; each cell is resumable.
"""

from __future__ import annotations

import os
import time
from typing import Any

import ml_collections
import numpy as np

from repdef_jax import data as data_lib
from repdef_jax import models as models_lib
from repdef_jax import storage
from repdef_jax import training
from repdef_jax.paper import batched
from repdef_jax.paper import harness
from repdef_jax.paper import report as report_lib
from repdef_jax.paper import stats
from repdef_jax.paper import sweep

RESULT_FILE = "adaptive.json"
PLOT_FILE = "adaptive.png"
VARIANTS = {
    "reference": {},
    "count": {"selection": "count"},
    "exact": {"score": "exact"},
}
PIXEL_SPACE = "[0,1] (model input space; SSIM on clamped images)"
# Config keys that enumerate the cells or only shape the analysis: a cell's
# settings (harness.cell_settings) leave them out.
ANALYSIS_KEYS = ("seeds", "stages", "variants", "success_ssim",
                 "unrecognisable")


def suite(family: str) -> tuple[str, str, str]:
  """The plain attack of a family and its two adaptive variants."""
  return (family, f"{family}_drop", f"{family}_mask")


def panel_stages(config: Any, name: str) -> tuple[str, ...]:
  """A panel's training stages: its own ``stages`` or the config's
  (``config``: the ConfigDict or its dict in a result)."""
  return tuple(config["panels"][name].get("stages") or config["stages"])


def panel_budgets(config: ml_collections.ConfigDict, name: str
                  ) -> dict[str, dict]:
  """Attack budgets per family: the config's, updated by the panel's own
  ``attack_budgets`` (e.g. a longer GS for a harder model)."""
  own = config.panels[name].get("attack_budgets", None)
  return harness.merge_budgets(config.attack_budgets.to_dict(),
                               own.to_dict() if own else None)


def panel_train_config(config: ml_collections.ConfigDict, name: str,
                       seed: int) -> ml_collections.ConfigDict:
  """The undefended FedAvg run that gives a panel's 'trained' stage."""
  c = sweep.panel_config(config, name)
  c.defense = "none"
  c.seed = int(seed)
  return c


class _Panel:
  """One (panel, seed): model, images and the parameters of every stage."""

  def __init__(self, config: ml_collections.ConfigDict, name: str,
               seed: int, workdir: str):
    spec = config.panels[name]
    info = data_lib.get_info(spec.dataset)
    self.model = models_lib.get_model(
        spec.model, info.image_shape, info.num_classes, init=spec.model_init,
        **spec.get("model_kwargs", ml_collections.ConfigDict()).to_dict())
    self.keys = harness.sweep_keys(seed)
    self.indices, self.images, self.labels, self.source = (
        batched.part_images(config, spec.dataset, seed))
    self.attacks = suite(spec.family)
    self.name = name
    self._config, self._seed = config, seed
    self._workdir = workdir
    self._params: dict[str, Any] = {}

  def params(self, stage: str) -> Any:
    """Global parameters at a stage ('init' / 'trained')."""
    if stage not in self._params:
      if stage == "init":
        self._params[stage] = self.model.init(self.keys.init)
      elif stage == "trained":
        run_dir = os.path.join(self._workdir, "train", self.name,
                               f"seed{self._seed}")
        result = training.train_and_evaluate(
            panel_train_config(self._config, self.name, self._seed),
            run_dir)
        self._params[stage] = result["state"].params
      else:
        raise ValueError(f"unknown stage {stage!r}; use 'init' or "
                         "'trained'.")
    return self._params[stage]


def plan(config: ml_collections.ConfigDict) -> list[dict[str, Any]]:
  """Every cell: per (panel, seed, stage) the undefended one, then every
  (variant, rate) of ``config.variants`` (variant -> rates)."""
  cells = []
  for panel in config.panels:
    for seed in config.seeds:
      for stage in panel_stages(config, panel):
        base = {"panel": panel, "seed": int(seed), "stage": stage}
        cells.append({**base, "variant": "none", "rate": 0.0})
        cells += [{**base, "variant": v, "rate": float(r)}
                  for v, rates in config.variants.items() for r in rates]
  return cells


def attack_cell(config: ml_collections.ConfigDict, panel: _Panel,
                stage: str, variant: str, rate: float) -> dict[str, Any]:
  """The panel's suite on every image's defended one-image gradient."""
  model, params = panel.model, panel.params(stage)
  d = (batched.get_defense("none", 0.0, model) if variant == "none" else
       batched.get_defense("soteria", rate, model, **VARIANTS[variant]))
  k_attack, k_defense = batched.image_keys(panel.keys,
                                           range(len(panel.indices)))
  _, shared, info = batched.defend_batch(model, params, d, panel.images,
                                         panel.labels, k_defense)
  entries, _ = batched.attack_suite(
      model, params, shared, panel.images, panel.labels, panel.attacks,
      k_attack, budgets=panel_budgets(config, panel.name),
      give_labels=config.give_labels)
  keep = ("mse", "mse_clamped", "ssim", "psnr", "diverged", "seconds",
          "same_as")
  return {"source": panel.source,
          "images": [{"index": int(panel.indices[i]),
                      "attacks": {n: {k: m[k] for k in keep if k in m}
                                  for n, m in e["attacks"].items()},
                      "best": e["best"],
                      **{f"defense/{k}": float(v[i]) for k, v in
                         info.items()}}
                     for i, e in enumerate(entries)]}


def _cell_name(cell: dict[str, Any]) -> str:
  return harness.cell_name(cell["panel"], f"seed{cell['seed']}", cell["stage"],
                           cell["variant"], cell["rate"])


# --------------------------------------------------------------------------
# Analysis.


def _ssims(images: list[dict], attack: str | None
           ) -> tuple[list[float], list[Any], int]:
  """SSIM samples of an attack (None: the best-of), their seeds and the
  diverged count."""
  vals, seeds, diverged = [], [], 0
  for e in images:
    m = e["best"] if attack is None else e["attacks"][attack]
    if m.get("all_diverged") or m.get("diverged"):
      diverged += 1
    else:
      vals.append(float(m["ssim"]))
      seeds.append(e.get("seed"))
  return vals, seeds, diverged


def verdict(ssim: dict[str, Any], undefended_success: float | None,
            unrecognisable: float) -> str:
  """'n/a (...)', 'holds', 'fails' or 'inconclusive' (module docstring)."""
  if undefended_success is None or undefended_success < 0.5:
    return "n/a (attack fails undefended)"
  if ssim["n"] == 0:
    return "n/a (every run diverged)"
  v = stats.verdict(ssim["low"], ssim["high"], unrecognisable,
                    higher_holds=False)
  return {"held": "holds", "did not hold": "fails"}.get(v, v)


def analyse(config: ml_collections.ConfigDict,
            cells: list[tuple[dict, dict]]) -> list[dict[str, Any]]:
  """One row per (panel, stage, variant, rate) with per-attack and best-of
  SSIM / clamped MSE summaries, undefended success rates and verdicts."""
  groups: dict[tuple, list[dict]] = {}
  for cell, result in cells:
    key = (cell["panel"], cell["stage"], cell["variant"], cell["rate"])
    groups.setdefault(key, []).extend(
        {**e, "seed": cell["seed"]} for e in result["images"])
  rows = []
  for (panel, stage, variant, rate), images in groups.items():
    attacks = suite(config.panels[panel].family)
    undefended = groups[(panel, stage, "none", 0.0)]
    row = {"panel": panel, "model": config.panels[panel].model,
           "dataset": config.panels[panel].dataset, "stage": stage,
           "variant": variant, "rate": rate, "images": len(images),
           "attacks": {}}
    for name in (*attacks, None):
      vals, seeds, diverged = _ssims(images, name)
      base, _, base_diverged = _ssims(undefended, name)
      # A diverged undefended attack is a failure of the attack.
      success = (float(np.mean([v >= config.success_ssim for v in base] +
                               [False] * base_diverged))
                 if undefended else None)
      mse = [float(e["best"]["mse_clamped"] if name is None else
                   e["attacks"][name]["mse_clamped"]) for e in images
             if not (e["best"].get("all_diverged") if name is None else
                     e["attacks"][name]["diverged"])]
      every = [e.get("seed") for e in images]
      summary = batched.summary(vals, seeds, every)
      entry = {"ssim": summary,
               "mse_clamped": batched.summary(mse, seeds, every),
               "diverged": diverged, "undefended_success_rate": success,
               "verdict": ("undefended" if variant == "none" else verdict(
                   summary, success, config.unrecognisable))}
      row["attacks"][name or "best"] = entry
    for k in images[0]:
      if k.startswith("defense/"):
        row[k] = float(np.mean([e[k] for e in images]))
    rows.append(row)
  return rows


def claims(config: ml_collections.ConfigDict,
           rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
  """The summary row: where Soteria holds against the best of the suite."""
  defended = [r for r in rows if r["variant"] != "none"]
  verdicts = [r["attacks"]["best"]["verdict"] for r in defended]
  applicable = [v for v in verdicts if not v.startswith("n/a")]
  held = sum(v == "holds" for v in applicable)
  per_attack = {}
  for r in defended:
    for name, a in r["attacks"].items():
      per_attack.setdefault(name, []).append(a["verdict"])
  counts = "; ".join(
      f"{name}: holds {sum(v == 'holds' for v in vs)}, fails "
      f"{sum(v == 'fails' for v in vs)}, inconclusive "
      f"{sum(v == 'inconclusive' for v in vs)}, n/a "
      f"{sum(v.startswith('n/a') for v in vs)}"
      for name, vs in per_attack.items())
  return [stats.claim(
      "Soteria withstands adaptive attacks (beyond the paper)",
      "not in the paper (later work broke Soteria with adaptive attacks)",
      f"share of the {len(applicable)} defended (panel, stage, variant, "
      f"rate) cells whose best-of-suite (plain, *_drop, *_mask) mean SSIM "
      f"interval is <= {config.unrecognisable} where the suite succeeds "
      f"undefended; per attack: {counts}",
      held / len(applicable) if applicable else None, None, None,
      target=None,
      rule=f"per cell: holds when the mean SSIM interval is <= "
           f"{config.unrecognisable} while the same attack succeeds "
           f"undefended (success rate >= 0.5 at SSIM >= "
           f"{config.success_ssim}); reported, no paper target")]


def table(rows: list[dict[str, Any]]) -> dict[str, Any]:
  """Every row: the share of active features the defense pruned, and per
  attack and best-of, mean SSIM [95 % interval] and the verdict; on the
  undefended rows the attack's success rate, which decides whether the
  defended rows get a verdict (a report table)."""

  def cell(a):
    text = f"{batched.interval(a['ssim'])} {a['verdict']}"
    rate = a.get("undefended_success_rate")
    if a["verdict"] == "undefended" and rate is not None:
      text += f" (success {report_lib.fmt(rate)})"
    if a.get("diverged"):
      text += f" ({a['diverged']} div)"
    return text

  out = []
  for r in rows:  # Attacks in suite order (plain, drop, mask), then best.
    names = list(r["attacks"])
    cells = [cell(a) for a in r["attacks"].values()]
    of_active = r.get("defense/pruned_fraction_of_active")
    out.append([r["panel"], r["stage"], r["variant"], r["rate"],
                "-" if of_active is None else round(100 * of_active, 1),
                ", ".join(names[:-1]), *cells])
  width = max((len(r["attacks"]) for r in rows), default=0)
  return {"title": "Mean SSIM [95 % interval over seeds] ([0,1] pixels) and "
                   "verdict; 'pruned %': share of the active (non-zero) "
                   "features whose gradient rows the defense zeroed, mean "
                   "over the row's images; columns: the panel's plain, "
                   "*_drop, *_mask attack and the best of them; "
                   "'(success x)' on an undefended row: the share of its "
                   "images the attack reconstructs (SSIM >= the success "
                   "level), below 0.5 the defended rows get no verdict; "
                   "'(k div)': k images whose attack diverged, left out of "
                   "the mean (a failure of the attack, not of the defense)",
          "header": ["panel", "stage", "variant", "rate %", "pruned %",
                     "attacks", "plain", "drop", "mask",
                     "best"][:6 + width],
          "rows": out}


def refresh_tables(path: str) -> dict[str, Any]:
  """Re-renders a finished run's ``tables`` from its ``rows`` (for a table
  whose layout changed after the run; nothing is recomputed).

  Args:
    path: an ``adaptive.json``, rewritten atomically.

  Returns:
    The updated result.
  """
  result = storage.read_json(path)
  result["tables"] = [table(result["rows"])]
  storage.write_json(path, harness.jsonable(result))
  return result


# --------------------------------------------------------------------------
# Entry.


def run(config: ml_collections.ConfigDict, workdir: str) -> dict[str, Any]:
  """Runs (or resumes) every cell; writes ``adaptive.json`` / ``.png``."""
  harness.check_part_config(config)
  start = time.perf_counter()
  os.makedirs(workdir, exist_ok=True)
  store = harness.CellStore(os.path.join(workdir, "cells"))
  cells = plan(config)
  progress = harness.Progress(len(cells), "adaptive")
  built: dict[tuple[str, int], _Panel] = {}

  def panel(name: str, seed: int) -> _Panel:
    if (name, seed) not in built:
      built.clear()
      built[(name, seed)] = _Panel(config, name, seed, workdir)
    return built[(name, seed)]

  done = []
  for cell in cells:
    result = store.get_or_run(
        _cell_name(cell),
        lambda cell=cell: attack_cell(config, panel(cell["panel"],
                                                    cell["seed"]),
                                      cell["stage"], cell["variant"],
                                      cell["rate"]), progress,
        harness.cell_settings(config, ANALYSIS_KEYS, cell["panel"]),
        data=batched.part_fingerprint(
            config, config.panels[cell["panel"]].dataset, cell["seed"]))
    done.append((cell, result))
  rows = analyse(config, done)
  result = harness.jsonable({
      "experiment": "adaptive", "config": config.to_dict(),
      "pixel_space": PIXEL_SPACE, "interval_rule": stats.INTERVAL_RULE,
      "image_source": sorted({r["source"] for _, r in done}),
      "verdict_rule": (f"holds when the mean SSIM interval is <= "
                       f"{config.unrecognisable} while the same attack "
                       "succeeds undefended; fails when above; n/a when the "
                       "attack fails undefended"),
      "rows": rows, "claims": claims(config, rows), "tables": [table(rows)],
      "seconds": time.perf_counter() - start,
      "cell_seconds": sum(r.get("cell_seconds", 0.0) for _, r in done)})
  storage.write_json(os.path.join(workdir, RESULT_FILE), result)
  plot(result, os.path.join(workdir, PLOT_FILE))
  return result


def report(result: dict[str, Any], workdir: str) -> None:
  """Prints each defended cell's verdicts per attack."""
  del workdir
  for r in result["rows"]:
    if r["variant"] == "none":
      continue
    text = ", ".join(
        f"{n} ssim {a['ssim']['mean'] and round(a['ssim']['mean'], 2)} "
        f"{a['verdict']}" for n, a in r["attacks"].items())
    print(f"{r['panel']} {r['stage']} {r['variant']} {r['rate']:g}: {text}")
  for row in result["claims"]:
    print(f"{row['claim']}: {row['value']} -> {row['verdict']}")
  print(f"total {result['seconds']:.0f}s")


def plot(result: dict[str, Any], path: str) -> None:
  """Mean SSIM (95 % interval) vs pruning rate: a row per (panel, stage), a
  column per variant, a line per attack (rate 0: undefended)."""
  plt = storage.pyplot()
  cfg = result["config"]
  rows = result["rows"]
  panel_rows = [(p, st) for p in cfg["panels"] for st in panel_stages(cfg, p)]
  variants = list(cfg["variants"])
  fig, axes = plt.subplots(len(panel_rows), len(variants),
                           figsize=(3.4 * len(variants), 2.8 * len(panel_rows)),
                           squeeze=False)
  for i, (panel, stage) in enumerate(panel_rows):
    mine = [r for r in rows if r["panel"] == panel and r["stage"] == stage]
    none = [r for r in mine if r["variant"] == "none"]
    for j, variant in enumerate(variants):
      ax = axes[i, j]
      pts = sorted(none + [r for r in mine if r["variant"] == variant],
                   key=lambda r: r["rate"])
      for name in (pts[0]["attacks"] if pts else {}):
        xs, ys, lo, hi = [], [], [], []
        for r in pts:
          s = r["attacks"][name]["ssim"]
          if s["mean"] is None:
            continue
          xs.append(r["rate"])
          ys.append(s["mean"])
          lo.append(s["mean"] - (s["low"] if s["low"] is not None
                                 else s["mean"]))
          hi.append((s["high"] if s["high"] is not None else s["mean"])
                    - s["mean"])
        ax.errorbar(xs, ys, yerr=[lo, hi], fmt="o-", ms=3, capsize=2,
                    label=name)
      ax.axhline(cfg["unrecognisable"], color="gray", ls=":")
      model = mine[0]["model"] if mine else panel
      ax.set_title(f"{panel} ({model}), {stage}, {variant}", fontsize=7)
      ax.set_xlabel("pruning rate (%)")
      ax.set_ylabel("SSIM ([0,1] pixels)")
      ax.set_ylim(-0.05, 1.05)
      ax.legend(fontsize=6)
  fig.tight_layout()
  storage.save_figure(fig, path, dpi=100)
  plt.close(fig)
