"""Models: parameter counts, shapes, conv formulations, registry errors."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from repdef_jax import models

SHAPES = {"mnist": (28, 28, 1), "cifar10": (32, 32, 3)}


def test_lenet_cifar_has_19438_parameters():
  model = models.get_model("lenet", (32, 32, 3), 10)
  assert models.num_params(model.init(jax.random.key(0))) == 19_438


@pytest.mark.parametrize("name", models.MODEL_NAMES)
@pytest.mark.parametrize("dataset", sorted(SHAPES))
def test_output_and_representation_shapes(name, dataset):
  model = models.get_model(name, SHAPES[dataset], 10)
  params = jax.eval_shape(model.init, jax.random.key(0))
  x = jax.ShapeDtypeStruct((2, *SHAPES[dataset]), jnp.float32)
  assert jax.eval_shape(model.apply, params, x).shape == (2, 10)
  assert jax.eval_shape(model.features, params, x).shape == (
      2, model.num_features)
  head = models.defended_params(model, params)
  assert head["kernel"].shape == (model.num_features, 10)


@pytest.mark.parametrize("name", ["lenet", "lenet5", "mlp", "logreg"])
def test_logits_are_the_defended_layer_applied_to_r(name):
  model = models.get_model(name, (28, 28, 1), 10)
  params = model.init(jax.random.key(0))
  x = jax.random.uniform(jax.random.key(1), (2, 28, 28, 1))
  head = models.defended_params(model, params)
  np.testing.assert_allclose(
      model.apply(params, x),
      model.features(params, x) @ head["kernel"] + head["bias"], atol=1e-5)


def test_known_representation_sizes():
  expected = {("lenet", "cifar10"): 768, ("lenet", "mnist"): 588,
              ("convnet64", "cifar10"): 2304, ("convnet64", "mnist"): 2304,
              ("lenet5", "cifar10"): 84, ("leakage", "cifar10"): 12 * 32 * 32,
              ("logreg", "mnist"): 784}
  for (name, ds), f in expected.items():
    assert models.get_model(name, SHAPES[ds]).num_features == f


def test_uniform_init_is_in_range():
  model = models.get_model("lenet", init="uniform")
  leaves = jax.tree_util.tree_leaves(model.init(jax.random.key(1)))
  allv = np.concatenate([np.ravel(l) for l in leaves])
  assert allv.min() >= -0.5 and allv.max() <= 0.5 and allv.std() > 0.25


@pytest.mark.parametrize("name,kwargs", [("lenet", {}), ("lenet5", {}),
                                         ("convnet64", {"width": 4})])
@pytest.mark.parametrize("impl", ["patches", "s2d"])
def test_conv_formulations_equal_xla_conv(name, kwargs, impl):
  m1 = models.get_model(name, (32, 32, 3), conv_impl="xla", **kwargs)
  m2 = m1.with_conv_impl(impl)
  params = m1.init(jax.random.key(0))
  x = jax.random.uniform(jax.random.key(1), (3, 32, 32, 3))
  np.testing.assert_allclose(jax.jit(m1.apply)(params, x),
                             jax.jit(m2.apply)(params, x), rtol=1e-4, atol=1e-5)
  # Gradients too (the formulations differ most in their backward pass).
  f = lambda m: jax.jit(jax.grad(lambda p, x: jnp.sum(m.apply(p, x) ** 2),
                                 (0, 1)))(params, x)
  jax.tree_util.tree_map(
      lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-3, atol=1e-5),
      f(m1), f(m2))


def test_examples_are_independent():
  model = models.get_model("convnet64", (32, 32, 3), width=8)
  params = model.init(jax.random.key(0))
  x = jax.random.uniform(jax.random.key(1), (4, 32, 32, 3))
  batched = model.apply(params, x)
  single = jnp.concatenate([model.apply(params, x[i:i + 1]) for i in range(4)])
  np.testing.assert_allclose(batched, single, rtol=1e-5, atol=1e-5)


def test_feature_fn_matches_batch():
  model = models.get_model("lenet", (28, 28, 1))
  params = model.init(jax.random.key(0))
  x = jax.random.uniform(jax.random.key(1), (2, 28, 28, 1))
  np.testing.assert_allclose(model.feature_fn(params)(x[1]),
                             model.features(params, x)[1], atol=1e-6)


def test_bad_inputs_name_the_argument():
  with pytest.raises(ValueError, match="valid names: lenet"):
    models.get_model("resnet")
  with pytest.raises(ValueError, match="init"):
    models.get_model("lenet", init="xavier")
  with pytest.raises(ValueError, match="conv_impl"):
    models.get_model("lenet", conv_impl="fft")
  with pytest.raises(ValueError, match="input_shape"):
    models.get_model("lenet", (32, 32))
  with pytest.raises(ValueError, match="cannot take images"):
    models.get_model("convnet64", (4, 4, 3))
  model = models.get_model("lenet", (32, 32, 3))
  params = model.init(jax.random.key(0))
  with pytest.raises(ValueError, match=r"x must be a batch of images of shape"):
    model.apply(params, jnp.zeros((1, 28, 28, 1)))
