"""Restarts, the line-search L-BFGS, run_batch and progress of the attacks."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from repdef_jax import attacks
from repdef_jax import gradients
from repdef_jax import models
from repdef_jax.attacks import base
from repdef_jax.attacks import lbfgs
from repdef_jax.attacks import objectives
from repdef_jax.attacks import progress

K = 3


@pytest.fixture(scope="module")
def setup():
  """Logistic regression on 8x8 images: K one-image gradients."""
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


# ------------------------------------------------------------------ restarts

def test_choose_restart_prefers_finite_and_not_diverged():
  losses = jnp.array([[0.1, 0.5, jnp.nan, 0.3],   # 0.1 diverged -> 0.3
                      [0.4, 0.2, 0.9, 0.8],       # all fine -> 0.2
                      [0.7, 0.6, jnp.inf, 0.9]])  # all diverged -> 0.6
  bad = jnp.array([[True, False, False, False],
                   [False, False, False, False],
                   [True, True, True, True]])
  index, diverged = base.choose_restart(losses, bad)
  np.testing.assert_array_equal(index, [3, 1, 1])
  # The attack diverged only where every restart did: one sane restart
  # (first row) is enough to keep it.
  np.testing.assert_array_equal(diverged, [False, False, True])
  # Every restart bad and a NaN among them: the lowest *finite* loss wins
  # (not the NaN, which a plain argmin would pick). A restart not flagged
  # bad but with a NaN loss is no good one: the lowest finite loss wins,
  # and the attack diverged.
  losses = jnp.array([[jnp.nan, 0.7, 0.5, jnp.inf],
                      [0.4, jnp.nan, 0.2, 0.9]])
  bad = jnp.array([[True, True, True, True],
                   [True, False, True, True]])
  index, diverged = base.choose_restart(losses, bad)
  np.testing.assert_array_equal(index, [2, 2])
  np.testing.assert_array_equal(diverged, [True, True])
  # One restart: the kept index is 0 and diverged is its own flag.
  index, diverged = base.choose_restart(jnp.array([[0.3], [jnp.nan]]),
                                        jnp.array([[False], [True]]))
  np.testing.assert_array_equal(index, [0, 0])
  np.testing.assert_array_equal(diverged, [False, True])


@pytest.mark.parametrize("name,overrides", [
    ("dlg", {"outer_steps": 2, "inner_steps": 4}),
    ("dlg", {"outer_steps": 2, "inner_steps": 4, "optimizer": "linesearch"}),
    ("gs", {"iterations": 6}),
])
def test_kept_restart_has_the_lowest_loss(setup, name, overrides):
  model, params, grads, keys, _ = setup
  attack = attacks.get_attack(name)
  g, key = _member(grads, 0), keys[0]
  res = attack(model, params, g, 1, key, restarts=4, **overrides)
  alone = [attack(model, params, g, 1, k, restarts=1, **overrides)
           for k in jax.random.split(key, 4)]
  losses = np.array([float(r.final_loss) for r in alone])
  best = int(np.argmin(losses))
  # The restarts differ by far more than the float noise of vmap (which
  # plain L-BFGS amplifies to ~1e-5 in a few steps).
  assert np.sort(losses)[1] > losses[best] * (1 + 1e-2)
  np.testing.assert_allclose(res.final_loss, losses[best], rtol=1e-4)
  np.testing.assert_allclose(res.x_rec, alone[best].x_rec, atol=1e-4)
  np.testing.assert_allclose(res.loss_history, alone[best].loss_history,
                             rtol=1e-4)


@pytest.mark.slow  # Which restarts diverge depends on the CPU's rounding.
def test_diverged_restarts_lose(setup):
  """A tight pixel bound makes some restarts diverge; a finite one wins."""
  model, params, grads, keys, _ = setup
  attack = attacks.get_attack("dlg")
  cfg = dict(outer_steps=2, inner_steps=5, max_abs_pixel=2.5)
  g, key = _member(grads, 0), keys[0]
  alone = [attack(model, params, g, 1, k, **cfg)
           for k in jax.random.split(key, 6)]
  div = np.array([bool(r.diverged) for r in alone])
  losses = np.array([float(r.final_loss) for r in alone])
  assert div.any() and not div.all()
  # Meaningful only if a diverged restart stopped at a lower loss.
  assert losses[div].min() < losses[~div].min()
  res = attack(model, params, g, 1, key, restarts=6, **cfg)
  assert not bool(res.diverged)
  # vmap's float noise, amplified by L-BFGS (as above).
  np.testing.assert_allclose(res.final_loss, losses[~div].min(), rtol=1e-4)
  all_bad = attack(model, params, g, 1, key, restarts=6,
                   **{**cfg, "max_abs_pixel": 1e-3})
  assert bool(all_bad.diverged)


# ------------------------------------------------------------- line search

def test_line_search_converges_where_plain_lbfgs_diverges(setup):
  model, params, grads, keys, ys = setup
  attack = attacks.get_attack("idlg")
  g, key = _member(grads, 2), keys[2]
  cfg = dict(outer_steps=10, inner_steps=10)
  plain = attack(model, params, g, 1, key, **cfg)
  assert bool(plain.diverged)
  # It stopped early; the outer steps after the stop repeat the final loss.
  stop = int(plain.iterations) // cfg["inner_steps"] + 1
  assert stop < cfg["outer_steps"]
  np.testing.assert_allclose(plain.loss_history[stop:], plain.final_loss,
                             rtol=1e-6)
  ls = attack(model, params, g, 1, key, optimizer="linesearch", **cfg)
  assert not bool(ls.diverged)
  hist = np.asarray(ls.loss_history)
  assert np.all(np.diff(hist) <= 1e-6 * hist[:-1])  # never increases
  assert hist[-1] < 1e-6 * hist[0]
  assert int(ls.labels_rec[0]) == int(ys[2, 0])


def test_line_search_never_increases_objective_on_lenet():
  model = models.get_model("lenet", (12, 12, 1), 4, init="uniform")
  params = model.init(jax.random.key(0))
  x = jax.random.uniform(jax.random.key(1), (1, 12, 12, 1))
  g = gradients.batch_grad(model, params, x, jnp.array([2]))
  res = attacks.get_attack("idlg")(model, params, g, 1, jax.random.key(3),
                                   outer_steps=15, inner_steps=1,
                                   optimizer="linesearch")
  hist = np.asarray(res.loss_history)
  assert np.all(np.diff(hist) <= 1e-6 * hist[:-1])
  assert hist[-1] < hist[0]


# ------------------------------------------------------- plain L-BFGS rule

@functools.partial(jax.jit, static_argnums=0)
def _l2_value_and_grad(model, params, x, y, g_ref):
  return jax.value_and_grad(lambda x: objectives.l2_distance(
      gradients.batch_grad(model, params, x, y), g_ref))(x)


@functools.lru_cache(maxsize=None)
def _torch_lbfgs_update(learning_rate, memory_size):
  return jax.jit(lbfgs.torch_lbfgs(learning_rate, memory_size).update)


@pytest.mark.parametrize("k,diverge_factor,stop", [
    (0, 1e4, 19), (2, 1e4, 14), (0, 50.0, 6)])
def test_plain_lbfgs_run_equals_its_rule_in_a_python_loop(
    setup, k, diverge_factor, stop):
  """iDLG with torch's L-BFGS (with the default diverge_factor, the program
  of the line-search test) equals its rule re-run step by step: start from
  normal(split(key)[0]); stop before a step once the loss is < tol or max
  |grad| <= grad_tol; reject a step (and stop, diverged) whose loss is not
  finite or exceeds diverge_factor times the *initial* loss, or whose image
  leaves [-max_abs_pixel, max_abs_pixel]; loss_history[j] is the loss after
  iteration 10 j + 9, the final loss after the stop. Member 0 converges
  (tol) after 19 iterations, member 2 diverges at the 14th
  (its loss jumps from 1.3 to 7e5). Member 0's loss (initially 182) falls
  to 40, then rises to 3.7e3 and 4e5: with diverge_factor 50 the 6th step
  is the first above 50 times the initial loss (the 5th is already above
  50 times the previous one)."""
  model, params, grads, keys, ys = setup
  g_ref, y = _member(grads, k), ys[k]
  cfg = attacks.DLGConfig(outer_steps=10, inner_steps=10, infer_label=True,
                          diverge_factor=diverge_factor)
  res = attacks.dlg_attack(model, params, g_ref, 1, keys[k], config=cfg)

  value_and_grad = lambda x: _l2_value_and_grad(  # noqa: E731
      model, params, x, y, g_ref)
  opt = lbfgs.torch_lbfgs(cfg.learning_rate, cfg.memory_size)
  update = _torch_lbfgs_update(cfg.learning_rate, cfg.memory_size)
  x = jax.random.normal(jax.random.split(keys[k])[0], (1, 8, 8, 1))
  state, (loss, g) = opt.init(x), value_and_grad(x)
  loss0, hist, n, diverged = float(loss), {}, 0, False
  for i in range(100):
    if float(loss) < cfg.tol or float(jnp.max(jnp.abs(g))) <= cfg.grad_tol:
      break
    u, new_state = update(g, state, x)
    new_x = x + u
    new_loss, new_g = value_and_grad(new_x)
    n += 1
    if not (np.isfinite(float(new_loss)) and np.all(np.isfinite(new_g))
            and float(jnp.max(jnp.abs(new_x))) <= cfg.max_abs_pixel
            and float(new_loss) <= cfg.diverge_factor * loss0):
      diverged = True
      break
    x, state, loss, g = new_x, new_state, new_loss, new_g
    hist[i // 10] = float(loss)
  assert n == stop and diverged == (stop < 15)  # The cases meant.
  assert int(res.iterations) == n and bool(res.diverged) == diverged
  np.testing.assert_array_equal(res.labels_rec, y)
  # Losses below tol (1e-9) are float noise: compared to an absolute 1e-8.
  np.testing.assert_allclose(res.final_loss, loss, rtol=1e-3, atol=1e-8)
  np.testing.assert_allclose(res.x_rec, x, atol=1e-3)
  np.testing.assert_allclose(
      res.loss_history, [hist.get(j, float(loss)) for j in range(10)],
      rtol=1e-3, atol=1e-8)


# ---------------------------------------------------------------- run_batch

@pytest.mark.parametrize("name,overrides", [
    ("idlg", {"outer_steps": 2, "inner_steps": 5, "optimizer": "linesearch",
              "restarts": 2}),
    ("dlg", {"outer_steps": 1, "inner_steps": 3}),
    ("gs_mask", {"iterations": 8, "restarts": 2}),
])
def test_run_batch_equals_loop(setup, name, overrides):
  model, params, grads, keys, _ = setup
  attack = attacks.get_attack(name)
  batch = attacks.run_batch(name, model, params, grads, 1, keys, **overrides)
  for k in range(K):
    one = attack(model, params, _member(grads, k), 1, keys[k], **overrides)
    for field, a, b in zip(one._fields, _member(batch, k), one):
      np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5, err_msg=field)


def test_run_batch_diverging_member_does_not_spoil_the_others(setup):
  model, params, grads, keys, ys = setup
  # Member 0 gets a huge gradient: its first step leaves the pixel bound.
  big = jax.tree_util.tree_map(lambda t: t.at[0].multiply(1e4), grads)
  cfg = dict(outer_steps=1, inner_steps=3, max_abs_pixel=50.0)
  batch = attacks.run_batch("dlg", model, params, big, 1, keys,
                            labels=ys, **cfg)
  diverged = np.asarray(batch.diverged)
  assert diverged[0] and not diverged[1:].any()
  for k in range(K):
    one = attacks.dlg_attack(model, params, _member(big, k), 1, keys[k],
                             labels=ys[k],
                             config=attacks.DLGConfig(**cfg))
    np.testing.assert_allclose(batch.x_rec[k], one.x_rec, atol=1e-5)
    assert int(batch.iterations[k]) == int(one.iterations)


def test_run_batch_checks_its_inputs(setup):
  model, params, grads, keys, _ = setup
  with pytest.raises(ValueError, match="3 PRNG keys"):
    attacks.run_batch("gs", model, params, grads, 1, keys[:2])
  with pytest.raises(ValueError, match=r"labels must be integer class ids "
                     r"of shape \[3, 1\]"):
    attacks.run_batch("gs", model, params, grads, 1, keys,
                      labels=jnp.zeros((3,), jnp.int32))
  with pytest.raises(ValueError, match=r"labels must lie in \[0, 4\)"):
    attacks.run_batch("gs", model, params, grads, 1, keys,
                      labels=jnp.array([[0], [4], [1]]))
  nan = jax.tree_util.tree_map(lambda t: t.at[2].set(jnp.nan), grads)
  with pytest.raises(ValueError, match="shared_batch holds NaN"):
    attacks.run_batch("dlg", model, params, nan, 1, keys)


# ----------------------------------------------------------------- progress

@pytest.mark.parametrize("name,overrides,total", [
    ("gs", {"iterations": 20}, 20),
    ("dlg", {"outer_steps": 4, "inner_steps": 5, "tol": 0.0,
             "grad_tol": 0.0}, 20),
])
def test_progress_events_and_identical_results(setup, name, overrides, total,
                                              monkeypatch):
  model, params, grads, keys, _ = setup
  events = []
  with progress.reporting(events.append):
    on = attacks.run_batch(name, model, params, grads, 1, keys,
                           progress_every=5, **overrides)
    jax.block_until_ready(on)
  # A reported batch runs on one device (base.over_devices): without
  # reports, the same one-device program gives the same numbers.
  monkeypatch.setattr(base.host, "cpu_mesh", lambda *a: None)
  off = attacks.run_batch(name, model, params, grads, 1, keys, **overrides)
  assert [e.iteration for e in events] == [5, 10, 15, 20]
  assert [e.final for e in events] == [False, False, False, True]
  assert all(e.total == total and e.losses.shape == (K,) for e in events)
  assert all(e.elapsed >= 0 for e in events)
  for a, b in zip(on, off):
    np.testing.assert_array_equal(a, b)


def test_progress_quiet_and_printed(setup, capsys):
  model, params, grads, keys, _ = setup
  g = _member(grads, 0)
  with progress.reporting(None):
    jax.block_until_ready(attacks.get_attack("gs")(
        model, params, g, 1, keys[0], iterations=4, progress_every=2))
  assert capsys.readouterr().err == ""
  jax.block_until_ready(attacks.get_attack("gs")(
      model, params, g, 1, keys[0], iterations=4, progress_every=2))
  err = capsys.readouterr().err.splitlines()
  assert len(err) == 2 and err[0].startswith("[gs] 2/4 loss")
  assert "ETA" in err[0] and "done in" in err[1]


def test_progress_host_events_rates_and_eta(monkeypatch):
  """The host side on hand-made calls and a fake clock: the first call only
  starts the clock, speed counts iterations since that call, the ETA is the
  rest of the budget at that speed (0 when final), events go to the
  reporter of the run's start, and a finished run is forgotten."""
  clock = iter([10.0, 12.0, 14.0, 15.0])
  monkeypatch.setattr(progress.time, "perf_counter", lambda: next(clock))
  events, later = [], []
  with progress.reporting(events.append):
    run_id = int(progress.start_run())
  with progress.reporting(later.append):
    # The clock starts at iteration 10 (callbacks are unordered).
    progress._host("gs", 100, run_id, 10, np.array([3.0]), 1, False)
    progress._host("gs", 100, run_id, 30, np.array([2.0, 1.0]), 2, False)
    progress._host("gs", 100, run_id, 50, np.array([1.0]), 0, True)
    progress._host("gs", 100, run_id, 60, np.array([1.0]), 0, False)
  assert not later
  assert [(e.iteration, e.final, e.running) for e in events] == [
      (30, False, 2), (50, True, 0)]
  first, last = events
  # 20 iterations in 2 s: 10 it/s, 70 iterations left.
  assert first.elapsed == pytest.approx(2.0)
  assert first.eta == pytest.approx(7.0)
  assert last.elapsed == pytest.approx(4.0) and last.eta == 0.0
  np.testing.assert_array_equal(first.losses, [2.0, 1.0])
  assert first.losses.dtype == np.float64
  assert run_id not in progress._runs


def test_progress_print_reporter_lines(capsys):
  """One line per event: the median is over the finite losses only."""
  event = progress.Event("dlg", 5, 20, np.array([9.0, np.nan, 1.0, 2.0]), 2,
                         1.0, 3.0, False)
  progress.print_reporter(event)
  progress.print_reporter(event._replace(losses=np.array([np.inf]),
                                         final=True))
  progress.print_reporter(event._replace(losses=np.array([0.5]),
                                         iteration=20, elapsed=4.0,
                                         final=True))
  assert capsys.readouterr().err.splitlines() == [
      "[dlg] 5/20 loss min 1.000e+00 median 2.000e+00 (2/4 running) "
      "1.0 s, ETA 3 s",
      "[dlg] 5/20 diverged (no finite loss) done in 1.0 s",
      "[dlg] 20/20 loss 5.000e-01 done in 4.0 s"]


def test_bad_progress_and_restarts_values(setup):
  model, params, grads, keys, _ = setup
  g = _member(grads, 0)
  for name, field, value in (("dlg", "restarts", 0),
                             ("dlg", "progress_every", -1),
                             ("dlg", "max_backtracks", 0),
                             ("gs", "progress_every", 1.5)):
    with pytest.raises(ValueError, match=field):
      attacks.get_attack(name)(model, params, g, 1, keys[0], **{field: value})


def _toy_core(model, params, shared, keys, labels, run_id, *, scale):
  """Independent 'attacks': row k of every output depends on row k only."""
  del model
  noise = jax.vmap(lambda k: jax.random.uniform(k, ()))(keys)
  return {"out": shared * scale * params + noise[:, None],
          "labels": labels + run_id}


def test_over_devices_without_a_mesh_runs_the_core_as_is(monkeypatch):
  """No mesh (one device): the core runs unchanged on all K attacks; with
  progress reporting no mesh is even asked for. Several devices, with K
  padded, are checked in a subprocess by
  tests/test_host.py::test_two_devices_equal_one_device."""
  k = 3
  shared = jnp.arange(k * 4, dtype=jnp.float32).reshape(k, 4)
  keys = jax.random.split(jax.random.key(0), k)
  labels = jnp.arange(k, dtype=jnp.int32)[:, None]
  args = (None, jnp.float32(2.0), shared, keys, labels, jnp.int32(1))
  asked = []
  monkeypatch.setattr(base.host, "cpu_mesh",
                      lambda n, axis: asked.append(n) or None)
  got = base.over_devices(_toy_core, *args, progress=False, scale=3.0)
  assert asked == [k]
  want = _toy_core(*args, scale=3.0)
  for name in want:
    np.testing.assert_allclose(got[name], want[name], rtol=1e-6)
  base.over_devices(_toy_core, *args, progress=True, scale=3.0)
  assert asked == [k]


def test_over_devices_sharded_program_equals_the_core(monkeypatch):
  """The shard_map path on a one-device mesh (every host has one) gives the
  core's numbers. Several devices, with padding of K, are checked in a
  subprocess by tests/test_host.py::test_two_devices_equal_one_device."""
  mesh = jax.sharding.Mesh(np.array(jax.devices()[:1]), (base.BATCH_AXIS,))
  calls = []
  monkeypatch.setattr(base.host, "cpu_mesh",
                      lambda *a: calls.append(a) or mesh)
  shared = jnp.arange(12, dtype=jnp.float32).reshape(3, 4)
  keys = jax.random.split(jax.random.key(0), 3)
  labels = jnp.arange(3, dtype=jnp.int32)[:, None]
  args = (None, jnp.float32(2.0), shared, keys, labels, jnp.int32(1))
  got = base.over_devices(_toy_core, *args, progress=False, scale=3.0)
  want = _toy_core(*args, scale=3.0)
  assert calls == [(3, base.BATCH_AXIS)]
  for name in want:
    np.testing.assert_allclose(got[name], want[name], rtol=1e-6)


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
