"""Certified robustness of the Soteria defense (Theorem 1), computed.

References:
  Sun et al., "Provable Defense against Privacy Leakage in Federated Learning
  from Representation Perspective", CVPR 2021, arXiv 2012.06043, Section 4,
  Theorem 1 (certified robustness) and Assumption 1 (local invertibility of
  the feature extractor). Nothing public computes the bound (NOTES.md,
  section 1); this module does.

Derivation (p = q = 2 in the distance, q = 0 in the perturbation):
  Let ``f`` map an image ``X`` to its representation ``r = f(X)`` and let the
  defense share ``r' = r + delta_r`` instead (for q = 0 with pruned set S:
  ``r'_i = 0`` for i in S, so ``||r - r'||_2 = ||r_S||_2``). Under Assumption 1
  an attacker that recovers ``r'`` exactly reconstructs ``X' = f^{-1}(r')``.
  Linearise at X: ``r' - r = f(X') - f(X) ~= J (X' - X)`` with
  ``J = df/dX (X)`` [F, D]. Sub-multiplicativity of the spectral norm gives
  ``||r - r'||_2 = ||J (X - X')||_2 <= ||J||_2 ||X - X'||_2``, hence

      ||X - X'||_2  >=  ||r - r'||_2 / ||J||_2  =  ||r_S||_2 / sigma_max(J).

  This is the paper's ``||C^{-1} D|| >= ||D|| / ||C||`` with ``C = J``.

Assumptions and caveats (stated, not hidden):
  * Assumption 1 (f locally invertible on {r, r'}) and that the attacker's
    ``X'`` satisfies ``f(X') = r'``.
  * The bound is first order: it is exact for a linear (or, within one
    linear region, piecewise-linear) feature map and an approximation
    otherwise; a curved ``f`` can violate it by a second-order term.
  * ``sigma_max(J)`` is computed exactly from the SVD of the full Jacobian
    (cheap for logistic regression, the leakage CNN and LeNet; for ConvNet64
    pass ``chunk``: its ``B x 2,304`` backward passes at once would hold
    ~170 GiB; in forward mode, where D < F, it bounds the pushforwards);
    :func:`spectral_norm_power` offers a matrix-free alternative for large
    ``D``.

For a reconstruction that an attack actually found, whatever its
representation, the same argument gives the checkable first-order statement
``||X - X'|| >= ||f(X) - f(X')|| / ||J||`` (:func:`empirical_bound`), and
:func:`representation_distance` returns ``||f(X) - f(X')||``.
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp

from repdef_jax import models as models_lib
from repdef_jax.defenses import soteria as soteria_lib

Params = Any


def jacobian_spectral_norms(features_fn: Callable[[jax.Array], jax.Array],
                            x: jax.Array, chunk: int | None = None
                            ) -> tuple[jax.Array, jax.Array]:
  """Per-example ``r [B, F]`` and ``||dr/dX||_2`` ``[B]`` (top singular
  value); ``chunk``: Jacobian rows, or in forward mode (picked where the
  input is smaller than the representation) input pixels, at a time
  (memory; same numbers)."""
  r, jac = soteria_lib.features_and_jacobian(features_fn, x, chunk=chunk)
  sigma = jax.vmap(lambda j: jnp.linalg.svd(j, compute_uv=False)[0])(jac)
  return r, sigma


def spectral_norm_power(features_fn: Callable[[jax.Array], jax.Array],
                        xi: jax.Array, key: jax.Array,
                        iters: int = 50) -> jax.Array:
  """Matrix-free ``||J||_2`` of one image by power iteration on ``J^T J``.

  A lower estimate that converges to ``sigma_max`` from below; a bound using
  it is therefore slightly *larger* (less conservative) than the SVD one.
  """
  _, jvp_fn = jax.linearize(features_fn, xi)
  vjp_fn = jax.linear_transpose(jvp_fn, xi)
  v = jax.random.normal(key, xi.shape, xi.dtype)
  v = v / jnp.linalg.norm(v)

  def body(_, v):
    (w,) = vjp_fn(jvp_fn(v))
    return w / jnp.maximum(jnp.linalg.norm(w), 1e-30)

  v = jax.lax.fori_loop(0, iters, body, v)
  return jnp.linalg.norm(jvp_fn(v))


def _check_sigma(sigma: jax.Array, batch: int) -> None:
  if jnp.shape(sigma) != (batch,):
    raise ValueError(f"sigma must have shape [B] = ({batch},), got "
                     f"{jnp.shape(sigma)}.")


def _bound(dist: jax.Array, sigma: jax.Array) -> jax.Array:
  """``dist / sigma``, 0 where ``sigma`` is 0."""
  return jnp.where(sigma > 0, dist / jnp.where(sigma > 0, sigma, 1.0), 0.0)


def certified_bound_fn(features_fn: Callable[[jax.Array], jax.Array],
                       x: jax.Array, keep_mask: jax.Array,
                       chunk: int | None = None,
                       sigma: jax.Array | None = None) -> jax.Array:
  """Theorem 1 bound for a feature map ``features_fn`` (one image -> [F]).

  Args:
    features_fn: one image -> representation ``[F]``.
    x: images ``[B, ...]``.
    keep_mask: ``[F]`` (one mask for the batch) or ``[B, F]`` keep-mask;
      ``r' = r * keep_mask``.
    chunk: Jacobian rows or pixels at a time (:func:`jacobian_spectral_norms`).
    sigma: ``[B]`` spectral norms of these images' Jacobians, as
      :func:`jacobian_spectral_norms` gives them; pass them to bound the
      same images under several masks without a Jacobian and SVD each time.

  Returns:
    ``||r - r'||_2 / ||J||_2`` per image, ``[B]`` (0 where ``J`` is 0).

  Raises:
    ValueError: ``keep_mask`` is neither ``[F]`` nor ``[B, F]``, or
      ``sigma`` is not ``[B]``.
  """
  f = tuple(jax.eval_shape(features_fn, x[0]).shape)
  if jnp.shape(keep_mask) not in (f, (x.shape[0],) + f):
    raise ValueError(f"keep_mask must have shape [F] = {f} or [B, F] = "
                     f"{(x.shape[0],) + f}, got {jnp.shape(keep_mask)}.")
  if sigma is None:
    r, sigma = jacobian_spectral_norms(features_fn, x, chunk)
  else:
    _check_sigma(sigma, x.shape[0])
    r = jax.vmap(features_fn)(x)
  delta = r * (1 - jnp.broadcast_to(keep_mask, r.shape).astype(r.dtype))
  return _bound(jnp.linalg.norm(delta, axis=-1), sigma)


def certified_bound(model: models_lib.Model, params: Params, x: jax.Array,
                    keep_mask: jax.Array, chunk: int | None = None,
                    sigma: jax.Array | None = None) -> jax.Array:
  """Certified lower bound on ``||X - X'||_2`` per image (Theorem 1).

  Args:
    model: the model (its representation is the input of the defended
      layer).
    params: its parameters.
    x: images ``[B, H, W, C]``.
    keep_mask: the Soteria keep-mask ``[F]`` (or ``[B, F]``).
    chunk: Jacobian rows or pixels at a time (:func:`jacobian_spectral_norms`).
    sigma: precomputed spectral norms (see :func:`certified_bound_fn`).

  Returns:
    ``[B]`` bounds, first order under Assumption 1 (see module docstring).
  """
  model.check_input(x)
  return certified_bound_fn(model.feature_fn(params), x, keep_mask, chunk,
                            sigma)


def _check_pair(x: jax.Array, x_rec: jax.Array) -> None:
  """ValueError unless ``x_rec`` has ``x``'s shape (no broadcasting)."""
  if jnp.shape(x) != jnp.shape(x_rec):
    raise ValueError(f"x_rec {tuple(jnp.shape(x_rec))} and x "
                     f"{tuple(jnp.shape(x))} differ in shape; one "
                     "reconstruction per image.")


def representation_distance(model: models_lib.Model, params: Params,
                            x: jax.Array, x_rec: jax.Array) -> jax.Array:
  """``||f(X) - f(X')||_2`` per image, ``[B]``."""
  _check_pair(x, x_rec)
  return jnp.linalg.norm(model.features(params, x) -
                         model.features(params, x_rec), axis=-1)


def input_distance(x: jax.Array, x_rec: jax.Array) -> jax.Array:
  """``||X - X'||_2`` per image, ``[B]``."""
  _check_pair(x, x_rec)
  return jnp.linalg.norm((x - x_rec).reshape(x.shape[0], -1), axis=-1)


def empirical_bound(model: models_lib.Model, params: Params, x: jax.Array,
                    x_rec: jax.Array, chunk: int | None = None,
                    sigma: jax.Array | None = None) -> jax.Array:
  """First-order lower bound on ``||X - X'||`` implied by ``f(X')``.

  ``||f(X) - f(X')|| / ||J(X)||_2`` per image; for a reconstruction with
  ``f(X') = r'`` it equals :func:`certified_bound` (``chunk``, ``sigma``:
  as there).
  """
  _check_pair(x, x_rec)
  if sigma is None:
    _, sigma = jacobian_spectral_norms(model.feature_fn(params), x, chunk)
  _check_sigma(sigma, x.shape[0])
  return _bound(representation_distance(model, params, x, x_rec), sigma)
