r"""The main job: one attack on real images, with and without one defense.

  python -m experiments.attack --workdir=runs/attack    # or: repdef-attack
  python -m experiments.attack --dataset=mnist --attack=gs --defense=compression \
      --strength=90 --num_images=8 --workdir=runs/attack_gs
  python -m experiments.attack --images=my_photos/ --num_images=5 \
      --workdir=runs/mine

Defaults: DLG (300 x 20 L-BFGS iterations) on DLG's LeNet with U(-0.5, 0.5)
weights, three CIFAR-10 test images, Soteria pruning 60 % of the
representation; ~90 s of CPU time on a 2-core CPU. Measured with seed 0
(test images 55, 16, 189; README): undefended DLG reconstructs image 55
(PSNR 36.6 dB, SSIM 0.998) and diverges on the other two (DLG learns the
label too, which fails often on this LeNet); against Soteria all three fail
(SSIM ~0). Notebook 1 gives DLG the label: it reconstructs test image 0
undefended (SSIM 0.93) and fails under Soteria (SSIM -0.02). Images: a prepared TFDS copy, else a download, else
the 256-image sample shipped in the package (docs/data.md). Outputs and
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
  c.images = config_dict.placeholder(str)  # Own images: folder or .npz.
  return c
