"""Runs an entry point under ``tfds.testing.mock_data`` (tests and CI only).

  python -m experiments.mock_run 120 experiments.tradeoff --config=... \
      --workdir=...

The first argument is the number of mock examples per split; the rest is the
module and its own arguments. Nothing is read from a real dataset.
"""

import runpy
import sys

import tensorflow_datasets as tfds


USAGE = ("usage: python -m experiments.mock_run NUM_EXAMPLES MODULE "
         "[ARGS...] (NUM_EXAMPLES: an int >= 1, mock examples per split)")


def main() -> None:
  try:
    num_examples = int(sys.argv[1])
    module = sys.argv[2]
  except (IndexError, ValueError):
    num_examples = 0
  if num_examples < 1:
    sys.exit(f"{USAGE}; got {sys.argv[1:3]}.")
  sys.argv = [module] + sys.argv[3:]
  with tfds.testing.mock_data(num_examples=num_examples):
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
  main()
