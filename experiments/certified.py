"""Entry point of :mod:`repdef_jax.paper.theorem1` (configs/certified.py).

  python -m experiments.certified --config=experiments/configs/certified.py:medium \
      --workdir=/tmp/certified --data_dir=$TFDS_DATA_DIR

Rerunning the same command reuses finished cells.
"""

from absl import app

from experiments import config_entry
from repdef_jax.paper import theorem1

main = config_entry.make_main("certified", theorem1.run,
                              theorem1.report)

if __name__ == "__main__":
  app.run(main)
