"""Convergence of (defended) FedAvg on non-IID MNIST (Sun et al. 2021, Fig. 6).

Each setting (local steps I, sampled devices K, defense) runs for every seed
(partition, initialisation, client sampling) as one resumable
:func:`repdef_jax.training.train_and_evaluate` run in
``workdir/runs/<setting>/seed<s>``; its cell holds the global objective F(w)
(l2 term included) at round 0 and after every round, and the test accuracy
after every round. Per setting: the initial and final F(w) and their paired
difference over seeds with 95 % intervals; the claim "defended FedAvg
converges" holds for a setting when the interval of ``F(w_0) - F(w_T)`` lies
above 0 (docs/evaluation.md). Writes ``curves.json`` (with ``claims``),
``loss_vs_round.png`` and ``accuracy_vs_round.png`` (means over seeds with
the interval as a band). Departure from the paper: it varies local *steps*
of batch 10 (the paper varies local epochs).
"""

from __future__ import annotations

import os
import time
from typing import Any

import ml_collections
import numpy as np

from repdef_jax import data as data_lib
from repdef_jax import fedavg
from repdef_jax import models as models_lib
from repdef_jax import storage
from repdef_jax import training
from repdef_jax.paper import batched
from repdef_jax.paper import harness
from repdef_jax.paper import report as report_lib
from repdef_jax.paper import stats

RESULT_FILE = "curves.json"
PLOT_FILE = "loss_vs_round.png"
ACCURACY_PLOT_FILE = "accuracy_vs_round.png"


def _defense(spec: str, default_strength: float) -> tuple[str, float, str]:
  """'none', 'soteria' (at ``default_strength``) or 'soteria:<strength>'
  -> (defense, strength, label)."""
  d, _, strength = spec.partition(":")
  strength = (0.0 if d == "none" else
              float(strength) if strength else default_strength)
  return d, strength, d if d == "none" else f"{d}{strength:g}"


def settings(config: ml_collections.ConfigDict) -> list[dict[str, Any]]:
  """The runs: name, local_steps, clients_per_round, defense, strength."""
  base_k = config.base.clients_per_round
  base_i = config.base.local_steps
  pairs = [(i, base_k) for i in config.local_steps]
  pairs += [(base_i, k) for k in config.clients_per_round
            if (base_i, k) not in pairs]
  out = []
  for i, k in pairs:
    for spec in config.defenses:
      d, strength, label = _defense(spec, config.base.defense_strength)
      out.append({"name": f"I{i}_K{k}_{label}", "local_steps": i,
                  "clients_per_round": k, "defense": d,
                  "strength": strength, "label": label})
  # Other models at K = base K, e.g. DLG's LeNet, whose trade-off panels
  # need it to learn under the paper's FedAvg.
  for extra in config.get("extra", ()):
    i = extra["overrides"].get("local_steps", base_i)
    for spec in extra["defenses"]:
      d, strength, label = _defense(spec, config.base.defense_strength)
      label = f"{extra['label']}_{label}"
      out.append({"name": f"I{i}_K{base_k}_{label}",
                  "local_steps": i, "clients_per_round": base_k,
                  "defense": d, "strength": strength, "label": label,
                  "overrides": dict(extra["overrides"])})
  if config.max_settings:
    out = out[:config.max_settings]
  return out


def smoothness_bound(config: ml_collections.ConfigDict) -> float:
  """L <= max_i (||x_i||^2 + 1) / 2 + l2 for softmax regression (with bias)."""
  images, _ = data_lib.load(config.dataset, "train", config.data_dir or None,
                            max_examples=config.max_train_examples or None)
  x = data_lib.to_float(images).reshape(len(images), -1)
  return float(0.5 * (np.max(np.sum(x * x, axis=1)) + 1.0) + config.l2)


def initial_loss(config: ml_collections.ConfigDict) -> float:
  """F(w_0): the global objective at the run's initial parameters."""
  clients, _, info = training.build_data(config)
  model = models_lib.get_model(config.model, info.image_shape,
                               info.num_classes, init=config.model_init,
                               conv_impl=config.conv_impl,
                               **config.model_kwargs.to_dict())
  params = model.init(fedavg.key_streams(config.seed).init)
  return float(fedavg.global_loss(model, params,
                                  fedavg.as_client_arrays(clients), config.l2))


def cell_config(base: ml_collections.ConfigDict, setting: dict[str, Any],
                seed: int) -> ml_collections.ConfigDict:
  """The training config of one (setting, seed)."""
  c = ml_collections.ConfigDict(base.to_dict())
  c.update(setting.get("overrides", {}))
  c.local_steps = setting["local_steps"]
  c.clients_per_round = setting["clients_per_round"]
  c.defense = setting["defense"]
  c.defense_strength = setting["strength"]
  c.seed = int(seed)
  return c


def data_record(c: ml_collections.ConfigDict) -> dict[str, Any]:
  """Which copy of the data a cell trains and evaluates on
  (:func:`harness.data_fingerprint` of both splits' labels; loads are
  cached in memory): a resumed run refuses finished cells of another copy,
  whose partition would differ."""
  arrays, kinds = [], []
  for split, limit in (("train", c.max_train_examples),
                       ("test", c.max_test_examples)):
    _, labels, source = data_lib.load_with_source(
        c.dataset, split, c.data_dir or None, max_examples=limit or None)
    arrays.append(np.asarray(labels, np.int64))
    kinds.append(source.kind)
  return harness.data_fingerprint("/".join(kinds), *arrays)


def run_cell(base: ml_collections.ConfigDict, setting: dict[str, Any],
             seed: int, run_dir: str) -> dict[str, Any]:
  """One (setting, seed): F(w) at round 0 and every round, and accuracy."""
  c = cell_config(base, setting, seed)
  result = training.train_and_evaluate(c, run_dir)
  recs = result["metrics"]
  return {"seed": int(seed), "initial_loss": initial_loss(c),
          "diverged_at_round": result.get("diverged_at_round"),
          "round": [r["round"] for r in recs],
          "global_loss": [r["global_loss"] for r in recs],
          "test_accuracy": [r["test_accuracy"] for r in recs]}


def summarize(setting: dict[str, Any], cells: list[dict[str, Any]]
              ) -> dict[str, Any]:
  """Initial / final F(w), their paired drop and final accuracy over seeds."""
  ok = [c for c in cells if c["diverged_at_round"] is None]
  init = [c["initial_loss"] for c in ok]
  final = [c["global_loss"][-1] for c in ok]
  rounds = ok[0]["round"] if ok else []
  return {**setting, "seeds": [c["seed"] for c in cells],
          "diverged_seeds": [c["seed"] for c in cells if c not in ok],
          "initial_loss": stats.mean_ci(init),
          "final_loss": stats.mean_ci(final),
          "loss_drop": stats.paired_difference_ci(init, final),
          "final_accuracy": stats.mean_ci(
              [c["test_accuracy"][-1] for c in ok]),
          "round": rounds,
          **_band(ok, "global_loss"), **_band(ok, "test_accuracy")}


def _band(cells: list[dict[str, Any]], name: str) -> dict[str, list]:
  """``{name}_mean / _low / _high``: per round, the mean of ``cell[name]``
  over the cells and its 95 % interval."""
  curves = np.asarray([c[name] for c in cells], np.float64)
  band = ([stats.mean_ci(curves[:, t]) for t in range(curves.shape[1])]
          if cells else [])
  return {f"{name}_{k}": [b[k] for b in band] for k in ("mean", "low", "high")}


def _nan(values: list) -> list:
  """An interval bound per round, None (undefined) as NaN for plotting."""
  return [np.nan if v is None else v for v in values]


def claims(summaries: list[dict[str, Any]]) -> list[dict[str, Any]]:
  """One row per setting: F(w_0) - F(w_T) over seeds, held above 0."""
  rows = []
  for s in summaries:
    d = s["loss_drop"]
    control = " (undefended control)" if s["defense"] == "none" else ""
    model = s.get("overrides", {}).get("model")
    claim, paper = (
        (f"Defended FedAvg converges: {s['name']}{control}",
         "LR + FedAvg with the defense converges (Theorem 2, Fig. 6)")
        if model is None else
        (f"{model} trains under the paper's FedAvg: {s['name']}",
         "the paper trains its attack models under FedAvg (Fig. 4/5)"))
    rows.append(stats.claim(
        claim, paper,
        f"F(w_0) - F(w_T), global objective over {d['n']} seeds "
        f"(final {report_lib.fmt(s['final_loss']['mean'])}, initial "
        f"{report_lib.fmt(s['initial_loss']['mean'])}, final test accuracy "
        f"{report_lib.fmt(s['final_accuracy']['mean'])})",
        d["mean"], d["low"], d["high"], target=0.0,
        rule="held when the interval of F(w_0) - F(w_T) lies above 0",
        verdict_override=("did not hold (training diverged)"
                          if s["diverged_seeds"] else None)))
  return rows


def table(summaries: list[dict[str, Any]]) -> dict[str, Any]:
  """Per setting: F(w) at round 0 and the end, their drop and the final
  accuracy, means [95 % interval] over seeds (a report table)."""
  return {"title": "Global objective F(w) over seeds, mean [95 % interval]",
          "header": ["setting", "seeds", "F(w_0)", "F(w_T)",
                     "F(w_0) - F(w_T)", "final test accuracy"],
          "rows": [[s["name"], len(s["seeds"])]
                   + [batched.interval(s[k]) for k in
                      ("initial_loss", "final_loss", "loss_drop",
                       "final_accuracy")] for s in summaries]}


def run(config: ml_collections.ConfigDict, workdir: str) -> dict[str, Any]:
  """Runs every (setting, seed); writes curves.json and loss_vs_round.png."""
  start = time.perf_counter()
  harness.check_part_config(config)
  harness.check_count(config.max_settings, "max_settings", 0,
                      "0: every setting")
  os.makedirs(workdir, exist_ok=True)
  base = ml_collections.ConfigDict(config.base.to_dict())
  base.data_dir = config.data_dir or base.data_dir
  if base.lr_schedule == "theorem2":
    if not base.mu:
      base.mu = base.l2
    if not base.smoothness:
      base.smoothness = smoothness_bound(base)
  store = harness.CellStore(os.path.join(workdir, "cells"))
  plan = [(s, int(seed)) for s in settings(config) for seed in config.seeds]
  progress = harness.Progress(len(plan), "convergence")
  by_setting: dict[str, list[dict]] = {}
  for s, seed in plan:
    run_dir = os.path.join(workdir, "runs", s["name"], f"seed{seed}")
    cell = store.get_or_run(
        harness.cell_name(s["name"], f"seed{seed}"),
        lambda s=s, seed=seed, run_dir=run_dir: run_cell(base, s, seed,
                                                         run_dir),
        progress, harness.cell_settings({"base": base.to_dict(), "setting": s},
                                        ("base.data_dir",),
                                        sweep_streams=False),
        data=data_record(cell_config(base, s, seed)))
    by_setting.setdefault(s["name"], []).append(cell)
  summaries = [summarize(s, by_setting[s["name"]]) for s in settings(config)]
  payload = {"experiment": "convergence", "config": config.to_dict(),
             "base": base.to_dict(),
             "metric": "global objective F(w) = mean loss over every "
                       "client's data + l2 / 2 ||w||^2 (no images)",
             "pixel_space": "[0,1] inputs (logistic regression on pixels)",
             "settings": summaries, "claims": claims(summaries),
             "tables": [table(summaries)],
             "seconds": time.perf_counter() - start}
  payload = harness.jsonable(payload)
  storage.write_json(os.path.join(workdir, RESULT_FILE), payload)
  plot(summaries, base, os.path.join(workdir, PLOT_FILE))
  plot_accuracy(summaries, os.path.join(workdir, ACCURACY_PLOT_FILE))
  return payload


def report(result: dict[str, Any], workdir: str) -> None:
  """Prints each setting's loss drop and verdict."""
  for row in result["claims"]:
    print(f"{row['claim']}: {row['value']} [{row['low']}, {row['high']}] "
          f"-> {row['verdict']}")
  print(f"wrote {workdir}/{RESULT_FILE} in {result['seconds']:.0f}s")


def plot(summaries: list[dict[str, Any]], base: ml_collections.ConfigDict,
         path: str) -> None:
  """Global loss vs round (mean over seeds, 95 % band): left varies I (K
  fixed), right varies K."""
  plt = storage.pyplot()
  fig, axes = plt.subplots(1, 2, figsize=(10, 4), sharey=True)
  for s in summaries:
    if not s["round"]:
      continue
    style = "--" if s["defense"] != "none" else "-"
    low, high = _nan(s["global_loss_low"]), _nan(s["global_loss_high"])
    for ax, show, label in (
        (axes[0], s["clients_per_round"] == base.clients_per_round,
         f"I={s['local_steps']} {s['label']}"),
        (axes[1], s["local_steps"] == base.local_steps,
         f"K={s['clients_per_round']} {s['label']}")):
      if show:
        line, = ax.plot(s["round"], s["global_loss_mean"], style, label=label)
        ax.fill_between(s["round"], low, high, color=line.get_color(),
                        alpha=0.2)
  axes[0].set_title(f"varying local steps (K={base.clients_per_round})")
  axes[1].set_title(f"varying sampled devices (I={base.local_steps})")
  for ax in axes:
    ax.set_xlabel("round")
    ax.set_yscale("log")
    if ax.get_legend_handles_labels()[0]:
      ax.legend(fontsize=7)
  axes[0].set_ylabel("global loss F(w) (mean over seeds, 95 % band)")
  fig.tight_layout()
  storage.save_figure(fig, path)
  plt.close(fig)


def plot_accuracy(summaries: list[dict[str, Any]], path: str) -> None:
  """Test accuracy vs round, every setting (mean over seeds, 95 % band)."""
  plt = storage.pyplot()
  fig, ax = plt.subplots(figsize=(6, 4))
  for s in summaries:
    if not s["round"]:
      continue
    # Accuracy lies in [0, 1]; a 3-seed t interval may not.
    low = np.clip(_nan(s["test_accuracy_low"]), 0, 1)
    high = np.clip(_nan(s["test_accuracy_high"]), 0, 1)
    line, = ax.plot(s["round"], s["test_accuracy_mean"],
                    "--" if s["defense"] != "none" else "-", label=s["name"])
    ax.fill_between(s["round"], low, high, color=line.get_color(), alpha=0.2)
  ax.set_xlabel("round")
  ax.set_ylabel("test accuracy (mean over seeds, 95 % band)")
  ax.set_ylim(0, 1)
  if ax.get_legend_handles_labels()[0]:
    ax.legend(fontsize=6)
  fig.tight_layout()
  storage.save_figure(fig, path)
  plt.close(fig)
