"""One process of a FedAvg run with Soteria, started by test_distributed.py.

  python tests/distributed_check.py WORKDIR NUM_PROCESSES PROCESS_ID \
      COORDINATOR [PACE_SECONDS]

Forces ``8 // NUM_PROCESSES`` CPU devices (XLA_FLAGS must be set before JAX
starts, hence a fresh process) and runs the real entry point
``python -m experiments.fedavg`` (its flags, ``--config.coordinator_address``
...) on tfds mock MNIST with the clients sharded over all 8 devices of all
processes. NUM_PROCESSES=1 is the one-process, 8-device reference.
PACE_SECONDS > 0 makes process 0 wait that long after each round, so that a
test can kill the run in the middle.
"""

import os
import sys
import time

NUM_PROCESSES = int(sys.argv[2])
os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") +
    f" --xla_force_host_platform_device_count={8 // NUM_PROCESSES}")
os.environ["JAX_PLATFORMS"] = "cpu"
os.environ["REPDEF_JAX_COMPILATION_CACHE"] = ""
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                ".."))

from absl import flags  # pylint: disable=g-import-not-at-top,wrong-import-position
import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top,wrong-import-position

from experiments import config_entry  # pylint: disable=g-import-not-at-top,wrong-import-position
from experiments import fedavg as main_lib  # pylint: disable=g-import-not-at-top,wrong-import-position
from repdef_jax import training  # pylint: disable=g-import-not-at-top,wrong-import-position

SETTINGS = {
    "dataset": "mnist", "model": "logreg", "partition": "noniid",
    "num_clients": 4, "classes_per_client": 2, "samples_per_class": 3,
    "rounds": 8, "clients_per_round": 5, "local_steps": 2, "batch_size": 3,
    "client_lr": 0.1, "l2": 1e-3, "defense": "soteria",
    "defense_strength": 60.0, "checkpoint_every": 2, "log_every": 1,
    "max_test_examples": 40, "eval_batch": 20, "plot": False,
    "num_devices": 8}


def main():
  workdir, process_id, coordinator = sys.argv[1], int(sys.argv[3]), sys.argv[4]
  pace = float(sys.argv[5]) if len(sys.argv) > 5 else 0.0
  settings = dict(SETTINGS)
  if NUM_PROCESSES > 1:
    settings.update(coordinator_address=coordinator,
                    num_processes=NUM_PROCESSES, process_id=process_id)
  config_file = os.path.join(config_entry.CONFIG_DIR, "fedavg.py")
  # config_flags reads the --config.* overrides from sys.argv.
  sys.argv = (["fedavg", f"--config={config_file}", f"--workdir={workdir}",
               "--data_dir=/nonexistent/mock"] +
              [f"--config.{k}={v}" for k, v in settings.items()])
  flags.FLAGS(sys.argv)
  if pace:
    real = training._append_line  # pylint: disable=protected-access

    def paced(path, record):
      real(path, record)
      time.sleep(pace)

    training._append_line = paced  # pylint: disable=protected-access
  with tfds.testing.mock_data(num_examples=120):
    main_lib.main(["fedavg"])
  print("DONE", process_id, flush=True)


if __name__ == "__main__":
  main()
