"""Attack benchmarks: DLG outer steps and GS iterations, one image.

DLG's LeNet (uniform init) on a CIFAR-10-shaped image. The attacks validate
their inputs on the host and jit internally, so the builders return host
callables (``memory_analysis`` is not reported for them).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from experiments.benchmarks import timing
from repdef_jax import gradients
from repdef_jax import models
from repdef_jax.attacks import dlg as dlg_lib
from repdef_jax.attacks import inverting
from repdef_jax.attacks import progress

LABEL = 3


def _setup(model_name, input_shape=(32, 32, 3), **kwargs):
  model = models.get_model(model_name, input_shape, 10, init="uniform",
                           **kwargs)
  params = model.init(jax.random.key(0))
  x = jax.random.uniform(jax.random.key(2), (1, *input_shape))
  shared = gradients.batch_grad(model, params, x, jnp.array([LABEL]))
  return model, params, x, shared


def matching_flops(model, params, x) -> float:
  """FLOPs of one gradient of the gradient-matching objective (XLA count)."""
  m = model.with_conv_impl("xla")
  y = jnp.full((1, 10), 0.1)
  target = gradients.batch_grad(m, params, x, jnp.array([LABEL]))

  def objective(xd):
    g = gradients.batch_grad(m, params, xd, y)
    return sum(jnp.sum((a - b) ** 2) for a, b in zip(
        jax.tree_util.tree_leaves(g), jax.tree_util.tree_leaves(target)))

  return timing.xla_flops(jax.grad(objective), x)


def no_stop_config(outer_steps: int, inner_steps: int,
                   progress_every: int = 0) -> dlg_lib.DLGConfig:
  """DLG settings with no early stop of any kind (the PyTorch peer runs every
  iteration): the divergence guards are off too (they stopped the default
  run at 44 of 60); grad_tol=0 stops only at an exactly zero gradient, where
  L-BFGS stalls."""
  return dlg_lib.DLGConfig(outer_steps=outer_steps, inner_steps=inner_steps,
                           tol=0.0, grad_tol=0.0,
                           diverge_factor=float("inf"),
                           max_abs_pixel=float("inf"),
                           progress_every=progress_every)


def build_dlg(model_name: str = "lenet", outer_steps: int = 3,
              inner_steps: int = 20, progress_every: int = 0,
              **kwargs) -> timing.Bench:
  """DLG for ``outer_steps`` x ``inner_steps`` L-BFGS iterations, no stop.

  With ``progress_every`` the progress callbacks run (to a quiet reporter:
  the host side is called, nothing is printed).
  """
  model, params, x, shared = _setup(model_name, **kwargs)
  cfg = no_stop_config(outer_steps, inner_steps, progress_every)
  key = jax.random.key(1)

  def fn():
    with progress.reporting(None):
      return dlg_lib.dlg(model, params, shared, 1, key, config=cfg)

  return timing.Bench(
      fn, (), outer_steps * inner_steps * matching_flops(model, params, x),
      f"{outer_steps} outer x {inner_steps} inner steps",
      {"model": model, "params": params, "x": x,
       "outer_steps": outer_steps, "inner_steps": inner_steps})


def build_gs(model_name: str = "lenet", iterations: int = 50,
             **kwargs) -> timing.Bench:
  """GS (Inverting Gradients) for ``iterations`` iterations, one restart."""
  model, params, x, shared = _setup(model_name, **kwargs)
  cfg = inverting.GSConfig(iterations=iterations, restarts=1)
  key = jax.random.key(1)
  fn = lambda: inverting.inverting_gradients(
      model, params, shared, 1, key, labels=jnp.array([LABEL]), config=cfg)
  return timing.Bench(fn, (), iterations * matching_flops(model, params, x),
                      f"{iterations} iterations",
                      {"model": model, "params": params, "x": x,
                       "iterations": iterations})


def torch_dlg(bench: timing.Bench):
  """PyTorch's DLG for the same number of outer steps (callable)."""
  from experiments.benchmarks import torch_peers  # pylint: disable=g-import-not-at-top
  meta = bench.meta
  net = torch_peers.torch_model(meta["model"], meta["params"])
  rng = np.random.default_rng(0)
  x0 = torch_peers.nchw(rng.normal(size=np.shape(meta["x"])))
  y0 = torch_peers._t(rng.normal(size=(1, 10)))  # pylint: disable=protected-access
  step = torch_peers.dlg_runner(net, torch_peers.nchw(meta["x"]), LABEL, x0,
                                y0, meta["inner_steps"])
  return torch_peers.synced(
      lambda: [step() for _ in range(meta["outer_steps"])])


def torch_gs(bench: timing.Bench):
  """PyTorch's GS for the same number of iterations (callable)."""
  from experiments.benchmarks import torch_peers  # pylint: disable=g-import-not-at-top
  meta = bench.meta
  net = torch_peers.torch_model(meta["model"], meta["params"])
  x0 = torch_peers.nchw(np.random.default_rng(0).random(np.shape(meta["x"])))
  step = torch_peers.gs_runner(net, torch_peers.nchw(meta["x"]), LABEL, x0)
  return torch_peers.synced(
      lambda: [step() for _ in range(meta["iterations"])])


def dlg_outer_step_seconds(model_name: str, repeats: int = 1,
                           **kwargs) -> float:
  """Seconds per DLG outer step (20 L-BFGS iterations), one image."""
  res = timing.measure(build_dlg(model_name, outer_steps=2, **kwargs),
                       repeats)
  return res["seconds"] / 2


def gs_iteration_seconds(model_name: str, repeats: int = 1,
                         **kwargs) -> float:
  """Seconds per GS iteration, one image, one restart."""
  res = timing.measure(build_gs(model_name, iterations=20, **kwargs), repeats)
  return res["seconds"] / 20
