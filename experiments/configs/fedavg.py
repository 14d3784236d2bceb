"""FedAvg on the paper's non-IID MNIST split (Sun et al. 2021, Section 5).

100 devices x 2 classes x 100 samples, 10 devices sampled per round with
replacement (p_k = n_k / n), uniform averaging, 200 rounds, logistic
regression, 5 local steps of batch 10. Run from the repository root:

  python -m experiments.fedavg --config=experiments/configs/fedavg.py \
      --workdir=/tmp/fedavg_mnist --data_dir=$TFDS_DATA_DIR

With the Soteria defense at every local step (80 % of the head's inputs
pruned):

  python -m experiments.fedavg --config=experiments/configs/fedavg.py \
      --workdir=/tmp/fedavg_mnist_soteria --data_dir=$TFDS_DATA_DIR \
      --config.defense=soteria --config.defense_strength=80

Killed and restarted with the same command it resumes from the last
checkpoint and ends exactly as an uninterrupted run. Expected: test accuracy
around 0.85-0.9 after 200 rounds (logreg on non-IID MNIST).
"""

from repdef_jax import training
from repdef_jax.paper import settings


def get_config():
  """The paper's MNIST setting (see module docstring)."""
  config = training.default_config()
  config.update(settings.federated_setting(
      "paper", client_lr=0.05, log_every=1).to_dict())
  config.dataset = "mnist"
  config.model = "logreg"
  config.l2 = 1e-4
  return config
