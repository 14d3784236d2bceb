"""Tests of repdef_jax.attacks: objectives, DLG / iDLG, GS, adaptive views."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from repdef_jax import attacks
from repdef_jax import defenses
from repdef_jax import gradients
from repdef_jax import metrics
from repdef_jax import models
from repdef_jax.attacks import inverting
from repdef_jax.attacks import lbfgs
from repdef_jax.attacks import objectives

batch_grad = jax.jit(gradients.batch_grad, static_argnums=0)


def smooth_image(shape, seed=0):
  rng = np.random.default_rng(seed)
  h, w, c = shape
  yy, xx = np.mgrid[0:h, 0:w] / max(h, w)
  chans = [0.5 + 0.4 * np.sin(2 * np.pi * (xx * rng.uniform(0.5, 1.5) + p))
           * np.cos(2 * np.pi * yy * rng.uniform(0.5, 1.5))
           for p in rng.uniform(0, 1, c)]
  return jnp.asarray(np.stack(chans, -1)[None], jnp.float32)


@pytest.fixture(scope="module")
def lenet_setup():
  model = models.get_model("lenet", (28, 28, 1), 10, init="uniform")
  params = model.init(jax.random.key(0))
  x = smooth_image(model.input_shape)
  y = jnp.array([3])
  grads = batch_grad(model, params, x, y)
  return model, params, x, y, grads


def _tree(seed, shapes=((3, 4), (4,), (5, 2))):
  keys = jax.random.split(jax.random.key(seed), len(shapes))
  return {f"t{i}": jax.random.normal(k, s) for i, (k, s) in
          enumerate(zip(keys, shapes))}


# ----------------------------------------------------------------- objectives

def test_l2_distance_is_summed_squares():
  a, b = _tree(0), _tree(1)
  want = sum(float(jnp.sum((a[k] - b[k]) ** 2)) for k in a)
  np.testing.assert_allclose(objectives.l2_distance(a, b), want, rtol=1e-6)
  assert float(objectives.l2_distance(a, a)) == 0.0


def test_cosine_distance_invariant_to_scale():
  a, b = _tree(0), _tree(1)
  d = objectives.cosine_distance(a, b)
  for s in (1e-3, 2.0, 1e4):
    scaled = jax.tree_util.tree_map(lambda t: s * t, a)
    np.testing.assert_allclose(objectives.cosine_distance(scaled, b), d,
                               rtol=1e-5)
  np.testing.assert_allclose(objectives.cosine_distance(a, a), 0.0, atol=1e-6)
  neg = jax.tree_util.tree_map(lambda t: -t, a)
  np.testing.assert_allclose(objectives.cosine_distance(neg, a), 2.0,
                             rtol=1e-6)


def test_cosine_distance_of_a_zero_gradient_is_one_with_finite_derivative():
  a, zero = _tree(0), jax.tree_util.tree_map(jnp.zeros_like, _tree(0))
  assert float(objectives.cosine_distance(zero, a)) == 1.0
  assert float(objectives.cosine_distance(zero, zero)) == 1.0
  for ref in (a, zero):
    d = jax.grad(objectives.cosine_distance)(zero, ref)
    assert all(np.all(np.isfinite(t)) for t in jax.tree_util.tree_leaves(d))


def test_total_variation_hand_computed():
  x = jnp.array([[0., 1., 3.], [2., 2., 2.]])[None, :, :, None]  # [1,2,3,1]
  # |dx|: row 0: 1, 2; row 1: 0, 0 -> mean 0.75.  |dy|: 2, 1, 1 -> mean 4/3.
  np.testing.assert_allclose(objectives.total_variation(x), 0.75 + 4 / 3,
                             rtol=1e-6)
  np.testing.assert_allclose(objectives.total_variation(x[0]), 0.75 + 4 / 3,
                             rtol=1e-6)


def _pruned(model, grads, rows):
  k = grads["head"]["kernel"].at[jnp.asarray(rows)].set(0.0)
  return {**grads, "head": {**grads["head"], "kernel": k}}


@pytest.mark.parametrize("kind", ["l2", "cosine"])
def test_mask_view_equals_plain_objective_on_masked_gradients(lenet_setup,
                                                              kind):
  model, params, x, _, grads = lenet_setup
  rows = np.arange(0, model.num_features, 3)
  shared = _pruned(model, grads, rows)
  trial = batch_grad(model, params, x * 0.5, jnp.array([1]))
  w = objectives.view_weights(model, shared,
                              objectives.GradientView(mask_from_shared=True))
  got = objectives.gradient_distance(kind, trial, shared, w)
  want = objectives.gradient_distance(kind, _pruned(model, trial, rows),
                                      shared)
  np.testing.assert_allclose(got, want, rtol=1e-5)
  # The mask is read off the shared gradient alone.
  np.testing.assert_array_equal(
      np.where(objectives.pruned_rows(model, shared))[0], rows)


def test_mask_view_keeps_rows_with_only_some_zero_entries(lenet_setup):
  """Only an all-zero row of the shared defended kernel is pruned: a row
  with a single exact zero (a class whose gradient entry vanished) keeps
  its weights."""
  model, _, _, _, grads = lenet_setup
  shared = _pruned(model, grads, [0, 3])
  kernel = shared["head"]["kernel"].at[1, 0].set(0.0).at[2, 1:].set(0.0)
  shared = {**shared, "head": {**shared["head"], "kernel": kernel}}
  np.testing.assert_array_equal(
      np.where(objectives.pruned_rows(model, shared))[0], [0, 3])
  w = objectives.view_weights(model, shared,
                              objectives.GradientView(mask_from_shared=True))
  keep = np.ones(model.num_features)
  keep[[0, 3]] = 0.0
  np.testing.assert_array_equal(
      w["head"]["kernel"], np.broadcast_to(keep[:, None], kernel.shape))


@pytest.mark.parametrize("kind", ["l2", "cosine"])
@pytest.mark.parametrize("drop_bias", [True, False])
def test_drop_view_equals_objective_without_head(lenet_setup, kind,
                                                 drop_bias):
  model, params, x, _, grads = lenet_setup
  trial = batch_grad(model, params, x * 0.5, jnp.array([1]))
  view = objectives.GradientView(drop_defended=True, drop_bias=drop_bias)
  w = objectives.view_weights(model, grads, view)
  got = objectives.gradient_distance(kind, trial, grads, w)

  def strip(g):
    g = dict(g)
    head = g.pop("head")
    if not drop_bias:
      g["head_bias"] = head["bias"]
    return g

  want = objectives.gradient_distance(kind, strip(trial), strip(grads))
  np.testing.assert_allclose(got, want, rtol=1e-5)


# ----------------------------------------------------------------- DLG / iDLG

def test_idlg_label_inference(lenet_setup):
  model, params, x, _, _ = lenet_setup
  for label in range(10):
    g = batch_grad(model, params, x, jnp.array([label]))
    assert int(attacks.infer_labels(model, g, 1)[0]) == label


def test_batch_label_inference_finds_present_classes(lenet_setup):
  # Needs sum_b p_bk < 1 for each present class k: an untrained net with
  # small logits (default init), not DLG's U(-0.5, 0.5) one.
  _, _, x, _, _ = lenet_setup
  model = models.get_model("lenet", (28, 28, 1), 10)
  params = model.init(jax.random.key(0))
  xs = jnp.concatenate([x, 1 - x, x * 0.3])
  g = batch_grad(model, params, xs, jnp.array([2, 7, 5]))
  assert sorted(np.asarray(attacks.infer_labels(model, g, 3))) == [2, 5, 7]
  # The same batch under Soteria with protect_bias (bias gradient zeroed).
  shared, _ = defenses.soteria_defense(model, 60.0, protect_bias=True)(
      g, defenses.ClientBatch(params, xs, jnp.array([2, 7, 5])),
      jax.random.key(1))
  assert not np.any(np.asarray(models.defended_params(model, shared)["bias"]))
  assert sorted(np.asarray(attacks.infer_labels(model, shared, 3))) == [
      2, 5, 7]
  # Fewer classes than images: the extra images repeat the most negative
  # class (here the one present twice), never a class the batch lacks.
  for labels in ([2, 2, 7], [1, 1, 1, 4]):
    n = len(labels)
    g = batch_grad(model, params, jnp.concatenate([xs, x * 0.6])[:n],
                   jnp.array(labels))
    got = np.asarray(attacks.infer_labels(model, g, n))
    assert sorted(got) == sorted(labels), (labels, got)
    bias = np.asarray(models.defended_params(model, g)["bias"])
    assert np.sum(got == np.argmin(bias)) == n - len(set(labels)) + 1


def test_batch_label_inference_reads_the_bias_not_the_kernel():
  """A batch's labels come from the bias gradient where the layer has one
  (the documented rule), even where the kernel's column sums disagree."""
  model = models.get_model("lenet", (28, 28, 1), 10)
  g = jax.tree_util.tree_map(jnp.zeros_like, model.init(jax.random.key(0)))
  head = models.defended_params(model, g)
  kernel = head["kernel"].at[:, jnp.array([1, 3])].set(-1.0)
  bias = head["bias"].at[jnp.array([2, 7])].set(-1.0)
  name = model.defended_path[-1]
  g = {**g, name: {**g[name], "kernel": kernel, "bias": bias}}
  assert sorted(np.asarray(attacks.infer_labels(model, g, 2))) == [2, 7]
  # A zeroed bias gradient (Soteria's protect_bias) says nothing: the kernel
  # column sums decide (they used to give class 0 for every image).
  g = {**g, name: {**g[name], "bias": jnp.zeros_like(bias)}}
  assert sorted(np.asarray(attacks.infer_labels(model, g, 2))) == [1, 3]


# Threshold: an undefended single-image attack (DLG's objective, torch-style
# L-BFGS, 25 x 20 = 500 iterations) brings the clamped [0, 1] MSE below 1e-4
# (PSNR > 40 dB); observed ~1e-7 with iDLG's inferred label, ~6e-8 with
# plain DLG, which learns the soft label with the image.
@pytest.mark.parametrize("name", ["idlg", "dlg"])
def test_undefended_image_reconstructed_nearly_exactly(lenet_setup, name):
  model, params, x, y, grads = lenet_setup
  res = attacks.get_attack(name)(model, params, grads, 1, jax.random.key(1),
                                 outer_steps=25)
  assert not bool(res.diverged)
  assert int(res.labels_rec[0]) == int(y[0])
  assert float(metrics.mse_clamped(res.x_rec, x)[0]) < 1e-4
  assert res.loss_history.shape == (25,)
  assert float(res.loss_history[-1]) < float(res.loss_history[0])


def _logreg_setup():
  model = models.get_model("logreg", (4, 4, 1), 3, init="uniform")
  params = model.init(jax.random.key(0))
  x = jax.random.uniform(jax.random.key(1), (1, 4, 4, 1))
  return model, params, batch_grad(model, params, x, jnp.array([1]))


def test_dlg_optax_lbfgs_is_selectable():
  model, params, grads = _logreg_setup()
  kw = dict(outer_steps=2, inner_steps=5)
  res = {opt: attacks.get_attack("idlg")(model, params, grads, 1,
                                         jax.random.key(1), optimizer=opt,
                                         **kw)
         for opt in ("torch", "optax")}
  for r in res.values():
    assert not bool(r.diverged) and int(r.iterations) == 10
    assert np.all(np.isfinite(np.asarray(r.loss_history)))
  # Different step rules (optax stores every curvature pair): different runs.
  assert float(res["optax"].final_loss) != float(res["torch"].final_loss)


@pytest.mark.parametrize("scale,overrides,finite_loss", [
    (1.0, {"diverge_factor": 1e-6}, True),  # Every step rejected.
    (1e25, {}, False),  # Squared distances overflow: a non-finite loss.
])
def test_dlg_divergence_stops_and_keeps_the_last_sane_iterate(
    scale, overrides, finite_loss):
  model, params, grads = _logreg_setup()
  grads = jax.tree_util.tree_map(lambda t: t * scale, grads)
  cfg = attacks.DLGConfig(outer_steps=2, inner_steps=3, **overrides)
  res = attacks.dlg_attack(model, params, grads, 1, jax.random.key(1),
                           config=cfg)
  assert bool(res.diverged) and int(res.iterations) == 1
  assert np.all(np.isfinite(np.asarray(res.x_rec)))
  assert np.isfinite(float(res.final_loss)) == finite_loss
  # No step was accepted: the loss never moved from the initial one.
  np.testing.assert_array_equal(res.loss_history,
                                np.full(2, float(res.final_loss)))


def test_gs_non_finite_objective_is_reported_as_diverged():
  model, params, grads = _logreg_setup()
  big = jax.tree_util.tree_map(lambda t: t * 1e25, grads)
  res = attacks.get_attack("gs")(model, params, big, 1, jax.random.key(1),
                                 iterations=5, restarts=1)
  assert bool(res.diverged)


def test_dlg_diverged_is_reported_not_raised():
  model = models.get_model("logreg", (4, 4, 1), 3, init="uniform")
  params = model.init(jax.random.key(0))
  grads = batch_grad(model, params, jnp.ones((1, 4, 4, 1)), jnp.array([1]))
  res = attacks.dlg_attack(model, params, grads, 1, jax.random.key(1),
                    config=attacks.DLGConfig(outer_steps=2,
                                             max_abs_pixel=1e-3))
  assert bool(res.diverged)
  assert np.all(np.isfinite(np.asarray(res.x_rec)))


def test_dlg_gradient_tolerance_reads_the_largest_absolute_entry():
  """grad_tol is compared with max |d loss / d dummy| over every leaf (a
  gradient with large negative entries has not converged)."""
  tree = {"x": jnp.array([[-3.0, 1e-9]]), "y": jnp.array([-2.0, 0.5])}
  assert float(attacks.dlg._tree_max_abs(tree)) == 3.0


def test_torch_lbfgs_minimises_quadratic():
  a = jnp.diag(jnp.arange(1.0, 6.0))
  f = lambda p: 0.5 * p["w"] @ a @ p["w"] - jnp.sum(p["w"])
  opt = lbfgs.torch_lbfgs(1.0, 10)

  @jax.jit
  def solve(p):
    def step(carry, _):
      p, s = carry
      u, s = opt.update(jax.grad(f)(p), s, p)
      return (jax.tree_util.tree_map(jnp.add, p, u), s), None
    return jax.lax.scan(step, (p, opt.init(p)), None, length=15)[0][0]

  p = solve({"w": jnp.zeros(5)})
  np.testing.assert_allclose(p["w"], 1.0 / jnp.arange(1.0, 6.0), atol=1e-4)


def _numpy_torch_lbfgs_steps(grad, x0, steps, memory):
  """torch.optim.LBFGS's rule (lr 1, no line search), written out in NumPy:
  pairs kept when y^T s > 1e-10, oldest dropped past ``memory``; a rejected
  pair keeps the history and H_diag. Returns the iterates and the steps whose
  pair was rejected."""
  x, s_list, y_list, h_diag = np.array(x0, np.float64), [], [], 1.0
  prev_x = prev_g = None
  out = []
  rejected = []
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


@pytest.mark.parametrize("dim, amplitude, memory, steps, rejects", [
    (20, 0.3, 7, 21, False), (20, 0.3, 13, 39, False), (4, 2.0, 7, 14, True)])
def test_torch_lbfgs_follows_the_torch_rule(dim, amplitude, memory, steps,
                                            rejects):
  """Every iterate equals the NumPy rule's: while the ring buffer fills and
  after it wraps (16-19 pairs stored; memories that are not multiples of the
  loop's unroll), and on a strongly non-convex objective where a curvature
  pair is rejected (y^T s < 0) long before convergence, after which torch's
  H_diag stays that of the newest *stored* pair."""
  c = np.logspace(-1.0, 1.0, dim)
  f = lambda w: (jnp.sum(c * w ** 2) +
                 amplitude * jnp.sum(jnp.sin(3.0 * w)))
  grad_np = lambda w: 2 * c * w + 3.0 * amplitude * np.cos(3.0 * w)
  x0 = np.linspace(-1.0, 1.5, dim)
  ref, rejected = _numpy_torch_lbfgs_steps(grad_np, x0, steps, memory)
  if rejects:  # The case meant: a pair rejected mid-run.
    assert rejected and rejected[0] < steps - 2, rejected
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


# ----------------------------------------------------------------- GS

def test_gs_reconstructs_on_small_model():
  model = models.get_model("lenet", (16, 16, 1), 10, init="uniform")
  params = model.init(jax.random.key(0))
  x = smooth_image(model.input_shape, 1)
  g = batch_grad(model, params, x, jnp.array([4]))
  res = attacks.get_attack("gs")(model, params, g, 1, jax.random.key(2),
                                 iterations=200, restarts=2)
  noise = jax.random.uniform(jax.random.key(3), x.shape)
  assert int(res.labels_rec[0]) == 4  # inferred
  assert not bool(res.diverged)
  p_rec, p_noise = metrics.psnr(res.x_rec, x)[0], metrics.psnr(noise, x)[0]
  assert p_rec > p_noise + 8.0, (p_rec, p_noise)
  assert float(res.x_rec.min()) >= 0.0 and float(res.x_rec.max()) <= 1.0


def test_gs_unrolling_the_local_steps_beats_one_gradient_on_an_update():
  # What a client shares after 5 local steps (Geiping et al. Sec. 6): the
  # attack that unrolls them reconstructs much closer (PSNR, [0, 1] pixels)
  # than the one that matches a single gradient, at the same iterations.
  model = models.get_model("mlp", (16, 16, 1), 10)
  params = model.init(jax.random.key(0))
  x, y = smooth_image(model.input_shape, 1), jnp.array([4])
  steps, lr = 5, 0.1
  update = gradients.local_update_direction(model, params, x, y, steps, lr)
  gs = attacks.get_attack("gs")
  kw = dict(labels=y, iterations=200, restarts=2)
  plain = gs(model, params, update, 1, jax.random.key(2), **kw)
  unrolled = gs(model, params, update, 1, jax.random.key(2), local_steps=steps,
                local_lr=lr, **kw)
  p_plain = float(metrics.psnr(plain.x_rec, x)[0])
  p_unrolled = float(metrics.psnr(unrolled.x_rec, x)[0])
  assert p_unrolled > 30.0 and p_unrolled > p_plain + 5.0, (p_unrolled,
                                                            p_plain)
  with pytest.raises(ValueError, match="local_lr"):
    gs(model, params, update, 1, jax.random.key(2), local_steps=steps, **kw)


def test_gs_box_from_normalization():
  box = attacks.box_from_normalization((0.5, 0.5), (0.25, 0.5))
  assert box == {"lower": (-2.0, -1.0), "upper": (2.0, 1.0)}
  # The reconstruction lies in the per-channel box (and reaches past the
  # other channel's bounds, so the box is applied per channel); a list or
  # NumPy box is read as the tuple.
  model = models.get_model("logreg", (4, 4, 2), 3, init="uniform")
  params = model.init(jax.random.key(0))
  x = jax.random.uniform(jax.random.key(1), (1, 4, 4, 2), minval=-2.0,
                         maxval=2.0) * jnp.array([1.0, 0.5])
  g = batch_grad(model, params, x, jnp.array([1]))
  gs = attacks.get_attack("gs")
  kw = dict(iterations=10, restarts=1)
  res = gs(model, params, g, 1, jax.random.key(2), **box, **kw)
  x_rec = np.asarray(res.x_rec)
  assert not bool(res.diverged)
  for c in range(2):
    assert box["lower"][c] <= x_rec[..., c].min(), c
    assert x_rec[..., c].max() <= box["upper"][c], c
  assert np.abs(x_rec[..., 0]).max() > 1.0  # Outside channel 1's box.
  as_arrays = gs(model, params, g, 1, jax.random.key(2),
                 lower=list(box["lower"]), upper=np.asarray(box["upper"]),
                 **kw)
  np.testing.assert_array_equal(as_arrays.x_rec, res.x_rec)


def test_gs_step_schedule_decays_tenfold_at_three_five_seven_eighths():
  """lr until floor(3/8 T), then lr / 10, lr / 100 from floor(5/8 T) and
  lr / 1000 from floor(7/8 T) (close to inversefed's, which divide T by
  2.667, 1.6 and 1.142); milestones that coincide multiply their decays."""
  sched = inverting.step_schedule(0.2, 800)  # Milestones 300, 500, 700.
  steps = [0, 299, 300, 499, 500, 699, 700, 799]
  want = [0.2, 0.2, 0.02, 0.02, 2e-3, 2e-3, 2e-4, 2e-4]
  np.testing.assert_allclose([float(sched(s)) for s in steps], want,
                             rtol=1e-6)
  sched = inverting.step_schedule(0.2, 5)  # 1.875, 3.125, 4.375: 1, 3, 4.
  np.testing.assert_allclose([float(sched(s)) for s in range(5)],
                             [0.2, 0.02, 0.02, 2e-3, 2e-4], rtol=1e-6)
  sched = inverting.step_schedule(0.2, 2)  # 0.75, 1.25, 1.75: 0, 1, 1.
  np.testing.assert_allclose([float(sched(s)) for s in range(2)],
                             [0.02, 2e-4], rtol=1e-6)


@pytest.mark.parametrize("normalization", [None, (0.4, 0.3)])
def test_gs_iterates_are_signed_adam_steps_clipped_to_the_box(normalization):
  """Five GS iterations equal the rule re-run step by step with NumPy's
  Adam (b1 0.9, b2 0.999, eps 1e-8) fed the sign of the objective's
  gradient (cosine distance + tv_weight TV), the step size of the
  schedule (lr, lr/10, lr/10, lr/100, lr/1000 over 5 iterations) and a
  clip into [0, 1] after each step. The run reuses the program of
  test_gs_non_finite_objective_is_reported_as_diverged; Adam on the raw
  gradient, a constant step size or no clip give other iterates. With
  ``normalization=(m, s)`` the same rule runs on z, the model sees
  ``m + s z``, TV is of z and the box is [0, 1] mapped into z."""
  model, params, grads = _logreg_setup()
  key = jax.random.key(1)
  cfg = attacks.GSConfig()
  kw = {} if normalization is None else {"normalization": normalization}
  res = attacks.get_attack("gs")(model, params, grads, 1, key, iterations=5,
                                 restarts=1, **kw)
  y = jnp.array([1])
  assert int(res.labels_rec[0]) == 1 and not bool(res.diverged)
  m0, s0 = normalization or (0.0, 1.0)

  @jax.jit
  def value_and_grad(z):
    def objective(z):
      g = gradients.batch_grad(model, params, m0 + s0 * z, y)
      return (objectives.cosine_distance(g, grads)
              + cfg.tv_weight * objectives.total_variation(z))
    return jax.value_and_grad(objective)(z)

  x = jax.random.normal(key, res.x_rec.shape)  # One restart: the key itself.
  m = v = np.zeros(x.shape)
  losses = []
  for t, scale in enumerate([1.0, 0.1, 0.1, 0.01, 1e-3], 1):
    loss, g = value_and_grad(x)
    losses.append(float(loss))
    s = np.sign(np.asarray(g, np.float64))
    m, v = 0.9 * m + 0.1 * s, 0.999 * v + 0.001 * s * s
    step = (cfg.learning_rate * scale * (m / (1 - 0.9 ** t))
            / (np.sqrt(v / (1 - 0.999 ** t)) + 1e-8))
    x = jnp.asarray(np.clip(np.asarray(x, np.float64) - step, -m0 / s0,
                            (1 - m0) / s0), jnp.float32)
  # z's float32 box ((0 - m) / s) and x = m + s z round differently from
  # this float64 replay: 1e-4 there (a wrong rule differs by far more).
  rtol = 1e-5 if normalization is None else 1e-4
  np.testing.assert_allclose(res.loss_history, losses, rtol=rtol)
  np.testing.assert_allclose(res.x_rec, m0 + s0 * x, atol=rtol / 10)
  np.testing.assert_allclose(res.final_loss, value_and_grad(x)[0], rtol=rtol)


def test_gs_normalization_checks_and_identity():
  """(0, 1) is the pixel-space attack, bit for bit; bad stats are one line
  naming the field."""
  model, params, grads = _logreg_setup()
  gs = attacks.get_attack("gs")
  kw = dict(iterations=5, restarts=1)
  plain = gs(model, params, grads, 1, jax.random.key(1), **kw)
  same = gs(model, params, grads, 1, jax.random.key(1),
            normalization=((0.0,), (1.0,)), **kw)
  np.testing.assert_array_equal(plain.x_rec, same.x_rec)
  for bad, match in (((0.5,), "normalization must be"),
                     ((0.5, 0.0), "stds > 0"),
                     ((0.5, (0.2, 0.3)), "normalization std has 2 values"),
                     ("ms", "normalization must be")):
    with pytest.raises(ValueError, match=match):
      gs(model, params, grads, 1, jax.random.key(1), normalization=bad, **kw)


# ----------------------------------------------------------------- API, errors

def test_registry_and_variants():
  assert set(attacks.ATTACK_NAMES) == {"dlg", "idlg", "gs", "dlg_drop",
                                       "gs_drop", "dlg_mask", "gs_mask"}
  with pytest.raises(ValueError, match="valid names: dlg"):
    attacks.get_attack("nope")
  cfg = attacks.get_attack("gs_mask").make_config(iterations=5)
  assert cfg.view.mask_from_shared and cfg.iterations == 5
  cfg = attacks.get_attack("dlg_drop").make_config(attacks.DLGConfig())
  assert cfg.view.drop_defended
  with pytest.raises(ValueError, match="GSConfig"):
    attacks.get_attack("gs").make_config(attacks.DLGConfig())


def test_variants_fix_their_settings_without_overwriting_the_users():
  view = objectives.GradientView
  # Defaults: the variants' views and iDLG's inferred label.
  assert attacks.get_attack("dlg_drop").make_config().view == view(
      drop_defended=True)
  assert attacks.get_attack("gs_mask").make_config().view == view(
      mask_from_shared=True)
  assert attacks.get_attack("idlg").make_config().infer_label
  # What a variant does not fix stays the user's: drop only the kernel.
  for name in ("dlg_drop", "gs_drop"):
    for v in (view(drop_bias=False), view(drop_defended=True,
                                          drop_bias=False)):
      cfg = attacks.get_attack(name).make_config(view=v)
      assert cfg.view == view(drop_defended=True, drop_bias=False)
  # A user setting that contradicts a fixed one raises, naming it.
  for name, kw, field in (
      ("idlg", {"infer_label": False}, "infer_label"),
      ("gs_mask", {"view": view(drop_defended=True)}, "view.drop_defended"),
      ("dlg_drop", {"view": view(mask_from_shared=True)},
       "view.mask_from_shared")):
    with pytest.raises(ValueError, match=f"fixes {field}="):
      attacks.get_attack(name).make_config(**kw)
  cfg = attacks.GSConfig(view=view(drop_defended=True))
  with pytest.raises(ValueError, match="fixes view.drop_defended"):
    attacks.get_attack("gs_mask").make_config(cfg)
  with pytest.raises(ValueError, match="view must be a GradientView"):
    attacks.get_attack("gs_drop").make_config(view="drop")


def test_drop_view_on_a_model_with_only_the_defended_layer_raises():
  # logreg's only layer is the defended one: dropping it (and its bias)
  # leaves nothing to match; keeping the bias does.
  model, params, grads = _logreg_setup()
  key = jax.random.key(0)
  for name in ("dlg_drop", "gs_drop"):
    attack = attacks.get_attack(name)
    with pytest.raises(ValueError, match="leaves no gradient entry"):
      attack(model, params, grads, 1, key)
    batch = jax.tree_util.tree_map(lambda t: t[None], grads)
    with pytest.raises(ValueError, match="leaves no gradient entry"):
      attack.run_batch(model, params, batch, 1, key[None])
  res = attacks.get_attack("gs_drop")(
      model, params, grads, 1, key, iterations=3, restarts=1,
      view=objectives.GradientView(drop_defended=True, drop_bias=False))
  assert not bool(res.diverged)


@pytest.mark.parametrize("name,field,value,match", [
    ("gs", "learning_rate", -0.1, "learning_rate must be a finite number > 0"),
    ("gs", "learning_rate", "0.1", "learning_rate must be"),
    ("gs", "learning_rate", float("inf"), "learning_rate must be"),
    ("gs", "tv_weight", -1.0, "tv_weight must be a finite number >= 0"),
    ("gs", "tv_weight", "x", "tv_weight must be"),
    ("gs", "lower", "a", "lower must be a number or one number per channel"),
    ("gs", "upper", [[1.0]], "upper must be a number or one number per"),
    ("gs", "view", "drop", "view must be a GradientView"),
    ("gs", "local_lr", "a", "local_lr must be"),
    ("gs", "local_lr", -1.0, "local_lr must be"),
    ("dlg", "view", "drop", "view must be a GradientView"),
    ("dlg", "tol", None, "tol must be a finite number >= 0"),
    ("dlg", "grad_tol", -1.0, "grad_tol must be a finite number >= 0"),
    ("dlg", "diverge_factor", "x", "diverge_factor must be a number > 0"),
    ("dlg", "diverge_factor", 0.0, "diverge_factor must be"),
    ("dlg", "max_abs_pixel", -1.0, "max_abs_pixel must be a number > 0"),
    ("dlg", "armijo", 5.0, "armijo must be a finite number > 0 and < 1"),
    ("dlg", "learning_rate", True, "learning_rate must be"),
    ("dlg", "num_images", 1.5, "num_images must be >= 1, an integer"),
    ("gs", "num_images", None, "num_images must be >= 1, an integer"),
    ("gs", "num_images", True, "num_images must be"),
])
def test_bad_config_values_raise_one_line_errors(lenet_setup, name, field,
                                                 value, match):
  model, params, _, _, grads = lenet_setup
  num_images, kw = 1, {field: value}
  if field == "num_images":
    num_images, kw = value, {}
  if field == "local_lr":
    kw["local_steps"] = 2
  with pytest.raises(ValueError, match=match) as err:
    attacks.get_attack(name)(model, params, grads, num_images,
                             jax.random.key(0), **kw)
  assert "\n" not in str(err.value)


def test_bad_inputs_raise_clear_errors(lenet_setup):
  model, params, _, _, grads = lenet_setup
  attack = attacks.get_attack("dlg")
  key = jax.random.key(0)
  bad = dict(grads)
  bad.pop("conv0")
  with pytest.raises(ValueError, match="does not match"):
    attack(model, params, bad, 1, key)
  nan = jax.tree_util.tree_map(lambda t: t, grads)
  nan["head"] = {**nan["head"], "bias": nan["head"]["bias"].at[0].set(jnp.nan)}
  with pytest.raises(ValueError, match="NaN"):
    attack(model, params, nan, 1, key)
  with pytest.raises(ValueError, match="num_images"):
    attack(model, params, grads, 0, key)
  with pytest.raises(ValueError, match="labels"):
    attack(model, params, grads, 1, key, labels=jnp.array([1, 2]))
  with pytest.raises(ValueError, match="channels"):
    attacks.get_attack("gs")(model, params, grads, 1, key,
                             lower=(0., 0., 0.), upper=(1., 1., 1.))


# ------------------------------------------- final loss = recomputed objective

@pytest.fixture(scope="module")
def small_lenet_pruned():
  """A 16x16 LeNet, a known label and a shared gradient whose defended
  kernel has every other row zeroed (what Soteria's pruning leaves)."""
  model = models.get_model("lenet", (16, 16, 1), 10, init="uniform")
  params = model.init(jax.random.key(0))
  y = jnp.array([4])
  g = batch_grad(model, params, smooth_image(model.input_shape, 1), y)
  shared = _pruned(model, g, np.arange(0, model.num_features, 2))
  return model, params, y, shared


_VIEWS = {"mask": objectives.GradientView(mask_from_shared=True),
          "drop": objectives.GradientView(drop_defended=True)}


# The adaptive attacks' reported final loss is their *viewed* objective at
# x_rec (the known label is used as given), recomputed here independently;
# an attack that ignored its view (weights None) reports the plain distance,
# which differs by far more than the tolerance.
@pytest.mark.parametrize("name", ["gs_mask", "dlg_mask", "gs_drop"])
def test_adaptive_final_loss_is_the_viewed_objective_at_x_rec(
    small_lenet_pruned, name):
  model, params, y, shared = small_lenet_pruned
  gs = name.startswith("gs")
  kw = (dict(iterations=5, restarts=1) if gs
        else dict(outer_steps=2, inner_steps=3, restarts=1))
  res = attacks.get_attack(name)(model, params, shared, 1, jax.random.key(3),
                                 labels=y, **kw)
  assert not bool(res.diverged)
  np.testing.assert_array_equal(res.labels_rec, y)
  kind = "cosine" if gs else "l2"
  w = objectives.view_weights(model, shared, _VIEWS[name.split("_")[1]])
  g = batch_grad(model, params, res.x_rec, y)
  tv = (attacks.GSConfig().tv_weight * objectives.total_variation(res.x_rec)
        if gs else 0.0)
  want = float(objectives.gradient_distance(kind, g, shared, w) + tv)
  plain = float(objectives.gradient_distance(kind, g, shared) + tv)
  got = float(res.final_loss)
  np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-7)
  assert abs(plain - want) > 1e-2 * abs(want), (got, want, plain)


def test_gs_final_loss_includes_the_tv_prior(small_lenet_pruned):
  """With a large TV weight, GS's loss is the cosine distance plus that
  weight times TV(x_rec), recomputed here (the TV term dominates it)."""
  model, params, y, shared = small_lenet_pruned
  res = attacks.get_attack("gs")(model, params, shared, 1, jax.random.key(3),
                                 labels=y, iterations=20, restarts=1,
                                 tv_weight=10.0)
  tv = float(objectives.total_variation(res.x_rec))
  dist = float(objectives.gradient_distance(
      "cosine", batch_grad(model, params, res.x_rec, y), shared))
  np.testing.assert_allclose(float(res.final_loss), dist + 10.0 * tv,
                             rtol=1e-4)
  assert 10.0 * tv > dist
