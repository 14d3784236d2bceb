"""End to end: the paper-reproduction experiments in tiny configurations.

Every run reads ``tfds.testing.mock_data`` (no real data) and checks the
files it writes and that a rerun reuses the finished cells.
"""

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
  sys.path.insert(0, ROOT)

from experiments.configs import adaptive as adaptive_cfg  # noqa: E402
from experiments.configs import certified as certified_cfg  # noqa: E402
from experiments.configs import visual as visual_cfg  # noqa: E402
from repdef_jax.paper import adaptive  # noqa: E402
from repdef_jax.paper import theorem1  # noqa: E402
from repdef_jax import training  # noqa: E402
from repdef_jax.paper import settings  # noqa: E402
from repdef_jax.paper import visual  # noqa: E402

NUM_MOCK = 120


def _run(module, cfg_module, tmp_path, name, **overrides):
  config = cfg_module.get_config("tiny")
  config.update(overrides)
  config.data_dir = str(tmp_path / "data")
  workdir = str(tmp_path / name)
  return module.run(config, workdir), workdir, config


def _rerun_reuses(module, config, workdir):
  cells = os.path.join(workdir, "cells")
  before = {f: os.path.getmtime(os.path.join(cells, f))
            for f in os.listdir(cells)}
  module.run(config, workdir)
  after = {f: os.path.getmtime(os.path.join(cells, f))
           for f in os.listdir(cells)}
  assert before == after


def test_presets_exist():
  for cfg in (visual_cfg, certified_cfg, adaptive_cfg):
    for preset in ("quick", "full", "tiny"):
      assert cfg.get_config(preset) is not None
    with pytest.raises(ValueError, match="preset"):
      cfg.get_config("nope")


def test_federated_setting():
  paper = settings.federated_setting("paper")
  assert (paper.num_clients, paper.classes_per_client, paper.samples_per_class,
          paper.clients_per_round) == (100, 2, 100, 10)
  assert set(paper.keys()) <= set(training.default_config().keys())
  assert settings.federated_setting("tiny", rounds=3).rounds == 3
  with pytest.raises(ValueError, match="setting 'nope'"):
    settings.federated_setting("nope")
  with pytest.raises(ValueError, match="roundz"):
    settings.federated_setting("paper", roundz=3)


def test_visual_end_to_end(mock_env):
  result, workdir, config = _run(visual, visual_cfg, mock_env, "visual")
  assert {"visual.json", "visual.png"} <= set(os.listdir(workdir))
  assert [s["defense"] for s in result["settings"]] == [
      "none", "soteria", "compression"]
  _rerun_reuses(visual, config, workdir)


def test_certified_end_to_end(mock_env):
  result, workdir, _ = _run(theorem1, certified_cfg, mock_env, "certified")
  assert {"certified.json", "certified.png"} <= set(os.listdir(workdir))
  rates = {c["rate"]: c for c in result["rates"]}
  assert rates[0.0]["certified_bound"] == 0.0  # nothing pruned, no bound
  assert rates[50.0]["certified_bound"] > 0.0
  assert 0.0 <= result["fraction_attack_distance_above_bound"]["gs"] <= 1.0


def test_adaptive_end_to_end(mock_env):
  result, workdir, config = _run(adaptive, adaptive_cfg, mock_env, "adaptive")
  assert {"adaptive.json", "adaptive.png", "train"} <= set(
      os.listdir(workdir))
  attacks = {c["attack"] for c in result["cells"]}
  assert attacks == {"gs", "gs_drop", "gs_mask"}
  assert {c["stage"] for c in result["cells"]} == {"init", "trained"}
  assert {c["model"] for c in result["cells"]} == set(config.models)
  assert len(result["cells"]) == len(config.models) * 2 * (
      1 + len(config.variants) * len(config.rates) * 3)
  assert all("verdict" in c for c in result["cells"])
  _rerun_reuses(adaptive, config, workdir)


def _reproduce(tmp_path, parts):
  env = dict(os.environ, REPDEF_JAX_CACHE=str(tmp_path / "cache"),
             JAX_PLATFORMS="cpu")
  env.pop("TFDS_DATA_DIR", None)
  workdir = tmp_path / "repro"
  cmd = [sys.executable, "-m", "experiments.reproduce", "--preset=tiny",
         f"--mock_data={NUM_MOCK}", f"--workdir={workdir}",
         f"--data_dir={tmp_path / 'data'}", f"--parts={','.join(parts)}"]
  out = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True,
                       text=True, timeout=1200)
  assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
  return workdir, out.stdout


def test_reproduce_entry_point_one_part(tmp_path):
  workdir, stdout = _reproduce(tmp_path, ["certified"])
  assert (workdir / "certified" / "certified.json").exists()
  assert (workdir / "certified" / "PART_DONE.json").exists()
  report = (workdir / "REPORT.md").read_text()
  assert "Certified bound" in report and "certified.png" in report
  assert "ETA" in stdout
  # Restart: the finished part is reused, not rerun.
  _, stdout = _reproduce(tmp_path, ["certified"])
  assert "reused" in stdout


@pytest.mark.slow
def test_reproduce_all_parts(tmp_path):
  workdir, _ = _reproduce(tmp_path, ["tradeoff", "visual", "repinfer",
                                     "convergence", "certified", "adaptive"])
  report = (workdir / "REPORT.md").read_text()
  for part in ("tradeoff", "visual", "repinfer", "convergence", "certified",
               "adaptive"):
    assert (workdir / part / "PART_DONE.json").exists(), part
  assert "Not run." not in report
  assert "paper" in report
