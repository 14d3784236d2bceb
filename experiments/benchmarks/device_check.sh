#!/usr/bin/env bash
# The GPU checks of issues 12 and 13 in one call of a lent device machine:
# the benchmark table with PyTorch peers on the same GPU (the GPU section of
# docs/benchmarks/BENCHMARKS.md), unit costs (the `full` preset priced from
# GPU measurements), the equivalence tests on the GPU and the notebooks' GPU
# path.
#
#   REPDEF_GIT_COMMIT=$(git rev-parse --short HEAD) \
#       bash experiments/benchmarks/device_check.sh [SECONDS]
#
# Run from the repository root. SECONDS (default 420) bounds the whole
# script: with a machine's start that is ~10 of a session's 15 device
# minutes, leaving room to rerun a part that failed (give the device call a
# timeout of SECONDS + 60). Each part gets what is left, in order of value,
# and every finished part is already in the report (the benchmark merges
# parts), so a part cut short loses only itself. Writes under $OUT (default
# ./device_out): gpu/benchmarks.json and gpu/BENCHMARKS.md (copy both to
# docs/benchmarks/gpu/ and run `python -m experiments.benchmark
# --render_only` on the CPU machine), gpu/benchmark.log, gpu/tests.log and
# gpu/notebooks.log.
#
# DEVICE_CHECK_FLAGS adds benchmark flags, DEVICE_CHECK_TESTS replaces the
# test files; a rehearsal on a CPU machine: OUT=/tmp/dc
# DEVICE_CHECK_FLAGS=--quick DEVICE_CHECK_TESTS=tests/test_gradients.py
# REPDEF_JAX_NOTEBOOK_TINY=1 bash experiments/benchmarks/device_check.sh 300
#
# Packages the machine's image lacks (it has jax with CUDA, flax, optax,
# chex, torch, matplotlib) travel as wheels in ./.whl, installed into
# /tmp/site; fetch them once on the CPU machine (pure Python):
#   echo /.whl/ >> .git/info/exclude
#   pip download --no-deps -d .whl dm-pix==0.4.5 ml-collections==1.1.0
# and name .whl in the device call's carry.
set -uo pipefail
out=${OUT:-device_out}
budget=${1:-420}
end=$((SECONDS + budget))
mkdir -p "$out/gpu"
log="$out/gpu/benchmark.log"
if compgen -G ".whl/*.whl" > /dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
      --upgrade --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
export MPLBACKEND=Agg REPDEF_JAX_OFFLINE=1  # nothing is reachable there
{ nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv
  python3 -c "import jax, torch; print('jax', jax.__version__,
jax.devices(), 'torch', torch.__version__, torch.cuda.is_available())"
} 2>&1 | tee "$log"

left() { echo $((end - SECONDS)); }
for part in fedavg defense unit_costs attack gradients; do
  if [ "$(left)" -lt 30 ]; then
    echo "[device_check] $part skipped: out of time" | tee -a "$log"
    continue
  fi
  echo "[device_check] $part ($(left) s left)" | tee -a "$log"
  timeout "$(left)" python3 -m experiments.benchmark --out_dir="$out/gpu" \
      --parts="$part" ${DEVICE_CHECK_FLAGS:-} 2>&1 | tee -a "$log"
done

# The library's GPU path ('xla' convolutions, clients all at once) under the
# equivalence tests, float32 at full precision (JAX's default TF32 on GPU
# would miss the CPU tolerances for reasons of precision, not logic).
tests=${DEVICE_CHECK_TESTS:-tests/test_models.py tests/test_soteria.py \
tests/test_fedavg.py tests/test_gradients.py tests/test_attacks_batch.py}
if [ "$(left)" -ge 60 ]; then
  echo "[device_check] tests ($(left) s left)" | tee "$out/gpu/tests.log"
  # shellcheck disable=SC2086
  JAX_PLATFORMS=cuda,cpu JAX_DEFAULT_MATMUL_PRECISION=highest \
      timeout "$(left)" python3 -m pytest -q --maxfail=10 -p no:cacheprovider \
      $tests 2>&1 | tee -a "$out/gpu/tests.log"
else
  echo "[device_check] tests skipped: out of time" | tee "$out/gpu/tests.log"
fi

# The notebooks as a user runs them on a GPU (their defaults, not TINY): code
# cells in order, in one namespace; the install cell finds the checkout.
for nb in colab/*.ipynb; do
  if [ "$(left)" -lt 30 ]; then
    echo "[device_check] $nb skipped: out of time" | tee -a "$out/gpu/notebooks.log"
    continue
  fi
  echo "[device_check] $nb ($(left) s left)" | tee -a "$out/gpu/notebooks.log"
  timeout "$(left)" python3 -c '
import json, sys, time
cells = [c for c in json.load(open(sys.argv[1]))["cells"]
         if c["cell_type"] == "code"]
ns = {"__name__": "__main__"}
for i, c in enumerate(cells):
  src = "".join(c["source"])
  if src.lstrip().startswith(("!", "%")):
    continue
  t0 = time.perf_counter()
  exec(compile(src, f"{sys.argv[1]}:cell{i}", "exec"), ns)
  print(f"[cell {i}] {time.perf_counter() - t0:.1f} s", flush=True)
' "$nb" 2>&1 | tee -a "$out/gpu/notebooks.log"
done
echo "[device_check] done in $SECONDS s" | tee -a "$log"
