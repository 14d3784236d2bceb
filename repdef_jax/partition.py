"""Splitting a dataset among federated clients (host-side numpy).

A partition is a list with one ``int64`` index array per client; the indices of
different clients are disjoint. :func:`pack` turns a partition into a padded,
fixed-shape :class:`ClientData` that can be ``vmap``-ed or sharded over
clients.

All randomness comes from ``np.random.default_rng(seed)``: the same arguments
and seed always give the same partition.
"""

from __future__ import annotations

from collections.abc import Sequence
import math
import operator

import flax.struct
import numpy as np

_MAX_DIRICHLET_TRIES = 1000


@flax.struct.dataclass
class ClientData:
  """Clients' examples, padded to a common size (a JAX pytree).

  Attributes:
    x: images ``[clients, max_examples, ...]``, zero past each client's size.
    y: ``int32`` labels ``[clients, max_examples]``, zero past the size.
    mask: ``float32`` ``[clients, max_examples]``, 1 for real examples and 0
      for padding.
    sizes: ``int32`` ``[clients]``, the number of real examples per client.
  """

  x: np.ndarray
  y: np.ndarray
  mask: np.ndarray
  sizes: np.ndarray

  @property
  def num_clients(self) -> int:
    """Number of clients, padding clients included."""
    return self.sizes.shape[0]

  @property
  def max_examples(self) -> int:
    """Padded number of examples per client."""
    return self.mask.shape[1]


def noniid(labels: np.ndarray, *, num_clients: int, classes_per_client: int,
           samples_per_class: int, seed: int,
           num_classes: int | None = None) -> list[np.ndarray]:
  """The paper's pathological non-IID split.

  Each client gets ``classes_per_client`` distinct classes and
  ``samples_per_class`` examples of each, drawn without replacement, so no
  example goes to two clients. Classes are assigned greedily to keep their use
  balanced: every client takes the classes used by the fewest clients so far
  (ties broken at random), so the number of clients per class differs by at
  most one.

  Args:
    labels: integer labels ``[N]``.
    num_clients: number of clients.
    classes_per_client: distinct classes per client.
    samples_per_class: examples per class and client.
    seed: seed of ``np.random.default_rng``.
    num_classes: number of classes; defaults to ``max(labels) + 1``.

  Returns:
    ``num_clients`` ``int64`` index arrays of length
    ``classes_per_client * samples_per_class``, grouped by class in
    increasing class order.

  Raises:
    ValueError: if the request is impossible, e.g. more classes per client
      than classes, or a class without enough examples for its clients.
  """
  labels = _as_labels(labels)
  _check_positive(num_clients=num_clients,
                  classes_per_client=classes_per_client,
                  samples_per_class=samples_per_class)
  num_classes = _num_classes(labels, num_classes)
  if classes_per_client > num_classes:
    raise ValueError(f"classes_per_client={classes_per_client} exceeds the "
                     f"number of classes ({num_classes}).")

  rng = _rng(seed)
  usage = np.zeros(num_classes, np.int64)
  client_classes = []
  for _ in range(num_clients):
    # Integer usage plus a tie-breaker in [0, 1): least-used classes first.
    order = np.argsort(usage + rng.random(num_classes), kind="stable")
    chosen = np.sort(order[:classes_per_client])
    usage[chosen] += 1
    client_classes.append(chosen)

  available = np.bincount(labels, minlength=num_classes)
  for cls in range(num_classes):
    needed = usage[cls] * samples_per_class
    if needed > available[cls]:
      raise ValueError(
          f"Cannot give {num_clients} clients {classes_per_client} classes x "
          f"{samples_per_class} samples: class {cls} is assigned to "
          f"{usage[cls]} clients and needs {needed} samples, but only "
          f"{available[cls]} exist.")

  pools = [rng.permutation(np.flatnonzero(labels == cls))
           for cls in range(num_classes)]
  taken = np.zeros(num_classes, np.int64)
  partition = []
  for chosen in client_classes:
    parts = []
    for cls in chosen:
      start = taken[cls]
      parts.append(pools[cls][start:start + samples_per_class])
      taken[cls] += samples_per_class
    partition.append(np.concatenate(parts).astype(np.int64))
  return partition


def iid(num_examples: int, *, num_clients: int,
        samples_per_client: int | None = None,
        seed: int) -> list[np.ndarray]:
  """A uniformly random split into disjoint clients.

  Args:
    num_examples: size of the dataset to split.
    num_clients: number of clients.
    samples_per_client: examples per client; by default all examples are
      shared out as equally as possible (sizes differ by at most one).
    seed: seed of ``np.random.default_rng``.

  Returns:
    ``num_clients`` disjoint ``int64`` index arrays.

  Raises:
    ValueError: if there are not enough examples.
  """
  _check_positive(num_clients=num_clients, num_examples=num_examples)
  if num_examples < num_clients:
    raise ValueError(f"num_examples={num_examples} cannot give each of "
                     f"num_clients={num_clients} clients an example.")
  order = _rng(seed).permutation(num_examples)
  if samples_per_client is None:
    return [part.astype(np.int64)
            for part in np.array_split(order, num_clients)]
  _check_positive(samples_per_client=samples_per_client)
  needed = num_clients * samples_per_client
  if needed > num_examples:
    raise ValueError(
        f"{num_clients} clients x {samples_per_client} samples need {needed} "
        f"examples, but only {num_examples} exist.")
  blocks = order[:needed].reshape(num_clients, samples_per_client)
  return list(blocks.astype(np.int64))


def dirichlet(labels: np.ndarray, *, num_clients: int, alpha: float,
              seed: int, min_size: int = 1) -> list[np.ndarray]:
  """Label-skewed split with per-class Dirichlet(``alpha``) proportions.

  For every class, the shares of the clients are drawn from a symmetric
  Dirichlet distribution and the class's shuffled examples are cut
  accordingly. Smaller ``alpha`` means more skew. Draws are repeated until
  every client has at least ``min_size`` examples. Every example is assigned
  to exactly one client.

  Args:
    labels: integer labels ``[N]``.
    num_clients: number of clients.
    alpha: concentration, > 0.
    seed: seed of ``np.random.default_rng``.
    min_size: smallest acceptable client size.

  Returns:
    ``num_clients`` disjoint ``int64`` index arrays covering ``range(N)``.

  Raises:
    ValueError: for invalid arguments, or if ``min_size`` is not reached
      within a fixed number of draws.
  """
  labels = _as_labels(labels)
  _check_positive(num_clients=num_clients)
  if (isinstance(alpha, (bool, np.bool_)) or
      not isinstance(alpha, (int, float, np.integer, np.floating)) or
      not (math.isfinite(alpha) and alpha > 0)):
    raise ValueError(f"alpha must be a finite number > 0, got {alpha!r}.")
  if isinstance(min_size, bool) or not isinstance(
      min_size, (int, np.integer)) or min_size < 0:
    raise ValueError(f"min_size must be an int >= 0, got {min_size!r}.")
  if min_size * num_clients > len(labels):
    raise ValueError(
        f"min_size={min_size} x num_clients={num_clients} is not achievable "
        f"with {len(labels)} examples.")

  rng = _rng(seed)
  classes = np.unique(labels)
  for _ in range(_MAX_DIRICHLET_TRIES):
    parts: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
    for cls in classes:
      pool = rng.permutation(np.flatnonzero(labels == cls))
      shares = rng.dirichlet(np.full(num_clients, float(alpha)))
      cuts = (np.cumsum(shares)[:-1] * len(pool)).astype(np.int64)
      for client, piece in enumerate(np.split(pool, cuts)):
        parts[client].append(piece)
    partition = [np.sort(np.concatenate(p)).astype(np.int64) for p in parts]
    if min(len(p) for p in partition) >= min_size:
      return partition
  raise ValueError(
      f"No Dirichlet(alpha={alpha}) split gave all {num_clients} clients at "
      f"least min_size={min_size} examples in {_MAX_DIRICHLET_TRIES} draws; "
      "raise alpha or lower min_size.")


def pack(images: np.ndarray, labels: np.ndarray,
         client_indices: Sequence[np.ndarray], *,
         max_examples: int | None = None) -> ClientData:
  """Gathers each client's examples into zero-padded arrays.

  Args:
    images: ``[N, ...]`` images of any dtype (kept as is, e.g. ``uint8``).
    labels: ``[N]`` integer labels.
    client_indices: one index array per client, e.g. from :func:`noniid`.
      Not checked for overlap: the partitions of this module are disjoint,
      but an index list of your own may repeat an example, within a client
      or across clients, and it is then packed as often as it is listed.
    max_examples: padded size per client; defaults to the largest client.

  Returns:
    The packed :class:`ClientData`.

  Raises:
    ValueError: if there are no clients, the inputs disagree in length, a
      client has more than ``max_examples`` examples, or an index is
      negative or not below ``len(images)``.
  """
  images = np.asarray(images)
  labels = np.asarray(labels)
  if labels.ndim != 1:
    raise ValueError(f"labels must be [N] integer class ids, got shape "
                     f"{labels.shape} (one-hot labels: argmax them).")
  if len(images) != len(labels):
    raise ValueError(f"images ({len(images)}) and labels ({len(labels)}) "
                     "differ in length.")
  if not isinstance(client_indices, (list, tuple)):
    raise ValueError("client_indices must be a list of index arrays (one per "
                     f"client), got {type(client_indices).__name__}.")
  if not client_indices:
    raise ValueError("client_indices is empty: need at least one client.")
  sizes = np.array([len(idx) for idx in client_indices], np.int32)
  largest = int(sizes.max())
  if max_examples is None:
    max_examples = largest
  elif largest > max_examples:
    client = int(sizes.argmax())
    raise ValueError(f"Client {client} has {largest} examples, more than "
                     f"max_examples={max_examples}.")

  num_clients = len(client_indices)
  x = np.zeros((num_clients, max_examples, *images.shape[1:]), images.dtype)
  y = np.zeros((num_clients, max_examples), np.int32)
  mask = np.zeros((num_clients, max_examples), np.float32)
  for client, idx in enumerate(client_indices):
    idx = np.asarray(idx)
    if idx.ndim != 1 or (idx.size and not np.issubdtype(idx.dtype,
                                                        np.integer)):
      raise ValueError(f"client_indices[{client}] must be a 1-D array of "
                       f"integer indices, got {idx.dtype}{list(idx.shape)}.")
    idx = idx.astype(np.int64)
    bad = idx[(idx < 0) | (idx >= len(images))]
    if bad.size:
      raise ValueError(
          f"client_indices[{client}] holds index {int(bad[0])}, outside "
          f"[0, {len(images)}) for {len(images)} images (negative indices "
          "are not allowed).")
    x[client, :len(idx)] = images[idx]
    y[client, :len(idx)] = labels[idx]
    mask[client, :len(idx)] = 1.0
  return ClientData(x=x, y=y, mask=mask, sizes=sizes)


def pad_clients(data: ClientData, num_clients: int) -> ClientData:
  """Appends empty clients (all padding, size 0), e.g. to fill a device mesh.

  Args:
    data: packed clients.
    num_clients: total number of clients wanted, at least
      ``data.num_clients``.

  Returns:
    ``ClientData`` with ``num_clients`` clients; the first ones are ``data``.

  Raises:
    ValueError: if ``num_clients`` is smaller than ``data.num_clients``.
  """
  extra = num_clients - data.num_clients
  if extra < 0:
    raise ValueError(f"num_clients={num_clients} is smaller than the "
                     f"{data.num_clients} clients already present.")

  def pad(array: np.ndarray) -> np.ndarray:
    widths = [(0, extra)] + [(0, 0)] * (array.ndim - 1)
    return np.pad(np.asarray(array), widths)

  return ClientData(x=pad(data.x), y=pad(data.y), mask=pad(data.mask),
                    sizes=pad(data.sizes))


def class_counts(labels: np.ndarray, client_indices: Sequence[np.ndarray],
                 num_classes: int) -> np.ndarray:
  """Examples of each class held by each client.

  Args:
    labels: integer labels ``[N]``.
    client_indices: one index array per client.
    num_classes: number of classes.

  Returns:
    ``int64`` counts ``[clients, num_classes]``.
  """
  labels = _as_labels(labels)
  if labels.size and labels.max() >= num_classes:
    raise ValueError(f"Label {labels.max()} is out of range for "
                     f"num_classes={num_classes}.")
  counts = [np.bincount(labels[np.asarray(idx, np.int64)],
                        minlength=num_classes) for idx in client_indices]
  return np.array(counts, np.int64).reshape(len(client_indices), num_classes)


def _as_labels(labels: np.ndarray) -> np.ndarray:
  """Checks that ``labels`` is a 1-D array of non-negative integers."""
  labels = np.asarray(labels)
  if labels.ndim != 1 or not np.issubdtype(labels.dtype, np.integer):
    raise ValueError("labels must be a 1-D integer array, got shape "
                     f"{labels.shape} and dtype {labels.dtype}.")
  if labels.size and labels.min() < 0:
    raise ValueError(f"labels must be non-negative, found {labels.min()}.")
  return labels


def _num_classes(labels: np.ndarray, num_classes: int | None) -> int:
  """``num_classes``, defaulting to ``max(labels) + 1`` and checked."""
  inferred = int(labels.max()) + 1 if labels.size else 0
  if num_classes is None:
    return inferred
  _check_positive(num_classes=num_classes)
  if num_classes < inferred:
    raise ValueError(f"num_classes={num_classes} but labels go up to "
                     f"{inferred - 1}.")
  return num_classes


def _rng(seed: int) -> np.random.Generator:
  """``np.random.default_rng(seed)``; ValueError unless an integer >= 0
  (any integer scalar, as :func:`repdef_jax.fedavg.key_streams` takes)."""
  try:
    value = None if isinstance(seed, bool) else operator.index(seed)
  except TypeError:
    value = None
  if value is None or value < 0:
    raise ValueError(f"seed must be an integer >= 0, got {seed!r}.")
  return np.random.default_rng(value)


def _check_positive(**values: int) -> None:
  """Raises ``ValueError`` unless every keyword value is an int > 0."""
  for name, value in values.items():
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
      raise ValueError(f"{name} must be an int, got {value!r}.")
    if value <= 0:
      raise ValueError(f"{name} must be > 0, got {value}.")
