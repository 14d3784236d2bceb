"""Per-example gradients: ``gradients.per_example_grads`` vs loops.

The library call (``vmap(grad)``, or a compiled loop where XLA's CPU
grouped convolutions make vmap slower, see
:func:`repdef_jax.gradients.per_example_chunk`) against a Python loop of a
jitted single-example gradient (same JAX code) and against PyTorch's loop
of single-example backward passes.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from experiments.benchmarks import timing
from repdef_jax import gradients
from repdef_jax import models


def build_per_example(model_name: str = "convnet64", batch: int = 8,
                      input_shape=(32, 32, 3)) -> timing.Bench:
  """The jitted per-example gradients of a batch, and its inputs."""
  model = models.get_model(model_name, input_shape, 10)
  params = model.init(jax.random.key(0))
  x = jax.random.uniform(jax.random.key(1), (batch, *input_shape))
  y = jnp.arange(batch, dtype=jnp.int32) % 10
  fn = jax.jit(lambda p, x, y: gradients.per_example_grads(model, p, x, y)[1])
  m = model.with_conv_impl("xla")
  flops = batch * timing.xla_flops(
      lambda p, x, y: gradients.batch_grad(m, p, x, y), params, x[:1], y[:1])
  return timing.Bench(fn, (params, x, y), flops, f"batch {batch}",
                      {"model": model})


def jax_loop(bench: timing.Bench):
  """A Python loop of one jitted single-example gradient (same model)."""
  params, x, y = bench.args
  model = bench.meta["model"]
  one = jax.jit(lambda p, x, y: gradients.batch_grad(model, p, x[None],
                                                     y[None]))
  return lambda: [one(params, x[i], y[i]) for i in range(x.shape[0])]


def torch_loop(bench: timing.Bench):
  """PyTorch's loop of single-example backward passes."""
  from experiments.benchmarks import torch_peers  # pylint: disable=g-import-not-at-top
  params, x, y = bench.args
  net = torch_peers.torch_model(bench.meta["model"], params)
  xt, yt = torch_peers.nchw(x), torch_peers.labels(jax.device_get(y))
  return torch_peers.synced(lambda: torch_peers.per_example_grads(net, xt,
                                                                  yt))
