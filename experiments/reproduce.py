r"""One command reproduces every result of the paper and writes REPORT.md.

  python -m experiments.reproduce --preset=quick --workdir=/tmp/repro \
      --data_dir=$TFDS_DATA_DIR

Runs every part (trade-off, visual comparison, representation leakage,
convergence, certified bound, adaptive attacks) as its own entry point in its
own sub-workdir (``workdir/<part>``), in a subprocess, logging each part's
wall time and an ETA, then writes ``workdir/REPORT.md`` with
:func:`repdef_jax.report.write_report`. Restarted with the same command it
skips finished parts (a ``PART_DONE.json`` marker with the same command) and
each part resumes its own finished cells. A failed part is recorded and the
others still run; the exit status is then 1.

Presets: ``quick`` (about 25 minutes on a 2-core CPU), ``full`` (paper scale,
for an accelerator) and ``tiny`` (tests; use with ``--mock_data``).
``--parts=tradeoff,visual`` runs a subset; ``--report_only`` only rewrites
the report.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import time

from absl import app
from absl import flags

from repdef_jax import io as io_lib
from repdef_jax import report

PRESETS = ("quick", "full", "tiny")
PART_ORDER = ("tradeoff", "visual", "repinfer", "convergence", "certified",
              "adaptive")
# Rough quick-preset wall times on an idle 2-core CPU (seconds), for the ETA.
QUICK_ESTIMATE = {"tradeoff": 930, "visual": 200, "repinfer": 180,
                  "convergence": 60, "certified": 120, "adaptive": 300}

_PRESET = flags.DEFINE_enum("preset", "quick", PRESETS, "Preset.")
_WORKDIR = flags.DEFINE_string("workdir", None, "Output directory.",
                               required=True)
_DATA_DIR = flags.DEFINE_string("data_dir", None,
                                "TFDS data dir (default: TFDS_DATA_DIR).")
_PARTS = flags.DEFINE_list("parts", list(PART_ORDER), "Parts to run.")
_MOCK = flags.DEFINE_integer(
    "mock_data", 0, "Tests only: run every part under "
    "tfds.testing.mock_data with this many examples per split (0 = off).")
_REPORT_ONLY = flags.DEFINE_bool("report_only", False,
                                 "Only rewrite REPORT.md.")

_REPINFER_ARGS = {
    "quick": [],
    "full": ["--config.rounds=20", "--config.recon_images=16"],
    "tiny": ["--config.num_clients=4", "--config.clients_per_round=2",
             "--config.samples_per_class=2", "--config.batch_size=2",
             "--config.rounds=1", "--config.recon_images=1",
             "--config.recon_steps=2"],
}
_CONVERGENCE_ARGS = {
    "quick": ["--config=experiments/configs/convergence.py:quick"],
    "full": ["--config=experiments/configs/convergence.py:full"],
    "tiny": ["--config=experiments/configs/convergence.py:quick",
             "--config.base.num_clients=4", "--config.base.samples_per_class=2",
             "--config.base.rounds=1", "--config.base.max_test_examples=20",
             "--config.base.eval_batch=20", "--config.base.checkpoint_every=1"],
}


def part_args(part: str, preset: str, workdir: str,
              data_dir: str | None) -> list[str]:
  """``[module, *args]`` of one part's entry point."""
  args = [f"--workdir={workdir}"]
  if data_dir:
    args.append(f"--data_dir={data_dir}")
  if part == "repinfer":
    return ["experiments.repinfer", *args, *_REPINFER_ARGS[preset]]
  if part == "convergence":
    return ["experiments.convergence", *args, *_CONVERGENCE_ARGS[preset]]
  return [f"experiments.{part}", *args,
          f"--config=experiments/configs/{part}.py:{preset}"]


def part_command(part: str, preset: str, workdir: str, data_dir: str | None,
                 mock_data: int = 0) -> list[str]:
  """The full command line (argv) of one part."""
  module_args = part_args(part, preset, workdir, data_dir)
  if mock_data:
    return [sys.executable, "-m", "experiments.mock_run", str(mock_data),
            *module_args]
  return [sys.executable, "-m", *module_args]


def _display(cmd: list[str]) -> str:
  """The command as a user would type it (``python`` for the interpreter)."""
  return " ".join(["python"] + [shlex.quote(c) for c in cmd[1:]])


def run_parts(preset: str, workdir: str, data_dir: str | None,
              parts: list[str], mock_data: int = 0) -> dict[str, dict]:
  """Runs the parts (skipping finished ones); returns per-part run records."""
  os.makedirs(workdir, exist_ok=True)
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  runs = io_lib.read_json(os.path.join(workdir, "reproduce.json"), {}) or {}
  start = time.perf_counter()
  todo = [p for p in PART_ORDER if p in parts]
  for i, part in enumerate(todo):
    sub = os.path.join(workdir, part)
    cmd = part_command(part, preset, sub, data_dir, mock_data)
    shown = _display(cmd)
    marker = os.path.join(sub, "PART_DONE.json")
    done = io_lib.read_json(marker)
    if done and done.get("command") == shown:
      runs[part] = {**done, "status": "done (reused)"}
      print(f"[reproduce] {i + 1}/{len(todo)} {part}: finished earlier "
            f"({done['seconds']:.0f}s), reused", flush=True)
      continue
    left = sum(QUICK_ESTIMATE[p] for p in todo[i:])
    scale = 1.0 if preset == "quick" else (0.1 if preset == "tiny" else 20.0)
    print(f"[reproduce] {i + 1}/{len(todo)} {part}: {shown}\n"
          f"[reproduce] elapsed {time.perf_counter() - start:.0f}s, "
          f"ETA ~{left * scale:.0f}s (estimate)", flush=True)
    os.makedirs(sub, exist_ok=True)
    t0 = time.perf_counter()
    rc = subprocess.call(cmd, cwd=root)
    seconds = time.perf_counter() - t0
    record = {"command": shown, "seconds": seconds, "returncode": rc,
              "status": "done" if rc == 0 else f"FAILED (exit {rc})"}
    runs[part] = record
    if rc == 0:
      io_lib.write_json(marker, record)
    io_lib.write_json(os.path.join(workdir, "reproduce.json"), runs)
    print(f"[reproduce] {part}: {record['status']} in {seconds:.0f}s",
          flush=True)
  return runs


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  unknown = set(_PARTS.value) - set(PART_ORDER)
  if unknown:
    raise app.UsageError(f"Unknown parts {sorted(unknown)}; valid: "
                         f"{', '.join(PART_ORDER)}.")
  workdir = os.path.abspath(_WORKDIR.value)
  if _REPORT_ONLY.value:
    runs = io_lib.read_json(os.path.join(workdir, "reproduce.json"), {})
  else:
    runs = run_parts(_PRESET.value, workdir, _DATA_DIR.value, _PARTS.value,
                     _MOCK.value)
  path = report.write_report(workdir, runs=runs, preset=_PRESET.value)
  total = sum(float(r.get("seconds") or 0) for r in runs.values())
  print(f"[reproduce] wrote {path}; parts' wall time {total:.0f}s")
  if any(str(r.get("status", "")).startswith("FAILED") for r in runs.values()):
    sys.exit(1)


if __name__ == "__main__":
  app.run(main)
