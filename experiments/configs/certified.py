r"""Theorem 1's certified bound vs the distances attacks actually reach.

Sun et al. 2021, Theorem 1: a lower bound on ||X - X'|| from the size of the
representation perturbation and the norm of the feature extractor's
Jacobian (computed by repdef_jax.defenses.certify). For each Soteria pruning
rate it plots the bound beside ||X - X'||_2 of the panel's attacks on the
defended one-image gradient, over images x seeds with 95 % intervals. Run
from the repository root:

  python -m experiments.certified --config=experiments/configs/certified.py:medium \
      --workdir=/tmp/certified --data_dir=$TFDS_DATA_DIR

Writes ``certified.json`` and ``certified.png``. The claim is tested only
where it says something: on images the attack reconstructs undefended (SSIM
>= 0.6 at rate 0), the fraction of (image, rate) pairs whose attack distance
is at least the bound (held when every pair is). The budgets are chosen so
that the undefended attack succeeds: DLG (labels given) on DLG's LeNet
(uniform init) on MNIST reconstructs every tried image at 600 L-BFGS
iterations, while at the old quick budgets (DLG 30 / GS 300 on CIFAR-10) it
failed even undefended. The adaptive ``dlg_mask`` attack (the pruning mask
read off the shared gradient) is a reconstruction from the same shared
gradient, so the certificate covers it too.

Presets: ``quick`` (CI smoke run: 1 seed, 2 images, rates 0/40/80; measured
7.2 min wall / 1.8 min CPU on the shared, heavily loaded 2-core machine),
``medium`` (3 seeds x 4 images = 12 per rate, rates 0/20/50/80, DLG and
DLG-mask 600 iterations; estimated ~8 min idle from the quick run's CPU
time: the defended cells run the full budget), ``full`` (5 seeds x 16
images, rates 0-90, plus the leakage CNN under GS on CIFAR-10), ``tiny``
(tests).
"""

import ml_collections


def _panel(dataset, model, attacks, model_init="default", model_kwargs=None):
  return ml_collections.ConfigDict(dict(
      dataset=dataset, model=model, model_init=model_init,
      model_kwargs=ml_collections.ConfigDict(model_kwargs or {}),
      attacks=tuple(attacks)))


def get_config(preset: str = "medium") -> ml_collections.ConfigDict:
  """'quick', 'medium', 'full' or 'tiny' (tests)."""
  c = ml_collections.ConfigDict()
  c.seeds = (0, 1, 2)
  c.data_dir = ""
  c.allow_synthetic = False
  c.image_pool = 1000  # images are drawn per seed from the first ones
  c.panels = ml_collections.ConfigDict({
      "lenet_mnist": _panel("mnist", "lenet", ("dlg", "dlg_mask"),
                            model_init="uniform")})
  c.rates = (0.0, 20.0, 50.0, 80.0)  # the first one: the reference
  c.num_images = 4  # per seed
  c.attack_budgets = ml_collections.ConfigDict({
      "dlg": {"outer_steps": 30, "inner_steps": 20},
      "gs": {"iterations": 2000, "restarts": 1}})
  c.give_labels = True
  c.success_ssim = 0.6
  if preset == "full":
    c.seeds = (0, 1, 2, 3, 4)
    c.num_images = 16
    c.rates = (0.0, 10.0, 20.0, 30.0, 40.0, 50.0, 60.0, 70.0, 80.0, 90.0)
    c.panels.leakage_cifar10 = _panel("cifar10", "leakage",
                                      ("gs", "gs_mask"))
    c.attack_budgets = ml_collections.ConfigDict({
        "dlg": {"outer_steps": 300, "inner_steps": 20},
        "gs": {"iterations": 24000, "restarts": 2}})
  elif preset == "quick":
    c.seeds = (0,)
    c.num_images = 2
    c.rates = (0.0, 40.0, 80.0)
    c.image_pool = 100
  elif preset == "tiny":
    c.seeds = (0, 1)
    c.panels = ml_collections.ConfigDict({
        "logreg_mnist": _panel("mnist", "logreg", ("gs", "gs_mask"))})
    c.rates = (0.0, 50.0)
    c.num_images = 2
    c.image_pool = 20
    c.attack_budgets = ml_collections.ConfigDict({
        "dlg": {"outer_steps": 2, "inner_steps": 2},
        "gs": {"iterations": 3, "restarts": 1}})
    c.allow_synthetic = True
  elif preset != "medium":
    raise ValueError(f"unknown preset {preset!r}; use 'quick', 'medium', "
                     "'full' or 'tiny'.")
  return c
