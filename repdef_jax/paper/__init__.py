"""Reproduction of Sun et al., CVPR 2021 (Soteria), and what goes beyond it.

The experiments of the paper (trade-off, visual comparison, representation
leakage, convergence, Theorem 1) and the adaptive attacks, built on the
library; nothing in ``repdef_jax`` outside this package imports it.
"""
