"""The trade-off sweep: panels, defense strengths, and the cells they make.

A config (:func:`default_config`, edited by the presets of
``experiments/configs/tradeoff.py``) names panels (model x dataset and its
attack suite), seeds and defense strengths; :func:`plan` lists the cells a
run computes and :func:`cell_name` their file names. Both the run
(:mod:`repdef_jax.paper.tradeoff`) and its cost model
(:mod:`repdef_jax.paper.cost`) read the plan from here; the adaptive part
builds its training runs with :func:`panel_config` too.
"""

from __future__ import annotations

from typing import Any, Sequence

import ml_collections

from repdef_jax import training
from repdef_jax.paper import harness
from repdef_jax.paper import settings


DLG_SUITE = ("dlg", "idlg", "gs", "dlg_mask", "gs_mask", "dlg_drop",
             "gs_drop")
GS_SUITE = ("gs", "idlg", "gs_mask", "gs_drop")


def panel(dataset: str, model: str, attacks: Sequence[str],
          model_init: str = "default", model_kwargs: dict | None = None,
          **train: Any) -> ml_collections.ConfigDict:
  """A panel: model x dataset, its attack suite and training overrides."""
  return ml_collections.ConfigDict(dict(
      dataset=dataset, model=model, model_init=model_init,
      model_kwargs=ml_collections.ConfigDict(model_kwargs or {}),
      attacks=tuple(attacks), train=ml_collections.ConfigDict(train)))


def default_config() -> ml_collections.ConfigDict:
  """The paper-scale trade-off (the ``full`` preset); presets edit it."""
  c = ml_collections.ConfigDict()
  c.dry_run = False
  # Earlier tradeoff.json whose cell timings give the dry run's rates.
  c.cost_reference = "docs/results/tradeoff/tradeoff.json"
  # Measured unit costs (python -m experiments.benchmark --parts=unit_costs)
  # price the models that no finished cell has timed.
  c.unit_costs_reference = "docs/benchmarks/benchmarks.json"
  c.data_dir = ""
  # Comma-separated names of the panels to run and analyse, e.g.
  # 'leakage_mnist'; '' runs them all. Cells do not depend on it: a run of
  # one panel and a run of all share their finished cells.
  c.panels_only = ""
  c.seeds = (0, 1, 2)
  # The paper's models (labelled): DLG's LeNet, GS's ConvNet (narrower in
  # medium), and the defense-favourable leakage CNN.
  c.panels = ml_collections.ConfigDict({
      # LeNet learns with DLG's U(-0.5, 0.5) init at lr 0.1 (measured: 0.86
      # at 200 rounds on the paper's MNIST split; the default init stays at
      # chance for 40 rounds at every lr tried).
      "lenet_mnist": panel("mnist", "lenet", DLG_SUITE, model_init="uniform",
                           client_lr=0.1),
      "lenet_cifar10": panel("cifar10", "lenet", DLG_SUITE,
                             model_init="uniform", client_lr=0.1,
                             rounds=1000),
      "convnet_cifar10": panel("cifar10", "convnet64", GS_SUITE,
                               client_lr=0.05, rounds=1000),
      "convnet_mnist": panel("mnist", "convnet64", GS_SUITE, client_lr=0.05),
      "leakage_mnist": panel("mnist", "leakage", DLG_SUITE, client_lr=0.05),
  })
  c.defenses = ml_collections.ConfigDict({
      "soteria": (10., 20., 30., 40., 50., 60., 70., 80., 90., 95., 99.),
      "compression": (10., 20., 30., 40., 50., 60., 70., 80., 90., 95., 99.),
      "dp_gaussian": (1e-4, 3e-4, 1e-3, 3e-3, 1e-2, 3e-2, 1e-1, 3e-1, 1.0),
      "dp_laplace": (1e-4, 3e-4, 1e-3, 3e-3, 1e-2, 3e-2, 1e-1, 3e-1, 1.0),
  })
  c.num_images = 8
  # Attack config overrides per family (see repdef_jax.attacks DLGConfig /
  # GSConfig); the paper's budgets in full.
  c.attack_budgets = ml_collections.ConfigDict({
      "dlg": {"outer_steps": 300, "inner_steps": 20},
      "gs": {"iterations": 24000, "restarts": 2},
  })
  c.give_labels = True
  c.train = settings.federated_setting("paper", log_every=5,
                                       max_test_examples=2000)
  c.accuracy_window = 5  # last rounds (the test set is scored every round)
  c.update_attack = ml_collections.ConfigDict(dict(
      cells=ml_collections.ConfigDict({"none": (0.0,),
                                       "soteria": (40.0, 80.0),
                                       "compression": (90.0,),
                                       "dp_gaussian": (1e-2,)}),
      stages=("first", "mid", "final"), batch=4, local_steps=5,
      attacks=("gs", "gs_mask", "gs_drop", "dlg"),
      # Per family, over attack_budgets: a multi-image update needs a
      # longer attack than a one-image gradient (docs/evaluation.md).
      # Optional ``unroll`` (absent: False): GS unrolls the client's local
      # steps (:func:`budgets`); the ``full`` preset sets it.
      budgets=ml_collections.ConfigDict()))
  c.thresholds = (0.1, 0.2, 0.3)  # sensitivity of the verdicts
  c.threshold = 0.2  # SSIM at or below which an image is unrecognisable
  c.success_ssim = 0.6
  return c


def strengths(config: ml_collections.ConfigDict) -> list[tuple[str, float]]:
  """``[(defense, strength)]``: the undefended cell, then every sweep point."""
  out = [("none", 0.0)]
  for name, values in config.defenses.items():
    out += [(name, float(s)) for s in values]
  return out


def budgets(config: ml_collections.ConfigDict, kind: str,
            panel: str | None = None) -> dict[str, dict]:
  """Attack budgets per family of an 'attack' (round-0 one-image) or
  'update' (real update: ``update_attack.budgets`` over them) cell.

  With ``update_attack.unroll`` (absent: False), GS on ``panel``'s updates
  unrolls the client's local steps at its learning rate
  (:class:`repdef_jax.attacks.inverting.GSConfig` ``local_steps``).
  """
  base = config.attack_budgets.to_dict()
  if kind != "update":
    return base
  ua = config.update_attack
  own = ua.get("budgets", None)
  out = harness.merge_budgets(base, own.to_dict() if own else None)
  if ua.get("unroll", False):
    out = harness.merge_budgets(out, {"gs": {
        "local_steps": int(ua.local_steps),
        "local_lr": float(panel_config(config, panel).client_lr)}})
  return out


def update_strengths(config: ml_collections.ConfigDict
                     ) -> list[tuple[str, float]]:
  """The (defense, strength) cells whose real updates are attacked."""
  return [(d, float(s)) for d, values in config.update_attack.cells.items()
          for s in values]


def panel_config(config: ml_collections.ConfigDict,
                 name: str) -> ml_collections.ConfigDict:
  """The training block of a panel: the shared ``train`` with its overrides."""
  panel = config.panels[name]
  c = training.default_config()
  c.update(config.train.to_dict())
  c.update(panel.get("train", ml_collections.ConfigDict()).to_dict())
  c.dataset = panel.dataset
  c.model = panel.model
  c.model_init = panel.model_init
  c.model_kwargs = panel.get("model_kwargs", ml_collections.ConfigDict())
  c.data_dir = config.data_dir
  c.plot = False
  return c


def select_panels(config: ml_collections.ConfigDict
                  ) -> ml_collections.ConfigDict:
  """``config`` with its panels narrowed to ``config.panels_only``.

  Returns ``config`` itself when ``panels_only`` is empty, else a copy.

  Raises:
    ValueError: a name in ``panels_only`` that is not one of the panels.
  """
  names = [n.strip() for n in str(config.get("panels_only") or "").split(",")
           if n.strip()]
  if not names:
    return config
  unknown = [n for n in names if n not in config.panels]
  if unknown:
    raise ValueError(f"panels_only must name panels of the config "
                     f"({', '.join(config.panels)}), separated by commas; "
                     f"got {', '.join(repr(n) for n in unknown)}.")
  narrowed = config.copy_and_resolve_references()
  with narrowed.unlocked():
    for name in [n for n in narrowed.panels if n not in names]:
      del narrowed.panels[name]
  return narrowed


def plan(config: ml_collections.ConfigDict) -> list[dict[str, Any]]:
  """Every cell of the run, in execution order (for progress and dry runs)."""
  cells = []
  upd = set(update_strengths(config))
  for panel in config.panels:
    for seed in config.seeds:
      for defense, strength in strengths(config):
        base = {"panel": panel, "seed": int(seed), "defense": defense,
                "strength": strength}
        cells.append({**base, "kind": "train"})
        cells.append({**base, "kind": "attack"})
        if (defense, strength) in upd:
          cells += [{**base, "kind": "update", "stage": st}
                    for st in config.update_attack.stages]
  return cells


def cell_name(cell: dict[str, Any]) -> str:
  """The file-system name of a planned cell."""
  return harness.cell_name(cell["panel"], f"seed{cell['seed']}", cell["kind"],
                           cell["defense"], cell["strength"],
                           cell.get("stage", ""))
