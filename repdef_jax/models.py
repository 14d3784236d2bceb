"""The paper's models as flax Linen modules behind a small pure-function API.

Every model ends in one fully connected layer named ``head`` whose input is the
representation ``r`` that the Soteria defense perturbs (Sun et al. 2021,
Section 4: "the representation fed into a fully connected layer"). A
:class:`Model` bundles a module with its input shape and exposes, as pure
functions of ``(params, x)``:

* ``apply``: logits, ``[B, num_classes]``;
* ``features``: the representation ``r`` that enters ``head``, ``[B, F]``;
* ``feature_fn(params)``: ``r`` for one image ``[H, W, C] -> [F]`` (what
  :func:`repdef_jax.defenses.soteria.feature_scores` differentiates);
* ``defended_path``: where the defended layer's parameters sit in the tree.

No model carries mutable state (no batch-norm statistics, no dropout), so every
example's output and gradient depend on that example alone and ``vmap`` over
examples or clients is exact.

Models (paper appendix B and the reference code):

* ``lenet``: DLG's LeNet, 4 x [conv 5x5, 12 channels, padding 2, strides
  2, 2, 1, 1, sigmoid] -> linear. 19,438 parameters on 32x32x3.
  ``init='uniform'`` draws every weight and bias from U(-0.5, 0.5) as DLG
  does.
* ``convnet64``: Inverting Gradients' ConvNet of width 64 (conv 3x3 blocks with
  64, 128, 128, 256, 256, 256 channels, max-pool 3, two 256 blocks, max-pool 3,
  linear from 2,304 features). Departure: batch norm is left out; the GS attack
  evaluates an untrained model in eval mode, where batch norm with fresh
  statistics is (up to its epsilon) the identity.
* ``lenet5``: the representation-inference model, conv 3->6, max-pool, conv
  6->16, max-pool, FC 120, FC 84, FC 10 (kernel 5, pool 2, ReLU).
* ``leakage``: the representation-leakage model, conv 3->12 (5x5, padding 2,
  sigmoid) -> FC 10.
* ``mlp``: two hidden ReLU layers (width 200 by default).
* ``logreg``: logistic regression; its representation is the flattened image.

Convolutions: ``conv_impl`` 'auto' (the default: on CPU 'patches' for a
one-channel image layer or a kernel of 5 or more, with AVX-512 only for
such kernels at stride 1 on large maps, else 's2d'; 'xla' on GPU/TPU),
'xla', 'patches' (im2col), 's2d' (space-to-depth, canonical layouts for
every derivative), 'dense' (the layer's matrix, one matmul),
'jacobian' (on CPU 'dense' for small stride-1 layers, 'patches' for one
input channel, else 's2d'; what the Soteria Jacobian's many pullbacks use)
or 'second_order' ('patches' on CPU, else 'xla'; what the gradient-matching
attacks use, which differentiate a gradient); same parameters, same numbers
(tested). Why and how fast: ``docs/design.md`` ("Convolutions") and
``docs/benchmarks``.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any, Callable, Sequence

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from repdef_jax import host

Params = Any

CONV_IMPLS = ("auto", "xla", "patches", "s2d", "dense", "jacobian",
              "second_order")
INITS = ("default", "uniform")


def _uniform_init(scale: float = 0.5):
  """U(-scale, scale), the DLG reference initialisation."""

  def init(key, shape, dtype=jnp.float32):
    return jax.random.uniform(key, shape, dtype, -scale, scale)

  return init


# On CPU, 'auto' runs a layer with one input channel (a grey image) as
# 'patches': its input gradient, where every Soteria pullback ends, is then
# pure data movement instead of a 1-channel-output convolution, which XLA's
# CPU backend runs slowly. LeNet on MNIST: Soteria scores 1.4x faster,
# training steps as fast; with 3 channels (CIFAR-10) 's2d' stays faster.
PATCHES_MAX_CHANNELS = 1

# 'second_order' is 'patches' on CPU: the gradient-matching attacks
# differentiate a gradient (DLG, GS), and XLA's CPU backend runs the
# resulting second-order convolutions of 's2d' and 'xla' slowly. Measured
# on LeNet, 60 steps of a DLG-style objective in one loop, 8 attacks at once:
# MNIST 0.585 s ('auto') / 0.429 s ('xla') / 0.187 s ('patches'), CIFAR-10
# 1.02 / 0.70 / 0.27 s.

# 'patches' gathers a layer with several input channels and a kernel of at
# least this size in 2k slices (k column taps, then k row taps of those)
# instead of k*k: XLA compiles the attacks' second-order programs faster and
# runs LeNet's faster. Measured on the 2-core AMD EPYC (XLA level 1, older
# fusion emitters): LeNet DLG compiles in 5.9 instead of 9.3 s (16x16x3),
# 7.1 instead of 9.8 s (CIFAR-10). At XLA's default level, runs: LeNet GS
# 1.13x (CIFAR-10) / 1.17x (MNIST) faster, DLG 1.05x / 1.22x for one image,
# 0.97x / 1.05x for 8; LeNet5 and the leakage CNN within noise. 3x3 kernels
# (ConvNet) ran GS 0.82x as fast and one-channel layers (MNIST's first) DLG
# 0.65x, so they keep k*k slices.
# 'auto' on CPU runs such a layer as 'patches' in training too (Soteria's
# pullbacks, 'jacobian', keep 's2d'): plain FedAvg rounds (10 clients x 200
# examples, one epoch), s2d / patches time on the AMD EPYC, batch 10 / 50 /
# 200: LeNet CIFAR-10 1.06x / 1.41x / 1.13x, LeNet MNIST 1.08x / 1.18x (batch
# 10 / 50), leakage CNN CIFAR-10 1.19x / 1.83x / 1.43x, LeNet5 CIFAR-10 1.37x
# / 1.39x / 1.29x. Defended rounds (Soteria at every step) within noise.
SEPARABLE_MIN_KERNEL = 5

# On a CPU with AVX-512, XLA's convolutions train strided layers and small
# stride-1 maps faster than im2col, so 'auto' takes 'patches' for such a
# layer only when it has stride 1 and an input of at least this many
# positions (H * W). The same rounds on a 2-core Intel Xeon (AVX-512), time
# with every 5x5 layer 'patches' / 's2d' (one-channel layers 'patches' in
# both; best of 7, interleaved), batch 10 / 50 / 200: LeNet CIFAR-10
# (strides 2, 2, 1, 1; 8x8 stride-1 maps) 1.66x / 1.36x / 2.46x, LeNet MNIST
# 1.34x / 1.34x / 2.71x, while the stride-1 layers on 32x32 / 28x28 / 14x14
# inputs still prefer im2col at batch 10 / 50: leakage CNN CIFAR-10 0.97x /
# 0.89x (1.59x at 200), LeNet5 CIFAR-10 1.05x / 0.68x / 0.94x. An AMD Zen 4
# (AVX-512 on 256-bit pipes) agrees (docs/design.md).
PATCHES_MIN_AREA_AVX512 = 196

# 'jacobian' on CPU runs a stride-1 layer as its dense matrix when the input
# has at most this many kernel areas (H * W <= ratio * k * k): the matmul does
# up to 3x the multiply-adds but runs 2-4x closer to peak than XLA's CPU
# convolution with 12 channels. Measured on 1,536 pullbacks at once (a
# Soteria chunk): LeNet's 7x7 layer 2.3x, its 8x8 layer 1.5x faster.
DENSE_MAX_RATIO = 3.0


def resolve_conv_impl(conv_impl: str, backend: str | None = None,
                      in_channels: int | None = None,
                      layer: tuple[int, int, int, int] | None = None,
                      avx512: bool | None = None) -> str:
  """The formulation a layer runs.

  'auto' -> 'xla' on GPU/TPU; on CPU 'patches' for a layer with
  ``in_channels`` <= :data:`PATCHES_MAX_CHANNELS` or a ``layer = (H, W,
  kernel, stride)`` with ``kernel >= SEPARABLE_MIN_KERNEL`` (with
  ``avx512``, default :func:`repdef_jax.host.cpu_has_avx512`, only a
  stride-1 layer with ``H * W >= PATCHES_MIN_AREA_AVX512``), else 's2d'.
  'jacobian' -> 'xla' on GPU/TPU; on CPU 'dense' for a stride-1 layer with
  ``H * W <= DENSE_MAX_RATIO * kernel ** 2``, else 'patches' for one input
  channel, else 's2d'. 'second_order' -> 'patches' on CPU, 'xla' on
  GPU/TPU. Any other value is returned unchanged.

  Raises:
    ValueError: ``conv_impl`` is not one of :data:`CONV_IMPLS`.
  """
  if conv_impl not in CONV_IMPLS:
    raise ValueError(f"conv_impl must be one of {CONV_IMPLS}, got "
                     f"{conv_impl!r}.")
  if conv_impl not in ("auto", "jacobian", "second_order"):
    return conv_impl
  backend = backend or jax.default_backend()
  if backend != "cpu":
    return "xla"
  if conv_impl == "second_order":
    return "patches"
  if conv_impl == "jacobian" and layer is not None:
    h, w, k, stride = layer
    if stride == 1 and h * w <= DENSE_MAX_RATIO * k * k:
      return "dense"
  if in_channels is not None and in_channels <= PATCHES_MAX_CHANNELS:
    return "patches"
  if conv_impl == "auto" and layer is not None:
    h, w, k, stride = layer
    if avx512 is None:
      avx512 = host.cpu_has_avx512()
    if k >= SEPARABLE_MIN_KERNEL and (not avx512 or (
        stride == 1 and h * w >= PATCHES_MIN_AREA_AVX512)):
      return "patches"
  return "s2d"


class Conv2D(nn.Module):
  """2-D convolution, NHWC, explicit symmetric padding, several formulations.

  Attributes:
    features: output channels.
    kernel_size: square kernel size.
    strides: stride in both spatial dimensions.
    padding: zero padding on each side (PyTorch convention).
    impl: one of :data:`CONV_IMPLS` (see the module docstring).
    kernel_init: initialiser of the kernel.
    bias_init: initialiser of the bias.
  """

  features: int
  kernel_size: int
  strides: int = 1
  padding: int = 0
  impl: str = "auto"
  kernel_init: Callable = nn.initializers.lecun_normal()
  bias_init: Callable = nn.initializers.zeros

  @nn.compact
  def __call__(self, x):
    cin = x.shape[-1]
    k = self.kernel_size
    kernel = self.param("kernel", self.kernel_init, (k, k, cin, self.features))
    bias = self.param("bias", self.bias_init, (self.features,))
    # One dtype for every formulation (lax.conv refuses mixed ones).
    x, kernel, bias = nn.dtypes.promote_dtype(x, kernel, bias)
    pad = ((self.padding, self.padding), (self.padding, self.padding))
    strides = (self.strides, self.strides)
    impl = resolve_conv_impl(self.impl, in_channels=cin,
                             layer=(x.shape[1], x.shape[2], k, self.strides))
    if impl == "dense":
      y = _dense_conv(x, kernel, self.strides, self.padding)
    elif impl == "xla":
      y = jax.lax.conv_general_dilated(
          x, kernel, strides, pad, dimension_numbers=_NHWC)
    elif impl == "patches":
      patches = _patches(x, k, self.strides, self.padding)
      y = patches @ kernel.reshape(k * k * cin, self.features)
    else:
      y = _space_to_depth_conv(x, kernel, self.strides, self.padding)
    return y + bias


_NHWC = ("NHWC", "HWIO", "NHWC")


def _patches(x, k, stride, padding, separable=None):
  """im2col: ``[B, H, W, C] -> [B, Ho, Wo, k*k*C]``.

  Features are ordered (kh, kw, cin), matching ``kernel.reshape(-1, cout)``
  of an HWIO kernel. This is pure data movement (its gradient is pads and
  adds), unlike ``lax.conv_general_dilated_patches``, which is itself a
  convolution with a one-hot kernel and k*k*C times the work of the real one.
  A strided layer first splits the padded input into its stride x stride
  phase planes and takes every tap as a stride-1 slice of one plane, so the
  input gradient adds each tap into its plane instead of into the whole
  input (measured on a 2-core CPU: LeNet's MNIST Soteria scores at batch
  10, 110 -> 94 ms; the input gradient of its first layer under 490
  cotangents 2.9 -> 1.7 ms; same numbers).

  ``separable`` (default: see :data:`SEPARABLE_MIN_KERNEL`) gathers the k
  column taps first and then the k row taps of that, 2k slices instead of
  k*k; the same array.
  """
  if separable is None:
    separable = x.shape[-1] > 1 and k >= SEPARABLE_MIN_KERNEL
  x = jnp.pad(x, ((0, 0), (padding, padding), (padding, padding), (0, 0)))
  _, h, w, _ = x.shape
  ho, wo = (h - k) // stride + 1, (w - k) // stride + 1
  if separable:
    return _taps(_taps(x, k, stride, wo, axis=2), k, stride, ho, axis=1)
  planes = {(a, b): x[:, a::stride, b::stride, :]
            for a in range(stride) for b in range(stride)}
  cols = [planes[i % stride, j % stride][:, i // stride:i // stride + ho,
                                         j // stride:j // stride + wo, :]
          for i in range(k) for j in range(k)]
  return jnp.concatenate(cols, axis=-1)


def _taps(x, k, stride, n, axis):
  """The k taps of a stride-``stride`` window along ``axis`` (n positions
  each, from phase planes as in :func:`_patches`), tap-major on the last
  axis."""
  planes = [jax.lax.slice_in_dim(x, a, x.shape[axis], stride, axis)
            for a in range(stride)]
  return jnp.concatenate(
      [jax.lax.slice_in_dim(planes[j % stride], j // stride,
                            j // stride + n, axis=axis) for j in range(k)],
      axis=-1)


@functools.lru_cache(maxsize=64)
def _conv_matrix_index(h, w, cin, cout, k, stride, padding):
  """Where each entry of a convolution's matrix sits in the flat kernel.

  Returns ``(index [H*W*Cin, Ho*Wo*Cout], (Ho, Wo))``; entries that no
  kernel tap reaches (including padding) point one past the kernel's end.
  """
  ho = (h + 2 * padding - k) // stride + 1
  wo = (w + 2 * padding - k) // stride + 1
  taps = np.arange(k * k * cin * cout).reshape(k, k, cin, cout)
  index = np.full((h, w, cin, ho, wo, cout), taps.size, np.int32)
  for oy in range(ho):
    for dy in range(k):
      iy = oy * stride + dy - padding
      if not 0 <= iy < h:
        continue
      for ox in range(wo):
        for dx in range(k):
          ix = ox * stride + dx - padding
          if 0 <= ix < w:
            index[iy, ix, :, oy, ox, :] = taps[dy, dx]
  return index.reshape(h * w * cin, ho * wo * cout), (ho, wo)


def _dense_conv(x, kernel, stride, padding):
  """A convolution as one matmul with its ``[H*W*Cin, Ho*Wo*Cout]`` matrix.

  The matrix is gathered from the kernel (zeros where no tap reaches), so
  its input gradient is one matmul too; worth it only for small layers
  (see :data:`DENSE_MAX_RATIO`).
  """
  n, h, w, cin = x.shape
  k, cout = kernel.shape[0], kernel.shape[3]
  index, (ho, wo) = _conv_matrix_index(h, w, cin, cout, k, stride, padding)
  flat = jnp.concatenate([kernel.reshape(-1), jnp.zeros((1,), kernel.dtype)])
  return (x.reshape(n, -1) @ flat[index]).reshape(n, ho, wo, cout)


def _conv(x, w, padding, dimension_numbers=_NHWC):
  return jax.lax.conv_general_dilated(x, w, (1, 1), padding,
                                      dimension_numbers=dimension_numbers)


@functools.partial(jax.custom_jvp, nondiff_argnums=(2,))
def canonical_conv(x: jax.Array, w: jax.Array, padding) -> jax.Array:
  """Stride-1 NHWC/HWIO convolution whose derivatives stay canonical.

  Same value as ``lax.conv_general_dilated``. Its JVP is written so that
  JAX's transposes of it are again NHWC/HWIO convolutions: the input term
  uses the kernel as an explicit [kh, kw, out, in] array ("HWOI"), whose
  transpose is a canonical convolution of the cotangent with the flipped
  kernel; the kernel term convolves ``x`` laid out [C, H, W, N] with the
  kernel laid out [in, kh, kw, out], whose transpose is the canonical
  convolution of x^T with the cotangent as kernel. Otherwise XLA's CPU
  backend runs these transposes in a slow generic loop inside ``lax.scan`` /
  ``lax.map`` bodies.

  Args:
    x: ``[N, H, W, Cin]``.
    w: ``[kh, kw, Cin, Cout]``.
    padding: ``((top, bottom), (left, right))`` (static).
  """
  return _conv(x, w, padding)


def _canonical_conv_jvp(padding, primals, tangents):
  x, w = primals
  dx, dw = tangents
  y = _conv(x, w, padding)
  zero = jax.custom_derivatives.SymbolicZero
  terms = []
  if not isinstance(dx, zero):
    terms.append(_conv(dx, w.transpose(0, 1, 3, 2), padding,
                       ("NHWC", "HWOI", "NHWC")))
  if not isinstance(dw, zero):
    terms.append(_conv(x.transpose(3, 1, 2, 0), dw.transpose(2, 0, 1, 3),
                       padding, ("CHWN", "IHWO", "HWNC")).transpose(2, 0, 1, 3))
  dy = sum(terms[1:], terms[0]) if terms else jnp.zeros_like(y)
  return y, dy


canonical_conv.defjvp(_canonical_conv_jvp, symbolic_zeros=True)


def _space_to_depth_conv(x, kernel, stride, padding):
  """A strided convolution as a stride-1 convolution on space-to-depth input.

  ``y[o] = sum_a xpad[s*o + a] w[a]``; writing ``a = s*u + v`` turns it into
  ``sum_u s2d(xpad)[o + u][v] w[s*u + v]``, a stride-1 convolution over
  ``s*s*C`` channels with a ``ceil(k/s)`` kernel. When the padding is a
  multiple of the stride and the image divides by it (LeNet),
  ``s2d(pad(x, p)) = pad(s2d(x), p / s)``, so the padding stays inside the
  convolution and its input gradient covers only the real pixels. Every
  convolution goes through :func:`canonical_conv`. Same numbers as the
  direct convolution.
  """
  s, p = stride, padding
  k, cout = kernel.shape[0], kernel.shape[3]
  n, h, w, c = x.shape
  ho, wo = (h + 2 * p - k) // s + 1, (w + 2 * p - k) // s + 1
  if s == 1:
    return canonical_conv(x, kernel, ((p, p), (p, p)))
  ks = -(-k // s)
  if p % s == 0 and h % s == 0 and w % s == 0:
    lo = p // s
    pad = ((lo, max(0, ho + ks - 1 - h // s - lo)),
           (lo, max(0, wo + ks - 1 - w // s - lo)))
    hp, wp = h, w
  else:
    hp, wp = -(-(h + 2 * p) // s) * s, -(-(w + 2 * p) // s) * s
    x = jnp.pad(x, ((0, 0), (p, hp - h - p), (p, wp - w - p), (0, 0)))
    pad = ((0, 0), (0, 0))
  x = x.reshape(n, hp // s, s, wp // s, s, c).transpose(0, 1, 3, 2, 4, 5)
  x = x.reshape(n, hp // s, wp // s, s * s * c)
  kernel = jnp.pad(kernel, ((0, ks * s - k), (0, ks * s - k), (0, 0), (0, 0)))
  kernel = kernel.reshape(ks, s, ks, s, c, cout).transpose(0, 2, 1, 3, 4, 5)
  kernel = kernel.reshape(ks, ks, s * s * c, cout)
  y = canonical_conv(x, kernel, pad)
  return y[:, :ho, :wo]


def _init_kwargs(scheme: str) -> dict[str, Callable]:
  """Initialiser keyword arguments of a layer for an init scheme."""
  if scheme == "uniform":
    return dict(kernel_init=_uniform_init(), bias_init=_uniform_init())
  return {}


class _Classifier(nn.Module):
  """Base of every model: logits are the layer ``head`` applied to r.

  The representation is split for the Soteria Jacobian
  (:func:`repdef_jax.defenses.soteria.representation_jacobian_norms`):
  ``r = top_post(top_pre(bottom(x)))`` with ``top_pre`` the extractor's last
  affine layer (or a reshape) and ``top_post`` what follows it. When
  ``top_post`` is elementwise (then a flatten), ``dr_i/dh`` is row i of
  ``top_pre``'s (constant) Jacobian times ``top_post'(z_i)``, so the Jacobian
  needs no backward pass through the top layer.
  """

  # top_post is an elementwise activation followed by a flatten.
  elementwise_top = True
  # bottom is the identity (r = top_post(top_pre(x))).
  identity_bottom = False

  def __call__(self, x):
    return self.head(self.features(x))

  def features(self, x):
    return self.top_post(self.top_pre(self.bottom(x)))

  def bottom(self, x):
    return x


def _flatten(x):
  return x.reshape(x.shape[0], -1)


def _max_pool(x, size):
  """PyTorch-style MaxPool2d(size): stride = size, no padding, floor."""
  return nn.max_pool(x, (size, size), strides=(size, size), padding="VALID")


class LeNet(_Classifier):
  """DLG's LeNet: four sigmoid convolutions with 12 channels, then linear."""

  num_classes: int = 10
  init_scheme: str = "default"
  conv_impl: str = "auto"

  def setup(self):
    kw = _init_kwargs(self.init_scheme)
    self.convs = [
        Conv2D(12, 5, strides=s, padding=2, impl=self.conv_impl, **kw,
               name=f"conv{i}")
        for i, s in enumerate((2, 2, 1, 1))
    ]
    self.head = nn.Dense(self.num_classes, name="head", **kw)

  def bottom(self, x):
    for conv in self.convs[:-1]:
      x = nn.sigmoid(conv(x))
    return x

  def top_pre(self, h):
    return self.convs[-1](h)

  def top_post(self, z):
    return _flatten(nn.sigmoid(z))


class ConvNet(_Classifier):
  """Inverting Gradients' ConvNet (width 64 by default), batch norm left out."""

  num_classes: int = 10
  width: int = 64
  init_scheme: str = "default"
  conv_impl: str = "auto"
  elementwise_top = False  # max-pool after the last convolution.

  def setup(self):
    w = self.width
    chans = (w, 2 * w, 2 * w, 4 * w, 4 * w, 4 * w, 4 * w, 4 * w)
    kw = _init_kwargs(self.init_scheme)
    self.convs = [
        Conv2D(c, 3, padding=1, impl=self.conv_impl, **kw, name=f"conv{i}")
        for i, c in enumerate(chans)
    ]
    self.head = nn.Dense(self.num_classes, name="head", **kw)

  def bottom(self, x):
    for i, conv in enumerate(self.convs[:-1]):
      x = nn.relu(conv(x))
      if i == 5:
        x = _max_pool(x, 3)
    return x

  def top_pre(self, h):
    return self.convs[-1](h)

  def top_post(self, z):
    return _flatten(_max_pool(nn.relu(z), 3))


class LeNet5(_Classifier):
  """Representation-inference CNN: conv 6, conv 16, FC 120, FC 84, FC 10."""

  num_classes: int = 10
  hidden: Sequence[int] = (120, 84)
  init_scheme: str = "default"
  conv_impl: str = "auto"

  @property
  def elementwise_top(self):
    return bool(self.hidden)  # Else a max-pool follows the last conv.

  def setup(self):
    kw = _init_kwargs(self.init_scheme)
    self.conv0 = Conv2D(6, 5, impl=self.conv_impl, **kw)
    self.conv1 = Conv2D(16, 5, impl=self.conv_impl, **kw)
    self.fcs = [nn.Dense(h, name=f"fc{i}", **kw)
                for i, h in enumerate(self.hidden)]
    self.head = nn.Dense(self.num_classes, name="head", **kw)

  def bottom(self, x):
    x = _max_pool(nn.relu(self.conv0(x)), 2)
    if not self.fcs:
      return x
    x = _flatten(_max_pool(nn.relu(self.conv1(x)), 2))
    for fc in self.fcs[:-1]:
      x = nn.relu(fc(x))
    return x

  def top_pre(self, h):
    return self.fcs[-1](h) if self.fcs else self.conv1(h)

  def top_post(self, z):
    return nn.relu(z) if self.fcs else _flatten(_max_pool(nn.relu(z), 2))


class Leakage(_Classifier):
  """Representation-leakage model: one sigmoid conv (12 channels) -> FC."""

  num_classes: int = 10
  init_scheme: str = "default"
  conv_impl: str = "auto"
  identity_bottom = True

  def setup(self):
    kw = _init_kwargs(self.init_scheme)
    self.conv0 = Conv2D(12, 5, padding=2, impl=self.conv_impl, **kw)
    self.head = nn.Dense(self.num_classes, name="head", **kw)

  def top_pre(self, h):
    return self.conv0(h)

  def top_post(self, z):
    return _flatten(nn.sigmoid(z))


class MLP(_Classifier):
  """Fully connected ReLU network."""

  num_classes: int = 10
  hidden: Sequence[int] = (200, 200)
  init_scheme: str = "default"
  conv_impl: str = "auto"  # Unused; accepted so every model takes it.

  @property
  def identity_bottom(self):
    return len(self.hidden) <= 1

  def setup(self):
    kw = _init_kwargs(self.init_scheme)
    self.fcs = [nn.Dense(h, name=f"fc{i}", **kw)
                for i, h in enumerate(self.hidden)]
    self.head = nn.Dense(self.num_classes, name="head", **kw)

  def bottom(self, x):
    if len(self.fcs) <= 1:
      return x
    x = _flatten(x)
    for fc in self.fcs[:-1]:
      x = nn.relu(fc(x))
    return x

  def top_pre(self, h):
    h = _flatten(h)
    return self.fcs[-1](h) if self.fcs else h

  def top_post(self, z):
    return nn.relu(z) if self.fcs else z


class LogReg(_Classifier):
  """Multinomial logistic regression on the flattened image.

  Starts at zero weights and bias (``init='default'``; 'uniform' as the
  other models), so F(w_0) = log(num_classes) in the convergence part.
  """

  num_classes: int = 10
  init_scheme: str = "default"
  conv_impl: str = "auto"  # Unused; accepted so every model takes it.
  identity_bottom = True

  def setup(self):
    kw = (_init_kwargs(self.init_scheme) if self.init_scheme == "uniform"
          else dict(kernel_init=nn.initializers.zeros))
    self.head = nn.Dense(self.num_classes, name="head", **kw)

  def top_pre(self, h):
    return _flatten(h)

  def top_post(self, z):
    return z


@dataclasses.dataclass(frozen=True)
class Model:
  """A flax module with its input shape, as pure functions.

  Attributes:
    name: registry name.
    module: the flax Linen module.
    input_shape: one image's shape ``(H, W, C)``.
    num_classes: number of outputs.
    activation: 'sigmoid', 'relu' or 'linear' (logreg); sets the reference
      Soteria score's epsilon (0 for sigmoid nets, else 0.1, as the
      reference code).
    fc_layers: names of the fully connected layers in forward order, ending
      with the defended layer ``head`` (used by representation inference).
    defended_path: where the defended layer's parameters sit in the tree.
  """

  name: str
  module: nn.Module
  input_shape: tuple[int, int, int]
  num_classes: int
  activation: str
  fc_layers: tuple[str, ...] = ("head",)

  defended_path: tuple[str, ...] = ("head",)

  @property
  def score_eps(self) -> float:
    """The reference code's denominator epsilon for this network."""
    return 0.0 if self.activation == "sigmoid" else 0.1

  @property
  def num_features(self) -> int:
    """Size F of the representation that enters the defended layer."""
    params = jax.eval_shape(self.init, jax.random.key(0))
    return defended_params(self, params)["kernel"].shape[0]

  @property
  def conv_impl(self) -> str:
    """The convolution formulation ('auto' resolves when applied)."""
    return self.module.conv_impl

  def with_conv_impl(self, conv_impl: str) -> "Model":
    """The same model (same parameters) with another conv formulation."""
    resolve_conv_impl(conv_impl)  # Validates.
    if conv_impl == self.module.conv_impl:
      return self
    return dataclasses.replace(self, module=self.module.clone(
        conv_impl=conv_impl))

  def with_default_conv_impl(self, conv_impl: str) -> "Model":
    """``conv_impl`` in place of the default 'auto', for a program whose
    workload has a faster formulation ('jacobian', 'second_order'); a
    formulation the user chose stays."""
    return self.with_conv_impl(conv_impl) if self.conv_impl == "auto" else self

  def init(self, rng: jax.Array) -> Params:
    """Initial parameters (the ``'params'`` collection), one jitted program
    per model (same bits as flax's eager init, compiled once instead of op
    by op; on CPU at XLA's optimisation level 1, see ``_init_params``)."""
    check_key(rng, "rng")
    top_level = not isinstance(rng, jax.core.Tracer)  # Not inside a jit.
    if top_level and jax.default_backend() == "cpu":
      return _init_params_cpu(self, rng)
    return _init_params(self, rng)

  def check_input(self, x, name: str = "x") -> None:
    """Raises when ``x`` is not a batch of this model's images.

    Raises:
      ValueError: wrong rank or image shape.
      TypeError: non-floating dtype (e.g. int32 or uint8: convert with
        :func:`repdef_jax.data.to_float` first).
    """
    if x.ndim != 4 or tuple(x.shape[1:]) != tuple(self.input_shape):
      raise ValueError(
          f"{name} must be a batch of images of shape [B, "
          f"{', '.join(map(str, self.input_shape))}] for model {self.name!r}; "
          f"got shape {tuple(x.shape)}.")
    if not jnp.issubdtype(x.dtype, jnp.floating):
      raise TypeError(
          f"{name} must be floating point images (float16/bfloat16/float32/"
          f"float64, e.g. in [0, 1]); got dtype {x.dtype}.")

  def apply(self, params: Params, x: jax.Array) -> jax.Array:
    """Logits ``[B, num_classes]`` of a batch ``x`` ``[B, H, W, C]`` (one
    compiled program per model and shape, also when called eagerly)."""
    self.check_input(x)
    return self._run(params, x, None)

  def features(self, params: Params, x: jax.Array) -> jax.Array:
    """Representation ``r`` ``[B, F]`` that enters the defended layer."""
    self.check_input(x)
    return self._run(params, x, "features")

  def _run(self, params: Params, x: jax.Array, method: str | None):
    try:
      return _apply(self, params, x, method)
    except (flax.errors.ScopeParamNotFoundError,
            flax.errors.ScopeParamShapeError,
            flax.errors.ApplyScopeInvalidVariablesStructureError) as e:
      raise ValueError(f"params do not match model {self.name!r} on images "
                       f"{self.input_shape} (pass the 'params' collection "
                       f"of its init): {str(e).splitlines()[0]}") from None

  def feature_fn(self, params: Params) -> Callable[[jax.Array], jax.Array]:
    """``x [H, W, C] -> r [F]`` for one image, closing over ``params``."""
    return lambda x: self.features(params, x[None])[0]

  # The split r = top_post(top_pre(bottom(x))) (see _Classifier), as pure
  # functions of (params, batch); used by the Soteria Jacobian.

  @property
  def elementwise_top(self) -> bool:
    """Whether ``top_post`` is an elementwise activation then a flatten."""
    return bool(self.module.elementwise_top)

  @property
  def identity_bottom(self) -> bool:
    """Whether ``bottom`` is the identity (r depends on x through top only)."""
    return bool(self.module.identity_bottom)

  def bottom(self, params: Params, x: jax.Array) -> jax.Array:
    """Input ``h`` of the representation's last affine layer, ``[B, ...]``."""
    return self.module.apply({"params": params}, x, method="bottom")

  def top_pre(self, params: Params, h: jax.Array) -> jax.Array:
    """The last affine layer of the representation, ``z`` ``[B, ...]``."""
    return self.module.apply({"params": params}, h, method="top_pre")

  def top_post(self, params: Params, z: jax.Array) -> jax.Array:
    """What follows it: ``r = top_post(z)`` ``[B, F]``."""
    return self.module.apply({"params": params}, z, method="top_post")


def defended_params(model: Model, tree: Params) -> Params:
  """The sub-tree of ``tree`` (params or gradients) of the defended layer."""
  for key in model.defended_path:
    tree = tree[key]
  return tree


_MODULES = {
    "lenet": (LeNet, "sigmoid", ("head",)),
    "convnet64": (ConvNet, "relu", ("head",)),
    "lenet5": (LeNet5, "relu", ("fc0", "fc1", "head")),
    "leakage": (Leakage, "sigmoid", ("head",)),
    "mlp": (MLP, "relu", ("fc0", "fc1", "head")),
    "logreg": (LogReg, "linear", ("head",)),
}
MODEL_NAMES = tuple(_MODULES)


def non_default_kwargs(name: str, kwargs: dict[str, Any]) -> dict[str, Any]:
  """``kwargs`` of :func:`get_model` without those equal to the defaults.

  E.g. ``('convnet64', {'width': 64})`` -> ``{}``: two spellings of one model
  get one key (cost tables, result labels).
  """
  if name not in _MODULES:
    raise ValueError(f"Unknown model name {name!r}; valid names: "
                     f"{', '.join(MODEL_NAMES)}.")
  defaults = {f.name: f.default for f in dataclasses.fields(_MODULES[name][0])}
  missing = object()
  kwargs = dict(kwargs)
  if "hidden" in kwargs:
    kwargs["hidden"] = tuple(kwargs["hidden"])
  return {k: v for k, v in kwargs.items() if defaults.get(k, missing) != v}


def get_model(name: str,
              input_shape: Sequence[int] = (32, 32, 3),
              num_classes: int = 10,
              *,
              init: str = "default",
              conv_impl: str = "auto",
              **kwargs) -> Model:
  """Builds a registered model.

  Args:
    name: one of :data:`MODEL_NAMES`.
    input_shape: one image's ``(H, W, C)``; e.g. (28, 28, 1) for MNIST or
      (32, 32, 3) for CIFAR-10.
    num_classes: number of classes.
    init: 'default' (flax initialisers) or 'uniform' (U(-0.5, 0.5) on every
      weight and bias, as DLG).
    conv_impl: 'auto' (default: per layer and backend, see
      :func:`resolve_conv_impl`), 'xla', 'patches', 's2d', 'dense',
      'jacobian' or 'second_order' (see the module docstring).
    **kwargs: extra module attributes (e.g. ``width`` for convnet64,
      ``hidden`` for mlp / lenet5).

  Returns:
    A :class:`Model`.

  Raises:
    ValueError: unknown name, init, conv_impl or keyword argument, or an
      input shape the model cannot take.
  """
  if name not in _MODULES:
    raise ValueError(f"Unknown model name {name!r}; valid names: "
                     f"{', '.join(MODEL_NAMES)}.")
  if init not in INITS:
    raise ValueError(f"init must be one of {INITS}, got {init!r}.")
  resolve_conv_impl(conv_impl)  # Validates.
  try:
    shape = (() if isinstance(input_shape, str)
             else tuple(int(d) for d in input_shape))
  except (TypeError, ValueError):
    shape = ()
  if len(shape) != 3 or min(shape) <= 0:
    raise ValueError(f"input_shape must be (H, W, C) with positive sizes, "
                     f"e.g. (28, 28, 1) for MNIST, got {input_shape!r}.")
  input_shape = shape
  if (isinstance(num_classes, bool) or
      not isinstance(num_classes, (int, np.integer)) or num_classes < 2):
    raise ValueError(f"num_classes must be an integer >= 2, got "
                     f"{num_classes!r}.")
  cls, activation, fc_layers = _MODULES[name]
  own = ("num_classes", "init_scheme", "conv_impl", "parent", "name")
  fields = ({f.name for f in dataclasses.fields(cls)}
            if isinstance(cls, type) and issubclass(cls, _Classifier)
            else set())
  if not set(own) <= fields:
    raise ValueError(
        f"Model {name!r}: its module {cls.__name__} must subclass "
        "repdef_jax.models._Classifier and have the fields num_classes, "
        "init_scheme and conv_impl (docs/design.md, 'A model').")
  accepted = [f.name for f in dataclasses.fields(cls)
              if f.init and f.name not in own]
  unknown = sorted(set(kwargs) - set(accepted))
  if unknown:
    raise ValueError(f"Unknown keyword argument(s) {', '.join(unknown)} for "
                     f"model {name!r}; it accepts "
                     f"{', '.join(accepted) or 'none'}.")
  if "width" in kwargs and not _is_count(kwargs["width"]):
    raise ValueError(f"width must be an integer >= 1, got "
                     f"{kwargs['width']!r}.")
  if "hidden" in kwargs:  # A tuple: the Model is a static (hashed) argument.
    hidden = kwargs["hidden"]
    if not (isinstance(hidden, (list, tuple)) and
            all(_is_count(h) for h in hidden)):
      raise ValueError("hidden must be a tuple of integers >= 1, e.g. "
                       f"(200, 200) or (); got {hidden!r}.")
    kwargs = {**kwargs, "hidden": tuple(int(h) for h in hidden)}
    n = len(kwargs["hidden"])
    fc_layers = tuple(f"fc{i}" for i in range(n)) + ("head",)
  module = cls(num_classes=num_classes, init_scheme=init, conv_impl=conv_impl,
               **kwargs)
  model = Model(name=name, module=module, input_shape=input_shape,
                num_classes=num_classes, activation=activation,
                fc_layers=fc_layers)
  try:
    out = jax.eval_shape(
        lambda k: model.apply(model.init(k),
                              jnp.zeros((1, *input_shape), jnp.float32)),
        jax.random.key(0))
  except Exception as e:  # pylint: disable=broad-except
    raise ValueError(f"Model {name!r} cannot take images of shape "
                     f"{input_shape}: {e}") from e
  if out.shape != (1, num_classes):
    raise ValueError(f"Model {name!r} gives logits of shape {out.shape} for "
                     f"one image; expected (1, {num_classes}).")
  head = jax.eval_shape(model.init, jax.random.key(0))
  for key in model.defended_path:
    head = head.get(key, {}) if isinstance(head, dict) else {}
  if jnp.ndim(head.get("kernel")) != 2:
    raise ValueError(f"Model {name!r} has no Dense layer named "
                     f"{'/'.join(model.defended_path)!r} (the defended "
                     "layer, which must compute the logits).")
  if head["kernel"].shape[0] <= 0:
    raise ValueError(f"Model {name!r} cannot take images of shape "
                     f"{input_shape} (empty representation).")
  return model


def check_model(model: Any, name: str = "model") -> "Model":
  """``model`` if it is a :class:`Model` (from :func:`get_model`), else a
  one-line ValueError naming ``name`` (e.g. a model's name string)."""
  if not isinstance(model, Model):
    raise ValueError(f"{name} must be a repdef_jax Model (repdef_jax."
                     f"get_model(...)), got {type(model).__name__}"
                     + (f" {model!r}" if isinstance(model, str) else "")
                     + ".")
  return model


def check_key(key: Any, name: str = "key") -> None:
  """Raises a ValueError unless ``key`` is one PRNG key: a typed key
  (``jax.random.key``) or a raw ``uint32`` one (``jax.random.PRNGKey``, of
  the default implementation's shape); traced keys are not checked."""
  if isinstance(key, jax.core.Tracer):
    return
  dtype, shape = getattr(key, "dtype", None), getattr(key, "shape", None)
  if dtype is None or not (
      (jnp.issubdtype(dtype, jax.dtypes.prng_key) and shape == ()) or
      (dtype == jnp.uint32 and
       tuple(shape) == _raw_key_shape(jax.config.jax_default_prng_impl))):
    got = (repr(key) if isinstance(key, (int, float, str, type(None)))
           else f"{type(key).__name__}" + (
               f" of shape {tuple(shape)} and dtype {dtype}"
               if shape is not None else ""))
    raise ValueError(f"{name} must be one PRNG key (jax.random.key(seed)); "
                     f"got {got}.")


@functools.cache
def _raw_key_shape(impl: str) -> tuple[int, ...]:
  """The shape of a raw key of JAX's default PRNG ``impl`` (``(2,)`` for
  threefry, ``(4,)`` for rbg)."""
  del impl  # The cache key: the shape follows the default implementation.
  return tuple(jax.random.PRNGKey(0).shape)


def _is_count(v: Any) -> bool:
  """Whether ``v`` is an integer >= 1 (not a bool)."""
  return (not isinstance(v, bool) and isinstance(v, (int, np.integer))
          and v >= 1)


def _init_program(model: Model, rng: jax.Array) -> Params:
  x = jnp.zeros((1, *model.input_shape), jnp.float32)
  return model.module.init(rng, x)["params"]


# The init program runs once and its cost is compiling it: at XLA's default
# optimisation level (3) a CPU compile took 2.1-6.1 s per model on a 2-core
# CPU (MLP to LeNet), at level 1 0.6-1.7 s, with the same bits (checked
# for LeNet, LeNet5, ConvNet64, the leakage CNN and the MLP; the test
# compares the two levels). Level 0 draws other bits. Off CPU the
# program compiles as the user's XLA settings say.
_init_params = jax.jit(_init_program, static_argnums=0)
_init_params_cpu = jax.jit(
    _init_program, static_argnums=0,
    compiler_options={"xla_backend_optimization_level": 1})


# Model.apply and Model.features run jitted, like Model.init: called eagerly
# (evaluation, notebooks, tests), op by op, a small LeNet's first forward
# pass took 1.9 s on a 2-core CPU against 0.6 s to compile it. Inside a
# caller's jit the call is inlined.
@functools.partial(jax.jit, static_argnums=(0, 3))
def _apply(model: Model, params: Params, x: jax.Array,
           method: str | None) -> jax.Array:
  return model.module.apply({"params": params}, x, method=method)


def num_params(params: Params) -> int:
  """Total number of scalars in a parameter tree."""
  return sum(math.prod(p.shape) for p in jax.tree_util.tree_leaves(params))
