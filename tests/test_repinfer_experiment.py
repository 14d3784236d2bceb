"""End to end: the representation-leakage experiment (paper Section 3) in
its tiny configuration under ``tfds.testing.mock_data``: both parts over two
seeds, claims rows with verdicts, resume without recomputation."""

import json
import os
import sys

import numpy as np
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
  cells = os.path.join(workdir, "cells")
  inf_cells = []
  for seed in (0, 1):
    with open(os.path.join(cells, f"inference_seed{seed}.json")) as f:
      inf_cells.append(json.load(f))
  for layer in ("fc0", "fc1", "head"):
    c = inf["correlation"][layer]
    # 2 seeds x 1 round x 2 devices x 2 classes.
    assert c["n"] == 8 and -1.0 <= c["mean"] <= 1.0
    # Specificity: own minus other-class correlation, mean of seed means.
    seed_means = [np.mean([dev["correlation"][layer][k] - other
                           for dev in cell["devices"]
                           for k, other in dev["correlation_other"][layer]
                           .items()]) for cell in inf_cells]
    spec = inf["specificity"][layer]
    assert spec["n"] == 8
    np.testing.assert_allclose(spec["mean"], np.mean(seed_means), rtol=1e-6)
  assert set(result["reconstruction"]) == {"one_image", "update"}
  for r in result["reconstruction"].values():
    assert r["images"] == 4  # 2 seeds x 2 images (or 2 clients x 1 image)
    for source in leakage.SOURCES:
      assert r[source]["mse"]["n"] == 4
  verdicts = [c["verdict"] for c in result["claims"]]
  # 3 layers x (correlation, specificity) + 2 rows per reconstruction setting.
  assert len(verdicts) == 10
  assert all(v.split(" ")[0] in ("held", "did", "inconclusive")
             for v in verdicts)
  assert "[0,1]" in result["pixel_space"] and result["seconds"] > 0
  assert {t["title"].split(" ")[0] for t in result["tables"]} == {
      "Inferred", "Specificity:", "Class", "Reconstruction"}
  before = {f: os.path.getmtime(os.path.join(cells, f))
            for f in os.listdir(cells)}
  assert len(before) == 2 + 2 * 2 * 2  # inference + (json, npz) per setting
  leakage.run(config, workdir)
  assert before == {f: os.path.getmtime(os.path.join(cells, f))
                    for f in os.listdir(cells)}
  # Cells record the copy of the training split; another copy is refused.
  path = os.path.join(cells, "update_seed1.json")
  with open(path, encoding="utf-8") as f:
    cell = json.load(f)
  assert cell["data"]["source"] == "tfds"
  cell["data"]["sha256"] = "0" * 16
  with open(path, "w", encoding="utf-8") as f:
    json.dump(cell, f)
  with pytest.raises(ValueError, match="update_seed1.json .*data:"):
    leakage.run(config, workdir)


def test_bad_preset():
  with pytest.raises(ValueError, match="preset"):
    repinfer_cfg.get_config("nope")


def _cell(seed, own, other):
  """An inference cell with one two-class device and layer 'fc0'."""
  dev = {"correlation": {"fc0": {"0": own[0], "1": own[1]}},
         "correlation_other": {"fc0": {"0": other[0], "1": other[1]}},
         "classes_correct": {r: True for r in leakage.RULES}}
  return {"seed": seed, "layers": ["fc0"], "devices": [dev]}


def test_specificity_statistic_on_known_cells():
  """Differences 0.4 / -0.05 (seed 0) and 0.2 / 0.1 (seed 1): seed means
  0.175 and 0.15, mean 0.1625; 3 of 4 samples closer to their own class."""
  cells = [_cell(0, (0.9, 0.8), (0.5, 0.85)), _cell(1, (0.9, 0.9),
                                                    (0.7, 0.8))]
  spec = leakage.summarize_inference(cells)["specificity"]["fc0"]
  np.testing.assert_allclose(spec["mean"], 0.1625)
  assert spec["n"] == 4 and spec["low"] < 0.15 < 0.175 < spec["high"]
  np.testing.assert_allclose(spec["other_mean"], (0.5 + 0.85 + 0.7 + 0.8) / 4)
  assert spec["share_own_higher"]["value"] == 0.75
  # Cells written before the statistic existed: no specificity, no claim row.
  for c in cells:
    for dev in c["devices"]:
      del dev["correlation_other"]
  inference = leakage.summarize_inference(cells)
  assert inference["specificity"] == {}
  assert not any("specific" in c["claim"]
                 for c in leakage.claims(inference, {}))


def test_a_class_blind_correlation_says_so_in_its_verdict():
  """Correlations >= 0.8 on every seed hold; when the same estimates are as
  close to the device's other class (specificity interval around 0), the
  verdict says "class-blind"; when they are closer to their own class, it
  is a plain "held"."""
  blind = [_cell(s, (0.95, 0.93), other) for s, other in enumerate(
      ((0.94, 0.95), (0.96, 0.92), (0.93, 0.94)))]  # Seed means -.005..+.005.
  specific = [_cell(s, (0.95, 0.93), (0.5, 0.6)) for s in (0, 1, 2)]
  for cells, want in ((blind, "held (class-blind"), (specific, "held")):
    rows = leakage.claims(leakage.summarize_inference(cells), {})
    [corr] = [r for r in rows if r["claim"].startswith("Representations")]
    assert corr["verdict"].startswith(want) and (
        want != "held" or corr["verdict"] == "held"), corr["verdict"]
