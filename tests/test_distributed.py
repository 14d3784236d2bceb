"""Multi-process FedAvg: two processes on localhost (gloo CPU collectives).

Each process forces 4 CPU devices, so the client mesh spans 8 devices over
2 processes; tests/distributed_check.py is one process of the run. Compared
with one process holding 8 devices, and with a run whose processes are
killed (SIGKILL) in the middle and started again.
"""

import json
import os
import signal
import socket
import subprocess
import sys
import time

import jax
import numpy as np
import pytest

from repdef_jax import distributed
from repdef_jax import training

_SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                       "distributed_check.py")


def _free_port():
  with socket.socket() as s:
    s.bind(("localhost", 0))
    return s.getsockname()[1]


def _start(workdir, num_processes, env, pace=0.0):
  coordinator = f"localhost:{_free_port()}"
  return [subprocess.Popen(
      [sys.executable, _SCRIPT, str(workdir), str(num_processes), str(i),
       coordinator, str(pace)], env=env, stdout=subprocess.PIPE,
      stderr=subprocess.STDOUT, text=True) for i in range(num_processes)]


def _finish(procs, timeout=600):
  outs = []
  for p in procs:
    out, _ = p.communicate(timeout=timeout)
    outs.append(out)
  for p, out in zip(procs, outs):
    assert p.returncode == 0, out[-3000:]
  return outs


def _env(child_env, tmp_path):
  env = child_env(REPDEF_JAX_CACHE=str(tmp_path / "data_cache"))
  env.pop("TFDS_DATA_DIR", None)
  return env


def _metrics(workdir):
  return [json.loads(line) for line in
          open(os.path.join(workdir, training.METRICS_FILE))]


def _leaves(workdir, step=None):
  return jax.tree_util.tree_leaves(training.load_checkpoint(str(workdir), step))


def test_two_processes_equal_one_process_with_eight_devices(child_env,
                                                            tmp_path):
  env = _env(child_env, tmp_path)
  two = _start(tmp_path / "two", 2, env)
  one = _start(tmp_path / "one", 1, env)
  outs = _finish(two + one)
  # Only process 0 logs rounds, reports and writes files.
  assert "round 8/8" in outs[0] and "test accuracy" in outs[0]
  assert "round" not in outs[1] and "DONE 1" in outs[1]
  assert sorted(os.listdir(tmp_path / "two")) == [
      "checkpoints", "config.json", "data.json", "metrics.jsonl"]
  assert sorted(os.listdir(tmp_path / "two" / "checkpoints")) == [
      "4", "6", "8"]
  a, b = _leaves(tmp_path / "two"), _leaves(tmp_path / "one")
  assert int(a[-1]) == int(b[-1]) == 8  # round
  diff = float(np.max([np.max(np.abs(x - y)) for x, y in zip(a, b)]))
  assert diff <= 1e-6, diff
  m2, m1 = _metrics(tmp_path / "two"), _metrics(tmp_path / "one")
  assert [r["round"] for r in m2] == list(range(1, 9))
  for r2, r1 in zip(m2, m1):
    assert r2["client_ids"] == r1["client_ids"]
    assert r2["weights"] == r1["weights"]
    assert abs(r2["train_loss"] - r1["train_loss"]) <= 1e-6
    assert abs(r2["test_accuracy"] - r1["test_accuracy"]) <= 1e-6


@pytest.mark.slow
def test_two_processes_killed_mid_run_resume_to_the_same_result(
    child_env, tmp_path):
  env = _env(child_env, tmp_path)
  _finish(_start(tmp_path / "ref", 2, env))
  workdir = tmp_path / "run"
  procs = _start(workdir, 2, env, pace=0.5)
  # Kill both once round 3 is logged and checkpoint 2 is complete.
  deadline = time.time() + 600
  while time.time() < deadline:
    path = workdir / training.METRICS_FILE
    rounds = len(training.read_metrics(str(workdir))) if path.exists() else 0
    if rounds >= 3 and (workdir / "checkpoints" / "2").exists():
      break
    assert all(p.poll() is None for p in procs), "a process ended early"
    time.sleep(0.05)
  for p in procs:
    p.send_signal(signal.SIGKILL)
  for p in procs:
    p.communicate()
  assert len(training.read_metrics(str(workdir))) < 8  # Killed mid-run.
  outs = _finish(_start(workdir, 2, env))
  first = [l for l in outs[0].splitlines() if l.startswith("round ")][0]
  assert not first.startswith(("round 1/", "round 2/")), first  # Resumed.
  ref, run = tmp_path / "ref", workdir
  assert (run / training.METRICS_FILE).read_bytes() == (
      ref / training.METRICS_FILE).read_bytes()
  assert sorted(os.listdir(run / "checkpoints")) == sorted(
      os.listdir(ref / "checkpoints"))
  for step in (4, 6, 8):
    assert all(np.array_equal(x, y) for x, y in zip(
        _leaves(run, step), _leaves(ref, step)))


def test_cluster_environment_detection(monkeypatch):
  for var in ("JAX_COORDINATOR_ADDRESS", "SLURM_STEP_NODELIST", "SLURM_NTASKS",
              "OMPI_MCA_orte_hnp_uri", "OMPI_COMM_WORLD_SIZE",
              "TPU_WORKER_HOSTNAMES"):
    monkeypatch.delenv(var, raising=False)
  assert distributed.cluster_environment() is None
  monkeypatch.setenv("SLURM_STEP_NODELIST", "node[1-2]")
  monkeypatch.setenv("SLURM_NTASKS", "1")
  assert distributed.cluster_environment() is None  # One task: one process.
  monkeypatch.setenv("SLURM_NTASKS", "2")
  assert distributed.cluster_environment() == "slurm"
  monkeypatch.delenv("SLURM_STEP_NODELIST")
  monkeypatch.setenv("OMPI_MCA_orte_hnp_uri", "123;tcp://10.0.0.1:5000")
  monkeypatch.setenv("OMPI_COMM_WORLD_SIZE", "4")
  assert distributed.cluster_environment() == "ompi"
  monkeypatch.setenv("OMPI_COMM_WORLD_SIZE", "1")
  assert distributed.cluster_environment() is None  # One Open MPI process.
  monkeypatch.delenv("OMPI_MCA_orte_hnp_uri")
  monkeypatch.setenv("TPU_WORKER_HOSTNAMES", "t0")
  assert distributed.cluster_environment() is None  # A single-host TPU.
  monkeypatch.setenv("TPU_WORKER_HOSTNAMES", "t0,t1")
  assert distributed.cluster_environment() == "tpu"
  monkeypatch.delenv("TPU_WORKER_HOSTNAMES")
  monkeypatch.setenv("JAX_COORDINATOR_ADDRESS", "10.0.0.1:1234")
  # The address alone is no cluster: JAX needs the count and id.
  assert distributed.cluster_environment() is None


def test_coordinator_address_from_the_environment(monkeypatch):
  """$JAX_COORDINATOR_ADDRESS stands in for the address; without a process
  count it stops with an error that asks for one; with a bad id the
  settings' own check names it."""
  monkeypatch.setenv("JAX_COORDINATOR_ADDRESS", "localhost:1")
  with pytest.raises(ValueError, match="give num_processes and process_id"):
    distributed.initialize()
  with pytest.raises(ValueError, match=r"process_id must be in"):
    distributed.initialize(num_processes=2, process_id=2)


@pytest.mark.parametrize("kwargs, match", [
    (dict(num_processes=2), "needs coordinator_address"),
    (dict(coordinator_address="localhost", num_processes=2), "host:port"),
    (dict(coordinator_address="localhost:1", num_processes=2, process_id=2),
     r"process_id must be in \[0, num_processes\)"),
    (dict(coordinator_address="localhost:1", num_processes=2, process_id=-1),
     r"process_id must be in \[0, num_processes\)"),
])
def test_bad_distributed_settings_fail_clearly(kwargs, match):
  with pytest.raises(ValueError, match=match):
    distributed.initialize(**kwargs)


def _clear(monkeypatch):
  for var in ("JAX_COORDINATOR_ADDRESS", "SLURM_STEP_NODELIST", "SLURM_NTASKS",
              "OMPI_MCA_orte_hnp_uri", "OMPI_COMM_WORLD_SIZE",
              "TPU_WORKER_HOSTNAMES"):
    monkeypatch.delenv(var, raising=False)


def test_cluster_without_a_process_count_is_one_process(monkeypatch):
  """A SLURM step or Open MPI job that does not say how many processes it
  has is a one-process run (starting jax.distributed there would wait for
  processes that never come)."""
  _clear(monkeypatch)
  monkeypatch.setenv("SLURM_STEP_NODELIST", "node1")
  assert distributed.cluster_environment() is None
  monkeypatch.delenv("SLURM_STEP_NODELIST")
  monkeypatch.setenv("OMPI_MCA_orte_hnp_uri", "123;tcp://10.0.0.1:5000")
  assert distributed.cluster_environment() is None


def test_single_process_initialize_is_not_multi_process(monkeypatch):
  _clear(monkeypatch)
  assert distributed.initialize() is False


def test_only_process_zero_is_primary(monkeypatch):
  monkeypatch.setattr(jax, "process_index", lambda: 1)
  assert distributed.is_primary() is False
  monkeypatch.setattr(jax, "process_index", lambda: 0)
  assert distributed.is_primary() is True
