r"""Every benchmark of the project in one command: BENCHMARKS.md + JSON.

Command (the README's performance table comes from its output)::

  python -m experiments.benchmark [--quick] [--out_dir=docs/benchmarks]
      [--runs=N] [--parts=gradients,defense,attack,fedavg]

It calls the ``run(...)`` function of each benchmark script, each part in its
own child process (so that every part's memory high-water mark is its own and
the scripts' absl flags never meet in one process):

* ``gradients`` (:mod:`experiments.benchmark_gradients`): per-example
  gradients, one jitted ``vmap(grad)`` vs a Python loop of jitted
  single-example gradients (no target in the issues; reported);
* ``defense`` (:mod:`experiments.benchmark_defense`): Soteria's
  ``feature_scores`` vs the reference's one-vjp-per-feature loop; target
  >= 2x at batch 8 on LeNet and ConvNet64 on CPU (>= 20x on a GPU), issue 3;
* ``attack`` (:mod:`experiments.benchmark_attack`): wall time of a full DLG
  attack and GS iterations/s; with ``torch`` importable, the same DLG in
  PyTorch and the ratio; target >= 3x faster than PyTorch, issue 4;
* ``fedavg`` (:mod:`experiments.benchmark_fedavg`): rounds/s of the
  vectorized round vs the FedJAX-style loop over clients; target >= 2x on CPU
  (>= 5x on a GPU), issue 5.

What is reported:

* times are medians: each script already takes the median over its own
  repeats, and with ``--runs=N`` the whole part runs N times and every
  number (ratios included, each measured within one run) is the median over
  runs;
* compile times (first call minus a steady call) separately from run times;
* memory, two ways: ``xla_*_mib`` from
  ``jax.jit(f).lower(...).compile().memory_analysis()`` of the benchmarked
  computation (temporary, argument and output buffers of the compiled XLA
  program: what the computation itself needs on the device) and
  ``peak_rss_mib``, the child process's resident-set high-water mark from
  ``resource.getrusage(RUSAGE_SELF).ru_maxrss`` (whole process: Python, JAX,
  every compiled program and buffer of that part), next to
  ``rss_after_import_mib`` measured before any benchmark ran;
* each ratio with its target and whether it is met;
* the machine: CPU model (``/proc/cpuinfo``), cores, JAX/jaxlib versions,
  backend, devices, torch version, git commit, date (UTC).

The persistent compilation cache is *not* enabled here, so compile times are
real cold compiles. ``--quick`` uses fewer configurations and repeats and
finishes in a few minutes on a 2-core CPU; its numbers are indicative only.
Outputs are written atomically (:mod:`repdef_jax.storage`).
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any, Sequence

from absl import app
from absl import flags

from repdef_jax import storage

PARTS = ("gradients", "defense", "attack", "fedavg")

# Targets set by the issue that introduced the benchmarked code:
# (cpu target, accelerator target, issue).
TARGETS = {
    "defense": (2.0, 20.0, 3),
    "attack": (3.0, 3.0, 4),
    "fedavg": (2.0, 5.0, 5),
}

SETTINGS = {
    "quick": {
        "gradients": dict(model_names=("lenet",), batch_sizes=(8,),
                          repeats=3),
        "defense": dict(model_names=("lenet",), batches=(8,), repeats=2,
                        max_features=96, verbose=False),
        "attack": dict(outer_steps=10, inner_steps=20, gs_iterations=50,
                       torch_outer_steps=1),
        "fedavg": dict(batch_sizes=(50,), rounds=2, include_vmap_xla=False,
                       mnist_rounds=0, verbose=False),
    },
    "full": {
        "gradients": dict(model_names=("lenet", "convnet64"),
                          batch_sizes=(8,), repeats=3),
        "defense": dict(model_names=("lenet", "convnet64"), batches=(1, 8),
                        repeats=3, max_features=768, verbose=False),
        "attack": dict(outer_steps=300, inner_steps=20, gs_iterations=200,
                       torch_outer_steps=10),
        "fedavg": dict(batch_sizes=(10, 50, 200), rounds=3,
                       include_vmap_xla=True, mnist_rounds=20,
                       verbose=False),
    },
}

_MIB = 1024.0 * 1024.0


# --------------------------------------------------------------------------
# Machine and memory.


def _rss_mib() -> float:
  """This process's resident-set high-water mark (Linux: ru_maxrss in KiB)."""
  return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def xla_memory(compiled: Any) -> dict[str, float]:
  """MiB of the buffers of a compiled XLA program (``memory_analysis``).

  Args:
    compiled: ``jax.jit(f).lower(*args).compile()``.

  Returns:
    ``{'xla_temp_mib', 'xla_argument_mib', 'xla_output_mib',
    'xla_alias_mib', 'xla_code_mib', 'xla_total_mib'}`` (total = temp +
    argument + output - alias); empty when the backend does not report it.
  """
  try:
    m = compiled.memory_analysis()
  except Exception:  # pylint: disable=broad-except
    return {}
  if m is None:
    return {}
  get = lambda name: float(getattr(m, name, 0) or 0) / _MIB
  out = {
      "xla_temp_mib": get("temp_size_in_bytes"),
      "xla_argument_mib": get("argument_size_in_bytes"),
      "xla_output_mib": get("output_size_in_bytes"),
      "xla_alias_mib": get("alias_size_in_bytes"),
      "xla_code_mib": get("generated_code_size_in_bytes"),
  }
  out["xla_total_mib"] = (out["xla_temp_mib"] + out["xla_argument_mib"] +
                          out["xla_output_mib"] - out["xla_alias_mib"])
  return out


def machine_info() -> dict[str, Any]:
  """CPU model, cores, versions, backend, devices, git commit and date."""
  import jax  # pylint: disable=g-import-not-at-top
  import jaxlib  # pylint: disable=g-import-not-at-top

  cpu = platform.processor() or "unknown"
  try:
    with open("/proc/cpuinfo", encoding="utf-8") as f:
      for line in f:
        if line.lower().startswith("model name"):
          cpu = line.split(":", 1)[1].strip()
          break
  except OSError:
    pass
  try:
    torch_version = __import__("torch").__version__
  except Exception:  # pylint: disable=broad-except
    torch_version = None
  try:
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"],
                            capture_output=True, text=True, timeout=10,
                            cwd=os.path.dirname(os.path.abspath(__file__))
                            ).stdout.strip() or None
  except (OSError, subprocess.SubprocessError):
    commit = None
  return {
      "cpu": cpu,
      "cores": os.cpu_count(),
      "affinity_cores": (len(os.sched_getaffinity(0))
                         if hasattr(os, "sched_getaffinity") else None),
      "load_average": list(os.getloadavg()) if hasattr(os, "getloadavg")
                      else None,
      "python": platform.python_version(),
      "jax": jax.__version__,
      "jaxlib": jaxlib.__version__,
      "backend": jax.default_backend(),
      "devices": [str(d) for d in jax.devices()],
      "torch": torch_version,
      "git_commit": commit,
      "date_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(
          timespec="seconds"),
  }


# --------------------------------------------------------------------------
# One part (runs inside a child process).


def _memory_gradients(settings: dict) -> dict[str, dict[str, float]]:
  import jax  # pylint: disable=g-import-not-at-top
  from repdef_jax import gradients  # pylint: disable=g-import-not-at-top
  from repdef_jax import models  # pylint: disable=g-import-not-at-top

  out = {}
  b = max(settings["batch_sizes"])
  for name in settings["model_names"]:
    model = models.get_model(name, (32, 32, 3))
    params = model.init(jax.random.key(0))
    x = jax.numpy.zeros((b, 32, 32, 3))
    y = jax.numpy.zeros((b,), jax.numpy.int32)
    fn = jax.jit(lambda p, x, y, m=model: gradients.per_example_grads(
        m, p, x, y)[1])
    out[f"{name} B={b}"] = xla_memory(fn.lower(params, x, y).compile())
  return out


def _memory_defense(settings: dict) -> dict[str, dict[str, float]]:
  """XLA memory of ``feature_scores`` as the soteria defense runs it."""
  import jax  # pylint: disable=g-import-not-at-top
  from repdef_jax import models  # pylint: disable=g-import-not-at-top
  from repdef_jax.defenses import soteria  # pylint: disable=g-import-not-at-top

  out = {}
  b = max(settings["batches"])
  for name in settings["model_names"]:
    model = models.get_model(name, (32, 32, 3))
    if hasattr(model, "with_conv_impl"):
      model = model.with_conv_impl("s2d")
    params = model.init(jax.random.key(0))
    x = jax.random.uniform(jax.random.key(1), (b, 32, 32, 3))
    fn = jax.jit(lambda x, m=model, p=params: soteria.feature_scores(
        m.feature_fn(p), x, eps=m.score_eps))
    out[f"{name} B={b}"] = xla_memory(fn.lower(x).compile())
  return out


def _memory_attack(settings: dict) -> dict[str, dict[str, float]]:
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  from repdef_jax import gradients  # pylint: disable=g-import-not-at-top
  from repdef_jax import models  # pylint: disable=g-import-not-at-top
  from repdef_jax.attacks import dlg as dlg_lib  # pylint: disable=g-import-not-at-top
  from repdef_jax.attacks import inverting as inv_lib  # pylint: disable=g-import-not-at-top

  model = models.get_model("lenet", (32, 32, 3), 10, init="uniform")
  params = model.init(jax.random.key(0))
  shared = gradients.batch_grad(model, params, jnp.full((1, 32, 32, 3), 0.5),
                                jnp.array([3]))
  key, labels = jax.random.key(1), jnp.zeros((1,), jnp.int32)
  cfg = dlg_lib.DLGConfig(outer_steps=settings["outer_steps"],
                          inner_steps=settings["inner_steps"], tol=0.0,
                          grad_tol=-1.0)
  gcfg = inv_lib.GSConfig(iterations=settings["gs_iterations"], restarts=1)
  dlg_c = dlg_lib._dlg_jit.lower(  # pylint: disable=protected-access
      model, params, shared, key, labels, num_images=1, mode="learn",
      config=cfg).compile()
  gs_c = inv_lib._gs_jit.lower(  # pylint: disable=protected-access
      model, params, shared, key, jnp.array([3]), num_images=1,
      config=gcfg).compile()
  return {"dlg lenet 1 image": xla_memory(dlg_c),
          "gs lenet 1 image 1 restart": xla_memory(gs_c)}


def _memory_fedavg(settings: dict) -> dict[str, dict[str, float]]:
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  from experiments import benchmark_fedavg  # pylint: disable=g-import-not-at-top
  from repdef_jax import fedavg  # pylint: disable=g-import-not-at-top
  from repdef_jax import models  # pylint: disable=g-import-not-at-top

  out = {}
  keys = fedavg.key_streams(0)
  data = benchmark_fedavg._synthetic(10, 200, (32, 32, 3))  # pylint: disable=protected-access
  ids = jnp.arange(10, dtype=jnp.int32)
  b = settings["batch_sizes"][0]
  config = fedavg.FedAvgConfig(clients_per_round=10, local_epochs=1,
                               batch_size=b, client_lr=0.01)
  patches = models.get_model("lenet", (32, 32, 3), 10, conv_impl="patches")
  state = fedavg.init(patches, config, keys.init)
  round_fn = fedavg.make_round(patches, config, donate=True)
  out[f"vectorized round, 10 clients, batch {b}"] = xla_memory(
      round_fn.lower(state, data, keys, client_ids=ids).compile())
  xla = models.get_model("lenet", (32, 32, 3), 10, conv_impl="xla")
  client_fn, _ = fedavg.make_loop_fns(xla, config)
  out[f"loop: one client update, batch {b}"] = xla_memory(
      client_fn.lower(state.params, data.x[0], data.y[0], data.mask[0],
                      state.round, keys, jnp.int32(0)).compile())
  return out


def run_part(part: str, settings: dict, runs: int = 1) -> dict[str, Any]:
  """Runs one benchmark part ``runs`` times in this process.

  Args:
    part: one of :data:`PARTS`.
    settings: keyword arguments of that script's ``run``.
    runs: how many times to call ``run`` (medians are taken later).

  Returns:
    ``{'runs': [raw outputs], 'memory': {...}, 'rss_after_import_mib',
    'peak_rss_mib', 'wall_s'}``.
  """
  import jax  # pylint: disable=g-import-not-at-top,unused-import
  if part == "gradients":
    from experiments import benchmark_gradients as mod  # pylint: disable=g-import-not-at-top
  elif part == "defense":
    from experiments import benchmark_defense as mod  # pylint: disable=g-import-not-at-top
  elif part == "attack":
    from experiments import benchmark_attack as mod  # pylint: disable=g-import-not-at-top
  elif part == "fedavg":
    from experiments import benchmark_fedavg as mod  # pylint: disable=g-import-not-at-top
  else:
    raise ValueError(f"Unknown part {part!r}; valid: {', '.join(PARTS)}.")
  rss0 = _rss_mib()
  start = time.perf_counter()
  raws = [mod.run(**settings) for _ in range(runs)]
  rss_bench = _rss_mib()
  if part == "gradients":
    memory = _memory_gradients(settings)
  elif part == "defense":
    memory = _memory_defense(settings)
  elif part == "attack":
    memory = _memory_attack(settings)
  else:
    memory = _memory_fedavg(settings)
  return {"runs": raws, "memory": memory, "rss_after_import_mib": rss0,
          "peak_rss_mib": rss_bench, "wall_s": time.perf_counter() - start}


def _run_child(part: str, quick: bool, runs: int,
               timeout: float | None) -> dict[str, Any]:
  """Runs :func:`run_part` in a fresh Python process; returns its JSON."""
  fd, path = tempfile.mkstemp(prefix=f"bench-{part}-", suffix=".json")
  os.close(fd)
  cmd = [sys.executable, "-m", "experiments.benchmark", f"--part={part}",
         f"--runs={runs}", f"--child_out={path}"]
  if quick:
    cmd.append("--quick")
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  try:
    proc = subprocess.run(cmd, cwd=root, capture_output=True, text=True,
                          timeout=timeout)
    if proc.returncode != 0:
      return {"error": f"exit {proc.returncode}: "
                       f"{(proc.stderr or proc.stdout)[-3000:]}"}
    with open(path, encoding="utf-8") as f:
      return json.load(f)
  except subprocess.TimeoutExpired:
    return {"error": f"timed out after {timeout} s"}
  finally:
    if os.path.exists(path):
      os.remove(path)


# --------------------------------------------------------------------------
# Summaries: one row per reported number.


def _median(values: Sequence[float]) -> float | None:
  values = [v for v in values if v is not None]
  return float(statistics.median(values)) if values else None


def _target(part: str, backend: str) -> float | None:
  if part not in TARGETS:
    return None
  cpu, accel, _ = TARGETS[part]
  return cpu if backend == "cpu" else accel


def _row(part, benchmark, config, ours, baseline, ratio, target, compile_s,
         memory, note="") -> dict[str, Any]:
  return {"part": part, "benchmark": benchmark, "config": config,
          "ours": ours, "baseline": baseline, "ratio": ratio,
          "target": target,
          "met": (None if target is None or ratio is None
                  else bool(ratio >= target)),
          "compile_s": compile_s, "memory": memory, "note": note}


def summarize(part: str, child: dict[str, Any],
              backend: str = "cpu") -> list[dict[str, Any]]:
  """Rows (medians over runs) of one part's raw child output."""
  if "error" in child:
    return [_row(part, part, "-", None, None, None, _target(part, backend),
                 None, {}, note=f"failed: {child['error'][:300]}")]
  runs = child["runs"]
  mem = child.get("memory", {})
  rss = {"peak_rss_mib": child.get("peak_rss_mib"),
         "rss_after_import_mib": child.get("rss_after_import_mib")}
  rows = []
  target = _target(part, backend)

  def mem_for(prefix):
    for k, v in mem.items():
      if k.startswith(prefix):
        return {**v, **rss, "program": k}
    return dict(rss)

  if part == "gradients":
    for i, r0 in enumerate(runs[0]):
      pick = lambda k, i=i: _median([r[i][k] for r in runs])
      cfg = f"{r0['model']} batch {r0['batch']}"
      rows.append(_row(
          part, "per-example gradients: vmap(grad) vs loop", cfg,
          {"vmap_s": pick("vmap_s")}, {"loop_s": pick("loop_s")},
          pick("ratio"), None,
          {"vmap": pick("compile_vmap_s"), "loop": pick("compile_loop_s")},
          mem_for(f"{r0['model']} "),
          note=f"max abs diff {pick('max_abs_diff'):.1e}"))
  elif part == "defense":
    for i, r0 in enumerate(runs[0]["rows"]):
      pick = lambda k, i=i: _median([r["rows"][i].get(k) for r in runs])
      name, b = r0["model"], r0["batch"]
      n, nf = r0.get("features_timed"), r0.get("num_features")
      rows.append(_row(
          part, "Soteria feature_scores vs per-feature vjp loop",
          f"{name} batch {b}", {"ours_s": pick("ours_s")},
          {"loop_s": pick("loop_s"), "loop_s2d_s": pick("loop_s2d_s")},
          pick("speedup"), target if int(b) == 8 else None,
          {"ours": pick("compile_ours_s"), "loop": pick("compile_loop_s")},
          mem_for(f"{name} B={b}") if f"{name} B={b}" in mem else dict(rss),
          note=(f"timed on {n} of {nf} features, scaled" if n and nf and
                n < nf else "") + (f"; {_fmt(pick('speedup_vs_loop_s2d'))}x "
                                   "vs the loop on s2d convolutions")))
  elif part == "attack":
    pick = lambda k: _median([r.get(k) for r in runs])
    r0 = runs[0]
    iters = r0.get("dlg_iterations")
    has_torch = "speedup_vs_torch" in r0
    rows.append(_row(
        part, "full DLG attack (L-BFGS) vs PyTorch", f"lenet, 1 image, "
        f"{iters} iterations", {"dlg_s": pick("dlg_seconds")},
        {"torch_dlg_s": pick("torch_dlg_seconds")} if has_torch else None,
        pick("speedup_vs_torch") if has_torch else None, target,
        {"dlg": pick("dlg_compile_seconds")}, mem_for("dlg"),
        note=(f"torch ran {r0.get('torch_outer_steps_run')} outer steps on "
              f"{r0.get('torch_threads')} thread(s), scaled" if has_torch
              else "torch not importable: ratio not measured")))
    rows.append(_row(
        part, "GS iterations per second", "lenet, 1 image, 1 restart",
        {"gs_it_per_s": pick("gs_iterations_per_second")}, None, None, None,
        {"gs": pick("gs_compile_seconds")}, mem_for("gs")))
  elif part == "fedavg":
    for i, s0 in enumerate(runs[0]["settings"]):
      pick = lambda k, i=i: _median([r["settings"][i].get(k) for r in runs])
      cfg = (f"lenet, 10 clients x 200 ex., batch {s0['batch_size']} "
             f"({s0['local_steps']} local steps)")
      rows.append(_row(
          part, "FedAvg round: vectorized (patches) vs FedJAX-style loop",
          cfg, {"rounds_per_s": pick("ours_rps")},
          {"loop_rounds_per_s": pick("loop_xla_rps")}, pick("ours_vs_loop"),
          target, {"ours": pick("ours_compile_s"),
                   "loop": pick("loop_xla_compile_s")},
          mem_for("vectorized") if i == 0 else dict(rss),
          note=f"max abs diff {pick('max_abs_diff'):.1e}"))
      if "slices_vs_loop" in s0:
        rows.append(_row(
            part, "FedAvg round: vectorized (slices im2col) vs loop", cfg,
            {"rounds_per_s": pick("slices_rps")},
            {"loop_rounds_per_s": pick("loop_xla_rps")},
            pick("slices_vs_loop"), None,
            {"slices": pick("slices_compile_s")}, dict(rss),
            note="proposed conv_impl (not yet the library's); max abs diff "
                 f"{pick('slices_max_abs_diff'):.1e}"))
    if "mnist" in runs[0]:
      m = lambda k: _median([r["mnist"].get(k) for r in runs])
      rows.append(_row(
          part, "200 MNIST rounds (estimate)",
          "lenet 28x28x1, 100 clients, 10/round, batch 50",
          {"s_per_round": m("s_per_round"),
           "est_200_rounds_s": m("est_200_rounds_s")}, None, None, None,
          {"round": m("compile_s")}, dict(rss)))
  return rows


# --------------------------------------------------------------------------
# Rendering.


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
  if isinstance(v, dict):
    return ", ".join(f"{k} {_fmt(x)}" for k, x in v.items()) or "-"
  if isinstance(v, (list, tuple)):
    return " / ".join(_fmt(x) for x in v) or "-"
  return str(v).replace("|", "/")


def render_markdown(report: dict[str, Any]) -> str:
  """Renders a benchmark report (as in ``benchmarks.json``) as Markdown.

  Pure function of the report (no JAX, no I/O), so it is unit-testable.

  Args:
    report: ``{'machine': {...}, 'settings': {...}, 'rows': [...]}`` as
      built by :func:`run_all`.

  Returns:
    The text of ``BENCHMARKS.md``.
  """
  m = report.get("machine", {})
  s = report.get("settings", {})
  lines = [
      "# Benchmarks",
      "",
      "Generated by `python -m experiments.benchmark"
      f"{' --quick' if s.get('quick') else ''}` on "
      f"{m.get('date_utc', '?')}; do not edit by hand.",
      "",
      f"Machine: {m.get('cpu', '?')}, {m.get('cores', '?')} cores"
      f" (load average {_fmt(m.get('load_average'))}); backend "
      f"{m.get('backend', '?')} ({', '.join(m.get('devices', []))}); "
      f"JAX {m.get('jax', '?')}, jaxlib {m.get('jaxlib', '?')}, Python "
      f"{m.get('python', '?')}, torch {m.get('torch') or 'not installed'}; "
      f"commit {m.get('git_commit') or '?'}.",
      "",
      f"Times are medians ({s.get('runs', 1)} run(s) of each script, each "
      "taking the median of its own repeats), in seconds unless named "
      "otherwise; ratios are baseline time / our time measured in the same "
      "run (higher is better); compile times are separate. Persistent "
      "compilation cache off.",
      "",
      "| benchmark | configuration | ours | baseline | ratio | target | met "
      "| compile (s) | memory (MiB) | note |",
      "|---|---|---|---|---|---|---|---|---|---|",
  ]
  for r in report.get("rows", []):
    mem = r.get("memory") or {}
    mem_text = []
    if mem.get("xla_total_mib") is not None:
      mem_text.append(f"XLA {_fmt(mem['xla_total_mib'])} (temp "
                      f"{_fmt(mem.get('xla_temp_mib'))})")
    if mem.get("peak_rss_mib") is not None:
      mem_text.append(f"RSS peak {_fmt(mem['peak_rss_mib'])}")
    target = r.get("target")
    lines.append(
        f"| {_fmt(r.get('benchmark'))} | {_fmt(r.get('config'))} | "
        f"{_fmt(r.get('ours'))} | {_fmt(r.get('baseline'))} | "
        f"{_fmt(r.get('ratio'))}{'x' if r.get('ratio') is not None else ''}"
        f" | {'>= ' + _fmt(target) + 'x' if target is not None else '-'} | "
        f"{_fmt(r.get('met'))} | {_fmt(r.get('compile_s'))} | "
        f"{'; '.join(mem_text) or '-'} | {_fmt(r.get('note'))} |")
  targeted = [r for r in report.get("rows", []) if r.get("target")]
  met = sum(1 for r in targeted if r.get("met"))
  lines += [
      "",
      f"Targets met: {met} of {len(targeted)} (targets from issues 3, 4 "
      "and 5: defense >= 2x at batch 8 on LeNet and ConvNet64; DLG >= 3x "
      "vs PyTorch; FedAvg round >= 2x vs the FedJAX-style loop; on an "
      "accelerator 20x / 3x / 5x).",
      "",
      "Memory: 'XLA' is temp + argument + output - alias of the compiled "
      "program of the benchmarked computation "
      "(`jax.jit(f).lower(...).compile().memory_analysis()`); 'RSS peak' is "
      "the benchmark part's whole-process resident-set high-water mark "
      "(`resource.getrusage(RUSAGE_SELF).ru_maxrss`, each part in its own "
      "process), including Python, JAX and every compiled program.",
  ]
  return "\n".join(lines) + "\n"


def run_all(quick: bool = False, out_dir: str = "docs/benchmarks",
            runs: int | None = None, parts: Sequence[str] = PARTS,
            timeout: float | None = None, verbose: bool = True
            ) -> dict[str, Any]:
  """Runs every part in a child process and writes BENCHMARKS.md + JSON.

  Args:
    quick: fewer configurations and repeats (a few minutes on 2 cores).
    out_dir: where ``BENCHMARKS.md`` and ``benchmarks.json`` go.
    runs: runs of each part (medians over runs); default 1 quick, 3 full.
    parts: subset of :data:`PARTS`.
    timeout: per-part timeout in seconds (None: none).
    verbose: print progress and the table.

  Returns:
    The report dict written to ``benchmarks.json``.
  """
  unknown = [p for p in parts if p not in PARTS]
  if unknown:
    raise ValueError(f"Unknown parts {unknown}; valid: {', '.join(PARTS)}.")
  runs = runs if runs is not None else (1 if quick else 3)
  if runs < 1:
    raise ValueError(f"runs must be >= 1, got {runs}.")
  machine = machine_info()
  mode = "quick" if quick else "full"
  report = {"machine": machine,
            "settings": {"quick": quick, "runs": runs, "parts": list(parts),
                         "per_part": {p: SETTINGS[mode][p] for p in parts}},
            "targets": {p: {"cpu": t[0], "accelerator": t[1], "issue": t[2]}
                        for p, t in TARGETS.items()},
            "memory_method": "xla memory_analysis of the benchmarked program "
                             "+ per-part process ru_maxrss",
            "rows": [], "raw": {}}
  for part in parts:
    t0 = time.perf_counter()
    if verbose:
      print(f"[benchmark] {part} ({mode}, {runs} run(s)) ...", flush=True)
    child = _run_child(part, quick, runs, timeout)
    report["raw"][part] = child
    rows = summarize(part, child, machine["backend"])
    report["rows"].extend(rows)
    if verbose:
      for r in rows:
        print(f"  {r['benchmark']} [{r['config']}]: ours {_fmt(r['ours'])}"
              f" | baseline {_fmt(r['baseline'])} | ratio "
              f"{_fmt(r['ratio'])} | target {_fmt(r['target'])} met "
              f"{_fmt(r['met'])} | compile {_fmt(r['compile_s'])}"
              f"{' | ' + r['note'] if r['note'] else ''}", flush=True)
      print(f"  ({time.perf_counter() - t0:.0f} s)", flush=True)
  os.makedirs(out_dir, exist_ok=True)
  storage.write_json(os.path.join(out_dir, "benchmarks.json"), report)
  storage.write_text(os.path.join(out_dir, "BENCHMARKS.md"),
                    render_markdown(report))
  if verbose:
    print(f"wrote {out_dir}/BENCHMARKS.md and benchmarks.json")
  return report


FLAGS = flags.FLAGS


def define_flags() -> None:
  """Defines the absl flags (only when run as a program)."""
  flags.DEFINE_bool("quick", False, "Fewer configurations and repeats.")
  flags.DEFINE_string("out_dir", "docs/benchmarks", "Output folder.")
  flags.DEFINE_integer("runs", None, "Runs per part (median); default 1 "
                       "quick, 3 full.")
  flags.DEFINE_list("parts", list(PARTS), "Parts to run.")
  flags.DEFINE_float("timeout", None, "Per-part timeout (s).")
  flags.DEFINE_string("part", None, "Internal: run one part in this process.")
  flags.DEFINE_string("child_out", None, "Internal: JSON output of --part.")


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  if FLAGS.part:
    mode = "quick" if FLAGS.quick else "full"
    out = run_part(FLAGS.part, SETTINGS[mode][FLAGS.part], FLAGS.runs or 1)
    storage.write_json(FLAGS.child_out, out)
    return
  run_all(FLAGS.quick, FLAGS.out_dir, FLAGS.runs, FLAGS.parts, FLAGS.timeout)


if __name__ == "__main__":
  define_flags()
  app.run(main)
