r"""Visual comparison: GS reconstructions of CIFAR-10 images under each defense.

Sun et al. 2021, Section 6 (Fig. 5): with GS on a CIFAR-10 image Soteria
makes the reconstruction unrecognisable after pruning 50-60 % of the
FC-layer's inputs, while gradient compression still leaves it recognisable
after pruning 80 % of every tensor. Same gradient, parameters and attack key
for every row. Run from the repository root:

  python -m experiments.visual --config=experiments/configs/visual.py:quick \
      --workdir=/tmp/visual_quick --data_dir=$TFDS_DATA_DIR

Writes ``visual.png`` (original, then one row per defense setting, titles:
clamped MSE / SSIM) and ``visual.json``. Quick preset: GS (labels given,
1,000 iterations, 1 restart) on the paper's representation-leakage CNN (one
sigmoid conv, 12 channels -> FC) instead of the width-64 ConvNet, because a
CPU-sized GS run on ConvNet64 reconstructs nothing even without a defense
(measured: SSIM < 0.1 after 300 iterations), whereas this one reconstructs
the undefended images exactly (SSIM 1.0); the 9 settings took 79 s; full:
GS on ConvNet64, 4,000 iterations, 4 restarts.
"""

import ml_collections


def get_config(preset: str = "quick") -> ml_collections.ConfigDict:
  """'quick', 'full' or 'tiny' (tests)."""
  c = ml_collections.ConfigDict()
  c.seed = 0
  c.data_dir = ""
  c.allow_synthetic = False
  c.dataset = "cifar10"
  c.model = "convnet64"
  c.model_init = "default"
  c.model_kwargs = ml_collections.ConfigDict()
  c.attack = "gs"
  c.num_images = 2
  c.attack_iterations = 4000
  c.restarts = 4
  c.give_labels = True
  c.settings = (("soteria", 40.0), ("soteria", 60.0), ("soteria", 80.0),
                ("compression", 80.0), ("compression", 90.0),
                ("dp_gaussian", 1e-2), ("dp_laplace", 1e-2))
  if preset == "quick":
    c.model = "leakage"
    c.num_images = 2
    c.attack_iterations = 1000
    c.restarts = 1
  elif preset == "tiny":
    c.model = "logreg"  # compiles in seconds
    c.dataset = "mnist"
    c.num_images = 1
    c.attack_iterations = 3
    c.restarts = 1
    c.allow_synthetic = True
    c.settings = (("soteria", 60.0), ("compression", 80.0))
  elif preset != "full":
    raise ValueError(f"unknown preset {preset!r}; use 'quick' or 'full'.")
  return c
