r"""Benchmark: Soteria feature scores, one Jacobian vs the reference's loop.

The reference code computes ``||d r_i / d x||`` with one backward pass per
feature. Here we time, on the same model code:

* ``loop``: the reference way, one jitted vjp (feature index traced, so it is
  compiled once) called from a Python loop over the F features; for large F
  the loop is timed on ``--loop_features`` features and extrapolated
  linearly (printed as such);
* our :func:`repdef_jax.defenses.soteria.feature_scores` variants, jitted,
  timed after compilation (compile time reported separately): ``rev``
  (vmap over images of a vmapped vjp = jacrev), ``fwd`` (jacfwd) and
  ``map_rev`` / ``map_fwd`` (``lax.map`` over images, one image's Jacobian
  at a time: less memory, same arithmetic).

The fastest variant per (model, batch) is printed as the choice.

Run:
  python -m experiments.benchmark_defense --out=/tmp/bench_defense.json
"""

from __future__ import annotations

import json
import statistics
import time
from typing import Sequence

from absl import app
from absl import flags
import jax
import jax.numpy as jnp

from repdef_jax import models
from repdef_jax.defenses import soteria

FLAGS = flags.FLAGS
flags.DEFINE_string("out", None, "Optional JSON output path.")
flags.DEFINE_list("models", ["lenet", "convnet64"], "Models to benchmark.")
flags.DEFINE_list("batches", ["1", "8"], "Batch sizes.")
flags.DEFINE_integer("repeats", 3, "Timed repeats (median).")
flags.DEFINE_integer("loop_features", 256,
                     "Max features timed in the reference loop (extrapolated).")


def _time(fn, *args, repeats: int) -> tuple[float, float]:
  t0 = time.perf_counter()
  jax.block_until_ready(fn(*args))
  first = time.perf_counter() - t0
  ts = []
  for _ in range(repeats):
    t0 = time.perf_counter()
    jax.block_until_ready(fn(*args))
    ts.append(time.perf_counter() - t0)
  med = statistics.median(ts)
  return med, max(first - med, 0.0)


def _variants(fn, eps, x):
  def batched(mode):
    return jax.jit(lambda x: soteria.feature_scores(fn, x, eps=eps,
                                                     jacobian=mode))

  def mapped(mode):
    def one(xi):
      r, jac = soteria.features_and_jacobian(fn, xi[None], jacobian=mode)
      return soteria.scores_from_jacobian(r, jac, eps=eps)
    return jax.jit(lambda x: jnp.sum(jax.lax.map(one, x), axis=0))

  out = {"map_rev": mapped("rev"), "map_fwd": mapped("fwd")}
  if x.shape[0] == 1 or fn(x[0]).shape[0] <= 1024:  # memory: B*F cotangents
    out["rev"] = batched("rev")
    out["fwd"] = batched("fwd")
  return out


def run(model_names: Sequence[str] = ("lenet", "convnet64"),
        batches: Sequence[int] = (1, 8), repeats: int = 3,
        loop_features: int = 256) -> dict:
  """Times feature_scores against the per-feature vjp loop.

  Returns:
    ``{model: {batch: {variant: seconds, 'loop': seconds, 'compile': {...},
    'choice': name, 'speedup': loop / best}}}``.
  """
  results = {"backend": jax.default_backend(), "models": {}}
  for name in model_names:
    model = models.get_model(name, (32, 32, 3))
    params = model.init(jax.random.key(0))
    fn = model.feature_fn(params)
    eps = model.score_eps
    nf = model.num_features
    res = {}
    for b in batches:
      x = jax.random.uniform(jax.random.key(1), (b, 32, 32, 3))
      entry = {"compile": {}}
      for vname, vfn in _variants(fn, eps, x).items():
        t, c = _time(vfn, x, repeats=repeats if name == "lenet" else 1)
        entry[vname], entry["compile"][vname] = t, c
        print(f"{name} B={b} {vname}: {t:.4f} s (compile {c:.2f} s)",
              flush=True)

      feats = lambda x: model.features(params, x)

      @jax.jit
      def one(x, i):
        r, vjp = jax.vjp(feats, x)
        (g,) = vjp(jax.nn.one_hot(jnp.full((x.shape[0],), i), nf,
                                  dtype=r.dtype))
        return jnp.linalg.norm(g.reshape(x.shape[0], -1), axis=-1) / (
            r[:, i] + eps)

      n_loop = min(nf, loop_features)
      jax.block_until_ready(one(x, 0))
      ts = []
      for _ in range(max(1, repeats if name == "lenet" else 1)):
        t0 = time.perf_counter()
        outs = [one(x, i) for i in range(n_loop)]
        jax.block_until_ready(outs)
        ts.append((time.perf_counter() - t0) * nf / n_loop)
      entry["loop"] = statistics.median(ts)
      entry["loop_extrapolated_from"] = n_loop
      variants = [k for k in entry if k not in ("compile", "loop",
                                                 "loop_extrapolated_from")]
      best = min(variants, key=lambda k: entry[k])
      entry["choice"] = best
      entry["speedup"] = entry["loop"] / entry[best]
      print(f"{name} B={b} loop: {entry['loop']:.4f} s"
            f"{' (extrapolated from %d features)' % n_loop if n_loop < nf else ''}"
            f" | choice {best}: {entry[best]:.4f} s | speedup "
            f"{entry['speedup']:.2f}x", flush=True)
      res[str(b)] = entry
    results["models"][name] = res
  return results


def main(argv):
  del argv
  results = run(FLAGS.models, [int(b) for b in FLAGS.batches], FLAGS.repeats,
                FLAGS.loop_features)
  if FLAGS.out:
    with open(FLAGS.out, "w") as f:
      json.dump(results, f, indent=1)


if __name__ == "__main__":
  app.run(main)
