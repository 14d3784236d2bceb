"""Soteria: the representation-perturbation defense (q = 0 closed form).

References:
  Sun, Li, Wang, Yang, Li, Chen. "Provable Defense against Privacy Leakage in
  Federated Learning from Representation Perspective" (Soteria), CVPR 2021,
  arXiv 2012.06043, Section 4; and its public PyTorch reference code (as
  summarised in ``shared/reference/NOTES.md`` section 1).

The defended layer is the model's last fully connected layer ``head``; its
input is the representation ``r`` [F]. Pruning feature i zeroes row i of the
flax kernel gradient (column i of the paper's ``dL/dW``). Scores come from
the per-example Jacobian ``dr/dx`` (:func:`representation_jacobian_norms`,
model-aware, never forming ``[B, F, D]``; :func:`feature_scores` for any
feature function), a mask from :func:`mask_from_scores`, and a registered
perturbation (:data:`PERTURBATIONS`, q = 0 is ``'q0'``) scales the rows.
The pipeline, the scores' orientation, the diagnostics in ``info`` and how to
add a perturbation norm: ``docs/design.md`` ("Soteria").

Departures from the paper / reference code (all opt-in except the first):

* One mask per client batch from scores summed over the batch (the reference
  handles one image); padded examples contribute nothing.
* ``selection='count'`` (prunes exactly the nominal number, inactive
  features last) and ``score='exact'`` (the paper's pseudo-inverse score
  instead of the reference's approximation) fix the reference's known
  weaknesses; ``selection='percentile'`` with ``score='reference'`` (the
  defaults) reproduce the reference exactly wherever its scores are >= 0
  (every sigmoid / ReLU representation): the reference prunes
  ``abs(score) < percentile(score)``, we prune ``score < percentile``, so
  that the 'exact' scores, <= 0 by design, keep their orientation.
* ``protect_bias=True`` also zeroes the defended layer's bias gradient,
  whose ratio to a kernel row reveals a single image's ``r`` exactly.
"""

from __future__ import annotations

import fractions
import math
import numbers
from typing import Any, Callable, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from repdef_jax import host
from repdef_jax import models as models_lib
from repdef_jax.defenses import base

Params = Any

SCORES = ("reference", "exact")
SELECTIONS = ("percentile", "count")
JACOBIAN_MODES = ("auto", "rev", "fwd")


# --------------------------------------------------------------------------
# Validation helpers (host side).


def check_percent(percent: Any, name: str = "percent") -> None:
  """Raises a ValueError unless ``percent`` is a number in [0, 100].

  Traced values are accepted unchecked (validation is host-side only).

  Args:
    percent: the value.
    name: how the message names it.
  """
  if isinstance(percent, jax.core.Tracer):
    return
  if isinstance(percent, (str, bytes, bool, np.bool_)):
    raise ValueError(f"{name} must be a number in [0, 100], got "
                     f"{percent!r}.")
  try:
    value = float(percent)
  except (TypeError, ValueError):
    raise ValueError(f"{name} must be a number in [0, 100], got "
                     f"{percent!r}.") from None
  if not 0.0 <= value <= 100.0 or math.isnan(value):
    raise ValueError(f"{name} must be a number in [0, 100], got {percent!r}.")


def check_strength(strength: Any, qname: str) -> None:
  """Raises a ValueError unless ``strength`` is a finite real number (a
  traced value passes); q0 also needs it in [0, 100].

  Args:
    strength: the perturbation's strength, in its own units.
    qname: a registered perturbation's name (:data:`PERTURBATIONS`).
  """
  if qname == "q0":
    check_percent(strength)
    return
  if isinstance(strength, jax.core.Tracer):
    return
  try:
    ok = (not isinstance(strength, (str, bytes, bool, np.bool_))
          and np.ndim(strength) == 0 and math.isfinite(float(strength)))
  except (TypeError, ValueError):
    ok = False
  if not ok:
    raise ValueError(f"percent (the strength of perturbation {qname!r}) must "
                     f"be a finite real number, got {strength!r}.")


def _check_perturbation(perturb: Perturbation, qname: str, strength: Any,
                        num_features: int, selection: str) -> None:
  """Raises a ValueError naming the perturbation unless it returns ``(row
  scale [F], dict of scalars)`` (checked on abstract inputs, host side)."""
  vec = jax.ShapeDtypeStruct((num_features,), jnp.float32)
  per_example = jax.ShapeDtypeStruct((1, num_features), jnp.float32)
  out = jax.eval_shape(
      lambda s, r, n, w, a: perturb(
          PerturbationInputs(s, r, n, w, a, selection), strength),
      vec, per_example, per_example, jax.ShapeDtypeStruct((1,), jnp.float32),
      jax.ShapeDtypeStruct((num_features,), jnp.bool_))
  want = (f"perturbation {qname!r} must return (row_scale, info): an array "
          f"of shape ({num_features},) and a dict of scalars")
  if not (isinstance(out, tuple) and len(out) == 2):
    got = (f"one array of shape {out.shape}" if hasattr(out, "shape")
           else type(out).__name__)
    raise ValueError(f"{want}; it returned {got}.")
  scale, info = out
  if not hasattr(scale, "shape") or tuple(scale.shape) != (num_features,):
    raise ValueError(f"{want}; its row_scale is "
                     f"{getattr(scale, 'shape', type(scale).__name__)}.")
  base.check_info(info, want)


def _check_chunk(chunk: Any, name: str = "chunk") -> None:
  """Raises a ValueError unless ``chunk`` is None or an integer >= 1 (NumPy
  integers included, bools not)."""
  if chunk is not None and (not isinstance(chunk, numbers.Integral) or
                            isinstance(chunk, (bool, np.bool_)) or chunk < 1):
    raise ValueError(f"{name} must be a positive int or None, got "
                     f"{chunk!r}.")


def _check_choice(value: str, choices: Sequence[str], name: str) -> None:
  if value not in choices:
    raise ValueError(f"{name} must be one of {tuple(choices)}, got {value!r}.")


# --------------------------------------------------------------------------
# Jacobian and scores.


def resolve_jacobian(jacobian: str, num_features: int, input_size: int) -> str:
  """'auto' -> the mode with fewer passes ('fwd' iff D < F); else unchanged."""
  _check_choice(jacobian, JACOBIAN_MODES, "jacobian")
  if jacobian != "auto":
    return jacobian
  return "fwd" if input_size < num_features else "rev"


def features_and_jacobian(features_fn: Callable[[jax.Array], jax.Array],
                          x: jax.Array,
                          *,
                          jacobian: str = "auto",
                          chunk: int | None = None
                          ) -> tuple[jax.Array, jax.Array]:
  """Per-example representation and Jacobian, no loop over features.

  Args:
    features_fn: one input ``[H, W, C]`` (any shape) -> ``r`` ``[F]``.
    x: a batch ``[B, ...]`` of inputs.
    jacobian: 'rev' (vmap of one vjp over the identity basis of R^F, i.e.
      ``jax.jacrev``: F backward passes batched), 'fwd' (D forward-mode
      passes batched, ``jax.jacfwd``) or 'auto' (the one with fewer passes:
      'fwd' when D < F, e.g. a single wide conv layer, else 'rev').
    chunk: bound memory by computing ``chunk`` rows ('rev') or columns
      ('fwd') of each Jacobian at a time (``lax.map`` over chunks of the
      basis and over images) instead of all ``B * F`` backward or ``B * D``
      forward passes at once; same numbers.
      ConvNet64 needs it (all 8 x 2,304 passes at once hold ~170 GiB of
      activations' cotangents); None computes everything in one batch.

  Returns:
    ``(r [B, F], J [B, F, D])`` with D the size of one input.

  Raises:
    ValueError: ``features_fn`` does not return a 1-D array, bad ``jacobian``.
  """
  _check_choice(jacobian, JACOBIAN_MODES, "jacobian")
  out = jax.eval_shape(features_fn, jax.ShapeDtypeStruct(x.shape[1:], x.dtype))
  if len(out.shape) != 1:
    raise ValueError("features_fn must map one input to a 1-D representation "
                     f"r of shape [F]; it returned shape {tuple(out.shape)}.")
  num_features, d = out.shape[0], math.prod(x.shape[1:])
  jacobian = resolve_jacobian(jacobian, num_features, d)

  _check_chunk(chunk)
  passes = num_features if jacobian == "rev" else d
  chunked = chunk is not None and int(chunk) < passes
  c = int(chunk) if chunked else passes
  n = -(-passes // c)

  def one(xi):
    # One vjp (rows) or jvp (columns) per basis vector, ``c`` at a time.
    if jacobian == "rev":
      r, lin = jax.vjp(features_fn, xi)
      lin_one = lambda e: lin(e)[0]
      basis = jnp.eye(n * c, num_features, dtype=r.dtype)
    else:
      r, lin_one = jax.linearize(features_fn, xi)
      basis = jnp.eye(n * c, d, dtype=xi.dtype).reshape(n * c, *xi.shape)
    if chunked:
      out = jax.lax.map(jax.vmap(lin_one),
                        basis.reshape(n, c, *basis.shape[1:]))
      out = out.reshape(n * c, -1)[:passes]
    else:
      out = jax.vmap(lin_one)(basis).reshape(passes, -1)
    # Rows are [F, D] already; columns [D, F] are transposed.
    return r, out if jacobian == "rev" else out.T

  return jax.lax.map(one, x) if chunked else jax.vmap(one)(x)


# Soteria's score needs, for every example b and feature i, the row
# dr_bi/dx_b of the representation Jacobian. With the model split
# r = top_post(top_pre(bottom(x))) (see repdef_jax.models), the rows for a
# chunk of features are pulled back through ``bottom`` by one batched vjp;
# when top_post is elementwise, dr_i/dh = top_post'(z_i) * (row i of
# top_pre's constant Jacobian), so no backward pass runs through the top
# layer. Chunks (lax.map) keep the working set small, and ``norms`` reduces
# each chunk at once: the [B, F, D] Jacobian is never formed. Where D < F
# (and bottom is not the identity), chunks of one-hot input pixels are pushed
# forward instead (:func:`_pushforward_chunks`), the same chunk sizes in
# examples x pixels.

# Examples x features pulled back at once when ``chunk`` is None: measured on
# a 2-core CPU (LeNet, MNIST and CIFAR-10 shapes, batch 1 / 10 / 50): flat
# from 160 to 1,536 on MNIST, 1.3x faster at 512 than 1,536 on CIFAR-10.
_PAIRS_PER_CHUNK = 512


def auto_chunk(batch: int, num_features: int) -> int:
  """Features per chunk: about _PAIRS_PER_CHUNK pairs, chunks of equal size."""
  c = max(1, min(num_features, _PAIRS_PER_CHUNK // max(batch, 1)))
  n = math.ceil(num_features / c)  # Chunks needed at that size...
  return math.ceil(num_features / n)  # ...and the smallest equal size.


def model_jacobian_mode(model: models_lib.Model, jacobian: str = "auto"
                        ) -> str:
  """The mode the model-aware Jacobian runs: 'rev' or 'fwd'.

  'auto' is 'fwd' iff one input is smaller than the representation (D < F)
  and the model has layers below the defended one's input (with none, the
  pullbacks stop at the top layer and cost almost nothing).

  Raises:
    ValueError: ``jacobian`` is not one of :data:`JACOBIAN_MODES`.
  """
  _check_choice(jacobian, JACOBIAN_MODES, "jacobian")
  if jacobian == "auto" and model.identity_bottom:
    return "rev"
  return resolve_jacobian(jacobian, model.num_features,
                          math.prod(model.input_shape))


def jacobian_passes(model: models_lib.Model, jacobian: str = "auto") -> int:
  """Passes per example of the model-aware Jacobian: F pullbacks or, in
  forward mode, D pushforwards (cost models and benchmarks price them)."""
  if model_jacobian_mode(model, jacobian) == "fwd":
    return math.prod(model.input_shape)
  return model.num_features


def jacobian_model(model: models_lib.Model, jacobian: str = "auto"
                   ) -> models_lib.Model:
  """``model`` with the convolutions the model-aware Jacobian runs: a
  formulation the user chose stays; 'auto' becomes 'jacobian' in reverse
  mode (fast pullbacks) and 'xla' in forward mode, whose JVP is a canonical
  convolution ('s2d''s JVP takes the kernel as HWOI, so that its transpose,
  the pullback, is canonical; XLA's CPU backend runs that HWOI convolution
  ~4.5x slower in a loop body, ``docs/design.md``)."""
  fwd = model_jacobian_mode(model, jacobian) == "fwd"
  return model.with_default_conv_impl("xla" if fwd else "jacobian")


def _one_hot_chunk(start: jax.Array, size: int, total: int) -> jax.Array:
  """Boolean ``[size, total]``: one-hot rows for indices start .. start +
  size - 1 (rows past ``total`` all False: a padded last chunk)."""
  return (start + jnp.arange(size))[:, None] == jnp.arange(total)[None, :]


def _jacobian_chunks(model: models_lib.Model, params: Params, x: jax.Array,
                     chunk: int | None, reduce: bool, jacobian: str
                     ) -> tuple[jax.Array, jax.Array]:
  """``(r [B, F], out)``: out is ``[B, F]`` row norms or ``[B, F, D]`` rows."""
  model.check_input(x)
  _check_chunk(chunk)
  mode = model_jacobian_mode(model, jacobian)
  model = jacobian_model(model, mode)
  if mode == "fwd":
    return _pushforward_chunks(model, params, x, chunk, reduce)
  h = model.bottom(params, x)
  z = model.top_pre(params, h)
  post = lambda zz: model.top_post(params, zz)
  r = post(z)
  b, f = r.shape
  c = auto_chunk(b, f) if chunk is None else int(chunk)
  c = min(c, f)
  n = -(-f // c)
  starts = jnp.arange(n) * c

  if model.elementwise_top:
    # top_post'(z), the diagonal of an elementwise map's Jacobian, flattened.
    dact = jax.jvp(post, (z,), (jnp.ones_like(z),))[1]
    if model.identity_bottom and reduce:
      # ||dr_i/dx|| = |top_post'(z_i)| * ||row i of top_pre's Jacobian||.
      return r, jnp.abs(dact) * _linear_row_norms(model, params, h)[None, :]
    dact_chunks = jnp.pad(dact, ((0, 0), (0, n * c - f))).reshape(
        b, n, c).transpose(1, 0, 2)
    h0 = jnp.zeros(h.shape[1:], h.dtype)
    _, lin_vjp = jax.vjp(
        lambda hh: model.top_pre(params, hh[None])[0].reshape(-1), h0)

    def top_rows(start, dact_c):  # [B, c, *h]
      rows = jax.vmap(lin_vjp)(_one_hot_chunk(start, c, f).astype(h.dtype))[0]
      return dact_c.reshape(b, c, *([1] * (h.ndim - 1))) * rows[None]
  else:
    _, top_vjp = jax.vjp(lambda hh: post(model.top_pre(params, hh)), h)
    dact_chunks = jnp.zeros((n,), r.dtype)  # Unused.

    def top_rows(start, dact_c):
      del dact_c
      e = _one_hot_chunk(start, c, f).astype(r.dtype)
      rows = jax.vmap(lambda ei: top_vjp(jnp.broadcast_to(ei, r.shape))[0])(e)
      return jnp.moveaxis(rows, 0, 1)

  if model.identity_bottom:
    pull = lambda t: t
  else:
    _, bottom_vjp = jax.vjp(lambda xx: model.bottom(params, xx), x)
    pull = jax.vmap(lambda t: bottom_vjp(t)[0], in_axes=1, out_axes=1)

  def one(args):
    start, dact_c = args
    rows = pull(top_rows(start, dact_c)).reshape(b, c, -1)
    return jnp.sqrt(jnp.sum(jnp.square(rows), -1)) if reduce else rows

  out = host.sequential_map(one, (starts, dact_chunks))  # [n, B, c, ...]
  out = jnp.moveaxis(out, 0, 1).reshape(b, n * c, *out.shape[3:])
  return r, out[:, :f]


def _pushforward_chunks(model: models_lib.Model, params: Params,
                        x: jax.Array, chunk: int | None, reduce: bool
                        ) -> tuple[jax.Array, jax.Array]:
  """:func:`_jacobian_chunks` in forward mode: D pushforwards per example.

  One-hot input directions, the same pixel in every example of the batch,
  go through the linearized model a chunk at a time; each gives column d of
  every example's Jacobian, and the row norms are sums of squares over the
  columns. Cheaper than the pullbacks where D < F (ConvNet64 on MNIST).
  """
  b, shape = x.shape[0], x.shape[1:]
  d = math.prod(shape)
  r, push = jax.linearize(lambda xx: model.features(params, xx), x)
  c = min(auto_chunk(b, d) if chunk is None else int(chunk), d)
  n = -(-d // c)

  def one(start):  # Columns start .. start + c - 1 of every Jacobian.
    e = _one_hot_chunk(start, c, d)
    t = jnp.broadcast_to(e.astype(x.dtype).reshape(c, 1, *shape),
                         (c, *x.shape))
    cols = jax.vmap(push)(t)  # [c, B, F]
    return jnp.sum(jnp.square(cols), 0) if reduce else cols

  out = host.sequential_map(one, jnp.arange(n) * c)
  if reduce:
    return r, jnp.sqrt(jnp.sum(out, 0))
  # [n, c, B, F] -> [B, F, D] (the padded columns of the last chunk dropped).
  jac = jnp.moveaxis(out.reshape(n * c, b, -1)[:d], 0, -1)
  return r, jac


def _linear_row_norms(model: models_lib.Model, params: Params,
                      h: jax.Array) -> jax.Array:
  """``[F]`` row norms of the Jacobian of ``top_pre`` (an affine layer).

  Every entry of a convolution's or dense layer's matrix is one kernel entry
  (or zero), so the squared row norms are the layer with squared kernels and
  zero biases applied to an all-ones input: one forward pass instead of F
  pullbacks. Parameters other than kernels and biases would break this: then
  the norms come from the layer's Jacobian.
  """
  leaves = jax.tree_util.tree_leaves_with_path(params)
  names = {getattr(path[-1], "key", None) for path, _ in leaves}
  if names <= {"kernel", "bias"}:
    squared = jax.tree_util.tree_map_with_path(
        lambda path, t: (jnp.square(t) if path[-1].key == "kernel"
                         else jnp.zeros_like(t)), params)
    ones = jnp.ones((1, *h.shape[1:]), h.dtype)
    return jnp.sqrt(model.top_pre(squared, ones)[0].reshape(-1))
  jac = jax.jacrev(lambda hh: model.top_pre(params, hh[None])[0].reshape(-1))(
      jnp.zeros(h.shape[1:], h.dtype))
  return jnp.linalg.norm(jac.reshape(jac.shape[0], -1), axis=-1)


def representation_jacobian_norms(model: models_lib.Model, params: Params,
                                  x: jax.Array, *,
                                  chunk: int | None = None,
                                  jacobian: str = "auto"
                                  ) -> tuple[jax.Array, jax.Array]:
  """``r`` and ``||dr_bi/dx_b||_2`` for every example and feature.

  Same numbers as the row norms of :func:`features_and_jacobian` (up to
  float rounding), without forming the ``[B, F, D]`` Jacobian (see the
  comment above; ``docs/benchmarks`` has the timings).

  Args:
    model: the model (its conv formulation is used as is, except that
      'auto' becomes the one :func:`jacobian_model` picks for the mode).
    params: its parameters.
    x: images ``[B, H, W, C]``.
    chunk: features pulled back ('rev') or input pixels pushed forward
      ('fwd') at a time (None: about 512 examples x rows or columns per
      chunk).
    jacobian: 'rev' (B x F pullbacks), 'fwd' (B x D pushforwards) or 'auto'
      (the one with fewer passes: 'fwd' iff D < F and the model has layers
      below the defended one's input, e.g. ConvNet64 on MNIST).

  Returns:
    ``(r [B, F], norms [B, F])``.

  Raises:
    ValueError: bad ``chunk`` or ``jacobian``, or ``x`` not the model's
      input shape.
  """
  return _jacobian_chunks(model, params, x, chunk, reduce=True,
                          jacobian=jacobian)


def representation_jacobian(model: models_lib.Model, params: Params,
                            x: jax.Array, *, chunk: int | None = None,
                            jacobian: str = "auto"
                            ) -> tuple[jax.Array, jax.Array]:
  """``(r [B, F], J [B, F, D])``, the model-aware :func:`features_and_jacobian`.

  Args, formulation, errors: as :func:`representation_jacobian_norms`.
  """
  return _jacobian_chunks(model, params, x, chunk, reduce=False,
                          jacobian=jacobian)


def _pinv_column_norms(jac: jax.Array) -> jax.Array:
  """``||J^+ e_i||_2`` for every i, from the thin SVD of ``J`` [F, D]."""
  u, s, _ = jnp.linalg.svd(jac, full_matrices=False)
  cutoff = max(jac.shape) * jnp.finfo(jac.dtype).eps * jnp.max(s)
  inv_s = jnp.where(s > cutoff, 1.0 / jnp.where(s > cutoff, s, 1.0), 0.0)
  return jnp.linalg.norm(u * inv_s[None, :], axis=1)


def reference_ratio(norms: jax.Array, r: jax.Array, eps: float
                    ) -> jax.Array:
  """The reference score per example, ``||dr_i/dx|| / (r_i + eps)``, with
  0 where the Jacobian row is 0: with ``eps = 0`` a feature at r = 0 (a
  sigmoid that underflows, or ``eps=0`` on a ReLU net) would be 0/0 = NaN,
  which makes the percentile threshold NaN and prunes every feature (the
  reference code, comparing with that NaN, would keep every one); 0 is what
  any ``eps > 0`` gives it."""
  return jnp.where(norms == 0, 0.0, norms / jnp.where(norms == 0, 1.0,
                                                        r + eps))


def scores_from_jacobian(r: jax.Array,
                         jac: jax.Array,
                         *,
                         score: str = "reference",
                         eps: float = 0.0,
                         weights: jax.Array | None = None) -> jax.Array:
  """Feature scores ``[F]`` from per-example ``r [B, F]`` and ``J [B, F, D]``.

  See :func:`feature_scores` for the definitions.
  """
  _check_choice(score, SCORES, "score")
  if score == "reference":
    per_example = reference_ratio(jnp.linalg.norm(jac, axis=-1), r, eps)
  else:
    per_example = -jnp.abs(r) * jax.vmap(_pinv_column_norms)(jac)
  return _weighted_sum(per_example, weights)


def _weighted_sum(per_example: jax.Array,
                  weights: jax.Array | None) -> jax.Array:
  """``sum_b w_b * per_example[b]`` over real examples ``[F]``."""
  if weights is not None:
    # where, not multiply: a padded example's inf / nan must not leak in.
    per_example = jnp.where(
        weights[:, None] > 0,
        per_example * weights[:, None].astype(per_example.dtype), 0.0)
  return jnp.sum(per_example, axis=0)


def feature_scores(features_fn: Callable[[jax.Array], jax.Array],
                   x: jax.Array,
                   *,
                   score: str = "reference",
                   eps: float = 0.0,
                   weights: jax.Array | None = None,
                   jacobian: str = "auto") -> jax.Array:
  """One Soteria score per representation feature, summed over a batch.

  Args:
    features_fn: one input ``[H, W, C]`` -> representation ``r`` ``[F]``
      (e.g. ``model.feature_fn(params)``).
    x: inputs ``[B, H, W, C]``.
    score: 'reference': ``sum_b ||dr_bi/dx_b||_2 / (r_bi + eps)``; 'exact':
      ``-sum_b ||r_bi (J_b^+ e_i)||_2`` (negated so that, like 'reference',
      a small score means prune; see the module docstring).
    eps: denominator epsilon of the 'reference' score (ignored by 'exact').
    weights: optional ``[B]`` example weights (0 = padding, contributes
      nothing).
    jacobian: 'auto', 'rev' or 'fwd', see :func:`features_and_jacobian`.

  Returns:
    Scores ``[F]``.

  Raises:
    ValueError: bad ``score`` / ``jacobian`` / ``eps`` or non 1-D
      ``features_fn``.
  """
  _check_choice(score, SCORES, "score")
  if not isinstance(eps, jax.core.Tracer):
    _check_eps(eps)
  r, jac = features_and_jacobian(features_fn, x, jacobian=jacobian)
  return scores_from_jacobian(r, jac, score=score, eps=eps, weights=weights)


# --------------------------------------------------------------------------
# Mask selection.


def mask_from_scores(scores: jax.Array,
                     percent: Any,
                     *,
                     selection: str = "percentile",
                     inactive: jax.Array | None = None) -> jax.Array:
  """0/1 keep-mask over features (1 = keep, 0 = prune).

  Args:
    scores: ``[F]`` scores, small = prune first.
    percent: pruning rate in percent, in [0, 100] (may be traced).
    selection: 'percentile': prune every feature whose score is strictly below
      ``np.percentile(scores, percent)`` (linear interpolation), ties kept,
      as the reference code (which compares ``abs(scores)`` with that
      threshold: the same mask for its scores, which are >= 0, and not
      applied here, where 'exact' scores are <= 0 by design); 'count':
      prune exactly ``round(percent / 100 * F)`` features (round half to
      even), smallest score first, ties broken by lower feature index
      first.
    inactive: optional boolean ``[F]``; with 'count', these features are
      ranked after every other one (they are 0 on every image already, so
      pruning them is a no-op). Ignored by 'percentile'.

  Returns:
    Float mask ``[F]`` of the dtype of ``scores`` (float32 for ints).

  Raises:
    ValueError: bad ``percent`` / ``selection`` or scores not 1-D.
  """
  _check_choice(selection, SELECTIONS, "selection")
  check_percent(percent)
  if jnp.ndim(scores) != 1:
    raise ValueError(f"scores must be 1-D [F], got shape {jnp.shape(scores)}.")
  scores = jnp.asarray(scores)
  dtype = scores.dtype if jnp.issubdtype(scores.dtype, jnp.floating) else (
      jnp.float32)
  num = scores.shape[0]
  if selection == "percentile":
    threshold = jnp.percentile(scores, percent, method="linear")
    return (scores >= threshold).astype(dtype)
  order = jnp.argsort(scores, stable=True)
  if inactive is not None:
    if tuple(jnp.shape(inactive)) != (num,):
      raise ValueError(f"inactive must have the shape of scores ({num},); "
                       f"got shape {tuple(jnp.shape(inactive))}.")
    # Two stable sorts = lexicographic (inactive last, then score, then index).
    order = order[jnp.argsort(inactive[order].astype(jnp.int32), stable=True)]
  rank = jnp.zeros((num,), jnp.int32).at[order].set(
      jnp.arange(num, dtype=jnp.int32))
  return (rank >= _prune_count(percent, num)).astype(dtype)


def _prune_count(percent: Any, num: int) -> Any:
  """``round(percent / 100 * num)``, half to even.

  Exact for a concrete ``percent`` (a float32 product would break some
  ties, e.g. 59 % of 50 to 29 instead of 30); float32 when traced.
  """
  if isinstance(percent, jax.core.Tracer):
    return jnp.round(jnp.asarray(percent, jnp.float32) / 100.0 * num)
  return round(fractions.Fraction(float(percent)) * num / 100)


def pruning_info(keep: jax.Array, active: jax.Array) -> base.Info:
  """Nominal and effective pruned fractions (see the module docstring).

  Args:
    keep: ``[F]`` 0/1 keep-mask.
    active: ``[F]`` bool, features non-zero on some real example.

  Returns:
    ``pruned_fraction``, ``effective_pruned_fraction``,
    ``pruned_fraction_of_active`` and ``active_fraction`` (scalars).
  """
  num = keep.shape[0]
  pruned = keep == 0
  n_active = jnp.sum(active)
  n_eff = jnp.sum(pruned & active)
  return {
      "pruned_fraction": jnp.sum(pruned) / num,
      "effective_pruned_fraction": n_eff / num,
      "pruned_fraction_of_active": jnp.where(
          n_active > 0, n_eff / jnp.maximum(n_active, 1), 0.0),
      "active_fraction": n_active / num,
  }


# --------------------------------------------------------------------------
# Applying a mask to the gradient.


def _path(model_or_path: Any) -> tuple[str, ...]:
  if isinstance(model_or_path, models_lib.Model):
    return tuple(model_or_path.defended_path)
  if isinstance(model_or_path, str):
    return (model_or_path,)
  return tuple(model_or_path)


def _replace(tree: Any, path: tuple[str, ...], fn: Callable[[Any], Any]) -> Any:
  """Functional update of the sub-tree at ``path`` (dicts / FrozenDicts)."""
  if not path:
    return fn(tree)
  key = path[0]
  new_sub = _replace(tree[key], path[1:], fn)
  if hasattr(tree, "copy") and not isinstance(tree, dict):
    return tree.copy({key: new_sub})  # flax FrozenDict
  out = dict(tree)
  out[key] = new_sub
  return type(tree)(out) if type(tree) is not dict else out


def defended_layer(tree: Any, model_or_path: Any) -> Any:
  """Sub-tree of the defended layer, with a clear error when absent.

  Raises:
    ValueError: ``tree`` has no Dense layer (a ``kernel`` [F, K]) at the path.
  """
  path = _path(model_or_path)
  sub = tree
  try:
    for key in path:
      sub = sub[key]
    kernel = sub["kernel"]
  except (KeyError, TypeError, IndexError):
    top = list(getattr(tree, "keys", lambda: [])())
    raise ValueError(
        "The model has no defended linear layer: expected a Dense layer with "
        f"a 'kernel' [F, K] at path {path} in the parameter/gradient tree "
        f"(top-level keys: {top}).") from None
  if jnp.ndim(kernel) != 2:
    raise ValueError(f"The defended layer at {path} must be a Dense layer "
                     f"with a 2-D kernel [F, K]; got shape "
                     f"{jnp.shape(kernel)}.")
  return sub


def apply_row_scale(grads: Params, row_scale: jax.Array, model_or_path: Any,
                    *, protect_bias: bool = False) -> Params:
  """Multiplies row i of the defended kernel gradient by ``row_scale[i]``.

  Entries whose scale is exactly 0 become exactly 0 (``where``, so a NaN or
  inf gradient entry does not survive a prune); every other leaf of
  ``grads`` is returned as the same object (bit-identical).

  Args:
    grads: the gradient tree.
    row_scale: ``[F]``, one factor per defended-kernel row.
    model_or_path: the model, or the defended layer's path in the tree.
    protect_bias: also zero the defended layer's bias gradient.

  Returns:
    ``grads`` with the defended kernel (and bias) replaced.

  Raises:
    ValueError: ``row_scale`` is not ``[F]``.
  """
  path = _path(model_or_path)
  layer = defended_layer(grads, path)
  kernel = layer["kernel"]
  if row_scale.shape != (kernel.shape[0],):
    raise ValueError(f"mask must have shape [F] = ({kernel.shape[0]},) for "
                     f"the defended kernel of shape {kernel.shape}; got "
                     f"{row_scale.shape}.")

  def update(layer):
    scale = row_scale.astype(kernel.dtype)[:, None]
    new_kernel = jnp.where(scale == 0, jnp.zeros_like(kernel), kernel * scale)
    # Keep rows with scale 1 bit-identical (x * 1 is exact in IEEE anyway).
    new_kernel = jnp.where(scale == 1, kernel, new_kernel)
    layer = _replace(layer, ("kernel",), lambda _: new_kernel)
    if protect_bias and "bias" in layer:
      layer = _replace(layer, ("bias",), jnp.zeros_like)
    return layer

  return _replace(grads, path, update)


def apply_mask(grads: Params, mask: jax.Array, model_or_path: Any, *,
               protect_bias: bool = False) -> Params:
  """Zeroes the pruned columns of the paper's ``dL/dW`` (flax kernel rows).

  Args:
    grads: gradient pytree (same structure as the parameters).
    mask: ``[F]`` keep-mask (1 keep, 0 prune).
    model_or_path: a :class:`~repdef_jax.models.Model` (uses its
      ``defended_path``) or the path to the defended layer, e.g. ``('head',)``.
    protect_bias: also zero the defended layer's bias gradient.

  Returns:
    ``grads`` with rows ``i`` of the defended ``kernel`` [F, K] zeroed where
    ``mask[i] == 0``; all other entries and leaves bit-identical.
  """
  return apply_row_scale(grads, jnp.asarray(mask), model_or_path,
                         protect_bias=protect_bias)


# --------------------------------------------------------------------------
# Perturbation registry.


class PerturbationInputs(NamedTuple):
  """What a perturbation may use to choose its row scale.

  Attributes:
    scores: summed feature scores ``[F]`` (small = prune first).
    r: per-example representations ``[B, F]``.
    jac_row_norms: ``||d r_bi / d x_b||_2`` ``[B, F]``.
    weights: example weights ``[B]`` (0 = padding).
    active: boolean ``[F]``, r non-zero on some real example.
    selection: 'percentile' or 'count' (static).
  """

  scores: jax.Array
  r: jax.Array
  jac_row_norms: jax.Array
  weights: jax.Array
  active: jax.Array
  selection: str = "percentile"


Perturbation = Callable[[PerturbationInputs, Any], tuple[jax.Array, base.Info]]
PERTURBATIONS: dict[str, Perturbation] = {}


def register_perturbation(name: str) -> Callable[[Perturbation], Perturbation]:
  """Decorator registering a perturbation under ``name`` (e.g. 'q2').

  Args:
    name: the perturbation's name, ``soteria(..., q=name)``.

  Returns:
    The decorator; it returns the function unchanged.

  Raises:
    ValueError: ``name`` is empty, not a string, or already registered, or
      the decorated object is not callable.
  """

  if not isinstance(name, str) or not name:
    raise ValueError(f"name must be a non-empty string (the q of "
                     f"soteria(q=...)), got {name!r}.")

  def deco(fn: Perturbation) -> Perturbation:
    if not callable(fn):
      raise ValueError(f"perturbation {name!r} must be a function "
                       f"fn(ctx, strength) -> (row_scale, info), got "
                       f"{type(fn).__name__}.")
    if name in PERTURBATIONS:
      raise ValueError(f"A perturbation named {name!r} is already registered.")
    PERTURBATIONS[name] = fn
    return fn

  return deco


@register_perturbation("q0")
def q0_perturbation(ctx: PerturbationInputs,
                    strength: Any) -> tuple[jax.Array, base.Info]:
  """Closed-form q = 0 solution: zero the selected features of ``r``.

  ``||r - r'||_0 <= eps`` with ``p = 2``: keep ``r`` except the features with
  the largest ``||r_i dX/dr_i||`` (smallest score), which are set to 0 (Sun
  et al. 2021, Section 4). The model to copy for a new norm.

  Args:
    ctx: the batch's scores, representations, Jacobian row norms, example
      weights, active features and selection rule.
    strength: the pruning rate in percent, [0, 100].

  Returns:
    ``(keep [F] of 0/1, info)``: the row scale and :func:`pruning_info`.
  """
  keep = mask_from_scores(ctx.scores, strength, selection=ctx.selection,
                          inactive=~ctx.active)
  return keep, pruning_info(keep, ctx.active)


def _check_eps(eps: Any, default: str = "") -> float:
  """``eps`` as a float; a ValueError unless it is a finite number >= 0."""
  try:
    v = math.nan if isinstance(eps, (bool, str)) else float(eps)
  except (TypeError, ValueError):
    v = math.nan
  if not (math.isfinite(v) and v >= 0):
    raise ValueError(f"eps must be a finite number >= 0{default}, got "
                     f"{eps!r}.")
  return v


def _resolve_q(q: Any) -> str:
  name = (f"q{int(q)}" if isinstance(q, numbers.Integral) and
          not isinstance(q, bool) else str(q))
  if name not in PERTURBATIONS:
    raise ValueError(f"q must name a registered perturbation, one of "
                     f"{tuple(PERTURBATIONS)} (or its integer q); got {q!r}.")
  return name


# --------------------------------------------------------------------------
# The defense.


def soteria(model: models_lib.Model,
            percent: Any,
            *,
            score: str = "reference",
            selection: str = "percentile",
            eps: float | None = None,
            protect_bias: bool = False,
            q: Any = 0,
            jacobian: str = "auto",
            jacobian_conv_impl: str | None = "auto",
            jacobian_chunk: int | None = None) -> base.Defense:
  """The Soteria defense as a :class:`~repdef_jax.defenses.base.Defense`.

  One mask is computed from the whole client batch (scores summed over real
  examples; padded ones, ``batch.mask == 0``, contribute nothing) at the
  parameters ``batch.params`` and applied to the defended layer's weight
  gradient. Deterministic (the key is ignored).

  Args:
    model: the model; must have a Dense layer at ``model.defended_path``.
    percent: perturbation strength; for q = 0 the pruning rate in percent,
      in [0, 100].
    score: 'reference' or 'exact' (see :func:`feature_scores`).
    selection: 'percentile' (reference rule) or 'count'.
    eps: 'reference' score epsilon; None uses ``model.score_eps``.
    protect_bias: also zero the defended layer's bias gradient.
    q: the perturbation: an int q (0 -> 'q0') or a registered name.
    jacobian: 'auto' (the model-aware :func:`representation_jacobian_norms`,
      or :func:`representation_jacobian` for the 'exact' score, in the mode
      of :func:`model_jacobian_mode`), or 'rev' / 'fwd' to run the generic
      :func:`features_and_jacobian` in that mode instead (the whole
      ``[B, F, D]`` Jacobian).
    jacobian_conv_impl: convolution formulation used for the Jacobian
      (same parameters, same numbers up to float rounding; see
      :mod:`repdef_jax.models`); 'auto' is 'xla' on GPU/TPU and on CPU
      the 'jacobian' rule of :func:`repdef_jax.models.resolve_conv_impl`
      (per layer 'dense', 'patches' or 's2d'), or 'xla' where the
      Jacobian runs in forward mode (:func:`model_jacobian_mode`); with
      ``jacobian='rev'`` / 'fwd' the 'auto' rule. None keeps the model's.
    jacobian_chunk: features pulled back (rows of the Jacobian) or, in
      forward mode, input pixels pushed forward (columns) at a time,
      bounding memory; None picks a size ('auto') or runs all at once
      ('rev' / 'fwd').

  Returns:
    A Defense named 'soteria' with info keys ``pruned_fraction``,
    ``effective_pruned_fraction``, ``pruned_fraction_of_active``,
    ``active_fraction`` (for q0), and ``nonfinite_input`` (1.0 when a real
    example's image holds NaN or inf, else 0.0; always present).

  Raises:
    ValueError: bad arguments, or a model without a defended linear layer.
  """
  models_lib.check_model(model)
  _check_choice(score, SCORES, "score")
  _check_choice(selection, SELECTIONS, "selection")
  _check_choice(jacobian, JACOBIAN_MODES, "jacobian")
  qname = _resolve_q(q)
  check_strength(percent, qname)
  eps = model.score_eps if eps is None else _check_eps(
      eps, " (or None for model.score_eps)")
  if not isinstance(protect_bias, (bool, np.bool_)):
    raise ValueError(f"protect_bias must be True or False, got "
                     f"{protect_bias!r}.")
  _check_chunk(jacobian_chunk, "jacobian_chunk")
  if jacobian_conv_impl is not None:
    _check_choice(jacobian_conv_impl, models_lib.CONV_IMPLS,
                  "jacobian_conv_impl")
  head = defended_layer(jax.eval_shape(model.init, jax.random.key(0)), model)
  perturb = PERTURBATIONS[qname]
  _check_perturbation(perturb, qname, percent, head["kernel"].shape[0],
                      selection)
  jac_model = (model if jacobian_conv_impl is None
               else model.with_conv_impl(jacobian_conv_impl))

  def apply(grads, batch: base.ClientBatch, key):
    del key
    base.check_batch(batch)
    weights = (jnp.ones(batch.x.shape[:1], batch.x.dtype)
               if batch.mask is None else batch.mask.astype(batch.x.dtype))
    if jacobian == "auto" and score == "reference":
      r, norms = representation_jacobian_norms(jac_model, batch.params,
                                               batch.x, chunk=jacobian_chunk)
      scores = _weighted_sum(reference_ratio(norms, r, eps), weights)
    else:
      if jacobian == "auto":
        r, jac = representation_jacobian(jac_model, batch.params, batch.x,
                                         chunk=jacobian_chunk)
      else:
        r, jac = features_and_jacobian(jac_model.feature_fn(batch.params),
                                       batch.x, jacobian=jacobian,
                                       chunk=jacobian_chunk)
      scores = scores_from_jacobian(r, jac, score=score, eps=eps,
                                    weights=weights)
      norms = jnp.linalg.norm(jac, axis=-1)
    active = jnp.any((r != 0) & (weights[:, None] > 0), axis=0)
    ctx = PerturbationInputs(scores=scores, r=r,
                             jac_row_norms=norms,
                             weights=weights, active=active,
                             selection=selection)
    row_scale, info = perturb(ctx, percent)
    # A NaN/inf image makes the scores NaN and the mask meaningless (every
    # feature pruned by 'percentile'; 'count' ranks NaN as kept): flag it
    # (jittable; host callers should raise on it).
    bad = ~jnp.all(jnp.isfinite(batch.x.reshape(batch.x.shape[0], -1)),
                   axis=1)
    info = {**info, "nonfinite_input": jnp.any(bad & (weights > 0)).astype(
        jnp.float32)}
    grads = apply_row_scale(grads, row_scale, model, protect_bias=protect_bias)
    return grads, info

  return base.Defense("soteria", apply)
