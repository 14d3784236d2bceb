r"""Benchmark: Soteria feature scores, one Jacobian vs the reference's loop.

The reference code computes ``||d r_i / d x||`` with one backward pass per
feature. On the same model and parameters we time:

* ``loop``: the reference way, one jitted vjp (feature index traced, so it is
  compiled once) called from a Python loop over the F features, with XLA's
  convolutions (what ``nn.Conv`` or a direct port would use);
* ``loop_s2d``: the same loop with our space-to-depth convolutions (to show
  how much of the gain is the formulation and how much the batching);
* ``ours``: :func:`repdef_jax.defenses.soteria.feature_scores` as the
  ``soteria`` defense runs it: one jitted ``vmap`` over images of a
  ``vmap``-ed vjp over the identity basis (``jacrev``), on the space-to-depth
  formulation (``jacobian_conv_impl='s2d'``).

Compile time (first call minus a steady call) is reported separately. For
models whose full Jacobian is too slow for a CPU benchmark (ConvNet64:
2,304 features, ~1.9 GMAC per backward pass) both sides are timed on the same
``--max_features`` features and scaled to F (said in the output).

  python -m experiments.benchmark_defense --out=/tmp/bench_defense.json
"""

from __future__ import annotations

import statistics
import time
from typing import Sequence

from absl import app
from absl import flags
import jax
import jax.numpy as jnp

from repdef_jax import models

FLAGS = flags.FLAGS


def define_flags() -> None:
  """Defines the absl flags (only when run as a program, so importing this
  module, e.g. with the other benchmarks, defines no flags)."""
  flags.DEFINE_string("out", None, "Optional JSON output path.")
  flags.DEFINE_list("models", ["lenet", "convnet64"], "Models to benchmark.")
  flags.DEFINE_list("batches", ["1", "8"], "Batch sizes.")
  flags.DEFINE_integer("repeats", 3, "Timed repeats (median).")
  flags.DEFINE_integer("max_features", 768,
                       "Features timed per model (scaled to F when fewer).")


def _time(fn, repeats: int) -> tuple[float, float]:
  """(median steady seconds, compile seconds) of a blocking ``fn()``."""
  t0 = time.perf_counter()
  fn()
  first = time.perf_counter() - t0
  ts = []
  for _ in range(repeats):
    t0 = time.perf_counter()
    fn()
    ts.append(time.perf_counter() - t0)
  med = statistics.median(ts)
  return med, max(first - med, 0.0)


def _reference_loop(model, params, eps, x, n):
  """The reference algorithm: one vjp per feature from a Python loop."""
  feats = lambda x: model.features(params, x)

  @jax.jit
  def one(x, i):
    r, vjp = jax.vjp(feats, x)
    (g,) = vjp(jax.nn.one_hot(jnp.full((x.shape[0],), i), r.shape[1],
                              dtype=r.dtype))
    return jnp.sum(jnp.linalg.norm(g.reshape(x.shape[0], -1), axis=-1)
                   / (r[:, i] + eps))

  return lambda: jax.block_until_ready([one(x, i) for i in range(n)])


def _ours(model, params, eps, x, n):
  """Our jitted batched Jacobian scores on the first n features."""
  fn = model.feature_fn(params)

  @jax.jit
  def scores(x):
    def one(xi):
      r, vjp = jax.vjp(fn, xi)
      (jac,) = jax.vmap(vjp)(jnp.eye(n, r.shape[0], dtype=r.dtype))
      return jnp.linalg.norm(jac.reshape(n, -1), axis=-1) / (r[:n] + eps)
    return jnp.sum(jax.vmap(one)(x), axis=0)

  return lambda: jax.block_until_ready(scores(x))


def run(model_names: Sequence[str] = ("lenet", "convnet64"),
        batches: Sequence[int] = (1, 8), repeats: int = 3,
        max_features: int = 768, verbose: bool = True,
        max_features_by_model: dict[str, int] | None = None) -> dict:
  """Times our feature scores against the per-feature vjp loop.

  Args:
    model_names: registry names (CIFAR-10 shapes).
    batches: batch sizes.
    repeats: timed repeats; medians are reported.
    max_features: features timed (the rest is scaled linearly).
    verbose: print as it goes.
    max_features_by_model: per-model cap on the features timed; default
      ``{'convnet64': 32}`` (its full Jacobian takes ~20 minutes per batch of
      8 on a 2-core CPU, on either side).

  Returns:
    ``{'backend', 'rows': [{model, batch, features_timed, num_features,
    loop_s, loop_s2d_s, ours_s, speedup, speedup_vs_loop_s2d, compile_*}]}``
    with every time scaled to all F features.
  """
  rows = []
  for name in model_names:
    xla = models.get_model(name, (32, 32, 3))
    s2d = xla.with_conv_impl("s2d")
    params = xla.init(jax.random.key(0))
    eps, nf = xla.score_eps, xla.num_features
    caps = ({"convnet64": 32} if max_features_by_model is None
            else max_features_by_model)
    n = min(nf, max_features, caps.get(name, nf))
    scale = nf / n
    reps = repeats if n * 8 <= 8192 else 1
    for b in batches:
      x = jax.random.uniform(jax.random.key(1), (b, 32, 32, 3))
      row = {"model": name, "batch": b, "num_features": nf,
             "features_timed": n}
      row["loop_s"], row["compile_loop_s"] = _time(
          _reference_loop(xla, params, eps, x, n), reps)
      row["loop_s2d_s"], row["compile_loop_s2d_s"] = _time(
          _reference_loop(s2d, params, eps, x, n), reps)
      row["ours_s"], row["compile_ours_s"] = _time(
          _ours(s2d, params, eps, x, n), reps)
      for k in ("loop_s", "loop_s2d_s", "ours_s"):
        row[k] *= scale
      row["speedup"] = row["loop_s"] / row["ours_s"]
      row["speedup_vs_loop_s2d"] = row["loop_s2d_s"] / row["ours_s"]
      rows.append(row)
      if verbose:
        note = f" (timed on {n} of {nf} features)" if n < nf else ""
        print(f"{name:9s} B={b}: loop {row['loop_s']:.3f} s, loop(s2d) "
              f"{row['loop_s2d_s']:.3f} s, ours {row['ours_s']:.3f} s -> "
              f"{row['speedup']:.2f}x ({row['speedup_vs_loop_s2d']:.2f}x vs "
              f"the s2d loop); compile ours {row['compile_ours_s']:.1f} s"
              f"{note}", flush=True)
  return {"backend": jax.default_backend(), "rows": rows}


def main(argv):
  del argv
  results = run(FLAGS.models, [int(b) for b in FLAGS.batches], FLAGS.repeats,
                FLAGS.max_features)
  if FLAGS.out:
    from repdef_jax import storage  # pylint: disable=g-import-not-at-top
    storage.write_json(FLAGS.out, results)


if __name__ == "__main__":
  define_flags()
  app.run(main)
