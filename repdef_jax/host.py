"""One JAX CPU device per core, so independent work runs on all of them.

XLA's CPU backend spreads one device's work over the cores poorly for the
small convolutions of the paper's models; with one host device per core the
clients of a FedAvg round (:func:`repdef_jax.fedavg.client_mesh`) and a
batch of independent attacks (:func:`repdef_jax.attacks.base.
over_devices`) are sharded over them (:func:`cpu_mesh`). Measured on a
2-core CPU: docs/scaling.md. ``import repdef_jax`` applies this before JAX
starts, unless

* JAX has already started (then it cannot change: one device),
* the CPU device count is set already (``XLA_FLAGS`` with
  ``--xla_force_host_platform_device_count`` or ``jax_num_cpu_devices``),
* ``REPDEF_JAX_CPU_DEVICES`` is set: that many devices (1 = one device, the
  formulation of every run before this default; results differ from it by
  float rounding only, docs/scaling.md).

On a GPU/TPU host the extra CPU devices are unused.
"""

from __future__ import annotations

import os

import jax
import numpy as np

ENV = "REPDEF_JAX_CPU_DEVICES"


def usable_cores() -> int:
  """Cores this process may run on."""
  try:
    return len(os.sched_getaffinity(0))
  except AttributeError:  # Not Linux.
    return os.cpu_count() or 1


def cpu_device_count() -> int:
  """The CPU device count this module asks for (``REPDEF_JAX_CPU_DEVICES``
  or the usable cores).

  Raises:
    ValueError: ``REPDEF_JAX_CPU_DEVICES`` is not a positive integer.
  """
  value = os.environ.get(ENV, "").strip()
  if not value:
    return usable_cores()
  if not value.isdigit() or int(value) < 1:
    raise ValueError(f"{ENV} must be a positive integer (1 = one CPU "
                     f"device), got {value!r}.")
  return int(value)


def configure_cpu_devices() -> bool:
  """Asks JAX for :func:`cpu_device_count` CPU devices if it still can.

  Returns:
    Whether the setting was applied (False: JAX had started, or the count
    was set elsewhere).
  """
  from jax._src import xla_bridge  # pylint: disable=g-import-not-at-top
  flags = os.environ.get("XLA_FLAGS", "")
  if (xla_bridge.backends_are_initialized()
      or "xla_force_host_platform_device_count" in flags
      or jax.config.jax_num_cpu_devices != -1):
    return False
  jax.config.update("jax_num_cpu_devices", cpu_device_count())
  return True


def cpu_mesh(items: int, axis: str) -> jax.sharding.Mesh | None:
  """A 1-D mesh named ``axis`` over ``min(devices, items)`` local CPU
  devices, or None (fewer than 2 of them, several processes, or a GPU/TPU
  backend: one device)."""
  n = min(jax.local_device_count(), items)
  if (jax.default_backend() != "cpu" or jax.process_count() > 1 or n < 2):
    return None
  return jax.sharding.Mesh(np.asarray(jax.local_devices()[:n]), (axis,))
