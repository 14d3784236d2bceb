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
gradients carry earlier representations unprotected),
whatever the rate or variant; the plain attack is the one Soteria stops.
"""

import ml_collections


def get_config(preset: str = "quick") -> ml_collections.ConfigDict:
  """'quick', 'full' or 'tiny' (tests)."""
  c = ml_collections.ConfigDict()
  c.seed = 0
  c.data_dir = ""
  c.dataset = "mnist"
  c.model = "lenet5"  # ReLU features: where 'count' and 'percentile' differ
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
  t = ml_collections.ConfigDict()
  t.num_clients = 100
  t.classes_per_client = 2
  t.samples_per_class = 100
  t.rounds = 50
  t.clients_per_round = 10
  t.local_steps = 5
  t.batch_size = 10
  t.client_lr = 0.1
  t.conv_impl = "patches"
  t.max_train_examples = 0
  t.max_test_examples = 1000
  t.checkpoint_every = 10
  t.log_every = 10
  c.train = t
  if preset == "quick":
    c.families = ("gs",)
    c.rates = (60.0, 90.0)
    c.num_images = 1
    c.attack_iterations = ml_collections.ConfigDict({"dlg": 30, "gs": 300})
    c.restarts = 1
    t.num_clients = 20
    t.samples_per_class = 20
    t.rounds = 10
    t.clients_per_round = 5
    t.max_train_examples = 5000
    t.checkpoint_every = 10
  elif preset == "tiny":
    c.model = "logreg"  # compiles in seconds
    c.families = ("gs",)
    c.variants = ("reference", "count")
    c.rates = (50.0,)
    c.num_images = 1
    c.attack_iterations = ml_collections.ConfigDict({"dlg": 2, "gs": 3})
    c.restarts = 1
    t.num_clients = 4
    t.samples_per_class = 2
    t.rounds = 1
    t.clients_per_round = 2
    t.local_steps = 1
    t.batch_size = 3
    t.max_test_examples = 20
    t.eval_batch = 20
    t.checkpoint_every = 1
    t.log_every = 1
  elif preset != "full":
    raise ValueError(f"unknown preset {preset!r}; use 'quick' or 'full'.")
  return c
