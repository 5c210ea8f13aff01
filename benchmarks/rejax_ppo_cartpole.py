"""PPO on gymnax:CartPole-v1, a population of 16, popjax against rejax at equal settings (issue 46).

Both sides train 16 members (popjax: one population, ``pop_size=16``; rejax: ``jax.vmap`` of ``PPO.train`` over 16
seeds, as rejax's README does) for the same env steps per member with the settings of ``SETTINGS``: rl-zoo's CartPole
PPO (8 envs x 32 steps, one minibatch of 256, 20 epochs, lr 1e-3, gamma 0.98, lambda 0.8, clip 0.2, no entropy
bonus, value coefficient 0.5), separate actor and critic MLPs of 64 x 64 tanh units, constant learning rate,
per-minibatch advantage normalisation; twice, once without gradient clipping and once with rl-zoo's max_grad_norm 0.5
(``MAX_GRAD_NORMS``: each library's own meaning of it). Each side evaluates once, at the end: ``EVAL_EPISODES``
deterministic (argmax) episodes per member. Wall time is everything from the training call to its evaluated result,
compilation included (popjax: ``popjax.train`` with the persistent compile cache off; rejax: ``jit(vmap(train))``
lowered, compiled and run); compile time is also recorded apart. The two sides run one after the other, the 1-minute
load average written beside each: on a shared machine the figures are costs of one run, not speed results.

What cannot be matched (``UNMATCHED``, written into the JSON): the initialisation (popjax: orthogonal, CleanRL's; rejax:
flax's lecun-normal default), rejax's clipped value loss (popjax's is unclipped), max_grad_norm (popjax clips the
global norm, rejax each element), rejax's two Adam optimisers (actor and critic apart; popjax one Adam over the summed
loss, which for separate networks gives the same per-parameter gradients), and the time limit: gymnax 1.0.1 returns
``terminated`` and ``truncated`` apart and rejax 0.1.3 reads the 5-tuple of gymnax 0.0.9, so its env here is gymnax
1.0.1's CartPole with ``done = terminated or truncated`` (gymnax 0.0.9's meaning; rejax does not bootstrap at the
500-step limit, popjax does).

rejax 0.1.3 cannot share popjax's venv (it pulls gymnasium 1.3 and tfp-nightly): its side runs in a throwaway venv
given by ``--rejax-python`` (``python3.11 -m venv /tmp/rejax-venv && /tmp/rejax-venv/bin/pip install rejax==0.1.3
jax==0.10.2 jaxlib==0.10.2``), this file called there with ``--side rejax``.

    PYTHONPATH=. .venv/bin/python benchmarks/rejax_ppo_cartpole.py --rejax-python /tmp/rejax-venv/bin/python \\
        --out benchmarks/results/rejax_ppo.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

POP = 16
ITERATIONS = 391  # rejax runs ceil(eval_freq / 256) iterations: 391 x 256 = 100,096 env steps per member
SETTINGS = dict(envs=8, rollout_len=32, epochs=20, minibatches=1, lr=1e-3, discount=0.98, gae_lambda=0.8, clip=0.2,
                ent_coef=0.0, vf_coef=0.5, hidden=[64, 64], activation="tanh")
# Gradient clipping, each configuration one run of both sides: none, and rl-zoo's max_grad_norm 0.5 (popjax clips the
# global norm; rejax 0.1.3's max_grad_norm is optax.clip, each element of the gradient to [-0.5, 0.5]).
MAX_GRAD_NORMS = {"no clipping": None, "max_grad_norm 0.5": 0.5}
EVAL_EPISODES = 32
UNMATCHED = [
    "initialisation: popjax orthogonal (CleanRL), rejax flax's lecun-normal default",
    "value loss: rejax clips it to clip_eps around the old value, popjax does not",
    "max_grad_norm: popjax scales the gradient to a global norm of at most it, rejax 0.1.3 clips each element "
    "to [-max_grad_norm, max_grad_norm] (optax.clip)",
    "optimiser: rejax one Adam for the actor and one for the critic, popjax one Adam over the summed loss",
    "time limit: rejax 0.1.3 reads gymnax 0.0.9's done (termination or truncation) and does not bootstrap at the "
    "500-step limit; popjax bootstraps truncations",
]


def env_steps() -> int:
    return ITERATIONS * SETTINGS["envs"] * SETTINGS["rollout_len"]


def load() -> float:
    return os.getloadavg()[0]


def side_popjax(seed: int, max_grad_norm: float | None) -> dict:
    import numpy as np

    import popjax

    s = SETTINGS
    with tempfile.TemporaryDirectory() as work:
        before = load()
        start = time.perf_counter()
        run = popjax.train(
            learner="ppo", env="gymnax:CartPole-v1", pop_size=POP, seed=seed, total_env_steps=env_steps(),
            envs_per_member=s["envs"], rollout_len=s["rollout_len"], eval_interval=env_steps(),
            eval_episodes=EVAL_EPISODES, progress=False, out_dir=Path(work) / "run", compile_cache="off",
            learner_config={"epochs": s["epochs"], "minibatches": s["minibatches"], "hidden": s["hidden"]},
            hparams={"lr": s["lr"], "discount": s["discount"], "gae_lambda": s["gae_lambda"], "clip": s["clip"],
                     "ent_coef": s["ent_coef"], "vf_coef": s["vf_coef"], "max_grad_norm": max_grad_norm or 1e30})
        wall = time.perf_counter() - start
    returns = [float(r) for r in run.summary["final_returns"]]
    return {"wall_s": wall, "compile_s": float(run.summary["compile_s"]), "train_s": float(run.summary["wall_s"]),
            "env_steps_per_member": int(run.summary["env_steps"]), "final_returns": returns,
            "mean_final_return": float(np.mean(returns)), "load_1min_before": before, "load_1min_after": load()}


def side_rejax(seed: int, max_grad_norm: float | None) -> dict:
    """Runs in rejax's venv."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from gymnax.environments.classic_control.cartpole import CartPole
    from rejax import PPO
    from rejax.evaluate import evaluate

    class CartPoleDone(CartPole):
        """gymnax 1.0.1's CartPole with gymnax 0.0.9's 5-tuple step (``done`` = terminated or truncated)."""

        def step(self, key, state, action, params=None):
            obs, state, reward, terminated, truncated, info = super().step(key, state, action, params)
            return obs, state, reward, jnp.logical_or(terminated, truncated), info

    s = SETTINGS
    env = CartPoleDone()
    algo = PPO.create(env=env, env_params=env.default_params, num_envs=s["envs"], num_steps=s["rollout_len"],
                      num_epochs=s["epochs"], num_minibatches=s["minibatches"], learning_rate=s["lr"],
                      gamma=s["discount"], gae_lambda=s["gae_lambda"], clip_eps=s["clip"], ent_coef=s["ent_coef"],
                      vf_coef=s["vf_coef"], max_grad_norm=max_grad_norm or float("inf"), total_timesteps=env_steps(),
                      eval_freq=env_steps(), skip_initial_evaluation=True,
                      agent_kwargs={"activation": s["activation"], "hidden_layer_sizes": tuple(s["hidden"])})

    def greedy_eval(algo, ts, rng):
        def act(obs, key):
            logits = algo.actor.apply(ts.actor_ts.params, obs[None], method="_action_dist").logits
            return jnp.argmax(logits[0])

        return evaluate(act, rng, algo.env, algo.env_params, EVAL_EPISODES, algo.env_params.max_steps_in_episode)

    algo = algo.replace(eval_callback=greedy_eval)
    keys = jax.random.split(jax.random.key(seed), POP)
    before = load()
    start = time.perf_counter()
    compiled = jax.jit(jax.vmap(algo.train)).lower(keys).compile()
    compile_s = time.perf_counter() - start
    ts, (lengths, returns) = jax.block_until_ready(compiled(keys))
    wall = time.perf_counter() - start
    per_member = np.asarray(returns)[:, -1, :].mean(axis=1)  # [pop, evaluations, episodes]: the last evaluation
    return {"wall_s": wall, "compile_s": compile_s, "train_s": wall - compile_s,
            "env_steps_per_member": int(np.asarray(ts.global_step)[0]),
            "final_returns": [float(r) for r in per_member], "mean_final_return": float(per_member.mean()),
            "load_1min_before": before, "load_1min_after": load(),
            "versions": {"rejax": __import__("importlib.metadata").metadata.version("rejax"),
                         "gymnax": __import__("importlib.metadata").metadata.version("gymnax"), "jax": jax.__version__}}


def main() -> None:
    global ITERATIONS
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--side", choices=("both", "rejax"), default="both")
    parser.add_argument("--rejax-python", default="/tmp/rejax-venv/bin/python")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-grad-norm", type=float, default=None, help="--side rejax: its clipping (none if absent)")
    parser.add_argument("--out", default="benchmarks/results/rejax_ppo.json")
    parser.add_argument("--iterations", type=int, default=ITERATIONS, help="PPO iterations per member (a smoke run "
                        "with fewer: its JSON must go elsewhere)")
    args = parser.parse_args()
    ITERATIONS = args.iterations
    if args.side == "rejax":
        print(json.dumps(side_rejax(args.seed, args.max_grad_norm)))
        return
    out = Path(args.out)
    if out.exists() and json.loads(out.read_text()).get("study") != "rejax_ppo":
        sys.exit(f"--out: {out} exists and was not written by this script (allowed: a new path or its own JSON)")
    if not Path(args.rejax_python).exists():
        sys.exit(f"--rejax-python: {args.rejax_python} not found (allowed: the python of a venv with rejax 0.1.3)")
    from popjax_bench import common

    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    runs = []
    for name, max_grad_norm in MAX_GRAD_NORMS.items():
        ours = side_popjax(args.seed, max_grad_norm)
        command = [args.rejax_python, __file__, "--side", "rejax", "--seed", str(args.seed),
                   "--iterations", str(ITERATIONS)] + ([] if max_grad_norm is None else
                                                       ["--max-grad-norm", str(max_grad_norm)])
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        if done.returncode:
            sys.exit(f"rejax side failed (exit {done.returncode}): {done.stderr.strip().splitlines()[-1:]}")
        theirs = json.loads(done.stdout.strip().splitlines()[-1])
        runs.append({"clipping": name, "max_grad_norm": max_grad_norm, "arms": {"popjax": ours, "rejax": theirs},
                     "time_ratio": ours["wall_s"] / theirs["wall_s"],
                     "train_time_ratio": ours["train_s"] / theirs["train_s"]})
        print(json.dumps({k: v for k, v in runs[-1].items() if k != "arms"}), flush=True)
    payload = {"study": "rejax_ppo", "started_utc": started, "env": "gymnax:CartPole-v1", "pop": POP,
               "seed": args.seed, "iterations": ITERATIONS, "env_steps_per_member": env_steps(), "settings": SETTINGS,
               "eval_episodes": EVAL_EPISODES, "unmatched": UNMATCHED, "machine": common.machine(), "runs": runs}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(payload, indent=1) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
