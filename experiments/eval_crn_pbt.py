"""Common random numbers in evaluation (issue 48): how often PBT's exploit choice changes, and how noisy the fitness
differences are, when members are evaluated on their own start states (``eval_starts: member``) or on the same ones
(``common``).

    PYTHONPATH=. .venv/bin/python experiments/eval_crn_pbt.py [--steps 8000] [--reps 200]

A PBT population (TD3, probe:pendulum, pop 8, ``driver: pbt``, seed 0, ``eval_starts: common``) is trained for
``--steps`` env steps per member, mid-learning, so its members differ. Each member's actor is exported and the 8
fixed policies are then evaluated ``--reps`` times under each protocol with the run's ``eval_episodes`` (5) per member,
each time under a fresh key, through ``JaxRunner.evaluate`` (the path the loop uses). Per protocol:

- the fitness noise: the SD over repetitions of each pairwise difference f_i − f_j, averaged over the 28 pairs;
- PBT's exploit choice at one evaluation (truncation at quantile 0.3 of 8: the bottom 2 are replaced, the top 2 are
  the parents): how often it differs between two consecutive evaluations of the same policies, and how often it
  differs from the choice of the reference ranking (each member's mean over every episode of both protocols).

Writes experiments/results/eval_crn_pbt.json (``--steps 8000``: a population near solved) or
eval_crn_pbt_<steps>.json (``--steps 3000``: one still learning, its members far apart).
"""

from __future__ import annotations

import argparse
import itertools
import json
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

import popjax
from popjax.envs import registry
from popjax.envs.base import make_vec_env
from popjax.envs.runner import JaxRunner
from popjax.export import export_policy
from popjax.networks import compact
from popjax.population.members import Members

HERE = Path(__file__).parent
POP, EPISODES, QUANTILE = 8, 5, 0.3


def choice(fitness: np.ndarray) -> tuple[frozenset, frozenset]:
    """Truncation selection: (the bottom k replaced, the top k parents), k = int(QUANTILE * POP)."""
    k, order = int(QUANTILE * POP), np.argsort(fitness, kind="stable")
    return frozenset(order[:k].tolist()), frozenset(order[-k:].tolist())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=8_000)
    parser.add_argument("--reps", type=int, default=200)
    parser.add_argument("--out", default=None, help="the PBT run's folder (default runs/eval_crn_pbt[_<steps>])")
    args = parser.parse_args()
    name = "eval_crn_pbt" if args.steps == 8_000 else f"eval_crn_pbt_{args.steps}"  # the run folder's and JSON's
    args.out = args.out or f"runs/{name}"
    started = time.time()
    run = popjax.train(learner="td3", env="probe:pendulum", driver="pbt", pop_size=POP, seed=0, preset="none",
                       total_env_steps=args.steps, warmup_steps=1_000, eval_interval=1_000, eval_episodes=EPISODES,
                       eval_starts="common", checkpoint_interval=0, progress=False, out_dir=args.out, overwrite=True)
    policies = []
    for m in range(POP):
        path = Path(args.out) / f"policy-member{m}.npz"
        path.unlink(missing_ok=True)  # this script's own file from an earlier run
        with np.load(export_policy(args.out, path, member=m)) as data:
            policies.append(compact.from_arrays({k: data[k] for k in data.files if k != "meta"}))

    def policy(actor, obs):  # obs [members, episodes, obs]: member i acts with its own exported actor
        del actor
        return jnp.stack([compact.forward(policies[i], obs[i]) for i in range(POP)])

    fitness = {}
    for protocol in ("member", "common"):
        runner = JaxRunner(make_vec_env(registry.make_jax_env("probe:pendulum")), Members(POP), 1,
                           common_starts=protocol == "common")
        evaluate = jax.jit(lambda key, runner=runner: runner.evaluate(key, policy, None, jnp.arange(POP), EPISODES))
        keys = jax.random.split(jax.random.key(48), args.reps)
        fitness[protocol] = np.stack([np.asarray(evaluate(k)) for k in keys])  # [reps, POP]
    reference = np.concatenate(list(fitness.values())).mean(0)
    ref_choice = choice(reference)
    summary = {}
    for protocol, f in fitness.items():
        pairs = [np.std(f[:, i] - f[:, j], ddof=1) for i, j in itertools.combinations(range(POP), 2)]
        choices = [choice(row) for row in f]
        summary[protocol] = {
            "pair_sd_mean": float(np.mean(pairs)), "member_sd_mean": float(np.mean(np.std(f, axis=0, ddof=1))),
            "choice_changes": float(np.mean([a != b for a, b in zip(choices, choices[1:], strict=False)])),
            "choice_differs_from_reference": float(np.mean([c != ref_choice for c in choices])),
            "replaced_differs_from_reference": float(np.mean([c[0] != ref_choice[0] for c in choices]))}
    record = {"env": "probe:pendulum", "learner": "td3", "driver": "pbt", "pop_size": POP, "steps": args.steps,
              "eval_episodes": EPISODES, "reps": args.reps, "quantile": QUANTILE, "key": 48,
              "run_final_returns": run.summary["final_returns"], "reference_fitness": reference.tolist(),
              "fitness": {k: v.tolist() for k, v in fitness.items()}, "summary": summary,
              "total_s": round(time.time() - started, 1)}
    (HERE / "results" / f"{name}.json").write_text(json.dumps(record, indent=1) + "\n")
    print(json.dumps(summary, indent=1), flush=True)


if __name__ == "__main__":
    main()
