r"""Utility-privacy trade-off (Sun et al. 2021, Section 6, Fig. 4/5).

  python -m experiments.tradeoff --config=experiments/configs/tradeoff.py:medium \
      --workdir=runs/tradeoff --data_dir=$TFDS_DATA_DIR
  python -m experiments.tradeoff --config=experiments/configs/tradeoff.py:full \
      --config.dry_run=True --workdir=runs/tradeoff_full   # plan + cost only

Per panel (model x dataset), seed, defense and strength: test accuracy of
defended FedAvg (the defense at every local step) and the best of an attack
suite (DLG, iDLG, GS, adaptive *_mask / *_drop) on a client's one-image
gradient at round 0 and on its real update at round 0, mid-training and the
end; statistics and verdict rules in docs/evaluation.md. Writes
``tradeoff.json`` and ``tradeoff.png``; every cell resumes.

What the paper claims: Soteria's MSE > 160x the baselines' at equal accuracy;
no accuracy lost where reconstructions become unrecognisable (baselines: up
to 6 % DLG / 9 % GS); accuracy holds until MSE 0.8. Presets: ``quick`` (CI
smoke run), ``medium`` (every claim at the paper's split, 3 seeds, 8 images
per point; ~2 h on a 2-core CPU), ``full`` (paper scale, GPU/TPU), ``tiny``
(tests).
"""

import ml_collections

from repdef_jax.paper import settings

DLG_SUITE = ("dlg", "idlg", "gs", "dlg_mask", "gs_mask", "dlg_drop",
             "gs_drop")
GS_SUITE = ("gs", "idlg", "gs_mask", "gs_drop")


def _panel(dataset, model, attacks, model_init="default", model_kwargs=None,
           **train):
  return ml_collections.ConfigDict(dict(
      dataset=dataset, model=model, model_init=model_init,
      model_kwargs=ml_collections.ConfigDict(model_kwargs or {}),
      attacks=tuple(attacks), train=ml_collections.ConfigDict(train)))


def get_config(preset: str = "medium") -> ml_collections.ConfigDict:
  """'quick', 'medium', 'full' or 'tiny'."""
  c = ml_collections.ConfigDict()
  c.dry_run = False
  # Earlier tradeoff.json whose cell timings give the dry run's rates.
  c.cost_reference = "docs/results/tradeoff/tradeoff.json"
  c.data_dir = ""
  c.seeds = (0, 1, 2)
  # The paper's models (labelled): DLG's LeNet, GS's ConvNet (narrower in
  # medium), and the defense-favourable leakage CNN.
  c.panels = ml_collections.ConfigDict({
      "lenet_mnist": _panel("mnist", "lenet", DLG_SUITE, client_lr=0.1),
      "lenet_cifar10": _panel("cifar10", "lenet", DLG_SUITE, client_lr=0.1),
      "convnet_cifar10": _panel("cifar10", "convnet64", GS_SUITE,
                                client_lr=0.05),
      "convnet_mnist": _panel("mnist", "convnet64", GS_SUITE, client_lr=0.05),
      "leakage_mnist": _panel("mnist", "leakage", DLG_SUITE, client_lr=0.05),
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
  c.accuracy_window = 5  # evaluations (every log_every rounds)
  c.update_attack = ml_collections.ConfigDict(dict(
      cells=ml_collections.ConfigDict({"none": (0.0,),
                                       "soteria": (40.0, 80.0),
                                       "compression": (90.0,),
                                       "dp_gaussian": (1e-2,)}),
      stages=("first", "mid", "final"), batch=4, local_steps=5,
      attacks=("gs", "gs_mask", "gs_drop", "dlg")))
  c.thresholds = (0.1, 0.2, 0.3)  # sensitivity of the verdicts
  c.threshold = 0.2  # SSIM at or below which a reconstruction is unrecognisable
  c.success_ssim = 0.6
  if preset == "full":
    c.panels.convnet_cifar10.train.rounds = 1000
    c.panels.lenet_cifar10.train.rounds = 1000
  elif preset == "medium":
    c.panels = ml_collections.ConfigDict({
        "lenet_mnist": _panel("mnist", "lenet", DLG_SUITE, client_lr=0.1,
                              rounds=30),
        "convnet16_cifar10": _panel("cifar10", "convnet64", GS_SUITE,
                                    model_kwargs={"width": 16},
                                    client_lr=0.05, rounds=30),
        "leakage_mnist": _panel("mnist", "leakage", DLG_SUITE,
                                client_lr=0.05, rounds=30),
    })
    c.attack_budgets = ml_collections.ConfigDict({
        "dlg": {"outer_steps": 100, "inner_steps": 20},
        "gs": {"iterations": 1000, "restarts": 1},
    })
  elif preset == "quick":
    c.seeds = (0,)
    c.panels = ml_collections.ConfigDict({
        "leakage_mnist": _panel("mnist", "leakage", ("dlg", "gs", "gs_mask"),
                                client_lr=0.05, rounds=10,
                                num_clients=20, samples_per_class=50),
    })
    c.defenses = ml_collections.ConfigDict({
        "soteria": (40., 80.), "compression": (90.,), "dp_gaussian": (1e-2,)})
    c.num_images = 2
    c.attack_budgets = ml_collections.ConfigDict({
        "dlg": {"outer_steps": 50, "inner_steps": 20},
        "gs": {"iterations": 500, "restarts": 1}})
    c.update_attack.cells = ml_collections.ConfigDict({"soteria": (80.0,)})
    c.update_attack.stages = ("first", "final")
    c.update_attack.attacks = ("gs", "gs_mask")
    c.train.update(dict(max_train_examples=10000, max_test_examples=1000,
                        log_every=1))
    c.accuracy_window = 3
  elif preset == "tiny":  # tests: seconds; 6 cells
    c.seeds = (0,)
    c.panels = ml_collections.ConfigDict({
        "logreg_mnist": _panel("mnist", "logreg", ("gs", "gs_mask"),
                               rounds=2)})
    c.defenses = ml_collections.ConfigDict({"soteria": (50.,)})
    c.num_images = 1
    c.attack_budgets = ml_collections.ConfigDict({
        "dlg": {"outer_steps": 2, "inner_steps": 2},
        "gs": {"iterations": 5, "restarts": 1}})
    c.train = settings.federated_setting("tiny")
    c.accuracy_window = 1
    c.update_attack.cells = ml_collections.ConfigDict({"soteria": (50.0,)})
    c.update_attack.stages = ("first", "final")
    c.update_attack.batch = 2
    c.update_attack.local_steps = 2
    c.update_attack.attacks = ("gs",)
  elif preset != "medium":
    raise ValueError(f"unknown preset {preset!r}; use 'quick', 'medium', "
                     "'full' or 'tiny'.")
  return c
