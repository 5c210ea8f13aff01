"""One process of a test job (``tests/test_distributed.py``): trains or resumes a small run.

    python distributed_job.py OUT train|resume DRIVER [--devices D] [--job HOST:PORT P I] [--env ENV] [--steps N]
                              [--exit-after-join]

Process 0 (or the single process) saves the final state's leaves to ``OUT/state.npz`` and the
summary to ``OUT/summary.out.json`` (beside the run directory ``OUT/run``).
"""

import argparse
import json
import os
import sys

import jax
import numpy as np

parser = argparse.ArgumentParser()
parser.add_argument("out")
parser.add_argument("mode", choices=("train", "resume"))
parser.add_argument("driver")
parser.add_argument("--devices", type=int, default=2, help="forced CPU devices of this process")
parser.add_argument("--job", nargs=3, metavar=("COORDINATOR", "P", "I"))
parser.add_argument("--timeout", type=int, default=30)
parser.add_argument("--steps", type=int, default=400)
parser.add_argument("--env", default="probe:pendulum")
parser.add_argument("--exit-after-join", action="store_true", help="die right after joining (failure test)")
args = parser.parse_args()
jax.config.update("jax_num_cpu_devices", args.devices)

from popjax import distributed  # noqa: E402

if args.job:
    coordinator, p, i = args.job
    distributed.initialize(distributed.JobPlace(coordinator, int(p), int(i), args.timeout))
    if args.exit_after_join:
        jax.devices()  # joined the job's topology, then gone
        os._exit(3)

import popjax  # noqa: E402

CONFIG = dict(learner="td3", env=args.env, pop_size=4, seed=3, total_env_steps=args.steps, warmup_steps=50,
              rollout_len=25, eval_interval=100, checkpoint_interval=50, eval_episodes=1, batch_size=16,
              buffer_size=1000, learner_config={"hidden": [8, 8]}, progress=False, devices=jax.device_count(),
              driver=args.driver)
if args.driver == "pbt":  # frequent exploits, so that members are copied across the processes
    CONFIG["pbt"] = {"interval": 100, "quantile": 0.5}

run_dir = os.path.join(args.out, "run")
if args.mode == "train":
    run = popjax.train(out_dir=run_dir, **CONFIG)
else:
    run = popjax.resume(run_dir)
leaves = distributed.fetch(jax.tree.leaves(run.state))  # a collective: every process takes part
if distributed.is_writer():
    np.savez(os.path.join(args.out, "state.npz"), *leaves)
    with open(os.path.join(args.out, "summary.out.json"), "w") as f:
        json.dump(run.summary, f)
print(f"process {jax.process_index()} done", file=sys.stderr)
