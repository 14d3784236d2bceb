r"""Representation leakage (Sun et al. 2021, Section 3 / Appendix A).

  python -m experiments.repinfer --config=experiments/configs/repinfer.py:quick \
      --workdir=/tmp/repinfer --data_dir=$TFDS_DATA_DIR

Part 1 infers each sampled device's classes and per-class representations
(entering every FC layer of LeNet5) from its real FedAvg update on non-IID
CIFAR-10 (100 devices x 2 classes x 20 images, 10 per round, 1 local epoch
of batch 10); part 2 reconstructs images on the leakage model from the
inferred representation, the whole gradient and the conv gradients alone.
Expected (the paper): correlations up to 0.99 and > 0.8 almost always;
reconstruction from the inferred representation as good as from the whole
gradient, conv gradients alone fail. Quick: 3 rounds, 4 images (~3 min on a
2-core CPU); full: 20 rounds, 16 images.
"""

import ml_collections


def get_config(preset: str = "quick") -> ml_collections.ConfigDict:
  """'quick', 'full' or 'tiny' (tests)."""
  c = ml_collections.ConfigDict()
  c.seed = 0
  c.data_dir = ""
  c.dataset = "cifar10"
  c.max_train_examples = 0  # 0: the whole split.
  # Federated setting (paper Section 3).
  c.num_clients = 100
  c.classes_per_client = 2
  c.samples_per_class = 20
  c.clients_per_round = 10
  c.rounds = 3
  c.local_epochs = 1
  c.batch_size = 10
  c.lr = 0.01
  c.model = "lenet5"
  c.conv_impl = "patches"
  # Inference.
  c.M = 10
  c.class_threshold = 2.0
  # Reconstruction.
  c.recon_model = "leakage"
  c.recon_conv_impl = "patches"
  c.recon_images = 4  # 0 skips the reconstruction part.
  c.recon_steps = 300
  if preset == "full":
    c.rounds = 20
    c.recon_images = 16
  elif preset == "tiny":
    c.update(dict(num_clients=4, clients_per_round=2, samples_per_class=2,
                  batch_size=2, rounds=1, recon_images=1, recon_steps=2))
  elif preset != "quick":
    raise ValueError(f"unknown preset {preset!r}; use 'quick', 'full' or "
                     "'tiny'.")
  return c
