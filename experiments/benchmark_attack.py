r"""Benchmark: a full DLG attack and GS iterations per second, JAX vs PyTorch.

Command::

  python -m experiments.benchmark_attack [--outer_steps=300] [--inner_steps=20]
      [--gs_iterations=200] [--torch=auto|off]

Prints, for one CIFAR-10-shaped image (32x32x3) on DLG's LeNet (uniform
init):

* the wall time of a full DLG attack (``outer_steps`` x ``inner_steps``
  L-BFGS iterations, no early stop) after compilation, with the compile time
  separately;
* GS (Inverting Gradients) iterations per second after compilation;
* when ``import torch`` works, the same DLG attack with
  ``torch.optim.LBFGS(lr=1, history_size=100, max_iter=inner_steps)`` on the
  same LeNet with the same weights, loss and start point, and the ratio
  torch time / JAX time (target >= 3). The peer runs ``torch_outer_steps``
  outer steps and its time is scaled to ``outer_steps`` (no early stop on
  either side, so every iteration costs the same).

:func:`run` returns the numbers as a dict for ``experiments/benchmark.py``.
"""

from __future__ import annotations

import time

from absl import app
from absl import flags
import jax
import jax.numpy as jnp
import numpy as np

from repdef_jax import gradients
from repdef_jax import models
from repdef_jax.attacks import dlg as dlg_lib
from repdef_jax.attacks import inverting as inverting_lib


def _smooth_image(shape, seed=0):
  rng = np.random.default_rng(seed)
  h, w, c = shape
  yy, xx = np.mgrid[0:h, 0:w] / max(h, w)
  chans = [0.5 + 0.4 * np.sin(2 * np.pi * (xx * rng.uniform(0.5, 1.5) + ph))
           * np.cos(2 * np.pi * yy * rng.uniform(0.5, 1.5))
           for ph in rng.uniform(0, 1, c)]
  return np.stack(chans, -1)[None].astype(np.float32)


def torch_lenet(params, model):
  """A PyTorch copy of DLG's LeNet holding ``params`` (NCHW in, logits out).

  The flax layout (NHWC, kernel HWIO, head kernel [F, K] over HWC-flattened
  features) is converted so both nets compute the same function.
  """
  import torch  # pylint: disable=g-import-not-at-top
  from torch import nn  # pylint: disable=g-import-not-at-top

  class Net(nn.Module):

    def __init__(self):
      super().__init__()
      c = model.input_shape[-1]
      convs = []
      for i, s in enumerate((2, 2, 1, 1)):
        conv = nn.Conv2d(c if i == 0 else 12, 12, 5, stride=s, padding=2)
        k = np.asarray(params[f"conv{i}"]["kernel"])  # HWIO
        conv.weight.data = torch.tensor(k.transpose(3, 2, 0, 1).copy())
        conv.bias.data = torch.tensor(np.asarray(params[f"conv{i}"]["bias"]))
        convs.append(conv)
      self.convs = nn.ModuleList(convs)
      hk = np.asarray(params["head"]["kernel"])
      self.fc = nn.Linear(hk.shape[0], hk.shape[1])
      self.fc.weight.data = torch.tensor(hk.T.copy())
      self.fc.bias.data = torch.tensor(np.asarray(params["head"]["bias"]))

    def forward(self, x):
      for conv in self.convs:
        x = torch.sigmoid(conv(x))
      x = x.permute(0, 2, 3, 1).reshape(x.shape[0], -1)  # HWC flatten
      return self.fc(x)

  return Net()


def torch_dlg(params, model, x_true, label, x0, y0, outer_steps, inner_steps):
  """The reference DLG loop in PyTorch (LBFGS lr 1, history 100).

  Returns:
    (seconds, final loss, reconstructed image NHWC).
  """
  import torch  # pylint: disable=g-import-not-at-top
  torch.manual_seed(0)
  net = torch_lenet(params, model)

  def ce(pred, target):
    return torch.mean(torch.sum(-target * torch.log_softmax(pred, -1), 1))

  gt = torch.tensor(x_true.transpose(0, 3, 1, 2).copy())
  onehot = torch.nn.functional.one_hot(torch.tensor([label]), 10).float()
  true_grads = torch.autograd.grad(ce(net(gt), onehot), net.parameters())
  true_grads = [g.detach() for g in true_grads]
  dx = torch.tensor(x0.transpose(0, 3, 1, 2).copy()).requires_grad_(True)
  dy = torch.tensor(y0.copy()).requires_grad_(True)
  opt = torch.optim.LBFGS([dx, dy], lr=1, history_size=100,
                          max_iter=inner_steps, tolerance_grad=0.0,
                          tolerance_change=0.0)

  def closure():
    opt.zero_grad()
    loss = ce(net(dx), torch.softmax(dy, -1))
    grads = torch.autograd.grad(loss, net.parameters(), create_graph=True)
    diff = sum(((g - t) ** 2).sum() for g, t in zip(grads, true_grads))
    diff.backward()
    return diff

  start = time.perf_counter()
  for _ in range(outer_steps):
    opt.step(closure)
  secs = time.perf_counter() - start
  return secs, float(closure().detach()), dx.detach().numpy().transpose(
      0, 2, 3, 1)


def run(outer_steps: int = 300, inner_steps: int = 20,
        gs_iterations: int = 200, use_torch: bool | None = None,
        seed: int = 0, torch_outer_steps: int = 10,
        torch_threads: int | None = 1) -> dict:
  """Times DLG and GS in JAX (and DLG in PyTorch when available).

  Args:
    outer_steps: DLG outer L-BFGS steps.
    inner_steps: L-BFGS iterations per outer step.
    gs_iterations: GS iterations timed (one restart).
    use_torch: run the PyTorch peer (None: when ``import torch`` works).
    seed: PRNG seed.
    torch_outer_steps: outer steps the PyTorch peer runs; its time is scaled
      linearly to ``outer_steps`` (a full torch run takes tens of minutes on
      a 2-core CPU; every iteration costs the same without early stop).
    torch_threads: ``torch.set_num_threads`` for the peer (None: torch's
      default). On a shared 2-core machine torch's default 2 threads ran
      ~40x slower (1.1 s vs 25 ms per iteration) than 1 thread, so the
      default compares against the faster single-threaded torch.

  Returns:
    A dict of timings (seconds) and losses.
  """
  model = models.get_model("lenet", (32, 32, 3), 10, init="uniform")
  key = jax.random.key(seed)
  k_init, k_attack = jax.random.split(key)
  params = model.init(k_init)
  x = _smooth_image(model.input_shape, seed)
  label = 3
  shared = gradients.batch_grad(model, params, jnp.asarray(x),
                                jnp.array([label]))
  out = {"device": jax.devices()[0].platform, "model": "lenet",
         "image_shape": list(model.input_shape)}

  # DLG without early stop (tol 0, grad_tol -1): always all iterations.
  cfg = dlg_lib.DLGConfig(outer_steps=outer_steps, inner_steps=inner_steps,
                          tol=0.0, grad_tol=-1.0)
  t = time.perf_counter()
  res = dlg_lib.dlg(model, params, shared, 1, k_attack, config=cfg)
  jax.block_until_ready(res)
  first = time.perf_counter() - t
  t = time.perf_counter()
  res = dlg_lib.dlg(model, params, shared, 1, k_attack, config=cfg)
  jax.block_until_ready(res)
  out["dlg_seconds"] = time.perf_counter() - t
  out["dlg_compile_seconds"] = max(first - out["dlg_seconds"], 0.0)
  out["dlg_iterations"] = int(res.iterations)
  out["dlg_final_loss"] = float(res.final_loss)
  out["dlg_mse"] = float(jnp.mean((res.x_rec - x) ** 2))

  gcfg = inverting_lib.GSConfig(iterations=gs_iterations, restarts=1)
  lab = jnp.array([label])
  t = time.perf_counter()
  jax.block_until_ready(inverting_lib.inverting_gradients(
      model, params, shared, 1, k_attack, labels=lab, config=gcfg))
  first = time.perf_counter() - t
  t = time.perf_counter()
  jax.block_until_ready(inverting_lib.inverting_gradients(
      model, params, shared, 1, k_attack, labels=lab, config=gcfg))
  gs_secs = time.perf_counter() - t
  out["gs_compile_seconds"] = max(first - gs_secs, 0.0)
  out["gs_iterations_per_second"] = gs_iterations / gs_secs

  if use_torch is None:
    try:
      import torch  # pylint: disable=g-import-not-at-top,unused-import,redefined-outer-name
      del torch
      use_torch = True
    except ImportError:
      use_torch = False
  if use_torch:
    kx, ky = jax.random.split(k_attack)  # The JAX attack's start point.
    x0 = np.asarray(jax.random.normal(kx, (1, *model.input_shape)))
    y0 = np.asarray(jax.random.normal(ky, (1, 10)))
    import torch  # pylint: disable=g-import-not-at-top
    if torch_threads is not None:
      torch.set_num_threads(torch_threads)
    out["torch_threads"] = torch.get_num_threads()
    n = min(torch_outer_steps, outer_steps)
    secs, loss, _ = torch_dlg(params, model, x, label, x0, y0, n, inner_steps)
    out["torch_outer_steps_run"] = n
    out["torch_dlg_seconds_measured"] = secs
    out["torch_dlg_seconds"] = secs * outer_steps / n
    out[f"torch_dlg_loss_after_{n}_outer"] = loss
    out["speedup_vs_torch"] = out["torch_dlg_seconds"] / out["dlg_seconds"]
  return out


FLAGS = flags.FLAGS


def define_flags() -> None:
  """Defines the absl flags (only when run as a program)."""
  flags.DEFINE_integer("outer_steps", 300, "DLG outer L-BFGS steps.")
  flags.DEFINE_integer("inner_steps", 20, "L-BFGS iterations per outer step.")
  flags.DEFINE_integer("gs_iterations", 200, "GS iterations to time.")
  flags.DEFINE_enum("torch", "auto", ["auto", "off"], "PyTorch peer.")
  flags.DEFINE_integer("torch_threads", 1, "torch.set_num_threads (0: "
                       "torch's default).")
  flags.DEFINE_integer("torch_outer_steps", 10,
                       "Outer steps the PyTorch peer runs (scaled up).")


def main(argv):
  del argv
  out = run(FLAGS.outer_steps, FLAGS.inner_steps, FLAGS.gs_iterations,
            None if FLAGS.torch == "auto" else False,
            torch_outer_steps=FLAGS.torch_outer_steps,
            torch_threads=FLAGS.torch_threads or None)
  for k, v in out.items():
    print(f"{k:28s} {v}")


if __name__ == "__main__":
  define_flags()
  app.run(main)
