r"""Every experiment of the paper, then REPORT.md.

  python -m experiments.reproduce --preset=quick --workdir=runs/repro \
      --data_dir=$TFDS_DATA_DIR

Presets: quick (a smoke run), medium (the claims over 3 seeds on a 2-core
CPU), full (paper scale, GPU/TPU), tiny (tests, with --mock_data=N, N mock
examples per split).
--parts=tradeoff,visual runs a subset; --report_only rewrites the report;
--publish=docs/results copies the results and the report there (no cells or
checkpoints); --readme=README.md also refreshes the README's results block.
Replication on unseen seeds and images (docs/evaluation.md):
  python -m experiments.reproduce --preset=medium --parts=tradeoff \
      --seeds=100,101,102 --compare_with=docs/results \
      --workdir=runs/replica --publish=docs/results/replica \
      --readme=README.md   # refreshes only the README's replication block
A rerun skips finished parts and resumes unfinished ones.
"""

import ml_collections

from repdef_jax.paper import reproduce


def get_config() -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.preset = "quick"
  c.parts = ",".join(reproduce.PART_ORDER)
  c.mock_data = 0  # Tests: tfds mock data with this many examples per split.
  c.report_only = False
  c.data_dir = ""
  # e.g. docs/results: the JSON, figures and REPORT.md without the cells.
  c.publish = ""
  c.readme = ""  # e.g. README.md: refresh its generated results block.
  # Replication: every part with these seeds (e.g. "100,101,102") instead
  # of its preset's, compared with a published run (e.g. docs/results).
  c.seeds = ""
  c.compare_with = ""
  return c
