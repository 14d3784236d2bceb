"""Executes every Colab notebook in its tiny configuration with nbclient.

The notebooks read ``REPDEF_JAX_NOTEBOOK_TINY=1`` from the environment and
shrink their sizes; ``TFDS_DATA_DIR`` is unset so they use synthetic images
and ``tfds.testing.mock_data``. The kernel is the 'python3' kernelspec,
which jupyter_client starts with this process's interpreter
(``sys.executable``, the venv's python); the notebooks print it and we check.
"""

import glob
import os
import sys

import nbformat
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NOTEBOOKS = sorted(glob.glob(os.path.join(ROOT, "colab", "*.ipynb")))


def test_there_are_three_notebooks():
  assert [os.path.basename(p) for p in NOTEBOOKS] == [
      "01_attack_vs_defense.ipynb", "02_federated_tradeoff.ipynb",
      "03_new_perturbation_norm.ipynb"]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=os.path.basename)
def test_notebook_is_clean_and_has_badge(path):
  nb = nbformat.read(path, as_version=4)
  name = os.path.basename(path)
  assert ("https://colab.research.google.com/github/repdef-jax/repdef_jax/"
          f"blob/main/colab/{name}") in nb.cells[0].source
  code = [c for c in nb.cells if c.cell_type == "code"]
  assert all(not c.outputs and c.execution_count is None for c in code)
  assert "repdef_jax@v0.1.0" in code[0].source and "except ImportError" in (
      code[0].source)
  assert "jax.devices()" in code[1].source
  assert "# @param" in code[2].source and "is_tiny()" in code[2].source


@pytest.mark.parametrize("path", NOTEBOOKS, ids=os.path.basename)
def test_notebook_executes_tiny(path, tmp_path, monkeypatch):
  from nbclient import NotebookClient  # pylint: disable=g-import-not-at-top
  monkeypatch.setenv("REPDEF_JAX_NOTEBOOK_TINY", "1")
  monkeypatch.setenv("REPDEF_JAX_CACHE", str(tmp_path / "cache"))
  monkeypatch.setenv("JAX_PLATFORMS", "cpu")
  monkeypatch.delenv("TFDS_DATA_DIR", raising=False)
  nb = nbformat.read(path, as_version=4)
  for cell in nb.cells:  # keep the run's files in tmp_path
    cell.source = cell.source.replace("/tmp/repdef_jax_tradeoff",
                                      str(tmp_path / "tradeoff"))
  client = NotebookClient(nb, kernel_name="python3", timeout=600,
                          resources={"metadata": {"path": str(tmp_path)}})
  client.execute()
  text = "\n".join(o.get("text", "") for c in nb.cells
                   if c.cell_type == "code" for o in c.outputs)
  assert f"python: {sys.executable}" in text
  assert "JAX devices:" in text
