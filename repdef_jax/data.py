"""Image-classification datasets read from prepared TFDS copies.

Records are read with :func:`tensorflow_datasets.data_source`, which needs
neither TensorFlow nor network access; nothing is ever downloaded. Decoding is
slow (about 15 s for the 60,000 MNIST training images), so :func:`load`
decodes a split once and keeps the result twice: in an in-process dictionary
and in an ``.npz`` file on disk.

Example:
  >>> images, labels = load("mnist", "train", data_dir="/data/tfds")
  >>> x = normalize(to_float(images), "mnist")
"""

from __future__ import annotations

import dataclasses
import hashlib
from io import BytesIO
import logging
import os
import re
import zipfile
from typing import Any

import numpy as np

from repdef_jax import storage

logger = logging.getLogger(__name__)

_DATA_DIR_ENV = "TFDS_DATA_DIR"
_CACHE_DIR_ENV = "REPDEF_JAX_CACHE"
_DEFAULT_CACHE_DIR = os.path.join("~", ".cache", "repdef_jax")

PathLike = str | os.PathLike[str]


@dataclasses.dataclass(frozen=True)
class DatasetInfo:
  """Static description of a supported dataset.

  Attributes:
    name: TFDS name of the dataset.
    image_shape: shape of one image, ``(height, width, channels)``.
    num_classes: number of label classes.
    mean: per-channel mean of the ``[0, 1]``-scaled training images.
    std: per-channel standard deviation of the ``[0, 1]``-scaled training
      images.
    splits: names of the splits the dataset provides.
  """

  name: str
  image_shape: tuple[int, int, int]
  num_classes: int
  mean: tuple[float, ...]
  std: tuple[float, ...]
  splits: tuple[str, ...] = ("train", "test")

  @property
  def num_channels(self) -> int:
    """Number of image channels."""
    return self.image_shape[-1]


DATASETS: dict[str, DatasetInfo] = {
    info.name: info for info in (
        DatasetInfo("mnist", (28, 28, 1), 10, (0.1307,), (0.3081,)),
        DatasetInfo("fashion_mnist", (28, 28, 1), 10, (0.2860,), (0.3530,)),
        DatasetInfo("cifar10", (32, 32, 3), 10, (0.4914, 0.4822, 0.4465),
                    (0.2470, 0.2435, 0.2616)),
        DatasetInfo("cifar100", (32, 32, 3), 100, (0.5071, 0.4865, 0.4409),
                    (0.2673, 0.2564, 0.2762)),
    )
}


class DataNotFoundError(FileNotFoundError):
  """A dataset split is not available in the TFDS data directory."""


# (name, split, resolved data_dir, max_examples) -> (images, labels).
_MEMORY_CACHE: dict[tuple[Any, ...], tuple[np.ndarray, np.ndarray]] = {}


def get_info(name: str) -> DatasetInfo:
  """Returns the static description of a supported dataset.

  Args:
    name: dataset name, one of the keys of :data:`DATASETS`.

  Returns:
    The dataset's :class:`DatasetInfo`.

  Raises:
    ValueError: if ``name`` is not a supported dataset.
  """
  try:
    return DATASETS[name]
  except (KeyError, TypeError):
    raise ValueError(f"Unknown dataset name={name!r}; expected one of "
                     f"{sorted(DATASETS)}.") from None


def clear_cache() -> None:
  """Empties the in-process cache of :func:`load` (the disk cache is kept)."""
  _MEMORY_CACHE.clear()


def load(
    name: str,
    split: str,
    data_dir: PathLike | None = None,
    *,
    cache_dir: PathLike | None = None,
    max_examples: int | None = None,
) -> tuple[np.ndarray, np.ndarray]:
  """Loads a dataset split as numpy arrays, decoding it at most once.

  The split is read from a prepared TFDS copy; nothing is downloaded. Decoded
  arrays are cached in process and in an ``.npz`` file under ``cache_dir``,
  written atomically (temporary file, then ``os.replace``) and skipped with a
  warning when the directory is not writable. The disk cache is keyed by
  dataset name, split, dataset version, ``max_examples`` and data directory.

  Args:
    name: dataset name, one of the keys of :data:`DATASETS`.
    split: split name such as ``"train"`` or ``"test"``; TFDS slicing syntax
      (``"train[:1000]"``, ``"train+test"``) is accepted.
    data_dir: folder holding prepared TFDS datasets (for example with
      ``<data_dir>/mnist/3.0.1/``). Defaults to the ``TFDS_DATA_DIR``
      environment variable, then to the TFDS default folder.
    cache_dir: folder for the ``.npz`` cache. Defaults to the
      ``REPDEF_JAX_CACHE`` environment variable, then to
      ``~/.cache/repdef_jax``.
    max_examples: if given, only the first ``max_examples`` records are
      decoded (for quick runs and tests).

  Returns:
    ``(images, labels)``: ``uint8`` images ``[N, H, W, C]`` and ``int32``
    labels ``[N]``. The arrays are shared with the in-process cache and hence
    read-only; copy them before modifying them in place.

  Raises:
    ValueError: if ``name``, ``split`` or ``max_examples`` is invalid.
    DataNotFoundError: if the split is not available under ``data_dir``
      (a ``FileNotFoundError``).
  """
  info = get_info(name)
  _check_split(info, split)
  if max_examples is not None and (isinstance(max_examples, bool) or
                                   not isinstance(max_examples, int) or
                                   max_examples < 0):
    raise ValueError("max_examples must be a non-negative int or None, got "
                     f"{max_examples!r}.")
  if data_dir is None:
    data_dir = os.environ.get(_DATA_DIR_ENV) or None
  if data_dir is not None:
    data_dir = os.path.abspath(os.path.expanduser(os.fspath(data_dir)))

  memory_key = (name, split, data_dir, max_examples)
  if memory_key in _MEMORY_CACHE:
    return _MEMORY_CACHE[memory_key]

  source = _open_source(name, split, data_dir)
  version = str(source.dataset_info.version)
  cache_path = _cache_path(cache_dir, name, split, version, data_dir,
                           max_examples)
  arrays = _read_cache(cache_path)
  if arrays is None:
    arrays = _decode(source, info, max_examples)
    _write_cache(cache_path, *arrays)
  for array in arrays:
    array.flags.writeable = False
  _MEMORY_CACHE[memory_key] = arrays
  return arrays


def to_float(images: Any) -> Any:
  """Scales images to ``float32`` values in ``[0, 1]``.

  Works on numpy and JAX arrays (also under ``jax.jit``).

  Args:
    images: ``uint8`` images, which are divided by 255, or floating-point
      images, which are taken to be in ``[0, 1]`` already and only cast to
      ``float32``.

  Returns:
    ``float32`` images of the same shape and array type.

  Raises:
    TypeError: for any other dtype (e.g. ``int32``), whose value range is
      ambiguous.
  """
  dtype = np.dtype(images.dtype)
  if dtype == np.uint8:
    return images.astype(np.float32) / np.float32(255.0)
  if np.issubdtype(dtype, np.floating):
    return images.astype(np.float32)
  raise TypeError("to_float expects uint8 or floating-point images, got "
                  f"dtype {dtype}.")


def normalize(x: Any, name: str) -> Any:
  """Standardizes ``[0, 1]`` images with the dataset's channel statistics.

  Args:
    x: float images, channels last (numpy or JAX; jittable with ``name``
      static).
    name: dataset name, one of the keys of :data:`DATASETS`.

  Returns:
    ``(x - mean) / std``, broadcast over the channel axis.
  """
  mean, std = _channel_stats(x, name)
  return (x - mean) / std


def denormalize(x: Any, name: str) -> Any:
  """Inverts :func:`normalize`: ``x * std + mean`` over the channel axis.

  Args:
    x: standardized images, channels last (numpy or JAX; jittable).
    name: dataset name, one of the keys of :data:`DATASETS`.

  Returns:
    Images on the ``[0, 1]`` scale.
  """
  mean, std = _channel_stats(x, name)
  return x * std + mean


def _channel_stats(x: Any, name: str) -> tuple[np.ndarray, np.ndarray]:
  """Returns the dataset's ``float32`` mean and std after checking ``x``."""
  info = get_info(name)
  if not x.shape or x.shape[-1] != info.num_channels:
    raise ValueError(
        f"Expected channels-last images with {info.num_channels} channel(s) "
        f"for {name!r}, got shape {tuple(x.shape)}.")
  return np.asarray(info.mean, np.float32), np.asarray(info.std, np.float32)


def _check_split(info: DatasetInfo, split: str) -> None:
  """Raises ``ValueError`` unless ``split`` only names known splits."""
  valid = isinstance(split, str) and all(
      re.sub(r"\[.*\]$", "", part.strip()) in info.splits
      for part in split.split("+"))
  if not valid:
    raise ValueError(
        f"Unknown split={split!r} for dataset {info.name!r}; expected one of "
        f"{list(info.splits)} (TFDS slicing such as 'train[:1000]' is "
        "allowed).")


def _missing_message(name: str, split: str, data_dir: str | None) -> str:
  """The message of a :class:`DataNotFoundError`."""
  searched = data_dir or "the TFDS default data directory"
  return (
      f"Could not find a prepared TFDS copy of dataset {name!r} (split "
      f"{split!r}) in {searched}. Pass data_dir= (or --data_dir) or set the "
      f"{_DATA_DIR_ENV} environment variable to a folder holding prepared "
      f"TFDS datasets, e.g. <dir>/{name}/<version>/ with dataset_info.json "
      "and the array_record files. Nothing is downloaded automatically.")


def _open_source(name: str, split: str, data_dir: str | None) -> Any:
  """Opens a random-access TFDS data source, never downloading."""
  import tensorflow_datasets as tfds  # Slow import: only when needed.

  try:
    return tfds.data_source(name, split=split, data_dir=data_dir,
                            download=False)
  except ValueError as error:
    if "split" in str(error).lower():
      raise ValueError(f"Invalid split={split!r} for dataset {name!r}: "
                       f"{error}") from error
    raise
  except (NotImplementedError, OSError, AssertionError,
          tfds.core.registered.DatasetNotFoundError) as error:
    # Without prepared files TFDS assumes its default TFRECORD format and
    # raises NotImplementedError ("random access ... is not supported").
    raise DataNotFoundError(_missing_message(name, split, data_dir)) from error


def _decode(source: Any, info: DatasetInfo,
            max_examples: int | None) -> tuple[np.ndarray, np.ndarray]:
  """Decodes records one at a time into preallocated arrays."""
  count = len(source)
  if max_examples is not None:
    count = min(count, max_examples)
  images = np.empty((count, *info.image_shape), np.uint8)
  labels = np.empty((count,), np.int32)
  for index in range(count):  # `__getitems__` is broken in tfds 4.9.10.
    example = source[index]
    image = np.asarray(example["image"])
    if image.shape != info.image_shape:
      raise ValueError(f"Record {index} of {info.name!r} has image shape "
                       f"{image.shape}, expected {info.image_shape}.")
    images[index] = image
    labels[index] = example["label"]
  return images, labels


def _cache_path(cache_dir: PathLike | None, name: str, split: str,
                version: str, data_dir: str | None,
                max_examples: int | None) -> str:
  """The ``.npz`` cache file of one decoded split."""
  if cache_dir is None:
    cache_dir = os.environ.get(_CACHE_DIR_ENV) or _DEFAULT_CACHE_DIR
  cache_dir = os.path.abspath(os.path.expanduser(os.fspath(cache_dir)))
  dir_hash = hashlib.sha256(str(data_dir).encode()).hexdigest()[:12]
  split_tag = re.sub(r"[^A-Za-z0-9_.-]+", "_", split)
  count_tag = "all" if max_examples is None else str(max_examples)
  file_name = f"{name}-{split_tag}-{version}-{count_tag}-{dir_hash}.npz"
  return os.path.join(cache_dir, file_name)


def _read_cache(path: str) -> tuple[np.ndarray, np.ndarray] | None:
  """Reads a cached split; ``None`` if it is absent or unreadable."""
  if not os.path.exists(path):
    return None
  try:
    with np.load(path, allow_pickle=False) as archive:
      images, labels = archive["images"], archive["labels"]
  except (OSError, ValueError, KeyError, EOFError,
          zipfile.BadZipFile) as error:
    logger.warning("Ignoring unreadable cache file %s: %s", path, error)
    return None
  if (images.dtype != np.uint8 or labels.dtype != np.int32 or
      len(images) != len(labels)):
    logger.warning("Ignoring malformed cache file %s.", path)
    return None
  return images, labels


def _write_cache(path: str, images: np.ndarray, labels: np.ndarray) -> None:
  """Writes a split to ``path`` atomically; on any OS error only warns."""
  buffer = BytesIO()
  np.savez(buffer, images=images, labels=labels)
  try:
    storage.write_bytes(path, buffer.getvalue())
  except OSError as error:
    logger.warning("Not caching %s (cache directory not writable?): %s",
                   path, error)
