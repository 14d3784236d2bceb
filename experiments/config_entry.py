"""The shared shape of the config-driven entry points (flax-examples style).

Each experiment module defines ``--config`` (an ``ml_collections`` file),
``--workdir`` and ``--data_dir`` and calls one library function
``run(config, workdir) -> dict``; this module builds that ``main``.
"""

import logging
from typing import Any, Callable

from absl import app
from absl import flags
from ml_collections import config_flags

from repdef_jax import io as io_lib


def make_main(name: str, run: Callable[[Any, str], dict],
              report: Callable[[dict, str], None] | None = None):
  """Defines the flags of experiment ``name`` and returns its ``main``.

  Args:
    name: the experiment; its default config is experiments/configs/NAME.py.
    run: the library function ``run(config, workdir) -> result``.
    report: prints a summary of the result (default: where it was written).

  Returns:
    ``main(argv)`` for ``absl.app.run``.
  """
  config_flag = config_flags.DEFINE_config_file(
      "config", f"experiments/configs/{name}.py", "Experiment config.")
  workdir_flag = flags.DEFINE_string("workdir", None, "Output directory.",
                                     required=True)
  data_dir_flag = flags.DEFINE_string(
      "data_dir", None, "TFDS data dir (default: TFDS_DATA_DIR).")

  def main(argv):
    if len(argv) > 1:
      raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
    logging.basicConfig(level=logging.WARNING)
    io_lib.enable_compilation_cache()
    config = config_flag.value
    if data_dir_flag.value:
      config.data_dir = data_dir_flag.value
    result = run(config, workdir_flag.value)
    if report is not None:
      report(result, workdir_flag.value)
    else:
      print(f"wrote {workdir_flag.value}/{name}.json in "
            f"{result['seconds']:.0f}s")

  return main
