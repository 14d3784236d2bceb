"""The download path, offline: original-format archives on a local HTTP mirror.

The served files are built from the prepared TFDS copies when they exist
(``$TFDS_DATA_DIR`` or ``../shared/tfds``: real MNIST and CIFAR-10 records),
otherwise from small synthetic arrays; Fashion-MNIST and CIFAR-100 are always
synthetic. Decoding them must give back exactly the served arrays.
"""

import functools
import gzip
import hashlib
import http.server
import io
import os
import subprocess
import sys
import tarfile
import threading

import numpy as np
import pytest

from repdef_jax import data
from repdef_jax import data_cli
from repdef_jax import download

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_SPLIT_SIZES = {"train": 300, "test": 200}


def _tfds_dir() -> str | None:
  for d in (os.environ.get("TFDS_DATA_DIR"),
            os.path.join(ROOT, "..", "shared", "tfds")):
    if d and os.path.isdir(os.path.join(d, "mnist")):
      return d
  return None


def _source_arrays(name: str) -> dict[str, tuple[np.ndarray, np.ndarray]]:
  """Real records when a prepared copy exists, else synthetic ones."""
  tfds_dir = _tfds_dir()
  if tfds_dir and name in ("mnist", "cifar10"):
    return {s: data.load(name, s, tfds_dir, download=False, max_examples=n)
            for s, n in _SPLIT_SIZES.items()}
  info = data.get_info(name)
  rng = np.random.default_rng(len(name))
  return {s: (rng.integers(0, 256, (n, *info.image_shape), dtype=np.uint8),
              rng.integers(0, info.num_classes, n).astype(np.int32))
          for s, n in _SPLIT_SIZES.items()}


def _idx(array: np.ndarray) -> bytes:
  """A gzipped IDX file of a uint8 array (the MNIST format)."""
  header = bytes([0, 0, 0x08, array.ndim]) + b"".join(
      int(d).to_bytes(4, "big") for d in array.shape)
  return gzip.compress(header + np.ascontiguousarray(array).tobytes(),
                       compresslevel=1)


def _cifar_tgz(name: str, splits) -> bytes:
  """A CIFAR ``*-binary.tar.gz``: label byte(s) then 3x1024 channel planes."""
  label_bytes = 2 if name == "cifar100" else 1
  if name == "cifar100":
    files = {"train": ["cifar-100-binary/train.bin"],
             "test": ["cifar-100-binary/test.bin"]}
  else:
    files = {"train": [f"cifar-10-batches-bin/data_batch_{i}.bin"
                       for i in range(1, 6)],
             "test": ["cifar-10-batches-bin/test_batch.bin"]}
  buffer = io.BytesIO()
  with tarfile.open(fileobj=buffer, mode="w:gz", compresslevel=1) as tar:
    for split, members in files.items():
      images, labels = splits[split]
      for member, part in zip(members, np.array_split(
          np.arange(len(labels)), len(members))):
        rows = np.zeros((len(part), label_bytes + 3072), np.uint8)
        rows[:, 0] = 7  # CIFAR-100's coarse label: must be ignored.
        rows[:, label_bytes - 1] = labels[part]
        rows[:, label_bytes:] = images[part].transpose(0, 3, 1, 2).reshape(
            len(part), -1)
        info = tarfile.TarInfo(member)
        info.size = rows.nbytes
        tar.addfile(info, io.BytesIO(rows.tobytes()))
  return buffer.getvalue()


def _files(name: str, splits) -> dict[str, bytes]:
  if name.startswith("cifar"):
    [archive] = download.ORIGINS[name].archives
    return {archive.file: _cifar_tgz(name, splits)}
  out = {}
  for split, prefix in (("train", "train"), ("test", "t10k")):
    images, labels = splits[split]
    out[f"{prefix}-images-idx3-ubyte.gz"] = _idx(images[..., 0])
    out[f"{prefix}-labels-idx1-ubyte.gz"] = _idx(labels.astype(np.uint8))
  return out


@pytest.fixture(scope="module")
def mirror(tmp_path_factory):
  """Serves every dataset's files; yields (url, checksums file, arrays)."""
  root = tmp_path_factory.mktemp("mirror")
  arrays, lines = {}, []
  for name in download.ORIGINS:
    arrays[name] = _source_arrays(name)
    os.makedirs(root / name)
    for file, blob in _files(name, arrays[name]).items():
      (root / name / file).write_bytes(blob)
      lines.append(f"{hashlib.sha256(blob).hexdigest()}  {name}/{file}")
  checksums = root / "SHA256SUMS"
  checksums.write_text("\n".join(lines) + "\n")
  handler = functools.partial(Quiet, directory=str(root))
  server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
  thread = threading.Thread(target=server.serve_forever, daemon=True)
  thread.start()
  yield f"http://127.0.0.1:{server.server_port}", str(checksums), arrays
  server.shutdown()
  thread.join()


class Quiet(http.server.SimpleHTTPRequestHandler):

  def log_message(self, *args):
    del args


@pytest.fixture(autouse=True)
def _fresh(monkeypatch):
  for var in (download.MIRROR_ENV, download.CHECKSUMS_ENV, "TFDS_DATA_DIR"):
    monkeypatch.delenv(var, raising=False)
  monkeypatch.setenv(data.QUIET_ENV, "1")
  data.clear_cache()
  yield
  data.clear_cache()


@pytest.mark.parametrize("name", sorted(download.ORIGINS))
def test_prepare_decodes_the_served_arrays(mirror, name, tmp_path):
  url, checksums, arrays = mirror
  paths = data.prepare(name, cache_dir=tmp_path, mirror=url,
                       checksums=checksums)
  assert sorted(paths) == ["test", "train"]
  for split, (images, labels) in arrays[name].items():
    with np.load(paths[split]) as z:
      np.testing.assert_array_equal(z["images"], images)
      np.testing.assert_array_equal(z["labels"], labels)
      assert z["images"].dtype == np.uint8 and z["labels"].dtype == np.int32


def test_wrong_checksum_is_refused_and_writes_nothing(mirror, tmp_path):
  url, _, _ = mirror
  # The served files are not the published ones: the default table refuses.
  with pytest.raises(download.DownloadError, match="checksum mismatch"):
    data.prepare("mnist", cache_dir=tmp_path, mirror=url)
  bad = tmp_path / "bad_sums"
  bad.write_text(f"{'0' * 64}  cifar10/cifar-10-binary.tar.gz\n")
  with pytest.raises(download.DownloadError,
                     match=r"sha256 [0-9a-f]{64}, expected 0{64}"):
    data.prepare("cifar10", cache_dir=tmp_path, mirror=url,
                 checksums=str(bad))
  assert not [f for _, _, fs in os.walk(tmp_path) for f in fs
              if f != "bad_sums"]


def test_a_checksum_file_only_replaces_what_it_names(mirror, tmp_path):
  url, checksums, _ = mirror
  partial = tmp_path / "partial"
  partial.write_text("".join(
      line + "\n" for line in open(checksums).read().splitlines()
      if "t10k-images" not in line))
  with pytest.raises(download.DownloadError, match="t10k-images.*mismatch|"
                     "mismatch.*t10k-images"):
    data.prepare("mnist", cache_dir=tmp_path / "c", mirror=url,
                 checksums=str(partial))


def test_load_downloads_on_first_use_then_reads_the_cache(mirror, tmp_path,
                                                          monkeypatch):
  url, checksums, arrays = mirror
  monkeypatch.setenv(download.MIRROR_ENV, url)
  monkeypatch.setenv(download.CHECKSUMS_ENV, checksums)
  empty = tmp_path / "no_tfds"
  images, labels, source = data.load_with_source(
      "cifar10", "test[:50]", empty, cache_dir=tmp_path, download=True)
  assert source.kind == "download"
  np.testing.assert_array_equal(images, arrays["cifar10"]["test"][0][:50])
  np.testing.assert_array_equal(labels, arrays["cifar10"]["test"][1][:50])

  data.clear_cache()
  monkeypatch.setenv(download.MIRROR_ENV, "http://127.0.0.1:9")  # Unused.
  images, _, source = data.load_with_source(
      "cifar10", "train+test", empty, cache_dir=tmp_path, download=False,
      max_examples=310)
  assert source.kind == "download" and images.shape == (310, 32, 32, 3)
  np.testing.assert_array_equal(images[300:],
                                arrays["cifar10"]["test"][0][:10])
  tag = download.verified_with("cifar10", checksums)
  assert tag.startswith("override ") and tag in source.detail

  # The cache holds files verified against the test's own digests, not the
  # published ones: a run without that override does not reuse it.
  data.clear_cache()
  monkeypatch.delenv(download.CHECKSUMS_ENV)
  with pytest.raises(data.DataNotFoundError, match=r"verified against "
                     r"override \w+ checksums, not this run's published"):
    data.load_with_source("cifar10", "test", empty, cache_dir=tmp_path,
                          download=False, sample=False)
  # A bad checksums file is a note of the search, not a traceback of load.
  monkeypatch.setenv(download.CHECKSUMS_ENV, str(tmp_path / "missing"))
  data.clear_cache()
  with pytest.raises(data.DataNotFoundError,
                     match="no usable download: cannot read checksums file"):
    data.load_with_source("cifar10", "test", empty, cache_dir=tmp_path,
                          download=False, sample=False)


def test_verified_with_names_only_digests_that_differ(tmp_path):
  [archive] = download.ORIGINS["cifar10"].archives
  key = f"cifar10/{archive.file}"
  assert download.verified_with("cifar10", {}) == "published"
  # The published digest restated, or another dataset's file: no override.
  assert download.verified_with(
      "cifar10", {key: archive.sha256.upper(), "mnist/x": "0" * 64}) == (
          "published")
  other = download.verified_with("cifar10", {key: "1" * 64})
  assert other.startswith("override ") and other != download.verified_with(
      "cifar10", {key: "2" * 64})
  sums = tmp_path / "sums"
  sums.write_text(f"{'1' * 64}  {key}\n")
  assert download.verified_with("cifar10", str(sums)) == other


def test_unreachable_mirror_fails_fast_with_one_line(tmp_path):
  # Port 9 (discard) on localhost: nothing listens; connect is refused.
  with pytest.raises(data.DataNotFoundError) as error:
    with pytest.MonkeyPatch.context() as m:
      m.setenv(download.MIRROR_ENV, "http://127.0.0.1:9")
      data.load("mnist", "test", tmp_path / "none", cache_dir=tmp_path,
                download=True)
  message = str(error.value)
  assert "\n" not in message
  assert "downloading failed: fetching http://127.0.0.1:9/mnist/" in message
  assert "repdef-data prepare mnist" in message
  assert not os.path.exists(tmp_path / "original")


def test_oversized_file_is_refused(mirror):
  url, _, _ = mirror
  with pytest.raises(download.DownloadError, match="larger than"):
    download.fetch(f"{url}/mnist/t10k-labels-idx1-ubyte.gz", "0" * 64,
                   size=10)


def test_cli_prepare(mirror, tmp_path):
  url, checksums, _ = mirror
  env = {**os.environ, data.QUIET_ENV: "1"}
  ok = subprocess.run(
      [sys.executable, "-m", "repdef_jax.data_cli", "prepare", "mnist",
       f"--mirror={url}", f"--checksums={checksums}",
       f"--cache_dir={tmp_path}"], capture_output=True, text=True, env=env,
      timeout=120, check=False)
  assert ok.returncode == 0, ok.stderr
  assert "mnist: ready (test, train)" in ok.stdout
  bad = subprocess.run(
      [sys.executable, "-m", "repdef_jax.data_cli", "prepare", "cifar10",
       f"--mirror={url}", f"--cache_dir={tmp_path / 'bad'}"],
      capture_output=True, text=True, env=env, timeout=120, check=False)
  assert bad.returncode == 1
  [line] = bad.stderr.strip().splitlines()
  assert line.startswith("repdef-data: cifar10: checksum mismatch")


def test_a_local_folder_is_a_mirror(mirror, tmp_path, monkeypatch):
  """A mirror without a scheme is a folder (absolute, relative or through
  $REPDEF_JAX_MIRROR), read as a file:// URL."""
  _, checksums, arrays = mirror
  root = os.path.dirname(checksums)
  assert download.base_url("mnist", "/a b/m/") == "file:///a%20b/m/mnist/"
  monkeypatch.chdir(os.path.dirname(root))
  for how in ("absolute", "relative", "env"):
    cache = tmp_path / how
    if how == "env":
      monkeypatch.setenv(download.MIRROR_ENV, root)
      mirror_arg = None
    else:
      mirror_arg = root if how == "absolute" else os.path.basename(root)
    paths = data.prepare("mnist", cache_dir=cache, mirror=mirror_arg,
                         checksums=checksums)
    with np.load(paths["test"]) as z:
      np.testing.assert_array_equal(z["images"], arrays["mnist"]["test"][0])


def test_bad_timeouts_name_the_setting(monkeypatch, tmp_path):
  """Checked before anything is fetched: a ValueError naming the argument
  or the environment variable."""
  for bad in (-1, 0, float("nan"), "abc"):
    with pytest.raises(ValueError, match="timeout must be a number of "
                       "seconds > 0"):
      download.fetch_and_decode("mnist", mirror="http://127.0.0.1:9",
                                timeout=bad)
  monkeypatch.setenv(download.TIMEOUT_ENV, "abc")
  with pytest.raises(ValueError, match="REPDEF_JAX_DOWNLOAD_TIMEOUT must be "
                     "a number of seconds > 0, got 'abc'"):
    data.prepare("mnist", cache_dir=tmp_path, mirror="http://127.0.0.1:9")
  monkeypatch.setenv(download.TIMEOUT_ENV, "2.5")
  assert download._timeout(None) == 2.5  # pylint: disable=protected-access


def test_cli_errors_are_one_line(tmp_path, monkeypatch, capsys):
  from repdef_jax import data_cli  # pylint: disable=g-import-not-at-top
  monkeypatch.setenv("REPDEF_JAX_CACHE", str(tmp_path / "cache"))
  assert data_cli.main(["prepare", "mnist", "--timeout=-1",
                        "--mirror=http://127.0.0.1:9"]) == 1
  [line] = capsys.readouterr().err.strip().splitlines()
  assert line.startswith("repdef-data: mnist: timeout must be")
  out = tmp_path / "sample"
  assert data_cli.main(["sample", "--data_dir=/nonexistent",
                        f"--out_dir={out}"]) == 1
  [line] = capsys.readouterr().err.strip().splitlines()
  assert line.startswith("repdef-data: sample: No data for dataset 'mnist'")
  assert not out.exists()


def test_cli_passes_its_options_and_goes_on_after_a_failure(monkeypatch,
                                                            capsys):
  """Every option reaches data.prepare; a failing name is reported on one
  line and the names after it are still prepared, with exit status 1."""
  from repdef_jax import data_cli  # pylint: disable=g-import-not-at-top
  calls = []

  def prepare(name, **kwargs):
    calls.append((name, kwargs))
    if name == "cifar10":
      raise OSError("no route")
    return {"test": f"/c/{name}/test.npz", "train": f"/c/{name}/train.npz"}

  monkeypatch.setattr(data_cli.data, "prepare", prepare)
  status = data_cli.main(["prepare", "cifar10", "mnist", "--mirror=/m",
                          "--checksums=/s.txt", "--cache_dir=/c",
                          "--timeout=2.5"])
  assert status == 1
  options = dict(cache_dir="/c", mirror="/m", checksums="/s.txt",
                 timeout=2.5)
  assert calls == [("cifar10", options), ("mnist", options)]
  out, err = capsys.readouterr()
  assert err == "repdef-data: cifar10: no route\n"
  assert out == "mnist: ready (test, train) in /c/mnist\n"
  assert data_cli.main(["prepare", "mnist"]) == 0
  assert calls[-1] == ("mnist", dict(cache_dir=None, mirror=None,
                                     checksums=None, timeout=None))


def test_fetch_passes_its_timeout_to_every_connection(monkeypatch):
  """The timeout given, else $REPDEF_JAX_DOWNLOAD_TIMEOUT, else 15 s, is the
  one urlopen gets (a checked but unused timeout would hang on a dead
  server)."""
  seen = []

  def urlopen(url, **kwargs):
    seen.append(kwargs.get("timeout"))
    return io.BytesIO(b"data")

  monkeypatch.setattr(download.urllib.request, "urlopen", urlopen)
  sha = hashlib.sha256(b"data").hexdigest()
  monkeypatch.delenv(download.TIMEOUT_ENV, raising=False)
  assert download.fetch("http://x/f", sha, timeout=2.5) == b"data"
  download.fetch("http://x/f", sha)
  monkeypatch.setenv(download.TIMEOUT_ENV, "7")
  download.fetch("http://x/f", sha.upper())  # Hex digits in either case.
  assert seen == [2.5, download.DEFAULT_TIMEOUT, 7.0]


def test_fetch_refuses_a_short_download_as_incomplete(monkeypatch):
  """A connection cut before Content-Length bytes (or a file shorter than
  the archive's known size) is an incomplete download, not a checksum
  mismatch that asks for --checksums."""
  class Cut(io.BytesIO):
    headers = {"Content-Length": "8"}

  monkeypatch.setattr(download.urllib.request, "urlopen",
                      lambda url, **kwargs: Cut(b"data"))
  sha = hashlib.sha256(b"datadata").hexdigest()
  with pytest.raises(download.DownloadError, match=r"incomplete download of "
                     r"http://x/f: got 4 of 8 bytes"):
    download.fetch("http://x/f", sha)
  monkeypatch.setattr(download.urllib.request, "urlopen",
                      lambda url, **kwargs: io.BytesIO(b"data"))
  with pytest.raises(download.DownloadError, match="got 4 of 8 bytes"):
    download.fetch("http://x/f", sha, size=8)


def test_an_explicit_mirror_beats_the_environment(monkeypatch):
  monkeypatch.setenv(download.MIRROR_ENV, "http://127.0.0.1:9")
  assert download.base_url("mnist", "http://x/") == "http://x/mnist/"
  assert download.base_url("mnist") == "http://127.0.0.1:9/mnist/"


def test_a_file_of_exactly_the_expected_size_is_accepted(monkeypatch):
  """size is the archive's published size: a download of exactly that many
  bytes is the genuine file, not 'larger than expected'."""
  monkeypatch.setattr(download.urllib.request, "urlopen",
                      lambda url, **kwargs: io.BytesIO(b"data"))
  sha = hashlib.sha256(b"data").hexdigest()
  assert download.fetch("http://x/f", sha, size=4) == b"data"


def test_overridden_checksums_drop_the_published_size(tmp_path):
  """A mirror with its own digests may serve files larger than the
  published ones (here 12,000 test labels, > the 4,542 bytes of MNIST's
  t10k labels): the size limit is the published file's, and goes with its
  digest."""
  rng = np.random.default_rng(0)
  n = 12000
  arrays = {"train": (np.zeros((1, 28, 28), np.uint8),
                      np.zeros((1,), np.uint8)),
            "t10k": (np.zeros((n, 28, 28), np.uint8),
                     rng.integers(0, 10, n).astype(np.uint8))}
  folder = tmp_path / "mirror" / "mnist"
  folder.mkdir(parents=True)
  sums = {}
  for prefix, (images, labels) in arrays.items():
    for kind, a in (("images-idx3", images), ("labels-idx1", labels)):
      blob = _idx(a)
      file = f"{prefix}-{kind}-ubyte.gz"
      (folder / file).write_bytes(blob)
      sums[f"mnist/{file}"] = hashlib.sha256(blob).hexdigest()
  published = {a.file: a.size for a in download.ORIGINS["mnist"].archives}
  assert (folder / "t10k-labels-idx1-ubyte.gz").stat().st_size > published[
      "t10k-labels-idx1-ubyte.gz"]
  out = download.fetch_and_decode("mnist", mirror=str(tmp_path / "mirror"),
                                  checksums=sums)
  np.testing.assert_array_equal(out["test"][1], arrays["t10k"][1])


def test_cli_sample_rebuilds_the_package_sample_and_reports_it(
    monkeypatch, tmp_path, capsys):
  """`repdef-data sample --data_dir=D` reads D, writes into the package's
  sample_data folder (docs/data.md: it rebuilds the embedded sample), lists
  each file with its size and exits 0."""
  calls = []
  written = tmp_path / "mnist.npz"
  written.write_bytes(b"12345")

  def write_sample(data_dir, out_dir):
    calls.append((data_dir, out_dir))
    return {"mnist": str(written)}

  monkeypatch.setattr(data_cli.data, "write_sample", write_sample)
  assert data_cli.main(["sample", "--data_dir=/tfds"]) == 0
  package_sample = os.path.join(
      os.path.dirname(os.path.abspath(data_cli.__file__)), "sample_data")
  assert calls == [("/tfds", package_sample)]
  assert capsys.readouterr().out == f"mnist: {written} (5 bytes)\n"
  assert data_cli.main(["sample", "--data_dir=/tfds",
                        f"--out_dir={tmp_path}"]) == 0
  assert calls[-1] == ("/tfds", str(tmp_path))
