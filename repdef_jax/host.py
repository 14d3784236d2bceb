"""How work maps onto the host: the CPU's cores, and what it is.

XLA's CPU backend spreads one device's work over the cores poorly for the
small convolutions of the paper's models. Always on: :func:`sequential_map`,
the compiled loop over independent items (clients, examples, Jacobian
chunks) that the library runs where ``vmap`` would be slower on CPU, keeps
two iterations in flight so that both cores work.

Opt-in: one JAX CPU device per core. Then the clients of a FedAvg round
(:func:`repdef_jax.fedavg.client_mesh`) and a batch of independent attacks
(:func:`repdef_jax.attacks.base.over_devices`) are sharded over them
(:func:`cpu_mesh`); measured on a 2-core CPU in docs/scaling.md (LeNet
rounds 1.2-1.8x, attack batches 1.2-1.8x). Set ``REPDEF_JAX_CPU_DEVICES=n``
(n >= 2; ``0``: one per usable core) before ``import repdef_jax`` to turn it
on; it applies unless JAX has started already or the CPU device count is
set elsewhere (``XLA_FLAGS`` with ``--xla_force_host_platform_device_count``,
``jax_num_cpu_devices``). It is not the default: in one long run with 2
host devices (the adaptive experiment, after 5 cells) a single-device
jitted program never completed, every XLA thread idle (docs/scaling.md).
Until that hang is understood, one CPU device is the default. Results with
several devices equal the one-device results to float rounding, not bit for
bit. On a GPU/TPU host the extra CPU devices are unused.

:func:`describe` names the machine (stored beside every timed cell).
"""

from __future__ import annotations

import functools
import os
import platform
from typing import Any, Callable

import jax
import numpy as np

ENV = "REPDEF_JAX_CPU_DEVICES"


def usable_cores() -> int:
  """Cores this process may run on."""
  try:
    return len(os.sched_getaffinity(0))
  except AttributeError:  # Not Linux.
    return os.cpu_count() or 1


def cpuinfo(key: str) -> str | None:
  """The value of the first ``/proc/cpuinfo`` line starting with ``key``
  (lower case, e.g. 'model name'), or None (no such line, not Linux)."""
  try:
    with open("/proc/cpuinfo", encoding="utf-8") as f:
      for line in f:
        if line.lower().startswith(key):
          return line.split(":", 1)[1].strip()
  except OSError:
    return None
  return None


@functools.lru_cache(maxsize=None)
def cpu_has_avx512() -> bool:
  """Whether this CPU reports AVX-512 (``avx512f`` in ``/proc/cpuinfo``'s
  flags; False where that file is missing). XLA's CPU convolutions compile
  to it, which changes the fastest formulation of some layers
  (:func:`repdef_jax.models.resolve_conv_impl`)."""
  return "avx512f" in (cpuinfo("flags") or "").split()


def describe() -> dict[str, Any]:
  """Where this process computes: CPU model, usable cores, JAX backend and
  device kind (stored beside timings, so that times taken on different
  machines are not compared as if alike)."""
  return {"cpu": cpuinfo("model name") or platform.processor() or None,
          "cores": usable_cores(), "backend": jax.default_backend(),
          "device_kind": jax.devices()[0].device_kind}


def cpu_device_count() -> int | None:
  """The CPU device count asked for by ``REPDEF_JAX_CPU_DEVICES`` (``0``:
  the usable cores), or None when it is unset (one device, JAX's default).

  Raises:
    ValueError: ``REPDEF_JAX_CPU_DEVICES`` is not a non-negative integer.
  """
  value = os.environ.get(ENV, "").strip()
  if not value:
    return None
  if not value.isdigit():
    raise ValueError(f"{ENV} must be a non-negative integer (0 = one CPU "
                     f"device per core, 1 = one device), got {value!r}.")
  return int(value) or usable_cores()


def configure_cpu_devices() -> bool:
  """Asks JAX for :func:`cpu_device_count` CPU devices if set and possible.

  Returns:
    Whether the setting was applied (False: not asked for, JAX had started,
    or the count was set elsewhere).
  """
  from jax._src import xla_bridge  # pylint: disable=g-import-not-at-top
  count = cpu_device_count()
  flags = os.environ.get("XLA_FLAGS", "")
  if (count is None or xla_bridge.backends_are_initialized()
      or "xla_force_host_platform_device_count" in flags
      or jax.config.jax_num_cpu_devices != -1):
    return False
  jax.config.update("jax_num_cpu_devices", count)
  return True


def cpu_mesh(items: int, axis: str) -> jax.sharding.Mesh | None:
  """A 1-D mesh named ``axis`` over ``min(devices, items)`` local CPU
  devices, or None (fewer than 2 of them, several processes, or a GPU/TPU
  backend: one device)."""
  n = min(jax.local_device_count(), items)
  if (jax.default_backend() != "cpu" or jax.process_count() > 1 or n < 2):
    return None
  return jax.sharding.Mesh(np.asarray(jax.local_devices()[:n]), (axis,))


# Iterations of a compiled loop over independent items run per trip on CPU.
# On the 2-core CPU (docs/design.md, "Loops on CPU") 2 makes the plain LeNet
# round 3-17 % faster (batch 10-200), the defended round 8 %, the Soteria
# mask at batch 50 15 % and ConvNet64's per-example gradients 12 %; 5 or 10
# gain nothing more and compile longer. Not measured on more cores.
CPU_LOOP_UNROLL = 2


def sequential_map(f: Callable[[Any], Any], xs: Any, *,
                   batch_size: int | None = None) -> Any:
  """``jax.lax.map(f, xs, batch_size=batch_size)``, unrolled on CPU.

  The items are independent, so with the loop unrolled by
  :data:`CPU_LOOP_UNROLL` XLA's CPU runtime runs the bodies of one trip at
  the same time where a single body's small convolutions leave a core idle.
  Same numbers as ``lax.map``. Chunks of ``batch_size`` > 1 and other
  backends (where these loops hold large kernels) use ``lax.map`` as is.
  """
  n = jax.tree_util.tree_leaves(xs)[0].shape[0]
  unroll = min(CPU_LOOP_UNROLL if jax.default_backend() == "cpu" else 1, n)
  if (batch_size is not None and batch_size > 1) or unroll <= 1:
    return jax.lax.map(f, xs, batch_size=batch_size)
  return jax.lax.scan(lambda _, x: (None, f(x)), None, xs, unroll=unroll)[1]
