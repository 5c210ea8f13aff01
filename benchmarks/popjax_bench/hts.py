"""Study ``hts``: env steps/s of the HTS-RL schedule vs the lock-step baseline, beside the runtime model.

The HTS driver's own threads (``popjax.drivers.hts_executors.Executors``: ``--executors`` executor threads, one
toy env each (``popjax.envs.toy``), ``--actors`` actor threads calling one jitted fixed-shape act) run
segments of ``alpha`` steps per env with step times that are constant, exponential or gamma (shape 2)
of mean ``--mean-ms``, drawn from an unseeded source. The learner is emulated by a sleep of
``--learner-ms-per-step`` x alpha per segment (about the rollout time): HTS sleeps while the
executors step (the update overlapped, one barrier per segment), lock-step sleeps after the segment
and puts a barrier after every step (A2C-style). A point's time is the median segment time (after
one warm-up segment, at least ``--repeats`` segments); env steps/s = executors x alpha / that time.

The prediction beside each point (Liu et al. 2020, Claim 1 plus the learner time, see
``popjax_bench.hts_model``): lock-step ``alpha E[max_n X] + L``, HTS ``max(E[max_n Gamma(alpha)], L)``.
``--real-update``: also one row per mode with the real HTS driver and a jitted A2C update on the toy env
(exponential steps, the first alpha), timed per loop iteration.

H2 (in the JSON's ``h2``): under exponential steps the measured HTS / lock-step ratio is at least 0.6 x the
predicted one at every alpha and grows with alpha; with constant steps only the overlap helps (<= 2.2).
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, ClassVar

import numpy as np

from popjax_bench import common, hts_model
from popjax_bench import options as opt
from popjax_bench.common import log

STUDY = "hts"
MODES = ("lockstep", "hts")


@dataclasses.dataclass(frozen=True)
class Options(opt.StudyOptions):
    """``popjax bench hts`` (and ``hts.run(...)``)."""

    STUDY: ClassVar[str] = STUDY
    step_times: tuple[str, ...] = opt.names(("constant", "exponential", "gamma"), "step-time distributions",
                                            allowed=("constant", "exponential", "gamma"))
    alpha: tuple[int, ...] = opt.ints((4, 16, 64), "sync intervals alpha (steps per env between barriers)")
    actors: tuple[int, ...] = opt.ints((1, 2, 4), "actor thread counts")
    executors: int = opt.integer(8, "executor threads (one env each)")
    mean_ms: float = opt.number(2.0, "mean env step time in ms")
    learner_ms_per_step: float = opt.number(1.875, "emulated learner time per segment, in ms per alpha step")
    repeats: int = opt.repeats()
    steps_per_point: int = opt.integer(512, "env steps per env per point at least (more segments for small alpha)")
    real_update: bool = opt.switch(True, "skip the rows with the real jitted A2C update", flag="--no-real-update")

    def check(self) -> None:
        bad = [a for a in self.actors if a > self.executors]
        if bad:
            raise ValueError(f"--actors: {bad[0]} actors for {self.executors} executors (at most {self.executors})")


def _executors(o: Options, kind: str, alpha: int, actors: int, lockstep: bool):
    import jax
    import jax.numpy as jnp

    from popjax.drivers.hts_executors import Executors
    from popjax.envs.registry import env_spec
    from popjax.envs.toy import SleepyToyEnv

    spec = env_spec("gym:popjax/HtsToy-v0")
    ex = Executors(lambda g: SleepyToyEnv(kind, o.mean_ms / 1e3), spec, 1, o.executors, alpha, o.executors, actors,
                   o.seed, lockstep=lockstep, timeout_s=60.0)
    w = jnp.asarray(np.random.default_rng(o.seed).normal(size=(16, 4)), jnp.float32)
    act = jax.jit(lambda obs: jnp.argmax(obs @ w, axis=-1))  # a fixed-shape population forward pass
    act(np.zeros((1, o.executors, 16), np.float32)).block_until_ready()
    ex.act = lambda obs, t, valid: (act(obs), None)
    return ex


def point(o: Options, kind: str, alpha: int, actors: int, mode: str) -> dict[str, Any]:
    learner_s = o.learner_ms_per_step * alpha / 1e3
    ex = _executors(o, kind, alpha, actors, lockstep=mode == "lockstep")
    segments = 1 + max(o.repeats, -(-o.steps_per_point // alpha))
    times = []
    try:
        for s in range(segments):
            start = time.perf_counter()
            if mode == "lockstep":
                ex.segment(s, None)
                time.sleep(learner_s)  # the blocking update
            else:
                ex.segment(s, None, during=lambda: time.sleep(learner_s))  # the update overlaps the segment
            times.append(time.perf_counter() - start)
    finally:
        ex.close()
    stats = common.summarize(times[1:])
    lock_pred, hts_pred = hts_model.segment_times(o.executors, alpha, kind, o.mean_ms / 1e3, learner_s)
    predicted = lock_pred if mode == "lockstep" else hts_pred
    row = {"step_time": kind, "alpha": alpha, "actors": actors, "mode": mode, "learner": "sleep",
           "learner_s": learner_s, "segments": len(times) - 1, **stats,
           "steps_per_s": o.executors * alpha / stats["median_s"],
           "predicted_segment_s": predicted, "predicted_steps_per_s": o.executors * alpha / predicted}
    log(f"  {kind:11s} alpha={alpha:3d} actors={actors} {mode:8s}: {row['steps_per_s']:8.0f} steps/s "
        f"(model {row['predicted_steps_per_s']:8.0f}; segment {1e3 * stats['median_s']:.1f} ms)")
    return row


def real_update_rows(o: Options) -> list[dict[str, Any]]:
    """The real driver (A2C, jitted update) on the toy env with exponential steps, pop 1 x ``executors`` envs."""
    from popjax.config import make_config
    from popjax.experiment import build

    alpha = o.alpha[min(1, len(o.alpha) - 1)]
    rows = []
    for mode in MODES:
        segments = 1 + max(o.repeats, -(-o.steps_per_point // alpha))
        config = make_config(learner="a2c", env="gym:popjax/HtsToy-v0", driver="hts", pop_size=1,
                             envs_per_member=o.executors, seed=o.seed, progress=False,
                             total_env_steps=(segments + 1) * alpha * o.executors,
                             hts={"alpha": alpha, "executors": o.executors, "actors": max(o.actors),
                                  "lockstep": mode == "lockstep"})
        loop = build(config)
        interaction = loop.driver.interaction
        from popjax.envs.toy import SleepyToyEnv

        interaction.executors.env_factory = lambda g: SleepyToyEnv("exponential", o.mean_ms / 1e3)
        state, _ = loop.initial_state()
        times = []
        try:
            for _ in range(segments + 1):  # the first two compile and fill the pipeline
                start = time.perf_counter()
                state, _, _ = loop.step(state, None)
                times.append(time.perf_counter() - start)
        finally:
            interaction.close()
            loop.runner.close()
        stats = common.summarize(times[2:])
        updates = [t["update_s"] for t in interaction.timings[2:] if "update_s" in t]
        learner_s = float(np.median(updates)) if updates else None
        lock_pred, hts_pred = hts_model.segment_times(o.executors, alpha, "exponential", o.mean_ms / 1e3,
                                                      learner_s or 0.0)
        predicted = lock_pred if mode == "lockstep" else hts_pred
        row = {"step_time": "exponential", "alpha": alpha, "actors": max(o.actors), "mode": mode,
               "learner": "a2c (jitted)", "learner_s": learner_s, "segments": len(times) - 2, **stats,
               "steps_per_s": o.executors * alpha / stats["median_s"], "predicted_segment_s": predicted,
               "predicted_steps_per_s": o.executors * alpha / predicted}
        log(f"  real A2C update alpha={alpha} {mode:8s}: {row['steps_per_s']:8.0f} steps/s "
            f"(model {row['predicted_steps_per_s']:8.0f}; update {1e3 * (learner_s or 0):.2f} ms)")
        rows.append(row)
    return rows


def ratios(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """HTS / lock-step steps/s per (step time, alpha, actors, learner), measured and predicted."""
    out = []
    index = {(r["step_time"], r["alpha"], r["actors"], r["learner"], r["mode"]): r for r in rows}
    for (kind, alpha, actors, learner, mode), r in index.items():
        lock = index.get((kind, alpha, actors, learner, "lockstep"))
        if mode == "hts" and lock is not None:
            out.append({"step_time": kind, "alpha": alpha, "actors": actors, "learner": learner,
                        "measured": r["steps_per_s"] / lock["steps_per_s"],
                        "predicted": r["predicted_steps_per_s"] / lock["predicted_steps_per_s"]})
    return out


def h2(ratio_rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The H2 verdict (see the module docstring), per actor count, on the sleep-learner rows."""
    verdict: dict[str, Any] = {}
    for actors in sorted({r["actors"] for r in ratio_rows}):
        exp = sorted((r for r in ratio_rows if r["step_time"] == "exponential" and r["actors"] == actors
                      and r["learner"] == "sleep"), key=lambda r: r["alpha"])
        const = [r for r in ratio_rows if r["step_time"] == "constant" and r["actors"] == actors
                 and r["learner"] == "sleep"]
        if not exp:
            continue
        verdict[f"actors {actors}"] = {
            "exponential: measured >= 0.6 x predicted": all(r["measured"] >= 0.6 * r["predicted"] for r in exp),
            "exponential: ratio grows with alpha": all(b["measured"] > a["measured"]
                                                       for a, b in zip(exp, exp[1:], strict=False)),
            "constant: ratio <= 2.2": all(r["measured"] <= 2.2 for r in const) if const else None}
    verdict["pass"] = bool(verdict) and all(v is not False for k, d in verdict.items() if k != "pass"
                                            for v in d.values())
    return verdict


def run(options: Options | None = None, /, **overrides: Any) -> dict[str, Any]:
    """Runs the study and writes ``<out_dir>/hts.json`` (and ``.png``); returns the payload."""
    o = Options.build(options, overrides)
    started = common.utc_now()
    sitting = common.Sitting(allow_busy=o.allow_busy, wait_quiet=o.wait_quiet, repeats=10, min_time=0.2,
                             seed=o.seed)
    rows = []
    for kind in o.step_times:
        for alpha in o.alpha:
            for actors in o.actors:
                for mode in MODES:
                    rows.append(point(o, kind, alpha, actors, mode))
    if o.real_update:
        rows += real_update_rows(o)
    ratio_rows = ratios(rows)
    params = {"step_times": list(o.step_times), "alpha": list(o.alpha), "actors": list(o.actors),
              "executors": o.executors, "mean_ms": o.mean_ms, "learner_ms_per_step": o.learner_ms_per_step,
              "repeats": o.repeats, "steps_per_point": o.steps_per_point, "seed": o.seed, "gamma_shape": 2.0,
              "measured": "median segment time (alpha steps in every env, barrier, learner) after one warm-up "
                          "segment; steps/s = executors * alpha / median"}
    payload = common.study_payload(STUDY, params, rows, started, ratios=ratio_rows, h2=h2(ratio_rows),
                                   **sitting.record())
    return common.write_study(o.out_dir, STUDY, payload, plot_hts, o.plot)


def main(options: Options) -> dict[str, Any]:
    """``popjax bench hts``."""
    return run(options)


def plot_hts(payload: dict[str, Any], path) -> Any:
    plt = common.pyplot()
    kinds = payload["params"]["step_times"]
    fig, axes = plt.subplots(1, len(kinds) + 1, figsize=(4.2 * (len(kinds) + 1), 4))
    rows = [r for r in payload["results"] if r["learner"] == "sleep"]
    actors = sorted({r["actors"] for r in rows})
    for ax, kind in zip(axes, kinds, strict=False):
        for i, a in enumerate(actors):
            for mode, style in (("hts", "-"), ("lockstep", "--")):
                series = sorted((r for r in rows if r["step_time"] == kind and r["actors"] == a and r["mode"] == mode),
                                key=lambda r: r["alpha"])
                if series:
                    x = [r["alpha"] for r in series]
                    ax.plot(x, [r["steps_per_s"] for r in series], style, marker="o", color=f"C{i}",
                            label=f"{mode}, {a} actor(s)")
                    if i == 0:
                        ax.plot(x, [r["predicted_steps_per_s"] for r in series], style, color="gray", alpha=0.6,
                                label=f"{mode}, model")
        ax.set(xscale="log", xlabel="alpha", ylabel="env steps / s", title=f"{kind} step times")
        _alpha_ticks(ax, payload["params"]["alpha"])
    axes[0].legend(fontsize=7)
    ax = axes[-1]
    for i, kind in enumerate(kinds):
        series = sorted((r for r in payload["ratios"] if r["step_time"] == kind and r["learner"] == "sleep"
                         and r["actors"] == actors[0]), key=lambda r: r["alpha"])
        if series:
            x = [r["alpha"] for r in series]
            ax.plot(x, [r["measured"] for r in series], "-o", color=f"C{i}", label=f"{kind}, measured")
            ax.plot(x, [r["predicted"] for r in series], ":", color=f"C{i}", label=f"{kind}, model")
    ax.set(xscale="log", xlabel="alpha", ylabel="HTS / lock-step steps/s", title=f"speed-up ({actors[0]} actor)")
    _alpha_ticks(ax, payload["params"]["alpha"])
    ax.legend(fontsize=7)
    return common.save_figure(fig, path, payload["machine"])


def _alpha_ticks(ax, alphas) -> None:
    ax.set_xticks(alphas, [str(a) for a in alphas])
    ax.minorticks_off()
    ax.grid(True, alpha=0.3)
