"""Tests of the baseline defenses (repdef_jax.defenses.baselines)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

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
  out2, _ = jax.jit(d.apply)(g, _batch(), jax.random.key(42))
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


def test_dp_sgd_clipping_padding_and_noise_after_sum():
  model, params, x, y = _model()
  clip, sigma = 1e-3, 2.0
  mask = jnp.array([1, 1, 1, 0])
  batch = base.ClientBatch(params, x, y, mask)
  d = B.dp_sgd(model, clip, 0.0)
  out, info = d(None, batch, jax.random.key(0))
  _, per = gradients.per_example_grads(model, params, x[:3], y[:3])
  norms = np.sqrt(sum(np.sum(np.asarray(l) ** 2, axis=tuple(range(1, l.ndim)))
                      for l in jax.tree_util.tree_leaves(per)))
  want = jax.tree_util.tree_map(
      lambda l: np.tensordot(np.minimum(1, clip / norms), np.asarray(l), 1) / 3,
      per)
  for a, b in zip(jax.tree_util.tree_leaves(want),
                  jax.tree_util.tree_leaves(out)):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-9)
  assert float(info["clipped_fraction"]) == 1.0
  # mean_grad_norm: mean over the 3 real examples of the per-example global
  # L2 norm BEFORE clipping (clip_by_global_norm returns the pre-clip norm;
  # after clipping every norm would be clip = 1e-3 here).
  assert norms.min() > 10 * clip  # pre- and post-clip values differ a lot
  np.testing.assert_allclose(float(info["mean_grad_norm"]), norms.mean(),
                             rtol=1e-5)
  # noise std on the mean is sigma * clip / n_real (divide AFTER the noise).
  noisy, _ = B.dp_sgd(model, clip, sigma)(None, batch, jax.random.key(3))
  resid = np.concatenate([
      (np.asarray(a) - np.asarray(b)).ravel() for a, b in zip(
          jax.tree_util.tree_leaves(noisy), jax.tree_util.tree_leaves(out))])
  np.testing.assert_allclose(np.std(resid), sigma * clip / 3, rtol=0.1)


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
