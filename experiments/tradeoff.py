"""Entry point: utility-privacy trade-off (paper Section 6). Logic:
:mod:`repdef_jax.paper.tradeoff`; config (command, expected result):
experiments/configs/tradeoff.py."""

from absl import app

from experiments import config_entry
from repdef_jax.paper import tradeoff

main = config_entry.make_main("tradeoff", tradeoff.run, tradeoff.report)

if __name__ == "__main__":
  app.run(main)
