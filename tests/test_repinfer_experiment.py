"""End to end: the representation-leakage experiment (paper Section 3) in
its tiny configuration under ``tfds.testing.mock_data``: both parts over two
seeds, claims rows with verdicts, resume without recomputation."""

import json
import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
  sys.path.insert(0, ROOT)

from experiments.configs import repinfer as repinfer_cfg  # noqa: E402
from repdef_jax.paper import leakage  # noqa: E402

NUM_MOCK = 120


def test_repinfer_end_to_end(mock_env):
  config = repinfer_cfg.get_config("tiny")
  config.data_dir = str(mock_env / "data")
  workdir = str(mock_env / "repinfer")
  result = leakage.run(config, workdir)
  assert {"repinfer.json", "repinfer.png", "cells"} <= set(
      os.listdir(workdir))
  with open(os.path.join(workdir, "repinfer.json")) as f:
    saved = json.load(f)
  assert saved["claims"] == result["claims"]
  inf = result["inference"]
  assert inf["seeds"] == [0, 1]
  for layer in ("fc0", "fc1", "head"):
    c = inf["correlation"][layer]
    # 2 seeds x 1 round x 2 devices x 2 classes.
    assert c["n"] == 8 and -1.0 <= c["mean"] <= 1.0
  assert set(result["reconstruction"]) == {"one_image", "update"}
  for r in result["reconstruction"].values():
    assert r["images"] == 4  # 2 seeds x 2 images (or 2 clients x 1 image)
    for source in leakage.SOURCES:
      assert r[source]["mse"]["n"] == 4
  verdicts = [c["verdict"] for c in result["claims"]]
  # 3 layers + 2 rows per reconstruction setting.
  assert len(verdicts) == 7
  assert all(v.split(" ")[0] in ("held", "did", "inconclusive")
             for v in verdicts)
  assert "[0,1]" in result["pixel_space"] and result["seconds"] > 0
  assert {t["title"].split(" ")[0] for t in result["tables"]} == {
      "Inferred", "Class", "Reconstruction"}
  cells = os.path.join(workdir, "cells")
  before = {f: os.path.getmtime(os.path.join(cells, f))
            for f in os.listdir(cells)}
  assert len(before) == 2 + 2 * 2 * 2  # inference + (json, npz) per setting
  leakage.run(config, workdir)
  assert before == {f: os.path.getmtime(os.path.join(cells, f))
                    for f in os.listdir(cells)}


def test_bad_preset():
  with pytest.raises(ValueError, match="preset"):
    repinfer_cfg.get_config("nope")
