"""DvD (5 TD3 actors, shared critic, scheduled diversity) vs weight 0 vs plain TD3, shared code.

Used by ``dvd_pendulum.py`` (R4) and ``dvd_halfcheetah.py``:

    .venv/bin/python experiments/dvd_<name>.py [--budget N] [--seeds 0,1]
        [--variants dvd,dvd_release_kernel,weight0] [--env ENV] [--hidden 64,64] [--out runs/dvd_<name>]

The budget counts env steps summed over the population: each of the 5 DvD members gets
budget / 5, with one population update per summed env step as in the release
(``update_ratio = 5`` per member step), policy delay 2; the release's weight schedule is
compressed into the budget (``schedule_scale: auto`` = budget / 3e6). Variants:

- ``dvd``: embedding distance normalised by its size and ``rbf_scale`` 0.5 (the kernel is
  then informative at any batch size);
- ``dvd_release_kernel``: the release kernel (unnormalised squared distance, scale 1);
- ``dvd_bandit``: the ``dvd`` kernel with the weight drawn by DvD's Thompson-sampling bandit
  over {0, 0.5} at every evaluation instead of the schedule;
- ``weight0``: the same shared-critic population with the diversity weight fixed at 0.

The TD3 baseline (one agent per seed, the whole budget each) is read from
experiments/results/cemrl_<name>.json when present, else run here. Writes
experiments/results/dvd_<name>.json and experiments/plots/dvd_<name>.png (best member's
return vs summed env steps, and the embedding distance).
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
from cemrl_common import common, experiment_parser, plot_seed_curves, save_results, td3_runs

import popjax
from popjax.plots import save_figure

HERE = Path(__file__).parent
VARIANTS = {
    "dvd": {"schedule_scale": "auto", "normalize": True, "rbf_scale": 0.5},
    "dvd_release_kernel": {"schedule_scale": "auto", "normalize": False, "rbf_scale": 1.0},
    "dvd_bandit": {"weight_source": "bandit", "normalize": True, "rbf_scale": 0.5},
    "weight0": {"weights": [0.0, 0.0, 0.0, 0.0]},
}


def dvd_run(env: str, budget: int, seed: int, variant: str, hidden: list[int], out: Path) -> dict:
    pop = 5
    per_member = budget // pop
    run = popjax.train(env=env, driver="dvd", pop_size=pop, seed=seed, total_env_steps=per_member,
                       warmup_steps=per_member // 10, eval_interval=per_member // 10, eval_episodes=10,
                       update_ratio=float(pop), buffer_size=budget, dvd=VARIANTS[variant], out_dir=out,
                       **common(hidden))
    with (out / "metrics.csv").open() as f:
        rows = list(csv.DictReader(f))
    steps = sorted({int(r["env_steps"]) for r in rows})
    at = lambda s, col: [float(r[col]) for r in rows if int(r["env_steps"]) == s]
    best = [[s * pop, max(at(s, "eval_return"))] for s in steps]
    distance = [[s * pop, at(s, "embedding_distance")[0]] for s in steps]
    div_loss = [[s * pop, at(s, "diversity_loss")[0]] for s in steps]
    weight = [[s * pop, at(s, "diversity_weight")[0]] for s in steps]
    finite = all(np.isfinite(float(v)) for r in rows[pop:] for k, v in r.items() if k not in ("member",))
    s = run.summary
    return {"method": variant, "seed": seed, "curve": best, "embedding_distance": distance,
            "diversity_loss": div_loss, "diversity_weight": weight, "final": max(s["final_returns"]),
            "final_mean": float(np.mean(s["final_returns"])), "best": s["best_return"], "all_finite": finite,
            "updates": s["updates"], "wall_s": s["wall_s"], "compile_s": s["compile_s"],
            "s_per_update": s["wall_s"] / max(s["updates"], 1), "out": str(out)}


def plot(results: list[dict], path: Path, title: str) -> None:
    import matplotlib.pyplot as plt  # headless: popjax.plots selected the Agg backend

    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
    for i, method in enumerate(sorted({r["method"] for r in results})):
        rs = [r for r in results if r["method"] == method]
        plot_seed_curves(ax, rs, f"C{i}", method)
        if "embedding_distance" in rs[0]:
            for j, r in enumerate(rs):
                d = np.asarray([p for p in r["embedding_distance"] if p[1] == p[1]])
                if len(d):
                    ax2.plot(d[:, 0], d[:, 1], color=f"C{i}", lw=1.5, label=method if j == 0 else None)
    ax.set_xlabel("env steps (summed over the population)")
    ax.set_ylabel("eval return (DvD: best member; TD3: each seed)")
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    ax2.set_xlabel("env steps (summed over the population)")
    ax2.set_ylabel("mean RMS action distance between actors")
    ax2.set_title("behaviour-embedding distance (training batches)", fontsize=10)
    ax2.grid(alpha=0.3)
    ax2.legend(fontsize=8)
    save_figure(fig, path)


def main(name: str, description: str, budget: int, seeds: str, variants: str, env: str, hidden: str,
         td3_warmup: int) -> None:
    """The experiment ``dvd_<name>`` with these defaults for its command-line options."""
    parser = experiment_parser("dvd", name, description, budget, seeds, env, hidden, td3_warmup)
    parser.add_argument("--variants", default=variants)
    args = parser.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    hidden = [int(h) for h in args.hidden.split(",")]
    results_path = Path(args.results)
    results = json.loads(results_path.read_text())["runs"] if results_path.exists() else []
    done = {(r["method"], r["seed"]) for r in results}
    for variant in [v for v in args.variants.split(",") if v]:
        for seed in seeds:
            if (variant, seed) in done:
                continue
            results.append(dvd_run(args.env, args.budget, seed, variant, hidden, Path(args.out) / f"{variant}_s{seed}"))
            save_results(results_path, args, results)
            print(json.dumps({k: v for k, v in results[-1].items()
                              if k not in ("curve", "embedding_distance", "diversity_loss", "diversity_weight")}))
    td3_path = HERE / "results" / f"cemrl_{name}.json"
    td3 = []
    if td3_path.exists():
        td3 = [r for r in json.loads(td3_path.read_text())["runs"] if r["method"] == "td3"]
    if not td3:
        td3 = td3_runs(args.env, args.budget, seeds, hidden, args.td3_warmup, Path(args.out) / "td3")
    plot(results + td3, HERE / "plots" / f"dvd_{name}.png",
         f"DvD (pop 5) vs TD3 on {args.env}, {args.budget} env steps, hidden {tuple(hidden)}")
    for method in sorted({r["method"] for r in results + td3}):
        rs = [r for r in results + td3 if r["method"] == method]
        finals = [r["final"] for r in rs]
        sd = np.std(finals, ddof=1) if len(finals) > 1 else 0.0
        line = (f"{method}: final {np.mean(finals):.1f} ± {sd:.1f} (SD, ddof 1) "
                f"(seeds {[r['seed'] for r in rs]})")
        if "embedding_distance" in rs[0]:
            last = [[p[1] for p in r["embedding_distance"] if p[1] == p[1]][-1] for r in rs]
            line += f"; final embedding distance {np.mean(last):.3f}; all finite {all(r['all_finite'] for r in rs)}"
        print(line)
