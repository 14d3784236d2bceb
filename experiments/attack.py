"""Main job (`repdef-attack`): attack real images, or your own (--images=a
folder or file of PNG/JPEG, or an .npz), with and without a defense; data
sources, config and output schema: docs/main_job.md and docs/data.md."""

from absl import app

from experiments import config_entry
from repdef_jax import attacks
from repdef_jax import defenses
from repdef_jax import models
from repdef_jax.paper import main_job

main = config_entry.make_main(
    "attack", main_job.run, lambda result, workdir: print(
        f"wrote {workdir}/{main_job.RESULT_FILE} and {main_job.PLOT_FILE}"),
    shortcuts={"dataset": main_job.DATASETS, "model": models.MODEL_NAMES,
               "init": models.INITS, "attack": attacks.ATTACK_NAMES,
               "defense": defenses.DEFENSE_NAMES, "strength": None,
               "num_images": None, "seed": None, "iterations": None,
               "dlg_optimizer": attacks.DLG_OPTIMIZERS,
               "images": None},
    default_workdir="./runs/attack")

if __name__ == "__main__":
  app.run(main)
