"""Property-based tests (hypothesis) for partitions, masks and metrics.

Every property is checked on random valid parameters drawn by hypothesis;
impossible parameters must raise a ValueError. ``max_examples`` is small and
``deadline=None`` so the module runs in seconds on a shared CPU.
"""

import math

from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st
import hypothesis.extra.numpy as hnp
import numpy as np
import pytest

from repdef_jax import metrics
from repdef_jax import partition
from repdef_jax.defenses import soteria

FAST = settings(max_examples=25, deadline=None, derandomize=True)


def _disjoint(parts):
  flat = np.concatenate(parts) if parts else np.zeros(0, np.int64)
  return len(flat) == len(np.unique(flat))


# --------------------------------------------------------------------------
# Partitions.


@st.composite
def _noniid_case(draw):
  num_classes = draw(st.integers(2, 6))
  classes_per_client = draw(st.integers(1, num_classes))
  num_clients = draw(st.integers(1, 8))
  samples_per_class = draw(st.integers(1, 5))
  # Enough examples per class for the worst balanced assignment.
  per_class_clients = math.ceil(num_clients * classes_per_client / num_classes)
  extra = draw(st.integers(0, 3))
  per_class = per_class_clients * samples_per_class + extra
  labels = np.repeat(np.arange(num_classes), per_class)
  labels = np.random.default_rng(draw(st.integers(0, 99))).permutation(labels)
  seed = draw(st.integers(0, 2**16))
  return labels, num_clients, classes_per_client, samples_per_class, seed


@FAST
@given(_noniid_case())
def test_noniid_disjoint_sizes_and_class_counts(case):
  labels, n, c, s, seed = case
  parts = partition.noniid(labels, num_clients=n, classes_per_client=c,
                           samples_per_class=s, seed=seed)
  assert len(parts) == n
  assert _disjoint(parts)
  num_classes = int(labels.max()) + 1
  counts = partition.class_counts(labels, parts, num_classes)
  for k, idx in enumerate(parts):
    assert len(idx) == c * s
    assert idx.dtype == np.int64
    # Exactly c distinct classes with s examples each.
    assert np.count_nonzero(counts[k]) == c
    assert set(counts[k][counts[k] > 0].tolist()) == {s}
  # Balanced class use: clients per class differ by at most one.
  usage = np.count_nonzero(counts, axis=0)
  assert usage.max() - usage.min() <= 1
  # Deterministic in the seed.
  again = partition.noniid(labels, num_clients=n, classes_per_client=c,
                           samples_per_class=s, seed=seed)
  assert all(np.array_equal(a, b) for a, b in zip(parts, again))


@FAST
@given(st.integers(2, 5), st.integers(1, 6), st.integers(0, 2**16))
def test_noniid_impossible_requests_raise(num_classes, n, seed):
  labels = np.repeat(np.arange(num_classes), 2)
  with pytest.raises(ValueError, match="classes_per_client"):
    partition.noniid(labels, num_clients=n,
                     classes_per_client=num_classes + 1,
                     samples_per_class=1, seed=seed)
  # Each class has 2 examples: asking 3 per class can never be satisfied.
  with pytest.raises(ValueError, match="samples"):
    partition.noniid(labels, num_clients=n, classes_per_client=1,
                     samples_per_class=3, seed=seed)


@FAST
@given(st.integers(0, 60), st.integers(1, 8), st.integers(0, 2**16))
def test_iid_default_covers_everything_equally(num_examples, n, seed):
  if num_examples < n:  # Some client would hold nothing.
    with pytest.raises(ValueError, match="cannot give each of|must be > 0"):
      partition.iid(num_examples, num_clients=n, seed=seed)
    return
  parts = partition.iid(num_examples, num_clients=n, seed=seed)
  assert len(parts) == n
  assert _disjoint(parts)
  assert sorted(np.concatenate(parts).tolist()) == list(range(num_examples))
  sizes = [len(p) for p in parts]
  assert max(sizes) - min(sizes) <= 1


@FAST
@given(st.integers(1, 60), st.integers(1, 8), st.integers(1, 10),
       st.integers(0, 2**16))
def test_iid_fixed_size_or_raises(num_examples, n, per_client, seed):
  if n * per_client > num_examples:
    with pytest.raises(ValueError, match="examples"):
      partition.iid(num_examples, num_clients=n, samples_per_client=per_client,
                    seed=seed)
    return
  parts = partition.iid(num_examples, num_clients=n,
                        samples_per_client=per_client, seed=seed)
  assert _disjoint(parts)
  assert all(len(p) == per_client for p in parts)
  assert all(((p >= 0) & (p < num_examples)).all() for p in parts)


@FAST
@given(hnp.arrays(np.int64, st.integers(10, 80), elements=st.integers(0, 4)),
       st.integers(1, 5), st.floats(0.05, 10.0), st.integers(0, 2**16))
def test_dirichlet_partitions_every_example_once(labels, n, alpha, seed):
  min_size = 1 if len(labels) >= n else 0
  parts = partition.dirichlet(labels, num_clients=n, alpha=alpha, seed=seed,
                              min_size=min_size)
  assert len(parts) == n
  assert _disjoint(parts)
  assert sorted(np.concatenate(parts).tolist()) == list(range(len(labels)))
  assert min(len(p) for p in parts) >= min_size
  counts = partition.class_counts(labels, parts, 5)
  np.testing.assert_array_equal(counts.sum(0), np.bincount(labels,
                                                           minlength=5))


@FAST
@given(st.integers(1, 6), st.floats(-5.0, 0.0), st.integers(0, 2**16))
def test_dirichlet_impossible_parameters_raise(n, alpha, seed):
  labels = np.arange(4) % 2
  with pytest.raises(ValueError, match="alpha"):
    partition.dirichlet(labels, num_clients=n, alpha=alpha, seed=seed)
  with pytest.raises(ValueError, match="min_size"):
    partition.dirichlet(labels, num_clients=n, alpha=1.0, seed=seed,
                        min_size=5)


# --------------------------------------------------------------------------
# Masks.

# Few distinct sizes: every new shape costs an XLA compile of the eager ops.
_SCORES = hnp.arrays(
    np.float32, st.sampled_from([1, 7, 16]),
    elements=st.one_of(st.sampled_from([0.0, 1.0, -1.0, 0.5]),
                       st.floats(-100, 100, width=32)))
_PERCENT = st.one_of(st.sampled_from([0.0, 12.5, 50.0, 100.0]),
                     st.floats(0.0, 100.0))


@FAST
@given(_SCORES, _PERCENT)
def test_count_selection_prunes_exactly_round_p_f(scores, percent):
  keep = np.asarray(soteria.mask_from_scores(scores, percent,
                                             selection="count"))
  f = len(scores)
  n_prune = round(percent / 100 * f)  # Python round: half to even.
  # float32 arithmetic of the implementation vs float64 here can only differ
  # on an exact .5 tie; accept the neighbour only in that case.
  exact = percent / 100 * f
  allowed = {n_prune}
  if abs(exact - math.floor(exact) - 0.5) < 1e-4:
    allowed |= {math.floor(exact), math.ceil(exact)}
  assert int(np.sum(keep == 0)) in allowed
  assert set(np.unique(keep).tolist()) <= {0.0, 1.0}
  # Pruned features are the smallest scores (ties by lower index first).
  pruned = np.flatnonzero(keep == 0)
  if len(pruned):
    order = np.argsort(scores, kind="stable")
    assert sorted(pruned.tolist()) == sorted(order[:len(pruned)].tolist())


@FAST
@given(_SCORES, _PERCENT)
def test_percentile_selection_equals_numpy_rule(scores, percent):
  keep = np.asarray(soteria.mask_from_scores(scores, percent,
                                             selection="percentile"))
  threshold = np.percentile(scores.astype(np.float32), percent)
  expected = (scores >= threshold).astype(np.float32)
  # jnp.percentile works in float32: only scores within float32 rounding of
  # the threshold may differ.
  close = np.isclose(scores, threshold, rtol=1e-5, atol=1e-6)
  np.testing.assert_array_equal(keep[~close], expected[~close])
  # Ties at the threshold are kept: where the order statistics on both
  # sides of the interpolation point (with a margin for float32's index)
  # are one tied value, the threshold is that value in any precision.
  ordered = np.sort(scores)
  at = percent / 100 * (len(scores) - 1)
  lo = max(0, math.floor(at - 1e-3))
  hi = min(len(scores) - 1, math.ceil(at + 1e-3))
  if ordered[lo] == ordered[hi]:
    assert np.all(keep[scores == ordered[lo]] == 1)
  assert np.all(keep[scores == scores.max()] == 1)


@FAST
@given(hnp.arrays(np.float32, st.tuples(st.sampled_from([1, 6]),
                                        st.sampled_from([3])),
                  elements=st.floats(-10, 10, width=32)),
       st.data())
def test_masked_rows_are_exactly_zero_and_rest_bit_identical(kernel, data):
  f, k = kernel.shape
  mask = np.asarray(data.draw(hnp.arrays(np.float32, (f,),
                                         elements=st.sampled_from([0.0, 1.0]))))
  bias = np.arange(k, dtype=np.float32)
  other = np.ones((3,), np.float32)
  grads = {"head": {"kernel": kernel, "bias": bias}, "conv0": {"w": other}}
  out = soteria.apply_mask(grads, mask, ("head",))
  out_k = np.asarray(out["head"]["kernel"])
  assert np.all(out_k[mask == 0] == 0)
  np.testing.assert_array_equal(out_k[mask == 1], kernel[mask == 1])
  np.testing.assert_array_equal(np.asarray(out["head"]["bias"]), bias)
  np.testing.assert_array_equal(np.asarray(out["conv0"]["w"]), other)


@FAST
@given(st.one_of(st.floats(-1e6, -1e-3), st.floats(100.001, 1e6),
                 st.just(float("nan")), st.just(float("inf"))))
def test_out_of_range_percent_raises(percent):
  with pytest.raises(ValueError, match="percent"):
    soteria.mask_from_scores(np.ones(4, np.float32), percent)


# --------------------------------------------------------------------------
# Metrics.

_IMAGES = hnp.arrays(np.float32, st.tuples(st.sampled_from([1, 3]), st.just(4),
                                           st.just(4), st.just(3)),
                     elements=st.floats(-2, 3, width=32))


@FAST
@given(_IMAGES, st.data())
def test_mse_nonnegative_and_clamped_at_most_one(a, data):
  b = data.draw(hnp.arrays(np.float32, a.shape,
                           elements=st.floats(-2, 3, width=32)))
  raw = metrics.mse_raw(a, b)
  clamped = metrics.mse_clamped(a, b)
  assert raw.shape == clamped.shape == (a.shape[0],)
  assert np.all(raw >= 0) and np.all(clamped >= 0)
  assert np.all(clamped <= 1.0)
  assert np.all(metrics.mse_raw(a, a) == 0)


@FAST
@given(_IMAGES)
def test_psnr_of_identical_images_is_infinite(a):
  assert np.all(np.isposinf(metrics.psnr(a, a)))
  assert np.allclose(metrics.ssim(np.clip(a, 0, 1), np.clip(a, 0, 1)), 1.0,
                     atol=1e-4)


@FAST
@given(st.integers(1, 6), st.integers(0, 2**16))
def test_hungarian_matching_recovers_permutation(b, seed):
  rng = np.random.default_rng(seed)
  x_true = rng.random((b, 4, 4, 1)).astype(np.float32)
  perm = rng.permutation(b)
  x_rec = x_true[perm]  # x_rec[j] = x_true[perm[j]]
  found = metrics.match_images(x_rec, x_true)
  # x_rec[found[i]] must be x_true[i].
  np.testing.assert_array_equal(x_rec[found], x_true)
  np.testing.assert_array_equal(perm[found], np.arange(b))
