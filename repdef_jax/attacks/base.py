"""What every gradient-inversion attack shares: result, input checks, labels.

An attack is a function

    attack(model, params, shared_grads, num_images, key, *, labels=None,
           config=None) -> AttackResult

that sees only what the server sees: the model, the parameters the client
computed its gradient at, and the gradient it shared (possibly defended).
"""

from __future__ import annotations

import functools
import math
import numbers
import operator
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from repdef_jax import gradients as gradients_lib
from repdef_jax import host
from repdef_jax import models as models_lib
from repdef_jax.attacks import objectives

Params = Any


class AttackResult(NamedTuple):
  """The outcome of one attack.

  Attributes:
    x_rec: reconstructed images ``[B, H, W, C]`` in the model's input space
      (not clamped; DLG's images are unconstrained).
    labels_rec: labels the attack used or recovered ``[B]`` (int32).
    loss_history: objective per outer step (DLG) or per iteration (GS,
      the loss before each step), ``[T]``; entries after an early stop
      repeat the final loss.
    final_loss: objective at ``x_rec`` (scalar).
    diverged: True when the objective or the image became non-finite or
      exploded; ``x_rec`` must then not be read as a reconstruction. DLG
      keeps its last sane iterate (finite); GS returns its final iterate,
      which may hold NaN or inf.
    iterations: objective evaluations after the initial one (DLG: L-BFGS
      trials, rejected and backtracked ones included) or iterations (GS).
  """

  x_rec: jax.Array
  labels_rec: jax.Array
  loss_history: jax.Array
  final_loss: jax.Array
  diverged: jax.Array
  iterations: jax.Array


def validate_inputs(model: models_lib.Model, params: Params,
                    shared_grads: Params, num_images: int,
                    labels: Any = None) -> jax.Array | None:
  """Host-side checks before a jitted attack; raises a clear ValueError.

  Args:
    model: the attacked model.
    params: its parameters.
    shared_grads: the gradient the server received.
    num_images: how many images the gradient was computed on.
    labels: optional known labels ``[num_images]``.

  Returns:
    ``labels`` as an int32 array (or None).
  """
  models_lib.check_model(model)
  gradients_lib.check_grads_match(params, shared_grads, "shared_grads")
  gradients_lib.check_finite(shared_grads, "shared_grads")
  num_images = check_num_images(num_images)
  model.check_input(jnp.zeros((int(num_images), *model.input_shape)),
                    "the reconstructed images")
  if labels is None:
    return None
  labels = jnp.asarray(labels)
  if labels.shape != (int(num_images),) or not jnp.issubdtype(
      labels.dtype, jnp.integer):
    raise ValueError(f"labels must be integer class ids of shape "
                     f"[{num_images}], got {labels.dtype}{labels.shape}.")
  if bool(jnp.any((labels < 0) | (labels >= model.num_classes))):
    raise ValueError(f"labels must lie in [0, {model.num_classes}).")
  return labels.astype(jnp.int32)


def check_num_images(num_images: Any) -> int:
  """``num_images`` as an int; a ValueError unless it is an integer >= 1."""
  try:
    n = None if isinstance(num_images, bool) else operator.index(num_images)
  except TypeError:
    n = None
  if n is None or n < 1:
    raise ValueError(f"num_images must be >= 1, an integer; got "
                     f"{num_images!r}.")
  return n


def check_int(config: Any, name: str, low: int) -> None:
  """Raises a ValueError naming ``name`` unless ``config.<name>`` is an
  integer (not a bool) >= ``low``."""
  check_int_value(getattr(config, name), name, low)


def check_int_value(v: Any, name: str, low: int) -> None:
  """Raises a ValueError naming ``name`` unless ``v`` is an integer (not a
  bool) >= ``low``."""
  if isinstance(v, bool) or not isinstance(v, numbers.Integral) or v < low:
    raise ValueError(f"{name} must be an integer >= {low}; got {v!r}.")


def check_number(config: Any, name: str, low: float, *,
                 strict: bool = True, high: float | None = None,
                 allow_inf: bool = False) -> None:
  """Raises a ValueError naming ``name`` unless ``config.<name>`` is a real
  number (not a bool) > ``low`` (>= with ``strict=False``), < ``high`` when
  given, and finite unless ``allow_inf``."""
  v = getattr(config, name)
  ok = (not isinstance(v, bool) and isinstance(v, numbers.Real)
        and not math.isnan(v) and (allow_inf or math.isfinite(v))
        and (v > low if strict else v >= low)
        and (high is None or v < high))
  if not ok:
    want = (f"{'> ' if strict else '>= '}{low:g}" +
            (f" and < {high:g}" if high is not None else ""))
    kind = "a number" if allow_inf else "a finite number"
    raise ValueError(f"{name} must be {kind} {want}; got {v!r}.")


def check_view(view: Any) -> None:
  """Raises a ValueError unless ``view`` is a GradientView."""
  if not isinstance(view, objectives.GradientView):
    raise ValueError(f"view must be a GradientView (e.g. GradientView("
                     f"drop_defended=True)); got {view!r}.")


def check_view_keeps_entries(model: models_lib.Model, shared: Params,
                             view: objectives.GradientView,
                             batched: bool = False) -> None:
  """Raises a ValueError when ``view`` leaves no gradient entry to match.

  E.g. the drop view on a model whose only layer is the defended one
  (``logreg``): the objective would be 0 for every image.

  Args:
    model: the attacked model.
    shared: the shared gradient (``batched``: K stacked on a leading axis).
    view: the attack's gradient view.
    batched: whether ``shared`` has a leading axis K.
  """
  if view.is_plain:
    return

  def kept(g):
    w = objectives.view_weights(model, g, view)
    return sum(jnp.sum(t) for t in jax.tree_util.tree_leaves(w))

  counts = jax.vmap(kept)(shared) if batched else kept(shared)
  if not bool(jnp.all(counts > 0)):
    raise ValueError(f"view {view} leaves no gradient entry of model "
                     f"{model.name!r} to match (every parameter is in the "
                     f"dropped or masked defended layer); use another "
                     f"attack or view.")


def check_keys(keys: Any, num: int | None = None) -> jax.Array:
  """PRNG keys as a typed key array; raises a clear error for anything else.

  Args:
    keys: one key (``jax.random.key(seed)`` or a raw ``PRNGKey``) or, with
      ``num``, a batch of ``num`` keys (``jax.random.split(key, num)``).
    num: the batch size, or None for a single key.

  Returns:
    A typed key array of shape ``[]`` or ``[num]``.
  """
  want = "a PRNG key (jax.random.key(seed))" if num is None else (
      f"{num} PRNG keys of shape [{num}] (jax.random.split(key, {num}))")
  arr = keys
  try:
    if not jnp.issubdtype(jnp.asarray(arr).dtype, jax.dtypes.prng_key):
      arr = jax.random.wrap_key_data(jnp.asarray(arr, jnp.uint32))
  except Exception:  # pylint: disable=broad-except
    raise ValueError(f"key must be {want}; got {keys!r}.") from None
  if arr.shape != (() if num is None else (num,)):
    raise ValueError(f"key must be {want}; got key shape {arr.shape}.")
  return arr


def validate_batch(model: models_lib.Model, params: Params,
                   shared_batch: Params, num_images: int, keys: Any,
                   labels: Any = None) -> tuple[int, jax.Array,
                                                jax.Array | None]:
  """Host-side checks of a batch of attacks (leading axis K everywhere).

  Args:
    model: the attacked model.
    params: its parameters (shared by every attack of the batch).
    shared_batch: K shared gradients stacked on a leading axis.
    num_images: B, images per gradient (the same for all K).
    keys: ``[K]`` PRNG keys.
    labels: optional known labels ``[K, B]``.

  Returns:
    ``(K, keys, labels)`` with typed keys and int32 labels (or None).
  """
  leaves = jax.tree_util.tree_leaves(shared_batch)
  if not leaves or any(jnp.ndim(t) < 1 for t in leaves):
    raise ValueError("shared_batch must be gradients stacked on a leading "
                     "axis (leaves [K, ...]).")
  k = int(jnp.shape(leaves[0])[0])
  if k < 1 or any(jnp.shape(t)[0] != k for t in leaves):
    raise ValueError("shared_batch leaves must share one leading axis K >= 1;"
                     f" got {[jnp.shape(t)[0] for t in leaves]}.")
  first = jax.tree_util.tree_map(lambda t: t[0], shared_batch)
  validate_inputs(model, params, first, num_images)
  gradients_lib.check_finite(shared_batch, "shared_batch")
  keys = check_keys(keys, k)
  if labels is None:
    return k, keys, None
  labels = jnp.asarray(labels)
  if labels.shape != (k, int(num_images)) or not jnp.issubdtype(
      labels.dtype, jnp.integer):
    raise ValueError(f"labels must be integer class ids of shape "
                     f"[{k}, {num_images}], got {labels.dtype}{labels.shape}.")
  if bool(jnp.any((labels < 0) | (labels >= model.num_classes))):
    raise ValueError(f"labels must lie in [0, {model.num_classes}).")
  return k, keys, labels.astype(jnp.int32)


def restart_keys(key: jax.Array, restarts: int) -> jax.Array:
  """``[R]`` keys of the restarts: ``split(key, R)``, or ``key`` itself for 1.

  So restart r of a run with key k equals a one-restart run with key
  ``split(k, R)[r]``.
  """
  return key[None] if restarts == 1 else jax.random.split(key, restarts)


def choose_restart(losses: jax.Array,
                   bad: jax.Array) -> tuple[jax.Array, jax.Array]:
  """The kept restart over the last axis, and whether the attack diverged.

  The kept restart has the lowest finite loss among the restarts not flagged
  ``bad`` (diverged): a bad restart or a non-finite loss never wins over a
  good one; when no restart is good, the lowest finite loss wins. The
  attack diverged only when no restart is good (every one is bad or ended
  at a non-finite loss).

  Returns:
    ``(index, diverged)``, both with the shape of ``losses`` less its last
    axis.
  """
  finite = jnp.where(jnp.isfinite(losses), losses, jnp.inf)
  any_good = jnp.any(~bad & jnp.isfinite(losses), axis=-1)
  index = jnp.where(any_good, jnp.argmin(jnp.where(bad, jnp.inf, finite),
                                         axis=-1),
                    jnp.argmin(finite, axis=-1))
  return index, ~any_good


def batch_map(fn: Callable, size: int, in_axes: tuple) -> Callable:
  """``jax.vmap(fn, in_axes)`` over a leading axis of ``size``; for size 1,
  ``fn`` on the squeezed arguments with the outputs expanded (no vmap, so a
  single attack compiles to the same program as an unbatched one)."""
  if size != 1:
    return jax.vmap(fn, in_axes=in_axes)

  def one(*args):
    args = [a if ax is None else jax.tree_util.tree_map(lambda t: t[0], a)
            for a, ax in zip(args, in_axes)]
    return jax.tree_util.tree_map(lambda t: t[None], fn(*args))

  return one


BATCH_AXIS = "attacks"


@functools.lru_cache(maxsize=32)
def _sharded(core: Callable, model: models_lib.Model,
             mesh: jax.sharding.Mesh, static: tuple):
  spec = jax.sharding.PartitionSpec(BATCH_AXIS)
  rep = jax.sharding.PartitionSpec()
  body = lambda params, shared, keys, labels, run_id: core(  # noqa: E731
      model, params, shared, keys, labels, run_id, **dict(static))
  return jax.jit(jax.shard_map(body, mesh=mesh,
                               in_specs=(rep, spec, spec, spec, rep),
                               out_specs=spec, check_vma=False))


def over_devices(core: Callable, model: models_lib.Model, params: Params,
                 shared: Params, keys: jax.Array, labels: jax.Array,
                 run_id: jax.Array, *, progress: bool, **static) -> Any:
  """``core(model, params, shared, keys, labels, run_id, **static)`` on K
  attacks, split over the CPU's host devices when there are several.

  ``core`` runs independent attacks stacked on the leading axis of
  ``shared``, ``keys`` and ``labels`` and returns outputs with that axis.
  With several CPU devices (on request, :mod:`repdef_jax.host`) and no
  ``progress`` reporting (it would report once per device), each device runs
  a share of the K attacks (K padded with copies of the last attack, whose
  results are dropped), in parallel; attack k gives the one-device result
  to float tolerance. Otherwise ``core`` runs as is. A model with the
  default 'auto' convolutions runs them as 'second_order'
  (:mod:`repdef_jax.models`): same numbers to float rounding, 2-4x faster
  attacks on CPU.
  """
  if model is not None:  # Faster second derivatives.
    model = model.with_default_conv_impl("second_order")
  k = keys.shape[0]
  mesh = None if progress else host.cpu_mesh(k, BATCH_AXIS)
  if mesh is None:
    return core(model, params, shared, keys, labels, run_id, **static)
  padded = -(-k // mesh.size) * mesh.size
  pad = lambda t: jnp.concatenate(  # noqa: E731
      [t, jnp.repeat(t[-1:], padded - k, axis=0)]) if padded > k else t
  shared, keys, labels = jax.tree_util.tree_map(pad, (shared, keys, labels))
  out = _sharded(core, model, mesh, tuple(sorted(static.items())))(
      params, shared, keys, labels, run_id)
  return jax.tree_util.tree_map(lambda t: t[:k], out)


def pick(tree: Any, index: jax.Array) -> Any:
  """``tree[m, index[m]]`` leafwise: one entry of axis 1 per row of axis 0."""
  return jax.tree_util.tree_map(
      lambda t: jax.vmap(lambda u, i: u[i])(t, index), tree)


def run_one(run: Callable, model: models_lib.Model, params: Params,
            shared_grads: Params, num_images: int, key: Any,
            labels: jax.Array | None, config: Any) -> AttackResult:
  """One validated attack as a batch of one through ``run(model, params,
  shared_batch, num_images, keys, labels, config)`` (the batched program)."""
  batch = jax.tree_util.tree_map(lambda t: jnp.asarray(t)[None],
                                 shared_grads)
  return squeeze_result(run(
      model, params, batch, int(num_images), check_keys(key)[None],
      None if labels is None else labels[None], config))


def squeeze_result(result: AttackResult) -> AttackResult:
  """The single attack of a batch-of-one result."""
  return AttackResult(*(t[0] for t in result))


def infer_labels(model: models_lib.Model, shared_grads: Params,
                 num_images: int) -> jax.Array:
  """Labels from the defended (last) layer's gradient; jittable.

  One image (iDLG, Zhao et al. 2020): with non-negative features r the
  kernel gradient is ``r (p - y)^T`` (flax layout ``[F, K]``), so its sum
  over F is ``sum(r) (p_k - y_k)``, negative only for the true class: the
  label is the argmin over K of the column sums.

  A batch: the bias gradient ``mean_b (p_b - y_b)`` (untouched by Soteria
  unless ``protect_bias``) is negative for the classes present (else the
  kernel column sums, which weight each image by its feature sum and
  usually have the same signs: when there is no bias or its gradient is all
  zero, e.g. under ``protect_bias``). Those classes, most negative first,
  fill the labels; if fewer classes are negative than images, the rest
  repeat the most negative class.
  Entry k is ``(sum_b p_bk - n_k) / B``, so a present class is found only when
  the model's summed probability for it stays below its count (true for an
  untrained net with small logits; DLG's U(-0.5, 0.5) LeNet can be too
  confident).
  Order is arbitrary: match reconstructions to images with the Hungarian
  method before comparing.

  Args:
    model: the model.
    shared_grads: the gradient the server received.
    num_images: B.

  Returns:
    int32 ``[B]``.
  """
  layer = models_lib.defended_params(model, shared_grads)
  kernel = layer["kernel"]
  col = jnp.sum(kernel.reshape(-1, kernel.shape[-1]), axis=0)
  if num_images == 1:
    return jnp.argmin(col)[None].astype(jnp.int32)
  s = col
  if "bias" in layer:  # A bias gradient zeroed by the defense says nothing.
    s = jnp.where(jnp.any(layer["bias"] != 0), layer["bias"], col)
  order = jnp.argsort(s)
  n_neg = jnp.sum(s < 0)
  idx = jnp.arange(num_images)
  pick = order[jnp.minimum(idx, s.shape[0] - 1)]
  return jnp.where(idx < n_neg, pick, order[0]).astype(jnp.int32)


def tree_select(pred: jax.Array, a: Any, b: Any) -> Any:
  """``a`` where the scalar ``pred`` holds, else ``b``, leafwise."""
  return jax.tree_util.tree_map(lambda u, v: jnp.where(pred, u, v), a, b)


def tree_all_finite(tree: Any) -> jax.Array:
  """Scalar bool: every leaf of ``tree`` is finite."""
  leaves = [jnp.all(jnp.isfinite(t)) for t in jax.tree_util.tree_leaves(tree)]
  return jnp.all(jnp.stack(leaves))


def to_host(result: AttackResult) -> AttackResult:
  """Copies a result to NumPy (and Python bool / float scalars)."""
  return AttackResult(
      x_rec=np.asarray(result.x_rec),
      labels_rec=np.asarray(result.labels_rec),
      loss_history=np.asarray(result.loss_history),
      final_loss=float(result.final_loss),
      diverged=bool(result.diverged),
      iterations=int(result.iterations))
