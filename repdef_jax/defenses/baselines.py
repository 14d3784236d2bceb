"""Baseline defenses: gradient compression, DP noise, DP-SGD.

References:
  Sun et al., "Provable Defense against Privacy Leakage in Federated Learning
  from Representation Perspective", CVPR 2021, arXiv 2012.06043, Section 6
  (the baselines: gradient compression, DP-Gaussian, DP-Laplace), with the
  reference code's behaviour summarised in ``shared/reference/NOTES.md``
  section 4; Abadi et al., "Deep Learning with Differential Privacy", CCS 2016
  (DP-SGD: per-example clipping plus Gaussian noise, with accounting).

* :func:`compression` zeroes, in every tensor separately, the entries whose
  magnitude is strictly below that tensor's ``percent``-th percentile
  (``np.percentile`` rule, linear interpolation), as the reference code.
* :func:`dp_gaussian` / :func:`dp_laplace` add i.i.d. noise of the given
  scale (Gaussian std / Laplace scale ``b``) to every entry of every tensor,
  with no clipping and no accounting, exactly as the paper's baselines.
  They give no formal (epsilon, delta) guarantee; the name follows the paper.
* :func:`dp_sgd` is what the paper did not run: per-example gradients
  (recomputed from the client batch with
  :func:`repdef_jax.gradients.per_example_grads`), each clipped to global L2
  norm ``clip_norm``, summed, plus ``N(0, (noise_multiplier * clip_norm)^2)``
  per entry, and only then divided by the batch size (dividing before adding
  noise calibrated to the sum would shrink the noise, a pitfall listed by
  jax_privacy). Padded examples (``batch.mask == 0``) are dropped from the
  sum. The default normaliser is the batch's fixed size B (padded rows
  included), as Abadi et al. divide by the lot size: it does not depend on
  the data. ``normalizer='count'`` divides by the number of real examples
  instead (a mean over them; the same when no row is padded): that number
  is data-dependent, so the accountant's epsilon does not cover it. It
  *replaces* the incoming gradient (it must see per-example gradients), so
  in a :func:`~repdef_jax.defenses.base.chain` put it first.
  :func:`dp_sgd_epsilon` computes (epsilon, delta) on the host with
  ``dp_accounting`` (RDP accountant, Poisson-subsampled Gaussian). Departure
  from that accounting: FedAvg's local minibatches are shuffled batches of
  fixed size, not Poisson samples; the epsilon is the usual approximation
  for them (as in common DP-SGD libraries), not a proof.

All defenses validate their arguments at construction time (host side) and
are pure, jittable functions of ``(grads, batch, key)``.
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from repdef_jax import gradients as gradients_lib
from repdef_jax import models as models_lib
from repdef_jax.defenses import base
from repdef_jax.defenses import soteria as soteria_lib

Params = Any


def _as_float(value: Any) -> float:
  """``float(value)``, or NaN (which every range check refuses)."""
  try:
    return float(value)
  except (TypeError, ValueError):
    return math.nan


def check_scale(scale: Any, name: str = "scale") -> float:
  try:
    value = float(scale)
  except (TypeError, ValueError):
    raise ValueError(f"{name} must be a finite number >= 0, got "
                     f"{scale!r}.") from None
  if not (value >= 0.0 and math.isfinite(value)):
    raise ValueError(f"{name} must be a finite number >= 0, got {scale!r}.")
  return value


def _keys_like(key: jax.Array, tree: Params) -> Params:
  leaves, treedef = jax.tree_util.tree_flatten(tree)
  keys = [jax.random.fold_in(key, i) for i in range(len(leaves))]
  return jax.tree_util.tree_unflatten(treedef, keys)


def compress_tensor(g: jax.Array, percent: Any) -> jax.Array:
  """Zeroes the entries of ``g`` with ``|g|`` strictly below its percentile."""
  a = jnp.abs(g)
  threshold = jnp.percentile(a.reshape(-1), percent, method="linear")
  return jnp.where(a >= threshold, g, jnp.zeros_like(g))


def compression(percent: Any) -> base.Defense:
  """Gradient compression (magnitude pruning per tensor), reference rule.

  Args:
    percent: in [0, 100]; entries of each tensor whose magnitude is strictly
      below ``np.percentile(|g|, percent)`` are set to 0 (ties kept).

  Returns:
    A deterministic Defense named 'compression'; info reports the fraction of
    zero entries after compression (``zero_fraction``).
  """
  soteria_lib.check_percent(percent)

  def apply(grads, batch, key):
    del batch, key
    out = jax.tree_util.tree_map(lambda g: compress_tensor(g, percent), grads)
    leaves = jax.tree_util.tree_leaves(out)
    zeros = sum(jnp.sum(g == 0) for g in leaves)
    total = sum(g.size for g in leaves)
    return out, {"zero_fraction": zeros / total}

  return base.Defense("compression", apply)


def _noise_defense(name: str, scale: float, sampler) -> base.Defense:

  def apply(grads, batch, key):
    del batch
    keys = _keys_like(key, grads)
    out = jax.tree_util.tree_map(
        lambda g, k: g + scale * sampler(k, g.shape, g.dtype), grads, keys)
    return out, {"noise_scale": jnp.asarray(scale, jnp.float32)}

  return base.Defense(name, apply)


def dp_gaussian(scale: Any) -> base.Defense:
  """Adds ``N(0, scale^2)`` to every entry of every tensor (no clipping).

  Args:
    scale: noise standard deviation, >= 0 (the paper used 1e-4 to 1e-1).
  """
  return _noise_defense("dp_gaussian", check_scale(scale),
                        jax.random.normal)


def dp_laplace(scale: Any) -> base.Defense:
  """Adds ``Laplace(0, scale)`` to every entry (std = sqrt(2) * scale).

  Args:
    scale: Laplace scale ``b``, >= 0.
  """
  return _noise_defense("dp_laplace", check_scale(scale), jax.random.laplace)


def clip_by_global_norm(tree: Params, clip_norm: float) -> tuple[Params,
                                                                 jax.Array]:
  """Scales ``tree`` to global L2 norm at most ``clip_norm``.

  Returns:
    ``(clipped tree, norm before clipping)``.
  """
  leaves = jax.tree_util.tree_leaves(tree)
  norm = jnp.sqrt(sum(jnp.sum(jnp.square(g)) for g in leaves))
  factor = jnp.minimum(1.0, clip_norm / jnp.maximum(norm, 1e-30))
  return jax.tree_util.tree_map(lambda g: g * factor, tree), norm


DP_SGD_NORMALIZERS = ("batch", "count")


def dp_sgd(model: models_lib.Model, clip_norm: Any,
           noise_multiplier: Any, normalizer: str = "batch") -> base.Defense:
  """DP-SGD's private gradient (Abadi et al. 2016) for one client batch.

  Ignores the incoming ``grads``; recomputes per-example gradients of the
  batch at ``batch.params``, clips each to ``clip_norm``, sums the real
  examples', adds ``N(0, (noise_multiplier * clip_norm)^2)`` per entry and
  divides by the batch size (after the noise).

  Args:
    model: the model whose loss is differentiated.
    clip_norm: per-example global L2 clipping norm, > 0.
    noise_multiplier: noise std over ``clip_norm``, >= 0.
    normalizer: 'batch' (the batch's size B, padded rows included:
      data-independent, what the accountant assumes) or 'count' (the number
      of real examples).

  Returns:
    A Defense named 'dp_sgd'; info: ``clipped_fraction`` (share of real
    examples whose norm exceeded ``clip_norm``) and ``mean_grad_norm``
    (mean per-example global L2 norm of the real examples, before clipping).
  """
  models_lib.check_model(model)
  clip = check_scale(clip_norm, "clip_norm")
  if clip <= 0:
    raise ValueError(f"clip_norm must be a finite number > 0, got "
                     f"{clip_norm!r}.")
  sigma = check_scale(noise_multiplier, "noise_multiplier")
  if normalizer not in DP_SGD_NORMALIZERS:
    raise ValueError(f"normalizer must be one of {DP_SGD_NORMALIZERS}, got "
                     f"{normalizer!r}.")

  def apply(grads, batch: base.ClientBatch, key):
    del grads
    base.check_batch(batch)
    b = batch.x.shape[0]
    weights = (jnp.ones((b,), jnp.float32) if batch.mask is None else
               batch.mask.astype(jnp.float32))
    x, y = ((batch.x, batch.y) if batch.mask is None else
            gradients_lib.drop_padding(batch.x, batch.y, batch.mask))
    _, per_ex = gradients_lib.per_example_grads(model, batch.params, x, y)
    clipped, norms = jax.vmap(lambda g: clip_by_global_norm(g, clip))(per_ex)
    count = jnp.maximum(jnp.sum(weights), 1.0)
    denom = float(b) if normalizer == "batch" else count
    keys = _keys_like(key, batch.params)

    def noisy_mean(g, k):
      total = jnp.tensordot(weights.astype(g.dtype), g, axes=1)
      noise = sigma * clip * jax.random.normal(k, total.shape, total.dtype)
      return (total + noise) / denom

    out = jax.tree_util.tree_map(noisy_mean, clipped, keys)
    info = {
        "clipped_fraction": jnp.sum(weights * (norms > clip)) / count,
        "mean_grad_norm": jnp.sum(weights * norms) / count,
    }
    return out, info

  return base.Defense("dp_sgd", apply, recomputes=True)


def dp_sgd_epsilon(noise_multiplier: float, sample_rate: float, steps: int,
                   delta: float) -> float:
  """Epsilon of DP-SGD with Poisson sampling, by the RDP accountant.

  Host-side (NumPy / Python), via ``dp_accounting.rdp.RdpAccountant`` on
  ``steps`` compositions of ``PoissonSampledDpEvent(sample_rate,
  GaussianDpEvent(noise_multiplier))``.

  Args:
    noise_multiplier: noise std over the clipping norm, > 0 (0 gives inf).
    sample_rate: probability that an example is in a batch, in (0, 1].
    steps: number of noisy steps, >= 0.
    delta: target delta, in (0, 1).

  Returns:
    epsilon (``inf`` when ``noise_multiplier == 0`` and steps > 0).
  """
  import dp_accounting  # pylint: disable=g-import-not-at-top

  sigma = check_scale(noise_multiplier, "noise_multiplier")
  if not 0.0 < _as_float(sample_rate) <= 1.0:
    raise ValueError(f"sample_rate must be in (0, 1], got {sample_rate!r}.")
  if (isinstance(steps, bool) or
      not isinstance(steps, (int, float, np.integer, np.floating)) or
      not math.isfinite(steps) or int(steps) != steps or steps < 0):
    raise ValueError(f"steps must be an integer >= 0, got {steps!r}.")
  if not 0.0 < _as_float(delta) < 1.0:
    raise ValueError(f"delta must be in (0, 1), got {delta!r}.")
  if steps == 0:
    return 0.0
  if sigma == 0.0:
    return math.inf
  event = dp_accounting.SelfComposedDpEvent(
      dp_accounting.PoissonSampledDpEvent(
          float(sample_rate), dp_accounting.GaussianDpEvent(sigma)),
      int(steps))
  accountant = dp_accounting.rdp.RdpAccountant()
  accountant.compose(event)
  return float(accountant.get_epsilon(float(delta)))
