"""The benchmark driver in quick mode: table and JSON structure, no timings.

Checks what a reader relies on: every row has its peer, ratio = peer time /
our time from the same JSON, GFLOP/s and peak fractions from the stated
FLOP count, the paper-scale table, and the markdown rendered from the JSON.
"""

import json
import math

import pytest

from experiments.benchmarks import driver
from experiments.benchmarks import timing
from experiments.benchmarks import torch_peers

HAS_TORCH = torch_peers.available()[0]

ROW_KEYS = {"part", "benchmark", "config", "ours_s", "peer", "peer_s",
            "ratio", "target", "met", "gflop", "ours_gflops",
            "ours_peak_fraction", "peer_gflops", "peer_peak_fraction",
            "compile_s", "xla_memory_mib", "load_1min", "note"}


# The Soteria-mask part runs in about 10 s; with the FedAvg rounds and the
# paper-scale table about 40 s (slow).
@pytest.fixture(scope="module", params=[
    ("defense",), pytest.param(("fedavg", "defense"), marks=pytest.mark.slow)])
def quick_report(request, tmp_path_factory):
  out = tmp_path_factory.mktemp("bench")
  driver.run_and_write(True, str(out), parts=request.param)
  with open(out / "benchmarks.json", encoding="utf-8") as f:
    report = json.load(f)
  with open(out / "BENCHMARKS.md", encoding="utf-8") as f:
    md = f.read()
  return report, md


def test_quick_driver_rows_and_ratios(quick_report):
  report, _ = quick_report
  rows = report["rows"]
  s = driver.SETTINGS["quick"]
  fedavg = "fedavg" in report["settings"]["parts"]
  assert len(rows) == len(s["mask_batches"]) + fedavg * (
      len(s["plain_batches"]) + len(s["defended_batches"]) + 1)
  peak = report["machine"]["peak"]["gflops"]
  for r in rows:
    assert set(r) == ROW_KEYS, r["benchmark"]
    assert r["ours_s"] > 0 and r["gflop"] > 0
    assert math.isclose(r["ours_gflops"], r["gflop"] / r["ours_s"],
                        rel_tol=1e-9)
    assert math.isclose(r["ours_peak_fraction"], r["ours_gflops"] / peak,
                        rel_tol=1e-9)
    if HAS_TORCH:
      assert r["peer"].startswith("torch 2 threads")
      assert math.isclose(r["ratio"], r["peer_s"] / r["ours_s"],
                          rel_tol=1e-9)
      if r["target"] is not None:
        assert r["met"] is (r["ratio"] >= r["target"])
    else:
      assert r["ratio"] is None and "torch" in r["note"]
  masks = [r for r in rows if r["part"] == "defense"]
  if HAS_TORCH:  # The peer's reference-rule mask equals ours.
    assert all("masks identical: yes" in r["note"] for r in masks)
  paper = report["paper_scale"]
  assert [p["defended"] for p in paper] == ([False, True] if fedavg else [])
  for p in paper:
    assert p["gpu"] == driver.GPU_NOTE
    assert math.isclose(p["estimate_s"], p["compile_s"] + 200 * p["round_s"],
                        rel_tol=1e-9)
    assert p["scale"] == 50.0  # 1 client x 1 step measured -> 10 x 5.
  assert report["torch"]["threads"] == (2 if HAS_TORCH else None)
  assert report["machine"]["git_commit"]
  assert len(report["machine"]["load_average_before"]) == 3


def test_quick_markdown_is_rendered_from_the_json(quick_report):
  report, md = quick_report
  assert md == driver.render_markdown(report)
  assert "python -m experiments.benchmark --quick" in md
  assert "Load average (1, 5, 15 min)" in md
  assert report["machine"]["peak"]["how"] in md
  assert "## Targets" in md
  if report["paper_scale"]:
    assert "## Paper-scale cost (200 rounds)" in md and driver.GPU_NOTE in md
  table = [l for l in md.splitlines() if l.startswith("| ")]
  for r in report["rows"]:
    line = next(l for l in table if l.startswith(
        f"| {driver._fmt(r['benchmark'])} | {driver._fmt(r['config'])} |"))  # pylint: disable=protected-access
    if r["ratio"] is not None:
      assert f"| {driver._fmt(r['ratio'])}x |" in line  # pylint: disable=protected-access


def test_cpu_peak_states_its_formula():
  peak = timing.cpu_peak()
  if peak["ghz"]:
    assert math.isclose(peak["gflops"], peak["cores"] * peak["ghz"] *
                        peak["flops_per_cycle_per_core"], rel_tol=1e-9)
    assert "FLOP/cycle" in peak["how"]


def _report(parts, commit, rows, quick=False):
  return {"settings": {"quick": quick, "parts": list(parts)},
          "machine": {"git_commit": commit, "date_utc": commit + "-date"},
          "rows": [{"part": p, "benchmark": b} for p, b in rows],
          "paper_scale": [{"setting": commit}], "unit_costs": {"c": commit},
          "preset_costs": [{"preset": commit}]}


def test_a_run_of_some_parts_keeps_the_others():
  old = _report(driver.PARTS, "old", [("fedavg", "round"), ("defense", "a"),
                                      ("attack", "dlg")])
  new = _report(("defense",), "new", [("defense", "b")])
  merged = driver.merge(old, new)
  assert [(r["part"], r["benchmark"]) for r in merged["rows"]] == [
      ("fedavg", "round"), ("defense", "b"), ("attack", "dlg")]
  assert merged["paper_scale"] == [{"setting": "old"}]  # fedavg not rerun
  assert merged["unit_costs"] == {"c": "old"}
  assert merged["measured"]["defense"]["git_commit"] == "new"
  assert merged["measured"]["attack"]["git_commit"] == "old"
  assert merged["settings"]["parts"] == list(driver.PARTS)
  assert "defense at commit new" in "\n".join(driver._measured_lines(merged))  # pylint: disable=protected-access
  # A quick run never mixes with a full one.
  quick = _report(("defense",), "q", [("defense", "c")], quick=True)
  assert [r["benchmark"] for r in driver.merge(old, quick)["rows"]] == ["c"]
