"""F1: the ReF-ER beta controller (Eq. 12) on a synthetic drifting Gaussian policy (spec refer.md §10).

    PYTHONPATH=. .venv/bin/python experiments/refer_controller.py [--steps 100000] [--seeds 3]

A state-free Gaussian policy N(m, sigma^2) in 1-D acts once per step into a FIFO replay of N = 2^14 rows that
stores its behaviour (mean, log-std, the action, rho = 1 on insert). Every step samples B = 128 rows uniformly,
computes rho with the current m, and moves m by gradient descent on ReF-ER's loss with a constant task gradient
(the task pushes m at a fixed rate, applied through the near samples only, divided by B) plus (1 - beta) x the
KL(mu || pi) gradient; the sampled rows' rho are written back and beta follows Eq. 12 on the far fraction of the
stored rho with the current c_max = 1 + C / (1 + A t). The functions are popjax's (``popjax.learners.refer``).

Arms: D in {0.05, 0.1, 0.2} with C = 4, A = 5 / T, beta step 1e-3, beta0 = 0, sigma 0.2; and C = 1e30 (c_max -> inf,
the unconstrained drift). Pass: after the first 20 % of the steps, the far fraction stays within [0.5 D, 2 D] and
beta stays strictly inside (0, 1), for every seed. Writes experiments/results/refer_controller.json and
experiments/plots/refer_controller.png (far fraction and beta against D).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from popjax.learners import refer
from popjax.plots import save_figure

HERE = Path(__file__).parent
N, B, SIGMA, LR, DRIFT = 2 ** 14, 128, 0.2, 1e-3, 1.0  # task gradient -DRIFT: m moves ~LR * DRIFT per step at beta 1
LOG_EVERY = 500


def simulate(key, steps: int, c: float, d: float, beta_lr: float = 1e-3):
    """Returns per-logged-step (far fraction, beta, c_max, m) of one run."""
    a_rate = 5.0 / steps
    log_sigma = jnp.log(jnp.float32(SIGMA))

    def step(carry, t):
        m, beta, means, us, rhos, size, k = carry
        k, k_act, k_sample = jax.random.split(k, 3)
        row = t % N
        u = m + SIGMA * jax.random.normal(k_act)
        means, us, rhos = means.at[row].set(m), us.at[row].set(u), rhos.at[row].set(1.0)
        size = jnp.minimum(size + 1, N)
        idx = jax.random.randint(k_sample, (B,), 0, size)
        cmax = refer.c_max(jnp.float32(c), jnp.float32(a_rate), t)
        rho = refer.importance_ratio(us[idx, None], m[None, None], log_sigma[None, None], means[idx, None],
                                     log_sigma[None, None])
        near = refer.near_mask(rho, cmax).astype(jnp.float32)

        def loss(mean):
            task = -DRIFT * mean * jnp.ones(B)  # a constant task gradient -DRIFT per sample
            kl = refer.kl_gaussian(means[idx, None], log_sigma[None, None], mean[None, None], log_sigma[None, None])
            return refer.refer_objective(task, near, kl, beta)

        m = m - LR * jax.grad(loss)(m)
        rhos = rhos.at[idx].set(rho)
        far = refer.far_fraction(rhos, jnp.arange(N) < size, cmax)
        beta = refer.beta_step(beta, far, jnp.float32(d), jnp.float32(beta_lr))
        return (m, beta, means, us, rhos, size, k), (far, beta, cmax, m)

    init = (jnp.float32(0.0), jnp.float32(0.0), jnp.zeros(N), jnp.zeros(N), jnp.ones(N), jnp.int32(0), key)
    _, out = jax.lax.scan(step, init, jnp.arange(steps, dtype=jnp.int32))
    return [x[::LOG_EVERY] for x in out]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=100_000)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--plot-only", action="store_true", help="redraw the plot from the saved results")
    args = parser.parse_args()
    if args.plot_only:
        saved = json.loads((HERE / "results" / "refer_controller.json").read_text())
        plot(saved, HERE / "plots" / "refer_controller.png")
        return
    started = time.time()
    arms = [{"name": f"D={d}", "c": 4.0, "d": d} for d in (0.05, 0.1, 0.2)] + [{"name": "C=inf", "c": 1e30, "d": 0.1}]
    run = jax.jit(simulate, static_argnums=(1,))
    results = {"steps": args.steps, "seeds": args.seeds, "N": N, "B": B, "sigma": SIGMA, "lr": LR, "drift": DRIFT,
               "A": 5.0 / args.steps, "beta_lr": 1e-3, "log_every": LOG_EVERY, "arms": []}
    after = int(0.2 * args.steps / LOG_EVERY)
    for arm in arms:
        seeds = []
        for seed in range(args.seeds):
            far, beta, cmax, m = (np.asarray(x, np.float64) for x in run(jax.random.key(seed), args.steps,
                                                                            arm["c"], arm["d"]))
            tail_far, tail_beta = far[after:], beta[after:]
            seeds.append({"seed": seed, "far": far.tolist(), "beta": beta.tolist(), "c_max": cmax.tolist(),
                          "mean": m.tolist(), "far_min": float(tail_far.min()), "far_max": float(tail_far.max()),
                          "far_mean": float(tail_far.mean()), "beta_min": float(tail_beta.min()),
                          "beta_max": float(tail_beta.max()), "beta_mean": float(tail_beta.mean()),
                          "drift_per_1k_steps": float((m[-1] - m[after]) / ((len(m) - 1 - after) * LOG_EVERY) * 1e3)})
        d = arm["d"]
        held = all(0.5 * d <= s["far_min"] and s["far_max"] <= 2 * d and 0 < s["beta_min"] and s["beta_max"] < 1
                   for s in seeds)
        results["arms"].append({**arm, "passed": held if arm["c"] < 1e29 else None, "seeds": seeds})
        print(json.dumps({"arm": arm["name"], "passed": held,
                          **{k: [round(s[k], 4) for s in seeds] for k in ("far_min", "far_max", "beta_mean",
                                                                          "drift_per_1k_steps")}}), flush=True)
    results["wall_s"] = round(time.time() - started, 1)
    out = HERE / "results" / "refer_controller.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results) + "\n")
    plot(results, HERE / "plots" / "refer_controller.png")


def plot(results: dict, path: Path) -> None:
    import matplotlib.pyplot as plt

    fig, (ax_far, ax_beta, ax_d) = plt.subplots(1, 3, figsize=(16, 4))
    colors = {"D=0.05": "tab:blue", "D=0.1": "tab:orange", "D=0.2": "tab:green", "C=inf": "tab:gray"}
    for arm in results["arms"]:
        for s in arm["seeds"]:
            x = np.arange(len(s["far"])) * results["log_every"]
            label = arm["name"] if s["seed"] == 0 else None
            ax_far.plot(x, s["far"], color=colors[arm["name"]], lw=0.8, label=label)
            ax_beta.plot(x, s["beta"], color=colors[arm["name"]], lw=0.8, label=label)
        if arm["c"] < 1e29:
            ax_far.axhline(arm["d"], color=colors[arm["name"]], ls="--", lw=0.8)
    ax_far.set(xlabel="gradient steps", ylabel="far fraction of the replay", yscale="log", ylim=(1e-3, 1.1),
               title="far fraction (dashed: D)")
    ax_beta.set(xlabel="gradient steps", ylabel="beta", title="beta (Eq. 12)")
    ax_far.legend(fontsize=8)
    controlled = [arm for arm in results["arms"] if arm["c"] < 1e29]
    ds = [arm["d"] for arm in controlled]
    for key, marker, label in (("far_mean", "o", "far fraction"), ("beta_mean", "s", "beta")):
        for arm in controlled:
            ax_d.scatter([arm["d"]] * len(arm["seeds"]), [s[key] for s in arm["seeds"]], marker=marker,
                         color="tab:red" if key == "far_mean" else "tab:blue",
                         label=label if arm is controlled[0] else None)
    ax_d.plot(ds, ds, color="tab:red", ls="--", lw=0.8, label="far fraction = D")
    ax_d.set(xlabel="D", ylabel="mean after 20 % of the steps", title="far fraction and beta against D")
    ax_d.legend(fontsize=8)
    fig.suptitle("F1: ReF-ER controller on a drifting Gaussian policy (C = 4, A = 5/T, N = 2^14, B = 128)")
    save_figure(fig, path)


if __name__ == "__main__":
    main()
