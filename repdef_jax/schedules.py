"""Learning-rate schedules for (defended) FedAvg, as optax schedules.

Theorem 2 of Sun et al. ("Provable Defense against Privacy Leakage in
Federated Learning from Representation Perspective", CVPR 2021), following Li
et al. ("On the Convergence of FedAvg on Non-IID Data", ICLR 2020): for an
L-smooth, mu-strongly convex objective, FedAvg with the defense and I local
steps converges with eta_t = 2 / (mu (gamma + t)), kappa = L / mu and
gamma = max(8 kappa, I). Here t counts local SGD steps over the whole run
(round * I + local step), which is what :func:`repdef_jax.fedavg.client_update`
passes to a schedule.
"""

from __future__ import annotations

import math
import operator
from typing import Any

import jax.numpy as jnp
import numpy as np
import optax


def as_real(value: Any) -> float:
  """``value`` as a float if it is a real scalar (a Python, NumPy or 0-d
  array number), else NaN: a bool, a string, a complex number or an array
  with a dimension, even of one value, is none (``float`` alone would take
  some of them)."""
  try:
    if (isinstance(value, (bool, np.bool_, str, bytes)) or np.ndim(value)
        or np.iscomplexobj(value)):
      return math.nan
    return float(value)
  except (TypeError, ValueError):  # A ragged sequence, a non-number.
    return math.nan


def check_rate(value: Any, name: str, accepted: str) -> None:
  """Raises ``ValueError('<name> must be <accepted>, got ...')`` unless
  ``value`` is a finite real number > 0 (:func:`as_real`; a client or server
  learning rate)."""
  v = as_real(value)
  if not (math.isfinite(v) and v > 0):
    raise ValueError(f"{name} must be {accepted}, got {value!r}.")


def constant(lr: float) -> optax.Schedule:
  """eta_t = lr.

  Raises:
    ValueError: lr is not a finite number > 0.
  """
  check_rate(lr, "learning rate", "a finite number > 0")
  return optax.constant_schedule(float(lr))


def theorem2_gamma(mu: float, smoothness: float, local_steps: int) -> float:
  """gamma = max(8 kappa, I) with kappa = L / mu."""
  _check(mu, smoothness, local_steps)
  return max(8.0 * smoothness / mu, float(local_steps))


def theorem2(mu: float, smoothness: float, local_steps: int) -> optax.Schedule:
  """Theorem 2's schedule eta_t = 2 / (mu (gamma + t)).

  Args:
    mu: strong-convexity constant (> 0); for l2-regularised logistic
      regression, mu >= the l2 coefficient.
    smoothness: L, the smoothness constant (>= mu).
    local_steps: I, local steps per round (>= 1).

  Returns:
    An optax schedule of the global step count t.

  Raises:
    ValueError: mu <= 0, L < mu or I < 1.
  """
  gamma = theorem2_gamma(mu, smoothness, local_steps)
  mu = float(mu)

  def schedule(count):
    return 2.0 / (mu * (gamma + jnp.asarray(count, jnp.float32)))

  return schedule


def _check(mu, smoothness, local_steps):
  check_rate(mu, "mu", "a finite number > 0 (strong convexity)")
  check_rate(smoothness, "smoothness (L)", "a finite number >= mu")
  if not smoothness >= mu:
    raise ValueError(f"smoothness (L) must be >= mu, got smoothness="
                     f"{smoothness}, mu={mu}.")
  try:  # int, NumPy int, 0-d integer array (NumPy or JAX); not a bool.
    steps = (None if isinstance(local_steps, (bool, np.bool_))
             else operator.index(local_steps))
  except TypeError:
    steps = None
  if steps is None or steps < 1:
    raise ValueError(f"local_steps must be an integer >= 1, got "
                     f"{local_steps!r}.")


def get_schedule(name: str, lr: float = 0.1, *, mu: float = 0.0,
                 smoothness: float = 0.0, local_steps: int = 1
                 ) -> optax.Schedule:
  """'constant' (lr) or 'theorem2' (mu, smoothness, local_steps)."""
  if name == "constant":
    return constant(lr)
  if name == "theorem2":
    return theorem2(mu, smoothness, local_steps)
  raise ValueError(f"unknown schedule {name!r}; use 'constant' or 'theorem2'.")
