"""The one shape of every entry point: an absl main over one library call.

Each experiment module defines ``--config`` (an ``ml_collections`` file in
``experiments/configs/``, found next to this module, so the entry points run
from any folder once installed), ``--workdir``, ``--data_dir`` and
``--quiet`` (and ``--plugins``: modules imported first, e.g. one
registering a Soteria perturbation) with :func:`make_main` and hands the
config to one library function ``run(config, workdir) -> result``. Shortcut flags
(``--dataset=mnist``) may stand for config fields (``--config.dataset=mnist``);
a shortcut with choices is an enum flag, so ``--help`` lists the valid values.
A bad setting (``ValueError``), missing data or a file-system error
(``OSError``, e.g. ``--workdir`` naming a file) ends the run with a one-line
``NAME: error:`` message and exit status 1 (``REPDEF_JAX_DEBUG=1``: the
traceback); so does an unknown ``--config.FIELD`` or preset
(:func:`config_flag_error`), which ml_collections would report with a
traceback.
Console scripts (``repdef-attack`` ...) are :mod:`experiments.console`.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import importlib.util
import inspect
import logging
import os
import re
import sys
from typing import Any, Callable, Mapping, Sequence

from absl import app
from absl import flags
from ml_collections import config_flags
from ml_collections.config_flags import config_path

from repdef_jax import data
from repdef_jax import storage

CONFIG_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                          "configs")


def _load_config(value: str) -> Any:
  """``get_config(preset)`` of ``--config=FILE[:PRESET]``, as ml_collections
  loads it."""
  path, *preset = value.split(":", 1)
  loader = importlib.machinery.SourceFileLoader("_repdef_config_check", path)
  module = importlib.util.module_from_spec(
      importlib.util.spec_from_loader(loader.name, loader))
  loader.exec_module(module)
  if preset and not inspect.signature(module.get_config).parameters:
    if "preset" in module.get_config():
      raise ValueError(f"this config takes its preset as a field: use "
                       f"--preset={preset[0]} (or --config.preset=...).")
    raise ValueError(f"this config has no presets (use --config={path} and "
                     "--config.FIELD=... overrides).")
  return module.get_config(*preset)


def config_flag_error(argv: Sequence[str], default: str) -> str | None:
  """The one-line error of a bad ``--config`` or ``--config.FIELD``, or None.

  ml_collections loads the config file and applies the ``--config.FIELD``
  overrides while absl parses the flags (with the default file: already when
  the flag is defined), and reports an unknown field or preset with a
  traceback. This loads the config the same way first.

  Args:
    argv: the command line (``sys.argv``).
    default: the config file used when ``--config`` is not given.

  Returns:
    None when every override names a field of the config, else the message:
    the unknown field and ml_collections' closest match (or the config's
    fields), the unknown preset and the accepted ones, or the unreadable
    file.
  """
  value, fields = None, []
  args = list(argv[1:])
  for i, arg in enumerate(args):
    if arg == "--":
      break
    override = re.match(r"--?(?:no)?config\.([^=]+)", arg)
    if override:
      fields.append(override.group(1))
    elif re.match(r"--?config(=|$)", arg):
      value = (arg.split("=", 1)[1] if "=" in arg
               else args[i + 1] if i + 1 < len(args) else None)
  if value is None and not fields:
    return None
  value = value or default
  try:
    config = _load_config(value)
  except OSError as error:
    return f"--config={value}: cannot read the config file ({error})."
  except Exception as error:  # pylint: disable=broad-except
    # An unknown preset: the config's ValueError lists the accepted ones.
    return f"--config={value}: {error}"
  for field in fields:
    try:
      config_path.get_type(field, config)
    except Exception as error:  # pylint: disable=broad-except
      close = re.search(r'Did you mean "([^"]+)" instead of "([^"]+)"',
                        str(error))
      if close:  # ml_collections' suggestion.
        hint = (f"did you mean {close.group(1)!r} instead of "
                f"{close.group(2)!r}?")
      elif hasattr(config, "keys") and "." not in field:
        hint = f"its fields: {', '.join(sorted(config.keys()))}."
      else:
        hint = "see the config file."
      return (f"--config.{field}: no such field in the config "
              f"({value}); {hint}")
  return None


def _define_shortcut(name: str, config: Any,
                     choices: Sequence[str] | None) -> flags.FlagHolder:
  help_ = f"Shortcut for --config.{name} (default {config[name]!r})."
  if choices:
    # The field's default is a valid value too (e.g. the main job's 'auto'
    # init, resolved per model).
    extra = [config[name]] if isinstance(config[name], str) else []
    return flags.DEFINE_enum(name, None, list(dict.fromkeys(
        [*choices, *extra])), help_)
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
    name: the experiment; its config is ``experiments/configs/NAME.py``
      (:data:`CONFIG_DIR`).
    run: the library function ``run(config, workdir) -> result``.
    report: prints a summary of the result (default: where it was written).
    shortcuts: config fields that also get a top-level flag, each with its
      valid choices (None: any value of the field's type).
    default_workdir: ``--workdir`` default (None: the flag is required).

  Returns:
    ``main(argv)`` for ``absl.app.run``.
  """
  default_config = os.path.join(CONFIG_DIR, f"{name}.py")
  if not os.environ.get("REPDEF_JAX_DEBUG"):
    error = config_flag_error(sys.argv, default_config)
    if error:  # Before ml_collections parses it (and raises a traceback).
      print(f"{name}: error: {error}", file=sys.stderr)
      sys.exit(1)
  config_flag = config_flags.DEFINE_config_file(
      "config", default_config,
      "Experiment config file[:preset] (default: the experiment's own).")
  workdir_flag = flags.DEFINE_string("workdir", default_workdir,
                                     "Output directory.",
                                     required=default_workdir is None)
  data_dir_flag = flags.DEFINE_string(
      "data_dir", None, "Prepared TFDS folder (default: TFDS_DATA_DIR; "
      "otherwise downloads, docs/data.md).")
  quiet_flag = flags.DEFINE_bool(
      "quiet", False, f"No progress lines or ETAs (also {data.QUIET_ENV}=1).")
  plugins_flag = flags.DEFINE_list(
      "plugins", [], "Python modules imported before the run, e.g. one "
      "registering a Soteria perturbation for --config.soteria_q "
      "(docs/design.md).")
  defaults = (importlib.import_module(f"experiments.configs.{name}")
              .get_config() if shortcuts else None)
  holders = {field: _define_shortcut(field, defaults, choices)
             for field, choices in (shortcuts or {}).items()}

  # The flags belong to this module; show them in the entry point's --help.
  # absl's --help lists the key flags of the module named sys.argv[0] (the
  # file run by `python -m`, or a console script).
  caller = sys._getframe(1).f_globals["__name__"]  # pylint: disable=protected-access
  for module in {caller, sys.argv[0]} - {"__main__"}:
    for flag in (config_flag, workdir_flag, data_dir_flag, quiet_flag,
                 plugins_flag, *holders.values()):
      flags.FLAGS.register_key_flag_for_module(module,
                                               flags.FLAGS[flag.name])

  def main(argv):
    if len(argv) > 1:
      raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
    logging.basicConfig(level=logging.WARNING)
    if quiet_flag.value:  # Also reaches subprocesses (reproduce's parts).
      os.environ[data.QUIET_ENV] = "1"
    storage.enable_compilation_cache()
    for module in plugins_flag.value:
      try:
        importlib.import_module(module)
      except Exception as error:  # pylint: disable=broad-except
        if os.environ.get("REPDEF_JAX_DEBUG"):
          raise
        print(f"{name}: error: --plugins: cannot import {module!r} "
              f"({type(error).__name__}: {error}).", file=sys.stderr)
        sys.exit(1)
    config = config_flag.value
    for field, holder in holders.items():
      if holder.value is not None:
        config[field] = holder.value
    if data_dir_flag.value:
      config.data_dir = data_dir_flag.value
    workdir = workdir_flag.value
    try:
      if os.path.exists(workdir) and not os.path.isdir(workdir):
        raise ValueError(f"--workdir={workdir} is a file; pass a folder "
                         "(created when missing).")
      result = run(config, workdir)
    except (ValueError, OSError, data.DataNotFoundError) as error:
      if os.environ.get("REPDEF_JAX_DEBUG"):
        raise
      # Bad settings, missing data or a file-system error: the one-line
      # message, no traceback.
      print(f"{name}: error: {error}", file=sys.stderr)
      sys.exit(1)
    if report is not None:
      report(result, workdir_flag.value)
    elif isinstance(result, dict) and "seconds" in result:
      print(f"wrote {workdir_flag.value} in {result['seconds']:.0f}s")

  return main
