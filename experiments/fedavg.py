"""Entry point: resumable (defended) FedAvg. Logic:
:func:`repdef_jax.training.train_and_evaluate`; config:
experiments/configs/fedavg.py (the command and expected result)."""

from absl import app

from experiments import config_entry
from repdef_jax import distributed
from repdef_jax import training


def _report(result, workdir):
  if not distributed.is_primary():  # Multi-process runs: process 0 reports.
    return
  last = result["metrics"][-1] if result["metrics"] else {}
  print(f"round {last.get('round')}: test accuracy "
        f"{last.get('test_accuracy', float('nan')):.4f}; wrote {workdir}")


main = config_entry.make_main("fedavg", training.train_and_evaluate, _report)

if __name__ == "__main__":
  app.run(main)
