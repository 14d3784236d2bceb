"""Representation inference from a client's model update, and inversion.

Implements the representation-leakage analysis of Sun et al. 2021, Section 3
and Appendix A (Algorithms 3 and 4), as pure, jittable JAX functions.

Why it works (column j of a layer's update is a weighted sum of the
representations entering it): ``docs/design.md``.

Reconstruction (Section 3, "representation leakage"): :func:`reconstruct`
inverts the feature extractor with L-BFGS inside one ``jit``
(``lax.while_loop``) from three sources selectable by name: the (inferred)
representation, the whole gradient (DLG-style L2 gradient matching over
every tensor), and the gradients of the convolutional layers alone.

Departures from the paper (all documented at the functions):

* Class detection: a class is inferred when its column norm exceeds
  ``threshold`` (default 2) times the median column norm; the paper only says
  "significantly larger". ``k`` (top-k) and ``rule='sign'`` (positive bias
  update, exact for absent classes under plain SGD on softmax cross-entropy,
  since their bias gradient ``sum p_c`` is always positive) are options.
* Scaling: the paper scales a row by a factor set by the number of local
  steps. By default we divide column ``c`` by the bias update ``U_b[c]``
  (the same ``delta`` weights), which gives a delta-weighted *mean* of the
  representations in the input's own units, independent of the learning rate
  and step count; a fixed ``scale`` is available. Correlation is
  scale-invariant; only the sign matters, and estimates are sign-corrected so
  that they correlate positively with non-negative (ReLU / sigmoid) features.
* Previous layers: each selected column is sign-corrected (by the sign of its
  sum, as the true input is non-negative) and normalised to unit norm before
  averaging, so that a few very large columns do not dominate; the paper
  averages the rows as they are. ``M`` defaults to 10 (not given in the
  paper's summary).
* Reconstruction: images are parametrised as ``x = sigmoid(z)`` so that they
  stay in ``[0, 1]`` without breaking L-BFGS's curvature pairs by clipping;
  the representation objective is the squared L2 distance (DLG-like), the
  gradient objectives the summed squared L2 gradient distance (DLG) with the
  label given.

References:
  Sun, Li, Wang, Yang, Li, Chen. "Provable Defense against Privacy Leakage in
  Federated Learning from Representation Perspective" (Soteria), CVPR 2021,
  arXiv:2012.06043, Section 3 and Appendix A.
  Zhu, Liu, Han. "Deep Leakage from Gradients", NeurIPS 2019.
"""

from __future__ import annotations

from collections.abc import Mapping
import functools
from typing import Any, Callable, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

from repdef_jax import gradients as gradients_lib
from repdef_jax import models as models_lib
from repdef_jax.attacks import base as attacks_base

Params = Any

OBJECTIVES = ("representation", "gradient", "conv_gradient")
CLASS_RULES = ("norm", "sign")


# --------------------------------------------------------------------------
# Helpers.
# --------------------------------------------------------------------------


def _kernel(update: Any) -> jax.Array:
  """The ``[in, out]`` kernel of a Dense update given as a dict or array."""
  if isinstance(update, Mapping):
    if "kernel" not in update:
      raise ValueError(
          "expected one Dense layer's update (a dict with 'kernel' [in, out], "
          "e.g. update['head'], or the kernel itself); got a dict with keys "
          f"{sorted(update)}.")
    return update["kernel"]
  return update


def _bias(update: Any) -> jax.Array | None:
  if isinstance(update, Mapping):
    return update.get("bias")
  return None


def _sign_nonneg(v: jax.Array, axis: int | None = None) -> jax.Array:
  """+1 where the sum along ``axis`` is >= 0, else -1 (never 0)."""
  return jnp.where(jnp.sum(v, axis=axis) >= 0, 1.0, -1.0).astype(v.dtype)


def pearson(a: jax.Array, b: jax.Array) -> jax.Array:
  """Pearson correlation of two arrays, flattened.

  The paper's measure of representation leakage (Section 3). For a batch of
  pairs use ``jax.vmap(pearson)``. A constant input carries no linear
  information about the other: its correlation is 0 (not NaN, which would
  poison a mean over images), as in
  :func:`repdef_jax.metrics.representation_correlation`.

  Args:
    a: any shape.
    b: same number of elements as ``a``.

  Returns:
    Scalar in ``[-1, 1]``.
  """
  a = jnp.ravel(a).astype(jnp.float32)
  b = jnp.ravel(b).astype(jnp.float32)
  def centred(v):  # Scaled to max |v| = 1: no float32 underflow below.
    v = v - jnp.mean(v)
    top = jnp.max(jnp.abs(v))
    return v / jnp.where(top == 0, 1.0, top)

  a, b = centred(a), centred(b)
  den = jnp.sqrt(jnp.sum(a * a) * jnp.sum(b * b))
  # NaN inputs stay NaN (den == 0 is False for NaN).
  return jnp.where(den == 0, 0.0,
                   jnp.sum(a * b) / jnp.where(den == 0, 1.0, den))


def fc_inputs(model: models_lib.Model, params: Params,
              x: jax.Array) -> dict[str, jax.Array]:
  """The representation entering each fully connected layer of ``model``.

  Captured by intercepting the calls of the submodules named in
  ``model.fc_layers``; jittable.

  Args:
    model: the model.
    params: its parameters.
    x: images ``[B, H, W, C]``.

  Returns:
    ``{layer: [B, F_layer]}`` for every layer in ``model.fc_layers``;
    ``out['head']`` equals ``model.features(params, x)``.
  """
  model.check_input(x)
  captured = {}
  names = set(model.fc_layers)

  def interceptor(next_fun, args, kwargs, context):
    if context.method_name == "__call__" and context.module.name in names:
      captured[context.module.name] = args[0]
    return next_fun(*args, **kwargs)

  with nn.intercept_methods(interceptor):
    model.module.apply({"params": params}, x)
  return {name: captured[name] for name in model.fc_layers}


def class_mean_representations(model: models_lib.Model, params: Params,
                               x: jax.Array, y: jax.Array
                               ) -> tuple[jax.Array, dict[str, jax.Array]]:
  """Per-class mean of the representation entering each FC layer.

  The ground truth that inferred representations are compared with.

  Args:
    model: the model.
    params: its parameters.
    x: images ``[B, H, W, C]``.
    y: integer labels ``[B]``.

  Returns:
    ``(counts [K], {layer: [K, F_layer]})``; classes absent from ``y`` have
    count 0 and a zero mean.
  """
  onehot = jax.nn.one_hot(y, model.num_classes, dtype=jnp.float32)  # [B, K]
  counts = jnp.sum(onehot, axis=0)
  denom = jnp.maximum(counts, 1.0)[:, None]
  reps = fc_inputs(model, params, x)
  return counts, {k: (onehot.T @ r) / denom for k, r in reps.items()}


# --------------------------------------------------------------------------
# Algorithm 3: classes and last-layer representation.
# --------------------------------------------------------------------------


def class_norms(head_update: Any) -> jax.Array:
  """Norm of each class's column of the last layer's weight update, ``[K]``.

  The paper's "row norms" (its ``W`` is ``[out, in]``; flax's is ``[in, out]``).
  """
  return jnp.linalg.norm(_kernel(head_update), axis=0)


def infer_classes(head_update: Any, *, threshold: float = 2.0,
                  k: int | None = None, rule: str = "norm") -> jax.Array:
  """Which classes a client trained on, from its last-layer update (Alg. 3).

  Rules:

  * ``rule='norm'`` (the paper's): class ``c`` is inferred when
    ``||U_W[:, c]|| > threshold * median_c' ||U_W[:, c']||``. The paper says
    only "significantly larger"; the median is robust as long as fewer than
    half of the classes are present (2 of 10 in the paper's setting).
  * ``rule='sign'``: class ``c`` is inferred when its bias update is
    positive. Under plain SGD on softmax cross-entropy an absent class's bias
    gradient ``sum_n p_{c,n}`` is strictly positive, so its update is strictly
    negative: absent classes are never inferred. Needs the bias.
  * ``k`` given: the ``k`` classes with the largest column norms (overrides
    ``rule``).

  Args:
    head_update: the last layer's update, ``{'kernel': [F, K], 'bias': [K]}``
      (or the kernel alone for the norm rules).
    threshold: multiple of the median norm (``rule='norm'``).
    k: number of classes if known (static).
    rule: 'norm' or 'sign' (static).

  Returns:
    Boolean mask ``[K]`` of the inferred classes. Jittable (``k`` and
    ``rule`` static).

  Raises:
    ValueError: unknown rule, or ``rule='sign'`` without a bias.
  """
  norms = class_norms(head_update)
  num_classes = norms.shape[0]
  if k is not None:
    if not 1 <= k <= num_classes:
      raise ValueError(f"k must be in [1, {num_classes}], got {k}.")
    _, idx = jax.lax.top_k(norms, k)
    return jnp.zeros(num_classes, bool).at[idx].set(True)
  if rule == "norm":
    return norms > threshold * jnp.median(norms)
  if rule == "sign":
    bias = _bias(head_update)
    if bias is None:
      raise ValueError("rule='sign' needs the bias update: pass "
                       "{'kernel': ..., 'bias': ...}.")
    return bias > 0
  raise ValueError(f"Unknown rule {rule!r}; valid rules: "
                   f"{', '.join(CLASS_RULES)}.")


def inferred_class_indices(head_update: Any, **kwargs) -> np.ndarray:
  """Host-side convenience: the inferred classes as sorted integer indices.

  Args:
    head_update: as :func:`infer_classes`.
    **kwargs: forwarded to :func:`infer_classes`.

  Returns:
    ``np.ndarray`` of class ids.
  """
  return np.flatnonzero(np.asarray(infer_classes(head_update, **kwargs)))


def infer_last_representation(head_update: Any, class_idx: jax.Array | int,
                              *, scale: float | None = None) -> jax.Array:
  """Representation of one class from its column of the last-layer update.

  ``U_W[:, c] = -lr sum_{t,n} delta_{c,n,t} r_{n,t}`` (Appendix A.1, with the
  paper's approximation that the ``delta`` of one class's examples are
  similar). For a class the client trains on, ``delta_c = p_c - 1 < 0``
  dominates, so the column is a positive multiple of the class-mean
  representation.

  Departure from the paper: with ``scale=None`` the column is divided by the
  bias update ``U_b[c] = -lr sum delta_{c,n,t}``, which returns the
  ``delta``-weighted mean representation in its own units (exact for one
  example and one step), whatever the learning rate or number of steps. With
  a float ``scale`` (the paper's factor from the number of local steps and the
  learning rate) the column is multiplied by it. Either way the result is then
  sign-corrected so that it sums to a non-negative value, i.e. correlates
  positively with non-negative (ReLU or sigmoid) features. Pearson
  correlation does not depend on the scale.

  Args:
    head_update: ``{'kernel': [F, K], 'bias': [K]}`` or the kernel alone
      (then ``scale=None`` means 1).
    class_idx: class id (may be traced).
    scale: fixed positive factor, or None for bias normalisation.

  Returns:
    Inferred representation ``[F]`` entering the last layer.
  """
  col = jnp.take(_kernel(head_update), class_idx, axis=1)
  bias = _bias(head_update)
  if scale is not None:
    col = col * scale
  elif bias is not None:
    b = jnp.take(bias, class_idx)
    tiny = jnp.finfo(col.dtype).tiny
    col = col / jnp.where(jnp.abs(b) > tiny, b, 1.0)
  return col * _sign_nonneg(col)


# --------------------------------------------------------------------------
# Algorithm 4: earlier fully connected layers.
# --------------------------------------------------------------------------


def infer_previous_representation(layer_update: Any, later_repr: jax.Array,
                                  *, M: int = 10,
                                  normalize: bool = True) -> jax.Array:
  """Representation entering a layer from that layer's update (Alg. 4).

  The layer maps ``r_{l-1} -> r_l`` with flax kernel ``[in=r_{l-1},
  out=r_l]``; its update column ``j`` is ``-lr sum delta_j r_{l-1}``. The
  ``M`` largest-magnitude features ``j`` of ``later_repr`` (the inferred
  ``r_l`` of one class) select the columns the class drives most; each is
  sign-corrected (``r_{l-1}`` is non-negative, but ``delta_j`` has either
  sign) and, by default, scaled to unit norm (departure: the paper averages
  the raw rows, which lets a few large columns dominate), then averaged.

  Args:
    layer_update: ``{'kernel': [F_in, F_out], ...}`` or the kernel.
    later_repr: inferred ``r_l``, ``[F_out]``.
    M: number of features used (static, ``1 <= M <= F_out``).
    normalize: unit-normalise the columns before averaging.

  Returns:
    Inferred ``r_{l-1}``, ``[F_in]``, non-negative-correlated; its scale is
    arbitrary (mean column norm 1 when ``normalize``).

  Raises:
    ValueError: when ``M`` is out of range or shapes do not match.
  """
  kernel = _kernel(layer_update)
  f_out = kernel.shape[1]
  if later_repr.shape != (f_out,):
    raise ValueError(f"later_repr must have shape ({f_out},) for a kernel of "
                     f"shape {kernel.shape}; got {later_repr.shape}.")
  if not 1 <= M <= f_out:
    raise ValueError(f"M must be in [1, {f_out}], got {M}.")
  _, idx = jax.lax.top_k(jnp.abs(later_repr), M)
  cols = jnp.take(kernel, idx, axis=1)  # [F_in, M]
  cols = cols * _sign_nonneg(cols, axis=0)[None, :]
  if normalize:
    norms = jnp.linalg.norm(cols, axis=0, keepdims=True)
    cols = cols / jnp.maximum(norms, jnp.finfo(cols.dtype).tiny)
  return jnp.mean(cols, axis=1)


def infer_all_representations(model: models_lib.Model, update_tree: Params,
                              *, M: int = 10,
                              num_classes_hint: int | None = None,
                              threshold: float = 2.0,
                              rule: str = "norm",
                              scale: float | None = None,
                              normalize: bool = True
                              ) -> tuple[jax.Array, dict[str, jax.Array]]:
  """Algorithms 3 and 4 for every class at once (jittable core).

  Walks back through ``model.fc_layers`` from ``head`` to the first FC
  layer, vmapped over classes.

  Args:
    model: the model (static); its ``fc_layers`` name the update's sub-trees.
    update_tree: the client's update (parameter tree, e.g. ``params_after -
      params_before``); a summed gradient works too with the default
      ``rule='norm'`` (or ``num_classes_hint``), not with ``rule='sign'``,
      which reads a positive bias *update* (minus the gradient) as present.
    M: features used per earlier layer (static); clipped to each layer's
      width.
    num_classes_hint: number of classes the client holds, if known (top-k).
    threshold: :func:`infer_classes` median multiple.
    rule: :func:`infer_classes` rule.
    scale: :func:`infer_last_representation` scale.
    normalize: :func:`infer_previous_representation` column normalisation.

  Returns:
    ``(class_mask [K], {layer: [K, F_layer]})``: the inferred classes and, for
    *every* class (meaningful only where the mask is set), the inferred
    representation entering each FC layer.
  """
  gradients_lib.check_grads_match(
      jax.eval_shape(model.init, jax.random.key(0)), update_tree,
      "update_tree")
  attacks_base.check_int_value(M, "M", 1)
  layers = model.fc_layers
  head = update_tree[layers[-1]]
  mask = infer_classes(head, threshold=threshold, k=num_classes_hint,
                       rule=rule)

  def per_class(c):
    r = infer_last_representation(head, c, scale=scale)
    out = {layers[-1]: r}
    for layer in reversed(layers[:-1]):
      lu = update_tree[layer]
      m = min(M, _kernel(lu).shape[1])
      r = infer_previous_representation(lu, r, M=m, normalize=normalize)
      out[layer] = r
    return out

  reps = jax.vmap(per_class)(jnp.arange(model.num_classes))
  return mask, {layer: reps[layer] for layer in layers}


@functools.lru_cache(maxsize=16)
def _jitted_inference(model: models_lib.Model, M: int,
                      num_classes_hint: int | None,
                      kwargs: tuple[tuple[str, Any], ...]) -> Callable:
  """One jitted :func:`infer_all_representations` per model and settings
  (a new ``jax.jit`` per call would compile again for every update)."""
  return jax.jit(functools.partial(infer_all_representations, model, M=M,
                                   num_classes_hint=num_classes_hint,
                                   **dict(kwargs)))


def infer_representations(model: models_lib.Model, update_tree: Params, *,
                          M: int = 10, num_classes_hint: int | None = None,
                          **kwargs) -> dict[int, dict[str, np.ndarray]]:
  """Host-side: inferred representations of each inferred class.

  Runs :func:`infer_all_representations` under ``jit`` and keeps the
  inferred classes.

  Args:
    model: the model.
    update_tree: the client's update.
    M: features used per earlier layer.
    num_classes_hint: number of classes, if known.
    **kwargs: forwarded to :func:`infer_all_representations`.

  Returns:
    ``{class_id: {layer: representation entering that layer}}`` for every
    layer of ``model.fc_layers``.
  """
  fn = _jitted_inference(model, M, num_classes_hint,
                         tuple(sorted(kwargs.items())))
  mask, reps = jax.device_get(fn(update_tree))
  return {int(c): {layer: reps[layer][c] for layer in reps}
          for c in np.flatnonzero(mask)}


# --------------------------------------------------------------------------
# Reconstruction by L-BFGS.
# --------------------------------------------------------------------------


def _select(tree: Params, layers: Sequence[str] | None) -> Params:
  if layers is None:
    return tree
  return {k: tree[k] for k in layers}


def conv_layers(model: models_lib.Model) -> tuple[str, ...]:
  """Top-level parameter groups that are not fully connected layers."""
  params = jax.eval_shape(model.init, jax.random.key(0))
  return tuple(k for k in params if k not in model.fc_layers)


def _check_objective(model: models_lib.Model, params: Params, target: Any,
                     label: Any, objective: str,
                     batch: int | None = None) -> None:
  """Host-side (trace-time) checks of :func:`make_objective`'s arguments.

  ``batch`` (images reconstructed jointly, None: unknown) also checks the
  leading axis of the label and of the representation.
  """
  if objective not in OBJECTIVES:
    raise ValueError(f"Unknown objective {objective!r}; valid objectives: "
                     f"{', '.join(OBJECTIVES)}.")
  if objective == "representation":
    f = model.num_features
    shape = jnp.shape(target)
    want = ((f,), (1, f)) if batch in (None, 1) else ((batch, f),)
    if (len(shape) not in (1, 2) or shape[-1] != f
        or (batch is not None and shape not in want)):
      raise ValueError(f"target must be a representation [{f}] (or [B, {f}] "
                       f"for B images) for model {model.name!r}; got shape "
                       f"{shape}" + (f" for {batch} image(s)." if batch
                                     else "."))
    return
  if label is None:
    raise ValueError(f"objective {objective!r} needs the label.")
  shape, dtype = jnp.shape(label), jnp.result_type(label)
  want = ((), (1,)) if batch in (None, 1) else ((batch,),)
  if (not jnp.issubdtype(dtype, jnp.integer) or len(shape) > 1
      or (batch is not None and shape not in want)):
    raise ValueError("label must be integer class ids of shape [] or [B]"
                     + (f" = [{batch}]" if batch else "") +
                     f"; got {dtype}{shape}.")
  if objective == "conv_gradient":
    layers = conv_layers(model)
    if not isinstance(target, Mapping) or not set(layers) <= set(target):
      raise ValueError(f"target must be a gradient tree with the conv layers "
                       f"{', '.join(layers)} of model {model.name!r}.")
    gradients_lib.check_grads_match(_select(params, layers),
                                    _select(target, layers), "target")
  else:
    gradients_lib.check_grads_match(params, target, "target")


def make_objective(model: models_lib.Model, params: Params, target: Any,
                   label: jax.Array | None, objective: str,
                   batch: int | None = None):
  """The loss of one image ``x [H, W, C]`` (or a batch ``[B, H, W, C]``).

  Args:
    model: the model.
    params: its parameters.
    target: the representation ``[F]`` (``[B, F]`` for a batch;
      ``'representation'``) or the shared gradient tree (``'gradient'``,
      ``'conv_gradient'``; for the latter only the conv sub-trees are read).
      For a batch the gradient is that of the batch's mean loss (what
      :func:`repdef_jax.gradients.batch_grad` computes).
    label: integer label, ``[]`` or ``[B]`` (gradient objectives; assumed
      known, e.g. inferred as in iDLG / :func:`infer_classes`).
    objective: one of :data:`OBJECTIVES`:
      ``'representation'``: ``||features(x) - target||^2``;
      ``'gradient'``: DLG, summed squared L2 distance over every tensor;
      ``'conv_gradient'``: the same over the convolutional layers only.
    batch: the number of images ``x`` will hold, when known: the label and
      the representation must then have that leading size.

  Returns:
    ``loss(x) -> scalar``.

  Raises:
    ValueError: unknown objective, missing label, a label that is not an
      integer of shape ``[]`` or ``[B]``, a representation whose last axis
      is not the model's feature size, or a gradient tree that does not
      match the parameters (for ``'conv_gradient'``: their conv sub-trees).
  """
  _check_objective(model, params, target, label, objective, batch)

  def as_batch(x):
    return x.reshape((-1, *model.input_shape))

  if objective == "representation":
    target = jnp.asarray(target)

    def loss(x):
      r = model.features(params, as_batch(x))
      return jnp.sum((r - target.reshape(r.shape)) ** 2)

    return loss
  layers = conv_layers(model) if objective == "conv_gradient" else None
  tgt = _select(target, layers)

  def loss(x):
    xb = as_batch(x)
    yb = jnp.reshape(label, (xb.shape[0],))
    g = jax.grad(lambda p: gradients_lib.batch_loss(model, p, xb, yb))(params)
    g = _select(g, layers)
    sq = jax.tree_util.tree_map(lambda a, b: jnp.sum((a - b) ** 2), g, tgt)
    return sum(jax.tree_util.tree_leaves(sq))

  return loss


def reconstruct(model: models_lib.Model, params: Params, target: Any,
                x_shape: Sequence[int], key: jax.Array, *,
                objective: str = "representation",
                label: jax.Array | None = None, steps: int = 300,
                memory_size: int = 100,
                rtol: float = 1e-10) -> tuple[jax.Array, jax.Array]:
  """Reconstructs one image with L-BFGS from a chosen source (jittable).

  The image is ``x = sigmoid(z)`` (in ``[0, 1]``), ``z`` starts from
  ``N(0, 1)``; up to ``steps`` iterations of ``optax.lbfgs`` (zoom line
  search, history ``memory_size``) inside one ``lax.while_loop``, stopping
  early once the objective is at most ``rtol`` times its initial value (near
  zero the line search only burns time). The paper runs 300 iterations on the
  conv 3->12 -> FC 10 model (Appendix B). Under ``vmap`` the loop runs until
  every image has stopped. The gradient objectives differentiate a gradient:
  a model with the default 'auto' convolutions runs them as 'second_order'
  (as the attacks do, :func:`repdef_jax.attacks.base.over_devices`; same
  numbers to float rounding, 3x faster on the leakage CNN on CIFAR-10 on CPU).

  Args:
    model: the model (static).
    params: its parameters.
    target: see :func:`make_objective`.
    x_shape: ``(H, W, C)``, or ``(B, H, W, C)`` for B images reconstructed
      jointly (static).
    key: PRNG key of the initial image.
    objective: one of :data:`OBJECTIVES` (static).
    label: integer label for the gradient objectives.
    steps: maximum number of L-BFGS iterations (static).
    memory_size: L-BFGS history (static).
    rtol: relative tolerance of the early stop (0 disables it).

  Returns:
    ``(x [*x_shape] in [0, 1], losses [steps])``; ``losses[t]`` is the
    objective before iteration ``t``; after an early stop the remaining
    entries repeat the final value. A non-finite objective (the run
    diverged) ends the loop and is written to ``losses[-1]``, so the run
    diverged exactly when ``losses[-1]`` is not finite; ``x`` is then the
    image at the non-finite objective (it may hold NaN) and must not be
    read as a reconstruction. (A pair, not a result with a ``diverged``
    field, so that callers unpacking ``x, losses`` keep working.)

  Raises:
    ValueError: unknown objective, missing label, ``steps`` or
      ``memory_size`` not an integer >= 1, or a shape that does not fit:
      ``x_shape`` vs the model, the label vs ``[]`` / ``[B]``, the
      representation vs ``[F]`` / ``[B, F]``, the gradient tree vs the
      parameters (:func:`make_objective`). Checked on the host (at trace
      time under ``jit``), before the loop.
  """
  x_shape = tuple(int(d) for d in x_shape)
  if x_shape[-3:] != tuple(model.input_shape) or len(x_shape) not in (3, 4):
    raise ValueError(f"x_shape {x_shape} does not fit model {model.name!r} "
                     f"(input shape {model.input_shape}, or a batch of it).")
  attacks_base.check_int_value(steps, "steps", 1)
  attacks_base.check_int_value(memory_size, "memory_size", 1)
  if objective != "representation":  # Faster second derivatives on CPU.
    model = model.with_default_conv_impl("second_order")
  obj = make_objective(model, params, target, label, objective,
                       batch=x_shape[0] if len(x_shape) == 4 else 1)
  fn = lambda z: obj(jax.nn.sigmoid(z))
  opt = optax.lbfgs(memory_size=memory_size)
  value_and_grad = optax.value_and_grad_from_state(fn)
  z0 = jax.random.normal(key, x_shape, jnp.float32)
  v0 = fn(z0)
  losses0 = jnp.full((steps,), jnp.nan, jnp.float32)

  def cond(carry):
    i, _, _, value, _ = carry
    return (i < steps) & (value > rtol * v0) & jnp.isfinite(value)

  def body(carry):
    i, z, state, _, losses = carry
    value, grad = value_and_grad(z, state=state)
    updates, state = opt.update(grad, state, z, value=value, grad=grad,
                                value_fn=fn)
    z = optax.apply_updates(z, updates)
    new_value = optax.tree.get(state, "value")
    return i + 1, z, state, new_value, losses.at[i].set(value)

  i, z, _, value, losses = jax.lax.while_loop(
      cond, body, (0, z0, opt.init(z0), v0, losses0))
  losses = jnp.where(jnp.arange(steps) < i, losses, value)
  # A non-finite objective ended the run: make the last entry say so even
  # when it happened at the last iteration.
  losses = losses.at[-1].set(jnp.where(jnp.isfinite(value), losses[-1],
                                       value))
  return jax.nn.sigmoid(z), losses


@functools.lru_cache(maxsize=16)
def jitted_reconstruction(model: models_lib.Model, steps: int) -> Callable:
  """``fn(params, r_target, key=)``: one jitted
  :func:`reconstruct_from_representation` on ``model.input_shape`` per
  model and ``steps``, compiled once (a new ``jax.jit`` per update would
  compile again for every one)."""
  return jax.jit(functools.partial(reconstruct_from_representation, model,
                                   x_shape=model.input_shape, steps=steps))


def reconstruct_from_representation(model: models_lib.Model, params: Params,
                                    r_target: jax.Array,
                                    x_shape: Sequence[int], key: jax.Array, *,
                                    steps: int = 300
                                    ) -> tuple[jax.Array, jax.Array]:
  """Inverts ``model.features``: :func:`reconstruct` on ``'representation'``.

  Minimises ``||features(x) - r_target||^2`` over ``x = sigmoid(z)``
  (squared L2, not cosine: the inferred representation's scale is right when
  it is bias-normalised, see :func:`infer_last_representation`; rescale an
  estimate with an arbitrary scale first).

  Args:
    model: the model (static), e.g. ``get_model('leakage')``.
    params: its parameters.
    r_target: representation ``[F]`` (true or inferred).
    x_shape: ``(H, W, C)``.
    key: PRNG key of the initial image.
    steps: L-BFGS iterations.

  Returns:
    ``(x [H, W, C], losses [steps])``.
  """
  return reconstruct(model, params, r_target, x_shape, key,
                     objective="representation", steps=steps)
