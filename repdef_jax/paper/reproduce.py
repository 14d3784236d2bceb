"""Every part of the paper's reproduction in one run, then REPORT.md.

Each part runs as its own entry point in a subprocess, in ``workdir/<part>``
with ``experiments/configs/<part>.py:<preset>``; a finished part leaves a
``PART_DONE.json`` marker holding its command, a digest of its resolved
preset and the key scheme (:data:`repdef_jax.paper.harness.KEY_SCHEME`), and
is skipped on a rerun with the same command, config and scheme (a part of
another scheme reruns, reusing the cells that draw none of the changed
streams). Each part
also resumes its own cells, so a part whose config grew (seeds, strengths,
panels) runs only the cells it has not run yet; a cell computed with other
settings (e.g. an attack budget since changed) is refused with an error
naming the setting (:class:`repdef_jax.paper.harness.CellStore`): remove
those cell files or use a fresh workdir. A failed part is recorded and the
others still run. The report is :func:`repdef_jax.paper.report.write_report`.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shlex
import subprocess
import sys
import time
from typing import Any

from repdef_jax import storage
from repdef_jax.paper import harness
from repdef_jax.paper import replication
from repdef_jax.paper import report

PRESETS = ("quick", "medium", "full", "tiny")
PART_ORDER = ("tradeoff", "visual", "repinfer", "convergence", "certified",
              "adaptive")
# Wall times measured on an idle 2-core CPU (seconds), for the ETA; a
# preset without measurements is not estimated.
MEASURED_SECONDS = {
    "quick": {"tradeoff": 930, "visual": 200, "repinfer": 180,
              "convergence": 60, "certified": 120, "adaptive": 300},
}


def _experiments_root() -> str:
  """The folder holding the ``experiments`` package that runs the parts: the
  checkout, or site-packages when installed (the parts' ``--config`` paths
  are relative to it)."""
  spec = importlib.util.find_spec("experiments")
  if spec is not None and spec.submodule_search_locations:
    return os.path.dirname(os.path.abspath(
        list(spec.submodule_search_locations)[0]))
  return os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(
      __file__))))


ROOT = _experiments_root()


def parse_seeds(seeds: Any) -> tuple[int, ...]:
  """``'100,101,102'`` (or a sequence of ints) -> ``(100, 101, 102)``;
  empty: ``()``, each part keeps its preset's seeds.

  Raises:
    ValueError: not a comma-separated list of distinct non-negative ints.
  """
  items = seeds.split(",") if isinstance(seeds, str) else list(seeds or ())
  items = [str(s).strip() for s in items if str(s).strip()]
  if not all(s.isdigit() for s in items) or len(set(map(int, items))) != len(
      items):
    raise ValueError(f"seeds must be distinct non-negative integers "
                     f"separated by commas (e.g. '100,101,102'), got "
                     f"{seeds!r}.")
  return tuple(int(s) for s in items)


def _check_outputs(config: Any) -> None:
  """Fails before any part runs on a ``readme`` without its generated
  block or a ``publish`` path that is a file (found after hours, else)."""
  readme = config.get("readme")
  if readme:
    marker = (replication.README_BEGIN if config.get("compare_with")
              else report.README_BEGIN)
    try:
      with open(readme, encoding="utf-8") as f:
        has_block = marker in f.read()
    except OSError as error:
      raise ValueError(f"readme={readme!r} cannot be read "
                       f"({error.strerror}).") from None
    if not has_block:
      raise ValueError(f"readme={readme!r} has no generated block to fill "
                       f"(no {marker!r} line).")
  publish = config.get("publish")
  if publish and os.path.exists(publish) and not os.path.isdir(publish):
    raise ValueError(f"publish={publish!r} is a file; it must be a folder.")


def part_args(part: str, preset: str, workdir: str,
              data_dir: str | None, seeds: tuple[int, ...] = ()
              ) -> list[str]:
  """``[module, *args]`` of one part's entry point (``seeds``: replaces the
  preset's seeds)."""
  args = [f"--workdir={workdir}",
          f"--config=experiments/configs/{part}.py:{preset}"]
  if data_dir:
    args.append(f"--data_dir={data_dir}")
  if seeds:
    args.append(f"--config.seeds=({','.join(map(str, seeds))},)")
  return [f"experiments.{part}", *args]


def part_command(part: str, preset: str, workdir: str, data_dir: str | None,
                 mock_data: int = 0, seeds: tuple[int, ...] = ()
                 ) -> list[str]:
  """The full command line (argv) of one part."""
  module_args = part_args(part, preset, workdir, data_dir, seeds)
  if mock_data:
    return [sys.executable, "-m", "experiments.mock_run", str(mock_data),
            *module_args]
  return [sys.executable, "-m", *module_args]


def config_digest(part: str, preset: str) -> str | None:
  """SHA-256 of a part's resolved preset: ``get_config(preset)`` of its
  config file, as sorted JSON. An edit to the file or to a default it
  imports (``sweep.default_config``, ``settings``) changes it, so the part
  reruns (reusing the cells the edit leaves valid; markers written before
  2026-12-07 digested the file, so every part reruns once after that).
  None, said in one line, when the config cannot be loaded here: the part
  then runs, and fails with the reason."""
  path = os.path.join(ROOT, "experiments", "configs", f"{part}.py")
  try:
    spec = importlib.util.spec_from_file_location(f"_config_{part}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    resolved = harness.jsonable(module.get_config(preset).to_dict())
  except Exception as error:  # pylint: disable=broad-except
    print(f"[reproduce] {part}: its config {path}:{preset} does not load "
          f"here ({type(error).__name__}: {error}); the part runs (and "
          "reports why it fails, if it does).", flush=True)
    return None
  text = json.dumps(resolved, sort_keys=True)
  return hashlib.sha256(text.encode()).hexdigest()


def _display(cmd: list[str]) -> str:
  """The command as a user would type it (``python`` for the interpreter)."""
  return " ".join(["python"] + [shlex.quote(c) for c in cmd[1:]])


def die_with_parent() -> None:
  """In a part's process before it starts (Linux): SIGTERM when reproduce
  dies. A reproduce killed with SIGKILL otherwise leaves its part running,
  and rerunning reproduce would start a second run on the same folder.
  Elsewhere a no-op."""
  if not sys.platform.startswith("linux"):
    return
  import ctypes  # pylint: disable=g-import-not-at-top
  import signal  # pylint: disable=g-import-not-at-top
  try:
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # DEATHSIG
  except (OSError, AttributeError):
    pass  # A libc without prctl: the part then outlives a killed reproduce.


def run_parts(preset: str, workdir: str, data_dir: str | None,
              parts: list[str], mock_data: int = 0,
              seeds: tuple[int, ...] = ()) -> dict[str, dict]:
  """Runs the parts (skipping finished ones); returns per-part run records."""
  os.makedirs(workdir, exist_ok=True)
  runs = storage.read_json(os.path.join(workdir, "reproduce.json"), {}) or {}
  start = time.perf_counter()
  todo = [p for p in PART_ORDER if p in parts]
  for i, part in enumerate(todo):
    sub = os.path.join(workdir, part)
    cmd = part_command(part, preset, sub, data_dir, mock_data, seeds)
    shown = _display(cmd)
    marker = os.path.join(sub, "PART_DONE.json")
    done = storage.read_json(marker)
    digest = config_digest(part, preset)
    if (done and digest and done.get("command") == shown
        and done.get("config_digest") == digest
        and done.get("key_scheme") == harness.KEY_SCHEME):
      runs[part] = {**done, "status": "done (reused)"}
      print(f"[reproduce] {i + 1}/{len(todo)} {part}: finished earlier "
            f"({done['seconds']:.0f}s), reused", flush=True)
      continue
    known = MEASURED_SECONDS.get(preset, {})
    eta = (f"ETA ~{sum(known[p] for p in todo[i:]):.0f}s (from an earlier "
           "run)" if all(p in known for p in todo[i:]) else "ETA unknown")
    print(f"[reproduce] {i + 1}/{len(todo)} {part}: {shown}\n"
          f"[reproduce] elapsed {time.perf_counter() - start:.0f}s, {eta}",
          flush=True)
    os.makedirs(sub, exist_ok=True)
    # The old marker goes first: a rerun that fails must not leave (or
    # publish) a record of the earlier, other command as this part's.
    if done is not None:
      os.remove(marker)
    t0 = time.perf_counter()
    rc = subprocess.call(cmd, cwd=ROOT, preexec_fn=die_with_parent)
    seconds = time.perf_counter() - t0
    record = {"command": shown, "config_digest": digest,
              "key_scheme": harness.KEY_SCHEME, "seconds": seconds,
              "returncode": rc,
              "status": "done" if rc == 0 else f"FAILED (exit {rc})"}
    runs[part] = record
    if rc == 0:
      storage.write_json(marker, record)
    storage.write_json(os.path.join(workdir, "reproduce.json"), runs)
    print(f"[reproduce] {part}: {record['status']} in {seconds:.0f}s",
          flush=True)
  return runs


def run(config: Any, workdir: str) -> dict[str, Any]:
  """Runs (or resumes) the parts and writes ``workdir/REPORT.md``.

  Args:
    config: ``preset``, ``parts`` (comma-separated or a sequence),
      ``mock_data`` (tests: run every part under tfds mock data with this
      many examples per split; 0 = off), ``report_only``, ``data_dir``,
      ``publish`` (a folder receiving the deliverables and the report,
      :func:`repdef_jax.paper.report.publish`), ``readme`` (a README whose
      generated results block is refreshed from the published folder),
      ``seeds`` (comma-separated: every part runs with these seeds instead
      of its preset's), ``compare_with`` (a published results folder: the
      run's claims are compared with its claims,
      :mod:`repdef_jax.paper.replication`, into REPLICATION.md).
    workdir: output folder.

  Returns:
    ``{'report': path, 'runs': {part: record}, 'failed': [parts],
    'replication': comparison or None}``.

  Raises:
    ValueError: unknown preset or parts, bad seeds, or a ``compare_with``
      folder without results.
  """
  if config.preset not in PRESETS:
    raise ValueError(f"unknown preset {config.preset!r}; use one of "
                     f"{', '.join(PRESETS)}.")
  parts = config.parts
  parts = [p for p in (parts.split(",") if isinstance(parts, str) else parts)
           if p]
  unknown = set(parts) - set(PART_ORDER)
  if unknown:
    raise ValueError(f"unknown parts {sorted(unknown)}; valid: "
                     f"{', '.join(PART_ORDER)}.")
  seeds = parse_seeds(config.get("seeds", ""))
  mock = config.get("mock_data", 0)
  if isinstance(mock, bool) or not isinstance(mock, int) or mock < 0:
    raise ValueError(f"mock_data must be an int >= 0 (examples per split "
                     f"of tfds mock data; 0 = real data), got {mock!r}.")
  _check_outputs(config)
  if config.get("compare_with"):
    replication.load_reference(config.compare_with)  # Fails before running.
    if config.get("publish") and (os.path.abspath(config.publish) ==
                                  os.path.abspath(config.compare_with)):
      raise ValueError("publish must differ from compare_with (publishing "
                       "would overwrite the reference's results).")
  workdir = os.path.abspath(workdir)
  # The parts run in the project root: a relative data_dir is the caller's.
  data_dir = os.path.abspath(config.data_dir) if config.data_dir else None
  if config.report_only:
    runs = storage.read_json(os.path.join(workdir, "reproduce.json"), {})
  else:
    runs = run_parts(config.preset, workdir, data_dir, parts,
                     config.mock_data, seeds)
  path = report.write_report(workdir, runs=runs, preset=config.preset)
  if config.get("publish"):
    path = report.publish(workdir, config.publish, preset=config.preset)
  dest = config.get("publish") or workdir
  replica = None
  if config.get("compare_with"):
    # The published folder, not the workdir: it may keep parts run elsewhere.
    replica = replication.write(config.compare_with, dest)
    if config.get("readme"):  # A replica fills only its own README block.
      replication.update_readme(config.readme, dest)
  elif config.get("readme"):
    report.update_readme(config.readme, dest)
  failed = [p for p, r in runs.items()
            if str(r.get("status", "")).startswith("FAILED")]
  return {"report": path, "runs": runs, "failed": failed,
          "replication": replica}


def summary(result: dict[str, Any], workdir: str) -> None:
  """Prints where the report is; exits 1 when a part failed."""
  del workdir
  total = sum(float(r.get("seconds") or 0) for r in result["runs"].values())
  print(f"[reproduce] wrote {result['report']}; parts' wall time "
        f"{total:.0f}s")
  if result.get("replication"):
    counts = result["replication"]["counts"]
    print("[reproduce] replication: " + ", ".join(
        f"{k} {v}" for k, v in sorted(counts.items())))
  if result["failed"]:
    print(f"[reproduce] FAILED parts: {', '.join(result['failed'])}")
    sys.exit(1)
