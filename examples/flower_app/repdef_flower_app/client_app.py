"""The ClientApp: repdef_jax's jitted client update with the defense inside."""

import functools
import json

from flwr.app import Context
from flwr.app import Message
from flwr.clientapp import ClientApp

from repdef_flower_app import task
from repdef_jax.integrations import flower


@functools.lru_cache(maxsize=None)
def _app(run_config_json):
  run_config = json.loads(run_config_json)

  def load_data(context):
    return task.client_data(run_config,
                            context.node_config[flower.PARTITION_ID],
                            context.node_config[flower.NUM_PARTITIONS])

  mods = []
  if run_config["defense-at"] == "mod" and run_config["defense"] != "none":
    mods.append(flower.defense_mod(task.defense(run_config),
                                   model=task.model(run_config),
                                   load_data=load_data,
                                   seed=int(run_config["seed"])))
  return flower.make_client_app(
      task.model(run_config), task.fedavg_config(run_config), load_data,
      seed=int(run_config["seed"]), mods=mods)


def _inner(context):
  return _app(json.dumps(dict(context.run_config), sort_keys=True))


app = ClientApp()


@app.train()
def train(message: Message, context: Context) -> Message:
  return _inner(context)(message, context)


@app.evaluate()
def evaluate(message: Message, context: Context) -> Message:
  return _inner(context)(message, context)
