"""Multi-process JAX: start ``jax.distributed`` and tell which process writes.

A run on several processes (several hosts, or several processes on one
machine) is the same program started once per process. :func:`initialize`
connects them, from explicit settings (coordinator address, number of
processes, this process's id; ``JAX_COORDINATOR_ADDRESS`` stands in for the
address) or from a cluster environment JAX recognises (SLURM, Open MPI,
multi-host Cloud TPU); after
it, ``jax.devices()`` lists every process's devices, so a mesh built from it
(:func:`repdef_jax.fedavg.make_mesh`) spans all of them. Only the primary
process (:func:`is_primary`) writes files and logs. On CPU the processes
exchange data with gloo collectives. Details and costs: ``docs/scaling.md``.
"""

from __future__ import annotations

import logging
import os

import jax

logger = logging.getLogger(__name__)


def cluster_environment() -> str | None:
  """The multi-process cluster environment this process runs in, if any.

  Returns:
    'slurm' (a job step of more than one task), 'ompi' (an Open MPI job of
    more than one process), 'tpu' (a multi-host Cloud TPU slice) or None.
    (``JAX_COORDINATOR_ADDRESS`` alone is not one: JAX reads no process
    count or id from the environment; see :func:`initialize`.)
  """
  env = os.environ
  if "SLURM_STEP_NODELIST" in env and int(env.get("SLURM_NTASKS", "1")) > 1:
    return "slurm"
  if ("OMPI_MCA_orte_hnp_uri" in env and
      int(env.get("OMPI_COMM_WORLD_SIZE", "1")) > 1):
    return "ompi"
  if "," in env.get("TPU_WORKER_HOSTNAMES", ""):
    return "tpu"
  return None


def initialize(coordinator_address: str = "", num_processes: int = 1,
               process_id: int = 0) -> bool:
  """Starts ``jax.distributed`` when the settings or the environment ask for it.

  Must run before anything touches a JAX device (``jax.devices()``, any
  computation). Calling it again in an initialised process does nothing.

  Args:
    coordinator_address: ``host:port`` of process 0 (every process gives the
      same); "" takes ``$JAX_COORDINATOR_ADDRESS`` (then ``num_processes``
      and ``process_id`` are needed), else reads the cluster environment
      (:func:`cluster_environment`), and without one the run is
      single-process.
    num_processes: number of processes (with ``coordinator_address``).
    process_id: this process's id in ``[0, num_processes)``.

  Returns:
    True when this is a multi-process run.

  Raises:
    ValueError: inconsistent settings, or JAX already started its backend
      in this process (message says what to do).
  """
  if jax.distributed.is_initialized():
    return jax.process_count() > 1
  if num_processes < 1:
    raise ValueError(f"num_processes must be >= 1, got {num_processes}.")
  if not coordinator_address and os.environ.get("JAX_COORDINATOR_ADDRESS"):
    coordinator_address = os.environ["JAX_COORDINATOR_ADDRESS"]
    if num_processes <= 1:
      raise ValueError(
          f"JAX_COORDINATOR_ADDRESS={coordinator_address} asks for several "
          "processes: give num_processes and process_id too (e.g. "
          "--config.num_processes=2 --config.process_id=0); JAX reads only "
          "the address from the environment.")
  if not coordinator_address:
    if num_processes > 1:
      raise ValueError(
          f"num_processes={num_processes} needs coordinator_address "
          "(host:port of process 0), e.g. --config.coordinator_address="
          "localhost:12355.")
    cluster = cluster_environment()
    if cluster is None:
      return False
    kwargs = {}
  else:
    if ":" not in coordinator_address:
      raise ValueError(f"coordinator_address must be host:port, got "
                       f"{coordinator_address!r}.")
    if num_processes < 1 or not 0 <= process_id < num_processes:
      raise ValueError(
          f"process_id must be in [0, num_processes) with num_processes >= 1;"
          f" got process_id={process_id}, num_processes={num_processes}.")
    cluster = "settings"
    kwargs = dict(coordinator_address=coordinator_address,
                  num_processes=num_processes, process_id=process_id)
  if jax.config.jax_cpu_collectives_implementation is None:
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
  try:
    jax.distributed.initialize(**kwargs)
  except RuntimeError as e:
    if "before any JAX" in str(e):
      raise ValueError(
          "jax.distributed must start before JAX uses a device in this "
          "process; call repdef_jax.distributed.initialize (or "
          "train_and_evaluate) first.") from e
    raise
  logger.info("jax.distributed (%s): process %d of %d, %d local / %d devices",
              cluster, jax.process_index(), jax.process_count(),
              jax.local_device_count(), jax.device_count())
  return jax.process_count() > 1


def is_primary() -> bool:
  """True in the process that writes files and logs (process 0)."""
  return jax.process_index() == 0


def barrier(name: str) -> None:
  """Waits until every process reaches ``name`` (no-op with one process)."""
  if jax.process_count() > 1:
    from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
    multihost_utils.sync_global_devices(name)
