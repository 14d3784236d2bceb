"""The ServerApp: FedAvg, auditing every update with a gradient-inversion attack.

With attack != 'none' the server is honest but curious
(repdef_jax.integrations.flower.AuditingFedAvg): it aggregates as FedAvg
and attacks the updates it receives, logging MSE / PSNR / SSIM ([0, 1]
pixel space) against the clients' true images (an auditor's privilege:
it re-creates the seeded split) and the reconstructions as PNGs under
audit-dir.
"""

import jax

from flwr.app import ArrayRecord
from flwr.app import Context
from flwr.app import MetricRecord
from flwr.serverapp import Grid
from flwr.serverapp import ServerApp
from flwr.serverapp.strategy import FedAvg

from repdef_flower_app import task
from repdef_jax import fedavg
from repdef_jax.integrations import flower

app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
  cfg = context.run_config
  num_nodes = len(list(grid.get_node_ids()))
  task.check(cfg, num_nodes)
  model = task.model(cfg)
  common = dict(fraction_train=float(cfg["fraction-train"]),
                fraction_evaluate=0.0, min_train_nodes=1,
                min_available_nodes=num_nodes)
  if cfg["attack"] == "none":
    strategy = FedAvg(**common)
  else:
    iters = int(cfg["attack-iterations"])
    if cfg["attack"] == "repinfer":
      budget = {"repinfer_steps": iters}
    elif "dlg" in cfg["attack"]:
      budget = {"attack_overrides": {"outer_steps": iters}}
    else:
      budget = {"attack_overrides": {"iterations": iters}}
    strategy = flower.AuditingFedAvg(
        model, cfg["attack"], client_lr=float(cfg["lr"]), **budget,
        num_images=int(cfg["attack-images"]) or None,
        reference_data=lambda pid: task.client_data(cfg, pid, num_nodes)[:2],
        workdir=str(cfg["audit-dir"]), seed=int(cfg["seed"]),
        max_audits_per_round=int(cfg["audit-clients-per-round"]),
        # What the records depend on but the server cannot see (the
        # clients' defense...): a restart with other settings is refused.
        run_info={k: v for k, v in cfg.items() if k not in (
            "audit-dir", "num-server-rounds", "max-test-examples")},
        **common)
  test = task.test_data(cfg)
  evaluate = jax.jit(lambda p: fedavg.evaluate(model, p, test))
  template = task.initial_params(cfg)

  def global_evaluate(server_round: int, arrays: ArrayRecord) -> MetricRecord:
    out = jax.device_get(evaluate(flower.from_arrays(arrays, template)))
    return MetricRecord({k: float(v) for k, v in out.items()})

  result = strategy.start(grid=grid,
                          initial_arrays=flower.to_arrays(template),
                          num_rounds=int(cfg["num-server-rounds"]),
                          evaluate_fn=global_evaluate)
  untrained = [r for r in range(1, int(cfg["num-server-rounds"]) + 1)
               if r not in result.train_metrics_clientapp]
  if untrained:
    raise RuntimeError(f"no client returned a training update in round(s) "
                       f"{untrained}; their errors are logged above.")
  last = result.evaluate_metrics_serverapp[max(
      result.evaluate_metrics_serverapp)]
  print(f"repdef_flower_app: final test accuracy "
        f"{last['test_accuracy']:.4f}", flush=True)
