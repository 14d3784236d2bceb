"""Assembles the benchmark table (BENCHMARKS.md + benchmarks.json).

Each row times one builder of this package with :func:`timing.measure`, its
peer (PyTorch from the ``[torch]`` extra, or a JAX loop) in the same run,
and reports the ratio, the target of issue 12, GFLOP/s from the stated FLOP
count and the fraction of the device's peak. Without torch the PyTorch rows
say so and carry no ratio.

A run on a GPU (``--out_dir=docs/benchmarks/gpu``, the device script
``experiments/benchmarks/device_check.sh``) times the same rows with the
peers on the same GPU; the CPU page then renders it as its GPU section
(:func:`render_markdown`, ``--render_only``). The previous report, moved
to ``archive/<date>-<commit>/`` when a full run on another CPU replaces it
(:func:`publish`), stays linked from the page with its targeted rows beside
the new ones.
"""

from __future__ import annotations

import os
import time
from typing import Any, Callable

import jax
import jax.numpy as jnp

from experiments.benchmarks import attack
from experiments.benchmarks import costs
from experiments.benchmarks import defense
from experiments.benchmarks import fedavg
from experiments.benchmarks import gradients
from experiments.benchmarks import timing
from experiments.benchmarks import torch_peers
from repdef_jax import gradients as repdef_gradients
from repdef_jax import storage

PARTS = ("fedavg", "defense", "gradients", "attack", "unit_costs")
MNIST_ROUNDS_TARGET_S = 1200.0
PAPER_ROUNDS = 200

# Workload sizes. 'full' is issue 12's; 'quick' runs tiny shapes in about a
# minute (the tests, smoke checks; its numbers mean nothing).
SETTINGS = {
    "full": dict(shape=(32, 32, 3), plain_batches=(10, 50, 200),
                 plain_clients=10, defended_batches=(10, 50),
                 defended_clients=2, per_client=200, mask_batches=(1, 10, 50),
                 paper=dict(clients=2, local_steps=5,
                            input_shape=(28, 28, 1)),
                 per_example=(("convnet64", 8), ("lenet", 32)),
                 dlg_outer=3, dlg_inner=20, gs_iterations=50, repeats=3,
                 progress_outer=15, unit_costs=dict()),
    "quick": dict(shape=(8, 8, 3), plain_batches=(10,), plain_clients=2,
                  defended_batches=(10,), defended_clients=1, per_client=20,
                  mask_batches=(1, 4),
                  paper=dict(clients=1, local_steps=1,
                             input_shape=(8, 8, 1)),
                  per_example=(("lenet", 4),), dlg_outer=1, dlg_inner=2,
                  gs_iterations=3, repeats=1, progress_outer=1,
                  unit_costs=dict(models=("mlp",), datasets=("mnist",),
                                  batches=(10,), attack_models=())),
}
GPU_NOTE = "not measured (no GPU lent)"
GPU_DIR = "gpu"  # the GPU run's report, under the CPU report's folder
# Earlier full runs on other CPUs, one folder each (BENCHMARKS.md and
# benchmarks.json as that run wrote them), under the CPU report's folder.
ARCHIVE_DIR = "archive"

# Soteria mask: batch -> target ratio over the PyTorch loop (issue 12).
MASK_TARGETS = {1: 10.0, 50: 3.0}
# Progress callbacks: at most 5 % slower than none (issue 14).
PROGRESS_TARGET = 0.95
# The targets judged in the table (issue 12; DLG's from issue 4).
TARGETS = [
    "defended round (Soteria every local step), LeNet, batch 10 and 50: "
    ">= 3x the PyTorch loop",
    "plain FedAvg round, LeNet, batch 10 / 50 / 200: >= 1.5x the PyTorch "
    "loop",
    f"{PAPER_ROUNDS} rounds of the paper's MNIST setting with Soteria at "
    f"every step: <= {MNIST_ROUNDS_TARGET_S / 60:.0f} min",
    "Soteria mask: >= 10x the PyTorch loop at batch 1, >= 3x at batch 50",
    "per-example gradients (vmap): never slower than a jitted loop (>= 1x)",
    "DLG: >= 3x PyTorch (issue 4)",
    "DLG progress callbacks: no measurable slowdown (time without / with "
    f">= {PROGRESS_TARGET})",
]


def _row(part: str, benchmark: str, config: str, ours: dict[str, Any],
         peer_name: str, peer: dict[str, Any] | None, target: float | None,
         flops: float | None, peak: float | None, note: str = "",
         met: bool | None = None, reused: bool = False) -> dict[str, Any]:
  """One table row; ``reused``: ours was compiled by an earlier row (no
  compile time of its own)."""
  ours_s = ours.get("seconds") if ours else None
  peer_s = peer.get("seconds") if peer else None
  ratio = peer_s / ours_s if ours_s and peer_s else None
  if met is None and target is not None and ratio is not None:
    met = ratio >= target
  gf = lambda s: flops / s / 1e9 if flops and s else None
  frac = lambda g: g / peak if g and peak else None
  return {
      "part": part, "benchmark": benchmark, "config": config,
      "ours_s": ours_s, "peer": peer_name, "peer_s": peer_s, "ratio": ratio,
      "target": target, "met": met, "gflop": flops / 1e9 if flops else None,
      "ours_gflops": gf(ours_s), "ours_peak_fraction": frac(gf(ours_s)),
      "peer_gflops": gf(peer_s), "peer_peak_fraction": frac(gf(peer_s)),
      "compile_s": (ours.get("compile_seconds") if ours and not reused
                    else None),
      "xla_memory_mib": (ours or {}).get("memory", {}).get("total"),
      "load_1min": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
      "note": note}


def _pair(bench: timing.Bench, make: Callable[[], Any], repeats: int,
          has_torch: bool = True, warmup: bool = True
          ) -> tuple[dict[str, Any], dict[str, Any] | None, str]:
  """(ours, peer, note): both timed interleaved (:func:`timing.compare`)."""
  if not has_torch:
    return (timing.measure(bench, repeats), None,
            "torch not installed: no peer")
  ours, peer = timing.compare(bench, make(), repeats, warmup)
  return ours, peer, ""


def run(quick: bool = False, parts=PARTS, torch_threads: int = 2,
        verbose: bool = True) -> dict[str, Any]:
  """Runs the benchmarks; returns the report (rows, unit costs, machine)."""
  s = SETTINGS["quick" if quick else "full"]
  reps = s["repeats"]
  has_torch, torch_version = torch_peers.available()
  threads = torch_peers.set_threads(torch_threads) if has_torch else None
  on = torch_peers.device() if has_torch else None
  tname = (("torch cuda" if on == "cuda" else f"torch {threads} threads")
           if has_torch else "torch")
  # The second Soteria peer: the reference computation vectorized with
  # torch.func (torch_peers.soteria_mask_vectorized); its rows have no
  # target (the targets are against the reference loop).
  vname = (("torch.func vmap, cuda" if on == "cuda"
            else f"torch.func vmap, {threads} threads")
           if has_torch else "torch.func vmap")
  vnote = lambda b: ("peer's mask: torch.func.vmap of the vjp, "
                     f"{torch_peers.vmap_chunk(b)} features a chunk")
  load_before = list(os.getloadavg())
  peak_info = timing.peak()
  if jax.default_backend() == "cpu" and not quick:
    n = 4096
    a = jnp.ones((n, n), jnp.float32)
    dot = jax.jit(jnp.dot)
    measured = {"XLA": timing.sgemm_gflops(
        lambda: dot(a, a).block_until_ready(), n)}
    if has_torch:
      measured[tname] = timing.sgemm_gflops(torch_peers.sgemm(n), n)
    peak_info = timing.raise_to_measured(peak_info, measured)
  peak = peak_info["gflops"]
  rows: list[dict[str, Any]] = []

  def add(row):
    rows.append(row)
    if verbose:
      print(f"[benchmark] {row['benchmark']} [{row['config']}]: ours "
            f"{_fmt(row['ours_s'])} s, {row['peer']} {_fmt(row['peer_s'])} "
            f"s, ratio {_fmt(row['ratio'])} (target {_fmt(row['target'])}),"
            f" {_fmt(row['ours_gflops'])} GFLOP/s {row['note']}", flush=True)

  shape = s["shape"]
  sname = "CIFAR" if tuple(shape) == (32, 32, 3) else "x".join(map(str, shape))
  paper = []
  if "fedavg" in parts:
    for b in s["plain_batches"]:
      bench = fedavg.build_round(input_shape=shape, batch_size=b,
                                 clients=s["plain_clients"],
                                 per_client=s["per_client"])
      ours, peer, note = _pair(bench, lambda: fedavg.torch_round(bench),
                               reps, has_torch)
      add(_row("fedavg", "plain FedAvg round", f"LeNet {sname}, {bench.note}",
               ours, tname, peer, 1.5, bench.flops, peak, note))
    for b in s["defended_batches"]:
      bench = fedavg.build_round(input_shape=shape, batch_size=b,
                                 clients=s["defended_clients"],
                                 per_client=s["per_client"],
                                 defense_percent=60.0)
      ours, peer, note = _pair(bench, lambda: fedavg.torch_round(bench),
                               reps, has_torch, warmup=False)
      add(_row("fedavg", "defended round (Soteria 60 % every step)",
               f"LeNet {sname}, {bench.note}", ours, tname, peer, 3.0,
               bench.flops, peak, note))
      # The same round against the vectorized mask (ours timed again,
      # interleaved with it; without torch the row reuses ours).
      if has_torch:
        ours, peer, note = _pair(
            bench, lambda: fedavg.torch_round(bench, "vectorized"), reps,
            warmup=False)
      add(_row("fedavg", "defended round (Soteria 60 % every step) vs "
               "vectorized PyTorch",
               f"LeNet {sname}, {bench.note}", ours, vname, peer, None,
               bench.flops, peak, note or vnote(bench.meta["batch"]),
               reused=True))
    # On CPU clients run one after another, so a round of 2 clients scales
    # linearly; a GPU runs them all at once: time every client there.
    paper_kw = (s["paper"] if jax.default_backend() == "cpu" else
                {**s["paper"], "clients": fedavg.PAPER_MNIST["clients"]})
    for label, percent in (("plain", None), ("Soteria 60 % every step", 60.0)):
      res = fedavg.paper_rounds(PAPER_ROUNDS, percent, with_torch=has_torch,
                                repeats=reps, **paper_kw)
      paper.append({"setting": label, "defended": percent is not None,
                    "gpu": GPU_NOTE if jax.default_backend() == "cpu"
                           else "the measured column is this GPU", **res})
      if percent is not None:
        add(_row("fedavg", f"{PAPER_ROUNDS} rounds, paper MNIST setting "
                 "(estimate)", "LeNet "
                 f"{'x'.join(map(str, s['paper']['input_shape']))}, 10 of "
                 "100 clients, 5 steps of batch 10, Soteria every step",
                 {"seconds": res["estimate_s"],
                  "compile_seconds": res["compile_s"],
                  "memory": res["memory"]}, tname if has_torch else "-",
                 {"seconds": res["torch_estimate_s"]}
                 if res["torch_estimate_s"] else None, None,
                 res["flops_per_round"] * PAPER_ROUNDS, peak,
                 f"{res['note']}; target <= {MNIST_ROUNDS_TARGET_S:.0f} s",
                 met=res["estimate_s"] <= MNIST_ROUNDS_TARGET_S))

  if "defense" in parts:

    def mask_pair(bench, b, mask_impl):
      """_pair against one PyTorch mask, noting whether the masks agree."""
      check = None

      def make():
        nonlocal check
        fn, check = defense.torch_mask(bench, mask_impl)
        return fn

      ours, peer, note = _pair(bench, make, reps if b == 1 else 2, has_torch,
                               warmup=b == 1)
      if check is not None:  # After the timing: it runs ours.
        note = f"masks identical: {'yes' if check() else 'NO'}"
      return ours, peer, note

    for b in s["mask_batches"]:
      bench = defense.build_mask(input_shape=shape, batch=b)
      ours, peer, note = mask_pair(bench, b, "loop")
      add(_row("defense", "Soteria mask (reference score)",
               f"LeNet {sname}, {bench.note}", ours, tname, peer,
               MASK_TARGETS.get(b), bench.flops, peak, note))
      # The same workload against the vectorized peer (no target; without
      # torch the row reuses ours).
      if has_torch:
        ours, peer, note = mask_pair(bench, b, "vectorized")
        note = f"{note}; {vnote(b)}"
      add(_row("defense", "Soteria mask (reference score) vs vectorized "
               "PyTorch",
               f"LeNet {sname}, {bench.note}", ours, vname, peer, None,
               bench.flops, peak, note, reused=True))

  if "gradients" in parts:
    for name, b in s["per_example"]:
      bench = gradients.build_per_example(name, b, input_shape=shape)
      ours, loop = timing.compare(bench, gradients.jax_loop(bench), reps)
      one_at_a_time = repdef_gradients.per_example_chunk(
          bench.meta["model"], bench.args[0]) == 1
      add(_row("gradients", "per-example gradients vs JAX loop",
               f"{name} {sname}, {bench.note}", ours, "jitted loop", loop,
               1.0, bench.flops, peak,
               "ours: a compiled loop of one-example gradients on this "
               "backend (vmapped wide convolutions are slower), the loop's "
               "own work" if one_at_a_time else ""))
      ours, peer, note = _pair(bench, lambda: gradients.torch_loop(bench),
                               reps, has_torch)
      add(_row("gradients", "per-example gradients vs PyTorch loop",
               f"{name} {sname}, {bench.note}", ours, tname, peer, None,
               bench.flops, peak, note, reused=True))

  if "attack" in parts:
    bench = attack.build_dlg(outer_steps=s["dlg_outer"],
                             inner_steps=s["dlg_inner"], input_shape=shape)
    ours, peer, note = _pair(bench, lambda: attack.torch_dlg(bench), 2,
                             has_torch)
    add(_row("attack", "DLG (L-BFGS, no early stop)",
             f"LeNet {sname}, 1 image, {bench.note}", ours, tname, peer, 3.0,
             bench.flops, peak, note or "host-validated attack: no XLA "
             "memory"))
    # A realistic run length: the callbacks' fixed cost (registering the
    # run, 5 host calls) is spread as in a real attack.
    plain_bench = attack.build_dlg(outer_steps=s["progress_outer"],
                                   inner_steps=s["dlg_inner"],
                                   input_shape=shape)
    with_progress = attack.build_dlg(
        outer_steps=s["progress_outer"], inner_steps=s["dlg_inner"],
        progress_every=max(1, s["progress_outer"] * s["dlg_inner"] // 4),
        input_shape=shape)
    ours, plain = timing.compare(with_progress, plain_bench.fn, reps)
    add(_row("attack", "DLG progress callbacks (4 per run) vs none",
             f"LeNet {sname}, 1 image, {plain_bench.note}", ours,
             "progress_every=0", plain, PROGRESS_TARGET, plain_bench.flops,
             peak, "ratio = time without / with callbacks"))
    bench = attack.build_gs(iterations=s["gs_iterations"], input_shape=shape)
    ours, peer, note = _pair(bench, lambda: attack.torch_gs(bench), 2,
                             has_torch)
    add(_row("attack", "GS (Adam on the cosine loss)",
             f"LeNet {sname}, 1 image, {bench.note}", ours, tname, peer, None,
             bench.flops, peak, note))

  unit = None
  if "unit_costs" in parts:
    unit = costs.unit_costs(repeats=1, verbose=verbose, **s["unit_costs"])

  machine = timing.machine_info()
  machine["load_average_before"] = load_before
  machine["peak"] = peak_info
  return {"machine": machine,
          "settings": {"quick": quick, "parts": list(parts), **{
              k: v for k, v in s.items() if k != "unit_costs"}},
          "targets": TARGETS,
          "torch": {"version": torch_version if has_torch else None,
                    "threads": threads, "device": on, "note": None
                    if has_torch else torch_version},
          "flop_count": ("XLA cost analysis (2 FLOPs per multiply-add, "
                         "padding taps excluded) of the reference algorithm "
                         "in the direct 'xla' convolution formulation; the "
                         "same count for ours and the peer"),
          "rows": rows, "paper_scale": paper, "unit_costs": unit}


def _fmt(v: Any) -> str:
  if v is None:
    return "-"
  if isinstance(v, bool):
    return "yes" if v else "no"
  if isinstance(v, float):
    if v == 0:
      return "0"
    if abs(v) >= 100:
      return f"{v:.0f}"
    if abs(v) >= 1:
      return f"{v:.2f}"
    return f"{v:.3g}"
  return str(v).replace("|", "/")


def _parts_flag(report: dict[str, Any]) -> str:
  parts = report.get("settings", {}).get("parts")
  if not parts or tuple(parts) == PARTS:
    return ""
  return f" --parts={','.join(parts)}"


def _threads_flag(report: dict[str, Any]) -> str:
  threads = report.get("torch", {}).get("threads")
  return "" if threads in (None, 2) else f" --torch_threads={threads}"


def _loads(v: Any) -> str:
  return "?" if not v else ", ".join(f"{x:.2f}" for x in v)


def _pct(v: float | None) -> str:
  return "-" if v is None else f"{100 * v:.1f} %"


def _measured_lines(report: dict[str, Any]) -> list[str]:
  """Which run measured each part, when parts come from different runs.

  Parts measured on different CPUs name theirs: each row's ratio and
  fraction of peak are of its own run, and rows of different CPUs do not
  compare with each other.
  """
  measured = report.get("measured") or {}
  if len({(m.get("git_commit"), m.get("date_utc"))
          for m in measured.values()}) <= 1:
    return []
  cpus = len({m.get("cpu") for m in measured.values()}) > 1
  on = lambda m: (f" on {m.get('cpu') or 'an unrecorded CPU'} (peak "
                  f"{_fmt(m.get('peak_gflops'))} GFLOP/s)" if cpus else "")
  return ["Parts measured by separate runs: " + "; ".join(
      f"{p} at commit {m.get('git_commit') or '?'} on {m.get('date_utc')}"
      f"{on(m)} (load before {_loads(m.get('load_average_before'))})"
      for p, m in measured.items()) + "." + (
          " The parts ran on different CPUs: each row's ratio and fraction "
          "of peak are of its own run, and the machine line below is the "
          "latest run's." if cpus else ""), ""]


def _gpu_lines(report: dict[str, Any], gpu: dict[str, Any]) -> list[str]:
  """The GPU section: a GPU run's rows beside this (CPU) report's."""
  g, t = gpu.get("machine", {}), gpu.get("torch", {})
  cpu_rows = {(r["benchmark"], r["config"]): r for r in report.get("rows", [])}
  lines = [
      "## On one GPU", "",
      f"Measured on {g.get('device_kind', '?')} at commit "
      f"{g.get('git_commit') or '?'} on {g.get('date_utc', '?')} "
      f"(`experiments/benchmarks/device_check.sh`: `python -m "
      f"experiments.benchmark --out_dir=docs/benchmarks/{GPU_DIR}`"
      f"{_parts_flag(gpu)}; its own page: [{GPU_DIR}/BENCHMARKS.md]"
      f"({GPU_DIR}/BENCHMARKS.md)); JAX {g.get('jax', '?')}, torch "
      f"{t.get('version') or 'not installed'} on {t.get('device') or '-'}. "
      f"Peak: {g.get('peak', {}).get('how', '?')}. The peers run on the same "
      "GPU; ratio = peer time / our time. 'GPU over CPU': our time in the "
      "table above (this CPU) / our time on the GPU, same workload.", "",
      "| benchmark | configuration | ours GPU (s) | peer | peer (s) | ratio | "
      "ours GFLOP/s (of fp32 peak) | compile (s) | ours CPU (s) | GPU over "
      "CPU | note |",
      "|---|---|---|---|---|---|---|---|---|---|---|"]
  for r in gpu.get("rows", []):
    c = cpu_rows.get((r["benchmark"], r["config"]), {})
    over = (c["ours_s"] / r["ours_s"] if c.get("ours_s") and r.get("ours_s")
            else None)
    lines.append(
        f"| {_fmt(r['benchmark'])} | {_fmt(r['config'])} | "
        f"{_fmt(r['ours_s'])} | {_fmt(r['peer'])} | {_fmt(r['peer_s'])} | "
        f"{_fmt(r['ratio']) + 'x' if r.get('ratio') is not None else '-'} | "
        f"{_fmt(r.get('ours_gflops'))} ({_pct(r.get('ours_peak_fraction'))})"
        f" | {_fmt(r.get('compile_s'))} | {_fmt(c.get('ours_s'))} | "
        f"{_fmt(over) + 'x' if over is not None else '-'} | "
        f"{_fmt(r.get('note'))} |")
  return lines + [""]


def _judged(r: dict[str, Any]) -> str:
  """A targeted row's measured value: its ratio, or its time."""
  if r.get("target") is None:
    return f"{_fmt(r.get('ours_s'))} s"
  return f"{_fmt(r['ratio'])}x" if r.get("ratio") is not None else "-"


def _archive_lines(judged: list[dict[str, Any]],
                   archived: list[tuple[str, dict[str, Any]]]) -> list[str]:
  """Earlier full runs on other machines: their targeted rows beside this
  run's ``judged`` ones."""
  runs = [(path, {(r["benchmark"], r["config"]): r
                  for r in old.get("rows", [])}, old.get("machine", {}))
          for path, old in archived]
  lines = [
      "## Earlier runs on other machines", "",
      "Full runs kept from other machines, each with its own page (frozen: "
      "measured at its commit, not re-rendered). A ratio is ours against "
      "PyTorch on the same machine in the same run, and it depends on the "
      "machine, so each run judges the targets on its own CPU.", "",
      "| run | CPU | commit | date | targets met |", "|---|---|---|---|---|"]
  for path, rows, m in runs:
    met = [r["met"] for r in rows.values() if r.get("met") is not None]
    lines.append(f"| [{path}]({path}/BENCHMARKS.md) | {cpu_label(m)} | "
                 f"{m.get('git_commit') or '?'} | {m.get('date_utc', '?')} | "
                 f"{sum(met)} of {len(met)} |")
  lines += ["", "| benchmark | configuration | this run | " +
            " | ".join(path for path, _, _ in runs) + " |",
            "|---|---|---|" + "---|" * len(archived)]
  mark = lambda r: f"{_judged(r)} ({'met' if r['met'] else 'not met'})"
  for r in judged:
    key = (r["benchmark"], r["config"])
    lines.append(f"| {_fmt(r['benchmark'])} | {_fmt(r['config'])} | "
                 f"{mark(r)} | " + " | ".join(
                     mark(rows[key]) if rows.get(key, {}).get("met")
                     is not None else "-" for _, rows, _ in runs) + " |")
  return lines + [""]


def render_markdown(report: dict[str, Any],
                    gpu: dict[str, Any] | None = None,
                    archived: list[tuple[str, dict[str, Any]]] | None = None
                    ) -> str:
  """BENCHMARKS.md from a report (pure function, no JAX, no I/O).

  Args:
    report: the run's report (:func:`run`, merged).
    gpu: a GPU run's report: rendered as its own section, and its paper
      scale and preset costs fill the 'one GPU' columns.
    archived: earlier full runs on other machines, ``(folder relative to
      the page, report)``: their targeted rows beside this run's.
  """
  m = report.get("machine", {})
  peak = m.get("peak", {})
  t = report.get("torch", {})
  quick = report.get("settings", {}).get("quick")
  modified = (" (with modified tracked files)"
              if m.get("tracked_files_modified") else "")
  threads = (f", {t['threads']} threads (torch.set_num_threads)"
             if t.get("threads") else "")
  lines = [
      "# Benchmarks",
      "",
      f"Generated by `python -m experiments.benchmark{' --quick' * bool(quick)}"
      f"{_parts_flag(report)}{_threads_flag(report)}`"
      f" on {m.get('date_utc', '?')} at commit "
      f"{m.get('git_commit') or '?'}"
      f"{modified}"
      "; do not edit by hand.",
      "",
      *_measured_lines(report),
      f"Machine: {cpu_label(m)}, "
      f"{m.get('cores', '?')} cores, backend {m.get('backend', '?')}; JAX "
      f"{m.get('jax', '?')}; torch {t.get('version') or 'not installed'}"
      f"{threads}. Load average (1, 5, 15 min) before "
      f"{_loads(m.get('load_average_before'))}"
      f", after {_loads(m.get('load_average'))} (column 'load': 1-min load "
      f"when the row finished; above {m.get('cores', 'the core count')} "
      "other jobs shared the cores): ratios (measured back to back) mean "
      "more than absolute times.",
      "",
      f"Peak: {_fmt(peak.get('gflops'))} GFLOP/s fp32 = {peak.get('how', '?')}."
      f" FLOP counts: {report.get('flop_count', '?')}.",
      "",
      "Times are the best (minimum) of the repeats, after compilation "
      "(compile time separate), for ours and the peers alike: the cores are "
      "shared, and PyTorch's two OpenMP threads slow down several-fold when "
      "another job takes a core, so the least disturbed run is compared. "
      "Ratio = peer time / our time (higher is better).",
      "",
      "| benchmark | configuration | ours (s) | peer | peer (s) | ratio | "
      "target | met | GFLOP | ours GFLOP/s (of peak) | peer GFLOP/s (of "
      "peak) | compile (s) | XLA MiB | load | note |",
      "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
  ]
  for r in report.get("rows", []):
    target = r.get("target")
    lines.append(
        f"| {_fmt(r['benchmark'])} | {_fmt(r['config'])} | "
        f"{_fmt(r['ours_s'])} | {_fmt(r['peer'])} | {_fmt(r['peer_s'])} | "
        f"{_fmt(r['ratio']) + 'x' if r.get('ratio') is not None else '-'} | "
        f"{'>= ' + _fmt(target) + 'x' if target is not None else '-'} | "
        f"{_fmt(r.get('met'))} | {_fmt(r.get('gflop'))} | "
        f"{_fmt(r.get('ours_gflops'))} ({_pct(r.get('ours_peak_fraction'))})"
        f" | {_fmt(r.get('peer_gflops'))} "
        f"({_pct(r.get('peer_peak_fraction'))}) | "
        f"{_fmt(r.get('compile_s'))} | {_fmt(r.get('xla_memory_mib'))} | "
        f"{_fmt(r.get('load_1min'))} | {_fmt(r.get('note'))} |")
  judged = [r for r in report.get("rows", []) if r.get("met") is not None]
  lines += ["", f"Targets met: {sum(1 for r in judged if r['met'])} of "
            f"{len(judged)}.", ""]
  lines += ["## Targets", "", *[f"* {t}" for t in report.get("targets", [])],
            ""]
  if not judged:
    lines += ["No target could be judged in this run (no PyTorch peer or no "
              "targeted row).", ""]
  else:
    lines += ["| benchmark | configuration | measured | target | met |",
              "|---|---|---|---|---|"]
    for r in judged:
      want = (f">= {_fmt(r['target'])}x" if r.get("target") is not None
              else f"<= {_fmt(MNIST_ROUNDS_TARGET_S)} s")
      lines.append(f"| {_fmt(r['benchmark'])} | {_fmt(r['config'])} | "
                   f"{_judged(r)} | {want} | "
                   f"{'met' if r['met'] else 'NOT met'} |")
    lines.append("")
  if archived:
    lines += _archive_lines(judged, archived)
  if gpu:
    lines += _gpu_lines(report, gpu)
  gpu_paper = {p["setting"]: p for p in (gpu or {}).get("paper_scale", [])}
  paper = report.get("paper_scale")
  if paper:
    lines += [f"## Paper-scale cost ({PAPER_ROUNDS} rounds)", "",
              "The paper's MNIST setting: 100 devices x 2 classes x 100 "
              "samples, 10 devices per round, 5 local steps of batch 10, "
              "LeNet. Estimated from one measured round (after compilation;"
              " total = compile + rounds x round; no test evaluation). "
              "PyTorch: the peer round of the table above on the same "
              "setting, extrapolated the same way.", "",
              "| setting | ours: s/round | ours: total (min) | PyTorch: "
              "s/round | PyTorch: total (min) | one GPU | how |",
              "|---|---|---|---|---|---|---|"]
    mins = lambda v: _fmt(v / 60.0) if v else "-"
    for p in paper:
      on_gpu = gpu_paper.get(p["setting"])
      one_gpu = (f"{mins(on_gpu['estimate_s'])} min ({_fmt(on_gpu['round_s'])}"
                 " s/round, measured)" if on_gpu else _fmt(p.get("gpu")))
      lines.append(
          f"| {_fmt(p['setting'])} | {_fmt(p['round_s'])} | "
          f"{mins(p['estimate_s'])} | {_fmt(p.get('torch_round_s'))} | "
          f"{mins(p.get('torch_estimate_s'))} | {one_gpu} | "
          f"{_fmt(p.get('note'))} |")
    lines.append("")
  unit = report.get("unit_costs")
  if unit:
    lines += ["## Unit costs (seconds)", "",
              "One local FedAvg step of one client (plain / Soteria 60 % at "
              "the step; * = Soteria's scores timed as programs of one and "
              "two feature chunks and extrapolated to all chunks), and one "
              "attack unit on one CIFAR-10 image. "
              "`experiments.benchmarks.costs.unit_costs()` returns them.", "",
              "| model | dataset | batch | plain step | Soteria step |",
              "|---|---|---|---|---|"]
    for name, per_ds in unit.get("fedavg_step", {}).items():
      for ds, per_b in per_ds.items():
        for b, v in per_b.items():
          lines.append(f"| {name} | {ds} | {b} | {_fmt(v['plain_s'])} | "
                       f"{_fmt(v['soteria_s'])}"
                       f"{'*' if v.get('soteria_scaled') else ''} |")
    lines += ["", "| model | DLG outer step (20 L-BFGS iterations) | GS "
              "iteration |", "|---|---|---|"]
    for name, v in unit.get("dlg_outer_step_s", {}).items():
      lines.append(f"| {name} | {_fmt(v)} | "
                   f"{_fmt(unit.get('gs_iteration_s', {}).get(name))} |")
    lines.append("")
  presets = report.get("preset_costs")
  gpu_presets = {p["preset"]: p for p in (gpu or {}).get("preset_costs") or []}
  if presets:
    lines += ["## Trade-off presets: estimated cost", "",
              "Every planned cell priced from the unit costs above "
              "(`repdef_jax.paper.cost.estimate`): training cells from "
              "their steps alone (no evaluation, compilation or host work: "
              "too low), attack cells from their full budget, one CIFAR-10 "
              "image at a time (no early stop, no batching of images, "
              "larger than MNIST: too high). 'measured': the committed "
              "medium run's total cell time (docs/results/tradeoff, under "
              "load; its CPU in the line below the table), the check of the "
              "estimate; that line compares them by kind of cell. "
              "One GPU: FLOPs of each step and attack iteration at "
              f"{presets[0].get('gpu_model', '?')} "
              "(`repdef_jax.paper.cost.gpu_seconds`; a model, not a "
              "measurement). 'one GPU, unit costs': the same plan priced "
              "from the unit costs measured on the GPU section's GPU, one "
              "client step at a time (an upper bound there: a GPU round runs "
              "its clients at once; '-': no GPU run).", "",
              "| preset | cells | this CPU (h) | measured (h) | one GPU, "
              "modelled (h) | one GPU, unit costs (h) | CPU h by model |",
              "|---|---|---|---|---|---|---|"]
    for p in presets:
      by = "; ".join(f"{k} {_fmt(v)}" for k, v in
                     sorted(p["by_model_h"].items()))
      on_gpu = gpu_presets.get(p["preset"], {}).get("cpu_h")
      lines.append(f"| {p['preset']} | {p['cells']} | {_fmt(p['cpu_h'])} | "
                   f"{_fmt(p.get('measured_h'))} | {_fmt(p['gpu_h'])} | "
                   f"{_fmt(on_gpu)} | {by} |")
    for p in presets:
      measured = p.get("measured_by_kind_h") or {}
      kinds = [k for k in sorted(measured) if k in p.get("by_kind_h", {})]
      if kinds:
        cpus = "; ".join(
            f"{n} with no CPU recorded" if cpu == "not recorded" else
            f"{n} on {cpu}"
            for cpu, n in sorted((p.get("measured_cpus") or {}).items()))
        lines += ["", f"{p['preset']}, estimated / measured hours by kind "
                  "of cell: " + "; ".join(
                      f"{k} {_fmt(p['by_kind_h'][k])} / {_fmt(measured[k])} "
                      f"({_fmt(p['by_kind_h'][k] / measured[k])}x)"
                      for k in kinds) +
                  f". The run's cells: {cpus or '?'}; the unit costs: "
                  f"{cpu_label(report.get('machine', {}))} (times on "
                  "different CPUs compare only roughly)."]
  return "\n".join(lines) + "\n"


def _price_presets(report: dict[str, Any] | None) -> None:
  """Sets ``report['preset_costs']`` from its unit costs and the current
  plans (a full run's report only); it is derived, never carried over."""
  if (report and report.get("unit_costs") and
      not report.get("settings", {}).get("quick")):
    report["preset_costs"] = costs.preset_costs(report["unit_costs"])


def write(report: dict[str, Any], out_dir: str) -> None:
  """Writes benchmarks.json and BENCHMARKS.md atomically; a CPU report's
  page includes the GPU report of ``out_dir/gpu`` when there is one, and the
  earlier runs kept in ``out_dir/archive/*``. The preset costs of this report
  and the GPU's are re-priced from their unit costs."""
  os.makedirs(out_dir, exist_ok=True)
  _price_presets(report)
  storage.write_json(os.path.join(out_dir, "benchmarks.json"), report)
  gpu, archived = None, []
  if report.get("machine", {}).get("backend") == "cpu":
    gpu = storage.read_json(os.path.join(out_dir, GPU_DIR, "benchmarks.json"))
    _price_presets(gpu)
    root = os.path.join(out_dir, ARCHIVE_DIR)
    for name in sorted(os.listdir(root)) if os.path.isdir(root) else ():
      old = storage.read_json(os.path.join(root, name, "benchmarks.json"))
      if old is not None:
        archived.append((f"{ARCHIVE_DIR}/{name}", old))
  storage.write_text(os.path.join(out_dir, "BENCHMARKS.md"),
                     render_markdown(report, gpu, archived))


def render(out_dir: str) -> None:
  """Rewrites ``out_dir``'s BENCHMARKS.md from its JSON (and its GPU run's)
  without measuring anything; :func:`write` re-prices the presets from the
  stored unit costs, so the table follows the current plans and committed
  run."""
  report = storage.read_json(os.path.join(out_dir, "benchmarks.json"))
  if report is None:
    raise ValueError(f"--out_dir: no benchmarks.json in {out_dir!r}; run "
                     "the benchmarks first.")
  write(report, out_dir)
  print(f"rendered {out_dir}/BENCHMARKS.md")


def _stamp(report: dict[str, Any]) -> dict[str, Any]:
  """The run that measured a part: commit, date, loads, CPU and its peak."""
  m = report.get("machine", {})
  return {**{k: m.get(k) for k in
             ("git_commit", "date_utc", "load_average_before", "load_average",
              "tracked_files_modified")},
          "cpu": cpu_label(m), "peak_gflops": m.get("peak", {}).get("gflops")}


def merge(old: dict[str, Any] | None, new: dict[str, Any]) -> dict[str, Any]:
  """``new`` with the parts it did not run taken from ``old``.

  Each part keeps the machine line (commit, date, loads, CPU and peak) of
  the run that measured it, in ``measured``; runs of different sizes
  (quick / full) are never merged.
  """
  parts = new["settings"]["parts"]
  new["measured"] = {p: _stamp(new) for p in parts}
  if (not old or old.get("settings", {}).get("quick") !=
      new["settings"]["quick"]):
    return new
  kept = [p for p in old.get("settings", {}).get("parts", PARTS)
          if p not in parts]
  if not kept:
    return new
  # A part measured by the run of old's machine line takes that line whole
  # (stamps written before the CPU was recorded gain it).
  run_of = lambda m: (m.get("git_commit"), m.get("date_utc"))
  stamps = {p: old.get("measured", {}).get(p) for p in kept}
  new["measured"] = {**{
      p: _stamp(old) if not m or run_of(m) == run_of(old.get("machine", {}))
      else m for p, m in stamps.items()}, **new["measured"]}
  rows = [r for r in old.get("rows", []) if r["part"] in kept] + new["rows"]
  new["rows"] = sorted(rows, key=lambda r: PARTS.index(r["part"]))
  if "fedavg" in kept:
    new["paper_scale"] = old.get("paper_scale", [])
  if "unit_costs" in kept:
    new["unit_costs"] = old.get("unit_costs")
  new["settings"]["parts"] = [p for p in PARTS if p in kept or p in parts]
  return new


def cpu_label(machine: dict[str, Any]) -> str:
  """A report's CPU: model name, family and model (a hypervisor gives the
  same name to different chips: 'AMD EPYC' has been a Zen 1 of family 23
  and a Zen 4 of family 25 here)."""
  peak = machine.get("peak", {})
  fm = peak.get("lscpu_family_model", "")
  family, _, model = fm.partition("/")
  family = family if family not in ("", "None") else machine.get(
      "cpu_family")
  where = ", ".join(
      f"{k} {v}" for k, v in (("family", family), ("model", model))
      if v not in (None, "", "None"))
  return f"{machine.get('cpu', '?')}" + (f" ({where})" if where else "")


def archive_previous(old: dict[str, Any] | None, new: dict[str, Any],
                     out_dir: str) -> str | None:
  """Keeps ``old``'s page and JSON under ``out_dir/archive/<date>-<commit>``
  when ``new`` is a full run of every part on another CPU (another
  :func:`cpu_label`: the run that replaces it); returns the folder, or None
  when nothing was kept."""
  m, n = (old or {}).get("machine", {}), new.get("machine", {})
  if (not old or old.get("settings", {}).get("quick") or
      new["settings"].get("quick") or cpu_label(m) == cpu_label(n) or
      set(new["settings"]["parts"]) != set(PARTS)):
    return None
  date = (m.get("date_utc") or "undated")[:10]
  folder = os.path.join(out_dir, ARCHIVE_DIR,
                        f"{date}-{m.get('git_commit') or 'unknown'}")
  for name in ("BENCHMARKS.md", "benchmarks.json"):  # Verbatim copies.
    path = os.path.join(out_dir, name)
    if os.path.exists(path):
      with open(path, "rb") as f:
        storage.write_bytes(os.path.join(folder, name), f.read())
  return folder


def publish(report: dict[str, Any], out_dir: str) -> dict[str, Any]:
  """Writes a run's report into ``out_dir``: a run of some of the parts
  replaces those parts of the report there and keeps the others
  (:func:`merge`); a full run on another CPU moves the previous report to
  the archive first (:func:`archive_previous`)."""
  old = storage.read_json(os.path.join(out_dir, "benchmarks.json"))
  kept = archive_previous(old, report, out_dir)
  if kept:
    print(f"kept the previous machine's run in {kept}")
  report = merge(old, report)
  write(report, out_dir)
  print(f"wrote {out_dir}/BENCHMARKS.md and benchmarks.json")
  return report


def run_and_write(quick: bool, out_dir: str, parts=PARTS,
                  torch_threads: int = 2) -> dict[str, Any]:
  """:func:`run` then :func:`publish`."""
  t0 = time.perf_counter()
  report = run(quick, parts, torch_threads)
  report["machine"]["benchmark_wall_s"] = time.perf_counter() - t0
  return publish(report, out_dir)
