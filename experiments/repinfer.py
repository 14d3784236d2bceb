"""Representation leakage in FedAvg (Sun et al. 2021, Section 3, Fig. 2-3).

Two parts, both attacking what an honest-but-curious server sees:

1. Inference. Non-IID CIFAR-10 over ``num_clients`` devices (default 100),
   each holding 2 classes x 20 images; each round ``clients_per_round``
   (default 10) devices run plain local SGD (``lax.scan`` over steps,
   ``vmap`` over devices) from the global lenet5 (conv 6, conv 16, FC 120,
   FC 84, FC 10) and the server averages them (FedAvg). For every sampled
   device the server infers its classes and, per class, the representation
   entering each FC layer from the device's update (Algorithms 3 and 4 in
   :mod:`repdef_jax.attacks.repinfer`); we report the Pearson correlation
   with the true class-mean representation under the global model the device
   received.
2. Reconstruction. On the conv 3->12 -> FC 10 leakage model, each of a few
   training images is reconstructed with L-BFGS (300 iterations) from (a) its
   representation inferred from the last-layer gradient, (b) the whole
   gradient (DLG L2 matching) and (c) the conv-layer gradients alone.
   Images are in ``[0, 1]`` (no normalisation); MSE and PSNR are computed in
   that space (reconstructions are in ``[0, 1]`` by construction, so the raw
   and clamped MSE coincide).

Writes ``workdir/repinfer.json`` and ``workdir/repinfer.png`` atomically.

  TFDS_DATA_DIR=/path/to/tfds python -m experiments.repinfer \\
      --workdir=/tmp/repinfer

Overrides: ``--config.rounds=5 --config.local_epochs=2 --config.M=20``.
Departures from the paper: local training details are not given in it (we
use 1 epoch of batch 10, lr 0.01); the ground truth is the class mean under
the model the device received; see also the departures listed in
:mod:`repdef_jax.attacks.repinfer`.
"""

from __future__ import annotations

import functools
import logging
import os
import time
from typing import Any

from absl import app
from absl import flags
import jax
import jax.numpy as jnp
import ml_collections
from ml_collections import config_flags
import numpy as np

from repdef_jax import data as data_lib
from repdef_jax import gradients
from repdef_jax import io
from repdef_jax import models
from repdef_jax import partition
from repdef_jax.attacks import repinfer

SOURCES = repinfer.OBJECTIVES  # representation, gradient, conv_gradient


def get_config() -> ml_collections.ConfigDict:
  """Quick defaults (under 3 minutes on a 2-core CPU)."""
  c = ml_collections.ConfigDict()
  c.seed = 0
  c.dataset = "cifar10"
  c.max_train_examples = 0  # 0: the whole split.
  # Federated setting (paper Section 3).
  c.num_clients = 100
  c.classes_per_client = 2
  c.samples_per_class = 20
  c.clients_per_round = 10
  c.rounds = 3
  c.local_epochs = 1
  c.batch_size = 10
  c.lr = 0.01
  c.model = "lenet5"
  c.conv_impl = "patches"
  # Inference.
  c.M = 10
  c.class_threshold = 2.0
  # Reconstruction.
  c.recon_model = "leakage"
  c.recon_conv_impl = "patches"  # Same numbers as 'xla', faster under vmap.
  c.recon_images = 4  # 0 skips the reconstruction part.
  c.recon_steps = 300
  return c


_CONFIG = config_flags.DEFINE_config_dict("config", get_config(),
                                          "Experiment config.")
_WORKDIR = flags.DEFINE_string("workdir", None, "Output directory.")
_DATA_DIR = flags.DEFINE_string(
    "data_dir", None, "TFDS data dir (defaults to $TFDS_DATA_DIR).")


def local_train(model: models.Model, params: Any, x: jax.Array, y: jax.Array,
                key: jax.Array, *, epochs: int, batch_size: int,
                lr: float) -> Any:
  """Plain minibatch SGD on one device; returns its final parameters.

  Args:
    model: the model.
    params: the global parameters.
    x: the device's images ``[n, H, W, C]`` (``n`` divisible by
      ``batch_size``).
    y: labels ``[n]``.
    key: shuffling key.
    epochs: local epochs.
    batch_size: minibatch size.
    lr: learning rate.

  Returns:
    The parameters after ``epochs * n // batch_size`` steps.
  """
  n = x.shape[0]
  nb = n // batch_size

  def epoch(p, k):
    perm = jax.random.permutation(k, n)[:nb * batch_size]
    xb = x[perm].reshape(nb, batch_size, *x.shape[1:])
    yb = y[perm].reshape(nb, batch_size)

    def step(q, batch):
      g = gradients.batch_grad(model, q, *batch)
      return jax.tree_util.tree_map(lambda a, b: a - lr * b, q, g), None

    return jax.lax.scan(step, p, (xb, yb))[0], None

  return jax.lax.scan(epoch, params, jax.random.split(key, epochs))[0]


def make_round_fn(model: models.Model, config: ml_collections.ConfigDict):
  """Jitted: one FedAvg round on a stack of devices, plus the attack.

  Returns:
    ``fn(params, x [D, n, ...], y [D, n], keys [D]) -> (new_params, masks
    {rule: [D, K]}, inferred {layer: [D, K, F]}, truth {layer: [D, K, F]},
    counts [D, K])``; the class masks are given for the paper's norm rule
    (``config.class_threshold`` x median), the bias-sign rule and top-k with
    k known; representations are inferred for every class.
  """
  train = functools.partial(local_train, model, epochs=config.local_epochs,
                            batch_size=config.batch_size, lr=config.lr)
  infer = functools.partial(repinfer.infer_all_representations, model,
                            M=config.M)
  truth_fn = functools.partial(repinfer.class_mean_representations, model)

  @jax.jit
  def fn(params, x, y, keys):
    local = jax.vmap(train, in_axes=(None, 0, 0, 0))(params, x, y, keys)
    updates = jax.tree_util.tree_map(lambda a, b: a - b[None], local, params)
    _, inferred = jax.vmap(infer)(updates)
    head = updates[model.fc_layers[-1]]
    masks = {
        "norm": jax.vmap(functools.partial(
            repinfer.infer_classes, threshold=config.class_threshold))(head),
        "sign": jax.vmap(functools.partial(repinfer.infer_classes,
                                           rule="sign"))(head),
        "topk": jax.vmap(functools.partial(
            repinfer.infer_classes, k=config.classes_per_client))(head),
    }
    counts, truth = jax.vmap(truth_fn, in_axes=(None, 0, 0))(params, x, y)
    new_params = jax.tree_util.tree_map(lambda a: jnp.mean(a, axis=0), local)
    return new_params, masks, inferred, truth, counts

  return fn


def run_inference(config: ml_collections.ConfigDict, images: np.ndarray,
                  labels: np.ndarray, key: jax.Array) -> dict[str, Any]:
  """Part 1: FedAvg rounds and per-device representation inference."""
  model = models.get_model(config.model, images.shape[1:],
                           conv_impl=config.conv_impl)
  parts = partition.noniid(labels, num_clients=config.num_clients,
                           classes_per_client=config.classes_per_client,
                           samples_per_class=config.samples_per_class,
                           seed=config.seed)
  k_init, k_train = jax.random.split(key)
  params = jax.jit(model.init)(k_init)
  round_fn = make_round_fn(model, config)
  sample_rng = np.random.default_rng(config.seed + 1)
  corr_fn = jax.jit(jax.vmap(jax.vmap(repinfer.pearson)))
  devices = []
  for rnd in range(config.rounds):
    t0 = time.time()
    chosen = sample_rng.choice(config.num_clients, config.clients_per_round,
                               replace=False)
    idx = np.stack([parts[i] for i in chosen])
    x = jnp.asarray(images[idx])
    y = jnp.asarray(labels[idx])
    keys = jax.random.split(jax.random.fold_in(k_train, rnd), len(chosen))
    params, masks, inferred, truth, counts = round_fn(params, x, y, keys)
    corr = {layer: np.asarray(corr_fn(inferred[layer], truth[layer]))
            for layer in model.fc_layers}  # [D, K]
    masks = {k: np.asarray(v) for k, v in masks.items()}
    counts = np.asarray(counts)
    for d, client in enumerate(chosen):
      true_cls = np.flatnonzero(counts[d] > 0)
      devices.append({
          "round": rnd,
          "client": int(client),
          "true_classes": true_cls.tolist(),
          "inferred_classes": {k: np.flatnonzero(m[d]).tolist()
                               for k, m in masks.items()},
          "classes_correct": {k: bool(set(np.flatnonzero(m[d])) ==
                                      set(true_cls))
                              for k, m in masks.items()},
          "correlation": {layer: {str(c): float(corr[layer][d, c])
                                  for c in true_cls}
                          for layer in model.fc_layers},
      })
    logging.info("round %d: %.1fs", rnd, time.time() - t0)

  summary = {}
  for layer in model.fc_layers:
    vals = np.array([v for dev in devices
                     for v in dev["correlation"][layer].values()])
    summary[layer] = {
        "mean": float(vals.mean()), "median": float(np.median(vals)),
        "min": float(vals.min()), "max": float(vals.max()),
        "frac_above_0.8": float(np.mean(vals > 0.8)), "n": int(vals.size)}
  return {
      "model": config.model,
      "layers": list(model.fc_layers),
      "layer_meaning": "representation entering each FC layer",
      "class_detection_accuracy": {
          rule: float(np.mean([dev["classes_correct"][rule]
                               for dev in devices]))
          for rule in ("norm", "sign", "topk")},
      "correlation_summary": summary,
      "devices": devices,
  }


def run_reconstruction(config: ml_collections.ConfigDict, images: np.ndarray,
                       labels: np.ndarray, key: jax.Array
                       ) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
  """Part 2: reconstruction from three sources on the leakage model."""
  model = models.get_model(config.recon_model, images.shape[1:],
                           conv_impl=config.recon_conv_impl)
  k_init, k_pick, k_rec = jax.random.split(key, 3)
  params = jax.jit(model.init)(k_init)
  n = config.recon_images
  pick = np.sort(np.asarray(jax.random.choice(k_pick, len(images), (n,),
                                              replace=False)))
  x = jnp.asarray(images[pick])
  y = jnp.asarray(labels[pick])

  @jax.jit
  def shared(xi, yi):
    """What one client sends: its one-image gradient, as an update (lr 1)."""
    g = jax.grad(lambda p: gradients.example_loss(model, p, xi, yi))(params)
    return g, jax.tree_util.tree_map(jnp.negative, g)

  grads, updates = jax.vmap(shared)(x, y)
  head = updates["head"]
  inferred_label = jax.vmap(
      lambda h: jnp.argmax(repinfer.infer_classes(h, k=1)))(head)
  r_hat = jax.vmap(repinfer.infer_last_representation)(head, inferred_label)
  r_true = model.features(params, x)
  rep_corr = np.asarray(jax.vmap(repinfer.pearson)(r_hat, r_true))

  keys = jax.random.split(k_rec, n)
  recs, timing = {}, {}
  for source in SOURCES:
    target = r_hat if source == "representation" else grads
    fn = jax.jit(jax.vmap(functools.partial(
        lambda t, k, lab, src: repinfer.reconstruct(
            model, params, t, model.input_shape, k, objective=src, label=lab,
            steps=config.recon_steps), src=source)))
    t0 = time.time()
    xr, losses = fn(target, keys, inferred_label)
    xr.block_until_ready()
    timing[source] = time.time() - t0
    recs[source] = (np.asarray(xr), np.asarray(losses))
    logging.info("reconstruction from %s: %.1fs (with compilation)", source,
                 timing[source])

  per_image = []
  for i in range(n):
    entry = {"index": int(pick[i]), "label": int(y[i]),
             "inferred_label": int(inferred_label[i]),
             "inferred_representation_correlation": float(rep_corr[i])}
    for source in SOURCES:
      xr, losses = recs[source]
      mse = float(np.mean((xr[i] - np.asarray(x[i])) ** 2))
      entry[source] = {"mse": mse, "psnr": float(-10 * np.log10(mse)),
                       "initial_loss": float(losses[i, 0]),
                       "final_loss": float(losses[i, -1])}
    per_image.append(entry)
  noise = np.asarray(jax.random.uniform(jax.random.fold_in(k_rec, 1),
                                        x.shape))
  summary = {source: {
      "mse": float(np.mean([e[source]["mse"] for e in per_image])),
      "psnr": float(np.mean([e[source]["psnr"] for e in per_image])),
      "seconds_with_compile": timing[source]} for source in SOURCES}
  noise_mse = float(np.mean((noise - np.asarray(x)) ** 2))
  summary["uniform_noise"] = {"mse": noise_mse,
                              "psnr": float(-10 * np.log10(noise_mse))}
  result = {"model": config.recon_model, "pixel_space": "[0, 1]",
            "optimizer": f"optax.lbfgs, {config.recon_steps} iterations, "
                         "x = sigmoid(z)",
            "summary": summary, "images": per_image}
  pics = {"original": np.asarray(x)}
  pics.update({s: recs[s][0] for s in SOURCES})
  return result, pics


def plot(result: dict[str, Any], pics: dict[str, np.ndarray],
         path: str) -> None:
  """Correlation per layer (left) and original | 3 reconstructions (right)."""
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top

  inf = result["inference"]
  layers = inf["layers"]
  rows = list(pics)
  n = len(pics["original"])
  fig = plt.figure(figsize=(3 + 1.3 * n + 3, 1.4 * len(rows) + 0.5))
  gs = fig.add_gridspec(len(rows), n + 2, width_ratios=[3, 0.3] + [1] * n)
  ax = fig.add_subplot(gs[:, 0])
  data = [[v for dev in inf["devices"] for v in dev["correlation"][l].values()]
          for l in layers]
  ax.boxplot(data)
  ax.set_xticks(range(1, len(layers) + 1), [f"into {l}" for l in layers])
  ax.set_ylabel("Pearson(inferred, true)")
  ax.set_ylim(min(0.0, min(min(d) for d in data)), 1.02)
  ax.set_title("representation inference")
  for r, name in enumerate(rows):
    for i in range(n):
      a = fig.add_subplot(gs[r, i + 2])
      a.imshow(np.clip(pics[name][i], 0, 1))
      a.set_xticks([])
      a.set_yticks([])
      if i == 0:
        a.set_ylabel(name.replace("_", "\n"), fontsize=8)
      if name != "original":
        mse = result["reconstruction"]["images"][i][name]["mse"]
        a.set_title(f"mse {mse:.3f}", fontsize=7)
  fig.tight_layout()
  io.save_figure(fig, path, dpi=100)
  plt.close(fig)


def run(config: ml_collections.ConfigDict, workdir: str | None = None,
        data_dir: str | None = None) -> dict[str, Any]:
  """Runs both parts; writes JSON and PNG into ``workdir`` when given.

  Args:
    config: see :func:`get_config`.
    workdir: output folder (created), or None to write nothing.
    data_dir: TFDS data dir (defaults to ``$TFDS_DATA_DIR``).

  Returns:
    ``{'config', 'inference', 'reconstruction', 'seconds'}``.
  """
  t0 = time.time()
  images, labels = data_lib.load(config.dataset, "train", data_dir,
                                 max_examples=config.max_train_examples or None)
  images = data_lib.to_float(np.asarray(images))
  labels = np.asarray(labels)
  key = jax.random.key(config.seed)
  k_inf, k_rec = jax.random.split(key)
  result = {"config": config.to_dict()}
  result["inference"] = run_inference(config, images, labels, k_inf)
  pics = None
  if config.recon_images > 0:
    result["reconstruction"], pics = run_reconstruction(config, images,
                                                        labels, k_rec)
  result["seconds"] = time.time() - t0
  if workdir:
    io.write_json(os.path.join(workdir, "repinfer.json"), result)
    if pics is not None:
      plot(result, pics, os.path.join(workdir, "repinfer.png"))
  return result


def main(argv):
  io.enable_compilation_cache()
  if len(argv) > 1:
    raise app.UsageError("Too many command-line arguments.")
  result = run(_CONFIG.value, _WORKDIR.value, _DATA_DIR.value)
  inf = result["inference"]
  print("class detection accuracy (exact set): " + ", ".join(
      f"{k} {v:.3f}" for k, v in inf["class_detection_accuracy"].items()))
  print("correlation of inferred vs true representation (entering layer):")
  for layer, s in inf["correlation_summary"].items():
    print(f"  {layer:5s} mean {s['mean']:.3f} median {s['median']:.3f} "
          f"min {s['min']:.3f} >0.8: {s['frac_above_0.8']:.2f} (n={s['n']})")
  if "reconstruction" in result:
    print("reconstruction on the leakage model ([0, 1] pixels):")
    for source, s in result["reconstruction"]["summary"].items():
      print(f"  {source:15s} mse {s['mse']:.2e} psnr {s['psnr']:.1f} dB")
  print(f"total {result['seconds']:.0f}s")


if __name__ == "__main__":
  app.run(main)
