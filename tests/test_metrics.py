"""Tests of repdef_jax.metrics."""

import itertools

import numpy as np
import pytest

from repdef_jax import metrics


def _imgs(n=4, seed=0, shape=(16, 16, 3)):
  return np.random.default_rng(seed).uniform(size=(n, *shape)).astype(
      np.float32)


def test_psnr_ssim_of_identical_images():
  x = _imgs()
  assert np.all(np.isinf(metrics.psnr(x, x)))
  np.testing.assert_allclose(metrics.ssim(x, x), 1.0, atol=1e-5)
  np.testing.assert_allclose(metrics.psnr(x * 0 + 0.5, x * 0 + 0.6),
                             20.0, atol=1e-3)  # 10 log10(1 / 0.01)


def test_mse_raw_vs_clamped():
  x = np.zeros((1, 2, 2, 1))
  rec = np.full((1, 2, 2, 1), 3.0)
  np.testing.assert_allclose(metrics.mse_raw(rec, x), [9.0])
  np.testing.assert_allclose(metrics.mse_clamped(rec, x), [1.0])
  nan = rec.copy()
  nan[0, 0, 0, 0] = np.nan
  assert np.isinf(metrics.mse_raw(nan, x)[0])
  # Clamped: NaN reads as 0.5 (0.25 from the truth 0), 3 as 1 (1 each).
  np.testing.assert_allclose(metrics.mse_clamped(nan, x), [(0.25 + 3) / 4])


def test_mse_raw_is_per_image_and_ssim_is_on_clamped_pixels():
  """One MSE per image (over H, W, C), and SSIM, like PSNR, on the
  reconstruction clamped to [0, 1] (a divergent one leaves the box)."""
  x = _imgs(2, shape=(16, 16, 3))
  rec = x + np.array([0.1, 0.2], np.float32)[:, None, None, None]
  np.testing.assert_allclose(metrics.mse_raw(rec, x), [0.01, 0.04],
                             rtol=1e-5)
  wild = 3 * x - 1
  np.testing.assert_allclose(metrics.ssim(wild, x),
                             metrics.ssim(np.clip(wild, 0, 1), x), atol=1e-6)


def test_hungarian_matching_recovers_permutation():
  x = _imgs(5)
  perm = np.array([3, 0, 4, 1, 2])
  rec = x[perm] + 0.01
  p = metrics.match_images(rec, x)
  np.testing.assert_array_equal(perm[p], np.arange(5))
  np.testing.assert_allclose(rec[p] - 0.01, x, atol=1e-6)
  m = metrics.reconstruction_metrics(rec, x)
  np.testing.assert_allclose(m["mse"], 1e-4, rtol=1e-3)
  assert m["pixel_space"] == "[0,1]" and m["finite"]


def test_reconstruction_metrics_diverged_and_space():
  x = _imgs(1)
  m = metrics.reconstruction_metrics(np.full_like(x, np.inf), x)
  assert np.isinf(m["mse"]) and not m["finite"]
  # +inf clamps to 1 and -inf to 0: the clamped metrics are those images'.
  assert m["mse_clamped"] == pytest.approx(np.mean((1 - x) ** 2))
  assert np.isfinite(m["psnr"])
  m = metrics.reconstruction_metrics(np.full_like(x, -np.inf), x)
  assert m["mse_clamped"] == pytest.approx(np.mean(x ** 2))
  with pytest.raises(ValueError, match="pixel_space"):
    metrics.reconstruction_metrics(x, x, pixel_space="normalized")


def test_label_accuracy_and_correlation():
  assert metrics.label_accuracy([1, 2, 3], [1, 0, 3]) == pytest.approx(2 / 3)
  r = np.random.default_rng(0).normal(size=50)
  assert metrics.representation_correlation(2 * r + 1, r) == pytest.approx(1)
  assert metrics.representation_correlation(-r, r) == pytest.approx(-1)


@pytest.mark.parametrize("size", [8, 32])
def test_ssim_of_independent_noise_is_near_zero(size):
  # Below 11 px the window shrinks to fit (dm_pix's 11-px window would give
  # 0.6-0.7 for independent noise at 4 px).
  a, b = _imgs(4, 0, (size, size, 3)), _imgs(4, 1, (size, size, 3))
  assert np.all(np.abs(metrics.ssim(a, b)) < 0.2)
  np.testing.assert_allclose(metrics.ssim(a, a), 1.0, atol=1e-5)


def test_ssim_window():
  assert [metrics.ssim_window(s, s) for s in (3, 4, 8, 10, 11, 28)] == [
      3, 3, 7, 9, 11, 11]
  assert metrics.ssim_window(32, 6) == 5
  with pytest.raises(ValueError, match="at least 3 x 3 pixels; got 2 x 8"):
    metrics.ssim(np.zeros((1, 2, 8, 1)), np.zeros((1, 2, 8, 1)))


@pytest.mark.parametrize("fn", [metrics.mse_raw, metrics.mse_clamped,
                                metrics.psnr, metrics.ssim,
                                metrics.match_images,
                                metrics.reconstruction_metrics])
def test_images_of_the_wrong_rank_raise(fn):
  with pytest.raises(ValueError, match=r"x_rec must be images \[B, H, W, C\] "
                     r"or one image \[H, W, C\]; got shape \(8, 8\)"):
    fn(np.zeros((8, 8)), np.ones((8, 8)))
  with pytest.raises(ValueError, match="x_true must be images"):
    fn(np.zeros((1, 8, 8, 1)), np.ones((1, 1, 8, 8, 1)))


def test_matching_reads_non_finite_reconstructions_as_clamped():
  # Two flat 3 x 3 truths, 0.1 and 0.9. rec[0] is the 0.9 one with a NaN
  # pixel (read as 0.5), rec[1] the 0.1 one with a +inf pixel (read as 1):
  # by the clamped cost rec[1] matches x[0] and rec[0] matches x[1].
  x = np.stack([np.full((3, 3, 1), 0.1), np.full((3, 3, 1), 0.9)])
  rec = x[::-1].copy()
  rec[0, 0, 0, 0] = np.nan
  rec[1, 1, 1, 0] = np.inf
  np.testing.assert_array_equal(metrics.match_images(rec, x), [1, 0])
  np.testing.assert_array_equal(metrics.match_images(rec[::-1], x), [0, 1])


def test_finite_flag_covers_every_reconstruction():
  """'finite' is False when any reconstruction of the batch diverged, not
  only the first one after matching."""
  x = np.random.default_rng(0).uniform(size=(3, 8, 8, 1))
  rec = x.copy()
  rec[2, 0, 0, 0] = np.nan
  assert not metrics.reconstruction_metrics(rec, x)["finite"]
  assert not metrics.reconstruction_metrics(rec, x, match=False)["finite"]
  assert metrics.reconstruction_metrics(x, x)["finite"]


def test_matching_minimises_the_total_clamped_mse():
  """The Hungarian matching is the permutation of least total clamped MSE
  (brute force over all 5! of them, on unrelated images where the choice
  is not obvious)."""
  rng = np.random.default_rng(1)
  for _ in range(5):
    x = rng.uniform(size=(5, 6, 6, 1))
    rec = rng.uniform(-0.3, 1.3, size=(5, 6, 6, 1))

    def cost(p, rec=rec, x=x):
      return np.sum(metrics.mse_clamped(rec[list(p)], x))

    best = min(cost(p) for p in itertools.permutations(range(5)))
    perm = metrics.match_images(rec, x)
    assert sorted(perm) == list(range(5))
    assert cost(perm) == pytest.approx(best, rel=1e-12)


def test_a_grayscale_batch_without_its_channel_axis_is_refused():
  """[B, H, W] of 8 MNIST images would read as one 8 x 28 image of 28
  channels (window 7, every metric meaningless); a channels-last single
  image [H, W, C] stays accepted."""
  x = np.random.default_rng(0).random((8, 28, 28))
  with pytest.raises(ValueError, match=r"x of shape \(8, 28, 28\) is no "
                     r"image \[H, W, C\]"):
    metrics.as_images(x)
  assert metrics.as_images(x[0][..., None]).shape == (1, 28, 28, 1)
  assert metrics.as_images(x[:3].transpose(1, 2, 0)).shape == (1, 28, 28, 3)
