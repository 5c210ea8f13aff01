#!/usr/bin/env bash
# The large-batch (FastTD3-class) study in one command on a GPU machine, from a source tree, with no installer
# access; about 10 minutes in all, each part bounded by `timeout`, every JSON written as it goes:
#   bash benchmarks/frontier_study.sh [OUT]          (OUT: where the JSON and the log go; default /tmp/popjax-frontier)
# What it needs on the machine: Python with JAX for the GPU, flax, optax, chex, orbax-checkpoint and numpy already
# importable; brax, mujoco, mujoco-mjx and whatever else popjax imports may be carried as wheels in ./whl at the
# repository root (installed with `pip --no-index --target` into a folder under OUT: no network, nothing system-wide).
#
#   0. `popjax train ... --plan` of the largest point: the memory and work XLA predicts for it, against the device.
#   1. `popjax bench frontier`: fast_td3 at FastTD3's shapes (critic 1024-512-256, actor 512-256-128, 101 atoms,
#      batch 32,768, 2 updates per env step) on brax:humanoid@mjx, N = 1, 4, 16 members x 256 and 1,024 envs per
#      member in bf16, and N = 1, 16 at 1,024 envs in tf32: agent env steps/s and the ratio to one member alone
#      (frontier.json; the arithmetic of each point is in its row).
#   2. MF-PBT (4 sub-populations of 4 evolving every 1, 2, 3, 4 rounds) over 16 members x 1,024 envs for the rest of the
#      budget (pbt_run/: metrics.csv holds each member's return against wall_s; pbt_curve.json the best member's
#      return against wall-clock seconds).
# Environment: PY (python), SMALL=1 (tiny sizes on probe:pendulum: a dry run on a CPU in a few minutes, what the
# test-slow group runs; with ENV=brax:humanoid@mjx each program compiles for about 80 s on a 2-core CPU), ENV (default
# brax:humanoid@mjx; probe:pendulum with SMALL=1).
set -u
ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUT=${1:-${OUT:-/tmp/popjax-frontier}}
mkdir -p "$OUT"
exec > >(tee -a "$OUT/run.log") 2>&1
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
PY=${PY:-python3}
if [ -n "${SMALL:-}" ]; then ENV=${ENV:-probe:pendulum}; else ENV=${ENV:-brax:humanoid@mjx}; fi
SITE="$OUT/site"
if compgen -G "$ROOT/whl/*.whl" >/dev/null; then
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$SITE" "$ROOT"/whl/*.whl \
    || { echo "frontier_study: installing the wheels of $ROOT/whl into $SITE failed"; exit 3; }
fi
export PYTHONPATH="$SITE:$ROOT:$ROOT/benchmarks${PYTHONPATH:+:$PYTHONPATH}"
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
$PY - <<'PYEOF' || { echo "frontier_study: the environment check failed (above)"; exit 4; }
import importlib, platform
print("python", platform.python_version())
for name in ("jax", "jaxlib", "flax", "optax", "orbax.checkpoint", "brax", "mujoco", "mujoco.mjx", "numpy"):
    try:
        print(name, getattr(importlib.import_module(name), "__version__", "?"))
    except Exception as err:  # noqa: BLE001 - report every missing piece, then fail below
        print(name, "MISSING", repr(err)[:200])
import jax, brax, mujoco.mjx  # noqa: F401,E401
import popjax, popjax_bench.frontier  # noqa: F401,E401 - the sources on PYTHONPATH import
print("jax devices", jax.devices(), "| popjax from", popjax.__file__)
PYEOF

if [ -n "${SMALL:-}" ]; then
  SHAPES="--critic-hidden 16 --actor-hidden 16 --batch-size 64 --buffer-per-env 32 --iterations 12 --warmup-iterations 2"
  POPS_BF16=1,2; ENVS=4,8; POPS_TF32=1,2; ENVS_TF32=8
  PBT_POP=8; PBT_ENVS=4; PBT_STEPS=2000; PBT_SHAPES='"critic_hidden": [16], "actor_hidden": [16], "num_atoms": 11'
  SUBPOPULATIONS="[4, 4]"; FREQUENCIES="[1, 2]"
  PBT_BATCH=64; PBT_BUFFER=1000; T_PLAN=300; T_BENCH=600; T_PBT=300
else
  SHAPES="--critic-hidden 1024,512,256 --actor-hidden 512,256,128 --batch-size 32768 --buffer-per-env 1024 \
--iterations 60 --warmup-iterations 4"
  POPS_BF16=1,4,16; ENVS=256,1024; POPS_TF32=1,16; ENVS_TF32=1024
  # the MF-PBT run keeps 64 replay rows per env: every evaluation writes a checkpoint of the whole population
  # (16 x 65,536 rows x 2,029 B = 2.1 GB on brax:humanoid@mjx), which FastTD3's 10,240 rows would make 340 GB
  PBT_POP=16; PBT_ENVS=1024; PBT_STEPS=$((1024 * 1000)); PBT_SHAPES='"n_step": 3'
  SUBPOPULATIONS="[4, 4, 4, 4]"; FREQUENCIES="[1, 2, 3, 4]"
  PBT_BATCH=32768; PBT_BUFFER=$((1024 * 64)); T_PLAN=60; T_BENCH=300; T_PBT=150
fi

cat > "$OUT/pbt.yaml" <<YAML
learner: fast_td3
env: $ENV
driver: pbt
pop_size: $PBT_POP
seed: 0
envs_per_member: $PBT_ENVS
rollout_len: 1
update_ratio: $(awk "BEGIN {print 2 / $PBT_ENVS}")
total_env_steps: $PBT_STEPS
warmup_steps: $((PBT_ENVS * 10))
batch_size: $PBT_BATCH
buffer_size: $PBT_BUFFER
eval_interval: $((PBT_STEPS / 10))
eval_episodes: 1
matmul_precision: bf16
progress: false
learner_config: {$PBT_SHAPES}
pbt: {interval: $((PBT_STEPS / 10)), quantile: 0.25, copy_buffer: true, subpopulations: $SUBPOPULATIONS,
      frequencies: $FREQUENCIES}
YAML
echo "== 0. the plan of the MF-PBT run: $PBT_POP members x $PBT_ENVS envs on $ENV"
timeout -k 10 $T_PLAN $PY -m popjax.cli train --config "$OUT/pbt.yaml" --preset none --plan | tee "$OUT/plan.txt"
echo "plan: exit ${PIPESTATUS[0]}"

echo "== 1. throughput (bf16, then tf32), out: $OUT"
SECONDS=0
# shellcheck disable=SC2086 # the option lists are split on purpose
timeout -k 10 $T_BENCH $PY -m popjax.cli bench frontier --allow-busy --env "$ENV" --learner fast_td3 \
  --pop $POPS_BF16 --envs-per-member $ENVS --precision bf16 $SHAPES --out "$OUT/frontier_bf16.json"
echo "bf16 throughput: exit $?, ${SECONDS}s"
# shellcheck disable=SC2086
timeout -k 10 $((T_BENCH * 2 / 5)) $PY -m popjax.cli bench frontier --allow-busy --env "$ENV" --learner fast_td3 \
  --pop $POPS_TF32 --envs-per-member $ENVS_TF32 --precision tf32 $SHAPES --out "$OUT/frontier_tf32.json"
echo "throughput: exit $?, ${SECONDS}s in all"

echo "== 2. MF-PBT: $PBT_POP members x $PBT_ENVS envs, bf16, until its time limit"
SECONDS=0
timeout -k 10 $T_PBT $PY -m popjax.cli train --config "$OUT/pbt.yaml" --preset none --out "$OUT/pbt_run" | tail -n 5
echo "MF-PBT: exit ${PIPESTATUS[0]}, ${SECONDS}s"
$PY - "$OUT" <<'PYEOF'
import csv, json, sys
from pathlib import Path
out = Path(sys.argv[1])
rows = list(csv.DictReader((out / "pbt_run" / "metrics.csv").open())) if (out / "pbt_run" / "metrics.csv").exists() else []
best = {}
for row in rows:  # the best member's return at each evaluation, against the loop's wall clock
    key = int(row["env_steps"])
    best[key] = max(best.get(key, (float("-inf"), 0.0)), (float(row["eval_return"]), float(row["wall_s"])))
curve = [{"env_steps": k, "best_return": r, "wall_s": w} for k, (r, w) in sorted(best.items())]
(out / "pbt_curve.json").write_text(json.dumps({"evaluations": curve}, indent=1) + "\n")
print(f"pbt_curve.json: {len(curve)} evaluations" + (f", last best return {curve[-1]['best_return']:.1f} at "
      f"{curve[-1]['wall_s']:.0f}s" if curve else ""))
PYEOF
ls -l "$OUT"/*.json 2>/dev/null
