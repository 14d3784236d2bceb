"""What a trade-off run will cost, from the timings of a run already made.

A cell's cost is its *work* (example-steps of FedAvg for a training cell,
attack iterations times images for an attack cell) times a *rate* (seconds
per unit of work). Rates come, in this order, from:

1. finished cells of the same model, dataset, kind and defense family: the
   run being planned (a resumed run) and a reference result
   (``tradeoff.json`` of an earlier run, whose ``cell_costs`` list every
   cell's work and seconds);
2. measured unit costs (``unit_costs`` of ``docs/benchmarks/benchmarks.json``,
   :mod:`experiments.benchmarks.costs`): one local FedAvg step of the model
   at the panel's batch size, plain and with Soteria, one DLG / GS iteration
   on one CIFAR-10 image. Neither a lower nor an upper bound: training
   cells leave out evaluation, compilation and per-round host work (too
   low), attack cells take the full budget with no early stop, one image at
   a time, at CIFAR-10 shapes (too high where images run as a batch or are
   MNIST-sized); :func:`estimate` reports which models they priced;
3. the nearest measured model scaled by forward FLOPs (flagged as
   extrapolated).
"""

from __future__ import annotations

import functools
import os
from typing import Any, Sequence

import jax
import numpy as np

from repdef_jax import data as data_lib
from repdef_jax import models as models_lib
from repdef_jax import storage
from repdef_jax.defenses import soteria
from repdef_jax.paper import sweep


def key(model: str, kwargs: dict[str, Any], dataset: str) -> str:
  """``model[kwargs]/dataset``, e.g. ``convnet64[width=16]/mnist``.

  Keyword arguments equal to the model's defaults are left out.
  """
  kwargs = models_lib.non_default_kwargs(model, kwargs)
  extra = ",".join(f"{k}={v}" for k, v in sorted(kwargs.items()))
  return f"{model}{f'[{extra}]' if extra else ''}/{dataset}"


def model_key(config, panel: str) -> str:
  """The :func:`key` of a panel's model and dataset."""
  spec = config.panels[panel]
  return key(spec.model, spec.get("model_kwargs", {}), spec.dataset)


def family(defense: str) -> str:
  """Soteria computes a Jacobian per step; every other defense is cheap."""
  return "soteria" if defense == "soteria" else "plain"


def _iterations_by_attack(budgets: dict[str, dict], attacks: Sequence[str]
                          ) -> dict[str, int]:
  """Worst-case iterations (no early stop) of a suite: ``{'dlg', 'gs'}``."""
  total = {"dlg": 0, "gs": 0}
  for a in attacks:
    fam = "gs" if a.startswith("gs") else "dlg"
    b = budgets.get(fam, {})
    if fam == "gs":
      total[fam] += (int(b.get("iterations", 2000)) *
                     int(b.get("restarts", 1)) * int(b.get("local_steps", 1)))
    else:
      total[fam] += (int(b.get("outer_steps", 300)) *
                     int(b.get("inner_steps", 20)) * int(b.get("restarts", 1)))
  return total


def _suite(config, cell: dict[str, Any]) -> tuple[Sequence[str], int, dict]:
  """(attacks, images, budgets) of an attack or update cell."""
  if cell["kind"] == "attack":
    return (config.panels[cell["panel"]].attacks, config.num_images,
            sweep.budgets(config, "attack"))
  return (config.update_attack.attacks, config.update_attack.batch,
          sweep.budgets(config, "update", cell["panel"]))


def work(config, cell: dict[str, Any]) -> float:
  """The units of work of a planned cell (see the module docstring)."""
  if cell["kind"] == "train":
    tc = sweep.panel_config(config, cell["panel"])
    return float(tc.rounds * tc.clients_per_round * tc.local_steps *
                 tc.batch_size)
  attacks, images, budgets = _suite(config, cell)
  return float(images * sum(_iterations_by_attack(budgets, attacks).values()))


def cell_costs(config, cells: Sequence[tuple[dict, dict]]) -> list[dict]:
  """``[{model, kind, family, work, seconds, cpu}]`` of finished cells
  (``cpu``: the CPU model the cell ran on; None where not recorded). Cells
  that did less than their planned work (a skipped update attack, a
  training run stopped by divergence) are left out: they would lower the
  rates."""
  out = []
  for cell, result in cells:
    if ("cell_seconds" not in result or "skipped" in result or
        result.get("diverged_at_round") is not None):
      continue
    out.append({"model": model_key(config, cell["panel"]),
                "kind": cell["kind"], "family": family(cell["defense"]),
                "work": work(config, cell),
                "seconds": float(result["cell_seconds"]),
                "cpu": result.get("host", {}).get("cpu")})
  return out


def _model_of(key: str) -> tuple[models_lib.Model, tuple[int, ...]]:
  """The model and image shape of a ``model[kwargs]/dataset`` key."""
  name_kw, dataset = key.split("/")
  name, _, kw = name_kw.partition("[")
  kwargs = {}
  for item in filter(None, kw.rstrip("]").split(",")):
    k, v = item.split("=")
    kwargs[k] = int(v) if v.isdigit() else v
  info = data_lib.get_info(dataset)
  return (models_lib.get_model(name, info.image_shape, info.num_classes,
                               **kwargs), tuple(info.image_shape))


@functools.lru_cache(maxsize=None)
def _forward_flops(key: str) -> float:
  """FLOPs of one forward pass of one image (XLA's cost analysis)."""
  model, shape = _model_of(key)
  params = jax.eval_shape(model.init, jax.random.key(0))
  x = jax.ShapeDtypeStruct((1, *shape), np.float32)
  cost = jax.jit(model.apply).lower(params, x).compile().cost_analysis()
  cost = cost[0] if isinstance(cost, (list, tuple)) else cost
  return float((cost or {}).get("flops", 0.0)) or 1.0


# One modern GPU, as a model (no GPU was lent to measure one): FLOPs at
# GPU_FLOPS (30 % of an H100's 67 TFLOP/s fp32 peak), and no step or
# iteration faster than GPU_STEP_FLOOR_S (kernel launches of small models).
# FLOPs per unit, in forward passes of one image: a training step 3 per
# example (forward + backward), plus 2 per example and Jacobian pass with
# Soteria (a pullback per representation feature, or a pushforward per input
# pixel where it runs in forward mode: the same cost per pass on a 2-core
# CPU, ConvNet64 on MNIST); a GS iteration 4 (forward,
# backward, and the backward of that); a DLG (L-BFGS) iteration 12 (about
# three loss-and-gradient evaluations of 4).
GPU_FLOPS = 20e12
GPU_STEP_FLOOR_S = 2e-4
_FORWARDS = {"train": 3.0, "soteria": 2.0, "gs": 4.0, "dlg": 12.0}


@functools.lru_cache(maxsize=None)
def _jacobian_passes(key: str) -> int:
  """Passes per example of the Soteria Jacobian (features or pixels)."""
  return soteria.jacobian_passes(_model_of(key)[0])


def gpu_seconds(config, cell: dict[str, Any]) -> float:
  """A cell's seconds on one modern GPU from the FLOP model above.

  Attack images run as one batch (:mod:`repdef_jax.paper.batched`).
  """
  key_ = model_key(config, cell["panel"])
  fwd, passes = _forward_flops(key_), _jacobian_passes(key_)
  unit = lambda forwards: max(forwards * fwd / GPU_FLOPS, GPU_STEP_FLOOR_S)
  if cell["kind"] == "train":
    tc = sweep.panel_config(config, cell["panel"])
    b = tc.batch_size
    per_step = _FORWARDS["train"] * b
    if family(cell["defense"]) == "soteria":
      per_step += _FORWARDS["soteria"] * b * passes
    return work(config, cell) / b * unit(per_step)
  attacks, images, budgets = _suite(config, cell)
  its = _iterations_by_attack(budgets, attacks)
  return sum(n * unit(images * _FORWARDS[a]) for a, n in its.items())


def unit_seconds(config, cell: dict[str, Any],
                 unit: dict[str, Any] | None) -> float | None:
  """A cell's seconds from measured unit costs; None when they lack it.

  Args:
    config: the trade-off config.
    cell: a planned cell.
    unit: ``unit_costs`` of a benchmark report
      (:func:`experiments.benchmarks.costs.unit_costs`) or None.
  """
  if not unit:
    return None
  spec = config.panels[cell["panel"]]
  wanted = key(spec.model, spec.get("model_kwargs", {}), "")
  names = [n for n, m in unit.get("models", {}).items()
           if key(m["name"], m.get("kwargs", {}), "") == wanted]
  if not names:
    return None
  name = names[0]
  if cell["kind"] == "train":
    tc = sweep.panel_config(config, cell["panel"])
    per_batch = unit.get("fedavg_step", {}).get(name, {}).get(spec.dataset,
                                                              {})
    # Batch keys are ints as measured, strings once read back from JSON.
    step = per_batch.get(str(tc.batch_size), per_batch.get(tc.batch_size))
    if step is None:
      return None
    per_step = step["soteria_s" if family(cell["defense"]) == "soteria"
                    else "plain_s"]
    return per_step * work(config, cell) / tc.batch_size
  dlg = unit.get("dlg_outer_step_s", {}).get(name)
  gs = unit.get("gs_iteration_s", {}).get(name)
  attacks, images, budgets = _suite(config, cell)
  its = _iterations_by_attack(budgets, attacks)
  if (its["dlg"] and dlg is None) or (its["gs"] and gs is None):
    return None
  per_dlg = (dlg or 0.0) / int(unit.get("dlg_inner_steps", 20))
  return images * (its["dlg"] * per_dlg + its["gs"] * (gs or 0.0))


def rates(costs: Sequence[dict]) -> dict[tuple[str, str, str], float]:
  """Seconds per unit of work by (model, kind, family): total s / total work."""
  acc: dict[tuple[str, str, str], list[float]] = {}
  for c in costs:
    k = (c["model"], c["kind"], c["family"])
    s, w = acc.get(k, [0.0, 0.0])
    acc[k] = [s + c["seconds"], w + c["work"]]
  return {k: s / w for k, (s, w) in acc.items() if w > 0}


def estimate(config, cells: Sequence[dict], workdir: str | None,
             reference: str | None = None,
             units: str | dict[str, Any] | None = None) -> dict[str, Any]:
  """Estimated seconds of every planned cell not finished yet.

  Args:
    config: the trade-off config.
    cells: the plan (:func:`repdef_jax.paper.sweep.plan`).
    workdir: the run's folder (finished cells there cost nothing more and
      give rates); None for a plan with nothing run.
    reference: a ``tradeoff.json`` whose ``cell_costs`` give rates (default:
      ``config.cost_reference``; '' for none).
    units: a benchmark report path (its ``unit_costs``) or the unit costs
      themselves (default: ``config.unit_costs_reference``; '' for none).

  Returns:
    ``{'cells', 'finished', 'seconds', 'gpu_seconds', 'by_kind',
    'by_model', 'from_units', 'extrapolated', 'unknown', 'reference',
    'units'}``: estimated seconds left on the machine of the timings and on
    one GPU (:func:`gpu_seconds`), by kind and by model; models priced by
    unit costs; models whose rates were scaled by FLOPs; models with no rate
    at all.
  """
  finished = []
  for cell in cells if workdir else ():
    r = storage.read_json(os.path.join(workdir, "cells",
                                       f"{sweep.cell_name(cell)}.json"))
    if r is not None:
      finished.append((cell, r))
  costs = cell_costs(config, finished)
  missing = []
  if reference is None:
    reference = config.get("cost_reference") or ""
  reference = _find(reference, missing)
  ref = storage.read_json(reference) if reference else None
  costs += (ref or {}).get("cell_costs", [])
  rate = rates(costs)
  if units is None:
    units = config.get("unit_costs_reference") or ""
  unit = units
  if isinstance(units, str):
    units = _find(units, missing)
    unit = (storage.read_json(units) or {}).get("unit_costs") if units else None
  done = {sweep.cell_name(c) for c, _ in finished}

  total, gpu_total, by_kind, by_model = 0.0, 0.0, {}, {}
  from_units, extrapolated, unknown = set(), set(), set()
  for cell in cells:
    if sweep.cell_name(cell) in done:
      continue
    gpu_total += gpu_seconds(config, cell)
    key = (model_key(config, cell["panel"]), cell["kind"],
           family(cell["defense"]))
    if key in rate:
      s = rate[key] * work(config, cell)
    else:
      s = unit_seconds(config, cell, unit)
      if s is not None:
        from_units.add(key[0])
    if s is None:
      peers = [k for k in rate if k[1:] == key[1:]]
      if not peers:
        unknown.add(key)
        continue
      # Scale the cheapest-to-compare measured model by forward FLOPs.
      near = min(peers, key=lambda k: abs(np.log(_forward_flops(k[0]) /
                                                 _forward_flops(key[0]))))
      s = (rate[near] * _forward_flops(key[0]) / _forward_flops(near[0]) *
           work(config, cell))
      extrapolated.add(f"{key[0]} from {near[0]}")
    total += s
    by_kind[cell["kind"]] = by_kind.get(cell["kind"], 0.0) + s
    by_model[key[0]] = by_model.get(key[0], 0.0) + s
  return {"cells": len(cells), "finished": len(done), "seconds": total,
          "gpu_seconds": gpu_total,
          "by_kind": by_kind, "by_model": by_model,
          "from_units": sorted(from_units),
          "extrapolated": sorted(extrapolated),
          "unknown": sorted("/".join(k) for k in unknown),
          "reference": reference or None,
          "units": units if isinstance(units, str) and units else None,
          "missing": missing}


def _find(path: str, missing: list[str]) -> str | None:
  """``path`` from the current folder, else (relative) from the checkout
  holding this package; None for '' and when neither exists (e.g. an
  installed wheel, which ships no ``docs/``: then ``path`` joins
  ``missing``)."""
  if not path or os.path.exists(path):
    return path or None
  root = os.path.dirname(os.path.dirname(os.path.dirname(
      os.path.abspath(__file__))))
  alt = os.path.join(root, path)
  if not os.path.isabs(path) and os.path.exists(alt):
    return alt
  missing.append(path)
  return None


def render(est: dict[str, Any]) -> str:
  """The estimate as a few lines of text."""
  sources = [s for s in (est["reference"], est.get("units")) if s]
  lines = [f"planned cells: {est['cells']} ({est['finished']} finished)",
           f"estimated time left: {est['seconds'] / 3600:.2f} h "
           f"({est['seconds']:.0f} s) on the machine of the timings "
           f"({', '.join(sources) or 'this workdir'})"]
  lines += [f"  {k}: {v / 3600:.2f} h" for k, v in
            sorted(est["by_kind"].items())]
  lines += [f"  {k}: {v / 3600:.2f} h" for k, v in
            sorted(est.get("by_model", {}).items())]
  lines.append(f"one modern GPU, from FLOPs (a model, not a measurement; "
               f"repdef_jax.paper.cost.GPU_FLOPS): "
               f"{est['gpu_seconds'] / 3600:.2f} h")
  if est.get("from_units"):
    lines.append("priced from measured unit costs (training without "
                 "evaluation: too low; attacks at full budget, one CIFAR-10 "
                 "image at a time: too high): " +
                 "; ".join(est["from_units"]))
  if est["extrapolated"]:
    lines.append("extrapolated by forward FLOPs: " +
                 "; ".join(est["extrapolated"]))
  if est.get("missing"):
    lines.append("timings not found, not used: " +
                 "; ".join(est["missing"]))
  if est["unknown"]:
    lines.append("no timing for: " + "; ".join(est["unknown"]) +
                 " (not included)")
  return "\n".join(lines)
