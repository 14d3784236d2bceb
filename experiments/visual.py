"""Entry point of :mod:`repdef_jax.paper.visual` (configs/visual.py).

  python -m experiments.visual --config=experiments/configs/visual.py:medium \
      --workdir=/tmp/visual --data_dir=$TFDS_DATA_DIR

Rerunning the same command reuses finished cells.
"""

from absl import app

from experiments import config_entry
from repdef_jax.paper import visual

main = config_entry.make_main("visual", visual.run,
                              visual.report)

if __name__ == "__main__":
  app.run(main)
