"""End to end: the resumable FedAvg run under tfds.testing.mock_data."""

import json
import os
import shutil
import sys

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from repdef_jax import data as data_lib
from repdef_jax import defenses
from repdef_jax import gradients
from repdef_jax import models
from repdef_jax import partition as partition_lib
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
  assert set(reference) == {"checkpoints", "config.json", "data.json",
                            "metrics.jsonl"}
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
  # leaves on disk is orbax's unfinished temporary folder, never "4". The
  # run is also older than data.json: the resume writes it.
  shutil.copytree(mock_env / "full", mock_env / "c")
  os.remove(mock_env / "c" / training.DATA_FILE)
  folder = mock_env / "c" / training.CHECKPOINT_DIR
  tmp = folder / "4.orbax-checkpoint-tmp-1010101"
  os.rename(folder / "4", tmp)
  os.remove(tmp / "_CHECKPOINT_METADATA")
  shutil.rmtree(tmp / "default" / "d")
  _run(_config(), mock_env / "c", data_dir)
  assert _files(mock_env / "c") == reference

  # 4. The last checkpoints_to_keep checkpoints are kept, older ones
  # dropped (2, not orbax's or the config's default 3).
  _run(_config(rounds=8, checkpoint_every=1, checkpoints_to_keep=2),
       mock_env / "keep", data_dir)
  assert sorted(os.listdir(mock_env / "keep" / "checkpoints")) == ["7", "8"]

  # 5. A different configuration in the same workdir: error, nothing changes.
  with pytest.raises(ValueError, match="different configuration"):
    _run(_config(client_lr=0.2), mock_env / "full", data_dir)
  # Another seed is another run, not a runtime setting.
  with pytest.raises(ValueError, match="different configuration"):
    _run(_config(seed=1), mock_env / "full", data_dir)
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
  # Checked before any round is trained or file written; one line each.
  for overrides, match in [
      ({"log_every": 0}, "log_every must be >= 1"),
      ({"eval_batch": 0}, "eval_batch must be >= 1"),
      ({"eval_batch": -5}, "eval_batch must be >= 1"),
      ({"server_lr": 0.0}, "server_lr must be a finite number > 0"),
      ({"server_lr": -1.0}, "server_lr must be a finite number > 0"),
      ({"server_lr": float("nan")}, "server_lr must be a finite number > 0"),
      ({"client_lr": float("inf")}, "client_lr must be a finite number > 0"),
      ({"model": "convnet64", "model_kwargs": {"widht": 3}},
       "Unknown keyword argument.* widht for model 'convnet64'; it accepts "
       "width"),
  ]:
    with pytest.raises(ValueError, match=match) as err:
      _run(_config(**overrides), mock_env / "w4", data_dir)
    assert "\n" not in str(err.value)
    assert not os.path.exists(mock_env / "w4" / "config.json")


def test_theorem2_gamma_counts_the_real_steps_per_round():
  """With local_epochs, Theorem 2's I is the steps a client takes per round
  (E * ceil(M / B) for clients padded to M), not local_steps."""
  model = models.get_model("logreg", (4, 4, 1), 4)
  config = _config(lr_schedule="theorem2", mu=1.0, smoothness=1.0,
                   local_steps=1, local_epochs=2, batch_size=3)
  fcfg = training.build_fedavg_config(config, model, padded_size=30)
  steps = fcfg.steps_per_round(30)
  assert steps == 20  # gamma = max(8 L / mu, I) = 20, not 8.
  for t in (0, 5):
    assert float(fcfg.client_lr(t)) == pytest.approx(2 / (20 + t))
  with pytest.raises(ValueError, match="needs padded_size"):
    training.build_fedavg_config(config, model)
  # local_steps: I = local_steps as before, padded_size or not.
  config = _config(lr_schedule="theorem2", mu=1.0, smoothness=1.0,
                   local_steps=12)
  for padded in (None, 30):
    fcfg = training.build_fedavg_config(config, model, padded_size=padded)
    assert float(fcfg.client_lr(0)) == pytest.approx(2 / 12)


def test_resume_on_other_data_or_fewer_rounds_is_refused(tmp_path,
                                                         monkeypatch):
  """A run started on the embedded sample is not resumed on a download of
  other records (data.json), nor with fewer rounds than its checkpoint;
  both leave the workdir untouched. The same data resumes."""
  cache = tmp_path / "cache"
  monkeypatch.setenv("REPDEF_JAX_CACHE", str(cache))
  monkeypatch.setenv("REPDEF_JAX_OFFLINE", "1")
  monkeypatch.delenv("TFDS_DATA_DIR", raising=False)
  data_lib.clear_cache()
  no_tfds = tmp_path / "no_tfds"
  workdir = tmp_path / "run"
  config = _config(rounds=2, checkpoint_every=1)
  with data_lib.allow_sample():
    _run(config, workdir, no_tfds)
  with open(workdir / training.DATA_FILE) as f:
    saved = json.load(f)
  assert saved["train_source"] == saved["test_source"] == "sample"
  assert (saved["train_examples"], saved["test_examples"]) == (256, 40)
  before = _files(workdir)

  # A download cache holding the sample's records in another order.
  for split in ("train", "test"):
    images, labels = data_lib.load_sample("mnist", split)
    path = data_lib._download_path(str(cache), "mnist", split)  # pylint: disable=protected-access
    os.makedirs(os.path.dirname(path), exist_ok=True)
    np.savez(path, images=images[::-1], labels=labels[::-1])
  with pytest.raises(ValueError, match="other data") as err:
    _run(_config(rounds=4, checkpoint_every=1), workdir, no_tfds)
  msg = str(err.value)
  assert "\n" not in msg
  assert "train: sample, 256 examples" in msg
  assert "train: download, 256 examples" in msg
  assert _files(workdir) == before

  shutil.rmtree(cache / "original")
  data_lib.clear_cache()
  with data_lib.allow_sample():
    out = _run(_config(rounds=4, checkpoint_every=1), workdir, no_tfds)
    assert [r["round"] for r in out["metrics"]] == [1, 2, 3, 4]
    before = _files(workdir)
    with pytest.raises(ValueError, match="checkpoint at round 4, past "
                       "rounds=3") as err:
      _run(_config(rounds=3, checkpoint_every=1), workdir, no_tfds)
  assert "\n" not in str(err.value)
  assert _files(workdir) == before
  data_lib.clear_cache()


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


def test_fedavg_config_takes_every_run_setting():
  """Each run setting reaches FedAvg: values unlike FedAvgConfig's defaults,
  the server step checked on a gradient (server_lr, not client_lr)."""
  model = models.get_model("logreg", (4, 4, 1), 4)
  config = _config(clients_per_round=3, local_steps=4, batch_size=5,
                   client_lr=0.3, l2=0.02, weighting="size", replace=False,
                   defense_at="update", server_lr=0.5)
  fcfg = training.build_fedavg_config(config, model)
  assert (fcfg.clients_per_round, fcfg.local_steps, fcfg.local_epochs,
          fcfg.batch_size, fcfg.l2, fcfg.weighting, fcfg.replace,
          fcfg.defense_at, fcfg.defense) == (3, 4, 0, 5, 0.02, "size", False,
                                              "update", None)
  assert float(fcfg.client_lr(9)) == pytest.approx(0.3)
  g = {"w": np.array([2.0, -4.0], np.float32)}
  opt = fcfg.server_optimizer
  updates, _ = opt.update(g, opt.init(g), g)
  np.testing.assert_allclose(updates["w"], [-1.0, 2.0], rtol=1e-6)


def test_clients_per_round_may_equal_num_clients_without_replacement():
  """Sampling every client once is allowed; one more is refused."""
  check = training._check_config  # pylint: disable=protected-access
  check(_config(num_clients=4, clients_per_round=4, replace=False))
  with pytest.raises(ValueError, match="exceeds num_clients"):
    check(_config(num_clients=4, clients_per_round=5, replace=False))


def test_build_data_sizes_follow_the_partition_settings(mock_env):
  """iid clients hold samples_per_client examples, noniid ones
  classes_per_client * samples_per_class; the test split is cut to
  max_test_examples (the mock has NUM_MOCK per split) and batched by
  eval_batch, padding masked out."""
  config = _config(partition="iid", num_clients=3, samples_per_client=7,
                   samples_per_class=2, max_test_examples=30, eval_batch=20,
                   data_dir=str(mock_env / "data"))
  clients, test, _, fp = training.build_data(config, with_fingerprint=True)
  assert np.asarray(clients.sizes).tolist() == [7, 7, 7]
  assert (fp["train_examples"], fp["test_examples"]) == (NUM_MOCK, 30)
  assert np.asarray(test.mask).shape == (2, 20)
  assert float(np.asarray(test.mask).sum()) == 30
  config = _config(partition="noniid", num_clients=3, classes_per_client=2,
                   samples_per_class=4, samples_per_client=7,
                   data_dir=str(mock_env / "data"))
  clients, _, _ = training.build_data(config)
  assert np.asarray(clients.sizes).tolist() == [8, 8, 8]


def test_read_metrics_keeps_rounds_up_to_the_checkpoint_and_drops_torn(
    tmp_path):
  """_append_line appends one JSON line per call; read_metrics returns the
  complete lines with round <= upto_round (the checkpoint's round is kept),
  skipping a torn line, and [] for a workdir without metrics."""
  workdir = str(tmp_path)
  assert training.read_metrics(workdir) == []
  path = os.path.join(workdir, training.METRICS_FILE)
  for r in (1, 2, 3):
    training._append_line(path, {"round": r, "x": r / 2})  # pylint: disable=protected-access
  with open(path, "ab") as f:
    f.write(b'{"round": 4, "x"')  # Killed in the middle of a line.
  assert training.read_metrics(workdir) == [
      {"round": 1, "x": 0.5}, {"round": 2, "x": 1.0}, {"round": 3, "x": 1.5}]
  for upto, rounds in [(0, []), (2, [1, 2]), (3, [1, 2, 3]), (9, [1, 2, 3])]:
    assert [r["round"] for r in training.read_metrics(workdir, upto)] == rounds


def test_workdir_check_uses_the_latest_checkpoint_and_refuses_orphans(
    tmp_path):
  """A workdir may be resumed with rounds >= its latest checkpoint (the
  highest round, temporary folders ignored), not fewer; checkpoints without
  config.json are refused, an empty checkpoints/ folder is not."""
  check = training._check_workdir  # pylint: disable=protected-access
  config = _config(rounds=4)
  workdir = tmp_path / "run"
  folder = workdir / training.CHECKPOINT_DIR
  folder.mkdir(parents=True)
  assert not check(config, str(workdir))  # Empty checkpoints/: a new run.
  assert training.latest_checkpoint_round(str(workdir)) is None
  for name in ("2", "10", "4", "12.orbax-checkpoint-tmp-7"):
    (folder / name).mkdir()
  with pytest.raises(ValueError, match="checkpoint but no config.json"):
    check(config, str(workdir))
  (workdir / training.CONFIG_FILE).write_text(config.to_json())
  assert training.latest_checkpoint_round(str(workdir)) == 10
  for rounds in (10, 11):
    assert check(_config(rounds=rounds), str(workdir))
  with pytest.raises(ValueError, match="checkpoint at round 10, past "
                     "rounds=9"):
    check(_config(rounds=9), str(workdir))


def test_data_fingerprint_covers_labels_partition_and_test_labels():
  """Any change of the training labels, of the clients' indices (also one
  index moved to the next client) or of the test labels changes the
  SHA-256; the same data (lists or arrays) gives the same fingerprint."""
  train, test = data_lib.Source("tfds", "a"), data_lib.Source("sample", "b")
  labels, test_labels = [0, 1, 2, 1, 0], [2, 2, 0]
  partition = [[0, 1], [2], [3, 4]]

  def fp(labels=labels, partition=partition, test_labels=test_labels):
    return training.data_fingerprint(train, np.asarray(labels),
                                     [np.asarray(p) for p in partition],
                                     test, np.asarray(test_labels))

  base = fp()
  assert base == training.data_fingerprint(train, labels, partition, test,
                                            test_labels)
  assert {k: v for k, v in base.items() if k != "sha256"} == {
      "train_source": "tfds", "train_examples": 5, "test_source": "sample",
      "test_examples": 3}
  others = [fp(labels=[0, 1, 2, 1, 1]),
            fp(partition=[[0], [1, 2], [3, 4]]),  # Same concatenation.
            fp(partition=[[1, 0], [2], [3, 4]]),
            fp(test_labels=[2, 2, 1])]
  shas = {f["sha256"] for f in [base, *others]}
  assert len(shas) == 5


def test_build_data_evaluates_on_the_scaled_test_split(tmp_path, monkeypatch):
  """The eval batches hold the test split's first max_test_examples images
  (of the embedded sample: not its training images) scaled to [0, 1] with
  their labels, padding masked out; the partition follows the seed (the
  fingerprint tells seeds apart)."""
  monkeypatch.setenv("REPDEF_JAX_CACHE", str(tmp_path / "cache"))
  monkeypatch.setenv("REPDEF_JAX_OFFLINE", "1")
  monkeypatch.delenv("TFDS_DATA_DIR", raising=False)
  data_lib.clear_cache()
  config = _config(max_test_examples=40, eval_batch=16,
                   data_dir=str(tmp_path / "no_tfds"))
  with data_lib.allow_sample():
    _, test, _, fp = training.build_data(config, with_fingerprint=True)
    config.seed = 1
    _, _, _, fp1 = training.build_data(config, with_fingerprint=True)
  data_lib.clear_cache()
  images, labels = (a[:40] for a in data_lib.load_sample("mnist", "test"))
  assert not np.array_equal(images,
                            data_lib.load_sample("mnist", "train")[0][:40])
  assert fp["test_examples"] == 40
  mask = np.asarray(test.mask)
  assert mask.shape == (3, 16)
  mask = mask.reshape(-1).astype(bool)
  np.testing.assert_array_equal(mask, np.arange(48) < 40)
  x = np.asarray(test.x).reshape(-1, *images.shape[1:])[mask]
  y = np.asarray(test.y).reshape(-1)[mask]
  assert x.dtype == np.float32
  np.testing.assert_allclose(x, np.asarray(images, np.float64) / 255.0,
                             rtol=1e-6)
  np.testing.assert_array_equal(y, labels)
  assert fp1["sha256"] != fp["sha256"]


def test_fedavg_config_builds_the_configured_defense():
  """defense_strength reaches the defense (compression 50% zeroes the two
  smaller of four magnitudes, 0% none) and soteria_score reaches soteria
  (an unknown score is refused by soteria's own check)."""
  model = models.get_model("logreg", (4, 4, 1), 4)
  g = {"w": np.array([1.0, -2.0, 3.0, -4.0], np.float32)}
  for strength, want in [(0.0, [1.0, -2.0, 3.0, -4.0]),
                         (50.0, [0.0, 0.0, 3.0, -4.0])]:
    fcfg = training.build_fedavg_config(
        _config(defense="compression", defense_strength=strength), model)
    assert fcfg.defense.name == "compression"
    out, _ = fcfg.defense.apply(g, None, jax.random.key(0))
    np.testing.assert_array_equal(np.asarray(out["w"]), want)
  config = _config(defense="soteria", defense_strength=30.0)
  assert training.build_fedavg_config(config, model).defense.name == "soteria"
  config.soteria_score = "bogus"
  with pytest.raises(ValueError, match="score must be one of"):
    training.build_fedavg_config(config, model)


def test_soteria_q_reaches_the_defense():
  """soteria_q picks a registered perturbation: one that halves every
  representation row makes the defended kernel exactly half the gradient
  ('q0' at 0 % leaves it whole)."""
  from repdef_jax.defenses import soteria as soteria_lib  # pylint: disable=g-import-not-at-top
  name = "halve_for_test"

  def halve(ctx, strength):
    del strength
    return 0.5 * jnp.ones(ctx.scores.shape), {}

  soteria_lib.register_perturbation(name)(halve)
  try:
    model = models.get_model("mlp", (4, 4, 1), hidden=(6,))
    params = model.init(jax.random.key(0))
    x = jax.random.uniform(jax.random.key(1), (3, 4, 4, 1))
    y = jnp.array([0, 1, 2])
    g = gradients.batch_grad(model, params, x, y)
    batch = defenses.ClientBatch(params, x, y)
    for q, factor in [(name, 0.5), ("q0", 1.0)]:
      config = _config(defense="soteria", defense_strength=0.0, soteria_q=q)
      training._check_config(config)  # pylint: disable=protected-access
      defense = training.build_fedavg_config(config, model).defense
      out, _ = defense.apply(g, batch, jax.random.key(0))
      np.testing.assert_allclose(out["head"]["kernel"],
                                 factor * g["head"]["kernel"], rtol=1e-6)
  finally:
    soteria_lib.PERTURBATIONS.pop(name)
  # The config holds a name: '0' is refused with the names it can take.
  config = _config(defense="soteria", defense_strength=50.0, soteria_q="0")
  with pytest.raises(ValueError, match=r"soteria_q must name a registered "
                     r"perturbation, one of \('q0'.*got '0'") as err:
    training._check_config(config)  # pylint: disable=protected-access
  assert "integer" not in str(err.value)


def test_a_run_saved_before_a_setting_existed_resumes(tmp_path):
  """A run saved before a setting of training.ADDED_KEYS existed resumes
  (its config is read with the value it ran with); another value of the
  setting is refused (the paper's cells: test_paper_harness.py)."""
  config = _config()
  workdir = tmp_path / "run"
  workdir.mkdir()
  old = json.loads(config.to_json())
  for key in training.ADDED_KEYS:
    del old[key]
  (workdir / training.CONFIG_FILE).write_text(json.dumps(old))
  assert training._check_workdir(config, str(workdir))  # pylint: disable=protected-access
  with pytest.raises(ValueError, match="soteria_q: 'q0' -> 'q9'"):
    training._check_workdir(_config(soteria_q="q9"), str(workdir))  # pylint: disable=protected-access


def test_saver_keeps_the_last_checkpoints_and_restores_the_latest(tmp_path):
  """Saves at rounds 1..4 with keep=2 leave checkpoints 3 and 4; restoring
  (and load_checkpoint) without a step gives the highest round, with a
  step that round."""
  workdir = str(tmp_path / "run")

  def state(r):
    return {"round": np.array(r, np.int32), "w": np.full(3, r, np.float32)}

  saver = training._Saver(training._checkpoint_manager(workdir, keep=2))  # pylint: disable=protected-access
  try:
    for r in (1, 2, 3, 4):
      saver.save(r, state(r))
  finally:
    saver.close()
  assert sorted(os.listdir(os.path.join(workdir, training.CHECKPOINT_DIR))
                ) == ["3", "4"]
  manager = training._checkpoint_manager(workdir, keep=2)  # pylint: disable=protected-access
  try:
    for step, want in [(None, 4), (3, 3)]:
      got = training._restore_checkpoint(manager, state(0), step)  # pylint: disable=protected-access
      assert int(got["round"]) == want
      np.testing.assert_array_equal(np.asarray(got["w"]), [want] * 3)
  finally:
    manager.close()
  for step, want in [(None, 4), (3, 3)]:
    assert int(training.load_checkpoint(workdir, step)["round"]) == want
  assert training.load_checkpoint(str(tmp_path / "empty")) is None


def test_last_round_is_checkpointed_logged_and_global_loss_kept(mock_env,
                                                                capsys):
  """rounds=3, checkpoint_every=2: checkpoints 2 and 3 (the last round even
  off the cadence); log_every=2 prints rounds 2 and 3 only; with
  eval_global_loss every metrics line has the federated objective."""
  workdir = mock_env / "odd"
  out = _run(_config(rounds=3, checkpoint_every=2, log_every=2,
                     eval_global_loss=True), workdir, mock_env / "data")
  assert sorted(os.listdir(workdir / training.CHECKPOINT_DIR)) == ["2", "3"]
  final = training.load_checkpoint(str(workdir))
  assert int(final["round"]) == 3
  for a, b in zip(jax.tree_util.tree_leaves(final["params"]),
                  jax.tree_util.tree_leaves(out["state"].params)):
    np.testing.assert_array_equal(a, np.asarray(b))
  printed = [line.split()[1] for line in capsys.readouterr().out.splitlines()
             if line.startswith("round ")]
  assert printed == ["2/3", "3/3"]
  assert [r["round"] for r in out["metrics"]] == [1, 2, 3]
  assert all(np.isfinite(r["global_loss"]) and r["global_loss"] > 0
             for r in out["metrics"])

def _dirichlet_config(**overrides):
  c = training.default_config()
  c.update(partition="dirichlet", num_clients=5, dirichlet_alpha=0.5, seed=0)
  c.update(overrides)
  return c


def test_dirichlet_partition_follows_the_configured_alpha_and_seed():
  """partition='dirichlet' splits with the run's dirichlet_alpha and seed:
  the clients are partition.dirichlet's for those values, and another alpha
  or seed gives another split (alpha 0.05: most clients hold one or two
  classes; alpha 100: every client holds nearly every class)."""
  labels = np.repeat(np.arange(10), 60)
  for alpha, seed in [(0.05, 0), (100.0, 0), (0.5, 3)]:
    got = training.client_indices(
        _dirichlet_config(dirichlet_alpha=alpha, seed=seed), labels, 10)
    want = partition_lib.dirichlet(labels, num_clients=5, alpha=alpha,
                                   seed=seed)
    assert len(got) == len(want) == 5
    for g, w in zip(got, want):
      np.testing.assert_array_equal(g, w)
  skewed = partition_lib.class_counts(labels, training.client_indices(
      _dirichlet_config(dirichlet_alpha=0.05), labels, 10), 10)
  flat = partition_lib.class_counts(labels, training.client_indices(
      _dirichlet_config(dirichlet_alpha=100.0), labels, 10), 10)
  # Share of each client's examples in its largest class.

  def top(c):
    return np.mean(c.max(1) / np.maximum(c.sum(1), 1))

  assert top(skewed) > 0.5 > 0.2 > top(flat)
  seeds = [training.client_indices(_dirichlet_config(seed=s), labels, 10)
           for s in (0, 1)]
  assert any(not np.array_equal(a, b) for a, b in zip(*seeds))


# --------------------------------------------------------------------------
# fedavg round: sampling, metrics.
