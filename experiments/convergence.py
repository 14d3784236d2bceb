"""Entry point: convergence of defended FedAvg (paper Section 5, Fig. 6).
Logic: :mod:`repdef_jax.paper.convergence`; config:
experiments/configs/convergence.py."""

from absl import app

from experiments import config_entry
from repdef_jax.paper import convergence

main = config_entry.make_main("convergence", convergence.run,
                              convergence.report)

if __name__ == "__main__":
  app.run(main)
