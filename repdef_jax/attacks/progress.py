"""Progress of the jitted attack loops: a host callback every N iterations.

An attack whose config has ``progress_every = N > 0`` calls back to the host
(``jax.debug.callback``) at iteration 0, every N iterations and once when its
loop ends; ``N = 0`` (the default) compiles no callback at all. Under
:func:`repdef_jax.attacks.run_batch` the loop over iterations is shared by
every attack of the batch, so each callback reports the whole batch (one line
per batch, not per attack).

The callback hands an :class:`Event` to the current reporter:
:func:`print_reporter` (default: one line on stderr with the iteration, the
losses and an ETA), any callable set with :func:`set_reporter` /
:func:`reporting`, or None (quiet: nothing is reported; the callback still
runs). The reporter is looked up when a run starts, so a jitted attack is not
recompiled when the reporter changes.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import sys
import threading
import time
from typing import Callable, Iterator, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np


class Event(NamedTuple):
  """One progress report of an attack run (or a batch of runs).

  Attributes:
    attack: 'dlg' (also iDLG and the adaptive DLG variants) or 'gs'.
    iteration: iterations done so far.
    total: the iteration budget (an early stop may end the run before).
    losses: ``[M]`` current objective of each attack of the batch (its best
      restart); M = 1 for a single attack.
    running: how many of the M attacks are still iterating.
    elapsed: seconds since iteration 0 (compilation excluded).
    eta: estimated seconds left at the current speed (to the full budget).
    final: True for the last event of the run.
  """

  attack: str
  iteration: int
  total: int
  losses: np.ndarray
  running: int
  elapsed: float
  eta: float
  final: bool


Reporter = Callable[[Event], None]


def print_reporter(event: Event) -> None:
  """Prints one line per event on stderr."""
  losses = event.losses[np.isfinite(event.losses)]
  if not losses.size:
    loss = "diverged (no finite loss)"
  elif event.losses.size == 1:
    loss = f"loss {event.losses[0]:.3e}"
  else:
    loss = (f"loss min {losses.min():.3e} median {np.median(losses):.3e} "
            f"({event.running}/{event.losses.size} running)")
  if event.final:
    tail = f"done in {event.elapsed:.1f} s"
  else:
    tail = f"{event.elapsed:.1f} s, ETA {event.eta:.0f} s"
  print(f"[{event.attack}] {event.iteration}/{event.total} {loss} {tail}",
        file=sys.stderr, flush=True)


_lock = threading.Lock()
_reporter: Reporter | None = print_reporter
_runs: dict[int, list] = {}  # run id -> [reporter, start time or None]
_ids = itertools.count()


def set_reporter(reporter: Reporter | None) -> Reporter | None:
  """Sets the reporter of the runs started from now on; returns the old one.

  Args:
    reporter: a callable taking an :class:`Event`, or None for quiet.
  """
  global _reporter
  with _lock:
    old, _reporter = _reporter, reporter
  return old


@contextlib.contextmanager
def reporting(reporter: Reporter | None) -> Iterator[None]:
  """Context manager: ``reporter`` (None: quiet) for the runs started inside."""
  old = set_reporter(reporter)
  try:
    yield
  finally:
    set_reporter(old)


def start_run() -> jax.Array:
  """Registers a run with the current reporter; its id to pass into the jit."""
  with _lock:
    run_id = next(_ids) % (2**31 - 1)
    _runs[run_id] = [_reporter, None]
  return jnp.asarray(run_id, jnp.int32)


def _host(attack: str, total: int, run_id, iteration, losses, running,
          final) -> None:
  now = time.perf_counter()
  run_id, iteration, final = int(run_id), int(iteration), bool(final)
  with _lock:
    entry = _runs.get(run_id)
    if entry is None:
      return
    if entry[1] is None:
      entry[1] = (now, iteration)
    if final:
      del _runs[run_id]
  reporter, (t0, i0) = entry
  if reporter is None or (iteration == i0 and not final):
    return  # The first call only starts the clock.
  elapsed = now - t0
  speed = (iteration - i0) / elapsed if elapsed > 0 else 0.0
  eta = (total - iteration) / speed if speed > 0 else float("inf")
  reporter(Event(attack, iteration, total, np.asarray(losses, np.float64),
                 int(running), elapsed, 0.0 if final else eta, final))


def emit(every: int, attack: str, total: int, run_id: jax.Array,
         iteration: jax.Array, losses: jax.Array, running: jax.Array,
         final: bool = False) -> None:
  """Inside a jitted loop: reports every ``every`` iterations (and the end).

  Args:
    every: N (static); 0 emits nothing.
    attack: the attack's name (static).
    total: the iteration budget (static).
    run_id: from :func:`start_run` (traced).
    iteration: the loop counter (traced scalar, not batched).
    losses: ``[M]`` current objectives.
    running: number of attacks still iterating.
    final: the event after the loop (static).
  """
  if not every:
    return

  def call():
    jax.debug.callback(functools.partial(_host, attack, total), run_id,
                       iteration, losses, running, final, ordered=False)

  if final:
    call()
  else:
    jax.lax.cond((iteration % every == 0) & (iteration < total), call,
                 lambda: None)
