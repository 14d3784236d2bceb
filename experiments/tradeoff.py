"""Entry point: utility-privacy trade-off (Sun et al. 2021, Section 6).

  python -m experiments.tradeoff --config=experiments/configs/tradeoff.py:quick \
      --workdir=/tmp/tradeoff --data_dir=/work/shared/tfds

The logic is in :mod:`repdef_jax.tradeoff`; see the config's docstring for
what the run writes and should show. Rerunning the same command resumes.
"""

import logging

from absl import app
from absl import flags
from ml_collections import config_flags

from repdef_jax import io as io_lib
from repdef_jax import tradeoff

_CONFIG = config_flags.DEFINE_config_file(
    "config", "experiments/configs/tradeoff.py", "Experiment config.")
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
  result = tradeoff.run(config, _WORKDIR.value)
  for key, panel in result["panels"].items():
    for b, r in panel["ratios"].items():
      print(f"{key}: MSE ratio soteria/{b} at equal accuracy: max "
            f"{r['mse']['max']} (raw), {r['mse_clamped']['max']} (clamped)")
    for d, u in panel["unrecognisable"].items():
      print(f"{key}: {d} unrecognisable at strength {u['strength']}, "
            f"accuracy drop {u['accuracy_drop']}")


if __name__ == "__main__":
  app.run(main)
