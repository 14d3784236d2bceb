"""Equivalences and invariants of the vectorized FedAvg round."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from repdef_jax import fedavg
from repdef_jax import gradients
from repdef_jax import models
from repdef_jax import partition
from repdef_jax import schedules
from repdef_jax import training
from repdef_jax.defenses import base as defenses_base
from tree_checks import max_diff

N, M, F = 6, 12, 4 * 4 * 1


@pytest.fixture(scope="module")
def model():
  return models.get_model("mlp", (4, 4, 1), 4, hidden=(8,))


@pytest.fixture(scope="module")
def logreg():
  return models.get_model("logreg", (4, 4, 1), 4)


def _data(n=N, m=M, seed=0, sizes=(12, 7, 12, 3, 0, 12)):
  rng = np.random.default_rng(seed)
  x = rng.random((n, m, 4, 4, 1), dtype=np.float32)
  y = rng.integers(0, 4, (n, m)).astype(np.int32)
  mask = np.zeros((n, m), np.float32)
  for k, s in enumerate(sizes):
    mask[k, :s] = 1.0
  x = x * mask[..., None, None, None]
  y = y * mask.astype(np.int32)
  return fedavg.ClientArrays(jnp.asarray(x), jnp.asarray(y), jnp.asarray(mask))


def _pad(data, extra_clients=0, extra_examples=0):
  pad = lambda a: jnp.pad(a, [(0, extra_clients), (0, extra_examples)] +
                          [(0, 0)] * (a.ndim - 2))
  return fedavg.ClientArrays(*(pad(a) for a in data))


def _fixed_rows_defense(rows):
  """Zeroes fixed rows of the head kernel gradient (a Soteria stand-in)."""
  rows = jnp.asarray(rows)

  def apply(grads, batch, key):
    del batch, key
    g = dict(grads)
    head = dict(g["head"])
    head["kernel"] = head["kernel"].at[rows].set(0.0)
    g["head"] = head
    return g, {"pruned": jnp.float32(len(rows))}

  return defenses_base.Defense("rows", apply)


CONFIGS = {
    "steps": fedavg.FedAvgConfig(clients_per_round=5, local_steps=3,
                                 batch_size=4, client_lr=0.1, l2=1e-2),
    "epochs_size": fedavg.FedAvgConfig(clients_per_round=4, local_epochs=2,
                                       batch_size=5, client_lr=0.1,
                                       weighting="size", replace=False),
    "update_defense": fedavg.FedAvgConfig(
        clients_per_round=4, local_steps=2, batch_size=4, client_lr=0.1,
        defense=_fixed_rows_defense([1, 3]), defense_at="update",
        server_optimizer=optax.sgd(0.5, momentum=0.9)),
}


_ROUND_FNS = {}


def _round_fn(model, name, **kwargs):
  """Shares compiled rounds between tests (compilation dominates run time)."""
  key = (id(model), name, tuple(sorted(kwargs.items())))
  if key not in _ROUND_FNS:
    _ROUND_FNS[key] = (fedavg.make_round(model, CONFIGS[name], **kwargs), model)
  return _ROUND_FNS[key][0]


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_vmapped_round_equals_python_loop(model, name):
  config = CONFIGS[name]
  data, keys = _data(), fedavg.key_streams(1)
  state = fedavg.init(model, config, keys.init)
  round_fn = _round_fn(model, name)
  for _ in range(2):
    new, metrics = round_fn(state, data, keys)
    ref = fedavg.loop_round(model, config, state, data, keys,
                            metrics["client_ids"])
    assert max_diff(new.params, ref.params) < 1e-6
    assert max_diff(new.opt_state, ref.opt_state) < 1e-6
    assert int(new.round) == int(ref.round)
    state = new


def test_chunked_round_equals_vmapped(model):
  config = CONFIGS["steps"]
  data, keys = _data(), fedavg.key_streams(2)
  state = fedavg.init(model, config, keys.init)
  a, ma = _round_fn(model, "steps")(state, data, keys)
  chunked = fedavg.FedAvgConfig(**{**config.__dict__, "client_chunk": 2})
  b, mb = fedavg.make_round(model, chunked)(state, data, keys)
  np.testing.assert_array_equal(ma["client_ids"], mb["client_ids"])
  assert max_diff(a.params, b.params) < 1e-6


def test_padding_clients_and_examples_changes_nothing(model):
  config = CONFIGS["steps"]
  data, keys = _data(), fedavg.key_streams(3)
  state = fedavg.init(model, config, keys.init)
  round_fn = _round_fn(model, "steps")
  a, ma = round_fn(state, data, keys)
  padded = _pad(data, extra_clients=3, extra_examples=5)
  b, mb = round_fn(state, padded, keys)
  # Zero-size clients have p_k = 0: same sample, same result.
  np.testing.assert_array_equal(ma["client_ids"], mb["client_ids"])
  assert max_diff(a.params, b.params) < 1e-6
  assert abs(float(ma["train_loss"]) - float(mb["train_loss"])) < 1e-6


def test_empty_client_contributes_nothing(model):
  config = CONFIGS["steps"]
  data, keys = _data(), fedavg.key_streams(4)
  state = fedavg.init(model, config, keys.init)
  round_fn = fedavg.make_round(model, config, return_client_updates=True)
  new, m = round_fn(state, data, keys, client_ids=jnp.array([4, 0]))
  ref, _ = round_fn(state, data, keys, client_ids=jnp.array([0]))
  np.testing.assert_allclose(m["weights"], [0.0, 1.0])
  assert max_diff(jax.tree_util.tree_map(lambda d: d[0],
                                         m["client_updates"]),
                  jax.tree_util.tree_map(jnp.zeros_like, state.params)) == 0
  assert max_diff(new.params, ref.params) < 1e-7


def test_one_client_one_full_step_is_centralized_sgd(model):
  config = fedavg.FedAvgConfig(clients_per_round=1, local_steps=1,
                               batch_size=100, client_lr=0.3, l2=0.05)
  data, keys = _data(n=1, sizes=(9,)), fedavg.key_streams(5)
  state = fedavg.init(model, config, keys.init)
  new, _ = fedavg.make_round(model, config)(state, data, keys)
  x, y = data.x[0, :9], data.y[0, :9]

  def loss(p):
    sq = sum(jnp.sum(w ** 2) for w in jax.tree_util.tree_leaves(p))
    return gradients.batch_loss(model, p, x, y) + 0.5 * 0.05 * sq

  g = jax.grad(loss)(state.params)
  expected = jax.tree_util.tree_map(lambda w, gw: w - 0.3 * gw, state.params, g)
  assert max_diff(new.params, expected) < 1e-6


def test_sampling_frequencies_match_probs():
  probs = jnp.array([0.5, 0.25, 0.15, 0.1, 0.0])
  key = jax.random.key(0)
  draws = jax.vmap(lambda r: fedavg.sample_clients(
      jax.random.fold_in(key, r), probs, 10))(jnp.arange(2000))
  freq = np.bincount(np.asarray(draws).ravel(), minlength=5) / draws.size
  np.testing.assert_allclose(freq, probs, atol=0.015)
  no_rep = jax.vmap(lambda r: fedavg.sample_clients(
      jax.random.fold_in(key, r), probs, 3, replace=False))(jnp.arange(200))
  assert all(len(set(row)) == 3 and 4 not in row
             for row in np.asarray(no_rep).tolist())


def test_defense_toggle_keeps_client_sampling(model):
  data, keys = _data(), fedavg.key_streams(6)
  plain = CONFIGS["steps"]
  defended = fedavg.FedAvgConfig(**{**plain.__dict__,
                                    "defense": _fixed_rows_defense([0])})
  ids = []
  for config in (plain, defended):
    state = fedavg.init(model, config, keys.init)
    round_fn = (_round_fn(model, "steps") if config is plain else
                fedavg.make_round(model, config))
    run = []
    for _ in range(3):
      state, m = round_fn(state, data, keys)
      run.append(np.asarray(m["client_ids"]))
    ids.append(run)
  np.testing.assert_array_equal(ids[0], ids[1])


def test_round_takes_packed_client_data_as_is(model):
  """partition.pack's ClientData (with its sizes) runs the same round as
  its ClientArrays."""
  data, keys = _data(), fedavg.key_streams(4)
  packed = partition.ClientData(np.asarray(data.x), np.asarray(data.y),
                                np.asarray(data.mask),
                                np.asarray(data.mask.sum(1), np.int32))
  round_fn = _round_fn(model, "steps")
  state = fedavg.init(model, CONFIGS["steps"], keys.init)
  a, ma = round_fn(state, data, keys)
  b, mb = round_fn(state, packed, keys)
  assert max_diff(a.params, b.params) == 0
  np.testing.assert_array_equal(ma["client_ids"], mb["client_ids"])


def test_fixed_rows_defense_every_step_zeroes_rows(model):
  config = fedavg.FedAvgConfig(clients_per_round=4, local_steps=3,
                               batch_size=4, client_lr=0.1,
                               defense=_fixed_rows_defense([2, 5]))
  data, keys = _data(), fedavg.key_streams(7)
  state = fedavg.init(model, config, keys.init)
  _, m = fedavg.make_round(model, config, return_client_updates=True)(
      state, data, keys)
  head = np.asarray(m["client_updates"]["head"]["kernel"])
  assert np.all(head[:, [2, 5]] == 0.0)
  assert np.any(head[:, [0, 1, 3]] != 0.0)
  assert float(m["defense/pruned"]) == pytest.approx(2.0)


def test_attack_hook_returns_what_the_server_receives(model):
  config = CONFIGS["update_defense"]
  data, keys = _data(), fedavg.key_streams(8)
  state = fedavg.init(model, config, keys.init)
  round_fn = fedavg.make_round(model, config, return_client_updates=True)
  state, _ = round_fn(state, data, keys)  # Attack round 1, not 0.
  _, m = round_fn(state, data, keys)
  slot = 1
  cid = int(m["client_ids"][slot])
  tk, nk = fedavg.client_keys(keys, state.round, cid)
  delta, _ = jax.jit(lambda p: fedavg.client_update(
      model, config, p, data.x[cid], data.y[cid], data.mask[cid], tk, nk,
      state.round))(state.params)
  got = jax.tree_util.tree_map(lambda d: d[slot], m["client_updates"])
  assert max_diff(got, delta) < 1e-7


@pytest.mark.parametrize("weighting,replace,tol", [("uniform", True, 0.05),
                                                   ("size", False, 0.25)])
def test_default_sampling_makes_weighting_near_unbiased(weighting, replace,
                                                        tol):
  """Over 20,000 sampled rounds with the default probabilities, each client's
  mean aggregation weight is n_k / n: exactly in expectation for 'uniform'
  (sampling by n_k), up to the ratio estimator's bias for 'size' (uniform
  sampling). Sampling by n_k under 'size' would give client 3 (3 of 46
  examples) 0.03 instead of 0.065."""
  data = _data()
  config = fedavg.FedAvgConfig(clients_per_round=3, weighting=weighting,
                               replace=replace)
  sizes = fedavg.client_sizes(data)
  probs = fedavg.default_probs(data, weighting)

  def one(key):
    ids = fedavg.sample_clients(key, probs, 3, replace)
    w = fedavg._aggregation_weights(config, sizes[ids], jnp.ones(3, bool))
    return jnp.zeros(N).at[ids].add(w)

  mean = np.asarray(jax.vmap(one)(jax.random.split(jax.random.key(0),
                                                   20_000)).mean(0))
  target = np.asarray(sizes) / np.sum(np.asarray(sizes))
  assert mean[4] == 0.0  # Client 4 holds no example.
  real = target > 0
  np.testing.assert_allclose(mean[real], target[real], rtol=tol)


@pytest.mark.parametrize("weighting", ["uniform", "size"])
def test_aggregation_weights_by_hand(logreg, weighting):
  """Clients 0, 0 and 3 (12, 12 and 3 examples): uniform gives 1/3 each,
  size n_k / 27; the new model is the old one plus sum_k w_k delta_k."""
  config = fedavg.FedAvgConfig(clients_per_round=3, local_steps=2,
                               batch_size=4, client_lr=0.1,
                               weighting=weighting)
  data, keys = _data(), fedavg.key_streams(4)
  state = fedavg.init(logreg, config, keys.init)
  new, m = fedavg.make_round(logreg, config, return_client_updates=True)(
      state, data, keys, client_ids=np.array([0, 0, 3]))
  expected = {"uniform": [1 / 3, 1 / 3, 1 / 3],
              "size": [12 / 27, 12 / 27, 3 / 27]}[weighting]
  np.testing.assert_allclose(np.asarray(m["weights"]), expected, rtol=1e-6)
  updates = m["client_updates"]
  assert max_diff(jax.tree_util.tree_map(lambda d: d[0], updates),
                  jax.tree_util.tree_map(lambda d: d[1], updates)) == 0.0
  want = jax.tree_util.tree_map(
      lambda p, d: np.asarray(p) + sum(w * np.asarray(d[i])
                                       for i, w in enumerate(expected)),
      state.params, updates)
  assert max_diff(new.params, want) < 1e-6


def _soteria(model):
  from repdef_jax.defenses import soteria  # pylint: disable=g-import-not-at-top
  return soteria.soteria(model, 50.0)


@pytest.mark.parametrize("defense_at", ["step", "update"])
def test_soteria_pruned_rows_are_zero_in_every_update(logreg, defense_at):
  defense = _soteria(logreg)
  config = fedavg.FedAvgConfig(clients_per_round=4, local_steps=1,
                               batch_size=M, client_lr=0.5, defense=defense,
                               defense_at=defense_at,
                               local_epochs=1 if defense_at == "update" else 0)
  data, keys = _data(sizes=(12, 7, 12, 3, 5, 12)), fedavg.key_streams(9)
  state = fedavg.init(logreg, config, keys.init)
  state = state.replace(params=jax.tree_util.tree_map(
      lambda p: p + 0.1, state.params))
  _, m = fedavg.make_round(logreg, config, return_client_updates=True)(
      state, data, keys)
  ones = jax.tree_util.tree_map(jnp.ones_like, state.params)
  for slot, cid in enumerate(np.asarray(m["client_ids"])):
    tk, nk = fedavg.client_keys(keys, state.round, int(cid))
    if defense_at == "step":  # The exact minibatch of the only step.
      idx, bm = fedavg._batch_plan(tk, data.mask[cid], config)  # pylint: disable=protected-access
      batch = defenses_base.ClientBatch(state.params, data.x[cid][idx[0]],
                                        data.y[cid][idx[0]], bm[0])
      key = jax.random.fold_in(nk, 0)
    else:
      batch = defenses_base.ClientBatch(state.params, data.x[cid],
                                        data.y[cid], data.mask[cid])
      key = nk
    mask, _ = defense.apply(ones, batch, key)
    pruned = np.asarray(mask["head"]["kernel"]) == 0
    assert pruned.any()
    delta = np.asarray(m["client_updates"]["head"]["kernel"][slot])
    assert np.all(delta[pruned] == 0.0)


def test_bad_inputs_raise(model):
  with pytest.raises(ValueError, match="local_steps"):
    fedavg.FedAvgConfig(local_steps=0).validate()
  with pytest.raises(ValueError, match="defense_at"):
    fedavg.FedAvgConfig(defense_at="never").validate()
  with pytest.raises(ValueError, match="weighting"):
    fedavg.FedAvgConfig(weighting="median").validate()
  data = _data()
  with pytest.raises(ValueError, match="without replacement"):
    fedavg.check_setup(fedavg.FedAvgConfig(clients_per_round=6,
                                           replace=False), data)
  fedavg.check_setup(fedavg.FedAvgConfig(clients_per_round=6), data)
  with pytest.raises(ValueError, match="client data must be"):
    fedavg.as_client_arrays(fedavg.ClientArrays(data.x[0], data.y, data.mask))
  for bad in (0, -1, 2.5):
    with pytest.raises(ValueError, match="batch_size must be an int >= 1"):
      fedavg.make_eval_data(np.zeros((5, 4, 4, 1)), np.zeros(5), bad)
  # What the type checks still take: the numbers and flags JAX, NumPy and
  # optax users pass.
  for ok in (dict(l2=jnp.float32(0.01)), dict(l2=np.float64(0.0)),
             dict(replace=0), dict(replace=jnp.bool_(True)),
             dict(clients_per_round=np.int64(3)),
             dict(server_optimizer=optax.MultiSteps(optax.sgd(1.0), 2)),
             dict(server_optimizer=optax.inject_hyperparams(optax.sgd)(
                 learning_rate=1.0))):
    fedavg.FedAvgConfig(**ok).validate()


def test_a_defense_that_breaks_the_contract_is_named(model):
  """make_round checks the defense on abstract values: one line naming it,
  not an AttributeError or a broadcasting error from inside the round."""
  per_example = lambda g, b, k: (g, {"n": jnp.sum(b.x, (1, 2, 3))})
  cases = {
      (lambda g, b, k: (g, {})): "must be a repdef_jax Defense",
      "dp_gaussian": "must be a repdef_jax Defense",
      defenses_base.Defense("a", lambda g, b, k: g): "defense 'a' must "
      r"return \(grads, info\).*it returned dict",
      defenses_base.Defense("b", lambda g, b, k: (g, None)): "its info is "
      "NoneType",
      defenses_base.Defense("c", per_example): r"info entries \['n'\] are "
      "not scalars",
      defenses_base.Defense("d", lambda g, b, k: ({"w": 0.0}, {})): "its "
      "grads differ from the input's",
  }
  for defense, match in cases.items():
    with pytest.raises(ValueError, match=match):
      fedavg.make_round(model, fedavg.FedAvgConfig(defense=defense))
  fedavg.make_round(model, fedavg.FedAvgConfig(
      defense=defenses_base.Defense("ok", lambda g, b, k: (g, {"s": 1.0}))))


def test_theorem2_schedule_matches_formula():
  mu, big_l, steps = 0.01, 0.5, 5
  gamma = max(8 * big_l / mu, steps)
  sched = schedules.theorem2(mu, big_l, steps)
  for t in (0, 1, 10, 1000):
    assert float(sched(t)) == pytest.approx(2 / (mu * (gamma + t)), rel=1e-6)
  assert schedules.theorem2_gamma(1.0, 1.0, 20) == 20
  assert float(schedules.constant(0.3)(7)) == pytest.approx(0.3)
  with pytest.raises(ValueError, match="mu"):
    schedules.theorem2(0.0, 1.0, 1)
  with pytest.raises(ValueError, match="smoothness \\(L\\) must be"):
    schedules.theorem2(1.0, 0.5, 1)
  with pytest.raises(ValueError):
    schedules.constant(0.0)


def test_schedule_settings_at_their_boundaries():
  """L == mu and one local step are valid, zero steps are not;
  get_schedule('theorem2') takes every constant (kappa = 2, gamma =
  max(16, I))."""
  assert schedules.theorem2_gamma(0.5, 0.5, 1) == 8
  with pytest.raises(ValueError, match="local_steps"):
    schedules.theorem2(1.0, 1.0, 0)
  for steps in (4, 40):
    sched = schedules.get_schedule("theorem2", 9.0, mu=0.5, smoothness=1.0,
                                   local_steps=steps)
    gamma = max(16, steps)
    for t in (0, 3):
      assert float(sched(t)) == pytest.approx(2 / (0.5 * (gamma + t)),
                                              rel=1e-6)
  assert float(schedules.get_schedule("constant", 0.25)(5)) == 0.25


def test_constant_schedule_refuses_an_infinite_rate():
  """A diverging run is not a valid schedule (it was accepted once)."""
  for lr in (float("inf"), "fast"):
    with pytest.raises(ValueError, match="a finite number > 0"):
      schedules.constant(lr)


def test_schedule_is_indexed_by_global_step(logreg):
  sched = schedules.theorem2(0.1, 0.2, 2)
  config = fedavg.FedAvgConfig(clients_per_round=1, local_steps=2,
                               batch_size=M, client_lr=sched, l2=0.1)
  data, keys = _data(n=1, sizes=(8,)), fedavg.key_streams(10)
  state = fedavg.init(logreg, config, keys.init)
  round_fn = fedavg.make_round(logreg, config)
  state, _ = round_fn(state, data, keys)
  x, y = data.x[0, :8], data.y[0, :8]
  p = state.params
  for t in (2, 3):  # Round 1 runs global steps 2 and 3.
    def loss(q):
      sq = sum(jnp.sum(w ** 2) for w in jax.tree_util.tree_leaves(q))
      return gradients.batch_loss(logreg, q, x, y) + 0.05 * sq
    g = jax.grad(loss)(p)
    p = jax.tree_util.tree_map(lambda w, gw: w - sched(t) * gw, p, g)
  new, _ = round_fn(state, data, keys)
  assert max_diff(new.params, p) < 1e-6


def _key_bits(key):
  return tuple(np.asarray(jax.random.key_data(key)).ravel().tolist())


def test_key_streams_differ_by_stream_round_and_client():
  """Every (stream, round, client) has a key of its own: a train key shared
  by rounds would replay the same minibatches each round, a noise key shared
  by clients (or equal to the train key) would correlate the defense noise."""
  keys = fedavg.key_streams(11)
  assert len({_key_bits(k) for k in keys}) == len(fedavg.STREAMS)
  seen = set()
  for r in range(3):
    for c in range(3):
      tk, nk = fedavg.client_keys(keys, jnp.int32(r), jnp.int32(c))
      seen.update((_key_bits(tk), _key_bits(nk)))
  assert len(seen) == 2 * 3 * 3


def test_each_round_samples_with_its_own_key(model):
  """Round r draws its clients with ``fold_in(sampling, r)`` (the key
  :func:`fedavg.sample_clients` documents), so the sample changes per round."""
  data, keys = _data(), fedavg.key_streams(12)
  state = fedavg.init(model, CONFIGS["steps"], keys.init)
  round_fn = _round_fn(model, "steps")
  probs = fedavg.default_probs(data, "uniform")
  got = []
  for r in range(3):
    state, m = round_fn(state, data, keys)
    want = fedavg.sample_clients(jax.random.fold_in(keys.sampling, r), probs, 5)
    np.testing.assert_array_equal(m["client_ids"], want)
    got.append(tuple(np.asarray(m["client_ids"]).tolist()))
  assert len(set(got)) > 1


def test_batch_plan_uses_real_examples_once_per_epoch():
  """Client 1 holds 7 real examples of 12. With local_steps every batch is B
  distinct real examples, and the steps draw different batches; with
  local_epochs every real example is used exactly once per epoch (padding
  never), in a fresh order each epoch."""
  mask = _data().mask[1]
  key = jax.random.key(13)
  steps = fedavg.FedAvgConfig(local_steps=6, batch_size=4)
  idx, bm = fedavg._batch_plan(key, mask, steps)  # pylint: disable=protected-access
  idx, bm = np.asarray(idx), np.asarray(bm)
  assert idx.shape == (6, 4) and np.all(bm == 1.0)
  assert all(len(set(row)) == 4 and max(row) < 7 for row in idx.tolist())
  assert len({tuple(sorted(row)) for row in idx.tolist()}) > 1
  epochs = fedavg.FedAvgConfig(local_epochs=3, batch_size=5)
  idx, bm = fedavg._batch_plan(key, mask, epochs)  # pylint: disable=protected-access
  idx, bm = np.asarray(idx), np.asarray(bm)
  assert idx.shape == (3 * 3, 5)  # ceil(12 / 5) = 3 batches per epoch.
  used = np.bincount(idx.ravel(), weights=bm.ravel(), minlength=12)
  np.testing.assert_array_equal(used, [3.0] * 7 + [0.0] * 5)
  orders = [tuple(e[m > 0].tolist()) for e, m in
            zip(idx.reshape(3, 15), bm.reshape(3, 15))]
  assert len(set(orders)) > 1


def _param_noise_defense():
  """Replaces the gradient by ``0.5 * batch.params + U(key)``: the result
  tells which parameters and which key the defense was called with."""

  def apply(grads, batch, key):
    del grads
    g = jax.tree_util.tree_map(
        lambda w: 0.5 * w + jax.random.uniform(key, w.shape), batch.params)
    return g, {"one": jnp.float32(1.0)}

  return defenses_base.Defense("param_noise", apply)


@pytest.mark.parametrize("defense_at", ["step", "update"])
def test_defense_sees_each_step_or_the_update_by_hand(logreg, defense_at):
  """Sun et al.'s defended FedAvg defends the gradient of every local step,
  taken at the current local parameters, with key ``fold_in(noise, t)``;
  'update' defends the delta once at the global parameters with the noise
  key. Client 1 (7 of 12 examples), 2 epochs of B = 4: batches t = 0, 1, 3, 4
  hold real examples, t = 2 and 5 only padding and are skipped. Client 4
  (no example) sends zeros either way."""
  lr = 0.1
  config = fedavg.FedAvgConfig(local_epochs=2, batch_size=4, client_lr=lr,
                               l2=0.1, defense=_param_noise_defense(),
                               defense_at=defense_at)
  data, keys = _data(), fedavg.key_streams(14)
  params = logreg.init(keys.init)
  tk, nk = fedavg.client_keys(keys, jnp.int32(0), jnp.int32(1))
  update = jax.jit(lambda c, t, n: fedavg.client_update(
      logreg, config, params, data.x[c], data.y[c], data.mask[c], t, n))
  delta, info = update(1, tk, nk)
  noise = lambda key: jax.tree_util.tree_map(
      lambda w: np.asarray(jax.random.uniform(key, w.shape)), params)
  p0 = jax.tree_util.tree_map(np.asarray, params)
  if defense_at == "step":
    p = p0
    for t in (0, 1, 3, 4):
      u = noise(jax.random.fold_in(nk, t))
      p = jax.tree_util.tree_map(lambda w, ui: w - lr * (0.5 * w + ui), p, u)
    want = jax.tree_util.tree_map(lambda a, b: a - b, p, p0)
    assert float(info["defense/one"]) == pytest.approx(1.0)
  else:
    want = jax.tree_util.tree_map(lambda w, ui: 0.5 * w + ui, p0, noise(nk))
  assert int(info["steps"]) == 4
  assert max_diff(delta, want) < 1e-6
  empty, info = update(4, *fedavg.client_keys(keys, jnp.int32(0),
                                              jnp.int32(4)))
  assert int(info["steps"]) == 0
  assert max_diff(empty, jax.tree_util.tree_map(np.zeros_like, p0)) == 0.0


def _np_cross_entropy(logits, y):
  logits = np.asarray(logits, np.float64)
  logp = logits - logits.max(-1, keepdims=True)
  logp = logp - np.log(np.exp(logp).sum(-1, keepdims=True))
  return -logp[np.arange(len(y)), np.asarray(y)]


def test_evaluate_and_global_loss_count_real_examples_only(logreg):
  """Test accuracy and loss average over the real test examples, not the
  batch padding; the federated objective is the mean loss over every real
  example of every client (not per client, not over padded slots) plus
  l2 / 2 ||w||^2; padding with NaN pixels and label -1 changes neither."""
  data = _data()
  params = jax.tree_util.tree_map(lambda p: p + 0.3,
                                  logreg.init(jax.random.key(15)))
  x = np.asarray(data.x[0, :7])
  logits = np.asarray(logreg.apply(params, jnp.asarray(x)))
  y = np.argmax(logits, -1)
  y[4:] = (y[4:] + 1) % 4  # 4 of 7 right.
  got = fedavg.evaluate(logreg, params, fedavg.make_eval_data(x, y, 3))
  assert float(got["test_accuracy"]) == pytest.approx(4 / 7, rel=1e-6)
  assert float(got["test_loss"]) == pytest.approx(
      _np_cross_entropy(logits, y).mean(), rel=1e-5)
  mask = np.asarray(data.mask) > 0
  xs, ys = np.asarray(data.x)[mask], np.asarray(data.y)[mask]
  losses = _np_cross_entropy(logreg.apply(params, jnp.asarray(xs)), ys)
  sq = sum(float(np.sum(np.asarray(w, np.float64) ** 2))
           for w in jax.tree_util.tree_leaves(params))
  want = losses.sum() / 46 + 0.5 * 0.2 * sq  # 12 + 7 + 12 + 3 + 0 + 12.
  assert float(fedavg.global_loss(logreg, params, data, 0.2, chunk=4)) == (
      pytest.approx(want, rel=1e-5))
  # Padding that holds NaN pixels and label -1 changes neither number.
  pad = np.asarray(data.mask) == 0
  hostile = data._replace(
      x=jnp.where(pad[..., None, None, None], jnp.nan, data.x),
      y=jnp.where(pad, -1, data.y))
  assert float(fedavg.global_loss(logreg, params, hostile, 0.2, chunk=4)) == (
      pytest.approx(want, rel=1e-5))
  test = fedavg.make_eval_data(x, y, 3)
  tpad = np.asarray(test.mask) == 0
  test = test._replace(
      x=jnp.where(tpad[..., None, None, None], jnp.nan, test.x),
      y=jnp.where(tpad, -1, test.y))
  got = fedavg.evaluate(logreg, params, test)
  assert float(got["test_accuracy"]) == pytest.approx(4 / 7, rel=1e-6)
  assert float(got["test_loss"]) == pytest.approx(
      _np_cross_entropy(logits, y).mean(), rel=1e-5)


def test_round_samples_by_the_configs_weighting_and_replace(logreg):
  """weighting='size', replace=False: every round draws 5 distinct clients
  (all that hold data) with fold_in(sampling, r), p = default_probs(data,
  'size') and replace=False, as the docs say; a probs argument overrides the
  default (all mass on client 3: client 3 every time)."""
  config = fedavg.FedAvgConfig(clients_per_round=5, local_steps=1,
                               batch_size=4, weighting="size", replace=False)
  data, keys = _data(), fedavg.key_streams(21)
  state = fedavg.init(logreg, config, keys.init)
  round_fn = fedavg.make_round(logreg, config)
  probs = fedavg.default_probs(data, "size")
  for r in range(3):
    state, m = round_fn(state, data, keys)
    ids = np.asarray(m["client_ids"])
    assert sorted(ids.tolist()) == [0, 1, 2, 3, 5]
    want = fedavg.sample_clients(jax.random.fold_in(keys.sampling, r), probs,
                                 5, replace=False)
    np.testing.assert_array_equal(ids, want)
  one_hot = jnp.zeros(6).at[3].set(1.0)
  _, m = fedavg.make_round(logreg, fedavg.FedAvgConfig(
      clients_per_round=3, local_steps=1, batch_size=4))(
          state, data, keys, probs=one_hot)
  np.testing.assert_array_equal(np.asarray(m["client_ids"]), [3, 3, 3])


def _count_defense():
  """Leaves the gradient alone; reports the real examples in the batch."""
  return defenses_base.Defense(
      "count", lambda g, b, k: (g, {"n": jnp.sum(b.mask)}))


def test_round_metrics_by_hand(logreg):
  """Clients 0 and 3 (12 and 3 examples), weighting='size' (w = 12/15,
  3/15), two full-batch steps at lr 0.5 with l2 = 0.5: train_loss is the
  weighted mean over clients of each client's mean step loss (l2 excluded),
  defense/n the weighted mean of the per-step info (12 and 3 examples), and
  test_* and global_loss are those of the model after the round."""
  lr, l2 = 0.5, 0.5
  config = fedavg.FedAvgConfig(clients_per_round=2, local_steps=2,
                               batch_size=100, client_lr=lr, l2=l2,
                               weighting="size", defense=_count_defense())
  data, keys = _data(), fedavg.key_streams(22)
  state = fedavg.init(logreg, config, keys.init)
  state = state.replace(params=jax.tree_util.tree_map(
      lambda p: p + 0.2, state.params))
  rng = np.random.default_rng(1)
  tx = rng.random((9, 4, 4, 1), dtype=np.float32)
  ty = rng.integers(0, 4, 9).astype(np.int32)
  test = fedavg.make_eval_data(tx, ty, 4)
  new, m = fedavg.make_round(logreg, config, eval_global_loss=True)(
      state, data, keys, test=test, client_ids=np.array([0, 3]))

  def objective(p, x, y):
    sq = sum(jnp.sum(w ** 2) for w in jax.tree_util.tree_leaves(p))
    return gradients.batch_loss(logreg, p, x, y) + 0.5 * l2 * sq

  client_loss = []
  for cid, n in ((0, 12), (3, 3)):
    x, y = data.x[cid, :n], data.y[cid, :n]
    p, losses = state.params, []
    for _ in range(2):
      losses.append(float(gradients.batch_loss(logreg, p, x, y)))
      g = jax.grad(objective)(p, x, y)
      p = jax.tree_util.tree_map(lambda w, gw: w - lr * gw, p, g)
    client_loss.append(np.mean(losses))
  w = np.array([12, 3]) / 15
  assert float(m["train_loss"]) == pytest.approx(w @ client_loss, rel=1e-5)
  assert float(m["defense/n"]) == pytest.approx(w @ [12, 3], rel=1e-6)
  logits = np.asarray(logreg.apply(new.params, jnp.asarray(tx)))
  assert float(m["test_accuracy"]) == pytest.approx(
      np.mean(np.argmax(logits, -1) == ty), abs=1e-6)
  assert float(m["test_loss"]) == pytest.approx(
      float(fedavg.evaluate(logreg, new.params, test)["test_loss"]), rel=1e-6)
  assert float(m["global_loss"]) == pytest.approx(
      float(fedavg.global_loss(logreg, new.params, data, l2)), rel=1e-6)
  assert float(m["global_loss"]) != pytest.approx(
      float(fedavg.global_loss(logreg, new.params, data, 0.0)), rel=1e-3)


def test_steps_per_round_counts_a_partial_last_batch():
  """local_epochs: E * ceil(M / B) steps (what _batch_plan plans), so
  Theorem 2's I for M = 31, B = 3, E = 2 is 22, and gamma = max(8, 22)."""
  for m, b, e in [(12, 5, 2), (31, 3, 2), (7, 7, 1), (7, 10, 3)]:
    cfg = fedavg.FedAvgConfig(local_epochs=e, batch_size=b)
    idx, _ = fedavg._batch_plan(jax.random.key(0), jnp.ones(m), cfg)  # pylint: disable=protected-access
    assert cfg.steps_per_round(m) == idx.shape[0] == e * -(-m // min(b, m))
  c = training.default_config()
  c.update(lr_schedule="theorem2", mu=1.0, smoothness=1.0, local_epochs=2,
           batch_size=3, model="logreg")
  fcfg = training.build_fedavg_config(
      c, models.get_model("logreg", (4, 4, 1), 4), padded_size=31)
  assert float(fcfg.client_lr(0)) == pytest.approx(2 / 22)


def test_rates_and_local_steps_take_scalars_and_name_the_argument():
  """Learning rates and Theorem 2's I accept NumPy and JAX scalars (0-d
  arrays too); anything else, a ragged list included, gets the one-line
  error naming the argument."""
  for lr in (0.1, np.float32(0.1), np.array(0.1), jnp.array(0.1)):
    schedules.check_rate(lr, "lr", "a finite number > 0")
  with pytest.raises(ValueError, match=r"^lr must be a finite number > 0, "
                     r"got \[1, \[2, 3\]\]\.$"):
    schedules.check_rate([1, [2, 3]], "lr", "a finite number > 0")
  for steps in (12, np.int64(12), np.array(12), jnp.array(12)):
    assert schedules.theorem2_gamma(1.0, 1.0, steps) == 12.0
  for steps in (2.5, True, np.array(True), np.array([3]), jnp.array(2.0), 0):
    with pytest.raises(ValueError, match="local_steps must be an integer >= 1"):
      schedules.theorem2_gamma(1.0, 1.0, steps)


def test_dp_sgd_is_a_step_defense_and_keeps_the_l2_term(logreg):
  """DP-SGD computes its own (clipped) gradient from the batch: with a clip
  no gradient reaches and no noise, a step defended by it is the plain
  step, l2 term included (it used to discard the l2 gradient it was
  handed); handed the model change ('update', a mod) or placed after
  another defense in a chain, it is refused in one line."""
  from repdef_jax.defenses import baselines  # pylint: disable=g-import-not-at-top
  data = _data(sizes=(12,) * N)
  params = logreg.init(jax.random.key(0))
  dp = baselines.dp_sgd(logreg, 1e6, 0.0)
  keys = fedavg.key_streams(0)

  def delta(defense, l2):
    cfg = fedavg.FedAvgConfig(local_steps=2, batch_size=6, client_lr=0.5,
                              l2=l2, defense=defense)
    train_key, noise_key = fedavg.client_keys(keys, 0, 0)
    return fedavg.client_update(logreg, cfg, params, data.x[0], data.y[0],
                                data.mask[0], train_key, noise_key)[0]

  assert max_diff(delta(dp, 10.0), delta(None, 10.0)) < 1e-5
  assert max_diff(delta(dp, 10.0), delta(dp, 0.0)) > 1e-2
  with pytest.raises(ValueError, match="defense_at='update' hands defense "
                     "'dp_sgd' the model change"):
    fedavg.FedAvgConfig(defense=dp, defense_at="update").validate()
  with pytest.raises(ValueError, match="put it first in the chain"):
    defenses_base.chain(baselines.compression(10.0), dp)
  assert defenses_base.chain(dp, baselines.compression(10.0)).recomputes
  config = training.default_config()
  config.update(defense="dp_sgd", defense_at="update")
  with pytest.raises(ValueError, match="hands dp_sgd the model change"):
    training._check_config(config)  # pylint: disable=protected-access


def test_dp_sgd_clip_norm_reaches_the_fedavg_run(logreg):
  """training's dp_clip_norm is the clip of the run's DP-SGD (it was always
  1.0); runs saved before the key existed resume as having 1.0."""
  config = training.default_config()
  config.update(defense="dp_sgd", defense_strength=0.0, dp_clip_norm=1e-6,
                l2=0.0)
  tiny = training.build_fedavg_config(config, logreg)
  config.dp_clip_norm = 1e6
  wide = training.build_fedavg_config(config, logreg)
  data = _data(sizes=(12,) * N)
  params = logreg.init(jax.random.key(0))
  batch = defenses_base.ClientBatch(params, data.x[0], data.y[0],
                                    data.mask[0])
  g_tiny, info = tiny.defense(None, batch, jax.random.key(1))
  g_wide, _ = wide.defense(None, batch, jax.random.key(1))
  assert float(info["clipped_fraction"]) == 1.0
  assert max_diff(g_tiny, jax.tree_util.tree_map(jnp.zeros_like, g_tiny)) < (
      1e-6)
  assert max_diff(g_wide, g_tiny) > 1e-3
  assert training.ADDED_KEYS["dp_clip_norm"] == 1.0
