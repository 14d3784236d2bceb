"""Determinism on CPU and independence of the key streams.

* Same seed and configuration give bit-identical results run to run: an
  attack, a noisy defense, a few FedAvg rounds through the library, and the
  main job (``experiments.attack.run``) in two fresh workdirs.
* Switching a defense on or off leaves every other random choice unchanged
  (separate key streams, big_vision style): FedAvg's sampled clients, initial
  parameters and local minibatch order, and the main job's undefended
  result.
"""

import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from repdef_jax import attacks
from repdef_jax import defenses
from repdef_jax import fedavg
from repdef_jax import gradients
from repdef_jax import models

_ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
if _ROOT not in sys.path:
  sys.path.insert(0, _ROOT)
from repdef_jax.paper import harness  # pylint: disable=g-import-not-at-top,wrong-import-position
from repdef_jax.paper import main_job as attack_main  # pylint: disable=g-import-not-at-top,wrong-import-position

NUM_MOCK = 8  # examples per split for the mock_env fixture


def _key_bytes(key) -> bytes:
  return np.asarray(jax.random.key_data(key)).tobytes()


def _leaves_equal(a, b) -> bool:
  la, lb = jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)
  return len(la) == len(lb) and all(
      np.array_equal(np.asarray(x), np.asarray(y), equal_nan=True)
      for x, y in zip(la, lb))


def _logreg():
  model = models.get_model("logreg", (4, 4, 1), 3, init="uniform")
  return model, model.init(jax.random.key(0))


@pytest.mark.parametrize("name,overrides", [
    ("dlg", {"outer_steps": 3, "inner_steps": 2}),
    ("gs", {"iterations": 4, "restarts": 2}),
])
def test_attack_is_deterministic(name, overrides):
  model, params = _logreg()
  g = gradients.batch_grad(model, params, jnp.full((1, 4, 4, 1), 0.3),
                           jnp.array([2]))
  attack = attacks.get_attack(name)
  runs = [attacks.to_host(attack(model, params, g, 1, jax.random.key(7),
                                 **overrides)) for _ in range(2)]
  assert _leaves_equal(tuple(runs[0]), tuple(runs[1]))
  other = attacks.to_host(attack(model, params, g, 1, jax.random.key(8),
                                 **overrides))
  assert not np.array_equal(runs[0].x_rec, other.x_rec)


@pytest.mark.parametrize("name", ["dp_gaussian", "dp_laplace",
                                  "soteria+dp_gaussian"])
def test_noisy_defense_is_deterministic(name):
  model = models.get_model("logreg", (4, 4, 1), 4)
  params = model.init(jax.random.key(0))
  x = jax.random.uniform(jax.random.key(1), (2, 4, 4, 1))
  y = jnp.array([0, 3])
  g = gradients.batch_grad(model, params, x, y)
  if name == "soteria+dp_gaussian":
    defense = defenses.chain(defenses.get_defense("soteria", 50, model=model),
                             defenses.get_defense("dp_gaussian", 0.1))
  else:
    defense = defenses.get_defense(name, 0.1)
  apply = jax.jit(defense.apply)
  batch = defenses.ClientBatch(params, x, y)
  a, _ = apply(g, batch, jax.random.key(3))
  b, _ = apply(g, batch, jax.random.key(3))
  c, _ = apply(g, batch, jax.random.key(4))
  assert _leaves_equal(a, b)
  assert not _leaves_equal(a, c)


def _fed_data():
  rng = np.random.default_rng(0)
  mask = np.ones((6, 8), np.float32)
  mask[2, 5:] = 0  # Unequal sizes: sampling by p_k is not uniform.
  return fedavg.ClientArrays(
      jnp.asarray(rng.random((6, 8, 4, 4, 1), dtype=np.float32)),
      jnp.asarray(rng.integers(0, 4, (6, 8)).astype(np.int32)),
      jnp.asarray(mask))


_MODEL = models.get_model("mlp", (4, 4, 1), 4, hidden=(8,))
_ROUNDS = {}  # defense name -> (config, jitted round): compile once each.


def _fed_run(defense_name, seed=0, rounds=3):
  """Three rounds from a fresh init; the jitted round is shared per config."""
  model = _MODEL
  if defense_name not in _ROUNDS:
    defense = {"none": None,
               "dp_gaussian_0": defenses.dp_gaussian(0.0)}[defense_name]
    config = fedavg.FedAvgConfig(clients_per_round=3, local_steps=2,
                                 batch_size=3, client_lr=0.1, defense=defense)
    _ROUNDS[defense_name] = (config, fedavg.make_round(model, config))
  config, round_fn = _ROUNDS[defense_name]
  keys = fedavg.key_streams(seed)
  init = fedavg.init(model, config, keys.init)
  state, history = fedavg.run_rounds(round_fn, init, _fed_data(), keys,
                                     rounds)
  return model, init, state, history


def test_fedavg_rounds_are_deterministic():
  _, init_a, a, hist_a = _fed_run("none")
  _, init_b, b, hist_b = _fed_run("none")
  assert _leaves_equal(init_a.params, init_b.params)
  assert _leaves_equal(a.params, b.params)
  assert _leaves_equal(hist_a, hist_b)
  _, _, c, _ = _fed_run("none", seed=1)
  assert not _leaves_equal(a.params, c.params)


def test_key_streams_differ_by_purpose_round_and_client():
  """Every named stream, and every (round, client)'s train and noise keys,
  is a different key: no two purposes, rounds or clients share randomness
  (same minibatch order every round, same noise as the batch order...)."""
  keys = fedavg.key_streams(0)
  assert len({_key_bytes(k) for k in keys}) == len(fedavg.STREAMS)
  derived = []
  for r in range(3):
    for c in range(3):
      derived.extend(fedavg.client_keys(keys, jnp.int32(r), jnp.int32(c)))
  derived = [_key_bytes(k) for k in derived]
  assert len(set(derived)) == len(derived) == 18
  assert not set(derived) & {_key_bytes(k) for k in keys}


def test_fedavg_sampling_is_folded_with_the_round():
  """Round r samples with ``fold_in(keys.sampling, r)`` (KeyStreams): a new
  draw each round, not the same clients every round."""
  _, _, _, hist = _fed_run("none")
  config, _ = _ROUNDS["none"]
  keys, data = fedavg.key_streams(0), _fed_data()
  probs = fedavg.default_probs(data, config.weighting)
  expected = [np.asarray(fedavg.sample_clients(
      jax.random.fold_in(keys.sampling, r), probs, config.clients_per_round,
      config.replace)) for r in range(3)]
  np.testing.assert_array_equal(hist["client_ids"], np.stack(expected))
  assert len({tuple(row) for row in hist["client_ids"].tolist()}) > 1


def test_fedavg_defense_toggle_keeps_sampling_init_and_batch_order():
  """none vs dp_gaussian(0): same clients, same init, same minibatches.

  With noise scale 0 the defense consumes its own (noise) stream but adds
  nothing, so the whole run must be bit-identical to the undefended one:
  any leak of the defense into the data, sampling or init streams would
  change the minibatches or clients and hence the parameters.
  """
  model, init_none, none, hist_none = _fed_run("none")
  _, init_zero, zero, hist_zero = _fed_run("dp_gaussian_0")
  assert _leaves_equal(init_none.params, init_zero.params)
  np.testing.assert_array_equal(hist_none["client_ids"],
                                hist_zero["client_ids"])
  np.testing.assert_array_equal(hist_none["weights"], hist_zero["weights"])
  assert _leaves_equal(none.params, zero.params)
  np.testing.assert_array_equal(hist_none["train_loss"],
                                hist_zero["train_loss"])
  del model


MAIN = {"dataset": "mnist", "model": "logreg", "attack": "gs",
        "defense": "soteria", "strength": 60.0, "num_images": 2,
        "iterations": 3, "seed": 0}


def _strip_seconds(images):
  out = []
  for e in images:
    e = dict(e)
    for part in ("undefended", "defended"):
      e[part] = {k: v for k, v in e[part].items() if k != "seconds"}
    out.append(e)
  return out


def test_main_job_deterministic_and_undefended_independent_of_defense(
    mock_env):
  a = attack_main.run(MAIN, str(mock_env / "a"), verbose=False)
  b = attack_main.run(MAIN, str(mock_env / "b"), verbose=False)
  assert _strip_seconds(a["images"]) == _strip_seconds(b["images"])
  for defense in ("none", "dp_gaussian"):
    strength = 0.0 if defense == "none" else 0.01
    c = attack_main.run({**MAIN, "defense": defense, "strength": strength},
                        str(mock_env / defense), verbose=False)
    # Same images drawn, same undefended attack, whatever the defense.
    assert [e["index"] for e in c["images"]] == [
        e["index"] for e in a["images"]]
    assert ([e["undefended"] for e in _strip_seconds(c["images"])] ==
            [e["undefended"] for e in _strip_seconds(a["images"])])


def test_sweep_keys_share_fedavg_init_and_keep_streams_apart():
  """The attacked model is FedAvg's initial one (same init key); the
  attack and defense streams differ from it and from each other, and every
  image gets its own attack key and a different defense key."""
  for seed in (0, 3):
    keys = harness.sweep_keys(seed)
    assert _key_bytes(keys.init) == _key_bytes(fedavg.key_streams(seed).init)
    assert len({_key_bytes(k) for k in keys[1:]}) == 4
    assert _key_bytes(keys.init) not in {_key_bytes(k) for k in keys[1:]}
    per_image = [harness.image_keys(keys, i) for i in range(3)]
    flat = [_key_bytes(k) for pair in per_image for k in pair]
    assert len(set(flat)) == 6
  assert _key_bytes(harness.sweep_keys(0).attack) != _key_bytes(
      harness.sweep_keys(3).attack)


def test_sweep_keys_streams_are_not_fedavg_streams():
  """SweepKeys' own streams (data, attack, defense, update) are none of FedAvg's
  named streams: image draws are not tied to the model init, nor attack
  dummies to client sampling."""
  keys = harness.sweep_keys(0)
  fed = {_key_bytes(k) for k in fedavg.key_streams(0)}
  # The Flower auditor's stream is index len(STREAMS) of the same root.
  audit = _key_bytes(jax.random.fold_in(jax.random.key(0),
                                        len(fedavg.STREAMS)))
  assert not {_key_bytes(k) for k in keys[1:]} & (fed | {audit})


def test_update_cell_attack_keys_are_not_image_keys():
  """Neither the client draw nor the attack keys of a real-update cell are
  an image's attack or defense key."""
  keys = harness.sweep_keys(0)
  images = {_key_bytes(k) for i in range(8)
            for k in harness.image_keys(keys, i)}
  for rounds in (0, 1, 5):
    assert not {_key_bytes(k) for k in harness.update_keys(keys, rounds)
                } & images


def test_main_job_attacks_each_image_with_its_index_keys(mock_env,
                                                         monkeypatch):
  """Image ``index`` is attacked with ``harness.image_keys(keys, index)``,
  whatever its position among the drawn images, and its defense (dp noise)
  draws from the defense stream, not the attack's."""
  seen = []

  def spy(model, params, attack, defense, x, y, key_attack, key_defense,
          *args, **kwargs):
    del model, params, attack, defense, x, y, args, kwargs
    seen.append((_key_bytes(key_attack), _key_bytes(key_defense)))
    raise ValueError("not attacked in this test")

  monkeypatch.setattr(attack_main, "attack_image", spy)
  res = attack_main.run({**MAIN, "defense": "dp_gaussian", "strength": 0.01,
                         "num_images": 3}, str(mock_env / "keys"),
                        verbose=False)
  indices = [e["index"] for e in res["images"]]
  assert indices != list(range(3))  # Positions and indices differ.
  keys = harness.sweep_keys(MAIN["seed"])
  expected = [tuple(_key_bytes(k) for k in harness.image_keys(keys, i))
              for i in indices]
  assert seen == expected
