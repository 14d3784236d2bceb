"""Soteria and the other defenses inside Flower deployments; an auditing server.

For Flower's Message API (``flwr.clientapp.ClientApp``,
``flwr.serverapp.ServerApp``, ``ArrayRecord``; tested with flwr 1.42):

* :func:`make_client_app`: a ``ClientApp`` whose train step is the jitted
  :func:`repdef_jax.fedavg.client_update` with any registered defense (at
  every local step or on the update, :class:`repdef_jax.fedavg.FedAvgConfig`),
  parameters exchanged as Flower arrays keyed by flattened pytree paths
  (:func:`to_arrays`), defense statistics returned as metrics;
* :func:`defense_mod`: a Flower mod applying an update-level defense to any
  ClientApp's reply; it composes with Flower's own clipping / DP mods;
* :class:`AuditingFedAvg`: Flower's ``FedAvg`` that first runs a
  gradient-inversion attack (DLG, GS, their adaptive variants, or
  representation inference) on every update it receives and logs
  reconstruction metrics and images per round: an honest-but-curious server
  inside a real deployment;
* :class:`InProcessGrid` / :func:`run_in_process`: a Flower ``Grid`` that
  runs the ClientApps in this process (no Ray, no network), for tests and
  notebooks; messages go through Flower's protobuf serialization.

A worked app for ``flwr run`` is in ``examples/flower_app/``; costs and when
to use Flower: ``docs/scaling.md``.

References:
  Beutel et al., "Flower: A Friendly Federated Learning Research Framework",
  arXiv:2007.14390, 2020. McMahan et al., "Communication-Efficient Learning
  of Deep Networks from Decentralized Data", AISTATS 2017. Sun et al.,
  "Provable Defense against Privacy Leakage in Federated Learning from
  Representation Perspective", CVPR 2021.

Departures:

* A client replies with its local parameters ``w_global + delta`` (Flower's
  convention, which its clipping mods rely on) and weight ``num-examples``
  (its real examples); with equal client sizes Flower's weighted mean is
  the uniform mean of :mod:`repdef_jax.fedavg`.
* The client's PRNG keys are :func:`repdef_jax.fedavg.client_keys` of
  (round - 1, partition id), so a Flower round draws what
  :func:`repdef_jax.fedavg.make_round` draws for the same client ids.
* The auditing server turns an update into a gradient
  ``-delta / (lr * steps)``: exact for one local step of plain SGD on one
  batch (the FedSGD setting of the attack papers), an approximation for
  several local steps.
"""

from __future__ import annotations

import json
import logging
import numbers
import os
import uuid
from typing import Any, Callable, Iterable, Optional, Sequence

try:
  from flwr.app import Array
  from flwr.app import ArrayRecord
  from flwr.app import ConfigRecord
  from flwr.app import Context
  from flwr.app import Error
  from flwr.app import Message
  from flwr.app import MessageType
  from flwr.app import MetricRecord
  from flwr.app import RecordDict
  from flwr.clientapp import ClientApp
  from flwr.common.constant import ErrorCode
  from flwr.serverapp import Grid
  from flwr.serverapp.strategy import FedAvg
except ImportError as e:  # pragma: no cover - depends on the environment.
  raise ImportError(
      "repdef_jax.integrations.flower needs Flower: pip install "
      "'repdef_jax[flower]' (or pip install flwr).") from e

import jax
import jax.numpy as jnp
import numpy as np

from repdef_jax import attacks as attacks_lib
from repdef_jax import fedavg
from repdef_jax import metrics as metrics_lib
from repdef_jax import models as models_lib
from repdef_jax import schedules
from repdef_jax import storage
from repdef_jax.attacks import base as attacks_base
from repdef_jax.attacks import repinfer
from repdef_jax.defenses import base as defenses_base

logger = logging.getLogger(__name__)

Params = Any
# load_data(context) -> (x [M, H, W, C] in [0, 1], y [M], mask [M] or None).
LoadData = Callable[[Context], tuple[Any, Any, Any]]

ARRAYS_KEY = "arrays"  # Flower FedAvg's arrayrecord_key.
METRICS_KEY = "metrics"
CLIENT_KEY = "client"  # Reply ConfigRecord: {'partition-id': int}.
PARTITION_ID = "partition-id"
NUM_PARTITIONS = "num-partitions"
WEIGHT_KEY = "num-examples"
REPINFER = "repinfer"
AUDIT_ATTACKS = attacks_lib.ATTACK_NAMES + (REPINFER,)


# --------------------------------------------------------------------------
# Parameters <-> Flower arrays.


def _path_key(path) -> str:
  parts = []
  for p in path:
    for attr in ("key", "name", "idx"):
      if hasattr(p, attr):
        parts.append(str(getattr(p, attr)))
        break
    else:
      parts.append(str(p))
  return "/".join(parts)


def array_keys(params: Params) -> list[str]:
  """The stable keys of ``params``' leaves: flattened paths, e.g.
  ``'head/kernel'``, in ``jax.tree_util`` order."""
  return [_path_key(path) for path, _ in
          jax.tree_util.tree_flatten_with_path(params)[0]]


def to_arrays(params: Params) -> ArrayRecord:
  """``params`` as a Flower ``ArrayRecord`` keyed by :func:`array_keys`."""
  leaves = jax.tree_util.tree_leaves(params)
  return ArrayRecord({k: Array(np.asarray(v)) for k, v in
                      zip(array_keys(params), jax.device_get(leaves))})


def from_arrays(record: ArrayRecord, template: Params) -> Params:
  """The pytree shaped like ``template`` from a Flower ``ArrayRecord``.

  Args:
    record: arrays keyed by :func:`array_keys` (any order).
    template: a pytree (or its ``jax.eval_shape``) giving structure, shapes
      and dtypes; a record in another float dtype is cast to them.

  Raises:
    ValueError: keys or shapes that do not match ``template``.
  """
  keys = array_keys(template)
  if sorted(record.keys()) != sorted(keys):
    raise ValueError(f"the arrays {sorted(record.keys())} do not match the "
                     f"model's parameters {sorted(keys)}.")
  leaves, treedef = jax.tree_util.tree_flatten(template)
  out = []
  for k, t in zip(keys, leaves):
    a = record[k].numpy()
    if tuple(a.shape) != tuple(t.shape):
      raise ValueError(f"array {k!r} has shape {a.shape}; the model's "
                       f"parameter has {tuple(t.shape)}.")
    out.append(jnp.asarray(a, t.dtype))
  return jax.tree_util.tree_unflatten(treedef, out)


def _only(records: dict, kind: str, message: Message):
  if len(records) != 1:
    raise ValueError(f"expected one {kind} in the "
                     f"{message.metadata.message_type} message, got "
                     f"{len(records)}.")
  return next(iter(records.items()))


def _server_round(message: Message) -> int:
  for rec in message.content.config_records.values():
    if "server-round" in rec:
      return int(rec["server-round"])
  raise ValueError("the message's ConfigRecord has no 'server-round'.")


def client_id(context: Context) -> int:
  """The client id a node trains as: its ``partition-id`` node setting."""
  if PARTITION_ID not in context.node_config:
    raise ValueError(
        f"node {context.node_id} has no '{PARTITION_ID}' in its node config "
        "(flower-supernode --node-config 'partition-id=0 num-partitions=2').")
  return int(context.node_config[PARTITION_ID])


def audit_key(seed: int, server_round: int, client: int) -> jax.Array:
  """The auditor's attack key for one client's update in one round.

  Its own stream of ``seed``: index ``len(fedavg.STREAMS)`` of the root
  that :func:`repdef_jax.fedavg.key_streams` splits into indices
  ``0 .. len(STREAMS) - 1``, folded with the round, then the client; so no
  attack draw reuses a key of the training run it audits.

  Args:
    seed: the run's seed.
    server_round: Flower's round (from 1).
    client: the client's partition id (or its reply's index).
  """
  stream = jax.random.fold_in(jax.random.key(int(seed)), len(fedavg.STREAMS))
  return jax.random.fold_in(jax.random.fold_in(stream, server_round), client)


def _host_metrics(info: dict[str, Any]) -> dict[str, float]:
  return {k: float(v) for k, v in jax.device_get(info).items()
          if k.startswith("defense/")}


# --------------------------------------------------------------------------
# Client.


_CLIENT_FNS: dict[Any, Any] = {}


def _client_fns(model: models_lib.Model, config: fedavg.FedAvgConfig,
                seed: int):
  """Jitted (update, evaluate) of a client, shared by apps of one config."""
  cache_key = (id(model), id(config), int(seed))
  if cache_key not in _CLIENT_FNS:
    keys = fedavg.key_streams(seed)

    @jax.jit
    def update(params, x, y, mask, round_, cid):
      tk, nk = fedavg.client_keys(keys, round_, cid)
      return fedavg.client_update(model, config, params, x, y, mask, tk, nk,
                                  round_)

    @jax.jit
    def evaluate(params, x, y, mask):
      return fedavg.evaluate(model, params,
                             fedavg.EvalData(x[None], y[None], mask[None]))

    _CLIENT_FNS[cache_key] = (update, evaluate, model, config)  # Keeps ids.
  return _CLIENT_FNS[cache_key][:2]


def _node_data(load_data: LoadData, context: Context
               ) -> tuple[jax.Array, jax.Array, jax.Array]:
  """The node's ``(x float32, y int32, mask float32)``; no mask: all real."""
  x, y, mask = load_data(context)
  x = jnp.asarray(x, jnp.float32)
  mask = (jnp.ones(x.shape[:1], jnp.float32) if mask is None
          else jnp.asarray(mask, jnp.float32))
  return x, jnp.asarray(y, jnp.int32), mask


def make_client_app(model: models_lib.Model, config: fedavg.FedAvgConfig,
                    load_data: LoadData, *, seed: int = 0,
                    mods: Optional[Sequence[Any]] = None) -> ClientApp:
  """A Flower ``ClientApp`` training with :func:`fedavg.client_update`.

  Train messages carry the global parameters (one ``ArrayRecord``) and a
  ``ConfigRecord`` with ``server-round``; the reply carries the local
  parameters, a ``MetricRecord`` (``num-examples``, ``train_loss``,
  ``steps`` and the defense's statistics as ``defense/<name>``, e.g.
  ``defense/effective_pruned_fraction``) and a ``ConfigRecord`` ``client``
  with the partition id. Evaluate messages reply ``eval_loss`` and
  ``eval_accuracy`` on the node's data.

  Args:
    model: the model.
    config: local training and defense (``defense``, ``defense_at``); its
      sampling and server settings are not used.
    load_data: ``load_data(context) -> (x, y, mask)``: the node's padded
      examples (``mask`` may be None: all real). Called at every message;
      cache inside it.
    seed: the run's seed (:func:`fedavg.key_streams`).
    mods: Flower mods wrapping the app (e.g. ``[fixedclipping_mod]``).

  Returns:
    The ``ClientApp``.
  """
  models_lib.check_model(model)
  if not isinstance(config, fedavg.FedAvgConfig):
    raise ValueError(f"config must be a fedavg.FedAvgConfig, got "
                     f"{type(config).__name__}.")
  if not callable(load_data):
    raise ValueError(f"load_data must be a function of the node's Context, "
                     f"got {type(load_data).__name__}.")
  fedavg.check_seed(seed)
  config.validate()
  template = jax.eval_shape(model.init, jax.random.key(0))
  update, evaluate = _client_fns(model, config, seed)

  app = ClientApp(mods=list(mods or []))

  @app.train()
  def train(message: Message, context: Context) -> Message:
    _, record = _only(message.content.array_records, "ArrayRecord", message)
    params = from_arrays(record, template)
    x, y, mask = _node_data(load_data, context)
    cid = client_id(context)
    delta, info = update(params, x, y, mask,
                         jnp.int32(_server_round(message) - 1), jnp.int32(cid))
    local = jax.tree_util.tree_map(jnp.add, params, delta)
    metrics = {WEIGHT_KEY: int(jnp.sum(mask > 0)),
               "train_loss": float(info["loss"]),
               "steps": int(info["steps"]), **_host_metrics(info)}
    return Message(RecordDict({
        ARRAYS_KEY: to_arrays(local), METRICS_KEY: MetricRecord(metrics),
        CLIENT_KEY: ConfigRecord({PARTITION_ID: cid})}), reply_to=message)

  @app.evaluate()
  def evaluate_(message: Message, context: Context) -> Message:
    _, record = _only(message.content.array_records, "ArrayRecord", message)
    x, y, mask = _node_data(load_data, context)
    out = jax.device_get(evaluate(from_arrays(record, template), x, y, mask))
    return Message(RecordDict({METRICS_KEY: MetricRecord({
        WEIGHT_KEY: int(jnp.sum(mask > 0)),
        "eval_loss": float(out["test_loss"]),
        "eval_accuracy": float(out["test_accuracy"])})}), reply_to=message)

  return app


def _no_examples(mask: Optional[jax.Array], reply: Message) -> bool:
  """Whether the node trained on no real example (by its mask, else by the
  ``num-examples`` its reply reports)."""
  if mask is not None:
    return not bool(jnp.sum(mask) > 0)
  return any(WEIGHT_KEY in r and r[WEIGHT_KEY] == 0
             for r in reply.content.metric_records.values())


def defense_mod(defense: defenses_base.Defense, *,
                model: Optional[models_lib.Model] = None,
                load_data: Optional[LoadData] = None, seed: int = 0):
  """A Flower mod that defends the update a ClientApp sends.

  On a train reply it takes ``update = returned - sent`` (per array),
  replaces it by ``defense(update, ClientBatch(sent params, x, y, mask),
  noise key)`` and adds the defense's statistics (``defense/<name>``) to the
  reply's ``MetricRecord``: what :func:`fedavg.client_update` does with
  ``defense_at='update'``, for any ClientApp. A node without real examples
  (``load_data``'s mask all zero, or a reply whose ``num-examples`` is 0)
  sends no update, noise included, as in :func:`fedavg.client_update`.
  Place Flower's clipping / DP mods before it in ``mods`` (outer: they then
  see the defended update), e.g.
  ``ClientApp(..., mods=[fixedclipping_mod, defense_mod(...)])``.

  Args:
    defense: an update-level defense (:func:`repdef_jax.get_defense`).
    model: the model whose parameters the arrays hold; needed by defenses
      that look up a layer (Soteria, DP-SGD). Without it the update is a
      flat dict keyed like the arrays.
    load_data: ``load_data(context) -> (x, y, mask)``, the node's examples,
      for defenses that need them (Soteria); None passes no data.
    seed: the run's seed; the noise key is the one
      :func:`fedavg.client_keys` gives the client.

  Returns:
    ``mod(message, context, call_next) -> Message``.
  """
  defenses_base.check_is_defense(defense)
  if defense.recomputes:
    raise ValueError(f"defense_mod defends the update, but defense "
                     f"{defense.name!r} computes its own gradient from a "
                     "batch: apply it at every local step instead "
                     "(FedAvgConfig(defense_at='step')).")
  template = (None if model is None else
              jax.eval_shape(model.init, jax.random.key(0)))
  keys = fedavg.key_streams(seed)
  apply = jax.jit(defense.apply)
  missing = " and ".join(arg for arg, value in (
      ("load_data=", load_data), ("model=", model)) if value is None)

  def as_tree(record):
    if template is not None:
      return from_arrays(record, template)
    return {k: jnp.asarray(v.numpy()) for k, v in record.items()}

  def mod(message: Message, context: Context, call_next) -> Message:
    if message.metadata.message_type != MessageType.TRAIN:
      return call_next(message, context)
    _, sent = _only(message.content.array_records, "ArrayRecord", message)
    reply = call_next(message, context)
    if reply.has_error():
      return reply
    name, returned = _only(reply.content.array_records, "ArrayRecord", reply)
    if set(returned.keys()) != set(sent.keys()):
      raise ValueError("defense_mod: the reply's arrays are not keyed like "
                       f"the ones sent ({sorted(returned.keys())} for "
                       f"{sorted(sent.keys())}).")
    params, local = as_tree(sent), as_tree(returned)
    update = jax.tree_util.tree_map(jnp.subtract, local, params)
    if load_data is None:
      x = y = mask = None
    else:
      x, y, mask = _node_data(load_data, context)
    _, nk = fedavg.client_keys(keys, _server_round(message) - 1,
                               client_id(context))
    try:
      defended, info = apply(
          update, defenses_base.ClientBatch(params, x, y, mask), nk)
    except (TypeError, AttributeError, ValueError) as e:
      if not missing:
        raise
      first = (str(e).splitlines() or [type(e).__name__])[0]
      raise ValueError(
          f"defense {defense.name!r} failed on an update given without "
          f"{missing} (Soteria and DP-SGD need the client's data and the "
          f"model): {first}") from e
    if _no_examples(mask, reply):
      defended = jax.tree_util.tree_map(jnp.zeros_like, defended)
    new = jax.tree_util.tree_map(jnp.add, params, defended)
    if template is not None:
      out = to_arrays(new)
    else:
      out = ArrayRecord({k: Array(np.asarray(new[k])) for k in sent.keys()})
    reply.content.array_records[name] = ArrayRecord(
        {k: out[k] for k in sent.keys()})  # The order of the sent arrays.
    for record in reply.content.metric_records.values():
      record.update({f"defense/{k}": float(v)
                     for k, v in jax.device_get(info).items()})
    return reply

  return mod


# --------------------------------------------------------------------------
# Auditing server.


class AuditingFedAvg(FedAvg):
  """Flower ``FedAvg`` that attacks every update before averaging it.

  An honest-but-curious server: it aggregates exactly as ``FedAvg`` but
  first runs ``attack`` on each client's update (seen as the gradient
  ``-delta / (client_lr * steps)`` at the round's global parameters) and
  logs, per round and client, the attack's final loss and, when
  ``reference_data`` gives the client's true images, the reconstruction
  metrics of :func:`repdef_jax.metrics.reconstruction_metrics` (MSE, PSNR,
  SSIM in the [0, 1] pixel space, the models' input space). Records go to
  :attr:`audit_log`, to ``<workdir>/audit.jsonl`` and, with images, to
  ``<workdir>/round_<r>_client_<id>.png``; the round's means are added to
  the aggregated train metrics as ``audit/<metric>``. A server restarted on
  the same workdir appends to the records it finds there (written by the
  same attack, seed and ``run_info``; another's are refused). Flower does
  not resume the global model, so a restart is a new run from round 1: its
  records carry ``start`` (1, 2, ... per server start in the workdir) and
  its images are named ``start_<k>_round_<r>_client_<id>.png`` from the
  second start on.

  ``attack`` is a name of :data:`repdef_jax.attacks.ATTACK_NAMES` ('dlg',
  'gs', the adaptive 'dlg_drop' / 'gs_mask' ...) or 'repinfer'
  (:mod:`repdef_jax.attacks.repinfer`: the class representations inferred
  from the update, each inverted by L-BFGS; compared with the mean true
  image of its class).
  """

  def __init__(self, model: models_lib.Model, attack: str = "dlg", *,
               client_lr: float, attack_config: Any = None,
               attack_overrides: Optional[dict[str, Any]] = None,
               num_images: Optional[int] = None,
               reference_data: Optional[Callable[[int], tuple[Any, Any]]]
               = None,
               workdir: Optional[str] = None, seed: int = 0,
               max_audits_per_round: Optional[int] = None,
               repinfer_steps: int = 300,
               run_info: Optional[dict[str, Any]] = None, **fedavg_kwargs):
    """Args:
      model: the trained model.
      attack: see the class docstring.
      client_lr: the clients' learning rate (to rescale updates).
      attack_config: the attack's config (``DLGConfig`` / ``GSConfig``).
      attack_overrides: fields replaced in it (e.g. ``{'outer_steps': 50}``
        for DLG, ``{'iterations': 500}`` for GS).
      num_images: images per update (default: the reply's ``num-examples``).
      reference_data: ``partition_id -> (x, y)``, the images a client trains
        on (for metrics; an auditor's privilege, not the attack's input).
      workdir: where to write the log and images (None: memory only).
      seed: the attack's PRNG seed (:func:`audit_key`).
      max_audits_per_round: attack at most this many updates per round.
      repinfer_steps: L-BFGS steps per image for 'repinfer'.
      run_info: JSON-ready settings the server cannot see but the records
        depend on (e.g. the clients' defense and strength), stored in every
        record; a restart with other ``run_info`` is refused.
      **fedavg_kwargs: ``FedAvg``'s arguments (``fraction_train`` ...).

    Raises:
      ValueError: unknown attack (lists the valid ones), an attack config
        of another class or one that contradicts the attack, a client_lr
        that is not a finite number > 0, num_images / max_audits_per_round
        / repinfer_steps not an int >= 1, a seed that is not an int.
      TypeError: an override that is no field of the attack's config.
    """
    if attack not in AUDIT_ATTACKS:
      raise ValueError(f"Unknown attack {attack!r}; valid attacks: "
                       f"{', '.join(AUDIT_ATTACKS)}.")
    schedules.check_rate(client_lr, "client_lr", "a finite number > 0")
    if max_audits_per_round is not None and (
        isinstance(max_audits_per_round, bool) or
        not isinstance(max_audits_per_round, numbers.Integral) or
        max_audits_per_round < 1):
      raise ValueError(f"max_audits_per_round must be an int >= 1 or None "
                       f"(every update), got {max_audits_per_round!r}.")
    if num_images is not None:
      attacks_base.check_num_images(num_images)
    attacks_base.check_int_value(repinfer_steps, "repinfer_steps", 1)
    models_lib.check_model(model)
    fedavg.check_seed(seed)
    if run_info is not None and not isinstance(run_info, dict):
      raise ValueError(f"run_info must be a dict or None, got "
                       f"{type(run_info).__name__}.")
    if attack == REPINFER:
      if attack_config is not None or attack_overrides:
        raise ValueError("attack 'repinfer' takes repinfer_steps, not "
                         "attack_config / attack_overrides.")
      self._attack_config = None
    else:  # Checked now, not after the first training round.
      self._attack_config = attacks_lib.get_attack(attack).make_config(
          attack_config, **(attack_overrides or {}))
    super().__init__(**fedavg_kwargs)
    self.model, self.attack = model, attack
    self.client_lr = float(client_lr)
    self.num_images, self.reference_data = num_images, reference_data
    self.workdir, self.seed = workdir, seed
    self.max_audits_per_round = max_audits_per_round
    self.repinfer_steps = repinfer_steps
    try:
      self.run_info = (None if run_info is None else
                       json.loads(json.dumps(run_info, sort_keys=True)))
    except (TypeError, ValueError) as error:
      raise ValueError(f"run_info must be JSON-ready (numbers, strings, "
                       f"lists, dicts): {error}.") from None
    self.server_start = 1
    self.audit_log: list[dict[str, Any]] = []
    self._template = jax.eval_shape(model.init, jax.random.key(0))
    self._sent: dict[int, ArrayRecord] = {}
    if workdir:
      os.makedirs(workdir, exist_ok=True)
      self.audit_log = self._earlier_audits()
      self.server_start = 1 + max(
          (r.get("start", 1) for r in self.audit_log), default=0)

  def _earlier_audits(self) -> list[dict[str, Any]]:
    """The records a killed server left in ``workdir/audit.jsonl``: kept (a
    restart appends to them), unless another attack, seed or ``run_info``
    wrote them."""
    path = os.path.join(self.workdir, "audit.jsonl")
    if not os.path.exists(path):
      return []
    with open(path, encoding="utf-8") as f:
      records = [json.loads(line) for line in f if line.strip()]
    mine = (self.attack, self.seed, self.run_info)
    for r in records:
      theirs = (r.get("attack"), r.get("seed", self.seed), r.get("run"))
      if theirs != mine:
        raise ValueError(
            f"workdir {self.workdir!r} holds an audit by attack "
            f"{theirs[0]!r}, seed {theirs[1]}, run_info {theirs[2]}; this "
            f"one is {self.attack!r}, seed {self.seed}, run_info "
            f"{self.run_info}: use another workdir.")
    return records

  def configure_train(self, server_round, arrays, config, grid):
    self._sent = {server_round: arrays}  # The global model of this round.
    return super().configure_train(server_round, arrays, config, grid)

  def aggregate_train(self, server_round, replies):
    replies = list(replies)
    # One attack per client, in turn: clients attack with their own image
    # counts (one program each), and each record is written as it ends.
    audited = [self._audit(server_round, i, m)
               for i, m in enumerate(r for r in replies if not r.has_error())
               if self.max_audits_per_round is None
               or i < self.max_audits_per_round]
    arrays, metrics = super().aggregate_train(server_round, replies)
    if metrics is not None and audited:
      for name in ("mse", "psnr", "ssim", "attack_loss"):
        vals = [a[name] for a in audited if name in a]
        if vals:
          metrics[f"audit/{name}"] = float(np.mean(vals))
    return arrays, metrics

  def _audit(self, server_round: int, index: int, reply: Message
             ) -> dict[str, Any]:
    """Attacks one client's update; returns (and logs) its record."""
    sent = self._sent[server_round]
    _, returned = _only(reply.content.array_records, "ArrayRecord", reply)
    params = from_arrays(sent, self._template)
    update = jax.tree_util.tree_map(
        jnp.subtract, from_arrays(returned, self._template), params)
    _, rec = _only(reply.content.metric_records, "MetricRecord", reply)
    steps = max(int(rec.get("steps", 1)), 1)
    num = int(self.num_images or rec.get(WEIGHT_KEY, 1))
    pid = None
    for cfg in reply.content.config_records.values():
      if PARTITION_ID in cfg:
        pid = int(cfg[PARTITION_ID])
    ident = pid if pid is not None else index
    key = audit_key(self.seed, server_round, ident)
    record = {"round": server_round, "client": ident, "attack": self.attack,
              "seed": self.seed, "start": self.server_start,
              "node_id": int(reply.metadata.src_node_id)}
    if self.run_info is not None:
      record["run"] = self.run_info
    if self.attack == REPINFER:
      x_rec, classes = self._repinfer(params, update, key)
      record["classes"] = classes
    else:
      grads = jax.tree_util.tree_map(
          lambda u: -u / (self.client_lr * steps), update)
      result = attacks_lib.to_host(attacks_lib.get_attack(self.attack).fn(
          self.model, params, grads, num, key, labels=None,
          config=self._attack_config))
      x_rec, classes = np.asarray(result.x_rec), None
      record.update(attack_loss=float(result.final_loss),
                    diverged=bool(result.diverged), num_images=num)
    x_true = None
    if self.reference_data is not None and pid is not None:
      x_true, y_true = (np.asarray(a) for a in self.reference_data(pid))
      if classes is not None:  # Class-mean images of the inferred classes.
        x_true = np.stack([x_true[y_true == c].mean(0) if np.any(y_true == c)
                           else np.zeros(x_true.shape[1:], np.float32)
                           for c in classes]) if classes else x_true[:0]
      if len(x_rec) and len(x_true) == len(x_rec):
        m = metrics_lib.reconstruction_metrics(x_rec, x_true)
        record.update({k: m[k] for k in ("mse", "psnr", "ssim",
                                          "pixel_space")})
        x_true = x_true[np.argsort(m["perm"])] if len(x_true) > 1 else x_true
    self.audit_log.append(record)
    if self.workdir:
      storage.write_text(
          os.path.join(self.workdir, "audit.jsonl"),
          "".join(json.dumps(r, sort_keys=True) + "\n"
                  for r in self.audit_log))
      self._save_images(server_round, ident, x_rec, x_true)
    logger.info("audit round %d client %s: %s", server_round, ident,
                {k: v for k, v in record.items() if k in (
                    "mse", "psnr", "ssim", "attack_loss")})
    return record

  def _repinfer(self, params, update, key):
    reps = repinfer.infer_representations(self.model, update)
    layer = self.model.fc_layers[-1]  # The input of the defended layer.
    classes = sorted(reps)
    fn = repinfer.jitted_reconstruction(self.model, self.repinfer_steps)
    # One compiled program for every class; the number of inferred classes
    # changes from update to update (a vmap would compile per count).
    images = [np.asarray(fn(params, jnp.asarray(reps[c][layer]),
                            key=jax.random.fold_in(key, c))[0])
              for c in classes]
    if not images:
      return np.zeros((0, *self.model.input_shape), np.float32), classes
    return np.stack(images), classes

  def _save_images(self, server_round, ident, x_rec, x_true):
    plt = storage.pyplot()
    rows = [("reconstruction", x_rec)]
    if x_true is not None and len(x_true) == len(x_rec):
      rows.append(("true", x_true))
    n = max(len(x_rec), 1)
    fig, axes = plt.subplots(len(rows), n, figsize=(1.6 * n, 1.7 * len(rows)),
                             squeeze=False)
    for r, (title, imgs) in enumerate(rows):
      for i in range(n):
        ax = axes[r][i]
        ax.axis("off")
        if i < len(imgs):
          img = np.clip(np.asarray(imgs[i], np.float32), 0.0, 1.0)
          ax.imshow(img[..., 0] if img.shape[-1] == 1 else img,
                    cmap="gray" if img.shape[-1] == 1 else None,
                    vmin=0.0, vmax=1.0)
        if i == 0:
          ax.set_title(title, fontsize=8, loc="left")
    prefix = f"start_{self.server_start}_" if self.server_start > 1 else ""
    storage.save_figure(fig, os.path.join(
        self.workdir, f"{prefix}round_{server_round:03d}_client_{ident}.png"))
    plt.close(fig)


# --------------------------------------------------------------------------
# In-process Grid.


class InProcessGrid(Grid):
  """A Flower ``Grid`` whose nodes are ClientApps in this process.

  Node ``i`` (of ``num_nodes``) has node config ``{'partition-id': i,
  'num-partitions': num_nodes}`` (plus ``node_config(i)``); messages are
  delivered in order, each message and reply passed through Flower's
  protobuf serialization as on the wire, and a ClientApp that raises
  replies with a Flower ``Error``. No Ray, no network: for tests, notebooks
  and debugging a strategy; the deployment engine runs the same apps.
  """

  def __init__(self, client_app: ClientApp, num_nodes: int, *,
               node_config: Optional[Callable[[int], dict[str, Any]]] = None,
               run_config: Optional[dict[str, Any]] = None, run_id: int = 1):
    """Args:
      client_app: the ClientApp every node runs.
      num_nodes: the number of nodes (partition ids 0 .. num_nodes - 1).
      node_config: ``i -> dict`` added to node i's node config.
      run_config: the run config every node's Context carries.
      run_id: the run's id (Flower's ``Run``).

    Raises:
      ValueError: ``num_nodes`` is not an integer >= 1.
    """
    # Flower's own server entry points set this identity of the server task
    # (flwr.server.compat.app.start_grid); Messages read it.
    from flwr.common import serde  # pylint: disable=g-import-not-at-top
    from flwr.common.constant import SUPERLINK_NODE_ID  # pylint: disable=g-import-not-at-top
    from flwr.supercore.run import Run  # pylint: disable=g-import-not-at-top
    from flwr.supercore.task_identity import TaskIdentity  # pylint: disable=g-import-not-at-top
    if isinstance(num_nodes, bool) or not isinstance(
        num_nodes, numbers.Integral) or num_nodes < 1:
      raise ValueError(f"num_nodes must be an integer >= 1, got "
                       f"{num_nodes!r}.")
    TaskIdentity.task_id = 1
    TaskIdentity.run_id = run_id
    TaskIdentity.node_id = SUPERLINK_NODE_ID
    self._serde = serde
    self._app = client_app
    self._run = Run.create_empty(run_id)
    self._contexts = {}
    for i in range(num_nodes):
      cfg = {PARTITION_ID: i, NUM_PARTITIONS: num_nodes,
             **(node_config(i) if node_config else {})}
      node_id = SUPERLINK_NODE_ID + 1 + i
      self._contexts[node_id] = Context(
          run_id=run_id, node_id=node_id, node_config=cfg,
          state=RecordDict(), run_config=dict(run_config or {}))
    self._replies: dict[str, Message] = {}

  def set_run(self, run) -> None:
    self._run = run

  @property
  def run(self):
    return self._run

  def create_message(self, content, message_type, dst_node_id, group_id,
                     ttl=None) -> Message:
    return Message(content, dst_node_id, message_type, ttl=ttl,
                   group_id=group_id)

  def get_node_ids(self) -> Iterable[int]:
    return list(self._contexts)

  def _wire(self, message: Message) -> Message:
    return self._serde.message_from_proto(self._serde.message_to_proto(message))

  def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
    ids = []
    for message in messages:
      message.metadata.__dict__["_message_id"] = uuid.uuid4().hex
      context = self._contexts.get(message.metadata.dst_node_id)
      message = self._wire(message)
      if context is None:
        reply = Message(Error(code=ErrorCode.NODE_UNAVAILABLE,
                              reason="node unavailable"),
                        reply_to=message)
      else:
        try:
          reply = self._app(message, context)
        except Exception as e:  # pylint: disable=broad-except
          logger.exception("ClientApp raised on node %d",
                           message.metadata.dst_node_id)
          reply = Message(Error(code=ErrorCode.CLIENT_APP_RAISED_EXCEPTION,
                                reason=f"{type(e).__name__}: {e}"),
                          reply_to=message)
      reply.metadata.__dict__["_message_id"] = uuid.uuid4().hex
      self._replies[message.metadata.message_id] = self._wire(reply)
      ids.append(message.metadata.message_id)
    return ids

  def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
    return [self._replies.pop(i) for i in message_ids if i in self._replies]

  def send_and_receive(self, messages: Iterable[Message], *,
                       timeout: Optional[float] = None) -> Iterable[Message]:
    del timeout  # Every node answers before this returns.
    return self.pull_messages(self.push_messages(messages))


def run_in_process(server_app: Any, client_app: ClientApp, num_nodes: int, *,
                   run_config: Optional[dict[str, Any]] = None,
                   node_config: Optional[Callable[[int], dict[str, Any]]]
                   = None) -> InProcessGrid:
  """Runs a ``ServerApp`` against ``num_nodes`` in-process ClientApps.

  Args:
    server_app: a ``flwr.serverapp.ServerApp``.
    client_app: the ``ClientApp`` every node runs.
    num_nodes: number of nodes (partition ids 0 .. num_nodes - 1).
    run_config: the run config both apps see (``context.run_config``).
    node_config: extra node settings per partition id.

  Returns:
    The grid (after the run).
  """
  from flwr.common.constant import SUPERLINK_NODE_ID  # pylint: disable=g-import-not-at-top
  grid = InProcessGrid(client_app, num_nodes, node_config=node_config,
                       run_config=run_config)
  context = Context(run_id=grid.run.run_id, node_id=SUPERLINK_NODE_ID,
                    node_config={}, state=RecordDict(),
                    run_config=dict(run_config or {}))
  server_app(grid, context)
  return grid
