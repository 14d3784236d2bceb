"""Tests of repdef_jax.partition on small synthetic label arrays."""

import jax
import numpy as np
import pytest

from repdef_jax import partition


def _labels(num_classes=10, per_class=50, seed=0):
  """Shuffled labels with ``per_class`` examples of each class."""
  labels = np.repeat(np.arange(num_classes), per_class).astype(np.int32)
  return np.random.default_rng(seed).permutation(labels)


def _assert_disjoint(parts, num_examples=None):
  merged = np.concatenate(parts)
  assert len(np.unique(merged)) == len(merged)
  if num_examples is not None:
    assert merged.min() >= 0 and merged.max() < num_examples


def test_noniid_paper_setting():
  labels = _labels(per_class=3000)
  parts = partition.noniid(labels, num_clients=100, classes_per_client=2,
                           samples_per_class=100, seed=0)
  assert len(parts) == 100
  assert all(p.dtype == np.int64 and p.shape == (200,) for p in parts)
  _assert_disjoint(parts, len(labels))
  counts = partition.class_counts(labels, parts, 10)
  assert np.all(np.sort(counts, axis=1)[:, -2:] == 100)
  assert np.all((counts > 0).sum(axis=1) == 2)
  # Balanced assignment: every class is used by 100 * 2 / 10 = 20 clients.
  np.testing.assert_array_equal((counts > 0).sum(axis=0), 20)


@pytest.mark.parametrize("classes_per_client", [1, 3, 10])
def test_noniid_exact_class_counts(classes_per_client):
  labels = _labels(per_class=40)
  parts = partition.noniid(labels, num_clients=7,
                           classes_per_client=classes_per_client,
                           samples_per_class=5, seed=3)
  _assert_disjoint(parts, len(labels))
  counts = partition.class_counts(labels, parts, 10)
  assert np.all((counts > 0).sum(axis=1) == classes_per_client)
  assert set(np.unique(counts)) <= {0, 5}
  usage = (counts > 0).sum(axis=0)
  assert usage.max() - usage.min() <= 1


def test_noniid_seeding():
  labels = _labels()
  kwargs = dict(num_clients=10, classes_per_client=2, samples_per_class=10)
  first = partition.noniid(labels, seed=1, **kwargs)
  again = partition.noniid(labels, seed=1, **kwargs)
  other = partition.noniid(labels, seed=2, **kwargs)
  assert all(np.array_equal(a, b) for a, b in zip(first, again))
  assert not all(np.array_equal(a, b) for a, b in zip(first, other))


def test_noniid_classes_and_samples_are_drawn_at_random():
  """Ties between equally used classes and the examples taken from a class
  are random: over seeds, the first client gets different class pairs and a
  one-class client different examples, not always the lowest ones."""
  labels = _labels(per_class=50)
  pairs, samples = set(), set()
  for seed in range(20):
    [part] = partition.noniid(labels, num_clients=1, classes_per_client=2,
                              samples_per_class=5, seed=seed)
    pairs.add(tuple(np.unique(labels[part])))
    [single] = partition.noniid(labels, num_clients=1, classes_per_client=10,
                                samples_per_class=5, seed=seed)
    samples.add(tuple(np.sort(single)))
  # 45 possible pairs: 20 seeds that all pick one pair would be a fixed rule.
  assert len(pairs) > 5
  assert len(samples) == 20


def test_noniid_parts_are_grouped_in_increasing_class_order():
  """Each client's indices come class by class, classes increasing."""
  labels = _labels(per_class=40)
  for seed in range(5):
    parts = partition.noniid(labels, num_clients=9, classes_per_client=3,
                             samples_per_class=4, seed=seed)
    for part in parts:
      part_labels = labels[part]
      assert np.all(np.diff(part_labels) >= 0), part_labels
      # Each class is one contiguous block of samples_per_class.
      np.testing.assert_array_equal(np.unique(part_labels,
                                              return_counts=True)[1], 4)


def test_noniid_errors_state_the_numbers():
  labels = _labels(per_class=50)
  with pytest.raises(ValueError, match=r"classes_per_client=11.*\(10\)"):
    partition.noniid(labels, num_clients=2, classes_per_client=11,
                     samples_per_class=1, seed=0)
  # 10 clients x 2 classes over 10 classes: 2 clients per class, 60 > 50.
  with pytest.raises(ValueError,
                     match=r"class \d+ .*needs 60 samples, but only 50"):
    partition.noniid(labels, num_clients=10, classes_per_client=2,
                     samples_per_class=30, seed=0)
  missing_class = labels[labels != 4]
  with pytest.raises(ValueError, match=r"class 4 .*only 0 exist"):
    partition.noniid(missing_class, num_clients=10, classes_per_client=1,
                     samples_per_class=1, seed=0)
  for bad in ({"num_clients": 0}, {"classes_per_client": -1},
              {"samples_per_class": 0}):
    kwargs = dict(num_clients=2, classes_per_client=2, samples_per_class=1,
                  seed=0)
    kwargs.update(bad)
    [(name, value)] = bad.items()
    with pytest.raises(ValueError, match=f"{name} must be > 0, got {value}"):
      partition.noniid(labels, **kwargs)
  with pytest.raises(ValueError, match="num_classes=5"):
    partition.noniid(labels, num_clients=1, classes_per_client=1,
                     samples_per_class=1, seed=0, num_classes=5)


def test_iid():
  parts = partition.iid(103, num_clients=10, seed=0)
  assert sorted({len(p) for p in parts}) == [10, 11]
  _assert_disjoint(parts, 103)
  assert len(np.concatenate(parts)) == 103
  fixed = partition.iid(103, num_clients=10, samples_per_client=7, seed=0)
  assert all(p.dtype == np.int64 and len(p) == 7 for p in fixed)
  _assert_disjoint(fixed, 103)
  again = partition.iid(103, num_clients=10, samples_per_client=7, seed=0)
  assert all(np.array_equal(a, b) for a, b in zip(fixed, again))
  with pytest.raises(ValueError, match="need 110 examples, but only 103"):
    partition.iid(103, num_clients=10, samples_per_client=11, seed=0)


def test_iid_is_a_random_draw():
  """On a dataset sorted by class every iid client holds many classes, and
  another seed draws other clients."""
  labels = np.sort(_labels(per_class=100))
  parts = partition.iid(len(labels), num_clients=5, samples_per_client=20,
                        seed=0)
  assert all(len(np.unique(labels[p])) >= 5 for p in parts)
  other = partition.iid(len(labels), num_clients=5, samples_per_client=20,
                        seed=1)
  assert not all(np.array_equal(a, b) for a, b in zip(parts, other))


@pytest.mark.parametrize("alpha", [0.1, 1.0, 100.0])
def test_dirichlet_covers_disjointly(alpha):
  labels = _labels(per_class=30)
  parts = partition.dirichlet(labels, num_clients=6, alpha=alpha, seed=0,
                              min_size=2)
  assert len(parts) == 6
  assert all(len(p) >= 2 and p.dtype == np.int64 for p in parts)
  np.testing.assert_array_equal(np.sort(np.concatenate(parts)),
                                np.arange(len(labels)))
  counts = partition.class_counts(labels, parts, 10)
  np.testing.assert_array_equal(counts.sum(axis=0), 30)


def test_dirichlet_draws_the_examples_of_a_class_at_random():
  """A client's share of a class is a random subset of it, not the next
  run of the class's examples in dataset order."""
  labels = _labels(per_class=100)
  runs = []
  for seed in range(5):
    parts = partition.dirichlet(labels, num_clients=2, alpha=1.0, seed=seed,
                                min_size=0)
    for p in parts:
      for c in np.unique(labels[p]):
        rank = np.searchsorted(np.flatnonzero(labels == c), p[labels[p] == c])
        runs.append(np.all(np.diff(np.sort(rank)) == 1))
  assert not all(runs)


def test_dirichlet_redraws_until_min_size():
  """Seed 1's first draw (what min_size=0 accepts) leaves a client with
  fewer than 20 examples; min_size=20 redraws until none has."""
  labels = _labels(per_class=200)
  first = partition.dirichlet(labels, num_clients=10, alpha=0.05, seed=1,
                              min_size=0)
  assert min(len(p) for p in first) < 20
  parts = partition.dirichlet(labels, num_clients=10, alpha=0.05, seed=1,
                              min_size=20)
  assert min(len(p) for p in parts) >= 20
  np.testing.assert_array_equal(np.sort(np.concatenate(parts)),
                                np.arange(len(labels)))


def test_dirichlet_min_size_bounds_are_inclusive():
  """min_size x num_clients == N is allowed and met exactly: 2 examples,
  2 clients, min_size 1 gives each client one example."""
  labels = np.array([0, 0])
  for seed in range(3):
    parts = partition.dirichlet(labels, num_clients=2, alpha=1.0, seed=seed,
                                min_size=1)
    assert sorted(p.tolist() for p in parts) == [[0], [1]]
  with pytest.raises(ValueError, match="min_size=2"):
    partition.dirichlet(labels, num_clients=2, alpha=1.0, seed=0, min_size=2)


def test_dirichlet_skew_and_errors():
  labels = _labels(per_class=200)
  skewed = partition.class_counts(
      labels, partition.dirichlet(labels, num_clients=5, alpha=0.05, seed=0),
      10)
  flat = partition.class_counts(
      labels, partition.dirichlet(labels, num_clients=5, alpha=1e3, seed=0),
      10)
  assert skewed.std() > 3 * flat.std()
  for bad in (0, float("inf"), "1", None):
    with pytest.raises(ValueError, match="alpha must be a finite number > 0"):
      partition.dirichlet(labels, num_clients=5, alpha=bad, seed=0)
  with pytest.raises(ValueError, match="min_size=1000"):
    partition.dirichlet(labels, num_clients=5, alpha=1.0, seed=0,
                        min_size=1000)


def test_pack():
  rng = np.random.default_rng(0)
  images = rng.integers(1, 256, size=(30, 4, 4, 1), dtype=np.uint8)
  labels = _labels(num_classes=3, per_class=10)
  parts = [np.array([0, 5, 7]), np.array([1]), np.array([], np.int64)]
  data = partition.pack(images, labels, parts)
  assert data.num_clients == 3 and data.max_examples == 3
  assert data.x.shape == (3, 3, 4, 4, 1) and data.x.dtype == np.uint8
  assert data.y.shape == data.mask.shape == (3, 3)
  assert data.y.dtype == data.sizes.dtype == np.int32
  np.testing.assert_array_equal(data.sizes, [3, 1, 0])
  np.testing.assert_array_equal(data.mask.sum(axis=1), data.sizes)
  np.testing.assert_array_equal(data.x[0], images[[0, 5, 7]])
  np.testing.assert_array_equal(data.y[1, :1], labels[[1]])
  padding = data.mask == 0
  assert np.all(data.x[padding] == 0) and np.all(data.y[padding] == 0)

  wide = partition.pack(images, labels, parts, max_examples=5)
  assert wide.x.shape[1] == 5
  exact = partition.pack(images, labels, parts, max_examples=3)
  np.testing.assert_array_equal(exact.x, data.x)
  with pytest.raises(ValueError, match="Client 0 has 3 examples.*=2"):
    partition.pack(images, labels, parts, max_examples=2)


def test_pad_clients_and_pytree():
  images = np.ones((10, 2, 2, 3), np.float32)
  labels = np.arange(10) % 2
  data = partition.pack(images, labels, partition.iid(10, num_clients=3,
                                                      seed=0))
  padded = partition.pad_clients(data, 8)
  assert padded.num_clients == 8
  assert padded.x.shape == (8, *data.x.shape[1:])
  np.testing.assert_array_equal(padded.x[:3], data.x)
  np.testing.assert_array_equal(padded.sizes[3:], 0)
  assert np.all(padded.mask[3:] == 0) and np.all(padded.x[3:] == 0)
  assert partition.pad_clients(data, 3).num_clients == 3
  with pytest.raises(ValueError, match="num_clients=2"):
    partition.pad_clients(data, 2)
  leaves = jax.tree_util.tree_leaves(padded)
  assert len(leaves) == 4


def test_class_counts():
  labels = np.array([0, 1, 1, 2, 2, 2])
  counts = partition.class_counts(labels, [np.array([0, 1]),
                                           np.array([3, 4, 5])], 4)
  np.testing.assert_array_equal(counts, [[1, 1, 0, 0], [0, 0, 3, 0]])
  with pytest.raises(ValueError, match="num_classes=2"):
    partition.class_counts(labels, [np.array([0])], 2)


def test_pack_and_iid_refuse_what_they_would_misread():
  """Float indices were truncated, a 2-D array of indices failed with
  NumPy's 'truth value is ambiguous', a float num_classes with a TypeError,
  and iid gave empty clients without a word."""
  x, y = np.zeros((6, 2, 2, 1)), np.arange(6) % 2
  with pytest.raises(ValueError, match=r"client_indices\[0\] must be a 1-D "
                     "array of integer indices, got float64"):
    partition.pack(x, y, [np.array([1.7, 2.2])])
  with pytest.raises(ValueError, match="client_indices must be a list"):
    partition.pack(x, y, np.stack([np.arange(3), np.arange(3, 6)]))
  with pytest.raises(ValueError, match="num_classes must be an int"):
    partition.noniid(y, num_clients=2, classes_per_client=1,
                     samples_per_class=1, seed=0, num_classes=12.5)
  with pytest.raises(ValueError, match="num_examples=3 cannot give each of "
                     "num_clients=5 clients an example"):
    partition.iid(3, num_clients=5, seed=0)

