"""Tests of the Soteria defense (repdef_jax.defenses.soteria)."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from repdef_jax import gradients
from repdef_jax import models
from repdef_jax.defenses import base
from repdef_jax.defenses import soteria as S
import repdef_jax.defenses as D


def _setup(name, shape=(8, 8, 1), b=3, seed=0, **kw):
  model = models.get_model(name, shape, **kw)
  params = model.init(jax.random.key(seed))
  x = jax.random.uniform(jax.random.key(seed + 1), (b, *shape))
  y = jnp.arange(b) % model.num_classes
  return model, params, x, y


def _naive_scores(model, params, x, eps):
  """The reference algorithm: one vjp per feature, Python loop."""
  fn = model.feature_fn(params)

  @jax.jit
  def one(xi, i):
    r, vjp = jax.vjp(fn, xi)
    (g,) = vjp(jax.nn.one_hot(i, r.shape[0], dtype=r.dtype))
    return jnp.linalg.norm(g) / (r[i] + eps)

  f = jax.eval_shape(fn, x[0]).shape[0]
  return np.sum([[float(one(xi, i)) for i in range(f)] for xi in x], axis=0)


@pytest.mark.parametrize("name,shape,kw", [
    ("mlp", (6, 6, 1), dict(hidden=(16, 12))),
    ("leakage", (6, 6, 1), {}),
    ("lenet", (8, 8, 3), {}),
])
@pytest.mark.parametrize("jacobian", ["rev", "fwd", "auto"])
def test_feature_scores_matches_naive_vjp_loop(name, shape, kw, jacobian):
  model, params, x, _ = _setup(name, shape, b=2, **kw)
  eps = model.score_eps
  got = S.feature_scores(model.feature_fn(params), x, eps=eps,
                         jacobian=jacobian)
  want = _naive_scores(model, params, x, eps)
  np.testing.assert_allclose(np.asarray(got), want, rtol=2e-4, atol=1e-5)


def test_auto_jacobian_picks_fewer_passes():
  # leakage on 6x6x1: F = 6*6*12 = 432 > D = 36 -> forward mode.
  assert S.resolve_jacobian("auto", 432, 36) == "fwd"
  assert S.resolve_jacobian("auto", 48, 192) == "rev"
  assert S.resolve_jacobian("rev", 432, 36) == "rev"
  assert S.resolve_jacobian("auto", 36, 36) == "rev"  # 'fwd' iff D < F.
  with pytest.raises(ValueError, match="jacobian"):
    S.resolve_jacobian("backward", 4, 4)


@pytest.mark.parametrize("jacobian", ["rev", "fwd"])
def test_chunked_jacobian_equals_full_jacobian(jacobian):
  model, params, x, _ = _setup("lenet", (8, 8, 3), b=3)
  fn = model.feature_fn(params)
  # The reference: all F = 48 rows at once, in reverse mode.
  r, jac = S.features_and_jacobian(fn, x, jacobian="rev")
  assert jac.shape == (3, 48, 192)
  # 5 and 7 divide neither F = 48 nor D = 192 (a padded last chunk of rows
  # or columns); a NumPy integer is one; 1000 is more than either.
  for chunk in (5, np.int64(7), 1000):
    r_c, jac_c = jax.jit(lambda x, c=chunk: S.features_and_jacobian(
        fn, x, chunk=c, jacobian=jacobian))(x)
    np.testing.assert_allclose(r_c, r, rtol=1e-6)
    np.testing.assert_allclose(jac_c, jac, rtol=1e-5, atol=1e-7)
  # Chunk 5 loops over ceil(48 / 5) = 10 row or ceil(192 / 5) = 39 column
  # chunks; 1000 runs every pass at once (no loop).
  text = lambda c: str(jax.make_jaxpr(lambda x: S.features_and_jacobian(
      fn, x, chunk=c, jacobian=jacobian))(x))
  assert f"length={10 if jacobian == 'rev' else 39}" in text(5)
  assert "scan" not in text(1000)


def test_exact_score_closed_form_on_linear_map():
  rng = np.random.default_rng(0)
  for f_dim, d in [(5, 12), (12, 5)]:  # F < D and F > D (pinv columns).
    a = rng.normal(size=(f_dim, d)).astype(np.float32)
    x = rng.normal(size=(3, d)).astype(np.float32)
    fn = lambda xi: jnp.asarray(a) @ xi
    got = S.feature_scores(fn, jnp.asarray(x), score="exact")
    pinv = np.linalg.pinv(a.astype(np.float64))  # [D, F]
    r = x @ a.T
    want = -np.sum(np.abs(r) * np.linalg.norm(pinv, axis=0)[None], axis=0)
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-4, atol=1e-5)


def test_scores_weights_ignore_padding():
  model, params, x, _ = _setup("mlp", (4, 4, 1), b=4, hidden=(8,))
  w = jnp.array([1.0, 1.0, 0.0, 0.0])
  a = S.feature_scores(model.feature_fn(params), x, eps=0.1, weights=w)
  b = S.feature_scores(model.feature_fn(params), x[:2], eps=0.1)
  np.testing.assert_allclose(a, b, rtol=1e-6)


def test_features_fn_not_1d_raises():
  with pytest.raises(ValueError, match="features_fn"):
    S.feature_scores(lambda xi: xi, jnp.zeros((2, 3, 3)))


@pytest.mark.parametrize("percent", [0, 10, 25, 33.3, 50, 60, 99, 100])
def test_percentile_mask_equals_numpy_with_ties(percent):
  rng = np.random.default_rng(1)
  scores = rng.normal(size=40).astype(np.float32)
  scores[:15] = 0.0                # ReLU-like ties at 0
  scores[20:25] = scores[30]       # more ties
  rng.shuffle(scores)
  want = (scores >= np.percentile(scores, percent)).astype(np.float32)
  got = S.mask_from_scores(jnp.asarray(scores), percent)
  np.testing.assert_array_equal(np.asarray(got), want)


def test_count_mask_exact_count_and_tie_break():
  scores = jnp.array([0.0, 0.0, 0.0, 1.0, 0.5, 0.0, 2.0, 3.0])
  for pct in [0, 12.5, 25, 50, 75, 100]:
    m = S.mask_from_scores(scores, pct, selection="count")
    assert int(jnp.sum(m == 0)) == round(pct / 100 * 8)
  m = S.mask_from_scores(scores, 25, selection="count")
  np.testing.assert_array_equal(m, [0, 0, 1, 1, 1, 1, 1, 1])  # lower index first
  inactive = jnp.array([True, True, True, False, False, True, False, False])
  m = S.mask_from_scores(scores, 25, selection="count", inactive=inactive)
  np.testing.assert_array_equal(m, [1, 1, 1, 0, 0, 1, 1, 1])
  with pytest.raises(ValueError, match="inactive must have the shape"):
    S.mask_from_scores(scores, 25, selection="count", inactive=inactive[:5])
  # traced percent works under jit, rounded like a concrete one (20 % and
  # 60 % of 8 are 1.6 and 4.8 features: 2 and 5 pruned)
  masked = jax.jit(lambda p: S.mask_from_scores(scores, p, selection="count"))
  for pct, n_pruned in [(25.0, 2), (20.0, 2), (60.0, 5)]:
    mj = masked(pct)
    np.testing.assert_array_equal(mj, S.mask_from_scores(scores, pct,
                                                         selection="count"))
    assert int(jnp.sum(mj == 0)) == n_pruned, pct


def test_count_is_exact_at_half_ties():
  """round(p / 100 * F) half to even, on exact values (float32 misses some)."""
  for num, pct, want in [(50, 59, 30), (45, 70, 32), (10, 25, 2),
                         (10, 35, 4), (588, 60, 353)]:
    m = S.mask_from_scores(jnp.arange(num, dtype=jnp.float32), pct,
                           selection="count")
    assert int(jnp.sum(m == 0)) == want, (num, pct)


def test_negative_scores_prune_the_signed_smallest():
  """The documented departure: no abs() before the percentile comparison."""
  scores = jnp.array([-5.0, -1.0, 0.5, 1.0, 2.0, 3.0, 4.0, 5.0])
  m = S.mask_from_scores(scores, 30)
  np.testing.assert_array_equal(m, [0, 0, 0, 1, 1, 1, 1, 1])


@pytest.mark.parametrize("bad", [-1, 100.5, float("nan"), "x"])
def test_bad_percent(bad):
  with pytest.raises(ValueError, match="percent"):
    S.mask_from_scores(jnp.ones(4), bad)
  model = models.get_model("mlp", (4, 4, 1), hidden=(8,))
  with pytest.raises(ValueError, match="percent"):
    S.soteria(model, bad)


def test_bad_choices():
  model = models.get_model("mlp", (4, 4, 1), hidden=(8,))
  with pytest.raises(ValueError, match="score"):
    S.soteria(model, 10, score="foo")
  with pytest.raises(ValueError, match="selection"):
    S.soteria(model, 10, selection="foo")
  with pytest.raises(ValueError, match="q"):
    S.soteria(model, 10, q=7)
  for eps in [float("nan"), -1.0, "a"]:
    with pytest.raises(ValueError, match="eps must be a finite number"):
      S.soteria(model, 10, eps=eps)
  for chunk in [0, "a", 2.5]:
    with pytest.raises(ValueError, match="jacobian_chunk must be"):
      S.soteria(model, 10, jacobian_chunk=chunk)
  x = jnp.zeros((3, 4, 4, 1))
  params = model.init(jax.random.key(0))
  d = S.soteria(model, 10)
  with pytest.raises(ValueError, match=r"batch.mask must have shape \[B\]"):
    d(params, base.ClientBatch(params, x, jnp.zeros(3, int), jnp.ones(4)),
      jax.random.key(0))


def _check_only_rows_zeroed(g0, g1, mask, path=("head",), protect_bias=False):
  flat0 = jax.tree_util.tree_flatten_with_path(g0)[0]
  flat1 = jax.tree_util.tree_flatten_with_path(g1)[0]
  pruned = np.asarray(mask) == 0
  for (p0, a), (p1, b) in zip(flat0, flat1):
    keys = tuple(k.key for k in p0)
    a, b = np.asarray(a), np.asarray(b)
    if keys == (*path, "kernel"):
      assert np.all(b[pruned] == 0)
      assert np.array_equal(b[~pruned], a[~pruned])
    elif keys == (*path, "bias") and protect_bias:
      assert np.all(b == 0)
    else:
      assert np.array_equal(a, b), keys


def test_apply_mask_only_defended_rows():
  model, params, x, y = _setup("mlp", (4, 4, 1), hidden=(8, 6))
  g = gradients.batch_grad(model, params, x, y)
  mask = jnp.array([1, 0, 1, 1, 0, 0])
  g1 = S.apply_mask(g, mask, model)
  _check_only_rows_zeroed(g, g1, mask)
  g2 = S.apply_mask(g, mask, ("head",), protect_bias=True)
  _check_only_rows_zeroed(g, g2, mask, protect_bias=True)
  with pytest.raises(ValueError, match="shape"):
    S.apply_mask(g, jnp.ones(5), model)
  # A square defended kernel (F = K): rows, not columns, are zeroed.
  square = {"head": {"kernel": jnp.arange(16.0).reshape(4, 4) + 1,
                     "bias": jnp.ones(4)}}
  mask = jnp.array([1, 0, 1, 0])
  _check_only_rows_zeroed(square, S.apply_mask(square, mask, ("head",)), mask)


def test_no_defended_layer_error():
  tree = {"conv": {"kernel": jnp.ones((3, 3, 1, 2))}}
  with pytest.raises(ValueError, match="defended linear layer"):
    S.apply_mask(tree, jnp.ones(2), ("head",))
  with pytest.raises(ValueError, match="defended linear layer"):
    S.defended_layer(tree, ("head",))


@pytest.mark.parametrize("score,selection", [("reference", "percentile"),
                                             ("exact", "count")])
def test_defense_end_to_end_jit_equals_eager(score, selection):
  model, params, x, y = _setup("leakage", (6, 6, 1), b=3)
  g = gradients.batch_grad(model, params, x, y)
  d = S.soteria(model, 40, score=score, selection=selection)
  batch = base.ClientBatch(params, x, y)
  with jax.disable_jit():  # Eager, the library's own jitted calls too.
    g1, info = d.apply(g, batch, jax.random.key(0))
  g2, info2 = d(g, batch, jax.random.key(0))  # Jitted.
  for a, b in zip(jax.tree_util.tree_leaves(g1), jax.tree_util.tree_leaves(g2)):
    np.testing.assert_allclose(a, b, rtol=1e-6, atol=0)
  kernel = np.asarray(g1["head"]["kernel"])
  zero_rows = np.all(kernel == 0, axis=1)
  r = model.features(params, x)
  keep = S.mask_from_scores(
      S.feature_scores(model.feature_fn(params), x, score=score,
                       eps=model.score_eps), 40, selection=selection,
      inactive=~jnp.any(r != 0, axis=0))
  _check_only_rows_zeroed(g, g1, keep)
  assert zero_rows.sum() >= (np.asarray(keep) == 0).sum()
  np.testing.assert_allclose(info["pruned_fraction"],
                             np.mean(np.asarray(keep) == 0))
  assert set(info) == {"pruned_fraction", "effective_pruned_fraction",
                       "pruned_fraction_of_active", "active_fraction",
                       "nonfinite_input"}
  assert float(info["nonfinite_input"]) == 0.0
  assert info2["pruned_fraction"] == info["pruned_fraction"]


@pytest.mark.parametrize("jacobian", ["rev", "fwd"])
def test_factory_modes_and_protect_bias(jacobian):
  """Forced Jacobian modes give the 'auto' mask; protect_bias zeroes the bias."""
  model, params, x, y = _setup("lenet", (12, 12, 1), b=2)
  g = gradients.batch_grad(model, params, x, y)
  batch = base.ClientBatch(params, x, y)
  g_auto, _ = S.soteria(model, 50)(g, batch, jax.random.key(0))
  g_mode, _ = S.soteria(model, 50, jacobian=jacobian, protect_bias=True)(
      g, batch, jax.random.key(0))
  keep = np.any(np.asarray(g_auto["head"]["kernel"]) != 0, axis=1)
  assert 0 < keep.mean() < 1
  _check_only_rows_zeroed(g, g_mode, keep.astype(np.float32),
                          protect_bias=True)


def test_relu_effective_fraction_and_count_selection():
  model, params, x, y = _setup("mlp", (4, 4, 1), b=2, hidden=(64,))
  g = gradients.batch_grad(model, params, x, y)
  batch = base.ClientBatch(params, x, y)
  r = model.features(params, x)
  active = np.asarray(jnp.any(r != 0, axis=0))
  assert 0 < active.mean() < 1  # some dead ReLU features
  _, info_p = S.soteria(model, 40)(g, batch, jax.random.key(0))
  _, info_c = S.soteria(model, 40, selection="count")(g, batch,
                                                       jax.random.key(0))
  n = round(0.4 * 64)
  np.testing.assert_allclose(info_c["pruned_fraction"], n / 64)
  np.testing.assert_allclose(info_c["effective_pruned_fraction"],
                             min(n, active.sum()) / 64)
  # active = r non-zero on some (real) example of the batch; 'count' prunes
  # active features first, so min(n, #active) of them are pruned.
  for info in (info_p, info_c):
    np.testing.assert_allclose(info["active_fraction"], active.mean())
  np.testing.assert_allclose(info_c["pruned_fraction_of_active"],
                             min(n, active.sum()) / active.sum())
  np.testing.assert_allclose(
      info_p["pruned_fraction_of_active"],
      float(info_p["effective_pruned_fraction"]) * 64 / active.sum(),
      rtol=1e-6)
  assert info_p["effective_pruned_fraction"] <= info_p["pruned_fraction"]
  assert info_c["effective_pruned_fraction"] >= info_p[
      "effective_pruned_fraction"]


def test_padding_mask_changes_nothing():
  model, params, x, y = _setup("mlp", (4, 4, 1), b=4, hidden=(16,))
  xp = x.at[2:].set(jax.random.uniform(jax.random.key(9), x[2:].shape))
  xp = xp.at[3, 0, 0, 0].set(jnp.nan)  # NaN padding: not scored, not flagged
  mask = jnp.array([1, 1, 0, 0])
  d = S.soteria(model, 50, selection="count")
  g = gradients.batch_grad(model, params, x[:2], y[:2])
  g_a, info_a = d(g, base.ClientBatch(params, x[:2], y[:2]), jax.random.key(0))
  g_b, info_b = d(g, base.ClientBatch(params, xp, y, mask), jax.random.key(0))
  for a, b in zip(jax.tree_util.tree_leaves(g_a), jax.tree_util.tree_leaves(g_b)):
    np.testing.assert_array_equal(a, b)
  for k in info_a:
    np.testing.assert_allclose(info_a[k], info_b[k])


def test_vmap_over_clients_each_own_mask():
  model, params, _, _ = _setup("mlp", (4, 4, 1), hidden=(16,))
  c, b = 3, 2
  xs = jax.random.uniform(jax.random.key(5), (c, b, 4, 4, 1))
  ys = jnp.zeros((c, b), jnp.int32)
  grads = jax.vmap(lambda x, y: gradients.batch_grad(model, params, x, y))(
      xs, ys)
  d = S.soteria(model, 50, selection="count")
  out, info = jax.jit(jax.vmap(
      lambda g, x, y: d(g, base.ClientBatch(params, x, y), jax.random.key(0))))(
          grads, xs, ys)
  masks = []
  for i in range(c):
    g_i = jax.tree_util.tree_map(lambda t: t[i], grads)
    o_i, info_i = d(g_i, base.ClientBatch(params, xs[i], ys[i]),
                    jax.random.key(0))
    for a, bb in zip(jax.tree_util.tree_leaves(o_i),
                     jax.tree_util.tree_leaves(
                         jax.tree_util.tree_map(lambda t: t[i], out))):
      np.testing.assert_allclose(a, bb, rtol=1e-6, atol=1e-7)
    masks.append(np.all(np.asarray(o_i["head"]["kernel"]) == 0, axis=1))
  assert not all(np.array_equal(masks[0], m) for m in masks[1:])


def test_chain_soteria_then_noise():
  model, params, x, y = _setup("mlp", (4, 4, 1), hidden=(16,))
  g = gradients.batch_grad(model, params, x, y)
  batch = base.ClientBatch(params, x, y)
  scale = 0.1
  key = jax.random.key(0)
  d = base.chain(S.soteria(model, 50, selection="count"), D.dp_gaussian(scale))
  out, info = d(g, batch, key)
  # chain gives member i the key fold_in(key, i) and feeds it the previous
  # member's output: dp_gaussian(scale) applied to soteria's output.
  sot, _ = S.soteria(model, 50, selection="count")(
      g, batch, jax.random.fold_in(key, 0))
  ref, _ = D.dp_gaussian(scale)(sot, batch, jax.random.fold_in(key, 1))
  for a, b in zip(jax.tree_util.tree_leaves(out), jax.tree_util.tree_leaves(ref)):
    np.testing.assert_array_equal(a, b)
  # the noise is really there (the second member changed something) ...
  resid = np.concatenate([(np.asarray(a) - np.asarray(b)).ravel() for a, b in
                          zip(jax.tree_util.tree_leaves(out),
                              jax.tree_util.tree_leaves(sot))])
  assert np.all(resid != 0)
  # ... and soteria ran first: its pruned rows carry pure noise of std scale.
  pruned = np.all(np.asarray(sot["head"]["kernel"]) == 0, axis=1)
  assert pruned.sum() >= 8  # 8 by count, plus dead-ReLU rows (zero grads)
  head = np.asarray(out["head"]["kernel"])[pruned]
  np.testing.assert_allclose(np.std(head), scale, rtol=0.3)
  assert "0_soteria/pruned_fraction" in info
  # One member alone is wrapped the same way: appending a member does not
  # change its noise.
  one, one_info = base.chain(D.dp_gaussian(scale))(g, batch, key)
  two, _ = base.chain(D.dp_gaussian(scale), base.identity())(g, batch, key)
  alone, _ = D.dp_gaussian(scale)(g, batch, jax.random.fold_in(key, 0))
  for a, b, c in zip(*map(jax.tree_util.tree_leaves, (one, two, alone))):
    np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(a, c)
  assert list(one_info) == ["0_dp_gaussian/noise_scale"]
  assert "1_dp_gaussian/noise_scale" in info
  np.testing.assert_allclose(info["1_dp_gaussian/noise_scale"], scale)


def test_get_defense_registry():
  model = models.get_model("mlp", (4, 4, 1), hidden=(8,))
  zeros = {"w": jnp.zeros((100, 100))}
  normal = {"w": jax.random.normal(jax.random.key(3), (100, 100))}
  batch = base.ClientBatch(None, jnp.zeros((1, 1, 1, 1)), jnp.zeros((1,)))

  def excess_kurtosis(t):
    t = np.asarray(t["w"], np.float64).ravel()
    t = t - t.mean()
    return np.mean(t ** 4) / np.mean(t ** 2) ** 2 - 3

  for name in D.DEFENSE_NAMES:
    d = D.get_defense(name, 10 if name != "dp_sgd" else 1.0, model=model)
    assert isinstance(d, base.Defense)
    assert d.name == name
    # behavioural fingerprints of the cheap ones
    if name == "none":
      out, _ = d(normal, batch, jax.random.key(0))
      np.testing.assert_array_equal(out["w"], normal["w"])
    elif name == "compression":  # 10% of the entries zeroed
      out, _ = d(normal, batch, jax.random.key(0))
      assert np.mean(np.asarray(out["w"]) == 0) == 0.1
    elif name in ("dp_gaussian", "dp_laplace"):
      # 10000 draws: excess kurtosis 0 (Gaussian) vs 3 (Laplace); the
      # estimate's std is ~0.05 (Gaussian) / ~0.4 (Laplace, right-skewed).
      k = excess_kurtosis(d(zeros, batch, jax.random.key(0))[0])
      assert (abs(k) < 1.0) if name == "dp_gaussian" else (k > 1.5), k
  with pytest.raises(ValueError, match="valid names.*soteria"):
    D.get_defense("nope", 1)
  with pytest.raises(ValueError, match="model"):
    D.get_defense("soteria", 10)
  odd = models.get_model("mlp", (4, 4, 1), hidden=(8,))
  odd = odd.__class__(**{**odd.__dict__, "defended_path": ("nohead",)})
  with pytest.raises(ValueError, match="defended linear layer"):
    D.get_defense("soteria", 10, model=odd)


def test_a_registered_perturbation_is_checked_by_name(monkeypatch):
  """A new norm's mistakes get one line naming it, not a JAX traceback."""
  model = models.get_model("mlp", (4, 4, 1), hidden=(8,))
  params = model.init(jax.random.key(0))
  x = jax.random.uniform(jax.random.key(1), (2, 4, 4, 1))
  y = jnp.array([0, 1])
  g = gradients.batch_grad(model, params, x, y)
  batch = base.ClientBatch(params, x, y)
  ones = lambda ctx: jnp.ones_like(ctx.scores)
  returns = {
      "scale_only": (lambda ctx, s: ones(ctx),
                     r"returned one array of shape \(8,\)"),
      "a_list": (lambda ctx, s: ([1.0] * 8, {}), "row_scale is list"),
      "wrong_size": (lambda ctx, s: (jnp.ones(3), {}), r"row_scale is \(3,\)"),
      "vector_info": (lambda ctx, s: (ones(ctx), {"v": ctx.scores}),
                      r"info entries \['v'\] are not scalars"),
  }
  for name, (fn, match) in returns.items():
    monkeypatch.setitem(S.PERTURBATIONS, name, fn)
    with pytest.raises(ValueError, match=rf"perturbation '{name}' must "
                       rf"return \(row_scale, info\).*{match}"):
      S.soteria(model, 10, q=name)
  monkeypatch.setitem(S.PERTURBATIONS, "fine", lambda ctx, s: (ones(ctx), {}))
  S.soteria(model, 10, q="fine")(g, batch, jax.random.key(0))
  for bad in ("abc", True, float("nan"), [1.0]):
    with pytest.raises(ValueError, match=r"percent \(the strength of "
                       r"perturbation 'fine'\) must be a finite real"):
      S.soteria(model, bad, q="fine")
  for bad in (2, "", None):
    with pytest.raises(ValueError, match="name must be a non-empty string"):
      S.register_perturbation(bad)
  # An integer q, NumPy's included, names "q<int>"; a bool does not.
  want, _ = S.soteria(model, 10, q="q0")(g, batch, jax.random.key(0))
  for q in (0, np.int64(0)):
    got, _ = S.soteria(model, 10, q=q)(g, batch, jax.random.key(0))
    assert jax.tree_util.tree_all(jax.tree_util.tree_map(
        lambda a, b: bool(jnp.array_equal(a, b)), got, want))
  with pytest.raises(ValueError, match="q must name a registered"):
    S.soteria(model, 10, q=False)


# --------------------------------------------------------------------------
# Known-answer tests of the pieces (mutation audit): no model, tiny shapes.


def test_exact_score_rank_deficient_jacobian_matches_numpy_pinv():
  """Dependent rows: J^+ needs the singular-value cutoff (numpy's pinv)."""
  rng = np.random.default_rng(3)
  a1, a2 = rng.normal(size=(2, 6))
  a = np.stack([a1, a2, a1 + a2, 2.0 * a1]).astype(np.float32)  # rank 2
  x = rng.normal(size=(2, 6)).astype(np.float32)
  r = x @ a.T
  jac = np.broadcast_to(a, (2, *a.shape))
  got = S.scores_from_jacobian(jnp.asarray(r), jnp.asarray(jac), score="exact")
  pinv = np.linalg.pinv(a.astype(np.float64), rcond=1e-5)  # [D, F]
  want = -np.sum(np.abs(r) * np.linalg.norm(pinv, axis=0)[None], axis=0)
  np.testing.assert_allclose(np.asarray(got), want, rtol=1e-3, atol=1e-5)


def test_scores_weighted_sum_uses_weight_values_and_drops_padding():
  """sum_b w_b * score_b; a padded example's inf (r = -eps) never leaks."""
  rng = np.random.default_rng(4)
  eps = 0.1
  r = rng.uniform(0.5, 2.0, size=(3, 4)).astype(np.float32)
  r[2, 1] = -eps  # padded example: 1 / (r + eps) = inf
  jac = rng.normal(size=(3, 4, 5)).astype(np.float32)
  w = np.array([0.5, 2.0, 0.0], np.float32)
  want = np.zeros(4)
  for b in range(2):  # the real examples only
    for i in range(4):
      want[i] += w[b] * np.linalg.norm(jac[b, i]) / (r[b, i] + eps)
  got = S.scores_from_jacobian(jnp.asarray(r), jnp.asarray(jac), eps=eps,
                               weights=jnp.asarray(w))
  np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5)


def test_pruning_info_hand_worked():
  keep = jnp.array([0.0, 0.0, 1.0, 1.0])
  info = S.pruning_info(keep, jnp.array([True, False, True, False]))
  # 2 of 4 pruned; of them only feature 0 is active; 2 active features.
  for k, v in {"pruned_fraction": 0.5, "effective_pruned_fraction": 0.25,
               "pruned_fraction_of_active": 0.5, "active_fraction": 0.5
               }.items():
    np.testing.assert_allclose(float(info[k]), v, err_msg=k)
  # No active feature: nothing effectively pruned, of none active -> 0.
  info = S.pruning_info(keep, jnp.zeros(4, bool))
  for k, v in {"pruned_fraction": 0.5, "effective_pruned_fraction": 0.0,
               "pruned_fraction_of_active": 0.0, "active_fraction": 0.0
               }.items():
    np.testing.assert_allclose(float(info[k]), v, err_msg=k)


def test_apply_row_scale_prunes_nonfinite_rows_and_scales_others():
  kernel = np.array([[np.nan, 1.0], [np.inf, -2.0], [3.0, 4.0],
                     [np.nan, 5.0]], np.float32)
  grads = {"head": {"kernel": jnp.asarray(kernel), "bias": jnp.ones(2)}}
  out = S.apply_row_scale(grads, jnp.array([0.0, 0.0, 0.5, 1.0]), ("head",))
  got = np.asarray(out["head"]["kernel"])
  np.testing.assert_array_equal(got[:2], 0.0)  # pruned: exactly 0, no NaN
  np.testing.assert_array_equal(got[2], [1.5, 2.0])
  np.testing.assert_array_equal(got[3], kernel[3])  # kept row: NaN kept
  np.testing.assert_array_equal(np.asarray(out["head"]["bias"]), 1.0)


def test_defended_layer_rejects_a_non_dense_kernel():
  tree = {"head": {"kernel": jnp.ones((3, 3, 1, 2))}}
  with pytest.raises(ValueError, match="2-D kernel"):
    S.defended_layer(tree, ("head",))
  with pytest.raises(ValueError, match="2-D kernel"):
    S.apply_mask(tree, jnp.ones(3), ("head",))


@pytest.mark.parametrize("jacobian", ["auto", "rev", "fwd"])
def test_reference_score_of_a_signed_representation_logreg(jacobian):
  """logreg: r = x and J = I, so score_i = sum_b 1 / (x_bi + eps), signed r
  (normalised pixels can be negative): no abs() on r, in the model-aware
  path and in the generic Jacobian modes alike."""
  model = models.get_model("logreg", (2, 2, 1))
  params = model.init(jax.random.key(0))
  x = jnp.array([[1.0, -0.5, 0.3, 2.0],
                 [0.5, -0.3, 1.0, -2.0]]).reshape(2, 2, 2, 1)
  y = jnp.array([0, 1])
  g = gradients.batch_grad(model, params, x, y)
  out, _ = jax.jit(S.soteria(model, 50, jacobian=jacobian).apply)(
      g, base.ClientBatch(params, x, y), jax.random.key(0))
  scores = np.sum(1.0 / (np.asarray(x).reshape(2, -1) + model.score_eps), 0)
  want = scores >= np.percentile(scores, 50)  # [1, 0, 1, 0] by hand
  kept = np.any(np.asarray(out["head"]["kernel"]) != 0, axis=1)
  np.testing.assert_array_equal(kept, want)
  np.testing.assert_array_equal(want, [True, False, True, False])


# --------------------------------------------------------------------------
# The model-aware Jacobian (issue 12): same numbers as the per-feature vjp.

JAC_MODELS = [
    ("lenet", (8, 8, 3), {}),
    ("lenet", (12, 12, 1), {}),
    ("leakage", (6, 6, 2), {}),
    ("mlp", (6, 6, 1), dict(hidden=(16, 12))),
    ("mlp", (6, 6, 1), dict(hidden=(16,))),
    ("lenet5", (16, 16, 3), {}),
    ("lenet5", (16, 16, 3), dict(hidden=())),
    ("convnet64", (12, 12, 3), dict(width=2)),
    ("logreg", (5, 5, 1), {}),
]


def _naive_norms(model, params, x):
  """||dr_bi/dx_b|| by one vjp per (example, feature), Python loops."""
  fn = model.with_conv_impl("xla").feature_fn(params)

  @jax.jit
  def one(xi, i):
    r, vjp = jax.vjp(fn, xi)
    (g,) = vjp(jax.nn.one_hot(i, r.shape[0], dtype=r.dtype))
    return jnp.linalg.norm(g), r[i]

  f = jax.eval_shape(fn, x[0]).shape[0]
  out = np.array([[one(xi, i) for i in range(f)] for xi in x])
  return out[..., 1], out[..., 0]  # r, norms


@pytest.mark.parametrize("name,shape,kw", JAC_MODELS)
def test_representation_jacobian_norms_match_per_feature_vjp(name, shape, kw):
  model, params, x, _ = _setup(name, shape, b=2, **kw)
  r_ref, n_ref = _naive_norms(model, params, x)
  for chunk in (None, 7):  # 7 does not divide F: padded last chunk.
    r, norms = jax.jit(lambda p, x, c=chunk: S.representation_jacobian_norms(
        model, p, x, chunk=c))(params, x)
    np.testing.assert_allclose(r, r_ref, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(norms, n_ref, rtol=2e-5, atol=1e-6)


# A ConvNet whose representation (4 * 32 = 128 features) is larger than
# its input (81 pixels): 'auto' runs the Jacobian in forward mode.
WIDE = ("convnet64", (9, 9, 1), dict(width=32))


@pytest.mark.parametrize("name,shape,kw", [WIDE, *JAC_MODELS[:5]])
def test_forward_mode_jacobian_norms_match_per_feature_vjp(name, shape, kw):
  model, params, x, _ = _setup(name, shape, b=2, **kw)
  r_ref, n_ref = _naive_norms(model, params, x)
  for chunk in (None, 7):  # 7 does not divide D: padded last chunk.
    r, norms = jax.jit(lambda p, x, c=chunk: S.representation_jacobian_norms(
        model, p, x, chunk=c, jacobian="fwd"))(params, x)
    np.testing.assert_allclose(r, r_ref, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(norms, n_ref, rtol=2e-5, atol=1e-6)
  r, jac = jax.jit(lambda p, x: S.representation_jacobian(
      model, p, x, chunk=5, jacobian="fwd"))(params, x)
  _, j_ref = S.features_and_jacobian(
      model.with_conv_impl("xla").feature_fn(params), x, jacobian="rev")
  np.testing.assert_allclose(jac, j_ref, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("name,shape,kw,want", [
    (*WIDE, "fwd"),
    ("convnet64", (28, 28, 1), {}, "fwd"),  # D 784 < F 2,304.
    ("convnet64", (32, 32, 3), {}, "rev"),  # D 3,072 > F 2,304.
    ("convnet64", (28, 28, 1), dict(width=16), "rev"),  # F 576.
    ("lenet", (28, 28, 1), {}, "rev"),  # F 588 < D 784.
    ("leakage", (4, 4, 1), {}, "rev"),  # D < F, but nothing below.
])
def test_auto_jacobian_mode_is_forward_iff_input_smaller(name, shape, kw,
                                                         want):
  model = models.get_model(name, shape, **kw)
  assert S.model_jacobian_mode(model) == want
  assert S.model_jacobian_mode(model, "rev") == "rev"
  assert S.model_jacobian_mode(model, "fwd") == "fwd"


def test_jacobian_model_keeps_a_chosen_formulation():
  # 'auto' becomes 'xla' in forward mode (its JVP is canonical), 'jacobian'
  # in reverse; a formulation the user chose stays, and its forward-mode
  # norms are the per-feature vjp's.
  wide = models.get_model(*WIDE[:2], **WIDE[2])
  lenet = models.get_model("lenet", (12, 12, 1))
  assert S.jacobian_model(wide).conv_impl == "xla"
  assert S.jacobian_model(wide, "rev").conv_impl == "jacobian"
  assert S.jacobian_model(lenet).conv_impl == "jacobian"
  assert S.jacobian_model(lenet, "fwd").conv_impl == "xla"
  model, params, x, _ = _setup(*WIDE[:2], b=2, conv_impl="s2d", **WIDE[2])
  assert S.jacobian_model(model).conv_impl == "s2d"
  _, n_ref = _naive_norms(model, params, x)
  _, norms = jax.jit(lambda p, x: S.representation_jacobian_norms(
      model, p, x, chunk=16))(params, x)
  np.testing.assert_allclose(norms, n_ref, rtol=2e-5, atol=1e-6)
  assert S.jacobian_passes(wide) == 81
  assert S.jacobian_passes(lenet) == lenet.num_features == 108


def test_defense_runs_forward_mode_where_auto_picks_it():
  # Same mask as the reverse-mode scores of the generic Jacobian, and
  # 'auto' traces the forward-mode program, not the reverse one.
  model, params, x, y = _setup(*WIDE[:2], b=3, **WIDE[2])
  grads = gradients.batch_grad(model, params, x, y, None)
  batch = base.ClientBatch(params, x, y)
  out, _ = jax.jit(S.soteria(model, 50.0).apply)(grads, batch,
                                                  jax.random.key(0))
  ref, _ = S.soteria(model, 50.0, jacobian="rev").apply(grads, batch,
                                                        jax.random.key(0))
  np.testing.assert_array_equal(out["head"]["kernel"] != 0,
                                ref["head"]["kernel"] != 0)
  assert 0 < int(jnp.sum(out["head"]["kernel"] != 0)) < out["head"][
      "kernel"].size
  text = {m: str(jax.make_jaxpr(functools.partial(
      S.representation_jacobian_norms, model, jacobian=m))(params, x))
          for m in ("auto", "fwd", "rev")}
  assert text["auto"] == text["fwd"] != text["rev"]


@pytest.mark.parametrize("name,shape", [("leakage", (6, 6, 2)),
                                        ("leakage", (7, 5, 3))])
def test_linear_row_norms_squared_kernel_equals_layer_jacobian(name, shape):
  # The one-forward-pass rule (squared kernels on ones) against the layer's
  # Jacobian, which the fallback (a parameter other than kernel/bias) uses.
  model, params, x, _ = _setup(name, shape, b=2)
  h = model.bottom(params, x)
  fast = S._linear_row_norms(model, params, h)
  extra = {**params, "extra": {"scale": jnp.ones(())}}
  slow = S._linear_row_norms(model, extra, h)
  jac = jax.jacrev(lambda hh: model.top_pre(params, hh[None])[0].reshape(-1))(
      h[0])
  np.testing.assert_allclose(
      slow, np.linalg.norm(np.asarray(jac).reshape(jac.shape[0], -1), axis=1),
      rtol=1e-6)
  np.testing.assert_allclose(fast, slow, rtol=1e-5, atol=1e-7)
  assert float(jnp.min(fast)) < float(jnp.max(fast))  # Borders differ.


@pytest.mark.parametrize("name,shape,kw", JAC_MODELS[:4])
def test_representation_jacobian_equals_generic_jacobian(name, shape, kw):
  model, params, x, _ = _setup(name, shape, b=3, **kw)
  r_ref, j_ref = S.features_and_jacobian(
      model.with_conv_impl("xla").feature_fn(params), x, jacobian="rev")
  r, jac = jax.jit(lambda p, x: S.representation_jacobian(
      model, p, x, chunk=5))(params, x)
  np.testing.assert_allclose(r, r_ref, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(jac, j_ref, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("name,shape,kw,b", [
    ("lenet", (8, 8, 3), {}, 1), ("lenet", (8, 8, 3), {}, 4),
    ("lenet", (12, 12, 1), {}, 3), ("mlp", (6, 6, 1), {}, 5),
    ("lenet5", (16, 16, 3), {}, 3), ("leakage", (6, 6, 1), {}, 2),
])
def test_defense_mask_identical_to_reference_rule(name, shape, kw, b):
  # The defense (model-aware Jacobian, s2d convolutions, inside jit) against
  # the reference rule on the per-feature vjp scores of the real examples;
  # the last example is padding holding other images.
  model, params, x, y = _setup(name, shape, b=b + 1, **kw)
  mask = jnp.ones((b + 1,)).at[b].set(0.0)
  r, norms = _naive_norms(model, params, x[:b])
  scores = np.sum(norms / (r + model.score_eps), axis=0)
  want = scores >= np.percentile(scores, 60.0)
  grads = gradients.batch_grad(model, params, x, y, mask)
  defense = S.soteria(model, 60.0)
  out, _ = jax.jit(defense.apply)(grads, base.ClientBatch(params, x, y, mask),
                                  jax.random.key(0))
  kept = np.asarray(out["head"]["kernel"] != 0).any(axis=1)
  nonzero = np.asarray(grads["head"]["kernel"] != 0).any(axis=1)
  np.testing.assert_array_equal(kept, want & nonzero)
  assert nonzero.sum() > 0.5 * len(nonzero)  # The comparison says something.


@pytest.mark.parametrize("batch,features", [(1, 588), (10, 588), (50, 588),
                                            (10, 768), (1, 10), (8, 2304),
                                            (1000, 30)])
def test_auto_chunk_covers_features_in_equal_chunks(batch, features):
  c = S.auto_chunk(batch, features)
  n = -(-features // c)
  assert 1 <= c <= features
  assert n * c - features < n  # Padding below one row per chunk.
  assert batch * c <= max(512, batch)  # About 512 pairs, at least 1 feature.


@pytest.mark.parametrize("jacobian", ["auto", "rev"])
def test_soteria_uses_the_eps_it_is_given(jacobian):
  """logreg: r = x, J = I, score_i = 1 / (x_i + eps). eps = 0.1 (the
  model's default) and eps = 1.0 give different masks by hand, so a
  factory that validated eps but used model.score_eps would be caught."""
  model = models.get_model("logreg", (2, 2, 1))
  assert model.score_eps == 0.1
  params = model.init(jax.random.key(0))
  x = jnp.array([1.0, -0.5, 0.3, 2.0]).reshape(1, 2, 2, 1)
  y = jnp.array([0])
  g = gradients.batch_grad(model, params, x, y)
  batch = base.ClientBatch(params, x, y)
  masks = {}
  for eps in (0.1, 1.0):
    out, _ = S.soteria(model, 50, eps=eps, jacobian=jacobian)(
        g, batch, jax.random.key(0))
    kept = np.any(np.asarray(out["head"]["kernel"]) != 0, axis=1)
    scores = 1.0 / (np.asarray(x).reshape(-1) + eps)
    np.testing.assert_array_equal(kept, scores >= np.percentile(scores, 50))
    masks[eps] = kept
  # By hand: eps 0.1 -> scores [.91, -2.5, 2.5, .48] keep {0, 2};
  # eps 1.0 -> [.5, 2, .77, .33] keep {1, 2}.
  np.testing.assert_array_equal(masks[0.1], [True, False, True, False])
  np.testing.assert_array_equal(masks[1.0], [False, True, True, False])



def test_soteria_flags_one_nonfinite_real_image_among_clean_ones():
  """nonfinite_input is 1 when ANY real example holds NaN/inf (not only
  when all do), and 0 when the NaN image is padding."""
  model = models.get_model("mlp", (4, 4, 1), hidden=(8,))
  params = model.init(jax.random.key(0))
  x = jax.random.uniform(jax.random.key(1), (3, 4, 4, 1))
  x = x.at[1, 0, 0, 0].set(jnp.nan)  # one bad image of three
  y = jnp.array([0, 1, 2])
  g = gradients.batch_grad(model, params, x[:1], y[:1])  # finite grads
  d = S.soteria(model, 50)
  _, info = d(g, base.ClientBatch(params, x, y), jax.random.key(0))
  assert float(info["nonfinite_input"]) == 1.0
  _, info = d(g, base.ClientBatch(params, x, y, jnp.array([1, 0, 1])),
              jax.random.key(0))
  assert float(info["nonfinite_input"]) == 0.0



def test_perturbation_receives_the_batch_inputs(monkeypatch):
  """A registered perturbation sees the documented PerturbationInputs:
  weights with 0 for padding, r and ||dr_bi/dx_b||_2 of every example, in
  the model-aware ('auto') and the generic ('rev') Jacobian paths alike."""
  model = models.get_model("mlp", (4, 4, 1), hidden=(8,))
  params = model.init(jax.random.key(0))
  x = jax.random.uniform(jax.random.key(1), (3, 4, 4, 1))
  y = jnp.array([0, 1, 2])
  mask = jnp.array([1.0, 1.0, 0.0])
  g = gradients.batch_grad(model, params, x, y, mask)
  coef = jnp.arange(1.0, 4.0)[:, None] * jnp.arange(1.0, 9.0)[None, :]

  def spy(ctx, strength):
    del strength
    return jnp.ones_like(ctx.scores), {
        "weights": jnp.sum(ctx.weights * jnp.arange(1.0, 4.0)),
        "r": jnp.sum(ctx.r * coef),
        "norms": jnp.sum(ctx.jac_row_norms * coef),
    }

  monkeypatch.setitem(S.PERTURBATIONS, "spy", spy)
  r, jac = S.features_and_jacobian(model.feature_fn(params), x)
  norms = np.linalg.norm(np.asarray(jac), axis=-1)
  for jacobian in ("auto", "rev"):
    _, info = S.soteria(model, 10, q="spy", jacobian=jacobian)(
        g, base.ClientBatch(params, x, y, mask), jax.random.key(0))
    np.testing.assert_allclose(float(info["weights"]), 1.0 + 2.0)
    np.testing.assert_allclose(float(info["r"]),
                               float(np.sum(np.asarray(r) * coef)), rtol=1e-5)
    np.testing.assert_allclose(float(info["norms"]),
                               float(np.sum(norms * coef)), rtol=1e-4)



def test_a_negative_feature_is_active_for_count_selection():
  """logreg, normalised pixels: r = x can be < 0. A feature negative on
  every image is active (r != 0), not dead: 'count' prunes it by its score
  and active_fraction counts it. Scores 1 / (x + 0.1) = [.91, -2.5, 2.5,
  .48]: pruning 1 of 4 removes feature 1."""
  model = models.get_model("logreg", (2, 2, 1))
  params = model.init(jax.random.key(0))
  x = jnp.array([1.0, -0.5, 0.3, 2.0]).reshape(1, 2, 2, 1)
  y = jnp.array([0])
  g = gradients.batch_grad(model, params, x, y)
  out, info = S.soteria(model, 25, selection="count")(
      g, base.ClientBatch(params, x, y), jax.random.key(0))
  kept = np.any(np.asarray(out["head"]["kernel"]) != 0, axis=1)
  np.testing.assert_array_equal(kept, [True, False, True, True])
  np.testing.assert_allclose(float(info["active_fraction"]), 1.0)
  np.testing.assert_allclose(float(info["effective_pruned_fraction"]), 0.25)


@pytest.mark.parametrize("name,shape", [("leakage", (6, 6, 2)),
                                        ("lenet", (8, 8, 3))])
def test_jacobian_norms_with_nonzero_biases_match_generic_jacobian(name, shape):
  # Trained parameters have non-zero biases; the one-forward-pass row-norm
  # rule must drop them (init biases are all 0, hiding the mistake).
  model = models.get_model(name, shape)
  params = model.init(jax.random.key(0))
  leaves, treedef = jax.tree_util.tree_flatten_with_path(params)
  keys = jax.random.split(jax.random.key(5), len(leaves))
  params = jax.tree_util.tree_unflatten(treedef, [
      (v + jax.random.normal(k, v.shape, v.dtype)
       if p[-1].key == "bias" else v) for (p, v), k in zip(leaves, keys)])
  x = jax.random.uniform(jax.random.key(1), (2, *shape))
  r_ref, j_ref = S.features_and_jacobian(
      model.with_conv_impl("xla").feature_fn(params), x, jacobian="rev")
  r, norms = S.representation_jacobian_norms(model, params, x)
  np.testing.assert_allclose(r, r_ref, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(norms, np.linalg.norm(j_ref, axis=-1),
                             rtol=1e-4, atol=1e-6)


def test_apply_mask_accepts_a_string_path():
  g = {"head": {"kernel": jnp.ones((4, 3)), "bias": jnp.ones(3)},
       "conv": {"kernel": jnp.ones((2, 2, 1, 4))}}
  out = S.apply_mask(g, jnp.array([1, 0, 1, 0]), "head")
  np.testing.assert_array_equal(out["head"]["kernel"].sum(axis=1),
                                [3.0, 0.0, 3.0, 0.0])
  assert out["conv"]["kernel"] is g["conv"]["kernel"]


def test_defended_layer_not_a_mapping_raises_value_error():
  # The defended path exists but holds an array, not a Dense layer's dict.
  with pytest.raises(ValueError, match="defended linear layer"):
    S.defended_layer({"head": jnp.ones((4, 3))}, ("head",))
  with pytest.raises(ValueError, match="defended linear layer"):
    S.defended_layer({"head": [1, 2]}, ("head",))


def test_exact_score_of_an_all_zero_jacobian_is_zero_not_nan():
  # A feature map whose Jacobian is 0 everywhere (e.g. dead ReLUs): J^+ = 0.
  r = jnp.ones((2, 3))
  got = S.scores_from_jacobian(r, jnp.zeros((2, 3, 5)), score="exact")
  np.testing.assert_array_equal(np.asarray(got), np.zeros(3))


def test_exact_score_cutoff_scales_with_the_larger_dimension():
  # J [2, 100] with singular values 1 and 5e-6: below the cutoff
  # max(F, D) * eps32 * s_max ~ 1.2e-5, so J^+ drops it (as jnp.linalg.pinv).
  u = np.eye(2, dtype=np.float32)
  v = np.linalg.qr(np.random.default_rng(0).normal(size=(100, 2)))[0]
  jac = (u * np.array([1.0, 5e-6])) @ v.T.astype(np.float32)
  r = jnp.ones((1, 2))
  got = S.scores_from_jacobian(r, jnp.asarray(jac[None], jnp.float32),
                               score="exact")
  want = -np.linalg.norm(np.asarray(jnp.linalg.pinv(jnp.asarray(
      jac, jnp.float32))), axis=0)
  np.testing.assert_allclose(np.asarray(got), want, rtol=1e-3, atol=1e-5)
  assert abs(float(got[1])) < 10.0  # Not 1 / 5e-6.


@pytest.mark.parametrize("jacobian", ["auto", "rev"])
def test_a_zero_feature_with_eps_zero_is_score_zero_not_nan(jacobian):
  """eps = 0 on a ReLU net: a feature at r = 0 has a zero Jacobian row,
  0/0. It scores 0 (what any eps > 0 gives it), so 10 % prunes about 10 %;
  as NaN it made the percentile threshold NaN and pruned every feature,
  with no flag raised."""
  model = models.get_model("mlp", (4, 4, 1), hidden=(12, 10))
  params = model.init(jax.random.key(0))
  x = jax.random.uniform(jax.random.key(1), (3, 4, 4, 1))
  r = model.features(params, x)
  assert int(jnp.sum(jnp.all(r == 0, axis=0))) > 0  # Dead ReLU features.
  g = gradients.batch_grad(model, params, x, jnp.array([0, 1, 2]))
  batch = base.ClientBatch(params, x, jnp.array([0, 1, 2]))
  _, info = S.soteria(model, 10.0, eps=0.0, jacobian=jacobian)(
      g, batch, jax.random.key(2))
  assert float(info["pruned_fraction"]) <= 0.2
  assert float(info["nonfinite_input"]) == 0.0
  scores = S.feature_scores(model.feature_fn(params), x, eps=0.0)
  assert bool(jnp.all(jnp.isfinite(scores)))
