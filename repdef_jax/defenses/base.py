"""The defense interface: a pure function of what a client holds.

A :class:`Defense` turns the gradient (or model update) a client is about to
share into the one it actually shares. It is a pure, jittable function of

* ``grads``: the gradient pytree (same structure as the parameters);
* ``batch``: a :class:`ClientBatch`, what the client holds: the parameters it
  computed ``grads`` at, its images, labels and an optional example mask;
* ``key``: a PRNG key for randomised defenses (ignored by deterministic ones),

and returns ``(grads, info)`` where ``info`` is a flat dict of scalar
diagnostics (for Soteria the nominal and effective pruned fraction) whose keys
do not depend on the inputs, so a defense can run under ``vmap`` over clients
and ``lax.scan`` over local steps. Defenses compose with :func:`chain`, in the
spirit of ``optax.chain`` (each gets its own key from ``fold_in``).
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp

from repdef_jax.models import check_key  # Re-exported: defenses check keys.

Params = Any
Info = dict[str, jax.Array]


class ClientBatch(NamedTuple):
  """What a client holds when it defends its gradient.

  Attributes:
    params: the parameters the gradient was computed at.
    x: images ``[B, H, W, C]`` (float, the model's input space).
    y: labels ``[B]`` (int) or ``[B, K]`` (soft).
    mask: optional ``[B]``, 1 for real examples and 0 for padding.
  """

  params: Params
  x: jax.Array
  y: jax.Array
  mask: jax.Array | None = None


def check_batch(batch: ClientBatch) -> None:
  """Raises a ValueError unless ``batch`` is a :class:`ClientBatch` whose
  ``y`` and ``mask`` have one entry per image.

  Host-side (shapes are static under ``jit``); defenses that read the
  batch call it so a mismatch is one line, not a broadcasting error.
  """
  if not isinstance(batch, ClientBatch):
    raise ValueError("this defense reads the client's batch: pass batch="
                     "ClientBatch(params, x, y[, mask]); got "
                     f"{type(batch).__name__}.")
  b = batch.x.shape[0] if jnp.ndim(batch.x) else None
  if b is None or jnp.ndim(batch.y) < 1 or batch.y.shape[0] != b:
    raise ValueError(f"batch.y must be [B] or [B, K] with B = {b} (one "
                     f"label per image of x {tuple(jnp.shape(batch.x))}); "
                     f"got shape {tuple(jnp.shape(batch.y))}.")
  if batch.mask is not None and tuple(jnp.shape(batch.mask)) != (b,):
    raise ValueError(f"batch.mask must have shape [B] = ({b},); got shape "
                     f"{tuple(jnp.shape(batch.mask))}.")


class Defense(NamedTuple):
  """A named pure function ``apply(grads, batch, key) -> (grads, info)``.

  Calling the defense runs ``apply`` jitted (one compiled program per
  defense and shapes, compiled on the first call): run eagerly, op by op,
  Soteria's first call on a small LeNet took 4x longer than its compilation
  on a 2-core CPU. ``apply`` itself is the plain function, for use inside
  your own ``jit``, ``vmap`` or ``lax.scan`` (or to run it eagerly).

  Attributes:
    name: the defense's name.
    apply: the pure function.
    recomputes: ``apply`` ignores ``grads`` and computes its own gradient
      from the batch (DP-SGD's clipped per-example gradients): it can only
      defend a local step's gradient (FedAvg's ``defense_at='step'``, where
      the data-independent l2 term is added after it).
  """

  name: str
  apply: Callable[[Params, ClientBatch, jax.Array], tuple[Params, Info]]
  recomputes: bool = False

  def __call__(self, grads: Params, batch: ClientBatch,
               key: jax.Array) -> tuple[Params, Info]:
    check_key(key)
    return jax.jit(self.apply)(grads, batch, key)


def identity() -> Defense:
  """The no-op defense (shares the gradient unchanged)."""
  return Defense("none", lambda grads, batch, key: (grads, {}))


def chain(*defenses: Defense) -> Defense:
  """Applies ``defenses`` in order; info keys are prefixed by position/name.

  Args:
    *defenses: the defenses, first applied first (one alone is wrapped the
      same way, its key ``fold_in(key, 0)``: appending a member never
      changes the noise of those before it).

  Returns:
    A defense whose key for the i-th member is ``fold_in(key, i)``.

  Raises:
    ValueError: a member is not a :class:`Defense`, or one that
      ``recomputes`` is not first.
  """
  for d in defenses:
    check_is_defense(d)
  if not defenses:
    return identity()
  for d in defenses[1:]:
    if d.recomputes:
      raise ValueError(f"defense {d.name!r} computes its own gradient from "
                       "the batch, discarding what the defenses before it "
                       "did: put it first in the chain.")

  def apply(grads, batch, key):
    info = {}
    for i, d in enumerate(defenses):
      grads, sub = d.apply(grads, batch, jax.random.fold_in(key, i))
      info.update({f"{i}_{d.name}/{k}": v for k, v in sub.items()})
    return grads, info

  return Defense("+".join(d.name for d in defenses), apply,
                 recomputes=defenses[0].recomputes)


def check_is_defense(defense: Any) -> None:
  """Raises a ValueError unless ``defense`` is a :class:`Defense`."""
  if not isinstance(defense, Defense):
    raise ValueError(
        "defense must be a repdef_jax Defense (e.g. repdef_jax.defenses."
        "get_defense('soteria', 60, model=model)), got "
        f"{type(defense).__name__}.")


def check_contract(defense: Any, grads: Params, batch: ClientBatch) -> None:
  """Raises a ValueError naming ``defense`` unless it is a :class:`Defense`
  whose ``apply`` returns ``(grads of the same structure and shapes, dict
  of scalars)``; checked on abstract values (``jax.eval_shape``: nothing
  runs), for callers that build a jitted program around it.
  """
  check_is_defense(defense)
  out = jax.eval_shape(
      lambda g, b: defense.apply(g, b, jax.random.key(0)), grads, batch)
  want = (f"defense {defense.name!r} must return (grads, info): the "
          "gradient tree with its shapes and a dict of scalars")
  if not (isinstance(out, tuple) and len(out) == 2):
    raise ValueError(f"{want}; it returned {type(out).__name__}.")
  shapes = lambda t: jax.tree_util.tree_map(jnp.shape, t)
  if (jax.tree_util.tree_structure(out[0]) !=
      jax.tree_util.tree_structure(grads) or shapes(out[0]) != shapes(grads)):
    raise ValueError(f"{want}; its grads differ from the input's in "
                     "structure or shapes.")
  check_info(out[1], want)


def check_info(info: Any, want: str) -> None:
  """Raises ``ValueError(want; ...)`` unless ``info`` is a dict of scalars
  (arrays or abstract values of rank 0)."""
  if not isinstance(info, dict):
    raise ValueError(f"{want}; its info is {type(info).__name__}.")
  bad = [k for k, v in info.items() if jnp.ndim(v) != 0]
  if bad:
    raise ValueError(f"{want}; info entries {bad} are not scalars.")


def zeros_info_like(defense: Defense, grads: Params,
                    batch: ClientBatch) -> Info:
  """An info dict of zeros with the structure ``defense`` returns.

  Useful as the initial carry of a ``lax.scan`` that accumulates info.
  """
  shapes = jax.eval_shape(
      lambda g, b: defense.apply(g, b, jax.random.key(0))[1], grads, batch)
  return jax.tree_util.tree_map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)
