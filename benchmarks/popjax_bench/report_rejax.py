"""The ``rejax_ppo`` section of ``benchmarks/RESULTS.md`` (issue 46): ``benchmarks/rejax_ppo_cartpole.py``'s PPO on
gymnax:CartPole-v1, a population against rejax's ``vmap`` over seeds at equal settings; every figure from its JSON."""

from __future__ import annotations

from typing import Any

from popjax_bench.report_gpu import _table


def section_rejax_ppo(p: dict[str, Any]) -> list[str]:
    s, runs = p["settings"], p["runs"]
    rejax = runs[0]["arms"]["rejax"].get("versions", {})
    lines = [f"## rejax_ppo — PPO on {p['env']}, a population of {p['pop']}: popjax against rejax "
             f"{rejax.get('rejax', '')}", "",
             f"Written by `benchmarks/rejax_ppo_cartpole.py` (not `make bench`; rejax runs in a venv of its own, "
             f"gymnax {rejax.get('gymnax', '?')}, jax {rejax.get('jax', '?')}). popjax: `popjax.train` with pop "
             f"{p['pop']}; rejax: `jit(vmap(PPO.train))` over {p['pop']} seeds. Both: {s['envs']} envs x "
             f"{s['rollout_len']} steps, {s['minibatches']} minibatch(es), {s['epochs']} epochs, lr {s['lr']:g}, "
             f"gamma {s['discount']:g}, lambda {s['gae_lambda']:g}, clip {s['clip']:g}, entropy {s['ent_coef']:g}, "
             f"value coefficient {s['vf_coef']:g}, actor and critic {s['hidden']} {s['activation']}, "
             f"{p['env_steps_per_member']:,} env steps per member (seed {p['seed']}), one evaluation at the end of "
             f"{p['eval_episodes']} deterministic episodes per member; each gradient-clipping setting one run of both "
             "sides. 'wall s': the training call to its evaluated result, compilation included (popjax's persistent "
             "compile cache off; popjax also writes its run directory: metrics, a checkpoint, plots); 'train s': "
             "without compilation. On a shared machine, the 1-minute load beside each arm: costs of these runs, not "
             "speed results.", "",
             "Not matched: " + "; ".join(p["unmatched"]) + ".", ""]
    rows = [[run["clipping"], arm, f"{a['wall_s']:.1f}", f"{a['compile_s']:.1f}", f"{a['train_s']:.1f}",
             f"{a['env_steps_per_member']:,}", f"{a['mean_final_return']:.1f}",
             f"{sum(r >= 500 for r in a['final_returns'])} / {len(a['final_returns'])}",
             f"{min(a['final_returns']):.1f}", f"{a['load_1min_before']:.2f} → {a['load_1min_after']:.2f}"]
            for run in runs for arm, a in run["arms"].items()]
    lines += _table(["gradient clipping", "arm", "wall s", "compile s", "train s", "env steps / member",
                     "mean final return", "members at 500", "worst member", "load"], rows)
    for run in runs:
        ours, theirs = run["arms"]["popjax"], run["arms"]["rejax"]
        better = ours["mean_final_return"] >= theirs["mean_final_return"]
        lines.append(f"- {run['clipping']}: popjax / rejax wall time {run['time_ratio']:.2f}× (train time "
                     f"{run['train_time_ratio']:.2f}×); popjax's mean final return is "
                     f"{'equal or better' if better else 'lower'}.")
    return lines + [""]


SECTIONS = {"rejax_ppo": section_rejax_ppo}
