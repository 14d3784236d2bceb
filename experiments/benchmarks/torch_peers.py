"""PyTorch peers: what a researcher would run instead (the ``[torch]`` extra).

Every peer runs the same model with the same parameters (copied from the
flax tree) on the same shapes, with ``torch.set_num_threads(threads)``
(default 2, stated in every row), on the device ours runs on (:func:`device`:
CUDA when JAX's backend is a GPU). They are the plain PyTorch ways:

* FedAvg round: a Python loop over clients; each copies the global weights
  and runs ``torch.optim.SGD`` over its minibatches; the server averages the
  deltas.
* Soteria mask: the reference per-feature loop, one
  ``torch.autograd.grad(r, x, e_i)`` per feature i, batched over the
  examples. It computes input gradients only (the reference code's
  ``backward`` also fills every weight gradient, which is slower), so the
  peer is the faster of the two.
* Soteria mask, vectorized (:func:`soteria_mask_vectorized`): the same
  scores from one forward pass and ``torch.func.vmap`` of the
  ``torch.func.vjp`` pullback over one-hot cotangents, a chunk of features
  at a time (:func:`vmap_chunk`): what a PyTorch user who vectorizes the
  reference computation gets (same FLOPs, fewer launches).
* Defended round: the FedAvg loop with that mask at every local step
  (``mask_impl``: the reference loop, or the vectorized mask), zeroing the
  pruned columns of the last layer's weight gradient.
* Per-example gradients: a loop of single-example backward passes.
* DLG: ``torch.optim.LBFGS(lr=1, history_size=100, max_iter=20)`` on the
  gradient-matching loss; GS: Adam on the cosine loss + total variation.

On CUDA every peer callable ends with ``torch.cuda.synchronize()``
(:func:`synced`), as ours ends with ``jax.block_until_ready``; each library
keeps its default float32 precision (JAX lets XLA use TF32 tensor cores for
float32 convolutions and matmuls on GPU, PyTorch lets cuDNN use them for
convolutions, not for matmuls).
"""

from __future__ import annotations

import functools
from typing import Any, Callable

import numpy as np


def available() -> tuple[bool, str]:
  """(True, version) when ``import torch`` works, else (False, why)."""
  try:
    import torch  # pylint: disable=g-import-not-at-top
  except ImportError as e:
    return False, (f"torch not importable ({e}); install the [torch] extra: "
                   "pip install -e '.[torch]'")
  return True, torch.__version__


def set_threads(threads: int) -> int:
  """``torch.set_num_threads``; returns the count torch reports."""
  import torch  # pylint: disable=g-import-not-at-top
  torch.set_num_threads(int(threads))
  return torch.get_num_threads()


@functools.lru_cache(maxsize=None)
def device() -> str:
  """'cuda' when JAX computes on a GPU and torch sees one, else 'cpu' (asked
  once per process: every tensor a peer makes, timed loops included, reads
  it)."""
  import jax  # pylint: disable=g-import-not-at-top
  import torch  # pylint: disable=g-import-not-at-top
  return ("cuda" if jax.default_backend() == "gpu"
          and torch.cuda.is_available() else "cpu")


def synced(fn: Callable[[], Any]) -> Callable[[], Any]:
  """``fn`` that returns only when the device's queued work is done."""
  if device() != "cuda":
    return fn
  import torch  # pylint: disable=g-import-not-at-top

  def call():
    out = fn()
    torch.cuda.synchronize()
    return out

  return call


def _t(a, dtype=np.float32):
  import torch  # pylint: disable=g-import-not-at-top
  return torch.tensor(np.asarray(a, dtype).copy(), device=device())


def labels(y) -> Any:
  """Integer labels -> an int64 torch tensor on the peers' device."""
  return _t(y, np.int64)


def torch_model(model: Any, params: Any):
  """A PyTorch copy of a repdef_jax model (lenet, leakage, convnet64, mlp).

  Input NCHW, ``forward`` returns logits, ``features`` the representation
  (flattened in the flax HWC order, so the head weights carry over).
  """
  import torch  # pylint: disable=g-import-not-at-top
  from torch import nn  # pylint: disable=g-import-not-at-top

  name = model.name
  module = model.module

  def conv(p, stride, padding):
    k = np.asarray(p["kernel"])  # HWIO
    c = nn.Conv2d(k.shape[2], k.shape[3], k.shape[0], stride=stride,
                  padding=padding)
    c.weight.data = _t(k.transpose(3, 2, 0, 1))
    c.bias.data = _t(p["bias"])
    return c

  def dense(p):
    k = np.asarray(p["kernel"])
    d = nn.Linear(k.shape[0], k.shape[1])
    d.weight.data = _t(k.T)
    d.bias.data = _t(p["bias"])
    return d

  class Net(nn.Module):
    """The model as a list of (layer, activation, pool) steps."""

    def __init__(self):
      super().__init__()
      layers, self.acts, self.pools = [], [], []
      if name == "lenet":
        for i, s in enumerate((2, 2, 1, 1)):
          layers.append(conv(params[f"conv{i}"], s, 2))
          self.acts.append(torch.sigmoid)
          self.pools.append(0)
      elif name == "leakage":
        layers.append(conv(params["conv0"], 1, 2))
        self.acts.append(torch.sigmoid)
        self.pools.append(0)
      elif name == "convnet64":
        for i in range(8):
          layers.append(conv(params[f"conv{i}"], 1, 1))
          self.acts.append(torch.relu)
          self.pools.append(3 if i in (5, 7) else 0)
      elif name == "mlp":
        for i in range(len(module.hidden)):
          layers.append(dense(params[f"fc{i}"]))
          self.acts.append(torch.relu)
          self.pools.append(0)
      else:
        raise ValueError(f"no PyTorch peer for model {name!r}.")
      self.layers = nn.ModuleList(layers)
      self.head = dense(params["head"])
      self.is_mlp = name == "mlp"

    def features(self, x):
      if self.is_mlp:
        x = x.permute(0, 2, 3, 1).reshape(x.shape[0], -1)
      for layer, act, pool in zip(self.layers, self.acts, self.pools):
        x = act(layer(x))
        if pool:
          x = torch.nn.functional.max_pool2d(x, pool)
      if not self.is_mlp:
        x = x.permute(0, 2, 3, 1).reshape(x.shape[0], -1)  # HWC flatten.
      return x

    def forward(self, x):
      return self.head(self.features(x))

  return Net().to(device())


def nchw(x) -> Any:
  """NHWC numpy/JAX images -> a NCHW float32 torch tensor."""
  return _t(np.asarray(x).transpose(0, 3, 1, 2))


# Features per vmapped pullback in soteria_mask_vectorized: about
# VMAP_ROWS (feature, example) rows a chunk, 32 to 256 features. Measured on
# the 2-core CPU of BENCHMARKS.md (LeNet CIFAR, 768 features, 2 threads,
# best of 2-3, other jobs on the cores, so +-15 % noise): batch 1, 64-256
# features within noise, 16-32 up to 2x slower, all 768 at once ~1.5x
# slower; batch 10, 32-256 within noise, 768 ~1.5x slower; batch 50, 16-32
# best, 128 (6400 rows) up to 1.5x slower. torch.autograd.grad(...,
# is_grads_batched=True) was ~1.6x slower than torch.func.vmap over
# torch.func.vjp at batch 10. Not measured on a GPU (the rule serves there
# too; a GPU would likely prefer larger chunks).
VMAP_ROWS = 2048


def vmap_chunk(batch: int) -> int:
  """Features per vmapped pullback for ``batch`` examples (see above)."""
  return max(32, min(256, VMAP_ROWS // max(int(batch), 1)))


MASK_IMPLS = ("loop", "vectorized")


def _keep(scores, percent: float):
  """The reference threshold: scores >= their ``percent``-th percentile."""
  return (scores >= np.percentile(scores, percent)).astype(np.float32)


def soteria_mask(net, x, percent: float, eps: float = 0.0):
  """The reference rule: per-feature ``autograd.grad`` loop, percentile mask.

  Returns:
    (keep mask [F] as a numpy array, scores [F]).
  """
  import torch  # pylint: disable=g-import-not-at-top
  x = x.detach().clone().requires_grad_(True)
  r = net.features(x)
  b, f = r.shape
  scores = torch.zeros(f, device=x.device)
  cot = torch.zeros_like(r)
  for i in range(f):
    cot.zero_()
    cot[:, i] = 1.0
    (dx,) = torch.autograd.grad(r, x, cot, retain_graph=True)
    scores[i] = torch.sum(dx.reshape(b, -1).norm(dim=1) / (r[:, i] + eps))
  scores = scores.detach().cpu().numpy()
  return _keep(scores, percent), scores


def soteria_mask_vectorized(net, x, percent: float, eps: float = 0.0,
                            chunk: int | None = None):
  """The reference rule with its per-feature backward passes vectorized.

  Same scores as :func:`soteria_mask`, ``score_i = sum_b ||dr_i/dx_b|| /
  (r_i + eps)``, and the same percentile mask: one forward pass under
  ``torch.func.vjp``, then the pullback ``torch.func.vmap``-ed over the
  one-hot cotangents of ``chunk`` features at a time (``[chunk, B, F]``),
  each giving ``[chunk, B, *x]`` input gradients at once.

  Args:
    net: the model (:func:`torch_model`); its weights get no gradient.
    x: NCHW images [B, ...].
    percent: pruning rate (percentile of the scores).
    eps: the score's denominator epsilon.
    chunk: features per vmapped pullback (None: :func:`vmap_chunk` of
      the batch size).

  Returns:
    (keep mask [F] as a numpy array, scores [F]).
  """
  import torch  # pylint: disable=g-import-not-at-top
  # torch.func differentiates x by itself; no_grad keeps autograd from also
  # recording the weights' graph (measured 10-20 % faster).
  with torch.no_grad():
    r, pullback = torch.func.vjp(net.features, x.detach())
    b, f = r.shape
    chunk = chunk or vmap_chunk(b)
    eye = torch.eye(f, device=r.device, dtype=r.dtype)
    scores = torch.empty(f, device=r.device, dtype=r.dtype)
    for s in range(0, f, chunk):
      rows = eye[s:s + chunk]
      c = rows.shape[0]
      (dx,) = torch.func.vmap(pullback)(rows[:, None, :].expand(c, b, f))
      norms = dx.reshape(c, b, -1).norm(dim=2)  # [c, B]
      scores[s:s + c] = torch.sum(norms / (r[:, s:s + c].T + eps), dim=1)
  scores = scores.cpu().numpy()
  return _keep(scores, percent), scores


def mask_fn(mask_impl: str) -> Callable[..., Any]:
  """The Soteria mask of a ``mask_impl``: 'loop' (:func:`soteria_mask`, the
  reference) or 'vectorized' (:func:`soteria_mask_vectorized`)."""
  if mask_impl not in MASK_IMPLS:
    raise ValueError(f"mask_impl must be one of {MASK_IMPLS}, got "
                     f"{mask_impl!r}.")
  return soteria_mask if mask_impl == "loop" else soteria_mask_vectorized


def fedavg_round(net, clients: list[tuple[Any, Any]], batch_size: int,
                 lr: float, defense_percent: float | None = None,
                 eps: float = 0.0, seed: int = 0,
                 local_steps: int | None = None,
                 mask_impl: str = "loop") -> None:
  """One FedAvg round (one local epoch per client), in place on ``net``.

  Args:
    net: the global model (updated with the averaged delta).
    clients: per client (x NCHW tensor, y int64 tensor).
    batch_size: local minibatch size.
    lr: client SGD learning rate.
    defense_percent: Soteria pruning rate at every local step (None: off).
    eps: the score's denominator epsilon.
    seed: minibatch order.
    local_steps: None = one local epoch; else that many minibatches
      (cycling over the shuffled client data).
    mask_impl: the Soteria mask: 'loop' (:func:`soteria_mask`, the
      reference) or 'vectorized' (:func:`soteria_mask_vectorized`); both
      give the same mask.
  """
  import copy  # pylint: disable=g-import-not-at-top
  import torch  # pylint: disable=g-import-not-at-top
  mask = mask_fn(mask_impl)
  gen = torch.Generator().manual_seed(seed)
  global_state = {k: v.clone() for k, v in net.state_dict().items()}
  total = {k: torch.zeros_like(v) for k, v in global_state.items()}
  loss_fn = torch.nn.CrossEntropyLoss()
  for x, y in clients:
    local = copy.deepcopy(net)
    opt = torch.optim.SGD(local.parameters(), lr=lr)
    order = torch.randperm(x.shape[0], generator=gen)
    starts = list(range(0, x.shape[0], batch_size))
    if local_steps is not None:
      starts = [starts[i % len(starts)] for i in range(local_steps)]
    for s in starts:
      idx = order[s:s + batch_size]
      xb, yb = x[idx], y[idx]
      opt.zero_grad()
      loss_fn(local(xb), yb).backward()
      if defense_percent is not None:
        keep, _ = mask(local, xb, defense_percent, eps)
        local.head.weight.grad *= _t(keep)[None, :]
      opt.step()
    for k, v in local.state_dict().items():
      total[k] += v - global_state[k]
  net.load_state_dict({k: global_state[k] + total[k] / len(clients)
                       for k in global_state})


def sgemm(n: int) -> Callable[[], Any]:
  """An [n, n] x [n, n] fp32 product on the peers' device, synchronised."""
  import torch  # pylint: disable=g-import-not-at-top
  a = torch.randn(n, n, device=device())
  b = torch.randn(n, n, device=device())
  return synced(lambda: a @ b)


def per_example_grads(net, x, y) -> list:
  """A loop of single-example backward passes (the PyTorch way)."""
  import torch  # pylint: disable=g-import-not-at-top
  loss_fn = torch.nn.CrossEntropyLoss()
  out = []
  for i in range(x.shape[0]):
    net.zero_grad()
    loss_fn(net(x[i:i + 1]), y[i:i + 1]).backward()
    out.append([p.grad.clone() for p in net.parameters()])
  return out


def _ce_soft(pred, target):
  import torch  # pylint: disable=g-import-not-at-top
  return torch.mean(torch.sum(-target * torch.log_softmax(pred, -1), 1))


def dlg_runner(net, x_true, label: int, x0, y0, inner_steps: int = 20
               ) -> Callable[[], float]:
  """A callable running one DLG outer L-BFGS step (``inner_steps`` iters)."""
  import torch  # pylint: disable=g-import-not-at-top
  onehot = torch.nn.functional.one_hot(labels([label]),
                                       net.head.out_features).float()
  true_grads = [g.detach() for g in torch.autograd.grad(
      _ce_soft(net(x_true), onehot), list(net.parameters()))]
  dx = x0.detach().clone().requires_grad_(True)
  dy = y0.detach().clone().requires_grad_(True)
  opt = torch.optim.LBFGS([dx, dy], lr=1, history_size=100,
                          max_iter=inner_steps, tolerance_grad=0.0,
                          tolerance_change=0.0)

  def closure():
    opt.zero_grad()
    loss = _ce_soft(net(dx), torch.softmax(dy, -1))
    grads = torch.autograd.grad(loss, list(net.parameters()),
                                create_graph=True)
    diff = sum(((g - t) ** 2).sum() for g, t in zip(grads, true_grads))
    diff.backward()
    return diff

  return lambda: float(opt.step(closure))


def gs_runner(net, x_true, label: int, x0, tv_weight: float = 1e-4,
              lr: float = 0.1) -> Callable[[], None]:
  """A callable running one GS iteration (Adam on the sign of the gradient)."""
  import torch  # pylint: disable=g-import-not-at-top
  y = labels([label])
  loss_fn = torch.nn.CrossEntropyLoss()
  params = list(net.parameters())
  true_grads = [g.detach() for g in torch.autograd.grad(
      loss_fn(net(x_true), y), params)]
  dx = x0.detach().clone().requires_grad_(True)
  opt = torch.optim.Adam([dx], lr=lr)

  def step():
    opt.zero_grad()
    grads = torch.autograd.grad(loss_fn(net(dx), y), params,
                                create_graph=True)
    dot = sum((g * t).sum() for g, t in zip(grads, true_grads))
    n1 = torch.sqrt(sum((g * g).sum() for g in grads))
    n2 = torch.sqrt(sum((t * t).sum() for t in true_grads))
    tv = (torch.mean(torch.abs(dx[:, :, :, :-1] - dx[:, :, :, 1:])) +
          torch.mean(torch.abs(dx[:, :, :-1, :] - dx[:, :, 1:, :])))
    loss = 1 - dot / (n1 * n2) + tv_weight * tv
    loss.backward()
    dx.grad.sign_()
    opt.step()
    with torch.no_grad():
      dx.clamp_(0, 1)

  return step
