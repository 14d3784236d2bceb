"""Image-classification datasets: prepared TFDS copies, downloads, a sample.

:func:`load` looks for a split in this order and says which one it used
(:func:`load_with_source`):

1. a prepared TFDS copy (``data_dir``, ``$TFDS_DATA_DIR`` or tfds's default
   folder), read with :func:`tensorflow_datasets.data_source` (no
   TensorFlow);
2. a copy downloaded earlier into the cache folder;
3. a download of the original archives (:mod:`repdef_jax.download`, checked
   against their published SHA-256), unless ``$REPDEF_JAX_OFFLINE`` is set;
4. with ``sample=True`` (or inside :func:`allow_sample`) only: the
   embedded sample shipped in the package
   (256 real test images of MNIST and CIFAR-10, 256 MNIST training images;
   ``repdef_jax/sample_data/README.md`` holds their sources and licences).

Otherwise it raises :class:`DataNotFoundError` with one line saying what was
searched and how to fix it. Decoded splits are cached in process and as
``.npz`` files (written atomically; an unreadable one is rebuilt). Layout,
environment variables and the ``repdef-data`` command: ``docs/data.md``.

Example:
  >>> images, labels = load("mnist", "train", data_dir="/data/tfds")
  >>> x = normalize(to_float(images), "mnist")
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import importlib.resources
from io import BytesIO
import logging
import numbers
import os
import re
import sys
from typing import Any, Iterator, NamedTuple
import zipfile

import numpy as np

from repdef_jax import download as download_lib
from repdef_jax import storage

logger = logging.getLogger(__name__)

_DATA_DIR_ENV = "TFDS_DATA_DIR"
_CACHE_DIR_ENV = "REPDEF_JAX_CACHE"
_DEFAULT_CACHE_DIR = os.path.join("~", ".cache", "repdef_jax")
OFFLINE_ENV = "REPDEF_JAX_OFFLINE"  # Set (not "0"): never download.
QUIET_ENV = "REPDEF_JAX_QUIET"  # Set (not "0"): no progress lines.

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
  """No source holds the split; the message says what was searched."""


class Source(NamedTuple):
  """Where :func:`load_with_source` found a split.

  Attributes:
    kind: 'tfds' (a prepared TFDS copy), 'download' (the original archives,
      downloaded now or earlier) or 'sample' (the embedded sample).
    detail: one line: the folder, or for the sample why it was used.
  """

  kind: str
  detail: str

  def __str__(self) -> str:
    return f"{self.kind}: {self.detail}"


# The embedded sample: dataset -> splits it holds (SAMPLE_SIZE images each).
SAMPLE_SPLITS = {"mnist": ("train", "test"), "cifar10": ("test",)}
SAMPLE_SIZE = 256
_SAMPLE_PACKAGE_DIR = "sample_data"

# (name, split, data_dir, cache_dir, max_examples) -> (images, labels, Source)
# for TFDS and downloaded copies (the sample is cheap to reread).
_MEMORY_CACHE: dict[tuple[Any, ...], tuple[np.ndarray, np.ndarray,
                                           Source]] = {}
# (name, base URL) -> why a download failed, so that one process tries once.
_FAILED_DOWNLOADS: dict[tuple[str, str], str] = {}

# The default of load(sample=None); allow_sample() pushes True.
_SAMPLE_ALLOWED = [False]

Arrays = tuple[np.ndarray, np.ndarray]


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
  """Forgets in-process state: decoded splits and failed downloads (the disk
  cache is kept)."""
  _MEMORY_CACHE.clear()
  _FAILED_DOWNLOADS.clear()


def load(
    name: str,
    split: str,
    data_dir: PathLike | None = None,
    *,
    cache_dir: PathLike | None = None,
    max_examples: int | None = None,
    download: bool | None = None,
    sample: bool | None = None,
) -> tuple[np.ndarray, np.ndarray]:
  """Loads a dataset split as numpy arrays (see the module docstring).

  Args:
    name: dataset name, one of the keys of :data:`DATASETS`.
    split: split name such as ``"train"`` or ``"test"``; TFDS slicing syntax
      (``"train[:1000]"``, ``"train[:10%]"``, ``"train+test"``) is accepted.
    data_dir: folder holding prepared TFDS datasets (for example with
      ``<data_dir>/mnist/3.0.1/``). Defaults to the ``TFDS_DATA_DIR``
      environment variable, then to the TFDS default folder.
    cache_dir: folder for the ``.npz`` caches and downloads. Defaults to the
      ``REPDEF_JAX_CACHE`` environment variable, then to
      ``~/.cache/repdef_jax``.
    max_examples: if given, only the first ``max_examples`` records are
      decoded (for quick runs and tests).
    download: fetch the original archives when no copy is found. None: yes,
      unless the ``REPDEF_JAX_OFFLINE`` environment variable is set.
    sample: fall back to the embedded sample (the first
      :data:`SAMPLE_SIZE` images of the splits in :data:`SAMPLE_SPLITS`).
      None: only inside :func:`allow_sample`.

  Returns:
    ``(images, labels)``: ``uint8`` images ``[N, H, W, C]`` and ``int32``
    labels ``[N]``. The arrays may be shared with the in-process cache and
    are read-only; copy them before modifying them in place.

  Raises:
    ValueError: if ``name``, ``split`` or ``max_examples`` is invalid.
    DataNotFoundError: if no source holds the split (a
      ``FileNotFoundError`` whose one-line message lists what was searched).
  """
  images, labels, _ = load_with_source(
      name, split, data_dir, cache_dir=cache_dir, max_examples=max_examples,
      download=download, sample=sample)
  return images, labels


def load_with_source(
    name: str,
    split: str,
    data_dir: PathLike | None = None,
    *,
    cache_dir: PathLike | None = None,
    max_examples: int | None = None,
    download: bool | None = None,
    sample: bool | None = None,
) -> tuple[np.ndarray, np.ndarray, Source]:
  """:func:`load`, also returning the :class:`Source` the split came from."""
  info = get_info(name)
  _check_split(info, split)
  if max_examples is not None and (
      isinstance(max_examples, (bool, np.bool_)) or
      not isinstance(max_examples, numbers.Integral) or max_examples < 0):
    raise ValueError("max_examples must be a non-negative int or None, got "
                     f"{max_examples!r}.")
  if max_examples is not None:
    max_examples = int(max_examples)
  if data_dir is None:
    data_dir = os.environ.get(_DATA_DIR_ENV) or None
  if data_dir is not None:
    data_dir = os.path.abspath(os.path.expanduser(os.fspath(data_dir)))
  cache_dir = _cache_root(cache_dir)

  memory_key = (name, split, data_dir, cache_dir, max_examples)
  if memory_key in _MEMORY_CACHE:
    return _MEMORY_CACHE[memory_key]
  notes: list[str] = []
  found = _from_tfds(info, split, data_dir, cache_dir, max_examples, notes)
  if found is None:
    found = _from_download(info, split, cache_dir, max_examples, download,
                           notes)
  if sample is None:
    sample = _SAMPLE_ALLOWED[-1]
  if found is None and sample and _sample_holds(name, split):
    images, labels = _select(split, {s: load_sample(name, s)
                                     for s in SAMPLE_SPLITS[name]})
    images, labels = images[:max_examples], labels[:max_examples]
    for array in (images, labels):
      array.flags.writeable = False
    return images, labels, Source(
        "sample", f"the embedded sample, {len(images)} real {name} {split} "
        f"images ({'; '.join(notes)})")
  if found is None:
    raise DataNotFoundError(_missing_message(name, split, notes))
  for array in found[:2]:
    array.flags.writeable = False
  _MEMORY_CACHE[memory_key] = found
  return found


@contextlib.contextmanager
def allow_sample() -> Iterator[None]:
  """Within the block, :func:`load` falls back to the embedded sample.

  For code that loads data deep inside (a federated run in a notebook):
  ``with data.allow_sample(): training.train_and_evaluate(config, workdir)``.
  """
  _SAMPLE_ALLOWED.append(True)
  try:
    yield
  finally:
    _SAMPLE_ALLOWED.pop()


def load_sample(name: str, split: str = "test") -> Arrays:
  """The embedded sample: the first :data:`SAMPLE_SIZE` images of a split.

  They are the first records of the prepared TFDS copies the project was
  developed with (tfds order); sources and licences in
  ``repdef_jax/sample_data/README.md``.

  Args:
    name: a key of :data:`SAMPLE_SPLITS`.
    split: a split it holds.

  Returns:
    ``(uint8 images [SAMPLE_SIZE, H, W, C], int32 labels)``, read-only.

  Raises:
    DataNotFoundError: no sample of that split (or the package data is
      missing from the installation).
  """
  if split not in SAMPLE_SPLITS.get(name, ()):
    held = ", ".join(f"{n} {s}" for n, splits in SAMPLE_SPLITS.items()
                     for s in splits)
    raise DataNotFoundError(f"No embedded sample of {name!r} split "
                            f"{split!r}; the sample holds {held}.")
  path = importlib.resources.files("repdef_jax").joinpath(
      _SAMPLE_PACKAGE_DIR, f"{name}.npz")
  try:
    with path.open("rb") as f, np.load(f, allow_pickle=False) as archive:
      arrays = archive[f"{split}_images"], archive[f"{split}_labels"]
  except (OSError, KeyError, ValueError, zipfile.BadZipFile) as error:
    raise DataNotFoundError(
        f"The embedded sample {path} is missing or unreadable ({error}); "
        "reinstall repdef_jax.") from None
  for array in arrays:
    array.flags.writeable = False
  return arrays


def prepare(name: str, *, cache_dir: PathLike | None = None,
            mirror: str | None = None, checksums: Any = None,
            timeout: float | None = None) -> dict[str, str]:
  """Downloads a dataset's original archives and caches the decoded splits.

  What :func:`load` does on first use when no TFDS copy exists, as an
  explicit step (``repdef-data prepare NAME``). Files are checked against the
  published SHA-256 (:mod:`repdef_jax.download`) and nothing is written
  unless every one of them matches.

  Args:
    name: dataset name, one of the keys of :data:`DATASETS`.
    cache_dir: see :func:`load`.
    mirror: root URL of a mirror (``<mirror>/<name>/<file>``); default
      ``$REPDEF_JAX_MIRROR``, then the original publisher.
    checksums: digests for a mirror holding other files than the published
      ones (:func:`repdef_jax.download.fetch_and_decode`).
    timeout: seconds a connect or read may block.

  Returns:
    ``{split: path of its .npz}``.

  Raises:
    ValueError: unknown ``name``.
    repdef_jax.download.DownloadError: fetching, verification or decoding
      failed (an ``OSError``); so does an unwritable cache folder.
  """
  get_info(name)
  splits = _download(name, _cache_root(cache_dir), mirror=mirror,
                     checksums=checksums, timeout=timeout)
  paths = {s: _download_path(_cache_root(cache_dir), name, s) for s in splits}
  for path in paths.values():
    if not os.path.exists(path):
      raise OSError(f"could not write {path}; pass another cache_dir or set "
                    f"{_CACHE_DIR_ENV}.")
  return paths

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


def _select(split: str, arrays: dict[str, Arrays]) -> Arrays:
  """Applies a TFDS split spec (``a+b``, ``[i:j]``, ``[:p%]``) to arrays."""
  images, labels = [], []
  for part in split.split("+"):
    match = re.fullmatch(r"\s*(\w+)\s*(?:\[(-?\d*)(%?):(-?\d*)(%?)\])?\s*",
                         part)
    if match is None:
      raise ValueError(f"Unsupported split={split!r}; use forms such as "
                       "'train', 'train[:1000]', 'train[10%:]', 'train+test'.")
    base, lo, lo_pct, hi, hi_pct = match.groups()
    x, y = arrays[base]
    n = len(y)
    if any(v and abs(int(v)) > (100 if pct else n)
           for v, pct in ((lo, lo_pct), (hi, hi_pct))):
      raise ValueError(
          f"split={split!r}: {part.strip()!r} reaches past the {n} records "
          f"of {base!r} in this source (a slice must lie within them, a "
          "percentage within 100 %).")
    bounds = [None if not v else (round(int(v) * n / 100) if pct else
                                  int(v))
              for v, pct in ((lo, lo_pct), (hi, hi_pct))]
    start, stop, _ = slice(*bounds).indices(n)
    if stop <= start:
      raise ValueError(f"split={split!r}: {part.strip()!r} selects no record "
                       f"of the {n} of {base!r} in this source.")
    images.append(x[start:stop])
    labels.append(y[start:stop])
  if len(images) == 1:
    return images[0], labels[0]
  return np.concatenate(images), np.concatenate(labels)


def _base_splits(split: str) -> set[str]:
  return {re.sub(r"\[.*\]$", "", part.strip()) for part in split.split("+")}


def _sample_holds(name: str, split: str) -> bool:
  return _base_splits(split) <= set(SAMPLE_SPLITS.get(name, ()))


def _missing_message(name: str, split: str, notes: list[str]) -> str:
  """The one-line message of a :class:`DataNotFoundError`."""
  return (
      f"No data for dataset {name!r} split {split!r}: {'; '.join(notes)}. "
      f"Fix: set {_DATA_DIR_ENV} (or pass data_dir / --data_dir) to a folder "
      f"of prepared TFDS datasets (<dir>/{name}/<version>/), or run "
      f"`repdef-data prepare {name}` where the network is reachable (a "
      f"mirror: --mirror or {download_lib.MIRROR_ENV}); see "
      "docs/data.md.")


def _env_flag(name: str) -> bool:
  return os.environ.get(name, "") not in ("", "0")


def quiet() -> bool:
  """Whether progress lines are off (``$REPDEF_JAX_QUIET``, ``--quiet``)."""
  return _env_flag(QUIET_ENV)


def _say(message: str) -> None:
  """A progress line on stderr, unless ``$REPDEF_JAX_QUIET`` is set."""
  if not quiet():
    print(f"[repdef_jax.data] {message}", file=sys.stderr, flush=True)


def _from_tfds(info: DatasetInfo, split: str, data_dir: str | None,
               cache_dir: str, max_examples: int | None,
               notes: list[str]) -> tuple[np.ndarray, np.ndarray,
                                          Source] | None:
  """The split from a prepared TFDS copy, or None (reason added to notes)."""
  import tensorflow_datasets as tfds  # Slow import: only when needed.
  from tensorflow_datasets.core import constants  # pylint: disable=g-import-not-at-top

  where = data_dir or os.fspath(constants.DATA_DIR)  # tfds's default folder
  absl_logger = logging.getLogger("absl")  # tfds warns through absl.
  level = absl_logger.level
  absl_logger.setLevel(logging.ERROR)
  try:
    source = tfds.data_source(info.name, split=split, data_dir=data_dir,
                              download=False)
    version = str(source.dataset_info.version)
    cache_path = _cache_path(cache_dir, info.name, split, version, data_dir,
                             max_examples)
    arrays = _read_cache(cache_path)
    if arrays is None:
      arrays = _decode(source, info, max_examples)
      _write_cache(cache_path, *arrays)
  except Exception as error:  # pylint: disable=broad-except
    # tfds raises many types, for a missing copy (NotImplementedError: no
    # array_record files; KeyError "splits is empty" for its default folder)
    # as for a half-written one; report it, never its traceback.
    folder = os.path.join(where, info.name)
    if not os.path.isdir(folder):
      notes.append(f"no prepared TFDS copy in {where}")
      return None
    if isinstance(error, ValueError) and "[" in split:
      raise ValueError(f"Invalid split={split!r} for dataset {info.name!r}: "
                       f"{_first_line(error)}") from None  # A bad slice.
    notes.append(f"an incomplete or unreadable TFDS copy in {folder} "
                 f"({_first_line(error)}; delete it or prepare it again)")
    return None
  finally:
    absl_logger.setLevel(level)
  return (*arrays, Source("tfds", f"prepared TFDS copy in {where}"))


def _first_line(error: BaseException) -> str:
  """``Type: first sentence of the message``: one line, <= ~300 chars."""
  text = str(error.args[0]) if isinstance(error, KeyError) and error.args else (
      str(error))
  text = re.split(r"(?<=\.)\s|\n", text.strip(), maxsplit=1)[0]
  return f"{type(error).__name__}: {text[:300].rstrip('.')}"


_DECODE_CHUNK = 4096  # Records read per batch: ~3 MB of CIFAR-10 images.


def _decode(source: Any, info: DatasetInfo,
            max_examples: int | None) -> Arrays:
  """Decodes records into preallocated arrays, a chunk of records at a time.

  A chunk read (``source.__getitems__``) decodes MNIST's train split about 4x
  faster than one record at a time; tfds's mock data source does not
  implement it (a ``TypeError``), and is read one record at a time.
  """
  count = len(source)
  if max_examples is not None:
    count = min(count, max_examples)
  images = np.empty((count, *info.image_shape), np.uint8)
  labels = np.empty((count,), np.int32)
  for start in range(0, count, _DECODE_CHUNK):
    indices = list(range(start, min(start + _DECODE_CHUNK, count)))
    try:
      examples = source.__getitems__(indices)
    except TypeError:  # tfds.testing.mock_data's source.
      examples = [source[index] for index in indices]
    for index, example in zip(indices, examples):
      image = np.asarray(example["image"])
      if image.shape != info.image_shape:
        raise RuntimeError(f"record {index} of {info.name!r} has image shape "
                           f"{image.shape}, expected {info.image_shape}")
      images[index] = image
      labels[index] = example["label"]
  return images, labels


def _from_download(info: DatasetInfo, split: str, cache_dir: str,
                   max_examples: int | None, allowed: bool | None,
                   notes: list[str]) -> tuple[np.ndarray, np.ndarray,
                                              Source] | None:
  """The split from downloaded archives (cached or fetched now), or None."""
  paths = {s: _download_path(cache_dir, info.name, s) for s in info.splits}
  try:
    verified = download_lib.verified_with(info.name)
  except download_lib.DownloadError as error:  # A bad $REPDEF_JAX_CHECKSUMS.
    notes.append(f"no usable download: {error}")
    return None
  # Archives verified against other digests (a test mirror, a re-packed
  # file) are other data: such a cache is not reused.
  arrays = {s: _read_cache(paths[s], verified, notes)
            for s in _base_splits(split)}
  if any(a is None for a in arrays.values()):
    if allowed is None:
      allowed = not _env_flag(OFFLINE_ENV)
    if not allowed:
      notes.append(f"no download in {cache_dir} and downloading is off ("
                   f"{OFFLINE_ENV}=1 or download=False)")
      return None
    key = (info.name, download_lib.base_url(info.name))
    if key not in _FAILED_DOWNLOADS:
      try:
        arrays = _download(info.name, cache_dir)
      except OSError as error:
        _FAILED_DOWNLOADS[key] = str(error)
    if key in _FAILED_DOWNLOADS:
      notes.append(f"no download in {cache_dir} and downloading failed: "
                   f"{_FAILED_DOWNLOADS[key]}")
      return None
  images, labels = _select(split, arrays)
  return (images[:max_examples], labels[:max_examples],
          Source("download", f"original archives ({verified} checksums), "
                 f"decoded in {cache_dir}"))


def _download(name: str, cache_dir: str, **kwargs) -> dict[str, Arrays]:
  """Fetches, verifies and decodes a dataset; caches its splits."""
  _say(f"downloading {name} from "
       f"{download_lib.base_url(name, kwargs.get('mirror'))} (set "
       f"{OFFLINE_ENV}=1 to skip)")
  verified = download_lib.verified_with(name, kwargs.get("checksums"))
  splits = download_lib.fetch_and_decode(name, log=_say, **kwargs)
  for split, arrays in splits.items():
    _write_cache(_download_path(cache_dir, name, split), *arrays,
                 verified=verified)
  _say(f"{name}: " + ", ".join(f"{s} {len(a[1])} images" for s, a in
                               splits.items()) + f" cached in {cache_dir}")
  return splits


def _cache_root(cache_dir: PathLike | None) -> str:
  if cache_dir is None:
    cache_dir = os.environ.get(_CACHE_DIR_ENV) or _DEFAULT_CACHE_DIR
  return os.path.abspath(os.path.expanduser(os.fspath(cache_dir)))


def _download_path(cache_dir: str, name: str, split: str) -> str:
  """The ``.npz`` of one whole split decoded from the original archives."""
  return os.path.join(cache_dir, "original", f"{name}-{split}.npz")


def _cache_path(cache_dir: str, name: str, split: str, version: str,
                data_dir: str | None, max_examples: int | None) -> str:
  """The ``.npz`` cache file of one decoded TFDS split."""
  dir_hash = hashlib.sha256(str(data_dir).encode()).hexdigest()[:12]
  split_tag = re.sub(r"[^A-Za-z0-9_.-]+", "_", split)
  count_tag = "all" if max_examples is None else str(max_examples)
  file_name = f"{name}-{split_tag}-{version}-{count_tag}-{dir_hash}.npz"
  return os.path.join(cache_dir, file_name)


def _read_cache(path: str, verified: str | None = None,
                notes: list[str] | None = None) -> Arrays | None:
  """Reads a cached split; ``None`` if it is absent or unreadable, or (for
  a download) was verified against other digests than ``verified``
  (:func:`repdef_jax.download.verified_with`; a cache written before this
  was recorded counts as 'published'), which ``notes`` then records."""
  if not os.path.exists(path):
    return None
  try:
    with np.load(path, allow_pickle=False) as archive:
      images, labels = archive["images"], archive["labels"]
      cached = (str(archive["verified"]) if "verified" in archive.files
                else "published")
  except (OSError, ValueError, KeyError, EOFError,
          zipfile.BadZipFile) as error:
    logger.warning("Rebuilding unreadable cache file %s (%s).", path,
                   _first_line(error))
    return None
  if (images.dtype != np.uint8 or labels.dtype != np.int32 or
      len(images) != len(labels)):
    logger.warning("Rebuilding malformed cache file %s.", path)
    return None
  if verified is not None and cached != verified:
    message = (f"{path} holds archives verified against {cached} "
               f"checksums, not this run's {verified} (set "
               f"${download_lib.CHECKSUMS_ENV} to the file it was made "
               "with to use it)")
    logger.warning("Not using %s.", message)
    if notes is not None:
      notes.append(message)
    return None
  return images, labels


def _write_cache(path: str, images: np.ndarray, labels: np.ndarray,
                 verified: str | None = None) -> None:
  """Writes a split to ``path`` atomically (with ``verified``: the digests
  a download was checked against); on any OS error only warns."""
  buffer = BytesIO()
  np.savez(buffer, images=images, labels=labels,
           **({"verified": np.array(verified)} if verified else {}))
  try:
    storage.write_bytes(path, buffer.getvalue())
  except OSError as error:
    logger.warning("Not caching %s (cache directory not writable?): %s",
                   path, error)


def write_sample(data_dir: PathLike, out_dir: PathLike) -> dict[str, str]:
  """Rebuilds the embedded sample from prepared TFDS copies (maintainers).

  Writes ``<out_dir>/<name>.npz`` holding ``<split>_images`` and
  ``<split>_labels`` for every split in :data:`SAMPLE_SPLITS`: the first
  :data:`SAMPLE_SIZE` records of each.

  Every split is read before anything is written.

  Returns:
    ``{name: path}``.

  Raises:
    DataNotFoundError: a split has no prepared TFDS copy in ``data_dir`` (a
      download cache does not count: its records are in another order).
  """
  blobs = {}
  for name, splits in SAMPLE_SPLITS.items():
    arrays = {}
    for split in splits:
      images, labels, source = load_with_source(
          name, split, data_dir, max_examples=SAMPLE_SIZE, download=False,
          sample=False)
      if source.kind != "tfds":
        raise DataNotFoundError(
            f"No prepared TFDS copy of {name!r} split {split!r} in "
            f"{data_dir} (found {source}); the sample is built from TFDS "
            "copies only.")
      arrays[f"{split}_images"], arrays[f"{split}_labels"] = images, labels
    buffer = BytesIO()
    np.savez_compressed(buffer, **arrays)
    blobs[os.path.join(os.fspath(out_dir), f"{name}.npz")] = buffer.getvalue()
  for path, blob in blobs.items():
    storage.write_bytes(path, blob)
  return {name: path for name, path in zip(SAMPLE_SPLITS, blobs)}
