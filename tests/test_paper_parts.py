"""The paper parts other than the trade-off: verdict rules and behaviour.

Verdicts are checked on constructed inputs whose answer is known from the
rules of docs/evaluation.md; the batched attack suite against the one-image
harness; the cell store against reusing a cell computed under other
settings; and, on a fixed seed, that the adaptive ``gs_mask`` attack
recovers an image through Soteria on the leakage model where the plain
attack is stopped.
"""

import io
import os
import types

import jax
import ml_collections
import numpy as np
import pytest

from repdef_jax import models
from repdef_jax import storage
from repdef_jax.paper import adaptive
from repdef_jax.paper import batched
from repdef_jax.paper import convergence
from repdef_jax.paper import harness
from repdef_jax.paper import leakage
from repdef_jax.paper import stats
from repdef_jax.paper import theorem1
from repdef_jax.paper import visual


def _ci(values):
  return stats.mean_ci(values)


# --------------------------------------------------------------------------
# Representation leakage.


def _recon(rep_ssim, grad_ssim, mse):
  """A reconstruction summary from per-image SSIMs and per-source MSEs."""
  out = {"ssim_representation_minus_gradient": stats.paired_difference_ci(
      rep_ssim, grad_ssim)}
  for source, values in mse.items():
    out[source] = {"mse": _ci(values), "ssim": _ci(
        rep_ssim if source == "representation" else grad_ssim)}
  return out


def _verdicts(rows):
  return {r["claim"].split(" (")[0]: r["verdict"] for r in rows}


def test_repinfer_claims_follow_rules():
  inference = {"layers": ["fc0", "head"], "seeds": [0, 1, 2],
               "correlation": {
                   "fc0": {**_ci([0.95, 0.9, 0.97, 0.93]),
                           "share_above_0.8": {"value": 1.0}},
                   "head": {**_ci([0.5, 0.9, 0.7, 0.95]),
                            "share_above_0.8": {"value": 0.5}}}}
  rows = leakage.claims(inference, {})
  assert [r["verdict"] for r in rows] == ["held", "inconclusive"]
  inference["correlation"]["head"].update(_ci([0.5, 0.6, 0.55, 0.52]))
  assert leakage.claims(inference, {})[1]["verdict"] == "did not hold"

  close = dict(representation=[1e-3, 2e-3, 1.5e-3],
               gradient=[1e-4, 2e-4, 1.2e-4], conv_gradient=[0.1, 0.12, 0.09])
  # Representation as good as the gradient (within 0.1 SSIM); conv fails.
  v = _verdicts(leakage.claims(None, {"one_image": _recon(
      [0.97, 0.99, 0.98], [1.0, 0.99, 1.0], close)}))
  assert v == {"Reconstruction from the inferred representation works as "
               "from the whole gradient": "held",
               "Conv-layer gradients alone fail to reconstruct": "held"}
  # Representation much worse; conv-only as good as the representation.
  worse = dict(close, conv_gradient=[1e-3, 2e-3, 1.5e-3])
  v = _verdicts(leakage.claims(None, {"update": _recon(
      [0.3, 0.35, 0.32], [1.0, 0.99, 1.0], worse)}))
  assert set(v.values()) == {"did not hold", "inconclusive"}
  worse["conv_gradient"] = [1e-6, 2e-6, 1e-6]  # below both
  v = _verdicts(leakage.claims(None, {"update": _recon(
      [0.3, 0.35, 0.32], [1.0, 0.99, 1.0], worse)}))
  assert set(v.values()) == {"did not hold"}
  # The whole-gradient attack itself fails (1 image in 3 reconstructed):
  # neither comparison measures anything.
  failed = _recon([0.1, 0.12, 0.7], [0.05, 0.1, 0.65], close)
  failed["gradient_success_rate"] = 1 / 3
  v = _verdicts(leakage.claims(None, {"update": failed}))
  assert set(v.values()) == {"inconclusive (whole-gradient attack fails: "
                             "reconstructs 0.333 of the images)"}


def test_conv_claim_needs_the_conv_interval_above_both_sources():
  """Conv-only MSE above the whole gradient's interval but overlapping the
  representation's is not "held" (above both is the rule)."""
  mse = dict(representation=[1e-3, 2e-3, 1.5e-3],
             gradient=[1e-5, 2e-5, 1.5e-5], conv_gradient=[3e-3, 4e-3, 3.5e-3])
  conv, rep, grad = (_ci(mse[k]) for k in ("conv_gradient", "representation",
                                           "gradient"))
  assert grad["high"] < conv["low"] < rep["high"]  # the construction
  v = _verdicts(leakage.claims(None, {"one_image": _recon(
      [0.97, 0.99, 0.98], [1.0, 0.99, 1.0], mse)}))
  assert v["Conv-layer gradients alone fail to reconstruct"] == (
      "inconclusive")


# --------------------------------------------------------------------------
# Certified bound.


def _cert_cells(distances, bounds, ssim0, diverged0=None, diverged=None):
  """Cells of one seed: rate 0 with the given undefended SSIMs, rate 50 with
  the given distances and bounds (one attack 'gs'); ``diverged0`` and
  ``diverged`` flag the attack's runs at rate 0 and 50 (default: none)."""
  none = (False,) * len(ssim0)
  def image(d, b, s, div):
    return {"certified_bound": b, "pruned_fraction": 0.5,
            "attacks": {"gs": {"distance": d, "empirical_bound": 0.0,
                               "ssim": s, "diverged": div}}}
  return {(0, 0.0): {"images": [image(0.0, 0.0, s, v) for s, v in zip(
              ssim0, diverged0 or none)]},
          (0, 50.0): {"images": [image(d, b, 0.0, v) for d, b, v in zip(
              distances, bounds, diverged or none)]}}


def _cert_config():
  c = ml_collections.ConfigDict()
  c.success_ssim = 0.6
  c.panels = {"p": ml_collections.ConfigDict(dict(
      dataset="mnist", model="logreg", attacks=("gs",)))}
  return c


@pytest.mark.parametrize("distances, ssim0, expected, pairs", [
    ((2.0, 3.0), (0.9, 0.9), "held", 2),
    ((2.0, 0.5), (0.9, 0.9), "did not hold", 2),  # one pair below the bound
    ((2.0, 0.5), (0.9, 0.1), "held", 1),  # failed undefended: not counted
    ((2.0, 0.5), (0.1, 0.1), "inconclusive (attack fails undefended)", 0),
])
def test_certified_claim_counts_only_attacks_that_work(distances, ssim0,
                                                      expected, pairs):
  config = _cert_config()
  panel = theorem1.analyse_panel(config, "p", _cert_cells(
      distances, (1.0, 1.0), ssim0))
  assert panel["bound_holds"]["gs"]["pairs"] == pairs
  (row,) = theorem1.claims(config, {"p": panel})
  assert row["verdict"] == expected


@pytest.mark.parametrize("distances, ssim0, diverged0, diverged, expected, "
                         "pairs, diverged_pairs", [
    # At the bound is at or above it; an SSIM at the threshold is a success.
    ((1.0, 2.0), (0.9, 0.6), None, None, "held", 2, 0),
    ((2.0, 0.5), (0.9, 0.6), None, None, "did not hold", 2, 0),
    # A run that diverged under the defense is not a pair (counted apart).
    ((2.0, 0.5), (0.9, 0.9), None, (False, True), "held", 1, 1),
    # Nor is an image whose undefended run diverged, whatever its SSIM.
    ((2.0, 0.5), (0.9, 0.9), (False, True), None, "held", 1, 0),
])
def test_certified_claim_boundaries_and_diverged_runs(
    distances, ssim0, diverged0, diverged, expected, pairs, diverged_pairs):
  config = _cert_config()
  panel = theorem1.analyse_panel(config, "p", _cert_cells(
      distances, (1.0, 1.0), ssim0, diverged0, diverged))
  holds = panel["bound_holds"]["gs"]
  assert (holds["pairs"], holds["diverged_pairs"]) == (pairs, diverged_pairs)
  (row,) = theorem1.claims(config, {"p": panel})
  assert row["verdict"] == expected


# --------------------------------------------------------------------------
# Adaptive attacks.


def test_adaptive_verdict_rule():
  low = _ci([0.05, 0.1, 0.08])
  high = _ci([0.9, 0.95, 0.85])
  straddle = _ci([0.0, 0.5, 0.1])
  assert adaptive.verdict(low, 0.8, 0.2) == "holds"
  assert adaptive.verdict(high, 0.8, 0.2) == "fails"
  assert adaptive.verdict(straddle, 0.8, 0.2) == "inconclusive"
  # An attack that fails undefended measures nothing, however low its SSIM.
  assert adaptive.verdict(low, 0.4, 0.2).startswith("n/a")
  assert adaptive.verdict(low, None, 0.2).startswith("n/a")


def test_adaptive_analyse_pairs_each_attack_with_its_undefended_run():
  config = ml_collections.ConfigDict(dict(
      success_ssim=0.6, unrecognisable=0.2,
      panels={"p": ml_collections.ConfigDict(dict(
          family="gs", model="leakage", dataset="mnist"))}))

  def images(gs, drop, mask):
    out = []
    for a, b, c in zip(gs, drop, mask):
      attacks = {name: {"ssim": v, "mse_clamped": 1 - v, "mse": 1 - v,
                        "psnr": 10 * v, "diverged": False}
                 for name, v in (("gs", a), ("gs_drop", b), ("gs_mask", c))}
      out.append({"attacks": attacks,
                  "best": harness.best_of(attacks)})
    return out

  base = {"panel": "p", "seed": 0, "stage": "init"}
  cells = [({**base, "variant": "none", "rate": 0.0},
            {"images": images([0.99, 0.98, 0.97], [0.3, 0.2, 0.1],
                              [0.99, 0.98, 0.97])}),
           ({**base, "variant": "reference", "rate": 80.0},
            {"images": images([0.05, 0.02, 0.01], [0.1, 0.1, 0.1],
                              [0.95, 0.97, 0.99])})]
  rows = adaptive.analyse(config, cells)
  (defended,) = [r for r in rows if r["variant"] != "none"]
  verdicts = {n: a["verdict"] for n, a in defended["attacks"].items()}
  assert verdicts == {"gs": "holds", "gs_drop": "n/a (attack fails "
                      "undefended)", "gs_mask": "fails", "best": "fails"}
  (row,) = adaptive.claims(config, rows)
  assert row["value"] == 0.0 and row["verdict"] == "reported"


def _adaptive_images(ssims, diverged=()):
  """One image per tuple of (gs, gs_drop, gs_mask) SSIMs; ``diverged``: the
  (image, attack) runs that diverged."""
  out = []
  for i, values in enumerate(ssims):
    attacks = {name: {"ssim": v, "mse_clamped": 1 - v, "mse": 1 - v,
                      "psnr": 10 * v, "diverged": (i, name) in diverged}
               for name, v in zip(("gs", "gs_drop", "gs_mask"), values)}
    out.append({"attacks": attacks, "best": harness.best_of(attacks)})
  return out


def _adaptive_config():
  return ml_collections.ConfigDict(dict(
      success_ssim=0.6, unrecognisable=0.2,
      panels={"p": ml_collections.ConfigDict(dict(
          family="gs", model="leakage", dataset="mnist"))}))


def test_adaptive_undefended_divergence_fails_and_half_success_decides():
  """A diverged undefended run is a failed attack (counted in the success
  rate); a rate of exactly 0.5 is enough for a verdict."""
  base = {"panel": "p", "seed": 0, "stage": "init"}
  # gs undefended: 0.99, 0.6 (at the threshold), 0.1, diverged -> 2 / 4.
  undefended = _adaptive_images(
      [(0.99, 0.99, 0.99), (0.6, 0.99, 0.99), (0.1, 0.99, 0.99),
       (0.9, 0.99, 0.99)], diverged={(3, "gs")})
  defended = _adaptive_images([(0.01, 0.9, 0.9), (0.02, 0.9, 0.9),
                               (0.03, 0.9, 0.9), (0.02, 0.9, 0.9)])
  rows = adaptive.analyse(_adaptive_config(), [
      ({**base, "variant": "none", "rate": 0.0}, {"images": undefended}),
      ({**base, "variant": "reference", "rate": 80.0},
       {"images": defended})])
  (row,) = [r for r in rows if r["variant"] != "none"]
  gs = row["attacks"]["gs"]
  assert gs["undefended_success_rate"] == pytest.approx(0.5)
  assert gs["verdict"] == "holds"


def test_adaptive_gives_no_interval_over_one_seeds_images():
  """gs diverged on every defended image of seed 1: its SSIM keeps seed 0's
  mean but no interval (one seed's images are not seeds), so no verdict."""
  undefended = _adaptive_images([(0.99, 0.99, 0.99)] * 2)
  defended = {0: _adaptive_images([(0.05, 0.9, 0.9), (0.06, 0.9, 0.9)]),
              1: _adaptive_images([(0.9, 0.9, 0.9)] * 2,
                                  diverged={(0, "gs"), (1, "gs")})}
  cells = []
  for seed in (0, 1):
    base = {"panel": "p", "seed": seed, "stage": "init"}
    cells += [({**base, "variant": "none", "rate": 0.0},
               {"images": undefended}),
              ({**base, "variant": "reference", "rate": 80.0},
               {"images": defended[seed]})]
  (row,) = [r for r in adaptive.analyse(_adaptive_config(), cells)
            if r["variant"] != "none"]
  gs = row["attacks"]["gs"]
  assert gs["ssim"]["mean"] == pytest.approx(0.055)
  assert gs["ssim"]["low"] is None and gs["mse_clamped"]["low"] is None
  assert gs["verdict"] == "inconclusive"
  assert row["attacks"]["gs_drop"]["ssim"]["low"] is not None


def test_adaptive_claim_shares_over_applicable_cells_only():
  """The summary share leaves out the cells whose suite fails undefended."""
  cells = []
  for stage, undefended_ssim in (("init", 0.99), ("trained", 0.1)):
    base = {"panel": "p", "seed": 0, "stage": stage}
    cells += [({**base, "variant": "none", "rate": 0.0},
               {"images": _adaptive_images([(undefended_ssim,) * 3] * 3)}),
              ({**base, "variant": "reference", "rate": 80.0},
               {"images": _adaptive_images([(0.01, 0.02, 0.03),
                                            (0.02, 0.01, 0.02),
                                            (0.03, 0.02, 0.01)])})]
  config = _adaptive_config()
  rows = adaptive.analyse(config, cells)
  best = {r["stage"]: r["attacks"]["best"]["verdict"] for r in rows
          if r["variant"] != "none"}
  assert best["init"] == "holds" and best["trained"].startswith("n/a")
  (row,) = adaptive.claims(config, rows)
  assert row["value"] == pytest.approx(1.0)  # 1 held of 1 applicable


def test_adaptive_panel_overrides_stages_and_budgets():
  """A panel's own stages and budgets apply to it alone."""
  config = ml_collections.ConfigDict(dict(
      seeds=(0,), stages=("init", "trained"),
      variants={"reference": (40.0, 80.0)},
      attack_budgets={"dlg": {"outer_steps": 30, "inner_steps": 20},
                      "gs": {"iterations": 500, "restarts": 1}},
      panels={"a": ml_collections.ConfigDict(dict(family="gs")),
              "b": ml_collections.ConfigDict(dict(
                  family="gs", stages=("init",),
                  attack_budgets={"gs": {"iterations": 2000}}))}))
  stages = {p: sorted({c["stage"] for c in adaptive.plan(config)
                       if c["panel"] == p}) for p in ("a", "b")}
  assert stages == {"a": ["init", "trained"], "b": ["init"]}
  assert len(adaptive.plan(config)) == 3 * 3
  assert adaptive.panel_budgets(config, "a") == config.attack_budgets.to_dict()
  b = adaptive.panel_budgets(config, "b")
  assert b["gs"] == {"iterations": 2000, "restarts": 1}
  assert b["dlg"] == {"outer_steps": 30, "inner_steps": 20}


def test_cell_store_refuses_cells_of_other_settings(tmp_path):
  """A cell is reused only under the settings it was computed with; a sweep
  may grow (seeds, rates, other panels) and change its analysis."""
  config = ml_collections.ConfigDict(dict(
      seeds=(0,), data_dir="/a", success_ssim=0.6,
      variants={"reference": (40.0,)},
      attack_budgets={"gs": {"iterations": 500}},
      panels={"a": {"family": "gs"}, "b": {"family": "dlg"}}))
  drop = adaptive.ANALYSIS_KEYS
  store = harness.CellStore(str(tmp_path))
  calls = []

  def cell():
    calls.append(1)
    return {"ssim": 0.5}

  first = store.get_or_run("a_seed0", cell, None,
                           harness.cell_settings(config, drop, "a"))
  assert first["ssim"] == 0.5 and len(calls) == 1
  # Its timing is stored with where it ran.
  assert first["cell_seconds"] >= 0
  assert first["host"]["backend"] == jax.default_backend()
  assert first["host"]["cores"] >= 1
  grown = ml_collections.ConfigDict(config.to_dict())
  grown.seeds, grown.data_dir, grown.success_ssim = (0, 1), "/b", 0.9
  grown.variants.reference = (40.0, 80.0)
  grown.panels.b.family = "gs"
  grown.panels["c"] = {"family": "gs"}
  assert store.get_or_run("a_seed0", cell, None,
                          harness.cell_settings(grown, drop, "a")) == first
  assert len(calls) == 1
  before = os.path.getmtime(store.path("a_seed0"))
  grown.attack_budgets.gs.iterations = 1000
  with pytest.raises(ValueError, match=r"a_seed0\.json was computed with "
                     r"other settings \(attack_budgets\.gs\.iterations: "
                     r"500 -> 1000\)"):
    store.get_or_run("a_seed0", cell, None,
                     harness.cell_settings(grown, drop, "a"))
  assert len(calls) == 1 and os.path.getmtime(
      store.path("a_seed0")) == before
  # A cell written before cells recorded their settings is not trusted.
  store.put("old", {"ssim": 0.1})
  with pytest.raises(ValueError, match="none recorded"):
    store.get_or_run("old", cell, None, {"x": 1})
  # Dotted keys drop nested entries.
  assert harness.cell_settings({"t": {"u": 1, "v": 2}}, ("t.u",),
                               sweep_streams=False) == {"t": {"v": 2}}
  # Runtime settings are left out at any depth, and a cell that an older
  # version stored with them, or with a key its caller now drops, is still
  # reused; any other key on one side only is a difference (a removed
  # override falls back to a default, which may change the result).
  assert harness.cell_settings(
      {"train": {"log_every": 5, "lr": 0.1}, "plot": True},
      sweep_streams=False) == {"train": {"lr": 0.1}}
  store.put("older", {"ssim": 0.2, "settings": {
      "train": {"lr": 0.1, "log_every": 10, "checkpoint_every": 10},
      "num_images": 8}})
  assert store.get_or_run("older", cell, None, harness.cell_settings(
      {"train": {"lr": 0.1, "log_every": 1}, "num_images": 4},
      ("num_images",), sweep_streams=False),
                              drop=("num_images",))["ssim"] == 0.2
  with pytest.raises(ValueError, match=r"train\.l2: None -> 0\.0"):
    store.get_or_run("older", cell, None, {
        "train": {"lr": 0.1, "l2": 0.0}}, drop=("num_images",))
  with pytest.raises(ValueError, match=r"num_images: 8 -> None"):
    store.get_or_run("older", cell, None, {"train": {"lr": 0.1}})
  assert len(calls) == 1


# --------------------------------------------------------------------------
# Visual comparison and convergence.


def test_visual_tile_names_the_shown_attack_with_its_own_metrics():
  """A tile shows the SSIM-best attack's reconstruction, so its title gives
  that attack's metrics, not the best-of MSE of another attack."""
  entry = {"attacks": {"gs": {"mse_clamped": 0.002, "ssim": 0.4},
                       "gs_mask": {"mse_clamped": 0.010, "ssim": 0.9}},
           "best": {"ssim_attack": "gs_mask", "ssim": 0.9,
                    "mse_clamped": 0.002}}
  assert visual._tile_title(entry, ("gs", "gs_mask")) == (  # pylint: disable=protected-access
      "gs_mask mse 0.010 ssim 0.90")


def _point(defense, strength, ssim):
  return {"defense": defense, "strength": strength, "per_attack": {
      "best": {"ssim": _ci(ssim), "success_rate": float(np.mean(
          [v >= 0.6 for v in ssim]))}}}


def _visual_config(attacks=("gs",)):
  return ml_collections.ConfigDict(dict(
      claim_soteria_rate=60.0, claim_compression_rate=80.0,
      unrecognisable=0.2, success_ssim=0.6, attacks=attacks, model="leakage",
      dataset="cifar10"))


def test_visual_claims_follow_rules():
  config = _visual_config()
  points = [_point("none", 0.0, [0.99, 0.97, 0.98]),
            _point("soteria", 60.0, [0.05, 0.1, 0.02]),
            _point("compression", 80.0, [0.9, 0.85, 0.95])]
  assert [r["verdict"] for r in visual.claims(config, points)] == [
      "held", "held"]
  points[1] = _point("soteria", 60.0, [0.7, 0.8, 0.75])
  points[2] = _point("compression", 80.0, [0.1, 0.15, 0.05])
  assert [r["verdict"] for r in visual.claims(config, points)] == [
      "did not hold", "did not hold"]
  # The attack fails undefended: nothing is decided.
  points[0] = _point("none", 0.0, [0.3, 0.2, 0.1])
  assert {r["verdict"] for r in visual.claims(config, points)} == {
      "inconclusive (attacks fail undefended)"}
  # It succeeds on exactly half of the undefended images: decided.
  points[0] = _point("none", 0.0, [0.9, 0.8, 0.1, 0.2])
  assert [r["verdict"] for r in visual.claims(config, points)] == [
      "did not hold", "did not hold"]


def test_adaptive_verdict_when_every_defended_run_diverged():
  none = {"mean": None, "low": None, "high": None, "n": 0}
  assert adaptive.verdict(none, 1.0, 0.2) == "n/a (every run diverged)"
  assert adaptive.verdict(none, 0.4, 0.2) == "n/a (attack fails undefended)"
  low = {"mean": 0.1, "low": 0.05, "high": 0.15, "n": 9}
  assert adaptive.verdict(low, 0.5, 0.2) == "holds"


def _gs_point(defense, strength, gs, best):
  """A visual point from per-image SSIMs of GS and of the best of the suite."""
  return {"defense": defense, "strength": strength, "per_attack": {
      name: {"ssim": _ci(v), "success_rate": float(np.mean(
          [x >= 0.6 for x in v]))} for name, v in (("gs", gs),
                                                    ("best", best))}}


def test_visual_soteria_against_gs_alone_and_the_adaptive_best():
  config = _visual_config()
  config.attacks = ("gs", "gs_mask")

  points = [_gs_point("none", 0.0, [0.99, 0.97, 0.98], [0.99, 0.98, 0.99]),
            _gs_point("soteria", 60.0, [0.05, 0.1, 0.02], [0.9, 0.95, 0.85])]
  rows = visual.claims(config, points)
  assert [(r["claim"].split("(")[1].split(";")[0], r["verdict"])
          for r in rows] == [("gs alone, the paper's attack", "held"),
                             ("best of gs/gs_mask", "did not hold")]


def test_visual_summary_counts_diverged_runs_as_failures():
  """The success rate is over every image: a diverged run fails."""
  config = _visual_config()

  def image(ssim, diverged):
    attacks = {"gs": {"ssim": ssim, "mse_clamped": 1 - ssim,
                      "diverged": diverged}}
    return {"attacks": attacks, "best": (
        {"all_diverged": True} if diverged else
        {"all_diverged": False, "ssim": ssim, "mse_clamped": 1 - ssim})}

  cells = [{"seed": 0, "images": [image(0.9, False), image(0.95, True)]},
           {"seed": 1, "images": [image(0.8, False), image(0.1, False)]}]
  point = visual.summarize(config, "none", 0.0, cells)
  for name in ("gs", "best"):
    a = point["per_attack"][name]
    assert a["success_rate"] == pytest.approx(2 / 4), name
    assert a["diverged"] == 1 and a["ssim"]["n"] == 3
    assert a["ssim"]["low"] is not None  # Both seeds keep values.
  # Seed 1's runs all diverged: seed 0's two images give a mean, no
  # interval (they are not seeds).
  cells = [{"seed": 0, "images": [image(0.9, False), image(0.95, False)]},
           {"seed": 1, "images": [image(0.8, True), image(0.1, True)]}]
  a = visual.summarize(config, "none", 0.0, cells)["per_attack"]["gs"]
  assert a["ssim"]["mean"] == pytest.approx(0.925)
  assert a["ssim"]["low"] is None and a["mse_clamped"]["high"] is None


def test_visual_paper_attack_is_judged_by_its_own_undefended_success():
  """Soteria against GS alone is inconclusive when GS fails undefended, even
  when the best of the suite (the adaptive variant) succeeds there."""
  config = _visual_config()
  config.attacks = ("gs", "gs_mask")

  points = [_gs_point("none", 0.0, [0.3, 0.2, 0.1], [0.99, 0.98, 0.99]),
            _gs_point("soteria", 60.0, [0.05, 0.1, 0.02],
                      [0.05, 0.1, 0.02])]
  assert [r["verdict"] for r in visual.claims(config, points)] == [
      "inconclusive (attacks fail undefended)", "held"]


def test_reconstruction_summary_success_at_threshold_and_seed_intervals(
    t_interval):
  """The whole-gradient success rate counts SSIM == SUCCESS_SSIM; the
  paired representation - gradient interval is over the seeds' means."""
  def cell(seed, rep, grad):
    out = {"seed": seed, "representation_correlation": [0.9] * len(rep)}
    for source, ssim in (("representation", rep), ("gradient", grad),
                         ("conv_gradient", [0.0] * len(rep))):
      out[source] = {"ssim": list(ssim), "mse": [0.1] * len(rep),
                     "mse_clamped": [0.1] * len(rep),
                     "psnr": [10.0] * len(rep),
                     "final_loss": [0.01] * len(rep)}
    return out

  t = leakage.SUCCESS_SSIM
  cells = [cell(0, [0.9, 0.5], [t, 0.2]), cell(1, [0.7, 0.8], [0.9, 0.3]),
           cell(2, [0.1, 0.95], [0.5, 0.4])]
  cells[2]["gradient"]["final_loss"][1] = float("nan")
  out = leakage.summarize_reconstruction(cells)
  assert out["gradient_success_rate"] == pytest.approx(2 / 6)
  # A non-finite final L-BFGS loss is a diverged reconstruction.
  assert out["diverged"] == {"representation": 0, "gradient": 1,
                             "conv_gradient": 0}
  d = out["ssim_representation_minus_gradient"]
  per_seed = [np.mean(np.subtract(c["representation"]["ssim"],
                                  c["gradient"]["ssim"])) for c in cells]
  mean, low, high = t_interval(per_seed)
  assert (d["mean"], d["low"], d["high"]) == (
      pytest.approx(mean), pytest.approx(low), pytest.approx(high))


def test_certified_rates_must_include_the_undefended_reference():
  config = _cert_config()
  config.seeds = (0,)
  config.rates = (20.0, 50.0)
  with pytest.raises(ValueError, match="rates must include 0"):
    theorem1._plan(config)


def test_convergence_claims_follow_rules():
  def summary(init, final, diverged=()):
    return {"name": "s", "defense": "soteria", "diverged_seeds": list(diverged),
            "initial_loss": _ci(init), "final_loss": _ci(final),
            "loss_drop": stats.paired_difference_ci(init, final),
            "final_accuracy": _ci([0.8, 0.8, 0.8])}

  ln10 = [2.3026] * 3
  rows = convergence.claims([summary(ln10, [0.5, 0.6, 0.55]),
                             summary(ln10, [2.5, 2.6, 2.55]),
                             summary(ln10, [2.2, 2.5, 2.3]),
                             summary(ln10, [0.5, 0.6, 0.55], diverged=[3])])
  assert [r["verdict"] for r in rows] == [
      "held", "did not hold", "inconclusive",
      "did not hold (training diverged)"]
  # A setting of another model is a trainability claim, not Theorem 2's.
  lenet = {**summary(ln10, [0.5, 0.6, 0.55]), "overrides": {"model": "lenet"}}
  row = convergence.claims([lenet])[0]
  assert row["claim"].startswith("lenet trains under the paper's FedAvg")
  assert row["verdict"] == "held"


def test_convergence_summary_over_the_seeds_that_did_not_diverge(
    t_interval):
  """F(w_0), F(w_T) (the last round), their paired drop, the final accuracy
  and the per-round bands are over the seeds that did not diverge."""
  def cell(seed, initial, loss, accuracy, diverged=None):
    return {"seed": seed, "initial_loss": initial, "round": [1, 2, 3],
            "global_loss": loss, "test_accuracy": accuracy,
            "diverged_at_round": diverged}

  cells = [cell(0, 2.0, [1.5, 1.2, 1.0], [0.5, 0.6, 0.7]),
           cell(1, 2.2, [1.8, 1.5, 1.2], [0.4, 0.6, 0.8]),
           cell(2, 2.6, [1.6, 1.1, 0.7], [0.3, 0.5, 0.9]),
           cell(3, 2.1, [1.9, 9.0, 50.0], [0.1, 0.1, 0.1], diverged=2)]
  out = convergence.summarize({"name": "s", "defense": "none"}, cells)
  assert out["seeds"] == [0, 1, 2, 3] and out["diverged_seeds"] == [3]
  assert out["round"] == [1, 2, 3]
  for name, values in (("initial_loss", [2.0, 2.2, 2.6]),
                       ("final_loss", [1.0, 1.2, 0.7]),
                       ("loss_drop", [1.0, 1.0, 1.9]),
                       ("final_accuracy", [0.7, 0.8, 0.9])):
    mean, low, high = t_interval(values)
    assert (out[name]["mean"], out[name]["low"], out[name]["high"]) == (
        pytest.approx(mean), pytest.approx(low), pytest.approx(high)), name
  assert out["global_loss_mean"] == pytest.approx([4.9 / 3, 3.8 / 3, 2.9 / 3])
  assert out["test_accuracy_low"][1] == pytest.approx(
      t_interval([0.6, 0.6, 0.5])[1])


def test_convergence_settings_vary_steps_then_devices_once_each():
  """Local steps at the base K, then sampled devices at the base I, the
  base pair once; 'soteria' at the base strength, 'soteria:s' at s."""
  config = ml_collections.ConfigDict({
      "base": {"clients_per_round": 10, "local_steps": 5,
               "defense_strength": 40.0},
      "local_steps": (1, 5), "clients_per_round": (5, 10),
      "defenses": ("none", "soteria", "soteria:30"), "max_settings": 0})
  names = [s["name"] for s in convergence.settings(config)]
  assert names == [f"I{i}_K{k}_{d}" for i, k in ((1, 10), (5, 10), (5, 5))
                   for d in ("none", "soteria40", "soteria30")]
  strengths = {s["label"]: s["strength"]
               for s in convergence.settings(config)}
  assert strengths == {"none": 0.0, "soteria40": 40.0, "soteria30": 30.0}


# --------------------------------------------------------------------------
# The batched attack suite.


def test_batched_suite_equals_one_image_harness(monkeypatch):
  """K gradients attacked at once give each one's single-attack metrics;
  a batch's wall time is shared equally by its K entries."""
  model = models.get_model("logreg", (8, 8, 1), 4, init="uniform")
  keys = harness.sweep_keys(0)
  params = model.init(keys.init)
  x = jax.random.uniform(keys.data, (3, 1, 8, 8, 1))
  y = np.array([[0], [1], [3]], np.int32)
  ka, kd = batched.image_keys(keys, range(3))
  defense = batched.get_defense("soteria", 50.0, model)
  _, shared, _ = batched.defend_batch(model, params, defense, x, y, kd)
  budgets = {"gs": {"iterations": 20, "restarts": 1}}
  names = ("gs", "gs_mask")
  clock = iter(np.arange(0.0, 100.0, 6.0))  # every batch takes 6 s
  monkeypatch.setattr(batched, "time", types.SimpleNamespace(
      perf_counter=lambda: float(next(clock))))
  entries, recs = batched.attack_suite(model, params, shared, x, y, names,
                                       ka, budgets=budgets, keep=("gs",))
  monkeypatch.undo()
  assert recs["gs"].shape == (3, 1, 8, 8, 1)
  assert [e["attacks"]["gs"]["seconds"] for e in entries] == [2.0] * 3
  for k in range(3):
    one = jax.tree_util.tree_map(lambda t, k=k: t[k], shared)
    _, one_shared, _ = harness.defend(model, params, defense, x[k], y[k],
                                      kd[k])
    np.testing.assert_allclose(one_shared["head"]["kernel"],
                               one["head"]["kernel"], rtol=1e-5, atol=1e-7)
    single = harness.attack_suite(model, params, one, x[k], y[k], names,
                                  ka[k], budgets=budgets)
    for name in names:
      for metric in ("ssim", "mse_clamped"):
        assert entries[k]["attacks"][name][metric] == pytest.approx(
            single["attacks"][name][metric], rel=1e-3, abs=1e-5), (k, name)
    assert entries[k]["best"]["ssim"] == pytest.approx(
        single["best"]["ssim"], rel=1e-3, abs=1e-5)


def test_gs_mask_recovers_through_soteria_where_gs_is_stopped():
  """Leakage model, Soteria 80 %, fixed seed: the plain GS attack is stopped
  (SSIM < 0.3), the mask-aware GS recovers the image (SSIM > 0.9)."""
  model = models.get_model("leakage", (28, 28, 1), 10)
  keys = harness.sweep_keys(0)
  params = model.init(keys.init)
  x, y = harness.synthetic_images("mnist", 1, seed=0)
  x, y = x[:, None], y[:, None]
  ka, kd = batched.image_keys(keys, [0])
  _, shared, info = batched.defend_batch(
      model, params, batched.get_defense("soteria", 80.0, model), x, y, kd)
  (entry,), _ = batched.attack_suite(
      model, params, shared, x, y, ("gs", "gs_mask"), ka,
      budgets={"gs": {"iterations": 200, "restarts": 1}})
  plain, mask = entry["attacks"]["gs"], entry["attacks"]["gs_mask"]
  print("pruned", info, "gs", plain["ssim"], "gs_mask", mask["ssim"])
  assert not plain["diverged"] and not mask["diverged"]
  assert plain["ssim"] < 0.3
  assert mask["ssim"] > 0.9
  assert entry["best"]["ssim_attack"] == "gs_mask"


def test_adaptive_table_mixes_attack_families():
  """Panels of different families (DLG's LeNet, GS's models) in one table."""
  entry = lambda v: {"ssim": {"mean": v, "low": v, "high": v, "n": 3},  # noqa: E731
                     "verdict": "holds"}
  rows = [{"panel": p, "stage": "init", "variant": "reference", "rate": 80.0,
           "defense/pruned_fraction_of_active": 0.0004,
           "attacks": {**{n: entry(0.1) for n in adaptive.suite(f)},
                       "best": entry(0.1)}}
          for p, f in (("lenet_mnist", "dlg"), ("leakage_mnist", "gs"))]
  rows[1].pop("defense/pruned_fraction_of_active")  # An undefended row.
  t = adaptive.table(rows)
  assert len(t["header"]) == 10 and all(len(r) == 10 for r in t["rows"])
  assert [r[4:6] for r in t["rows"]] == [[0.0, "dlg, dlg_drop, dlg_mask"],
                                         ["-", "gs, gs_drop, gs_mask"]]


def test_adaptive_table_gives_the_undefended_success_rate(tmp_path):
  """The rate that decides whether a defended row gets a verdict is on the
  undefended row (a mean SSIM of 0.54 can be a success rate of 0.33), and
  refresh_tables re-renders a committed run with it."""
  undefended = {"ssim": {"mean": 0.54, "low": 0.3, "high": 0.8, "n": 9},
                "undefended_success_rate": 1 / 3, "verdict": "undefended"}
  defended = {"ssim": {"mean": 0.1, "low": 0.0, "high": 0.2, "n": 9},
              "undefended_success_rate": 1 / 3,
              "verdict": "n/a (attack fails undefended)"}
  rows = [{"panel": "leakage_mnist", "stage": "init", "variant": v,
           "rate": r, "attacks": {"gs": a}}
          for v, r, a in (("none", 0.0, undefended),
                          ("reference", 80.0, defended))]
  t = adaptive.table(rows)
  assert t["rows"][0][-1] == "0.54 [0.3, 0.8] undefended (success 0.333)"
  assert t["rows"][1][-1] == "0.1 [0, 0.2] n/a (attack fails undefended)"
  path = str(tmp_path / "adaptive.json")
  storage.write_json(path, {"rows": rows, "tables": []})
  assert adaptive.refresh_tables(path)["tables"] == [t]
  assert storage.read_json(path)["tables"] == [t]
  # Diverged attacks are counted on the row (left out of its mean).
  defended["diverged"] = 2
  assert adaptive.table(rows)["rows"][1][-1] == (
      "0.1 [0, 0.2] n/a (attack fails undefended) (2 div)")


def test_batched_summary_median_and_mean_of_finite_values():
  s = batched.summary([4.0, 1.0, np.inf, 2.0, np.nan])
  assert s["n"] == 3 and s["mean"] == pytest.approx(7 / 3)
  assert s["median"] == 2.0  # of 1, 2, 4; not of the five values
  assert "groups" not in s
  assert batched.summary([np.nan])["median"] is None
  s = batched.summary([1.0, 3.0, 10.0, 20.0], seeds=[0, 0, 1, 1])
  assert s["groups"] == 2 and s["mean"] == pytest.approx((2 + 15) / 2)
  assert s["median"] == 6.5
  assert batched.interval(s).startswith(f"{s['mean']:.3g}"[:3])


def test_pick_images_draws_distinct_images_of_the_pool():
  keys = harness.sweep_keys(0)
  pool_x, pool_y, source = harness.load_images("mnist", 12)
  pick, x, y, got_source = batched.pick_images("mnist", 12, keys, pool=12)
  assert sorted(pick.tolist()) == list(range(12))  # without replacement
  assert got_source == source and x.shape == (12, 1, *pool_x.shape[1:])
  for k, i in enumerate(pick):
    np.testing.assert_array_equal(x[k, 0], pool_x[i])
    assert y[k, 0] == pool_y[i]


def test_batched_image_keys_are_each_index_s_attack_and_defense_keys():
  keys = harness.sweep_keys(0)
  ka, kd = batched.image_keys(keys, [5, 0])
  data = lambda k: np.asarray(jax.random.key_data(k))  # noqa: E731
  for row, index in enumerate((5, 0)):
    np.testing.assert_array_equal(
        data(ka[row]), data(jax.random.fold_in(keys.attack, index)))
    np.testing.assert_array_equal(
        data(kd[row]), data(jax.random.fold_in(keys.defense, index)))


def test_visual_success_counts_ssim_at_the_threshold():
  config = _visual_config()
  attacks = lambda s: {"gs": {"ssim": s, "mse_clamped": 1 - s,  # noqa: E731
                              "mse": 1 - s, "psnr": 10 * s,
                              "diverged": False}}
  cells = [{"seed": 0, "images": [
      {"attacks": attacks(s), "best": harness.best_of(attacks(s))}
      for s in (0.6, 0.1)]}]
  point = visual.summarize(config, "none", 0.0, cells)
  assert point["per_attack"]["gs"]["success_rate"] == pytest.approx(0.5)
  assert point["per_attack"]["best"]["success_rate"] == pytest.approx(0.5)


def test_visual_table_columns_are_ssim_mse_and_each_attacks_own_rate():
  config = _visual_config(("gs", "gs_mask"))
  s = lambda m: {"mean": m, "low": m, "high": m, "n": 3}  # noqa: E731
  points = [{"defense": "soteria", "strength": 60.0, "per_attack": {
      "best": {"ssim": s(0.5), "mse_clamped": s(0.02), "success_rate": 0.75,
               "diverged": 0},
      "gs": {"success_rate": 0.25, "diverged": 1},
      "gs_mask": {"success_rate": 0.75, "diverged": 0}}}]
  t = visual.table(config, points)
  assert t["header"][1:3] == ["best-of SSIM", "best-of clamped MSE"]
  assert t["rows"] == [["soteria 60", batched.interval(s(0.5)),
                        batched.interval(s(0.02)), "0.25 / 1", "0.75 / 0"]]


def test_visual_compression_is_judged_against_the_best_of_the_suite_only():
  config = _visual_config(("gs", "gs_mask"))
  pt = lambda d, st, v: {"defense": d, "strength": st, "per_attack": {  # noqa
      n: {"ssim": stats.mean_ci(v), "success_rate": 1.0}
      for n in ("gs", "best")}}
  rows = visual.claims(config, [pt("none", 0.0, [0.99, 0.98, 0.97]),
                                pt("compression", 80.0, [0.9, 0.85, 0.95])])
  assert len(rows) == 1 and "best of gs/gs_mask" in rows[0]["claim"]



def test_visual_saves_each_images_best_by_ssim_reconstruction(monkeypatch):
  """Image 0's best SSIM is gs_mask's, image 1's is gs's: the saved
  reconstructions follow each image's best, not the suite's first."""
  recs = {"gs": np.zeros((2, 1, 2, 2, 1)), "gs_mask": np.ones((2, 1, 2, 2, 1))}
  m = lambda s: {"ssim": s, "mse_clamped": 1 - s, "mse": 1 - s,  # noqa
                 "psnr": 10 * s, "diverged": False}
  per = [{"gs": m(0.1), "gs_mask": m(0.9)}, {"gs": m(0.8), "gs_mask": m(0.2)}]
  entries = [{"attacks": a, "best": harness.best_of(a)} for a in per]
  monkeypatch.setattr(batched, "get_defense", lambda *a, **k: None)
  monkeypatch.setattr(batched, "image_keys", lambda keys, idx: (None, None))
  monkeypatch.setattr(batched, "defend_batch",
                      lambda *a, **k: (None, None, {}))
  monkeypatch.setattr(batched, "attack_suite",
                      lambda *a, **k: (entries, recs))
  saved = {}
  monkeypatch.setattr(visual.storage, "write_bytes",
                      lambda path, b: saved.setdefault(path, b))
  config = ml_collections.ConfigDict(dict(
      attacks=("gs", "gs_mask"), attack_budgets={}, give_labels=True))
  visual.setting_cell(config, None, None, None, np.zeros((2, 1, 2, 2, 1)),
                      np.zeros((2, 1)), "soteria", 60.0, "rec.npy")
  best = np.load(io.BytesIO(saved["rec.npy"]))
  assert best.shape == (2, 2, 2, 1)
  assert best[0].min() == 1.0 and best[1].max() == 0.0



def test_adaptive_variants_build_the_named_soteria_rule(monkeypatch):
  built = []

  def get_defense(name, strength, model, **kwargs):
    built.append((name, strength, kwargs))
    return None

  monkeypatch.setattr(batched, "get_defense", get_defense)
  monkeypatch.setattr(batched, "image_keys", lambda keys, idx: (None, None))
  monkeypatch.setattr(batched, "defend_batch",
                      lambda *a, **k: (None, None, {}))
  monkeypatch.setattr(batched, "attack_suite", lambda *a, **k: ([], {}))
  panel = types.SimpleNamespace(
      model=None, params=lambda stage: None, keys=None, indices=[],
      images=None, labels=None, attacks=("gs",), name="p", source="x")
  monkeypatch.setattr(adaptive, "panel_budgets", lambda c, n: {})
  config = ml_collections.ConfigDict(dict(give_labels=True))
  for variant in ("reference", "count", "exact"):
    adaptive.attack_cell(config, panel, "init", variant, 80.0)
  assert built == [("soteria", 80.0, {}),
                   ("soteria", 80.0, {"selection": "count"}),
                   ("soteria", 80.0, {"score": "exact"})]



def test_adaptive_rows_average_the_defense_info_and_skip_all_diverged_images():
  """'pruned %' is the mean over the row's images; an image on which every
  attack diverged has no best-of MSE (and does not crash the row)."""
  config = ml_collections.ConfigDict(dict(
      success_ssim=0.6, unrecognisable=0.2,
      panels={"p": ml_collections.ConfigDict(dict(
          family="gs", model="leakage", dataset="mnist"))}))

  def images(ssims, fractions, all_diverged=()):
    out = []
    for i, (v, f) in enumerate(zip(ssims, fractions)):
      a = {n: {"ssim": v, "mse_clamped": 1 - v, "mse": 1 - v,
               "psnr": 10 * v, "diverged": i in all_diverged}
           for n in adaptive.suite("gs")}
      out.append({"attacks": a, "best": harness.best_of(a),
                  "defense/pruned_fraction_of_active": f})
    return out

  base = {"panel": "p", "seed": 0, "stage": "init"}
  rows = adaptive.analyse(config, [
      ({**base, "variant": "none", "rate": 0.0},
       {"images": images([0.99] * 3, [0.0] * 3)}),
      ({**base, "variant": "reference", "rate": 80.0},
       {"images": images([0.1, 0.2, 0.3], [0.1, 0.1, 0.7],
                         all_diverged={2})})])
  (row,) = [r for r in rows if r["variant"] != "none"]
  assert row["defense/pruned_fraction_of_active"] == pytest.approx(0.3)
  assert row["attacks"]["best"]["mse_clamped"]["n"] == 2
  assert row["attacks"]["best"]["mse_clamped"]["mean"] == pytest.approx(0.85)
