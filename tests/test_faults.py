"""Faults: killed runs resume without loss; divergence is detected and recorded.

A kill is simulated by making a file-system call (``os.replace`` or the JSON
write) raise in the middle of a run; the same command is then run again and
compared with an uninterrupted run. After every kill the result file must
parse, hold only finished items, and no temporary file may remain.

Covered: the main job (``experiments.attack.run``) and FedAvg training
(``repdef_jax.training.train_and_evaluate``). Divergence and failures:
FedAvg stops at the first non-finite round
(``diverged_at_round``), and the main job records an image whose attack
raises (an ``error`` entry) and goes on.
"""

import json
import os
import sys

import jax
import ml_collections
import numpy as np
import pytest

from repdef_jax import training

_ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
if _ROOT not in sys.path:
  sys.path.insert(0, _ROOT)
from repdef_jax.paper import harness  # pylint: disable=g-import-not-at-top,wrong-import-position
from repdef_jax.paper import main_job as attack_main  # pylint: disable=g-import-not-at-top,wrong-import-position


class Killed(BaseException):
  """Stands for SIGKILL: not an Exception, so no handler swallows it."""


def _temp_files(folder):
  return [f for f in os.listdir(folder)
          if f.endswith(".tmp") or f.startswith(".tmp") or ".tmp." in f]


# --------------------------------------------------------------------------
# Main job.

MAIN = {"dataset": "mnist", "model": "logreg", "attack": "gs",
        "defense": "soteria", "strength": 60.0, "num_images": 3,
        "iterations": 2, "seed": 0}


def _no_seconds(images):
  return [{**e, **{p: {k: v for k, v in e[p].items() if k != "seconds"}
                   for p in ("undefended", "defended")}} for e in images]


def _read(workdir):
  with open(os.path.join(workdir, "results.json")) as f:
    return json.load(f)


@pytest.mark.parametrize("kill_at", ["replace", "json_dump"])
def test_main_job_killed_at_every_write_resumes_without_loss(
    mock_env, monkeypatch, kill_at):
  reference = attack_main.run(MAIN, str(mock_env / "ref"), verbose=False)
  workdir = str(mock_env / "run")
  real_replace, real_dump = os.replace, json.dump
  # Kill at the 1st write, restart and kill at the restart's 2nd write (and,
  # for os.replace, which also lands each reconstruction, the 3rd), then
  # finish: kills before the first result file and between images.
  for kill_index in (1, 2, 3) if kill_at == "replace" else (1, 2):
    calls = []

    def dying_replace(src, dst, calls=calls, kill_index=kill_index):
      calls.append(dst)
      if len(calls) == kill_index:
        raise Killed()
      return real_replace(src, dst)

    def dying_dump(obj, f, calls=calls, kill_index=kill_index, **kw):
      calls.append(f)
      if len(calls) == kill_index:
        f.write(json.dumps(obj)[:20])  # A torn temporary file.
        raise Killed()
      return real_dump(obj, f, **kw)

    if kill_at == "replace":
      monkeypatch.setattr(attack_main.os, "replace", dying_replace)
    else:
      monkeypatch.setattr(json, "dump", dying_dump)
    before = (_read(workdir)["images"]
              if os.path.exists(os.path.join(workdir, "results.json")) else [])
    with pytest.raises(Killed):
      attack_main.run(MAIN, workdir, verbose=False)
    monkeypatch.setattr(attack_main.os, "replace", real_replace)
    monkeypatch.setattr(json, "dump", real_dump)
    # Nothing half-written, nothing finished lost, no temporary file left:
    # the run recorded one more image per results.json write that landed
    # (os.replace also lands each image's reconstruction, before its
    # record), then died mid-write.
    assert not _temp_files(workdir)
    path = os.path.join(workdir, "results.json")
    after = _read(workdir)["images"] if os.path.exists(path) else []
    assert after[:len(before)] == before  # Finished entries kept as they were.
    landed = [c for c in calls[:-1]
              if kill_at == "json_dump" or str(c).endswith("results.json")]
    assert len(after) == len(before) + len(landed)
  final = attack_main.run(MAIN, workdir, verbose=False)
  assert not _temp_files(workdir)
  assert _no_seconds(final["images"]) == _no_seconds(reference["images"])
  assert _read(workdir) == json.loads(json.dumps(final))


def test_main_job_resume_keeps_finished_images_untouched(mock_env,
                                                         monkeypatch):
  workdir = str(mock_env / "run")
  first = attack_main.run({**MAIN, "num_images": 3}, workdir, verbose=False)
  calls = []
  real = attack_main.attack_image

  def counting(*args, **kwargs):
    calls.append(1)
    return real(*args, **kwargs)

  monkeypatch.setattr(attack_main, "attack_image", counting)
  again = attack_main.run({**MAIN, "num_images": 3}, workdir, verbose=False)
  assert not calls  # Nothing recomputed.
  assert again["images"] == first["images"]  # Including 'seconds'.


def test_main_job_records_diverged_attack_and_goes_on(mock_env, monkeypatch):
  """A diverging DLG: every image recorded diverged=True, run completes
  (the paper's L-BFGS rule: a line search would reject the bad steps)."""
  monkeypatch.setattr(
      harness, "attack_overrides",
      lambda attack, iterations=None, restarts=None: {
          "outer_steps": 2, "inner_steps": 2, "max_abs_pixel": 1e-3})
  workdir = str(mock_env / "div")
  res = attack_main.run({**MAIN, "attack": "dlg", "num_images": 2,
                         "dlg_optimizer": "torch"}, workdir, verbose=False)
  assert len(res["images"]) == 2
  for e in res["images"]:
    assert e["undefended"]["diverged"] is True
    assert e["defended"]["diverged"] is True
  assert _read(workdir)["images"] == res["images"]


def test_main_job_records_failing_image_and_goes_on(mock_env, monkeypatch):
  real = attack_main.attack_image
  seen = []

  workdir = str(mock_env / "f")
  on_disk = []

  def failing_first(*args, **kwargs):
    seen.append(1)
    if len(seen) == 1:
      raise ValueError("shared_grads holds NaN or inf at ['head']['kernel'].")
    on_disk.append(_read(workdir)["images"])  # What a kill now would keep.
    return real(*args, **kwargs)

  monkeypatch.setattr(attack_main, "attack_image", failing_first)
  res = attack_main.run({**MAIN, "num_images": 2}, workdir, verbose=False)
  assert len(res["images"]) == 2
  assert "error" in res["images"][0]
  # The error entry is a finished item: on disk before the next image starts.
  assert on_disk == [res["images"][:1]]
  assert _read(workdir)["images"] == res["images"]


# --------------------------------------------------------------------------
# FedAvg training.


def _config(**overrides):
  c = training.default_config()
  c.update({"dataset": "mnist", "model": "logreg", "partition": "noniid",
            "num_clients": 4, "classes_per_client": 2, "samples_per_class": 3,
            "rounds": 4, "clients_per_round": 2, "local_steps": 2,
            "batch_size": 3, "client_lr": 0.1, "l2": 1e-3,
            "checkpoint_every": 2, "max_test_examples": 40,
            "eval_batch": 20, "plot": False})
  c.update(overrides)
  return c


def _train(config, workdir, data_dir):
  config = ml_collections.ConfigDict(config.to_dict())
  config.data_dir = str(data_dir)
  return training.train_and_evaluate(config, str(workdir))


def _files(workdir):
  """Every file's bytes, the checkpoint folder's entries and each checkpoint's
  arrays (orbax's own metadata files carry timestamps)."""
  out = {n: open(os.path.join(workdir, n), "rb").read()
         for n in sorted(os.listdir(workdir))
         if not n.endswith(".png") and n != training.CHECKPOINT_DIR}
  folder = os.path.join(workdir, training.CHECKPOINT_DIR)
  if os.path.isdir(folder):
    out[training.CHECKPOINT_DIR] = {
        n: [a.tobytes() for a in jax.tree_util.tree_leaves(
            training.load_checkpoint(str(workdir), int(n)))]
        if n.isdigit() else None for n in sorted(os.listdir(folder))}
  return out


def test_training_killed_twice_including_during_resume(mock_env,
                                                       monkeypatch):
  """Killed after round 3, then killed again while resuming, then finished."""
  data_dir = mock_env / "data"
  _train(_config(), mock_env / "ref", data_dir)
  reference = _files(mock_env / "ref")
  workdir = mock_env / "run"

  real_append = training._append_line  # pylint: disable=protected-access

  def append_then_die(path, record):
    real_append(path, record)
    if record["round"] == 3:
      raise Killed()

  monkeypatch.setattr(training, "_append_line", append_then_die)
  with pytest.raises(Killed):
    _train(_config(), workdir, data_dir)
  monkeypatch.setattr(training, "_append_line", real_append)
  assert not _temp_files(workdir)
  assert [r["round"] for r in training.read_metrics(str(workdir))] == [1, 2, 3]

  # Killed while the resume rewrites metrics.jsonl (drops round 3).
  real_replace = os.replace

  def dying_replace(src, dst):
    if dst.endswith(training.METRICS_FILE):
      raise Killed()
    return real_replace(src, dst)

  monkeypatch.setattr(training.os, "replace", dying_replace)
  with pytest.raises(Killed):
    _train(_config(), workdir, data_dir)
  monkeypatch.setattr(training.os, "replace", real_replace)
  assert not _temp_files(workdir)
  assert [r["round"] for r in training.read_metrics(str(workdir))] == [1, 2, 3]

  # The last start resumes from the round-2 checkpoint: it runs (and
  # appends) rounds 3 and 4 only.
  appended = []

  def recording_append(path, record):
    appended.append(record["round"])
    real_append(path, record)

  monkeypatch.setattr(training, "_append_line", recording_append)
  _train(_config(), workdir, data_dir)
  assert appended == [3, 4]
  assert not _temp_files(workdir)
  assert _files(workdir) == reference


def _poison_data(monkeypatch):
  """Every client's first image becomes NaN (a corrupt input file)."""
  real = training.build_data

  def poisoned(config, **kwargs):
    clients, *rest = real(config, **kwargs)
    x = np.array(clients.x)
    x[:, 0] = np.nan
    return (clients.replace(x=x), *rest)

  monkeypatch.setattr(training, "build_data", poisoned)


def test_training_nan_is_recorded_in_metrics(mock_env, monkeypatch):
  """A NaN loss is written as NaN (flagged finite=false) in metrics.jsonl,
  and training stops at that round instead of going on to the last one."""
  _poison_data(monkeypatch)
  out = _train(_config(), mock_env / "nan", mock_env / "data")
  losses = [r["train_loss"] for r in out["metrics"]]
  assert len(losses) == out["diverged_at_round"] < 4
  assert not np.all(np.isfinite(losses))
  with open(mock_env / "nan" / training.METRICS_FILE) as f:
    assert any("NaN" in line or "Infinity" in line for line in f)


def test_training_nan_is_detected_and_run_stops_cleanly(mock_env,
                                                        monkeypatch):
  _poison_data(monkeypatch)
  out = _train(_config(), mock_env / "nan", mock_env / "data")
  assert out.get("diverged_at_round") is not None
  assert out["metrics"][-1].get("finite") is False


def test_training_stops_at_non_finite_params_keeps_finite_checkpoint(
    mock_env):
  """Parameters that overflow while the loss is still finite stop the run.

  With one local step and l2 = 1e30, logreg (zero logits at init: round 1's
  loss is ln 10) takes an ordinary first step; round 2's step scales the
  weights by about -l2 * lr = -1e29 (still finite), and round 3's step
  overflows them to inf while its loss, taken before the step, is finite.
  Round 3 must be flagged non-finite from the parameters alone, the run
  stops there, and the latest checkpoint is round 2's finite one (none of
  the diverged round).
  """
  workdir = mock_env / "blowup"
  out = _train(_config(local_steps=1, l2=1e30, checkpoint_every=1), workdir,
               mock_env / "data")
  *before, last = out["metrics"]
  assert out["diverged_at_round"] == last["round"] == 3
  assert np.isfinite(last["train_loss"])  # The loss alone would miss it.
  assert last["finite"] is False
  assert [r["finite"] for r in before] == [True, True]
  assert not all(np.all(np.isfinite(leaf)) for leaf in
                 jax.tree_util.tree_leaves(out["state"].params))
  checkpoint = training.load_checkpoint(str(workdir))
  assert int(checkpoint["round"]) == 2
  assert all(np.all(np.isfinite(leaf)) for leaf in
             jax.tree_util.tree_leaves(checkpoint["params"]))


# --------------------------------------------------------------------------
# Benchmark outputs.


def test_benchmark_report_renders_and_is_written_atomically(tmp_path,
                                                            monkeypatch):
  from experiments.benchmarks import driver  # pylint: disable=g-import-not-at-top
  from repdef_jax import storage  # pylint: disable=g-import-not-at-top

  ours = {"seconds": 2.0, "compile_seconds": 5.0,
          "memory": {"total": 5.0, "temp": 4.0}}
  rows = [driver._row("attack", "DLG", "LeNet", ours, "torch 2 threads",  # pylint: disable=protected-access
                      {"seconds": 4.0}, 3.0, 8e9, 100.0),
          driver._row("fedavg", "plain FedAvg round", "LeNet", ours,  # pylint: disable=protected-access
                      "torch 2 threads", None, 1.5, None, 100.0,
                      "torch not installed: no peer")]
  assert rows[0]["ratio"] == 2.0 and rows[0]["target"] == 3.0
  assert rows[0]["met"] is False
  assert rows[0]["ours_gflops"] == 4.0 and rows[0]["peer_gflops"] == 2.0
  assert rows[0]["ours_peak_fraction"] == 0.04
  assert rows[1]["ratio"] is None and rows[1]["met"] is None
  report = {"machine": {"cpu": "Test CPU", "cores": 2, "backend": "cpu",
                        "devices": ["cpu:0"], "jax": "x",
                        "load_average": [1.0, 2.0, 3.0]},
            "settings": {"quick": True}, "rows": rows}
  md = driver.render_markdown(report)
  assert "Machine: Test CPU, 2 cores" in md
  assert "| 2.00x | >= 3.00x | no |" in md
  assert "| 4.00 (4.0 %) | 2.00 (2.0 %) |" in md
  assert "Targets met: 0 of 1" in md
  # A kill while replacing BENCHMARKS.md keeps the old file, no temp left.
  path = tmp_path / "BENCHMARKS.md"
  storage.write_text(str(path), "old\n")

  def dying_replace(src, dst):
    raise Killed()

  monkeypatch.setattr(storage.os, "replace", dying_replace)
  with pytest.raises(Killed):
    storage.write_text(str(path), md)
  monkeypatch.undo()
  assert path.read_text() == "old\n"
  assert os.listdir(tmp_path) == ["BENCHMARKS.md"]
