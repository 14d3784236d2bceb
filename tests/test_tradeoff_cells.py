"""The trade-off's cells and tables on hand-made inputs: the update stages'
rounds, clients and keys, what a training cell records, each table column
from its statistic, the plot's curves, the analysis of update stages."""

import os
import types

import flax.serialization
import jax
import ml_collections
import numpy as np
import pytest

from experiments.configs import tradeoff as tradeoff_cfg
from repdef_jax import fedavg
from repdef_jax import models
from repdef_jax import storage
from repdef_jax.paper import harness
from repdef_jax.paper import tradeoff


def _key_bytes(k):
  return np.asarray(jax.random.key_data(k)).tobytes()


def _update_env(monkeypatch, tmp_path, seed=0):
  model = models.get_model("logreg", (4, 4, 1), 3)
  keys = harness.sweep_keys(seed)
  params0 = model.init(keys.init)
  rng = np.random.default_rng(0)
  images = rng.integers(0, 256, (12, 4, 4, 1), dtype=np.uint8)
  labels = np.arange(12, dtype=np.int32) % 3
  idx = [np.arange(4 * c, 4 * c + 4) for c in range(3)]
  monkeypatch.setattr(tradeoff, "_client_data",
                      lambda *a: (images, labels, idx))
  monkeypatch.setattr(tradeoff.sweep, "budgets", lambda *a, **k: {})
  seen = {}

  real_client_keys = fedavg.client_keys

  def spy_client_keys(run_keys, rnd, cid):
    seen.update(client_round=int(rnd), client_keys=real_client_keys(
        run_keys, rnd, cid))
    return seen["client_keys"]
  monkeypatch.setattr(fedavg, "client_keys", spy_client_keys)

  def fake_update(model, fcfg, params, x, y, mask, train_key, noise_key):
    return (jax.tree_util.tree_map(lambda p: jax.numpy.full_like(p, 0.3),
                                   params), {})
  monkeypatch.setattr(fedavg, "client_update", fake_update)

  def fake_suite(model, params, shared, x, y, names, key, **kwargs):
    seen.update(params=params, key=key)
    m = {"ssim": 0.5, "mse": 0.1, "mse_clamped": 0.1, "psnr": 10.0,
         "diverged": False}
    return {"attacks": {"gs": m}, "best": harness.best_of({"gs": m})}
  monkeypatch.setattr(tradeoff.harness, "attack_suite", fake_suite)
  config = ml_collections.ConfigDict(dict(
      data_dir="", give_labels=True, update_attack=dict(
          batch=2, local_steps=2, attacks=("gs",))))
  panel = types.SimpleNamespace(
      name="p", seed=seed, model=model, keys=keys, params0=params0,
      train_config=ml_collections.ConfigDict(dict(
          rounds=4, dataset="mnist", num_clients=3, classes_per_client=1,
          samples_per_class=4, client_lr=0.1, l2=0.01, local_steps=5,
          batch_size=10)))
  run_dir = tmp_path / f"run{seed}"
  run_dir.mkdir()
  for st, v in (("mid", 1.0), ("final", 2.0)):
    snap = jax.tree_util.tree_map(lambda p, v=v: np.full_like(p, v), params0)
    (run_dir / f"params_{st}.msgpack").write_bytes(
        flax.serialization.to_bytes(snap))
  return config, panel, str(run_dir), seen


def test_update_stages_are_rounds_0_half_and_last_with_their_keys(
    monkeypatch, tmp_path):
  """first/mid/final are rounds 0, rounds // 2 and rounds; each stage
  attacks its own snapshot with the attack key of its round, and the
  client runs with the training's client keys of that round."""
  config, panel, run_dir, seen = _update_env(monkeypatch, tmp_path)
  attack_keys = set()
  for stage, rnd, value in (("first", 0, None), ("mid", 2, 1.0),
                            ("final", 4, 2.0)):
    out = tradeoff.update_cell(config, panel, "none", 0.0, stage, run_dir)
    assert out["round"] == rnd, stage
    if value is not None:
      for leaf in jax.tree_util.tree_leaves(seen["params"]):
        np.testing.assert_array_equal(leaf, value)
    client_key, attack_key = harness.update_keys(panel.keys, rnd)
    assert _key_bytes(seen["key"]) == _key_bytes(attack_key), stage
    assert out["client"] == int(jax.random.randint(client_key, (), 0, 3))
    attack_keys.add(_key_bytes(seen["key"]))
    # The client's training keys are those of the stage's round.
    assert seen["client_round"] == rnd, stage
  assert len(attack_keys) == 3  # one attack key per stage


def test_the_attacked_client_is_drawn_per_stage(monkeypatch, tmp_path):
  """The attacked client is drawn per (seed, stage): over a few seeds the
  three stages do not always attack the same client."""
  clients = []
  for seed in range(4):
    config, panel, run_dir, _ = _update_env(monkeypatch, tmp_path, seed)
    clients.append([tradeoff.update_cell(config, panel, "none", 0.0, st,
                                         run_dir)["client"]
                    for st in ("first", "mid", "final")])
  assert any(len(set(c)) > 1 for c in clients), clients


def _summary(mean, low, high, groups=None, median=None):
  out = {"mean": mean, "low": low, "high": high, "n": 4,
         "median": mean if median is None else median}
  if groups is not None:
    out["groups"] = groups
  return out


def _table_panel():
  per = lambda ssim, mse_c, mse, div, groups: {  # noqa: E731
      "ssim": _summary(ssim, ssim - 0.1, ssim + 0.1, groups),
      "mse_clamped": _summary(mse_c, mse_c / 2, mse_c * 2, groups),
      "mse": _summary(mse, mse / 2, mse * 2, groups, median=mse * 3),
      "psnr": _summary(10.0, 9.0, 11.0, groups),
      "success_rate": 0.25, "diverged": div}
  point = {"defense": "soteria", "strength": 95.0, "images": 8,
           # mean_ci of the seeds' accuracies: no "groups" key.
           "accuracy_summary": {"mean": 0.9, "low": 0.8, "high": 1.0,
                                "n": 3, "dropped": 0},
           "per_attack": {"best": per(0.3, 0.02, 0.5, 1, 3),
                          "dlg": per(0.2, 0.04, 0.7, 3, 1),
                          "gs": per(0.3, 0.02, 0.5, 0, 3)}}
  update = {"best": per(0.4, 0.03, 0.6, 0, 3), "gs": per(0.4, 0.03, 0.6, 2, 3)}
  return {"model": "leakage", "dataset": "mnist", "attacks": ["dlg", "gs"],
          "points": [point], "undefended_success_rate": {"best": 1.0},
          "updates": {"soteria/95": {"final": update}},
          "accuracy_drop": {}, "ratios": {}}


def test_tables_render_each_column_from_its_statistic():
  """Main table: accuracy with its interval, clamped MSE (not raw), raw MSE
  median, the best-of's all-diverged count; per attack: "k div" only where
  k > 0; real updates: clamped MSE and each attack's diverged count."""
  out = tradeoff.tables({"p": _table_panel()}, 0.6, num_seeds=3)
  main = next(t for t in out if "best-of-attacks privacy" in t["title"])
  assert main["rows"] == [["soteria", 95.0, "0.9 [0.8, 1]",
                           "0.02 [0.01, 0.04]", "0.3 [0.2, 0.4]", 1.5, 0.25,
                           "1/8"]]
  per_attack = next(t for t in out if "SSIM per attack" in t["title"])
  # dlg: values from one seed of three: no interval, 3 diverged runs;
  # gs: no diverged run, so no "(0 div)".
  assert per_attack["rows"] == [["soteria", 95.0, "0.2 (3 div)",
                                 "0.3 [0.2, 0.4]"]]
  upd = next(t for t in out if "real multi-step updates" in t["title"])
  assert upd["rows"] == [["soteria/95", "final", "0.4 [0.3, 0.5]",
                          "0.03 [0.015, 0.06]", 0.25,
                          "0.4 [0.3, 0.5] (2 div)"]]


def test_two_seed_run_drops_one_seed_intervals():
  """The one-seed rule applies from two seeds on (not only from three)."""
  out = tradeoff.tables({"p": _table_panel()}, 0.6, num_seeds=2)
  per_attack = next(t for t in out if "SSIM per attack" in t["title"])
  assert per_attack["rows"][0][2] == "0.2 (3 div)"


def test_update_claims_without_an_undefended_update_are_inconclusive():
  """With no undefended real update at a stage (the medium preset attacks
  Soteria's updates only, or the undefended run diverged) the attacks are
  not shown to work there: the claim is not decided."""
  config = tradeoff_cfg.get_config("tiny")
  low = {"ssim": _summary(0.05, 0.01, 0.09, 3), "success_rate": 0.0}
  panel = {"model": "m", "dataset": "d",
           "updates": {"soteria/80": {"final": {"best": low}}}}
  claims = tradeoff.update_claims("p", panel, config)
  assert [c["verdict"] for c in claims] == [
      "inconclusive (attacks fail undefended)"]


def test_plot_draws_each_defense_from_the_undefended_point(monkeypatch,
                                                           tmp_path):
  """Each defense's curve starts at the undefended point, x = best-of
  clamped MSE, y = accuracy, in strength order."""
  figs = []
  monkeypatch.setattr(storage, "save_figure",
                      lambda fig, path, **kw: figs.append(fig))
  pt = lambda d, s, mse_c, acc: {  # noqa: E731
      "defense": d, "strength": s,
      "accuracy_summary": {"mean": acc, "low": None, "high": None},
      "per_attack": {"best": {"mse_clamped": {"mean": mse_c, "low": None},
                              "mse": {"mean": 100 * mse_c, "low": None}}}}
  panel = {"model": "m", "dataset": "d", "points": [
      pt("soteria", 80.0, 0.3, 0.85), pt("none", 0.0, 0.01, 0.9),
      pt("soteria", 40.0, 0.1, 0.88)]}
  tradeoff.plot({"panels": {"p": panel}}, str(tmp_path / "x.png"))
  line = figs[0].axes[0].lines[0]
  np.testing.assert_allclose(np.asarray(line.get_xdata(), float),
                             [0.01, 0.1, 0.3])
  np.testing.assert_allclose(np.asarray(line.get_ydata(), float),
                             [0.9, 0.88, 0.85])


def test_train_cell_accuracy_window_final_and_no_snapshot_when_diverged(
    tmp_path, monkeypatch):
  """Accuracy is the mean of the last accuracy_window evaluations (records
  without one skipped), final_accuracy the last one; a run that diverged
  keeps no snapshot, so its update cells are skipped, not attacked on
  diverged parameters."""
  diverged = {"at": None}

  def fake_train(config, panel, defense, strength, folder, upto):
    os.makedirs(folder, exist_ok=True)
    state = types.SimpleNamespace(params={"w": np.ones(2, np.float32)})
    return {"state": state, "diverged_at_round": diverged["at"],
            "metrics": [{"round": 0, "test_accuracy": 0.1},
                        {"round": 1, "test_accuracy": 0.3},
                        {"round": 2, "train_loss": 1.0},
                        {"round": 3, "test_accuracy": 0.5,
                         "defense/pruned": 2}]}
  monkeypatch.setattr(tradeoff, "_train", fake_train)
  panel = types.SimpleNamespace(
      train_config=ml_collections.ConfigDict({"rounds": 4}))
  config = ml_collections.ConfigDict({"accuracy_window": 2})
  out = tradeoff.train_cell(config, panel, "soteria", 60.0,
                            str(tmp_path / "ok"), True)
  assert out["accuracy"] == pytest.approx(0.4)
  assert out["final_accuracy"] == pytest.approx(0.5)
  assert out["rounds"] == 3 and out["defense/pruned"] == 2.0
  diverged["at"] = 3
  tradeoff.train_cell(config, panel, "soteria", 60.0, str(tmp_path / "div"),
                      True)
  assert not [n for n in os.listdir(tmp_path / "div")
              if n.startswith("params_")]


def _entry(ssim):
  m = {"ssim": ssim, "mse": 1 - ssim, "mse_clamped": 1 - ssim, "psnr": 10.0,
       "diverged": False}
  return {"attacks": {"gs": dict(m), "gs_mask": dict(m)},
          "best": harness.best_of({"gs": m})}


def test_analyse_keeps_update_stages_apart_and_leaves_skipped_out():
  """Each stage's summary is of that stage's update cells only; a stage
  skipped because training diverged has no value (and does not break the
  analysis)."""
  config = tradeoff_cfg.get_config("tiny")
  cells = []
  for d, s in (("none", 0.0), ("soteria", 50.0)):
    base = {"panel": "logreg_mnist", "seed": 0, "defense": d, "strength": s}
    cells.append(({**base, "kind": "train"}, {"accuracy": 0.8}))
    cells.append(({**base, "kind": "attack"},
                  {"images": [{"index": 3, "label": 1, **_entry(0.7)}]}))
  base = {"panel": "logreg_mnist", "seed": 0, "defense": "soteria",
          "strength": 50.0, "kind": "update"}
  cells.append(({**base, "stage": "first"},
                {"client": 0, "round": 0, **_entry(0.9)}))
  cells.append(({**base, "stage": "final"},
                {"skipped": "training diverged before the final stage"}))
  panel = tradeoff.analyse(config, cells)["logreg_mnist"]
  stages = panel["updates"]["soteria/50"]
  assert stages["first"]["best"]["ssim"]["mean"] == pytest.approx(0.9)
  assert stages["final"]["best"]["ssim"]["mean"] is None
  assert stages["final"]["best"]["success_rate"] is None
