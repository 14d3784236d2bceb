"""Entry point of :mod:`repdef_jax.paper.adaptive` (configs/adaptive.py).

  python -m experiments.adaptive --config=experiments/configs/adaptive.py:medium \
      --workdir=/tmp/adaptive --data_dir=$TFDS_DATA_DIR

Rerunning the same command reuses finished cells.
"""

from absl import app

from experiments import config_entry
from repdef_jax.paper import adaptive

main = config_entry.make_main("adaptive", adaptive.run,
                              adaptive.report)

if __name__ == "__main__":
  app.run(main)
