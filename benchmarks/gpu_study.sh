#!/usr/bin/env bash
# The accelerator study in one command on a GPU machine, from a source tree, with no installer access:
#   bash benchmarks/gpu_study.sh [OUT]          (OUT: where the JSON and the log go; default /tmp/popjax-gpu)
# What it needs on the machine: Python with JAX for the GPU (jax + jaxlib + the CUDA plugin), flax, optax, chex,
# orbax-checkpoint, numpy and a CUDA PyTorch already importable; whatever else popjax imports (pydantic,
# gymnasium, tensorboardX, pyyaml ...) may be carried as wheels in ./whl at the repository root: they are
# installed with `pip --no-index --target` into a folder under OUT (no index, no network, nothing system-wide).
# The popjax and popjax_bench sources go on PYTHONPATH from this checkout.
#
# It runs, each bounded in time and writing its JSON as it goes:
#   1. `popjax bench accelerator`: TD3 and SAC at N = 1, 4, 16, 64, 256, popjax against JAX sequential and every
#      PyTorch variant (eager and compiled, sequential and vectorized, CUDA graphs) at the same arithmetic on both
#      sides (PRECISION: tf32 by default, as JAX computes on a GPU by default; fp32 = highest; bf16), one table
#      printed at the end; about 10 minutes (its --budget).
#   2. with E2E=1: `popjax train` TD3 pop 256 on probe:pendulum, 10k env steps per member (about a minute).
# Environment: PRECISION (tf32 | highest | bf16 | default), E2E=1, STUDY_ARGS (extra options for the study),
# PY (python), SMALL=1 (tiny sizes: a dry run on a CPU in a few minutes).
set -u
ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUT=${1:-${OUT:-/tmp/popjax-gpu}}
mkdir -p "$OUT"
exec > >(tee -a "$OUT/run.log") 2>&1
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
PY=${PY:-python3}
PRECISION=${PRECISION:-tf32}
SITE="$OUT/site"
if compgen -G "$ROOT/whl/*.whl" >/dev/null; then
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$SITE" "$ROOT"/whl/*.whl \
    || { echo "gpu_study: installing the wheels of $ROOT/whl into $SITE failed"; exit 3; }
fi
export PYTHONPATH="$SITE:$ROOT:$ROOT/benchmarks${PYTHONPATH:+:$PYTHONPATH}"
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm \
  --format=csv
$PY - <<'PYEOF' || { echo "gpu_study: the environment check failed (above)"; exit 4; }
import importlib, platform
print("python", platform.python_version())
for name in ("jax", "jaxlib", "flax", "optax", "chex", "orbax.checkpoint", "torch", "numpy", "pydantic", "gymnasium"):
    try:
        print(name, getattr(importlib.import_module(name), "__version__", "?"))
    except Exception as err:  # noqa: BLE001 - report every missing piece, then fail below
        print(name, "MISSING", repr(err)[:200])
import jax, torch
print("jax devices", jax.devices(), "| torch cuda", torch.cuda.is_available(),
      torch.cuda.get_device_name(0) if torch.cuda.is_available() else "")
import popjax, popjax_bench.accelerator  # noqa: F401 - the sources on PYTHONPATH import
print("popjax from", popjax.__file__)
PYEOF
if [ -n "${SMALL:-}" ]; then
  SIZES="--pop 1,2 --hidden 16,16 --batch-size 8 --k 2 --min-time 0 --compile-workers 2 --budget 600"
  E2E_POP=4; E2E_STEPS=1500; T_STUDY=900; T_E2E=300
else
  SIZES=""; E2E_POP=256; E2E_STEPS=10000; T_STUDY=720; T_E2E=240
fi
PRECISION_FLAG=""
if $PY -m popjax.cli bench accelerator --help 2>/dev/null | grep -q -- "--matmul-precision"; then
  PRECISION_FLAG="--matmul-precision $PRECISION"
else
  echo "gpu_study: this popjax has no --matmul-precision: both sides run their defaults (not matched on a GPU)"
fi
echo "== accelerator study ($PRECISION on both sides), out: $OUT"
SECONDS=0
# shellcheck disable=SC2086 # the option lists are split on purpose
timeout -k 10 $T_STUDY $PY -m popjax.cli bench accelerator --allow-busy --no-plot $PRECISION_FLAG $SIZES \
  ${STUDY_ARGS:-} --out "$OUT/"
echo "accelerator study: exit $?, ${SECONDS}s"
if [ -n "${E2E:-}" ]; then
  echo "== end to end: TD3 pop $E2E_POP on probe:pendulum, $E2E_STEPS env steps per member"
  SECONDS=0
  timeout -k 10 $T_E2E $PY -m popjax.cli train --learner td3 --env probe:pendulum --pop $E2E_POP --steps $E2E_STEPS \
    --warmup 1000 --eval-interval 5000 --seed 3 --no-progress --out "$OUT/e2e_pop$E2E_POP" | tail -n 3
  echo "end to end: exit ${PIPESTATUS[0]}, ${SECONDS}s in all"
fi
ls -l "$OUT"/*.json 2>/dev/null
