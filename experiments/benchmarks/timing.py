"""The one timing helper of the benchmarks, with FLOP counts and CPU peak.

* :func:`measure` times a benchmark (:class:`Bench`): a jitted function is
  lowered and compiled once (compile time separate), and that compiled
  object is both timed and asked for ``memory_analysis()``; a host callable
  (a PyTorch peer, an attack that validates its inputs on the host) is
  called once to warm up and then timed.
* :func:`xla_flops` counts FLOPs with XLA's cost analysis of a function;
  the benchmarks count the *reference algorithm* in the direct ``'xla'``
  convolution formulation, so the count is the same for every
  implementation and its peers (XLA counts 2 FLOPs per multiply-add and
  leaves out taps that fall on the zero padding).
* :func:`cpu_peak` states this CPU's fp32 peak: FLOPs per cycle per core
  from its vector units (:func:`flops_per_cycle`: 32 with AVX2 + FMA, e.g.
  AMD Zen 2-4; 64 with AVX-512 on Intel, two 512-bit FMA units assumed),
  times the clock (``/proc/cpuinfo`` / ``lscpu``), times the cores this
  process may use. :func:`peak` is that on CPU and, on a GPU, its
  datasheet fp32 peak (:data:`GPU_FP32_TFLOPS`).
"""

from __future__ import annotations

import dataclasses
import datetime
import os
import platform
import resource
import statistics
import subprocess
import time
from typing import Any, Callable

import jax

from repdef_jax import host

_MIB = 1024.0 * 1024.0
# Dense fp32 peak on the CUDA cores (no tensor cores), TFLOP/s, NVIDIA's
# datasheets; matched against JAX's device_kind, first match wins.
GPU_FP32_TFLOPS = (("H200", 67.0), ("H100 PCIe", 51.0), ("H100", 67.0),
                   ("A100", 19.5), ("L40S", 91.6), ("L4", 30.3),
                   ("A10G", 31.2), ("V100", 15.7), ("T4", 8.1))


@dataclasses.dataclass
class Bench:
  """A benchmarked computation.

  Attributes:
    fn: the jitted function (or a host callable, see :func:`measure`).
    args: its arguments.
    flops: FLOPs of one call of the reference algorithm (None: unknown).
    note: what is timed, for the report.
    meta: what a peer needs to rebuild the same workload (model, batch).
  """

  fn: Callable[..., Any]
  args: tuple = ()
  flops: float | None = None
  note: str = ""
  meta: dict = dataclasses.field(default_factory=dict)


def _prepare(bench: Bench, warmup: bool = True):
  """``(call, compile_seconds_or_None, memory)`` for a benchmark."""
  fn, args = bench.fn, bench.args
  memory = {}
  t0 = time.perf_counter()
  if hasattr(fn, "lower"):
    compiled = fn.lower(*args).compile()
    memory = xla_memory(compiled)
    call = lambda: jax.block_until_ready(compiled(*args))
    call()
    return call, time.perf_counter() - t0, memory
  call = lambda: jax.block_until_ready(fn(*args))
  if warmup:
    call()
    return call, time.perf_counter() - t0, memory
  return call, None, memory


def _timed(call) -> float:
  t0 = time.perf_counter()
  call()
  return time.perf_counter() - t0


def _summary(times, first, memory, flops) -> dict[str, Any]:
  best = min(times)
  out = {"seconds": best, "median_seconds": statistics.median(times),
         "compile_seconds": max(first - best, 0.0) if first else 0.0,
         "repeats": len(times), "times": times, "memory": memory}
  if flops:
    out["gflops"] = flops / best / 1e9
  return out


def measure(bench: Bench, repeats: int = 3,
            warmup: bool = True) -> dict[str, Any]:
  """Best-of-``repeats`` seconds of ``bench.fn(*bench.args)``.

  The minimum, not the median: the cores are shared with other jobs, and
  the fastest run is the one least disturbed by them (the median and every
  time are also returned).

  Args:
    bench: the benchmark; a jitted ``fn`` (one with ``.lower``) is lowered
      and compiled once, and that compiled object is run and asked for
      ``memory_analysis()``.
    repeats: timed calls.
    warmup: make one untimed call first (always done for a jitted
      function, whose compile time is reported separately); without it a
      host callable's first call is a timed repeat (for expensive PyTorch
      peers, which do not compile).

  Returns:
    ``{'seconds' (min), 'median_seconds', 'times', 'compile_seconds',
    'repeats', 'memory'}`` (memory: :func:`xla_memory` of the compiled
    program; empty for host callables), plus ``gflops`` when
    ``bench.flops`` is known.
  """
  call, first, memory = _prepare(bench, warmup)
  times = [_timed(call) for _ in range(max(1, repeats))]
  return _summary(times, first, memory, bench.flops)


def compare(bench: Bench, peer: Callable[[], Any], repeats: int = 3,
            peer_warmup: bool = True
            ) -> tuple[dict[str, Any], dict[str, Any]]:
  """:func:`measure` of ``bench`` and of a peer, interleaved.

  Ours and the peer run alternately (ours, peer, ours, peer, ...), so that
  both see the same load from other jobs; each side reports its best run.

  Returns:
    ``(ours, peer)`` as :func:`measure` returns them.
  """
  call, first, memory = _prepare(bench)
  pcall, pfirst, _ = _prepare(Bench(peer), peer_warmup)
  ours, theirs = [], []
  for _ in range(max(1, repeats)):
    ours.append(_timed(call))
    theirs.append(_timed(pcall))
  return (_summary(ours, first, memory, bench.flops),
          _summary(theirs, pfirst, {}, bench.flops))


def time_host(fn: Callable[[], Any], repeats: int = 3,
              warmup: bool = True) -> dict[str, Any]:
  """:func:`measure` for a zero-argument host callable (PyTorch peers)."""
  return measure(Bench(fn), repeats, warmup)


def xla_flops(fn: Callable[..., Any], *args) -> float:
  """FLOPs of ``jax.jit(fn)(*args)`` by XLA's cost analysis."""
  cost = jax.jit(fn).lower(*args).compile().cost_analysis()
  if isinstance(cost, (list, tuple)):
    cost = cost[0]
  return float(cost.get("flops", 0.0))


def xla_memory(compiled: Any) -> dict[str, float]:
  """MiB of the buffers of a compiled XLA program (``memory_analysis``).

  Returns:
    ``{'temp', 'argument', 'output', 'total'}`` in MiB (total = temp +
    argument + output - alias); empty when the backend does not report it.
  """
  try:
    m = compiled.memory_analysis()
  except Exception:  # pylint: disable=broad-except
    return {}
  if m is None:
    return {}
  get = lambda name: float(getattr(m, name, 0) or 0) / _MIB
  out = {"temp": get("temp_size_in_bytes"),
         "argument": get("argument_size_in_bytes"),
         "output": get("output_size_in_bytes")}
  out["total"] = (out["temp"] + out["argument"] + out["output"] -
                  get("alias_size_in_bytes"))
  return out


def _lscpu() -> dict[str, str]:
  try:
    out = subprocess.run(["lscpu"], capture_output=True, text=True,
                         timeout=10).stdout
  except (OSError, subprocess.SubprocessError):
    return {}
  return {k.strip().lower(): v.strip() for k, v in
          (line.split(":", 1) for line in out.splitlines() if ":" in line)}


def flops_per_cycle(vendor: str, flags: set[str]) -> tuple[int, str]:
  """fp32 FLOP/cycle/core of a CPU from its vendor and flags, and why.

  Intel with AVX-512: two 512-bit FMA units (16 lanes x 2 FLOPs each), as
  on Xeon Scalable Gold 6xxx / Platinum and every later server part (some
  Silver / Gold 5xxx parts have one: half this). AMD Zen 2-5 and Intel
  without AVX-512: two 256-bit FMA pipes (Zen 4 runs AVX-512 on them).
  Without FMA: one add and one multiply pipe of 8 lanes.
  """
  if "avx512f" in flags and vendor == "GenuineIntel":
    return 64, ("2 FMA units x 16 fp32 lanes x 2 FLOPs; AVX-512 on Intel, "
                "assumed two 512-bit FMA units per core")
  if "fma" in flags and "avx2" in flags:
    amd512 = ", AVX-512 executed on the same 256-bit pipes" if (
        "avx512f" in flags) else ""
    return 32, f"2 FMA pipes x 8 fp32 lanes x 2 FLOPs; AVX2 + FMA{amd512}"
  return 16, "1 add + 1 multiply pipe x 8 fp32 lanes; no FMA"


# Model names a hypervisor reports for its generic CPU types (QEMU's named
# models), where the host's chip, and so its FMA width, is unknown.
GENERIC_CPU_MODELS = ("AMD EPYC", "AMD EPYC Processor", "Common KVM processor",
                      "QEMU Virtual CPU")


def generic_cpu_note(model_name: str | None) -> str:
  """A caveat for the peak when ``model_name`` is a hypervisor's generic CPU
  type (the FLOP/cycle is then inferred from the flags alone), else ''."""
  name = (model_name or "").strip()
  if name in GENERIC_CPU_MODELS or "QEMU" in name:
    return (f"; the hypervisor reports a generic CPU model ('{name}'): the "
            "host chip is unknown, so FLOP/cycle follows from the flags "
            "alone (compare the measured sgemm)")
  return ""


def cpu_peak() -> dict[str, Any]:
  """fp32 peak GFLOP/s of this CPU and how it is derived.

  peak = cores x GHz x FLOP/cycle/core, with GHz the largest of
  ``lscpu``'s 'CPU max MHz' (when the hypervisor reports it) and
  ``/proc/cpuinfo``'s 'cpu MHz' (a turbo clock above both would make the
  true peak higher), and FLOP/cycle from :func:`flops_per_cycle`.
  """
  lscpu = _lscpu()
  mhz = [float(v) for v in (host.cpuinfo("cpu mhz"),
                            lscpu.get("cpu max mhz")) if v]
  ghz = max(mhz) / 1000.0 if mhz else None
  n = host.usable_cores()
  flags = set((host.cpuinfo("flags") or "").split())
  per_cycle, why = flops_per_cycle(host.cpuinfo("vendor_id") or "", flags)
  peak = ghz * per_cycle * n if ghz else None
  return {
      "gflops": peak, "ghz": ghz, "cores": n,
      "flops_per_cycle_per_core": per_cycle,
      "avx2": "avx2" in flags, "fma": "fma" in flags,
      "avx512": "avx512f" in flags,
      "lscpu_model": lscpu.get("model name"),
      "lscpu_family_model": f"{lscpu.get('cpu family')}/"
                            f"{lscpu.get('model')}",
      "how": (f"{n} cores x {ghz:.3f} GHz x {per_cycle} FLOP/cycle ({why})"
              f"; clock: max of /proc/cpuinfo 'cpu MHz' and lscpu 'CPU max "
              f"MHz'; cores: sched_getaffinity"
              f"{generic_cpu_note(lscpu.get('model name'))}"
              if ghz else "unknown clock"),
  }


def sgemm_gflops(matmul: Callable[[], Any], n: int, repeats: int = 5
                 ) -> float:
  """Best-of-``repeats`` GFLOP/s of ``matmul()``, an [n, n] x [n, n] fp32
  product that blocks until done (called once untimed first)."""
  matmul()
  return 2.0 * n ** 3 / min(_timed(matmul) for _ in range(repeats)) / 1e9


def raise_to_measured(peak_info: dict[str, Any],
                      measured: dict[str, float]) -> dict[str, Any]:
  """``peak_info`` with the measured sgemm rates, raised to the fastest when
  that beats the nominal peak (the cores run above their nominal clock), so
  no fraction of peak exceeds 100 % for want of a clock reading."""
  out = dict(peak_info, sgemm_gflops=dict(measured))
  rates = ", ".join(f"{k} {v:.0f}" for k, v in measured.items())
  name, best = max(measured.items(), key=lambda kv: kv[1])
  nominal = peak_info.get("gflops")
  if nominal is not None and best <= nominal:
    out["how"] = (f"{peak_info['how']}; measured 4096 x 4096 sgemm: {rates} "
                  "GFLOP/s")
    return out
  out["gflops"] = best
  out["how"] = (f"the fastest measured 4096 x 4096 sgemm ({name}; {rates} "
                f"GFLOP/s), above the nominal "
                f"{_fmt_gflops(nominal)} GFLOP/s = {peak_info['how']}: the "
                "cores run above their nominal clock")
  return out


def _fmt_gflops(v: float | None) -> str:
  return "?" if v is None else f"{v:.0f}"


def gpu_peak(kind: str) -> dict[str, Any]:
  """fp32 peak GFLOP/s of a GPU named ``kind`` (JAX's ``device_kind``)."""
  tflops = next((t for name, t in GPU_FP32_TFLOPS if name in kind), None)
  if tflops is None:
    return {"gflops": None, "how": f"unknown fp32 peak for {kind!r}"}
  return {"gflops": tflops * 1e3, "device_kind": kind,
          "how": (f"{kind}: {tflops:g} TFLOP/s fp32 on the CUDA cores "
                  "(NVIDIA datasheet, dense). Float32 convolutions and "
                  "matmuls may run on TF32 tensor cores (both libraries' "
                  "defaults allow it for convolutions), whose peak is "
                  "several times higher, so a fraction above 100 % is "
                  "possible")}


def peak() -> dict[str, Any]:
  """The peak of the device JAX computes on: :func:`cpu_peak` on CPU,
  :func:`gpu_peak` on a GPU; unknown elsewhere (TPU)."""
  backend = jax.default_backend()
  if backend == "cpu":
    return cpu_peak()
  if backend == "gpu":
    return gpu_peak(jax.devices()[0].device_kind)
  return {"gflops": None, "how": f"peak not stated for backend {backend}"}


def machine_info() -> dict[str, Any]:
  """CPU, cores, load, versions, backend, git commit and date."""
  import jaxlib  # pylint: disable=g-import-not-at-top
  try:
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True,
        text=True, timeout=10,
        cwd=os.path.dirname(os.path.abspath(__file__))).stdout.strip()
    dirty = subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=no"],
        capture_output=True, text=True, timeout=10,
        # Not stripped: each line starts with a 2-letter status and a space.
        cwd=os.path.dirname(os.path.abspath(__file__))).stdout
  except (OSError, subprocess.SubprocessError):
    commit, dirty = None, ""
  # A copy without .git (the device machine) names its commit in the
  # environment.
  commit = commit or os.environ.get("REPDEF_GIT_COMMIT")
  return {
      "cpu": host.cpuinfo("model name") or platform.processor() or "unknown",
      "cpu_family": host.cpuinfo("cpu family"),
      "cores": host.usable_cores(),
      "load_average": list(os.getloadavg()) if hasattr(os, "getloadavg")
                      else None,
      "python": platform.python_version(),
      "jax": jax.__version__, "jaxlib": jaxlib.__version__,
      "backend": jax.default_backend(),
      "devices": [str(d) for d in jax.devices()],
      "device_kind": jax.devices()[0].device_kind,
      "xla_flags": os.environ.get("XLA_FLAGS", ""),
      "git_commit": commit or None,
      "tracked_files_modified": bool(dirty),
      "modified_files": [l[3:] for l in dirty.splitlines()],
      "peak": peak(),
      "peak_rss_mib": resource.getrusage(
          resource.RUSAGE_SELF).ru_maxrss / 1024.0,
      "date_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(
          timespec="seconds"),
  }
