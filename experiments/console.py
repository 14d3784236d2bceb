"""Console scripts (``setup.py`` entry points) over the absl entry points.

``repdef-attack`` is ``python -m experiments.attack`` and so on; both work
from any folder once the project is installed.
"""

import importlib
import sys

from absl import app
from absl import flags


def _run(name: str, define_flags: bool = False) -> None:
  module = importlib.import_module(f"experiments.{name}")
  if define_flags:  # Modules that define their flags only when run.
    module.define_flags()
  for flag in flags.FLAGS.get_flags_for_module(module.__name__):
    # absl's --help lists the key flags of the module named sys.argv[0].
    flags.FLAGS.register_key_flag_for_module(sys.argv[0], flag)
  # absl's --help shows __main__'s docstring: the module's first paragraph.
  sys.modules["__main__"].__doc__ = (module.__doc__ or "").split("\n\n")[0]
  app.run(module.main)


def attack() -> None:
  """``repdef-attack``: the main job (:mod:`experiments.attack`)."""
  _run("attack")


def reproduce() -> None:
  """``repdef-reproduce``: the paper's reproduction and REPORT.md."""
  _run("reproduce")


def fedavg() -> None:
  """``repdef-fedavg``: resumable (defended) FedAvg."""
  _run("fedavg")


def benchmark() -> None:
  """``repdef-benchmark``: every benchmark, BENCHMARKS.md and JSON."""
  _run("benchmark", define_flags=True)
