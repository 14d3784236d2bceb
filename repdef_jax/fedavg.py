"""Federated averaging as pure, vectorized JAX functions, with a defense inside.

FedAvg (McMahan et al., "Communication-Efficient Learning of Deep Networks from
Decentralized Data", AISTATS 2017): each round the server samples clients, each
runs local SGD from the global model, and the server averages their model
deltas. The defended FedAvg of Sun et al. ("Provable Defense against Privacy
Leakage in Federated Learning from Representation Perspective", CVPR 2021,
Section 5 and Theorem 2) applies the defense to the gradient of *every* local
step, so what the server receives is built only from defended gradients; it
samples K devices with replacement with probabilities p_k and averages them
uniformly (scheme I of Li et al. 2020), with learning rate
eta_t = 2 / (mu (gamma + t)) (see :mod:`repdef_jax.schedules`).

One jitted round: the sampled clients' local SGD (``lax.scan`` over steps)
vectorized over clients, aggregation on device. Design, randomness (named
key streams: every draw is a function of seed, round and client id) and
scale (client chunks, a 'clients' mesh axis over devices and processes):
``docs/design.md`` ("FedAvg").

Departures from the papers:

* Client optimizer is plain SGD (as both papers); its learning rate is a float
  or an optax schedule evaluated at the global local-step count
  ``round * T + t`` (T = local steps per round), as Theorem 2 indexes t.
* Minibatches: with ``local_steps`` each step draws ``batch_size`` distinct
  examples among the client's real ones (a fresh random permutation per step;
  ``batch_size >= n_k`` gives the full batch). With ``local_epochs`` each epoch
  is a permutation of the real examples cut into ``ceil(M / B)`` batches
  (M = padded size); batches holding no real example are skipped, so a client
  with n_k examples takes ``E * ceil(n_k / B)`` effective steps.
* A client that holds no example takes no step, sends a zero delta and gets
  weight 0. A client sampled twice in a round sends the same update twice.
* ``defense_at='update'`` applies the defense once to the final delta
  ``w_local - w_global`` (evaluated with the global parameters and all of the
  client's data) instead of every step's gradient.
* The l2 term ``l2 / 2 * ||w||^2`` covers every parameter (weights and
  biases), which makes logistic regression mu-strongly convex with mu >= l2.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import numbers
import operator
from typing import Any, Callable, NamedTuple, Optional, Union

import chex
import flax
import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from repdef_jax import gradients
from repdef_jax import host
from repdef_jax import models as models_lib
from repdef_jax import schedules
from repdef_jax.defenses import base as defenses_base

Params = Any
LearningRate = Union[float, Callable[[jax.Array], jax.Array]]

STREAMS = ("init", "sampling", "train", "noise")
DEFENSE_AT = ("step", "update")
WEIGHTINGS = ("size", "uniform")
CLIENTS_AXIS = "clients"


class KeyStreams(NamedTuple):
  """Named PRNG streams derived from one seed (big_vision style).

  Attributes:
    init: model initialisation.
    sampling: client sampling, folded with the round.
    train: local minibatches, folded with the round then the client id.
    noise: defense randomness, folded with the round then the client id.
  """

  init: jax.Array
  sampling: jax.Array
  train: jax.Array
  noise: jax.Array


def check_seed(seed: Any) -> int:
  """``seed`` as an int: any integer scalar, not a bool.

  Raises:
    ValueError: ``seed`` is not an integer.
  """
  try:
    value = None if isinstance(seed, (bool, np.bool_)) else operator.index(
        seed)
  except TypeError:
    value = None
  if value is None:
    raise ValueError(f"seed must be an integer, got {seed!r}.")
  return value


def key_streams(seed: int) -> KeyStreams:
  """Splits ``seed`` into the named streams; each is ``fold_in(root, i)``.

  Raises:
    ValueError: ``seed`` is not an integer.
  """
  root = jax.random.key(check_seed(seed))
  return KeyStreams(*(jax.random.fold_in(root, i) for i in range(len(STREAMS))))


def client_keys(keys: KeyStreams, round_: jax.Array,
                client_id: jax.Array) -> tuple[jax.Array, jax.Array]:
  """The (train, noise) keys of client ``client_id`` in round ``round_``."""
  train = jax.random.fold_in(jax.random.fold_in(keys.train, round_), client_id)
  noise = jax.random.fold_in(jax.random.fold_in(keys.noise, round_), client_id)
  return train, noise


@flax.struct.dataclass
class ServerState:
  """The server's state between rounds.

  Attributes:
    params: global model parameters.
    opt_state: server optimizer state.
    round: number of rounds done (int32 scalar).
  """

  params: Params
  opt_state: Any
  round: jax.Array


class ClientArrays(NamedTuple):
  """Padded federated data (what :func:`repdef_jax.partition.pack` returns).

  Attributes:
    x: images ``[N, M, H, W, C]`` (N clients padded to M examples).
    y: labels ``[N, M]``.
    mask: ``[N, M]``, 1 for a real example, 0 for padding.
  """

  x: jax.Array
  y: jax.Array
  mask: jax.Array


class EvalData(NamedTuple):
  """A test set cut into equal batches: ``x [nb, bs, ...]``, ``y``, ``mask``."""

  x: jax.Array
  y: jax.Array
  mask: jax.Array


@dataclasses.dataclass(frozen=True)
class FedAvgConfig:
  """Static settings of a FedAvg run.

  Attributes:
    clients_per_round: K, clients sampled per round.
    local_steps: I, local SGD steps per round (used when local_epochs == 0).
    local_epochs: E; when > 0, each client runs E epochs of minibatches.
    batch_size: local minibatch size B (clamped to the padded client size).
    client_lr: float or schedule of the global local-step count.
    l2: coefficient of ``l2 / 2 * ||w||^2`` added to every client's loss.
    defense: a :class:`repdef_jax.defenses.base.Defense` or None.
    defense_at: 'step' (every local gradient; the paper) or 'update'.
    weighting: 'size' (delta weights proportional to n_k; clients sampled
      uniformly by default) or 'uniform' (1/K; clients sampled by p_k =
      n_k / n by default, the paper's scheme, unbiased when sampling with
      replacement). Clients without data always get weight 0. See
      :func:`default_probs`.
    replace: sample clients with replacement (the paper) or without.
    server_optimizer: optax transformation applied to minus the averaged
      delta; None means ``optax.sgd(1.0)`` (plain FedAvg).
    client_chunk: clients processed at a time with
      ``lax.map(..., batch_size=client_chunk)``; 0 = all at once (``vmap``);
      -1 (default) = :func:`resolve_client_chunk` (1 on CPU, all on GPU/TPU).
  """

  clients_per_round: int = 10
  local_steps: int = 1
  local_epochs: int = 0
  batch_size: int = 10
  client_lr: LearningRate = 0.1
  l2: float = 0.0
  defense: Optional[defenses_base.Defense] = None
  defense_at: str = "step"
  weighting: str = "uniform"
  replace: bool = True
  server_optimizer: Optional[optax.GradientTransformation] = None
  client_chunk: int = -1

  def validate(self) -> None:
    """Raises a ValueError, naming the field, on settings that cannot run."""
    for name, low in (("clients_per_round", 1), ("local_epochs", 0),
                      ("local_steps", 0 if self.local_epochs else 1),
                      ("batch_size", 1), ("client_chunk", -1)):
      v = getattr(self, name)
      if isinstance(v, bool) or not isinstance(v, numbers.Integral) or (
          v < low):
        hint = {"local_steps": " (or set local_epochs)",
                "client_chunk": " (-1: auto, 0: all clients at once)"}
        raise ValueError(f"{name} must be an integer >= {low}"
                         f"{hint.get(name, '')}, got {v!r}.")
    if self.defense is not None:
      defenses_base.check_is_defense(self.defense)
    if self.defense_at not in DEFENSE_AT:
      raise ValueError(f"defense_at must be one of {DEFENSE_AT}, got "
                       f"{self.defense_at!r}.")
    if (self.defense is not None and self.defense.recomputes
        and self.defense_at == "update"):
      raise ValueError(f"defense_at='update' hands defense "
                       f"{self.defense.name!r} the model change, but it "
                       "computes its own gradient from a batch: use "
                       "defense_at='step'.")
    if self.weighting not in WEIGHTINGS:
      raise ValueError(f"weighting must be one of {WEIGHTINGS}, got "
                       f"{self.weighting!r}.")
    l2 = schedules.as_real(self.l2)  # jnp.float32(0.01) too.
    if not (math.isfinite(l2) and l2 >= 0):
      raise ValueError(f"l2 must be a finite number >= 0, got {self.l2!r}.")
    flag = np.asarray(self.replace)  # True / False, 0 / 1, 0-d arrays.
    if flag.ndim or not (flag.dtype == bool or
                         np.issubdtype(flag.dtype, np.integer)) or (
                             int(flag) not in (0, 1)):
      raise ValueError(f"replace must be True or False, got "
                       f"{self.replace!r}.")
    opt = self.server_optimizer
    if opt is not None and not (callable(getattr(opt, "init", None)) and
                                callable(getattr(opt, "update", None))):
      raise ValueError("server_optimizer must be an optax transformation "
                       "(init and update) or None (plain FedAvg), got "
                       f"{opt!r}.")
    if not callable(self.client_lr):
      schedules.check_rate(self.client_lr, "client_lr",
                           "a finite number > 0 or a schedule (callable)")

  @property
  def server_opt(self) -> optax.GradientTransformation:
    return self.server_optimizer or optax.sgd(1.0)

  @property
  def the_defense(self) -> defenses_base.Defense:
    return self.defense or defenses_base.identity()

  def steps_per_round(self, padded_size: int) -> int:
    """T, the local steps per round for clients padded to ``padded_size``."""
    if self.local_epochs > 0:
      b = min(self.batch_size, padded_size)
      return self.local_epochs * math.ceil(padded_size / b)
    return self.local_steps


def resolve_client_chunk(client_chunk: int,
                         backend: Optional[str] = None) -> int:
  """-1 (auto) -> 1 on CPU, 0 (all clients at once) on GPU/TPU.

  On CPU one client at a time inside the jitted round is fastest (measured:
  vmapping clients batches their weights, which XLA's CPU backend runs as
  slow grouped convolutions and batched matmuls); a GPU/TPU has the
  parallelism to run them all at once.
  """
  if client_chunk != -1:
    return client_chunk
  backend = backend or jax.default_backend()
  return 1 if backend == "cpu" else 0


def as_client_arrays(data: Any) -> ClientArrays:
  """Takes ``x, y, mask`` from any object that has them (e.g. ClientData)."""
  x, y, mask = data.x, data.y, data.mask
  if x.ndim != 5 or y.shape != x.shape[:2] or mask.shape != x.shape[:2]:
    raise ValueError(f"client data must be x [N, M, H, W, C], y [N, M], mask "
                     f"[N, M]; got {x.shape}, {y.shape}, {mask.shape}.")
  return ClientArrays(jnp.asarray(x), jnp.asarray(y), jnp.asarray(mask))


def client_sizes(data: ClientArrays) -> jax.Array:
  """n_k, the number of real examples of each client ``[N]``."""
  return jnp.sum(data.mask > 0, axis=1).astype(jnp.int32)


def default_probs(data: ClientArrays, weighting: str = "uniform") -> jax.Array:
  """Sampling probabilities that suit ``weighting``.

  'uniform' (weights 1/K): the paper's p_k = n_k / n (Li et al. 2020,
  scheme I), an unbiased average of the clients' updates when clients are
  drawn with replacement (``replace=True``, the default); drawn without
  replacement, small clients count more than n_k / n (unequal sizes only).
  'size' (weights n_k / sum of the sampled n_k, a ratio estimate): every
  client with data equally likely, as McMahan et al. 2017 sample; with p_k =
  n_k / n a client would count in proportion to n_k^2.
  """
  n = client_sizes(data).astype(jnp.float32)
  if weighting == "size":
    n = (n > 0).astype(jnp.float32)
  return n / jnp.maximum(jnp.sum(n), 1.0)


def make_eval_data(x: Any, y: Any, batch_size: int = 1000) -> EvalData:
  """Cuts a test set into equal batches (host side), padding the last one.

  Raises:
    ValueError: an empty test set, ``x`` and ``y`` of different lengths or
      ``batch_size`` < 1.
  """
  if isinstance(batch_size, bool) or not isinstance(
      batch_size, (int, np.integer)) or batch_size < 1:
    raise ValueError(f"batch_size must be an int >= 1, got {batch_size!r}.")
  x, y = np.asarray(x), np.asarray(y)
  n = len(x)
  if len(y) != n:
    raise ValueError(f"x ({n}) and y ({len(y)}) differ in length.")
  if n == 0:
    raise ValueError("the test set is empty.")
  bs = min(batch_size, n)
  nb = math.ceil(n / bs)
  pad = nb * bs - n
  mask = np.concatenate([np.ones(n, np.float32), np.zeros(pad, np.float32)])
  x = np.concatenate([x, np.zeros((pad, *x.shape[1:]), x.dtype)])
  y = np.concatenate([y, np.zeros((pad, *y.shape[1:]), y.dtype)])
  return EvalData(jnp.asarray(x.reshape(nb, bs, *x.shape[1:])),
                  jnp.asarray(y.reshape(nb, bs, *y.shape[1:])),
                  jnp.asarray(mask.reshape(nb, bs)))


def evaluate(model: models_lib.Model, params: Params,
             data: EvalData) -> dict[str, jax.Array]:
  """Accuracy and mean loss over a batched test set (jittable)."""

  def one(batch):
    x, y, m = batch
    x, y = gradients.drop_padding(x, y, m)
    logits = model.apply(params, x)
    correct = jnp.sum((jnp.argmax(logits, -1) == y) * m)
    loss = jnp.sum(gradients.cross_entropy(logits, y) * m)
    return correct, loss

  correct, loss = jax.lax.map(one, tuple(data))
  n = jnp.maximum(jnp.sum(data.mask), 1.0)
  return {"test_accuracy": jnp.sum(correct) / n, "test_loss": jnp.sum(loss) / n}


def _l2_term(params: Params, l2: float) -> jax.Array:
  if not l2:
    return jnp.zeros((), jnp.float32)
  sq = sum(jnp.sum(jnp.square(p)) for p in jax.tree_util.tree_leaves(params))
  return 0.5 * l2 * sq


def global_loss(model: models_lib.Model, params: Params, data: ClientArrays,
                l2: float = 0.0, chunk: int = 10) -> jax.Array:
  """The federated objective: mean loss over every real example, plus l2.

  Args:
    model: the model.
    params: parameters.
    data: padded client data.
    l2: the l2 coefficient.
    chunk: clients evaluated at once (``lax.map`` batch size).

  Returns:
    ``sum_k n_k F_k(w) / n + l2 / 2 ||w||^2``, a scalar.
  """

  def one(c):
    x, y, m = c
    x, y = gradients.drop_padding(x, y, m)
    losses = gradients.cross_entropy(model.apply(params, x), y)
    return jnp.sum(losses * m)

  sums = jax.lax.map(one, tuple(data), batch_size=chunk)
  n = jnp.maximum(jnp.sum(data.mask), 1.0)
  return jnp.sum(sums) / n + _l2_term(params, l2)


def sample_clients(key: jax.Array, probs: jax.Array, k: int,
                   replace: bool = True) -> jax.Array:
  """Samples ``k`` client ids by probabilities ``probs`` (jittable).

  Args:
    key: the round's sampling key (``fold_in(streams.sampling, round)``).
    probs: ``[N]`` non-negative, summing to 1.
    k: number of clients.
    replace: with replacement (the paper) or without.

  Returns:
    int32 ids ``[k]``.
  """
  n = probs.shape[0]
  return jax.random.choice(key, n, (k,), replace=replace,
                           p=probs).astype(jnp.int32)


def _batch_plan(key: jax.Array, mask: jax.Array, config: FedAvgConfig):
  """Indices ``[T, B]`` and masks ``[T, B]`` of every local minibatch."""
  m = mask.shape[0]
  b = min(config.batch_size, m)
  real = mask > 0

  def perm(k):  # Real examples first, in random order; padding last.
    u = jax.random.uniform(k, (m,))
    return jnp.argsort(jnp.where(real, u, 2.0 + u))

  if config.local_epochs > 0:
    s = math.ceil(m / b)
    perms = jax.vmap(perm)(jax.random.split(key, config.local_epochs))
    pad = s * b - m
    idx = jnp.pad(perms, ((0, 0), (0, pad)))
    valid = jnp.pad(jnp.ones_like(perms, dtype=bool), ((0, 0), (0, pad)))
    idx = idx.reshape(config.local_epochs * s, b)
    valid = valid.reshape(config.local_epochs * s, b)
  else:
    perms = jax.vmap(perm)(jax.random.split(key, config.local_steps))
    idx = perms[:, :b]
    valid = jnp.ones_like(idx, dtype=bool)
  bmask = jnp.where(valid, mask[idx].astype(jnp.float32), 0.0)
  return idx, bmask


def _lr_at(lr: LearningRate, count: jax.Array) -> jax.Array:
  if callable(lr):
    return jnp.asarray(lr(count), jnp.float32)
  return jnp.asarray(lr, jnp.float32)


def client_update(model: models_lib.Model, config: FedAvgConfig,
                  params: Params, x: jax.Array, y: jax.Array, mask: jax.Array,
                  train_key: jax.Array, noise_key: jax.Array,
                  round_: jax.Array = 0) -> tuple[Params, dict[str, jax.Array]]:
  """One client's local training: what it sends to the server (pure, jittable).

  This is also the attack hook: called with the inputs of round r and client
  k (keys from :func:`client_keys`), it returns exactly the delta that client
  sends in that round.

  Args:
    model: the model (static).
    config: the run's settings (static).
    params: the global parameters.
    x: the client's padded images ``[M, H, W, C]``.
    y: its labels ``[M]``.
    mask: ``[M]``, 1 for real examples.
    train_key: minibatch key (:func:`client_keys`).
    noise_key: defense key (:func:`client_keys`).
    round_: the round (for the learning-rate schedule).

  Returns:
    ``(delta, info)``: the (defended) model delta ``w_local - w_global`` and
    diagnostics: ``loss`` (mean minibatch loss over the steps taken, l2
    excluded), ``steps`` (steps taken) and the defense's info averaged over
    steps, prefixed by ``defense/``.
  """
  chex.assert_equal_shape_prefix([x, y, mask], 1)
  defense = config.the_defense
  idx, bmask = _batch_plan(train_key, mask, config)
  num_steps = idx.shape[0]
  b = idx.shape[1]
  sample = defenses_base.ClientBatch(params, x[:b], y[:b], bmask[0])
  if config.defense_at == "step":
    info0 = defenses_base.zeros_info_like(defense, params, sample)
  else:
    info0 = {}

  def step(carry, inp):
    p, info_sum, loss_sum, taken = carry
    t, ib, mb = inp
    xb, yb = x[ib], y[ib]
    loss, g = gradients.batch_loss_and_grad(model, p, xb, yb, mb)
    add_l2 = lambda g: jax.tree_util.tree_map(  # noqa: E731
        jnp.add, g, jax.grad(_l2_term)(p, config.l2))
    if config.l2 and not defense.recomputes:
      g = add_l2(g)
    if config.defense_at == "step":
      g, info = defense.apply(g, defenses_base.ClientBatch(p, xb, yb, mb),
                              jax.random.fold_in(noise_key, t))
    else:
      info = {}
    if config.l2 and defense.recomputes:  # It discarded the l2 term.
      g = add_l2(g)
    active = jnp.sum(mb) > 0
    lr = _lr_at(config.client_lr, round_ * num_steps + t)
    p = jax.tree_util.tree_map(
        lambda w, gw: jnp.where(active, w - (lr * gw).astype(w.dtype), w), p, g)
    info_sum = jax.tree_util.tree_map(
        lambda a, v: a + jnp.where(active, v, 0).astype(a.dtype), info_sum,
        info)
    loss_sum = loss_sum + jnp.where(active, loss, 0.0)
    return (p, info_sum, loss_sum, taken + active.astype(jnp.int32)), None

  carry0 = (params, info0, jnp.zeros((), jnp.float32), jnp.zeros((), jnp.int32))
  (p, info_sum, loss_sum, taken), _ = jax.lax.scan(
      step, carry0, (jnp.arange(num_steps), idx, bmask))
  delta = jax.tree_util.tree_map(lambda a, b0: a - b0, p, params)
  denom = jnp.maximum(taken, 1).astype(jnp.float32)
  info = {f"defense/{k}": v / denom for k, v in info_sum.items()}
  if config.defense_at == "update":
    batch = defenses_base.ClientBatch(params, x, y, mask.astype(jnp.float32))
    delta, dinfo = defense.apply(delta, batch, noise_key)
    info = {f"defense/{k}": v for k, v in dinfo.items()}
    has_data = jnp.sum(mask) > 0
    delta = jax.tree_util.tree_map(lambda d: jnp.where(has_data, d, 0), delta)
  info["loss"] = loss_sum / denom
  info["steps"] = taken
  return delta, info


def init(model: models_lib.Model, config: FedAvgConfig,
         key: jax.Array) -> ServerState:
  """Initial server state from the init stream's key."""
  params = model.init(key)
  return ServerState(params=params,
                     opt_state=config.server_opt.init(params),
                     round=jnp.zeros((), jnp.int32))


def _aggregation_weights(config: FedAvgConfig, sizes: jax.Array,
                         valid: jax.Array) -> jax.Array:
  if config.weighting == "size":
    w = sizes.astype(jnp.float32)
  else:
    w = (sizes > 0).astype(jnp.float32)
  w = w * valid.astype(jnp.float32)
  return w / jnp.maximum(jnp.sum(w), 1e-30)


def client_mesh(mesh: Union[jax.sharding.Mesh, str, None],
                clients_per_round: int,
                backend: Optional[str] = None
                ) -> Optional[jax.sharding.Mesh]:
  """Resolves ``mesh='auto'``: on CPU, the clients over the host devices.

  With several CPU devices in one process (on request, one per core,
  :mod:`repdef_jax.host`), 'auto' is a 'clients' mesh over
  ``min(devices, clients_per_round)`` of them, so the cores run clients in
  parallel (measured 1.2-1.8x per LeNet round on 2 cores, docs/scaling.md);
  with one CPU device, several processes, or on a GPU/TPU, 'auto' is None
  (one device; more accelerators are used by passing a mesh). A mesh or None
  is returned as given.
  """
  if not isinstance(mesh, str):
    return mesh
  if mesh != "auto":
    raise ValueError(f"mesh must be a Mesh, None or 'auto', got {mesh!r}.")
  if (backend or jax.default_backend()) != "cpu":
    return None
  return host.cpu_mesh(clients_per_round, CLIENTS_AXIS)


def make_round(model: models_lib.Model,
               config: FedAvgConfig,
               *,
               mesh: Union[jax.sharding.Mesh, str, None] = "auto",
               return_client_updates: bool = False,
               eval_global_loss: bool = False,
               donate: bool = False,
               jit: bool = True) -> Callable[..., Any]:
  """Builds the round function ``round_fn(state, data, keys, probs, test)``.

  ``round_fn(state, data, keys, probs=None, test=None, client_ids=None)``
  samples ``config.clients_per_round`` clients (unless ``client_ids`` is
  given), runs their updates at once, averages the deltas and applies the
  server optimizer. It returns ``(new_state, metrics)``; metrics (all on
  device, computed inside the jit) hold ``client_ids``, ``weights``,
  ``train_loss`` (weighted mean of the clients' local losses), the mean of
  the defense diagnostics, ``test_accuracy`` / ``test_loss`` of the new model
  when ``test`` is given, ``global_loss`` when ``eval_global_loss``, and
  ``client_updates`` (the ``[K, ...]`` deltas exactly as the server received
  them) when ``return_client_updates``. ``probs`` (sampling probabilities,
  one per client; None: :func:`default_probs`) is checked for its shape when
  the round is traced; :func:`check_setup` checks its values on the host.
  ``data`` is :class:`ClientArrays` (or ``partition.pack``'s ClientData),
  ``keys`` :func:`key_streams`; ``client_ids`` given as a host or device
  array are checked to lie in [0, clients) before the jitted call.

  Args:
    model: the model.
    config: the settings.
    mesh: a mesh with a 'clients' axis: the sampled clients are split
      over it with ``shard_map`` (K is padded with weight-0 slots to a
      multiple of the axis size), same result as one device to float
      rounding; None: one device; 'auto' (default, :func:`client_mesh`): the
      CPU's host devices, else (and with ``jit=False``) one device.
    return_client_updates: also return every client's delta (attack hook).
    eval_global_loss: also compute the federated objective after the round.
    donate: donate the input state's buffers (the caller must not reuse it).
    jit: wrap in ``jax.jit`` (False for eager debugging).

  Returns:
    The round function.
  """
  config.validate()
  if config.defense is not None:
    f32 = lambda *shape: jax.ShapeDtypeStruct(shape, jnp.float32)
    b = config.batch_size
    params = jax.eval_shape(model.init, jax.random.key(0))
    batch = defenses_base.ClientBatch(params, f32(b, *model.input_shape),
                                      jax.ShapeDtypeStruct((b,), jnp.int32),
                                      f32(b))
    defenses_base.check_contract(config.defense, params, batch)
  k = config.clients_per_round
  mesh = client_mesh(mesh if jit or not isinstance(mesh, str) else None, k)
  n_shards = 1 if mesh is None else mesh.shape[CLIENTS_AXIS]

  def per_client(params, round_, keys, x, y, mask, cid):
    tk, nk = client_keys(keys, round_, cid)
    return client_update(model, config, params, x, y, mask, tk, nk, round_)

  client_chunk = resolve_client_chunk(config.client_chunk)

  def many_clients(params, round_, keys, xs, ys, ms, ids):
    fn = functools.partial(per_client, params, round_, keys)
    if client_chunk > 0:
      return host.sequential_map(lambda a: fn(*a), (xs, ys, ms, ids),
                                 batch_size=min(client_chunk, xs.shape[0]))
    return jax.vmap(fn)(xs, ys, ms, ids)

  if mesh is not None:
    many_clients = jax.shard_map(
        many_clients, mesh=mesh,
        in_specs=(P(), P(), P(), P(CLIENTS_AXIS), P(CLIENTS_AXIS),
                  P(CLIENTS_AXIS), P(CLIENTS_AXIS)),
        out_specs=P(CLIENTS_AXIS), check_vma=False)

  def round_fn(state, data, keys, probs=None, test=None, client_ids=None):
    data = _check_round_args(data, keys, client_ids)
    sizes_all = client_sizes(data)
    n = data.x.shape[0]
    if probs is not None and jnp.shape(probs) != (n,):
      raise ValueError(f"probs must hold one probability per client, shape "
                       f"({n},), got shape {jnp.shape(probs)} (check_setup "
                       "checks the values on the host).")
    if client_ids is None and not config.replace and k > n:
      raise ValueError(f"clients_per_round={k} is more than the {n} clients "
                       "that can be sampled without replacement.")
    if client_ids is None:
      p = default_probs(data, config.weighting) if probs is None else probs
      ids = sample_clients(jax.random.fold_in(keys.sampling, state.round), p, k,
                           config.replace)
    else:
      ids = jnp.asarray(client_ids, jnp.int32)
    kk = ids.shape[0]
    kp = math.ceil(kk / n_shards) * n_shards
    valid = jnp.arange(kp) < kk
    ids_p = jnp.pad(ids, (0, kp - kk))
    xs, ys, ms = data.x[ids_p], data.y[ids_p], data.mask[ids_p]
    deltas, infos = many_clients(state.params, state.round, keys, xs, ys, ms,
                                 ids_p)
    if mesh is not None:  # Reduce on replicated values: same order as 1 device.
      rep = NamedSharding(mesh, P())
      deltas = jax.lax.with_sharding_constraint(deltas, rep)
      infos = jax.lax.with_sharding_constraint(infos, rep)
    if kp > kk:  # Padding slots trained client 0: zero them (0 * nan = nan).
      keep = lambda t: jnp.where(
          valid.reshape(valid.shape + (1,) * (t.ndim - 1)), t, 0)
      deltas = jax.tree_util.tree_map(keep, deltas)
      infos = jax.tree_util.tree_map(keep, infos)
    w = _aggregation_weights(config, sizes_all[ids_p], valid)
    avg = jax.tree_util.tree_map(lambda d: jnp.tensordot(w, d, axes=1), deltas)
    updates, opt_state = config.server_opt.update(
        jax.tree_util.tree_map(jnp.negative, avg), state.opt_state,
        state.params)
    params = optax.apply_updates(state.params, updates)
    new_state = ServerState(params=params, opt_state=opt_state,
                            round=state.round + 1)
    metrics = {"client_ids": ids, "weights": w[:kk],
               "train_loss": jnp.sum(w * infos["loss"])}
    for name, v in infos.items():
      if name.startswith("defense/"):
        metrics[name] = jnp.sum(w * v.astype(jnp.float32))
    if test is not None:
      metrics.update(evaluate(model, params, EvalData(*test)))
    if eval_global_loss:
      metrics["global_loss"] = global_loss(model, params, data, config.l2)
    if return_client_updates:
      metrics["client_updates"] = jax.tree_util.tree_map(lambda d: d[:kk],
                                                         deltas)
    return new_state, metrics

  if not jit:
    return round_fn
  jitted = jax.jit(round_fn, donate_argnums=(0,) if donate else ())

  @functools.wraps(round_fn)
  def placed(state, data, keys, probs=None, test=None, client_ids=None):
    # On the host: the jitted round sees traced client_ids (an id out of
    # range would silently train another client) and keys.
    _check_round_args(data, keys, client_ids)
    # Inputs on every device of the mesh before the call (a no-op for the
    # round's own outputs and for data placed once with place_on(mesh)), so
    # the round compiles once whatever the caller's arrays are.
    return jitted(*place_on(mesh, (state, data, keys, probs, test,
                                   client_ids)))

  placed._cache_size = jitted._cache_size  # pylint: disable=protected-access
  placed.mesh = mesh
  if mesh is None:  # Same arguments: ahead-of-time lowering (benchmarks).
    placed.lower = jitted.lower
  return placed


def _check_round_args(data: Any, keys: Any, client_ids: Any
                      ) -> ClientArrays:
  """A round's ``data`` as ClientArrays (also from ``partition.pack``'s
  ClientData); one-line errors for other data, keys that are not
  :class:`KeyStreams` and concrete ``client_ids`` outside [0, clients)."""
  if isinstance(data, tuple) and len(data) == len(ClientArrays._fields):
    data = ClientArrays(*data)
  elif all(hasattr(data, f) for f in ClientArrays._fields):
    data = ClientArrays(data.x, data.y, data.mask)
  else:
    raise ValueError("data must be ClientArrays (fedavg.as_client_arrays("
                     f"partition.pack(...))); got {type(data).__name__}.")
  if not isinstance(keys, KeyStreams):
    got = repr(keys) if isinstance(keys, int) else type(keys).__name__
    raise ValueError("keys must be the run's key streams, "
                     f"fedavg.key_streams(seed); got {got}.")
  if client_ids is None or isinstance(client_ids, jax.core.Tracer) or (
      isinstance(client_ids, jax.Array)
      and not client_ids.is_fully_addressable):
    return data
  n = data.x.shape[0]
  ids = np.asarray(client_ids)
  if ids.ndim != 1 or not np.issubdtype(ids.dtype, np.integer):
    raise ValueError("client_ids must be a 1-D array of integers, got "
                     f"{ids.dtype}{list(ids.shape)}.")
  bad = ids[(ids < 0) | (ids >= n)]
  if bad.size:
    raise ValueError(f"client_ids must lie in [0, {n}); got "
                     f"{bad[:5].tolist()}{' ...' if bad.size > 5 else ''} "
                     "among them.")
  return data


def place_on(mesh: Optional[jax.sharding.Mesh], tree: Any) -> Any:
  """``tree`` replicated on every device of ``mesh`` (None: as it is).

  Place the clients' data once with this before many rounds of a mesh
  round function; otherwise every call copies it to the devices.
  """
  if mesh is None:
    return tree
  return jax.device_put(tree, NamedSharding(mesh, P()))


def check_setup(config: FedAvgConfig, data: ClientArrays,
                probs: Optional[Any] = None) -> None:
  """Host-side checks of a run's inputs; raises a ValueError with the cause."""
  config.validate()
  sizes = np.asarray(client_sizes(data))
  n = len(sizes)
  if probs is None:
    p = sizes.astype(np.float64)
  else:
    p = np.asarray(probs, np.float64)
    if p.shape != (n,) or np.any(p < 0) or not np.isclose(p.sum(), 1.0):
      raise ValueError(f"probs must be {n} non-negative numbers summing to 1.")
  available = int(np.sum(p > 0))
  if available == 0:
    raise ValueError("no client holds any example.")
  if not config.replace and config.clients_per_round > available:
    raise ValueError(
        f"clients_per_round={config.clients_per_round} is more than the "
        f"{available} clients that can be sampled without replacement.")


def run_rounds(round_fn: Callable[..., Any], state: ServerState, data: Any,
               keys: KeyStreams, num_rounds: int, **kwargs):
  """Runs ``num_rounds`` rounds; returns the state and stacked host metrics."""
  history = []
  for _ in range(num_rounds):
    state, metrics = round_fn(state, data, keys, **kwargs)
    history.append(jax.device_get(metrics))
  if not history:
    return state, {}
  return state, jax.tree_util.tree_map(lambda *a: np.stack(a), *history)


def loop_round(model: models_lib.Model, config: FedAvgConfig,
               state: ServerState, data: ClientArrays, keys: KeyStreams,
               client_ids: Any) -> ServerState:
  """Reference round: a Python loop over clients of a jitted client update.

  The fedjax single-device design; used by tests and the benchmark to check
  the vectorized round. Not for production use.
  """
  x, y, mask = (np.asarray(a) for a in data)
  client_fn, server_fn = make_loop_fns(model, config)
  ids = [int(i) for i in np.asarray(client_ids)]
  deltas = [client_fn(state.params, x[i], y[i], mask[i], state.round, keys,
                      np.int32(i))[0] for i in ids]
  sizes = np.sum(mask[ids] > 0, axis=1).astype(np.int32)
  return server_fn(state, deltas, sizes)


_CLIENT_FNS: dict[Any, Callable[..., Any]] = {}


def make_loop_fns(model: models_lib.Model, config: FedAvgConfig):
  """Jitted ``(client_fn, server_fn)`` of the fedjax-style loop round.

  ``client_fn(params, x, y, mask, round, keys, client_id) -> (delta, info)``
  runs one client; ``server_fn(state, [deltas], sizes) -> state`` averages
  and applies the server optimizer. Cached per (model, config) object.
  """
  cache_key = (id(model), id(config))
  if cache_key in _CLIENT_FNS:
    return _CLIENT_FNS[cache_key][:2]

  def client_fn(params, x, y, mask, round_, keys, cid):
    tk, nk = client_keys(keys, round_, cid)
    return client_update(model, config, params, x, y, mask, tk, nk, round_)

  def server_fn(state, deltas, sizes):
    w = _aggregation_weights(config, sizes, jnp.ones(sizes.shape, bool))
    avg = jax.tree_util.tree_map(
        lambda *d: sum(w[i] * di for i, di in enumerate(d)), *deltas)
    updates, opt_state = config.server_opt.update(
        jax.tree_util.tree_map(jnp.negative, avg), state.opt_state,
        state.params)
    return ServerState(params=optax.apply_updates(state.params, updates),
                       opt_state=opt_state, round=state.round + 1)

  fns = (jax.jit(client_fn), jax.jit(server_fn))
  _CLIENT_FNS[cache_key] = (*fns, model, config)  # Keeps the ids alive.
  return fns


def make_mesh(num_devices: Optional[int] = None) -> jax.sharding.Mesh:
  """A 1-D mesh with a 'clients' axis over the first ``num_devices`` devices.

  After ``jax.distributed`` starts (:mod:`repdef_jax.distributed`),
  ``jax.devices()`` lists every process's devices; a multi-process mesh
  spans all of them (every process runs its share of the clients), so there
  ``num_devices`` must be None or the global device count.
  """
  devices = jax.devices()
  n = len(devices) if num_devices is None else int(num_devices)
  if not 1 <= n <= len(devices):
    raise ValueError(f"num_devices must be in [1, {len(devices)}], got {n}.")
  if jax.process_count() > 1 and n != len(devices):
    raise ValueError(
        f"num_devices={n}: a multi-process mesh spans every process's "
        f"devices; use None (all {len(devices)}).")
  return jax.sharding.Mesh(np.asarray(devices[:n]), (CLIENTS_AXIS,))
