"""CEM-RL (pop 10, 5 trained, shared critic) vs plain TD3 at one env-step budget, shared code.

Used by ``cemrl_pendulum.py`` (R3) and ``cemrl_halfcheetah.py``:

    .venv/bin/python experiments/cemrl_<name>.py [--budget N] [--seeds 0,1,2]
        [--orders vectorized,sequential] [--env ENV] [--hidden 64,64] [--out runs/cemrl_<name>]

The budget counts env steps summed over the population (CEM-RL's 10 actors share it; each TD3
seed gets all of it). CEM-RL runs with both critic orders: the fast-PBT vectorized step (the
``cemrl`` driver) and the original sequential CEM-RL order, a driver this module registers
(``cemrl_sequential``: popjax's CEM-RL with the reference order of ``popjax_bench.cemrl_order``;
``updates_per_call`` = one generation's G = pop x episode
length, so member by member: G/5 critic updates, then G actor updates, exactly as in CEM-RL).
TD3 runs the same seeds as independent members of one population. Batch 256, popjax TD3
defaults (CEM-RL: policy delay 1). Writes every run directory under ``--out``, a summary JSON
(experiments/results/cemrl_<name>.json) and a plot (experiments/plots/cemrl_<name>.png): CEM
mean-actor return vs TD3 eval return against total env steps.
"""

from __future__ import annotations

import argparse
import csv
import json
from pathlib import Path

import numpy as np
from sweep_common import plot_curves

import popjax
from popjax.drivers import DRIVERS, DriverDef, cemrl, register
from popjax.envs.registry import env_spec
from popjax.plots import save_figure
from popjax_bench.cemrl_order import make_sequential_order

HERE = Path(__file__).parent


def common(hidden: list[int]) -> dict:
    return dict(learner="td3", batch_size=256, learner_config={"hidden": hidden}, progress=False)


def build_sequential(ctx, options):
    """CEM-RL whose K-step training is the original order (member by member) instead of the vectorized step."""
    shared = ctx.learner_def.shared_critic(ctx.learner_config, ctx.spec, options.n_trained)
    order = make_sequential_order(shared, ctx.learner_config.hidden, ctx.spec.action_dim)
    return cemrl.build(ctx, options, train=order.update)


if "cemrl_sequential" not in DRIVERS:
    register(DriverDef(name="cemrl_sequential", build=build_sequential, options=cemrl.CEMRLOptions,
                       plots=cemrl.cemrl_run_plots, pmap=False, replay_transitions=lambda config: config.buffer_size))


def cemrl_run(env: str, budget: int, seed: int, order: str, hidden: list[int], out: Path) -> dict:
    pop = 10
    driver = "cemrl" if order == "vectorized" else "cemrl_sequential"
    options = {}
    if order == "sequential":
        # one generation's G (each of the 10 actors plays one full episode): the exact CEM-RL order
        options["updates_per_call"] = pop * env_spec(env).max_episode_steps
    run = popjax.train(env=env, driver=driver, pop_size=pop, seed=seed, total_env_steps=budget // pop,
                       warmup_steps=100, eval_interval=budget // pop // 10, eval_episodes=10,
                       buffer_size=max(budget, 4000), out_dir=out, **{driver: options}, **common(hidden))
    s = run.summary
    curve = [[steps * pop, ret] for steps, ret in s["cem_mean_returns"]]  # total env steps
    return {"method": f"cemrl_{order}", "seed": seed, "curve": curve, "final": s["final_return"],
            "best": s["best_return"], "updates": s["updates"], "wall_s": s["wall_s"], "compile_s": s["compile_s"],
            "s_per_update": s["wall_s"] / max(s["updates"], 1), "out": str(out)}


def td3_runs(env: str, budget: int, seeds: list[int], hidden: list[int], warmup: int, out: Path) -> list[dict]:
    run = popjax.train(env=env, driver="independent", pop_size=len(seeds), seed=seeds[0], total_env_steps=budget,
                       warmup_steps=warmup, eval_interval=budget // 10, eval_episodes=10, buffer_size=budget,
                       out_dir=out, **common(hidden))
    with (out / "metrics.csv").open() as f:
        rows = list(csv.DictReader(f))
    s = run.summary
    results = []
    for m, seed in enumerate(seeds):
        curve = [[int(r["env_steps"]), float(r["eval_return"])] for r in rows if int(r["member"]) == m]
        results.append({"method": "td3", "seed": seed, "member": m, "curve": curve, "final": curve[-1][1],
                        "best": max(c[1] for c in curve), "updates": s["updates"], "wall_s": s["wall_s"],
                        "compile_s": s["compile_s"], "s_per_update": s["wall_s"] / max(s["updates"], 1),
                        "note": "wall_s/updates of the whole TD3 population (all seeds in one vmapped call)",
                        "out": str(out)})
    return results


def plot_seed_curves(ax, runs: list[dict], color: str, method: str) -> None:
    """Each run's ``curve`` thin, and their mean over seeds thick (``plot_curves``)."""
    plot_curves(ax, [r["curve"] for r in runs], color,
                f"{method} (mean of {len(runs)} seed{'s' if len(runs) > 1 else ''})")


def plot(results: list[dict], path: Path, title: str) -> None:
    import matplotlib.pyplot as plt  # headless: popjax.plots selected the Agg backend

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for i, method in enumerate(sorted({r["method"] for r in results})):
        plot_seed_curves(ax, [r for r in results if r["method"] == method], f"C{i}", method)
    ax.set_xlabel("env steps (summed over the population)")
    ax.set_ylabel("eval return (CEM-RL: CEM mean actor)")
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    save_figure(fig, path)


def experiment_parser(prefix: str, name: str, description: str, budget: int, seeds: str, env: str, hidden: str,
                      td3_warmup: int) -> argparse.ArgumentParser:
    """The options shared by the CEM-RL and DvD comparisons (``<prefix>_<name>``), with these defaults."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--budget", type=int, default=budget, help="env steps summed over the population")
    parser.add_argument("--seeds", default=seeds)
    parser.add_argument("--env", default=env)
    parser.add_argument("--hidden", default=hidden, help="hidden sizes of actor and critic, comma-separated")
    parser.add_argument("--td3-warmup", type=int, default=td3_warmup, help="TD3 baseline random warm-up steps")
    parser.add_argument("--out", default=f"runs/{prefix}_{name}")
    parser.add_argument("--results", default=str(HERE / "results" / f"{prefix}_{name}.json"))
    return parser


def main(name: str, description: str, budget: int, seeds: str, orders: str, env: str, hidden: str,
         td3_warmup: int) -> None:
    """The experiment ``cemrl_<name>`` with these defaults for its command-line options."""
    parser = experiment_parser("cemrl", name, description, budget, seeds, env, hidden, td3_warmup)
    parser.add_argument("--orders", default=orders)
    parser.add_argument("--no-td3", action="store_true")
    args = parser.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    hidden = [int(h) for h in args.hidden.split(",")]
    out = Path(args.out)
    results_path = Path(args.results)
    results = json.loads(results_path.read_text())["runs"] if results_path.exists() else []
    done = {(r["method"], r["seed"]) for r in results}
    for order in [o for o in args.orders.split(",") if o]:
        for seed in seeds:
            if (f"cemrl_{order}", seed) in done:
                continue
            results.append(cemrl_run(args.env, args.budget, seed, order, hidden, out / f"cemrl_{order}_s{seed}"))
            save_results(results_path, args, results)
            print(json.dumps({k: v for k, v in results[-1].items() if k != "curve"}))
    missing = [seed for seed in seeds if ("td3", seed) not in done]
    if not args.no_td3 and missing:  # the missing seeds as the members of one population
        first_run = not any(r["method"] == "td3" for r in results)
        td3_out = out / ("td3" if first_run else "td3_s" + "_".join(map(str, missing)))
        results += td3_runs(args.env, args.budget, missing, hidden, args.td3_warmup, td3_out)
        save_results(results_path, args, results)
    plot(results, HERE / "plots" / f"cemrl_{name}.png",
         f"CEM-RL (pop 10) vs TD3 on {args.env}, {args.budget} env steps, hidden {tuple(hidden)}")
    for method in sorted({r["method"] for r in results}):
        rs = [r for r in results if r["method"] == method]
        finals = [r["final"] for r in rs]
        sd = np.std(finals, ddof=1) if len(finals) > 1 else 0.0
        print(f"{method}: final {np.mean(finals):.1f} ± {sd:.1f} (SD, ddof 1) over seeds {[r['seed'] for r in rs]}; "
              f"best {np.mean([r['best'] for r in rs]):.1f}; s/update {np.mean([r['s_per_update'] for r in rs]):.4f}")


def save_results(path: Path, args, results: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"config": vars(args), "runs": results}, indent=1) + "\n")

