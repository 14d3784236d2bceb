"""End to end: the resumable FedAvg run under tfds.testing.mock_data."""

import os
import shutil
import sys

import jax
import ml_collections
import pytest

from repdef_jax import training

NUM_MOCK = 120


def _config(**overrides):
  c = training.default_config()
  c.dataset = "mnist"
  c.model = "logreg"
  c.partition = "noniid"
  c.num_clients = 4
  c.classes_per_client = 2
  c.samples_per_class = 3
  c.rounds = 4
  c.clients_per_round = 2
  c.local_steps = 2
  c.batch_size = 3
  c.client_lr = 0.1
  c.l2 = 1e-3
  c.checkpoint_every = 2
  c.max_test_examples = 40
  c.eval_batch = 20
  c.plot = False
  c.update(overrides)
  return c


def _files(workdir):
  """Every file's bytes, the checkpoint folder's entries and each checkpoint's
  arrays (orbax's own metadata files carry timestamps)."""
  out = {name: open(os.path.join(workdir, name), "rb").read()
         for name in sorted(os.listdir(workdir))
         if not name.endswith(".png") and name != training.CHECKPOINT_DIR}
  folder = os.path.join(workdir, training.CHECKPOINT_DIR)
  if os.path.isdir(folder):
    names = sorted(os.listdir(folder))
    out[training.CHECKPOINT_DIR] = {
        n: [a.tobytes() for a in jax.tree_util.tree_leaves(
            training.load_checkpoint(str(workdir), int(n)))]
        if n.isdigit() else None for n in names}
  return out


def _run(config, workdir, data_dir):
  config = ml_collections.ConfigDict(config.to_dict())
  config.data_dir = str(data_dir)
  return training.train_and_evaluate(config, str(workdir))


class _Killed(Exception):
  pass


def test_resume_after_kill_equals_uninterrupted(mock_env, monkeypatch):
  data_dir = mock_env / "data"
  full = _run(_config(), mock_env / "full", data_dir)
  assert [r["round"] for r in full["metrics"]] == [1, 2, 3, 4]
  reference = _files(mock_env / "full")
  assert set(reference) == {"checkpoints", "config.json", "metrics.jsonl"}
  assert set(reference["checkpoints"]) == {"2", "4"}

  # 1. Killed after round 3 (checkpoint at 2): rerun the same command.
  real_append = training._append_line  # pylint: disable=protected-access

  def append_then_die(path, record):
    real_append(path, record)
    if record["round"] == 3:
      raise _Killed()

  monkeypatch.setattr(training, "_append_line", append_then_die)
  with pytest.raises(_Killed):
    _run(_config(), mock_env / "a", data_dir)
  monkeypatch.setattr(training, "_append_line", real_append)
  _run(_config(), mock_env / "a", data_dir)
  assert _files(mock_env / "a") == reference

  # 2. Killed in the middle of writing a metrics line (torn line on disk).
  real_write = os.write

  def torn_write(fd, payload):
    if b'"round": 4' in payload:
      real_write(fd, payload[:len(payload) // 2])
      raise _Killed()
    return real_write(fd, payload)

  monkeypatch.setattr(training.os, "write", torn_write)
  with pytest.raises(_Killed):
    _run(_config(), mock_env / "b", data_dir)
  monkeypatch.setattr(training.os, "write", real_write)
  _run(_config(), mock_env / "b", data_dir)
  assert _files(mock_env / "b") == reference

  # 3. Killed while writing the second checkpoint (round 4): what the kill
  # leaves on disk is orbax's unfinished temporary folder, never "4".
  shutil.copytree(mock_env / "full", mock_env / "c")
  folder = mock_env / "c" / training.CHECKPOINT_DIR
  tmp = folder / "4.orbax-checkpoint-tmp-1010101"
  os.rename(folder / "4", tmp)
  os.remove(tmp / "_CHECKPOINT_METADATA")
  shutil.rmtree(tmp / "default" / "d")
  _run(_config(), mock_env / "c", data_dir)
  assert _files(mock_env / "c") == reference

  # 4. Three checkpoints are kept (checkpoints_to_keep), the oldest dropped.
  _run(_config(rounds=8, checkpoint_every=1, checkpoints_to_keep=3),
       mock_env / "keep", data_dir)
  assert sorted(os.listdir(mock_env / "keep" / "checkpoints")) == [
      "6", "7", "8"]

  # 5. A different configuration in the same workdir: error, nothing changes.
  with pytest.raises(ValueError, match="different configuration"):
    _run(_config(client_lr=0.2), mock_env / "full", data_dir)
  assert _files(mock_env / "full") == reference


def test_legacy_msgpack_checkpoint_gets_a_clear_message(mock_env):
  """A workdir of the flax-msgpack era: one-line error naming the file and
  what to do; nothing is written."""
  data_dir = mock_env / "data"
  workdir = mock_env / "old"
  workdir.mkdir()
  config = _config(rounds=2, data_dir=str(data_dir))
  (workdir / training.CONFIG_FILE).write_text(config.to_json())
  (workdir / training.LEGACY_CHECKPOINT_FILE).write_bytes(b"msgpack")
  before = _files(workdir)
  with pytest.raises(ValueError) as err:
    _run(_config(rounds=2), workdir, data_dir)
  msg = str(err.value)
  assert "\n" not in msg
  assert "checkpoint.msgpack" in msg and "another --workdir" in msg
  assert _files(workdir) == before


def test_bad_input_gives_clear_errors(mock_env):
  data_dir = mock_env / "data"
  with pytest.raises(ValueError, match="exceeds num_clients"):
    _run(_config(clients_per_round=5, replace=False), mock_env / "w1",
         data_dir)
  with pytest.raises(ValueError, match="local_steps"):
    _run(_config(local_steps=0), mock_env / "w2", data_dir)
  with pytest.raises(ValueError, match="Cannot give"):
    _run(_config(samples_per_class=1000), mock_env / "w3", data_dir)
  assert not os.path.exists(mock_env / "w3" / "config.json")


def test_entry_point_end_to_end(mock_env):
  from absl import flags  # pylint: disable=g-import-not-at-top
  root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
  if root not in sys.path:
    sys.path.insert(0, root)
  from experiments import fedavg as main_lib  # pylint: disable=g-import-not-at-top
  workdir = mock_env / "main"
  config_file = mock_env / "tiny_config.py"
  config_file.write_text(
      "from experiments.configs import fedavg\n"
      "def get_config():\n"
      "  c = fedavg.get_config()\n"
      "  c.update(num_clients=4, samples_per_class=3, rounds=2,\n"
      "           clients_per_round=2, local_steps=1, max_test_examples=20,\n"
      "           checkpoint_every=1)\n"
      "  return c\n")
  argv = ["fedavg", f"--config={config_file}", f"--workdir={workdir}",
          f"--data_dir={mock_env / 'data'}"]
  here = os.getcwd()
  os.chdir(os.path.join(os.path.dirname(__file__), ".."))
  try:
    flags.FLAGS.unparse_flags()
    flags.FLAGS(argv)
    main_lib.main(["fedavg"])
  finally:
    os.chdir(here)
    flags.FLAGS.unparse_flags()
  names = set(os.listdir(workdir))
  assert {"config.json", "checkpoints", "metrics.jsonl",
          "accuracy.png"} <= names
  records = training.read_metrics(str(workdir))
  assert [r["round"] for r in records] == [1, 2]
  assert 0.0 <= records[-1]["test_accuracy"] <= 1.0


def test_quiet_run_prints_no_round_lines(mock_env, monkeypatch, capsys):
  data_dir = mock_env / "data"
  _run(_config(rounds=2, log_every=1), mock_env / "loud", data_dir)
  assert "round 2/2" in capsys.readouterr().out
  monkeypatch.setenv("REPDEF_JAX_QUIET", "1")
  _run(_config(rounds=2, log_every=1), mock_env / "quiet", data_dir)
  assert "round" not in capsys.readouterr().out


def test_orbax_info_lines_are_dropped_warnings_kept(mock_env):
  import logging  # pylint: disable=g-import-not-at-top
  _run(_config(rounds=1, checkpoint_every=1), mock_env / "ckpt",
       mock_env / "data")  # installs the filter with its checkpoint manager
  absl_logger = logging.getLogger("absl")
  orbax_file = os.path.join(os.sep, "site", "orbax", "checkpoint", "x.py")

  def emitted(level, path):
    record = absl_logger.makeRecord("absl", level, path, 1, "m", (), None)
    return absl_logger.filter(record)

  assert not emitted(logging.INFO, orbax_file)
  assert emitted(logging.WARNING, orbax_file)
  assert emitted(logging.INFO, training.__file__)  # our round lines stay
