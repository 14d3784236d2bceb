"""DLG and iDLG: gradient inversion by L-BFGS on a summed L2 gradient distance.

References:
  Zhu, Liu, Han. "Deep Leakage from Gradients". NeurIPS 2019.
  Zhao, Mopuri, Bilen. "iDLG: Improved Deep Leakage from Gradients". 2020.

The attack draws a dummy image and dummy label logits from a standard normal,
uses ``softmax(dummy logits)`` as a soft label, and minimises the summed
squared L2 distance between the dummy's gradient and the shared gradient over
every parameter tensor, jointly in image and label, with L-BFGS. Images live
in [0, 1] with no normalisation (the model takes them as they are). With
``infer_label=True`` (iDLG) the label is read off the last layer's gradient
(:func:`repdef_jax.attacks.base.infer_labels`) and only the image is
optimised, with that hard label. A :class:`~repdef_jax.attacks.objectives.
GradientView` turns it into the adaptive attacks (defended layer dropped, or
the shared gradient's pruning mask applied to the trial gradient).

Where this departs from the reference PyTorch code:

* Optimiser: lr 1, history 100, no line search, as ``torch.optim.LBFGS(lr=1)``.
  The default is :func:`repdef_jax.attacks.lbfgs.torch_lbfgs`, an optax
  ``GradientTransformation`` with torch's step rule, not
  ``optax.lbfgs(learning_rate=1.0, memory_size=100, linesearch=None)``:
  optax 0.2.8 stores curvature pairs with ``y^T s <= 0`` (torch skips them),
  which on DLG's non-convex objective gave ascent directions and diverged in
  our tests. ``optimizer='optax'`` selects optax's.
* Loop: PyTorch runs 300 outer ``step(closure)`` calls of up to 20 inner
  iterations each. Here the whole attack is one ``lax.while_loop`` inside
  ``jit`` over at most ``outer_steps * inner_steps`` single L-BFGS
  iterations (one gradient evaluation each, as PyTorch without line search);
  ``loss_history`` holds the loss at the end of each outer step.
* Stopping: the loop stops early when the loss falls below ``tol`` or the
  largest absolute gradient entry below ``grad_tol`` (PyTorch's
  ``tolerance_grad``); PyTorch's ``tolerance_change`` test is not used.
* Divergence: an iteration whose loss or gradient is non-finite, whose loss
  exceeds ``diverge_factor`` times the initial loss, or whose image leaves
  ``[-max_abs_pixel, max_abs_pixel]`` is rejected, the loop stops and the
  result says ``diverged=True`` (PyTorch carries on into NaN).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import numbers
from typing import Any

import jax
import jax.numpy as jnp
import optax

from repdef_jax import gradients as gradients_lib
from repdef_jax import models as models_lib
from repdef_jax.attacks import base
from repdef_jax.attacks import lbfgs as lbfgs_lib
from repdef_jax.attacks import objectives

Params = Any


@dataclasses.dataclass(frozen=True)
class DLGConfig:
  """DLG / iDLG settings (defaults: the reference code's).

  Attributes:
    outer_steps: PyTorch ``step`` calls (300 in DLG).
    inner_steps: L-BFGS iterations per outer step (PyTorch ``max_iter`` 20).
    learning_rate: L-BFGS step size (1).
    memory_size: L-BFGS history (100, PyTorch ``history_size``).
    tol: stop once the gradient distance is below this.
    grad_tol: stop once max |d loss / d dummy| is at most this.
    infer_label: iDLG: infer the label from the last layer, optimise only
      the image with that hard label.
    view: which gradient entries to match (adaptive attacks).
    diverge_factor: loss above this times the initial loss = diverged.
    max_abs_pixel: an image entry beyond this magnitude = diverged.
    optimizer: 'torch' (:func:`repdef_jax.attacks.lbfgs.torch_lbfgs`, the
      curvature-safe rule of ``torch.optim.LBFGS``; default) or 'optax'
      (``optax.lbfgs(lr, memory_size, linesearch=None)``).
  """

  outer_steps: int = 300
  inner_steps: int = 20
  learning_rate: float = 1.0
  memory_size: int = 100
  tol: float = 1e-9
  grad_tol: float = 1e-7
  infer_label: bool = False
  view: objectives.GradientView = objectives.GradientView()
  diverge_factor: float = 1e4
  max_abs_pixel: float = 1e3
  optimizer: str = "torch"


def check_config(config: DLGConfig) -> None:
  """Raises a ValueError naming the field when ``config`` cannot run.

  Host-side, before the jitted loop: ``outer_steps``, ``inner_steps`` and
  ``memory_size`` must be integers >= 1, ``learning_rate`` a finite number
  > 0.
  """
  for name in ("outer_steps", "inner_steps", "memory_size"):
    v = getattr(config, name)
    if isinstance(v, bool) or not isinstance(v, numbers.Integral) or v < 1:
      raise ValueError(f"{name} must be an integer >= 1; got {v!r}.")
  lr = config.learning_rate
  if isinstance(lr, bool) or not isinstance(lr, numbers.Real) or not (
      math.isfinite(lr) and lr > 0):
    raise ValueError(f"learning_rate must be a finite number > 0; got "
                     f"{lr!r}.")


def dlg(model: models_lib.Model, params: Params, shared_grads: Params,
        num_images: int, key: jax.Array, *, labels: Any = None,
        config: DLGConfig | None = None) -> base.AttackResult:
  """Runs DLG (or iDLG / an adaptive variant, by ``config``).

  Args:
    model: the attacked model.
    params: the parameters the shared gradient was computed at.
    shared_grads: the (possibly defended) gradient of the mean loss over
      ``num_images`` images.
    num_images: B, the number of images to reconstruct.
    key: PRNG key for the dummy image and label.
    labels: known labels ``[B]``; when given only the image is optimised.
    config: :class:`DLGConfig` (defaults if None).

  Returns:
    An :class:`~repdef_jax.attacks.base.AttackResult` (device arrays).

  Raises:
    ValueError: shared_grads does not match params or is not finite, the
      model cannot take the images, or a bad config (:func:`check_config`).
  """
  config = config or DLGConfig()
  check_config(config)
  labels = base.validate_inputs(model, params, shared_grads, num_images,
                                labels)
  mode = "given" if labels is not None else (
      "infer" if config.infer_label else "learn")
  if labels is None:
    labels = jnp.zeros((num_images,), jnp.int32)
  return _dlg_jit(model, params, shared_grads, key, labels,
                  num_images=int(num_images), mode=mode, config=config)


@functools.partial(jax.jit,
                   static_argnames=("model", "num_images", "mode", "config"))
def _dlg_jit(model, params, shared_grads, key, labels, *, num_images, mode,
             config):
  """The jitted attack; ``mode`` is 'learn', 'infer' or 'given' labels."""
  kx, ky = jax.random.split(key)
  shape = (num_images, *model.input_shape)
  z = {"x": jax.random.normal(kx, shape, jnp.float32)}
  if mode == "learn":
    z["y"] = jax.random.normal(ky, (num_images, model.num_classes))
  elif mode == "infer":
    labels = base.infer_labels(model, shared_grads, num_images)
  weights = objectives.view_weights(model, shared_grads, config.view)

  def loss_fn(z):
    y = jax.nn.softmax(z["y"], axis=-1) if mode == "learn" else labels
    g = gradients_lib.batch_grad(model, params, z["x"], y)
    return objectives.gradient_distance("l2", g, shared_grads, weights)

  value_and_grad = jax.value_and_grad(loss_fn)
  if config.optimizer == "torch":
    opt = lbfgs_lib.torch_lbfgs(config.learning_rate, config.memory_size)
  elif config.optimizer == "optax":
    opt = optax.lbfgs(learning_rate=config.learning_rate,
                      memory_size=config.memory_size, linesearch=None)
  else:
    raise ValueError(f"optimizer must be 'torch' or 'optax', got "
                     f"{config.optimizer!r}.")
  loss0, grad0 = value_and_grad(z)
  total = config.outer_steps * config.inner_steps
  hist0 = jnp.full((config.outer_steps,), jnp.nan, jnp.float32)

  def converged(loss, grad):
    gmax = jnp.max(jnp.stack([jnp.max(jnp.abs(g))
                              for g in jax.tree_util.tree_leaves(grad)]))
    return (loss < config.tol) | (gmax <= config.grad_tol)

  init = (0, z, opt.init(z), loss0, grad0,
          converged(loss0, grad0), jnp.array(False), hist0)

  def cond(carry):
    i, _, _, _, _, done, _, _ = carry
    return (i < total) & ~done

  def body(carry):
    i, z, state, loss, grad, _, _, hist = carry
    updates, new_state = opt.update(grad, state, z)
    new_z = optax.apply_updates(z, updates)
    new_loss, new_grad = value_and_grad(new_z)
    bad = (~jnp.isfinite(new_loss) | ~base.tree_all_finite(new_grad)
           | ~base.tree_all_finite(new_z)
           | (new_loss > config.diverge_factor * jnp.maximum(loss0, 1e-30))
           | (jnp.max(jnp.abs(new_z["x"])) > config.max_abs_pixel))
    z, state, loss, grad = base.tree_select(
        bad, (z, state, loss, grad), (new_z, new_state, new_loss, new_grad))
    done = bad | converged(loss, grad)
    hist = hist.at[i // config.inner_steps].set(loss)
    return i + 1, z, state, loss, grad, done, bad, hist

  n, z, _, loss, _, _, diverged, hist = jax.lax.while_loop(cond, body, init)
  hist = jnp.where(jnp.isnan(hist), loss, hist)
  if mode == "learn":
    labels = jnp.argmax(z["y"], axis=-1).astype(jnp.int32)
  return base.AttackResult(x_rec=z["x"], labels_rec=labels, loss_history=hist,
                           final_loss=loss, diverged=diverged, iterations=n)
