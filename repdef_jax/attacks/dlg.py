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
* Labels: ``labels`` passed to the attack are used as hard labels and only
  the image is optimised, whatever ``infer_label`` says (the paper harness
  passes the true labels to every attack but iDLG: a stronger attacker than
  Zhu et al.'s, which learns a soft label). iDLG's rule reads one image's
  label; for a batch ``infer_label`` uses the bias-gradient heuristic of
  :func:`repdef_jax.attacks.base.infer_labels` (order arbitrary, classes
  present can be missed on a confident model), which is not in the iDLG
  paper.
* Additions (not in the paper): ``restarts`` independent starts in parallel,
  keeping the lowest final loss; ``optimizer='linesearch'``, the same
  directions with a backtracking Armijo search, for settings where plain
  L-BFGS diverges; :func:`dlg_batch` runs K attacks in one program.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from repdef_jax import gradients as gradients_lib
from repdef_jax import models as models_lib
from repdef_jax.attacks import base
from repdef_jax.attacks import lbfgs as lbfgs_lib
from repdef_jax.attacks import objectives
from repdef_jax.attacks import progress

Params = Any


OPTIMIZERS = ("torch", "linesearch", "optax")


@dataclasses.dataclass(frozen=True)
class DLGConfig:
  """DLG / iDLG settings.

  Attributes:
    outer_steps: PyTorch ``step`` calls (300 in DLG).
    inner_steps: L-BFGS iterations per outer step (PyTorch ``max_iter`` 20).
      The budget is ``outer_steps * inner_steps`` gradient evaluations.
    learning_rate: L-BFGS step size (1).
    memory_size: L-BFGS history (100, PyTorch ``history_size``).
    tol: stop once the gradient distance is below this.
    grad_tol: stop once max |d loss / d dummy| is at most this.
    infer_label: iDLG: infer the label from the last layer, optimise only
      the image with that hard label.
    view: which gradient entries to match (adaptive attacks).
    diverge_factor: loss above this times the initial loss = diverged
      (not with ``optimizer='linesearch'``, which backtracks from such a
      step instead).
    max_abs_pixel: an image entry beyond this magnitude = diverged (with
      the line search: the trial step is rejected).
    optimizer: 'torch' (:func:`repdef_jax.attacks.lbfgs.torch_lbfgs`, the
      curvature-safe rule of ``torch.optim.LBFGS`` without line search, as
      the paper), 'linesearch' (the same directions with a backtracking
      Armijo line search: the objective never increases and a non-finite
      trial halves the step instead of ending the run) or 'optax'
      (``optax.lbfgs(lr, memory_size, linesearch=None)``).
    restarts: independent random starts (dummy image and label) run in
      parallel (vmap); the restart with the lowest final objective is kept,
      a diverged one only when every restart diverged.
    max_backtracks: line search: halvings of the step before the run stops
      (the objective cannot be decreased along the direction).
    armijo: line search: sufficient-decrease constant c1.
    progress_every: report progress every this many iterations
      (:mod:`repdef_jax.attacks.progress`); 0: off, no callback compiled.
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
  restarts: int = 1
  max_backtracks: int = 10
  armijo: float = 1e-4
  progress_every: int = 0


def check_config(config: DLGConfig) -> None:
  """Raises a ValueError naming the field when ``config`` cannot run.

  Host-side, before the jitted loop: ``outer_steps``, ``inner_steps``,
  ``memory_size``, ``restarts`` and ``max_backtracks`` must be integers
  >= 1, ``progress_every`` >= 0, ``learning_rate`` a finite number > 0,
  ``tol`` and ``grad_tol`` finite numbers >= 0, ``diverge_factor`` and
  ``max_abs_pixel`` numbers > 0 (inf: that test is off), ``armijo`` in
  (0, 1), ``optimizer`` one of :data:`OPTIMIZERS` and ``view`` a
  :class:`~repdef_jax.attacks.objectives.GradientView`.
  """
  for name in ("outer_steps", "inner_steps", "memory_size", "restarts",
               "max_backtracks"):
    base.check_int(config, name, 1)
  base.check_int(config, "progress_every", 0)
  base.check_number(config, "learning_rate", 0)
  for name in ("tol", "grad_tol"):
    base.check_number(config, name, 0, strict=False)
  for name in ("diverge_factor", "max_abs_pixel"):
    base.check_number(config, name, 0, allow_inf=True)
  base.check_number(config, "armijo", 0, high=1)
  base.check_view(config.view)
  if config.optimizer not in OPTIMIZERS:
    raise ValueError(f"optimizer must be one of {', '.join(OPTIMIZERS)}; got "
                     f"{config.optimizer!r}.")


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
    key: PRNG key for the dummy images and labels (split over restarts).
    labels: known labels ``[B]``; when given only the image is optimised.
    config: :class:`DLGConfig` (defaults if None).

  Returns:
    An :class:`~repdef_jax.attacks.base.AttackResult` (device arrays).

  Raises:
    ValueError: shared_grads does not match params or is not finite, the
      model cannot take the images, a bad config (:func:`check_config`),
      or a view that leaves no gradient entry to match (e.g. ``dlg_drop``
      on ``logreg``, whose only layer is the defended one).
  """
  config = config or DLGConfig()
  check_config(config)
  labels = base.validate_inputs(model, params, shared_grads, num_images,
                                labels)
  base.check_view_keeps_entries(model, shared_grads, config.view)
  return base.run_one(_run, model, params, shared_grads, num_images, key,
                      labels, config)


def dlg_batch(model: models_lib.Model, params: Params, shared_batch: Params,
              num_images: int, keys: jax.Array, *, labels: Any = None,
              config: DLGConfig | None = None) -> base.AttackResult:
  """K independent DLG attacks in one jitted program (see :func:`dlg`).

  Args:
    model: the attacked model.
    params: the parameters every gradient was computed at.
    shared_batch: K gradients stacked on a leading axis.
    num_images: B per gradient.
    keys: ``[K]`` PRNG keys.
    labels: known labels ``[K, B]`` or None.
    config: :class:`DLGConfig`.

  Returns:
    An AttackResult whose every field has a leading axis K; attack k equals
    ``dlg(..., shared_batch[k], keys[k], labels[k])`` to float tolerance.
  """
  config = config or DLGConfig()
  check_config(config)
  _, keys, labels = base.validate_batch(model, params, shared_batch,
                                        num_images, keys, labels)
  base.check_view_keeps_entries(model, shared_batch, config.view, True)
  return _run(model, params, shared_batch, int(num_images), keys, labels,
              config)


def _run(model, params, shared_batch, num_images, keys, labels, config):
  """The validated batch of attacks (labels ``[K, B]`` or None)."""
  mode = "given" if labels is not None else (
      "infer" if config.infer_label else "learn")
  if labels is None:
    labels = jnp.zeros((keys.shape[0], num_images), jnp.int32)
  run_id = (progress.start_run() if config.progress_every
            else jnp.zeros((), jnp.int32))
  return base.over_devices(_dlg_jit, model, params, shared_batch, keys,
                           labels, run_id,
                           progress=bool(config.progress_every),
                           num_images=num_images, mode=mode, config=config)


def _optimizer(config: DLGConfig) -> optax.GradientTransformation:
  if config.optimizer == "optax":
    return optax.lbfgs(learning_rate=config.learning_rate,
                       memory_size=config.memory_size, linesearch=None)
  return lbfgs_lib.torch_lbfgs(config.learning_rate, config.memory_size)


class _Run(NamedTuple):
  """The state of one restart of one attack."""

  z: Any  # {'x': image, 'y': label logits (learned labels only)}
  opt_state: Any
  loss: jax.Array
  grad: Any
  direction: Any  # line search: the step to try at t = 1
  t: jax.Array  # line search: the current trial step
  backtracks: jax.Array
  fresh: jax.Array  # line search: the memory was just reset
  loss0: jax.Array
  done: jax.Array
  bad: jax.Array
  n: jax.Array
  hist: jax.Array


def _tree_max_abs(tree):
  return jnp.max(jnp.stack([jnp.max(jnp.abs(t))
                            for t in jax.tree_util.tree_leaves(tree)]))


def _tree_vdot(a, b):
  return sum(jnp.vdot(u, v) for u, v in zip(jax.tree_util.tree_leaves(a),
                                            jax.tree_util.tree_leaves(b)))


@functools.partial(jax.jit,
                   static_argnames=("model", "num_images", "mode", "config"))
def _dlg_jit(model, params, shared, keys, labels, run_id, *, num_images, mode,
             config):
  """K attacks x R restarts; ``mode`` is 'learn', 'infer' or 'given' labels.

  One ``lax.while_loop`` whose counter is shared by every attack and restart
  (so progress is reported once per batch); each (attack, restart) stops
  when it converges or diverges and is frozen from then on.
  """
  num, restarts = keys.shape[0], config.restarts
  total = config.outer_steps * config.inner_steps
  linesearch = config.optimizer == "linesearch"
  opt = _optimizer(config)
  if mode == "infer":
    labels = jax.vmap(
        lambda g: base.infer_labels(model, g, num_images))(shared)
  weights = None if config.view.is_plain else jax.vmap(
      lambda g: objectives.view_weights(model, g, config.view))(shared)

  def loss_fn(z, g_ref, w, lab):
    y = jax.nn.softmax(z["y"], axis=-1) if mode == "learn" else lab
    g = gradients_lib.batch_grad(model, params, z["x"], y)
    return objectives.gradient_distance("l2", g, g_ref, w)

  value_and_grad = jax.value_and_grad(loss_fn)

  def converged(loss, grad):
    return (loss < config.tol) | (_tree_max_abs(grad) <= config.grad_tol)

  def init(key, g_ref, w, lab):
    kx, ky = jax.random.split(key)
    z = {"x": jax.random.normal(kx, (num_images, *model.input_shape),
                                jnp.float32)}
    if mode == "learn":
      z["y"] = jax.random.normal(ky, (num_images, model.num_classes))
    loss, grad = value_and_grad(z, g_ref, w, lab)
    state = opt.init(z)
    direction = jax.tree_util.tree_map(jnp.zeros_like, z)
    if linesearch:
      direction, state = opt.update(grad, state, z)
    return _Run(z, state, loss, grad, direction, jnp.ones(()),
                jnp.zeros((), jnp.int32), jnp.array(True), loss,
                converged(loss, grad),
                jnp.array(False), jnp.zeros((), jnp.int32),
                jnp.full((config.outer_steps,), jnp.nan, jnp.float32))

  def step(i, run, g_ref, w, lab):
    z, loss, grad = run.z, run.loss, run.grad
    if linesearch:
      new_z = jax.tree_util.tree_map(lambda a, d: a + run.t * d, z,
                                     run.direction)
    else:
      updates, new_state = opt.update(grad, run.opt_state, z)
      new_z = optax.apply_updates(z, updates)
    new_loss, new_grad = value_and_grad(new_z, g_ref, w, lab)
    sane = (jnp.isfinite(new_loss) & base.tree_all_finite(new_grad)
            & base.tree_all_finite(new_z)
            & (jnp.max(jnp.abs(new_z["x"])) <= config.max_abs_pixel))
    if linesearch:
      slope = jnp.minimum(_tree_vdot(grad, run.direction), 0.0)
      accept = sane & (new_loss <= loss + config.armijo * run.t * slope)
      direction, new_state = opt.update(new_grad, run.opt_state, new_z)
      backtracks = jnp.where(accept, 0, run.backtracks + 1)
      # No decrease along the L-BFGS direction: forget the curvature pairs
      # and restart from a (scaled) gradient step; stop if that fails too.
      reset = backtracks > config.max_backtracks
      stalled = reset & run.fresh
      reset_dir, reset_state = opt.update(grad, opt.init(z), z)
      run = run._replace(
          direction=base.tree_select(
              accept, direction,
              base.tree_select(reset, reset_dir, run.direction)),
          opt_state=base.tree_select(reset, reset_state, run.opt_state),
          t=jnp.where(accept | reset, 1.0, 0.5 * run.t),
          backtracks=jnp.where(reset, 0, backtracks),
          fresh=jnp.where(accept, False, run.fresh | reset))
      bad = jnp.array(False)
    else:
      accept = sane & (new_loss <= config.diverge_factor
                       * jnp.maximum(run.loss0, 1e-30))
      stalled = bad = ~accept
    z, state, loss, grad = base.tree_select(
        accept, (new_z, new_state, new_loss, new_grad),
        (z, run.opt_state, loss, grad))
    new_run = run._replace(
        z=z, opt_state=state, loss=loss, grad=grad,
        done=stalled | converged(loss, grad), bad=bad, n=run.n + 1,
        hist=run.hist.at[i // config.inner_steps].set(loss))
    return base.tree_select(run.done, run, new_run)

  over_restarts = lambda f, ax: base.batch_map(f, restarts, ax)
  init_all = base.batch_map(over_restarts(init, (0, None, None, None)), num,
                            (0, 0, 0, 0))
  step_all = base.batch_map(
      over_restarts(step, (None, 0, None, None, None)), num,
      (None, 0, 0, 0, 0))
  rkeys = jax.vmap(lambda k: base.restart_keys(k, restarts))(keys)
  runs = init_all(rkeys, shared, weights, labels)

  def report(i, runs, final=False):
    losses = jnp.min(jnp.where(runs.bad, jnp.inf, runs.loss), axis=1)
    progress.emit(config.progress_every, "dlg", total, run_id, i, losses,
                  jnp.sum(jnp.any(~runs.done, axis=1)), final)

  report(0, runs)

  def body(carry):
    i, runs = carry
    return i + 1, step_all(i, runs, shared, weights, labels)

  def loop(carry, end):
    return jax.lax.while_loop(
        lambda c: (c[0] < end) & ~jnp.all(c[1].done), body, carry)

  if config.progress_every:
    # Chunks of progress_every iterations with a report between them: no
    # per-iteration branch (a cond in the body costs ~5 % on CPU).
    def chunk(carry):
      i, runs = loop(carry, jnp.minimum(carry[0] + config.progress_every,
                                        total))
      report(i, runs)  # Skipped unless i is a multiple of progress_every.
      return i, runs

    i, runs = jax.lax.while_loop(
        lambda c: (c[0] < total) & ~jnp.all(c[1].done), chunk, (0, runs))
  else:
    i, runs = loop((0, runs), total)
  report(i, runs, final=True)
  best, diverged = base.choose_restart(runs.loss, runs.bad)
  run = base.pick(runs, best)
  hist = jnp.where(jnp.isnan(run.hist), run.loss[:, None], run.hist)
  if mode == "learn":
    labels = jnp.argmax(run.z["y"], axis=-1).astype(jnp.int32)
  return base.AttackResult(x_rec=run.z["x"], labels_rec=labels,
                           loss_history=hist, final_loss=run.loss,
                           diverged=diverged, iterations=run.n)
