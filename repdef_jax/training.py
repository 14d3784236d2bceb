"""A resumable FedAvg run: data, partition, model, defense, rounds, checkpoints.

The library behind ``python -m experiments.fedavg`` (flax examples style:
the entry point only parses flags). :func:`train_and_evaluate` trains FedAvg
(McMahan et al. 2017) with an optional defense at every local step (Sun et
al. 2021, defended FedAvg) using :mod:`repdef_jax.fedavg`, and keeps a
workdir that survives being killed at any moment:

* ``config.json``: the configuration. A workdir whose ``config.json`` differs
  in any setting that changes results is refused with a ValueError and left
  untouched.
* ``checkpoint.msgpack``: server state every ``checkpoint_every`` rounds and
  at the end (flax serialization; temp file + ``os.replace``).
* ``metrics.jsonl``: one JSON line per round. On resume, lines past the
  checkpoint's round (and any torn line) are dropped by an atomic rewrite, so
  the final file equals an uninterrupted run's.
* ``accuracy.png``: test accuracy (and train loss) vs round.

All randomness is a function of (seed, round, client) (see
:mod:`repdef_jax.fedavg`), so a resumed run is bit-for-bit the uninterrupted
one.
"""

from __future__ import annotations

import json
import logging
import os
import time
from typing import Any, Optional

import flax.serialization
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax

from repdef_jax import data as data_lib
from repdef_jax import fedavg
from repdef_jax import io as io_lib
from repdef_jax import models as models_lib
from repdef_jax import partition as partition_lib
from repdef_jax import schedules

logger = logging.getLogger(__name__)

CONFIG_FILE = "config.json"
CHECKPOINT_FILE = "checkpoint.msgpack"
METRICS_FILE = "metrics.jsonl"
PLOT_FILE = "accuracy.png"

# Settings that do not change any result: allowed to differ on resume.
RUNTIME_KEYS = ("data_dir", "log_every", "plot", "num_devices",
                "client_chunk", "checkpoint_every")


def default_config() -> ml_collections.ConfigDict:
  """Every setting :func:`train_and_evaluate` reads, with defaults."""
  c = ml_collections.ConfigDict()
  c.dataset = "mnist"
  c.data_dir = ""  # "" = TFDS_DATA_DIR or the tfds default.
  c.max_train_examples = 0  # 0 = all; decode only a prefix (quick runs).
  c.max_test_examples = 0
  c.model = "logreg"
  c.model_init = "default"
  c.conv_impl = "patches"
  c.partition = "noniid"  # noniid | iid | dirichlet
  c.num_clients = 100
  c.classes_per_client = 2
  c.samples_per_class = 100
  c.samples_per_client = 200  # iid
  c.dirichlet_alpha = 0.5
  c.rounds = 200
  c.clients_per_round = 10
  c.replace = True
  c.weighting = "uniform"
  c.local_steps = 1
  c.local_epochs = 0
  c.batch_size = 10
  c.client_lr = 0.05
  c.lr_schedule = "constant"  # constant | theorem2
  c.mu = 0.0  # theorem2: strong convexity
  c.smoothness = 0.0  # theorem2: L
  c.l2 = 0.0
  c.server_lr = 1.0
  c.defense = "none"
  c.defense_strength = 0.0
  c.defense_at = "step"
  c.soteria_score = "reference"  # soteria only: 'reference' or 'exact'.
  c.seed = 0
  c.checkpoint_every = 10
  c.log_every = 1
  c.eval_global_loss = False
  c.eval_batch = 1000
  # Clients per vectorized chunk; -1 = auto: 1 on CPU (a sequence of plain
  # matmuls beats XLA's CPU batched ones), all at once on GPU/TPU.
  c.client_chunk = -1
  c.num_devices = 1  # > 1: shard clients over a 'clients' mesh axis.
  c.plot = True
  return c


_SETTINGS = {
    # The paper's non-IID split and FedAvg (NOTES section 4): 100 devices x
    # 2 classes x 100 samples, 10 per round, 5 local steps of batch 10.
    "paper": dict(partition="noniid", num_clients=100, classes_per_client=2,
                  samples_per_class=100, rounds=200, clients_per_round=10,
                  local_steps=5, batch_size=10, client_lr=0.1,
                  conv_impl="patches", max_train_examples=0,
                  max_test_examples=0, checkpoint_every=10, log_every=10),
    # Seconds under tfds mock data (tests).
    "tiny": dict(partition="noniid", num_clients=4, classes_per_client=2,
                 samples_per_class=2, rounds=1, clients_per_round=2,
                 local_steps=1, batch_size=3, client_lr=0.1,
                 conv_impl="patches", max_train_examples=0,
                 max_test_examples=20, eval_batch=20, checkpoint_every=1,
                 log_every=1),
}


def federated_setting(name: str = "paper", **overrides: Any
                      ) -> ml_collections.ConfigDict:
  """A named federated setting as a ``train`` block of an experiment config.

  Args:
    name: 'paper' (the paper's non-IID MNIST/CIFAR-10 FedAvg) or 'tiny'.
    **overrides: settings that replace the named ones (any key of
      :func:`default_config`).

  Returns:
    A ConfigDict holding a subset of :func:`default_config`'s keys.

  Raises:
    ValueError: unknown ``name`` or an override that is not a setting.
  """
  if name not in _SETTINGS:
    raise ValueError(f"unknown federated setting {name!r}; use one of "
                     f"{sorted(_SETTINGS)}.")
  unknown = set(overrides) - set(default_config().keys())
  if unknown:
    raise ValueError(f"unknown training settings {sorted(unknown)}.")
  return ml_collections.ConfigDict({**_SETTINGS[name], **overrides})


def _config_dict(config: ml_collections.ConfigDict) -> dict[str, Any]:
  return json.loads(config.to_json())


def _append_line(path: str, record: dict[str, Any]) -> None:
  line = (json.dumps(record, sort_keys=True) + "\n").encode()
  fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
  try:
    os.write(fd, line)  # One write call; torn lines are dropped on resume.
    os.fsync(fd)
  finally:
    os.close(fd)


def read_metrics(workdir: str, upto_round: Optional[int] = None
                 ) -> list[dict[str, Any]]:
  """The complete metric lines of a workdir (rounds ``<= upto_round``)."""
  path = os.path.join(workdir, METRICS_FILE)
  if not os.path.exists(path):
    return []
  out = []
  with open(path, "rb") as f:
    for raw in f.read().split(b"\n"):
      try:
        rec = json.loads(raw)
      except ValueError:
        continue  # Torn or empty line.
      if upto_round is None or rec["round"] <= upto_round:
        out.append(rec)
  return out


def _check_config(config: ml_collections.ConfigDict) -> None:
  if config.rounds < 1:
    raise ValueError(f"rounds must be >= 1, got {config.rounds}.")
  # FedAvg's own checks (the model-independent ones), before data is loaded.
  fedavg.FedAvgConfig(
      clients_per_round=config.clients_per_round,
      local_steps=config.local_steps, local_epochs=config.local_epochs,
      batch_size=config.batch_size, l2=config.l2,
      defense_at=config.defense_at, weighting=config.weighting,
      replace=config.replace).validate()
  if not config.replace and config.clients_per_round > config.num_clients:
    raise ValueError(
        f"clients_per_round={config.clients_per_round} exceeds "
        f"num_clients={config.num_clients} (sampling without replacement).")
  if config.checkpoint_every < 1:
    raise ValueError(f"checkpoint_every must be >= 1, got "
                     f"{config.checkpoint_every}.")


def _check_workdir(config: ml_collections.ConfigDict, workdir: str) -> bool:
  """Raises on a workdir of a different run; returns whether it holds one."""
  path = os.path.join(workdir, CONFIG_FILE)
  if not os.path.exists(path):
    if os.path.exists(os.path.join(workdir, CHECKPOINT_FILE)):
      raise ValueError(f"{workdir} holds a checkpoint but no {CONFIG_FILE}; "
                       "refusing to overwrite it. Use another --workdir.")
    return False
  with open(path) as f:
    saved = json.load(f)
  new = _config_dict(config)
  diff = sorted(k for k in set(saved) | set(new)
                if k not in RUNTIME_KEYS and saved.get(k) != new.get(k))
  if diff:
    details = ", ".join(f"{k}: {saved.get(k)!r} -> {new.get(k)!r}"
                        for k in diff)
    raise ValueError(
        f"{workdir} holds a run with a different configuration ({details}). "
        "Nothing was changed; use another --workdir or the saved settings.")
  return True


def build_data(config: ml_collections.ConfigDict):
  """Loads the dataset and partitions it. Returns (ClientData, EvalData, info)."""
  info = data_lib.get_info(config.dataset)
  data_dir = config.data_dir or None
  images, labels = data_lib.load(config.dataset, "train", data_dir,
                                 max_examples=config.max_train_examples or None)
  test_x, test_y = data_lib.load(config.dataset, "test", data_dir,
                                 max_examples=config.max_test_examples or None)
  if config.partition == "noniid":
    idx = partition_lib.noniid(
        labels, num_clients=config.num_clients,
        classes_per_client=config.classes_per_client,
        samples_per_class=config.samples_per_class, seed=config.seed,
        num_classes=info.num_classes)
  elif config.partition == "iid":
    idx = partition_lib.iid(len(labels), num_clients=config.num_clients,
                            samples_per_client=config.samples_per_client,
                            seed=config.seed)
  elif config.partition == "dirichlet":
    idx = partition_lib.dirichlet(labels, num_clients=config.num_clients,
                                  alpha=config.dirichlet_alpha,
                                  seed=config.seed)
  else:
    raise ValueError(f"unknown partition {config.partition!r}; use noniid, "
                     "iid or dirichlet.")
  clients = partition_lib.pack(data_lib.to_float(images), labels, idx)
  test = fedavg.make_eval_data(data_lib.to_float(test_x),
                               np.asarray(test_y, np.int32), config.eval_batch)
  return clients, test, info


def build_fedavg_config(config: ml_collections.ConfigDict,
                        model: models_lib.Model) -> fedavg.FedAvgConfig:
  """The :class:`repdef_jax.fedavg.FedAvgConfig` of a run config."""
  if config.lr_schedule == "theorem2":
    lr = schedules.theorem2(config.mu, config.smoothness,
                            max(config.local_steps, 1))
  else:
    lr = schedules.get_schedule(config.lr_schedule, config.client_lr)
  defense = None
  if config.defense != "none":
    from repdef_jax import defenses  # pylint: disable=g-import-not-at-top
    kwargs = ({"score": config.soteria_score}
              if config.defense == "soteria" else {})
    defense = defenses.get_defense(config.defense, config.defense_strength,
                                   model=model, **kwargs)
  return fedavg.FedAvgConfig(
      clients_per_round=config.clients_per_round,
      local_steps=config.local_steps, local_epochs=config.local_epochs,
      batch_size=config.batch_size, client_lr=lr, l2=config.l2,
      defense=defense, defense_at=config.defense_at,
      weighting=config.weighting, replace=config.replace,
      server_optimizer=optax.sgd(config.server_lr),
      client_chunk=resolve_client_chunk(config.client_chunk))


def resolve_client_chunk(client_chunk: int) -> int:
  """-1 (auto) -> 1 on CPU, 0 (all clients at once) on GPU/TPU."""
  if client_chunk == -1:
    return 1 if jax.default_backend() == "cpu" else 0
  return client_chunk


def _save_checkpoint(workdir: str, state: fedavg.ServerState) -> None:
  payload = flax.serialization.to_bytes(jax.device_get(state))
  io_lib.write_bytes(os.path.join(workdir, CHECKPOINT_FILE), payload)


def _load_checkpoint(workdir: str, template: fedavg.ServerState
                     ) -> Optional[fedavg.ServerState]:
  path = os.path.join(workdir, CHECKPOINT_FILE)
  if not os.path.exists(path):
    return None
  with open(path, "rb") as f:
    try:
      return flax.serialization.from_bytes(jax.device_get(template), f.read())
    except Exception as e:  # pylint: disable=broad-except
      raise ValueError(f"{path} does not match this configuration's model "
                       f"or optimizer: {e}") from e


def plot_metrics(records: list[dict[str, Any]], path: str) -> None:
  """Writes test accuracy and train loss vs round to ``path`` (PNG)."""
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  rounds = [r["round"] for r in records]
  fig, axes = plt.subplots(1, 2, figsize=(9, 3.5))
  axes[0].plot(rounds, [r["test_accuracy"] for r in records])
  axes[0].set_xlabel("round")
  axes[0].set_ylabel("test accuracy")
  axes[1].plot(rounds, [r["train_loss"] for r in records])
  axes[1].set_xlabel("round")
  axes[1].set_ylabel("train loss")
  fig.tight_layout()
  io_lib.save_figure(fig, path)
  plt.close(fig)


def train_and_evaluate(config: ml_collections.ConfigDict,
                       workdir: str) -> dict[str, Any]:
  """Runs (or resumes) FedAvg as configured; returns the final metrics.

  Args:
    config: a config like :func:`default_config` (missing keys take the
      defaults).
    workdir: output folder (created if needed).

  Returns:
    ``{'state': ServerState, 'metrics': [per-round dicts],
    'diverged_at_round': int or None}``. Every metrics line has ``finite``:
    the round's train loss and all parameters are finite. At the first
    non-finite round the run logs a warning, writes that round's line, saves
    no checkpoint (the last finite one is kept) and stops;
    ``diverged_at_round`` is that round (None when training finished).
    ``state`` is then the non-finite state of that round.

  Raises:
    ValueError: invalid settings, a partition the dataset cannot satisfy, or
      a workdir that holds a different run (left untouched).
  """
  full = default_config()
  full.update(config)
  config = full
  _check_config(config)
  os.makedirs(workdir, exist_ok=True)
  resuming = _check_workdir(config, workdir)

  clients, test, info = build_data(config)
  model = models_lib.get_model(config.model, info.image_shape,
                               info.num_classes, init=config.model_init,
                               conv_impl=config.conv_impl)
  fcfg = build_fedavg_config(config, model)
  data = fedavg.as_client_arrays(clients)
  fedavg.check_setup(fcfg, data)

  keys = fedavg.key_streams(config.seed)
  state = fedavg.init(model, fcfg, keys.init)
  restored = _load_checkpoint(workdir, state) if resuming else None
  start = 0
  if restored is not None:
    state = jax.tree_util.tree_map(jnp.asarray, restored)
    start = int(state.round)
  # Drop metric lines past the checkpoint (and torn lines): atomic rewrite.
  kept = read_metrics(workdir, upto_round=start)
  kept = [r for r in kept if r["round"] <= start]
  io_lib.write_bytes(os.path.join(workdir, METRICS_FILE),
                "".join(json.dumps(r, sort_keys=True) + "\n"
                        for r in kept).encode())
  if not resuming:
    io_lib.write_bytes(os.path.join(workdir, CONFIG_FILE),
                  json.dumps(_config_dict(config), indent=2,
                             sort_keys=True).encode())

  mesh = fedavg.make_mesh(config.num_devices) if config.num_devices > 1 else None
  round_fn = fedavg.make_round(model, fcfg, mesh=mesh,
                               eval_global_loss=config.eval_global_loss)
  logger.info("Run: %s on %s, %d clients, rounds %d -> %d%s", config.model,
              config.dataset, clients.num_clients, start, config.rounds,
              " (resumed)" if start else "")
  t_start = t0 = time.time()
  done_here = 0
  diverged_at = None
  for r in range(start, config.rounds):
    state, metrics = round_fn(state, data, keys, test=test)
    metrics = jax.device_get(metrics)
    finite = bool(np.isfinite(metrics["train_loss"])) and all(
        bool(np.all(np.isfinite(leaf))) for leaf in
        jax.tree_util.tree_leaves(jax.device_get(state.params)))
    record = {"round": r + 1}
    for k, v in metrics.items():
      if k in ("client_ids", "weights"):
        record[k] = np.asarray(v).tolist()
      else:
        record[k] = float(v)
    record["finite"] = finite
    _append_line(os.path.join(workdir, METRICS_FILE), record)
    if not finite:
      diverged_at = r + 1
      msg = (f"round {r + 1}: non-finite loss or parameters; stopping "
             "(last checkpoint kept).")
      logger.warning(msg)
      print(msg, flush=True)
      break
    done_here += 1
    if done_here == 1:
      t0 = time.time()  # Rates exclude the first round (compilation).
    if (r + 1) % config.checkpoint_every == 0 or r + 1 == config.rounds:
      _save_checkpoint(workdir, state)
    if (r + 1) % config.log_every == 0 or r + 1 == config.rounds:
      rate = (done_here - 1) / max(time.time() - t0, 1e-9) if done_here > 1 \
          else 1.0 / max(time.time() - t_start, 1e-9)
      eta = (config.rounds - r - 1) / max(rate, 1e-9)
      msg = (f"round {r + 1}/{config.rounds} loss {record['train_loss']:.4f} "
             f"acc {record.get('test_accuracy', float('nan')):.4f} "
             f"{rate:.2f} rounds/s ETA {eta:.0f}s")
      logger.info(msg)
      print(msg, flush=True)
  records = read_metrics(workdir)
  if config.plot and records:
    plot_metrics(records, os.path.join(workdir, PLOT_FILE))
  return {"state": state, "metrics": records,
          "diverged_at_round": diverged_at}
