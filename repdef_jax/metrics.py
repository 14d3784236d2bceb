"""Reconstruction and representation metrics, each with its pixel space.

Pixel spaces (the value of a metric changes ~16x between CIFAR-10's
normalised space and [0, 1], so every result records its space):

* :func:`mse_raw`: mean over pixels of ``(x_rec - x)^2`` without clamping, in
  whatever space the images are given (the paper's privacy metric; unbounded
  for a diverged reconstruction).
* :func:`mse_clamped`: the same after clamping ``x_rec`` (and ``x``) to
  [0, 1]; the images must be [0, 1] images.
* :func:`psnr`, :func:`ssim`: ``dm_pix`` on images clamped to [0, 1]
  (max value 1), computed per image and then averaged. SSIM uses an 11-px
  window, a smaller one on images below 11 px (not comparable with 11-px
  SSIM; :func:`ssim_window`).
* :func:`label_accuracy`, :func:`match_images` (Hungarian matching on the
  pairwise clamped MSE), :func:`representation_correlation` (Pearson; space
  of the representation).

Images are float ``[B, H, W, C]`` or one image ``[H, W, C]``; another
rank, integer pixels (convert with ``repdef_jax.data.to_float``), a
channels-first-looking shape (a leading axis of 1 or 3 with a last one of
neither), a rank-3 array whose last axis is no channel count (1, 3 or 4: a
grayscale batch without its channel axis) and an empty batch raise a
ValueError (:func:`as_images`). True images are expected in [0, 1] and not
checked.

Non-finite reconstructions (a diverged attack) give ``mse = inf``,
``mse_clamped``/``psnr``/``ssim`` computed after replacing NaN by 0.5 and
+-inf by the box ends, and ``finite = False`` in
:func:`reconstruction_metrics`.
"""

from __future__ import annotations

from typing import Any

import dm_pix as pix
import jax
import jax.numpy as jnp
import numpy as np
from scipy import optimize

PIXEL_SPACE = "[0,1]"

# dm_pix's metrics as one program per shape: run eagerly, SSIM dispatches
# about 20 operations, each compiled on its own for every new image shape.
_psnr = jax.jit(pix.psnr)
_ssim = jax.jit(pix.ssim, static_argnames=("max_val", "filter_size"))


def as_images(x: Any, name: str = "x") -> np.ndarray:
  """``x`` as ``[B, H, W, C]`` float64 (what every metric here takes).

  ValueError unless float images of rank 3 or 4, channels last, at least one:
  integer pixels (``data.load``'s uint8) and channels-first arrays would
  otherwise give wrong numbers silently.
  """
  x = np.asarray(x)
  if x.ndim not in (3, 4):
    raise ValueError(f"{name} must be images [B, H, W, C] or one image "
                     f"[H, W, C]; got shape {x.shape}.")
  if not jnp.issubdtype(x.dtype, jnp.floating):  # (bfloat16 is one.)
    top = f" with max {x.max()}" if x.size and x.dtype != bool else ""
    raise ValueError(f"{name} must be float images in [0, 1], got "
                     f"{x.dtype}{top}; convert with "
                     "repdef_jax.data.to_float.")
  c_first, c_last = x.shape[-3], x.shape[-1]
  if x.ndim == 3 and c_last not in (1, 3, 4):
    raise ValueError(f"{name} of shape {x.shape} is no image [H, W, C] "
                     "(C 1, 3 or 4); a grayscale batch [B, H, W] needs its "
                     "channel axis: x[..., None].")
  if c_first in (1, 3) and c_last not in (1, 3):
    raise ValueError(f"{name} must be channels-last [B, H, W, C]; shape "
                     f"{x.shape} looks channels-first [B, C, H, W] (move the "
                     "axis) or grayscale [B, H, W] (add one: x[..., None]).")
  x = x.astype(np.float64)
  x = x[None] if x.ndim == 3 else x
  if not len(x):
    raise ValueError(f"{name} is an empty batch (shape {x.shape}).")
  return x


def _check_same_shape(x_rec: Any, x_true: Any) -> tuple[np.ndarray,
                                                          np.ndarray]:
  """Both as ``[B, H, W, C]`` float64; ValueError when their shapes differ.

  Guards against NumPy broadcasting (e.g. one reconstruction against three
  true images) silently producing a per-image metric.
  """
  x_rec, x_true = as_images(x_rec, "x_rec"), as_images(x_true, "x_true")
  if x_rec.shape != x_true.shape:
    raise ValueError(f"x_rec {x_rec.shape} and x_true {x_true.shape} differ "
                     "in shape; both must be [B, H, W, C] (or one image "
                     "[H, W, C]) of the same shape.")
  return x_rec, x_true


def _sanitize(x):
  """NaN -> 0.5, +-inf -> 1 / 0, then clamp to [0, 1]."""
  x = np.nan_to_num(np.asarray(x, np.float64), nan=0.5, posinf=1.0, neginf=0.0)
  return np.clip(x, 0.0, 1.0)


def mse_raw(x_rec: Any, x_true: Any) -> np.ndarray:
  """Per-image mean squared error, no clamping (inf if x_rec is not finite).

  Args:
    x_rec: ``[B, H, W, C]`` (or one image), any pixel space.
    x_true: same shape and space.

  Returns:
    ``[B]`` float64.
  """
  x_rec, x_true = _check_same_shape(x_rec, x_true)
  with np.errstate(over="ignore", invalid="ignore"):
    err = np.mean((x_rec - x_true) ** 2, axis=(1, 2, 3))
  return np.where(np.isfinite(err), err, np.inf)


def mse_clamped(x_rec: Any, x_true: Any) -> np.ndarray:
  """Per-image MSE after clamping both images to [0, 1]; ``[B]``."""
  x_rec, x_true = _check_same_shape(x_rec, x_true)
  x_rec, x_true = _sanitize(x_rec), _sanitize(x_true)
  return np.mean((x_rec - x_true) ** 2, axis=(1, 2, 3))


def psnr(x_rec: Any, x_true: Any) -> np.ndarray:
  """Per-image PSNR (dB, ``dm_pix.psnr``) on images clamped to [0, 1]; ``[B]``.

  Identical images (after clamping) give +inf, which summaries drop as
  non-finite (counted in their ``dropped``): a mean PSNR leaves exact
  reconstructions out.
  """
  x_rec, x_true = _check_same_shape(x_rec, x_true)
  a = jnp.asarray(_sanitize(x_rec), jnp.float32)
  b = jnp.asarray(_sanitize(x_true), jnp.float32)
  return np.asarray(_psnr(a, b), np.float64)


SSIM_WINDOW = 11


def ssim_window(height: int, width: int) -> int:
  """The SSIM window: 11 px, or ``min(H, W)`` rounded down to odd below it.

  Raises:
    ValueError: an image smaller than 3 x 3 pixels.
  """
  size = min(SSIM_WINDOW, height, width)
  if size < 3:
    raise ValueError(f"ssim needs images of at least 3 x 3 pixels; got "
                     f"{height} x {width}.")
  return size if size % 2 else size - 1


def ssim(x_rec: Any, x_true: Any) -> np.ndarray:
  """Per-image SSIM (``dm_pix.ssim``, max value 1) on clamped images; ``[B]``.

  Gaussian window of ``filter_sigma`` 1.5 and size 11 (dm_pix's default)
  on images of at least 11 x 11 pixels. A smaller image gets a smaller
  window, ``min(H, W)`` rounded down to odd (dm_pix's 11-px window does not
  fit it and gives meaningless numbers); such SSIM values are not comparable
  with 11-px SSIM. Images below 3 x 3 pixels raise a ValueError.
  """
  x_rec, x_true = _check_same_shape(x_rec, x_true)
  size = ssim_window(*x_rec.shape[1:3])
  a = jnp.asarray(_sanitize(x_rec), jnp.float32)
  b = jnp.asarray(_sanitize(x_true), jnp.float32)
  return np.asarray(_ssim(a, b, max_val=1.0, filter_size=size),
                    np.float64)


def label_accuracy(labels_rec: Any, labels_true: Any) -> float:
  """Fraction of equal labels."""
  a, b = np.asarray(labels_rec).reshape(-1), np.asarray(labels_true).reshape(-1)
  if a.shape != b.shape:
    raise ValueError(f"label shapes differ: {a.shape} vs {b.shape}.")
  return float(np.mean(a == b)) if a.size else float("nan")


def match_images(x_rec: Any, x_true: Any) -> np.ndarray:
  """Hungarian matching of reconstructions to true images.

  Args:
    x_rec: ``[B, H, W, C]`` reconstructions.
    x_true: ``[B, H, W, C]`` true images ([0, 1]).

  Returns:
    ``perm`` ``[B]`` such that ``x_rec[perm[i]]`` is matched to
    ``x_true[i]``, minimising the total clamped [0, 1] MSE.
  """
  a = _sanitize(as_images(x_rec, "x_rec"))
  b = _sanitize(as_images(x_true, "x_true"))
  if a.shape != b.shape:
    raise ValueError(f"x_rec {a.shape} and x_true {b.shape} differ in shape.")
  fa, fb = a.reshape(len(a), -1), b.reshape(len(b), -1)
  cost = np.mean((fb[:, None, :] - fa[None, :, :]) ** 2, axis=-1)  # [true, rec]
  rows, cols = optimize.linear_sum_assignment(cost)
  perm = np.empty(len(b), np.int64)
  perm[rows] = cols
  return perm


def representation_correlation(r_est: Any, r_true: Any) -> float:
  """Pearson correlation of two flattened representations (0 if constant).

  Host-side twin of :func:`repdef_jax.attacks.repinfer.pearson`, in float64.

  Raises:
    ValueError: ``r_est`` and ``r_true`` differ in size.
  """
  a = np.asarray(r_est, np.float64).reshape(-1)
  b = np.asarray(r_true, np.float64).reshape(-1)
  if a.size != b.size:
    raise ValueError(f"r_est ({a.size} values, shape "
                     f"{np.shape(r_est)}) and r_true ({b.size} values, shape "
                     f"{np.shape(r_true)}) must have the same size.")
  a, b = a - a.mean(), b - b.mean()
  den = np.sqrt(np.sum(a * a) * np.sum(b * b))
  return 0.0 if den == 0 else float(np.sum(a * b) / den)  # NaN stays NaN.


def reconstruction_metrics(x_rec: Any, x_true: Any, *,
                           pixel_space: str = PIXEL_SPACE,
                           match: bool = True) -> dict:
  """All image metrics, averaged over the batch, with their pixel space.

  Args:
    x_rec: reconstructions ``[B, H, W, C]`` (or one image).
    x_true: true images, same shape, in ``pixel_space``.
    pixel_space: the space the images are in; clamped metrics (mse_clamped,
      psnr, ssim) assume '[0,1]' and raise otherwise.
    match: reorder reconstructions by Hungarian matching first (B > 1).

  Returns:
    dict with 'mse' (raw, in ``pixel_space``), 'mse_clamped', 'psnr', 'ssim'
    (clamped [0, 1]), 'finite' (x_rec all finite), 'perm' (list) and
    'pixel_space'.
  """
  if pixel_space != PIXEL_SPACE:
    raise ValueError(f"clamped metrics need images in {PIXEL_SPACE}; got "
                     f"pixel_space={pixel_space!r}. Map them back first.")
  x_rec, x_true = _check_same_shape(x_rec, x_true)
  perm = match_images(x_rec, x_true) if (match and len(x_rec) > 1) else \
      np.arange(len(x_rec))
  x_rec = x_rec[perm]
  return {
      "mse": float(np.mean(mse_raw(x_rec, x_true))),
      "mse_clamped": float(np.mean(mse_clamped(x_rec, x_true))),
      "psnr": float(np.mean(psnr(x_rec, x_true))),
      "ssim": float(np.mean(ssim(x_rec, x_true))),
      "finite": bool(np.all(np.isfinite(x_rec))),
      "perm": [int(i) for i in perm],
      "pixel_space": pixel_space,
  }
