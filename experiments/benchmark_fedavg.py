"""Rounds/s of the vectorized FedAvg round vs a FedJAX-style Python loop.

The paper's setting (Sun et al. 2021, Section 5; FedAvg of McMahan et al.
2017): 10 clients per round, DLG's LeNet on CIFAR-10 shapes (32x32x3), 200
examples per client, one local epoch of batch 10 / 50 / 200 (20 / 4 / 1 local
steps). Three rounds are timed, all in the same process:

* ``loop_xla``: the FedJAX single-device design: a Python loop over clients,
  each calling a jitted client update (``lax.scan`` over local steps) of the
  LeNet with XLA convolutions (what ``nn.Conv`` lowers to); a jitted server
  average. Client data is already on device (the loop is not charged for
  host-to-device copies).
* ``vmap_xla``: our round (one jit: vmap over clients) with XLA convolutions.
* ``ours``: our round (one client at a time inside the jit on CPU, all
  clients vmapped at once on GPU/TPU; ``client_chunk``) with the im2col LeNet (``conv_impl='patches'``: k*k
  strided slices and one matmul per convolution, same parameters) and
  donated state buffers. Batched per-client weight gradients are then plain
  batched matmuls instead of XLA's grouped convolutions.

Compile time (first call) is reported separately; ratios are steady-state
rounds/s measured in this run; ``max_abs_diff`` compares the parameters after
one round of ``ours`` and ``loop_xla`` from the same state and clients.

  python -m experiments.benchmark_fedavg            # all batch sizes
  python -m experiments.benchmark_fedavg --rounds=5 --batch_sizes=10

Also times MNIST rounds (LeNet on 28x28x1, 100 clients x 200 examples,
10 clients per round, batch 50, one local epoch): ``--mnist_rounds`` rounds are
measured and 200 rounds extrapolated (synthetic data of MNIST's shapes: the
cost does not depend on pixel values).
"""

from __future__ import annotations

import dataclasses
import json
import time
from typing import Any, Sequence

from absl import app
from absl import flags
import jax
import jax.numpy as jnp
import numpy as np

from repdef_jax import fedavg
from repdef_jax import models


def _synthetic(num_clients, per_client, shape, seed=0):
  rng = np.random.default_rng(seed)
  x = rng.random((num_clients, per_client, *shape), dtype=np.float32)
  y = rng.integers(0, 10, (num_clients, per_client)).astype(np.int32)
  mask = np.ones((num_clients, per_client), np.float32)
  return fedavg.ClientArrays(jnp.asarray(x), jnp.asarray(y), jnp.asarray(mask))


def _block(tree):
  return jax.block_until_ready(tree)


def _time_vectorized(model, config, data, keys, rounds, donate,
                     **round_kwargs):
  """(compile + first round seconds, rounds per second) of the jitted round."""
  round_fn = fedavg.make_round(model, config, donate=donate)
  state = fedavg.init(model, config, keys.init)
  t = time.perf_counter()
  state, _ = _block(round_fn(state, data, keys, **round_kwargs))
  compile_s = time.perf_counter() - t
  t = time.perf_counter()
  for _ in range(rounds):
    state, _ = round_fn(state, data, keys, **round_kwargs)
  _block(state)
  return compile_s, rounds / (time.perf_counter() - t)


def _loop_round(client_fn, server_fn, state, clients, keys, ids):
  deltas = [client_fn(state.params, *clients[i], state.round, keys,
                      np.int32(i))[0] for i in ids]
  sizes = jnp.asarray([int(clients[i][2].shape[0]) for i in ids], jnp.int32)
  return server_fn(state, deltas, sizes)


def _time_loop(model, config, data, keys, ids, rounds):
  client_fn, server_fn = fedavg.make_loop_fns(model, config)
  clients = [tuple(a[i] for a in data) for i in range(data.x.shape[0])]
  _block(clients)
  state = fedavg.init(model, config, keys.init)
  t = time.perf_counter()
  state = _block(_loop_round(client_fn, server_fn, state, clients, keys, ids))
  compile_s = time.perf_counter() - t
  t = time.perf_counter()
  for _ in range(rounds):
    state = _loop_round(client_fn, server_fn, state, clients, keys, ids)
  _block(state)
  return compile_s, rounds / (time.perf_counter() - t)


def _one_round_diff(models_, config, data, keys, ids):
  """Max |params(ours) - params(loop_xla)| after one round from one state."""
  xla, patches = models_
  state = fedavg.init(xla, config, keys.init)
  client_fn, server_fn = fedavg.make_loop_fns(xla, config)
  clients = [tuple(a[i] for a in data) for i in range(data.x.shape[0])]
  ref = _loop_round(client_fn, server_fn, state, clients, keys, ids)
  ours, _ = fedavg.make_round(patches, config)(state, data, keys,
                                               client_ids=ids)
  return max(float(jnp.max(jnp.abs(a - b))) for a, b in zip(
      jax.tree_util.tree_leaves(ref.params),
      jax.tree_util.tree_leaves(ours.params)))


def run(batch_sizes: Sequence[int] = (10, 50, 200),
        rounds: int = 3,
        clients_per_round: int = 10,
        examples_per_client: int = 200,
        input_shape: Sequence[int] = (32, 32, 3),
        model_name: str = "lenet",
        include_vmap_xla: bool = True,
        mnist_rounds: int = 20,
        client_chunk: int | None = None,
        verbose: bool = True) -> dict[str, Any]:
  """Runs the benchmark; returns a dict of timings, ratios and diffs.

  Args:
    batch_sizes: local batch sizes (one local epoch each).
    rounds: timed rounds per variant (after one compile round).
    clients_per_round: K.
    examples_per_client: examples per client.
    input_shape: image shape (CIFAR-10: 32x32x3).
    model_name: the model.
    include_vmap_xla: also time our round with XLA convolutions.
    mnist_rounds: MNIST rounds to time (0 skips; 200 are extrapolated).
    client_chunk: clients per vectorized chunk of our round (0 = all at
      once); None picks 1 on CPU (one client at a time inside the jitted
      round: XLA's CPU batched matmuls over clients are slower than a
      sequence of plain ones) and 0 on GPU/TPU.
    verbose: print as it goes.

  Returns:
    ``{'settings': [...per batch size...], 'mnist': {...}, 'devices': ...}``.
  """
  if client_chunk is None:
    client_chunk = 1 if jax.default_backend() == "cpu" else 0
  chunk = client_chunk
  keys = fedavg.key_streams(0)
  xla = models.get_model(model_name, input_shape, 10, conv_impl="xla")
  patches = models.get_model(model_name, input_shape, 10, conv_impl="patches")
  data = _synthetic(clients_per_round, examples_per_client, input_shape)
  ids = jnp.arange(clients_per_round, dtype=jnp.int32)
  out = {"devices": str(jax.devices()), "rounds_timed": rounds,
         "settings": []}
  for b in batch_sizes:
    config = fedavg.FedAvgConfig(clients_per_round=clients_per_round,
                                 local_epochs=1, batch_size=b, client_lr=0.01)
    row = {"batch_size": b,
           "local_steps": config.steps_per_round(examples_per_client)}
    row["loop_xla_compile_s"], row["loop_xla_rps"] = _time_loop(
        xla, config, data, keys, ids, rounds)
    if include_vmap_xla:
      row["vmap_xla_compile_s"], row["vmap_xla_rps"] = _time_vectorized(
          xla, config, data, keys, rounds, donate=True, client_ids=ids)
      row["vmap_xla_vs_loop"] = row["vmap_xla_rps"] / row["loop_xla_rps"]
    row["ours_client_chunk"] = chunk
    row["ours_compile_s"], row["ours_rps"] = _time_vectorized(
        patches, dataclasses.replace(config, client_chunk=chunk), data, keys,
        rounds, donate=True, client_ids=ids)
    row["ours_vs_loop"] = row["ours_rps"] / row["loop_xla_rps"]
    row["max_abs_diff"] = _one_round_diff((xla, patches), config, data, keys,
                                          ids)
    out["settings"].append(row)
    if verbose:
      print(json.dumps(row), flush=True)
  if mnist_rounds:
    out["mnist"] = time_mnist(mnist_rounds, verbose=verbose)
  return out


def time_mnist(rounds: int = 20, verbose: bool = True,
               conv_impl: str = "patches") -> dict[str, Any]:
  """Times ``rounds`` MNIST rounds (LeNet 28x28x1, 100 clients) -> 200 est."""
  model = models.get_model("lenet", (28, 28, 1), 10, conv_impl=conv_impl)
  data = _synthetic(100, 200, (28, 28, 1), seed=1)
  keys = fedavg.key_streams(0)
  config = fedavg.FedAvgConfig(
      clients_per_round=10, local_epochs=1, batch_size=50, client_lr=0.05,
      client_chunk=1 if jax.default_backend() == "cpu" else 0)
  test = fedavg.make_eval_data(np.asarray(data.x[:50]).reshape(-1, 28, 28, 1),
                               np.asarray(data.y[:50]).reshape(-1), 1000)
  compile_s, rps = _time_vectorized(model, config, data, keys, rounds,
                                    donate=True, test=test)
  per_round = 1.0 / rps
  res = {"model": f"lenet ({conv_impl})", "clients": 100, "clients_per_round": 10,
         "batch_size": 50, "local_epochs": 1, "test_examples": 10000,
         "rounds_measured": rounds, "s_per_round": per_round,
         "compile_s": compile_s,
         "est_200_rounds_s": compile_s + 200 * per_round}
  if verbose:
    print(json.dumps(res), flush=True)
  return res


FLAGS = flags.FLAGS


def define_flags() -> None:
  """Defines the absl flags (only when run as a program, so importing this
  module, e.g. with the other benchmarks, defines no flags)."""
  flags.DEFINE_list("batch_sizes", ["10", "50", "200"], "Local batch sizes.")
  flags.DEFINE_integer("rounds", 3, "Timed rounds per variant.")
  flags.DEFINE_integer("mnist_rounds", 20, "MNIST rounds to time (0 = skip).")
  flags.DEFINE_bool("vmap_xla", True, "Also time vmap with XLA convolutions.")


def main(argv):
  del argv
  res = run([int(b) for b in FLAGS.batch_sizes], rounds=FLAGS.rounds,
            include_vmap_xla=FLAGS.vmap_xla, mnist_rounds=FLAGS.mnist_rounds)
  print("\nbatch steps loop_xla r/s | vs loop: vmap_xla ours | "
        "compile s: loop ours | max|diff|")
  nan = float("nan")
  for r in res["settings"]:
    print(f"{r['batch_size']:5d} {r['local_steps']:5d} "
          f"{r['loop_xla_rps']:12.3f} | "
          f"{r.get('vmap_xla_vs_loop', nan):8.2f} {r['ours_vs_loop']:7.2f} | "
          f"{r['loop_xla_compile_s']:6.1f} {r['ours_compile_s']:6.1f} | "
          f"{r['max_abs_diff']:.1e}")
  if "mnist" in res:
    m = res["mnist"]
    print(f"MNIST: {m['s_per_round']:.3f} s/round, 200 rounds ~ "
          f"{m['est_200_rounds_s']:.0f} s (extrapolated from "
          f"{m['rounds_measured']} rounds, compile {m['compile_s']:.1f} s)")


if __name__ == "__main__":
  define_flags()
  app.run(main)
