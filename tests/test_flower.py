"""Flower integration: equivalence with make_round, the defense mod, auditing.

Skipped (with the reason) when Flower is not installed:
``pip install -e '.[flower]'``. The in-process runs use
:class:`repdef_jax.integrations.flower.InProcessGrid` (Flower's strategy,
ServerApp, ClientApp, mods and message serialization, without Ray); the
slow test runs the example app on Flower's deployment engine.
"""

import json
import os
import shutil
import socket
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from repdef_jax import attacks
from repdef_jax import defenses
from repdef_jax import fedavg
from repdef_jax import gradients
from repdef_jax import models
from tree_checks import max_diff

_ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")


@pytest.fixture(name="fl")
def _flower():
  pytest.importorskip(
      "flwr", reason="Flower is not installed (pip install -e '.[flower]')")
  from repdef_jax.integrations import flower  # pylint: disable=g-import-not-at-top
  return flower


def _clients(n, m, seed=0, shape=(28, 28, 1)):
  rng = np.random.default_rng(seed)
  x = rng.random((n, m, *shape), dtype=np.float32)
  y = rng.integers(0, 10, (n, m)).astype(np.int32)
  return x, y, np.ones((n, m), np.float32)


def _loader(fl, x, y, mask):
  def load(context):
    i = fl.client_id(context)
    return x[i], y[i], mask[i]
  return load


def _server(fl, strategy, initial, num_rounds, out):
  from flwr.serverapp import ServerApp  # pylint: disable=g-import-not-at-top
  app = ServerApp()

  @app.main()
  def main(grid, context):
    del context
    out["result"] = strategy.start(grid=grid, initial_arrays=initial,
                                   num_rounds=num_rounds)

  return app


def test_import_repdef_jax_does_not_import_flower():
  code = ("import sys, repdef_jax, repdef_jax.integrations; "
          "assert 'flwr' not in sys.modules")
  subprocess.run([sys.executable, "-c", code], check=True, cwd=_ROOT,
                 env={**os.environ, "JAX_PLATFORMS": "cpu"})


def test_flower_rounds_match_make_round(fl):
  """4 Flower clients x 3 rounds (Soteria at every local step) = make_round."""
  from flwr.serverapp.strategy import FedAvg  # pylint: disable=g-import-not-at-top
  model = models.get_model("logreg", (28, 28, 1), 10)
  x, y, mask = _clients(4, 6)
  config = fedavg.FedAvgConfig(
      clients_per_round=4, local_steps=2, batch_size=3, client_lr=0.1,
      weighting="uniform",
      defense=defenses.get_defense("soteria", 60.0, model=model))
  keys = fedavg.key_streams(0)
  state = fedavg.init(model, config, keys.init)
  round_fn = fedavg.make_round(model, config)
  data = fedavg.ClientArrays(jnp.asarray(x), jnp.asarray(y), jnp.asarray(mask))
  ref = state
  for _ in range(3):
    ref, metrics = round_fn(ref, data, keys, client_ids=np.arange(4))

  out = {}
  strategy = FedAvg(fraction_evaluate=0.0, min_train_nodes=4,
                    min_available_nodes=4)
  fl.run_in_process(
      _server(fl, strategy, fl.to_arrays(state.params), 3, out),
      fl.make_client_app(model, config, _loader(fl, x, y, mask), seed=0), 4)
  result = out["result"]
  params = fl.from_arrays(result.arrays, state.params)
  diff = max_diff(params, ref.params)
  assert diff <= 1e-6, diff
  assert max_diff(params, state.params) > 1e-3  # It trained.
  last = result.train_metrics_clientapp[3]
  assert abs(last["train_loss"] - float(metrics["train_loss"])) <= 1e-5
  assert abs(last["defense/effective_pruned_fraction"] - float(
      metrics["defense/effective_pruned_fraction"])) <= 1e-6
  assert fl.array_keys(state.params) == ["head/bias", "head/kernel"]


def _stub_attack(record):
  """An attack for AuditingFedAvg that reconstructs zeros (28x28x1 images)
  with final loss ``record(grads, num_images, key)``."""
  from repdef_jax.attacks import base as attack_base  # pylint: disable=g-import-not-at-top

  class Stub:

    @staticmethod
    def make_config(config, **overrides):
      del config, overrides

    @staticmethod
    def fn(model, params, grads, num, key, labels=None, config=None):
      del model, params, labels, config
      return attack_base.AttackResult(
          x_rec=np.zeros((num, 28, 28, 1), np.float32),
          labels_rec=np.zeros((num,), np.int32), loss_history=np.zeros(1),
          final_loss=record(grads, num, key), diverged=False, iterations=1)

  return Stub


def _train_message(fl, params, dst_node_id=2, arrays=None, **config):
  """Round 1's train message carrying ``params`` (or the record ``arrays``
  as given); build it after the grid, whose run id it takes."""
  from flwr.app import ConfigRecord, Message, MessageType, RecordDict  # pylint: disable=g-import-not-at-top
  return Message(RecordDict({
      "arrays": fl.to_arrays(params) if arrays is None else arrays,
      "config": ConfigRecord({"server-round": 1, **config})}),
                 dst_node_id=dst_node_id, message_type=MessageType.TRAIN)


def test_defense_mod_equals_update_defense_and_composes_with_clipping(fl):
  """Soteria in the mod equals Soteria inside the client on an MLP, whose
  representation (and so the mask) depends on the parameters sent, not the
  ones returned; Flower's clipping mod composes with it."""
  from flwr.clientapp.mod import fixedclipping_mod  # pylint: disable=g-import-not-at-top
  model = models.get_model("mlp", (28, 28, 1), 10, hidden=(20,))
  x, y, mask = _clients(1, 5, seed=1)
  load = _loader(fl, x, y, mask)
  soteria = defenses.get_defense("soteria", 70.0, model=model)
  plain = fedavg.FedAvgConfig(local_steps=2, batch_size=5, client_lr=0.1)
  params = model.init(jax.random.key(3))

  def reply(app, **config):
    grid = fl.InProcessGrid(app, 1)
    [r] = grid.send_and_receive([_train_message(fl, params, **config)])
    assert not r.has_error(), r.error
    rec = r.content
    return (fl.from_arrays(rec["arrays"], params),
            dict(next(iter(rec.metric_records.values()))))

  # Inside the client (defense_at='update') == the mod around a plain client.
  inside, m_in = reply(fl.make_client_app(
      model, fedavg.FedAvgConfig(local_steps=2, batch_size=5, client_lr=0.1,
                                 defense=soteria, defense_at="update"), load))
  mod = fl.defense_mod(soteria, model=model, load_data=load)
  around, m_mod = reply(fl.make_client_app(model, plain, load, mods=[mod]))
  assert max_diff(inside, around) <= 1e-6
  assert m_mod["defense/pruned_fraction"] == pytest.approx(
      m_in["defense/pruned_fraction"])
  assert m_mod["defense/pruned_fraction"] > 0.5
  update = np.asarray(around["head"]["kernel"] - params["head"]["kernel"])
  pruned = np.all(update == 0, axis=1)
  assert pruned.mean() >= 0.7  # Whole feature rows of the head are zero.

  # Flower's client-side clipping mod outside it: clipped, still pruned.
  clip = 1e-3
  clipped, _ = reply(fl.make_client_app(
      model, plain, load, mods=[fixedclipping_mod, mod]), clipping_norm=clip)
  delta = jax.tree_util.tree_map(jnp.subtract, clipped, params)
  norm = float(jnp.sqrt(sum(jnp.sum(d ** 2) for d in
                            jax.tree_util.tree_leaves(delta))))
  full = jax.tree_util.tree_map(jnp.subtract, around, params)
  full_norm = float(jnp.sqrt(sum(jnp.sum(d ** 2) for d in
                                 jax.tree_util.tree_leaves(full))))
  assert full_norm > clip and norm == pytest.approx(clip, rel=1e-4)
  assert np.all(np.asarray(delta["head"]["kernel"])[pruned] == 0)
  np.testing.assert_allclose(
      np.asarray(delta["head"]["kernel"]),
      # Deltas are read back as (params + delta) - params: float32
      # rounding at the parameters' magnitude (< 1), ~6e-8.
      np.asarray(full["head"]["kernel"]) * clip / full_norm, atol=1e-7)


def test_defense_mod_reads_arrays_by_key_and_names_what_is_missing(fl):
  """A server whose ArrayRecord lists the arrays in another order gets the
  same defended reply; Soteria in a mod given no load_data says so."""
  from flwr.app import ArrayRecord  # pylint: disable=g-import-not-at-top
  model = models.get_model("mlp", (28, 28, 1), 10, hidden=(8,))
  x, y, mask = _clients(1, 4, seed=4)
  load = _loader(fl, x, y, mask)
  soteria = defenses.get_defense("soteria", 50.0, model=model)
  plain = fedavg.FedAvgConfig(local_steps=1, batch_size=4, client_lr=0.1)
  params = model.init(jax.random.key(5))

  def train(app, arrays):
    grid = fl.InProcessGrid(app, 1)
    [r] = grid.send_and_receive([_train_message(fl, None, arrays=arrays)])
    return r

  app = fl.make_client_app(model, plain, load, mods=[
      fl.defense_mod(soteria, model=model, load_data=load)])
  arrays = fl.to_arrays(params)
  reordered = ArrayRecord({k: arrays[k] for k in reversed(arrays.keys())})
  assert list(reordered.keys()) != list(arrays.keys())
  a, b = train(app, arrays), train(app, reordered)
  assert not a.has_error() and not b.has_error(), b.error
  assert max_diff(fl.from_arrays(a.content["arrays"], params),
                  fl.from_arrays(b.content["arrays"], params)) == 0.0
  blind = fl.make_client_app(model, plain, load, mods=[
      fl.defense_mod(soteria, model=model)])
  r = train(blind, arrays)
  assert r.has_error()
  assert ("defense 'soteria' failed on an update given without load_data="
          in r.error.reason), r.error.reason


def test_defense_mod_draws_the_clients_noise_key_and_counts_real_examples(fl):
  """A noisy update defense in the mod draws what the client draws inside
  (fedavg.client_keys of round - 1 and the partition id): node 3 is
  partition 1 of 2, in round 2. Its last 2 of 5 examples are padding: the
  reply's num-examples (Flower's weight) is 3."""
  model = models.get_model("logreg", (28, 28, 1), 10)
  x, y, mask = _clients(2, 5, seed=2)
  mask[1, 3:] = 0.0
  load = _loader(fl, x, y, mask)
  noise = defenses.get_defense("dp_gaussian", 0.01)
  plain = fedavg.FedAvgConfig(local_steps=2, batch_size=5, client_lr=0.1)
  params = model.init(jax.random.key(4))

  def reply(app):
    grid = fl.InProcessGrid(app, 2)
    [r] = grid.send_and_receive([_train_message(
        fl, params, dst_node_id=3, **{"server-round": 2})])
    assert not r.has_error(), r.error
    return (fl.from_arrays(r.content["arrays"], params),
            dict(next(iter(r.content.metric_records.values()))))

  inside, m_in = reply(fl.make_client_app(model, fedavg.FedAvgConfig(
      local_steps=2, batch_size=5, client_lr=0.1, defense=noise,
      defense_at="update"), load))
  around, m_mod = reply(fl.make_client_app(
      model, plain, load, mods=[fl.defense_mod(noise, model=model)]))
  undefended, _ = reply(fl.make_client_app(model, plain, load))
  assert max_diff(inside, around) <= 1e-6
  assert max_diff(around, undefended) > 1e-3  # The noise is there.
  assert m_in["num-examples"] == m_mod["num-examples"] == 3


def test_auditing_strategy_breaks_undefended_update_not_soteria(fl, tmp_path):
  """GS (300 iterations) on the one-image update of a logistic regression:
  the undefended image comes back (PSNR > 40 dB in [0, 1]; measured 52);
  Soteria's 80 % makes it fail (measured 4.5 dB)."""
  from flwr.serverapp.strategy import FedAvg  # pylint: disable=g-import-not-at-top
  model = models.get_model("logreg", (28, 28, 1), 10)
  rng = np.random.default_rng(0)
  x = np.repeat(np.repeat(rng.random((1, 1, 7, 7, 1), dtype=np.float32), 4,
                          axis=2), 4, axis=3)  # A smooth 28x28 image.
  y = np.array([[3]], np.int32)
  mask = np.ones((1, 1), np.float32)
  params = model.init(jax.random.key(0))
  results = {}
  for name in ("none", "soteria"):
    config = fedavg.FedAvgConfig(
        local_steps=1, batch_size=1, client_lr=0.1,
        defense=(None if name == "none" else
                 defenses.get_defense("soteria", 80.0, model=model)))
    strategy = fl.AuditingFedAvg(
        model, "gs", client_lr=0.1,
        attack_overrides={"iterations": 300, "restarts": 1},
        reference_data=lambda pid: (x[pid], y[pid]),
        workdir=str(tmp_path / name), fraction_evaluate=0.0,
        min_train_nodes=1, min_available_nodes=1)
    out = {}
    fl.run_in_process(
        _server(fl, strategy, fl.to_arrays(params), 1, out),
        fl.make_client_app(model, config, _loader(fl, x, y, mask)), 1)
    [record] = strategy.audit_log
    assert record["pixel_space"] == "[0,1]" and record["client"] == 0
    assert out["result"].train_metrics_clientapp[1]["audit/psnr"] == (
        pytest.approx(record["psnr"]))
    assert os.path.exists(tmp_path / name / "round_001_client_0.png")
    assert len(open(tmp_path / name / "audit.jsonl").readlines()) == 1
    results[name] = record
  assert results["none"]["psnr"] > 40, results
  assert results["none"]["mse"] < 1e-4, results
  assert results["soteria"]["mse"] > 0.05, results
  assert results["soteria"]["psnr"] < 15, results
  assert issubclass(fl.AuditingFedAvg, FedAvg)


def test_bad_flower_inputs_fail_clearly(fl):
  model = models.get_model("logreg", (28, 28, 1), 10)
  with pytest.raises(ValueError, match="Unknown attack 'nope'; valid attacks:"):
    fl.AuditingFedAvg(model, "nope", client_lr=0.1)
  for lr in (np.float32(0.05), np.array(0.05), jnp.float32(0.05)):
    assert fl.AuditingFedAvg(model, "dlg", client_lr=lr).client_lr == (
        pytest.approx(0.05))
  for bad in (0.0, "0.1", True, float("nan"), np.array([0.1, 0.2])):
    with pytest.raises(ValueError, match="client_lr must be a finite number "
                       "> 0"):
      fl.AuditingFedAvg(model, "dlg", client_lr=bad)
  for bad in (0, -1, 1.5):
    with pytest.raises(ValueError, match="max_audits_per_round must be an "
                       "int >= 1 or None"):
      fl.AuditingFedAvg(model, "dlg", client_lr=0.1,
                        max_audits_per_round=bad)
  # The attack's config is checked when the strategy is built, not after
  # the first training round.
  with pytest.raises(TypeError, match="Unknown setting.*iterations.*'dlg'"):
    fl.AuditingFedAvg(model, "dlg", client_lr=0.1,
                      attack_overrides={"iterations": 500})
  with pytest.raises(ValueError, match="Attack 'gs' takes a GSConfig"):
    fl.AuditingFedAvg(model, "gs", client_lr=0.1,
                      attack_config=attacks.DLGConfig())
  with pytest.raises(ValueError, match="repinfer_steps"):
    fl.AuditingFedAvg(model, "repinfer", client_lr=0.1,
                      attack_overrides={"outer_steps": 5})
  for name, bad in (("num_images", 0), ("repinfer_steps", -3),
                    ("seed", "x"), ("seed", 1.5)):
    with pytest.raises(ValueError, match=name):
      fl.AuditingFedAvg(model, "dlg", client_lr=0.1, **{name: bad})
  assert fl.AuditingFedAvg(model, "gs", client_lr=0.1, attack_overrides={
      "iterations": 7})._attack_config.iterations == 7
  with pytest.raises(ValueError, match="defense must be a repdef_jax Defense"):
    fl.defense_mod("soteria", model=model)
  params = model.init(jax.random.key(0))
  with pytest.raises(ValueError, match="do not match the model's parameters"):
    fl.from_arrays(fl.to_arrays({"head": {"kernel": np.zeros((784, 10))}}),
                   params)
  with pytest.raises(ValueError, match=r"'head/kernel' has shape \(64, 10\)"):
    fl.from_arrays(fl.to_arrays({"head": {"bias": np.zeros(10),
                                          "kernel": np.zeros((64, 10))}}),
                   params)


def _free_port():
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


@pytest.mark.slow
def test_example_app_on_flower_deployment_engine(fl, tmp_path):
  """SuperLink + 2 SuperNodes on localhost; `flwr run` the example app."""
  del fl
  bindir = os.path.dirname(sys.executable)
  app = tmp_path / "flower_app"
  shutil.copytree(os.path.join(_ROOT, "examples", "flower_app"), app)
  home = tmp_path / "flwr_home"
  home.mkdir()
  link_port = _free_port()
  env = {**os.environ, "FLWR_HOME": str(home), "JAX_PLATFORMS": "cpu",
         "REPDEF_JAX_OFFLINE": "1", "TFDS_DATA_DIR": str(tmp_path / "none"),
         "REPDEF_JAX_CACHE": str(tmp_path / "cache"),
         "PYTHONPATH": os.pathsep.join(
             [_ROOT, os.environ.get("PYTHONPATH", "")])}
  (home / "config.toml").write_text(
      '[superlink]\ndefault = "local-deployment"\n\n'
      '[superlink.local-deployment]\n'
      f'address = "127.0.0.1:{link_port}"\ninsecure = true\n')
  procs = []
  logs = []

  def start(name, *args):
    log = open(tmp_path / f"{name}.log", "w")
    logs.append((name, tmp_path / f"{name}.log"))
    procs.append(subprocess.Popen([os.path.join(bindir, args[0]), *args[1:]],
                                  env=env, stdout=log, stderr=log,
                                  cwd=tmp_path))

  try:
    start("superlink", "flower-superlink", "--insecure",
          "--disable-runtime-dependency-installation", "--port",
          str(link_port))
    time.sleep(5)
    for i in range(2):
      start(f"supernode{i}", "flower-supernode", "--insecure",
            "--superlink", f"127.0.0.1:{link_port}", "--port",
            str(_free_port()), "--node-config",
            f"partition-id={i} num-partitions=2")
    run = subprocess.run(
        [os.path.join(bindir, "flwr"), "run", str(app), "local-deployment",
         "--stream", "--run-config",
         "num-server-rounds=2 sample-data=true samples-per-class=10 "
         "max-test-examples=100 attack='repinfer' attack-iterations=20 "
         f"audit-dir='{tmp_path / 'audit'}'"],
        env=env, capture_output=True, text=True, timeout=900, check=False)
    out = run.stdout + run.stderr
    assert run.returncode == 0, out[-4000:]
    assert "repdef_flower_app: final test accuracy" in out, out[-4000:]
    assert (tmp_path / "audit" / "audit.jsonl").exists()
  finally:
    for p in procs:
      p.terminate()
    for p in procs:
      try:
        p.wait(timeout=30)
      except subprocess.TimeoutExpired:
        p.kill()
    for name, path in logs:
      print(f"---- {name}\n{open(path).read()[-3000:]}")


def test_restarted_auditor_keeps_the_earlier_records(fl, tmp_path):
  """A server killed mid-run leaves audit.jsonl; a new auditor on the same
  workdir appends to its records (the first audit used to overwrite them)
  and refuses a log written by another attack or seed."""
  model = models.get_model("logreg", (28, 28, 1), 10)
  earlier = [{"round": r, "client": 0, "attack": "dlg", "seed": 0}
             for r in (1, 2)]
  (tmp_path / "audit.jsonl").write_text(
      "".join(json.dumps(r) + "\n" for r in earlier))
  strategy = fl.AuditingFedAvg(model, "dlg", client_lr=0.1,
                               workdir=str(tmp_path))
  assert strategy.audit_log == earlier and strategy.server_start == 2
  for kw in ({"attack": "gs"}, {"attack": "dlg", "seed": 3},
             {"attack": "dlg", "run_info": {"defense": "none"}}):
    with pytest.raises(ValueError, match=r"holds an audit by attack 'dlg', "
                       r"seed 0, run_info None; this one is .*use another "
                       r"workdir"):
      fl.AuditingFedAvg(model, client_lr=0.1, workdir=str(tmp_path), **kw)
  # Records of a run with run_info (the clients' defense): another defense
  # on the same workdir is refused, the same one is the next start.
  info = {"defense": "soteria", "defense-strength": 80.0}
  (tmp_path / "audit.jsonl").write_text("".join(
      json.dumps({**r, "start": 3, "run": info}) + "\n" for r in earlier))
  again = fl.AuditingFedAvg(model, "dlg", client_lr=0.1, run_info=info,
                            workdir=str(tmp_path))
  assert again.server_start == 4
  with pytest.raises(ValueError, match="run_info {'defense': 'none'}"):
    fl.AuditingFedAvg(model, "dlg", client_lr=0.1, workdir=str(tmp_path),
                      run_info={"defense": "none"})
  with pytest.raises(ValueError, match="run_info must be a dict"):
    fl.AuditingFedAvg(model, "dlg", client_lr=0.1, run_info="soteria")
  with pytest.raises(ValueError, match="run_info must be JSON-ready"):
    fl.AuditingFedAvg(model, "dlg", client_lr=0.1, run_info={"f": print})


def test_audit_key_is_its_own_stream(fl):
  """The auditor's attack keys never equal a key of the FedAvg run it
  audits: neither a stream of fedavg.key_streams nor a round's or a
  client's key derived from them (the old fold_in(fold_in(key(seed),
  round), client) had fold_in(key(seed), round) = stream ``round``)."""
  data = lambda k: tuple(np.asarray(jax.random.key_data(k)).ravel())
  for seed in (0, 7):
    keys = fedavg.key_streams(seed)
    fedavg_keys = {data(k) for k in keys}
    for r in range(6):
      fedavg_keys |= {data(jax.random.fold_in(k, r)) for k in keys}
      for c in range(4):
        fedavg_keys |= {data(k) for k in fedavg.client_keys(keys, r, c)}
    audit = {data(fl.audit_key(seed, r, c)) for r in range(6)
             for c in range(4)}
    audit_rounds = {data(jax.random.fold_in(jax.random.fold_in(
        jax.random.key(seed), len(fedavg.STREAMS)), r)) for r in range(6)}
    assert len(audit) == 24
    assert not (audit | audit_rounds) & fedavg_keys


def test_audit_divides_the_update_by_lr_times_local_steps(fl, monkeypatch,
                                                          tmp_path):
  """With 3 local steps the gradient handed to the attack is
  -delta / (lr * 3), delta the client's update (here the new global model
  minus the old: one client); a stub attack records what it receives."""
  model = models.get_model("logreg", (28, 28, 1), 10)
  x, y, mask = _clients(1, 3)
  params = model.init(jax.random.key(0))
  seen = []
  stub = _stub_attack(lambda grads, num, key: seen.append(grads) or 0.0)
  monkeypatch.setattr(fl.attacks_lib, "get_attack", lambda name: stub)
  config = fedavg.FedAvgConfig(local_steps=3, batch_size=1, client_lr=0.1)
  strategy = fl.AuditingFedAvg(
      model, "dlg", client_lr=0.1, workdir=str(tmp_path),
      fraction_evaluate=0.0, min_train_nodes=1, min_available_nodes=1)
  out = {}
  fl.run_in_process(
      _server(fl, strategy, fl.to_arrays(params), 1, out),
      fl.make_client_app(model, config, _loader(fl, x, y, mask)), 1)
  [grads] = seen
  new = fl.from_arrays(out["result"].arrays, params)
  delta = jax.tree_util.tree_map(lambda a, b: a - b, new, params)
  expected = jax.tree_util.tree_map(lambda d: -d / (0.1 * 3), delta)
  assert max_diff(delta, jax.tree_util.tree_map(jnp.zeros_like, delta)) > 0
  assert max_diff(grads, expected) < 1e-5


def _example_app():
  """The example app's modules and its default run config."""
  import tomllib  # pylint: disable=g-import-not-at-top
  app_dir = os.path.join(_ROOT, "examples", "flower_app")
  if app_dir not in sys.path:
    sys.path.insert(0, app_dir)
  from repdef_flower_app import server_app, task  # pylint: disable=g-import-not-at-top
  with open(os.path.join(app_dir, "pyproject.toml"), "rb") as f:
    cfg = tomllib.load(f)["tool"]["flwr"]["app"]["config"]
  return server_app, task, cfg


def test_example_app_refuses_bad_run_config_and_untrained_rounds(fl):
  """A run-config typo stops the ServerApp before the first round, naming
  the key; a run in which no client trained raises instead of printing the
  untrained model's accuracy."""
  from flwr.clientapp import ClientApp  # pylint: disable=g-import-not-at-top
  server_app, task, cfg = _example_app()
  # The embedded images when no prepared copy is found (no TFDS needed;
  # they hold 5 per class for 2 nodes); infeasible splits either way.
  cfg = {**cfg, "sample-data": True, "samples-per-class": 5}
  task.check(cfg, 2)
  for key, value, match in (
      ("seed", "a", "run-config seed must be an integer >= 0, got 'a'"),
      ("num-server-rounds", 0, "run-config num-server-rounds must be an "
       "integer >= 1, got 0"),
      ("attack-images", -1, "attack-images must be an integer >= 0"),
      ("max-test-examples", -5, "max-test-examples must be an integer"),
      ("lr", "x", "run-config lr must be a number, got 'x'"),
      ("sample-data", "false", "sample-data must be true or false"),
      ("classes-per-client", 11, "run-config classes-per-client / "
       "samples-per-class / sample-data"),
      ("samples-per-class", 10000, "run-config classes-per-client / "
       "samples-per-class / sample-data"),
      ("defense-at", "foo", r"run-config defense-at must be one of "
       r"\('step', 'update', 'mod'\), got 'foo'"),
      ("fraction-train", 2.0, r"run-config fraction-train must be in "
       r"\(0, 1\], got 2.0"),
      ("defense", "Soteria", "run-config defense / defense-strength: "
       "Unknown defense name 'Soteria'"),
      ("model", "resnet", "run-config dataset / model: Unknown model name"),
      ("local-steps", 0, "run-config local-steps must be an integer >= 1"),
      ("lr", -0.1, "run-config local-steps / batch-size / lr: client_lr"),
      ("attack", "dgl", "run-config attack must be one of"),
      ("audit-clients-per-round", 0,
       "run-config audit-clients-per-round must be an integer >= 1, got 0")):
    with pytest.raises(ValueError, match=match):
      task.check({**cfg, key: value}, 2)
  broken = ClientApp()

  @broken.train()
  def train(message, context):
    raise RuntimeError("this client cannot train")

  run = {**cfg, "num-server-rounds": 1, "attack": "none",
         "samples-per-class": 5, "max-test-examples": 20}
  with pytest.raises(RuntimeError, match=r"no client returned a training "
                     r"update in round\(s\) \[1\]"):
    fl.run_in_process(server_app.app, broken, 2, run_config=run)


def test_arrays_round_trip_by_key_with_the_templates_dtypes(fl):
  """Leaves map to their flattened paths in tree order (a 12-leaf list: the
  path 'layers/10' sorts before 'layers/2' as a string, not as a leaf), a
  record is read by key whatever its insertion order, and a half-precision
  record comes back in the template's dtype."""
  tree = {"layers": [np.full((2,), i, np.float32) for i in range(12)],
          "scale": np.arange(3, dtype=np.float32)}
  keys = [f"layers/{i}" for i in range(12)] + ["scale"]
  assert fl.array_keys(tree) == keys
  record = fl.to_arrays(tree)
  assert list(record.keys()) == keys
  for i in range(12):
    np.testing.assert_array_equal(record[f"layers/{i}"].numpy(), [i, i])
  back = fl.from_arrays(record, tree)
  for i in range(12):
    np.testing.assert_array_equal(back["layers"][i], [i, i])
  np.testing.assert_array_equal(back["scale"], [0, 1, 2])
  from flwr.app import Array, ArrayRecord  # pylint: disable=g-import-not-at-top
  shuffled = ArrayRecord({k: Array(record[k].numpy().astype(np.float16))
                          for k in reversed(keys)})
  back = fl.from_arrays(shuffled, tree)
  for i in range(12):
    assert back["layers"][i].dtype == jnp.float32
    np.testing.assert_array_equal(back["layers"][i], [i, i])
  assert back["scale"].dtype == jnp.float32
  np.testing.assert_array_equal(back["scale"], [0, 1, 2])


def _logreg_params(seed, kernel_std, bias_std):
  """Random parameters of the 28x28x1, 10-class logistic regression (its
  ``init`` is all zeros): normal draws of a NumPy generator of ``seed``."""
  rng = np.random.default_rng(seed)
  return {"head": {
      "kernel": rng.normal(0, kernel_std, (784, 10)).astype(np.float32),
      "bias": rng.normal(0, bias_std, (10,)).astype(np.float32)}}


def test_client_app_evaluate_is_the_masked_mean_over_real_examples(fl):
  """An evaluate message: loss and accuracy of a logistic regression over
  the 3 real of 5 examples (NumPy reference), and num-examples 3."""
  from flwr.app import Message, MessageType, RecordDict  # pylint: disable=g-import-not-at-top
  model = models.get_model("logreg", (28, 28, 1), 10)
  x, y, mask = _clients(1, 5, seed=5)
  mask[0, 3:] = 0.0
  params = _logreg_params(5, 0.05, 0.1)  # logreg's init is zero.
  w = np.asarray(params["head"]["kernel"], np.float64)
  b = np.asarray(params["head"]["bias"], np.float64)
  logits = x[0].reshape(5, -1).astype(np.float64) @ w + b
  pred = np.argmax(logits, -1)
  y[0] = (pred + 1) % 10  # All wrong ...
  y[0, :2] = pred[:2]  # ... but the first 2: 2 of 3 real right.
  y[0, 3:] = pred[3:]  # Padding right: must not count.
  top = logits.max(-1, keepdims=True)
  logp = logits - top - np.log(np.sum(np.exp(logits - top), -1,
                                      keepdims=True))
  ce = -logp[np.arange(5), y[0]]
  app = fl.make_client_app(
      model, fedavg.FedAvgConfig(local_steps=1, batch_size=5, client_lr=0.1),
      _loader(fl, x, y, mask))
  grid = fl.InProcessGrid(app, 1)
  [r] = grid.send_and_receive([Message(
      RecordDict({"arrays": fl.to_arrays(params)}), dst_node_id=2,
      message_type=MessageType.EVALUATE)])
  assert not r.has_error(), r.error
  m = dict(next(iter(r.content.metric_records.values())))
  assert m["num-examples"] == 3
  assert m["eval_accuracy"] == pytest.approx(2 / 3, abs=1e-6)
  assert m["eval_loss"] == pytest.approx(ce[:3].mean(), rel=1e-4)


def test_client_app_noise_follows_the_seed_and_the_mod_silences_empty_nodes(
    fl):
  """Two apps of one model and config but seeds 0 and 1 draw different
  noise (seed 0 twice: the same); a node whose examples are all padding
  sends no update, also when defense_mod adds Gaussian noise around it
  (told by load_data's mask, or else by the reply's num-examples)."""
  model = models.get_model("logreg", (28, 28, 1), 10)
  x, y, mask = _clients(2, 4, seed=6)
  mask[1] = 0.0
  load = _loader(fl, x, y, mask)
  noise = defenses.get_defense("dp_gaussian", 0.01)
  config = fedavg.FedAvgConfig(local_steps=1, batch_size=4, client_lr=0.1,
                               defense=noise, defense_at="update")
  params = model.init(jax.random.key(6))

  def reply(app, node):
    [r] = fl.InProcessGrid(app, 2).send_and_receive(
        [_train_message(fl, params, dst_node_id=node)])
    assert not r.has_error(), r.error
    return fl.from_arrays(r.content["arrays"], params)

  seed0 = reply(fl.make_client_app(model, config, load, seed=0), 2)
  again = reply(fl.make_client_app(model, config, load, seed=0), 2)
  seed1 = reply(fl.make_client_app(model, config, load, seed=1), 2)
  assert max_diff(seed0, again) == 0
  assert max_diff(seed0, seed1) > 1e-3
  plain = fedavg.FedAvgConfig(local_steps=1, batch_size=4, client_lr=0.1)
  for data in (load, None):  # Without load_data: the reply's num-examples.
    empty = reply(fl.make_client_app(
        model, plain, load,
        mods=[fl.defense_mod(noise, model=model, load_data=data)]), 3)
    assert max_diff(empty, params) == 0, data
  full = reply(fl.make_client_app(
      model, plain, load, mods=[fl.defense_mod(noise, model=model)]), 2)
  assert max_diff(full, params) > 1e-3


def test_in_process_grid_turns_failures_into_error_replies(fl):
  """A ClientApp that raises replies a CLIENT_APP_RAISED_EXCEPTION error; a
  message to an unknown node a NODE_UNAVAILABLE one."""
  from flwr.common.constant import ErrorCode  # pylint: disable=g-import-not-at-top
  model = models.get_model("logreg", (28, 28, 1), 10)

  def broken(context):
    raise RuntimeError(f"no data on node {context.node_id}")

  app = fl.make_client_app(
      model, fedavg.FedAvgConfig(local_steps=1, batch_size=1, client_lr=0.1),
      broken)
  params = model.init(jax.random.key(0))
  grid = fl.InProcessGrid(app, 1)
  raised, missing = grid.send_and_receive([
      _train_message(fl, params, dst_node_id=2),
      _train_message(fl, params, dst_node_id=99)])
  assert raised.has_error() and missing.has_error()
  assert raised.error.code == ErrorCode.CLIENT_APP_RAISED_EXCEPTION
  assert "RuntimeError: no data on node 2" in raised.error.reason
  assert missing.error.code == ErrorCode.NODE_UNAVAILABLE


def test_auditor_attacks_each_update_as_its_client(fl, monkeypatch):
  """3 clients, 2 rounds, replies handed to aggregate_train in reverse
  partition order behind a failed node: every record attacks
  -(local - global of its round) / (lr * steps) of the client it names,
  with num-examples images (4, 3, 4), that client's audit key of the round
  and its reference images (client p's pixels are 0.2 (p + 1), the stub
  reconstructs zeros: MSE 0.04 (p + 1)^2); the round's audit/<metric> are
  the means over clients; max_audits_per_round=1 attacks one update."""
  from flwr.app import ConfigRecord  # pylint: disable=g-import-not-at-top
  model = models.get_model("logreg", (28, 28, 1), 10)
  n, m, lr = 3, 4, 0.1
  x = np.stack([np.full((m, 28, 28, 1), 0.2 * (p + 1), np.float32)
                for p in range(n)])
  y = np.random.default_rng(7).integers(0, 10, (n, m)).astype(np.int32)
  mask = np.ones((n, m), np.float32)
  mask[1, 3] = 0.0
  seen = []

  def record(grads, num, key):
    loss = float(np.sum(np.abs(np.asarray(grads["head"]["bias"]))))
    seen.append((grads, num, key, loss))
    return loss

  stub = _stub_attack(record)
  monkeypatch.setattr(fl.attacks_lib, "get_attack", lambda name: stub)
  reference = lambda pid: (x[pid][mask[pid] > 0], y[pid][mask[pid] > 0])
  app = fl.make_client_app(
      model, fedavg.FedAvgConfig(local_steps=2, batch_size=2, client_lr=lr),
      _loader(fl, x, y, mask))
  grid = fl.InProcessGrid(app, n)
  kwargs = dict(client_lr=lr, reference_data=reference, seed=5,
                fraction_evaluate=0.0, min_train_nodes=n,
                min_available_nodes=n)
  strategy = fl.AuditingFedAvg(model, "dlg", **kwargs)
  data = lambda k: np.asarray(jax.random.key_data(k))
  keys = []
  for rnd in (1, 2):
    glob = _logreg_params(rnd, 0.01, 0.01)  # A new global model per round.
    messages = list(strategy.configure_train(
        rnd, fl.to_arrays(glob), ConfigRecord({}), grid))
    assert len(messages) == n
    messages.append(_train_message(fl, glob, dst_node_id=99))
    replies = list(grid.send_and_receive(messages))
    ok = sorted((r for r in replies if not r.has_error()),
                key=lambda r: -r.content["client"]["partition-id"])
    by_pid = {r.content["client"]["partition-id"]: r for r in ok}
    seen.clear()
    _, metrics = strategy.aggregate_train(
        rnd, [r for r in replies if r.has_error()] + ok)
    records = [r for r in strategy.audit_log if r["round"] == rnd]
    assert len(records) == len(seen) == n
    assert sorted(r["client"] for r in records) == list(range(n))
    for record, (grads, num, key, _) in zip(records, seen):
      pid = record["client"]
      reply = by_pid[pid]
      steps = reply.content["metrics"]["steps"]
      assert steps == 2
      local = fl.from_arrays(reply.content["arrays"], glob)
      expected = jax.tree_util.tree_map(
          lambda a, b: -(a - b) / (lr * steps), local, glob)
      assert max_diff(grads, expected) < 1e-5, (rnd, pid)
      assert num == record["num_images"] == (3 if pid == 1 else 4)
      np.testing.assert_array_equal(data(key),
                                    data(fl.audit_key(5, rnd, pid)))
      keys.append(tuple(data(key).ravel()))
      assert record["mse"] == pytest.approx(0.04 * (pid + 1) ** 2, rel=1e-5)
    losses = [s[3] for s in seen]
    assert len(set(losses)) == n
    assert metrics["audit/attack_loss"] == pytest.approx(np.mean(losses))
    assert metrics["audit/mse"] == pytest.approx(
        np.mean([r["mse"] for r in records]))
  assert len(set(keys)) == 2 * n

  capped = fl.AuditingFedAvg(model, "dlg", max_audits_per_round=1, **kwargs)
  list(capped.configure_train(1, fl.to_arrays(glob), ConfigRecord({}), grid))
  capped.aggregate_train(1, ok)
  assert len(capped.audit_log) == 1


def test_repinfer_audit_compiles_its_reconstruction_once(fl):
  """Auditing a second update with 'repinfer' compiles nothing new: the
  reconstruction program is built once per model and step count (a new
  jit per audited client compiled it again every time)."""
  model = models.get_model("leakage", (8, 8, 1), 10)
  params = model.init(jax.random.key(0))
  strategy = fl.AuditingFedAvg(model, "repinfer", client_lr=0.1,
                               repinfer_steps=3)
  x, y, _ = _clients(2, 4, shape=(8, 8, 1))
  updates = [jax.tree_util.tree_map(
      lambda g: -0.1 * g, gradients.batch_grad(
          model, params, jnp.asarray(x[k]), jnp.asarray(y[k])))
             for k in range(2)]
  compiles = []
  listener = lambda event, *a, **k: compiles.append(event) if (  # noqa: E731
      "backend_compile" in event) else None
  jax.monitoring.register_event_duration_secs_listener(listener)
  try:
    strategy._repinfer(params, updates[0], jax.random.key(1))  # pylint: disable=protected-access
    first = len(compiles)
    images, classes = strategy._repinfer(params, updates[1],  # pylint: disable=protected-access
                                         jax.random.key(2))
  finally:
    jax.monitoring.unregister_event_duration_listener(listener)
  assert first > 0 and len(compiles) == first
  assert images.shape == (len(classes), 8, 8, 1)


def _audit_round(fl, strategy, grid, glob, rnd):
  from flwr.app import ConfigRecord  # pylint: disable=g-import-not-at-top
  messages = list(strategy.configure_train(rnd, fl.to_arrays(glob),
                                           ConfigRecord({}), grid))
  replies = sorted(grid.send_and_receive(messages),  # Failures first.
                   key=lambda r: not r.has_error())
  return replies, strategy.aggregate_train(rnd, replies)[1]


def test_audit_log_files_ssim_and_caps_by_partition(fl, monkeypatch,
                                                    tmp_path):
  """Partition 0's node fails, partitions 1 and 2 reply, 2 rounds: the
  images are saved per partition id, audit.jsonl holds all 4 records,
  num_images=2 is what the attack is asked for, every record has an SSIM
  and the round's audit/ssim is their mean; max_audits_per_round=1 audits
  one update even when a failed reply comes first."""
  model = models.get_model("logreg", (28, 28, 1), 10)
  n, m = 3, 4
  x = np.stack([np.full((m, 28, 28, 1), 0.2 * (p + 1), np.float32)
                for p in range(n)])
  x[:, 1] *= 0.5  # Two different images per client.
  y = np.zeros((n, m), np.int32)
  mask = np.ones((n, m), np.float32)
  seen = []
  stub = _stub_attack(lambda grads, num, key: seen.append(num) or 0.0)
  monkeypatch.setattr(fl.attacks_lib, "get_attack", lambda name: stub)

  def load(context):
    i = fl.client_id(context)
    if i == 0:
      raise RuntimeError("partition 0 is down")
    return x[i], y[i], mask[i]

  app = fl.make_client_app(
      model, fedavg.FedAvgConfig(local_steps=1, batch_size=2, client_lr=0.1),
      load)
  grid = fl.InProcessGrid(app, n)
  kwargs = dict(client_lr=0.1, reference_data=lambda pid: (x[pid][:2],
                                                           y[pid][:2]),
                num_images=2, fraction_evaluate=0.0, min_train_nodes=n,
                min_available_nodes=n)
  strategy = fl.AuditingFedAvg(model, "dlg", workdir=str(tmp_path), **kwargs)
  for rnd in (1, 2):
    glob = _logreg_params(rnd, 0.01, 0.01)
    replies, metrics = _audit_round(fl, strategy, grid, glob, rnd)
    assert replies[0].has_error()
    records = [r for r in strategy.audit_log if r["round"] == rnd]
    assert sorted(r["client"] for r in records) == [1, 2]
    for pid in (1, 2):
      assert os.path.exists(tmp_path / f"round_{rnd:03d}_client_{pid}.png")
    assert not os.path.exists(tmp_path / f"round_{rnd:03d}_client_0.png")
    assert all(-1 <= r["ssim"] < 0.5 for r in records), records
    assert metrics["audit/ssim"] == pytest.approx(
        np.mean([r["ssim"] for r in records]))
  assert seen == [2] * 4
  assert all(r["num_images"] == 2 for r in strategy.audit_log)
  import json  # pylint: disable=g-import-not-at-top
  with open(tmp_path / "audit.jsonl") as f:
    lines = [json.loads(line) for line in f]
  assert len(lines) == 4
  assert [(r["round"], r["client"]) for r in lines] == [
      (r["round"], r["client"]) for r in strategy.audit_log]
  # A restarted server starts again at round 1: its records and images are
  # told apart from the first start's, which stay.
  restarted = fl.AuditingFedAvg(model, "dlg", workdir=str(tmp_path),
                                **kwargs)
  _audit_round(fl, restarted, grid, _logreg_params(1, 0.01, 0.01), 1)
  with open(tmp_path / "audit.jsonl") as f:
    lines = [json.loads(line) for line in f]
  assert [r["start"] for r in lines] == [1] * 4 + [2] * 2
  assert os.path.exists(tmp_path / "round_001_client_1.png")
  assert os.path.exists(tmp_path / "start_2_round_001_client_1.png")
  capped = fl.AuditingFedAvg(model, "dlg", max_audits_per_round=1, **kwargs)
  replies, _ = _audit_round(fl, capped, grid, glob, 1)
  assert replies[0].has_error()
  assert len(capped.audit_log) == 1


def test_saved_true_images_follow_their_matched_reconstructions(
    fl, monkeypatch, tmp_path):
  """The stub returns the client's 3 images in the order (1, 2, 0): the
  figure's 'true' row is reordered so that each true image stands under
  its reconstruction."""
  model = models.get_model("logreg", (28, 28, 1), 10)
  rng = np.random.default_rng(3)
  x = rng.random((1, 3, 28, 28, 1), dtype=np.float32)
  y = np.zeros((1, 3), np.int32)
  mask = np.ones((1, 3), np.float32)
  from repdef_jax.attacks import base as attack_base  # pylint: disable=g-import-not-at-top

  class Stub:
    make_config = staticmethod(lambda config, **o: None)

    @staticmethod
    def fn(model, params, grads, num, key, labels=None, config=None):
      return attack_base.AttackResult(
          x_rec=x[0][[1, 2, 0]], labels_rec=np.zeros((3,), np.int32),
          loss_history=np.zeros(1), final_loss=0.0, diverged=False,
          iterations=1)

  monkeypatch.setattr(fl.attacks_lib, "get_attack", lambda name: Stub)
  strategy = fl.AuditingFedAvg(
      model, "dlg", client_lr=0.1, workdir=str(tmp_path),
      reference_data=lambda pid: (x[pid], y[pid]), fraction_evaluate=0.0,
      min_train_nodes=1, min_available_nodes=1)
  saved = []
  real = strategy._save_images  # pylint: disable=protected-access
  monkeypatch.setattr(strategy, "_save_images",
                      lambda *a: saved.append(a) or real(*a))
  grid = fl.InProcessGrid(fl.make_client_app(
      model, fedavg.FedAvgConfig(local_steps=1, batch_size=3, client_lr=0.1),
      _loader(fl, x, y, mask)), 1)
  _audit_round(fl, strategy, grid, _logreg_params(1, 0.01, 0.01), 1)
  [(_, _, x_rec, x_true)] = saved
  assert strategy.audit_log[0]["mse"] == pytest.approx(0.0, abs=1e-12)
  np.testing.assert_array_equal(x_true, x_rec)


def test_repinfer_audit_compares_with_class_mean_images(fl, monkeypatch):
  """A repinfer audit whose inferred classes are 1 and 4: class 1's true
  images (0.2 and 0.4) average 0.3, absent class 4 compares with a zero
  image; zero reconstructions: MSE (0.3^2 + 0) / 2."""
  model = models.get_model("logreg", (28, 28, 1), 10)
  x = np.stack([np.full((28, 28, 1), v, np.float32)
                for v in (0.2, 0.9, 0.4, 0.9)])[None]
  y = np.array([[1, 7, 1, 7]], np.int32)
  mask = np.ones((1, 4), np.float32)
  strategy = fl.AuditingFedAvg(
      model, "repinfer", client_lr=0.1,
      reference_data=lambda pid: (x[pid], y[pid]), fraction_evaluate=0.0,
      min_train_nodes=1, min_available_nodes=1)
  monkeypatch.setattr(strategy, "_repinfer", lambda params, update, key: (
      np.zeros((2, 28, 28, 1), np.float32), [1, 4]))
  grid = fl.InProcessGrid(fl.make_client_app(
      model, fedavg.FedAvgConfig(local_steps=1, batch_size=4, client_lr=0.1),
      _loader(fl, x, y, mask)), 1)
  _audit_round(fl, strategy, grid, _logreg_params(1, 0.01, 0.01), 1)
  [record] = strategy.audit_log
  assert record["classes"] == [1, 4]
  assert record["mse"] == pytest.approx(0.3 ** 2 / 2, rel=1e-5)


def test_repinfer_audit_inverts_the_head_input(fl, monkeypatch):
  """On a 2-layer MLP the auditor inverts the representation entering the
  head (exact for one example and one SGD step), not the image itself."""
  model = models.get_model("mlp", (8, 8, 1), 10, hidden=(16,))
  params = model.init(jax.random.key(0))
  x = jax.random.uniform(jax.random.key(1), (1, 8, 8, 1))
  grads = gradients.batch_grad(model, params, x, jnp.array([3]))
  update = jax.tree_util.tree_map(lambda g: -0.1 * g, grads)
  targets = []

  def fake(model_, steps):
    def fn(params_, r, key):
      targets.append(np.asarray(r))
      return jnp.zeros(model_.input_shape), jnp.zeros(steps)
    return fn

  monkeypatch.setattr(fl.repinfer, "jitted_reconstruction", fake)
  strategy = fl.AuditingFedAvg(model, "repinfer", client_lr=0.1,
                               repinfer_steps=2)
  images, classes = strategy._repinfer(params, update, jax.random.key(2))  # pylint: disable=protected-access
  assert 3 in classes and images.shape == (len(classes), 8, 8, 1)
  np.testing.assert_allclose(targets[classes.index(3)],
                             np.asarray(model.features(params, x)[0]),
                             rtol=1e-4, atol=1e-6)


def test_library_bad_inputs_are_one_line_errors_naming_the_argument(fl):
  """A model's name for the model, a dict for the config, no data loader, a
  string seed or node count: one ValueError naming the argument, before
  any message arrives (they were AttributeErrors, or failed in a round)."""
  model = models.get_model("logreg", (28, 28, 1), 10)
  config = fedavg.FedAvgConfig(local_steps=1, batch_size=2, client_lr=0.1)
  load = lambda context: (np.zeros((2, 28, 28, 1)), np.zeros(2), None)  # noqa: E731
  app = fl.make_client_app(model, config, load)
  for kwargs, match in (
      (dict(model="logreg"), r"model must be a repdef_jax Model .*got str "
       r"'logreg'"),
      (dict(config={"local_steps": 1}), "config must be a fedavg.FedAvgConfig"),
      (dict(load_data=None), "load_data must be a function"),
      (dict(seed="a"), "seed must be an integer, got 'a'")):
    args = {"model": model, "config": config, "load_data": load, **kwargs}
    seed = args.pop("seed", 0)
    with pytest.raises(ValueError, match=match):
      fl.make_client_app(args["model"], args["config"], args["load_data"],
                         seed=seed)
  with pytest.raises(ValueError, match="model must be a repdef_jax Model"):
    fl.AuditingFedAvg("logreg", "dlg", client_lr=0.1)
  with pytest.raises(ValueError, match="seed must be an integer"):
    fl.AuditingFedAvg(model, "dlg", client_lr=0.1, seed=1.5)
  with pytest.raises(ValueError, match="num_nodes must be an integer >= 1, "
                     "got '2'"):
    fl.InProcessGrid(app, "2")
  from repdef_jax.defenses import baselines  # pylint: disable=g-import-not-at-top
  with pytest.raises(ValueError, match="defense_mod defends the update, but "
                     "defense 'dp_sgd' computes its own gradient"):
    fl.defense_mod(baselines.dp_sgd(model, 1.0, 1.0), model=model)
