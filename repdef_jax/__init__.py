"""repdef_jax: the Soteria representation defense, its attacks and FedAvg.

Curated public API; the submodules hold the rest.
"""

# First, before anything starts JAX: CPU devices on request (host.py).
from repdef_jax import host  # isort: skip
host.configure_cpu_devices()

from repdef_jax import attacks
from repdef_jax import data
from repdef_jax import defenses
from repdef_jax import fedavg
from repdef_jax import gradients
from repdef_jax import metrics
from repdef_jax import models
from repdef_jax import partition
from repdef_jax import schedules
from repdef_jax import storage
from repdef_jax.attacks import ATTACK_NAMES
from repdef_jax.attacks import AttackResult
from repdef_jax.attacks import get_attack
from repdef_jax.data import load
from repdef_jax.defenses import chain
from repdef_jax.defenses import ClientBatch
from repdef_jax.defenses import Defense
from repdef_jax.defenses import DEFENSE_NAMES
from repdef_jax.defenses import get_defense
from repdef_jax.fedavg import FedAvgConfig
from repdef_jax.fedavg import make_round
from repdef_jax.fedavg import ServerState
from repdef_jax.gradients import batch_grad
from repdef_jax.gradients import batch_loss
from repdef_jax.gradients import cross_entropy
from repdef_jax.gradients import per_example_grads
from repdef_jax.metrics import reconstruction_metrics
from repdef_jax.models import get_model
from repdef_jax.models import Model
from repdef_jax.models import MODEL_NAMES

__version__ = "0.1.0"
