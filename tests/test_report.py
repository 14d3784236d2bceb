"""The report generator and the trade-off analysis on small fake results."""

import math
import os

import pytest

from repdef_jax import storage
from repdef_jax.paper import report
from repdef_jax.paper import tradeoff


def _pt(strength, acc, mse, ssim=0.5):
  return {"strength": strength, "accuracy": acc, "mse": mse,
          "mse_clamped": min(mse, 1.0), "ssim": ssim}


def test_best_metric_interpolates_on_accuracy():
  curve = [(0.0, 0.90, 0.01), (50.0, 0.90, 0.5), (100.0, 0.80, 1.5)]
  # Accuracy floor 0.85 is crossed half-way through the last segment.
  assert tradeoff.best_metric_at_accuracy(curve, 0.85) == pytest.approx(1.0)
  assert tradeoff.best_metric_at_accuracy(curve, 0.95) is None


def test_mse_ratios_and_threshold():
  sot = [_pt(0, 0.9, 0.01, 0.9), _pt(40, 0.9, 0.8, 0.1),
         _pt(80, 0.89, 2.0, 0.05)]
  base = [_pt(0, 0.9, 0.01, 0.9), _pt(50, 0.88, 0.01, 0.8),
          _pt(90, 0.80, 0.05, 0.15)]
  r = tradeoff.mse_ratios(sot, base, metric="mse", tol=0.01)
  assert [p["strength"] for p in r["per_point"]] == [50.0, 90.0]
  assert r["per_point"][0]["ratio"] == pytest.approx(200.0)
  assert r["max"] == pytest.approx(200.0)
  t = tradeoff.threshold_crossing(sot, metric="ssim", threshold=0.2)
  assert t["reached"] and t["accuracy_drop"] == pytest.approx(0.0)
  assert 0 < t["strength"] < 40
  t = tradeoff.threshold_crossing(base, metric="ssim", threshold=0.2)
  assert t["strength"] == pytest.approx(50 + 40 * (0.6 / 0.65))
  assert t["accuracy_drop"] == pytest.approx(0.9 - (0.88 - 0.08 * 0.6 / 0.65))
  never = tradeoff.threshold_crossing(base, metric="ssim", threshold=0.01)
  assert not never["reached"] and never["accuracy_drop"] is None


def _fake_results(workdir):
  sot = [_pt(0, 0.9, 0.01, 0.9), _pt(60, 0.9, 1.0, 0.1)]
  base = [_pt(0, 0.9, 0.01, 0.9), _pt(90, 0.85, 0.02, 0.3)]
  curves = {"soteria": sot, "compression": base}
  panel = {"dataset": "mnist", "attack": "dlg", "curves": curves,
           **tradeoff.summarize(curves, tol=0.01, unrec_metric="ssim",
                                unrec_threshold=0.2)}
  storage.write_json(os.path.join(workdir, "tradeoff", "tradeoff.json"), {
      "config": {"seed": 3, "equal_accuracy_tol": 0.01},
      "pixel_space": "[0,1]", "definitions": {"mse": "raw"},
      "panels": {"mnist/dlg": panel}})
  with open(os.path.join(workdir, "tradeoff", "tradeoff.png"), "wb") as f:
    f.write(b"\x89PNG fake")
  storage.write_json(os.path.join(workdir, "certified", "certified.json"), {
      "config": {"seed": 0, "attacks": ["gs"]}, "pixel_space": "[0,1]",
      "rates": [{"rate": 0.0, "certified_bound": 0.0, "gs_distance": 1.0},
                {"rate": 50.0, "certified_bound": 0.5,
                 "gs_distance": 3.0}],
      "fraction_attack_distance_above_bound": {"gs": 1.0}})
  storage.write_json(os.path.join(workdir, "repinfer", "repinfer.json"), {
      "config": {"seed": 0},
      "inference": {"correlation_summary": {"head": {
          "mean": 0.9, "median": 0.92, "max": 0.99, "min": 0.7,
          "frac_above_0.8": 0.95, "n": 20}}},
      "reconstruction": {"pixel_space": "[0, 1]", "summary": {
          "representation": {"mse": 0.01, "psnr": 20.0},
          "gradient": {"mse": 0.01, "psnr": 20.0},
          "conv_gradient": {"mse": 0.1, "psnr": 10.0}}}})
  storage.write_json(os.path.join(workdir, "adaptive", "adaptive.json"), {
      "config": {"seed": 0}, "pixel_space": "[0,1]",
      "verdict_rule": "holds when mean SSIM <= 0.2",
      "cells": [{"model": "lenet5", "stage": "init", "variant": "reference",
                 "rate": 60.0,
                 "attack": "gs_drop", "mse": 0.01, "mse_clamped": 0.01,
                 "ssim": 0.9, "verdict": "fails"}]})


def test_report_has_every_part_ours_and_paper(tmp_path):
  _fake_results(str(tmp_path))
  runs = {"tradeoff": {"command": "python -m experiments.tradeoff --x",
                       "seconds": 12.5, "status": "done"}}
  path = report.write_report(str(tmp_path), runs=runs, preset="quick")
  text = open(path).read()
  assert path == os.path.join(str(tmp_path), "REPORT.md")
  for heading in ("Utility-privacy trade-off", "Visual comparison",
                  "Representation leakage", "Convergence", "Certified bound",
                  "adaptive attacks"):
    assert heading in text
  assert "**paper**" in text and "> 160x" in text
  assert "50x" in text  # Soteria 1.0 / compression 0.02 at equal accuracy
  assert "up to 0.06 (DLG)" in text
  assert "![tradeoff: tradeoff.png](tradeoff/tradeoff.png)" in text
  assert "python -m experiments.tradeoff --x" in text and "12.5" in text
  assert "[0,1]" in text
  assert text.count("Not run.") == 2  # visual and convergence are missing
  assert "0.99" in text and "fails against gs_drop" in text


def test_report_survives_malformed_part(tmp_path):
  storage.write_json(os.path.join(str(tmp_path), "certified",
                                 "certified.json"), {"config": {}})
  text = report.render(report.collect(str(tmp_path)), workdir=str(tmp_path),
                       report_dir=str(tmp_path))
  assert "Could not summarise" in text
  assert not math.isnan(len(text))
