r"""The main job: one attack on real images, with and without one defense.

  python -m experiments.attack --workdir=runs/attack    # or: repdef-attack
  python -m experiments.attack --dataset=mnist --attack=gs --defense=compression \
      --strength=90 --num_images=8 --workdir=runs/attack_gs
  python -m experiments.attack --images=my_photos/ --num_images=5 \
      --workdir=runs/mine

Defaults: DLG (300 x 20 L-BFGS iterations with a backtracking line search,
``dlg_optimizer='linesearch'``) on DLG's LeNet with U(-0.5, 0.5) weights,
three CIFAR-10 test images, Soteria pruning 60 % of the representation.
Measured with seed 0 (test images 72, 11, 20): the README's table,
generated from docs/results/main_job/results.json; undefended DLG
reconstructs all three (SSIM >= 0.99) and against Soteria all three fail
(SSIM <= 0.071), none diverged. With the paper's rule
(``--dlg_optimizer=torch``, no line search) undefended DLG fails on some of
them (one of three in docs/results/main_job/dlg_optimizer_torch); which ones
depends on the CPU's float rounding. Images: a prepared TFDS copy, else a download,
else the 256-image sample shipped in the package (docs/data.md). Outputs and
schema: docs/main_job.md.
"""

import ml_collections
from ml_collections import config_dict

from repdef_jax.paper import main_job


def get_config() -> ml_collections.ConfigDict:
  """:data:`repdef_jax.paper.main_job.DEFAULT_CONFIG` as a ConfigDict."""
  c = ml_collections.ConfigDict(
      {k: v for k, v in main_job.DEFAULT_CONFIG.items() if v is not None})
  c.iterations = config_dict.placeholder(int)  # None: the attack's default.
  c.data_dir = config_dict.placeholder(str)
  c.images = config_dict.placeholder(str)  # Own images: folder, file or .npz.
  return c
