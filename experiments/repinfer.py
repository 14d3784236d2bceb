"""Entry point: representation leakage (paper Section 3). Logic:
:mod:`repdef_jax.paper.leakage`; config: experiments/configs/repinfer.py."""

from absl import app

from experiments import config_entry
from repdef_jax.paper import leakage

main = config_entry.make_main("repinfer", leakage.run, leakage.report)

if __name__ == "__main__":
  app.run(main)
