"""Parity with Stable-Baselines3 (issue 48): popjax's learners against SB3 2.9.2 at the rl-zoo settings popjax's
presets copy, the same budget and the same evaluation episodes.

    PYTHONPATH=. .venv/bin/python experiments/parity_sb3.py [--pairs td3_pendulum,sac_pendulum,dqn_cartpole,
        ppo_cartpole,td3_hopper] [--seeds 5] [--side both|popjax|sb3]

Pairs (``PAIRS``): TD3 and SAC on gym:Pendulum-v1, DQN and PPO on gym:CartPole-v1, TD3 on gym:Hopper-v5 (30k
steps), TD3 on gym:InvertedPendulum-v5 (20k). Ablations (``VARIANTS``): one named difference between the two sides
changed, on popjax's side (a run option, hparams or learner_config; paired with the base pair's SB3 runs) or on SB3's
(``sb3_init``: paired with the base pair's popjax runs).

popjax side: one population of ``--seeds`` members (``driver: independent``, ``seed: 0``, ``preset: auto``: the
learner's PRESETS row), ``eval_starts: common``. SB3 side: seed s = 0 .. seeds-1, one run each, with the same
values written in SB3's terms (``sb3_model``; ``torch.set_num_threads(1)``, device cpu). Where the zoo uses a
schedule popjax does not reproduce (PPO's linear learning rate and clip range), SB3 gets popjax's constant values, so
the two sides run the same settings.

Evaluation (the same on both sides): at every env step at which popjax evaluated (``eval_interval``, after that
iteration's updates), ``eval_episodes`` deterministic episodes from the gymnasium reset seeds popjax's evaluation
drew from its key (``HostRunner.eval_seeds``, recorded while popjax runs): the same start states for every popjax
member and every SB3 seed at one evaluation, fresh at the next. SB3 is evaluated at the start of the first
rollout collected at or after that step (after its updates), and once more at the end.

Scores per seed (the rule in ``margins.py``, fixed before these data): **final** = the mean of the last 3
evaluations; **learning speed** = the mean over the evaluations at or after the warm-up (``warmup_steps``).
popjax member m is paired with SB3 seed m (they share the evaluation episodes, not their training randomness).
"popjax matches SB3": popjax − SB3 against −``margins.margin(env)`` on both measures (``stats.paired_verdict``,
``margins.combine``; held (ceiling) under ``margins.at_ceiling``). Wall time: popjax's population (all seeds in one
run) and the sum of SB3's runs, on a shared 2-core machine (the 1-minute load beside it): costs, not speed results.
Writes experiments/results/parity_sb3/<pair>.json.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import numpy as np
from sweep_common import member_rows

import popjax
from popjax.envs.runner import HostRunner
from popjax.presets import PRESETS

HERE = Path(__file__).parent
FOLDER = HERE / "results" / "parity_sb3"
LAST = 3  # evaluations averaged into the final score
PAIRS = {
    "td3_pendulum": {"learner": "td3", "env": "Pendulum-v1", "sb3_algo": "TD3", "eval_interval": 1_000,
                     "eval_episodes": 10},
    "sac_pendulum": {"learner": "sac", "env": "Pendulum-v1", "sb3_algo": "SAC", "eval_interval": 1_000,
                     "eval_episodes": 10},
    "dqn_cartpole": {"learner": "dqn", "env": "CartPole-v1", "sb3_algo": "DQN", "eval_interval": 2_500,
                     "eval_episodes": 10},
    "ppo_cartpole": {"learner": "ppo", "env": "CartPole-v1", "sb3_algo": "PPO", "eval_interval": 5_000,
                     "eval_episodes": 10},
    # The MuJoCo pair at a budget 2 shared cores afford: the zoo's 1M-step preset cut to 30k (10k random warm-up,
    # 20k updates). 100k was started and stopped: at 20k steps it had taken 20 min of a contended core for popjax's
    # side alone, about 3 core-hours for both sides.
    "td3_hopper": {"learner": "td3", "env": "Hopper-v5", "sb3_algo": "TD3", "eval_interval": 2_500,
                   "eval_episodes": 10, "total_env_steps": 30_000},
    # A MuJoCo pair that learns within a budget 2 cores afford (TD3 balances it in 10-20k steps). The zoo has no TD3
    # row for it: both sides run SB3's TD3 defaults (which popjax's TD3 defaults equal: tau 0.005, policy delay 2,
    # target noise 0.2 clipped at 0.5, discount 0.99, (400, 300)) with the zoo's MuJoCo exploration noise 0.1 and a
    # 1k-step random warm-up.
    "td3_inverted_pendulum": {"learner": "td3", "env": "InvertedPendulum-v5", "sb3_algo": "TD3",
                              "eval_interval": 1_000, "eval_episodes": 10,
                              "preset": {"total_env_steps": 20_000, "warmup_steps": 1_000, "batch_size": 256,
                                         "buffer_size": 1_000_000, "learner_config": {"hidden": [400, 300]},
                                         "hparams": {"actor_lr": 1e-3, "critic_lr": 1e-3,
                                                     "exploration_noise": 0.1}}},
}
# Ablations: popjax with one named difference from SB3 removed, scored against the base pair's SB3 runs (the same
# evaluation episodes: popjax's evaluation seeds depend on the run's seed only, checked when paired).
VARIANTS = {
    # SB3 weighs its squared value error by vf_coef with no 1/2; popjax (CleanRL, the paper) by vf_coef / 2: the
    # preset's vf_coef 1.0 is SB3's 0.5, and 0.5 (the preset before this comparison) halves the value term.
    "ppo_cartpole_halved_value": {"base": "ppo_cartpole", "hparams": {"vf_coef": 0.5}},
    # SB3's DQN target is max_a Q_target(s', a) (no double Q), its epsilon reaches its end at 16 % of the budget
    # (8k env steps; popjax counts updates: 1k warm-up steps, then 0.5 updates per env step, 3,500 updates).
    "dqn_cartpole_single_q": {"base": "dqn_cartpole", "learner_config": {"double_q": False},
                              "hparams": {"epsilon_decay_steps": 3_500}},
    # The other way round: SB3 initialised as flax initialises popjax's layers (LeCun normal weights, SD
    # 1/sqrt(fan_in), truncated at 2 SD; zero biases) instead of PyTorch's uniform +-1/sqrt(fan_in) weights and
    # biases, against the base pair's popjax runs (``sb3_init``: new SB3 runs, popjax's copied from the base pair).
    "dqn_cartpole_sb3_lecun_init": {"base": "dqn_cartpole", "sb3_init": "lecun_normal"},
    # The one TD3 pair popjax trails on the means without a reason. Two differences, each defined before its data:
    # popjax steps 50 env steps between two compiled calls of 50 updates (``rollout_len``), SB3 one step and one
    # update, so popjax's early updates see up to 49 fewer transitions; and the initialisation, as for DQN.
    # (rollout_len changes which iteration an evaluation falls in, and popjax draws an evaluation's start states from
    # the iteration's key: that ablation is evaluated on other episodes, so it is compared unpaired, with no verdict.)
    "td3_inverted_pendulum_rollout1": {"base": "td3_inverted_pendulum", "run": {"rollout_len": 1}},
    "td3_inverted_pendulum_sb3_lecun_init": {"base": "td3_inverted_pendulum", "sb3_init": "lecun_normal"},
}


def preset(pair: str) -> dict:
    """The learner's PRESETS row for the env, with the pair's own budget where it sets one (a variant: its base
    pair's, with the variant's run options, hparams and learner_config on top)."""
    variant = VARIANTS.get(pair, {})
    p = PAIRS[variant.get("base", pair)]
    row = p["preset"] if "preset" in p else PRESETS[p["learner"], f"gym:{p['env']}"]
    out = {**row, **{k: p[k] for k in ("total_env_steps",) if k in p}, **variant.get("run", {})}
    for part in ("hparams", "learner_config"):
        if part in variant:
            out[part] = {**out.get(part, {}), **variant[part]}
    return out


def pair_of(name: str) -> dict:
    """The pair's settings (a variant: its base pair's)."""
    return PAIRS[VARIANTS[name]["base"] if name in VARIANTS else name]


def sb3_settings(pair: str) -> dict:
    """popjax's preset in SB3's keyword arguments (the zoo's names)."""
    p, pre = pair_of(pair), preset(pair)
    hp, lc = pre.get("hparams", {}), pre.get("learner_config", {})
    if p["sb3_algo"] == "TD3":
        return {"learning_rate": hp["actor_lr"], "buffer_size": pre["buffer_size"],
                "learning_starts": pre["warmup_steps"], "batch_size": pre["batch_size"],
                "gamma": hp.get("discount", 0.99),  # the MuJoCo presets keep TD3's default, SB3's too
                "train_freq": 1, "gradient_steps": 1,
                "action_noise_std": hp["exploration_noise"], "policy_kwargs": {"net_arch": list(lc["hidden"])}}
    if p["sb3_algo"] == "SAC":
        return {"learning_rate": hp["actor_lr"], "buffer_size": pre["buffer_size"],
                "learning_starts": pre["warmup_steps"], "batch_size": pre["batch_size"], "train_freq": 1,
                "gradient_steps": 1,
                "policy_kwargs": {"net_arch": list(lc["hidden"])}}
    if p["sb3_algo"] == "DQN":
        return {"learning_rate": hp["lr"], "batch_size": pre["batch_size"], "buffer_size": pre["buffer_size"],
                "learning_starts": pre["warmup_steps"], "gamma": hp["discount"], "target_update_interval": 10,
                "train_freq": pre["rollout_len"], "gradient_steps": int(pre["rollout_len"] * pre["update_ratio"]),
                "exploration_fraction": 0.16, "exploration_final_eps": hp["epsilon_end"],
                "policy_kwargs": {"net_arch": list(lc["hidden"])}}
    return {"n_envs": pre["envs_per_member"], "n_steps": pre["rollout_len"],
            "batch_size": pre["envs_per_member"] * pre["rollout_len"] // lc["minibatches"],
            "gae_lambda": hp["gae_lambda"],
            "gamma": hp["discount"], "n_epochs": lc["epochs"], "ent_coef": hp["ent_coef"], "learning_rate": hp["lr"],
            "clip_range": hp["clip"]}


def run_popjax(pair: str, seeds: int, steps: int | None = None) -> dict:
    p, pre = pair_of(pair), dict(preset(pair))
    if steps:  # a smoke test's budget
        pre.update(total_env_steps=steps, warmup_steps=min(pre.get("warmup_steps", 0), steps // 2))
    drawn: list[list[int]] = []
    original = HostRunner.eval_seeds

    def recording(key, episodes):
        out = original(key, episodes)
        drawn.append(out)
        return out

    HostRunner.eval_seeds = staticmethod(recording)
    try:
        out = Path("runs/parity_sb3") / pair
        load = os.getloadavg()[0]
        budget = {k: pre[k] for k in ("total_env_steps", "warmup_steps") if k in pre}
        if "preset" in p:  # settings of the pair's own (no library preset for the env): all given
            budget = dict(pre)
        budget.update({part: pre[part] for part in ("hparams", "learner_config")
                       if part in VARIANTS.get(pair, {})})  # the variant's, as ``preset`` merged them
        budget.update(VARIANTS.get(pair, {}).get("run", {}))
        run = popjax.train(learner=p["learner"], env=f"gym:{p['env']}", driver="independent", pop_size=seeds, seed=0,
                           preset="auto", **budget, eval_interval=p["eval_interval"], eval_episodes=p["eval_episodes"],
                           eval_starts="common", checkpoint_interval=0, progress=False, out_dir=out, overwrite=True)
    finally:
        HostRunner.eval_seeds = staticmethod(original)
    curves = [[[int(r["env_steps"]), float(r["eval_return"])] for r in rows] for rows in member_rows(out, seeds)]
    steps = [s for s, _ in curves[0]]
    if len(drawn) != len(steps):
        raise RuntimeError(f"{pair}: {len(drawn)} evaluation seed draws for {len(steps)} evaluations")
    return {"curves": curves, "eval_steps": steps, "eval_seeds": drawn, "wall_s": run.summary["wall_s"],
            "load_1min_before": load, "preset": pre, "total_env_steps": pre["total_env_steps"]}


def sb3_model(pair: str, seed: int):
    import gymnasium as gym
    import stable_baselines3 as sb3
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.noise import NormalActionNoise

    p, kw = pair_of(pair), dict(sb3_settings(pair))
    cls = getattr(sb3, p["sb3_algo"])
    if p["sb3_algo"] == "PPO":
        env = make_vec_env(p["env"], n_envs=kw.pop("n_envs"), seed=seed)
    else:
        env = gym.make(p["env"])
    if "action_noise_std" in kw:
        std = kw.pop("action_noise_std")
        dims = env.action_space.shape
        kw["action_noise"] = NormalActionNoise(np.zeros(dims), std * np.ones(dims))
    model = cls("MlpPolicy", env, seed=seed, device="cpu", verbose=0, **kw)
    if VARIANTS.get(pair, {}).get("sb3_init") == "lecun_normal":
        lecun_normal_init(model)
    return model


def lecun_normal_init(model) -> None:
    """Re-initialises every linear layer of ``model``'s policy as flax's ``Dense`` defaults do (the optimizer holds
    the same tensors) and copies the online networks into their targets, as SB3 does after building them."""
    import torch

    with torch.no_grad():
        for layer in model.policy.modules():
            if isinstance(layer, torch.nn.Linear):
                std = (1.0 / layer.in_features) ** 0.5 / 0.87962566103423978  # JAX's truncated-normal correction
                torch.nn.init.trunc_normal_(layer.weight, std=std, a=-2 * std, b=2 * std)
                torch.nn.init.zeros_(layer.bias)
    for online, target in (("q_net", "q_net_target"), ("actor", "actor_target"), ("critic", "critic_target")):
        if getattr(model, target, None) is not None:
            getattr(model, target).load_state_dict(getattr(model, online).state_dict())


def evaluate_sb3(model, env_id: str, seeds: list[int]) -> float:
    import gymnasium as gym

    env, total = gym.make(env_id), 0.0
    for s in seeds:
        obs, _ = env.reset(seed=int(s))
        done = False
        while not done:
            action, _ = model.predict(obs, deterministic=True)
            obs, reward, terminated, truncated, _ = env.step(action)
            total += float(reward)
            done = terminated or truncated
    env.close()
    return total / len(seeds)


def run_sb3(pair: str, seed: int, eval_steps: list[int], eval_seeds: list[list[int]], total: int) -> dict:
    import torch
    from stable_baselines3.common.callbacks import BaseCallback

    torch.set_num_threads(1)
    env_id = pair_of(pair)["env"]

    class Evaluate(BaseCallback):
        def __init__(self):
            super().__init__()
            self.curve, self.next = [], 0

        def _catch_up(self, final: bool):
            while self.next < len(eval_steps) and (self.num_timesteps >= eval_steps[self.next] or final):
                self.curve.append([eval_steps[self.next], self.num_timesteps,
                                   evaluate_sb3(self.model, env_id, eval_seeds[self.next])])
                self.next += 1

        def _on_rollout_start(self):
            self._catch_up(final=False)

        def _on_step(self):
            return True

        def _on_training_end(self):
            self._catch_up(final=True)

    started = time.time()
    model = sb3_model(pair, seed)
    callback = Evaluate()
    model.learn(total_timesteps=total, callback=callback)
    return {"seed": seed, "curve": callback.curve, "wall_s": time.time() - started}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", default=",".join(PAIRS))
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--side", default="both", choices=("both", "popjax", "sb3"))
    parser.add_argument("--steps", type=int, default=0, help="a smoke test's budget (default: the preset's)")
    parser.add_argument("--results", default=str(FOLDER), help="where the JSON go")
    parser.add_argument("--rerun-popjax", action="store_true",
                        help="run popjax's side again (its settings changed); SB3's runs are kept when the "
                             "evaluation episodes are unchanged")
    args = parser.parse_args()
    folder = Path(args.results)
    folder.mkdir(parents=True, exist_ok=True)
    for pair in args.pairs.split(","):
        if pair not in PAIRS and pair not in VARIANTS:
            parser.exit(2, f"--pairs: {pair!r} unknown (allowed: {', '.join([*PAIRS, *VARIANTS])})\n")
    for pair in args.pairs.split(","):
        path = folder / f"{pair}.json"
        record = json.loads(path.read_text()) if path.exists() else {"pair": pair, **pair_of(pair)}
        if pair in VARIANTS:
            record["variant"] = VARIANTS[pair]
        sb3_only = "sb3_init" in VARIANTS.get(pair, {})
        if sb3_only and "popjax" not in record:  # the base pair's popjax runs, scored on the same episodes
            record["popjax"] = json.loads((folder / f"{VARIANTS[pair]['base']}.json").read_text())["popjax"]
        if args.side in ("both", "popjax") and not sb3_only and (args.rerun_popjax or
                                                len(record.get("popjax", {}).get("curves", ())) < args.seeds):
            old_seeds = record.get("popjax", {}).get("eval_seeds")
            record["popjax"] = run_popjax(pair, args.seeds, args.steps)
            record["popjax_version"] = popjax.__version__
            if old_seeds is not None and old_seeds != record["popjax"]["eval_seeds"]:
                record.pop("sb3", None)  # scored on other episodes: not comparable
            path.write_text(json.dumps(record, indent=1) + "\n")
            print(f"{pair} popjax: {record['popjax']['wall_s']:.0f} s", flush=True)
        if args.side in ("both", "sb3") and "popjax" in record and (pair not in VARIANTS or sb3_only):
            run_sb3_seeds(pair, record, args.seeds, path)


def run_sb3_seeds(pair: str, record: dict, seeds: int, path: Path) -> None:
    """SB3 seeds 0 .. seeds-1 not yet in ``record`` (saved after each: a killed run goes on where it stopped)."""
    import stable_baselines3
    import torch

    pj = record["popjax"]
    record.setdefault("sb3", {"settings": sb3_settings(pair), "runs": [],
                              "versions": {"stable_baselines3": stable_baselines3.__version__,
                                           "torch": torch.__version__}})
    done = {r["seed"] for r in record["sb3"]["runs"]}
    for seed in range(seeds):
        if seed in done:
            continue
        load = os.getloadavg()[0]
        result = run_sb3(pair, seed, pj["eval_steps"], pj["eval_seeds"], pj["total_env_steps"])
        record["sb3"]["runs"].append({**result, "load_1min_before": load})
        path.write_text(json.dumps(record, indent=1) + "\n")
        print(f"{pair} sb3 seed {seed}: final {np.mean([c[2] for c in result['curve'][-LAST:]]):.1f}, "
              f"{result['wall_s']:.0f} s", flush=True)


if __name__ == "__main__":
    main()
