"""The Colab notebooks: clean, installable as-is, and executed in CI.

Execution runs against the package installed from a wheel built from this
checkout, not against the checkout itself, so packaging breakage (missing
package data such as the embedded sample, a subpackage left out of
``setup.py``) fails here. The wheel is built offline (``pip wheel --no-deps
--no-build-isolation``) and installed into a fresh venv whose ``.pth`` line
lets it import this environment's packages (the dependencies) after its own.
Each notebook then runs in its tiny configuration (``REPDEF_JAX_NOTEBOOK_TINY
=1``) with nbclient under that venv's interpreter (the kernel is that
interpreter), offline, with an empty ``TFDS_DATA_DIR``: images come from the
embedded sample.
"""

import glob
import os
import shutil
import subprocess
import sys
import sysconfig
import time
import zipfile

import nbformat
import numpy as np
import pytest

from repdef_jax.paper import notebook
from repdef_jax.paper import tradeoff

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NOTEBOOKS = sorted(glob.glob(os.path.join(ROOT, "colab", "*.ipynb")))
PLACEHOLDER = "https://github.com/YOUR_GITHUB_USER/repdef_jax"


def test_there_are_three_notebooks():
  assert [os.path.basename(p) for p in NOTEBOOKS] == [
      "01_attack_vs_defense.ipynb", "02_federated_tradeoff.ipynb",
      "03_new_perturbation_norm.ipynb"]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=os.path.basename)
def test_notebook_is_clean_and_self_describing(path):
  nb = nbformat.read(path, as_version=4)
  intro = nb.cells[0].source
  assert "**Data.**" in intro and "**Time.**" in intro and "REPO_URL" in intro
  code = [c for c in nb.cells if c.cell_type == "code"]
  assert all(not c.outputs and c.execution_count is None for c in code)
  install = code[0].source
  assert f'\nREPO_URL = "{PLACEHOLDER}"' in install
  assert "device_summary()" in code[1].source
  assert "# @param" in code[2].source and "is_tiny()" in code[2].source


@pytest.mark.parametrize("path", NOTEBOOKS, ids=os.path.basename)
def test_cells_from_the_parameters_on_run_after_a_restart(path):
  """Every name the cells from the parameter cell onward read is defined
  by those cells (or is a builtin): after 'Restart runtime' a user reruns
  from the parameters, not from the install and device cells."""
  import ast  # pylint: disable=g-import-not-at-top
  import builtins  # pylint: disable=g-import-not-at-top
  code = [c.source for c in nbformat.read(path, as_version=4).cells
          if c.cell_type == "code"]
  defined, missing = set(dir(builtins)), []
  for source in code[2:]:
    tree = ast.parse(source)
    for node in ast.walk(tree):
      if isinstance(node, (ast.Import, ast.ImportFrom)):
        defined |= {(a.asname or a.name).split(".")[0] for a in node.names}
      elif isinstance(node, (ast.FunctionDef, ast.ClassDef)):
        defined.add(node.name)
        defined |= {a.arg for a in ast.walk(node.args)
                    if isinstance(a, ast.arg)}
      elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
        defined.add(node.id)
      elif isinstance(node, ast.arg):
        defined.add(node.arg)
    for node in ast.walk(tree):
      if (isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load)
          and node.id not in defined):
        missing.append(node.id)
  assert not missing, missing


@pytest.mark.parametrize("value,tiny", [
    (None, False), ("", False), ("0", False), ("1", True), ("yes", True)])
def test_is_tiny_reads_the_environment(monkeypatch, value, tiny):
  """Only an unset, empty or '0' REPDEF_JAX_NOTEBOOK_TINY is a full run."""
  from repdef_jax.paper import notebook  # pylint: disable=g-import-not-at-top
  if value is None:
    monkeypatch.delenv(notebook.TINY_ENV, raising=False)
  else:
    monkeypatch.setenv(notebook.TINY_ENV, value)
  assert notebook.is_tiny() is tiny


def test_device_summary_names_the_backend_jax_uses():
  import jax  # pylint: disable=g-import-not-at-top
  from repdef_jax.paper import notebook  # pylint: disable=g-import-not-at-top
  line = notebook.device_summary()
  platform = jax.devices()[0].platform
  assert line.startswith(f"jax {jax.__version__}, {len(jax.devices())} x ")
  assert ("no GPU: running on the CPU" in line) == (platform == "cpu")
  assert (f"{platform.upper()} present, JAX uses it" in line) == (
      platform != "cpu")


@pytest.mark.parametrize("model,given,init", [
    ("lenet", None, "uniform"), ("convnet64", None, "default"),
    ("lenet5", None, "default"), ("convnet64", "uniform", "uniform"),
    ("lenet", "auto", "uniform")])
def test_attack_vs_defense_init_is_dlgs_for_lenet_only(monkeypatch, model,
                                                       given, init):
  """DLG's uniform init saturates ConvNet64's / LeNet5's softmax (zero
  gradient): notebooks 1 and 3 get it only on DLG's LeNet by default."""
  from repdef_jax.paper import notebook  # pylint: disable=g-import-not-at-top
  seen = []

  class Stop(Exception):
    pass

  def get_model(name, *args, init="default", **kwargs):
    del args, kwargs
    seen.append((name, init))
    raise Stop

  monkeypatch.setattr(notebook.models_lib, "get_model", get_model)
  kwargs = {} if given is None else {"model_init": given}
  with pytest.raises(Stop):
    notebook.attack_vs_defense("cifar10", model, "dlg", **kwargs)
  assert seen == [(model, init)]


@pytest.mark.parametrize("attack,given", [("dlg", True), ("gs", True),
                                          ("idlg", False)])
def test_attack_vs_defense_gives_the_label_except_to_idlg(monkeypatch,
                                                          attack, given):
  """iDLG infers the label from the last layer: handed the true label it
  would be DLG with a known label (its rows equalled DLG's)."""
  from repdef_jax.paper import notebook  # pylint: disable=g-import-not-at-top
  seen = []

  class Stop(Exception):
    pass

  def defend_and_attack(*args, give_labels, **kwargs):
    del args, kwargs
    seen.append(give_labels)
    raise Stop

  monkeypatch.setattr(notebook.harness, "defend_and_attack",
                      defend_and_attack)
  with pytest.raises(Stop):
    notebook.attack_vs_defense("mnist", "logreg", attack,
                               settings=[("none", 0.0)])
  assert seen == [given]


def _install_cell(cwd, repo_url=None, installed=False):
  """Runs a notebook's first cell with pip and the import check faked."""
  source = nbformat.read(NOTEBOOKS[0], as_version=4).cells[1].source
  if repo_url:
    source = source.replace(PLACEHOLDER, repo_url)
  calls = []
  import importlib.util  # pylint: disable=g-import-not-at-top
  old_cwd, old_path = os.getcwd(), list(sys.path)
  fake_spec = lambda name: object() if installed else None
  real = importlib.util.find_spec, subprocess.check_call
  importlib.util.find_spec, subprocess.check_call = fake_spec, calls.append
  try:
    os.chdir(cwd)
    exec(compile(source, "cell", "exec"), {})  # pylint: disable=exec-used
  finally:
    importlib.util.find_spec, subprocess.check_call = real
    os.chdir(old_cwd)
    sys.path[:] = old_path
  return calls


def test_install_cell_uses_the_checkout_the_url_or_nothing(tmp_path):
  [call] = _install_cell(os.path.join(ROOT, "colab"))
  assert call[-3:] == ["-q", "-e", ROOT]
  assert not _install_cell(tmp_path, installed=True)
  with pytest.raises(SystemExit, match="Set REPO_URL"):
    _install_cell(tmp_path)
  [call] = _install_cell(tmp_path, repo_url="https://example.org/me/rj")
  assert call[-1] == "repdef_jax @ git+https://example.org/me/rj@main"


def _wheel_venv(tmp):
  """Builds the wheel and a venv holding it; returns (python, seconds)."""
  start = time.perf_counter()
  src = tmp / "src"
  ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
  os.makedirs(src)
  for item in ("setup.py", "setup.cfg", "README.md"):
    shutil.copy(os.path.join(ROOT, item), src / item)
  for package in ("repdef_jax", "experiments"):
    shutil.copytree(os.path.join(ROOT, package), src / package, ignore=ignore)
  subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps",
                  "--no-build-isolation", "-q", "-w", str(tmp / "dist"),
                  str(src)], check=True, capture_output=True)
  [wheel] = glob.glob(str(tmp / "dist" / "*.whl"))
  with zipfile.ZipFile(wheel) as z:
    names = set(z.namelist())
  for needed in ("repdef_jax/sample_data/cifar10.npz",
                 "repdef_jax/sample_data/mnist.npz",
                 "repdef_jax/sample_data/README.md",
                 "repdef_jax/paper/main_job.py", "repdef_jax/data_cli.py",
                 "experiments/configs/attack.py", "experiments/console.py"):
    assert needed in names, f"{needed} missing from the wheel"
  venv = tmp / "venv"
  subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)],
                 check=True)
  python = str(venv / "bin" / "python")
  site = subprocess.run(
      [python, "-c", "import sysconfig; print(sysconfig.get_paths()"
       "['purelib'])"], check=True, capture_output=True, text=True
  ).stdout.strip()
  with open(os.path.join(site, "zz_dependencies.pth"), "w") as f:
    f.write(sysconfig.get_paths()["purelib"] + "\n")
  subprocess.run([sys.executable, "-m", "pip", "--python", python, "install",
                  "--no-deps", "--no-index", "-q", wheel], check=True,
                 capture_output=True)
  return python, time.perf_counter() - start


_RUN = """
import sys, nbformat
from nbclient import NotebookClient
path, out, cwd = sys.argv[1:]
nb = nbformat.read(path, as_version=4)
for cell in nb.cells:  # keep the run's files in cwd
  cell.source = cell.source.replace("/tmp/repdef_jax_tradeoff",
                                    cwd + "/tradeoff")
NotebookClient(nb, kernel_name="python3", timeout=600,
               resources={"metadata": {"path": cwd}}).execute()
nbformat.write(nb, out)
"""


@pytest.fixture(scope="module")
def wheel_env(tmp_path_factory):
  """(python, env, tmp): the wheel's venv and an offline notebook env."""
  tmp = tmp_path_factory.mktemp("wheel")
  python, build_seconds = _wheel_venv(tmp)
  print(f"wheel + venv {build_seconds:.0f}s")
  env = {k: v for k, v in os.environ.items()
         if not k.startswith(("REPDEF_JAX", "PYTHON"))}
  os.makedirs(tmp / "empty_tfds")
  env.update(REPDEF_JAX_NOTEBOOK_TINY="1", REPDEF_JAX_OFFLINE="1",
             REPDEF_JAX_CACHE=str(tmp / "cache"), JAX_PLATFORMS="cpu",
             TFDS_DATA_DIR=str(tmp / "empty_tfds"))
  return python, env, tmp


def test_console_scripts_and_configs_from_the_wheel(wheel_env):
  python, env, tmp = wheel_env
  venv_bin = os.path.dirname(python)
  helped = subprocess.run([os.path.join(venv_bin, "repdef-attack"),
                           "--help"], cwd=tmp, env=env, check=False,
                          capture_output=True, text=True, timeout=300)
  assert "--images" in helped.stdout, helped.stderr[-2000:]  # absl: exit 1
  # The default --config is the installed file (absl wraps long lines).
  assert "site-packages/experiments/configs/attack.py" in "".join(
      helped.stdout.split())


# One test per notebook, so that pytest-xdist spreads them over workers.
@pytest.mark.parametrize("path", NOTEBOOKS, ids=os.path.basename)
def test_notebook_executes_tiny_from_the_wheel(wheel_env, path):
  python, env, tmp = wheel_env
  venv_site = os.path.dirname(os.path.dirname(python))
  name = os.path.basename(path)
  start = time.perf_counter()
  out = tmp / name
  cwd = tmp / name.split("_")[0]
  os.makedirs(cwd)
  proc = subprocess.run([python, "-c", _RUN, path, str(out), str(cwd)],
                        cwd=cwd, env=env, capture_output=True,
                        text=True, timeout=600, check=False)
  assert proc.returncode == 0, f"{name}: {proc.stderr[-3000:]}"
  print(f"{name} {time.perf_counter() - start:.0f}s")
  nb = nbformat.read(out, as_version=4)
  text = "\n".join(o.get("text", "") for c in nb.cells
                   if c.cell_type == "code" for o in c.outputs)
  assert "repdef_jax is installed" in text
  assert f"python: {python}" in text
  assert f"repdef_jax: {venv_site}" in text  # the wheel, not the checkout
  assert "JAX devices: jax " in text and "no GPU: running on the CPU" in text
  if name.startswith("02"):
    assert "data: sample: the embedded sample" in text
  else:
    assert "images: sample" in text


def test_attack_vs_defense_rows_hold_each_settings_reconstruction(
    monkeypatch):
  """Each row: the setting's label, the attack's reconstruction (not the
  original image) and its metrics; 'soteria:<q>' picks perturbation q and
  defense_kwargs reach the defense of their setting."""
  defenses, calls = [], []

  def get_defense(name, strength, model=None, **kwargs):
    defenses.append((name, strength, kwargs))
    return f"defense {len(defenses)}"

  def defend_and_attack(model, params, d, x, y, attack, *keys, iterations,
                        restarts, give_labels):
    calls.append((d, attack, iterations, restarts))
    return {"ssim": 0.5, "mse_clamped": 0.1}, np.full_like(
        np.asarray(x), 0.25 * len(calls)), None

  monkeypatch.setattr(notebook.defenses_lib, "get_defense", get_defense)
  monkeypatch.setattr(notebook.harness, "defend_and_attack",
                      defend_and_attack)
  result = notebook.attack_vs_defense(
      "mnist", "logreg", "gs", settings=[("none", 0.0), ("soteria:q0", 60.0)],
      iterations=7, defense_kwargs={"soteria:q0 60": {"layer": "fc"}})
  assert defenses == [("none", 0.0, {}),
                      ("soteria", 60.0, {"layer": "fc", "q": "q0"})]
  assert calls == [("defense 1", "gs", 7, 1), ("defense 2", "gs", 7, 1)]
  assert [r[0] for r in result["rows"]] == ["none 0", "soteria:q0 60"]
  for i, (_, x_rec, m) in enumerate(result["rows"]):
    np.testing.assert_array_equal(x_rec, np.full_like(result["image"],
                                                      0.25 * (i + 1)))
    assert m == {"ssim": 0.5, "mse_clamped": 0.1}
  assert result["image"].shape == (28, 28, 1)


def test_federated_tradeoff_passes_every_argument_to_the_sweep(
    monkeypatch, tmp_path, capsys):
  seen = []
  monkeypatch.setattr(tradeoff, "run",
                      lambda c, workdir: seen.append((c, workdir)) or "R")
  assert notebook.federated_tradeoff(
      str(tmp_path), rounds=6, num_clients=10, num_images=3, attack="dlg",
      attack_iterations=17, soteria=(30.0,), compression=(70.0,),
      dp_gaussian=(1e-3,), model="lenet") == "R"
  [(c, workdir)] = seen
  assert workdir == str(tmp_path)
  assert c.defenses.to_dict() == {"soteria": (30.0,), "compression": (70.0,),
                                  "dp_gaussian": (1e-3,)}
  assert c.num_images == 3 and c.seeds == (0,)
  assert c.attack_budgets.dlg.outer_steps == 17
  assert c.attack_budgets.gs.iterations == 17
  panel = c.panels.notebook
  assert (panel.dataset, panel.model, panel.attacks) == (
      "mnist", "lenet", ("dlg", "dlg_mask"))
  assert (panel.train.num_clients, panel.train.rounds,
          panel.train.clients_per_round) == (10, 6, 5)
  assert c.accuracy_window == 2
  assert capsys.readouterr().out.startswith("data: ")
