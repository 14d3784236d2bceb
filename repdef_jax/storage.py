"""Crash-safe result files and run set-up shared by the experiment scripts.

Everything an experiment writes goes through these helpers so that a run
killed at any moment leaves either the old file or the new one, never half of
one: data is written to a temporary file in the same folder, synced to disk,
moved over the target with ``os.replace`` (atomic on POSIX), and the folder
is synced so that the rename itself survives a power loss.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from typing import Any, Iterator

import numpy as np


def _umask() -> int:
  """The process's umask, read without changing it where Linux allows."""
  try:
    with open("/proc/self/status", encoding="ascii") as f:
      for line in f:
        if line.startswith("Umask:"):
          return int(line.split()[1], 8)
  except (OSError, ValueError, IndexError):
    pass
  # Elsewhere: set and restore. The umask is process-wide: a file another
  # thread creates in between gets umask 022.
  old = os.umask(0o022)
  os.umask(old)
  return old


def _fsync(path: str, folder: bool = False) -> None:
  """Flushes a file (errors raised: it must not land) or a folder (best
  effort: not every OS can sync one) to disk."""
  flags = (os.O_RDONLY | getattr(os, "O_DIRECTORY", 0)) if folder else os.O_RDWR
  try:
    fd = os.open(path, flags)
  except OSError:
    if folder:
      return
    raise
  try:
    os.fsync(fd)
  except OSError:
    if not folder:
      raise
  finally:
    os.close(fd)


@contextlib.contextmanager
def _atomic_path(path: str) -> Iterator[str]:
  """A temporary file next to ``path``, moved over it if the block succeeds.

  mkstemp creates it with mode 0o600; it gets the mode ``open()`` gives a
  new file (0o666 less the umask, e.g. 0o644) so that results stay readable
  by the group and others as usual.
  """
  folder = os.path.dirname(os.path.abspath(path))
  os.makedirs(folder, exist_ok=True)
  stem, ext = os.path.splitext(os.path.basename(path))
  fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{stem}.",
                             suffix=f"{ext}.tmp")
  os.close(fd)
  try:
    yield tmp
    _fsync(tmp)
    os.chmod(tmp, 0o666 & ~_umask())
    os.replace(tmp, path)
    _fsync(folder, folder=True)
  finally:
    if os.path.exists(tmp):
      os.remove(tmp)


def _json_default(obj: Any) -> Any:
  if isinstance(obj, (np.generic,)):
    return obj.item()
  if hasattr(obj, "tolist"):
    return obj.tolist()
  if hasattr(obj, "to_dict"):
    return obj.to_dict()
  raise TypeError(f"cannot write {type(obj).__name__} to JSON")


def write_bytes(path: str, data: bytes) -> None:
  """Writes ``data`` to ``path`` atomically."""
  with _atomic_path(path) as tmp:
    with open(tmp, "wb") as f:
      f.write(data)


def remove_tree(path: str) -> None:
  """Deletes the folder ``path`` as one step: it is renamed away first, so a
  kill mid-delete leaves ``path`` absent (never half deleted) and a
  ``path + '.deleting'`` folder that the next call for ``path`` removes."""
  trash = path.rstrip(os.sep) + ".deleting"
  shutil.rmtree(trash, ignore_errors=True)
  if os.path.exists(path):
    os.replace(path, trash)
    _fsync(os.path.dirname(os.path.abspath(path)), folder=True)
  shutil.rmtree(trash, ignore_errors=True)


def write_text(path: str, text: str) -> None:
  """Writes ``text`` (UTF-8) to ``path`` atomically."""
  write_bytes(path, text.encode("utf-8"))


def write_json(path: str, obj: Any) -> None:
  """Writes ``obj`` as indented JSON to ``path`` atomically.

  NumPy and JAX scalars and arrays are converted to Python numbers and lists;
  non-finite floats are written as JSON's ``NaN`` / ``Infinity`` tokens, which
  Python's ``json`` reads back.
  """
  with _atomic_path(path) as tmp:
    with open(tmp, "w", encoding="utf-8") as f:
      json.dump(obj, f, indent=2, default=_json_default)
      f.write("\n")


def read_json(path: str, default: Any = None) -> Any:
  """Reads JSON from ``path``, or returns ``default`` when it does not exist.

  Raises:
    ValueError: the file exists but is not UTF-8 JSON (the message names
      ``path``; e.g. a file truncated by a full disk).
  """
  if not os.path.exists(path):
    return default
  with open(path, encoding="utf-8") as f:
    try:
      return json.load(f)
    except ValueError as error:  # JSONDecodeError, UnicodeDecodeError.
      raise ValueError(f"{path} is not valid JSON ({error}); repair it or "
                       "move it aside.") from error


def pyplot() -> Any:
  """``matplotlib.pyplot`` on the non-interactive Agg backend (files only).

  The one place that selects the backend; plotting code calls this instead
  of importing pyplot, so nothing opens a window on a headless machine.
  """
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  return plt


def save_figure(fig: Any, path: str, **kwargs) -> None:
  """Saves a matplotlib figure to ``path`` atomically (format from suffix)."""
  fmt = os.path.splitext(path)[1].lstrip(".") or "png"
  with _atomic_path(path) as tmp:
    fig.savefig(tmp, format=fmt, **kwargs)


def enable_compilation_cache(cache_dir: str | None = None) -> str | None:
  """Turns on JAX's persistent compilation cache for an entry point.

  Args:
    cache_dir: where compiled programs are kept. ``None`` uses the
      environment variable ``REPDEF_JAX_COMPILATION_CACHE`` or
      ``~/.cache/repdef_jax/jax_compilation``; an empty string disables it.

  Returns:
    The folder in use, or None when disabled.
  """
  import jax  # pylint: disable=g-import-not-at-top

  if cache_dir is None:
    cache_dir = os.environ.get(
        "REPDEF_JAX_COMPILATION_CACHE",
        os.path.join(os.path.expanduser("~"), ".cache", "repdef_jax",
                     "jax_compilation"))
  if not cache_dir:
    return None
  try:
    os.makedirs(cache_dir, exist_ok=True)
  except OSError:
    return None
  jax.config.update("jax_compilation_cache_dir", cache_dir)
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.5)
  jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
  return cache_dir
