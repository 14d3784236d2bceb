"""Shared pytest setup: CPU, quiet logs, cheaper compilation (a per-run
cache, XLA optimisation level 1, XLA's older CPU fusion emitters) and the
tfds mock-data fixture."""

import atexit
import os
import shutil
import subprocess
import sys
import tempfile

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
# No test downloads a dataset (tests/test_download.py serves its own mirror).
os.environ.setdefault("REPDEF_JAX_OFFLINE", "1")
# One persistent compilation cache per test run, fresh and shared by the
# xdist workers and the subprocesses they start (they inherit the
# environment): tests that build the same program in separate closures or
# processes compile it once. Nothing in a user's ~/.cache is read, neither
# compiled programs nor dataset caches, so a run here starts as cold as on a
# clean CI machine.
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
  _RUN_DIR = tempfile.mkdtemp(prefix="repdef_jax_tests_")
  atexit.register(shutil.rmtree, _RUN_DIR, ignore_errors=True)
  _XLA_DIR = os.path.join(_RUN_DIR, "xla")
  os.makedirs(_XLA_DIR)
  os.environ["JAX_COMPILATION_CACHE_DIR"] = _XLA_DIR
  os.environ["REPDEF_JAX_COMPILATION_CACHE"] = _XLA_DIR
  os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"
  os.environ["JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES"] = "0"
  os.environ.setdefault("REPDEF_JAX_CACHE", os.path.join(_RUN_DIR, "data"))

# XLA compiles at optimisation level 1 here, not its default 3, and with its
# older CPU fusion emitters: compilation is most of the suite's time, and the
# two take a fifth each off the suite with the same outcomes (README.md,
# "Tests"). Settings already in XLA_FLAGS are kept; subprocesses inherit them.
_LEVEL = "--xla_backend_optimization_level"
_EMITTERS = "--xla_cpu_use_fusion_emitters"


def _xla_accepts(flag):
  """Whether this jaxlib's XLA starts with ``flag``: it aborts on a flag it
  does not know (one an older or newer XLA lacks). A subprocess, ~2 s."""
  env = dict(os.environ, XLA_FLAGS=flag, JAX_PLATFORMS="cpu")
  return subprocess.run(
      [sys.executable, "-c", "import jax; jax.devices()"], env=env,
      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
      check=False).returncode == 0


_flags = os.environ.get("XLA_FLAGS", "")
_extra = [] if _LEVEL in _flags else [f"{_LEVEL}=1"]
if _EMITTERS not in _flags and _xla_accepts(f"{_EMITTERS}=false"):
  _extra.append(f"{_EMITTERS}=false")
if _extra:
  os.environ["XLA_FLAGS"] = " ".join(filter(None, [_flags, *_extra]))

import pytest  # noqa: E402


@pytest.fixture()
def mock_env(request, tmp_path, monkeypatch):
  """tfds mock data (``NUM_MOCK`` examples per split, default 120) with a
  fresh repdef_jax data cache under ``tmp_path``; yields ``tmp_path``."""
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
  from repdef_jax import data  # pylint: disable=g-import-not-at-top
  monkeypatch.setenv("REPDEF_JAX_CACHE", str(tmp_path / "cache"))
  monkeypatch.delenv("TFDS_DATA_DIR", raising=False)
  data.clear_cache()
  with tfds.testing.mock_data(
      num_examples=getattr(request.module, "NUM_MOCK", 120)):
    yield tmp_path
  data.clear_cache()


@pytest.fixture()
def child_env():
  """``make(**env_vars)``: this environment for a child Python process on
  the CPU, with this checkout's repdef_jax first on ``PYTHONPATH`` (not
  whichever one the venv installed) and no CPU device count (neither the
  XLA flag nor ``REPDEF_JAX_CPU_DEVICES``; other XLA flags kept), updated
  with ``env_vars``."""
  from repdef_jax import host  # pylint: disable=g-import-not-at-top
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

  def make(**env_vars):
    env = {k: v for k, v in os.environ.items() if k != host.ENV}
    env["PYTHONPATH"] = os.pathsep.join(
        filter(None, [root, env.get("PYTHONPATH")]))
    env["XLA_FLAGS"] = " ".join(f for f in env.get("XLA_FLAGS", "").split()
                                if "device_count" not in f)
    env.update(JAX_PLATFORMS="cpu", **env_vars)
    return env

  return make


@pytest.fixture()
def t_interval():
  """``f(values) -> (mean, low, high)``: the mean and 95 % Student-t
  interval of ``values``, a SciPy reference for the library's intervals."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  from scipy import stats  # pylint: disable=g-import-not-at-top

  def f(values):
    v = np.asarray(values, np.float64)
    half = stats.t.ppf(0.975, v.size - 1) * v.std(ddof=1) / np.sqrt(v.size)
    return v.mean(), v.mean() - half, v.mean() + half

  return f
