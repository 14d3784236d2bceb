"""Bad-input sweep: every public entry point with wrong or hostile input.

Each case drives one public function (library or command line) with one bad
input and asserts either a clear error whose message names the argument
(``pytest.raises(..., match=...)``) or a documented, recorded outcome (for
example a diverged attack recorded as ``diverged``). Cases are parametrised;
the outcome of each is collected in :data:`TABLE` and printed at the end of
the module (``pytest -s tests/test_bad_inputs.py``) or written as Markdown to
the file named by ``$REPDEF_BAD_INPUT_TABLE``.

Cases marked ``GAP`` are known weaknesses of files owned by other parts of the
project: they assert the *desired* behaviour and are ``xfail`` (non-strict)
until the fix named in their reason lands.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import sys
from typing import Any, Callable

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from repdef_jax import attacks
from repdef_jax import data
from repdef_jax import defenses
from repdef_jax import fedavg
from repdef_jax import gradients
from repdef_jax import metrics
from repdef_jax import models
from repdef_jax import partition
from repdef_jax import schedules
from repdef_jax import training
from repdef_jax.attacks import repinfer
from repdef_jax.defenses import certify
from repdef_jax.defenses import soteria

_ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
if _ROOT not in sys.path:
  sys.path.insert(0, _ROOT)
from repdef_jax.paper import harness  # pylint: disable=g-import-not-at-top,wrong-import-position
from repdef_jax.paper import main_job as attack_main  # pylint: disable=g-import-not-at-top,wrong-import-position

TABLE: dict[str, str] = {}


@dataclasses.dataclass(frozen=True)
class Case:
  """One bad input.

  Attributes:
    name: short id (entry point: input).
    fn: ``fn(env) -> result``; ``env`` holds shared fixtures.
    error: expected exception type, or None for a recorded outcome.
    match: regex the message must match (names the argument).
    check: for ``error=None``: ``check(result)`` asserts the outcome and
      returns its description for the table.
    gap: non-empty: a known gap (xfail) with the fix that closes it.
  """

  name: str
  fn: Callable[[dict], Any]
  error: type | tuple[type, ...] | None = ValueError
  match: str = ""
  check: Callable[[Any], str] | None = None
  gap: str = ""


@pytest.fixture(scope="module")
def env():
  """A tiny LeNet, its parameters and the gradient of one image."""
  model = models.get_model("lenet", (8, 8, 1), 4, init="uniform")
  params = model.init(jax.random.key(0))
  x = jnp.full((1, 8, 8, 1), 0.5)
  y = jnp.array([1])
  grads = gradients.batch_grad(model, params, x, y)
  ones = fedavg.ClientArrays(jnp.zeros((3, 2, 8, 8, 1)),
                             jnp.zeros((3, 2), jnp.int32), jnp.ones((3, 2)))
  empty = ones._replace(mask=jnp.zeros((3, 2)))
  return {"model": model, "params": params, "x": x, "y": y, "grads": grads,
          "clients": ones, "empty_clients": empty, "key": jax.random.key(0)}


def _noniid(labels, **kw):
  args = dict(num_clients=1, classes_per_client=1, samples_per_class=1, seed=0)
  return partition.noniid(np.asarray(labels), **{**args, **kw})


def _pack(client_indices, **kw):
  return partition.pack(np.zeros((2, 4, 4, 1)), np.zeros(2, int),
                        client_indices, **kw)


def _nan_like(tree):
  return jax.tree_util.tree_map(lambda a: a * jnp.nan, tree)


def _attack(e, name="dlg", grads=None, n=1, **kw):
  return attacks.get_attack(name)(e["model"], e["params"],
                                  e["grads"] if grads is None else grads, n,
                                  e["key"], **kw)


def _diverged_dlg(_):
  model = models.get_model("logreg", (4, 4, 1), 3, init="uniform")
  params = model.init(jax.random.key(0))
  g = gradients.batch_grad(model, params, jnp.ones((1, 4, 4, 1)),
                           jnp.array([1]))
  return attacks.to_host(attacks.dlg_attack(
      model, params, g, 1, jax.random.key(1),
      config=attacks.DLGConfig(outer_steps=2, max_abs_pixel=1e-3)))


def _check_diverged(res) -> str:
  assert res.diverged is True
  assert np.all(np.isfinite(res.x_rec))  # Last sane iterate, not NaN.
  return "recorded: diverged=True, x_rec = last finite iterate"


def _check_nonfinite_metrics(m) -> str:
  assert m["finite"] is False and m["mse"] == float("inf")
  assert 0.0 <= m["mse_clamped"] <= 1.0 and np.isfinite(m["psnr"])
  return "recorded: finite=False, mse=inf, clamped metrics finite"


def _check_empty_client(out) -> str:
  weights, delta_norm = out
  assert weights[0] == 0.0 and delta_norm == 0.0
  return "recorded: weight 0, zero delta, no step"


def _round_call(e, jit=True, data=None, keys=None, **kw):
  """One round of the tiny LeNet on ``env``'s 3 clients (2 per round)."""
  config = fedavg.FedAvgConfig(clients_per_round=2)
  round_fn = fedavg.make_round(e["model"], config, mesh=None, jit=jit)
  return round_fn(fedavg.init(e["model"], config, KEY),
                  e["clients"] if data is None else data,
                  fedavg.key_streams(0) if keys is None else keys, **kw)


def _empty_client_round(e):
  model = models.get_model("logreg", (4, 4, 1), 4)
  cfg = fedavg.FedAvgConfig(clients_per_round=2, local_steps=1)
  x = jnp.ones((2, 3, 4, 4, 1))
  mask = jnp.array([[0., 0., 0.], [1., 1., 1.]])
  clients = fedavg.ClientArrays(x, jnp.zeros((2, 3), jnp.int32), mask)
  keys = fedavg.key_streams(0)
  state = fedavg.init(model, cfg, keys.init)
  _, m = fedavg.make_round(model, cfg, return_client_updates=True)(
      state, clients, keys, client_ids=jnp.array([0, 1]))
  d0 = jax.tree_util.tree_map(lambda d: d[0], m["client_updates"])
  norm = sum(float(jnp.sum(jnp.abs(a))) for a in jax.tree_util.tree_leaves(d0))
  return np.asarray(m["weights"]), norm


def _check_propagates_nan(out) -> str:
  grads, _ = out
  assert not all(bool(jnp.all(jnp.isfinite(g)))
                 for g in jax.tree_util.tree_leaves(grads))
  return "recorded: NaN propagates to the shared gradient (visible)"


def _check_not_silently_finite(grads) -> str:
  finite = all(bool(jnp.all(jnp.isfinite(a)))
               for a in jax.tree_util.tree_leaves(grads))
  assert not finite, "silent: a finite gradient for an impossible label"
  return "recorded: NaN gradient (caught by check_finite downstream)"


def _check_nonfinite_input_flagged(out) -> str:
  _, info = out
  assert "nonfinite_input" in info, (
      f"silent: pruned_fraction={float(info['pruned_fraction'])}, no flag")
  assert bool(info["nonfinite_input"])
  return "recorded: info['nonfinite_input'] = True"


def _attack_run(tmp, **overrides):
  cfg = {"dataset": "mnist", "attack": "gs", "defense": "none",
         "num_images": 1, "iterations": 1, **overrides}
  return attack_main.run(cfg, str(tmp), verbose=False)


def _train(tmp, **overrides):
  c = training.default_config()
  c.update({"rounds": 2, "num_clients": 4, "clients_per_round": 2,
            "plot": False, "data_dir": "/nonexistent/tfds", **overrides})
  return training.train_and_evaluate(ml_collections.ConfigDict(c.to_dict()),
                                     str(tmp))


def _train_early(tmp, **overrides):
  """``_train`` into ``tmp``; returns (error, whether ``tmp`` exists)."""
  try:
    _train(tmp, **overrides)
  except ValueError as error:
    return str(error), os.path.exists(tmp)
  return None, os.path.exists(tmp)


def _no_workdir(result, pattern: str) -> str:
  """The setting was refused, naming it, before the workdir was made."""
  message, made = result
  assert message is not None and re.search(pattern, message), message
  assert not made, "the workdir was created before the check"
  return f"refused before any file is written: {message}"


def _cli(module: str, *flags_: str) -> subprocess.CompletedProcess:
  return subprocess.run([sys.executable, "-m", module, *flags_], cwd=_ROOT,
                        capture_output=True, text=True, timeout=120,
                        env={**os.environ, "JAX_PLATFORMS": "cpu"})


def _cli_error(proc: subprocess.CompletedProcess, pattern: str) -> str:
  assert proc.returncode != 0
  text = proc.stdout + proc.stderr
  assert re.search(pattern, text), text[-2000:]
  return f"exit {proc.returncode}, message matches {pattern!r}"


def _one_line_error(proc: subprocess.CompletedProcess, pattern: str) -> str:
  """A CLI error: exit 1 and the message on one line, no traceback."""
  assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
  [line] = [ln for ln in proc.stderr.splitlines() if ": error: " in ln]
  assert re.search(pattern, line), line
  return f"exit 1, one line: {line[:80]}..."


def _cli_workdir_file(e):
  path = e["tmp"] / "a_file"
  path.write_text("not a folder")
  return _cli("experiments.attack", f"--workdir={path}")


def _attack_run_corrupt_results(e):
  (e["tmp"] / "results.json").write_text("{bad")
  return _attack_run(e["tmp"])


KEY = jax.random.key(0)
CASES = [
    # ---- models ---------------------------------------------------------
    Case("models.get_model: unknown name", lambda e: models.get_model("resnet"),
         match="Unknown model name 'resnet'; valid names: lenet"),
    Case("models.get_model: bad init",
         lambda e: models.get_model("lenet", init="xavier"), match="init"),
    Case("models.get_model: bad conv_impl",
         lambda e: models.get_model("lenet", conv_impl="fft"),
         match="conv_impl"),
    Case("models.get_model: 2-D input_shape",
         lambda e: models.get_model("lenet", (8, 8)), match="input_shape"),
    Case("models.get_model: negative input size",
         lambda e: models.get_model("lenet", (8, -8, 1)), match="input_shape"),
    Case("models.get_model: num_classes=1",
         lambda e: models.get_model("lenet", (8, 8, 1), 1),
         match="num_classes"),
    Case("models.get_model: num_classes 10.0",
         lambda e: models.get_model("mlp", (8, 8, 1), 10.0),
         match=r"num_classes must be an integer >= 2, got 10\.0\."),
    Case("models.get_model: mlp hidden an int",
         lambda e: models.get_model("mlp", (8, 8, 1), 4, hidden=100),
         match=r"hidden must be a tuple of integers >= 1, e\.g\. \(200, "
               r"200\) or \(\); got 100\."),
    Case("models.get_model: convnet64 width 0",
         lambda e: models.get_model("convnet64", (8, 8, 1), 4, width=0),
         match=r"width must be an integer >= 1, got 0\."),
    Case("Model.init: an int seed",
         lambda e: e["model"].init(0),
         match=r"rng must be one PRNG key \(jax\.random\.key\(seed\)\); "
               r"got 0\."),
    Case("Model.init: the whole key streams",
         lambda e: e["model"].init(fedavg.key_streams(0)),
         match=r"rng must be one PRNG key \(jax\.random\.key\(seed\)\); "
               r"got KeyStreams\."),
    Case("Model.init: a batch of keys",
         lambda e: e["model"].init(jax.random.split(e["key"], 3)),
         match=r"rng must be one PRNG key .*got \w+ of shape \(3,\) and "
               r"dtype key<fry>\."),
    Case("Model.apply: parameters of another model",
         lambda e: e["model"].apply(
             models.get_model("logreg", (8, 8, 1), 4).init(e["key"]), e["x"]),
         match=r"params do not match model 'lenet' on images \(8, 8, 1\) "
               r"\(pass the 'params' collection of its init\): Could not "
               r"find parameter"),
    Case("Model.apply: {'params': params}",
         lambda e: e["model"].apply({"params": e["params"]}, e["x"]),
         match=r"params do not match model 'lenet'.*extra params layer"),
    Case("models.get_model: image too small for lenet5",
         lambda e: models.get_model("lenet5", (4, 4, 1)),
         match="cannot take images of shape"),
    Case("Model.apply: unbatched image",
         lambda e: e["model"].apply(e["params"], jnp.zeros((8, 8, 1))),
         match="x must be a batch of images of shape"),
    Case("Model.apply: wrong image size",
         lambda e: e["model"].apply(e["params"], jnp.zeros((1, 9, 9, 1))),
         match="x must be a batch of images of shape"),
    Case("Model.apply: int32 images",
         lambda e: e["model"].apply(e["params"],
                                    jnp.zeros((1, 8, 8, 1), jnp.int32)),
         error=(TypeError, ValueError), match="x must be floating"),
    # ---- gradients ------------------------------------------------------
    Case("gradients.cross_entropy: float hard labels",
         lambda e: gradients.cross_entropy(jnp.zeros((2, 4)), jnp.zeros((2,))),
         match="labels must be integer class ids"),
    Case("gradients.cross_entropy: soft labels with wrong K",
         lambda e: gradients.cross_entropy(jnp.zeros((2, 4)),
                                           jnp.zeros((2, 3))),
         error=(TypeError, ValueError), match="labels"),
    Case("gradients.batch_grad: y of wrong length",
         lambda e: gradients.batch_grad(e["model"], e["params"],
                                        jnp.ones((2, 8, 8, 1)),
                                        jnp.array([1, 2, 3])),
         match="y has"),
    Case("gradients.per_example_grads: y of wrong length",
         lambda e: gradients.per_example_grads(e["model"], e["params"],
                                               jnp.ones((2, 8, 8, 1)),
                                               jnp.array([1, 2, 3])),
         match="y has 3 labels for 2 images"),
    Case("gradients.batch_grad: label >= num_classes",
         lambda e: gradients.batch_grad(e["model"], e["params"], e["x"],
                                        jnp.array([7])),
         error=None, check=_check_not_silently_finite),
    Case("gradients.check_grads_match: missing layer",
         lambda e: gradients.check_grads_match(e["params"],
                                               {"head": e["grads"]["head"]}),
         match="grads does not match the parameter tree"),
    Case("gradients.check_finite: NaN gradient",
         lambda e: gradients.check_finite(_nan_like(e["grads"])),
         match=r"grads holds NaN or inf at \['conv0'\]"),
    # ---- defenses -------------------------------------------------------
    Case("defenses.get_defense: unknown name",
         lambda e: defenses.get_defense("dropout"),
         match="valid names: none, soteria"),
    Case("defenses.get_defense: soteria percent 150",
         lambda e: defenses.get_defense("soteria", 150, model=e["model"]),
         match=r"percent must be a number in \[0, 100\]"),
    Case("defenses.get_defense: soteria percent -1",
         lambda e: defenses.get_defense("soteria", -1, model=e["model"]),
         match=r"percent must be a number in \[0, 100\]"),
    Case("defenses.get_defense: soteria percent NaN",
         lambda e: defenses.get_defense("soteria", float("nan"),
                                        model=e["model"]),
         match="percent"),
    Case("defenses.get_defense: soteria percent 'abc'",
         lambda e: defenses.get_defense("soteria", "abc", model=e["model"]),
         match="percent"),
    Case("defenses.get_defense: soteria without model",
         lambda e: defenses.get_defense("soteria", 50), match="needs model="),
    Case("defenses.get_defense: compression 101",
         lambda e: defenses.get_defense("compression", 101), match="percent"),
    Case("defenses.get_defense: dp_gaussian scale -1",
         lambda e: defenses.get_defense("dp_gaussian", -1.0),
         match="scale must be a finite number >= 0"),
    Case("defenses.get_defense: dp_laplace scale inf",
         lambda e: defenses.get_defense("dp_laplace", float("inf")),
         match="scale"),
    Case("defenses.get_defense: dp_sgd clip_norm 0",
         lambda e: defenses.get_defense("dp_sgd", 1.0, model=e["model"],
                                        clip_norm=0.0), match="clip_norm"),
    Case("defenses.get_defense: dp_sgd noise -1",
         lambda e: defenses.get_defense("dp_sgd", -1.0, model=e["model"]),
         match="noise_multiplier"),
    Case("defense call: an int key",
         lambda e: defenses.get_defense("dp_gaussian", 0.1)(
             e["grads"], defenses.ClientBatch(e["params"], e["x"], e["y"]),
             0),
         match=r"key must be one PRNG key \(jax.random.key\(seed\)\); "
         "got 0"),
    Case("defense call: a raw key of the wrong length",
         lambda e: defenses.get_defense("dp_gaussian", 0.1)(
             e["grads"], defenses.ClientBatch(e["params"], e["x"], e["y"]),
             jnp.zeros(5, jnp.uint32)),
         match=r"key must be one PRNG key"),
    Case("defenses.chain: a member that is no defense",
         lambda e: defenses.chain(defenses.get_defense("dp_gaussian", 0.1),
                                  "soteria"),
         match="defense must be a repdef_jax Defense.*got str"),
    Case("defenses.check_strength: dp_sgd noise -1",
         lambda e: defenses.check_strength("dp_sgd", -1.0),
         match=r"strength \(dp_sgd\): noise_multiplier must be a finite"),
    Case("defenses.check_strength: unknown defense",
         lambda e: defenses.check_strength("foo", 1.0),
         match="strength: unknown defense 'foo'; valid names: none, soteria"),
    Case("defenses.certified_bound: keep_mask of the wrong length",
         lambda e: defenses.certified_bound(e["model"], e["params"], e["x"],
                                            jnp.ones(3)),
         match=r"keep_mask must have shape \[F\]"),
    Case("defenses.empirical_bound: one reconstruction for two images",
         lambda e: defenses.empirical_bound(e["model"], e["params"],
                                            jnp.concatenate([e["x"]] * 2),
                                            e["x"]),
         match=r"x_rec \(1, 8, 8, 1\) and x \(2, 8, 8, 1\) differ in shape"),
    Case("certify.input_distance: one reconstruction for two images",
         lambda e: certify.input_distance(jnp.zeros((2, 8, 8, 1)),
                                          jnp.zeros((1, 8, 8, 1))),
         match=r"x_rec \(1, 8, 8, 1\) and x \(2, 8, 8, 1\) differ in shape"),
    Case("soteria: batch None (the form dp_gaussian accepts)",
         lambda e: defenses.get_defense("soteria", 60, model=e["model"])(
             e["grads"], None, e["key"]),
         match=r"this defense reads the client's batch: pass batch="
               r"ClientBatch\(params, x, y\[, mask\]\); got NoneType\."),
    Case("defenses.get_defense: unknown keyword",
         lambda e: defenses.get_defense("soteria", 50, model=e["model"],
                                        bogus=1),
         error=TypeError, match="bogus"),
    Case("soteria: score name", lambda e: defenses.soteria_defense(
        e["model"], 50, score="best"), match="score must be one of"),
    Case("soteria: selection name", lambda e: defenses.soteria_defense(
        e["model"], 50, selection="top"), match="selection must be one of"),
    Case("soteria: unregistered q", lambda e: defenses.soteria_defense(
        e["model"], 50, q=7), match="q must name a registered perturbation"),
    Case("soteria: eps < 0", lambda e: defenses.soteria_defense(
        e["model"], 50, eps=-1.0), match="eps must be a finite number >= 0"),
    Case("soteria: eps a string", lambda e: defenses.soteria_defense(
        e["model"], 50, eps="abc"), match="eps must be a finite.*got 'abc'"),
    Case("soteria: protect_bias a string", lambda e: defenses.soteria_defense(
        e["model"], 50, protect_bias="yes"),
         match="protect_bias must be True or False, got 'yes'"),
    Case("soteria.feature_scores: eps < 0",
         lambda e: defenses.soteria.feature_scores(
             e["model"].feature_fn(e["params"]), e["x"], eps=-1.0),
         match="eps must be a finite number >= 0, got -1.0"),
    Case("soteria: model without defended layer",
         lambda e: defenses.soteria_defense(dataclasses.replace(
             e["model"], defended_path=("nohead",)), 50),
         match="no defended linear layer"),
    Case("soteria.feature_scores: features_fn not 1-D",
         lambda e: soteria.feature_scores(lambda xi: xi, e["x"]),
         match="features_fn must map one input to a 1-D"),
    Case("soteria.mask_from_scores: 2-D scores",
         lambda e: soteria.mask_from_scores(jnp.ones((2, 2)), 10),
         match="scores must be 1-D"),
    Case("soteria.apply_mask: mask of wrong length",
         lambda e: soteria.apply_mask(e["grads"], jnp.ones(3), e["model"]),
         match="mask must have shape"),
    Case("soteria.apply: image of wrong shape",
         lambda e: defenses.get_defense("soteria", 50, model=e["model"])(
             e["grads"], defenses.ClientBatch(e["params"],
                                              jnp.ones((1, 9, 9, 1)), e["y"]),
             KEY), match="x must be a batch of images"),
    Case("soteria.apply: NaN image",
         lambda e: jax.jit(defenses.get_defense(
             "soteria", 50, model=e["model"]).apply)(
                 e["grads"], defenses.ClientBatch(e["params"],
                                                  e["x"] * jnp.nan, e["y"]),
                 KEY),
         error=None, check=_check_nonfinite_input_flagged),
    Case("dp_gaussian.apply: NaN gradient",
         lambda e: jax.jit(defenses.get_defense("dp_gaussian", 0.1).apply)(
             _nan_like(e["grads"]), None, KEY),
         error=None, check=_check_propagates_nan),
    Case("defenses.dp_sgd_epsilon: sample_rate 0",
         lambda e: defenses.dp_sgd_epsilon(1.0, 0.0, 10, 1e-5),
         match="sample_rate"),
    Case("defenses.dp_sgd_epsilon: delta 1.5",
         lambda e: defenses.dp_sgd_epsilon(1.0, 0.1, 10, 1.5), match="delta"),
    Case("defenses.dp_sgd_epsilon: steps 2.5",
         lambda e: defenses.dp_sgd_epsilon(1.0, 0.1, 2.5, 1e-5),
         match="steps"),
    Case("defenses.dp_sgd_epsilon: steps 'a'",
         lambda e: defenses.dp_sgd_epsilon(1.0, 0.1, "a", 1e-5),
         match="steps must be an integer >= 0"),
    Case("defenses.dp_sgd_epsilon: delta 'x'",
         lambda e: defenses.dp_sgd_epsilon(1.0, 0.1, 10, "x"),
         match="delta must be in"),
    Case("defenses.get_defense: dp_sgd normalizer 'mean'",
         lambda e: defenses.get_defense("dp_sgd", 1.0, model=e["model"],
                                        normalizer="mean"),
         match="normalizer must be one of"),
    Case("defenses.get_defense: compression percent '50'",
         lambda e: defenses.get_defense("compression", "50"),
         match="percent must be a number"),
    Case("soteria: jacobian_conv_impl name", lambda e: defenses.soteria_defense(
        e["model"], 50, jacobian_conv_impl="fast"),
         match="jacobian_conv_impl must be one of"),
    Case("soteria.representation_jacobian_norms: chunk 2.5",
         lambda e: soteria.representation_jacobian_norms(
             e["model"], e["params"], e["x"], chunk=2.5),
         match="chunk must be a positive int"),
    Case("soteria.representation_jacobian_norms: jacobian 'forward'",
         lambda e: soteria.representation_jacobian_norms(
             e["model"], e["params"], e["x"], jacobian="forward"),
         match="jacobian must be one of"),
    # ---- attacks --------------------------------------------------------
    Case("attacks.get_attack: unknown name",
         lambda e: attacks.get_attack("dlg++"),
         match="valid names: dlg, idlg, gs"),
    Case("attack: gradient tree missing layers",
         lambda e: _attack(e, grads={"head": e["grads"]["head"]}),
         match="shared_grads does not match the parameter tree"),
    Case("attack: gradient leaf of wrong shape",
         lambda e: _attack(e, grads=jax.tree_util.tree_map(
             lambda a: a[..., :1], e["grads"])),
         match="shared_grads has a leaf of shape"),
    Case("attack: NaN in shared gradient",
         lambda e: _attack(e, grads=_nan_like(e["grads"])),
         match="shared_grads holds NaN or inf"),
    Case("attack: inf in shared gradient",
         lambda e: _attack(e, "gs", grads=jax.tree_util.tree_map(
             lambda a: a + jnp.inf, e["grads"])),
         match="shared_grads holds NaN or inf"),
    Case("attack: num_images 0", lambda e: _attack(e, n=0),
         match="num_images must be >= 1"),
    Case("attack: label out of range", lambda e: _attack(e, labels=[9]),
         match=r"labels must lie in \[0, 4\)"),
    Case("attack: float labels", lambda e: _attack(e, labels=[1.0]),
         match="labels must be integer class ids"),
    Case("attack: labels of wrong length",
         lambda e: _attack(e, labels=[1, 2]),
         match="labels must be integer class ids of shape"),
    Case("attack: unknown config field", lambda e: _attack(e, bogus=3),
         error=TypeError, match=r"Unknown setting\(s\) bogus for attack "
         r"'dlg'; DLGConfig has .*outer_steps"),
    Case("repinfer.infer_classes: the whole update tree",
         lambda e: repinfer.infer_classes(e["grads"]),
         match=r"expected one Dense layer's update .*got a dict with keys "
         r"\['conv0'"),
    Case("attack: a flax module as the model",
         lambda e: attacks.get_attack("dlg")(
             e["model"].module, e["params"], e["grads"], 1, e["key"]),
         match=r"model must be a repdef_jax Model \(repdef_jax.get_model"),
    Case("attack: config of the wrong attack",
         lambda e: _attack(e, config=attacks.GSConfig()),
         match="takes a DLGConfig"),
    Case("attack: unknown L-BFGS optimizer",
         lambda e: _attack(e, optimizer="sgd", outer_steps=1, inner_steps=1),
         match="optimizer must be one of torch, linesearch, optax"),
    Case("attack: outer_steps 0", lambda e: _attack(e, outer_steps=0),
         error=(ValueError,), match="outer_steps"),
    Case("attack: outer_steps -1", lambda e: _attack(e, outer_steps=-1),
         error=(ValueError,), match="outer_steps"),
    Case("attack: integer instead of a PRNG key",
         lambda e: attacks.get_attack("dlg")(e["model"], e["params"],
                                            e["grads"], 1, 0, outer_steps=1),
         error=(TypeError, ValueError), match="key"),
    Case("gs: box with wrong channel count",
         lambda e: _attack(e, "gs", lower=(0.0, 0.0, 0.0)),
         match="lower has 3 values"),
    Case("gs: restarts 0", lambda e: _attack(e, "gs", restarts=0),
         match="restarts must be an integer >= 1; got 0"),
    Case("gs: labels required but infer_label off",
         lambda e: _attack(e, "gs", infer_label=False),
         match="labels are required"),
    Case("gs: lower > upper",
         lambda e: _attack(e, "gs", lower=1.0, upper=0.0, iterations=1,
                           restarts=1),
         match="lower"),
    Case("dlg: diverging attack", _diverged_dlg, error=None,
         check=_check_diverged),
    # ---- metrics --------------------------------------------------------
    Case("metrics.reconstruction_metrics: shape mismatch",
         lambda e: metrics.reconstruction_metrics(np.zeros((1, 4, 4, 1)),
                                                  np.zeros((1, 4, 4, 3))),
         match="x_rec .* and x_true .* differ"),
    Case("metrics.reconstruction_metrics: unknown pixel space",
         lambda e: metrics.reconstruction_metrics(
             np.zeros((1, 4, 4, 1)), np.zeros((1, 4, 4, 1)),
             pixel_space="normalized"), match="pixel_space"),
    Case("metrics.reconstruction_metrics: NaN reconstruction",
         lambda e: metrics.reconstruction_metrics(
             np.full((1, 4, 4, 1), np.nan), np.zeros((1, 4, 4, 1))),
         error=None, check=_check_nonfinite_metrics),
    Case("metrics.reconstruction_metrics: inf reconstruction",
         lambda e: metrics.reconstruction_metrics(
             np.full((1, 4, 4, 1), np.inf), np.zeros((1, 4, 4, 1))),
         error=None, check=_check_nonfinite_metrics),
    Case("metrics.label_accuracy: shape mismatch",
         lambda e: metrics.label_accuracy([1, 2], [1]),
         match="label shapes differ"),
    Case("metrics.match_images: batch mismatch",
         lambda e: metrics.match_images(np.zeros((2, 4, 4, 1)),
                                        np.zeros((3, 4, 4, 1))),
         match="differ in shape"),
    Case("metrics.mse_raw: batch 1 vs 3 (broadcast)",
         lambda e: metrics.mse_raw(np.zeros((1, 4, 4, 1)),
                                   np.ones((3, 4, 4, 1))),
         match="x_rec"),
    Case("metrics.reconstruction_metrics: uint8 originals (data.load's)",
         lambda e: metrics.reconstruction_metrics(
             np.zeros((1, 4, 4, 1)), np.full((1, 4, 4, 1), 255, np.uint8)),
         match=r"x_true must be float images in \[0, 1\], got uint8 with "
               r"max 255; convert with repdef_jax.data.to_float"),
    Case("metrics.ssim: channels-first images",
         lambda e: metrics.ssim(np.zeros((2, 3, 32, 32)),
                                np.zeros((2, 3, 32, 32))),
         match=r"x_rec must be channels-last \[B, H, W, C\]; shape "
               r"\(2, 3, 32, 32\) looks channels-first"),
    Case("metrics.ssim: empty batch",
         lambda e: metrics.ssim(np.zeros((0, 8, 8, 1)), np.zeros((0, 8, 8, 1))),
         match=r"x_rec is an empty batch"),
    Case("paper.harness.attack_gradient: uint8 originals",
         lambda e: harness.attack_gradient(
             e["model"], e["params"], e["grads"],
             np.full((1, 8, 8, 1), 128, np.uint8), e["y"], "dlg", e["key"]),
         match=r"x_true must be float images in \[0, 1\], got uint8"),
    Case("metrics.representation_correlation: size mismatch",
         lambda e: metrics.representation_correlation(np.arange(3.0),
                                                      np.arange(4.0)),
         match="r_est"),
    # ---- data -----------------------------------------------------------
    Case("data.get_info: unknown dataset", lambda e: data.get_info("imagenet"),
         match="Unknown dataset name='imagenet'; expected one of"),
    Case("data.load: unknown split", lambda e: data.load("mnist", "valid"),
         match="Unknown split='valid'"),
    Case("data.load: max_examples -1",
         lambda e: data.load("mnist", "test", max_examples=-1),
         match="max_examples"),
    Case("data.load: missing data directory",
         lambda e: data.load("mnist", "test", data_dir="/nonexistent/tfds"),
         error=FileNotFoundError, match="data_dir"),
    Case("data.to_float: int32 images",
         lambda e: data.to_float(np.zeros((2, 2), np.int32)),
         error=TypeError, match="uint8 or floating-point"),
    Case("data.normalize: wrong channel count",
         lambda e: data.normalize(np.zeros((2, 4, 4, 3)), "mnist"),
         match="1 channel"),
    # ---- partition ------------------------------------------------------
    Case("partition.noniid: 2-D labels",
         lambda e: _noniid(np.zeros((2, 2), int)),
         match="labels must be a 1-D"),
    Case("partition.noniid: float labels",
         lambda e: _noniid([1.0, 0.0]), match="integer"),
    Case("partition.noniid: negative labels",
         lambda e: _noniid([-1, 0]), match="non-negative"),
    Case("partition.noniid: num_clients 0",
         lambda e: _noniid([1, 0], num_clients=0),
         match="num_clients must be > 0"),
    Case("partition.noniid: num_clients 1.5",
         lambda e: _noniid([1, 0], num_clients=1.5),
         match="num_clients must be an int"),
    Case("partition.noniid: more classes per client than classes",
         lambda e: _noniid([1, 0], classes_per_client=3),
         match="classes_per_client=3"),
    Case("partition.noniid: not enough samples",
         lambda e: _noniid([1, 0], num_clients=2, samples_per_class=2),
         match="needs .* samples"),
    Case("partition.noniid: negative seed",
         lambda e: _noniid([0, 1], seed=-1),
         match=r"seed must be an integer >= 0, got -1\."),
    Case("partition.iid: float seed",
         lambda e: partition.iid(4, num_clients=2, seed=1.5),
         match=r"seed must be an integer >= 0, got 1\.5\."),
    Case("partition.dirichlet: negative seed",
         lambda e: partition.dirichlet(np.array([0, 1, 0, 1]), num_clients=2,
                                       alpha=1.0, seed=-3),
         match=r"seed must be an integer >= 0, got -3\."),
    Case("partition.iid: negative num_examples",
         lambda e: partition.iid(-1, num_clients=2, seed=0),
         match="num_examples"),
    Case("partition.iid: too many samples per client",
         lambda e: partition.iid(5, num_clients=2, samples_per_client=3,
                                 seed=0), match="need 6 examples"),
    Case("partition.dirichlet: alpha NaN",
         lambda e: partition.dirichlet(np.array([1, 0]), num_clients=1,
                                       alpha=float("nan"), seed=0),
         match="alpha must be a finite number > 0"),
    Case("partition.dirichlet: min_size a string",
         lambda e: partition.dirichlet(np.array([1, 0]), num_clients=1,
                                       alpha=1.0, seed=0, min_size="a"),
         match="min_size must be an int >= 0, got 'a'"),
    Case("partition.dirichlet: min_size 1.5",
         lambda e: partition.dirichlet(np.array([1, 0]), num_clients=1,
                                       alpha=1.0, seed=0, min_size=1.5),
         match="min_size must be an int >= 0, got 1.5"),
    Case("partition.dirichlet: min_size unreachable",
         lambda e: partition.dirichlet(np.array([1, 0]), num_clients=2,
                                       alpha=1.0, seed=0, min_size=2),
         match="min_size"),
    Case("partition.pack: no clients",
         lambda e: _pack([]), match="client_indices is empty"),
    Case("partition.pack: images/labels length mismatch",
         lambda e: partition.pack(np.zeros((2, 4, 4, 1)), np.zeros(3, int),
                                  [np.array([0])]), match="differ in length"),
    Case("partition.pack: one-hot labels",
         lambda e: partition.pack(np.zeros((2, 4, 4, 1)), np.eye(2),
                                  [np.array([0])]),
         match=r"labels must be \[N\] integer class ids, got shape \(2, 2\)"),
    Case("partition.pack: client larger than max_examples",
         lambda e: _pack([np.array([0, 1])], max_examples=1),
         match="max_examples=1"),
    Case("partition.pack: index out of range",
         lambda e: _pack([np.array([5])]), match="client_indices"),
    Case("partition.pack: negative index",
         lambda e: _pack([np.array([-1])]), match="client_indices"),
    Case("partition.pad_clients: fewer clients than present",
         lambda e: partition.pad_clients(_pack([np.array([0])]), 0),
         match="num_clients=0 is smaller"),
    Case("partition.class_counts: label >= num_classes",
         lambda e: partition.class_counts(np.array([5]), [np.array([0])], 3),
         match="out of range for num_classes=3"),
    # ---- schedules ------------------------------------------------------
    Case("schedules.constant: lr 0", lambda e: schedules.constant(0.0),
         match="learning rate must be a finite number > 0"),
    Case("schedules.constant: lr NaN", lambda e: schedules.constant(
        float("nan")), match="learning rate must be a finite number > 0"),
    Case("schedules.theorem2: mu 0", lambda e: schedules.theorem2(0.0, 1.0, 1),
         match="mu must be a finite number > 0"),
    Case("schedules.theorem2: L < mu",
         lambda e: schedules.theorem2(1.0, 0.5, 1),
         match=r"smoothness \(L\) must be >= mu"),
    Case("schedules.get_schedule: unknown name",
         lambda e: schedules.get_schedule("cosine"),
         match="unknown schedule 'cosine'"),
    # float() alone would take a string or a bool, int() would cut 2.5.
    Case("schedules.constant: lr '0.1'", lambda e: schedules.constant("0.1"),
         match="learning rate must be a finite number > 0, got '0.1'"),
    Case("schedules.constant: lr True", lambda e: schedules.constant(True),
         match="learning rate must be a finite number > 0, got True"),
    Case("schedules.constant: lr [0.1, 0.2]",
         lambda e: schedules.constant(np.array([0.1, 0.2])),
         match="learning rate must be a finite number > 0"),
    Case("schedules.theorem2: mu '1'", lambda e: schedules.theorem2("1", 2.0, 1),
         match="mu must be a finite number > 0"),
    Case("schedules.theorem2: local_steps 2.5",
         lambda e: schedules.theorem2(1.0, 2.0, 2.5),
         match="local_steps must be an integer >= 1, got 2.5"),
    Case("schedules.theorem2: local_steps True",
         lambda e: schedules.theorem2(1.0, 2.0, True),
         match="local_steps must be an integer >= 1, got True"),
    Case("fedavg.FedAvgConfig: client_lr '0.1'",
         lambda e: fedavg.FedAvgConfig(client_lr="0.1").validate(),
         match="client_lr must be a finite number > 0 or a schedule"),
    # ---- fedavg ---------------------------------------------------------
    *[Case(f"fedavg.FedAvgConfig: {k}={v!r}",
           lambda e, k=k, v=v: fedavg.FedAvgConfig(**{k: v}).validate(),
           match=k)
      for k, v in [("clients_per_round", 0), ("local_steps", 0),
                   ("local_epochs", -1), ("batch_size", 0),
                   ("defense_at", "never"), ("weighting", "median"),
                   ("l2", -1.0), ("client_chunk", -2),
                   ("clients_per_round", 2.5), ("local_steps", 1.5),
                   ("batch_size", None), ("batch_size", True),
                   ("client_chunk", 1.5), ("l2", "a"), ("l2", float("nan")),
                   ("replace", "no"), ("server_optimizer", 3)]],
    Case("fedavg.FedAvgConfig: client_lr -1",
         lambda e: fedavg.FedAvgConfig(client_lr=-1.0).validate(),
         match="client_lr"),
    Case("fedavg.FedAvgConfig: client_lr NaN",
         lambda e: fedavg.FedAvgConfig(client_lr=float("nan")).validate(),
         match="client_lr"),
    Case("fedavg.check_setup: every client empty",
         lambda e: fedavg.check_setup(fedavg.FedAvgConfig(),
                                      e["empty_clients"]),
         match="no client holds any example"),
    Case("fedavg.check_setup: more clients than exist (no replacement)",
         lambda e: fedavg.check_setup(fedavg.FedAvgConfig(
             clients_per_round=5, replace=False), e["clients"]),
         match="clients_per_round=5"),
    Case("fedavg.check_setup: probs of wrong length",
         lambda e: fedavg.check_setup(fedavg.FedAvgConfig(), e["clients"],
                                      probs=[0.5, 0.5]), match="probs"),
    Case("fedavg.check_setup: negative probs",
         lambda e: fedavg.check_setup(fedavg.FedAvgConfig(), e["clients"],
                                      probs=[1.5, -0.5, 0.0]), match="probs"),
    Case("fedavg.as_client_arrays: 4-D images",
         lambda e: fedavg.as_client_arrays(e["clients"]._replace(
             x=jnp.zeros((3, 8, 8, 1)))), match="client data must be"),
    Case("fedavg.make_eval_data: empty test set",
         lambda e: fedavg.make_eval_data(np.zeros((0, 8, 8, 1)), np.zeros(0)),
         match="test set is empty"),
    Case("fedavg.make_eval_data: x and y of different lengths",
         lambda e: fedavg.make_eval_data(np.zeros((10, 4, 4, 1)),
                                         np.zeros(7, int), 4),
         match=r"x \(10\) and y \(7\) differ in length"),
    Case("fedavg.make_mesh: 0 devices", lambda e: fedavg.make_mesh(0),
         match="num_devices"),
    Case("fedavg.make_round: client images of the wrong shape",
         lambda e: fedavg.make_round(e["model"], fedavg.FedAvgConfig(
             clients_per_round=2))(
                 fedavg.init(e["model"], fedavg.FedAvgConfig(), KEY),
                 e["clients"]._replace(x=jnp.zeros((3, 2, 9, 9, 1))),
                 fedavg.key_streams(0)),
         match="x must be a batch of images"),
    *[Case(f"fedavg.key_streams: seed {v!r}",
           lambda e, v=v: fedavg.key_streams(v),
           match=f"seed must be an integer, got {re.escape(repr(v))}")
      for v in (1.7, "a", True)],
    Case("fedavg round: probs of the wrong length",
         lambda e: fedavg.make_round(e["model"], fedavg.FedAvgConfig(
             clients_per_round=2))(
                 fedavg.init(e["model"], fedavg.FedAvgConfig(), KEY),
                 e["clients"], fedavg.key_streams(0), jnp.array([1.0, 0.0])),
         match=r"probs must hold one probability per client, shape \(3,\)"),
    Case("fedavg round: more clients than exist (no replacement)",
         lambda e: fedavg.make_round(e["model"], fedavg.FedAvgConfig(
             clients_per_round=5, replace=False))(
                 fedavg.init(e["model"], fedavg.FedAvgConfig(), KEY),
                 e["clients"], fedavg.key_streams(0)),
         match="clients_per_round=5 is more than the 3 clients"),
    Case("fedavg round: client_ids out of range (jitted)",
         lambda e: _round_call(e, client_ids=jnp.array([0, 7])),
         match=r"client_ids must lie in \[0, 3\); got \[7\] among them\."),
    Case("fedavg round: negative client_ids (eager)",
         lambda e: _round_call(e, jit=False, client_ids=np.array([-1, 0])),
         match=r"client_ids must lie in \[0, 3\); got \[-1\] among them\."),
    Case("fedavg round: an int for the key streams",
         lambda e: _round_call(e, keys=0),
         match=r"keys must be the run's key streams, fedavg\.key_streams"
               r"\(seed\); got 0\."),
    Case("fedavg round: data of another type",
         lambda e: _round_call(e, data={"x": e["clients"].x}),
         match=r"data must be ClientArrays \(fedavg\.as_client_arrays\("
               r"partition\.pack\(\.\.\.\)\)\); got dict\."),
    Case("fedavg round: an empty client among the sampled",
         _empty_client_round, error=None, check=_check_empty_client),
    # ---- training.train_and_evaluate ------------------------------------
    Case("training.train_and_evaluate: rounds 0",
         lambda e: _train(e["tmp"], rounds=0), match="rounds must be >= 1"),
    Case("training.train_and_evaluate: local_steps 0",
         lambda e: _train(e["tmp"], local_steps=0), match="local_steps"),
    Case("training.train_and_evaluate: clients_per_round > num_clients",
         lambda e: _train(e["tmp"], replace=False, clients_per_round=9),
         match="clients_per_round=9 exceeds num_clients=4"),
    Case("training.train_and_evaluate: checkpoint_every 0",
         lambda e: _train(e["tmp"], checkpoint_every=0),
         match="checkpoint_every"),
    Case("training.train_and_evaluate: missing data directory",
         lambda e: _train(e["tmp"]), error=FileNotFoundError,
         match="data_dir"),
    Case("training.train_and_evaluate: unknown dataset",
         lambda e: _train(e["tmp"], dataset="imagenet"),
         match="Unknown dataset name"),
    Case("training.train_and_evaluate: unknown partition",
         lambda e: _train_early(e["tmp"] / "w", partition="shards"),
         error=None, check=lambda r: _no_workdir(r, "partition must be one of "
                                                 "noniid, iid, dirichlet")),
    Case("training.train_and_evaluate: unknown lr_schedule",
         lambda e: _train_early(e["tmp"] / "w", lr_schedule="cosine"),
         error=None, check=lambda r: _no_workdir(r, "unknown schedule")),
    Case("training.train_and_evaluate: theorem2 with mu 0",
         lambda e: _train_early(e["tmp"] / "w", lr_schedule="theorem2", mu=0.0),
         error=None, check=lambda r: _no_workdir(r, "mu must be a finite number > 0")),
    Case("training.train_and_evaluate: unknown defense",
         lambda e: _train_early(e["tmp"] / "w", defense="dropout"),
         error=None, check=lambda r: _no_workdir(r, "defense must be one of")),
    Case("training.train_and_evaluate: unregistered soteria_q",
         lambda e: _train_early(e["tmp"] / "w", defense="soteria",
                                defense_strength=50.0, soteria_q="q2"),
         error=None, check=lambda r: _no_workdir(
             r, "soteria_q must name a registered perturbation")),
    Case("training.train_and_evaluate: unknown soteria_score",
         lambda e: _train_early(e["tmp"] / "w", defense="soteria",
                                defense_strength=50.0, soteria_score="l2"),
         error=None, check=lambda r: _no_workdir(
             r, "soteria_score must be one of")),
    Case("training.train_and_evaluate: defense_strength 150 for soteria",
         lambda e: _train_early(e["tmp"] / "w", defense="soteria",
                                defense_strength=150.0),
         error=None, check=lambda r: _no_workdir(
             r, r"defense_strength \(soteria\): percent must be a number")),
    Case("training.train_and_evaluate: num_processes -3",
         lambda e: _train(e["tmp"], num_processes=-3),
         match="num_processes must be >= 1, got -3"),
    # ---- experiments.attack.run (the main job) -------------------------
    Case("experiments.attack.run: unknown config key",
         lambda e: _attack_run(e["tmp"], lr=3), match="Unknown config keys"),
    Case("experiments.attack.run: unknown attack",
         lambda e: _attack_run(e["tmp"], attack="nope"),
         match="valid names: dlg"),
    Case("experiments.attack.run: unknown defense",
         lambda e: _attack_run(e["tmp"], defense="nope"),
         match="valid names: none"),
    Case("experiments.attack.run: unknown dataset",
         lambda e: _attack_run(e["tmp"], dataset="svhn"),
         match="valid names: mnist"),
    Case("experiments.attack.run: num_images 0",
         lambda e: _attack_run(e["tmp"], num_images=0), match="num_images"),
    Case("experiments.attack.run: iterations 0",
         lambda e: _attack_run(e["tmp"], iterations=0), match="iterations"),
    Case("experiments.attack.run: unknown dlg_optimizer",
         lambda e: _attack_run(e["tmp"], dlg_optimizer="adam"),
         match="dlg_optimizer must be one of torch, linesearch, optax"),
    Case("experiments.attack.run: soteria strength 150",
         lambda e: _attack_run(e["tmp"], defense="soteria", strength=150,
                               data_dir="/nonexistent/tfds"),
         error=ValueError, match=r"strength \(soteria\): percent must be "
         r"a number in \[0, 100\], got 150"),
    Case("experiments.attack.run: missing data directory",
         lambda e: _attack_run(e["tmp"], data_dir="/nonexistent/tfds"),
         error=FileNotFoundError, match="data_dir"),
    Case("experiments.attack.run: dlg_drop on logreg (no layer left)",
         lambda e: _attack_run(e["tmp"], model="logreg", attack="dlg_drop"),
         match="attack 'dlg_drop' leaves no gradient entry of model 'logreg'"
               ".*valid attacks for this model: dlg, idlg, gs"),
    Case("experiments.attack.run: init 'xavier'",
         lambda e: _attack_run(e["tmp"], init="xavier"),
         match="init must be one of auto, default, uniform; got 'xavier'"),
    Case("experiments.attack.run: corrupt results.json in the workdir",
         _attack_run_corrupt_results,
         match=r"results\.json is not valid JSON \(Expecting"),
    # ---- command lines --------------------------------------------------
    Case("CLI experiments.attack --dataset=svhn",
         lambda e: _cli("experiments.attack", "--dataset=svhn",
                        f"--workdir={e['tmp']}"),
         error=None, check=lambda p: _cli_error(p, r"dataset.*svhn|svhn.*dataset")),
    Case("CLI experiments.fedavg without --workdir",
         lambda e: _cli("experiments.fedavg"), error=None,
         check=lambda p: _cli_error(p, r"--workdir")),
    Case("CLI experiments.fedavg --plugins=<missing module>",
         lambda e: _cli("experiments.fedavg", "--plugins=no_such_plugin",
                        f"--workdir={e['tmp']}"), error=None,
         check=lambda p: _one_line_error(
             p, r"fedavg: error: --plugins: cannot import 'no_such_plugin' "
             r"\(ModuleNotFoundError: No module named")),
    Case("CLI experiments.fedavg --config.soteria_q=q9 (not registered)",
         lambda e: _cli("experiments.fedavg", "--config.defense=soteria",
                        "--config.soteria_q=q9", f"--workdir={e['tmp']}"),
         error=None, check=lambda p: _one_line_error(
             p, r"fedavg: error: soteria_q must name a registered "
             r"perturbation, one of \('q0',\)")),
    Case("CLI experiments.attack --images=<missing path>",
         lambda e: _cli("experiments.attack", "--images=/nonexistent/x",
                        f"--workdir={e['tmp']}"), error=None,
         check=lambda p: _one_line_error(
             p, r"attack: error: images='/nonexistent/x' does not exist; "
             r"pass a folder of PNG/JPEG files or an \.npz")),
    Case("CLI experiments.attack --data_dir=<empty folder>",
         lambda e: _cli("experiments.attack", f"--data_dir={e['tmp']}",
                        f"--workdir={e['tmp'] / 'run'}"), error=None,
         check=lambda p: _one_line_error(
             p, r"attack: error: No data for dataset 'cifar10' split 'test': "
             r"no prepared TFDS copy in .*Fix: set TFDS_DATA_DIR")),
    Case("CLI experiments.attack --config.num_image=5 (mistyped field)",
         lambda e: _cli("experiments.attack", "--config.num_image=5",
                        f"--workdir={e['tmp']}"), error=None,
         check=lambda p: _one_line_error(
             p, r"attack: error: --config\.num_image: no such field in the "
             r"config .*; did you mean 'num_images' instead of 'num_image'\?")),
    Case("CLI experiments.fedavg --config.round=5 (mistyped field)",
         lambda e: _cli("experiments.fedavg", "--config.round=5",
                        f"--workdir={e['tmp']}"), error=None,
         check=lambda p: _one_line_error(
             p, r"fedavg: error: --config\.round: .*did you mean 'rounds'")),
    Case("CLI experiments.tradeoff --config=tradeoff.py:foo (unknown preset)",
         lambda e: _cli("experiments.tradeoff",
                        "--config=experiments/configs/tradeoff.py:foo",
                        f"--workdir={e['tmp']}"), error=None,
         check=lambda p: _one_line_error(
             p, r"tradeoff: error: --config=experiments/configs/tradeoff\.py:"
             r"foo: unknown preset 'foo'; use 'quick', 'medium', 'full' or "
             r"'tiny'\.")),
    Case("CLI experiments.attack --workdir=<a file>", _cli_workdir_file,
         error=None, check=lambda p: _one_line_error(
             p, r"attack: error: --workdir=.*a_file is a file; pass a folder")),
    Case("CLI experiments.attack --model=logreg --attack=dlg_drop",
         lambda e: _cli("experiments.attack", "--model=logreg",
                        "--attack=dlg_drop", f"--workdir={e['tmp']}"),
         error=None, check=lambda p: _one_line_error(
             p, r"attack: error: attack 'dlg_drop' leaves no gradient entry "
             r"of model 'logreg'")),
    Case("CLI experiments.tradeoff dry run with num_images=0",
         lambda e: _cli("experiments.tradeoff",
                        "--config=experiments/configs/tradeoff.py:tiny",
                        "--config.dry_run=True", "--config.num_images=0",
                        f"--workdir={e['tmp']}"), error=None,
         check=lambda p: _one_line_error(
             p, r"tradeoff: error: num_images must be >= 1, an integer; "
             r"got 0\.")),
    Case("CLI experiments.tradeoff dry run with panels_only=lenet",
         lambda e: _cli("experiments.tradeoff",
                        "--config=experiments/configs/tradeoff.py:medium",
                        "--config.dry_run=True", "--config.panels_only=lenet",
                        f"--workdir={e['tmp']}"), error=None,
         check=lambda p: _one_line_error(
             p, r"tradeoff: error: panels_only must name panels of the "
             r"config \(leakage_mnist, lenet_mnist\), separated by commas; "
             r"got 'lenet'\.")),
    Case("CLI repdef_jax.data_cli prepare svhn",
         lambda e: _cli("repdef_jax.data_cli", "prepare", "svhn"), error=None,
         check=lambda p: _cli_error(p, r"invalid choice: 'svhn' \(choose "
                                    r"from 'cifar10', 'cifar100'")),
]


@pytest.fixture(scope="module", autouse=True)
def _report():
  yield
  lines = ["| # | bad input | outcome |", "|---|---|---|"]
  for i, (name, outcome) in enumerate(TABLE.items(), 1):
    lines.append(f"| {i} | {name} | {outcome} |")
  text = "\n".join(lines)
  print(f"\nBad-input sweep: {len(TABLE)} inputs tried\n{text}")
  path = os.environ.get("REPDEF_BAD_INPUT_TABLE")
  if path:
    with open(path, "w", encoding="utf-8") as f:
      f.write(text + "\n")


def _run_case(case: Case, e: dict) -> str:
  if case.error is None:
    return case.check(case.fn(e))
  with pytest.raises(case.error, match=case.match) as info:
    case.fn(e)
  msg = str(info.value).replace("|", "/").replace("\n", " ")
  return f"{info.type.__name__}: {msg[:90]}"


def test_cases_are_unique():
  assert len({c.name for c in CASES}) == len(CASES)


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_bad_input(case, env, tmp_path, monkeypatch):
  monkeypatch.setenv("REPDEF_JAX_CACHE", str(tmp_path / "cache"))
  data.clear_cache()
  e = {**env, "tmp": tmp_path}
  if case.gap:
    try:
      outcome = _run_case(case, e)
    except BaseException as err:  # pylint: disable=broad-except
      msg = " ".join(str(err).split())[:70].replace("|", "/")
      TABLE[case.name] = f"GAP: {type(err).__name__}: {msg} -> fix: {case.gap}"
      pytest.xfail(case.gap)
    TABLE[case.name] = f"fixed: {outcome}"
    return
  TABLE[case.name] = _run_case(case, e)


def test_training_refuses_other_config_and_keeps_workdir(tmp_path):
  """A workdir of a different run: clear error, no byte changed."""
  workdir = tmp_path / "run"
  workdir.mkdir()
  c = training.default_config()
  c.update({"rounds": 2, "num_clients": 4, "clients_per_round": 2,
            "plot": False, "data_dir": "/nonexistent/tfds", "seed": 123})
  saved = json.loads(c.to_json())
  (workdir / training.CONFIG_FILE).write_text(json.dumps(saved))
  (workdir / training.LEGACY_CHECKPOINT_FILE).write_bytes(b"old checkpoint")
  (workdir / training.METRICS_FILE).write_text('{"round": 1}\n')
  before = {p.name: p.read_bytes() for p in workdir.iterdir()}
  with pytest.raises(ValueError, match=r"different configuration \(seed"):
    _train(workdir, seed=0)
  assert {p.name: p.read_bytes() for p in workdir.iterdir()} == before
  TABLE["training.train_and_evaluate: workdir of another config"] = (
      "ValueError naming the differing keys; workdir unchanged")


def test_main_job_refuses_other_config_and_keeps_results(tmp_path):
  """The main job's workdir of a different config: clear error, unchanged."""
  path = tmp_path / "results.json"
  old = {"config": {"seed": 99}, "images": []}
  path.write_text(json.dumps(old))
  with pytest.raises(ValueError, match="another --workdir"):
    _attack_run(tmp_path)
  assert json.loads(path.read_text()) == old
  TABLE["experiments.attack.run: workdir of another config"] = (
      "ValueError 'Use another --workdir'; results.json unchanged")
