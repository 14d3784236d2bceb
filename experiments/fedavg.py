"""Entry point: resumable (defended) FedAvg. The logic is in repdef_jax.training.

  python -m experiments.fedavg --config=experiments/configs/fedavg.py \
      --workdir=/tmp/fedavg --data_dir=$TFDS_DATA_DIR \
      --config.defense=soteria --config.defense_strength=80

This file is intentionally kept short (flax examples style): see
:func:`repdef_jax.training.train_and_evaluate`.
"""

import logging

from absl import app
from absl import flags
from ml_collections import config_flags

from repdef_jax import io
from repdef_jax import training

_CONFIG = config_flags.DEFINE_config_file(
    "config", "experiments/configs/fedavg.py", "Run configuration.")
_WORKDIR = flags.DEFINE_string("workdir", None, "Output directory.",
                               required=True)
_DATA_DIR = flags.DEFINE_string("data_dir", None,
                                "TFDS data dir (default: TFDS_DATA_DIR).")


def main(argv):
  io.enable_compilation_cache()
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  logging.basicConfig(level=logging.INFO)
  config = _CONFIG.value
  if _DATA_DIR.value:
    config.data_dir = _DATA_DIR.value
  training.train_and_evaluate(config, _WORKDIR.value)


if __name__ == "__main__":
  app.run(main)
