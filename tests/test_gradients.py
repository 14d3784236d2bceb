"""Per-example gradients: vmap(grad) equals a loop, mean equals batch grad."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from repdef_jax import fedavg
from repdef_jax import gradients
from repdef_jax import models


@pytest.fixture(scope="module")
def setup():
  model = models.get_model("lenet", (28, 28, 1), init="uniform")
  params = model.init(jax.random.key(0))
  kx, ky = jax.random.split(jax.random.key(1))
  x = jax.random.uniform(kx, (5, 28, 28, 1))
  y = jax.random.randint(ky, (5,), 0, 10)
  return model, params, x, y


def _close(a, b, **kw):
  jax.tree_util.tree_map(
      lambda u, v: np.testing.assert_allclose(u, v, **kw), a, b)


def test_per_example_equals_python_loop(setup):
  model, params, x, y = setup
  losses, grads = jax.jit(gradients.per_example_grads, static_argnums=0)(
      model, params, x, y)
  for i in range(x.shape[0]):
    gi = gradients.batch_grad(model, params, x[i:i + 1], y[i:i + 1])
    li = gradients.batch_loss(model, params, x[i:i + 1], y[i:i + 1])
    np.testing.assert_allclose(losses[i], li, rtol=1e-5)
    _close(jax.tree_util.tree_map(lambda g: g[i], grads), gi,
           rtol=1e-4, atol=1e-6)


def test_mean_of_per_example_equals_batch_grad(setup):
  model, params, x, y = setup
  _, grads = gradients.per_example_grads(model, params, x, y)
  mean = jax.tree_util.tree_map(lambda g: g.mean(0), grads)
  _close(mean, gradients.batch_grad(model, params, x, y), rtol=1e-4, atol=1e-6)


def test_local_update_direction_is_what_a_fedavg_client_shares():
  # MLP at its default init: five steps of lr 0.1 move it enough that the
  # update is not one gradient.
  model = models.get_model("mlp", (16, 16, 1), 10)
  params = model.init(jax.random.key(0))
  x = jax.random.uniform(jax.random.key(1), (3, 16, 16, 1))
  y = jnp.array([4, 7, 1])
  steps, lr = 5, 0.1
  direction = jax.jit(gradients.local_update_direction,
                      static_argnums=(0, 4, 5))(model, params, x, y, steps, lr)
  config = fedavg.FedAvgConfig(local_steps=steps, batch_size=3, client_lr=lr)
  delta, _ = fedavg.client_update(model, config, params, x, y, jnp.ones(3),
                                  jax.random.key(2), jax.random.key(3))
  _close(direction, jax.tree_util.tree_map(lambda d: -d / (lr * steps), delta),
         rtol=1e-4, atol=1e-6)
  one = gradients.batch_grad(model, params, x, y)
  assert not np.allclose(direction["head"]["kernel"], one["head"]["kernel"],
                         rtol=1e-2)
  _close(gradients.local_update_direction(model, params, x, y, 1, lr), one,
         rtol=1e-4, atol=1e-6)


def test_soft_one_hot_labels_equal_hard_labels(setup):
  model, params, x, y = setup
  soft = jax.nn.one_hot(y, 10)
  l_hard, g_hard = gradients.per_example_grads(model, params, x, y)
  l_soft, g_soft = gradients.per_example_grads(model, params, x, soft)
  np.testing.assert_allclose(l_hard, l_soft, rtol=1e-6)
  _close(g_hard, g_soft, rtol=1e-5, atol=1e-7)


def test_cross_entropy_matches_formula():
  logits = jnp.array([[1.0, 2.0, 0.5], [0.0, 0.0, 0.0]])
  y = jnp.array([1, 2])
  p = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)
  np.testing.assert_allclose(gradients.cross_entropy(logits, y),
                             -np.log(p[[0, 1], [1, 2]]), rtol=1e-6)
  soft = jnp.array([[0.2, 0.5, 0.3], [1 / 3, 1 / 3, 1 / 3]])
  np.testing.assert_allclose(gradients.cross_entropy(logits, soft),
                             -(soft * np.log(p)).sum(-1), rtol=1e-6)


def test_mask_ignores_padding(setup):
  model, params, x, y = setup
  mask = jnp.array([1, 1, 1, 0, 0])
  padded = x.at[3:].set(7.0)
  g_mask = gradients.batch_grad(model, params, padded, y, mask)
  g_real = gradients.batch_grad(model, params, x[:3], y[:3])
  _close(g_mask, g_real, rtol=1e-5, atol=1e-7)


def test_nan_or_negative_label_padding_stays_out(setup):
  """0 * nan is nan: padded rows are zeroed before the forward pass."""
  model, params, x, y = setup
  mask = jnp.array([1, 1, 1, 0, 0])
  xp = x.at[3].set(jnp.nan)
  yp = y.at[4].set(-1)
  g_real = gradients.batch_grad(model, params, x[:3], y[:3])
  g_pad = jax.jit(gradients.batch_grad, static_argnums=0)(model, params, xp,
                                                          yp, mask)
  _close(g_pad, g_real, rtol=1e-5, atol=1e-7)
  # Unmasked, the same label is still an error signal (NaN), not hidden.
  assert not np.isfinite(float(gradients.batch_loss(model, params, x, yp)))


def test_per_example_chunked_loop_equals_vmap(setup):
  model, params, x, y = setup
  _, full = gradients.per_example_grads(model, params, x, y, chunk=8)
  _, looped = jax.jit(lambda p: gradients.per_example_grads(
      model, p, x, y, chunk=2))(params)
  _close(looped, full, rtol=1e-4, atol=1e-6)


def test_bad_arguments_name_themselves(setup):
  model, params, x, y = setup
  with pytest.raises(ValueError, match="y has 2 labels for 5 images"):
    gradients.per_example_grads(model, params, x, y[:2])
  with pytest.raises(ValueError, match="steps must be an int >= 1"):
    gradients.local_update_direction(model, params, x, y, 0, 0.1)
  with pytest.raises(ValueError, match="lr must be a finite nonzero"):
    gradients.local_update_direction(model, params, x, y, 2, 0.0)


def test_grad_checks_name_the_problem(setup):
  model, params, _, _ = setup
  bad = jax.tree_util.tree_map(jnp.zeros_like, params)
  bad["head"]["bias"] = jnp.zeros(3)
  with pytest.raises(ValueError, match="shared_grads has a leaf of shape"):
    gradients.check_grads_match(params, bad, "shared_grads")
  nan = jax.tree_util.tree_map(jnp.zeros_like, params)
  nan["conv1"]["kernel"] = nan["conv1"]["kernel"].at[0].set(jnp.nan)
  with pytest.raises(ValueError, match="NaN or inf at .*conv1"):
    gradients.check_finite(nan)
  assert not gradients.all_finite(nan)
  inf = jax.tree_util.tree_map(jnp.zeros_like, params)
  inf["head"]["bias"] = inf["head"]["bias"].at[-1].set(-jnp.inf)
  assert not gradients.all_finite(inf)
  assert gradients.all_finite(params)
  with pytest.raises(ValueError, match="integer class ids"):
    gradients.cross_entropy(jnp.zeros((2, 3)), jnp.zeros((2,)))


def test_label_out_of_range_is_nan_and_empty_mask_is_zero(setup):
  """Labels K and -1 (just outside [0, K)) give NaN, K - 1 a finite loss; a
  batch with no real example has loss 0 and a zero (finite) gradient."""
  logits = jnp.array([[1.0, 2.0, 0.5]] * 4)
  loss = np.asarray(gradients.cross_entropy(logits, jnp.array([3, -1, 2, 0])))
  assert np.isnan(loss[:2]).all() and np.isfinite(loss[2:]).all()
  model, params, x, y = setup
  none = jnp.zeros(5)
  assert float(gradients.batch_loss(model, params, x, y, none)) == 0.0
  g = gradients.batch_grad(model, params, x, y, none)
  assert all(np.all(np.asarray(leaf) == 0.0)
             for leaf in jax.tree_util.tree_leaves(g))


def test_labels_with_a_trailing_axis_are_refused_not_broadcast():
  """Hard labels of shape [B, 1] (y[:, None]) or soft labels of shape
  [B, 1] broadcast against [B, K] logits to a finite, wrong loss; they must
  be refused with the message naming both accepted shapes."""
  logits = jnp.array([[1.0, 2.0, 0.5], [0.0, 0.0, 0.0]])
  for labels in (jnp.array([[1], [2]]), jnp.ones((2, 1))):
    with pytest.raises(ValueError, match=r"labels \(soft\) must have the "
                       r"shape of logits \(2, 3\); got shape \(2, 1\)"):
      gradients.cross_entropy(logits, labels)


def test_mask_of_the_wrong_shape_names_itself():
  model = models.get_model("logreg", (4, 4, 1), 3)
  params = model.init(jax.random.key(0))
  x = jnp.ones((3, 4, 4, 1))
  y = jnp.array([0, 1, 2])
  for bad in (jnp.ones((3, 1)), jnp.ones(2)):
    with pytest.raises(ValueError, match=r"mask must have shape \[B\] = "
                       r"\(3,\) for 3 images; got shape"):
      gradients.batch_loss(model, params, x, y, bad)
    for chunk in (1, None):  # looped and batched loss-and-gradient alike
      with pytest.raises(ValueError, match=r"mask must have shape \[B\]"):
        gradients.batch_loss_and_grad(model, params, x, y, bad, chunk=chunk)


def test_check_grads_match_refuses_renamed_layers_of_equal_shapes():
  params = {"a": jnp.zeros(3), "b": jnp.zeros(3)}
  with pytest.raises(ValueError, match="grads does not match the parameter "
                     "tree"):
    gradients.check_grads_match(params, {"a": jnp.zeros(3),
                                         "c": jnp.zeros(3)})


@pytest.mark.parametrize("chunk", [1, 2])
def test_looped_loss_and_grad_equals_the_batch(setup, chunk):
  """The one-example-at-a-time formulation (wide convolutions on CPU) gives
  the batch's masked loss and gradient, NaN padding and bad labels kept
  out."""
  model, params, x, y = setup
  mask = jnp.array([1, 0, 1, 1, 0])
  xp, yp = x.at[1].set(jnp.nan), y.at[4].set(-1)
  want = jax.value_and_grad(
      lambda p: gradients.batch_loss(model, p, x, y, mask))(params)
  got = jax.jit(lambda p: gradients.batch_loss_and_grad(
      model, p, xp, yp, mask, chunk=chunk))(params)
  _close(got, want, rtol=1e-4, atol=1e-6)
  # Unmasked: the plain mean of every example.
  want = jax.value_and_grad(
      lambda p: gradients.batch_loss(model, p, x, y))(params)
  _close(gradients.batch_loss_and_grad(model, params, x, y, chunk=chunk),
         want, rtol=1e-4, atol=1e-6)


def test_wide_convolutions_train_one_example_at_a_time_on_cpu():
  """ConvNet64's step is 1.5-1.7x faster looped on CPU (docs/design.md);
  LeNet's batched (looped 2-8x slower)."""
  wide = models.get_model("convnet64", (32, 32, 3), 10)
  narrow = models.get_model("lenet", (32, 32, 3), 10)
  for model, chunk in ((wide, 1), (narrow, 1 << 30)):
    params = jax.eval_shape(model.init, jax.random.key(0))
    assert gradients.per_example_chunk(model, params, "cpu") == chunk
    assert gradients.per_example_chunk(model, params, "gpu") == 1 << 30
