"""Models: parameter counts, shapes, conv formulations, registry errors."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from repdef_jax import host
from repdef_jax import models

SHAPES = {"mnist": (28, 28, 1), "cifar10": (32, 32, 3)}


def test_lenet_cifar_has_19438_parameters():
  model = models.get_model("lenet", (32, 32, 3), 10)
  assert models.num_params(model.init(jax.random.key(0))) == 19_438


def test_convnet64_cifar_has_2901770_parameters():
  """Counted by hand from Inverting Gradients' ConvNet (inversefed, width
  64, batch norm left out): eight 3x3 convolutions (padding 1) with widths
  w, 2w, 2w, 4w, 4w, 4w, 4w, 4w, a 3x3 max-pool after the sixth and after
  the eighth, then one linear layer."""
  w, (h, _, cin) = 64, SHAPES["cifar10"]
  widths = [w, 2 * w, 2 * w, 4 * w, 4 * w, 4 * w, 4 * w, 4 * w]
  total = 0
  for cout in widths:
    total += 3 * 3 * cin * cout + cout  # kernel + bias
    cin = cout
  side = h // 3 // 3  # 32 -> 10 -> 3
  features = side * side * cin
  assert features == 2304 == 36 * w  # inversefed's Linear(36 * width, 10)
  total += features * 10 + 10
  assert total == 2_901_770
  model = models.get_model("convnet64", (32, 32, 3), 10)
  params = jax.eval_shape(model.init, jax.random.key(0))
  assert models.num_params(params) == total


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


def test_jitted_init_equals_flax_eager_init():
  # Model.init is one jitted program, compiled on CPU at XLA's level 1; it
  # must draw flax's eager bits, and those of a program compiled at XLA's
  # default level 3 (the suite runs at level 1), or the committed results
  # would no longer be reproduced.
  key = jax.random.key(3)
  inits = ("default", "uniform")
  ms = [models.get_model("leakage", (12, 12, 1), init=i) for i in inits]
  flax_init = lambda k: [m.module.init(  # noqa: E731
      k, jnp.zeros((1, 12, 12, 1)))["params"] for m in ms]
  ours = [m.init(key) for m in ms]
  level3 = jax.jit(flax_init).lower(key).compile(  # One program, both.
      compiler_options={"xla_backend_optimization_level": 3})
  for other in (flax_init(key), level3(key)):
    jax.tree_util.tree_map(np.testing.assert_array_equal, ours, other)


def test_uniform_init_is_in_range():
  model = models.get_model("lenet", init="uniform")
  params = model.init(jax.random.key(1))
  leaves = jax.tree_util.tree_leaves(params)
  allv = np.concatenate([np.ravel(l) for l in leaves])
  assert allv.min() >= -0.5 and allv.max() <= 0.5 and allv.std() > 0.25
  # Every weight *and bias* of every layer (DLG), not only the kernels: the
  # 58 biases are too few to move the pooled statistics above.
  for path, leaf in jax.tree_util.tree_leaves_with_path(params):
    assert np.abs(leaf).max() <= 0.5 and np.ptp(leaf) > 0.5, path


@pytest.mark.parametrize("name,kwargs", [("lenet", {}), ("lenet5", {}),
                                         ("convnet64", {"width": 4})])
@pytest.mark.parametrize("impl", ["patches", "s2d", "dense", "jacobian",
                                  "second_order"])
def test_conv_formulations_equal_xla_conv(name, kwargs, impl):
  if impl == "dense" and name == "convnet64":
    pytest.skip("'dense' is for small layers; ConvNet's 32x32 ones take "
                "minutes as matrices (LeNet and LeNet5 cover it)")
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


def _ref_conv(x, p, stride, padding):
  return jax.lax.conv_general_dilated(
      x, p["kernel"], (stride, stride), [(padding, padding)] * 2,
      dimension_numbers=("NHWC", "HWIO", "NHWC")) + p["bias"]


@pytest.mark.parametrize("h,w,k,stride,padding", [
    (9, 7, 3, 2, 1), (10, 11, 5, 3, 2), (8, 8, 5, 2, 0), (6, 5, 3, 1, 1)])
def test_patches_and_dense_conv_equal_xla_conv_on_odd_shapes(h, w, k, stride,
                                                           padding):
  # The phase-plane slicing of _patches and the gathered matrix of
  # _dense_conv at sizes that the stride does not divide and on non-square
  # images (the models only test them on square ones), value and input
  # gradient.
  x = jax.random.normal(jax.random.key(0), (2, h, w, 3))
  kernel = jax.random.normal(jax.random.key(1), (k, k, 3, 4))
  ref = lambda x: _ref_conv(x, {"kernel": kernel, "bias": 0.0}, stride,
                            padding)
  patches = lambda x: jnp.einsum("nhwk,ko->nhwo",
                                 models._patches(x, k, stride, padding),
                                 kernel.reshape(-1, 4))
  dense = lambda x: models._dense_conv(x, kernel, stride, padding)
  g = jax.random.normal(jax.random.key(2), ref(x).shape)
  for ours in (patches, dense):
    np.testing.assert_allclose(ours(x), ref(x), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(jax.vjp(ours, x)[1](g)[0],
                               jax.vjp(ref, x)[1](g)[0], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("shape,k,stride,padding", [
    ((2, 9, 7, 3), 3, 2, 1), ((2, 10, 11, 2), 5, 3, 2),
    ((1, 16, 16, 12), 5, 1, 2), ((2, 8, 8, 1), 5, 2, 0)])
def test_separable_patches_are_the_kxk_slices(shape, k, stride, padding):
  # Both gathers of _patches give the same array, exactly, and so the same
  # input gradient; the default picks the separable one only for a kernel of
  # at least SEPARABLE_MIN_KERNEL over several channels.
  x = jax.random.normal(jax.random.key(0), shape)
  g = jax.random.normal(jax.random.key(1),
                        models._patches(x, k, stride, padding).shape)
  out = {}
  for sep in (False, True):
    y, vjp = jax.vjp(lambda x: models._patches(x, k, stride, padding, sep), x)
    out[sep] = (y, vjp(g)[0])
  np.testing.assert_array_equal(out[True][0], out[False][0])
  np.testing.assert_allclose(out[True][1], out[False][1], rtol=1e-6, atol=1e-6)
  default = shape[-1] > 1 and k >= models.SEPARABLE_MIN_KERNEL
  hlo = lambda *sep: jax.jit(
      lambda x: models._patches(x, k, stride, padding, *sep)).lower(x).as_text()
  assert hlo() == hlo(default) != hlo(not default)


def _ref_dense(x, p):
  return x.reshape(x.shape[0], -1) @ p["kernel"] + p["bias"]


def _ref_pool(x, s):
  """PyTorch's MaxPool2d(s): s x s windows, stride s, floor."""
  n, h, w, c = x.shape
  x = x[:, :h // s * s, :w // s * s]
  return x.reshape(n, h // s, s, w // s, s, c).max(axis=(2, 4))


def _reference_features(name, p, x):
  """The module docstring's architectures, written out layer by layer."""
  sig, relu = jax.nn.sigmoid, jax.nn.relu
  if name == "lenet":  # conv 5x5, padding 2, strides 2, 2, 1, 1, sigmoid
    for i, s in enumerate((2, 2, 1, 1)):
      x = sig(_ref_conv(x, p[f"conv{i}"], s, 2))
  elif name == "convnet64":  # conv 3x3 padding 1, ReLU, max-pool 3 after 6, 8
    for i in range(8):
      x = relu(_ref_conv(x, p[f"conv{i}"], 1, 1))
      if i in (5, 7):
        x = _ref_pool(x, 3)
  elif name == "lenet5":  # conv 5x5, ReLU, max-pool 2 (twice), FC, FC
    for conv in ("conv0", "conv1"):
      x = _ref_pool(relu(_ref_conv(x, p[conv], 1, 0)), 2)
    for fc in ("fc0", "fc1"):
      x = relu(_ref_dense(x, p[fc]))
  elif name == "leakage":  # conv 5x5, padding 2, sigmoid
    x = sig(_ref_conv(x, p["conv0"], 1, 2))
  elif name == "mlp":
    for fc in ("fc0", "fc1"):
      x = relu(_ref_dense(x, p[fc]))
  return x.reshape(x.shape[0], -1)


@pytest.mark.parametrize("name,shape,kwargs", [
    ("lenet", (32, 32, 3), {}), ("convnet64", (32, 32, 3), {"width": 4}),
    ("lenet5", (32, 32, 3), {}), ("leakage", (28, 28, 1), {}),
    ("mlp", (28, 28, 1), {"hidden": (16, 8)}), ("logreg", (28, 28, 1), {})])
def test_models_match_a_layer_by_layer_reference(name, shape, kwargs):
  # Architecture (activations, strides, pool positions, biases) against the
  # module docstring, written out with lax convolutions. Parameters drawn
  # from U(-0.5, 0.5), so that every bias is nonzero (the default init
  # zeroes them), without compiling Model.init (8 s for the ConvNet).
  model = models.get_model(name, shape, **kwargs)
  rng = np.random.default_rng(0)
  params = jax.tree_util.tree_map(
      lambda s: jnp.asarray(rng.uniform(-0.5, 0.5, s.shape), s.dtype),
      jax.eval_shape(model.init, jax.random.key(0)))
  x = jax.random.uniform(jax.random.key(1), (2, *shape))
  r, logits, ref = jax.jit(lambda p, x: (
      model.features(p, x), model.apply(p, x),
      _reference_features(name, p, x)))(params, x)
  np.testing.assert_allclose(r, ref, rtol=1e-4, atol=1e-5)
  np.testing.assert_allclose(logits, _ref_dense(ref, params["head"]),
                             rtol=1e-4, atol=1e-4)


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
  for shape in ("mnist", 28, (28, "a", 1)):
    with pytest.raises(ValueError, match="input_shape must be"):
      models.get_model("lenet", shape)
  with pytest.raises(ValueError, match="cannot take images"):
    models.get_model("convnet64", (4, 4, 3))
  with pytest.raises(ValueError, match="Unknown keyword argument.* widht for "
                     "model 'convnet64'; it accepts width"):
    models.get_model("convnet64", widht=3)
  with pytest.raises(ValueError, match="hidden for model 'lenet'; it accepts "
                     "none"):
    models.get_model("lenet", hidden=(8,))
  model = models.get_model("lenet", (32, 32, 3))
  params = model.init(jax.random.key(0))
  with pytest.raises(ValueError, match=r"x must be a batch of images of shape"):
    model.apply(params, jnp.zeros((1, 28, 28, 1)))


def test_a_new_model_that_misses_the_recipe_is_named(monkeypatch):
  """docs/design.md's recipe for a model, each mistake one line."""
  import flax.linen as nn  # pylint: disable=g-import-not-at-top

  class Plain(nn.Module):  # A flax module ending in 'head', nothing more.
    num_classes: int = 10
    init_scheme: str = "default"
    conv_impl: str = "auto"

    @nn.compact
    def __call__(self, x):
      return nn.Dense(self.num_classes, name="head")(x.reshape(len(x), -1))

  class Fields(models._Classifier):  # pylint: disable=protected-access
    num_classes: int = 10

  def classifier(head_name, logits):
    class Tiny(models._Classifier):  # pylint: disable=protected-access
      num_classes: int = 10
      init_scheme: str = "default"
      conv_impl: str = "auto"
      identity_bottom = True

      def setup(self):
        self.head = nn.Dense(logits, name=head_name)

      def top_pre(self, h):
        return h

      def top_post(self, z):
        return z.reshape(z.shape[0], -1)
    return Tiny

  class NotAModule:  # Not even a dataclass.
    pass

  cases = {
      "plain": (Plain, "must subclass repdef_jax.models._Classifier"),
      "class": (NotAModule, "must subclass repdef_jax.models._Classifier"),
      "fields": (Fields, "have the fields num_classes, init_scheme and "
                 "conv_impl"),
      "renamed": (classifier("out", 10),
                  "has no Dense layer named 'head'"),
      "logits": (classifier("head", 3),
                 r"gives logits of shape \(1, 3\) for one image; expected "
                 r"\(1, 10\)"),
  }
  for name, (cls, match) in cases.items():
    monkeypatch.setitem(models._MODULES, name, (cls, "relu", ("head",)))  # pylint: disable=protected-access
    with pytest.raises(ValueError, match=f"Model '{name}'.*{match}"):
      models.get_model(name, (4, 4, 1))
  monkeypatch.setitem(models._MODULES, "tiny",  # pylint: disable=protected-access
                      (classifier("head", 10), "relu", ("head",)))
  assert models.get_model("tiny", (4, 4, 1)).num_features == 16


@pytest.mark.parametrize("h,w,cin,stride,padding,k", [
    (28, 28, 1, 2, 2, 5), (14, 14, 12, 2, 2, 5), (7, 7, 12, 1, 2, 5),
    (9, 10, 2, 2, 2, 5), (10, 10, 3, 2, 1, 5), (11, 11, 3, 3, 3, 5),
    (8, 8, 3, 2, 0, 3), (6, 6, 2, 2, 4, 3)])
def test_s2d_conv_value_gradients_and_jvp_equal_xla(h, w, cin, stride,
                                                    padding, k):
  # Padding inside the s2d convolution (p % s == 0, even sizes) and the
  # explicit-padding fallback; the custom JVP and its transposes.
  x = jax.random.normal(jax.random.key(0), (2, h, w, cin))
  ref = models.Conv2D(4, k, strides=stride, padding=padding, impl="xla")
  s2d = ref.clone(impl="s2d")
  params = ref.init(jax.random.key(1), x)
  f1 = lambda p, x: ref.apply(p, x)
  f2 = lambda p, x: s2d.apply(p, x)
  np.testing.assert_allclose(f2(params, x), f1(params, x), atol=1e-5)
  g = jax.random.normal(jax.random.key(2), f1(params, x).shape)
  grad = lambda f: jax.grad(lambda p, x: jnp.sum(f(p, x) * g), (0, 1))(
      params, x)
  jax.tree_util.tree_map(
      lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4),
      grad(f1), grad(f2))
  jvp = lambda f: jax.jvp(f, (params, x), (params, x))[1]
  np.testing.assert_allclose(jvp(f2), jvp(f1), rtol=1e-4, atol=1e-4)


def _conv_dim_labels(fn, *args):
  hlo = jax.jit(fn).lower(*args).compile().as_text()
  return {l.split("dim_labels=")[1].split(",")[0] for l in hlo.splitlines()
          if " convolution(" in l}


def test_s2d_derivatives_stay_canonical_inside_loops():
  # XLA's CPU backend runs convolutions fast only in the canonical
  # NHWC/HWIO form; autodiff's transposes of lax.conv carry an [.., out, in]
  # kernel that stays non-canonical inside while bodies (~3x slower: the
  # 'xla' formulation below). 's2d' writes its derivatives so that every
  # convolution is canonical: checked on the compiled HLO of Jacobian rows
  # and of training steps inside loops (MNIST shapes; on maps smaller than
  # the kernel XLA rewrites convolutions its own way).
  canonical = {"b01f_01io->b01f"}
  x = jnp.ones((2, 28, 28, 1))

  def fns(model):
    def jac_rows(p, x):
      _, vjp = jax.vjp(lambda x: model.features(p, x), x)
      return jax.lax.map(lambda c: vjp(jnp.broadcast_to(c, (2, c.shape[0])))[
          0], jnp.eye(model.num_features)[:4])

    def train(p, x):
      step = lambda p, _: (jax.tree_util.tree_map(
          lambda a, b: a - 0.1 * b, p, jax.grad(
              lambda p: jnp.sum(model.apply(p, x) ** 2))(p)), None)
      return jax.lax.scan(step, p, None, length=2)[0]

    return jac_rows, train

  s2d = models.get_model("lenet", (28, 28, 1), conv_impl="s2d")
  params = s2d.init(jax.random.key(0))
  for fn in fns(s2d):
    assert _conv_dim_labels(fn, params, x) == canonical
  jac_rows, _ = fns(s2d.with_conv_impl("xla"))
  assert _conv_dim_labels(jac_rows, params, x) - canonical


def test_auto_conv_impl_resolves_per_backend():
  assert models.resolve_conv_impl("auto", "cpu") == "s2d"
  # On CPU a grey image layer and a 5x5 (or larger) one are im2col, every
  # other layer s2d; with AVX-512 only stride-1 5x5 layers on maps of 14x14
  # or more are im2col (LeNet's layers are not, LeNet5's and the leakage
  # CNN's are).
  for avx512 in (False, True):
    assert models.resolve_conv_impl("auto", "cpu", in_channels=1,
                                    avx512=avx512) == "patches"
    assert models.resolve_conv_impl("auto", "cpu", in_channels=3,
                                    avx512=avx512) == "s2d"
  for layer, avx2, avx512 in [
      ((32, 32, 5, 2), "patches", "s2d"), ((8, 8, 5, 1), "patches", "s2d"),
      ((32, 32, 7, 1), "patches", "patches"),
      ((14, 14, 5, 1), "patches", "patches"),
      ((13, 14, 5, 1), "patches", "s2d"), ((32, 32, 3, 1), "s2d", "s2d"),
      ((8, 8, 3, 2), "s2d", "s2d")]:
    assert models.resolve_conv_impl("auto", "cpu", 12, layer,
                                    avx512=False) == avx2
    assert models.resolve_conv_impl("auto", "cpu", 12, layer,
                                    avx512=True) == avx512
    assert models.resolve_conv_impl("auto", "gpu", 12, layer) == "xla"
  # Without the argument, this host's flags decide.
  assert models.resolve_conv_impl("auto", "cpu", 12, (8, 8, 5, 1)) == (
      "s2d" if host.cpu_has_avx512() else "patches")
  assert models.resolve_conv_impl("auto", "gpu", in_channels=3) == "xla"
  assert models.resolve_conv_impl("auto", "gpu") == "xla"
  assert models.resolve_conv_impl("auto", "tpu") == "xla"
  assert models.resolve_conv_impl("patches", "cpu") == "patches"
  # 'jacobian': small stride-1 layers (LeNet's 7x7 / 8x8 ones) as matrices.
  # Soteria's pullbacks keep 's2d' for 5x5 layers ('patches' was slower).
  for layer, impl in [((7, 7, 5, 1), "dense"), ((8, 8, 5, 1), "dense"),
                      ((8, 8, 5, 2), "s2d"), ((14, 14, 5, 1), "s2d"),
                      ((32, 32, 5, 2), "s2d"), ((10, 10, 3, 1), "s2d")]:
    assert models.resolve_conv_impl("jacobian", "cpu", 12, layer) == impl
  assert models.resolve_conv_impl("jacobian", "gpu", 12, (7, 7, 5, 1)) == "xla"
  assert models.resolve_conv_impl("jacobian", "cpu", 1) == "patches"
  # 'second_order' (the attacks): im2col on CPU, whatever the layer.
  assert models.resolve_conv_impl("second_order", "cpu", 12) == "patches"
  assert models.resolve_conv_impl("second_order", "gpu", 12) == "xla"
  assert models.get_model("lenet").conv_impl == "auto"
  # A workload's formulation replaces only the default, never a user's.
  lenet = models.get_model("lenet")
  assert lenet.with_default_conv_impl("jacobian").conv_impl == "jacobian"
  chosen = lenet.with_conv_impl("xla")
  assert chosen.with_default_conv_impl("second_order") is chosen
  with pytest.raises(ValueError, match="conv_impl"):
    models.resolve_conv_impl("fft")


@pytest.mark.parametrize("impl", ["xla", "patches", "s2d", "dense", "auto"])
def test_every_formulation_takes_the_float_dtypes_check_input_accepts(impl):
  """bfloat16 / float16 images with float32 weights: every formulation
  promotes to one dtype and gives the float32 result (lax.conv refused
  mixed dtypes, so 'xla', 's2d' and 'auto' raised)."""
  m = models.get_model("lenet", (16, 16, 3), conv_impl=impl)
  params = m.init(jax.random.key(0))
  x = jax.random.uniform(jax.random.key(1), (2, 16, 16, 3))
  want = m.apply(params, x)
  for dtype in (jnp.bfloat16, jnp.float16):
    low = x.astype(dtype)
    got = m.apply(params, low)
    assert got.dtype == jnp.float32
    np.testing.assert_allclose(got, m.apply(params, low.astype(jnp.float32)),
                               rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got, want, rtol=0.05, atol=0.05)


def test_hidden_as_a_list_is_one_model():
  """An MLP's ``hidden`` as a list (from JSON or ConfigDict.to_dict) is the
  tuple: a hashable Model and one spelling."""
  m = models.get_model("mlp", (8, 8, 1), hidden=[4, 3])
  assert m == models.get_model("mlp", (8, 8, 1), hidden=(4, 3))
  assert m.fc_layers == ("fc0", "fc1", "head")
  assert models.non_default_kwargs("mlp", {"hidden": [200, 200]}) == {}


def test_non_default_kwargs_gives_one_spelling_per_model():
  assert models.non_default_kwargs("convnet64", {"width": 64}) == {}
  assert models.non_default_kwargs("convnet64", {"width": 16}) == {
      "width": 16}
  with pytest.raises(ValueError, match="Unknown model name"):
    models.non_default_kwargs("resnet", {})


@pytest.mark.parametrize("name,kwargs", [
    ("lenet", {}), ("leakage", {}), ("convnet64", {"width": 4}),
    ("lenet5", {}), ("mlp", {"hidden": (16, 8)}), ("logreg", {})])
def test_score_eps_is_zero_exactly_for_sigmoid_representations(name, kwargs):
  """The reference code adds 0.1 to the score's denominator r_i for ReLU
  (and linear) nets and nothing for sigmoid ones: checked against what the
  representation is (a sigmoid net's r lies strictly in (0, 1); a ReLU's
  has zeros, a linear one negatives), not against the activation label."""
  model = models.get_model(name, (32, 32, 3), init="uniform", **kwargs)
  params = model.init(jax.random.key(0))
  x = jax.random.normal(jax.random.key(1), (2, 32, 32, 3))
  r = np.asarray(model.features(params, x))
  sigmoid_like = bool(np.all((r > 0) & (r < 1)))
  assert model.score_eps == (0.0 if sigmoid_like else 0.1)


def test_logreg_starts_at_zero():
  """LogReg's default init is all zeros (every class equally likely:
  the loss at round 0 is log(num_classes)); 'uniform' is not."""
  model = models.get_model("logreg", (4, 4, 1), num_classes=3)
  params = model.init(jax.random.key(0))
  assert all(not np.any(np.asarray(a))
             for a in jax.tree_util.tree_leaves(params))
  x = jax.random.normal(jax.random.key(1), (2, 4, 4, 1))
  np.testing.assert_allclose(jax.nn.softmax(model.apply(params, x)), 1 / 3,
                             rtol=1e-6)
  uniform = models.get_model("logreg", (4, 4, 1), num_classes=3,
                             init="uniform").init(jax.random.key(0))
  assert np.any(np.asarray(uniform["head"]["kernel"]))
