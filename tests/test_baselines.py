"""Tests of the baseline defenses (repdef_jax.defenses.baselines)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from repdef_jax import defenses
from repdef_jax import gradients
from repdef_jax import models
from repdef_jax.defenses import base
from repdef_jax.defenses import baselines as B


def _tree():
  k = jax.random.split(jax.random.key(0), 3)
  return {"a": {"kernel": jax.random.normal(k[0], (40, 25)),
                "bias": jax.random.normal(k[1], (25,))},
          "b": jax.random.normal(k[2], (7, 3, 2))}


def _batch():
  return base.ClientBatch(None, jnp.zeros((1, 1, 1, 1)), jnp.zeros((1,)))


@pytest.mark.parametrize("percent", [0, 30, 50, 90, 100])
def test_compression_numpy_rule_per_tensor(percent):
  g = _tree()
  out, info = B.compression(percent)(g, _batch(), jax.random.key(0))
  for a, b in zip(jax.tree_util.tree_leaves(g), jax.tree_util.tree_leaves(out)):
    a, b = np.asarray(a), np.asarray(b)
    keep = np.abs(a) >= np.percentile(np.abs(a), percent)
    np.testing.assert_array_equal(b, np.where(keep, a, 0))
    # the kept fraction per tensor is 1 - percent/100 up to one entry
    assert abs(keep.mean() - (1 - percent / 100)) <= 1.0 / a.size + 1e-9
  # zero_fraction is the measured share of zero entries over all leaves.
  leaves = [np.asarray(b) for b in jax.tree_util.tree_leaves(out)]
  measured = sum(int((b == 0).sum()) for b in leaves) / sum(b.size
                                                            for b in leaves)
  np.testing.assert_allclose(float(info["zero_fraction"]), measured,
                             rtol=1e-6, atol=1e-9)


@pytest.mark.parametrize("factory,std_factor", [(B.dp_gaussian, 1.0),
                                                 (B.dp_laplace, np.sqrt(2))])
def test_noise_scale_empirical(factory, std_factor):
  g = {"w": jnp.zeros((200, 250)), "u": jnp.zeros((200, 250)),
       "v": jnp.ones((10,))}
  scale = 0.05
  d = factory(scale)
  out, _ = d(g, _batch(), jax.random.key(42))
  for name in ("w", "u"):
    noise = np.asarray(out[name])
    std = float(np.std(noise))
    assert abs(std - scale * std_factor) < 0.03 * scale * std_factor, name
    # mean within 5 standard errors (std / sqrt(n)) of 0
    assert abs(float(np.mean(noise))) < 5 * scale * std_factor / np.sqrt(
        noise.size), name
  with jax.disable_jit():  # Eager; calling the defense jits it.
    out2, _ = d.apply(g, _batch(), jax.random.key(42))
  np.testing.assert_allclose(out["w"], out2["w"], rtol=1e-6, atol=1e-9)
  zero, _ = factory(0.0)(g, _batch(), jax.random.key(1))
  np.testing.assert_array_equal(zero["v"], g["v"])
  # independent noise across leaves: two zero leaves of the same shape get
  # uncorrelated noise (|rho| ~ 1/sqrt(50000) ~ 0.005 when independent; the
  # same key for both leaves gives rho = 1).
  rho = np.corrcoef(np.asarray(out["w"]).ravel(),
                    np.asarray(out["u"]).ravel())[0, 1]
  assert abs(rho) < 0.1, rho


@pytest.mark.parametrize("bad", [-0.1, float("nan"), float("inf"), "a"])
def test_bad_scale(bad):
  for f in (B.dp_gaussian, B.dp_laplace):
    with pytest.raises(ValueError, match="scale"):
      f(bad)


@pytest.mark.parametrize("bad", [-1, 101])
def test_bad_compression_percent(bad):
  with pytest.raises(ValueError, match=r"percent.*\[0, 100\]"):
    B.compression(bad)


def _model():
  model = models.get_model("mlp", (4, 4, 1), hidden=(8,))
  params = model.init(jax.random.key(0))
  x = jax.random.uniform(jax.random.key(1), (4, 4, 4, 1))
  y = jnp.array([0, 1, 2, 3])
  return model, params, x, y


def test_dp_sgd_no_noise_large_clip_is_plain_gradient():
  model, params, x, y = _model()
  g = gradients.batch_grad(model, params, x, y)
  out, info = B.dp_sgd(model, 1e6, 0.0)(g, base.ClientBatch(params, x, y),
                                        jax.random.key(0))
  for a, b in zip(jax.tree_util.tree_leaves(g), jax.tree_util.tree_leaves(out)):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
  assert float(info["clipped_fraction"]) == 0.0


def _clipped_mean(model, params, x, y, clip):
  """NumPy DP-SGD without noise on the real examples ``x, y``: the mean of
  the per-example gradients, each scaled to norm <= clip; and their norms
  before clipping."""
  _, per = gradients.per_example_grads(model, params, x, y)
  norms = np.sqrt(sum(np.sum(np.asarray(l) ** 2, axis=tuple(range(1, l.ndim)))
                      for l in jax.tree_util.tree_leaves(per)))
  scale = np.minimum(1.0, clip / norms)
  return jax.tree_util.tree_map(
      lambda l: np.tensordot(scale, np.asarray(l), 1) / len(norms), per), norms


def _assert_trees_close(want, got, atol):
  for a, b in zip(jax.tree_util.tree_leaves(want),
                  jax.tree_util.tree_leaves(got)):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=atol)


def test_dp_sgd_clipping_padding_and_noise_after_sum():
  model, params, x, y = _model()
  clip, sigma = 1e-3, 2.0
  mask = jnp.array([1, 1, 1, 0])
  batch = base.ClientBatch(params, x, y, mask)
  d = B.dp_sgd(model, clip, 0.0, normalizer="count")
  out, info = d(None, batch, jax.random.key(0))
  want, norms = _clipped_mean(model, params, x[:3], y[:3], clip)
  _assert_trees_close(want, out, atol=1e-9)
  # The default divides the same sum by the batch's fixed size, 4.
  out_b, _ = B.dp_sgd(model, clip, 0.0)(None, batch, jax.random.key(0))
  _assert_trees_close(jax.tree_util.tree_map(lambda w: w * 3 / 4, want),
                      out_b, atol=1e-9)
  assert float(info["clipped_fraction"]) == 1.0
  # mean_grad_norm: mean over the 3 real examples of the per-example global
  # L2 norm BEFORE clipping (clip_by_global_norm returns the pre-clip norm;
  # after clipping every norm would be clip = 1e-3 here).
  assert norms.min() > 10 * clip  # pre- and post-clip values differ a lot
  np.testing.assert_allclose(float(info["mean_grad_norm"]), norms.mean(),
                             rtol=1e-5)
  # noise std on the mean is sigma * clip / the normaliser (divide AFTER the
  # noise): / n_real = 3 with 'count', / B = 4 by default.
  for normalizer, base_out, n in (("count", out, 3), ("batch", out_b, 4)):
    noisy, _ = B.dp_sgd(model, clip, sigma, normalizer)(None, batch,
                                                        jax.random.key(3))
    resid = np.concatenate([
        (np.asarray(a) - np.asarray(b)).ravel() for a, b in zip(
            jax.tree_util.tree_leaves(noisy),
            jax.tree_util.tree_leaves(base_out))])
    np.testing.assert_allclose(np.std(resid), sigma * clip / n, rtol=0.1)


def test_dp_sgd_padding_with_nan_and_bad_mask():
  model, params, x, y = _model()
  mask = jnp.array([1, 1, 1, 0])
  clean = base.ClientBatch(params, x.at[3].set(0.0), y, mask)
  dirty = base.ClientBatch(params, x.at[3].set(jnp.nan), y.at[3].set(-1),
                           mask)
  d = B.dp_sgd(model, 1e-3, 0.5)
  want, info_w = d(None, clean, jax.random.key(1))
  got, info_g = d(None, dirty, jax.random.key(1))
  for a, b in zip(jax.tree_util.tree_leaves(want),
                  jax.tree_util.tree_leaves(got)):
    np.testing.assert_array_equal(a, b)
  assert float(info_g["mean_grad_norm"]) == float(info_w["mean_grad_norm"])
  with pytest.raises(ValueError, match=r"batch.mask must have shape \[B\]"):
    d(None, base.ClientBatch(params, x, y, jnp.ones(3)), jax.random.key(1))


def test_dp_sgd_validation_and_epsilon():
  model, *_ = _model()
  with pytest.raises(ValueError, match="clip_norm"):
    B.dp_sgd(model, 0.0, 1.0)
  with pytest.raises(ValueError, match="noise_multiplier"):
    B.dp_sgd(model, 1.0, -1.0)
  with pytest.raises(ValueError, match="normalizer must be one of"):
    B.dp_sgd(model, 1.0, 1.0, normalizer="mean")
  e1 = B.dp_sgd_epsilon(1.1, 0.01, 1000, 1e-5)
  e2 = B.dp_sgd_epsilon(2.0, 0.01, 1000, 1e-5)
  assert 0 < e2 < e1 < 10
  # epsilon strictly increases with the number of steps.
  eps_t = [B.dp_sgd_epsilon(1.1, 0.01, t, 1e-5) for t in (1, 10, 100, 1000)]
  assert all(a < b for a, b in zip(eps_t, eps_t[1:])), eps_t
  assert B.dp_sgd_epsilon(1.1, 0.01, 0, 1e-5) == 0.0
  # Without subsampling (rate 1), T Gaussian steps of noise multiplier sigma
  # compose (in RDP, alpha / (2 sigma^2) per step) exactly as one step with
  # sigma / sqrt(T); the RDP accountant reproduces this up to float rounding.
  for sigma, steps in [(1.0, 4), (2.0, 16), (5.0, 100)]:
    np.testing.assert_allclose(
        B.dp_sgd_epsilon(sigma, 1.0, steps, 1e-5),
        B.dp_sgd_epsilon(sigma / np.sqrt(steps), 1.0, 1, 1e-5), rtol=1e-6)
  assert B.dp_sgd_epsilon(0.0, 0.01, 10, 1e-5) == float("inf")
  with pytest.raises(ValueError, match="delta"):
    B.dp_sgd_epsilon(1.0, 0.01, 10, 2.0)
  with pytest.raises(ValueError, match="sample_rate"):
    B.dp_sgd_epsilon(1.0, 0.0, 10, 1e-5)


# --------------------------------------------------------------------------
# Mutation-audit additions: known answers and invariants, tiny shapes.


def test_compression_keeps_ties_at_the_percentile():
  """|g| = [1, 1, 1, 2]: the 50th percentile is 1, so ties at 1 are kept."""
  g = {"w": jnp.array([[1.0, -1.0], [1.0, 2.0]]),
       "v": jnp.array([3.0, -0.5, 0.5, -3.0, 2.0])}
  out, info = B.compression(50)(g, _batch(), jax.random.key(0))
  np.testing.assert_array_equal(out["w"], g["w"])  # nothing strictly below
  # |v| = [3, .5, .5, 3, 2]: percentile 50 is 2 -> the two 0.5 are zeroed.
  np.testing.assert_array_equal(out["v"], [3.0, 0.0, 0.0, -3.0, 2.0])
  np.testing.assert_allclose(float(info["zero_fraction"]), 2 / 9, rtol=1e-6)


def test_dp_sgd_noise_on_every_leaf_independent_across_leaves():
  """Every parameter gets noise; equal-shape leaves get independent draws."""
  # fc0 and fc1 kernels are both 16 x 16 (input 4 * 4 * 1 = 16).
  model = models.get_model("mlp", (4, 4, 1), hidden=(16, 16))
  params = model.init(jax.random.key(0))
  x = jax.random.uniform(jax.random.key(1), (2, 4, 4, 1))
  batch = base.ClientBatch(params, x, jnp.array([0, 1]))
  clip, sigma = 0.5, 100.0
  out, _ = jax.jit(B.dp_sgd(model, clip, sigma).apply)(None, batch,
                                                       jax.random.key(5))
  out = jax.tree_util.tree_map(np.asarray, out)
  # out = signal + noise; |signal| <= clip / 2 per entry, noise std is
  # sigma * clip / 2 = 25 (divided by n = 2 after the noise), so the
  # signal is <1% of it. Each leaf has >= 10 entries: its rms is within
  # [0.2, 5] x 25 except with probability < 1e-5 (chi-square, 10 dof).
  want = sigma * clip / 2
  for path, leaf in jax.tree_util.tree_flatten_with_path(out)[0]:
    rms = np.sqrt(np.mean(leaf ** 2))
    assert 0.2 * want < rms < 5 * want, (path, rms)
  # 256 independent pairs: rho has std ~ 1/16, so |rho| < 0.5 is an
  # 8-sigma margin; the same key for both leaves gives rho ~ 1.
  rho = np.corrcoef(out["fc0"]["kernel"].ravel(),
                    out["fc1"]["kernel"].ravel())[0, 1]
  assert abs(rho) < 0.5, rho
  # pooled over all 698 entries: std error of the std ~2.7%, so rtol 0.15
  # is a 5-sigma margin; missing clip or /n (factor 2) are far outside.
  pooled = np.concatenate([l.ravel() for l in jax.tree_util.tree_leaves(out)])
  np.testing.assert_allclose(np.std(pooled), want, rtol=0.15)


def test_dp_sgd_all_padding_batch_is_finite_zero():
  """A client with no real example shares 0 (plus noise), never NaN."""
  model, params, x, y = _model()
  batch = base.ClientBatch(params, x, y, jnp.zeros((4,)))
  out, info = B.dp_sgd(model, 1.0, 0.0)(None, batch, jax.random.key(0))
  for leaf in jax.tree_util.tree_leaves(out):
    np.testing.assert_array_equal(leaf, np.zeros(leaf.shape))
  assert float(info["clipped_fraction"]) == 0.0
  assert float(info["mean_grad_norm"]) == 0.0


def test_get_defense_dp_sgd_strength_and_default_clip_norm():
  """get_defense('dp_sgd', s) is dp_sgd(model, clip_norm=1.0, noise=s)."""
  model, params, x, y = _model()
  batch = base.ClientBatch(params, x, y)
  want, norms = _clipped_mean(model, params, x, y, 1.0)
  # every per-example norm is in (1.7, 3.1): clip_norm=1.0 rescales each
  # example to norm exactly 1 (any other default gives another result).
  assert norms.min() > 1.5, norms
  out, info = defenses.get_defense("dp_sgd", 0.0, model=model)(
      None, batch, jax.random.key(0))
  _assert_trees_close(want, out, atol=1e-7)
  assert float(info["clipped_fraction"]) == 1.0


def _gaussian_exact_epsilon(s, delta):
  """Tight epsilon of one Gaussian mechanism, sensitivity 1, noise std s.

  Balle & Wang (ICML 2018), Theorem 8: delta(eps) = Phi(1/(2s) - eps s)
  - e^eps Phi(-1/(2s) - eps s), decreasing in eps; solved by bisection.
  """
  def delta_of(eps):
    return (stats.norm.cdf(0.5 / s - eps * s)
            - np.exp(eps) * stats.norm.cdf(-0.5 / s - eps * s))

  lo, hi = 0.0, 100.0
  for _ in range(100):
    mid = (lo + hi) / 2
    lo, hi = (mid, hi) if delta_of(mid) > delta else (lo, mid)
  return hi


@pytest.mark.parametrize("sigma,steps,delta", [(1.0, 1, 1e-3),
                                               (2.0, 10, 1e-5),
                                               (4.0, 50, 1e-2)])
def test_dp_sgd_epsilon_full_batch_between_exact_and_rdp_bounds(
    sigma, steps, delta):
  """sample_rate 1: T Gaussian steps are one Gaussian of std sigma/sqrt(T).

  The accountant's epsilon is a valid (eps, delta) guarantee, so at least
  the exact one (Balle & Wang); and at most the classic RDP conversion
  min_a T a / (2 sigma^2) + log(1/delta) / (a - 1) over integer orders
  2..63 (all in dp_accounting's default grid; its conversion is tighter).
  """
  got = B.dp_sgd_epsilon(sigma, 1.0, steps, delta)
  lower = _gaussian_exact_epsilon(sigma / np.sqrt(steps), delta)
  a = np.arange(2, 64, dtype=np.float64)
  upper = np.min(steps * a / (2 * sigma ** 2) + np.log(1 / delta) / (a - 1))
  assert lower <= got <= upper, (lower, got, upper)
  # The bracket is narrow enough to see a wrong delta, sigma or step count.
  assert upper < 1.5 * lower, (lower, upper)


def test_dp_sgd_epsilon_monotone_in_delta_and_sample_rate():
  """Larger delta -> smaller epsilon; larger sample_rate -> larger epsilon."""
  eps_d = [B.dp_sgd_epsilon(1.1, 0.01, 100, d) for d in (1e-7, 1e-5, 1e-3)]
  assert eps_d[0] > eps_d[1] > eps_d[2] > 0, eps_d
  eps_q = [B.dp_sgd_epsilon(1.1, q, 100, 1e-5) for q in (0.001, 0.01, 0.1)]
  assert 0 < eps_q[0] < eps_q[1] < eps_q[2], eps_q


def test_dp_sgd_info_and_clipping_count_only_real_examples():
  """clip_norm between the per-example norms; padding outside all counts."""
  model, params, x, y = _model()
  clip = 2.0
  want, norms = _clipped_mean(model, params, x[:3], y[:3], clip)
  assert 0 < np.sum(norms > clip) < 3, norms  # some clipped, some not
  batch = base.ClientBatch(params, x, y, jnp.array([1, 1, 1, 0]))
  out, info = B.dp_sgd(model, clip, 0.0, "count")(None, batch,
                                                   jax.random.key(0))
  _assert_trees_close(want, out, atol=1e-7)
  np.testing.assert_allclose(float(info["clipped_fraction"]),
                             np.mean(norms > clip), rtol=1e-6)
  np.testing.assert_allclose(float(info["mean_grad_norm"]), norms.mean(),
                             rtol=1e-5)


@pytest.mark.parametrize("name,std_factor", [("dp_gaussian", 1.0),
                                              ("dp_laplace", np.sqrt(2))])
def test_get_defense_noise_strength_is_the_scale(name, std_factor):
  """get_defense(name, s): s is the Gaussian std / the Laplace scale b."""
  zeros = {"w": jnp.zeros((100, 100))}
  out, info = defenses.get_defense(name, 0.2)(zeros, _batch(),
                                              jax.random.key(0))
  # 10000 draws: the sample std's relative std error is ~0.7% (Gaussian)
  # / ~1.1% (Laplace), so rtol 0.1 is a 9-sigma margin; a Laplace scale
  # taken for its std (factor sqrt(2)) is 29% off.
  np.testing.assert_allclose(np.std(np.asarray(out["w"])), 0.2 * std_factor,
                             rtol=0.1)
  np.testing.assert_allclose(float(info["noise_scale"]), 0.2, rtol=1e-6)


def test_dp_sgd_noise_is_gaussian_not_just_of_the_right_std():
  """The accountant assumes Gaussian noise: with sigma huge the output is
  noise; pooled over keys its excess kurtosis is ~0 (Laplace: 3). 8 keys x
  1,738 entries: the Gaussian estimate's std is ~0.04."""
  from repdef_jax.defenses import baselines as B
  model = models.get_model("mlp", (4, 4, 1), hidden=(64,))
  params = model.init(jax.random.key(0))
  x = jax.random.uniform(jax.random.key(1), (2, 4, 4, 1))
  batch = base.ClientBatch(params, x, jnp.array([0, 1]))
  apply = jax.jit(B.dp_sgd(model, 1.0, 1e4).apply)
  draws = np.concatenate([
      np.concatenate([np.asarray(l).ravel() for l in
                      jax.tree_util.tree_leaves(
                          apply(None, batch, jax.random.key(s))[0])])
      for s in range(8)]).astype(np.float64)
  draws = draws - draws.mean()
  kurt = np.mean(draws ** 4) / np.mean(draws ** 2) ** 2 - 3
  assert abs(kurt) < 0.5, kurt
  np.testing.assert_allclose(np.std(draws), 1e4 * 1.0 / 2, rtol=0.05)



def test_dp_sgd_info_counts_real_examples_under_the_default_normalizer():
  """Default normalizer='batch' divides the GRADIENT by B = 4, but the
  diagnostics are over the 3 real examples: every one is clipped
  (clip 1e-3 is far below each norm), so clipped_fraction is 1, not 3/4."""
  from repdef_jax.defenses import baselines as B
  model = models.get_model("mlp", (4, 4, 1), hidden=(8,))
  params = model.init(jax.random.key(0))
  x = jax.random.uniform(jax.random.key(1), (4, 4, 4, 1))
  y = jnp.array([0, 1, 2, 3])
  batch = base.ClientBatch(params, x, y, jnp.array([1, 1, 1, 0]))
  _, per = gradients.per_example_grads(model, params, x[:3], y[:3])
  norms = np.sqrt(sum(np.sum(np.asarray(l) ** 2, axis=tuple(range(1, l.ndim)))
                      for l in jax.tree_util.tree_leaves(per)))
  assert norms.min() > 10 * 1e-3
  _, info = B.dp_sgd(model, 1e-3, 0.0)(None, batch, jax.random.key(0))
  np.testing.assert_allclose(float(info["clipped_fraction"]), 1.0)
  np.testing.assert_allclose(float(info["mean_grad_norm"]), norms.mean(),
                             rtol=1e-5)
