"""The one shape of every entry point: an absl main over one library call.

Each experiment module defines ``--config`` (an ``ml_collections`` file in
``experiments/configs/``), ``--workdir`` and ``--data_dir`` with
:func:`make_main` and hands the config to one library function
``run(config, workdir) -> result``. Shortcut flags (``--dataset=mnist``) may
stand for config fields (``--config.dataset=mnist``); a shortcut with choices
is an enum flag, so ``--help`` lists the valid values.
"""

from __future__ import annotations

import importlib
import logging
import sys
from typing import Any, Callable, Mapping, Sequence

from absl import app
from absl import flags
from ml_collections import config_flags

from repdef_jax import storage


def _define_shortcut(name: str, config: Any,
                     choices: Sequence[str] | None) -> flags.FlagHolder:
  help_ = f"Shortcut for --config.{name} (default {config[name]!r})."
  if choices:
    return flags.DEFINE_enum(name, None, list(choices), help_)
  kind = config.get_type(name)  # Also the type of a None placeholder.
  define = {bool: flags.DEFINE_bool, int: flags.DEFINE_integer,
            float: flags.DEFINE_float}.get(kind, flags.DEFINE_string)
  return define(name, None, help_)


def make_main(name: str, run: Callable[[Any, str], Any],
              report: Callable[[Any, str], None] | None = None, *,
              shortcuts: Mapping[str, Sequence[str] | None] | None = None,
              default_workdir: str | None = None):
  """Defines the flags of experiment ``name`` and returns its ``main``.

  Args:
    name: the experiment; its config is ``experiments/configs/NAME.py``.
    run: the library function ``run(config, workdir) -> result``.
    report: prints a summary of the result (default: where it was written).
    shortcuts: config fields that also get a top-level flag, each with its
      valid choices (None: any value of the field's type).
    default_workdir: ``--workdir`` default (None: the flag is required).

  Returns:
    ``main(argv)`` for ``absl.app.run``.
  """
  config_flag = config_flags.DEFINE_config_file(
      "config", f"experiments/configs/{name}.py", "Experiment config file.")
  workdir_flag = flags.DEFINE_string("workdir", default_workdir,
                                     "Output directory.",
                                     required=default_workdir is None)
  data_dir_flag = flags.DEFINE_string(
      "data_dir", None, "TFDS data dir (default: TFDS_DATA_DIR).")
  defaults = (importlib.import_module(f"experiments.configs.{name}")
              .get_config() if shortcuts else None)
  holders = {field: _define_shortcut(field, defaults, choices)
             for field, choices in (shortcuts or {}).items()}

  # The flags belong to this module; show them in the entry point's --help.
  caller = sys._getframe(1).f_globals["__name__"]  # pylint: disable=protected-access
  if caller == "__main__":
    caller = sys.argv[0]  # How absl names the main module.
  for flag in (config_flag, workdir_flag, data_dir_flag, *holders.values()):
    flags.FLAGS.register_key_flag_for_module(caller, flags.FLAGS[flag.name])

  def main(argv):
    if len(argv) > 1:
      raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
    logging.basicConfig(level=logging.WARNING)
    storage.enable_compilation_cache()
    config = config_flag.value
    for field, holder in holders.items():
      if holder.value is not None:
        config[field] = holder.value
    if data_dir_flag.value:
      config.data_dir = data_dir_flag.value
    result = run(config, workdir_flag.value)
    if report is not None:
      report(result, workdir_flag.value)
    elif isinstance(result, dict) and "seconds" in result:
      print(f"wrote {workdir_flag.value} in {result['seconds']:.0f}s")

  return main
