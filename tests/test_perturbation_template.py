"""Contract every registered Soteria perturbation (q-norm) must satisfy.

Template for a new norm: register it with
``@repdef_jax.defenses.soteria.register_perturbation('q2')`` and these
parametrised tests run on it automatically (shape, finiteness, determinism,
jit, strength 0 = identity, a positive strength perturbs and a larger one
no fewer rows, only the defended kernel rows touched).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from repdef_jax import gradients
from repdef_jax import models
from repdef_jax.defenses import base
from repdef_jax.defenses import soteria as S


@pytest.fixture(scope="module")
def setup():
  model = models.get_model("mlp", (4, 4, 1), hidden=(12,))
  params = model.init(jax.random.key(0))
  x = jax.random.uniform(jax.random.key(1), (3, 4, 4, 1))
  y = jnp.array([0, 1, 2])
  g = gradients.batch_grad(model, params, x, y)
  r, jac = S.features_and_jacobian(model.feature_fn(params), x)
  w = jnp.ones((3,))
  ctx = S.PerturbationInputs(
      scores=S.scores_from_jacobian(r, jac, eps=0.1, weights=w), r=r,
      jac_row_norms=jnp.linalg.norm(jac, axis=-1), weights=w,
      active=jnp.any(r != 0, axis=0), selection="count")
  return model, params, x, y, g, ctx


@pytest.mark.parametrize("name", sorted(S.PERTURBATIONS))
@pytest.mark.parametrize("strength", [0.0, 30.0, 100.0])
def test_perturbation_contract(setup, name, strength):
  model, params, x, y, g, ctx = setup
  fn = S.PERTURBATIONS[name]
  scale, info = fn(ctx, strength)
  f = ctx.scores.shape[0]
  assert scale.shape == (f,)
  assert bool(jnp.all(jnp.isfinite(scale)))
  assert all(jnp.ndim(v) == 0 for v in info.values())
  scale2, _ = fn(ctx, strength)
  np.testing.assert_array_equal(scale, scale2)                  # deterministic
  scale3 = jax.jit(lambda s: fn(ctx, s)[0])(strength)
  # jit == eager up to XLA's float rewrites (q0's 0/1 mask is exact).
  np.testing.assert_allclose(scale, scale3, rtol=1e-6, atol=1e-7)
  if name == "q0":
    np.testing.assert_array_equal(scale, scale3)
  if strength == 0.0:
    np.testing.assert_array_equal(scale, np.ones(f))            # identity
  else:  # A positive strength perturbs.
    assert bool(jnp.any(scale != 1.0)), "strength > 0 changed nothing"
  if strength > 30.0:  # And more of it at 100 than at 30.
    weaker = fn(ctx, 30.0)[0]
    assert int(jnp.sum(scale != 1.0)) >= int(jnp.sum(weaker != 1.0))
  # Through the defense: only the defended kernel rows may change.
  out, _ = S.soteria(model, strength, q=name, selection="count")(
      g, base.ClientBatch(params, x, y), jax.random.key(0))
  for (path, a), b in zip(jax.tree_util.tree_flatten_with_path(g)[0],
                          jax.tree_util.tree_leaves(out)):
    keys = tuple(k.key for k in path)
    if keys == ("head", "kernel"):
      np.testing.assert_allclose(
          np.asarray(b), np.asarray(a) * np.asarray(scale)[:, None],
          rtol=1e-6, atol=1e-7)
    else:
      np.testing.assert_array_equal(a, b)
