"""The trade-off experiment: end to end on mock data, analysis, behaviour."""

import json
import os
import re
import shutil
import sys
import types

import jax
import ml_collections
import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
  sys.path.insert(0, ROOT)

from experiments.configs import tradeoff as tradeoff_cfg  # noqa: E402
from repdef_jax import data as data_lib  # noqa: E402
from repdef_jax import defenses  # noqa: E402
from repdef_jax import fedavg  # noqa: E402
from repdef_jax import host  # noqa: E402
from repdef_jax import models  # noqa: E402
from repdef_jax import storage  # noqa: E402
from repdef_jax import training  # noqa: E402
from repdef_jax.paper import cost  # noqa: E402
from repdef_jax.paper import harness  # noqa: E402
from repdef_jax.paper import sweep  # noqa: E402
from repdef_jax.paper import tradeoff  # noqa: E402

NUM_MOCK = 120


def test_tiny_end_to_end_and_resume(mock_env):
  config = tradeoff_cfg.get_config("tiny")
  config.data_dir = str(mock_env / "data")
  workdir = str(mock_env / "tradeoff")
  result = tradeoff.run(config, workdir)
  assert {"tradeoff.json", "tradeoff.png", "cells", "runs"} <= set(
      os.listdir(workdir))
  with open(os.path.join(workdir, "tradeoff.json")) as f:
    saved = json.load(f)
  panel = saved["panels"]["logreg_mnist"]
  assert {(p["defense"], p["strength"]) for p in panel["points"]} == {
      ("none", 0.0), ("soteria", 50.0)}
  for p in panel["points"]:
    assert len(p["accuracy"]) == 1 and 0.0 <= p["accuracy"][0] <= 1.0
    assert set(p["per_attack"]) == {"best", "gs", "gs_mask"}
  # The attacked test images are recorded, and are the ones seed 0 draws.
  num_test = len(data_lib.load("mnist", "test", config.data_dir)[1])
  np.testing.assert_array_equal(
      panel["attacked_images"]["0"],
      tradeoff.attacked_indices(0, config.num_images, num_test))
  # Real-update attacks at the first and final stage of the defended run.
  assert set(panel["updates"]["soteria/50"]) == {"first", "final"}
  assert os.path.exists(os.path.join(
      workdir, "runs", "logreg_mnist", "seed0", "soteria_50",
      "params_final.msgpack"))
  assert saved["claims"] and all(  # every claim decided
      c["verdict"].split(" ")[0] in ("held", "did", "inconclusive", "reported")
      for c in saved["claims"]), [c["verdict"] for c in saved["claims"]]
  # Every per-attack SSIM carries its interval; the undefended success
  # rates have their table; re-rendering the tables from the panels gives
  # the run's tables.
  per_attack = next(t for t in saved["tables"] if "SSIM per attack" in
                    t["title"])
  for p, row in zip(panel["points"], per_attack["rows"]):
    for a, cell in zip(panel["attacks"], row[2:]):
      assert ("[" in cell) == (p["per_attack"][a]["ssim"]["low"] is not None)
  rates = next(t for t in saved["tables"] if "undefended success" in
               t["title"])
  assert rates["rows"] == [[panel["undefended_success_rate"][a]
                            for a in rates["header"]]]
  assert rates["header"] == ["best", "gs", "gs_mask"]
  tables_before = saved["tables"]
  saved["tables"] = []
  storage.write_json(os.path.join(workdir, "tradeoff.json"), saved)
  assert tradeoff.refresh_tables(os.path.join(workdir, "tradeoff.json"))[
      "tables"] == tables_before
  cells = os.path.join(workdir, "cells")
  names = sorted(os.listdir(cells))
  assert len(names) == len(sweep.plan(config)) == 6
  # The utility is the mean of the last accuracy_window evaluations.
  with open(os.path.join(cells, "logreg_mnist_seed0_train_none_0_.json")) as f:
    cell = json.load(f)
  assert cell["accuracy"] == pytest.approx(
      np.mean(cell["accuracy_curve"][-config.accuracy_window:]))
  # Real updates are attacked with update_attack.budgets over attack_budgets.
  with open(os.path.join(
      cells, "logreg_mnist_seed0_update_soteria_50_first.json")) as f:
    update = json.load(f)
  assert update["attacks"]["gs"]["iterations"] == (
      config.update_attack.budgets.gs.iterations)
  # A rerun reuses every cell (no file rewritten) and gives the same claims.
  before = {n: os.path.getmtime(os.path.join(cells, n)) for n in names}
  again = tradeoff.run(config, workdir)
  assert before == {n: os.path.getmtime(os.path.join(cells, n))
                    for n in names}
  assert again["claims"] == result["claims"]
  # A workdir copied without the snapshots and checkpoints (as a run
  # committed between sessions may be) retrains the run the update cells
  # read, to the same numbers, instead of recording its update cells as
  # skipped.
  run_dir = os.path.join(workdir, "runs", "logreg_mnist", "seed0",
                         "soteria_50")
  for name in os.listdir(run_dir):
    if name.startswith("params_") or name == "checkpoints":
      path = os.path.join(run_dir, name)
      shutil.rmtree(path) if os.path.isdir(path) else os.remove(path)
  train = os.path.join(cells, "logreg_mnist_seed0_train_soteria_50_.json")
  with open(train) as f:
    trained = json.load(f)
  updates = [n for n in names if "_update_" in n]
  for n in updates:
    os.remove(os.path.join(cells, n))
  tradeoff.run(config, workdir)
  assert os.path.exists(os.path.join(run_dir, "params_final.msgpack"))
  with open(train) as f:
    assert json.load(f)["accuracy_curve"] == trained["accuracy_curve"]
  for n in updates:
    with open(os.path.join(cells, n)) as f:
      assert "skipped" not in json.load(f)
  # Killed in the second leg (mid snapshot written, checkpoint past mid):
  # the resume continues that leg instead of rerunning the first.
  os.remove(os.path.join(run_dir, "params_final.msgpack"))
  os.remove(train)
  tradeoff.run(config, workdir)
  assert os.path.exists(os.path.join(run_dir, "params_final.msgpack"))
  with open(train) as f:
    assert json.load(f)["accuracy_curve"] == trained["accuracy_curve"]
  # A changed attack budget keeps the finished training (planned first) and
  # refuses the attack cell computed with the old budget.
  longer = tradeoff_cfg.get_config("tiny")
  longer.data_dir = config.data_dir
  longer.attack_budgets.gs.iterations += 1
  with pytest.raises(ValueError, match=r"seed0_attack_none_0_\.json was "
                     r"computed with other settings \(attack_budgets\.gs"):
    tradeoff.run(longer, workdir)

  # Dry run of a bigger plan, priced by this run's cell timings: the same
  # panel with twice the rounds costs twice as much to train; a model never
  # timed is scaled by forward FLOPs.
  bigger = tradeoff_cfg.get_config("tiny")
  bigger.panels.logreg_mnist.train.rounds = 4
  bigger.panels["mlp_mnist"] = tradeoff_cfg.get_config("tiny").panels[
      "logreg_mnist"]
  bigger.panels.mlp_mnist.model = "mlp"
  cells = sweep.plan(bigger)
  est = cost.estimate(bigger, cells, str(mock_env / "none"),
                      reference=os.path.join(workdir, "tradeoff.json"))
  assert est["cells"] == 12 and est["finished"] == 0 and not est["unknown"]
  assert est["extrapolated"] == ["mlp/mnist from logreg/mnist"]
  train_rate = cost.rates(saved["cell_costs"])[("logreg/mnist", "train",
                                                 "plain")]
  # Each cell's cost names the CPU it ran on (as the cell recorded it).
  assert {c["cpu"] for c in saved["cell_costs"]} == {host.describe()["cpu"]}
  none_train = [c for c in cells if c["panel"] == "logreg_mnist" and
                c["kind"] == "train" and c["defense"] == "none"][0]
  assert cost.work(bigger, none_train) == 2 * cost.work(config, none_train)
  assert est["seconds"] > train_rate * cost.work(bigger, none_train)
  assert "planned cells: 12" in cost.render(est)


def test_unit_costs_price_cells_no_finished_run_timed():
  config = tradeoff_cfg.get_config("tiny")
  tc = sweep.panel_config(config, "logreg_mnist")
  unit = {"models": {"lr": {"name": "logreg", "kwargs": {}}},
          "fedavg_step": {"lr": {"mnist": {str(tc.batch_size): {
              "plain_s": 0.01, "soteria_s": 0.5}}}},
          "dlg_outer_step_s": {}, "gs_iteration_s": {"lr": 0.002},
          "dlg_inner_steps": 20}
  cells = sweep.plan(config)
  est = cost.estimate(config, cells, None, reference="", units=unit)
  steps = tc.rounds * tc.clients_per_round * tc.local_steps
  gs_its = config.attack_budgets.gs.iterations
  upd_its = config.update_attack.budgets.gs.iterations  # its own budget
  assert upd_its != gs_its
  want = {
      "train": steps * (0.01 + 0.5),  # the undefended and the Soteria cell
      "attack": 2 * config.num_images * 2 * gs_its * 0.002,  # gs, gs_mask
      "update": (len(config.update_attack.stages) * config.update_attack.batch
                 * upd_its * 0.002),
  }
  assert est["by_kind"] == pytest.approx(want)
  assert est["from_units"] == ["logreg/mnist"] and not est["unknown"]
  # On the modelled GPU every step and iteration of this tiny model takes
  # the floor: seconds = floor x (steps + iterations), images batched.
  units = (2 * steps + 2 * 2 * gs_its
           + len(config.update_attack.stages) * upd_its)
  assert est["gpu_seconds"] == pytest.approx(cost.GPU_STEP_FLOOR_S * units)
  assert "priced from measured unit costs" in cost.render(est)
  # As measured (int batch keys) and as read back from JSON (strings).
  step = unit["fedavg_step"]["lr"]["mnist"]
  step[tc.batch_size] = step.pop(str(tc.batch_size))
  again = cost.estimate(config, cells, None, reference="", units=unit)
  assert again["seconds"] == pytest.approx(est["seconds"])
  # GS unrolling the client's local steps at the panel's learning rate costs
  # one iteration per local step; DLG and the round-0 attacks are unchanged.
  config.update_attack.unroll = True
  gs = sweep.budgets(config, "update", "logreg_mnist")["gs"]
  assert (gs["local_steps"], gs["local_lr"]) == (
      config.update_attack.local_steps, tc.client_lr)
  assert "local_steps" not in sweep.budgets(config, "attack")["gs"]
  unrolled = cost.estimate(config, cells, None, reference="", units=unit)
  assert unrolled["by_kind"] == pytest.approx(
      {**want, "update": want["update"] * config.update_attack.local_steps})
  del config.update_attack["unroll"]
  # A model the unit costs never measured is left out, and said so.
  unit["models"] = {"lr": {"name": "mlp", "kwargs": {}}}
  est = cost.estimate(config, cells, None, reference="", units=unit)
  assert est["seconds"] == 0 and len(est["unknown"]) == 5  # kind x family


def test_full_preset_dry_run_prints_the_plan(tmp_path, capsys):
  config = tradeoff_cfg.get_config("full")
  config.dry_run = True
  out = tradeoff.run(config, str(tmp_path))
  assert out["dry_run"] and out["cells"] == len(sweep.plan(config))
  printed = capsys.readouterr().out
  assert f"planned cells: {out['cells']}" in printed


def test_panels_only_runs_a_subset_that_shares_the_whole_runs_cells():
  """``panels_only`` narrows the plan to the named panels; no cell's
  settings depend on it, so a one-panel run reuses the whole run's cells."""
  whole = tradeoff_cfg.get_config("medium")
  assert sweep.select_panels(whole) is whole  # '' keeps every panel.
  config = tradeoff_cfg.get_config("medium")
  config.panels_only = "leakage_mnist"
  narrowed = sweep.select_panels(config)
  assert list(narrowed.panels) == ["leakage_mnist"]
  # A copy: the config keeps its panels, and shares none with the copy.
  assert list(config.panels) == ["leakage_mnist", "lenet_mnist"]
  assert narrowed.panels.leakage_mnist is not config.panels.leakage_mnist
  cells = sweep.plan(narrowed)
  assert cells == [c for c in sweep.plan(whole)
                   if c["panel"] == "leakage_mnist"]
  one_of_each = {c["kind"]: c for c in reversed(cells)}
  assert set(one_of_each) == {"train", "attack", "update"}
  for cell in one_of_each.values():
    assert (tradeoff.cell_settings(narrowed, cell)
            == tradeoff.cell_settings(whole, cell))
  config.panels_only = "leakage_mnist, lenet"
  with pytest.raises(ValueError, match=r"panels_only must name panels of "
                     r"the config \(leakage_mnist, lenet_mnist\).*'lenet'"):
    sweep.select_panels(config)


def test_cell_settings_leave_out_what_a_cell_does_not_read(tmp_path):
  base = tradeoff_cfg.get_config("medium")
  changed = tradeoff_cfg.get_config("medium")
  changed.num_images += 1
  changed.train.log_every += 1
  changed.train.checkpoint_every += 1
  cells = {c["kind"]: c for c in sweep.plan(base)}
  same = {k: tradeoff.cell_settings(base, c) == tradeoff.cell_settings(
      changed, c) for k, c in cells.items()}
  # The round-0 attacks read the number of images; training and the
  # update attacks do not, and progress lines and checkpoints change nothing.
  assert same == {"train": True, "attack": False, "update": True}
  changed.update_attack.batch += 1
  assert (tradeoff.cell_settings(base, cells["update"])
          != tradeoff.cell_settings(changed, cells["update"]))
  # A removed override (the panel's rounds fall back to the shared
  # training's) is a difference for the stored cell, not a key to ignore.
  store = harness.CellStore(str(tmp_path))
  train = cells["train"]
  store.put("t", {"acc": 0.9, "settings": tradeoff.cell_settings(base, train)})
  del changed.panels[train["panel"]].train["rounds"]
  with pytest.raises(ValueError, match=r"train\.rounds: \d+ -> None"):
    store.get_or_run("t", dict, None, tradeoff.cell_settings(changed, train),
                     drop=tradeoff.cell_drops(train))


def test_panel_config_overrides_the_shared_training():
  """A panel's own training settings win over the shared ``train`` block;
  what it does not set comes from the shared block."""
  config = sweep.default_config()
  shared = config.train
  assert shared.rounds != 1000 and shared.client_lr != 0.05
  lenet = sweep.panel_config(config, "lenet_cifar10")
  assert lenet.rounds == 1000
  assert (lenet.dataset, lenet.model, lenet.model_init) == (
      "cifar10", "lenet", "uniform")
  convnet = sweep.panel_config(config, "convnet_mnist")
  assert (convnet.rounds, convnet.client_lr) == (shared.rounds, 0.05)
  assert convnet.batch_size == shared.batch_size


def _image(ssim_by_attack, diverged=()):
  attacks = {a: {"ssim": s, "mse_clamped": 1 - s, "mse": 1 - s, "psnr": s,
                 "diverged": a in diverged}
             for a, s in ssim_by_attack.items()}
  return {"attacks": attacks, "best": harness.best_of(attacks)}


def test_best_of_ignores_diverged_attacks_and_counts_all_diverged():
  images = [_image({"gs": 0.2, "dlg": 0.9}, diverged=("dlg",)),
            _image({"gs": 0.7, "dlg": 0.4}),
            _image({"gs": 0.9, "dlg": 0.9}, diverged=("gs", "dlg"))]
  assert images[0]["best"]["ssim"] == 0.2  # the diverged 0.9 does not count
  assert images[1]["best"]["ssim_attack"] == "gs"
  point = tradeoff.summarize_point([{"accuracy": 0.5}], images,
                                   ("gs", "dlg"), success_ssim=0.6)
  best = point["per_attack"]["best"]
  assert best["diverged"] == 1 and best["ssim"]["n"] == 2
  assert best["ssim"]["mean"] == pytest.approx(0.45)
  # Over every image: the all-diverged one counts as a failure (1 of 3).
  assert best["success_rate"] == pytest.approx(1 / 3)
  assert point["per_attack"]["dlg"]["diverged"] == 2
  assert point["per_attack"]["dlg"]["ssim"]["n"] == 1
  # The samples the statistics use leave the all-diverged image out.
  assert point["ssim"] == [0.2, 0.7]


def test_best_of_picks_each_metric_on_its_own():
  """Each best-of metric comes from the attack best at that metric: max SSIM
  and PSNR, min clamped and raw MSE."""
  best = harness.best_of({
      "a": {"ssim": 0.9, "mse_clamped": 0.01, "mse": 0.5, "psnr": 12.0,
            "diverged": False},
      "b": {"ssim": 0.4, "mse_clamped": 0.2, "mse": 0.002, "psnr": 30.0,
            "diverged": False}})
  assert (best["ssim"], best["ssim_attack"]) == (0.9, "a")
  assert (best["mse_clamped"], best["mse_clamped_attack"]) == (0.01, "a")
  assert (best["mse"], best["mse_attack"]) == (0.002, "b")
  assert (best["psnr"], best["psnr_attack"]) == (30.0, "b")


def test_point_summary_boundaries_seeds_and_round0_divergence(t_interval):
  """An SSIM equal to success_ssim is a success; a run that diverged at
  round 0 is a diverged seed (NaN accuracy); the interval is over the seeds'
  means and the median over the images."""
  ssims = {0: (0.6, 0.2), 1: (0.3, 0.5), 2: (0.9, 0.1)}
  images = [{**_image({"gs": v}), "seed": seed}
            for seed, vs in ssims.items() for v in vs]
  train = [{"accuracy": 0.8, "diverged_at_round": 0},
           {"accuracy": 0.7, "diverged_at_round": None}, {"accuracy": 0.9}]
  point = tradeoff.summarize_point(train, images, ("gs",), success_ssim=0.6)
  assert np.isnan(point["accuracy"][0]) and point["accuracy"][1:] == [0.7,
                                                                     0.9]
  assert point["diverged_training"] == 1
  flat = [v for vs in ssims.values() for v in vs]
  for name in ("best", "gs"):
    s = point["per_attack"][name]
    assert s["success_rate"] == pytest.approx(2 / 6)  # 0.6 and 0.9
    assert s["ssim"]["median"] == pytest.approx(np.median(flat))  # 0.4
    mean, low, high = t_interval([np.mean(vs) for vs in ssims.values()])
    assert (s["ssim"]["mean"], s["ssim"]["low"], s["ssim"]["high"]) == (
        pytest.approx(mean), pytest.approx(low), pytest.approx(high))
    assert s["ssim"]["n"] == 6 and s["ssim"]["groups"] == 3


def _point(strength, acc, mse, ssim, raw_mse=None):
  return {"strength": strength, "accuracy": list(np.broadcast_to(acc, 3)),
          "mse_clamped": [mse] * 8, "mse": [mse if raw_mse is None
                                            else raw_mse] * 8,
          "ssim": [ssim] * 8, "psnr": [10.0] * 8}


def _claims(points, undefended_success=1.0):
  config = tradeoff_cfg.get_config("tiny")
  panel = {"model": "m", "dataset": "d",
           "undefended_success_rate": {"best": undefended_success},
           **tradeoff.analyse_panel(points, config)}
  claims = tradeoff.panel_claims("p", panel, config)
  return panel, {c["claim"].removeprefix("p (m/d): "): c for c in claims}


def _panel_with(undefended_success):
  return _claims({("none", 0.0): _point(0, 0.9, 0.001, 0.95),
                  ("soteria", 50.0): _point(50, 0.9, 0.2, 0.1),
                  ("compression", 90.0): _point(90, 0.9, 0.001, 0.9),
                  ("compression", 99.0): _point(99, 0.6, 0.1, 0.15)},
                 undefended_success)[1]


def test_claims_follow_the_rules():
  claims = _panel_with(1.0)
  ratio = claims["Soteria's MSE / compression's at equal accuracy"]
  # Compression 90 (acc 0.9): Soteria 50 -> 200x; compression 99 (0.6) is
  # outside the common range [0.9, 0.9].
  assert ratio["value"] == pytest.approx(200.0)
  assert ratio["verdict"] == "held"
  first = claims["same, at compression's first point with SSIM "
                 "<= 0.2"]
  assert first["value"] == pytest.approx(2.0)  # 0.2 / 0.1 at strength 99
  assert first["verdict"] == "did not hold"
  drop = claims["Soteria's accuracy drop where reconstructions "
                "become unrecognisable (best-of SSIM <= 0.2)"]
  assert drop["value"] == pytest.approx(0.0) and drop["verdict"] == "held"
  holds = claims["accuracy holds until MSE 0.8"]
  assert holds["value"] == pytest.approx(0.2)
  assert holds["verdict"] == "did not hold"


def test_claims_are_inconclusive_when_attacks_fail_undefended():
  for rate in (0.25, 0.45, 0.49):
    for c in _panel_with(rate).values():
      assert c["verdict"] in ("inconclusive (attacks fail undefended)",
                              "reported"), (rate, c)


def test_the_ratio_claim_is_on_clamped_mse():
  """The headline ratio is the clamped MSE's (200x here), not the raw
  MSE's (5000x), as its statistic says."""
  _, claims = _claims({
      ("none", 0.0): _point(0, 0.9, 0.001, 0.95),
      ("soteria", 50.0): _point(50, 0.9, 0.2, 0.1, raw_mse=5.0),
      ("compression", 90.0): _point(90, 0.9, 0.001, 0.9)})
  ratio = claims["Soteria's MSE / compression's at equal accuracy"]
  assert ratio["value"] == pytest.approx(200.0)
  assert "clamped-MSE ratio" in ratio["statistic"]


def test_accuracy_holds_leaves_out_points_that_lose_accuracy():
  """A point counts when its paired drop is at most one point: Soteria 80 %
  (drop 1.5 points) and 90 % (30 points) are left out however private."""
  panel, claims = _claims({
      ("none", 0.0): _point(0, 0.9, 0.001, 0.95),
      ("soteria", 50.0): _point(50, 0.9, 0.2, 0.1),
      ("soteria", 80.0): _point(80, 0.885, 0.9, 0.05),
      ("soteria", 90.0): _point(90, 0.6, 0.95, 0.01)})
  assert [h["strength"] for h in panel["accuracy_holds"]] == [50.0]
  holds = claims["accuracy holds until MSE 0.8"]
  assert holds["value"] == pytest.approx(0.2)
  assert holds["verdict"] == "did not hold"


def test_the_drop_claim_is_at_the_configured_threshold():
  """Soteria 40 % reaches SSIM 0.15 (protective at 0.2, not at 0.1), 80 %
  SSIM 0.05 with 10 points less accuracy: at the configured 0.2 the claim
  is Soteria 40 %'s drop, 0."""
  _, claims = _claims({
      ("none", 0.0): _point(0, 0.9, 0.001, 0.95),
      ("soteria", 40.0): _point(40, 0.9, 0.2, 0.15),
      ("soteria", 80.0): _point(80, 0.8, 0.5, 0.05)})
  drop = claims["Soteria's accuracy drop where reconstructions become "
                "unrecognisable (best-of SSIM <= 0.2)"]
  assert drop["statistic"] == "paired drop at strength 40.0"
  assert drop["value"] == pytest.approx(0.0) and drop["verdict"] == "held"


def test_the_drop_claim_does_not_hold_where_training_diverged():
  _, claims = _claims({
      ("none", 0.0): _point(0, 0.9, 0.001, 0.95),
      ("soteria", 40.0): _point(40, [0.9, float("nan"), 0.9], 0.2, 0.15)})
  drop = claims["Soteria's accuracy drop where reconstructions become "
                "unrecognisable (best-of SSIM <= 0.2)"]
  assert drop["verdict"] == "did not hold (training diverged)"


def _update_stage(ssims, success_ssim=0.6):
  """An update stage's per-attack summary from its images' best SSIMs."""
  images = [_image({"gs": v}) for v in ssims]
  return tradeoff.summarize_point([], images, ("gs",),
                                  success_ssim)["per_attack"]


def test_update_claims_follow_the_rules():
  config = tradeoff_cfg.get_config("tiny")
  undefended = {"first": _update_stage([0.1, 0.2, 0.7, 0.3]),  # rate 0.25
                "final": _update_stage([0.9, 0.8, 0.7, 0.95])}
  panel = {"model": "m", "dataset": "d", "updates": {
      "none/0": undefended,
      "soteria/40": {"first": _update_stage([0.05, 0.1, 0.08, 0.12]),
                     "final": _update_stage([0.5, 0.6, 0.55, 0.45])},
      "soteria/80": {"first": _update_stage([0.05, 0.06, 0.07, 0.05]),
                     "final": _update_stage([0.05, 0.06, 0.07, 0.05])},
      "compression/90": {"final": _update_stage([0.1, 0.1, 0.1, 0.1])}}}
  claims = {c["claim"]: c for c in tradeoff.update_claims("p", panel, config)}
  name = "p (m/d): Soteria {} % makes a client's real update unrecognisable " \
         "({} stage)"
  assert set(claims) == {name.format(s, st) for s in ("40", "80")
                         for st in ("first", "final")}  # Soteria only
  # Low SSIM where the attacks fail undefended decides nothing.
  assert claims[name.format("40", "first")]["verdict"] == (
      "inconclusive (attacks fail undefended)")
  final40 = claims[name.format("40", "final")]
  assert final40["value"] == pytest.approx(0.525)
  assert final40["verdict"] == "did not hold"
  assert claims[name.format("80", "final")]["verdict"] == "held"


def test_claims_at_half_undefended_success_and_the_most_private_holding():
  """An undefended success rate of exactly 0.5 lets the claims be decided;
  "accuracy holds" takes the most private Soteria point whose paired drop is
  <= 1 point on every seed (one diverged seed disqualifies a point)."""
  _, claims = _claims({
      ("none", 0.0): _point(0, 0.9, 0.001, 0.95),
      ("soteria", 50.0): _point(50, 0.9, 0.2, 0.1),
      ("soteria", 80.0): _point(80, 0.9, 0.9, 0.05),
      ("soteria", 95.0): {**_point(95, 0.9, 2.0, 0.01),
                          "accuracy": [0.9, 0.9, float("nan")]}}, 0.5)
  holds = claims["accuracy holds until MSE 0.8"]
  assert holds["value"] == pytest.approx(0.9)  # Soteria 80
  assert holds["verdict"] == "held"
  assert not any(c["verdict"].startswith("inconclusive") for c in
                 claims.values()), claims


def test_update_claims_decide_at_half_undefended_success_per_stage():
  """Each stage is judged against the undefended update of the same stage;
  a success rate of exactly 0.5 there lets the claim be decided."""
  config = tradeoff_cfg.get_config("tiny")
  low = [0.05, 0.1, 0.08, 0.12]
  panel = {"model": "m", "dataset": "d", "updates": {
      "none/0": {"first": _update_stage([0.6, 0.1, 0.7, 0.2]),  # rate 0.5
                 "final": _update_stage([0.1, 0.2, 0.3, 0.1])},  # rate 0
      "soteria/40": {"first": _update_stage(low),
                     "final": _update_stage(low)}}}
  claims = {c["claim"]: c["verdict"]
            for c in tradeoff.update_claims("p", panel, config)}
  name = ("p (m/d): Soteria 40 % makes a client's real update unrecognisable"
          " ({} stage)")
  assert claims == {name.format("first"): "held",
                    name.format("final"):
                        "inconclusive (attacks fail undefended)"}


def test_update_cell_attacks_the_rescaled_client_update(monkeypatch):
  """The suite receives -update / (lr * local_steps) of the attacked client,
  at the stage's parameters, with that client's first ``batch`` images."""
  model = models.get_model("logreg", (4, 4, 1), 3)
  keys = harness.sweep_keys(0)
  params = model.init(keys.init)
  rng = np.random.default_rng(0)
  images = rng.integers(0, 256, (12, 4, 4, 1), dtype=np.uint8)
  labels = np.arange(12, dtype=np.int32) % 3
  idx = [np.arange(4 * c, 4 * c + 4) for c in range(3)]
  monkeypatch.setattr(tradeoff, "_client_data", lambda *a: (images, labels,
                                                            idx))
  monkeypatch.setattr(tradeoff.sweep, "budgets", lambda *a, **k: {})

  def fake_update(model, fcfg, params, x, y, mask, train_key, noise_key):
    del model, x, y, mask, train_key, noise_key
    seen["fcfg"] = fcfg
    return (jax.tree_util.tree_map(lambda p: jax.numpy.full_like(p, 0.3),
                                   params), {"defense/x": 1.0})
  seen = {}
  monkeypatch.setattr(fedavg, "client_update", fake_update)

  def fake_suite(model, params, shared, x, y, names, key, **kwargs):
    seen.update(params=params, shared=shared, x=x, y=y, key=key)
    metrics = {"ssim": 0.5, "mse": 0.1, "mse_clamped": 0.1, "psnr": 10.0,
               "diverged": False}
    return {"attacks": {"gs": metrics}, "best": harness.best_of(
        {"gs": metrics})}
  monkeypatch.setattr(tradeoff.harness, "attack_suite", fake_suite)
  config = ml_collections.ConfigDict(dict(
      data_dir="", give_labels=True, update_attack=dict(
          batch=2, local_steps=2, attacks=("gs",))))
  panel = types.SimpleNamespace(
      name="p", seed=0, model=model, keys=keys, params0=params,
      train_config=ml_collections.ConfigDict(dict(
          rounds=4, dataset="mnist", num_clients=3, classes_per_client=1,
          samples_per_class=4, client_lr=0.1, l2=0.01, local_steps=5,
          batch_size=10)))
  out = tradeoff.update_cell(config, panel, "dp_gaussian", 0.01, "first", "")
  assert out["round"] == 0 and out["defense/x"] == 1.0
  # The training's client settings on the attacked batch's local steps.
  fcfg = seen["fcfg"]
  assert (fcfg.l2, fcfg.local_steps, fcfg.batch_size) == (0.01, 2, 2)
  assert fcfg.defense.name == "dp_gaussian" and fcfg.defense_at == "step"
  assert float(fcfg.client_lr(0)) == pytest.approx(0.1)
  for leaf in jax.tree_util.tree_leaves(seen["shared"]):
    np.testing.assert_allclose(leaf, -0.3 / (0.1 * 2), rtol=1e-6)
  for a, b in zip(jax.tree_util.tree_leaves(seen["params"]),
                  jax.tree_util.tree_leaves(params)):
    np.testing.assert_array_equal(a, b)
  pick = idx[out["client"]][:2]
  np.testing.assert_allclose(seen["x"], images[pick] / 255.0, rtol=1e-6)
  np.testing.assert_array_equal(seen["y"], labels[pick])
  assert out["labels"] == labels[pick].tolist()


@pytest.mark.parametrize("partition", ["noniid", "iid"])
def test_update_cells_attack_the_clients_the_training_had(monkeypatch,
                                                          partition):
  """The attacked client's examples are the training's: same split size
  (max_train_examples), same partition (the update cells built the full
  split's non-IID partition whatever the training used)."""
  rng = np.random.default_rng(0)
  images = rng.integers(0, 256, (120, 28, 28, 1), dtype=np.uint8)
  labels = np.arange(120, dtype=np.int64) % 10

  def fake_load(name, split, data_dir=None, *, max_examples=None, **kw):
    del name, data_dir, kw
    n = max_examples or len(labels)
    return (images[:n], labels[:n]) if split == "train" else (
        images[:10], labels[:10])

  monkeypatch.setattr(data_lib, "load", fake_load)
  monkeypatch.setattr(data_lib, "load_with_source",
                      lambda *a, **k: (*fake_load(*a, **k), "synthetic"))
  tc = training.default_config()
  tc.update(dict(dataset="mnist", max_train_examples=80, partition=partition,
                 num_clients=4, classes_per_client=2, samples_per_class=5,
                 samples_per_client=20, seed=3))
  clients, _, _ = training.build_data(tc)
  got_images, got_labels, idx = tradeoff._client_data(tc, "")  # pylint: disable=protected-access
  for c in range(4):
    n = int(np.sum(np.asarray(clients.mask[c]) > 0))
    np.testing.assert_array_equal(
        data_lib.to_float(got_images[np.asarray(idx[c])]),
        np.asarray(clients.x[c][:n]))
    np.testing.assert_array_equal(got_labels[np.asarray(idx[c])],
                                  np.asarray(clients.y[c][:n]))


def test_every_defense_at_a_strong_setting_degrades_the_best_attack():
  """Undefended, iDLG and GS reconstruct the leakage CNN's one-image
  gradient; each defense at a strong setting raises the best-of clamped
  MSE (fixed seed)."""
  model = models.get_model("leakage", (28, 28, 1), 10)
  keys = harness.sweep_keys(0)
  params = model.init(keys.init)
  x, y = harness.synthetic_images("mnist", 1, seed=3)
  budgets = {"dlg": {"outer_steps": 20}, "gs": {"iterations": 600}}
  k_attack, k_defense = harness.image_keys(keys, 0)

  def best(name, strength):
    d = defenses.get_defense(name, strength, model=model)
    _, shared, _ = harness.defend(model, params, d, x, y, k_defense)
    return harness.attack_suite(model, params, shared, x, y, ("idlg", "gs"),
                                k_attack, budgets=budgets)["best"]

  undefended = best("none", 0.0)
  assert undefended["ssim"] > 0.9
  for name, strength in (("soteria", 95.0), ("compression", 99.0),
                         ("dp_gaussian", 1.0), ("dp_laplace", 1.0)):
    defended = best(name, strength)
    assert defended["mse_clamped"] > 10 * undefended["mse_clamped"], name
    assert defended["ssim"] < undefended["ssim"] - 0.3, name


def test_committed_tables_give_every_mean_its_interval_over_seeds():
  """The committed medium run (3 seeds) rendered with today's tables: every
  per-attack SSIM, one-image and real-update, has its interval, except
  where diverged runs left values from fewer than two seeds: an interval
  there would be over one seed's images."""
  path = os.path.join(ROOT, "docs", "results", "tradeoff", "tradeoff.json")
  assert os.path.exists(path), "no committed trade-off run"
  result = storage.read_json(path)
  seeds = len(result["config"]["seeds"])
  assert seeds >= 2
  out = tradeoff.tables(result["panels"], result["config"]["success_ssim"],
                        seeds)
  per_attack = [t for t in out if "per attack" in t["title"] or
                "real multi-step updates" in t["title"]]
  # Per panel: SSIM per attack, success rate per attack, updates.
  assert len(per_attack) == 3 * len(result["panels"])
  one_seed = 0
  for t in per_attack:
    if "success rate" in t["title"]:
      assert t["header"][0] == "best" and len(t["rows"]) == 1
      continue
    first_attack = 2 if "SSIM per attack" in t["title"] else 5
    assert all("[" in c or re.search(r"\(\d+ div\)$", c)
               for row in t["rows"] for c in row[first_attack:]), t["title"]
  for name, panel in result["panels"].items():
    t = next(t for t in out if t["title"].startswith(name) and
             "SSIM per attack" in t["title"])
    for p, row in zip(panel["points"], t["rows"]):
      for attack, cell in zip(panel["attacks"], row[2:]):
        ssim = p["per_attack"][attack]["ssim"]
        several = ssim["mean"] is not None and ssim["groups"] >= 2
        one_seed += ssim["mean"] is not None and not several
        assert ("[" in cell) == several, (name, p["defense"], attack, cell)
        # The JSON obeys the rule too (refresh_tables applied it).
        assert (ssim["low"] is not None) == several, (name, p["defense"])
  assert one_seed > 0  # The run has such cells (DLG at Soteria 95 %).


def test_refresh_tables_drops_stored_intervals_over_one_seeds_images(
    tmp_path):
  """A run older than the interval rule stored an interval over one seed's
  images; refresh_tables removes it from the JSON (mean kept), and keeps
  the intervals over seeds and those of a one-seed run."""
  one = {"mean": 0.1, "low": 0.0, "high": 0.2, "n": 4, "median": 0.1,
         "groups": 1}
  over_seeds = {**one, "groups": 3}
  point = {"defense": "soteria", "strength": 95.0, "images": 12,
           "accuracy_summary": {"mean": 0.9, "low": 0.8, "high": 1.0},
           "per_attack": {
               a: {m: dict(one if a == "dlg" else over_seeds)
                   for m in tradeoff.PRIVACY_METRICS} | {
                       "success_rate": 0.0, "diverged": 8 * (a == "dlg")}
               for a in ("best", "dlg", "gs")}}
  panel = {"model": "leakage", "dataset": "mnist", "attacks": ["dlg", "gs"],
           "points": [point], "undefended_success_rate": {"best": 1.0},
           "updates": {}, "accuracy_drop": {}, "ratios": {}}
  for seeds, kept in (((0, 1, 2), False), ((0,), True)):
    path = str(tmp_path / f"tradeoff{len(seeds)}.json")
    storage.write_json(path, {"config": {"seeds": seeds,
                                         "success_ssim": 0.6},
                              "panels": {"leakage_mnist": panel}})
    out = tradeoff.refresh_tables(path)
    per = storage.read_json(path)["panels"]["leakage_mnist"]["points"][0][
        "per_attack"]
    assert per == out["panels"]["leakage_mnist"]["points"][0]["per_attack"]
    for m in tradeoff.PRIVACY_METRICS:
      assert per["dlg"][m]["mean"] == 0.1
      assert (per["dlg"][m]["low"] is not None) == kept, (seeds, m)
      assert per["gs"][m] == over_seeds and per["best"][m] == over_seeds


def test_holds_claim_and_ratios_give_no_interval_over_one_seeds_images():
  """Every attack diverged on seed 1's images at Soteria 60 %: the "accuracy
  holds" MSE and the ratios that use that point keep their value but get
  no interval, so the claim cannot be decided on seed 0's images alone."""
  def image(seed, mse, diverged=False):
    m = {"mse": mse, "mse_clamped": mse, "ssim": 0.1, "psnr": 10.0,
         "diverged": diverged}
    return {"seed": seed, "attacks": {"gs": m},
            "best": {"all_diverged": True} if diverged else dict(m)}
  train = [{"accuracy": 0.9}, {"accuracy": 0.9}]
  config = ml_collections.ConfigDict({"thresholds": (0.2,)})
  none = tradeoff.summarize_point(train, [image(s, 0.1) for s in (0, 0, 1, 1)],
                                  ("gs",), 0.6)
  sot = tradeoff.summarize_point(
      train, [image(0, 0.90), image(0, 0.91), image(0, 0.92),
              image(1, 0.0, True), image(1, 0.0, True)], ("gs",), 0.6)
  comp = tradeoff.summarize_point(
      train,
      [image(s, v) for s, v in ((0, .01), (0, .012), (1, .011), (1, .013))],
      ("gs",), 0.6)
  panel = tradeoff.analyse_panel({("none", 0.0): none, ("soteria", 60.0): sot,
                                  ("compression", 90.0): comp}, config)
  holds = panel["accuracy_holds"][0]["mse"]
  assert holds["mean"] == pytest.approx(0.91) and holds["groups"] == 1
  assert holds["low"] is None and holds["high"] is None
  ratio = panel["ratios"]["compression"]["mse_clamped"]
  assert ratio["at_first_protective"][0]["value"] > 1
  assert ratio["at_first_protective"][0]["low"] is None
  assert ratio["curve"]["median"]["n"] == 1
  assert ratio["curve"]["median"]["low"] is None
  # With both seeds kept the same analysis gives intervals.
  both = tradeoff.summarize_point(
      train, [image(s, v) for s, v in ((0, .9), (0, .91), (1, .92), (1, .9))],
      ("gs",), 0.6)
  panel = tradeoff.analyse_panel({("none", 0.0): none, ("soteria", 60.0): both,
                                  ("compression", 90.0): comp}, config)
  assert panel["accuracy_holds"][0]["mse"]["low"] is not None
  ratio = panel["ratios"]["compression"]["mse_clamped"]
  assert ratio["at_first_protective"][0]["low"] is not None
  assert ratio["curve"]["median"]["low"] is not None


def test_summarize_point_gives_no_interval_over_one_seeds_images():
  """An attack that diverged on every image of two of three seeds keeps its
  mean but no interval; the best-of, from all three seeds, keeps both."""
  def entry(seed, i, dlg_diverged):
    m = {"ssim": 0.1 * i + seed, "mse": 1.0, "mse_clamped": 0.5, "psnr": 3.0}
    return {"seed": seed, "best": m,
            "attacks": {"dlg": {**m, "diverged": dlg_diverged},
                        "gs": {**m, "diverged": False}}}
  images = [entry(s, i, s != 0) for s in range(3) for i in range(4)]
  point = tradeoff.summarize_point([], images, ("dlg", "gs"), 0.6)
  dlg = point["per_attack"]["dlg"]["ssim"]
  assert dlg["mean"] == pytest.approx(0.15) and dlg["n"] == 4
  assert dlg["low"] is None and dlg["high"] is None
  assert point["per_attack"]["dlg"]["diverged"] == 8
  for name in ("gs", "best"):
    s = point["per_attack"][name]["ssim"]
    assert s["mean"] == pytest.approx(1.15)
    assert s["low"] < s["mean"] < s["high"]


def test_threshold_sensitivity_table():
  """Per defense and threshold: the first protective strength, its accuracy
  drop and the ratio there with intervals; 'not reached' and the ratio's
  note where there is none."""
  drop = lambda t, s: {"threshold": t, "strength": s, "reached": s is not None,
                       "mean": 0.02, "low": 0.01, "high": 0.03}
  panel = {
      "accuracy_drop": {"compression": [drop(0.1, None), drop(0.2, 90.0),
                                        drop(0.3, 80.0)],
                        "soteria": [drop(0.1, 60.0), drop(0.2, 40.0),
                                    drop(0.3, 40.0)]},
      "ratios": {"compression": {"mse_clamped": {"at_first_protective": [
          {"threshold": 0.1, "value": None, "low": None, "high": None,
           "note": "baseline never protective in the sweep"},
          {"threshold": 0.2, "value": None, "low": None, "high": None,
           "note": "no Soteria point reaches the baseline's accuracy"},
          {"threshold": 0.3, "value": 12.5, "low": 8.0, "high": 20.0}]}}}}
  rows = tradeoff._sensitivity_rows(panel)  # pylint: disable=protected-access
  assert rows == [
      ["compression", 0.1, "not reached", "n/a", "n/a"],
      ["compression", 0.2, 90.0, "0.02 [0.01, 0.03]",
       "no Soteria point reaches the baseline's accuracy"],
      ["compression", 0.3, 80.0, "0.02 [0.01, 0.03]", "12.5 [8, 20]"],
      ["soteria", 0.1, 60.0, "0.02 [0.01, 0.03]", "n/a"],
      ["soteria", 0.2, 40.0, "0.02 [0.01, 0.03]", "n/a"],
      ["soteria", 0.3, 40.0, "0.02 [0.01, 0.03]", "n/a"]]


def _fake_flops(monkeypatch, flops, passes=1):
  """Forward FLOPs by model key from ``flops`` and ``passes`` Soteria
  Jacobian passes per example (no model is compiled)."""
  monkeypatch.setattr(cost, "_forward_flops", lambda key: flops[key])
  monkeypatch.setattr(cost, "_jacobian_passes", lambda key: passes)


def test_train_cell_past_the_middle_without_its_snapshot_starts_again(
    tmp_path, monkeypatch):
  """A run folder with a checkpoint past the middle but no mid snapshot (a
  run that kept none, or a copied folder) is trained again from round 0,
  so the mid update attack has its parameters; with the snapshot, the
  second leg resumes."""
  run_dir = tmp_path / "run"
  run_dir.mkdir()
  monkeypatch.setattr(training, "latest_checkpoint_round",
                      lambda d: 30 if os.path.isdir(d) and os.listdir(d)
                      else None)
  legs = []

  def fake_train(config, panel, defense, strength, folder, upto):
    del config, panel, defense, strength
    legs.append(upto)
    os.makedirs(folder, exist_ok=True)
    state = types.SimpleNamespace(params={"w": np.ones(2, np.float32)})
    return {"state": state, "diverged_at_round": None,
            "metrics": [{"round": upto, "test_accuracy": 0.5}]}

  monkeypatch.setattr(tradeoff, "_train", fake_train)
  panel = types.SimpleNamespace(
      train_config=ml_collections.ConfigDict({"rounds": 50}))
  config = ml_collections.ConfigDict({"accuracy_window": 1})
  (run_dir / "ckpt").write_text("round 30")  # Past the middle, no snapshot.
  tradeoff.train_cell(config, panel, "soteria", 60.0, str(run_dir), True)
  assert legs == [25, 50]
  assert {"params_mid.msgpack", "params_final.msgpack"} <= set(
      os.listdir(run_dir))
  legs.clear()  # Now with its mid snapshot: only the second leg runs.
  tradeoff.train_cell(config, panel, "soteria", 60.0, str(run_dir), True)
  assert legs == [50]
  # Resumed with other rounds (60: mid 30, the checkpoint still past it):
  # the snapshot holds round 25, not 30, so the run starts again.
  legs.clear()
  panel.train_config.rounds = 60
  tradeoff.train_cell(config, panel, "soteria", 60.0, str(run_dir), True)
  assert legs == [30, 60]
  assert storage.read_json(str(run_dir / "params_mid.msgpack.json")) == {
      "round": 30}


def test_a_skipped_update_cell_is_attacked_again_once_its_snapshot_exists(
    tmp_path):
  """An update cell stored as "training diverged" is forgotten when the
  stage's snapshot exists (the run was retrained); one whose snapshot is
  still missing, or that ran, is kept."""
  store = harness.CellStore(str(tmp_path / "cells"))
  run_dir = tmp_path / "run"
  run_dir.mkdir()
  store.put("mid", {"skipped": "training diverged before the mid stage"})
  store.put("final", {"skipped": "training diverged before the final stage"})
  store.put("ran", {"client": 0})
  (run_dir / "params_mid.msgpack").write_bytes(b"x")
  (run_dir / "params_final.msgpack").write_bytes(b"x")
  for name, stage in (("mid", "mid"), ("ran", "final")):
    tradeoff._drop_if_skipped_but_trained(store, name, str(run_dir), stage)  # pylint: disable=protected-access
  assert store.get("mid") is None and store.get("ran") == {"client": 0}
  os.remove(run_dir / "params_final.msgpack")
  tradeoff._drop_if_skipped_but_trained(store, "final", str(run_dir), "final")  # pylint: disable=protected-access
  assert store.get("final") is not None


def test_cell_costs_leave_out_cells_that_did_less_work():
  """A skipped update attack or a training run stopped by divergence took
  less than its planned work: its seconds would lower the rates."""
  config = tradeoff_cfg.get_config("tiny")
  cells = [c for c in sweep.plan(config) if c["kind"] in ("train", "update")]
  train = next(c for c in cells if c["kind"] == "train")
  update = next(c for c in cells if c["kind"] == "update")
  done = {"cell_seconds": 5.0}
  costs = cost.cell_costs(config, [
      (train, done), (train, {**done, "diverged_at_round": 1}),
      (update, done), (update, {**done, "skipped": "training diverged"})])
  assert [(c["kind"], c["seconds"]) for c in costs] == [("train", 5.0),
                                                        ("update", 5.0)]


def test_cost_rates_budgets_and_unit_prices_by_hand():
  """Rates pool seconds over work; DLG iterations count restarts; a DLG
  outer-step price covers its inner steps; Soteria cells take the Soteria
  step price, undefended ones the plain price."""
  rate = cost.rates([
      {"model": "m", "kind": "train", "family": "plain", "seconds": 1.0,
       "work": 1.0},
      {"model": "m", "kind": "train", "family": "plain", "seconds": 9.0,
       "work": 3.0}])
  assert rate == {("m", "train", "plain"): pytest.approx(10.0 / 4.0)}
  budgets = {"dlg": {"outer_steps": 3, "inner_steps": 5, "restarts": 2},
             "gs": {"iterations": 7, "restarts": 2, "local_steps": 3}}
  assert cost._iterations_by_attack(budgets, ("dlg", "gs", "gs_mask")) == {  # pylint: disable=protected-access
      "dlg": 3 * 5 * 2, "gs": 2 * 7 * 2 * 3}

  config = tradeoff_cfg.get_config("tiny")
  config.panels.logreg_mnist.attacks = ("dlg",)
  config.attack_budgets.dlg.restarts = 3
  tc = sweep.panel_config(config, "logreg_mnist")
  unit = {"models": {"lr": {"name": "logreg", "kwargs": {}}},
          "fedavg_step": {"lr": {"mnist": {str(tc.batch_size): {
              "plain_s": 0.01, "soteria_s": 0.5}}}},
          "dlg_outer_step_s": {"lr": 0.4}, "gs_iteration_s": {"lr": 0.002},
          "dlg_inner_steps": 20}
  steps = tc.rounds * tc.clients_per_round * tc.local_steps
  dlg_its = 2 * 2 * 3  # outer x inner x restarts of the tiny budget
  want = {("train", "none"): steps * 0.01, ("train", "soteria"): steps * 0.5,
          ("attack", "none"): config.num_images * dlg_its * 0.4 / 20,
          ("attack", "soteria"): config.num_images * dlg_its * 0.4 / 20}
  cells = [c for c in sweep.plan(config) if c["kind"] != "update"]
  assert {(c["kind"], c["defense"]) for c in cells} == set(want)
  for c in cells:
    assert cost.unit_seconds(config, c, unit) == pytest.approx(
        want[(c["kind"], c["defense"])]), c


def test_cost_extrapolates_from_the_nearest_model_and_skips_finished_cells(
    tmp_path, monkeypatch):
  """An untimed model is priced from the peer nearest in forward FLOPs,
  scaled by their FLOP ratio; a finished cell costs nothing more and gives
  the rate of its kind."""
  config = tradeoff_cfg.get_config("tiny")
  config.panels.logreg_mnist.model = "mlp"
  cells = sweep.plan(config)
  # 'near' is 4x cheaper than mlp (|ln 4| < |ln 25|), 'far' 25x dearer.
  _fake_flops(monkeypatch, {"mlp/mnist": 4e3, "near/mnist": 1e3,
                            "far/mnist": 1e5})
  kinds = {(c["kind"], cost.family(c["defense"])) for c in cells}
  near = {k: 0.5 + i for i, k in enumerate(sorted(kinds))}
  # Seconds per unit of work: 'near' at `near`, 'far' 100x that.
  ref = [{"model": m, "kind": k, "family": f, "seconds": factor * r * 2.0,
          "work": 2.0}
         for m, factor in (("near/mnist", 1.0), ("far/mnist", 100.0))
         for (k, f), r in near.items()]
  storage.write_json(str(tmp_path / "ref.json"), {"cell_costs": ref})
  est = cost.estimate(config, cells, None, reference=str(tmp_path / "ref.json"),
                      units="")
  want = sum(near[(c["kind"], cost.family(c["defense"]))] * 4.0 *
             cost.work(config, c) for c in cells)
  assert est["seconds"] == pytest.approx(want)
  assert est["extrapolated"] == ["mlp/mnist from near/mnist"]

  # One finished undefended training cell: skipped, and its rate prices
  # nothing else (the other cells have no rate, no unit cost, no peer).
  config = tradeoff_cfg.get_config("tiny")
  cells = sweep.plan(config)
  _fake_flops(monkeypatch, {"logreg/mnist": 1e3})
  (done,) = [c for c in cells if c["kind"] == "train" and
             c["defense"] == "none"]
  storage.write_json(
      str(tmp_path / "run" / "cells" / f"{sweep.cell_name(done)}.json"),
      {"cell_seconds": 123.0})
  est = cost.estimate(config, cells, str(tmp_path / "run"), reference="",
                      units="")
  assert est["finished"] == 1 and est["cells"] == len(cells)
  assert est["seconds"] == 0.0 and "train" not in est["by_kind"]
  assert len(est["unknown"]) == 4  # soteria training, 2 attacks, updates


@pytest.mark.parametrize("key,want", [
    ("convnet64/mnist", 784),  # Forward mode: D = 784 < F = 2,304.
    ("convnet64/cifar10", 2304),
    ("convnet64[width=16]/mnist", 576),
    ("lenet/mnist", 588),
])
def test_soteria_jacobian_passes_are_the_fewer_of_features_and_pixels(
    key, want):
  assert cost._jacobian_passes(key) == want


def test_gpu_seconds_follow_the_flop_model(monkeypatch):
  """Training: (3 + 2 x Jacobian passes with Soteria) forwards per example
  and step; attacks: 4 (GS) forwards per iteration for all images at once;
  never faster than the floor per step or iteration."""
  config = tradeoff_cfg.get_config("tiny")
  config.num_images = 3
  fwd, features = 2e9, 7
  _fake_flops(monkeypatch, {"logreg/mnist": fwd}, features)
  tc = sweep.panel_config(config, "logreg_mnist")
  b = tc.batch_size
  steps = tc.rounds * tc.clients_per_round * tc.local_steps
  gs_its = 2 * config.attack_budgets.gs.iterations  # gs and gs_mask
  floor = cost.GPU_STEP_FLOOR_S
  want = {
      ("train", "none"): steps * max(3 * b * fwd / cost.GPU_FLOPS, floor),
      ("train", "soteria"): steps * max((3 + 2 * features) * b * fwd /
                                        cost.GPU_FLOPS, floor),
      ("attack", "none"): gs_its * max(4 * 3 * fwd / cost.GPU_FLOPS, floor)}
  assert 3 * b * fwd / cost.GPU_FLOPS > floor  # above the floor
  for c in sweep.plan(config):
    k = (c["kind"], c["defense"])
    if k in want:
      assert cost.gpu_seconds(config, c) == pytest.approx(want[k]), k
  # A tiny model takes the floor for every step.
  _fake_flops(monkeypatch, {"logreg/mnist": 1.0}, features)
  (train,) = [c for c in sweep.plan(config) if c["kind"] == "train" and
              c["defense"] == "soteria"]
  assert cost.gpu_seconds(config, train) == pytest.approx(steps * floor)
