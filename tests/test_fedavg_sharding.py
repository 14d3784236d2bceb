"""Clients sharded over 8 forced CPU devices give the one-device result,
also when an unsampled client holds NaN (the padding slots train client 0).

XLA_FLAGS must be set before JAX initialises, so the check runs in a fresh
process (tests/fedavg_sharding_check.py).
"""

import json
import os
import subprocess
import sys


def test_sharded_round_equals_one_device(child_env):
  env = child_env()
  env["XLA_FLAGS"] += " --xla_force_host_platform_device_count=8"
  script = os.path.join(os.path.dirname(__file__), "fedavg_sharding_check.py")
  proc = subprocess.run([sys.executable, script], env=env, capture_output=True,
                        text=True, timeout=300, check=False)
  assert proc.returncode == 0, proc.stderr[-3000:]
  result = json.loads(proc.stdout.strip().splitlines()[-1])
  for k, r in result.items():
    if k != "nan_unsampled_client":  # its client ids are given, not drawn
      assert r["ids_equal"], (k, r)
    assert r["params"] <= 1e-6, (k, r)
    assert r["loss"] <= 1e-6, (k, r)
    assert r.get("finite", True), (k, r)
  assert "nan_unsampled_client" in result
