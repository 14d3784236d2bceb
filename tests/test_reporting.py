"""What a reader of the generated reports sees: REPORT.md, REPLICATION.md,
the README blocks, the cost estimate and the reproduce summary, checked
against hand-made inputs and against the committed results."""

import json
import math
import os
import shutil

import pytest

from repdef_jax import storage
from repdef_jax.paper import convergence
from repdef_jax.paper import cost
from repdef_jax.paper import harness
from repdef_jax.paper import replication
from repdef_jax.paper import report
from repdef_jax.paper import reproduce
from repdef_jax.paper import stats
from repdef_jax.paper import sweep
from experiments.configs import tradeoff as tradeoff_cfg

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(ROOT, "docs", "results")


def _claim(name, value, low, high, verdict):
  return {"claim": name, "value": value, "low": low, "high": high,
          "verdict": verdict}


# ---------------------------------------------------------------- replication

def test_readme_block_lists_claims_whose_estimates_differ():
  ref = {"visual": {"claims": [_claim("apart", 1.0, 0.9, 1.1, "held"),
                               _claim("flip", 1.0, 0.5, 1.5, "held")]}}
  rep = {"visual": {"claims": [_claim("apart", 2.0, 1.9, 2.1, "held"),
                               _claim("flip", 1.0, 0.5, 1.5, "inconclusive")]}}
  text = replication.readme_block(replication.compare(ref, rep), "src")
  assert "| apart | held | held | estimates differ |" in text
  assert "| flip | held | inconclusive | verdict differs |" in text


def test_render_is_a_rerun_only_when_every_part_kept_its_seeds():
  def part(seeds):
    return {"config": {"seeds": seeds}, "claims": []}
  ref = {"visual": part([0, 1]), "repinfer": part([0, 1])}
  mixed = {"visual": part([0, 1]), "repinfer": part([5, 6])}
  text = replication.render(replication.compare(ref, mixed), "ref")
  assert text.startswith("# Replication on unseen seeds and images\n")
  assert "not that its verdicts hold on unseen data" not in text


def test_update_readme_names_the_json_relative_to_the_readme(tmp_path):
  dest = tmp_path / "docs" / "replica"
  dest.mkdir(parents=True)
  result = replication.compare({"visual": {"claims": []}},
                               {"visual": {"claims": []}})
  (dest / replication.JSON_FILE).write_text(json.dumps(result))
  readme = tmp_path / "README.md"
  readme.write_text(f"{replication.README_BEGIN}\n{replication.README_END}\n")
  replication.update_readme(str(readme), str(dest))
  assert ("Generated from `docs/replica/replication.json` by "
          "`repdef_jax.paper.replication`") in readme.read_text()


def _committed(name: str) -> list[str]:
  """The folders below docs/results holding a committed ``name`` (paths
  relative to it; nested runs such as key_scheme_1/replica included)."""
  return sorted(os.path.relpath(d, RESULTS) for d, _, files in os.walk(RESULTS)
                if d != RESULTS and name in files)


def test_every_comparison_and_report_is_checked():
  # The parametrized checks below cover every committed folder.
  assert {"replica", "rerun_2026-12-06", "key_scheme_1"} <= set(
      _committed(replication.JSON_FILE))


def test_benchmarks_page_measures_the_committed_medium_run():
  """BENCHMARKS.md's 'measured' hours are the committed reference's cell
  time: publishing a new run re-renders the page (``--render_only``)."""
  bench = storage.read_json(os.path.join(ROOT, "docs", "benchmarks",
                                         "benchmarks.json"))
  (medium,) = [p for p in bench["preset_costs"] if p["preset"] == "medium"]
  run = storage.read_json(os.path.join(RESULTS, "tradeoff", "tradeoff.json"))
  assert math.isclose(medium["measured_h"], run["cell_seconds"] / 3600)


# Convergence draws FedAvg's streams only, so its part records no scheme.
@pytest.mark.parametrize("part", [p for p in reproduce.PART_ORDER
                                  if p != "convergence"])
@pytest.mark.parametrize("folder", ["", "replica"])
def test_committed_reference_parts_are_of_todays_key_scheme(folder, part):
  """The parts of the reference and the replica that draw the sweep streams
  were run under today's keys, so a rerun of the README's commands attacks
  the committed images."""
  done = storage.read_json(os.path.join(RESULTS, folder, part,
                                        "PART_DONE.json"))
  assert done["key_scheme"] == harness.KEY_SCHEME


@pytest.mark.parametrize("folder", _committed(replication.JSON_FILE))
def test_committed_replication_is_the_committed_results_compared(folder):
  """replication.json and REPLICATION.md of a committed replica are the
  comparison of the committed results with the reference that
  REPLICATION.md names, rendered."""
  dest = os.path.join(RESULTS, folder)
  committed = storage.read_json(os.path.join(dest, replication.JSON_FILE))
  with open(os.path.join(dest, replication.REPORT_FILE), encoding="utf-8") as f:
    text = f.read()
  reference = text.split("Reference: `")[1].split("`")[0]
  fresh = json.loads(json.dumps(replication.compare(
      report.collect(os.path.join(ROOT, reference)), report.collect(dest))))
  assert fresh == committed
  assert text == replication.render(committed, reference)


@pytest.mark.parametrize("folder", _committed("tradeoff.json"))
def test_committed_tradeoff_statistics_are_their_samples_analysed(
    folder, tmp_path):
  """Every committed tradeoff.json's ratios, claims and tables are what the
  current rules compute from the per-image samples it keeps (and the
  recomputation leaves the samples alone)."""
  from repdef_jax.paper import tradeoff  # pylint: disable=g-import-not-at-top
  path = os.path.join(RESULTS, folder, "tradeoff.json")
  committed = storage.read_json(path)
  assert committed["interval_rule"] == stats.INTERVAL_RULE
  copy = str(tmp_path / "tradeoff.json")
  shutil.copy(path, copy)
  fresh = json.loads(json.dumps(tradeoff.reanalyse(copy)))
  assert fresh["claims"] == committed["claims"]
  assert fresh["tables"] == committed["tables"]
  assert fresh["panels"] == committed["panels"]


# --------------------------------------------------------------------- report

def test_runs_table_says_not_run_without_results_or_record(tmp_path):
  results = {"tradeoff": {"claims": []}}
  text = report.render(results, workdir=str(tmp_path),
                       report_dir=str(tmp_path))
  runs = text.split("## Runs")[1].split("\n## ")[0]
  assert "| tradeoff | n/a | n/a | - | done |" in runs
  assert "| visual | n/a | n/a | - | not run |" in runs


def test_adaptive_section_states_its_interval_rule(tmp_path):
  text = report.render({"adaptive": {"claims": []}}, workdir=str(tmp_path),
                       report_dir=str(tmp_path))
  section = text.split(f"## {report.PARTS['adaptive'][0]}")[1]
  assert f"Intervals: {report.LEGACY_INTERVAL_RULE}." in section


@pytest.mark.parametrize("folder", ["", *_committed("REPORT.md")])
def test_committed_reports_are_their_json_rendered(folder):
  """Every committed REPORT.md re-renders from its folder's JSON."""
  dest = os.path.join(RESULTS, folder) if folder else RESULTS
  path = os.path.join(dest, "REPORT.md")
  with open(path, encoding="utf-8") as f:
    text = f.read()
  preset = text.split("Preset: `")[1].split("`")[0]
  runs = storage.read_json(os.path.join(dest, "reproduce.json"), {})
  assert text == report.render(report.collect(dest), workdir=dest,
                               report_dir=dest, runs=runs, preset=preset)


# ---------------------------------------------------------------- convergence

def _summary(name, defense, init, final, diverged=()):
  ci = stats.mean_ci
  return {"name": name, "defense": defense, "seeds": [0, 1, 2, 3],
          "diverged_seeds": list(diverged), "initial_loss": ci(init),
          "final_loss": ci(final),
          "loss_drop": stats.paired_difference_ci(init, final),
          "final_accuracy": ci([0.5, 0.75, 1.0])}


def test_convergence_claims_name_the_control_and_both_losses():
  rows = convergence.claims([
      _summary("a", "none", [2.0, 2.0, 2.0], [0.5, 0.5, 0.5]),
      _summary("b", "soteria", [2.0, 2.0, 2.0], [0.25, 0.25, 0.25])])
  assert rows[0]["claim"] == "Defended FedAvg converges: a (undefended control)"
  assert rows[1]["claim"] == "Defended FedAvg converges: b"
  assert rows[1]["statistic"] == (
      "F(w_0) - F(w_T), global objective over 3 seeds (final 0.25, initial "
      "2, final test accuracy 0.75)")


def test_convergence_table_columns_by_hand():
  s = _summary("a", "none", [2.0, 2.0, 2.0], [0.5, 0.5, 0.5], diverged=[3])
  t = convergence.table([s])
  assert t["header"][1:5] == ["seeds", "F(w_0)", "F(w_T)", "F(w_0) - F(w_T)"]
  row = t["rows"][0]
  assert row[1] == 4  # every seed run, the diverged one included
  assert row[2].startswith("2") and row[3].startswith("0.5")
  assert row[4].startswith("1.5")


@pytest.mark.parametrize("folder", ["", "replica", "rerun_2026-12-06"])
def test_committed_convergence_claims_and_table_follow_the_rules(folder):
  dest = os.path.join(RESULTS, folder) if folder else RESULTS
  res = storage.read_json(os.path.join(dest, "convergence", "curves.json"))
  assert res is not None, f"no committed convergence in {dest}"
  again = json.loads(json.dumps({"claims": convergence.claims(res["settings"]),
                                 "table": convergence.table(res["settings"])}))
  assert again["claims"] == res["claims"]
  assert again["table"] == res["tables"][0]


# ----------------------------------------------------------------------- cost

def test_committed_preset_gpu_hours_are_the_flop_model():
  """benchmarks.json's GPU model line and modelled GPU hours (quoted in
  docs/evaluation.md: 20 TFLOP/s, ~4,432 GPU-hours for full) are what the
  cost model gives now."""
  committed = storage.read_json(
      os.path.join(ROOT, "docs", "benchmarks", "benchmarks.json"))
  assert committed is not None, "no committed benchmarks.json"
  rows = committed["preset_costs"]
  assert rows
  for row in rows:
    assert row["gpu_model"] == "20 TFLOP/s, at least 0.2 ms per step or iteration"
    config = tradeoff_cfg.get_config(row["preset"])
    est = cost.estimate(config, sweep.plan(config), None, reference="",
                        units="")
    assert est["gpu_seconds"] / 3600 == pytest.approx(row["gpu_h"], rel=1e-9)


def test_dlg_iteration_costs_twelve_forwards_per_image(monkeypatch):
  config = tradeoff_cfg.get_config("tiny")
  config.panels.logreg_mnist.attacks = ("dlg",)
  config.num_images = 3
  fwd = 4e10  # well above the floor
  monkeypatch.setattr(cost, "_forward_flops", lambda key: fwd)
  monkeypatch.setattr(cost, "_jacobian_passes", lambda key: 1)
  b = config.attack_budgets.dlg
  its = b.outer_steps * b.inner_steps * b.get("restarts", 1)
  (cell,) = [c for c in sweep.plan(config)
             if c["kind"] == "attack" and c["defense"] == "none"]
  assert 12 * 3 * fwd / 20e12 > cost.GPU_STEP_FLOOR_S
  assert cost.gpu_seconds(config, cell) == pytest.approx(
      its * 12 * 3 * fwd / 20e12)


def test_only_soteria_is_priced_as_soteria():
  assert cost.family("soteria") == "soteria"
  for d in ("none", "dp_gaussian", "dp_laplace", "compression", "pruning"):
    assert cost.family(d) == "plain", d


def test_render_gives_hours_by_kind_and_the_gpu_model_separately():
  est = {"cells": 4, "finished": 1, "seconds": 7200.0, "gpu_seconds": 900.0,
         "by_kind": {"train": 5400.0, "attack": 1800.0},
         "by_model": {"m/mnist": 7200.0}, "from_units": [],
         "extrapolated": [], "unknown": [], "reference": "ref.json",
         "units": None, "missing": []}
  lines = cost.render(est).splitlines()
  assert lines[0] == "planned cells: 4 (1 finished)"
  assert lines[1] == ("estimated time left: 2.00 h (7200 s) on the machine of "
                      "the timings (ref.json)")
  assert lines[2:5] == ["  attack: 0.50 h", "  train: 1.50 h",
                        "  m/mnist: 2.00 h"]
  assert lines[5].endswith("repdef_jax.paper.cost.GPU_FLOPS): 0.25 h")


# ------------------------------------------------------------------ reproduce

def _config(**overrides):
  from experiments.configs import reproduce as reproduce_cfg  # pylint: disable=g-import-not-at-top
  config = reproduce_cfg.get_config()
  config.update(dict(preset="tiny", report_only=True, parts=""), **overrides)
  return config


def _with_results(folder):
  shutil.copytree(os.path.join(RESULTS, "convergence"),
                  os.path.join(folder, "convergence"))
  return str(folder)


def test_published_run_fills_the_readme_from_the_published_folder(tmp_path):
  work = _with_results(tmp_path / "work")
  readme = tmp_path / "README.md"
  readme.write_text(f"{report.README_BEGIN}\n{report.README_END}\n")
  reproduce.run(_config(publish=str(tmp_path / "pub"), readme=str(readme)),
                work)
  assert "Generated from the JSON in `pub`" in readme.read_text()


def test_replica_run_writes_its_comparison_and_only_its_readme_block(
    tmp_path):
  ref = _with_results(tmp_path / "ref")
  work = _with_results(tmp_path / "work")
  pub = tmp_path / "pub"
  readme = tmp_path / "README.md"
  readme.write_text(f"{report.README_BEGIN}\nKEEP\n{report.README_END}\n"
                    f"{replication.README_BEGIN}\n{replication.README_END}\n")
  out = reproduce.run(_config(compare_with=ref, publish=str(pub),
                              readme=str(readme)), work)
  assert (pub / replication.JSON_FILE).exists()
  assert (pub / replication.REPORT_FILE).exists()
  text = readme.read_text()
  assert "\nKEEP\n" in text
  assert "Generated from `pub/replication.json`" in text
  assert out["replication"]["counts"] == {"replicates": 13}
  # A README with the replication block alone is enough for a replica.
  readme.write_text(f"{replication.README_BEGIN}\n{replication.README_END}\n")
  reproduce.run(_config(compare_with=ref, publish=str(pub),
                        readme=str(readme)), work)
  assert "Generated from `pub/replication.json`" in readme.read_text()


def test_replica_published_from_a_partial_workdir_compares_every_part(
    tmp_path):
  """A workdir that reran some parts publishes into a folder keeping the
  others; the comparison is of the published folder, not the workdir."""
  ref = _with_results(tmp_path / "ref")
  pub = _with_results(tmp_path / "pub")
  work = tmp_path / "work"
  work.mkdir()
  out = reproduce.run(_config(compare_with=ref, publish=str(pub)), str(work))
  assert out["replication"]["counts"] == {"replicates": 13}


def test_summary_prints_the_replication_counts(capsys):
  reproduce.summary({"report": "R.md", "runs": {}, "failed": [],
                     "replication": {"counts": {"replicates": 2,
                                                "estimates differ": 1}}},
                    "w")
  assert ("[reproduce] replication: estimates differ 1, replicates 2"
          in capsys.readouterr().out)
