"""Tests of repdef_jax.data: TFDS loading, caching and pixel scaling."""

import dataclasses
import os
import re
import shutil
import socket
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import tensorflow_datasets as tfds

from repdef_jax import data

NUM_MOCK = 12


@pytest.fixture(autouse=True)
def _fresh_memory_cache():
  data.clear_cache()
  yield
  data.clear_cache()


@pytest.fixture
def no_network(monkeypatch):
  """Makes any attempt to open a network connection fail loudly."""

  def refuse(*args, **kwargs):
    raise AssertionError(f"network access attempted: {args}")

  monkeypatch.setattr(socket.socket, "connect", refuse)
  monkeypatch.setattr(socket, "create_connection", refuse)
  monkeypatch.setattr(socket, "getaddrinfo", refuse)


def test_get_info():
  info = data.get_info("cifar10")
  assert info.image_shape == (32, 32, 3)
  assert info.num_classes == 10
  assert len(info.mean) == len(info.std) == info.num_channels == 3
  assert data.get_info("cifar100").num_classes == 100
  assert data.get_info("fashion_mnist").mean == (0.2860,)
  assert set(data.DATASETS) == {"mnist", "fashion_mnist", "cifar10",
                                "cifar100"}


def test_get_info_unknown_name():
  with pytest.raises(ValueError, match=r"name='svhn'.*cifar10"):
    data.get_info("svhn")


@pytest.mark.parametrize("name, shape", [("mnist", (28, 28, 1)),
                                         ("cifar10", (32, 32, 3))])
def test_load_shapes_and_dtypes(name, shape, tmp_path):
  with tfds.testing.mock_data(num_examples=NUM_MOCK):
    images, labels = data.load(name, "train", tmp_path, cache_dir=tmp_path)
  assert images.shape == (NUM_MOCK, *shape)
  assert images.dtype == np.uint8
  assert labels.shape == (NUM_MOCK,)
  assert labels.dtype == np.int32
  assert labels.min() >= 0 and labels.max() < 10


def test_load_max_examples(tmp_path):
  with tfds.testing.mock_data(num_examples=NUM_MOCK):
    images, labels = data.load("mnist", "test", tmp_path,
                               cache_dir=tmp_path, max_examples=5)
    full_images, _ = data.load("mnist", "test", tmp_path, cache_dir=tmp_path)
  assert images.shape[0] == labels.shape[0] == 5
  np.testing.assert_array_equal(images, full_images[:5])
  with pytest.raises(ValueError, match="max_examples"):
    data.load("mnist", "test", tmp_path, max_examples=-1)


def test_max_examples_is_part_of_both_cache_keys(tmp_path):
  """A short load never answers a full one (nor the reverse), from the
  memory cache or, after clear_cache, from the .npz files."""
  counts = []
  with tfds.testing.mock_data(num_examples=NUM_MOCK):
    for max_examples, clear in ((5, False), (None, False), (None, True),
                                (5, True)):
      if clear:
        data.clear_cache()
      images, labels = data.load("mnist", "test", tmp_path,
                                 cache_dir=tmp_path, max_examples=max_examples)
      assert len(images) == len(labels)
      counts.append(len(images))
  assert counts == [5, NUM_MOCK, NUM_MOCK, 5]


def test_cache_file_names_separate_what_changes_the_arrays():
  """Each of split, version, data_dir and max_examples gets its own file."""
  base = ("/c", "mnist", "train", "3.0.1", "/a", None)
  path = data._cache_path(*base)  # pylint: disable=protected-access
  assert path == data._cache_path(*base)  # pylint: disable=protected-access
  for index, other in ((2, "test"), (3, "3.0.2"), (4, "/b"), (4, None),
                       (5, 100)):
    changed = list(base)
    changed[index] = other
    assert data._cache_path(*changed) != path, changed  # pylint: disable=protected-access


def test_malformed_disk_cache_is_rebuilt(tmp_path):
  """A readable cache whose labels are not int32 (e.g. an older int64 one) is
  rebuilt: load still returns int32 labels."""
  with tfds.testing.mock_data(num_examples=NUM_MOCK):
    images, labels = data.load("mnist", "train", tmp_path, cache_dir=tmp_path)
    [cache_file] = [f for f in os.listdir(tmp_path) if f.endswith(".npz")]
    np.savez(tmp_path / cache_file, images=images,
             labels=labels.astype(np.int64))
    data.clear_cache()
    _, reloaded = data.load("mnist", "train", tmp_path, cache_dir=tmp_path)
  assert reloaded.dtype == np.int32
  np.testing.assert_array_equal(reloaded, labels)
  with np.load(tmp_path / cache_file) as archive:
    assert archive["labels"].dtype == np.int32


def test_load_unknown_name_and_split(tmp_path):
  with pytest.raises(ValueError, match="name='imagenet'"):
    data.load("imagenet", "train", tmp_path)
  with pytest.raises(ValueError, match=r"split='validation'.*'train'"):
    data.load("mnist", "validation", tmp_path)
  with pytest.raises(ValueError, match="split='train\\+dev'"):
    data.load("mnist", "train+dev", tmp_path)


def test_memory_cache_returns_same_arrays(tmp_path):
  with tfds.testing.mock_data(num_examples=NUM_MOCK):
    first = data.load("mnist", "train", tmp_path, cache_dir=tmp_path)
    second = data.load("mnist", "train", tmp_path, cache_dir=tmp_path)
  assert first[0] is second[0] and first[1] is second[1]
  assert not first[0].flags.writeable


def test_disk_cache_written_atomically_and_reused(tmp_path, monkeypatch):
  cache_dir = tmp_path / "cache"
  replaced = []
  real_replace = os.replace

  def recording_replace(src, dst):
    replaced.append((str(src), str(dst)))
    real_replace(src, dst)

  monkeypatch.setattr(os, "replace", recording_replace)
  with tfds.testing.mock_data(num_examples=NUM_MOCK):
    images, labels = data.load("cifar10", "test", tmp_path,
                               cache_dir=cache_dir)
  files = sorted(os.listdir(cache_dir))
  assert len(files) == 1 and files[0].endswith(".npz")
  assert files[0].startswith("cifar10-test-3.0.2-all-")
  [(src, dst)] = replaced
  assert os.path.dirname(src) == os.path.dirname(dst) == str(cache_dir)
  assert src.endswith(".npz.tmp") and dst == str(cache_dir / files[0])

  # A fresh process (empty memory cache) must read the file, not decode.
  data.clear_cache()

  def no_decoding(*args, **kwargs):
    raise AssertionError("decoded although the disk cache exists")

  monkeypatch.setattr(data, "_decode", no_decoding)
  with tfds.testing.mock_data(num_examples=NUM_MOCK):
    cached_images, cached_labels = data.load("cifar10", "test", tmp_path,
                                             cache_dir=cache_dir)
  np.testing.assert_array_equal(cached_images, images)
  np.testing.assert_array_equal(cached_labels, labels)


def test_corrupt_disk_cache_is_replaced(tmp_path):
  with tfds.testing.mock_data(num_examples=NUM_MOCK):
    images, _ = data.load("mnist", "train", tmp_path, cache_dir=tmp_path)
    [cache_file] = [f for f in os.listdir(tmp_path) if f.endswith(".npz")]
    (tmp_path / cache_file).write_bytes(b"not a zip file")
    data.clear_cache()
    reloaded, _ = data.load("mnist", "train", tmp_path, cache_dir=tmp_path)
  np.testing.assert_array_equal(reloaded, images)
  with np.load(tmp_path / cache_file) as archive:
    np.testing.assert_array_equal(archive["images"], images)


def test_unwritable_cache_dir_is_skipped(tmp_path):
  blocker = tmp_path / "a_file"
  blocker.write_text("makedirs below a regular file fails")
  with tfds.testing.mock_data(num_examples=NUM_MOCK):
    images, labels = data.load("mnist", "train", tmp_path,
                               cache_dir=blocker / "cache")
  assert images.shape[0] == labels.shape[0] == NUM_MOCK
  assert sorted(os.listdir(tmp_path)) == ["a_file"]


@pytest.mark.usefixtures("no_network")
def test_missing_data_dir_fails_fast(tmp_path):
  start = time.perf_counter()
  with pytest.raises(FileNotFoundError) as error:
    data.load("mnist", "train", tmp_path, cache_dir=tmp_path / "cache")
  assert time.perf_counter() - start < 20
  assert isinstance(error.value, data.DataNotFoundError)
  message = str(error.value)
  for part in ("'mnist'", "'train'", str(tmp_path), "TFDS_DATA_DIR",
               "data_dir"):
    assert part in message
  assert os.listdir(tmp_path) == []  # Nothing was prepared or downloaded.


@pytest.mark.usefixtures("no_network")
def test_data_dir_defaults_to_environment(tmp_path, monkeypatch):
  monkeypatch.setenv("TFDS_DATA_DIR", str(tmp_path))
  with pytest.raises(data.DataNotFoundError) as error:
    data.load("cifar10", "test", cache_dir=tmp_path / "cache")
  assert "'cifar10'" in str(error.value)
  assert str(tmp_path) in str(error.value)


def test_to_float():
  images = np.array([[0, 128, 255]], np.uint8)[..., None]
  scaled = data.to_float(images)
  assert scaled.dtype == np.float32
  np.testing.assert_allclose(scaled[..., 0], [[0.0, 128 / 255, 1.0]])
  jax_scaled = jax.jit(data.to_float)(jnp.asarray(images))
  assert jax_scaled.dtype == jnp.float32
  np.testing.assert_allclose(jax_scaled, scaled)
  halves = np.full((2, 2), 0.5, np.float64)
  assert data.to_float(halves).dtype == np.float32
  with pytest.raises(TypeError, match="int32"):
    data.to_float(np.zeros((2, 2), np.int32))


@pytest.mark.parametrize("name", sorted(data.DATASETS))
def test_normalize_round_trip(name):
  info = data.get_info(name)
  rng = np.random.default_rng(0)
  x = rng.random((2, *info.image_shape), dtype=np.float32)
  normalized = jax.jit(data.normalize, static_argnums=1)(jnp.asarray(x), name)
  assert normalized.dtype == jnp.float32
  restored = jax.jit(data.denormalize, static_argnums=1)(normalized, name)
  np.testing.assert_allclose(restored, x, atol=1e-6)
  np.testing.assert_allclose(data.denormalize(data.normalize(x, name), name),
                             x, atol=1e-6)
  at_mean = np.broadcast_to(np.asarray(info.mean, np.float32), x.shape)
  np.testing.assert_allclose(data.normalize(at_mean, name), 0.0, atol=1e-6)


def test_normalize_checks_channels():
  with pytest.raises(ValueError, match="3 channel"):
    data.normalize(np.zeros((1, 28, 28, 1), np.float32), "cifar10")


def _has_real_data() -> bool:
  root = os.environ.get("TFDS_DATA_DIR", "")
  return bool(root) and all(
      os.path.isdir(os.path.join(root, name)) for name in ("mnist", "cifar10"))


_needs_real_data = pytest.mark.skipif(
    not _has_real_data(), reason="TFDS_DATA_DIR does not hold mnist and cifar10")


# (dataset, split): examples (None: whatever the prepared copy holds).
_TEST_SPLITS = {("mnist", "test"): 10000, ("cifar10", "test"): 10000}
_TRAIN_SPLITS = {("mnist", "train"): 60000, ("cifar10", "train"): None}


@pytest.mark.integration
@_needs_real_data
def test_real_test_splits_load(tmp_path):
  """Both test splits, decoded from TFDS (cold) then from the cache (warm);
  the train splits' chunked decode is checked on 1,500 records below."""
  _check_real_splits(_TEST_SPLITS, tmp_path)


@pytest.mark.slow
@pytest.mark.integration
@_needs_real_data
def test_real_datasets_load(tmp_path):
  """Every real split, train included (slow: ~60 s of PNG decoding)."""
  _check_real_splits({**_TRAIN_SPLITS, **_TEST_SPLITS}, tmp_path)


def _check_real_splits(expected, tmp_path):
  for pass_name in ("cold", "warm"):
    data.clear_cache()
    for (name, split), count in expected.items():
      start = time.perf_counter()
      images, labels = data.load(name, split, cache_dir=tmp_path)
      elapsed = time.perf_counter() - start
      print(f"{pass_name} load {name}/{split}: {len(images)} examples in "
            f"{elapsed:.2f} s")
      info = data.get_info(name)
      assert images.shape[1:] == info.image_shape
      assert images.dtype == np.uint8 and labels.dtype == np.int32
      assert len(images) == len(labels) > 0
      if count is not None:
        assert len(images) == count
      np.testing.assert_array_equal(np.unique(labels),
                                    np.arange(info.num_classes))


@pytest.mark.integration
@_needs_real_data
@pytest.mark.parametrize("name", ["mnist", "cifar10"])
def test_chunked_decode_equals_one_record_at_a_time(monkeypatch, name):
  """Chunk reads (3 chunks of 700, the last partial) give the records that
  reading one at a time gives, in order; a wrong image shape is refused."""
  monkeypatch.setattr(data, "_DECODE_CHUNK", 700)
  source = tfds.data_source(name, split="train", download=False)
  assert len(source.__getitems__([0, 1])) == 2  # The chunk read works here.
  info = data.get_info(name)
  images, labels = data._decode(source, info, 1500)  # pylint: disable=protected-access
  assert images.shape == (1500, *info.image_shape)
  for index in (0, 699, 700, 1399, 1400, 1499):
    example = source[index]
    np.testing.assert_array_equal(images[index], example["image"])
    assert labels[index] == example["label"]
  wrong = dataclasses.replace(info, image_shape=(32, 32, 1))
  with pytest.raises(RuntimeError, match="record 0 of .* has image shape"):
    data._decode(source, wrong, 10)  # pylint: disable=protected-access


def test_mock_source_decodes_one_record_at_a_time(mock_env):
  """tfds 4.9.10's mock data source has no working chunk read (TypeError):
  the records still come, equal to reading them one at a time."""
  del mock_env
  source = tfds.data_source("mnist", split="train", download=False)
  images, labels = data._decode(source, data.get_info("mnist"), None)  # pylint: disable=protected-access
  assert len(images) == len(source) > 1
  for index in (0, len(source) - 1):
    np.testing.assert_array_equal(images[index], source[index]["image"])
    assert labels[index] == source[index]["label"]


# ---------------------------------------------------------------------------
# Every data state: (id, setup(tmp_path) -> load kwargs, expected outcome).
# An error is one line saying what was searched and how to fix it, never a
# traceback from tfds; a state with a fallback says which source was used.


_REAL_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(
    __file__))), "..", "shared", "tfds")


def _half_written(tmp_path):
  """What an interrupted `tfds.builder(...).download_and_prepare` leaves:
  dataset_info.json and features.json with no splits, no record files."""
  builder = tfds.builder("mnist", data_dir=tmp_path / "tfds",
                         file_format="array_record")
  os.makedirs(builder.data_dir)
  builder.info.write_to_directory(builder.data_dir)
  return {"data_dir": tmp_path / "tfds"}


def _empty_folder(tmp_path):
  os.makedirs(tmp_path / "tfds" / "mnist")
  return {"data_dir": tmp_path / "tfds"}


def _records_missing(tmp_path):
  """A prepared copy's info files without its array_record files."""
  if not os.path.isdir(os.path.join(_REAL_DIR, "mnist", "3.0.1")):
    pytest.skip("needs the prepared MNIST copy in ../shared/tfds")
  version = os.path.join(tmp_path, "tfds", "mnist", "3.0.1")
  os.makedirs(version)
  for name in ("dataset_info.json", "features.json"):
    shutil.copy(os.path.join(_REAL_DIR, "mnist", "3.0.1", name), version)
  return {"data_dir": tmp_path / "tfds"}


def _corrupt_download(tmp_path):
  os.makedirs(tmp_path / "cache" / "original")
  (tmp_path / "cache" / "original" / "mnist-test.npz").write_bytes(b"junk")
  return {"data_dir": tmp_path / "none", "sample": True}


DATA_STATES = [
    ("no data, downloads off", lambda t: {"data_dir": t / "none"},
     data.DataNotFoundError,
     r"^No data for dataset 'mnist' split 'test': no prepared TFDS copy in "
     r".*none; no download in .*cache and downloading is off "
     r"\(REPDEF_JAX_OFFLINE=1 or download=False\)\. Fix: set TFDS_DATA_DIR"),
    ("no data, no network",
     lambda t: {"data_dir": t / "none", "download": True},
     data.DataNotFoundError,
     r"downloading failed: fetching https://storage\.googleapis\.com/\S+ "
     r"failed \(URLError: .*Network is unreachable\)\. Fix: .*repdef-data "
     r"prepare mnist"),
    ("tfds's default folder without the dataset",
     lambda t: {"data_dir": None, "_default_dir": t / "home_tfds"},
     data.DataNotFoundError,
     r"^No data for dataset 'mnist' split 'test': no prepared TFDS copy in "
     r".*home_tfds; no download in"),
    ("empty TFDS folder", _empty_folder, data.DataNotFoundError,
     r"an incomplete or unreadable TFDS copy in .*tfds/mnist "
     r"\(NotImplementedError: .*; delete it or prepare it again\)"),
    ("half-written TFDS folder", _half_written, data.DataNotFoundError,
     r"unreadable TFDS copy in .*tfds/mnist \(KeyError: Trying to access "
     r"`splits\['test'\]` but `splits` is empty; delete it"),
    ("record file missing", _records_missing, data.DataNotFoundError,
     r"unreadable TFDS copy in .*tfds/mnist \(RuntimeError: open\(\) "
     r"failed: No such file or directory; opening .*mnist-test\."
     r"array_record-00000-of-00001; delete it"),
    ("unknown dataset name", lambda t: {"name": "svhn"}, ValueError,
     r"^Unknown dataset name='svhn'; expected one of \['cifar10', "),
    ("unknown split", lambda t: {"split": "validation"}, ValueError,
     r"^Unknown split='validation' for dataset 'mnist'; expected one of"),
    ("no data, sample lacks the split",
     lambda t: {"name": "cifar10", "split": "train", "sample": True,
                "data_dir": t / "none"}, data.DataNotFoundError,
     r"^No data for dataset 'cifar10' split 'train': no prepared TFDS copy"),
    ("no data, sample allowed", lambda t: {"data_dir": t / "none",
                                           "sample": True},
     "sample", r"^the embedded sample, 256 real mnist test images \(no "
     r"prepared TFDS copy in .*none; no download in .* downloading is off"),
    ("corrupt download cache, sample allowed", _corrupt_download, "sample",
     r"^the embedded sample, 256 real mnist test images"),
]


@pytest.fixture
def unreachable_network(monkeypatch):
  """Every connection fails as on a machine without a network."""

  def unreachable(*args, **kwargs):
    raise OSError(101, "Network is unreachable")

  monkeypatch.setattr(socket, "create_connection", unreachable)
  monkeypatch.delenv("REPDEF_JAX_MIRROR", raising=False)


@pytest.mark.usefixtures("unreachable_network")
@pytest.mark.parametrize("setup, expected, match",
                         [c[1:] for c in DATA_STATES],
                         ids=[c[0] for c in DATA_STATES])
def test_data_states(setup, expected, match, tmp_path, monkeypatch):
  kwargs = {"name": "mnist", "split": "test", "cache_dir": tmp_path / "cache",
            **setup(tmp_path)}
  default_dir = kwargs.pop("_default_dir", None)
  if default_dir is not None:
    from tensorflow_datasets.core import constants  # pylint: disable=g-import-not-at-top
    monkeypatch.setattr(constants, "DATA_DIR", str(default_dir))
    monkeypatch.delenv("TFDS_DATA_DIR", raising=False)
  if isinstance(expected, str):
    *_, source = data.load_with_source(**kwargs)
    assert source.kind == expected
    assert re.search(match, source.detail), source.detail
    assert "\n" not in str(source)
    return
  with pytest.raises(expected) as error:
    data.load_with_source(**kwargs)
  message = str(error.value)
  assert "\n" not in message and "Traceback" not in message
  assert re.search(match, message), message


def test_sample_is_real_and_matches_the_prepared_copy(tmp_path):
  roots = [os.environ.get("TFDS_DATA_DIR", ""), _REAL_DIR]
  root = next((r for r in roots if r and all(
      os.path.isdir(os.path.join(r, n)) for n in data.SAMPLE_SPLITS)), None)
  for name, splits in data.SAMPLE_SPLITS.items():
    info = data.get_info(name)
    for split in splits:
      images, labels = data.load_sample(name, split)
      assert images.shape == (data.SAMPLE_SIZE, *info.image_shape)
      assert images.dtype == np.uint8 and labels.dtype == np.int32
      assert len(np.unique(labels)) == info.num_classes  # every class
      assert images.std() > 30  # natural images, not constants
      if root is not None:
        # A fresh cache: a copy left in ~/.cache must not decide the test.
        real, real_labels = data.load(
            name, split, data_dir=root, max_examples=data.SAMPLE_SIZE,
            download=False, cache_dir=tmp_path)
        np.testing.assert_array_equal(images, real)
        np.testing.assert_array_equal(labels, real_labels)
  if root is None:
    pytest.skip("no prepared copy (TFDS_DATA_DIR or ../shared/tfds): the "
                "sample was checked, not compared with one")


def test_write_sample_reads_prepared_tfds_copies_only(tmp_path, monkeypatch):
  """From the prepared copies (when present) it rebuilds the shipped sample;
  a download cache is not one (its records are in another order): refused
  before anything is written."""
  monkeypatch.setenv("REPDEF_JAX_CACHE", str(tmp_path / "cache"))
  if all(os.path.isdir(os.path.join(_REAL_DIR, n)) for n in data.SAMPLE_SPLITS):
    paths = data.write_sample(_REAL_DIR, tmp_path / "out")
    assert sorted(paths) == sorted(data.SAMPLE_SPLITS)
    for name, path in paths.items():
      with np.load(path) as rebuilt:
        for split in data.SAMPLE_SPLITS[name]:
          images, labels = data.load_sample(name, split)
          np.testing.assert_array_equal(rebuilt[f"{split}_images"], images)
          np.testing.assert_array_equal(rebuilt[f"{split}_labels"], labels)
  for split in ("train", "test"):
    images, labels = data.load_sample("mnist", split)
    path = data._download_path(str(tmp_path / "cache"), "mnist", split)  # pylint: disable=protected-access
    os.makedirs(os.path.dirname(path), exist_ok=True)
    np.savez(path, images=images, labels=labels)
  with pytest.raises(data.DataNotFoundError, match=r"No prepared TFDS copy "
                     r"of 'mnist' split 'train' in \S+ \(found download: "):
    data.write_sample(tmp_path / "none", tmp_path / "out2")
  assert not (tmp_path / "out2").exists()


def test_sample_fallback_slices_splits_and_max_examples(tmp_path):
  """The sample path applies TFDS split syntax (a percentage rounds to the
  nearest record: 10 % of 256 is 26) and then max_examples."""
  kwargs = {"data_dir": tmp_path / "none", "cache_dir": tmp_path / "cache",
            "download": False}
  train, train_labels = data.load_sample("mnist", "train")
  test, test_labels = data.load_sample("mnist", "test")
  images, labels = data.load("mnist", "test[:10%]", sample=True, **kwargs)
  assert len(images) == 26
  np.testing.assert_array_equal(images, test[:26])
  images, labels = data.load("mnist", "train[250:]+test[-4:]", sample=True,
                             max_examples=8, **kwargs)
  np.testing.assert_array_equal(images, np.concatenate([train[250:],
                                                        test[-4:-2]]))
  np.testing.assert_array_equal(labels, np.concatenate([train_labels[250:],
                                                        test_labels[-4:-2]]))
  # Read-only like every other source, also when concatenated.
  for array in (images, labels):
    assert not array.flags.writeable
  # A slice past the records the source holds, or an empty one, is refused
  # as TFDS refuses it (it was clipped silently); a NumPy int is an int.
  for bad, match in (("test[:300]", r"reaches past the 256 records of "
                      r"'test' in this source"),
                     ("test[:200%]", "reaches past"),
                     ("test[20:10]", "selects no record of the 256")):
    with pytest.raises(ValueError, match=match):
      data.load("mnist", bad, sample=True, **kwargs)
  assert len(data.load("mnist", "test", sample=True,
                       max_examples=np.int64(5), **kwargs)[0]) == 5
  with pytest.raises(data.DataNotFoundError):
    data.load("mnist", "test", **kwargs)
  with data.allow_sample():
    *_, source = data.load_with_source("mnist", "test", **kwargs)
  assert source.kind == "sample"


def test_download_cache_honours_split_and_max_examples(tmp_path):
  """Arrays decoded from the original archives (cached): sliced, joined and
  cut to max_examples like a TFDS copy."""
  cache = tmp_path / "cache"
  arrays = {}
  for split in ("train", "test"):
    arrays[split] = data.load_sample("mnist", split)
    path = data._download_path(str(cache), "mnist", split)  # pylint: disable=protected-access
    os.makedirs(os.path.dirname(path), exist_ok=True)
    np.savez(path, images=arrays[split][0], labels=arrays[split][1])
  images, labels, source = data.load_with_source(
      "mnist", "test+train[:3]", tmp_path / "none", cache_dir=cache,
      max_examples=258, download=False)
  assert source.kind == "download"
  np.testing.assert_array_equal(images, np.concatenate(
      [arrays["test"][0], arrays["train"][0][:2]]))
  np.testing.assert_array_equal(labels, np.concatenate(
      [arrays["test"][1], arrays["train"][1][:2]]))


@pytest.mark.integration
@_needs_real_data
@pytest.mark.parametrize("name", ["mnist", "cifar10"])
def test_normalization_constants_match_the_training_images(name, tmp_path):
  """DatasetInfo.mean / std, channel by channel (R, G, B), are those of the
  [0, 1]-scaled training pixels (the first 2000 images are within 0.005;
  a swap of CIFAR-10's R and B means is 0.045 off)."""
  images, _ = data.load(name, "train", cache_dir=tmp_path,
                        max_examples=2000, download=False)
  x = images.astype(np.float64) / 255.0
  info = data.get_info(name)
  np.testing.assert_allclose(x.mean(axis=(0, 1, 2)), info.mean, atol=0.01)
  np.testing.assert_allclose(x.std(axis=(0, 1, 2)), info.std, atol=0.01)


@pytest.mark.parametrize("name,splits", [("mnist", ("train", "test")),
                                         ("cifar10", ("test",))])
def test_normalization_constants_match_the_embedded_sample(name, splits):
  """DatasetInfo.mean / std, channel by channel, against the real images
  shipped in the package (512 MNIST / 256 CIFAR-10 images are within
  0.008 of them; a swap of CIFAR-10's R and B means, or the widespread
  wrong CIFAR-10 std (0.2023, 0.1994, 0.2010), is >= 0.045 off)."""
  x = np.concatenate([data.load_sample(name, s)[0] for s in splits])
  x = x.astype(np.float64) / 255.0
  info = data.get_info(name)
  np.testing.assert_allclose(x.mean(axis=(0, 1, 2)), info.mean, atol=0.015)
  np.testing.assert_allclose(x.std(axis=(0, 1, 2)), info.std, atol=0.015)
