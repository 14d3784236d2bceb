"""Losses, batch gradients and per-example gradients (``vmap(grad)``).

Per-example gradients are what a client's gradient is made of: the batch
gradient is their mean. Everything here is a pure, jittable function of
``(model, params, x, y)``; ``model`` is static (close over it or mark it
static under ``jax.jit``).
"""

from __future__ import annotations

import functools
import math
from typing import Any

import jax
import jax.numpy as jnp

from repdef_jax import host
from repdef_jax import models as models_lib

Params = Any


def cross_entropy(logits: jax.Array, labels: jax.Array) -> jax.Array:
  """Per-example cross-entropy with hard or soft labels.

  Args:
    logits: ``[..., K]``.
    labels: integer class ids ``[...]`` (hard) or a probability vector per
      example ``[..., K]`` (soft; DLG's dummy label after softmax).

  Returns:
    Loss per example, ``[...]``. A hard label outside ``[0, K)`` gives a NaN
    loss (and a NaN gradient), never a silent finite value, so it is caught by
    :func:`check_finite` downstream (the check cannot raise under ``jit``).

  Raises:
    ValueError: soft labels whose shape differs from ``logits``, or hard
      labels that are not integers.
  """
  logp = jax.nn.log_softmax(logits, axis=-1)
  if labels.ndim == logits.ndim:
    if tuple(labels.shape) != tuple(logits.shape):
      raise ValueError(
          f"labels (soft) must have the shape of logits {tuple(logits.shape)};"
          f" got shape {tuple(labels.shape)}. Hard labels must be integer "
          f"class ids of shape {tuple(logits.shape[:-1])}.")
    return -jnp.sum(labels * logp, axis=-1)
  if not jnp.issubdtype(labels.dtype, jnp.integer):
    raise ValueError(
        "labels must be integer class ids of shape logits.shape[:-1] or "
        f"probabilities of shape logits.shape; got dtype {labels.dtype} and "
        f"shape {labels.shape} for logits of shape {logits.shape}.")
  num_classes = logits.shape[-1]
  valid = (labels >= 0) & (labels < num_classes)
  picked = jnp.take_along_axis(logp, jnp.clip(labels, 0, num_classes - 1)[
      ..., None], axis=-1)[..., 0]
  # Out-of-range labels: NaN loss and, through the product, NaN gradient.
  return -picked * jnp.where(valid, 1.0, jnp.nan).astype(picked.dtype)


def batch_loss(model: models_lib.Model, params: Params, x: jax.Array,
               y: jax.Array, mask: jax.Array | None = None) -> jax.Array:
  """Mean cross-entropy over a batch, ignoring examples where ``mask`` is 0.

  Args:
    model: the model.
    params: its parameters.
    x: images ``[B, H, W, C]``.
    y: hard ``[B]`` or soft ``[B, K]`` labels.
    mask: optional ``[B]`` weights (1 = real example, 0 = padding).

  Returns:
    Scalar mean loss over the real examples (0 when there are none).

  Raises:
    ValueError: ``y`` or ``mask`` does not have one entry per image.
  """
  _check_labels(x, y)
  _check_mask(x, mask)
  if mask is None:
    return jnp.mean(cross_entropy(model.apply(params, x), y))
  x, y = drop_padding(x, y, mask)
  losses = cross_entropy(model.apply(params, x), y)
  mask = mask.astype(losses.dtype)
  return jnp.sum(losses * mask) / jnp.maximum(jnp.sum(mask), 1.0)


def _check_labels(x: jax.Array, y: jax.Array) -> None:
  if jnp.ndim(y) < 1 or y.shape[0] != x.shape[0]:
    raise ValueError(f"y has {y.shape[0] if jnp.ndim(y) else 0} labels for "
                     f"{x.shape[0]} images (x of shape {tuple(x.shape)}); "
                     "y must be [B] (hard) or [B, K] (soft).")


def _check_mask(x: jax.Array, mask: jax.Array | None) -> None:
  if mask is not None and tuple(jnp.shape(mask)) != (x.shape[0],):
    raise ValueError(f"mask must have shape [B] = ({x.shape[0]},) for "
                     f"{x.shape[0]} images; got shape "
                     f"{tuple(jnp.shape(mask))}.")


def drop_padding(x: jax.Array, y: jax.Array,
                 mask: jax.Array) -> tuple[jax.Array, jax.Array]:
  """``x`` and ``y`` with the padded rows (``mask == 0``) set to 0.

  A padded row's loss is multiplied by 0 afterwards, but ``0 * nan`` is
  nan: padding that holds NaN pixels or an out-of-range label (-1 is a
  common choice) would otherwise reach the gradient. Rows already 0 (how
  :func:`repdef_jax.partition.pack` pads) are unchanged, bit for bit.
  """
  keep = mask > 0
  x = jnp.where(keep.reshape(keep.shape + (1,) * (x.ndim - 1)), x, 0)
  y = jnp.where(keep.reshape(keep.shape + (1,) * (y.ndim - 1)), y, 0)
  return x, y


@functools.partial(jax.jit, static_argnums=0)
def batch_grad(model: models_lib.Model, params: Params, x: jax.Array,
               y: jax.Array, mask: jax.Array | None = None) -> Params:
  """Gradient of :func:`batch_loss` with respect to ``params``.

  One compiled program per model and shapes, also when called outside
  ``jit``: run eagerly, op by op, its first call on a small LeNet took
  5.4 s on a 2-core CPU against 1.5 s to compile it, and each later call
  0.15 s.
  """
  return jax.grad(lambda p: batch_loss(model, p, x, y, mask))(params)


def batch_loss_and_grad(model: models_lib.Model, params: Params,
                        x: jax.Array, y: jax.Array,
                        mask: jax.Array | None = None, *,
                        chunk: int | None = None) -> tuple[jax.Array, Params]:
  """:func:`batch_loss` and its gradient, the formulation picked per backend.

  Where :func:`per_example_chunk` runs examples one at a time (CPU, wide
  convolutions: XLA's CPU convolutions at batch B run slower than B
  one-example ones there), the gradient is the masked mean of the
  per-example gradients of that compiled loop; else ``value_and_grad`` of
  the batch. Same numbers up to float rounding; no layer of these models
  couples the examples of a batch. Measured on the 2-core Intel Xeon, one
  step of ConvNet64 (width 64) on CIFAR-10 at batch 10 / 50: 1.11 / 5.47 s
  batched, 0.64 / 3.20 s looped (docs/design.md).

  Args:
    model, params, x, y, mask: as :func:`batch_loss`.
    chunk: examples at a time (None: :func:`per_example_chunk`).

  Returns:
    ``(loss, grads)``.
  """
  chunk = per_example_chunk(model, params) if chunk is None else int(chunk)
  if chunk >= x.shape[0]:
    return jax.value_and_grad(
        lambda p: batch_loss(model, p, x, y, mask))(params)
  _check_labels(x, y)
  _check_mask(x, mask)
  if mask is None:
    weights = jnp.ones((x.shape[0],), jnp.float32)
  else:
    x, y = drop_padding(x, y, mask)
    weights = mask.astype(jnp.float32)
  losses, grads = per_example_grads(model, params, x, y, chunk=chunk)
  total = jnp.maximum(jnp.sum(weights), 1.0)

  def mean(v):
    return jnp.tensordot(weights, v, axes=1) / total

  return mean(losses), jax.tree_util.tree_map(mean, grads)


def local_update_direction(model: models_lib.Model, params: Params,
                           x: jax.Array, y: jax.Array, steps: int,
                           lr: float) -> Params:
  """``(params - params_I) / (lr * I)`` after I full-batch SGD steps on x.

  What a FedAvg client with batch ``x`` shares after ``steps`` local steps
  of learning rate ``lr``, rescaled to a gradient (one step: exactly
  :func:`batch_grad`, up to rounding). Differentiable in ``x``: an attack
  that unrolls the client's local training matches this instead of one
  gradient (Geiping et al. 2020, Sec. 6).
  """
  if not isinstance(steps, int) or isinstance(steps, bool) or steps < 1:
    raise ValueError(f"steps must be an int >= 1, got {steps!r}.")
  if isinstance(lr, (int, float)) and not (math.isfinite(lr) and lr != 0):
    raise ValueError(f"lr must be a finite nonzero number, got {lr!r}.")

  def step(p, _):
    g = batch_grad(model, p, x, y)
    return jax.tree_util.tree_map(lambda w, gw: w - lr * gw, p, g), None

  final, _ = jax.lax.scan(step, params, None, length=steps)
  return jax.tree_util.tree_map(lambda a, b: (a - b) / (lr * steps), params,
                                final)


def example_loss(model: models_lib.Model, params: Params, x: jax.Array,
                 y: jax.Array) -> jax.Array:
  """Loss of one example ``x [H, W, C]``, label ``y`` (``[]`` or ``[K]``)."""
  return cross_entropy(model.apply(params, x[None]), y[None])[0]


@functools.partial(jax.jit, static_argnums=0, static_argnames=("chunk",))
def per_example_grads(model: models_lib.Model, params: Params, x: jax.Array,
                      y: jax.Array, *,
                      chunk: int | None = None) -> tuple[jax.Array, Params]:
  """Loss and gradient of every example of a batch, with ``vmap(grad)``.

  Args:
    model: the model.
    params: its parameters (shared by every example).
    x: images ``[B, H, W, C]``.
    y: hard ``[B]`` or soft ``[B, K]`` labels.
    chunk: examples vectorized at once (``lax.map(..., batch_size=chunk)``);
      None picks per backend (:func:`per_example_chunk`). Same numbers.

  Returns:
    ``(losses [B], grads)`` where every leaf of ``grads`` has a leading
    axis of size B. Their mean over B equals :func:`batch_grad`.

  Like :func:`batch_grad`, one compiled program per model, shapes and
  ``chunk``, also when called outside ``jit``.
  """
  model.check_input(x)
  _check_labels(x, y)
  fn = jax.value_and_grad(lambda p, xi, yi: example_loss(model, p, xi, yi))
  chunk = per_example_chunk(model, params) if chunk is None else int(chunk)
  if chunk < 1:
    raise ValueError(f"chunk must be a positive int or None, got {chunk}.")
  if chunk >= x.shape[0]:
    return jax.vmap(fn, in_axes=(None, 0, 0))(params, x, y)
  return host.sequential_map(lambda a: fn(params, *a), (x, y),
                             batch_size=chunk)


# Widest convolution (output channels) for which vmapped per-example weight
# gradients beat one example at a time on CPU (LeNet: 12, vmap 1.5x faster;
# ConvNet64: 64-256, vmap 0.6x: XLA's CPU grouped convolutions are slow).
_VMAP_MAX_CONV_CHANNELS = 32


def per_example_chunk(model: models_lib.Model, params: Params,
                      backend: str | None = None) -> int:
  """Examples vectorized at once by :func:`per_example_grads` by default.

  All of them (``vmap``) on GPU/TPU and for models whose convolutions are
  narrow; one at a time (a compiled ``lax.map`` loop) on CPU for wide
  convolutions, where vmapped weight gradients become slow grouped
  convolutions.
  """
  backend = backend or jax.default_backend()
  widest = max((leaf.shape[-1] for leaf in jax.tree_util.tree_leaves(params)
                if leaf.ndim == 4), default=0)
  if backend == "cpu" and widest > _VMAP_MAX_CONV_CHANNELS:
    return 1
  return 1 << 30


def check_grads_match(params: Params, grads: Params,
                      name: str = "grads") -> None:
  """Raises a ValueError when ``grads`` does not have the structure of params.

  Args:
    params: the reference tree.
    grads: the tree to check (same structure and leaf shapes).
    name: argument name used in the error.
  """
  ps, pt = jax.tree_util.tree_flatten(params)
  gs, gt = jax.tree_util.tree_flatten(grads)
  if pt != gt:
    raise ValueError(f"{name} does not match the parameter tree: expected "
                     f"{pt}, got {gt}.")
  for p, g in zip(ps, gs):
    if jnp.shape(p) != jnp.shape(g):
      raise ValueError(f"{name} has a leaf of shape {jnp.shape(g)} where the "
                       f"parameters have {jnp.shape(p)}.")


def check_finite(tree: Any, name: str = "grads") -> None:
  """Raises a ValueError naming ``name`` when a leaf holds NaN or inf.

  Host-side check on concrete arrays; call it before handing a gradient to a
  jitted attack or defense. One compiled program per tree's shapes (not two
  one-operation programs per leaf shape), on the arrays' device.
  """
  flat = jax.tree_util.tree_flatten_with_path(tree)[0]
  finite = jax.device_get(_leaves_finite([leaf for _, leaf in flat]))
  for (path, _), ok in zip(flat, finite):
    if not ok:
      raise ValueError(f"{name} holds NaN or inf at "
                       f"{jax.tree_util.keystr(path)}.")


def all_finite(tree: Any) -> bool:
  """Whether every leaf of ``tree`` is finite (host side; fetches one bool
  per leaf, not the arrays)."""
  return all(jax.device_get(_leaves_finite(jax.tree_util.tree_leaves(tree))))


@jax.jit
def _leaves_finite(leaves: list[jax.Array]) -> list[jax.Array]:
  return [jnp.all(jnp.isfinite(leaf)) for leaf in leaves]
