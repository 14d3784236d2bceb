"""The hot loops compile once: no retrace inside defense, attack or FedAvg loops.

Two ways of counting traces are used:

* ``chex.assert_max_traces(n=1)`` around the Python function before
  ``jax.jit``: a second trace raises an AssertionError (it matters where a
  call's outputs come back as inputs, e.g. a round's state, or a value is
  traced that a sweep changes);
* ``jitted._cache_size()`` of the library's own jitted functions (the DLG and
  GS loops, the FedAvg round): the number of compiled specialisations, which
  must not grow when the same shapes come back with new values.

Every call below uses new data, keys or round indices of the same shapes and
dtypes as the first call, as the experiment loops do.
"""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from repdef_jax import attacks
from repdef_jax import defenses
from repdef_jax import fedavg
from repdef_jax import gradients
from repdef_jax import models
from repdef_jax.attacks import dlg as dlg_lib
from repdef_jax.attacks import inverting as inverting_lib


@pytest.fixture(autouse=True)
def _reset_trace_counter():
  chex.clear_trace_counter()
  yield
  chex.clear_trace_counter()


@pytest.fixture(scope="module")
def lenet():
  model = models.get_model("lenet", (8, 8, 1), 4, init="uniform")
  return model, model.init(jax.random.key(0))


def _batch(seed, b=2):
  k1, k2 = jax.random.split(jax.random.key(seed))
  return (jax.random.uniform(k1, (b, 8, 8, 1)),
          jax.random.randint(k2, (b,), 0, 4))


@pytest.mark.parametrize("name,kwargs", [
    ("soteria", {"strength": 60.0}),
    ("dp_gaussian", {"strength": 0.01}),
    ("compression", {"strength": 50.0}),
])
def test_defense_is_a_pure_function_under_jit(lenet, name, kwargs):
  """The defense traces (no host work inside), gives finite gradients, and
  the same inputs give the same outputs (a pure function of its
  arguments: nothing carried between calls)."""
  model, params = lenet
  defense = defenses.get_defense(name, kwargs["strength"], model=model)

  @jax.jit
  def defend(params, x, y, key):
    grads = gradients.batch_grad(model, params, x, y)
    return defense.apply(grads, defenses.ClientBatch(params, x, y), key)

  outs = []
  for step in range(3):  # New images, labels, params and key each call.
    x, y = _batch(step)
    p = jax.tree_util.tree_map(lambda a, s=step: a + 0.01 * s, params)
    outs.append(defend(p, x, y, jax.random.key(step)))
  assert all(bool(jnp.all(jnp.isfinite(leaf)))
             for leaf in jax.tree_util.tree_leaves(outs[-1][0]))
  x, y = _batch(0)
  again = defend(params, x, y, jax.random.key(0))
  chex.assert_trees_all_equal(again, outs[0])


def test_chained_defense_with_traced_strength_traces_once(lenet):
  """Soteria then noise; a sweep over pruning rates reuses one compile."""
  model, params = lenet

  @jax.jit
  @chex.assert_max_traces(n=1)
  def defend(percent, x, y, key):
    defense = defenses.chain(defenses.soteria_defense(model, percent),
                             defenses.dp_gaussian(0.01))
    grads = gradients.batch_grad(model, params, x, y)
    return defense.apply(grads, defenses.ClientBatch(params, x, y), key)

  for step, percent in enumerate((10.0, 40.0, 80.0)):
    x, y = _batch(step)
    _, info = defend(jnp.float32(percent), x, y, jax.random.key(step))
    assert float(info["0_soteria/pruned_fraction"]) == pytest.approx(
        percent / 100, abs=0.05)


def test_calls_outside_jit_run_one_compiled_program(lenet):
  """Called eagerly, Model.apply / features, batch_grad, per_example_grads
  and a Defense each build one program per shapes and reuse it for new
  values (run op by op, they took 3-4x longer on a first call)."""
  model, params = lenet
  calls = {
      "apply": (models._apply, lambda x, y: model.apply(params, x)),  # pylint: disable=protected-access
      "features": (models._apply, lambda x, y: model.features(params, x)),  # pylint: disable=protected-access
      "batch_grad": (gradients.batch_grad,
                     lambda x, y: gradients.batch_grad(model, params, x, y)),
      "per_example_grads": (gradients.per_example_grads, lambda x, y: (
          gradients.per_example_grads(model, params, x, y))),
  }
  for name, (jitted, call) in calls.items():
    before = jitted._cache_size()  # pylint: disable=protected-access
    for seed in (0, 1):  # A batch size no other test here uses.
      jax.block_until_ready(call(*_batch(seed, b=7)))
    assert jitted._cache_size() == before + 1, name  # pylint: disable=protected-access
  traces = []
  soteria = defenses.get_defense("soteria", 60.0, model=model)
  counted = defenses.Defense("counted", lambda g, b, k: (
      traces.append(1), soteria.apply(g, b, k))[1])
  for seed in (0, 1):
    x, y = _batch(seed)
    g = gradients.batch_grad(model, params, x, y)
    jax.block_until_ready(counted(g, defenses.ClientBatch(params, x, y),
                                  jax.random.key(seed)))
  assert len(traces) == 1  # Traced once: the second call runs the program.


def _logreg_setup():
  model = models.get_model("logreg", (4, 4, 1), 3, init="uniform")
  params = model.init(jax.random.key(0))
  return model, params


def _shared(model, params, seed):
  x = jax.random.uniform(jax.random.key(100 + seed), (1, 4, 4, 1))
  return gradients.batch_grad(model, params, x, jnp.array([seed % 3]))


@pytest.mark.parametrize("name,overrides,jitted", [
    ("dlg", {"outer_steps": 2, "inner_steps": 2}, dlg_lib._dlg_jit),  # pylint: disable=protected-access
    ("gs", {"iterations": 3, "restarts": 1}, inverting_lib._gs_jit),  # pylint: disable=protected-access
])
def test_repeated_attacks_do_not_retrace(name, overrides, jitted):
  """The main job attacks image after image: one compile for all of them."""
  model, params = _logreg_setup()
  attack = attacks.get_attack(name)
  jitted.clear_cache()  # the attack must compile through `jitted`
  before = None
  for i in range(3):
    # A fresh (equal) config object each call, as the main job builds it.
    res = attack(model, params, _shared(model, params, i), 1,
                 jax.random.key(i), labels=jnp.array([i % 3]),
                 **dict(overrides))
    jax.block_until_ready(res.x_rec)
    if before is None:
      before = jitted._cache_size()  # pylint: disable=protected-access
  assert before >= 1 and jitted._cache_size() == before  # pylint: disable=protected-access


def _fed_setup():
  model = models.get_model("logreg", (4, 4, 1), 4)
  rng = np.random.default_rng(0)
  data = fedavg.ClientArrays(
      jnp.asarray(rng.random((5, 6, 4, 4, 1), dtype=np.float32)),
      jnp.asarray(rng.integers(0, 4, (5, 6)).astype(np.int32)),
      jnp.ones((5, 6), jnp.float32))
  return model, data


@pytest.mark.parametrize("defense_name", ["none", "soteria"])
def test_fedavg_rounds_do_not_retrace(defense_name):
  """The round index changes every call; the round compiles once."""
  model, data = _fed_setup()
  defense = (None if defense_name == "none" else
             defenses.get_defense(defense_name, 50.0, model=model))
  config = fedavg.FedAvgConfig(clients_per_round=3, local_steps=2,
                               batch_size=3, defense=defense)
  keys = fedavg.key_streams(0)
  round_py = fedavg.make_round(model, config, jit=False)
  round_fn = jax.jit(chex.assert_max_traces(round_py, n=1))
  state = fedavg.init(model, config, keys.init)
  for _ in range(4):
    state, metrics = round_fn(state, data, keys)
  jax.block_until_ready(state)
  assert int(state.round) == 4
  assert np.isfinite(float(metrics["train_loss"]))
  assert round_fn._cache_size() == 1  # pylint: disable=protected-access


def test_library_round_with_donation_compiles_once():
  """make_round's own jit (donated state, test set) over several rounds."""
  model, data = _fed_setup()
  config = fedavg.FedAvgConfig(clients_per_round=2, local_steps=1,
                               batch_size=2)
  keys = fedavg.key_streams(1)
  test = fedavg.make_eval_data(np.asarray(data.x[0]), np.asarray(data.y[0]),
                               3)
  round_fn = fedavg.make_round(model, config, donate=True)
  state = fedavg.init(model, config, keys.init)
  for _ in range(3):
    state, _ = round_fn(state, data, keys, test=test)
  jax.block_until_ready(state)
  assert round_fn._cache_size() == 1  # pylint: disable=protected-access
