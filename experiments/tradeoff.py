"""Entry point: utility-privacy trade-off (Sun et al. 2021, Section 6).

  python -m experiments.tradeoff --config=experiments/configs/tradeoff.py:quick \
      --workdir=/tmp/tradeoff --data_dir=$TFDS_DATA_DIR

The logic is in :mod:`repdef_jax.tradeoff`; see the config's docstring for
what the run writes and should show. Rerunning the same command resumes.
"""

from absl import app

from experiments import config_entry
from repdef_jax import tradeoff


def report(result: dict, workdir: str) -> None:
  """Prints the MSE ratios and the accuracy drops at the threshold."""
  del workdir
  for key, panel in result["panels"].items():
    for b, r in panel["ratios"].items():
      print(f"{key}: MSE ratio soteria/{b} at equal accuracy: max "
            f"{r['mse']['max']} (raw), {r['mse_clamped']['max']} (clamped)")
    for d, u in panel["unrecognisable"].items():
      print(f"{key}: {d} unrecognisable at strength {u['strength']}, "
            f"accuracy drop {u['accuracy_drop']}")


main = config_entry.make_main("tradeoff", tradeoff.run, report)

if __name__ == "__main__":
  app.run(main)
