"""Benchmarks of repdef_jax against what users would otherwise run.

One module per workload (:mod:`.fedavg`, :mod:`.defense`, :mod:`.gradients`,
:mod:`.attack`), each with public builders returning the jitted function and
its arguments (:class:`.timing.Bench`); one timing helper (:mod:`.timing`);
the PyTorch peers (:mod:`.torch_peers`, from the ``[torch]`` extra); the unit
costs of the paper presets (:func:`unit_costs`); and the driver that
assembles ``docs/benchmarks/BENCHMARKS.md`` (:mod:`.driver`, run by
``python -m experiments.benchmark``); on a GPU, ``device_check.sh`` beside
them is the one prepared device call.
"""

from experiments.benchmarks.costs import unit_costs

__all__ = ["unit_costs"]
