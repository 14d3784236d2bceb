"""Contract every registered Soteria perturbation (q-norm) must satisfy.

Template for a new norm: register it with
``@repdef_jax.defenses.soteria.register_perturbation('q2')`` in a module and
name the module in ``$REPDEF_JAX_PLUGINS`` (comma-separated; imported here
before the tests are collected), e.g. ``REPDEF_JAX_PLUGINS=myq2 pytest
tests/test_perturbation_template.py``; these parametrised tests then run on
it too (shape, finiteness, determinism, jit, strength 0 = identity, a
positive strength perturbs and a larger one no fewer rows, only the
defended kernel rows touched).
"""

import importlib
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from repdef_jax import gradients
from repdef_jax import models
from repdef_jax.defenses import base
from repdef_jax.defenses import soteria as S

for _plugin in filter(None, os.environ.get("REPDEF_JAX_PLUGINS",
                                           "").split(",")):
  importlib.import_module(_plugin.strip())


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


def test_a_plugin_norm_reaches_the_contract_and_the_command_line(tmp_path):
  """A module registering 'q9' (row scale 1, strength in its own units):
  named in $REPDEF_JAX_PLUGINS, the contract runs on it; named by
  ``--plugins``, ``experiments.fedavg`` accepts ``soteria_q='q9'`` with
  strength 150 (the run then stops at the missing data, after the config
  checks); without it the command names the registered norms."""
  (tmp_path / "myq9.py").write_text(
      "import jax.numpy as jnp\n"
      "from repdef_jax.defenses import soteria\n\n\n"
      "@soteria.register_perturbation('q9')\n"
      "def q9(ctx, strength):\n"
      "  scale = 1.0 / (1.0 + strength / 100.0)\n"
      "  return jnp.where(ctx.scores <= jnp.min(ctx.scores), scale, 1.0), {}\n")
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  env = {k: v for k, v in os.environ.items() if k != "TFDS_DATA_DIR"}
  env.update(PYTHONPATH=os.pathsep.join([str(tmp_path), root]),
             JAX_PLATFORMS="cpu", REPDEF_JAX_OFFLINE="1",
             REPDEF_JAX_CACHE=str(tmp_path / "cache"))
  run = lambda *args: subprocess.run(  # noqa: E731
      [sys.executable, *args], cwd=root, env=env, capture_output=True,
      text=True, timeout=300)
  contract = ("-m", "pytest", "-q", "-p", "no:cacheprovider", "-o",
              "addopts=", os.path.abspath(__file__), "-k", "contract and q9")
  out = run(*contract)  # Not registered: no q9 case is collected.
  assert out.returncode == 5, out.stdout[-2000:]
  env["REPDEF_JAX_PLUGINS"] = "myq9"
  out = run(*contract)
  assert out.returncode == 0 and "3 passed" in out.stdout, out.stdout[-2000:]
  flags = ["--config.defense=soteria", "--config.soteria_q=q9",
           "--config.defense_strength=150", f"--data_dir={tmp_path}",
           f"--workdir={tmp_path / 'run'}"]
  out = run("-m", "experiments.fedavg", "--plugins=myq9", *flags)
  assert "fedavg: error: No data for dataset 'mnist'" in out.stderr, (
      out.stderr[-2000:])
  out = run("-m", "experiments.fedavg", *flags)
  assert "soteria_q must name a registered perturbation" in out.stderr


def test_registration_and_strength_checks_follow_the_norm():
  """A non-callable is refused at registration, naming the norm; a FedAvg
  config checks a registered norm's strength by that norm's rule (150 is
  no percent, yet fine for a norm in its own units), q0's as a percent."""
  with pytest.raises(ValueError, match="perturbation 'zz' must be a "
                     "function"):
    S.register_perturbation("zz")(5)
  assert "zz" not in S.PERTURBATIONS
  from repdef_jax import defenses  # pylint: disable=g-import-not-at-top
  name = "q_units_test"
  S.register_perturbation(name)(
      lambda ctx, strength: (jnp.ones_like(ctx.scores), {}))
  try:
    defenses.check_strength("soteria", 150.0, "defense_strength", q=name)
    with pytest.raises(ValueError, match="finite real number"):
      defenses.check_strength("soteria", float("nan"), q=name)
  finally:
    S.PERTURBATIONS.pop(name)
  with pytest.raises(ValueError, match=r"defense_strength \(soteria\): "
                     "percent must be"):
    defenses.check_strength("soteria", 150.0, "defense_strength")
