"""End to end: the paper-reproduction experiments in tiny configurations.

Every run reads ``tfds.testing.mock_data`` (no real data) and checks the
files it writes and that a rerun reuses the finished cells.
"""

import json
import os
import shutil
import subprocess
import sys
import time

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
  sys.path.insert(0, ROOT)

from experiments import config_entry  # noqa: E402
from experiments.configs import adaptive as adaptive_cfg  # noqa: E402
from experiments.configs import certified as certified_cfg  # noqa: E402
from experiments.configs import convergence as convergence_cfg  # noqa: E402
from experiments.configs import repinfer as repinfer_cfg  # noqa: E402
from experiments.configs import tradeoff as tradeoff_cfg  # noqa: E402
from experiments.configs import visual as visual_cfg  # noqa: E402
from repdef_jax.paper import adaptive  # noqa: E402
from repdef_jax.paper import convergence  # noqa: E402
from repdef_jax.paper import leakage  # noqa: E402
from repdef_jax.paper import report  # noqa: E402
from repdef_jax.paper import reproduce  # noqa: E402
from repdef_jax.paper import theorem1  # noqa: E402
from repdef_jax.paper import tradeoff  # noqa: E402
from repdef_jax import training  # noqa: E402
from repdef_jax.paper import settings  # noqa: E402
from repdef_jax.paper import sweep  # noqa: E402
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


def _refuses_other_copy(module, config, workdir):
  """Every cell records which copy of the data it used; a resumed run that
  loads another copy (here: a cell claims other labels) refuses it."""
  cells = os.path.join(workdir, "cells")
  names = sorted(f for f in os.listdir(cells) if f.endswith(".json"))
  for name in names:
    with open(os.path.join(cells, name), encoding="utf-8") as f:
      assert json.load(f)["data"]["source"].startswith("tfds"), name
  path = os.path.join(cells, names[0])
  with open(path, encoding="utf-8") as f:
    cell = json.load(f)
  cell["data"]["sha256"] = "0" * 16
  with open(path, "w", encoding="utf-8") as f:
    json.dump(cell, f)
  with pytest.raises(ValueError, match="other settings .*data:"):
    module.run(config, workdir)


def test_presets_exist():
  for cfg in (visual_cfg, certified_cfg, adaptive_cfg, convergence_cfg,
              repinfer_cfg):
    for preset in ("quick", "medium", "full", "tiny"):
      assert cfg.get_config(preset) is not None
    with pytest.raises(ValueError, match="preset"):
      cfg.get_config("nope")
  # medium: >= 3 seeds everywhere (the protocol).
  for cfg in (visual_cfg, certified_cfg, adaptive_cfg, convergence_cfg,
              repinfer_cfg):
    assert len(cfg.get_config("medium").seeds) >= 3


def test_presets_keep_the_protocol_and_the_paper_scale():
  """medium: >= 3 seeds and >= 8 images per point (pooled over seeds; the
  trade-off: 8 per seed); full: the paper's split, rounds and ConvNet64."""
  for cfg in (visual_cfg, certified_cfg, adaptive_cfg, tradeoff_cfg):
    medium = cfg.get_config("medium")
    assert len(medium.seeds) >= 3, cfg.__name__
    assert len(medium.seeds) * medium.num_images >= 8, cfg.__name__
  for preset in ("medium", "full"):
    assert tradeoff_cfg.get_config(preset).num_images >= 8
  paper_split = (100, 2, 100, 10)
  full = tradeoff_cfg.get_config("full")
  assert {full.panels[p].dataset for p in full.panels} == {"mnist",
                                                           "cifar10"}
  for name in full.panels:
    train = sweep.panel_config(full, name)
    assert (train.num_clients, train.classes_per_client,
            train.samples_per_class, train.clients_per_round) == paper_split
    assert train.rounds == {"mnist": 200, "cifar10": 1000}[train.dataset], (
        name)
    if train.model.startswith("convnet"):
      assert train.model == "convnet64", name
      assert train.model_kwargs.to_dict().get("width", 64) == 64, name
  conv = convergence_cfg.get_config("full").base
  assert (conv.num_clients, conv.classes_per_client, conv.samples_per_class,
          conv.clients_per_round, conv.rounds) == (*paper_split, 200)
  adaptive_full = adaptive_cfg.get_config("full")
  for panel in adaptive_full.panels.values():
    if panel.model.startswith("convnet"):
      assert panel.get("model_kwargs", {}).get("width", 64) == 64


_PERCENT = r"percent must be a number in \[0, 100\], got 150"


@pytest.mark.parametrize("module,cfg,overrides,match", [
    (visual, visual_cfg, {"seeds": ()},
     r"seeds must be a non-empty sequence of distinct integers, e\.g\. "
     r"\(0, 1, 2\); got \(\)"),
    (visual, visual_cfg, {"num_images": 0}, "num_images must be >= 1"),
    (visual, visual_cfg, {"image_pool": -1}, "image_pool must be an int >= "),
    (adaptive, adaptive_cfg, {"image_pool": 0}, "image_pool must be an int"),
    (visual, visual_cfg, {"attacks": ("gs", "gz")},
     "attacks: unknown attack 'gz'; valid names: dlg, idlg, gs"),
    (visual, visual_cfg, {"settings": (("soteria", 150.0),)},
     r"settings \(soteria\): " + _PERCENT),
    (theorem1, certified_cfg, {"seeds": (0, 1.5)}, "seeds must be"),
    (theorem1, certified_cfg, {"rates": (0.0, 150.0)},
     r"rates \(soteria\): " + _PERCENT),
    (adaptive, adaptive_cfg, {"num_images": 0}, "num_images must be >= 1"),
    (leakage, repinfer_cfg, {"seeds": ()}, "seeds must be"),
    (leakage, repinfer_cfg, {"rounds": -1}, "rounds must be an int >= 1"),
    (leakage, repinfer_cfg, {"recon_images": -1},
     r"recon_images must be an int >= 0 \(0 skips that setting\), got -1"),
    (leakage, repinfer_cfg, {"update_images": 0},
     r"update_images must be an int >= 1, got 0"),
    (leakage, repinfer_cfg, {"recon_steps": 0},
     r"recon_steps must be an int >= 1, got 0"),
    (theorem1, certified_cfg, {"success_ssim": 5.0},
     r"success_ssim must be an SSIM level in \(-1, 1\]; got 5\.0"),
    (tradeoff, tradeoff_cfg, {"dry_run": True,
                              "update_attack.stages": ("first", "bogus")},
     r"update_attack\.stages must be among first, mid, final; got 'bogus'"),
    (tradeoff, tradeoff_cfg, {"dry_run": True, "accuracy_window": 0},
     r"accuracy_window must be an int >= 1"),
    (convergence, convergence_cfg, {"seeds": ()}, "seeds must be"),
    (convergence, convergence_cfg, {"seeds": (0, 0)},
     "seeds must be a non-empty sequence of distinct integers"),
    (convergence, convergence_cfg, {"max_settings": -1},
     r"max_settings must be an int >= 0 \(0: every setting\), got -1"),
    # The dry run is checked too (it used to accept all of these).
    (tradeoff, tradeoff_cfg, {"dry_run": True, "num_images": 0},
     "num_images must be >= 1"),
    (tradeoff, tradeoff_cfg, {"dry_run": True, "seeds": ()}, "seeds must be"),
    (tradeoff, tradeoff_cfg, {"dry_run": True, "seeds": (0, 0)},
     "seeds must be a non-empty sequence of distinct integers"),
    (tradeoff, tradeoff_cfg, {"dry_run": True,
                              "attack_budgets.gs.iterations": 0},
     r"attack_budgets\.gs\.iterations must be an integer >= 1; got 0"),
    (tradeoff, tradeoff_cfg, {"dry_run": True, "defenses.soteria": (150.0,)},
     r"defenses \(soteria\): " + _PERCENT),
    (tradeoff, tradeoff_cfg,
     {"dry_run": True, "panels.logreg_mnist.attacks": ("gs", "gz")},
     "panels.logreg_mnist.attacks: unknown attack 'gz'; valid names: dlg"),
], ids=lambda v: getattr(v, "__name__", None))
def test_parts_check_their_config_before_any_work(tmp_path, module, cfg,
                                                  overrides, match):
  config = cfg.get_config("tiny")
  for path, value in overrides.items():
    *parents, last = path.split(".")
    holder = config
    for name in parents:
      holder = holder[name]
    holder[last] = value
  workdir = tmp_path / "run"
  with pytest.raises(ValueError, match=match):
    module.run(config, str(workdir))
  assert not workdir.exists()  # nothing ran


def test_every_preset_passes_the_shared_check():
  from repdef_jax.paper import harness  # pylint: disable=g-import-not-at-top
  for cfg in (visual_cfg, certified_cfg, adaptive_cfg, repinfer_cfg,
              tradeoff_cfg, convergence_cfg):
    for preset in ("quick", "medium", "full", "tiny"):
      harness.check_part_config(cfg.get_config(preset))


def test_config_flag_error_names_the_field_or_the_preset():
  def error(name, *args):
    default = os.path.join(config_entry.CONFIG_DIR, f"{name}.py")
    return config_entry.config_flag_error(["prog", *args], default)

  attack = os.path.join(config_entry.CONFIG_DIR, "attack.py")
  assert error("attack", "--config.num_image=5") == (
      f"--config.num_image: no such field in the config ({attack}); did you "
      "mean 'num_images' instead of 'num_image'?")
  assert "did you mean 'rounds' instead of 'round'" in error(
      "fedavg", "--config.round=5")
  assert "did you mean 'iterations'" in error(
      "visual", "--config.attack_budgets.gs.iteration=3")
  assert error("visual", "--config.zzz=1").endswith(
      "its fields: allow_synthetic, attack_budgets, attacks, "
      "claim_compression_rate, claim_soteria_rate, data_dir, dataset, "
      "give_labels, image_pool, model, model_init, model_kwargs, num_images, "
      "seeds, settings, success_ssim, unrecognisable.")
  preset = os.path.join(config_entry.CONFIG_DIR, "tradeoff.py:foo")
  for args in ([f"--config={preset}"], ["--config", preset]):
    assert error("tradeoff", *args) == (
        f"--config={preset}: unknown preset 'foo'; use 'quick', 'medium', "
        "'full' or 'tiny'.")
  # An override checked against the config --config names, not the default.
  tiny = os.path.join(config_entry.CONFIG_DIR, "tradeoff.py:tiny")
  assert "did you mean 'num_images'" in error(
      "tradeoff", f"--config={tiny}", "--config.num_image=0")
  assert "cannot read the config file" in error("attack", "--config=nope.py")
  fedavg = os.path.join(config_entry.CONFIG_DIR, "fedavg.py")
  assert error("fedavg", f"--config={fedavg}:quick") == (
      f"--config={fedavg}:quick: this config has no presets (use "
      f"--config={fedavg} and --config.FIELD=... overrides).")
  repro = os.path.join(config_entry.CONFIG_DIR, "reproduce.py")
  assert error("reproduce", f"--config={repro}:medium").endswith(
      "this config takes its preset as a field: use --preset=medium (or "
      "--config.preset=...).")
  # Fine: known fields, presets, other flags, nothing to check.
  assert error("attack", "--config.num_images=5", "--noconfig.seed") is None
  assert error("tradeoff", f"--config={tiny}", "--config.dry_run=True",
               "--config.panels.logreg_mnist.attacks=('gs',)") is None
  assert error("attack", "--workdir=/tmp/x", "--", "--config.nope=1") is None
  assert error("attack") is None


def test_config_flag_error_checks_negated_overrides():
  attack = os.path.join(config_entry.CONFIG_DIR, "attack.py")
  assert "--config.zzz: no such field" in config_entry.config_flag_error(
      ["prog", "--noconfig.zzz"], attack)


_SHORTCUT_MAIN = """
from absl import app
from experiments import config_entry
def run(config, workdir):
  print("VALUES", config.preset, config.mock_data, config.report_only)
main = config_entry.make_main(
    "reproduce", run, lambda result, workdir: None,
    shortcuts={"preset": ("quick", "tiny"), "mock_data": None,
               "report_only": None})
app.run(main)
"""


def test_shortcut_flags_override_the_config_even_when_false(tmp_path):
  """--mock_data=0 / --noreport_only win over --config.FIELD (and 0 / False
  are values, not 'not given')."""
  env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=ROOT)
  out = subprocess.run(
      [sys.executable, "-c", _SHORTCUT_MAIN, f"--workdir={tmp_path}",
       "--config.mock_data=5", "--mock_data=0", "--config.report_only=True",
       "--noreport_only", "--preset=tiny"],
      cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
  assert out.returncode == 0, out.stderr[-3000:]
  assert "VALUES tiny 0 False" in out.stdout


def test_helper_commands_refuse_bad_arguments_before_any_work(tmp_path):
  """mock_run without a positive count prints its usage (it ran a real
  download with -5); the benchmark refuses an --out_dir that is a file
  before measuring."""
  env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=ROOT)
  for args in ([], ["abc", "experiments.tradeoff"],
               ["-5", "experiments.repinfer"]):
    out = subprocess.run(
        [sys.executable, "-m", "experiments.mock_run", *args], cwd=ROOT,
        env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode != 0
    assert "usage: python -m experiments.mock_run NUM_EXAMPLES" in out.stderr
  afile = tmp_path / "afile"
  afile.write_text("")
  out = subprocess.run(
      [sys.executable, "-m", "experiments.benchmark", "--quick",
       "--parts=gradients", f"--out_dir={afile}"], cwd=ROOT, env=env,
      capture_output=True, text=True, timeout=300)
  assert out.returncode != 0
  assert f"--out_dir={afile} is a file" in out.stderr, out.stderr[-2000:]


@pytest.mark.skipif(not sys.platform.startswith("linux"),
                    reason="PR_SET_PDEATHSIG is Linux's")
def test_a_killed_reproduce_takes_its_part_with_it(tmp_path):
  """reproduce starts each part with die_with_parent: SIGKILL of reproduce
  ends the part too, so a rerun never races a leftover run in its folder."""
  import signal  # pylint: disable=g-import-not-at-top
  pid_file = tmp_path / "child.pid"
  parent = subprocess.Popen([sys.executable, "-c", (
      "import subprocess, sys\n"
      "from repdef_jax.paper import reproduce\n"
      "subprocess.call([sys.executable, '-c', 'import os, time; "
      f"open(r\"{pid_file}\", \"w\").write(str(os.getpid())); "
      "time.sleep(120)'], preexec_fn=reproduce.die_with_parent)\n")],
      cwd=ROOT, env=dict(os.environ, PYTHONPATH=ROOT))
  deadline = time.time() + 60
  while not (pid_file.exists() and pid_file.read_text()):
    assert time.time() < deadline and parent.poll() is None
    time.sleep(0.1)
  child = int(pid_file.read_text())
  parent.send_signal(signal.SIGKILL)
  parent.wait()

  def running():  # A zombie (state Z) has ended.
    try:
      with open(f"/proc/{child}/stat", encoding="utf-8") as f:
        return f.read().rsplit(")", 1)[-1].split()[0] != "Z"
    except FileNotFoundError:
      return False

  deadline = time.time() + 10
  while running() and time.time() < deadline:
    time.sleep(0.1)
  assert not running()


def _claims_ok(result):
  """Every part returns claims rows with a verdict and its wall time."""
  assert result["claims"] and "seconds" in result
  for row in result["claims"]:
    assert set(row) >= {"claim", "paper", "statistic", "value", "low", "high",
                        "verdict", "rule"}
    assert row["verdict"].split(" ")[0] in (
        "held", "did", "inconclusive", "reported"), row["verdict"]
  assert "[0,1]" in result["pixel_space"]


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
  assert [(s["defense"], s["images"]) for s in result["settings"]] == [
      ("none", 4), ("soteria", 4), ("compression", 4)]  # 2 seeds x 2 images
  _claims_ok(result)
  # Soteria against GS alone and against the best of GS / gs_mask; then
  # compression.
  assert [c["claim"].split(" (")[1].split(";")[0] for c in
          result["claims"]] == ["gs alone, the paper's attack",
                                "best of gs/gs_mask", "best of gs/gs_mask"]
  soteria = result["settings"][1]["per_attack"]["best"]["ssim"]
  assert soteria["groups"] == 2  # the interval is over the 2 seeds' means
  # 2 seeds x 3 settings: a cell and its reconstructions each.
  assert len(os.listdir(os.path.join(workdir, "cells"))) == 12
  _rerun_reuses(visual, config, workdir)


def test_certified_end_to_end(mock_env, monkeypatch):
  # Every bound of a (panel, seed) reuses its images' ||J||_2, computed
  # once, instead of a Jacobian and SVD per rate and attack.
  sigmas = []
  for name in ("_certified_bound", "_empirical_bound"):
    fn = getattr(theorem1, name)
    monkeypatch.setattr(theorem1, name, lambda *a, fn=fn, **k: (
        sigmas.append(k.get("sigma")), fn(*a, **k))[1])
  result, workdir, config = _run(theorem1, certified_cfg, mock_env,
                                 "certified")
  # 2 seeds x 2 rates x (1 certified + 2 attacks' empirical) bounds.
  assert len(sigmas) == 12 and all(s is not None for s in sigmas)
  assert len({id(s) for s in sigmas}) == 2  # one per seed
  assert {"certified.json", "certified.png"} <= set(os.listdir(workdir))
  panel = result["panels"]["logreg_mnist"]
  rates = {r["rate"]: r for r in panel["rates"]}
  assert rates[0.0]["certified_bound"]["mean"] == 0.0  # nothing pruned
  assert rates[50.0]["certified_bound"]["mean"] > 0.0
  assert rates[50.0]["certified_bound"]["n"] == 4  # 2 seeds x 2 images
  _claims_ok(result)
  assert {r["claim"] for r in result["claims"]} == {
      "Theorem 1 bound holds (logreg_mnist, gs)",
      "Theorem 1 bound holds (logreg_mnist, gs_mask)"}
  _rerun_reuses(theorem1, config, workdir)


def test_adaptive_end_to_end(mock_env):
  result, workdir, config = _run(adaptive, adaptive_cfg, mock_env, "adaptive")
  assert {"adaptive.json", "adaptive.png", "train"} <= set(
      os.listdir(workdir))
  rows = result["rows"]
  # Per (panel, stage): undefended + 2 (variant, rate), pooled over seeds.
  assert len(rows) == len(config.panels) * 2 * 3
  assert {r["stage"] for r in rows} == {"init", "trained"}
  for r in rows:
    assert set(r["attacks"]) == {"gs", "gs_drop", "gs_mask", "best"}
    assert r["images"] == 4  # 2 seeds x 2 images
  _claims_ok(result)
  assert result["claims"][0]["verdict"] == "reported"
  # 2 seeds x 2 stages x 3 cells.
  assert len(os.listdir(os.path.join(workdir, "cells"))) == 12
  _rerun_reuses(adaptive, config, workdir)


def test_convergence_end_to_end(mock_env):
  result, workdir, config = _run(convergence, convergence_cfg, mock_env,
                                 "convergence")
  assert {"curves.json", "loss_vs_round.png", "accuracy_vs_round.png"} <= set(
      os.listdir(workdir))
  _claims_ok(result)
  names = [s["name"] for s in result["settings"]]
  assert names == ["I5_K10_none", "I5_K10_soteria10", "I5_K10_mlp_none"]
  for s in result["settings"]:
    assert s["seeds"] == [0, 1]
    assert len(s["global_loss_mean"]) == config.base.rounds
    assert len(s["test_accuracy_mean"]) == config.base.rounds
    if "overrides" not in s:
      # logreg starts at zero weights: F(w_0) = ln 10 for every seed.
      assert s["initial_loss"]["mean"] == pytest.approx(np.log(10), rel=1e-5)
  # The extra setting trained its own model (random init: F(w_0) != ln 10).
  mlp_run = os.path.join(workdir, "runs", "I5_K10_mlp_none", "seed0")
  with open(os.path.join(mlp_run, "config.json"), encoding="utf-8") as f:
    assert json.load(f)["model"] == "mlp"
  assert result["settings"][2]["initial_loss"]["mean"] != pytest.approx(
      np.log(10), rel=1e-3)
  _rerun_reuses(convergence, config, workdir)
  _refuses_other_copy(convergence, config, workdir)


def _reproduce(tmp_path, parts, *extra):
  env = dict(os.environ, REPDEF_JAX_CACHE=str(tmp_path / "cache"),
             JAX_PLATFORMS="cpu")
  env.pop("TFDS_DATA_DIR", None)
  workdir = tmp_path / "repro"
  cmd = [sys.executable, "-m", "experiments.reproduce", "--preset=tiny",
         f"--mock_data={NUM_MOCK}", f"--workdir={workdir}",
         f"--data_dir={tmp_path / 'data'}", f"--parts={','.join(parts)}",
         *extra]
  out = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True,
                       text=True, timeout=1200)
  assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
  return workdir, out.stdout


def test_reproduce_entry_point_one_part(tmp_path):
  # The cheapest part, with the seeds overridden.
  workdir, stdout = _reproduce(tmp_path, ["convergence"], "--seeds=7")
  with open(workdir / "convergence" / "curves.json", encoding="utf-8") as f:
    assert json.load(f)["config"]["seeds"] == [7]
  assert (workdir / "convergence" / "PART_DONE.json").exists()
  text = (workdir / "REPORT.md").read_text()
  assert "Convergence of defended FedAvg" in text
  assert "loss_vs_round.png" in text
  assert "ETA" in stdout
  # Restart: the finished part is reused, not rerun; the run is compared with
  # a reference (here its own claims: the comparison's wiring, not its rule,
  # which test_replication covers).
  _, stdout = _reproduce(tmp_path, ["convergence"], "--seeds=7",
                         f"--compare_with={workdir}")
  assert "reused" in stdout
  with open(workdir / "replication.json", encoding="utf-8") as f:
    counts = json.load(f)["counts"]
  claims = report.all_claims(report.collect(str(workdir)))
  assert sum(counts.values()) == len(claims) > 0
  assert "[reproduce] replication:" in stdout
  assert "seeds [7] (reference" in (workdir / "REPLICATION.md").read_text()


def test_reproduce_reruns_a_part_whose_config_changed(tmp_path, monkeypatch):
  root = tmp_path / "root"
  config = root / "experiments" / "configs" / "convergence.py"
  config.parent.mkdir(parents=True)
  text = ("import ml_collections\nRATE = {}\n\n\ndef get_config(preset):\n"
          "  return ml_collections.ConfigDict({{'rate': RATE}})\n")
  config.write_text(text.format(1))
  monkeypatch.setattr(reproduce, "ROOT", str(root))
  calls = []
  monkeypatch.setattr(reproduce.subprocess, "call",
                      lambda cmd, cwd, **kw: calls.append(cmd) or 0)
  workdir = str(tmp_path / "work")
  for _ in range(2):  # The second run finds the part done.
    runs = reproduce.run_parts("tiny", workdir, None, ["convergence"])
  assert len(calls) == 1 and runs["convergence"]["status"] == "done (reused)"
  config.write_text(text.format(1) + "# A comment: the same preset.\n")
  runs = reproduce.run_parts("tiny", workdir, None, ["convergence"])
  assert len(calls) == 1 and runs["convergence"]["status"] == "done (reused)"
  config.write_text(text.format(2))
  runs = reproduce.run_parts("tiny", workdir, None, ["convergence"])
  assert len(calls) == 2 and runs["convergence"]["status"] == "done"


def test_part_command_passes_data_dir_mock_data_and_seeds():
  config = "--config=experiments/configs/visual.py:tiny"
  assert reproduce.part_command("visual", "tiny", "w", "/d", mock_data=5,
                                seeds=(1,)) == [
      sys.executable, "-m", "experiments.mock_run", "5", "experiments.visual",
      "--workdir=w", config, "--data_dir=/d", "--config.seeds=(1,)"]
  assert reproduce.part_command("visual", "tiny", "w", None) == [
      sys.executable, "-m", "experiments.visual", "--workdir=w", config]


def _fake_parts(tmp_path, monkeypatch, returncode=0):
  """Config files of every part under a fake root; parts' runs are stubbed.

  Returns:
    The list that receives each stubbed run's argv, and a setter of the
    return code of the next runs.
  """
  root = tmp_path / "root"
  configs = root / "experiments" / "configs"
  configs.mkdir(parents=True)
  # Each config resolves a default it reads from elsewhere (defaults.json
  # stands for sweep.default_config / settings.py).
  (configs / "defaults.json").write_text('{"lr": 0.1}')
  for part in reproduce.PART_ORDER:
    (configs / f"{part}.py").write_text(
        "import json, os\nimport ml_collections\n"
        f"PART = {part!r}\n\n\ndef get_config(preset):\n"
        "  with open(os.path.join(os.path.dirname(__file__), "
        "'defaults.json')) as f:\n"
        "    return ml_collections.ConfigDict({'part': PART, "
        "'preset': preset, **json.load(f)})\n")
  monkeypatch.setattr(reproduce, "ROOT", str(root))
  calls, code = [], [returncode]
  monkeypatch.setattr(reproduce.subprocess, "call",
                      lambda cmd, cwd, **kw: calls.append(cmd) or code[0])
  return calls, lambda rc: code.__setitem__(0, rc)


def test_reproduce_reruns_a_part_whose_command_changed(tmp_path,
                                                       monkeypatch):
  calls, _ = _fake_parts(tmp_path, monkeypatch)
  workdir = str(tmp_path / "work")
  for _ in range(2):  # The same seeds: the second run reuses the part.
    runs = reproduce.run_parts("tiny", workdir, None, ["visual"], seeds=(7,))
  assert len(calls) == 1 and runs["visual"]["status"] == "done (reused)"
  # Other seeds (same config file): the part runs again with them.
  runs = reproduce.run_parts("tiny", workdir, None, ["visual"], seeds=(8,))
  assert len(calls) == 2 and runs["visual"]["status"] == "done"
  assert calls[-1][-1] == "--config.seeds=(8,)"
  with open(os.path.join(workdir, "visual", "PART_DONE.json"),
            encoding="utf-8") as f:
    assert json.load(f)["command"].endswith(" '--config.seeds=(8,)'")


def test_reproduce_reruns_a_part_whose_resolved_preset_changed(
    tmp_path, monkeypatch):
  """The marker holds a digest of ``get_config(preset)``, not of the config
  file: a changed default the file imports reruns the part; a config that
  cannot be loaded is never taken as finished."""
  calls, _ = _fake_parts(tmp_path, monkeypatch)
  workdir = str(tmp_path / "work")
  configs = tmp_path / "root" / "experiments" / "configs"
  digest = reproduce.config_digest("visual", "tiny")
  assert digest and digest != reproduce.config_digest("visual", "quick")
  for _ in range(2):
    runs = reproduce.run_parts("tiny", workdir, None, ["visual"])
  assert len(calls) == 1 and runs["visual"]["config_digest"] == digest
  (configs / "defaults.json").write_text('{"lr": 0.2}')  # File unchanged.
  runs = reproduce.run_parts("tiny", workdir, None, ["visual"])
  assert len(calls) == 2 and runs["visual"]["status"] == "done"
  assert runs["visual"]["config_digest"] != digest
  (configs / "defaults.json").write_text("not json")
  assert reproduce.config_digest("visual", "tiny") is None
  for _ in range(2):
    runs = reproduce.run_parts("tiny", workdir, None, ["visual"])
  assert len(calls) == 4


def test_reproduce_reruns_a_part_finished_under_another_key_scheme(
    tmp_path, monkeypatch):
  """A part finished by an older key scheme (its marker records another or
  none) is run again, not published as if it were today's draw."""
  from repdef_jax.paper import harness  # pylint: disable=g-import-not-at-top
  calls, _ = _fake_parts(tmp_path, monkeypatch)
  workdir = str(tmp_path / "work")
  reproduce.run_parts("tiny", workdir, None, ["visual"])
  monkeypatch.setattr(harness, "KEY_SCHEME", harness.KEY_SCHEME + 1)
  runs = reproduce.run_parts("tiny", workdir, None, ["visual"])
  assert len(calls) == 2 and runs["visual"]["status"] == "done"
  assert runs["visual"]["key_scheme"] == harness.KEY_SCHEME


def test_reproduce_failed_part_is_recorded_and_rerun(tmp_path, monkeypatch):
  calls, set_rc = _fake_parts(tmp_path, monkeypatch, returncode=3)
  workdir = str(tmp_path / "work")
  runs = reproduce.run_parts("tiny", workdir, None, ["visual", "certified"])
  assert len(calls) == 2  # A failed part does not stop the others.
  assert [runs[p]["status"] for p in ("visual", "certified")] == [
      "FAILED (exit 3)"] * 2
  assert not os.path.exists(os.path.join(workdir, "visual", "PART_DONE.json"))
  set_rc(0)
  runs = reproduce.run_parts("tiny", workdir, None, ["visual"])
  assert len(calls) == 3 and runs["visual"]["status"] == "done"
  assert os.path.exists(os.path.join(workdir, "visual", "PART_DONE.json"))
  # A rerun (other seeds) that fails leaves no record of the earlier run.
  set_rc(2)
  runs = reproduce.run_parts("tiny", workdir, None, ["visual"], seeds=(9,))
  assert len(calls) == 4 and runs["visual"]["status"] == "FAILED (exit 2)"
  assert not os.path.exists(os.path.join(workdir, "visual", "PART_DONE.json"))


def test_reproduce_runs_parts_in_paper_order_and_keeps_records(
    tmp_path, monkeypatch, capsys):
  calls, _ = _fake_parts(tmp_path, monkeypatch)
  workdir = str(tmp_path / "work")
  reproduce.run_parts("quick", workdir, None,
                      ["adaptive", "convergence", "tradeoff"])
  # sys.executable -m experiments.<part>: the paper's order, not the given.
  assert [c[2] for c in calls] == ["experiments.tradeoff",
                                   "experiments.convergence",
                                   "experiments.adaptive"]
  # ETA: the measured seconds of this part and of the ones after it.
  quick = reproduce.MEASURED_SECONDS["quick"]
  etas = [int(line.split("ETA ~")[1].split("s")[0])
          for line in capsys.readouterr().out.splitlines() if "ETA ~" in line]
  assert etas == [quick["tradeoff"] + quick["convergence"] + quick["adaptive"],
                  quick["convergence"] + quick["adaptive"], quick["adaptive"]]
  # A later run of another part keeps the earlier parts' records.
  runs = reproduce.run_parts("quick", workdir, None, ["visual"])
  assert set(runs) == {"tradeoff", "convergence", "adaptive", "visual"}
  with open(os.path.join(workdir, "reproduce.json"), encoding="utf-8") as f:
    assert set(json.load(f)) == set(runs)


def _reproduce_config(**overrides):
  from experiments.configs import reproduce as reproduce_cfg  # pylint: disable=g-import-not-at-top
  config = reproduce_cfg.get_config()
  config.update(dict(preset="tiny", report_only=True, parts=""), **overrides)
  return config


def test_reproduce_run_lists_failed_parts_and_summary_exits(tmp_path,
                                                             capsys):
  workdir = tmp_path / "work"
  workdir.mkdir()
  (workdir / "reproduce.json").write_text(json.dumps({
      "visual": {"status": "FAILED (exit 2)", "seconds": 5.0},
      "convergence": {"status": "done (reused)", "seconds": 7.0}}))
  result = reproduce.run(_reproduce_config(), str(workdir))
  assert result["failed"] == ["visual"]
  assert os.path.exists(result["report"])
  with pytest.raises(SystemExit) as exit_info:
    reproduce.summary(result, str(workdir))
  assert exit_info.value.code == 1
  out = capsys.readouterr().out
  assert "wall time 12s" in out and "FAILED parts: visual" in out
  reproduce.summary({**result, "failed": []}, str(workdir))  # No exit.


def test_reproduce_run_checks_parts_and_publish(tmp_path, monkeypatch):
  with pytest.raises(ValueError, match=r"unknown parts \['nope'\]"):
    reproduce.run(_reproduce_config(parts="tradeoff,nope"),
                  str(tmp_path / "a"))
  with pytest.raises(ValueError, match=r"mock_data must be an int >= 0"):
    reproduce.run(_reproduce_config(mock_data=-5), str(tmp_path / "a"))
  # A subset of the parts is fine.
  reproduce.run(_reproduce_config(parts="convergence"), str(tmp_path / "b"))
  # The same folder, named relatively and absolutely, is refused.
  reference = tmp_path / "ref"
  shutil.copytree(os.path.join(ROOT, "docs", "results", "convergence"),
                  reference / "convergence")
  monkeypatch.chdir(tmp_path)
  for compare_with, publish in (("ref", str(reference)),
                                (str(reference), "./ref")):
    with pytest.raises(ValueError, match="publish must differ"):
      reproduce.run(_reproduce_config(compare_with=compare_with,
                                      publish=publish), str(tmp_path / "c"))


def test_reproduce_checks_readme_and_publish_before_any_part(
    tmp_path, monkeypatch):
  """A readme without its block and a publish path that is a file fail
  before the first part runs (not after hours); a relative data_dir reaches
  the parts, which run in the project root, as an absolute path."""
  calls, _ = _fake_parts(tmp_path, monkeypatch)
  note = tmp_path / "notes.md"
  note.write_text("# no generated block\n")
  afile = tmp_path / "afile"
  afile.write_text("")
  for overrides, match in (
      ({"readme": str(tmp_path / "missing.md")}, "readme=.* cannot be read"),
      ({"readme": str(note)}, "readme=.* has no generated block"),
      ({"publish": str(afile)}, "publish=.* is a file")):
    with pytest.raises(ValueError, match=match):
      reproduce.run(_reproduce_config(report_only=False, parts="visual",
                                      **overrides), str(tmp_path / "w"))
  assert not calls
  monkeypatch.chdir(tmp_path)
  reproduce.run(_reproduce_config(report_only=False, parts="visual",
                                  data_dir="my_tfds"), str(tmp_path / "w"))
  assert f"--data_dir={tmp_path / 'my_tfds'}" in calls[0]


@pytest.mark.slow
def test_reproduce_all_parts(tmp_path):
  workdir, _ = _reproduce(tmp_path, ["tradeoff", "visual", "repinfer",
                                     "convergence", "certified", "adaptive"])
  text = (workdir / "REPORT.md").read_text()
  for part in ("tradeoff", "visual", "repinfer", "convergence", "certified",
               "adaptive"):
    assert (workdir / part / "PART_DONE.json").exists(), part
  assert "Not run." not in text
  assert "paper" in text


_MAIN = """
import os
from absl import app
from experiments import config_entry
from repdef_jax import models
def run(config, workdir):
  print("VALUES", config.data_dir, os.environ.get("REPDEF_JAX_QUIET"),
        config.init, workdir)
main = config_entry.make_main("attack", run, lambda result, workdir: None,
                              shortcuts={"init": models.INITS})
app.run(main)
"""


def _main(tmp_path, *args):
  env = {k: v for k, v in os.environ.items() if k != "REPDEF_JAX_QUIET"}
  env.update(JAX_PLATFORMS="cpu", PYTHONPATH=ROOT)
  return subprocess.run([sys.executable, "-c", _MAIN,
                         f"--workdir={tmp_path}", *args], cwd=ROOT, env=env,
                        capture_output=True, text=True, timeout=300)


def test_make_main_common_flags_reach_the_run(tmp_path):
  """--data_dir sets config.data_dir, --quiet sets REPDEF_JAX_QUIET=1, an
  enum shortcut accepts the field's own default ('auto' init), and a stray
  positional argument is refused."""
  out = _main(tmp_path, "--data_dir=/my/tfds", "--quiet", "--init=auto")
  assert out.returncode == 0, out.stderr[-3000:]
  assert f"VALUES /my/tfds 1 auto {tmp_path}" in out.stdout
  stray = _main(tmp_path, "extra")
  assert stray.returncode != 0
  assert "Unexpected arguments: ['extra']" in stray.stderr
  assert "VALUES" not in stray.stdout


def test_tradeoff_medium_is_what_docs_evaluation_md_describes():
  """docs/evaluation.md: medium attacks every one-image gradient with DLG,
  iDLG, GS and the *_mask / *_drop variants, every real update with GS,
  gs_mask, gs_drop and DLG (medium and full), and trains DLG's LeNet
  (uniform init) at lr 0.2 for the paper's 200 rounds."""
  for preset in ("medium", "full"):
    c = tradeoff_cfg.get_config(preset)
    assert set(c.update_attack.attacks) == {"gs", "gs_mask", "gs_drop",
                                            "dlg"}, preset
  medium = tradeoff_cfg.get_config("medium")
  for name, panel in medium.panels.items():
    assert set(panel.attacks) == {"dlg", "idlg", "gs", "dlg_mask", "gs_mask",
                                  "dlg_drop", "gs_drop"}, name
  lenet = sweep.panel_config(medium, "lenet_mnist")
  assert (lenet.model, lenet.model_init, lenet.client_lr, lenet.rounds) == (
      "lenet", "uniform", 0.2, 200)


def test_full_panels_attack_each_model_with_its_papers_attack():
  """GS's ConvNet under the GS family; DLG's LeNet under DLG."""
  full = tradeoff_cfg.get_config("full")
  for name, panel in full.panels.items():
    if panel.model.startswith("convnet"):
      assert "gs" in panel.attacks and "dlg" not in panel.attacks, name
    if panel.model == "lenet":
      assert "dlg" in panel.attacks, name


def test_part_presets_keep_their_docstrings_promises():
  adaptive_medium = adaptive_cfg.get_config("medium")
  lenet = adaptive_medium.panels.lenet_mnist
  assert (lenet.family, lenet.model_init) == ("dlg", "uniform")
  assert adaptive_medium.panels.convnet16_mnist.family == "gs"
  assert len(adaptive_medium.seeds) * adaptive_medium.num_images == 9
  adaptive_full = adaptive_cfg.get_config("full")
  assert (len(adaptive_full.seeds), adaptive_full.num_images) == (5, 8)
  # certified full: rates 0-90 in steps of 10.
  assert tuple(certified_cfg.get_config("full").rates) == tuple(
      float(r) for r in range(0, 100, 10))
  # visual: both claim rates are among the settings they are decided on.
  for preset in ("quick", "medium", "full"):
    v = visual_cfg.get_config(preset)
    assert ("soteria", v.claim_soteria_rate) in v.settings, preset
    assert ("compression", v.claim_compression_rate) in v.settings, preset
  # convergence medium: (I, K) in {(1, 10), (10, 10), (10, 5), (10, 20)},
  # none and Soteria 10 / 80 %: 12 settings, plus undefended LeNet.
  conv = convergence.settings(convergence_cfg.get_config("medium"))
  main = [s for s in conv if "overrides" not in s]
  assert len(main) == 12
  assert {(s["local_steps"], s["clients_per_round"]) for s in main} == {
      (1, 10), (10, 10), (10, 5), (10, 20)}
  # repinfer medium: 3 seeds x 5 rounds x 10 devices; 8 one-image gradients
  # and 4 two-image updates per seed.
  r = repinfer_cfg.get_config("medium")
  assert (len(r.seeds), r.rounds, r.clients_per_round, r.recon_images,
          r.recon_clients, r.update_images) == (3, 5, 10, 8, 4, 2)
