r"""Benchmark: per-example gradients with vmap(grad) vs a Python loop.

The loop is the PyTorch way (one backward pass per example, here a jitted
single-example gradient called B times); the vectorized version is one jitted
``vmap(grad)``. Both run the same model code.

Command:

  python -m experiments.benchmark_gradients --batch=8,32

Prints one line per (model, batch) with the median time of each and the ratio.
"""

from __future__ import annotations

import time
from typing import Sequence

from absl import app
from absl import flags
import jax
import numpy as np

from repdef_jax import gradients
from repdef_jax import models

FLAGS = flags.FLAGS


def define_flags() -> None:
  """Defines the absl flags (only when run as a program, so importing this
  module, e.g. with the other benchmarks, defines no flags)."""
  flags.DEFINE_list("models", ["lenet", "convnet64"], "Models.")
  flags.DEFINE_list("batch", ["8", "32"], "Batch sizes.")
  flags.DEFINE_integer("repeats", 5, "Timed repeats (median).")


def median_time(fn, repeats: int) -> float:
  """Median wall time of ``fn()`` (which must block) over ``repeats`` calls."""
  times = []
  for _ in range(repeats):
    t0 = time.perf_counter()
    fn()
    times.append(time.perf_counter() - t0)
  return float(np.median(times))


def run(model_names: Sequence[str] = ("lenet", "convnet64"),
        batch_sizes: Sequence[int] = (8, 32),
        repeats: int = 5) -> list[dict]:
  """Times vmap(grad) against a loop of jitted single-example gradients.

  Args:
    model_names: registry names (CIFAR-10 shapes).
    batch_sizes: batch sizes to time.
    repeats: timed repeats per measurement; the median is reported.

  Returns:
    One dict per (model, batch) with compile and run times, the ratio and the
    largest difference between the two results.
  """
  rows = []
  for name in model_names:
    model = models.get_model(name, (32, 32, 3))
    params = model.init(jax.random.key(0))
    vec = jax.jit(lambda p, x, y, m=model: gradients.per_example_grads(
        m, p, x, y)[1])
    one = jax.jit(lambda p, x, y, m=model: gradients.batch_grad(
        m, p, x[None], y[None]))
    for b in batch_sizes:
      x = jax.random.uniform(jax.random.key(1), (b, 32, 32, 3))
      y = jax.random.randint(jax.random.key(2), (b,), 0, 10)
      t0 = time.perf_counter()
      jax.block_until_ready(vec(params, x, y))
      compile_vec = time.perf_counter() - t0
      t0 = time.perf_counter()
      jax.block_until_ready(one(params, x[0], y[0]))
      compile_loop = time.perf_counter() - t0

      def loop():
        return jax.block_until_ready([one(params, x[i], y[i])
                                      for i in range(b)])

      t_vec = median_time(lambda: jax.block_until_ready(vec(params, x, y)),
                          repeats)
      t_loop = median_time(loop, repeats)
      g_vec = vec(params, x, y)
      g_loop = loop()
      diff = max(
          float(np.max(np.abs(np.asarray(a[i]) - np.asarray(c))))
          for i, gi in enumerate(g_loop)
          for a, c in zip(jax.tree_util.tree_leaves(g_vec),
                          jax.tree_util.tree_leaves(gi)))
      rows.append(dict(model=name, batch=b, vmap_s=t_vec, loop_s=t_loop,
                       ratio=t_loop / t_vec, compile_vmap_s=compile_vec,
                       compile_loop_s=compile_loop, max_abs_diff=diff))
  return rows


def main(argv):
  del argv
  for r in run(FLAGS.models, [int(b) for b in FLAGS.batch], FLAGS.repeats):
    print(f"{r['model']:10s} batch {r['batch']:3d}: vmap {r['vmap_s']*1e3:8.1f}"
          f" ms  loop {r['loop_s']*1e3:8.1f} ms  ratio {r['ratio']:5.2f}x  "
          f"(compile {r['compile_vmap_s']:.1f} s / {r['compile_loop_s']:.1f} s,"
          f" max diff {r['max_abs_diff']:.1e})")


if __name__ == "__main__":
  define_flags()
  app.run(main)
