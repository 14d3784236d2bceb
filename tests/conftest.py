"""Shared pytest setup: CPU, small default precision, quiet logs."""

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
# No test downloads a dataset (tests/test_download.py serves its own mirror).
os.environ.setdefault("REPDEF_JAX_OFFLINE", "1")

import pytest  # noqa: E402


@pytest.fixture()
def mock_env(request, tmp_path, monkeypatch):
  """tfds mock data (``NUM_MOCK`` examples per split, default 120) with a
  fresh repdef_jax data cache under ``tmp_path``; yields ``tmp_path``."""
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
  from repdef_jax import data  # pylint: disable=g-import-not-at-top
  monkeypatch.setenv("REPDEF_JAX_CACHE", str(tmp_path / "cache"))
  monkeypatch.delenv("TFDS_DATA_DIR", raising=False)
  data.clear_cache()
  with tfds.testing.mock_data(
      num_examples=getattr(request.module, "NUM_MOCK", 120)):
    yield tmp_path
  data.clear_cache()
