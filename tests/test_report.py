"""REPORT.md and the README block are renderings of the parts' JSON."""

import os
import re

import pytest

from repdef_jax import storage
from repdef_jax.paper import replication
from repdef_jax.paper import report
from repdef_jax.paper import stats

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _claim(name, value, low, high, target=160.0):
  return stats.claim(name, "> 160x", "median ratio", value, low, high,
                     target=target, rule="interval low >= 160")


def _fake(workdir):
  storage.write_json(os.path.join(workdir, "tradeoff", "tradeoff.json"), {
      "pixel_space": "[0,1]", "seconds": 12.0, "cell_seconds": 345.0,
      "claims": [_claim("ratio vs compression", 200.0, 170.0, 250.0),
                 _claim("ratio vs dp", 20.0, 5.0, 40.0)],
      "tables": [{"title": "points", "header": ["defense", "accuracy"],
                  "rows": [["soteria", "0.9 [0.88, 0.92]"]]}]})
  with open(os.path.join(workdir, "tradeoff", "tradeoff.png"), "wb") as f:
    f.write(b"\x89PNG fake")
  storage.write_json(os.path.join(workdir, "certified", "certified.json"), {
      "pixel_space": "[0,1]",
      "claims": [stats.claim("bound holds", "certified", "fraction", 1.0,
                             None, None, target=None)]})


def test_report_renders_every_claim_with_its_verdict(tmp_path):
  _fake(str(tmp_path))
  runs = {"tradeoff": {"command": "python -m experiments.tradeoff --x",
                       "seconds": 12.5, "status": "done"}}
  path = report.write_report(str(tmp_path), runs=runs, preset="medium")
  text = open(path).read()
  verdicts = text.split("## Verdicts")[1].split("## Runs")[0]
  assert "| ratio vs compression | > 160x | 200 [170, 250] | held |" in (
      verdicts)
  assert "| ratio vs dp | > 160x | 20 [5, 40] | did not hold |" in verdicts
  assert "| bound holds | certified | 1 | reported |" in verdicts
  assert "**points**" in text and "0.9 [0.88, 0.92]" in text
  assert "![tradeoff: tradeoff.png](tradeoff/tradeoff.png)" in text
  # The last invocation's wall time and, beside it, the cells' total.
  assert "| `python -m experiments.tradeoff --x` | 12.5 | 345 | done |" in text
  # Parts without results say so; every section is present.
  assert text.count("Not run.") == 4
  for heading, _, _ in report.PARTS.values():
    assert f"## {heading}" in text


def test_report_survives_a_malformed_part(tmp_path):
  storage.write_json(os.path.join(str(tmp_path), "visual", "visual.json"),
                     {"tables": [{"title": "t"}]})
  text = report.render(report.collect(str(tmp_path)), workdir=str(tmp_path),
                       report_dir=str(tmp_path))
  assert "Could not summarise this part (KeyError" in text


def test_update_readme_replaces_only_the_generated_block(tmp_path):
  _fake(str(tmp_path / "results"))
  readme = tmp_path / "README.md"
  readme.write_text(f"intro\n{report.README_BEGIN}\nold\n{report.README_END}"
                    "\noutro\n")
  assert report.update_readme(str(readme), str(tmp_path / "results"))
  text = readme.read_text()
  assert text.startswith("intro\n") and text.endswith("\noutro\n")
  assert "\nold\n" not in text
  assert "| ratio vs dp | > 160x | 20 [5, 40] |" in text
  assert "`results`" in text  # the source folder, relative to the README
  assert not report.update_readme(str(readme), str(tmp_path / "results"))
  readme.write_text("no markers\n")
  with pytest.raises(ValueError, match="no '<!-- results:begin"):
    report.update_readme(str(readme), str(tmp_path / "results"))


def _readme_block(begin: str, end: str) -> str:
  """The README's block between two markers (a committed block: its
  absence fails)."""
  with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
    text = f.read()
  assert begin in text and end in text, f"README has no {begin} block"
  return text[text.index(begin):text.index(end) + len(end)]


def test_readme_results_are_the_committed_json_rendered():
  """No hand-copied numbers: the README block re-renders from docs/results."""
  block = _readme_block(report.README_BEGIN, report.README_END)
  results = os.path.join(ROOT, "docs", "results")
  assert block == report.readme_block(
      report.collect(results), "docs/results",
      storage.read_json(os.path.join(results, "reproduce.json"), {}))


def test_publish_copies_results_not_cells(tmp_path):
  work, dest = str(tmp_path / "run"), str(tmp_path / "published")
  _fake(work)
  storage.write_json(os.path.join(work, "tradeoff", "cells", "c.json"), {})
  storage.write_json(os.path.join(work, "tradeoff", "PART_DONE.json"),
                     {"command": "x"})
  storage.write_json(os.path.join(work, "reproduce.json"),
                     {"tradeoff": {"command": "python -m experiments.tradeoff",
                                   "seconds": 3.0, "status": "done"}})
  path = report.publish(work, dest, preset="medium")
  assert sorted(os.listdir(os.path.join(dest, "tradeoff"))) == [
      "PART_DONE.json", "tradeoff.json", "tradeoff.png"]
  text = open(path).read()
  assert path == os.path.join(dest, "REPORT.md")
  assert "| ratio vs dp | > 160x | 20 [5, 40] | did not hold |" in text
  assert "python -m experiments.tradeoff" in text  # runs from reproduce.json
  # A part published from another workdir keeps the first one's runs.
  other = str(tmp_path / "other")
  storage.write_json(os.path.join(other, "visual", "visual.json"),
                     {"claims": []})
  storage.write_json(os.path.join(other, "reproduce.json"),
                     {"visual": {"command": "python -m experiments.visual",
                                 "seconds": 1.0, "status": "done"}})
  text = open(report.publish(other, dest)).read()
  assert "experiments.tradeoff" in text and "experiments.visual" in text


def test_a_failed_rerun_is_flagged_where_its_old_result_is_shown(tmp_path):
  """A part whose last run failed keeps its earlier JSON in the folder; the
  report (verdicts and section) and the README block say so."""
  work = str(tmp_path / "run")
  _fake(work)
  runs = {"tradeoff": {"command": "python -m experiments.tradeoff",
                       "seconds": 3.0, "returncode": 1,
                       "status": "FAILED (exit 1)"},
          "certified": {"command": "python -m experiments.certified",
                        "seconds": 3.0, "returncode": 0, "status": "done"}}
  storage.write_json(os.path.join(work, "reproduce.json"), runs)
  text = open(report.write_report(work, runs=runs)).read()
  warning = "**The last run of tradeoff failed"
  verdicts, rest = text.split("## Runs")
  assert warning in verdicts and "certified failed" not in text
  section = rest.split("## ")[1]
  assert section.startswith("Utility-privacy trade-off") and warning in (
      section)
  readme = tmp_path / "README.md"
  readme.write_text(f"x\n{report.README_BEGIN}\n{report.README_END}\n")
  assert report.update_readme(str(readme), work)
  assert warning in readme.read_text()
  runs["tradeoff"].update(status="done", returncode=0)
  storage.write_json(os.path.join(work, "reproduce.json"), runs)
  report.update_readme(str(readme), work)
  assert "failed" not in readme.read_text()
  assert "failed" not in open(report.write_report(work, runs=runs)).read()


def _job_results():
  entry = lambda mse, ssim, div: {  # noqa: E731
      "mse": mse, "psnr": 30.0, "ssim": ssim, "diverged": div,
      "seconds": 2.0, "pruned_fraction_effective": 0.6}
  return {"config": {"attack": "dlg", "model": "lenet", "dataset": "cifar10",
                     "defense": "soteria", "strength": 60.0},
          "images": [{"index": 55, "label": 9,
                      "undefended": entry(2.1e-4, 0.998, False),
                      "defended": entry(21.8, 0.02, True)}]}


def test_update_readme_fills_the_main_job_block(tmp_path):
  from repdef_jax.paper import main_job
  _fake(str(tmp_path / "results"))
  storage.write_json(str(tmp_path / "results" / "main_job" / "results.json"),
                     _job_results())
  readme = tmp_path / "README.md"
  readme.write_text(f"{main_job.README_BEGIN}\nold\n{main_job.README_END}\n"
                    f"{report.README_BEGIN}\n{report.README_END}\n")
  assert report.update_readme(str(readme), str(tmp_path / "results"))
  text = readme.read_text()
  assert "\nold\n" not in text
  row = next(l for l in text.splitlines() if l.lstrip().startswith("55"))
  assert row.split() == ["55", "9", "|", "0.00021", "30", "0.998", "False",
                         "|", "21.8", "30", "0.02", "True", "0.60", "|",
                         "4.0"]


def test_readme_main_job_output_is_the_committed_json_rendered():
  from repdef_jax.paper import main_job
  with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
    text = f.read()
  path = os.path.join(ROOT, "docs", "results", "main_job", "results.json")
  assert main_job.README_BEGIN in text and os.path.exists(path), (
      "README's generated main-job block or its JSON is missing")
  block = text[text.index(main_job.README_BEGIN):
               text.index(main_job.README_END) + len(main_job.README_END)]
  assert block == main_job.readme_block(storage.read_json(path))


@pytest.mark.parametrize("v, expected", [
    (None, "n/a"), ("held", "held"), (True, "True"), (False, "False"),
    (0, "0"), (0.5, "0.5"), (12.345, "12.3"), (250.0, "250"),
    (1e4, "1.00e+04"), (-12345.0, "-1.23e+04"),
    (0.001, "0.001"), (0.00099, "9.90e-04"), (-0.0005, "-5.00e-04"),
    (float("nan"), "nan"), (float("inf"), "inf")])
def test_fmt_three_significant_digits(v, expected):
  """Hand-written: below 1e-3 and from 1e4 on, scientific with three
  significant digits (trailing zeros kept); booleans and text as they are."""
  assert report.fmt(v) == expected


def test_an_interval_with_an_unknown_end_is_left_out():
  assert report.fmt_interval(0.5, 0.25, 0.75) == "0.5 [0.25, 0.75]"
  assert report.fmt_interval(0.5, None, 0.75) == "0.5"
  assert report.fmt_interval(0.5, 0.25, None) == "0.5"
  assert report.fmt_interval(None, 0.25, 0.75) == "n/a"
  assert report.fmt_value_interval({}) == "n/a"
  assert report.fmt_value_interval(None) == "n/a"


def test_table_escapes_pipes_inside_cells():
  """Every row has as many unescaped separators as the header."""
  lines = report.table(["a", "b"], [["x|y", 1.0], ["z", "p | q"]])
  assert lines[2:4] == ["| x\\|y | 1 |", "| z | p \\| q |"]
  seps = lambda l: len(re.findall(r"(?<!\\)\|", l))  # noqa: E731
  assert {seps(l) for l in lines if l} == {3}


def test_all_claims_follow_the_report_order():
  results = {"adaptive": {"claims": [{"claim": "c"}]}, "visual": None,
             "tradeoff": {"claims": [{"claim": "a"}, {"claim": "b"}]}}
  order = list(report.PARTS)
  assert order.index("tradeoff") < order.index("adaptive")
  assert [c["claim"] for c in report.all_claims(results)] == ["a", "b", "c"]


def test_each_image_part_says_its_interval_rule(tmp_path):
  results = {"tradeoff": {"interval_rule": "over seeds", "claims": []},
             "visual": {"claims": []},  # written before the rule was kept
             "convergence": {"claims": []}}
  text = report.render(results, workdir=str(tmp_path),
                       report_dir=str(tmp_path))
  section = lambda p: text.split(f"## {report.PARTS[p][0]}")[1].split(  # noqa: E731
      "## ")[0]
  assert "Intervals: over seeds." in section("tradeoff")
  assert f"Intervals: {report.LEGACY_INTERVAL_RULE}." in section("visual")
  assert "Intervals:" not in section("convergence")  # no run config
  block = report.readme_block(results, "src")
  assert f"Intervals of visual: {report.LEGACY_INTERVAL_RULE};" in block


def test_replace_block_keeps_everything_outside_the_markers():
  text = "top\n<b>\nold 1\n<e>\nmiddle\n<b>\nold 2\n<e>\nend\n"
  block = "<b>\nnew \\1 \\g<0> \\sigma\n<e>"  # backslashes kept as written
  assert report.replace_block(text, "<b>", "<e>", block) == (
      f"top\n{block}\nmiddle\n{block}\nend\n")


def test_publish_again_replaces_the_part_s_run(tmp_path):
  work, dest = str(tmp_path / "run"), str(tmp_path / "published")
  _fake(work)
  for command in ("python -m experiments.tradeoff --first",
                  "python -m experiments.tradeoff --second"):
    storage.write_json(os.path.join(work, "reproduce.json"), {"tradeoff": {
        "command": command, "seconds": 3.0, "status": "done"}})
    text = open(report.publish(work, dest)).read()
  assert "--second" in text and "--first" not in text
  assert storage.read_json(os.path.join(dest, "reproduce.json"))[
      "tradeoff"]["command"].endswith("--second")


def test_convergence_section_states_its_setting_and_interval(tmp_path):
  """F(w_0) - F(w_T) > 0 over a short constant-rate run is not Theorem 2's
  convergence: the section says what was run, from the run's own config."""
  base = {"model": "logreg", "dataset": "mnist", "rounds": 30,
          "lr_schedule": "constant", "client_lr": 0.05, "batch_size": 10,
          "l2": 0.001}
  text = report.render({"convergence": {"claims": [], "base": base}},
                       workdir=str(tmp_path), report_dir=str(tmp_path))
  setting = next(l for l in text.splitlines() if l.startswith("Setting:"))
  assert "logreg on mnist, 30 rounds" in setting
  assert "rows with their own" not in setting
  assert "constant client learning rate 0.05" in setting
  assert "not that it converged" in setting
  assert f"Intervals: {report.SEED_VALUES_RULE}." in text
  # A row with its own run config says so, with what it changes.
  rows = [{"name": "I5_K10_lenet_none", "overrides": {
      "model": "lenet", "rounds": 200, "client_lr": 0.1, "l2": 0.0,
      "log_every": 20}}]
  text = report.render({"convergence": {"claims": [], "base": base,
                                        "settings": rows}},
                       workdir=str(tmp_path), report_dir=str(tmp_path))
  assert ("(rows with their own settings: I5_K10_lenet_none: model lenet, "
          "rounds 200, client_lr 0.1, l2 0)") in text
  base = {**base, "lr_schedule": "theorem2", "rounds": 200}
  text = report.render({"convergence": {"claims": [], "base": base}},
                       workdir=str(tmp_path), report_dir=str(tmp_path))
  assert "200 rounds, Theorem 2's decaying rate" in text


def test_readme_replication_block_is_the_committed_json_rendered():
  """The README's replication block re-renders from the replica's JSON."""
  block = _readme_block(replication.README_BEGIN, replication.README_END)
  source = "docs/results/replica"
  assert f"`{source}/{replication.JSON_FILE}`" in block
  result = storage.read_json(os.path.join(ROOT, source, replication.JSON_FILE))
  assert block == replication.readme_block(result, source)


def test_each_part_states_its_attack_budgets(tmp_path):
  """A part's section names the budgets its config recorded: the shared
  ones, a panel's overrides and the real-update attacks'."""
  config = {"attack_budgets": {"dlg": {"outer_steps": 30, "inner_steps": 20},
                               "gs": {"iterations": 500, "restarts": 2}},
            "panels": {"p": {"attack_budgets": {
                "gs": {"iterations": 2000, "tv_weight": 0.1}}}},
            "update_attack": {"budgets": {"gs": {"iterations": 16000}},
                              "unroll": True}}
  text = report.render({"visual": {"claims": [], "config": config}},
                       workdir=str(tmp_path), report_dir=str(tmp_path))
  section = text.split(f"## {report.PARTS['visual'][0]}")[1]
  assert ("Attack budgets (DLG-type: outer x inner L-BFGS steps; GS: "
          "iterations): dlg 30 x 20; gs 500 x 2 restarts; p: gs 2000 "
          "(tv_weight 0.1); real updates: gs 16000 (unrolled). The paper's: "
          "DLG 300 x 20, GS 24,000 x 2 restarts.") in section
  assert report.attack_budgets_line({}) == ""


def test_verdicts_table_marks_a_ratio_of_one_measured_point():
  """Without its statistic column, the verdicts table still says when a
  'median' ratio rests on one measured point."""
  claim = {"claim": "c", "paper": "> 160x", "value": 2.0, "low": 1.0,
           "high": 3.0, "verdict": "did not hold",
           "statistic": "median over 1 measured points of the ratio"}
  text = lambda **kw: "\n".join(report.claims_table([claim], **kw))  # noqa: E731
  assert "| 2 [1, 3] (one measured point) | did not hold |" in text(
      with_statistic=False)
  assert "(one measured point)" not in text()  # The column says it.
  claim["statistic"] = "median over 3 measured points of the ratio"
  assert "(one measured point)" not in text(with_statistic=False)
