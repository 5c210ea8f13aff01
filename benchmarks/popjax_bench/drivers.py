"""Study ``drivers``: time per training iteration of every driver, on 1 and more devices.

For each driver, device count and ``--parallel`` path (``pmap`` only for drivers that have
it), one real ``popjax.train`` run on a JAX env (the iteration is one compiled call) with the
loop's compiled programs wrapped by a timer that blocks on their outputs. Reported per run:
the median and IQR of the iterations' call times (the first quarter, which holds the warm-up
iterations that only collect, is left out), the compile time, and the ratio to the same driver on one device.
On a CPU the devices are forced host devices sharing the same cores: the ratio shows the
cost of splitting (collectives, smaller per-device batches), not a speed-up. At least 10
iterations are timed per run. The study runs in a ``common.Sitting`` (load check, the
dense-matmul peak before and after, and the N×[B,h]@[h,h] ceiling of the TD3 update's dominant
layer for each device count).
"""

from __future__ import annotations

import dataclasses
import tempfile
from pathlib import Path
from typing import Any, ClassVar

from popjax_bench import common
from popjax_bench import options as opt
from popjax_bench.common import log
from popjax_bench.train import CallTimer

STUDY = "drivers"
MIN_ITERATIONS = 10


def _drivers():
    from popjax.drivers import DRIVERS

    return DRIVERS


@dataclasses.dataclass(frozen=True)
class Options(opt.StudyOptions):
    """``popjax bench drivers`` (and ``drivers.run(...)``)."""

    STUDY: ClassVar[str] = STUDY
    SPLIT: ClassVar[str] = "pop"
    drivers: tuple[str, ...] = opt.names(("independent", "pbt", "cemrl", "dvd"), "comma-separated drivers",
                                         flag="--driver", allowed=_drivers, what=" driver")
    parallel: tuple[str, ...] = opt.names(("sharding", "pmap"), "parallel paths for device counts > 1",
                                          allowed=("sharding", "pmap"))
    pop: int = opt.integer(4, "population size")
    env: str = opt.text("probe:pendulum", "a JAX env (the iteration is one compiled call)",
                        check=opt.env_check(jax_only=True))
    env_steps: int = opt.integer(2000, "env steps per member")
    warmup: int = opt.integer(200, "random warm-up env steps per member", ge=0)
    rollout_len: int = opt.integer(50, "env steps per env per iteration (K)")
    batch_size: int = opt.integer(64, "batch size")
    hidden: tuple[int, ...] = opt.ints((64, 64), "hidden sizes")

    def check(self) -> None:
        calls = -(-self.env_steps // self.rollout_len)
        if calls - calls // 4 < MIN_ITERATIONS:
            raise ValueError(f"--env-steps: {self.env_steps} env steps with --rollout-len {self.rollout_len} give "
                             f"{calls - calls // 4} timed iterations (the first quarter is left out); at least "
                             f"{MIN_ITERATIONS} are needed")
# Per-driver options that make every mechanism act within a short run.
DRIVER_OPTIONS = {
    "pbt": {"pbt": {"quantile": 0.25}},
    "cemrl": {"cemrl": {"updates_per_call": 50}},
    "dvd": {},
}


def run_one(driver: str, devices: int, parallel: str, pop: int, env: str, env_steps: int, warmup: int,
            rollout_len: int, batch_size: int, hidden, seed: int, work_dir: Path) -> dict[str, Any]:
    from popjax.experiment import train

    options = dict(learner="td3", env=env, driver=driver, pop_size=pop, total_env_steps=env_steps,
                   warmup_steps=warmup, rollout_len=rollout_len, batch_size=batch_size, eval_interval=env_steps // 4,
                   eval_episodes=1, buffer_size=max(env_steps * pop, 4 * batch_size), seed=seed, progress=False,
                   devices=devices, parallel=parallel, learner_config={"hidden": list(hidden)},
                   **DRIVER_OPTIONS.get(driver, {}))
    timer = CallTimer()
    run = train(out_dir=work_dir / f"{driver}-{parallel}-{devices}", instrument=timer, **options)
    # The first quarter of the iterations is left out: warm-up iterations collect only (a rollout
    # driver's first warmup / rollout_len, CEM-RL's first generation), whatever the driver.
    calls = timer.times.get("iteration", [])
    training = calls[len(calls) // 4:]
    stats = common.summarize(training)
    return {"driver": driver, "devices": devices, "parallel": parallel, "pop": pop, "env": env,
            "iteration_s": stats["median_s"], "iteration_iqr_s": stats["iqr_s"], "iterations_timed": len(training),
            "compile_s": run.summary["compile_s"], "wall_s": run.summary["wall_s"],
            "updates": run.summary["updates"], "state_shards": common.shards(run.state), "config": options}


def run(options: Options | None = None, /, **overrides: Any) -> dict[str, Any]:
    """Runs the study and writes ``<out_dir>/drivers.json`` (and ``.png``); returns the payload."""
    o = Options.build(options, overrides)
    drivers, devices, parallel, pop, env = o.drivers, o.devices, o.parallel, o.pop, o.env
    env_steps, warmup, rollout_len, batch_size, hidden, seed = (o.env_steps, o.warmup, o.rollout_len, o.batch_size,
                                                                o.hidden, o.seed)
    known = _drivers()
    common.request_devices(devices)
    started = common.utc_now()
    sitting = common.Sitting(allow_busy=o.allow_busy, wait_quiet=o.wait_quiet, seed=seed)
    layers = {d: sitting.layer(pop, batch_size, max(hidden), d) for d in devices if pop % d == 0}
    results = []
    with tempfile.TemporaryDirectory(prefix="popjax-bench-drivers-") as tmp:
        for driver in drivers:
            for d in devices:
                paths = ["sharding"] if d == 1 else [p for p in parallel if p == "sharding" or known[driver].pmap]
                for path in paths:
                    row = run_one(driver, d, path, pop, env, env_steps, warmup, rollout_len, batch_size, hidden,
                                  seed, Path(tmp)) | {"layer_gflops": layers.get(d)}
                    results.append(row)
                    log(f"  {driver:12s} devices {d} {path:8s}: {1e3 * row['iteration_s']:8.2f} ms/iteration "
                        f"(IQR {1e3 * row['iteration_iqr_s']:.2f}, {row['iterations_timed']} calls; "
                        f"compile {row['compile_s']:.1f} s)")
    for row in results:
        base = next((r for r in results if r["driver"] == row["driver"] and r["devices"] == 1), None)
        row["vs_one_device"] = None if base is None else row["iteration_s"] / base["iteration_s"]
    params = {"drivers": list(drivers), "devices": list(devices), "parallel": list(parallel), "pop": pop, "env": env,
              "env_steps_per_member": env_steps, "warmup_steps": warmup, "rollout_len": rollout_len,
              "updates_per_iteration": rollout_len, "batch_size": batch_size, "hidden": list(hidden), "seed": seed}
    payload = common.study_payload(STUDY, params, results, started, **sitting.record())
    return common.write_study(o.out_dir, STUDY, payload, plot_drivers, o.plot)


def main(options: Options) -> dict[str, Any]:
    """``popjax bench drivers``."""
    return run(options)


def plot_drivers(payload: dict[str, Any], path) -> Any:
    plt = common.pyplot()
    rows = payload["results"]
    labels = sorted({(r["devices"], r["parallel"]) for r in rows})
    drivers = list(dict.fromkeys(r["driver"] for r in rows))
    fig, ax = plt.subplots(figsize=(8, 4.2))
    width = 0.8 / len(labels)
    for i, (d, path_name) in enumerate(labels):
        values = [next((1e3 * r["iteration_s"] for r in rows if r["driver"] == name and r["devices"] == d
                        and r["parallel"] == path_name), 0.0) for name in drivers]
        ax.bar([j + i * width for j in range(len(drivers))], values, width, label=f"{d} device(s), {path_name}")
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(drivers))], drivers)
    p = payload["params"]
    ax.set(ylabel="ms per training iteration (median)",
           title=f"one iteration: {p['rollout_len']} env steps + {p['updates_per_iteration']} updates, "
                 f"pop {p['pop']}, {p['env']}")
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=8)
    return common.save_figure(fig, path, payload["machine"])
