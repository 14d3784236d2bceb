"""End-to-end test of experiments/attack.py under tfds.testing.mock_data."""

import json
import os
import sys

import pytest
import tensorflow_datasets as tfds

from repdef_jax import data

_ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
if _ROOT not in sys.path:
  sys.path.insert(0, _ROOT)
from repdef_jax.paper import main_job as attack_main  # pylint: disable=g-import-not-at-top,wrong-import-position


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path, monkeypatch):
  monkeypatch.setenv("REPDEF_JAX_CACHE", str(tmp_path / "cache"))
  data.clear_cache()
  yield
  data.clear_cache()


# GS with 2 iterations keeps the compile short; DLG shares the same driver.
CONFIG = {"dataset": "mnist", "attack": "gs", "defense": "soteria",
          "strength": 60.0, "num_images": 2, "iterations": 2, "seed": 0}
ENTRY_KEYS = {"mse", "mse_clamped", "psnr", "ssim", "seconds", "diverged",
              "label_correct"}


def test_main_job_end_to_end_and_resume(tmp_path):
  workdir = str(tmp_path / "run")
  with tfds.testing.mock_data(num_examples=8):
    results = attack_main.run(CONFIG, workdir, verbose=False)
  with open(os.path.join(workdir, "results.json")) as f:
    on_disk = json.load(f)
  assert on_disk == json.loads(json.dumps(results))
  assert on_disk["pixel_space"] == "[0,1]"
  assert on_disk["config"]["attack"] == "gs"
  assert on_disk["config"]["num_images"] == 2
  assert len(on_disk["images"]) == 2
  for entry in on_disk["images"]:
    assert {"index", "label", "undefended", "defended"} <= set(entry)
    assert ENTRY_KEYS <= set(entry["undefended"])
    assert ENTRY_KEYS | {"pruned_fraction_nominal",
                         "pruned_fraction_effective"} <= set(entry["defended"])
    assert entry["defended"]["pruned_fraction_nominal"] == pytest.approx(
        0.6, abs=0.01)
  assert os.path.getsize(os.path.join(workdir, "reconstructions.png")) > 0

  # Same config: resumes without recomputing (seconds unchanged).
  with tfds.testing.mock_data(num_examples=8):
    again = attack_main.run(CONFIG, workdir, verbose=False)
  assert again["images"] == on_disk["images"]
  # Different config in the same workdir: a clear error.
  with pytest.raises(ValueError, match="another --workdir"):
    with tfds.testing.mock_data(num_examples=8):
      attack_main.run({**CONFIG, "seed": 1}, workdir, verbose=False)


@pytest.mark.parametrize("key,value,match", [
    ("attack", "nope", "valid names: dlg"),
    ("defense", "nope", "valid names: none"),
    ("dataset", "nope", "valid names: mnist"),
    ("model", "nope", "valid names: lenet"),
])
def test_bad_names_list_valid_ones(tmp_path, key, value, match):
  with pytest.raises(ValueError, match=match):
    attack_main.run({**CONFIG, key: value}, str(tmp_path), verbose=False)
