"""Representation leakage in FedAvg (Sun et al. 2021, Section 3, Fig. 2-3).

1. Inference: non-IID FedAvg of LeNet5 (100 devices x 2 classes x 20 images,
   10 per round); for every sampled device the server infers its classes and,
   per class, the representation entering each FC layer from the device's
   real update (Algorithms 3 and 4, :mod:`repdef_jax.attacks.repinfer`),
   scored by Pearson correlation with the true class-mean representation
   under the model the device received.
2. Reconstruction: on the conv 3->12 -> FC 10 leakage model, L-BFGS
   reconstructions of a few images from (a) the representation inferred from
   the last-layer gradient, (b) the whole gradient, (c) the conv gradients
   alone; MSE / PSNR in [0, 1] pixel space.

Departures: the paper gives no local-training details (we use 1 epoch of
batch 10, lr 0.01, clients sampled without replacement); the ground truth is
the class mean under the model the device received.
"""

from __future__ import annotations

import functools
import logging
import os
import time
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from repdef_jax import data as data_lib
from repdef_jax import fedavg
from repdef_jax import gradients
from repdef_jax import models
from repdef_jax import partition
from repdef_jax import storage
from repdef_jax.attacks import repinfer
from repdef_jax.paper import harness

SOURCES = repinfer.OBJECTIVES  # representation, gradient, conv_gradient
RESULT_FILE = "repinfer.json"
PLOT_FILE = "repinfer.png"


def _make_attack_fn(model: models.Model, config: ml_collections.ConfigDict):
  """Jitted server-side analysis of one round's client updates.

  Returns:
    ``fn(params, updates [D, ...], x [D, n, ...], y [D, n]) -> (masks {rule:
    [D, K]}, inferred {layer: [D, K, F]}, truth {layer: [D, K, F]}, counts
    [D, K])``: the class masks for the paper's norm rule
    (``config.class_threshold`` x median), the bias-sign rule and top-k with
    k known; representations inferred for every class; the true class means
    under ``params`` (the model the devices received).
  """
  infer = functools.partial(repinfer.infer_all_representations, model,
                            M=config.M)
  truth_fn = functools.partial(repinfer.class_mean_representations, model)
  rules = {"norm": dict(threshold=config.class_threshold),
           "sign": dict(rule="sign"), "topk": dict(k=config.classes_per_client)}

  @jax.jit
  def fn(params, updates, x, y):
    _, inferred = jax.vmap(infer)(updates)
    head = updates[model.fc_layers[-1]]
    masks = {name: jax.vmap(functools.partial(repinfer.infer_classes, **kw))(
        head) for name, kw in rules.items()}
    counts, truth = jax.vmap(truth_fn, in_axes=(None, 0, 0))(params, x, y)
    return masks, inferred, truth, counts

  return fn


def run_inference(config: ml_collections.ConfigDict, images: np.ndarray,
                  labels: np.ndarray) -> dict[str, Any]:
  """Part 1: FedAvg rounds and per-device representation inference."""
  model = models.get_model(config.model, images.shape[1:],
                           conv_impl=config.conv_impl)
  parts = partition.noniid(labels, num_clients=config.num_clients,
                           classes_per_client=config.classes_per_client,
                           samples_per_class=config.samples_per_class,
                           seed=config.seed)
  clients = fedavg.as_client_arrays(partition.pack(images, labels, parts))
  fed_config = fedavg.FedAvgConfig(
      clients_per_round=config.clients_per_round, local_epochs=
      config.local_epochs, batch_size=config.batch_size, client_lr=config.lr,
      replace=False, weighting="uniform")
  keys = fedavg.key_streams(config.seed)
  state = fedavg.init(model, fed_config, keys.init)
  round_fn = fedavg.make_round(model, fed_config, return_client_updates=True)
  attack_fn = _make_attack_fn(model, config)
  corr_fn = jax.jit(jax.vmap(jax.vmap(repinfer.pearson)))
  devices = []
  for rnd in range(config.rounds):
    params = state.params
    state, metrics = round_fn(state, clients, keys)
    ids = metrics["client_ids"]
    # Padding (mask 0) gets label -1: a zero one-hot, no part in the truth.
    y = jnp.where(clients.mask[ids] > 0, clients.y[ids], -1)
    masks, inferred, truth, counts = attack_fn(
        params, metrics["client_updates"], clients.x[ids], y)
    corr = {layer: np.asarray(corr_fn(inferred[layer], truth[layer]))
            for layer in model.fc_layers}  # [D, K]
    masks = {k: np.asarray(v) for k, v in masks.items()}
    counts = np.asarray(counts)
    for d, client in enumerate(np.asarray(ids)):
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
                       labels: np.ndarray, keys: harness.SweepKeys
                       ) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
  """Part 2: reconstruction from three sources on the leakage model."""
  model = models.get_model(config.recon_model, images.shape[1:],
                           conv_impl=config.recon_conv_impl)
  k_pick, k_noise = jax.random.split(keys.data)
  params = jax.jit(model.init)(keys.init)
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

  rec_keys = jax.vmap(jax.random.fold_in, in_axes=(None, 0))(
      keys.attack, jnp.arange(n))
  recs, timing = {}, {}
  for source in SOURCES:
    target = r_hat if source == "representation" else grads
    fn = jax.jit(jax.vmap(functools.partial(
        lambda t, k, lab, src: repinfer.reconstruct(
            model, params, t, model.input_shape, k, objective=src, label=lab,
            steps=config.recon_steps), src=source)))
    t0 = time.time()
    xr, losses = fn(target, rec_keys, inferred_label)
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
  noise = np.asarray(jax.random.uniform(k_noise, x.shape))
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
  plt = storage.pyplot()

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
  storage.save_figure(fig, path, dpi=100)
  plt.close(fig)


def run(config: ml_collections.ConfigDict, workdir: str) -> dict[str, Any]:
  """Runs both parts; writes ``repinfer.json`` and ``repinfer.png``.

  Args:
    config: see ``experiments/configs/repinfer.py``.
    workdir: output folder (created).

  Returns:
    ``{'config', 'inference', 'reconstruction', 'seconds'}``.
  """
  t0 = time.time()
  images, labels = data_lib.load(config.dataset, "train",
                                 config.data_dir or None,
                                 max_examples=config.max_train_examples or None)
  images = data_lib.to_float(np.asarray(images))
  labels = np.asarray(labels)
  result = {"config": config.to_dict()}
  result["inference"] = run_inference(config, images, labels)
  pics = None
  if config.recon_images > 0:
    result["reconstruction"], pics = run_reconstruction(
        config, images, labels, harness.sweep_keys(config.seed))
  result["seconds"] = time.time() - t0
  storage.write_json(os.path.join(workdir, RESULT_FILE), result)
  if pics is not None:
    plot(result, pics, os.path.join(workdir, PLOT_FILE))
  return result


def report(result: dict[str, Any], workdir: str) -> None:
  """Prints the class-detection accuracy, correlations and reconstruction."""
  del workdir
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
