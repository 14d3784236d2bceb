"""CPU devices on request (repdef_jax.host) and the auto client mesh."""

import json
import os
import re
import subprocess
import sys
import types

import jax
from jax._src import xla_bridge
import pytest

from repdef_jax import fedavg
from repdef_jax import host

_PROBE = ("import json, jax, repdef_jax; from repdef_jax import fedavg; "
          "ms = [fedavg.client_mesh('auto', k) for k in (10, 2)]; "
          "print(json.dumps([jax.device_count()] + "
          "[None if m is None else m.size for m in ms]))")


def _probe(child_env, **env_vars):
  out = subprocess.run([sys.executable, "-c", _PROBE],
                       env=child_env(**env_vars),
                       capture_output=True, text=True, timeout=120,
                       check=False)
  assert out.returncode == 0, out.stderr[-2000:]
  return json.loads(out.stdout.strip().splitlines()[-1])


def test_cpu_devices_on_request_give_a_client_mesh(child_env):
  # The mesh spans min(devices, clients): 3 devices, 10 or 2 clients.
  assert _probe(child_env, **{host.ENV: "3"}) == [3, 3, 2]
  cores = host.usable_cores()
  assert _probe(child_env, **{host.ENV: "0"}) == [
      cores, None if cores < 2 else min(cores, 10),
      None if cores < 2 else 2]


def test_one_device_by_default_and_user_settings_kept(child_env):
  assert _probe(child_env) == [1, None, None]
  assert _probe(child_env, **{host.ENV: "1"}) == [1, None, None]
  assert _probe(
      child_env, XLA_FLAGS="--xla_force_host_platform_device_count=4") == [
      4, 4, 2]


@pytest.mark.parametrize("value", ["two", "-1", "1.5"])
def test_bad_device_count_is_a_one_line_error(monkeypatch, value):
  monkeypatch.setenv(host.ENV, value)
  with pytest.raises(ValueError, match=host.ENV):
    host.cpu_device_count()


def test_configure_is_a_no_op_once_jax_started():
  jax.devices()
  assert host.configure_cpu_devices() is False


def test_client_mesh_resolution():
  n = jax.local_device_count()
  assert fedavg.client_mesh(None, 10) is None
  assert fedavg.client_mesh("auto", 10, backend="gpu") is None
  assert fedavg.client_mesh("auto", 1) is None
  mesh = fedavg.client_mesh("auto", 10)
  assert (mesh is None) == (n < 2)
  if mesh is not None:
    assert mesh.size == min(n, 10)
  with pytest.raises(ValueError, match="mesh must be"):
    fedavg.client_mesh("all", 10)


def test_two_devices_equal_one_device(child_env):
  """Auto client mesh and sharded attack batches (tests/host_check.py,
  with REPDEF_JAX_CPU_DEVICES=2) against one device."""
  script = os.path.join(os.path.dirname(__file__), "host_check.py")
  out = subprocess.run([sys.executable, script],
                       env=child_env(**{host.ENV: "2"}),
                       capture_output=True, text=True, timeout=600,
                       check=False)
  assert out.returncode == 0, out.stderr[-3000:]
  result = json.loads(out.stdout.strip().splitlines()[-1])
  assert result["devices"] == 2
  rounds, attacks = result["rounds"], result["attacks"]
  assert rounds["mesh"] == 2 and rounds["ids_equal"]
  assert rounds["params"] <= 1e-6
  assert rounds["compiles"] == 1
  assert attacks["mesh"] == 2 and attacks["x_rec"] <= 1e-5


def _scan_unrolls(fn, *args):
  """The ``unroll`` of every scan in ``fn``'s jaxpr (loops of lax.map too)."""
  out = []

  def walk(jaxpr):
    for eqn in jaxpr.eqns:
      if eqn.primitive.name == "scan":
        out.append(eqn.params["unroll"])
      for sub in jax.core.jaxprs_in_params(eqn.params):
        walk(sub)

  walk(jax.make_jaxpr(fn)(*args).jaxpr)
  return out


@pytest.mark.parametrize("n", [1, 4, 5])
def test_sequential_map_is_lax_map_unrolled_on_cpu(n):
  """Same numbers as lax.map, bit for bit (odd n: a remainder trip), with
  two iterations per trip on CPU and none for a single item."""
  w = jax.random.normal(jax.random.key(0), (3, 3, 2, 4))

  def f(x):  # A small convolution and a reduction: per-item work.
    y = jax.lax.conv_general_dilated(x[None], w, (1, 1), "SAME",
                                     dimension_numbers=("NHWC", "HWIO",
                                                        "NHWC"))
    return jax.numpy.tanh(y).sum(axis=(1, 2))[0]

  xs = jax.random.normal(jax.random.key(1), (n, 6, 6, 2))
  ours = jax.jit(lambda a: host.sequential_map(f, a))(xs)
  ref = jax.jit(lambda a: jax.lax.map(f, a))(xs)
  assert (ours == ref).all()
  assert _scan_unrolls(lambda a: host.sequential_map(f, a), xs) == (
      [min(host.CPU_LOOP_UNROLL, n)] if n > 1 else [1])
  # Chunks of one item are single items: unrolled the same.
  assert _scan_unrolls(lambda a: host.sequential_map(f, a, batch_size=1),
                       xs) == _scan_unrolls(
                           lambda a: host.sequential_map(f, a), xs)
  # Chunks of several items stay lax.map's (vmapped chunks, one per trip).
  chunked = jax.jit(lambda a: host.sequential_map(f, a, batch_size=2))(xs)
  assert jax.numpy.allclose(chunked, ref, rtol=1e-6, atol=1e-6)


def test_configure_asks_jax_only_when_nothing_else_set_the_count(
    monkeypatch):
  """Before JAX starts: the requested count goes to ``jax_num_cpu_devices``
  unless XLA_FLAGS or jax_num_cpu_devices already set a count (a fake JAX
  config records what would be asked)."""
  asked = []
  monkeypatch.setattr(xla_bridge, "backends_are_initialized", lambda: False)

  def configure(env=None, flags="", preset=-1):
    monkeypatch.setattr(host.jax, "config", types.SimpleNamespace(
        jax_num_cpu_devices=preset, update=lambda *a: asked.append(a)))
    if env is None:
      monkeypatch.delenv(host.ENV, raising=False)
    else:
      monkeypatch.setenv(host.ENV, env)
    monkeypatch.setenv("XLA_FLAGS", flags)
    return host.configure_cpu_devices()

  assert configure() is False and not asked
  assert configure("3", "--xla_force_host_platform_device_count=4") is False
  assert configure("3", preset=2) is False
  assert not asked
  assert configure("3", "--xla_backend_optimization_level=1") is True
  assert asked == [("jax_num_cpu_devices", 3)]


def test_zero_devices_means_the_cores_this_process_may_use(monkeypatch):
  """``0`` counts the cores of the affinity mask, not every core."""
  if not hasattr(os, "sched_getaffinity"):
    pytest.skip("no affinity mask on this OS")
  monkeypatch.setattr(host.os, "sched_getaffinity", lambda pid: {0})
  monkeypatch.setattr(host.os, "cpu_count", lambda: 64)
  monkeypatch.setenv(host.ENV, "0")
  assert host.usable_cores() == 1
  assert host.cpu_device_count() == 1
  monkeypatch.setenv(host.ENV, " 5 ")
  assert host.cpu_device_count() == 5


def test_cpuinfo_reads_the_first_matching_line():
  """The value after the first colon, stripped, of the first line whose
  lower-cased start is the key (read here with a regex)."""
  try:
    with open("/proc/cpuinfo", encoding="utf-8") as f:
      text = f.read()
  except OSError:
    pytest.skip("no /proc/cpuinfo")
  assert host.cpuinfo("no such key here") is None
  match = re.search(r"^model name\s*:[ \t]*(.*?)[ \t]*$", text,
                    re.MULTILINE | re.IGNORECASE)
  if match is None:
    pytest.skip("no 'model name' line")
  assert host.cpuinfo("model name") == match.group(1)
  assert host.describe()["cpu"] == match.group(1)


@pytest.mark.parametrize("flags,expected", [
    ("fpu sse avx2 fma avx512f avx512dq", True),
    ("fpu sse avx2 fma", False),
    ("fpu avx512_bf16 avx512vl", False),  # Extensions without the base set.
    (None, False)])  # No /proc/cpuinfo (not Linux).
def test_avx512_is_the_avx512f_flag(monkeypatch, flags, expected):
  monkeypatch.setattr(host, "cpuinfo",
                      lambda key: flags if key == "flags" else None)
  assert host.cpu_has_avx512.__wrapped__() is expected


def test_sequential_map_is_not_unrolled_off_cpu(monkeypatch):
  """On GPU/TPU the loop stays lax.map's (one item per trip)."""
  xs = jax.numpy.ones((4, 3))
  monkeypatch.setattr(host.jax, "default_backend", lambda: "gpu")
  assert _scan_unrolls(lambda a: host.sequential_map(jax.numpy.sin, a),
                       xs) == [1]
