"""Run by tests/test_host.py with REPDEF_JAX_CPU_DEVICES=2 (JAX must not
have started): the auto client mesh and sharded attack batches equal the
one-device results. Prints one JSON line."""

import json

import jax
import numpy as np

from repdef_jax import attacks
from repdef_jax import defenses
from repdef_jax import fedavg
from repdef_jax import gradients
from repdef_jax import host
from repdef_jax import models
from repdef_jax.attacks import base

MODEL = "leakage"  # One convolution: small programs, fast compiles.


def _rounds():
  model = models.get_model(MODEL, (12, 12, 1), 10)
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
  s_auto = s_one = fedavg.init(model, config, keys.init)
  for _ in range(3):
    s_auto, m_auto = auto(s_auto, data, keys)
    s_one, m_one = one(s_one, data, keys)
  diff = float(np.max([np.max(np.abs(a - b)) for a, b in zip(
      jax.tree_util.tree_leaves(s_auto.params),
      jax.tree_util.tree_leaves(s_one.params))]))
  return {"mesh": auto.mesh.size, "params": diff,
          "ids_equal": bool(np.array_equal(m_auto["client_ids"],
                                           m_one["client_ids"])),
          "compiles": auto._cache_size()}  # pylint: disable=protected-access


def _attacks():
  model = models.get_model(MODEL, (12, 12, 1), 10)
  params = model.init(jax.random.key(0))
  x = jax.random.uniform(jax.random.key(1), (3, 1, 12, 12, 1))
  y = np.arange(3, dtype=np.int32)[:, None]
  shared = jax.vmap(lambda a, b: gradients.batch_grad(model, params, a, b))(
      x, y)
  keys = jax.random.split(jax.random.key(2), 3)
  run = lambda: attacks.run_batch("gs", model, params, shared, 1, keys,  # noqa: E731
                                  labels=y, iterations=20)
  mesh = host.cpu_mesh(3, base.BATCH_AXIS)
  sharded = run()
  cpu_mesh, base.host.cpu_mesh = host.cpu_mesh, lambda *a: None
  try:
    one = run()
  finally:
    base.host.cpu_mesh = cpu_mesh
  return {"mesh": None if mesh is None else mesh.size,
          "x_rec": float(np.max(np.abs(np.asarray(sharded.x_rec) -
                                       np.asarray(one.x_rec))))}


if __name__ == "__main__":
  print(json.dumps({"devices": jax.device_count(), "rounds": _rounds(),
                    "attacks": _attacks()}))
