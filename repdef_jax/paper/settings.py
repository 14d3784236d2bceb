"""The paper's federated setting as a named block of training settings.

Sun et al. 2021 (NOTES section 4) train on non-IID MNIST and CIFAR-10 split
over 100 devices holding 2 classes x 100 samples each, 10 devices per round.
"""

from __future__ import annotations

from typing import Any

import ml_collections

from repdef_jax import training

SETTINGS = {
    # The paper's non-IID split and FedAvg (NOTES section 4): 100 devices x
    # 2 classes x 100 samples, 10 per round, 5 local steps of batch 10.
    "paper": dict(partition="noniid", num_clients=100, classes_per_client=2,
                  samples_per_class=100, rounds=200, clients_per_round=10,
                  local_steps=5, batch_size=10, client_lr=0.1,
                  conv_impl="auto", max_train_examples=0,
                  max_test_examples=0, checkpoint_every=10, log_every=10),
    # Seconds under tfds mock data (tests).
    "tiny": dict(partition="noniid", num_clients=4, classes_per_client=2,
                 samples_per_class=2, rounds=1, clients_per_round=2,
                 local_steps=1, batch_size=3, client_lr=0.1,
                 conv_impl="auto", max_train_examples=0,
                 max_test_examples=20, eval_batch=20, checkpoint_every=1,
                 log_every=1),
}


def federated_setting(name: str = "paper", **overrides: Any
                      ) -> ml_collections.ConfigDict:
  """A named federated setting as a ``train`` block of an experiment config.

  Args:
    name: 'paper' (the paper's non-IID MNIST/CIFAR-10 FedAvg) or 'tiny'.
    **overrides: settings that replace the named ones (any key of
      :func:`repdef_jax.training.default_config`).

  Returns:
    A ConfigDict holding a subset of the keys of
    :func:`repdef_jax.training.default_config`.

  Raises:
    ValueError: unknown ``name`` or an override that is not a setting.
  """
  if name not in SETTINGS:
    raise ValueError(f"unknown federated setting {name!r}; use one of "
                     f"{sorted(SETTINGS)}.")
  unknown = set(overrides) - set(training.default_config().keys())
  if unknown:
    raise ValueError(f"unknown training settings {sorted(unknown)}.")
  return ml_collections.ConfigDict({**SETTINGS[name], **overrides})


