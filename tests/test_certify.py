"""Tests of the Theorem 1 certified bound (repdef_jax.defenses.certify)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from repdef_jax import gradients
from repdef_jax import models
from repdef_jax.defenses import base
from repdef_jax.defenses import certify as C
from repdef_jax.defenses import soteria as S


def test_bound_monotone_in_pruning_rate_count_selection():
  model = models.get_model("leakage", (6, 6, 1))
  params = model.init(jax.random.key(0))
  x = jax.random.uniform(jax.random.key(1), (2, 6, 6, 1))
  fn = model.feature_fn(params)
  scores = S.feature_scores(fn, x, eps=model.score_eps)
  prev = np.zeros(2)
  for pct in [0, 10, 20, 40, 60, 80, 100]:
    keep = S.mask_from_scores(scores, pct, selection="count")
    bound = np.asarray(C.certified_bound(model, params, x, keep))
    assert np.all(bound >= prev - 1e-7)
    prev = bound
  assert np.all(prev > 0)
  np.testing.assert_allclose(
      C.certified_bound(model, params, x, jnp.ones(scores.shape)), 0.0)


def test_bound_exact_for_linear_feature_map():
  """For r = A x the theorem is exact: every X' with A X' = r' obeys it."""
  rng = np.random.default_rng(0)
  a = jnp.asarray(rng.normal(size=(6, 15)).astype(np.float32))
  fn = lambda xi: a @ xi
  x = jnp.asarray(rng.normal(size=(3, 15)).astype(np.float32))
  keep = jnp.array([1, 0, 1, 0, 1, 1.0])
  bound = np.asarray(C.certified_bound_fn(fn, x, keep))
  r = x @ a.T
  r_prime = r * keep
  sigma = np.linalg.svd(np.asarray(a), compute_uv=False)[0]
  np.testing.assert_allclose(bound, np.linalg.norm(r - r_prime, axis=1) / sigma,
                             rtol=1e-5)
  pinv = np.linalg.pinv(np.asarray(a))
  null = np.eye(15) - pinv @ np.asarray(a)
  for seed in range(5):  # min-norm inversion plus random null-space moves
    z = np.random.default_rng(seed).normal(size=(3, 15)) * seed
    x_rec = np.asarray(x) + (np.asarray(r_prime - r)) @ pinv.T + z @ null.T
    np.testing.assert_allclose(x_rec @ np.asarray(a).T, r_prime, atol=1e-4)
    dist = np.linalg.norm(np.asarray(x) - x_rec, axis=1)
    assert np.all(dist >= bound * (1 - 1e-5))


def test_bound_is_zero_where_the_jacobian_is_zero_and_masks_per_image():
  """r = 1 + relu(x): J = diag(x > 0), sigma = 1 unless every x_i <= 0."""
  fn = lambda xi: 1.0 + jax.nn.relu(xi)
  x = jnp.array([[-1.0, -2.0, -3.0], [1.0, -1.0, 2.0]])  # r = 1; [2, 1, 3]
  # J = 0 for the first image: no bound (0), not r_S / 0.
  np.testing.assert_allclose(C.certified_bound_fn(fn, x, jnp.array([1, 0, 0.])),
                             [0.0, np.sqrt(1 + 9)], rtol=1e-6)
  # A [B, F] keep-mask: one mask per image.
  keep = jnp.array([[1, 1, 1], [0, 1, 1.]])
  np.testing.assert_allclose(C.certified_bound_fn(fn, x, keep), [0.0, 2.0],
                             rtol=1e-6)


def test_power_iteration_matches_svd():
  model = models.get_model("mlp", (4, 4, 1), hidden=(10,))
  params = model.init(jax.random.key(0))
  x = jax.random.uniform(jax.random.key(1), (1, 4, 4, 1))
  fn = model.feature_fn(params)
  _, sigma = C.jacobian_spectral_norms(fn, x)
  est = C.spectral_norm_power(fn, x[0], jax.random.key(2), iters=200)
  np.testing.assert_allclose(est, sigma[0], rtol=1e-3)
  # Rows of the Jacobian 3 at a time (memory): the same norm and bound.
  _, chunked = C.jacobian_spectral_norms(fn, x, chunk=3)
  np.testing.assert_allclose(chunked, sigma, rtol=1e-6)
  keep = jnp.arange(10) % 2
  np.testing.assert_allclose(
      C.certified_bound(model, params, x, keep, chunk=3),
      C.certified_bound(model, params, x, keep), rtol=1e-6)


def test_theorem_attacker_on_defended_logreg_meets_the_bound():
  """Logistic regression, r = x (J = I, sigma = 1): the bound is known in
  closed form, ||x * (1 - keep)||, and the theorem's own attacker, who reads
  r' off the defended gradient (kernel row / bias, exact for one image) and
  inverts f, lands exactly on it: the bound is tight, and Soteria's shared
  gradient reveals exactly the kept pixels."""
  model = models.get_model("logreg", (4, 4, 1), init="uniform")
  params = model.init(jax.random.key(0))
  x = jax.random.uniform(jax.random.key(1), (1, 4, 4, 1))
  y = jnp.array([3])
  g = gradients.batch_grad(model, params, x, y)
  shared, _ = S.soteria(model, 50, selection="count")(
      g, base.ClientBatch(params, x, y), jax.random.key(0))
  keep = (jnp.abs(shared["head"]["kernel"]).sum(1) > 0).astype(jnp.float32)
  assert int(keep.sum()) == 8
  flat = np.asarray(x).reshape(-1)
  want = np.linalg.norm(flat * (1 - np.asarray(keep)))
  bound = np.asarray(C.certified_bound(model, params, x, keep))
  np.testing.assert_allclose(bound, [want], rtol=1e-5)
  k = int(jnp.argmax(jnp.abs(shared["head"]["bias"])))
  r_prime = np.asarray(shared["head"]["kernel"][:, k] /
                       shared["head"]["bias"][k])
  np.testing.assert_allclose(r_prime, flat * np.asarray(keep), rtol=1e-4,
                             atol=1e-6)
  dist = np.asarray(C.input_distance(x, jnp.asarray(r_prime).reshape(x.shape)))
  np.testing.assert_allclose(dist, bound, rtol=1e-4)


def test_empirical_bound_is_a_first_order_lower_bound():
  """For a small move d of a nonlinear f, ||f(x + d) - f(x)|| / sigma(x) is
  ||d|| along the top right singular vector of J(x) and less elsewhere."""
  model = models.get_model("mlp", (4, 4, 1), hidden=(10,))
  params = model.init(jax.random.key(0))
  x = jax.random.uniform(jax.random.key(1), (1, 4, 4, 1))
  jac = np.asarray(jax.jacobian(model.feature_fn(params))(x[0])).reshape(10, -1)
  top = np.linalg.svd(jac)[2][0].reshape(x.shape)
  other = np.asarray(jax.random.normal(jax.random.key(2), x.shape))
  step = 1e-3

  def emp(d):
    d = step * d / np.linalg.norm(d)
    return float(C.empirical_bound(model, params, x, x + d)[0])

  np.testing.assert_allclose(emp(top), step, rtol=1e-2)
  assert emp(other) < 0.9 * step


def test_empirical_bound_divides_by_the_jacobian_at_the_true_image():
  """For a far reconstruction X' (another ReLU pattern, so J(X') != J(X)),
  the bound is ||f(X) - f(X')|| / sigma_max(J(X)), per image, not
  sigma_max(J(X'))."""
  model = models.get_model("mlp", (4, 4, 1), hidden=(10,))
  params = model.init(jax.random.key(0))
  x = jax.random.uniform(jax.random.key(1), (2, 4, 4, 1))
  x_rec = x[::-1] - 1.0  # other image, shifted: a different linear region
  fn = model.feature_fn(params)

  def sigma(xi):
    return np.linalg.svd(np.asarray(jax.jacobian(fn)(xi)).reshape(10, -1),
                         compute_uv=False)[0]

  want = [np.linalg.norm(np.asarray(fn(x[i]) - fn(x_rec[i]))) / sigma(x[i])
          for i in range(2)]
  assert not np.allclose([sigma(x[i]) for i in range(2)],
                         [sigma(x_rec[i]) for i in range(2)], rtol=1e-2)
  np.testing.assert_allclose(C.empirical_bound(model, params, x, x_rec), want,
                             rtol=1e-5)


def test_input_distance_is_per_image():
  x = jnp.zeros((2, 2, 2, 1))
  x_rec = x.at[0, 0, 0, 0].set(3.0).at[1].set(1.0)  # image 1: 4 pixels of 1
  np.testing.assert_allclose(C.input_distance(x, x_rec), [3.0, 2.0])


def test_precomputed_spectral_norms_give_the_same_bounds():
  model = models.get_model("leakage", (6, 6, 1))
  params = model.init(jax.random.key(0))
  x = jax.random.uniform(jax.random.key(1), (3, 6, 6, 1))
  x_rec = jax.random.uniform(jax.random.key(2), (3, 6, 6, 1))
  _, sigma = C.jacobian_spectral_norms(model.feature_fn(params), x)
  keep = (jax.random.uniform(jax.random.key(3), (3, model.num_features))
          > 0.5).astype(jnp.float32)
  np.testing.assert_allclose(
      C.certified_bound(model, params, x, keep, sigma=sigma),
      C.certified_bound(model, params, x, keep), rtol=1e-6)
  np.testing.assert_allclose(
      C.empirical_bound(model, params, x, x_rec, sigma=sigma),
      C.empirical_bound(model, params, x, x_rec), rtol=1e-6)
  bound = C.certified_bound(model, params, x, keep, sigma=sigma)
  assert float(jnp.min(bound)) > 0
  # The given norms are the ones used: twice the norm, half the bound.
  np.testing.assert_allclose(
      C.certified_bound(model, params, x, keep, sigma=2 * sigma), bound / 2,
      rtol=1e-6)
  np.testing.assert_allclose(
      C.empirical_bound(model, params, x, x_rec, sigma=2 * sigma),
      C.empirical_bound(model, params, x, x_rec, sigma=sigma) / 2, rtol=1e-6)
  with pytest.raises(ValueError, match=r"sigma must have shape \[B\]"):
    C.certified_bound(model, params, x, keep, sigma=sigma[None])
  with pytest.raises(ValueError, match=r"sigma must have shape \[B\]"):
    C.empirical_bound(model, params, x, x_rec, sigma=sigma[:2])
