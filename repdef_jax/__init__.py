"""repdef_jax: the Soteria representation defense, its attacks and FedAvg."""

from repdef_jax import data
from repdef_jax import gradients
from repdef_jax import models
from repdef_jax import partition
from repdef_jax.gradients import batch_grad
from repdef_jax.gradients import batch_loss
from repdef_jax.gradients import cross_entropy
from repdef_jax.gradients import per_example_grads
from repdef_jax.models import get_model
from repdef_jax.models import Model
from repdef_jax.models import MODEL_NAMES

__version__ = "0.1.0"
