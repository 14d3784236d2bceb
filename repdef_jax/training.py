"""A resumable FedAvg run: data, partition, model, defense, rounds, checkpoints.

The library behind ``python -m experiments.fedavg`` (flax examples style:
the entry point only parses flags). :func:`train_and_evaluate` trains FedAvg
(McMahan et al. 2017) with an optional defense at every local step (Sun et
al. 2021, defended FedAvg) using :mod:`repdef_jax.fedavg`, and keeps a
workdir that survives being killed at any moment:

* ``config.json``: the configuration. A workdir whose ``config.json`` differs
  in any setting that changes results is refused with a ValueError and left
  untouched.
* ``data.json``: where the data came from (:func:`data_fingerprint`: the
  source kind of each split, their sizes and a hash of the labels and of the
  partition). A resume that loads other data (say the embedded sample where
  the run started on a TFDS copy) is refused the same way.
* ``checkpoints/<round>/``: orbax checkpoints of the server state every
  ``checkpoint_every`` rounds and at the end, the last
  ``checkpoints_to_keep`` kept. Written asynchronously (training goes on
  while they are written) into a temporary folder renamed when complete, so
  a kill leaves only complete checkpoints; with several processes every
  process writes its shards and process 0 commits.
* ``metrics.jsonl``: one JSON line per round. On resume, lines past the
  checkpoint's round (and any torn line) are dropped by an atomic rewrite, so
  the final file equals an uninterrupted run's.
* ``accuracy.png``: test accuracy (and train loss) vs round.

All randomness is a function of (seed, round, client) (see
:mod:`repdef_jax.fedavg`), so a resumed run is bit-for-bit the uninterrupted
one when it runs with the same runtime settings (:data:`RUNTIME_KEYS`);
``num_devices`` and ``client_chunk`` change the order of float sums, so with
other values it equals it to float rounding.

Several processes (``coordinator_address``, ``num_processes``,
``process_id``, or a cluster environment; :mod:`repdef_jax.distributed`)
run one program: the client mesh spans every process's devices, every
process loads the same data and restores the same checkpoint, and only
process 0 writes ``config.json``, ``metrics.jsonl``, the plot and logs. The
workdir must be on a file system every process sees.
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import json
import logging
import os
import time
from typing import Any, Optional

import jax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
import ml_collections
import numpy as np
import optax
import orbax.checkpoint as ocp

from repdef_jax import data as data_lib
from repdef_jax import distributed
from repdef_jax import fedavg
from repdef_jax import gradients
from repdef_jax import storage
from repdef_jax import models as models_lib
from repdef_jax import partition as partition_lib
from repdef_jax import schedules

logger = logging.getLogger(__name__)

PARTITIONS = ("noniid", "iid", "dirichlet")
CONFIG_FILE = "config.json"
DATA_FILE = "data.json"
CHECKPOINT_DIR = "checkpoints"
LEGACY_CHECKPOINT_FILE = "checkpoint.msgpack"  # Before orbax; refused.
METRICS_FILE = "metrics.jsonl"
PLOT_FILE = "accuracy.png"

# Settings allowed to differ on resume. 'rounds' (a longer run continues a
# shorter one exactly; fewer rounds than the workdir's latest checkpoint is
# refused), 'data_dir' (the data it holds is checked against data.json),
# logging, checkpointing and the processes change no result; 'num_devices'
# and 'client_chunk' change how the clients are split and summed, so results
# at float rounding level.
RUNTIME_KEYS = ("rounds", "data_dir", "log_every", "plot", "num_devices",
                "client_chunk", "checkpoint_every", "checkpoints_to_keep",
                "coordinator_address", "num_processes", "process_id")

# Settings added after runs were saved, with the value every earlier run used:
# a saved config without one is read as having it, so adding a setting does
# not refuse the resume of an older run (nor, in the paper package, reuse of
# its cells).
ADDED_KEYS = {"soteria_q": "q0", "dp_clip_norm": 1.0}


def default_config() -> ml_collections.ConfigDict:
  """Every setting :func:`train_and_evaluate` reads, with defaults."""
  c = ml_collections.ConfigDict()
  c.dataset = "mnist"
  c.data_dir = ""  # "" = TFDS_DATA_DIR or the tfds default.
  c.max_train_examples = 0  # 0 = all; decode only a prefix (quick runs).
  c.max_test_examples = 0
  c.model = "logreg"
  c.model_init = "default"
  c.model_kwargs = ml_collections.ConfigDict()  # e.g. {'width': 16}
  c.conv_impl = "auto"  # Per layer and backend (models.resolve_conv_impl).
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
  # soteria only: its perturbation, 'q0' (the closed form) or the name of one
  # registered with defenses.register_perturbation before the run.
  c.soteria_q = "q0"
  # dp_sgd only: the per-example clipping norm C (defense_strength is the
  # noise multiplier sigma; noise N(0, (sigma C)^2)). A FedAvg run computes
  # no epsilon: defenses.dp_sgd_epsilon assumes Poisson-sampled steps, and
  # neither the fixed-size local batches nor the client sampling of the
  # rounds are that (defenses.baselines.dp_sgd).
  c.dp_clip_norm = 1.0
  c.seed = 0
  c.checkpoint_every = 10
  c.checkpoints_to_keep = 3
  c.log_every = 1
  c.eval_global_loss = False
  c.eval_batch = 1000
  # Clients per vectorized chunk; -1 = auto: 1 on CPU (a sequence of plain
  # matmuls beats XLA's CPU batched ones), all at once on GPU/TPU.
  c.client_chunk = -1
  # > 1: shard clients over a 'clients' mesh axis of that many devices; 0:
  # all devices; 1: one device; -1 (auto): on CPU the host devices when
  # there are several (REPDEF_JAX_CPU_DEVICES, fedavg.client_mesh), else
  # one device. A multi-process run always
  # uses every process's devices.
  c.num_devices = -1
  # Multi-process runs (docs/scaling.md): "host:port" of process 0, the
  # number of processes and this one's id. "" = $JAX_COORDINATOR_ADDRESS
  # (with num_processes and process_id), else the cluster environment if any
  # (SLURM, Open MPI, multi-host TPU), else one process.
  c.coordinator_address = ""
  c.num_processes = 1
  c.process_id = 0
  c.plot = True
  return c


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
  if config.defense == "dp_sgd" and config.defense_at == "update":
    raise ValueError("defense_at='update' hands dp_sgd the model change, "
                     "but it computes its own gradient from a batch: use "
                     "defense_at='step'.")
  if not config.replace and config.clients_per_round > config.num_clients:
    raise ValueError(
        f"clients_per_round={config.clients_per_round} exceeds "
        f"num_clients={config.num_clients} (sampling without replacement).")
  if config.checkpoint_every < 1:
    raise ValueError(f"checkpoint_every must be >= 1, got "
                     f"{config.checkpoint_every}.")
  if config.checkpoints_to_keep < 1:
    raise ValueError(f"checkpoints_to_keep must be >= 1, got "
                     f"{config.checkpoints_to_keep}.")
  if config.num_devices < -1:
    raise ValueError(f"num_devices must be >= -1 (-1 = auto, 0 = all), got "
                     f"{config.num_devices}.")
  if config.log_every < 1:
    raise ValueError(f"log_every must be >= 1 (rounds between progress "
                     f"lines), got {config.log_every}.")
  if config.eval_batch < 1:
    raise ValueError(f"eval_batch must be >= 1, got {config.eval_batch}.")
  schedules.check_rate(config.server_lr, "server_lr",
                       "a finite number > 0 (1.0 = plain FedAvg)")
  # Names checked here, before the workdir is made and the data loaded.
  data_lib.get_info(config.dataset)
  if config.partition not in PARTITIONS:
    raise ValueError(f"partition must be one of {', '.join(PARTITIONS)}; "
                     f"got {config.partition!r}.")
  if config.lr_schedule == "constant":
    schedules.check_rate(config.client_lr, "client_lr", "a finite number > 0")
  elif config.lr_schedule == "theorem2":
    schedules.theorem2_gamma(config.mu, config.smoothness,
                             max(config.local_steps, 1))
  else:
    schedules.get_schedule(config.lr_schedule)  # Raises, naming the choices.
  from repdef_jax import defenses  # pylint: disable=g-import-not-at-top
  if config.defense not in defenses.DEFENSE_NAMES:
    raise ValueError(f"defense must be one of "
                     f"{', '.join(defenses.DEFENSE_NAMES)}; got "
                     f"{config.defense!r}.")
  if config.defense == "soteria" and (
      config.soteria_q not in defenses.soteria.PERTURBATIONS):
    raise ValueError(
        f"soteria_q must name a registered perturbation, one of "
        f"{tuple(defenses.soteria.PERTURBATIONS)} ('q0': the paper's "
        f"q = 0); got {config.soteria_q!r}.")
  defenses.check_strength(config.defense, config.defense_strength,
                          "defense_strength", q=config.soteria_q)
  if config.defense == "soteria":
    if config.soteria_score not in defenses.soteria.SCORES:
      raise ValueError(f"soteria_score must be one of "
                       f"{', '.join(defenses.soteria.SCORES)}; got "
                       f"{config.soteria_score!r}.")


def _check_workdir(config: ml_collections.ConfigDict, workdir: str) -> bool:
  """Raises on a workdir of a different run; returns whether it holds one."""
  path = os.path.join(workdir, CONFIG_FILE)
  if not os.path.exists(path):
    ckpt_dir = os.path.join(workdir, CHECKPOINT_DIR)
    if (os.path.exists(os.path.join(workdir, LEGACY_CHECKPOINT_FILE)) or
        (os.path.isdir(ckpt_dir) and os.listdir(ckpt_dir))):
      raise ValueError(f"{workdir} holds a checkpoint but no {CONFIG_FILE}; "
                       "refusing to overwrite it. Use another --workdir.")
    return False
  with open(path) as f:
    saved = {**ADDED_KEYS, **json.load(f)}
  new = _config_dict(config)
  diff = sorted(k for k in set(saved) | set(new)
                if k not in RUNTIME_KEYS and saved.get(k) != new.get(k))
  if diff:
    details = ", ".join(f"{k}: {saved.get(k)!r} -> {new.get(k)!r}"
                        for k in diff)
    raise ValueError(
        f"{workdir} holds a run with a different configuration ({details}). "
        "Nothing was changed; use another --workdir or the saved settings.")
  if (os.path.exists(os.path.join(workdir, LEGACY_CHECKPOINT_FILE)) and
      not os.path.exists(os.path.join(workdir, CHECKPOINT_DIR))):
    raise ValueError(
        f"{workdir} holds {LEGACY_CHECKPOINT_FILE}, a checkpoint of an older "
        f"repdef_jax (one flax msgpack file; checkpoints are now orbax "
        f"folders in {CHECKPOINT_DIR}/): finish it with the version that "
        "wrote it, or start over in another --workdir.")
  latest = latest_checkpoint_round(workdir)
  if latest is not None and latest > config.rounds:
    raise ValueError(
        f"{workdir} holds a checkpoint at round {latest}, past "
        f"rounds={config.rounds}; nothing was changed. Pass rounds >= "
        f"{latest} to continue it, or use another --workdir.")
  return True


def latest_checkpoint_round(workdir: str) -> int | None:
  """The round of the workdir's latest checkpoint (None when it has none)."""
  ckpt_dir = os.path.join(workdir, CHECKPOINT_DIR)
  steps = [int(n) for n in (os.listdir(ckpt_dir) if os.path.isdir(ckpt_dir)
                            else ()) if n.isdigit()]
  return max(steps, default=None)


def data_fingerprint(train_source: data_lib.Source, labels: Any,
                     partition: Any, test_source: data_lib.Source,
                     test_labels: Any) -> dict[str, Any]:
  """What a run trains and evaluates on, compared on resume (``data.json``).

  Args:
    train_source: where the training split came from
      (:func:`repdef_jax.data.load_with_source`).
    labels: the training labels ``[N]``.
    partition: one index array per client.
    test_source: where the test split came from.
    test_labels: the test labels.

  Returns:
    ``{'train_source', 'train_examples', 'test_source', 'test_examples',
    'sha256'}``: the source kinds ('tfds', 'download', 'sample'), the split
    sizes and a SHA-256 of the labels and of the partition's indices. The
    folder is left out: moving a dataset (``data_dir`` is a runtime key)
    keeps the fingerprint.
  """
  digest = hashlib.sha256()
  for array in (labels, *partition, test_labels):
    array = np.ascontiguousarray(array, np.int64)
    digest.update(np.int64(array.size).tobytes())
    digest.update(array.tobytes())
  return {"train_source": train_source.kind, "train_examples": len(labels),
          "test_source": test_source.kind, "test_examples": len(test_labels),
          "sha256": digest.hexdigest()}


def _describe_data(fingerprint: dict[str, Any]) -> str:
  f = fingerprint
  return (f"train: {f.get('train_source')}, {f.get('train_examples')} "
          f"examples; test: {f.get('test_source')}, "
          f"{f.get('test_examples')} examples; sha256 "
          f"{str(f.get('sha256'))[:12]}")


def _check_data(workdir: str, fingerprint: dict[str, Any]) -> None:
  """Raises when a resumed run loads other data than it started on."""
  saved = storage.read_json(os.path.join(workdir, DATA_FILE))
  if saved is not None and saved != fingerprint:
    raise ValueError(
        f"{workdir} holds a run started on other data ({_describe_data(saved)})"
        f" than this one loads ({_describe_data(fingerprint)}); nothing was "
        "changed. Resume with the data the run started on (data_dir, "
        "TFDS_DATA_DIR) or use another --workdir.")


def build_data(config: ml_collections.ConfigDict,
               with_fingerprint: bool = False):
  """Loads the dataset and partitions it.

  Args:
    config: the run's config.
    with_fingerprint: also return the data's :func:`data_fingerprint`.

  Returns:
    ``(ClientData, EvalData, DatasetInfo)``, and the fingerprint as a fourth
    item with ``with_fingerprint``.
  """
  info = data_lib.get_info(config.dataset)
  data_dir = config.data_dir or None
  images, labels, train_source = data_lib.load_with_source(
      config.dataset, "train", data_dir,
      max_examples=config.max_train_examples or None)
  test_x, test_y, test_source = data_lib.load_with_source(
      config.dataset, "test", data_dir,
      max_examples=config.max_test_examples or None)
  idx = client_indices(config, labels, info.num_classes)
  # Packed first, then scaled: only the clients' images become float32.
  clients = partition_lib.pack(images, labels, idx)
  clients = clients.replace(x=data_lib.to_float(clients.x))
  test = fedavg.make_eval_data(data_lib.to_float(test_x),
                               np.asarray(test_y, np.int32), config.eval_batch)
  if not with_fingerprint:
    return clients, test, info
  return clients, test, info, data_fingerprint(train_source, labels, idx,
                                               test_source, test_y)


def client_indices(config: ml_collections.ConfigDict, labels: Any,
                   num_classes: int) -> list[np.ndarray]:
  """Each client's indices into the training split, by ``config.partition``.

  Raises:
    ValueError: an unknown partition, or one the labels cannot satisfy.
  """
  if config.partition == "noniid":
    return partition_lib.noniid(
        labels, num_clients=config.num_clients,
        classes_per_client=config.classes_per_client,
        samples_per_class=config.samples_per_class, seed=config.seed,
        num_classes=num_classes)
  if config.partition == "iid":
    return partition_lib.iid(len(labels), num_clients=config.num_clients,
                             samples_per_client=config.samples_per_client,
                             seed=config.seed)
  if config.partition == "dirichlet":
    return partition_lib.dirichlet(labels, num_clients=config.num_clients,
                                   alpha=config.dirichlet_alpha,
                                   seed=config.seed)
  raise ValueError(f"partition must be one of {', '.join(PARTITIONS)}; "
                   f"got {config.partition!r}.")


def build_fedavg_config(config: ml_collections.ConfigDict,
                        model: models_lib.Model,
                        padded_size: Optional[int] = None
                        ) -> fedavg.FedAvgConfig:
  """The :class:`repdef_jax.fedavg.FedAvgConfig` of a run config.

  Args:
    config: the run's config.
    model: its model (for the defense).
    padded_size: the clients' padded size M (``ClientData.max_examples``);
      needed by ``lr_schedule='theorem2'`` with ``local_epochs > 0``, whose
      steps per round (gamma's I) depend on it.

  Raises:
    ValueError: invalid schedule settings, or theorem2 with local_epochs and
      no padded_size.
  """
  if config.lr_schedule == "theorem2":
    steps = config.local_steps
    if config.local_epochs > 0:
      if padded_size is None:
        raise ValueError("lr_schedule='theorem2' with local_epochs > 0 needs "
                         "padded_size (the steps per round depend on it).")
      steps = fedavg.FedAvgConfig(
          local_epochs=config.local_epochs,
          batch_size=config.batch_size).steps_per_round(padded_size)
    lr = schedules.theorem2(config.mu, config.smoothness, max(steps, 1))
  else:
    lr = schedules.get_schedule(config.lr_schedule, config.client_lr)
  defense = None
  if config.defense != "none":
    from repdef_jax import defenses  # pylint: disable=g-import-not-at-top
    kwargs = ({"score": config.soteria_score, "q": config.soteria_q}
              if config.defense == "soteria" else
              {"clip_norm": config.dp_clip_norm}
              if config.defense == "dp_sgd" else {})
    defense = defenses.get_defense(config.defense, config.defense_strength,
                                   model=model, **kwargs)
  return fedavg.FedAvgConfig(
      clients_per_round=config.clients_per_round,
      local_steps=config.local_steps, local_epochs=config.local_epochs,
      batch_size=config.batch_size, client_lr=lr, l2=config.l2,
      defense=defense, defense_at=config.defense_at,
      weighting=config.weighting, replace=config.replace,
      server_optimizer=optax.sgd(config.server_lr),
      client_chunk=fedavg.resolve_client_chunk(config.client_chunk))


class OrbaxInfoFilter(logging.Filter):
  """Drops orbax's INFO lines (about 40 per checkpoint); keeps its warnings."""

  def filter(self, record: logging.LogRecord) -> bool:
    orbax = f"{os.sep}orbax{os.sep}" in (record.pathname or "")
    return record.levelno >= logging.WARNING or not orbax


def _quiet_orbax() -> None:
  """Installs :class:`OrbaxInfoFilter` on absl's logger (orbax logs there)."""
  absl_logger = logging.getLogger("absl")
  if not any(isinstance(f, OrbaxInfoFilter) for f in absl_logger.filters):
    absl_logger.addFilter(OrbaxInfoFilter())


def _checkpoint_manager(workdir: str, keep: int = 3) -> ocp.CheckpointManager:
  """The orbax manager of a workdir's ``checkpoints/`` (async, last ``keep``).

  Unfinished checkpoints a kill left behind are removed when it starts. Call
  ``close()`` when done: it waits for a save in flight. orbax's INFO lines
  are dropped (:class:`OrbaxInfoFilter`).
  """
  _quiet_orbax()
  options = ocp.CheckpointManagerOptions(
      max_to_keep=keep, create=True, enable_async_checkpointing=True,
      enable_background_delete=True, cleanup_tmp_directories=True)
  return ocp.CheckpointManager(
      os.path.abspath(os.path.join(workdir, CHECKPOINT_DIR)), options=options)


class _Saver:
  """Saves through ``manager``; with one process from a worker thread.

  orbax's asynchronous save still blocks for its synchronous part (folders,
  metadata, device-to-host copies); in a one-process run a worker thread
  takes that too, so the round loop does not wait. Saves stay in order (a
  save waits for the previous one to be handed over). Several processes
  save from the main thread: orbax synchronises them there.
  """

  def __init__(self, manager: ocp.CheckpointManager):
    self.manager = manager
    self._pool = (concurrent.futures.ThreadPoolExecutor(1)
                  if jax.process_count() == 1 else None)
    self._pending = None

  def save(self, step: int, state: fedavg.ServerState) -> None:
    args = ocp.args.StandardSave(state)
    if self._pool is None:
      self.manager.save(step, args=args)
      return
    self._handed_over()
    self._pending = self._pool.submit(self.manager.save, step, args=args)

  def _handed_over(self) -> None:
    if self._pending is not None:
      pending, self._pending = self._pending, None
      pending.result()  # Raises the save's error, if any.

  def wait(self) -> None:
    """Until every save is complete on disk."""
    self._handed_over()
    self.manager.wait_until_finished()

  def close(self) -> None:
    try:
      self.wait()
    finally:
      self.manager.close()
      if self._pool is not None:
        self._pool.shutdown()


def _restore_checkpoint(manager: ocp.CheckpointManager,
                       template: fedavg.ServerState,
                       step: Optional[int] = None
                       ) -> Optional[fedavg.ServerState]:
  """The state saved at ``step`` (default: the latest), shaped and placed as
  ``template``; None when there is no checkpoint.

  Raises:
    ValueError: the checkpoint does not fit ``template``'s model/optimizer.
  """
  step = manager.latest_step() if step is None else step
  if step is None:
    return None
  abstract = jax.tree_util.tree_map(ocp.utils.to_shape_dtype_struct, template)
  try:
    return manager.restore(step, args=ocp.args.StandardRestore(abstract))
  except Exception as e:  # pylint: disable=broad-except
    raise ValueError(f"checkpoint {step} in {manager.directory} does not match "
                     f"this configuration's model or optimizer: {e}") from e


def load_checkpoint(workdir: str, step: Optional[int] = None
                    ) -> Optional[dict[str, Any]]:
  """A run's saved server state as host arrays (e.g. its final model).

  Args:
    workdir: the run's folder.
    step: the round (default: the latest checkpoint).

  Returns:
    ``{'params': ..., 'opt_state': ..., 'round': ...}`` (NumPy leaves), or
    None when the workdir holds no checkpoint.
  """
  folder = os.path.abspath(os.path.join(workdir, CHECKPOINT_DIR))
  if not os.path.isdir(folder):
    return None
  with ocp.CheckpointManager(
      folder, item_handlers=ocp.StandardCheckpointHandler(),
      options=ocp.CheckpointManagerOptions(read_only=True)) as manager:
    step = manager.latest_step() if step is None else step
    if step is None:
      return None
    meta = manager.item_metadata(step)
    # On this process's first CPU device, whatever devices wrote it.
    host = jax.sharding.SingleDeviceSharding(
        jax.local_devices(backend="cpu")[0])
    abstract = jax.tree_util.tree_map(
        lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype, sharding=host),
        getattr(meta, "tree", meta))
    tree = manager.restore(step, args=ocp.args.StandardRestore(abstract))
  return jax.tree_util.tree_map(np.asarray, tree)


def _replicate(tree: Any, mesh: jax.sharding.Mesh) -> Any:
  """Every leaf copied to every device of ``mesh`` (all processes' devices)."""
  sharding = NamedSharding(mesh, P())

  def put(leaf):
    if jax.dtypes.issubdtype(leaf.dtype, jax.dtypes.prng_key):
      impl = jax.random.key_impl(leaf)
      data = put(jax.random.key_data(leaf))
      return jax.random.wrap_key_data(data, impl=impl)
    host = np.asarray(leaf)
    return jax.make_array_from_callback(host.shape, sharding,
                                        lambda idx: host[idx])

  return jax.tree_util.tree_map(put, tree)


def plot_metrics(records: list[dict[str, Any]], path: str) -> None:
  """Writes test accuracy and train loss vs round to ``path`` (PNG)."""
  plt = storage.pyplot()
  rounds = [r["round"] for r in records]
  fig, axes = plt.subplots(1, 2, figsize=(9, 3.5))
  axes[0].plot(rounds, [r["test_accuracy"] for r in records])
  axes[0].set_xlabel("round")
  axes[0].set_ylabel("test accuracy")
  axes[1].plot(rounds, [r["train_loss"] for r in records])
  axes[1].set_xlabel("round")
  axes[1].set_ylabel("train loss")
  fig.tight_layout()
  storage.save_figure(fig, path)
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
      a workdir that holds a different run: another configuration, other
      data (``data.json``) or a checkpoint past ``rounds`` (left untouched).
  """
  full = default_config()
  full.update(config)
  config = full
  _check_config(config)
  multi = distributed.initialize(config.coordinator_address,
                                 config.num_processes, config.process_id)
  primary = distributed.is_primary()
  os.makedirs(workdir, exist_ok=True)
  resuming = _check_workdir(config, workdir)
  distributed.barrier("repdef_jax.training: workdir checked")

  clients, test, info, fingerprint = build_data(config, with_fingerprint=True)
  if resuming:
    _check_data(workdir, fingerprint)
  model = models_lib.get_model(config.model, info.image_shape,
                               info.num_classes, init=config.model_init,
                               conv_impl=config.conv_impl,
                               **config.model_kwargs.to_dict())
  fcfg = build_fedavg_config(config, model, clients.max_examples)
  data = fedavg.as_client_arrays(clients)
  fedavg.check_setup(fcfg, data)

  data_path = os.path.join(workdir, DATA_FILE)
  if primary and (not resuming or not os.path.exists(data_path)):
    # Before config.json: a workdir with a config always has it (runs older
    # than data.json get it on their first resume).
    storage.write_json(data_path, fingerprint)
  if primary and not resuming:
    storage.write_bytes(os.path.join(workdir, CONFIG_FILE),
                        json.dumps(_config_dict(config), indent=2,
                                   sort_keys=True).encode())

  keys = fedavg.key_streams(config.seed)
  state = fedavg.init(model, fcfg, keys.init)
  if multi or config.num_devices not in (-1, 1):
    # 0 = all devices; several processes always use all (1 and -1 included).
    mesh = fedavg.make_mesh(None if config.num_devices == 0 or (
        multi and config.num_devices in (-1, 1)) else config.num_devices)
  else:
    mesh = fedavg.client_mesh("auto" if config.num_devices == -1 else None,
                              fcfg.clients_per_round)
  if mesh is not None:
    # Placed once on every device (of every process), not at every round.
    state, data, test, keys = _replicate((state, data, test, keys), mesh)
  saver = _Saver(_checkpoint_manager(workdir, config.checkpoints_to_keep))
  try:
    return _train(config, workdir, saver, model, fcfg, state, data, test,
                  keys, mesh, primary, resuming, clients.num_clients)
  finally:
    saver.close()  # Waits for a save in flight.


def _train(config, workdir, saver, model, fcfg, state, data, test, keys,
           mesh, primary, resuming, num_clients):
  """The round loop of :func:`train_and_evaluate`."""
  restored = _restore_checkpoint(saver.manager, state) if resuming else None
  start = 0
  if restored is not None:
    state = restored
    start = int(state.round)
  if primary:
    # Drop metric lines past the checkpoint (and torn lines): atomic rewrite.
    kept = read_metrics(workdir, upto_round=start)
    storage.write_bytes(os.path.join(workdir, METRICS_FILE),
                        "".join(json.dumps(r, sort_keys=True) + "\n"
                                for r in kept).encode())

  round_fn = fedavg.make_round(model, fcfg, mesh=mesh,
                               eval_global_loss=config.eval_global_loss)
  log = logger.info if primary else logger.debug
  log("Run: %s on %s, %d clients, rounds %d -> %d%s", config.model,
      config.dataset, num_clients, start, config.rounds,
      " (resumed)" if start else "")
  t_start = t0 = time.time()
  done_here = 0
  diverged_at = None
  for r in range(start, config.rounds):
    state, metrics = round_fn(state, data, keys, test=test)
    metrics = jax.device_get(metrics)
    finite = (bool(np.isfinite(metrics["train_loss"]))
              and gradients.all_finite(state.params))
    record = {"round": r + 1}
    for k, v in metrics.items():
      if k in ("client_ids", "weights"):
        record[k] = np.asarray(v).tolist()
      else:
        record[k] = float(v)
    record["finite"] = finite
    if primary:
      _append_line(os.path.join(workdir, METRICS_FILE), record)
    if not finite:
      diverged_at = r + 1
      if primary:
        msg = (f"round {r + 1}: non-finite loss or parameters; stopping "
               "(last checkpoint kept).")
        logger.warning(msg)
        print(msg, flush=True)
      break
    done_here += 1
    if done_here == 1:
      t0 = time.time()  # Rates exclude the first round (compilation).
    if (r + 1) % config.checkpoint_every == 0 or r + 1 == config.rounds:
      saver.save(r + 1, state)
    if primary and ((r + 1) % config.log_every == 0 or r + 1 == config.rounds):
      rate = (done_here - 1) / max(time.time() - t0, 1e-9) if done_here > 1 \
          else 1.0 / max(time.time() - t_start, 1e-9)
      eta = (config.rounds - r - 1) / max(rate, 1e-9)
      msg = (f"round {r + 1}/{config.rounds} loss {record['train_loss']:.4f} "
             f"acc {record.get('test_accuracy', float('nan')):.4f} "
             f"{rate:.2f} rounds/s ETA {eta:.0f}s")
      logger.info(msg)
      if not data_lib.quiet():
        print(msg, flush=True)
  saver.wait()
  distributed.barrier("repdef_jax.training: done")
  records = read_metrics(workdir)
  if primary and config.plot and records:
    plot_metrics(records, os.path.join(workdir, PLOT_FILE))
  return {"state": state, "metrics": records,
          "diverged_at_round": diverged_at}
