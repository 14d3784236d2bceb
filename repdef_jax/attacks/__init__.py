"""Gradient-inversion attacks: DLG, iDLG, Inverting Gradients, adaptive ones.

Every attack has one signature::

  attack = get_attack('dlg')
  result = attack(model, params, shared_grads, num_images, key,
                  labels=None, config=None, **overrides)

and returns an :class:`AttackResult` ``(x_rec, labels_rec, loss_history,
final_loss, diverged, iterations)``. :func:`run_batch` runs K independent
attacks (K gradients, K keys, one model) in one jitted program and returns
the same fields with a leading axis K. ``progress_every`` in a config turns
on progress reports from inside the jitted loop (:mod:`.progress`). The
attacker uses only what the server sees: the model, the parameters and the
shared (possibly defended) gradient.
Inputs are checked on the host first (gradient tree matching the parameters,
finite gradient, image shape fitting the model: clear ``ValueError``).

Registered names (:data:`ATTACKS`):

* ``dlg``: DLG, Zhu et al. 2019 (L-BFGS, summed L2, learned soft label);
  the function is :func:`dlg_attack` (``attacks.dlg`` is the module).
* ``idlg``: iDLG, Zhao et al. 2020 (label read off the last layer).
* ``gs``: Inverting Gradients, Geiping et al. 2020 (cosine + TV, signed Adam).
* ``dlg_drop`` / ``gs_drop``: the defended layer left out of the objective
  (Balunovic et al., ICLR 2022); its bias too unless the user's view says
  ``drop_bias=False``.
* ``dlg_mask`` / ``gs_mask``: the shared gradient's all-zero defended rows
  masked in the trial gradient too (GGL, Li et al., CVPR 2022).

A variant fixes some settings (iDLG ``infer_label=True``, the views' flags):
a user value that contradicts one raises a ``ValueError`` naming the field
(:meth:`Attack.make_config`) instead of being overwritten. A view's flag at
its default cannot be told from one left unset, so it takes the variant's
value: ``view=GradientView(drop_bias=False)`` with ``dlg_drop`` drops the
defended kernel only, and ``GradientView(drop_defended=False)`` there is
the plain view's default, not a refusal of the drop (use ``dlg`` for that).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, NamedTuple

from repdef_jax.attacks import objectives
from repdef_jax.attacks import progress
from repdef_jax.attacks.base import AttackResult
from repdef_jax.attacks.base import infer_labels
from repdef_jax.attacks.base import to_host
from repdef_jax.attacks import dlg  # The module; the function: dlg_attack.
from repdef_jax.attacks import inverting
from repdef_jax.attacks.dlg import dlg as dlg_attack
from repdef_jax.attacks.dlg import dlg_batch
from repdef_jax.attacks.dlg import DLGConfig
from repdef_jax.attacks.dlg import OPTIMIZERS as DLG_OPTIMIZERS
from repdef_jax.attacks.inverting import box_from_normalization
from repdef_jax.attacks.inverting import GSConfig
from repdef_jax.attacks.inverting import inverting_gradients
from repdef_jax.attacks.inverting import inverting_gradients_batch
from repdef_jax.attacks.objectives import cosine_distance
from repdef_jax.attacks.objectives import GradientView
from repdef_jax.attacks.objectives import l2_distance
from repdef_jax.attacks.objectives import total_variation


class Attack(NamedTuple):
  """A registered attack: a base function, its config class and fixed fields.

  Attributes:
    name: registry name.
    fn: ``fn(model, params, shared_grads, num_images, key, *, labels,
      config) -> AttackResult``.
    config_cls: the config dataclass (``DLGConfig`` or ``GSConfig``).
    fixed: settings this variant always has, ``'field'`` or
      ``'field.subfield'`` to value (e.g. ``'view.drop_defended': True``);
      see :meth:`make_config`.
    batch_fn: ``batch_fn(model, params, shared_batch, num_images, keys, *,
      labels, config) -> AttackResult`` with a leading axis K.
  """

  name: str
  fn: Callable[..., AttackResult]
  config_cls: type
  fixed: dict
  batch_fn: Callable[..., AttackResult]

  def make_config(self, config: Any = None, **overrides) -> Any:
    """The variant's config: ``config`` (or defaults), overrides, fixed.

    A fixed setting (``'field'`` or ``'field.subfield'``, e.g.
    ``'view.drop_defended'``) replaces a value left at the config class's
    default; a value the user set to something else (in ``overrides``, or
    different from the default in ``config``) raises. Settings the variant
    does not fix are the user's (e.g. ``view.drop_bias`` of ``*_drop``).

    Raises:
      ValueError: a config of another class, or a user setting that
        contradicts one the variant fixes.
      TypeError: an override that is no field of the config (the message
        lists them).
    """
    config = config if config is not None else self.config_cls()
    if not isinstance(config, self.config_cls):
      raise ValueError(f"Attack {self.name!r} takes a "
                       f"{self.config_cls.__name__}, got "
                       f"{type(config).__name__}.")
    fields = [f.name for f in dataclasses.fields(self.config_cls)]
    unknown = sorted(set(overrides) - set(fields))
    if unknown:
      raise TypeError(f"Unknown setting(s) {', '.join(unknown)} for attack "
                       f"{self.name!r}; {self.config_cls.__name__} has "
                       f"{', '.join(fields)}.")
    config = dataclasses.replace(config, **overrides)
    default = self.config_cls()
    for path, want in self.fixed.items():
      name, _, sub = path.partition(".")
      have, dflt = getattr(config, name), getattr(default, name)
      if sub:
        if not isinstance(have, type(dflt)):
          raise ValueError(f"{name} must be a {type(dflt).__name__}; got "
                           f"{have!r}.")
        outer, have, dflt = have, getattr(have, sub), getattr(dflt, sub)
      given = have != dflt or (not sub and name in overrides)
      if given and have != want:
        raise ValueError(f"Attack {self.name!r} fixes {path}={want!r}; got "
                         f"{path}={have!r} (leave it unset or use another "
                         f"attack).")
      value = dataclasses.replace(outer, **{sub: want}) if sub else want
      config = dataclasses.replace(config, **{name: value})
    return config

  def __call__(self, model, params, shared_grads, num_images, key, *,
               labels=None, config=None, **overrides) -> AttackResult:
    return self.fn(model, params, shared_grads, num_images, key,
                   labels=labels, config=self.make_config(config, **overrides))

  def run_batch(self, model, params, shared_batch, num_images, keys, *,
                labels=None, config=None, **overrides) -> AttackResult:
    """K independent attacks in one jitted program (see :func:`run_batch`)."""
    return self.batch_fn(model, params, shared_batch, num_images, keys,
                         labels=labels,
                         config=self.make_config(config, **overrides))


# The views' flags; drop_bias stays the user's (default True: bias dropped).
_DROP = {"view.drop_defended": True, "view.mask_from_shared": False}
_MASK = {"view.mask_from_shared": True, "view.drop_defended": False}


def _dlg(name: str, **fixed) -> Attack:
  return Attack(name, dlg_attack, DLGConfig, fixed, dlg_batch)


def _gs(name: str, **fixed) -> Attack:
  return Attack(name, inverting_gradients, GSConfig, fixed,
                inverting_gradients_batch)


ATTACKS: dict[str, Attack] = {a.name: a for a in (
    _dlg("dlg"), _dlg("idlg", infer_label=True), _gs("gs"),
    _dlg("dlg_drop", **_DROP), _gs("gs_drop", **_DROP),
    _dlg("dlg_mask", **_MASK), _gs("gs_mask", **_MASK))}
ATTACK_NAMES = tuple(ATTACKS)


def get_attack(name: str) -> Attack:
  """The registered attack ``name``.

  Raises:
    ValueError: unknown name (the message lists the valid names).
  """
  if name not in ATTACKS:
    raise ValueError(f"Unknown attack {name!r}; valid names: "
                     f"{', '.join(ATTACK_NAMES)}.")
  return ATTACKS[name]


def run_batch(attack: str | Attack, model, params, shared_batch,
              num_images: int, keys, *, labels=None, config=None,
              **overrides) -> AttackResult:
  """K independent attacks of one kind in one jitted, vmapped program.

  Attack k sees ``shared_batch[k]`` (every leaf indexed on its leading axis),
  ``keys[k]`` and ``labels[k]``; all share the model, the parameters and the
  config. Each attack stops (converged or diverged) on its own and is frozen
  from then on, so a diverging attack does not change the others: attack k
  equals ``get_attack(attack)(model, params, shared_batch[k], num_images,
  keys[k], labels=labels[k], ...)`` to float tolerance (DLG's L-BFGS can
  amplify such differences on an image it has not converged on). On a CPU
  with several host devices (on request, :mod:`repdef_jax.host`) the K
  attacks are split over them and run in parallel
  (:func:`repdef_jax.attacks.base.over_devices`), unless progress
  (``progress_every``) is reported: then one device runs the batch and
  reports once per batch.

  Args:
    attack: a registered name or an :class:`Attack`.
    model: the attacked model.
    params: the parameters every gradient was computed at.
    shared_batch: K shared gradients stacked on a leading axis.
    num_images: B, images per gradient.
    keys: ``[K]`` PRNG keys (``jax.random.split(key, K)``).
    labels: known labels ``[K, B]``, or None.
    config: the attack's config; ``overrides`` replace its fields.

  Returns:
    An :class:`AttackResult` whose fields have a leading axis K.
  """
  if not isinstance(attack, Attack):
    attack = get_attack(attack)
  return attack.run_batch(model, params, shared_batch, num_images, keys,
                          labels=labels, config=config, **overrides)


__all__ = [
    "ATTACKS", "ATTACK_NAMES", "Attack", "AttackResult", "DLGConfig",
    "DLG_OPTIMIZERS",
    "GSConfig", "GradientView", "box_from_normalization", "cosine_distance",
    "dlg", "dlg_attack", "get_attack", "infer_labels", "inverting",
    "inverting_gradients", "l2_distance",
    "objectives", "progress", "run_batch", "to_host", "total_variation",
]
