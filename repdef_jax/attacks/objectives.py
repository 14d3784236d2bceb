"""Gradient-matching objectives and the attacker's "gradient view".

Distances between a trial gradient ``g`` (of dummy data) and the shared
gradient ``g'`` (what the server received), both pytrees with the structure of
the parameters:

* :func:`l2_distance`: the summed squared L2 distance over every tensor, as
  DLG (Zhu et al., "Deep Leakage from Gradients", NeurIPS 2019).
* :func:`cosine_distance`: one global cosine distance over the concatenation
  of all tensors, ``1 - <g, g'> / (||g|| ||g'||)``, as Inverting Gradients
  (Geiping et al., "Inverting Gradients - How easy is it to break privacy in
  federated learning?", NeurIPS 2020).
* :func:`total_variation`: anisotropic TV, ``mean |dx| + mean |dy|`` (the
  image prior of Inverting Gradients).

A :class:`GradientView` says which parts of the gradient the attacker matches.
It implements the two adaptive attacks later work used against Soteria (Sun
et al., CVPR 2021), which perturbs only the defended layer
(``model.defended_path``, the classifier head):

* ``drop_defended``: exclude the defended layer (its kernel, and by default its
  bias) from the objective and match every other layer (Balunovic et al.,
  "Bayesian Framework for Gradient Leakage", ICLR 2022).
* ``mask_from_shared``: read the pruned features off the shared gradient (the
  rows of the defended kernel that are exactly all-zero; flax's Dense kernel is
  ``[F, K]`` so the paper's columns of dL/dW are its rows) and apply the same
  mask to the trial gradient (GGL, Li et al., "Auditing Privacy Defenses in
  Federated Learning via Generative Gradient Leakage", CVPR 2022).

Departures: both papers' attacks bring more than the view. Balunovic et al.
pair the dropped layer with their Bayesian image prior, and GGL searches the
latent space of a GAN generator with gradient-free optimisers; here only the
view is taken over and added to DLG's and GS's own objectives and priors (no
learned prior, no generator), which is what the project's adaptive attacks
run (``dlg_drop``, ``gs_mask``, ...).

Both are expressed as elementwise 0/1 weights applied to *both* gradients
(:func:`view_weights`), computed only from what the server sees (the shared
gradient and the model). Zeroing an entry in both gradients removes it from
the L2 sum and from the dot product and both norms of the cosine, so a weighted
objective equals the plain objective on the remaining entries.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp

from repdef_jax import models as models_lib

Params = Any


@dataclasses.dataclass(frozen=True)
class GradientView:
  """Which entries of the gradient the attack objective matches.

  Attributes:
    drop_defended: exclude the defended layer (Balunovic et al. 2022).
    drop_bias: with ``drop_defended``, also drop the defended layer's bias
      (True, default) or drop only its kernel (False).
    mask_from_shared: apply the all-zero-row mask of the shared defended
      kernel to the trial gradient (GGL, Li et al. 2022).
  """

  drop_defended: bool = False
  drop_bias: bool = True
  mask_from_shared: bool = False

  @property
  def is_plain(self) -> bool:
    return not (self.drop_defended or self.mask_from_shared)


def l2_distance(g: Params, g_ref: Params) -> jax.Array:
  """Summed squared L2 distance over every tensor (DLG).

  Args:
    g: trial gradient pytree.
    g_ref: shared gradient pytree (same structure).

  Returns:
    ``sum_t ||g_t - g'_t||^2``, a scalar.
  """
  leaves = jax.tree_util.tree_leaves(
      jax.tree_util.tree_map(lambda a, b: jnp.sum((a - b) ** 2), g, g_ref))
  return sum(leaves, jnp.zeros((), jnp.float32))


def cosine_distance(g: Params, g_ref: Params, eps: float = 1e-12) -> jax.Array:
  """One global cosine distance over the concatenation of all tensors (GS).

  Args:
    g: trial gradient pytree.
    g_ref: shared gradient pytree (same structure).
    eps: guards the division when a norm is 0.

  Returns:
    ``1 - <g, g'> / (||g|| ||g'|| + eps)``, a scalar in [0, 2]; 1 when a
    gradient is all zero (the norm's derivative is taken as 0 there, so
    the distance's derivative stays finite, not NaN). Invariant to a
    positive rescaling of either gradient only while ``||g|| ||g'||`` is
    large against the absolute ``eps`` (relative error ``eps / (||g||
    ||g'||)``): two gradients of norm ~1e-6 or below lose it and their
    distance drifts towards 1. In float32 the squared norms also underflow
    for entries below ~1e-19 and overflow above ~1e19.
  """
  def tsum(tree):
    return sum(jax.tree_util.tree_leaves(tree), jnp.zeros((), jnp.float32))

  def norm(sq):  # sqrt with a zero derivative at 0 (sqrt's is inf: NaN).
    pos = sq > 0
    return jnp.where(pos, jnp.sqrt(jnp.where(pos, sq, 1.0)), 0.0)

  dot = tsum(jax.tree_util.tree_map(lambda a, b: jnp.sum(a * b), g, g_ref))
  n1 = tsum(jax.tree_util.tree_map(lambda a: jnp.sum(a * a), g))
  n2 = tsum(jax.tree_util.tree_map(lambda a: jnp.sum(a * a), g_ref))
  return 1.0 - dot / (norm(n1) * norm(n2) + eps)


def total_variation(x: jax.Array) -> jax.Array:
  """Anisotropic total variation ``mean |dx| + mean |dy|``.

  Args:
    x: images ``[B, H, W, C]`` or one image ``[H, W, C]`` (NHWC).

  Returns:
    Scalar: the mean absolute difference of horizontal neighbours plus that
    of vertical neighbours (means over all differences, all images).
  """
  if x.ndim == 3:
    x = x[None]
  dx = jnp.abs(x[:, :, 1:, :] - x[:, :, :-1, :])
  dy = jnp.abs(x[:, 1:, :, :] - x[:, :-1, :, :])
  return jnp.mean(dx) + jnp.mean(dy)


def pruned_rows(model: models_lib.Model, shared_grads: Params) -> jax.Array:
  """Boolean ``[F]``: rows of the shared defended kernel that are all zero.

  Args:
    model: the model (gives the defended layer's place in the tree).
    shared_grads: the gradient the server received.

  Returns:
    True for every feature whose weight-gradient row is exactly zero, i.e.
    what Soteria pruned (plus any feature that was exactly 0 anyway).
  """
  kernel = models_lib.defended_params(model, shared_grads)["kernel"]
  return jnp.all(kernel == 0, axis=tuple(range(1, kernel.ndim)))


def view_weights(model: models_lib.Model, shared_grads: Params,
                 view: GradientView) -> Params | None:
  """Elementwise 0/1 weights implementing ``view`` (None for a plain view).

  Jittable; uses only the shared gradient and the model.

  Args:
    model: the model.
    shared_grads: the gradient the server received.
    view: the gradient view.

  Returns:
    A pytree like ``shared_grads`` of float 0/1 arrays, or None.
  """
  if view.is_plain:
    return None
  weights = jax.tree_util.tree_map(jnp.ones_like, shared_grads)
  sub = weights
  for k in model.defended_path[:-1]:
    sub = sub[k]
  last = model.defended_path[-1]
  layer = dict(sub[last])
  if view.mask_from_shared:
    keep = (~pruned_rows(model, shared_grads)).astype(layer["kernel"].dtype)
    layer["kernel"] = layer["kernel"] * keep.reshape(
        (-1,) + (1,) * (layer["kernel"].ndim - 1))
  if view.drop_defended:
    layer["kernel"] = jnp.zeros_like(layer["kernel"])
    if view.drop_bias and "bias" in layer:
      layer["bias"] = jnp.zeros_like(layer["bias"])
  # Rebuild the tree with the new defended layer.
  return _replace_at(weights, model.defended_path, layer)


def _replace_at(tree, path, value):
  if not path:
    return value
  out = dict(tree)
  out[path[0]] = _replace_at(tree[path[0]], path[1:], value)
  return out


def apply_view(grads: Params, weights: Params | None) -> Params:
  """``grads * weights`` leafwise (identity for ``weights is None``)."""
  if weights is None:
    return grads
  return jax.tree_util.tree_map(lambda g, w: g * w, grads, weights)


def gradient_distance(kind: str, g: Params, g_ref: Params,
                      weights: Params | None = None) -> jax.Array:
  """``l2`` or ``cosine`` distance of the viewed gradients.

  Args:
    kind: 'l2' (DLG) or 'cosine' (GS).
    g: trial gradient.
    g_ref: shared gradient.
    weights: from :func:`view_weights` (None: all entries).

  Returns:
    The scalar distance.
  """
  g = apply_view(g, weights)
  g_ref = apply_view(g_ref, weights)
  if kind == "l2":
    return l2_distance(g, g_ref)
  if kind == "cosine":
    return cosine_distance(g, g_ref)
  raise ValueError(f"Unknown distance {kind!r}; valid: 'l2', 'cosine'.")
