r"""Adaptive attacks against Soteria (beyond the paper).

Plain vs defended-layer-dropped (Balunovic et al. 2022) vs mask-read-off
(GGL, Li et al. 2022) attacks on Soteria-defended one-image gradients, at
several pruning rates, at the initial global model and after some rounds of
FedAvg, for the reference rule, selection='count' and score='exact'. Run
from the repository root:

  python -m experiments.adaptive --config=experiments/configs/adaptive.py:quick \
      --workdir=/tmp/adaptive_quick --data_dir=$TFDS_DATA_DIR

Writes ``adaptive.json`` (every cell with its verdict: the defense "holds"
when the mean SSIM is <= 0.2) and ``adaptive.png`` (SSIM vs rate). What it
should show, honestly: the drop attack ignores the only layer Soteria
touches, so it recovers the image about as well as without the defense
whenever the other layers' gradients suffice (LeNet5's FC 120 / FC 84
gradients carry earlier representations unprotected), whatever the rate or
variant; the mask attack reads the pruned rows off the shared gradient and
matches only the rest, so pruning alone cannot stop it where the unpruned
rows and the other layers determine the image (the leakage CNN).
"""

import ml_collections

from repdef_jax.paper import settings


def get_config(preset: str = "quick") -> ml_collections.ConfigDict:
  """'quick', 'full' or 'tiny' (tests)."""
  c = ml_collections.ConfigDict()
  c.seed = 0
  c.data_dir = ""
  c.dataset = "mnist"
  # leakage: the trade-off's model, whose only other gradient is the conv's;
  # lenet5: ReLU features (where 'count' and 'percentile' differ) and two
  # unprotected FC layers before the defended one.
  c.models = ("leakage", "lenet5")
  c.model_init = "default"
  c.families = ("dlg", "gs")
  c.stages = ("init", "trained")
  c.variants = ("reference", "count", "exact")
  c.rates = (40.0, 60.0, 80.0)
  c.num_images = 4
  c.attack_iterations = ml_collections.ConfigDict({"dlg": 300, "gs": 4000})
  c.restarts = 2
  c.give_labels = True
  c.unrecognisable_threshold = 0.2
  c.train = settings.federated_setting("paper", rounds=50,
                                       max_test_examples=1000)
  if preset == "quick":
    c.families = ("gs",)
    c.rates = (60.0, 90.0)
    c.num_images = 1
    c.attack_iterations = ml_collections.ConfigDict({"dlg": 30, "gs": 300})
    c.restarts = 1
    c.train.update(dict(num_clients=20, samples_per_class=20, rounds=10,
                        clients_per_round=5, max_train_examples=5000))
  elif preset == "tiny":
    c.models = ("logreg", "mlp")  # compile in seconds
    c.families = ("gs",)
    c.variants = ("reference", "count")
    c.rates = (50.0,)
    c.num_images = 1
    c.attack_iterations = ml_collections.ConfigDict({"dlg": 2, "gs": 3})
    c.restarts = 1
    c.train = settings.federated_setting("tiny")
  elif preset != "full":
    raise ValueError(f"unknown preset {preset!r}; use 'quick' or 'full'.")
  return c
