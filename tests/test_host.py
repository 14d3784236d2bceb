"""One CPU device per core (repdef_jax.host) and the auto client mesh."""

import json
import os
import subprocess
import sys

import jax
import numpy as np
import pytest

from repdef_jax import defenses
from repdef_jax import fedavg
from repdef_jax import host
from repdef_jax import models

_PROBE = ("import json, jax, repdef_jax; from repdef_jax import fedavg; "
          "m = fedavg.client_mesh('auto', 10); print(json.dumps("
          "[jax.device_count(), None if m is None else m.size]))")


def _probe(**env_vars):
  env = {k: v for k, v in os.environ.items()
         if k not in ("XLA_FLAGS", host.ENV)}
  env.update(JAX_PLATFORMS="cpu", **env_vars)
  out = subprocess.run([sys.executable, "-c", _PROBE], env=env,
                       capture_output=True, text=True, timeout=120,
                       check=False)
  assert out.returncode == 0, out.stderr[-2000:]
  return json.loads(out.stdout.strip().splitlines()[-1])


def test_import_gives_one_cpu_device_per_core_and_a_client_mesh():
  assert _probe(**{host.ENV: "3"}) == [3, 3]
  cores = host.usable_cores()
  assert _probe() == [cores, None if cores < 2 else min(cores, 10)]


def test_one_device_on_request_and_user_settings_kept():
  assert _probe(**{host.ENV: "1"}) == [1, None]
  assert _probe(XLA_FLAGS="--xla_force_host_platform_device_count=4") == [
      4, 4]


@pytest.mark.parametrize("value", ["0", "two", "-1"])
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


@pytest.mark.skipif(jax.local_device_count() < 2,
                    reason="needs several CPU devices (one per core)")
def test_auto_mesh_round_equals_one_device_and_compiles_once():
  model = models.get_model("lenet", (12, 12, 1), 10)
  rng = np.random.default_rng(0)
  data = fedavg.ClientArrays(
      rng.random((6, 8, 12, 12, 1), dtype=np.float32),
      rng.integers(0, 10, (6, 8)).astype(np.int32),
      np.ones((6, 8), np.float32))
  config = fedavg.FedAvgConfig(
      clients_per_round=5, local_steps=2, batch_size=4, client_lr=0.1,
      defense=defenses.get_defense("soteria", 50.0, model=model))
  keys = fedavg.key_streams(0)
  auto = fedavg.make_round(model, config)
  one = fedavg.make_round(model, config, mesh=None)
  assert auto.mesh.size == min(jax.local_device_count(), 5)
  s_auto = s_one = fedavg.init(model, config, keys.init)
  for _ in range(3):
    s_auto, m_auto = auto(s_auto, data, keys)
    s_one, m_one = one(s_one, data, keys)
  np.testing.assert_array_equal(m_auto["client_ids"], m_one["client_ids"])
  for a, b in zip(jax.tree_util.tree_leaves(s_auto.params),
                  jax.tree_util.tree_leaves(s_one.params)):
    np.testing.assert_allclose(a, b, atol=1e-6)
  assert auto._cache_size() == 1  # pylint: disable=protected-access
