"""FedAvg round benchmarks: plain and defended (Soteria at every local step).

The issue-12 workload: DLG's LeNet on CIFAR-10 shapes, clients of 200
synthetic examples (the cost does not depend on pixel values), one local
epoch of ``batch_size``; and the paper's MNIST setting (100 clients, 10 per
round, 5 local steps of batch 10, Soteria at every step). The round is the
library's default: ``get_model`` and ``make_round`` without tuning.
"""

from __future__ import annotations

import functools
import math
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from experiments.benchmarks import timing
from repdef_jax import fedavg
from repdef_jax import gradients
from repdef_jax import models
from repdef_jax.defenses import soteria


def synthetic_clients(num_clients: int, per_client: int,
                      shape: Sequence[int], seed: int = 0
                      ) -> fedavg.ClientArrays:
  """Uniform images and random labels, every example real."""
  rng = np.random.default_rng(seed)
  x = rng.random((num_clients, per_client, *shape), dtype=np.float32)
  y = rng.integers(0, 10, (num_clients, per_client)).astype(np.int32)
  return fedavg.ClientArrays(jnp.asarray(x), jnp.asarray(y),
                             jnp.ones((num_clients, per_client), jnp.float32))


def step_flops(model: models.Model, batch: int, defended: bool) -> float:
  """FLOPs of one local step of the reference algorithm (XLA count).

  Plain: the batch gradient. Defended: plus the reference Soteria score,
  one forward pass and F input-gradient backward passes (one per feature),
  all in the direct 'xla' convolution formulation.
  """
  m = model.with_conv_impl("xla")
  params = jax.eval_shape(m.init, jax.random.key(0))
  params = jax.tree_util.tree_map(lambda s: jnp.zeros(s.shape, s.dtype),
                                  params)
  x = jnp.zeros((batch, *m.input_shape))
  y = jnp.zeros((batch,), jnp.int32)
  flops = timing.xla_flops(lambda p, x, y: gradients.batch_grad(m, p, x, y),
                           params, x, y)
  if defended:
    flops += mask_flops(m, batch)
  return flops


def mask_flops(model: models.Model, batch: int) -> float:
  """FLOPs of the reference Soteria score: forward + F backward passes."""
  m = model.with_conv_impl("xla")
  params = m.init(jax.random.key(0))
  x = jnp.zeros((batch, *m.input_shape))
  feats = lambda x: m.features(params, x)
  fwd = timing.xla_flops(feats, x)
  cot = jnp.zeros((batch, m.num_features))
  both = timing.xla_flops(lambda x, c: jax.vjp(feats, x)[1](c), x, cot)
  return fwd + m.num_features * max(both - fwd, 0.0)


def build_round(model_name: str = "lenet",
                input_shape: Sequence[int] = (32, 32, 3),
                batch_size: int = 50, clients: int = 10,
                per_client: int = 200, defense_percent: float | None = None,
                local_steps: int = 0) -> timing.Bench:
  """One jitted FedAvg round with the library's defaults, and its inputs.

  Args:
    model_name: the model.
    input_shape: image shape.
    batch_size: local batch size.
    clients: clients per round (all of them, ids 0..clients-1).
    per_client: examples per client.
    defense_percent: Soteria pruning rate at every local step (None: off).
    local_steps: 0 = one local epoch; else that many steps.

  Returns:
    A Bench whose ``fn`` is the jitted round, ``args`` (state, data, keys,
    probs, test, client_ids) and ``flops`` those of the reference algorithm.
  """
  model = models.get_model(model_name, input_shape, 10)
  defense = (None if defense_percent is None
             else soteria.soteria(model, defense_percent))
  config = fedavg.FedAvgConfig(
      clients_per_round=clients, local_epochs=0 if local_steps else 1,
      local_steps=local_steps or 1, batch_size=batch_size, client_lr=0.01,
      defense=defense)
  keys = fedavg.key_streams(0)
  state = fedavg.init(model, config, keys.init)
  data = synthetic_clients(clients, per_client, input_shape)
  ids = jnp.arange(clients, dtype=jnp.int32)
  steps = config.steps_per_round(per_client)
  b = min(batch_size, per_client)
  flops = clients * steps * step_flops(model, b, defense is not None)
  return timing.Bench(fedavg.make_round(model, config),
                      (state, data, keys, None, None, ids), flops,
                      f"{clients} clients x {per_client} ex., {steps} local "
                      f"steps of batch {b}",
                      {"model": model, "batch": b,
                       "defense_percent": defense_percent,
                       "local_steps": local_steps or None})


def torch_round(bench: timing.Bench, mask_impl: str = "loop"):
  """The PyTorch peer of :func:`build_round` (same model, params, shapes).

  ``mask_impl``: a defended round's Soteria mask, 'loop' (the reference
  per-feature loop) or 'vectorized' (``torch.func.vmap``; see
  :func:`experiments.benchmarks.torch_peers.fedavg_round`).
  """
  from experiments.benchmarks import torch_peers  # pylint: disable=g-import-not-at-top
  state, data = bench.args[0], bench.args[1]
  model = bench.meta["model"]
  batch_size, defense_percent = bench.meta["batch"], bench.meta[
      "defense_percent"]
  net = torch_peers.torch_model(model, state.params)
  clients = [(torch_peers.nchw(data.x[k]), torch_peers.labels(data.y[k]))
             for k in range(data.x.shape[0])]
  eps = model.score_eps
  steps = bench.meta.get("local_steps")
  return torch_peers.synced(lambda: torch_peers.fedavg_round(
      net, clients, batch_size, 0.01, defense_percent, eps,
      local_steps=steps, mask_impl=mask_impl))


# The paper's MNIST setting (issue 12): 100 devices x 2 classes x 100
# samples, 10 devices per round, 5 local steps of batch 10, LeNet.
PAPER_MNIST = dict(input_shape=(28, 28, 1), clients=10, local_steps=5,
                   batch_size=10, per_client=200)


def paper_rounds(num_rounds: int = 200, defense_percent: float | None = 60.0,
                 clients: int = 10, local_steps: int = 5,
                 input_shape: Sequence[int] = (28, 28, 1),
                 with_torch: bool = False, repeats: int = 3
                 ) -> dict[str, object]:
  """Seconds of ``num_rounds`` rounds of the paper's MNIST setting (estimate).

  LeNet, clients of 200 examples, batch 10, Soteria at every local step
  (``defense_percent``; None: plain). One round of ``clients`` clients x
  ``local_steps`` steps is timed after compilation; the per-round cost is
  scaled by ``(10 x 5) / (clients x local_steps)`` (clients run one after
  another on CPU, so the cost is linear in client-steps; 1 at the paper's
  sizes) and ``num_rounds`` rounds are extrapolated (+ one compile; no test
  evaluation). With ``with_torch`` the PyTorch peer round is timed (interleaved
  with ours) and extrapolated the same way.

  Returns:
    ``{'round_s', 'compile_s', 'estimate_s', 'torch_round_s',
    'torch_estimate_s', 'scale', 'flops_per_round', 'memory', 'note'}``.
  """
  bench = build_round("lenet", input_shape, batch_size=10, clients=clients,
                      per_client=200, defense_percent=defense_percent,
                      local_steps=local_steps)
  if with_torch:
    res, peer = timing.compare(bench, torch_round(bench), repeats,
                               peer_warmup=False)
  else:
    res, peer = timing.measure(bench, repeats=repeats), None
  scale = (PAPER_MNIST["clients"] * PAPER_MNIST["local_steps"]) / (
      clients * local_steps)
  out = {"round_s": res["seconds"] * scale,
         "compile_s": res["compile_seconds"],
         "estimate_s": res["compile_seconds"] + num_rounds * res["seconds"] *
                       scale,
         "scale": scale, "rounds": num_rounds,
         "flops_per_round": bench.flops * scale, "memory": res["memory"],
         "torch_round_s": None, "torch_estimate_s": None,
         "note": (f"measured {clients} clients x {local_steps} steps of "
                  f"batch 10 on {tuple(input_shape)}"
                  + (f", scaled x{scale:g}" if scale != 1 else ""))}
  if peer is not None:
    out["torch_round_s"] = peer["seconds"] * scale
    out["torch_estimate_s"] = num_rounds * out["torch_round_s"]
  return out


def local_step_seconds(model_name: str, input_shape: Sequence[int],
                       batch: int, defended: bool, repeats: int = 1,
                       steps: int = 2, **model_kwargs) -> dict[str, float]:
  """Seconds per local FedAvg step of one client (the unit costs).

  Runs ``client_update`` for ``steps`` local steps (jitted, ``lax.scan``)
  and divides. For models whose full defended step would take minutes
  (ConvNet) the Soteria part is timed on one chunk of features and scaled
  to all of them (``scaled`` in the result); models whose scores need no
  pullback (``identity_bottom``, e.g. the leakage CNN) are timed whole.
  """
  model = models.get_model(model_name, input_shape, 10, **model_kwargs)
  params = model.init(jax.random.key(0))
  data = synthetic_clients(1, max(batch * steps, batch), input_shape)
  x, y, mask = data.x[0], data.y[0], data.mask[0]
  keys = fedavg.key_streams(0)
  tk, nk = fedavg.client_keys(keys, 0, 0)
  cost = batch * soteria.jacobian_passes(model) * step_flops(model, 1, False)
  scaled = defended and cost > 5e10 and not model.identity_bottom
  defense = (soteria.soteria(model, 60.0) if defended and not scaled
             else None)
  config = fedavg.FedAvgConfig(clients_per_round=1, local_steps=steps,
                               batch_size=batch, client_lr=0.01,
                               defense=defense)
  fn = jax.jit(lambda p, x, y, m, tk, nk: fedavg.client_update(
      model, config, p, x, y, m, tk, nk)[0])
  res = timing.measure(timing.Bench(fn, (params, x, y, mask, tk, nk)),
                       repeats)
  out = {"seconds": res["seconds"] / steps, "scaled": bool(scaled)}
  if scaled:
    out["seconds"] += _soteria_chunk_seconds(model, params, x[:batch],
                                             repeats)
  return out


def _soteria_chunk_seconds(model, params, x, repeats):
  """Soteria scores of one batch, from programs of one and two chunks: the
  first chunk plus (chunks - 1) times the second's extra time (scaling one
  timed chunk would charge every chunk the forward pass and the call).
  A chunk is pullbacks through ``bottom`` or, where the defense runs in
  forward mode, pushforwards through the whole feature map."""
  mode = soteria.model_jacobian_mode(model)
  jm = soteria.jacobian_model(model, mode)  # As the defense runs it.
  passes = soteria.jacobian_passes(model, mode)
  c = soteria.auto_chunk(x.shape[0], passes)

  def chunks(params, x, k):
    if mode == "fwd":
      _, lin = jax.linearize(lambda xx: jm.features(params, xx), x)
      shape, dtype, push = x.shape, x.dtype, lambda t: lin(t) ** 2
    else:
      h, vjp = jax.vjp(lambda xx: jm.bottom(params, xx), x)
      shape, dtype, push = h.shape, h.dtype, lambda t: vjp(t)[0] ** 2

    def one(i):  # Rows depend on i: XLA cannot hoist the body.
      rows = jnp.full((c, *shape), i + 1, dtype)
      return jnp.sum(jax.vmap(push)(rows))

    return jnp.sum(jax.lax.map(one, jnp.arange(k)))

  t1, t2 = (timing.measure(timing.Bench(
      jax.jit(functools.partial(chunks, k=k)), (params, x)),
                           repeats)["seconds"] for k in (1, 2))
  return t1 + (math.ceil(passes / c) - 1) * max(t2 - t1, 0.0)
