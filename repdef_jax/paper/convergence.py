"""Convergence of (defended) FedAvg on non-IID MNIST (Sun et al. 2021, Fig. 6).

Each setting (local steps I, sampled devices K, defense) is one resumable
:func:`repdef_jax.training.train_and_evaluate` run in ``workdir/<name>``;
the global objective F(w) (l2 term included) per round goes to
``curves.json`` and ``loss_vs_round.png``. Departure from the paper: it
varies local *steps* of batch 10 (the paper varies local epochs).
"""

from __future__ import annotations

import os
from typing import Any

import ml_collections
import numpy as np

from repdef_jax import data as data_lib
from repdef_jax import storage
from repdef_jax import training

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
      # 'none', 'soteria' (base.defense_strength) or 'soteria:<strength>'.
      d, _, strength = spec.partition(":")
      strength = (0.0 if d == "none" else
                  float(strength) if strength else config.base.defense_strength)
      label = d if d == "none" else f"{d}{strength:g}"
      out.append({"name": f"I{i}_K{k}_{label}", "local_steps": i,
                  "clients_per_round": k, "defense": d,
                  "strength": strength, "label": label})
  if config.max_settings:
    out = out[:config.max_settings]
  return out


def smoothness_bound(config: ml_collections.ConfigDict) -> float:
  """L <= max_i (||x_i||^2 + 1) / 2 + l2 for softmax regression (with bias)."""
  images, _ = data_lib.load(config.dataset, "train", config.data_dir or None,
                            max_examples=config.max_train_examples or None)
  x = data_lib.to_float(images).reshape(len(images), -1)
  return float(0.5 * (np.max(np.sum(x * x, axis=1)) + 1.0) + config.l2)


def run(config: ml_collections.ConfigDict, workdir: str) -> dict[str, Any]:
  """Runs every setting; writes curves.json and loss_vs_round.png."""
  os.makedirs(workdir, exist_ok=True)
  base = ml_collections.ConfigDict(config.base.to_dict())
  base.data_dir = config.data_dir or base.data_dir
  if base.lr_schedule == "theorem2":
    if not base.mu:
      base.mu = base.l2
    if not base.smoothness:
      base.smoothness = smoothness_bound(base)
  curves = {}
  for s in settings(config):
    c = ml_collections.ConfigDict(base.to_dict())
    c.local_steps = s["local_steps"]
    c.clients_per_round = s["clients_per_round"]
    c.defense = s["defense"]
    c.defense_strength = s["strength"]
    print(f"== {s['name']}", flush=True)
    result = training.train_and_evaluate(c, os.path.join(workdir, s["name"]))
    recs = result["metrics"]
    diverged = result.get("diverged_at_round")
    if diverged is not None:  # Recorded; the sweep goes on.
      print(f"   {s['name']} diverged at round {diverged}", flush=True)
    curves[s["name"]] = {
        **s,
        "diverged_at_round": diverged,
        "round": [r["round"] for r in recs],
        "global_loss": [r["global_loss"] for r in recs],
        "test_accuracy": [r["test_accuracy"] for r in recs],
    }
  payload = {"base": base.to_dict(), "curves": curves}
  storage.write_json(os.path.join(workdir, "curves.json"), payload)
  plot(curves, base, os.path.join(workdir, "loss_vs_round.png"))
  return payload


def plot(curves: dict[str, Any], base: ml_collections.ConfigDict,
         path: str) -> None:
  """Global loss vs round: left varies I (K fixed), right varies K."""
  plt = storage.pyplot()
  fig, axes = plt.subplots(1, 2, figsize=(10, 4), sharey=True)
  for c in curves.values():
    style = "--" if c["defense"] != "none" else "-"
    if c["clients_per_round"] == base.clients_per_round:
      axes[0].plot(c["round"], c["global_loss"], style,
                   label=f"I={c['local_steps']} {c['label']}")
    if c["local_steps"] == base.local_steps:
      axes[1].plot(c["round"], c["global_loss"], style,
                   label=f"K={c['clients_per_round']} {c['label']}")
  axes[0].set_title(f"varying local steps (K={base.clients_per_round})")
  axes[1].set_title(f"varying sampled devices (I={base.local_steps})")
  for ax in axes:
    ax.set_xlabel("round")
    ax.set_yscale("log")
    if ax.get_legend_handles_labels()[0]:
      ax.legend(fontsize=7)
  axes[0].set_ylabel("global loss F(w)")
  fig.tight_layout()
  storage.save_figure(fig, path)
  plt.close(fig)
