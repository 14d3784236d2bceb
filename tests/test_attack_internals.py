"""Attack internals a user sees through results: torch's L-BFGS curvature
scale, DLG's gradient tolerance over the label logits, progress events'
best restart and running count, GS's reported iterations and box checks."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from repdef_jax import attacks
from repdef_jax import gradients
from repdef_jax import models
from repdef_jax.attacks import lbfgs
from repdef_jax.attacks import objectives
from repdef_jax.attacks import progress

K = 3


@pytest.fixture(scope="module")
def setup():
  """As tests/test_attacks_batch.py: logreg on 8x8 images, K gradients."""
  model = models.get_model("logreg", (8, 8, 1), 4, init="uniform")
  params = model.init(jax.random.key(0))
  xs = jax.random.uniform(jax.random.key(1), (K, 1, 8, 8, 1))
  ys = jnp.arange(K)[:, None] % 4
  grads = jax.vmap(lambda x, y: gradients.batch_grad(model, params, x, y))(
      xs, ys)
  keys = jax.random.split(jax.random.key(2), K)
  return model, params, grads, keys, ys


def _member(tree, k):
  return jax.tree_util.tree_map(lambda t: t[k], tree)


# ------------------------------------------------------------ torch L-BFGS

def _numpy_torch_lbfgs(grad, x0, steps, memory):
  """torch.optim.LBFGS (lr 1, no line search) in NumPy; a rejected pair
  (y^T s <= 1e-10) leaves the history *and* the scale H_diag unchanged."""
  x, s_list, y_list, h_diag = np.array(x0, np.float64), [], [], 1.0
  prev_x = prev_g = None
  out, rejected = [], []
  for it in range(steps):
    g = grad(x)
    if it:
      s, y = x - prev_x, g - prev_g
      ys = y @ s
      if ys > 1e-10:
        if len(s_list) == memory:
          s_list.pop(0), y_list.pop(0)
        s_list.append(s), y_list.append(y)
        h_diag = ys / (y @ y)
      else:
        rejected.append(it)
    q, al = -g, []
    for s, y in zip(reversed(s_list), reversed(y_list)):
      a = (s @ q) / (y @ s)
      al.append(a)
      q = q - a * y
    d = q * h_diag
    for (s, y), a in zip(zip(s_list, y_list), reversed(al)):
      d = d + (a - (y @ d) / (y @ s)) * s
    t = min(1.0, 1.0 / np.abs(g).sum()) if it == 0 else 1.0
    prev_x, prev_g = x, g
    x = x + t * d
    out.append(x)
  return np.array(out), rejected


def test_torch_lbfgs_keeps_the_scale_of_the_newest_stored_pair():
  """A strongly non-convex objective on which a curvature pair is rejected
  (y^T s < 0) mid-run, long before convergence: the iterates still follow
  torch's rule, whose H_diag stays that of the newest *stored* pair."""
  c = np.logspace(-1.0, 1.0, 4)
  f = lambda w: jnp.sum(c * w ** 2) + 2.0 * jnp.sum(jnp.sin(3.0 * w))
  grad_np = lambda w: 2 * c * w + 6.0 * np.cos(3.0 * w)
  x0 = np.linspace(-1.0, 1.5, 4)
  steps, memory = 14, 7
  ref, rejected = _numpy_torch_lbfgs(grad_np, x0, steps, memory)
  assert rejected and rejected[0] < 12, rejected  # The case meant.
  opt = lbfgs.torch_lbfgs(1.0, memory)

  @jax.jit
  def run(w):
    def step(carry, _):
      w, st = carry
      u, st = opt.update(jax.grad(f)(w), st, w)
      return (w + u, st), w + u
    return jax.lax.scan(step, (w, opt.init(w)), None, length=steps)[1]

  ours = np.asarray(run(jnp.asarray(x0, jnp.float32)))
  np.testing.assert_allclose(ours, ref, rtol=2e-3, atol=2e-4)


# ------------------------------------------------------------ DLG stopping

def _dlg_init(model, key, num_classes):
  kx, ky = jax.random.split(key)
  return {"x": jax.random.normal(kx, (1, *model.input_shape), jnp.float32),
          "y": jax.random.normal(ky, (1, num_classes))}


def test_dlg_grad_tol_counts_the_label_logits_gradient(setup):
  """Learned-label DLG stops on grad_tol only when the largest |d loss /
  d dummy| over the image *and* the label logits is <= grad_tol: with
  grad_tol between the two maxima at the start, it must iterate."""
  model, params, grads, keys, _ = setup
  g_ref = _member(grads, 0)

  def loss(z):
    y = jax.nn.softmax(z["y"], axis=-1)
    return objectives.l2_distance(
        gradients.batch_grad(model, params, z["x"], y), g_ref)

  for key in jax.random.split(jax.random.key(7), 20):
    dz = jax.grad(loss)(_dlg_init(model, key, model.num_classes))
    gx, gy = (float(jnp.max(jnp.abs(dz[n]))) for n in ("x", "y"))
    if gy > 4 * gx:
      break
  else:
    pytest.fail("no start with a larger label gradient")
  kw = dict(outer_steps=1, inner_steps=3, tol=0.0)
  res = attacks.get_attack("dlg")(model, params, g_ref, 1, key,
                                  grad_tol=float(np.sqrt(gx * gy)), **kw)
  assert int(res.iterations) >= 1, (gx, gy)  # Not stopped at the start.
  res = attacks.get_attack("dlg")(model, params, g_ref, 1, key,
                                  grad_tol=2 * gy, **kw)
  assert int(res.iterations) == 0


# ---------------------------------------------------------------- progress

@pytest.mark.parametrize("name,overrides", [
    ("dlg", {"outer_steps": 2, "inner_steps": 4, "tol": 0.0,
             "grad_tol": 0.0}),
    ("gs", {"iterations": 8}),
])
def test_progress_events_report_the_best_restart_and_running_count(
    setup, name, overrides):
  """Event.losses is each attack's best (lowest) restart objective and, at
  the final event, equals the result's final_loss; Event.running counts
  the attacks still iterating (all of them until the budget is spent, 0
  once every attack has stopped)."""
  model, params, grads, keys, _ = setup
  events = []
  with progress.reporting(events.append):
    res = attacks.run_batch(name, model, params, grads, 1, keys, restarts=3,
                            progress_every=4, **overrides)
    jax.block_until_ready(res)
  assert [e.iteration for e in events] == [4, 8]
  final = events[-1]
  np.testing.assert_allclose(final.losses, res.final_loss, rtol=1e-6)
  assert final.running == (0 if name == "gs" else K)
  assert events[0].running == K
  # Each restart run alone (restart r of key k is a one-restart run with
  # split(k, 3)[r]): the events hold the lowest objective over restarts,
  # at the end (final_loss) and after 4 iterations (DLG: the loss after
  # them, loss_history[0]; GS: the loss before the 4th step,
  # loss_history[3]).
  alone = [[attacks.get_attack(name)(model, params, _member(grads, k), 1, r,
                                     restarts=1, **overrides)
            for r in jax.random.split(keys[k], 3)] for k in range(K)]
  last = np.array([[float(r.final_loss) for r in row] for row in alone])
  at4 = np.array([[float(r.loss_history[0 if name == "dlg" else 3])
                   for r in row] for row in alone])
  np.testing.assert_allclose(final.losses, last.min(axis=1), rtol=1e-4)
  np.testing.assert_allclose(events[0].losses, at4.min(axis=1), rtol=1e-4)
  # The restarts differ, so taking the min is a real choice.
  assert np.all(last.max(axis=1) > last.min(axis=1) * 1.01)
  assert np.all(at4.max(axis=1) > at4.min(axis=1) * 1.01)


def test_dlg_progress_running_is_zero_when_every_attack_converged(setup):
  model, params, grads, keys, _ = setup
  events = []
  with progress.reporting(events.append):
    res = attacks.run_batch("dlg", model, params, grads, 1, keys,
                            progress_every=2, outer_steps=2, inner_steps=2,
                            tol=1e30)
    jax.block_until_ready(res)
  np.testing.assert_array_equal(res.iterations, 0)
  assert [(e.iteration, e.running, e.final) for e in events] == [
      (0, 0, True)]


# ------------------------------------------------------------------- GS

def test_gs_reports_its_iterations_and_accepts_tv_weight_zero(setup):
  model, params, grads, keys, ys = setup
  g = _member(grads, 0)
  res = attacks.get_attack("gs")(model, params, g, 1, keys[0], labels=ys[0],
                                 iterations=6, restarts=1, tv_weight=0.0)
  assert int(res.iterations) == 6
  dist = objectives.cosine_distance(
      gradients.batch_grad(model, params, res.x_rec, ys[0]), g)
  np.testing.assert_allclose(res.final_loss, dist, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("lower,upper", [(1.0, 1.0), (0.5, 0.0),
                                         ((0.0,), (0.0,))])
def test_gs_box_with_lower_not_below_upper_raises(setup, lower, upper):
  model, params, grads, keys, _ = setup
  with pytest.raises(ValueError, match="lower must be < upper") as err:
    attacks.get_attack("gs")(model, params, _member(grads, 0), 1, keys[0],
                             lower=lower, upper=upper, iterations=2)
  assert "\n" not in str(err.value)


def test_dlg_infinite_thresholds_turn_the_tests_off(setup):
  """diverge_factor / max_abs_pixel = inf are accepted (documented: that
  test is off) and give a run."""
  model, params, grads, keys, _ = setup
  res = attacks.get_attack("idlg")(
      model, params, _member(grads, 0), 1, keys[0], outer_steps=1,
      inner_steps=3, diverge_factor=float("inf"),
      max_abs_pixel=float("inf"))
  assert int(res.iterations) >= 1
