"""The datasets' original archives: where they are, their checksums, decoding.

MNIST and Fashion-MNIST are four gzipped IDX files each (LeCun et al. 1998;
Xiao et al. 2017); CIFAR-10 and CIFAR-100 one ``*-binary.tar.gz`` each
(Krizhevsky 2009). The URLs, sizes and SHA-256 digests are those of
TensorFlow Datasets' checksum registry (``url_checksums/*.txt`` in
tensorflow-datasets 4.9), the archives tfds itself prepares from. We read the
binary CIFAR version (fixed-size records) rather than the Python one, which
would mean unpickling downloaded files.

Archives are read into memory, verified and decoded there: nothing is written
until the arrays exist, so a failed or tampered download leaves no file.
Departure from tfds: records keep the archives' order (tfds shuffles them
when it prepares a dataset), so index ``i`` is the ``i``-th image of the
original files.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import math
import os
import pathlib
import tarfile
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Callable, Mapping, NamedTuple

import numpy as np

MIRROR_ENV = "REPDEF_JAX_MIRROR"
CHECKSUMS_ENV = "REPDEF_JAX_CHECKSUMS"
TIMEOUT_ENV = "REPDEF_JAX_DOWNLOAD_TIMEOUT"
DEFAULT_TIMEOUT = 15.0  # Seconds without progress before a fetch gives up.


class Archive(NamedTuple):
  """One original file: name, size in bytes and SHA-256 (hex)."""
  file: str
  size: int
  sha256: str


class Origin(NamedTuple):
  """Where a dataset's original files are published."""
  url: str
  archives: tuple[Archive, ...]


_IDX = ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz",
        "t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz")

ORIGINS: dict[str, Origin] = {
    "mnist": Origin("https://storage.googleapis.com/cvdf-datasets/mnist/", (
        Archive(_IDX[0], 9912422, "440fcabf73cc546fa21475e81ea370265605f56b"
                "e210a4024d2ca8f203523609"),
        Archive(_IDX[1], 28881, "3552534a0a558bbed6aed32b30c495cca23d567ec52"
                "cac8be1a0730e8010255c"),
        Archive(_IDX[2], 1648877, "8d422c7b0a1c1c79245a5bcf07fe86e33eeafee7"
                "92b84584aec276f5a2dbc4e6"),
        Archive(_IDX[3], 4542, "f7ae60f92e00ec6debd23a6088c31dbd2371eca3ffa"
                "0defaefb259924204aec6"))),
    "fashion_mnist": Origin(
        "http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/", (
            Archive(_IDX[0], 26421880, "3aede38d61863908ad78613f6a32ed271626"
                    "dd12800ba2636569512369268a84"),
            Archive(_IDX[1], 29515, "a04f17134ac03560a47e3764e11b92fc97de4d1"
                    "bfaf8ba1a3aa29af54cc90845"),
            Archive(_IDX[2], 4422102, "346e55b948d973a97e58d2351dde16a484bd4"
                    "15d4595297633bb08f03db6a073"),
            Archive(_IDX[3], 5148, "67da17c76eaffca5446c3361aaab5c3cd6d1c260"
                    "8764d35dfb1850b086bf8dd5"))),
    "cifar10": Origin("https://www.cs.toronto.edu/~kriz/", (
        Archive("cifar-10-binary.tar.gz", 170052171, "c4a38c50a1bc5f3a1c5537"
                "f2155ab9d68f9f25eb1ed8d9ddda3db29a59bca1dd"),)),
    "cifar100": Origin("https://www.cs.toronto.edu/~kriz/", (
        Archive("cifar-100-binary.tar.gz", 168513733, "58a81ae192c23a4be8b18"
                "04d68e518ed807d710a4eb253b1f2a199162a40d8ec"),)),
}

# CIFAR binary layout: member file names per split and label bytes per record
# (CIFAR-100: coarse then fine label; we keep the fine one, as tfds 'label').
_CIFAR = {
    "cifar10": ("cifar-10-batches-bin/", {
        "train": [f"data_batch_{i}.bin" for i in range(1, 6)],
        "test": ["test_batch.bin"]}, 1),
    "cifar100": ("cifar-100-binary/", {"train": ["train.bin"],
                                        "test": ["test.bin"]}, 2),
}

Arrays = tuple[np.ndarray, np.ndarray]


class DownloadError(OSError):
  """An archive could not be fetched, verified or decoded."""


def base_url(name: str, mirror: str | None = None) -> str:
  """The folder a dataset's files are fetched from (ends with ``/``).

  Args:
    name: a key of :data:`ORIGINS`.
    mirror: a mirror's root URL (``https://``, ``file://``...) or a local
      folder (a path without a scheme, made a ``file://`` URL); its files are
      ``<mirror>/<name>/<file>``. Defaults to ``$REPDEF_JAX_MIRROR``, then to
      the original publisher.
  """
  mirror = mirror or os.environ.get(MIRROR_ENV) or None
  if mirror:
    if not urllib.parse.urlsplit(mirror).scheme:  # A folder.
      mirror = pathlib.Path(mirror).expanduser().resolve().as_uri()
    return f"{mirror.rstrip('/')}/{name}/"
  return ORIGINS[name].url


def _timeout(timeout: float | None) -> float:
  """``timeout``, else ``$REPDEF_JAX_DOWNLOAD_TIMEOUT``, else 15; checked."""
  name, value = "timeout", timeout
  if timeout is None:
    name, value = TIMEOUT_ENV, os.environ.get(TIMEOUT_ENV) or DEFAULT_TIMEOUT
  try:
    seconds = float(value)
  except (TypeError, ValueError):
    seconds = float("nan")
  if not (math.isfinite(seconds) and seconds > 0):
    raise ValueError(f"{name} must be a number of seconds > 0, got "
                     f"{value!r}.")
  return seconds


def read_checksums(path: str) -> dict[str, str]:
  """Reads ``<sha256>  <dataset>/<file>`` lines (``sha256sum`` format).

  A mirror holding files other than the published ones (a test, a re-packed
  archive) states their digests in such a file; the user passes it
  explicitly (``checksums=`` / ``--checksums`` / ``$REPDEF_JAX_CHECKSUMS``).
  It is never fetched from the mirror itself.

  Returns:
    ``{'<dataset>/<file>': sha256}``.

  Raises:
    DownloadError: unreadable file or a malformed line.
  """
  table = {}
  try:
    with open(path, encoding="utf-8") as f:
      lines = f.read().splitlines()
  except OSError as error:
    raise DownloadError(f"cannot read checksums file {path}: {error}") from None
  for number, line in enumerate(lines, 1):
    if not line.strip() or line.startswith("#"):
      continue
    parts = line.split()
    if (len(parts) != 2 or len(parts[0]) != 64 or
        not all(c in "0123456789abcdef" for c in parts[0].lower())):
      raise DownloadError(f"{path}:{number}: expected '<sha256>  "
                          f"<dataset>/<file>', got {line!r}")
    table[parts[1].lstrip("*")] = parts[0].lower()
  return table


def fetch(url: str, sha256: str, *, size: int | None = None,
          timeout: float | None = None) -> bytes:
  """Reads ``url`` into memory and checks its SHA-256.

  Args:
    url: the file.
    sha256: expected digest (hex).
    size: expected size in bytes, if known: reading stops past it.
    timeout: seconds a connect or read may block (default
      ``$REPDEF_JAX_DOWNLOAD_TIMEOUT`` or 15).

  Returns:
    The file's bytes.

  Raises:
    DownloadError: network failure, an over-long or short file (fewer
      bytes than announced or than ``size``) or a digest mismatch.
    ValueError: a timeout (or ``$REPDEF_JAX_DOWNLOAD_TIMEOUT``) that is not a
      number > 0.
  """
  timeout = _timeout(timeout)
  digest, chunks, total = hashlib.sha256(), [], 0
  try:
    with urllib.request.urlopen(url, timeout=timeout) as response:
      announced = (getattr(response, "headers", None) or {}).get(
          "Content-Length")
      while chunk := response.read(1 << 20):
        total += len(chunk)
        if size is not None and total > size:
          raise DownloadError(f"{url} is larger than the expected {size} "
                              "bytes; refused")
        digest.update(chunk)
        chunks.append(chunk)
    expected = (int(announced) if announced and announced.isdigit()
                else size)
    if expected is not None and total < expected:
      raise DownloadError(f"incomplete download of {url}: got {total} of "
                          f"{expected} bytes (connection cut, or a truncated "
                          "file); retry, or fix the mirror")
  except (urllib.error.URLError, OSError, ValueError) as error:
    if isinstance(error, DownloadError):
      raise
    reason = getattr(error, "reason", None) or error
    raise DownloadError(f"fetching {url} failed ({type(error).__name__}: "
                        f"{reason})") from None
  if digest.hexdigest() != sha256.lower():
    raise DownloadError(
        f"checksum mismatch for {url}: sha256 {digest.hexdigest()}, expected "
        f"{sha256}; refused (a mirror with other files needs --checksums)")
  return b"".join(chunks)


def _idx(raw_gz: bytes, what: str) -> np.ndarray:
  """Decodes a gzipped IDX file of unsigned bytes."""
  try:
    raw = gzip.decompress(raw_gz)
  except (OSError, EOFError) as error:
    raise DownloadError(f"{what}: not a gzip file ({error})") from None
  if len(raw) < 4 or raw[:2] != b"\0\0" or raw[2] != 0x08:
    raise DownloadError(f"{what}: not an IDX file of unsigned bytes")
  ndim = raw[3]
  dims = [int.from_bytes(raw[4 + 4 * i:8 + 4 * i], "big") for i in range(ndim)]
  start = 4 + 4 * ndim
  if len(raw) != start + int(np.prod(dims)):
    raise DownloadError(f"{what}: {len(raw) - start} data bytes for shape "
                        f"{dims}")
  return np.frombuffer(raw, np.uint8, offset=start).reshape(dims)


def _decode_idx_dataset(files: Mapping[str, bytes]) -> dict[str, Arrays]:
  out = {}
  for split, prefix in (("train", "train"), ("test", "t10k")):
    images = _idx(files[f"{prefix}-images-idx3-ubyte.gz"], f"{prefix} images")
    labels = _idx(files[f"{prefix}-labels-idx1-ubyte.gz"], f"{prefix} labels")
    if images.ndim != 3 or labels.ndim != 1 or len(images) != len(labels):
      raise DownloadError(f"{split}: images {images.shape} and labels "
                          f"{labels.shape} do not match")
    out[split] = (images[..., None], labels.astype(np.int32))
  return out


def _decode_cifar(name: str, raw_tgz: bytes) -> dict[str, Arrays]:
  prefix, members, label_bytes = _CIFAR[name]
  record = label_bytes + 32 * 32 * 3
  out = {}
  try:
    with tarfile.open(fileobj=io.BytesIO(raw_tgz), mode="r:gz") as tar:
      for split, files in members.items():
        blobs = []
        for file in files:
          member = tar.extractfile(prefix + file)  # Read, never extracted.
          if member is None:
            raise KeyError(prefix + file)
          blobs.append(member.read())
        raw = np.frombuffer(b"".join(blobs), np.uint8)
        if raw.size % record:
          raise DownloadError(f"{name} {split}: {raw.size} bytes is not a "
                              f"whole number of {record}-byte records")
        raw = raw.reshape(-1, record)
        images = raw[:, label_bytes:].reshape(-1, 3, 32, 32)
        out[split] = (np.ascontiguousarray(images.transpose(0, 2, 3, 1)),
                      raw[:, label_bytes - 1].astype(np.int32))
  except (tarfile.TarError, KeyError, OSError, EOFError) as error:
    if isinstance(error, DownloadError):
      raise
    raise DownloadError(f"{name}: unreadable archive ({type(error).__name__}:"
                        f" {error})") from None
  return out


def checksum_overrides(name: str,
                       checksums: str | Mapping[str, str] | None = None
                       ) -> dict[str, str]:
  """``{file: sha256}`` of ``name``'s archives whose digest ``checksums``
  (see :func:`fetch_and_decode`; default ``$REPDEF_JAX_CHECKSUMS``) replaces
  with another than the published one.

  Raises:
    DownloadError: an unreadable or malformed checksums file.
  """
  checksums = checksums or os.environ.get(CHECKSUMS_ENV) or {}
  if isinstance(checksums, str):
    checksums = read_checksums(checksums)
  out = {}
  for archive in ORIGINS[name].archives:
    digest = checksums.get(f"{name}/{archive.file}")
    if digest and digest.lower() != archive.sha256:
      out[archive.file] = digest.lower()
  return out


def verified_with(name: str,
                  checksums: str | Mapping[str, str] | None = None) -> str:
  """Which digests ``name``'s archives are verified against: 'published',
  or 'override <hash>' naming the set of :func:`checksum_overrides` (files
  other than the published ones). A download cache records it, so files
  verified against one set are not reused as those of another."""
  overrides = checksum_overrides(name, checksums)
  if not overrides:
    return "published"
  text = "".join(f"{f} {d}\n" for f, d in sorted(overrides.items()))
  return "override " + hashlib.sha256(text.encode()).hexdigest()[:12]


def fetch_and_decode(name: str, *, mirror: str | None = None,
                     checksums: str | Mapping[str, str] | None = None,
                     timeout: float | None = None,
                     log: Callable[[str], None] | None = None
                     ) -> dict[str, Arrays]:
  """Fetches a dataset's original files, verifies and decodes them.

  Args:
    name: a key of :data:`ORIGINS`.
    mirror: see :func:`base_url`.
    checksums: digests replacing the published ones for the files they name
      (``'<dataset>/<file>'`` keys): a mapping or a file for
      :func:`read_checksums`; default ``$REPDEF_JAX_CHECKSUMS``. Files it
      does not name keep the published digest.
    timeout: see :func:`fetch`.
    log: called with one progress line per fetched file.

  Returns:
    ``{'train': (images, labels), 'test': (images, labels)}``: ``uint8``
    ``[N, H, W, C]`` and ``int32`` ``[N]`` in the archives' order.

  Raises:
    DownloadError: a file could not be fetched, verified or decoded.
    ValueError: a bad timeout (see :func:`fetch`).
  """
  timeout = _timeout(timeout)
  overrides = checksum_overrides(name, checksums)
  url = base_url(name, mirror)
  files = {}
  for archive in ORIGINS[name].archives:
    override = overrides.get(archive.file)
    start = time.perf_counter()
    files[archive.file] = fetch(
        url + archive.file, override or archive.sha256,
        size=None if override else archive.size, timeout=timeout)
    if log:
      log(f"fetched {url}{archive.file} ({len(files[archive.file]) / 1e6:.1f}"
          f" MB, sha256 ok) in {time.perf_counter() - start:.1f}s")
  if name in _CIFAR:
    [raw] = files.values()
    return _decode_cifar(name, raw)
  return _decode_idx_dataset(files)
