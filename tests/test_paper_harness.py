"""The paper package's harness, batched suite, sweep plan, representation
inference and certified statistics on hand-made inputs: what each cell
measures, which attacks run, and the rules of the summaries."""

import io
import types

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from experiments.configs import tradeoff as tradeoff_cfg
from repdef_jax import attacks as attacks_lib
from repdef_jax import data as data_lib
from repdef_jax import models
from repdef_jax.paper import batched
from repdef_jax.paper import harness
from repdef_jax.paper import leakage
from repdef_jax.paper import sweep
from repdef_jax.paper import theorem1
from repdef_jax.paper import tradeoff


def _res(x_rec, labels, diverged=False):
  return attacks_lib.AttackResult(
      x_rec=np.asarray(x_rec, np.float32),
      labels_rec=np.asarray(labels, np.int32),
      loss_history=np.zeros(3, np.float32), final_loss=np.float32(0.5),
      diverged=np.bool_(diverged), iterations=np.int32(3))


def test_measure_matches_order_and_averages_the_distance():
  """Reconstructions (and their labels) in the attack's order are matched to
  the true images; input_distance is the mean over images of ||X - X'||_2."""
  x = np.random.default_rng(0).uniform(0.1, 0.8, (2, 8, 8, 1)).astype(
      np.float32)
  rec = np.stack([x[1], x[0] + 0.1])  # swapped; image 0 off by 0.1
  m, x_rec = harness.measure(_res(rec, [1, 0]), x, [0, 1], 1.0)
  np.testing.assert_allclose(x_rec, np.stack([x[0] + 0.1, x[1]]), atol=1e-6)
  assert m["label_accuracy"] == 1.0
  assert m["input_distance"] == pytest.approx(np.sqrt(64 * 0.01) / 2,
                                              rel=1e-4)
  assert m["mse_clamped"] == pytest.approx(0.01 / 2, rel=1e-3)


def test_measure_flags_a_non_finite_reconstruction_as_diverged():
  """An attack that did not flag divergence but returned a non-finite image
  is diverged (best_of leaves it out)."""
  x = np.full((1, 8, 8, 1), 0.5, np.float32)
  rec = x.copy()
  rec[0, 0, 0, 0] = np.inf
  m, _ = harness.measure(_res(rec, [0], diverged=False), x, [0], 1.0)
  assert not m["finite"] and m["diverged"]


def test_progress_eta_averages_only_the_units_computed(monkeypatch):
  monkeypatch.delenv(data_lib.QUIET_ENV, raising=False)
  clock = iter([0.0, 0.0, 20.0])
  monkeypatch.setattr(harness, "time", types.SimpleNamespace(
      perf_counter=lambda: next(clock)))
  out = io.StringIO()
  p = harness.Progress(4, "x", stream=out)
  p.step("a", skipped=True)
  p.step("b")
  assert out.getvalue().splitlines() == [
      "[x] 1/4 a (reused) elapsed 0s ETA ?",
      "[x] 2/4 b elapsed 20s ETA 40s"]


def test_overrides_give_way_to_iterations_and_restarts(monkeypatch):
  seen = []

  def fn(*args, **kwargs):
    seen.append(kwargs)
    return _res(np.zeros((1, 8, 8, 1)), [0])

  monkeypatch.setattr(harness.attacks_lib, "get_attack",
                      lambda name: _Callable(fn))
  harness.attack_gradient(None, None, None, np.zeros((1, 8, 8, 1)), [0],
                          "gs", jax.random.key(0), iterations=2, restarts=1,
                          overrides={"iterations": 50, "restarts": 4,
                                     "tv": 0.1})
  assert {k: seen[0][k] for k in ("iterations", "restarts", "tv")} == {
      "iterations": 2, "restarts": 1, "tv": 0.1}


class _Callable:
  config_cls = attacks_lib.GSConfig

  def __init__(self, fn):
    self.fn = fn

  def __call__(self, *args, **kwargs):
    return self.fn(*args, **kwargs)


def _fake_metrics(ssim):
  return {"ssim": ssim, "mse_clamped": 1 - ssim, "mse": 1 - ssim,
          "psnr": ssim, "diverged": False}


@pytest.mark.parametrize("defense, strength, mask_runs", [
    ("none", 0.0, False), ("soteria", 80.0, True)])
def test_suite_reruns_mask_attacks_only_on_pruned_gradients(
    monkeypatch, defense, strength, mask_runs):
  """gs_mask copies gs (same_as) on an unpruned gradient and runs on its own
  on a Soteria-pruned one; iDLG never gets the labels; each attack gets its
  family's budget."""
  model = models.get_model("leakage", (28, 28, 1), 10)
  keys = harness.sweep_keys(0)
  params = model.init(keys.init)
  x, y = harness.synthetic_images("mnist", 1, seed=0)
  d = batched.get_defense(defense, strength, model)
  _, shared, _ = harness.defend(model, params, d, x, y, keys.defense)
  calls = []

  def attack_gradient(model, params, shared, x, y, name, key, *,
                      give_labels, overrides):
    calls.append((name, give_labels, overrides))
    return _fake_metrics({"gs": 0.2, "gs_mask": 0.9, "idlg": 0.1}[name]), None

  monkeypatch.setattr(harness, "attack_gradient", attack_gradient)
  out = harness.attack_suite(model, params, shared, x, y,
                             ("gs_mask", "gs", "idlg"), keys.attack,
                             budgets={"gs": {"iterations": 7},
                                      "dlg": {"outer_steps": 3}})
  ran = sorted(c[0] for c in calls)
  assert ran == (["gs", "gs_mask", "idlg"] if mask_runs else ["gs", "idlg"])
  assert dict((c[0], c[1]) for c in calls)["idlg"] is False
  assert dict((c[0], c[1]) for c in calls)["gs"] is True
  assert dict((c[0], c[2]) for c in calls)["idlg"] == {"outer_steps": 3}
  mask = out["attacks"]["gs_mask"]
  if mask_runs:
    assert "same_as" not in mask and out["best"]["ssim_attack"] == "gs_mask"
  else:
    assert mask["same_as"] == "gs" and mask["ssim"] == 0.2
  assert list(out["attacks"]) == ["gs_mask", "gs", "idlg"]


@pytest.mark.parametrize("defense, strength, mask_runs", [
    ("none", 0.0, False), ("soteria", 80.0, True)])
def test_batched_suite_reruns_mask_attacks_only_on_pruned_gradients(
    monkeypatch, defense, strength, mask_runs):
  model = models.get_model("leakage", (28, 28, 1), 10)
  keys = harness.sweep_keys(0)
  params = model.init(keys.init)
  x, y = harness.synthetic_images("mnist", 2, seed=0)
  x, y = x[:, None], y[:, None]
  ka, kd = batched.image_keys(keys, [0, 1])
  d = batched.get_defense(defense, strength, model)
  _, shared, _ = batched.defend_batch(model, params, d, x, y, kd)
  calls = []

  def run_batch(attack, model, params, shared, b, keys, *, labels, **kw):
    calls.append((attack.name, labels is not None, kw))
    k = len(keys)
    return attacks_lib.AttackResult(
        np.zeros((k, b, 28, 28, 1), np.float32), np.zeros((k, b), np.int32),
        np.zeros((k, 3), np.float32), np.zeros(k, np.float32),
        np.zeros(k, bool), np.zeros(k, np.int32))

  monkeypatch.setattr(batched.attacks_lib, "run_batch", run_batch)
  entries, recs = batched.attack_suite(
      model, params, shared, x, y, ("gs_mask", "gs", "idlg"), ka,
      budgets={"gs": {"iterations": 7}, "dlg": {"outer_steps": 3}},
      keep=("gs", "gs_mask"))
  ran = sorted(c[0] for c in calls)
  assert ran == (["gs", "gs_mask", "idlg"] if mask_runs else ["gs", "idlg"])
  assert dict((c[0], c[1]) for c in calls)["idlg"] is False
  assert dict((c[0], c[1]) for c in calls)["gs"] is True
  assert recs["gs_mask"].shape == (2, 1, 28, 28, 1)
  for e in entries:
    assert ("same_as" in e["attacks"]["gs_mask"]) == (not mask_runs)


def test_load_images_refuses_a_short_split_or_falls_back(monkeypatch):
  monkeypatch.setattr(harness.data_lib, "load_with_source",
                      lambda *a, **k: (np.zeros((5, 28, 28, 1), np.uint8),
                                       np.zeros(5, np.int32),
                                       types.SimpleNamespace(kind="sample")))
  with pytest.raises(data_lib.DataNotFoundError, match="only 5 mnist"):
    harness.load_images("mnist", 8, allow_synthetic=False)
  x, y, source = harness.load_images("mnist", 8)
  assert source == "synthetic" and x.shape[0] == 8 and y.shape == (8,)


def test_a_non_default_added_key_is_a_setting(tmp_path):
  """training.ADDED_KEYS at their old default are left out (old cells stay
  valid); any other value is a setting a stored cell is checked against."""
  assert harness.cell_settings({"train": {"soteria_q": "q0", "lr": 1}},
                               sweep_streams=False) == {"train": {"lr": 1}}
  assert harness.cell_settings({"train": {"soteria_q": "q1"}},
                               sweep_streams=False) == {
                                   "train": {"soteria_q": "q1"}}
  store = harness.CellStore(str(tmp_path))
  store.get_or_run("c", dict, None, harness.cell_settings(
      {"train": {"soteria_q": "q0"}}))
  with pytest.raises(ValueError, match=r"train\.soteria_q: None -> 'q1'"):
    store.get_or_run("c", dict, None, harness.cell_settings(
        {"train": {"soteria_q": "q1"}}))


def test_a_cell_computed_on_another_copy_of_the_data_is_refused(tmp_path):
  """A run resumed on another copy of a dataset (its images in another
  order) refuses the cells it finished on the first copy; cells stored
  before the fingerprint was recorded are reused."""
  store = harness.CellStore(str(tmp_path))
  tfds = harness.data_fingerprint("tfds", np.array([3, 1, 4]))
  download = harness.data_fingerprint("download", np.array([1, 3, 4]))
  assert tfds["sha256"] != download["sha256"]
  assert harness.data_fingerprint("tfds", np.array([3, 1, 4])) == tfds
  store.get_or_run("c", lambda: {"v": 1}, None, {"lr": 1}, data=tfds)
  assert store.get("c")["data"] == tfds
  assert store.get_or_run("c", dict, None, {"lr": 1}, data=tfds)["v"] == 1
  with pytest.raises(ValueError, match=r"computed with other settings "
                     r"\(data: .*'tfds'.* -> .*'download'"):
    store.get_or_run("c", dict, None, {"lr": 1}, data=download)
  store.put("old", {"v": 2, "settings": {"lr": 1}})  # No fingerprint.
  assert store.get_or_run("old", dict, None, {"lr": 1}, data=download)[
      "v"] == 2


def test_a_cell_of_an_older_key_scheme_is_refused(tmp_path):
  """A cell that draws from the sweep's streams records the key scheme; one
  stored before it (scheme 1, no record) is refused, not mixed in."""
  store = harness.CellStore(str(tmp_path))
  config = {"train": {"lr": 1}}
  old = harness.cell_settings(config, sweep_streams=False)
  assert harness.cell_settings(config) == {
      **old, "key_scheme": harness.KEY_SCHEME}
  store.put("attack", {"v": 1, "settings": old})
  with pytest.raises(ValueError, match=r"key_scheme: None -> 2"):
    store.get_or_run("attack", dict, None, harness.cell_settings(config))


def test_tradeoff_records_the_key_scheme_on_cells_that_draw_sweep_keys():
  """Training cells draw FedAvg's streams only (the 90 finished training
  runs of a scheme-1 workdir stay valid); attack and update cells record the
  scheme."""
  config = tradeoff_cfg.get_config("tiny")
  seen = {}
  for cell in sweep.plan(config):
    seen.setdefault(cell["kind"], "key_scheme" in tradeoff.cell_settings(
        config, cell))
  assert seen == {"train": False, "attack": True, "update": True}


def test_batched_suite_returns_a_kept_mask_attack_without_its_plain_one(
    monkeypatch):
  """recs holds every attack in ``keep`` (docstring), also a *_mask attack
  that copied its plain attack on an unpruned gradient."""
  model = models.get_model("logreg", (8, 8, 1), 4)
  keys = harness.sweep_keys(0)
  params = model.init(keys.init)
  x = np.full((1, 1, 8, 8, 1), 0.5, np.float32)
  y = np.zeros((1, 1), np.int32)
  ka, kd = batched.image_keys(keys, [0])
  _, shared, _ = batched.defend_batch(
      model, params, batched.get_defense("none", 0.0, model), x, y, kd)
  monkeypatch.setattr(batched.attacks_lib, "run_batch",
                      lambda attack, model, params, shared, b, keys, **kw:
                      attacks_lib.AttackResult(
                          np.zeros((1, 1, 8, 8, 1), np.float32),
                          np.zeros((1, 1), np.int32),
                          np.zeros((1, 3), np.float32), np.zeros(1, np.float32),
                          np.zeros(1, bool), np.zeros(1, np.int32)))
  _, recs = batched.attack_suite(model, params, shared, x, y,
                                 ("gs", "gs_mask"), ka, keep=("gs_mask",))
  assert set(recs) == {"gs_mask"}


# ---------------------------------------------------------------- theorem1


def _image(distance, ssim, diverged, bound=1.0):
  return {"certified_bound": bound, "pruned_fraction": 0.5,
          "attacks": {"gs": {"distance": distance, "empirical_bound": 0.0,
                             "ssim": ssim, "diverged": diverged}}}


def test_certified_rows_leave_out_diverged_runs_and_lost_seeds():
  """Per rate: a diverged run is counted, not averaged; when one of two
  seeds keeps values there is no interval (over one seed's images)."""
  c = ml_collections.ConfigDict()
  c.success_ssim = 0.6
  c.panels = {"p": ml_collections.ConfigDict(dict(
      dataset="mnist", model="logreg", attacks=("gs",)))}
  cells = {(0, 0.0): {"images": [_image(0.0, 0.9, False)] * 2},
           (1, 0.0): {"images": [_image(0.0, 0.9, False)] * 2},
           (0, 50.0): {"images": [_image(2.0, 0.1, False),
                                  _image(3.0, 0.2, False)]},
           (1, 50.0): {"images": [_image(9.0, 0.9, True),
                                  _image(9.0, 0.9, True)]}}
  panel = theorem1.analyse_panel(c, "p", cells)
  row = {r["rate"]: r for r in panel["rates"]}[50.0]["gs"]
  assert row["diverged"] == 2
  assert row["distance"]["mean"] == pytest.approx(2.5)
  assert row["distance"]["n"] == 2
  assert row["distance"]["low"] is None and row["distance"]["high"] is None
  assert row["ssim"]["low"] is None


def test_certified_cell_clamps_the_reconstruction_and_counts_pruned_rows(
    monkeypatch):
  model = models.get_model("leakage", (28, 28, 1), 10)
  keys = harness.sweep_keys(0)
  params = model.init(keys.init)
  x, y = harness.synthetic_images("mnist", 1, seed=0)
  x, y = x[:, None], y[:, None]
  panel = types.SimpleNamespace(
      model=model, params=params, keys=keys, indices=np.array([7]),
      images=x, labels=y, attacks=("gs",), source="synthetic",
      sigma=theorem1._sigma(model, params, jnp.asarray(x[:, 0])))
  rec = x.copy()
  rec[0, 0, :5, :5, 0] = 5.0  # far outside the pixel box
  m = {"input_distance": 123.0, "mse": 1.0, "mse_clamped": 0.5, "ssim": 0.3,
       "diverged": False, "seconds": 1.0}
  monkeypatch.setattr(batched, "attack_suite", lambda *a, **k: (
      [{"attacks": {"gs": m}}], {"gs": rec}))
  config = ml_collections.ConfigDict(dict(attack_budgets={}, give_labels=True))
  cell = theorem1.rate_cell(config, panel, 80.0)
  (img,) = cell["images"]
  expected = np.sqrt(np.sum((1.0 - x[0, 0, :5, :5, 0]) ** 2))
  assert img["attacks"]["gs"]["distance"] == pytest.approx(expected, rel=1e-5)
  assert img["attacks"]["gs"]["distance_raw"] == 123.0
  assert img["index"] == 7
  assert 0.7 <= img["pruned_fraction"] <= 0.9  # Soteria 80 %
  assert theorem1.rate_cell(config, panel, 0.0)["images"][0][
      "pruned_fraction"] == 0.0


# ---------------------------------------------------------------- leakage


def _dev(corr, correct):
  return {"correlation": {"fc0": {str(i): v for i, v in enumerate(corr)}},
          "classes_correct": dict(zip(leakage.RULES, correct))}


def test_inference_summary_over_seeds_shares_and_detection():
  cells = [{"seed": 0, "layers": ["fc0"], "devices": [
               _dev((0.9, 0.7), (True, False, True)),
               _dev((0.85, 0.95), (False, False, True))]},
           {"seed": 1, "layers": ["fc0"], "devices": [
               _dev((0.5,), (True, True, True))]}]
  out = leakage.summarize_inference(cells)
  c = out["correlation"]["fc0"]
  assert c["mean"] == pytest.approx((0.85 + 0.5) / 2)  # mean of seed means
  assert c["n"] == 5 and c["groups"] == 2
  assert c["share_above_0.8"]["value"] == pytest.approx(3 / 5)
  assert c["per_seed_mean"] == pytest.approx([0.85, 0.5])
  norm = out["class_detection"]["norm"]
  assert norm["mean"] == pytest.approx(0.75)  # seeds 0.5 and 1.0
  assert norm["pooled"] == pytest.approx(2 / 3) and norm["devices"] == 3
  assert out["specificity"] == {}


def test_reconstruction_claim_is_decided_at_half_success():
  """The whole-gradient attack reconstructing exactly half of the images is
  enough for a verdict (inconclusive only below half)."""
  ci = leakage.stats.mean_ci
  r = {"ssim_representation_minus_gradient": ci([0.0, 0.01, -0.01]),
       "gradient": {"ssim": ci([0.5, 0.7]), "mse": ci([0.1, 0.1])},
       "representation": {"mse": ci([0.1, 0.1])},
       "conv_gradient": {"mse": ci([0.5, 0.6])},
       "gradient_success_rate": 0.5}
  rows = leakage.claims(None, {"one_image": r})
  assert not rows[0]["verdict"].startswith("inconclusive"), rows[0]
  r["gradient_success_rate"] = 0.49
  rows = leakage.claims(None, {"one_image": r})
  assert rows[0]["verdict"].startswith("inconclusive")


def test_measure_clamps_only_the_clamped_metrics():
  """mse is raw (unclamped); mse_clamped clamps the reconstruction to the
  pixel box first (a DLG image may leave it)."""
  x = np.full((1, 4, 4, 1), 0.5, np.float32)
  m, _ = harness.measure(_res(np.full_like(x, 2.0), [0]), x, [0], 1.0)
  assert m["mse"] == pytest.approx(1.5 ** 2)
  assert m["mse_clamped"] == pytest.approx(0.5 ** 2)


@pytest.mark.parametrize("extra, match", [
    ({"num_images": 4, "image_pool": 2},
     r"image_pool must be an int >= 4 .*got 2"),
    ({"panels": {"a": {"family": "gz"}}},
     r"panels\.a\.family: unknown attack 'gz'"),
    ({"update_attack": {"attacks": ("gs", "gz")}},
     r"update_attack\.attacks: unknown attack 'gz'"),
    ({"variants": {"reference": (40.0, 150.0)}}, r"variants\.reference"),
    ({"success_ssim": 5.0},
     r"success_ssim must be an SSIM level in \(-1, 1\]; got 5\.0\."),
    ({"thresholds": (0.1, -1.0)}, r"thresholds must be an SSIM level"),
    ({"accuracy_window": 0}, r"accuracy_window must be an int >= 1 \(the "
     r"last evaluations averaged\), got 0\."),
    ({"update_attack": {"batch": 0}},
     r"update_attack\.batch must be an int >= 1, got 0\."),
    ({"update_attack": {"stages": ("first", "bogus")}},
     r"update_attack\.stages must be among first, mid, final; got 'bogus'\."),
    ({"attack_budgets": {"gs": {"normalization": ((0.5,), (0.0,))}}},
     r"attack_budgets\.gs: normalization needs finite means and stds > 0"),
    ({"panels": {"a": {"attack_budgets": {"gs": {"normalization": (0.5,)}}}}},
     r"panels\.a\.attack_budgets\.gs: normalization must be \(mean, std\)"),
    ({"attack_budgets": {"dlg": {"normalization": ((0.5,), (0.2,))}}},
     r"attack_budgets\.dlg\.normalization: only GS takes a normalization"),
])
def test_part_config_check_names_each_bad_setting(extra, match):
  config = ml_collections.ConfigDict({"seeds": (0, 1), **extra})
  with pytest.raises(ValueError, match=match):
    harness.check_part_config(config)


def test_pick_images_draws_by_seed_not_the_first_images():
  picks = [set(batched.pick_images("mnist", 4, harness.sweep_keys(s),
                                   pool=64)[0].tolist()) for s in (0, 1)]
  assert all(len(p) == 4 and p <= set(range(64)) for p in picks)
  assert picks[0] != picks[1] and picks[0] != set(range(4))


def test_plan_attacks_real_updates_only_at_the_update_cells():
  config = tradeoff_cfg.get_config("medium")
  cells = sweep.plan(config)
  upd = {(c["defense"], c["strength"]) for c in cells if c["kind"] == "update"}
  # medium's update_attack.cells, written out.
  assert upd == {("none", 0.0), ("soteria", 40.0), ("soteria", 80.0),
                 ("compression", 90.0), ("dp_gaussian", 0.01)}
  assert len(upd) < len(sweep.strengths(config))
  # One update cell per (defense, strength), panel, seed and stage.
  n = len(config.panels) * len(config.seeds) * len(config.update_attack.stages)
  assert n == 2 * 3 * 3
  assert sum(c["kind"] == "update" for c in cells) == len(upd) * n


def test_update_budgets_unroll_the_clients_local_steps():
  config = sweep.default_config()
  config.update_attack.local_steps = 7
  config.update_attack.unroll = True
  gs = sweep.budgets(config, "update", "convnet_mnist")["gs"]
  assert (gs["local_steps"], gs["local_lr"]) == (7, 0.05)
  assert "local_steps" not in sweep.budgets(config, "attack")["gs"]
