"""Defenses: pure functions ``(grads, ClientBatch, key) -> (grads, info)``.

Public API:

* :class:`Defense`, :class:`ClientBatch`, :func:`chain`, :func:`identity`
  (``base``);
* Soteria (Sun et al. 2021): the factory ``soteria.soteria`` (alias
  :func:`soteria_defense`; the name ``soteria`` stays the submodule so that
  ``repdef_jax.defenses.soteria.feature_scores`` works), :func:`feature_scores`,
  :func:`mask_from_scores`, :func:`apply_mask`, :data:`PERTURBATIONS`,
  :class:`PerturbationInputs`, :func:`register_perturbation`;
* Theorem 1: :func:`certified_bound`, :func:`representation_distance`,
  :func:`empirical_bound`;
* baselines: :func:`compression`, :func:`dp_gaussian`, :func:`dp_laplace`,
  :func:`dp_sgd`, :func:`dp_sgd_epsilon`;
* :func:`get_defense` builds any of them by name.
"""

from __future__ import annotations

from typing import Any

import jax

from repdef_jax import models as models_lib
from repdef_jax.defenses import baselines
from repdef_jax.defenses import certify
from repdef_jax.defenses import soteria
from repdef_jax.defenses.base import chain
from repdef_jax.defenses.base import ClientBatch
from repdef_jax.defenses.base import Defense
from repdef_jax.defenses.base import identity
from repdef_jax.defenses.base import zeros_info_like
from repdef_jax.defenses.baselines import compression
from repdef_jax.defenses.baselines import dp_gaussian
from repdef_jax.defenses.baselines import dp_laplace
from repdef_jax.defenses.baselines import dp_sgd
from repdef_jax.defenses.baselines import dp_sgd_epsilon
from repdef_jax.defenses.certify import certified_bound
from repdef_jax.defenses.certify import empirical_bound
from repdef_jax.defenses.certify import representation_distance
from repdef_jax.defenses.soteria import apply_mask
from repdef_jax.defenses.soteria import feature_scores
from repdef_jax.defenses.soteria import mask_from_scores
from repdef_jax.defenses.soteria import PerturbationInputs
from repdef_jax.defenses.soteria import PERTURBATIONS
from repdef_jax.defenses.soteria import register_perturbation
from repdef_jax.defenses.soteria import soteria as soteria_defense

DEFENSE_NAMES = ("none", "soteria", "compression", "dp_gaussian", "dp_laplace",
                 "dp_sgd")


def _require_model(name: str, model: Any) -> models_lib.Model:
  if not isinstance(model, models_lib.Model):
    raise ValueError(f"Defense {name!r} needs model=<repdef_jax Model>, got "
                     f"{model!r}.")
  return model


def check_strength(name: str, strength: Any, where: str = "strength",
                   q: str = "q0") -> None:
  """Raises a ValueError naming ``where`` unless ``name`` is one of
  :data:`DEFENSE_NAMES` and ``strength`` suits it: a percent in [0, 100]
  for compression and Soteria's q0, a finite number in its own units for
  another registered Soteria perturbation ``q``, a finite scale >= 0 for
  the DP noise and DP-SGD's noise multiplier (checks that need no model)."""
  if name not in DEFENSE_NAMES:
    raise ValueError(f"{where}: unknown defense {name!r}; valid names: "
                     f"{', '.join(DEFENSE_NAMES)}.")
  try:
    if name == "soteria":
      soteria.check_strength(strength, q)
    elif name == "compression":
      soteria.check_percent(strength)
    elif name in ("dp_gaussian", "dp_laplace"):
      get_defense(name, strength)
    elif name == "dp_sgd":
      baselines.check_scale(strength, "noise_multiplier")
  except ValueError as error:
    raise ValueError(f"{where} ({name}): {error}") from None


def get_defense(name: str, strength: Any = 0.0, *,
                model: models_lib.Model | None = None,
                **kwargs) -> Defense:
  """Builds a defense by name.

  Args:
    name: one of :data:`DEFENSE_NAMES`.
    strength: 'soteria': its perturbation's strength (q0, the default:
      percent in [0, 100]); 'compression': percent in [0, 100];
      'dp_gaussian' / 'dp_laplace': noise scale >= 0; 'dp_sgd': noise
      multiplier >= 0 (``clip_norm`` in kwargs, default 1.0); 'none': ignored.
    model: required by 'soteria' and 'dp_sgd'.
    **kwargs: forwarded to the factory (e.g. ``score``, ``selection``,
      ``protect_bias`` for soteria; ``clip_norm`` for dp_sgd).

  Returns:
    A :class:`Defense`.

  Raises:
    ValueError: unknown name (lists the valid ones), missing model, a model
      without a defended linear layer, or a bad strength.
  """
  if name == "none":
    return identity()
  if name == "soteria":
    model = _require_model(name, model)
    soteria.defended_layer(jax.eval_shape(model.init, jax.random.key(0)),
                               model)
    return soteria_defense(model, strength, **kwargs)
  if name == "compression":
    return compression(strength, **kwargs)
  if name == "dp_gaussian":
    return dp_gaussian(strength, **kwargs)
  if name == "dp_laplace":
    return dp_laplace(strength, **kwargs)
  if name == "dp_sgd":
    model = _require_model(name, model)
    clip_norm = kwargs.pop("clip_norm", 1.0)
    return dp_sgd(model, clip_norm, strength, **kwargs)
  raise ValueError(f"Unknown defense name {name!r}; valid names: "
                   f"{', '.join(DEFENSE_NAMES)}.")


__all__ = [
    "DEFENSE_NAMES", "ClientBatch", "Defense", "PERTURBATIONS",
    "PerturbationInputs", "apply_mask",
    "baselines", "certified_bound", "certify", "chain", "check_strength",
    "compression",
    "dp_gaussian", "dp_laplace", "dp_sgd", "dp_sgd_epsilon", "empirical_bound",
    "feature_scores", "get_defense", "identity", "mask_from_scores",
    "register_perturbation", "representation_distance", "soteria",
    "soteria_defense",
    "zeros_info_like",
]
