"""What the client and server apps share: model, data, settings.

Data come from repdef_jax.data.load (TFDS_DATA_DIR, or repdef-data prepare
mnist); node i trains on client i of the paper's non-IID split
(repdef_jax.partition.noniid: 2 classes x 100 samples per client) over
num-partitions clients, the same split in every process (seeded).
"""

import functools

from repdef_jax import data
from repdef_jax import defenses
from repdef_jax import fedavg
from repdef_jax import models
from repdef_jax import partition
from repdef_jax.integrations import flower


def model(run_config):
  """The configured model for the configured dataset (cached)."""
  info = data.get_info(run_config["dataset"])
  return _model(run_config["model"], info.image_shape, info.num_classes)


@functools.lru_cache(maxsize=None)
def _model(name, shape, num_classes):
  return models.get_model(name, shape, num_classes)


def defense(run_config):
  """The configured defense (None for 'none')."""
  if run_config["defense"] == "none":
    return None
  return defenses.get_defense(run_config["defense"],
                              float(run_config["defense-strength"]),
                              model=model(run_config))


DEFENSE_AT = ("step", "update", "mod")
# Integer keys and their least value; the number and bool keys.
INT_KEYS = {"num-server-rounds": 1, "seed": 0, "classes-per-client": 1,
            "samples-per-class": 1, "local-steps": 1, "batch-size": 1,
            "attack-iterations": 1, "attack-images": 0,
            "audit-clients-per-round": 1, "max-test-examples": 0}
NUMBER_KEYS = ("fraction-train", "lr", "defense-strength")
BOOL_KEYS = ("sample-data",)


def _check_types(run_config):
  """Each key's type and range, as a one-line error naming the key."""
  for key, low in INT_KEYS.items():
    v = run_config[key]
    if isinstance(v, bool) or not isinstance(v, int) or v < low:
      raise ValueError(f"run-config {key} must be an integer >= {low}, got "
                       f"{v!r}.")
  for key in NUMBER_KEYS:
    v = run_config[key]
    if isinstance(v, bool) or not isinstance(v, (int, float)):
      raise ValueError(f"run-config {key} must be a number, got {v!r}.")
  for key in BOOL_KEYS:
    if not isinstance(run_config[key], bool):
      raise ValueError(f"run-config {key} must be true or false, got "
                       f"{run_config[key]!r}.")


def check(run_config, num_partitions):
  """Raises a ValueError naming the run-config key of a setting the apps
  cannot use. The ServerApp calls it before the first round: a typo then
  stops the run instead of failing every client while the server goes on.

  Args:
    run_config: the run's config.
    num_partitions: the number of nodes (the split is checked for them).
  """
  _check_types(run_config)
  if run_config["defense-at"] not in DEFENSE_AT:
    raise ValueError(f"run-config defense-at must be one of {DEFENSE_AT}, "
                     f"got {run_config['defense-at']!r}.")
  fraction = float(run_config["fraction-train"])
  if not 0 < fraction <= 1:
    raise ValueError(f"run-config fraction-train must be in (0, 1], got "
                     f"{fraction}.")
  attacks = ("none", *flower.AUDIT_ATTACKS)
  if run_config["attack"] not in attacks:
    raise ValueError(f"run-config attack must be one of {attacks}, got "
                     f"{run_config['attack']!r}.")
  for keys, build in (
      ("dataset / model", lambda: model(run_config)),
      ("defense / defense-strength", lambda: defense(run_config)),
      ("local-steps / batch-size / lr",
       lambda: fedavg_config(run_config, with_defense=False).validate()),
      ("classes-per-client / samples-per-class / sample-data (the split of "
       f"{num_partitions} nodes)",
       lambda: client_data(run_config, 0, num_partitions))):
    try:
      build()
    except ValueError as e:
      raise ValueError(f"run-config {keys}: {e}") from None


def fedavg_config(run_config, with_defense=True):
  """Local training of a client (its defense unless the mod applies it)."""
  at = run_config["defense-at"]
  return fedavg.FedAvgConfig(
      local_steps=int(run_config["local-steps"]),
      batch_size=int(run_config["batch-size"]),
      client_lr=float(run_config["lr"]),
      defense=defense(run_config) if with_defense and at != "mod" else None,
      defense_at="update" if at == "mod" else at)


def _load(dataset, split, sample, max_examples=None):
  if sample:  # The images embedded in repdef_jax (tests; no download).
    with data.allow_sample():
      return data.load(dataset, split, max_examples=max_examples)
  return data.load(dataset, split, max_examples=max_examples)


@functools.lru_cache(maxsize=None)
def _clients(dataset, num_partitions, classes, samples, seed, sample):
  images, labels = _load(dataset, "train", sample)
  info = data.get_info(dataset)
  idx = partition.noniid(labels, num_clients=num_partitions,
                         classes_per_client=classes, samples_per_class=samples,
                         seed=seed, num_classes=info.num_classes)
  return partition.pack(data.to_float(images), labels, idx)


def client_data(run_config, partition_id, num_partitions):
  """``(x, y, mask)`` of one client: its row of the packed split."""
  c = _clients(run_config["dataset"], int(num_partitions),
               int(run_config["classes-per-client"]),
               int(run_config["samples-per-class"]), int(run_config["seed"]),
               bool(run_config["sample-data"]))
  i = int(partition_id)
  return c.x[i], c.y[i], c.mask[i]


def test_data(run_config):
  """The server's test set (``max-test-examples``; 0: all)."""
  return _test_data(run_config["dataset"],
                    int(run_config["max-test-examples"]),
                    bool(run_config["sample-data"]))


@functools.lru_cache(maxsize=None)
def _test_data(dataset, max_examples, sample):
  x, y = _load(dataset, "test", sample, max_examples or None)
  return fedavg.make_eval_data(data.to_float(x), y, min(500, len(y)))


def initial_params(run_config):
  """The global model's initial parameters (the seed's init stream)."""
  keys = fedavg.key_streams(int(run_config["seed"]))
  return model(run_config).init(keys.init)
