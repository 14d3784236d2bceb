"""One JAX CPU device per core, so a FedAvg round runs clients in parallel.

XLA's CPU backend spreads one device's work over the cores poorly for the
small convolutions of the paper's models; with one host device per core the
clients of a round are sharded over them (:func:`repdef_jax.fedavg.
client_mesh`). Measured on a 2-core CPU (docs/scaling.md): LeNet rounds
1.3-1.4x faster, plain and defended. ``import repdef_jax`` applies this
before JAX starts, unless

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
