"""Entry point: see :mod:`repdef_jax.visual` and experiments/configs/visual.py.

  python -m experiments.visual --config=experiments/configs/visual.py:quick \
      --workdir=/tmp/visual --data_dir=/work/shared/tfds

Rerunning the same command reuses finished cells.
"""

import logging

from absl import app
from absl import flags
from ml_collections import config_flags

from repdef_jax import visual
from repdef_jax import io as io_lib

_CONFIG = config_flags.DEFINE_config_file(
    "config", "experiments/configs/visual.py", "Experiment config.")
_WORKDIR = flags.DEFINE_string("workdir", None, "Output directory.",
                               required=True)
_DATA_DIR = flags.DEFINE_string("data_dir", None,
                                "TFDS data dir (default: TFDS_DATA_DIR).")


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  logging.basicConfig(level=logging.WARNING)
  io_lib.enable_compilation_cache()
  config = _CONFIG.value
  if _DATA_DIR.value:
    config.data_dir = _DATA_DIR.value
  result = visual.run(config, _WORKDIR.value)
  print(f"wrote {_WORKDIR.value}/visual.json in {result['seconds']:.0f}s")


if __name__ == "__main__":
  app.run(main)
