"""Comparisons of parameter trees shared by tests and their subprocess
scripts (tests/ is on ``sys.path`` in both)."""

import jax
import numpy as np


def max_diff(a, b) -> float:
  """Largest absolute difference over the leaves of two trees (0.0 for no
  leaves). ``np.max``, not ``max()``: a NaN anywhere gives NaN, which fails
  every ``<=`` comparison."""
  la, lb = jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)
  assert len(la) == len(lb), (len(la), len(lb))
  return float(np.max([0.0] + [np.max(np.abs(np.asarray(u) - np.asarray(v)))
                               for u, v in zip(la, lb)]))
