"""A FedAvg round's cost on one device, many devices, many processes, Flower.

  python -m experiments.benchmarks.scaling [--rounds=20] [--out=FILE.json]

The paper's MNIST FedAvg round (logistic regression, 100 clients of 200
synthetic 28x28 images, 10 sampled per round, 5 local steps of batch 10,
Soteria 80 % at every step) timed as milliseconds per round after
compilation, each setting in its own process (XLA_FLAGS must be set before
JAX starts):

* ``one device``: ``fedavg.make_round`` (the default, no mesh);
* ``8 devices``: the clients sharded over 8 forced host devices (a mesh);
* ``2 processes x 4 devices``: the same mesh over two processes on this
  machine (``jax.distributed``, gloo collectives);
* ``flower in-process``: the same clients as Flower ClientApps
  (``repdef_jax.integrations.flower``, FedAvg strategy, messages serialized
  as on the wire), 10 nodes per round.

Forced host devices share this machine's cores, so on a CPU the mesh rows
measure the overhead of sharding and collectives, not a speed-up; on a
GPU/TPU host each device is a chip. Results: docs/scaling.md.
"""

import json
import os
import socket
import subprocess
import sys
import time

ROUNDS = 20


def _setting():
  from repdef_jax import defenses  # pylint: disable=g-import-not-at-top
  from repdef_jax import fedavg  # pylint: disable=g-import-not-at-top
  from repdef_jax import models  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  model = models.get_model("logreg", (28, 28, 1), 10)
  rng = np.random.default_rng(0)
  n, m = 100, 200
  x = rng.random((n, m, 28, 28, 1), dtype=np.float32)
  y = rng.integers(0, 10, (n, m)).astype(np.int32)
  mask = np.ones((n, m), np.float32)
  config = fedavg.FedAvgConfig(
      clients_per_round=10, local_steps=5, batch_size=10, client_lr=0.05,
      client_chunk=1, defense=defenses.get_defense("soteria", 80.0,
                                                   model=model))
  return model, config, (x, y, mask)


def _time_rounds(round_fn, state, data, keys, rounds, **kwargs):
  import jax  # pylint: disable=g-import-not-at-top
  state, _ = round_fn(state, data, keys, **kwargs)  # Compile.
  jax.block_until_ready(state)
  t = time.perf_counter()
  for _ in range(rounds):
    state, _ = round_fn(state, data, keys, **kwargs)
  jax.block_until_ready(state)
  return (time.perf_counter() - t) / rounds * 1e3


def child(mode, rounds, process_id=0, coordinator=""):
  """One timing in this process; prints a JSON line."""
  from repdef_jax import distributed  # pylint: disable=g-import-not-at-top
  if mode == "two_processes":
    distributed.initialize(coordinator, 2, process_id)
  import jax  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  from repdef_jax import fedavg  # pylint: disable=g-import-not-at-top
  model, config, (x, y, mask) = _setting()
  keys = fedavg.key_streams(0)
  state = fedavg.init(model, config, keys.init)
  if mode == "flower":
    out = {"ms_per_round": _flower(model, config, state, (x, y, mask),
                                   rounds)}
  else:
    mesh = None if mode == "one_device" else fedavg.make_mesh()
    data = fedavg.ClientArrays(x, y, mask)
    if mesh is not None:
      from repdef_jax import training  # pylint: disable=g-import-not-at-top
      state, data, keys = training._replicate((state, data, keys), mesh)  # pylint: disable=protected-access
    else:
      data = jax.device_put(data)
    ms = _time_rounds(fedavg.make_round(model, config, mesh=mesh), state,
                      data, keys, rounds)
    out = {"ms_per_round": ms, "devices": jax.device_count(),
           "processes": jax.process_count()}
  if distributed.is_primary():
    print("RESULT " + json.dumps(out), flush=True)
  del np


def _flower(model, config, state, arrays, rounds):
  """ms per Flower round (10 in-process nodes, FedAvg, after round 1)."""
  from flwr.serverapp import ServerApp  # pylint: disable=g-import-not-at-top
  from flwr.serverapp.strategy import FedAvg  # pylint: disable=g-import-not-at-top
  from repdef_jax.integrations import flower  # pylint: disable=g-import-not-at-top
  x, y, mask = arrays
  stamps = []

  class Timed(FedAvg):

    def aggregate_train(self, server_round, replies):
      out = super().aggregate_train(server_round, replies)
      stamps.append(time.perf_counter())
      return out

  app = ServerApp()

  @app.main()
  def main(grid, context):
    del context
    Timed(fraction_evaluate=0.0, min_train_nodes=10,
          min_available_nodes=10).start(
              grid=grid, initial_arrays=flower.to_arrays(state.params),
              num_rounds=rounds + 1)

  def load(context):
    i = flower.client_id(context)
    return x[i], y[i], mask[i]

  flower.run_in_process(app, flower.make_client_app(model, config, load), 10)
  return (stamps[-1] - stamps[0]) / rounds * 1e3


def _free_port():
  with socket.socket() as s:
    s.bind(("localhost", 0))
    return s.getsockname()[1]


def _spawn(mode, rounds, devices, processes=1):
  env = dict(os.environ, JAX_PLATFORMS="cpu",
             XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}")
  coordinator = f"localhost:{_free_port()}"
  procs = [subprocess.Popen(
      [sys.executable, "-m", "experiments.benchmarks.scaling", "--child",
       mode, str(rounds), str(i), coordinator], env=env,
      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
           for i in range(processes)]
  outs = [p.communicate() for p in procs]
  for p, (out, err) in zip(procs, outs):
    if p.returncode:
      return {"error": err[-500:]}
  line = [l for l in outs[0][0].splitlines() if l.startswith("RESULT ")][0]
  return json.loads(line[len("RESULT "):])


def main(argv):
  if len(argv) > 1 and argv[1] == "--child":
    child(argv[2], int(argv[3]), int(argv[4]), argv[5])
    return
  rounds, out_path = ROUNDS, None
  for arg in argv[1:]:
    if arg.startswith("--rounds="):
      if not (arg[9:].isdigit() and int(arg[9:])):
        sys.exit(f"--rounds must be a positive integer; got {arg[9:]!r}.")
      rounds = int(arg[9:])
    elif arg.startswith("--out="):
      out_path = arg.split("=", 1)[1]
    else:  # --help or anything unknown: the usage line, nothing runs.
      print(__doc__.splitlines()[2].strip())
      sys.exit(0 if arg in ("-h", "--help") else 2)
  load = os.getloadavg()[0]
  results = {
      "one device": _spawn("one_device", rounds, 1),
      "8 devices": _spawn("mesh", rounds, 8),
      "2 processes x 4 devices": _spawn("two_processes", rounds, 4, 2),
      "flower in-process (10 nodes)": _spawn("flower", rounds, 1),
  }
  report = {"rounds": rounds, "cores": os.cpu_count(),
            "load_before": load, "load_after": os.getloadavg()[0],
            "results": results}
  print(json.dumps(report, indent=2))
  if out_path:
    from repdef_jax import storage  # pylint: disable=g-import-not-at-top
    storage.write_json(out_path, report)


if __name__ == "__main__":
  main(sys.argv)
