"""Crash-safe writes: a failure mid-write never leaves a half-written file."""

import json
import os
import re

import numpy as np
import pytest

from repdef_jax import storage


def test_json_round_trip_with_numpy(tmp_path):
  path = str(tmp_path / "r.json")
  storage.write_json(path, {"a": np.float32(1.5), "b": np.arange(3), "c": np.inf})
  assert storage.read_json(path) == {"a": 1.5, "b": [0, 1, 2], "c": float("inf")}
  # 0-d arrays (not NumPy scalars) keep their Python type.
  storage.write_json(path, {"n": np.array(3), "x": np.array(0.25)})
  got = storage.read_json(path)
  assert got == {"n": 3, "x": 0.25} and isinstance(got["n"], int)
  assert storage.read_json(str(tmp_path / "missing.json"), {}) == {}


@pytest.mark.parametrize("content", [b"{bad", b"", b'{"a": 1', b"\x89PNG"])
def test_corrupt_json_is_a_value_error_naming_the_file(tmp_path, content):
  path = tmp_path / "results.json"
  path.write_bytes(content)
  with pytest.raises(ValueError, match=f"^{re.escape(str(path))} is not "
                     "valid JSON .*; repair it or move it aside.$"):
    storage.read_json(str(path), default={})  # default: a missing file only
  # A missing file still gives the default (None unless given).
  assert storage.read_json(str(tmp_path / "missing.json")) is None
  assert storage.read_json(str(tmp_path / "missing.json"), []) == []


def test_failed_write_keeps_old_file_and_leaves_no_temp(tmp_path):
  path = str(tmp_path / "r.json")
  storage.write_json(path, {"ok": 1})

  class Boom:
    pass

  with pytest.raises(TypeError):
    storage.write_json(path, {"bad": Boom()})
  assert storage.read_json(path) == {"ok": 1}
  assert os.listdir(tmp_path) == ["r.json"]


def test_save_figure_is_atomic(tmp_path):
  plt = storage.pyplot()
  fig, ax = plt.subplots()
  ax.plot([0, 1], [1, 0])
  path = str(tmp_path / "f.png")
  storage.save_figure(fig, path)
  with open(path, "rb") as f:
    assert f.read(8) == b"\x89PNG\r\n\x1a\n"
  plt.close(fig)
  assert json.dumps(sorted(os.listdir(tmp_path))) == '["f.png"]'


def test_atomic_writes_get_the_umask_mode(tmp_path):
  """mkstemp's 0600 is not kept: a result is 0644 under umask 022 (0640
  under 027), as open() would create it, for every kind of write."""
  old = os.umask(0o022)
  try:
    for umask, mode in ((0o022, 0o644), (0o027, 0o640)):
      os.umask(umask)
      paths = [str(tmp_path / f"{umask:o}.{ext}") for ext in
               ("bin", "json", "png")]
      storage.write_bytes(paths[0], b"x")
      storage.write_json(paths[1], {"a": 1})
      plt = storage.pyplot()
      fig, _ = plt.subplots()
      storage.save_figure(fig, paths[2])
      plt.close(fig)
      for path in paths:
        assert os.stat(path).st_mode & 0o777 == mode, path
  finally:
    os.umask(old)


@pytest.mark.parametrize("write", [
    lambda p: storage.write_bytes(p, b"new"),
    lambda p: storage.write_text(p, "new"),
    lambda p: storage.write_json(p, {"new": 1})])
def test_a_write_failing_before_it_lands_keeps_the_old_file(tmp_path,
                                                           monkeypatch, write):
  """Bytes, text and JSON go through a temporary file that is synced
  before the rename: an error there (here fsync) leaves the old content and
  no temporary."""
  path = tmp_path / "r.bin"
  path.write_bytes(b"old")

  def fsync(fd):
    raise OSError("disk full")

  monkeypatch.setattr(storage.os, "fsync", fsync)
  with pytest.raises(OSError, match="disk full"):
    write(str(path))
  assert path.read_bytes() == b"old"
  assert os.listdir(tmp_path) == ["r.bin"]


def test_writes_sync_the_file_then_the_folder(tmp_path, monkeypatch):
  """Every write (a figure too) syncs its temporary file before the rename
  and the folder after it; a figure whose sync fails does not land."""
  if not os.path.isdir("/proc/self/fd"):
    pytest.skip("needs /proc to name a file descriptor")
  synced = []
  real = os.fsync
  monkeypatch.setattr(storage.os, "fsync",
                      lambda fd: synced.append(os.readlink(
                          f"/proc/self/fd/{fd}")) or real(fd))
  plt = storage.pyplot()
  fig = plt.figure()
  storage.save_figure(fig, str(tmp_path / "f.png"))
  storage.write_json(str(tmp_path / "r.json"), {"a": 1})
  assert [os.path.basename(p).endswith(".tmp") for p in synced] == [
      True, False] * 2
  assert synced[1] == synced[3] == str(tmp_path)

  def fail(fd):
    raise OSError("disk full")

  monkeypatch.setattr(storage.os, "fsync", fail)
  old = (tmp_path / "f.png").read_bytes()
  with pytest.raises(OSError, match="disk full"):
    storage.save_figure(fig, str(tmp_path / "f.png"))
  plt.close(fig)
  assert (tmp_path / "f.png").read_bytes() == old
  assert sorted(os.listdir(tmp_path)) == ["f.png", "r.json"]


def test_compilation_cache_folder_argument_environment_and_off(
    tmp_path, monkeypatch):
  """The argument wins, then $REPDEF_JAX_COMPILATION_CACHE, then a folder
  under ~/.cache; '' (argument or environment) or an uncreatable folder
  turns the cache off without touching JAX's settings."""
  import jax  # pylint: disable=g-import-not-at-top
  updates = {}
  monkeypatch.setattr(jax.config, "update",
                      lambda name, value: updates.__setitem__(name, value))
  env_dir = str(tmp_path / "env")
  monkeypatch.setenv("REPDEF_JAX_COMPILATION_CACHE", env_dir)
  assert storage.enable_compilation_cache() == env_dir
  assert os.path.isdir(env_dir)
  assert updates["jax_compilation_cache_dir"] == env_dir
  arg_dir = str(tmp_path / "arg")
  assert storage.enable_compilation_cache(arg_dir) == arg_dir
  assert updates["jax_compilation_cache_dir"] == arg_dir
  monkeypatch.delenv("REPDEF_JAX_COMPILATION_CACHE")
  monkeypatch.setenv("HOME", str(tmp_path / "home"))
  home_dir = str(tmp_path / "home" / ".cache" / "repdef_jax" /
                 "jax_compilation")
  assert storage.enable_compilation_cache() == home_dir
  assert updates["jax_compilation_cache_dir"] == home_dir
  updates.clear()
  assert storage.enable_compilation_cache("") is None
  monkeypatch.setenv("REPDEF_JAX_COMPILATION_CACHE", "")
  assert storage.enable_compilation_cache() is None
  blocker = tmp_path / "file"
  blocker.write_text("x")
  assert storage.enable_compilation_cache(str(blocker / "sub")) is None
  assert not updates


def test_remove_tree_renames_first_and_clears_a_killed_removal(tmp_path):
  """The folder disappears in one rename; what a killed removal left (the
  renamed folder) is deleted by the next call, and absence is no error."""
  run = tmp_path / "run"
  (run / "checkpoints" / "7").mkdir(parents=True)
  (run / "config.json").write_text("{}")
  (tmp_path / "run.deleting" / "old").mkdir(parents=True)  # A killed one.
  storage.remove_tree(str(run))
  assert sorted(os.listdir(tmp_path)) == []
  storage.remove_tree(str(run))  # Nothing there: no error.
