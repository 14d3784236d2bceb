r"""Theorem 1's certified bound vs the distances attacks actually reach.

Sun et al. 2021, Theorem 1: a lower bound on ||X - X'|| from the size of the
representation perturbation and the norm of the feature extractor's
Jacobian (computed by repdef_jax.defenses.certify). For each Soteria pruning
rate it plots the bound beside ||X - X'||_2 of DLG and GS reconstructions
from the defended gradient. Run from the repository root:

  python -m experiments.certified --config=experiments/configs/certified.py:quick \
      --workdir=/tmp/certified_quick --data_dir=$TFDS_DATA_DIR

Writes ``certified.json`` and ``certified.png``. What it should show: the
bound grows with the pruning rate and is 0 at rate 0; the attacks'
distances lie above it (the bound is first order and assumes the attacker
matches the perturbed representation exactly, so it is loose; the JSON
reports the fraction of (image, rate) pairs where the attack distance is
above the bound).
"""

import ml_collections


def get_config(preset: str = "quick") -> ml_collections.ConfigDict:
  """'quick', 'full' or 'tiny' (tests)."""
  c = ml_collections.ConfigDict()
  c.seed = 0
  c.data_dir = ""
  c.allow_synthetic = False
  c.dataset = "cifar10"
  c.model = "lenet"
  c.model_init = "uniform"
  c.rates = (0.0, 20.0, 40.0, 60.0, 80.0, 90.0)
  c.attacks = ("dlg", "gs")
  c.attack_iterations = ml_collections.ConfigDict({"dlg": 300, "gs": 4000})
  c.restarts = 2
  c.give_labels = True
  c.num_images = 8
  if preset == "quick":
    c.rates = (0.0, 40.0, 80.0)
    c.attack_iterations = ml_collections.ConfigDict({"dlg": 30, "gs": 300})
    c.restarts = 1
    c.num_images = 2
  elif preset == "tiny":
    c.model = "logreg"  # compiles in seconds
    c.dataset = "mnist"
    c.rates = (0.0, 50.0)
    c.attacks = ("gs",)
    c.attack_iterations = ml_collections.ConfigDict({"dlg": 2, "gs": 3})
    c.restarts = 1
    c.num_images = 1
    c.allow_synthetic = True
  elif preset != "full":
    raise ValueError(f"unknown preset {preset!r}; use 'quick' or 'full'.")
  return c
