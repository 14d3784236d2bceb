"""Crash-safe writes: a failure mid-write never leaves a half-written file."""

import json
import os

import numpy as np
import pytest

from repdef_jax import storage


def test_json_round_trip_with_numpy(tmp_path):
  path = str(tmp_path / "r.json")
  storage.write_json(path, {"a": np.float32(1.5), "b": np.arange(3), "c": np.inf})
  assert storage.read_json(path) == {"a": 1.5, "b": [0, 1, 2], "c": float("inf")}
  assert storage.read_json(str(tmp_path / "missing.json"), {}) == {}


def test_failed_write_keeps_old_file_and_leaves_no_temp(tmp_path):
  path = str(tmp_path / "r.json")
  storage.write_json(path, {"ok": 1})

  class Boom:
    pass

  with pytest.raises(TypeError):
    storage.write_json(path, {"bad": Boom()})
  assert storage.read_json(path) == {"ok": 1}
  assert os.listdir(tmp_path) == ["r.json"]


def test_jsonl_ignores_torn_last_line(tmp_path):
  path = str(tmp_path / "m.jsonl")
  storage.write_jsonl(path, [{"round": 1}, {"round": 2}])
  with open(path, "a") as f:
    f.write('{"round": 3, "lo')
  assert storage.read_jsonl(path) == [{"round": 1}, {"round": 2}]
  assert storage.read_jsonl(str(tmp_path / "none.jsonl")) == []


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
