"""The benchmark driver in quick mode: table and JSON structure, no timings.

Checks what a reader relies on: every row has its peer, ratio = peer time /
our time from the same JSON, GFLOP/s and peak fractions from the stated
FLOP count, the paper-scale table, and the markdown rendered from the JSON.
"""

import json
import math
import os

import numpy as np
import pytest

from experiments.benchmarks import driver
from experiments.benchmarks import fedavg as fedavg_bench
from experiments.benchmarks import timing
from experiments.benchmarks import torch_peers
from experiments.configs import tradeoff as tradeoff_config
from repdef_jax import storage
from repdef_jax.paper import cost
from repdef_jax.paper import sweep

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
  # Mask and defended-round workloads have a row per PyTorch peer (the
  # reference loop, the torch.func-vectorized mask).
  assert len(rows) == 2 * len(s["mask_batches"]) + fedavg * (
      len(s["plain_batches"]) + 2 * len(s["defended_batches"]) + 1)
  peak = report["machine"]["peak"]["gflops"]
  for r in rows:
    assert set(r) == ROW_KEYS, r["benchmark"]
    assert r["ours_s"] > 0 and r["gflop"] > 0
    assert math.isclose(r["ours_gflops"], r["gflop"] / r["ours_s"],
                        rel_tol=1e-9)
    assert math.isclose(r["ours_peak_fraction"], r["ours_gflops"] / peak,
                        rel_tol=1e-9)
    if HAS_TORCH:
      vectorized = "vectorized PyTorch" in r["benchmark"]
      assert r["peer"] == ("torch.func vmap, 2 threads" if vectorized
                           else "torch 2 threads")
      if vectorized:  # Targets are against the reference loop only.
        assert r["target"] is None and r["met"] is None
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


def test_flops_per_cycle_by_vendor_and_flags():
  fma = {"avx2", "fma"}
  assert timing.flops_per_cycle("GenuineIntel", fma | {"avx512f"})[0] == 64
  amd = timing.flops_per_cycle("AuthenticAMD", fma | {"avx512f"})
  assert amd[0] == 32 and "256-bit pipes" in amd[1]
  assert timing.flops_per_cycle("GenuineIntel", fma)[0] == 32
  assert timing.flops_per_cycle("GenuineIntel", {"avx"})[0] == 16


def test_generic_hypervisor_cpu_models_get_a_caveat():
  for name in ("AMD EPYC", "QEMU Virtual CPU version 2.5+",
               "Common KVM processor"):
    assert "generic CPU model" in timing.generic_cpu_note(name)
  for name in ("AMD EPYC 7B13", "Intel(R) Xeon(R) Processor", None):
    assert timing.generic_cpu_note(name) == ""


def test_peak_is_raised_to_a_faster_measured_sgemm():
  nominal = {"gflops": 100.0, "how": "2 cores x 1 GHz x 50 FLOP/cycle"}
  kept = timing.raise_to_measured(nominal, {"XLA": 90.0})
  assert kept["gflops"] == 100.0 and "XLA 90" in kept["how"]
  raised = timing.raise_to_measured(nominal, {"XLA": 90.0, "torch": 120.0})
  assert raised["gflops"] == 120.0
  assert "torch" in raised["how"] and "nominal 100" in raised["how"]
  assert raised["sgemm_gflops"] == {"XLA": 90.0, "torch": 120.0}


def test_cpu_peak_from_a_known_cpu(monkeypatch):
  """2 Intel AVX-512 cores, cpuinfo 2,600 MHz below lscpu's 3,000 MHz
  maximum: 2 x 3.0 GHz x 64 FLOP/cycle = 384 GFLOP/s; no clock: no peak."""
  info = {"cpu mhz": "2600.0", "vendor_id": "GenuineIntel",
          "flags": "fpu avx2 fma avx512f"}
  monkeypatch.setattr(timing.host, "cpuinfo", info.get)
  monkeypatch.setattr(timing.host, "usable_cores", lambda: 2)
  monkeypatch.setattr(timing, "_lscpu", lambda: {"cpu max mhz": "3000.0"})
  peak = timing.cpu_peak()
  assert (peak["ghz"], peak["cores"], peak["flops_per_cycle_per_core"]) == (
      3.0, 2, 64)
  assert math.isclose(peak["gflops"], 384.0) and peak["avx512"]
  assert "2 cores x 3.000 GHz x 64 FLOP/cycle" in peak["how"]
  info.pop("cpu mhz")
  monkeypatch.setattr(timing, "_lscpu", lambda: {})
  peak = timing.cpu_peak()
  assert peak["gflops"] is None and peak["how"] == "unknown clock"


def _report(parts, commit, rows, quick=False, cpu="X"):
  return {"settings": {"quick": quick, "parts": list(parts)},
          "machine": {"git_commit": commit, "date_utc": commit + "-date",
                      "cpu": cpu, "peak": {"gflops": len(cpu) * 100.0}},
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
  text = "\n".join(driver._measured_lines(merged))  # pylint: disable=protected-access
  assert "defense at commit new" in text
  assert "attack at commit old on old-date (load" in text
  assert "different CPUs" not in text
  # A part run on another CPU is labelled with it and its peak.
  other = driver.merge(old, _report(("defense",), "new", [("defense", "b")],
                                    cpu="Other CPU"))
  assert other["measured"]["defense"]["cpu"] == "Other CPU"
  assert other["measured"]["attack"]["peak_gflops"] == 100.0
  text = "\n".join(driver._measured_lines(other))  # pylint: disable=protected-access
  assert "defense at commit new on new-date on Other CPU (peak 900 " in text
  assert "attack at commit old on old-date on X (peak 100 GFLOP/s)" in text
  assert "ran on different CPUs" in text
  # The same model name on another family is another CPU too.
  zen4 = _report(("defense",), "new", [("defense", "b")], cpu="AMD EPYC")
  zen4["machine"]["peak"]["lscpu_family_model"] = "25/17"
  zen1 = _report(driver.PARTS, "old", [("attack", "dlg")], cpu="AMD EPYC")
  zen1["machine"]["peak"]["lscpu_family_model"] = "23/1"
  text = "\n".join(driver._measured_lines(driver.merge(zen1, zen4)))  # pylint: disable=protected-access
  assert "on AMD EPYC (family 25, model 17) (peak" in text
  assert "on AMD EPYC (family 23, model 1) (peak" in text
  # Stamps written before the CPU was recorded take it from their run's
  # machine line; a part of an earlier run keeps its own stamp.
  legacy = {"git_commit": "old", "date_utc": "old-date"}
  earlier = {"git_commit": "older", "date_utc": "d0", "cpu": "Y"}
  old["measured"] = {"fedavg": legacy, "attack": earlier}
  merged = driver.merge(old, _report(("defense",), "new", [("defense", "b")]))
  assert merged["measured"]["fedavg"]["cpu"] == "X"
  assert merged["measured"]["attack"] == earlier
  # A quick run never mixes with a full one.
  quick = _report(("defense",), "q", [("defense", "c")], quick=True)
  assert [r["benchmark"] for r in driver.merge(old, quick)["rows"]] == ["c"]


def _full_row(benchmark, ours_s, peer, peer_s):
  row = dict.fromkeys(ROW_KEYS)
  row.update(part="fedavg", benchmark=benchmark, config="LeNet CIFAR",
             ours_s=ours_s, peer=peer, peer_s=peer_s, ratio=peer_s / ours_s)
  return row


def _machine_report(backend, seconds, peer, peer_s, paper_s, preset_h):
  return {"settings": {"quick": False, "parts": list(driver.PARTS)},
          "machine": {"backend": backend, "device_kind": backend.upper() + "-x",
                      "git_commit": backend, "peak": {"how": backend}},
          "torch": {"version": "t", "device": "cuda" if backend == "gpu"
                    else "cpu"},
          "rows": [_full_row("plain FedAvg round", seconds, peer, peer_s)],
          "paper_scale": [{"setting": "plain", "round_s": paper_s / 200,
                           "estimate_s": paper_s, "gpu": driver.GPU_NOTE}],
          "preset_costs": [{"preset": "full", "cells": 1, "cpu_h": preset_h,
                            "gpu_h": 1.0, "by_model_h": {}}]}


def test_a_gpu_run_renders_as_the_gpu_section_of_the_cpu_page(tmp_path):
  cpu = _machine_report("cpu", 0.4, "torch 2 threads", 0.6, 3600.0, 5000.0)
  gpu = _machine_report("gpu", 0.01, "torch cuda", 0.05, 600.0, 12.5)
  driver.write(cpu, str(tmp_path))
  alone = (tmp_path / "BENCHMARKS.md").read_text()
  assert "## On one GPU" not in alone and driver.GPU_NOTE in alone
  driver.write(gpu, str(tmp_path / driver.GPU_DIR))
  driver.render(str(tmp_path))
  md = (tmp_path / "BENCHMARKS.md").read_text()
  section = md.split("## On one GPU")[1].split("\n## ")[0]
  # GPU time, its CUDA peer, the peer ratio, the CPU time and CPU / GPU.
  assert ("| plain FedAvg round | LeNet CIFAR | 0.01 | torch cuda | 0.05 | "
          "5.00x |") in section
  assert "| 0.4 | 40.00x |" in section
  # The paper-scale and preset tables take the GPU's measured numbers.
  assert "| 10.00 min (3.00 s/round, measured) |" in md
  assert driver.GPU_NOTE not in md
  assert "| full | 1 | 5000 | - | 1.00 | 12.50 |  |" in md
  # The GPU page itself has no GPU section.
  assert "## On one GPU" not in (tmp_path / "gpu" / "BENCHMARKS.md").read_text()
  with pytest.raises(ValueError, match="--out_dir"):
    driver.render(str(tmp_path / "nothing"))


def test_earlier_runs_on_other_machines_render_beside_this_one(tmp_path):
  """A full run on another CPU archives the previous one; the page lists
  each archived run and its targeted rows beside ours (matched by benchmark
  and configuration; '-' where a row is missing)."""
  def report(cpu, commit, ratio, rounds_s):
    r = _machine_report("cpu", 1.0, "torch 2 threads", ratio, 1.0, 1.0)
    r["machine"].update(cpu=cpu, git_commit=commit, date_utc=commit + "-d")
    r["rows"][0].update(target=1.5, met=ratio >= 1.5)
    rounds = _full_row("rounds", rounds_s, "t", 1.0)
    rounds.update(config="paper", met=rounds_s <= 1200)
    r["rows"].append(rounds)
    return r

  old = report("Xeon", "old", 2.0, 900.0)
  old["rows"] = old["rows"][:1]  # No time row in the earlier run.
  driver.write(old, str(tmp_path))
  xeon_page = (tmp_path / "BENCHMARKS.md").read_text()
  # Same CPU, or some parts only: nothing is archived.
  assert driver.archive_previous(old, report("Xeon", "b", 1.0, 1.0),
                                 str(tmp_path)) is None
  part = report("AMD", "p", 1.0, 1.0)
  part["settings"]["parts"] = ["fedavg"]
  assert driver.archive_previous(old, part, str(tmp_path)) is None
  assert not (tmp_path / driver.ARCHIVE_DIR).exists()
  # The same model name on another family is another CPU (a hypervisor's
  # 'AMD EPYC' named both a Zen 1 and a Zen 4 here).
  def zen(family_model):
    r = report("AMD EPYC", family_model, 1.0, 1.0)
    r["machine"]["peak"]["lscpu_family_model"] = family_model
    return r
  assert driver.cpu_label(zen("25/17")["machine"]) == (
      "AMD EPYC (family 25, model 17)")
  assert driver.cpu_label({"cpu": "Xeon", "cpu_family": "6"}) == (
      "Xeon (family 6)")
  assert driver.archive_previous(zen("23/1"), zen("23/1"),
                                 str(tmp_path / "zen")) is None
  assert driver.archive_previous(zen("23/1"), zen("25/17"),
                                 str(tmp_path / "zen")) is not None
  # A full run on another CPU moves the page and JSON to the archive.
  driver.publish(report("AMD", "new", 0.5, 4000.0), str(tmp_path))
  kept = tmp_path / driver.ARCHIVE_DIR / "old-d-old"
  assert (kept / "BENCHMARKS.md").read_text() == xeon_page
  assert json.loads((kept / "benchmarks.json").read_text()) == old
  md = (tmp_path / "BENCHMARKS.md").read_text()
  section = md.split("## Earlier runs on other machines")[1].split("\n## ")[0]
  assert ("| [archive/old-d-old](archive/old-d-old/BENCHMARKS.md) | Xeon | "
          "old | old-d | 1 of 1 |") in section
  assert ("| plain FedAvg round | LeNet CIFAR | 0.5x (not met) | "
          "2.00x (met) |") in section
  assert "| rounds | paper | 4000 s (not met) | - |" in section
  # This run's own verdicts are unchanged by the archive.
  assert "Targets met: 0 of 2." in md


def test_presets_are_priced_from_the_stored_unit_costs(tmp_path):
  """A stale preset table (priced under an older plan) is re-priced by
  --render_only and by a run of other parts that keeps the unit costs."""
  committed = os.path.join(os.path.dirname(__file__), "..", "docs",
                           "benchmarks", "benchmarks.json")
  assert os.path.exists(committed), "no committed benchmarks.json"
  with open(committed, encoding="utf-8") as f:
    unit = json.load(f)["unit_costs"]
  stale = [{"preset": "medium", "cells": 1, "cpu_h": 123456.0, "gpu_h": 1.0,
            "by_model_h": {}}]
  cells = len(sweep.plan(tradeoff_config.get_config("medium")))

  def medium_row(report):
    (row,) = [p for p in report["preset_costs"] if p["preset"] == "medium"]
    return row

  report = _machine_report("cpu", 0.4, "torch 2 threads", 0.6, 3600.0, 5000.0)
  report.update(unit_costs=unit, preset_costs=stale)
  storage.write_json(str(tmp_path / "benchmarks.json"), report)  # stale
  driver.render(str(tmp_path))
  md = (tmp_path / "BENCHMARKS.md").read_text()
  rows = {line.split(" | ")[0]: line for line in md.splitlines()
          if line.startswith(("| medium |", "| full |"))}
  assert set(rows) == {"| medium", "| full"}
  assert "123456" not in rows["| medium"]
  assert rows["| medium"].startswith(f"| medium | {cells} |")
  priced = medium_row(storage.read_json(str(tmp_path / "benchmarks.json")))
  assert priced["cells"] == cells and priced["cpu_h"] != 123456.0
  # The estimate and the committed run, by kind of cell, add up to totals.
  assert math.isclose(sum(priced["by_kind_h"].values()), priced["cpu_h"])
  if priced["measured_h"] is not None:
    assert math.isclose(sum(priced["measured_by_kind_h"].values()),
                        priced["measured_h"])
    train = priced["by_kind_h"]["train"]
    assert (f"train {driver._fmt(train)} / "  # pylint: disable=protected-access
            f"{driver._fmt(priced['measured_by_kind_h']['train'])}") in md  # pylint: disable=protected-access

  # A run of the defense part alone keeps the old unit costs; the presets
  # are priced from them, not copied from the old report.
  old = dict(report, preset_costs=stale)
  new = _machine_report("cpu", 0.3, "torch 2 threads", 0.6, 3600.0, 5000.0)
  new["settings"]["parts"] = ["defense"]
  new.pop("preset_costs")
  merged = driver.merge(old, new)
  driver.write(merged, str(tmp_path / "merged"))
  assert medium_row(merged) == priced


def test_gpu_peak_from_the_device_kind():
  assert timing.gpu_peak("NVIDIA H200")["gflops"] == 67e3
  assert timing.gpu_peak("NVIDIA H100 PCIe")["gflops"] == 51e3  # not SXM's
  assert timing.gpu_peak("NVIDIA H100 80GB HBM3")["gflops"] == 67e3
  unknown = timing.gpu_peak("Some GPU")
  assert unknown["gflops"] is None and "Some GPU" in unknown["how"]


def test_peers_run_where_ours_runs():
  if not HAS_TORCH:
    pytest.skip("torch not installed")
  import jax  # pylint: disable=g-import-not-at-top
  want = "cuda" if jax.default_backend() == "gpu" else "cpu"
  assert torch_peers.device() == want
  assert str(torch_peers.labels([1, 2]).device).startswith(want)
  assert torch_peers.labels([1, 2]).dtype == __import__("torch").int64


def test_dlg_peer_and_ours_follow_the_same_lbfgs_from_the_same_start():
  """The DLG row compares one algorithm: from our dummy image and label,
  torch.optim.LBFGS (lr 1, no line search) on the peer's network reaches
  our loss after 1 and 5 iterations (later, without a line search, float
  rounding takes the two apart: after 20, 1,113 against torch's 1,036 in
  float32 and 827 in float64 on this image)."""
  if not HAS_TORCH:
    pytest.skip("torch not installed")
  import jax  # pylint: disable=g-import-not-at-top
  import torch  # pylint: disable=g-import-not-at-top
  from experiments.benchmarks import attack  # pylint: disable=g-import-not-at-top
  from repdef_jax.attacks import dlg as dlg_lib  # pylint: disable=g-import-not-at-top
  model, params, x, shared = attack._setup("lenet")  # pylint: disable=protected-access
  key = jax.random.key(1)
  kx, ky = jax.random.split(key)  # How dlg draws a one-restart start.
  x0 = np.asarray(jax.random.normal(kx, (1, *model.input_shape)))
  y0 = np.asarray(jax.random.normal(ky, (1, model.num_classes)))
  net = torch_peers.torch_model(model, params)
  onehot = torch.nn.functional.one_hot(torch_peers.labels([attack.LABEL]),
                                       10).float()
  ce = torch_peers._ce_soft  # pylint: disable=protected-access
  true = [g.detach() for g in torch.autograd.grad(
      ce(net(torch_peers.nchw(np.asarray(x))), onehot),
      list(net.parameters()))]
  for inner in (1, 5):
    ours = dlg_lib.dlg(model, params, shared, 1, key,
                       config=attack.no_stop_config(1, inner))
    dx = torch_peers.nchw(x0).clone().requires_grad_(True)
    dy = torch.tensor(y0).clone().requires_grad_(True)
    opt = torch.optim.LBFGS([dx, dy], lr=1, history_size=100,
                            max_iter=inner, tolerance_grad=0.0,
                            tolerance_change=0.0)

    def closure():
      opt.zero_grad()
      g = torch.autograd.grad(ce(net(dx), torch.softmax(dy, -1)),
                              list(net.parameters()), create_graph=True)
      d = sum(((a - b) ** 2).sum() for a, b in zip(g, true))
      d.backward()
      return d

    opt.step(closure)
    assert float(ours.final_loss) == pytest.approx(
        float(closure().detach()), rel=2e-3), inner


def test_dlg_bench_runs_every_iteration():
  """The DLG benchmark's settings pass the attack's checks and take every
  iteration they are priced for (the FLOP count assumes no early stop)."""
  import jax  # pylint: disable=g-import-not-at-top
  from experiments.benchmarks import attack  # pylint: disable=g-import-not-at-top
  from repdef_jax import gradients  # pylint: disable=g-import-not-at-top
  from repdef_jax.attacks import dlg  # pylint: disable=g-import-not-at-top
  model, params, x = _small_lenet(1)
  shared = gradients.batch_grad(model, params, x, jax.numpy.array([3]))
  result = dlg.dlg(model, params, shared, 1, jax.random.key(1),
                   config=attack.no_stop_config(2, 3))
  assert int(result.iterations) == 2 * 3


def _small_lenet(batch):
  """A LeNet on 8x8x3 images (48 features), its parameters and a batch."""
  import jax  # pylint: disable=g-import-not-at-top
  from repdef_jax import models  # pylint: disable=g-import-not-at-top
  model = models.get_model("lenet", (8, 8, 3), 10)
  params = model.init(jax.random.key(0))
  x = jax.random.uniform(jax.random.key(1), (batch, 8, 8, 3))
  return model, params, x


@pytest.mark.parametrize("percent", [60.0, 50.0])
def test_vectorized_soteria_mask_equals_the_reference_loop(percent):
  """torch.func-vectorized scores in feature chunks (a chunk that does not
  divide F included) give the reference loop's mask and scores."""
  if not HAS_TORCH:
    pytest.skip("torch not installed")
  model, params, x = _small_lenet(6)
  net = torch_peers.torch_model(model, params)
  xt = torch_peers.nchw(x)
  keep, scores = torch_peers.soteria_mask(net, xt, percent, model.score_eps)
  assert scores.shape == (model.num_features,) and 0 < keep.sum() < len(keep)
  for chunk in (None, 7):  # vmap_chunk(6) = 256 > F = 48; 7 splits F.
    keep_v, scores_v = torch_peers.soteria_mask_vectorized(
        net, xt, percent, model.score_eps, chunk=chunk)
    assert np.array_equal(keep_v, keep), chunk
    np.testing.assert_allclose(scores_v, scores, rtol=1e-5, atol=0)
  with pytest.raises(ValueError, match="mask_impl"):
    torch_peers.mask_fn("unrolled")


def test_defended_round_is_the_same_with_either_torch_mask():
  if not HAS_TORCH:
    pytest.skip("torch not installed")
  model, params, _ = _small_lenet(1)
  rng = np.random.default_rng(0)
  clients = [(torch_peers.nchw(rng.random((8, 8, 8, 3))),
              torch_peers.labels(rng.integers(0, 10, 8))) for _ in range(2)]
  before = torch_peers.torch_model(model, params).state_dict()
  after = {}
  for impl in torch_peers.MASK_IMPLS:
    net = torch_peers.torch_model(model, params)
    torch_peers.fedavg_round(net, clients, 4, 0.5, defense_percent=60.0,
                             eps=model.score_eps, mask_impl=impl)
    after[impl] = {k: v.cpu().numpy() for k, v in net.state_dict().items()}
  assert not np.allclose(after["loop"]["head.weight"],
                         before["head.weight"].cpu().numpy())  # It trained.
  for k, v in after["loop"].items():
    np.testing.assert_allclose(after["vectorized"][k], v, rtol=1e-5,
                               atol=1e-7, err_msg=k)


@pytest.mark.slow
def test_device_check_script_rehearsed_on_cpu(tmp_path):
  """experiments/benchmarks/device_check.sh end to end on this CPU (quick
  workloads, one test file, tiny notebooks): every part lands in one merged
  report and the logs show the tests and each notebook ran (~2 min)."""
  import os  # pylint: disable=g-import-not-at-top
  import subprocess  # pylint: disable=g-import-not-at-top
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  env = {**os.environ, "OUT": str(tmp_path), "DEVICE_CHECK_FLAGS": "--quick",
         "DEVICE_CHECK_TESTS": "tests/test_stats.py",
         "REPDEF_JAX_NOTEBOOK_TINY": "1"}
  proc = subprocess.run(
      ["bash", "experiments/benchmarks/device_check.sh", "600"], cwd=root,
      env=env, capture_output=True, text=True, timeout=900, check=False)
  assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
  gpu = tmp_path / driver.GPU_DIR
  with open(gpu / "benchmarks.json", encoding="utf-8") as f:
    report = json.load(f)
  assert report["settings"]["parts"] == list(driver.PARTS)
  assert set(report["measured"]) == set(driver.PARTS)
  assert " passed" in (gpu / "tests.log").read_text()
  notebooks = (gpu / "notebooks.log").read_text()
  assert notebooks.count("[device_check] colab/") == 3
  assert "Traceback" not in notebooks


def test_timing_summary_sgemm_and_clock_by_hand(monkeypatch):
  """Best (minimum) time, compile = first call - best, GFLOP/s; sgemm
  counts 2 n^3 FLOPs at its best time; the peak takes the highest clock
  and needs AVX2 and FMA both for 32 FLOP/cycle."""
  out = timing._summary([3.0, 1.0, 2.0], 5.0, {}, 4e9)  # pylint: disable=protected-access
  assert (out["seconds"], out["median_seconds"], out["compile_seconds"],
          out["gflops"], out["repeats"]) == (1.0, 2.0, 4.0, 4.0, 3)
  times = iter([0.5, 0.25, 1.0])
  monkeypatch.setattr(timing, "_timed", lambda call: next(times))
  assert timing.sgemm_gflops(lambda: None, 100, repeats=3) == pytest.approx(
      2 * 100 ** 3 / 0.25 / 1e9)
  info = {"cpu mhz": "2000.0", "flags": "avx2 fma",
          "vendor_id": "AuthenticAMD", "model name": "AMD EPYC 7B13"}
  monkeypatch.setattr(timing.host, "cpuinfo", info.get)
  monkeypatch.setattr(timing.host, "usable_cores", lambda: 4)
  monkeypatch.setattr(timing, "_lscpu", lambda: {"cpu max mhz": "3500.0"})
  assert timing.cpu_peak()["gflops"] == pytest.approx(4 * 3.5 * 32)
  for flags in ({"avx2"}, {"fma"}):
    assert timing.flops_per_cycle("AuthenticAMD", flags)[0] == 16
  # A measured sgemm equal to the nominal peak does not raise it.
  kept = timing.raise_to_measured({"gflops": 100.0, "how": "n"},
                                  {"XLA": 100.0})
  assert kept["gflops"] == 100.0 and "above the nominal" not in kept["how"]


def test_row_ratio_target_and_fraction_of_peak_by_hand():
  """Ratio = peer / ours; a ratio equal to its target meets it; each
  side's GFLOP/s and fraction of peak come from its own time."""
  row = driver._row("p", "b", "c", {"seconds": 1.0}, "peer", {"seconds": 1.5},  # pylint: disable=protected-access
                    1.5, 3e9, 6.0)
  assert row["ratio"] == 1.5 and row["met"] is True
  assert (row["ours_gflops"], row["peer_gflops"]) == (3.0, 2.0)
  assert row["ours_peak_fraction"] == pytest.approx(0.5)
  assert row["peer_peak_fraction"] == pytest.approx(2.0 / 6.0)
  assert driver._row("p", "b", "c", {"seconds": 1.0}, "peer", {"seconds": 1.4},  # pylint: disable=protected-access
                     1.5, None, None)["met"] is False


def test_targets_met_counts_every_judged_row():
  """'Targets met: k of n' counts ratio targets and the paper-rounds time
  target (met given, no ratio target); estimated / measured by kind."""
  rows = []
  for name, target, met, ours in (("a", 1.5, True, 1.0), ("rounds", None,
                                                           False, 2000.0),
                                  ("b", None, None, 1.0)):
    row = dict.fromkeys(ROW_KEYS)
    row.update(part="fedavg", benchmark=name, config="c", ours_s=ours,
               peer="t", target=target, met=met,
               ratio=2.0 if target else None)
    rows.append(row)
  report = {"rows": rows, "settings": {"quick": True},
            "preset_costs": [{"preset": "medium", "cells": 1, "cpu_h": 2.0,
                              "gpu_h": 1.0, "by_model_h": {},
                              "by_kind_h": {"train": 2.0},
                              "measured_by_kind_h": {"train": 4.0}}]}
  md = driver.render_markdown(report)
  assert "Targets met: 1 of 2." in md
  assert "| rounds | c | 2000 s | <= 1200 s | NOT met |" in md
  assert "train 2.00 / 4.00 (0.5x)" in md
  # Parts measured by one run need no per-part line.
  stamp = {"git_commit": "x", "date_utc": "d"}
  assert driver._measured_lines({"measured": {"fedavg": stamp,  # pylint: disable=protected-access
                                              "defense": stamp}}) == []


def test_measured_medium_run_by_kind_and_cpu(tmp_path, monkeypatch):
  """The committed run's hours, by kind of cell and cells per CPU."""
  run = {"cell_seconds": 12600.0, "cell_costs": [
      {"kind": "train", "seconds": 3600.0, "cpu": "X"},
      {"kind": "train", "seconds": 1800.0, "cpu": None},
      {"kind": "attack", "seconds": 7200.0, "cpu": "X"}]}
  storage.write_json(str(tmp_path / "run.json"), run)
  monkeypatch.setattr(driver.costs, "MEASURED_MEDIUM", str(tmp_path /
                                                           "run.json"))
  est = {"cells": 3, "seconds": 7200.0, "gpu_seconds": 36.0,
         "by_model": {"m": 7200.0}, "by_kind": {"train": 3600.0,
                                                "attack": 3600.0},
         "unknown": [], "extrapolated": []}
  monkeypatch.setattr(cost, "estimate", lambda *a, **k: est)
  monkeypatch.setattr(sweep, "plan", lambda config: [])
  (p,) = driver.costs.preset_costs({}, presets=("medium",))
  assert (p["cpu_h"], p["gpu_h"], p["measured_h"]) == (2.0, 0.01, 3.5)
  assert p["by_kind_h"] == {"train": 1.0, "attack": 1.0}
  assert p["measured_by_kind_h"] == {"train": 1.5, "attack": 2.0}
  assert p["measured_cpus"] == {"X": 2, "not recorded": 1}


def test_paper_rounds_scale_by_client_steps_and_add_one_compile(
    monkeypatch):
  """total = compile + rounds x round, the round scaled from the measured
  client-steps to the paper's 10 clients x 5 steps; the PyTorch peer
  (which compiles nothing) extrapolated the same way, without compile."""
  bench = timing.Bench(fn=None, flops=10.0)
  monkeypatch.setattr(fedavg_bench, "build_round", lambda *a, **k: bench)
  monkeypatch.setattr(fedavg_bench, "torch_round", lambda b: None)
  ours = {"seconds": 2.0, "compile_seconds": 7.0, "memory": {}}
  monkeypatch.setattr(timing, "measure", lambda *a, **k: ours)
  monkeypatch.setattr(timing, "compare",
                      lambda *a, **k: (ours, {"seconds": 3.0}))
  out = fedavg_bench.paper_rounds(200, 60.0, clients=2, local_steps=1)
  assert out["scale"] == 25.0  # (10 x 5) / (2 x 1)
  assert out["round_s"] == 50.0 and out["estimate_s"] == 7.0 + 200 * 50.0
  assert out["flops_per_round"] == 250.0 and out["torch_estimate_s"] is None
  out = fedavg_bench.paper_rounds(100, None, clients=10, local_steps=5,
                                  with_torch=True)
  assert out["scale"] == 1.0 and out["estimate_s"] == 7.0 + 100 * 2.0
  out = fedavg_bench.paper_rounds(100, None, clients=5, local_steps=5,
                                  with_torch=True)
  assert out["torch_round_s"] == 6.0 and out["torch_estimate_s"] == 600.0
