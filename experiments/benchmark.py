r"""Every benchmark, against PyTorch, in one command: BENCHMARKS.md + JSON.

  python -m experiments.benchmark [--quick] [--out_dir=docs/benchmarks]
      [--parts=fedavg,defense,gradients,attack,unit_costs] [--torch_threads=2]

Rows, peers, FLOP counts and the CPU peak: :mod:`experiments.benchmarks`.
``--quick`` runs small workloads in minutes (indicative only).
"""

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
                       "PyTorch peers.")


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  from experiments.benchmarks import driver  # pylint: disable=g-import-not-at-top
  unknown = sorted(set(FLAGS.parts) - set(driver.PARTS))
  if unknown:
    raise app.UsageError(f"--parts: unknown {unknown}; valid: "
                         f"{', '.join(driver.PARTS)}.")
  driver.run_and_write(FLAGS.quick, FLAGS.out_dir, tuple(FLAGS.parts),
                       FLAGS.torch_threads)


if __name__ == "__main__":
  define_flags()
  app.run(main)
