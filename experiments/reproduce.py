"""Entry point: every part of the paper's reproduction, then REPORT.md.
Logic: :mod:`repdef_jax.paper.reproduce`; config:
experiments/configs/reproduce.py."""

from absl import app

from experiments import config_entry
from repdef_jax.paper import reproduce

main = config_entry.make_main(
    "reproduce", reproduce.run, reproduce.summary,
    shortcuts={"preset": reproduce.PRESETS, "parts": None, "mock_data": None,
               "report_only": None, "publish": None, "readme": None,
               "seeds": None, "compare_with": None})

if __name__ == "__main__":
  app.run(main)
