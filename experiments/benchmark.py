r"""Every benchmark, against PyTorch, in one command: BENCHMARKS.md + JSON.

  python -m experiments.benchmark [--quick] [--out_dir=docs/benchmarks]
      [--parts=fedavg,defense,gradients,attack,unit_costs] [--torch_threads=2]
  python -m experiments.benchmark --render_only   # the page from its JSON

Rows, peers, FLOP counts and the device's peak: :mod:`experiments.benchmarks`.
``--quick`` runs small workloads in minutes (indicative only). On a GPU
(``experiments/benchmarks/device_check.sh``) write to ``docs/benchmarks/gpu``;
the CPU page shows that run as its GPU section.
"""

import os

from absl import app
from absl import flags

FLAGS = flags.FLAGS


def define_flags() -> None:
  """Defines the absl flags (only when run as a program)."""
  from experiments.benchmarks import driver  # pylint: disable=g-import-not-at-top
  flags.DEFINE_bool("quick", False, "Small workloads (minutes).")
  flags.DEFINE_string("out_dir", "docs/benchmarks", "Output folder.")
  flags.DEFINE_list("parts", list(driver.PARTS), "Parts to run.")
  flags.DEFINE_integer("torch_threads", 2, "torch.set_num_threads of the "
                       "PyTorch peers (>= 1).", lower_bound=1)
  flags.DEFINE_bool("render_only", False, "Rewrite BENCHMARKS.md from the "
                    "JSON in --out_dir (and its gpu/ run); measure nothing.")


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  from experiments.benchmarks import driver  # pylint: disable=g-import-not-at-top
  if FLAGS.render_only:
    try:
      driver.render(FLAGS.out_dir)
    except ValueError as e:
      raise app.UsageError(str(e)) from None
    return
  unknown = sorted(set(FLAGS.parts) - set(driver.PARTS))
  if unknown:
    raise app.UsageError(f"--parts: unknown {unknown}; valid: "
                         f"{', '.join(driver.PARTS)}.")
  if os.path.exists(FLAGS.out_dir) and not os.path.isdir(FLAGS.out_dir):
    raise app.UsageError(f"--out_dir={FLAGS.out_dir} is a file; name a "
                         "folder (made if missing).")
  driver.run_and_write(FLAGS.quick, FLAGS.out_dir, tuple(FLAGS.parts),
                       FLAGS.torch_threads)


if __name__ == "__main__":
  define_flags()
  app.run(main)
