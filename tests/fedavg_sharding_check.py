"""Helper run in a subprocess by test_fedavg_sharding.py (8 forced CPU devices).

Prints one JSON line: max abs differences between sharded and one-device
rounds.
"""

import json
import os

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                           " --xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # pylint: disable=g-import-not-at-top
import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
import numpy as np  # pylint: disable=g-import-not-at-top

from repdef_jax import fedavg  # pylint: disable=g-import-not-at-top
from repdef_jax import models  # pylint: disable=g-import-not-at-top
from tree_checks import max_diff  # pylint: disable=g-import-not-at-top


def main():
  assert len(jax.devices()) == 8, jax.devices()
  model = models.get_model("mlp", (4, 4, 1), 4, hidden=(8,))
  rng = np.random.default_rng(0)
  n, m = 12, 10
  x = rng.random((n, m, 4, 4, 1), dtype=np.float32)
  y = rng.integers(0, 4, (n, m)).astype(np.int32)
  mask = np.ones((n, m), np.float32)
  mask[3, 4:] = 0
  data = fedavg.ClientArrays(jnp.asarray(x), jnp.asarray(y), jnp.asarray(mask))
  keys = fedavg.key_streams(0)
  out = {}
  for k in (5,):  # 5 clients: padded with weight-0 slots to 8.
    config = fedavg.FedAvgConfig(clients_per_round=k, local_steps=2,
                                 batch_size=4, client_lr=0.1)
    state0 = fedavg.init(model, config, keys.init)
    results = []
    for mesh in (None, fedavg.make_mesh(8)):
      round_fn = fedavg.make_round(model, config, mesh=mesh)
      state = state0
      for _ in range(2):
        state, metrics = round_fn(state, data, keys)
      results.append((jax.device_get(state.params),
                      np.asarray(metrics["client_ids"]),
                      float(metrics["train_loss"])))
    (p1, ids1, l1), (p8, ids8, l8) = results
    out[f"k{k}"] = {
        "params": max_diff(p1, p8),
        "ids_equal": bool(np.array_equal(ids1, ids8)),
        "loss": abs(l1 - l8),
    }
  # Client 0, never sampled, holds NaN images: the weight-0 slots that pad
  # K to the mesh (client id 0) must not reach the average (0 * nan = nan).
  nan_data = data._replace(x=data.x.at[0].set(jnp.nan))
  config = fedavg.FedAvgConfig(clients_per_round=3, local_steps=2,
                               batch_size=4, client_lr=0.1)
  state0 = fedavg.init(model, config, keys.init)
  results = []
  for mesh in (None, fedavg.make_mesh(8)):
    round_fn = fedavg.make_round(model, config, mesh=mesh)
    state, metrics = round_fn(state0, nan_data, keys,
                              client_ids=jnp.array([1, 2, 3]))
    results.append((jax.device_get(state.params), float(metrics["train_loss"])))
  (p1, l1), (p8, l8) = results
  leaves8 = jax.tree_util.tree_leaves(p8)
  out["nan_unsampled_client"] = {
      "params": max_diff(p1, p8),
      "loss": abs(l1 - l8),
      "finite": bool(all(np.isfinite(a).all() for a in leaves8)),
  }
  print(json.dumps(out))


if __name__ == "__main__":
  main()
