"""Bridges to other frameworks; each submodule needs its own extra.

* :mod:`repdef_jax.integrations.flower`: Flower (``pip install
  'repdef_jax[flower]'``). Importing :mod:`repdef_jax` or this package does
  not import Flower.
"""
