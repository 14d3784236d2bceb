"""Soteria mask benchmark: the defense as users call it, on one client batch.

``soteria(model, percent)`` applied to a batch gradient (LeNet, CIFAR-10
shapes, batch 1 / 10 / 50), against the reference per-feature backward loop
in PyTorch (:func:`experiments.benchmarks.torch_peers.soteria_mask`) and
against the same computation vectorized with ``torch.func``
(:func:`~experiments.benchmarks.torch_peers.soteria_mask_vectorized`); each
row also says whether both masks are identical.
"""

from __future__ import annotations

from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from experiments.benchmarks import fedavg as fedavg_bench
from experiments.benchmarks import timing
from repdef_jax import gradients
from repdef_jax import models
from repdef_jax.defenses import base
from repdef_jax.defenses import soteria


def build_mask(model_name: str = "lenet",
               input_shape: Sequence[int] = (32, 32, 3), batch: int = 10,
               percent: float = 60.0) -> timing.Bench:
  """The jitted Soteria defense on one batch gradient, and its inputs.

  ``fn(params, x, y, grads)`` returns ``(defended grads, keep mask)``.
  """
  model = models.get_model(model_name, input_shape, 10)
  defense = soteria.soteria(model, percent)
  params = model.init(jax.random.key(0))
  x = jax.random.uniform(jax.random.key(1), (batch, *input_shape))
  y = jnp.arange(batch, dtype=jnp.int32) % 10
  grads = gradients.batch_grad(model, params, x, y)

  @jax.jit
  def fn(params, x, y, grads):
    out, _ = defense.apply(grads, base.ClientBatch(params, x, y, None),
                           jax.random.key(0))
    keep = jnp.any(models.defended_params(model, out)["kernel"] != 0, axis=1)
    return out, keep

  return timing.Bench(fn, (params, x, y, grads),
                      fedavg_bench.mask_flops(model, batch),
                      f"batch {batch}, {model.num_features} features",
                      {"model": model, "percent": percent})


def torch_mask(bench: timing.Bench, mask_impl: str = "loop"):
  """The PyTorch peer of :func:`build_mask` and a check of equal masks.

  Args:
    bench: :func:`build_mask`'s benchmark.
    mask_impl: 'loop' (the reference per-feature loop) or 'vectorized'
      (``torch.func.vmap`` over the pullback, in feature chunks).

  Returns:
    ``(callable, masks_equal)``: that peer on the same model, parameters
    and images, and a function saying whether its keep-mask equals ours
    (rows of the kernel gradient that are exactly zero are read as pruned
    on both sides; a row that is zero before masking counts as pruned on
    both). Call it after timing: it runs ours, which would otherwise be
    compiled before the timing measures its compilation.
  """
  from experiments.benchmarks import torch_peers  # pylint: disable=g-import-not-at-top
  mask = torch_peers.mask_fn(mask_impl)
  params, x, y, grads = bench.args
  model, percent = bench.meta["model"], bench.meta["percent"]
  net = torch_peers.torch_model(model, params)
  xt = torch_peers.nchw(x)
  keep_t, _ = mask(net, xt, percent, model.score_eps)

  def masks_equal() -> bool:
    _, keep = bench.fn(*bench.args)
    nonzero = np.asarray(jnp.any(
        models.defended_params(model, grads)["kernel"] != 0, axis=1))
    return bool(np.array_equal(np.asarray(keep), (keep_t > 0) & nonzero))

  return torch_peers.synced(lambda: mask(net, xt, percent,
                                         model.score_eps)), masks_equal
