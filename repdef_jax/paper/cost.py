"""What a trade-off run will cost, from the timings of a run already made.

A cell's cost is its *work* (example-steps of FedAvg for a training cell,
attack iterations times images for an attack cell) times a *rate* (seconds
per unit of work) measured on finished cells of the same model, dataset,
kind and defense family. Rates come from the cells of the run being planned
(a resumed run) and from a reference result (``tradeoff.json`` of an earlier
run, whose ``cell_costs`` list every cell's work and seconds); a model the
references never ran is scaled from the nearest measured one by its forward
FLOPs and flagged as extrapolated.
"""

from __future__ import annotations

import os
from typing import Any, Sequence

import jax
import numpy as np

from repdef_jax import data as data_lib
from repdef_jax import models as models_lib
from repdef_jax import storage


def model_key(config, panel: str) -> str:
  """``model[kwargs]/dataset`` of a panel, e.g. ``convnet64[width=16]/mnist``."""
  spec = config.panels[panel]
  kwargs = dict(spec.get("model_kwargs", {}))
  extra = ",".join(f"{k}={v}" for k, v in sorted(kwargs.items()))
  return f"{spec.model}{f'[{extra}]' if extra else ''}/{spec.dataset}"


def family(defense: str) -> str:
  """Soteria computes a Jacobian per step; every other defense is cheap."""
  return "soteria" if defense == "soteria" else "plain"


def _iterations(config, attacks: Sequence[str]) -> int:
  """Worst-case attack iterations of a suite (no early stop)."""
  total = 0
  for a in attacks:
    b = config.attack_budgets["gs" if a.startswith("gs") else "dlg"]
    if a.startswith("gs"):
      total += int(b.get("iterations", 2000)) * int(b.get("restarts", 1))
    else:
      total += (int(b.get("outer_steps", 300)) * int(b.get("inner_steps", 20))
                * int(b.get("restarts", 1)))
  return total


def work(config, cell: dict[str, Any]) -> float:
  """The units of work of a planned cell (see the module docstring)."""
  from repdef_jax.paper import tradeoff  # pylint: disable=g-import-not-at-top
  tc = tradeoff.panel_config(config, cell["panel"])
  if cell["kind"] == "train":
    return float(tc.rounds * tc.clients_per_round * tc.local_steps *
                 tc.batch_size)
  if cell["kind"] == "attack":
    return float(config.num_images *
                 _iterations(config, config.panels[cell["panel"]].attacks))
  ua = config.update_attack
  return float(ua.batch * _iterations(config, ua.attacks))


def cell_costs(config, cells: Sequence[tuple[dict, dict]]) -> list[dict]:
  """``[{model, kind, family, work, seconds}]`` of finished cells."""
  out = []
  for cell, result in cells:
    if "cell_seconds" not in result:
      continue
    out.append({"model": model_key(config, cell["panel"]),
                "kind": cell["kind"], "family": family(cell["defense"]),
                "work": work(config, cell),
                "seconds": float(result["cell_seconds"])})
  return out


def _forward_flops(key: str) -> float:
  """FLOPs of one forward pass of a ``model[kwargs]/dataset`` key."""
  name_kw, dataset = key.split("/")
  name, _, kw = name_kw.partition("[")
  kwargs = {}
  for item in filter(None, kw.rstrip("]").split(",")):
    k, v = item.split("=")
    kwargs[k] = int(v) if v.isdigit() else v
  info = data_lib.get_info(dataset)
  model = models_lib.get_model(name, info.image_shape, info.num_classes,
                               **kwargs)
  params = jax.eval_shape(model.init, jax.random.key(0))
  x = jax.ShapeDtypeStruct((1, *info.image_shape), np.float32)
  cost = jax.jit(model.apply).lower(params, x).compile().cost_analysis()
  cost = cost[0] if isinstance(cost, (list, tuple)) else cost
  return float((cost or {}).get("flops", 0.0)) or 1.0


def rates(costs: Sequence[dict]) -> dict[tuple[str, str, str], float]:
  """Seconds per unit of work by (model, kind, family): total s / total work."""
  acc: dict[tuple[str, str, str], list[float]] = {}
  for c in costs:
    k = (c["model"], c["kind"], c["family"])
    s, w = acc.get(k, [0.0, 0.0])
    acc[k] = [s + c["seconds"], w + c["work"]]
  return {k: s / w for k, (s, w) in acc.items() if w > 0}


def estimate(config, cells: Sequence[dict], workdir: str,
             reference: str | None = None) -> dict[str, Any]:
  """Estimated seconds of every planned cell not finished yet.

  Args:
    config: the trade-off config.
    cells: the plan (:func:`repdef_jax.paper.tradeoff.plan`).
    workdir: the run's folder (finished cells there cost nothing more and
      give rates).
    reference: a ``tradeoff.json`` whose ``cell_costs`` give rates (default:
      ``config.cost_reference``).

  Returns:
    ``{'cells', 'finished', 'seconds', 'by_kind', 'extrapolated',
    'unknown', 'reference'}``: estimated seconds left, by kind; models whose
    rates were scaled by FLOPs; models with no rate at all.
  """
  from repdef_jax.paper import tradeoff  # pylint: disable=g-import-not-at-top
  store_dir = os.path.join(workdir, "cells")
  finished = []
  for cell in cells:
    r = storage.read_json(os.path.join(store_dir,
                                       f"{tradeoff.cell_name(cell)}.json"))
    if r is not None:
      finished.append((cell, r))
  costs = cell_costs(config, finished)
  reference = reference or config.get("cost_reference") or ""
  ref = storage.read_json(reference) if reference else None
  costs += (ref or {}).get("cell_costs", [])
  rate = rates(costs)
  done = {tradeoff.cell_name(c) for c, _ in finished}
  flops_cache: dict[str, float] = {}

  def flops(key):
    if key not in flops_cache:
      flops_cache[key] = _forward_flops(key)
    return flops_cache[key]

  total, by_kind, extrapolated, unknown = 0.0, {}, set(), set()
  for cell in cells:
    if tradeoff.cell_name(cell) in done:
      continue
    key = (model_key(config, cell["panel"]), cell["kind"],
           family(cell["defense"]))
    r = rate.get(key)
    if r is None:
      peers = [k for k in rate if k[1:] == key[1:]]
      if not peers:
        unknown.add(key)
        continue
      # Scale the cheapest-to-compare measured model by forward FLOPs.
      near = min(peers, key=lambda k: abs(np.log(flops(k[0]) /
                                                 flops(key[0]))))
      r = rate[near] * flops(key[0]) / flops(near[0])
      extrapolated.add(f"{key[0]} from {near[0]}")
    s = r * work(config, cell)
    total += s
    by_kind[cell["kind"]] = by_kind.get(cell["kind"], 0.0) + s
  return {"cells": len(cells), "finished": len(done), "seconds": total,
          "by_kind": by_kind, "extrapolated": sorted(extrapolated),
          "unknown": sorted("/".join(k) for k in unknown),
          "reference": reference or None}


def render(est: dict[str, Any]) -> str:
  """The estimate as a few lines of text."""
  lines = [f"planned cells: {est['cells']} ({est['finished']} finished)",
           f"estimated time left: {est['seconds'] / 3600:.2f} h "
           f"({est['seconds']:.0f} s) on the machine of the reference "
           f"timings ({est['reference'] or 'this workdir'})"]
  lines += [f"  {k}: {v / 3600:.2f} h" for k, v in
            sorted(est["by_kind"].items())]
  if est["extrapolated"]:
    lines.append("extrapolated by forward FLOPs: " +
                 "; ".join(est["extrapolated"]))
  if est["unknown"]:
    lines.append("no timing for: " + "; ".join(est["unknown"]) +
                 " (not included)")
  return "\n".join(lines)
