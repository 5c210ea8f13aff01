"""Study ``frontier``: agent env-steps/s of large-batch learners (``fast_td3``) in whole training runs.

For each learner, matmul precision, population size N and envs per member E, a real ``popjax.experiment.train``
run (independent driver, one env step of every env per iteration, ``num_updates`` updates per iteration, the
replay on the device), every compiled call timed by ``train.CallTimer``. Reported per point:

- ``agent_steps_per_s``: N x E x iterations / the steady-state wall time of the training iterations (the warm-up
  iterations, compilation and the final evaluation left out), ``agent_steps_per_s_overall`` the same over the
  loop's whole wall time;
- ``vs_one_member``: the ratio to N = 1 at the same E, learner and precision, measured in the same run (how much a
  population costs over one agent alone);
- the run's ``compile_s`` and ``iteration_s`` (median, IQR).

The JSON is rewritten after every point, so a study stopped by a time limit (``timeout`` in
``benchmarks/frontier_study.sh``) keeps every point it finished. The widths, batch and buffer are options, so the
same study runs FastTD3's real shapes on a GPU and small ones on a CPU.
"""

from __future__ import annotations

import dataclasses
import itertools
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any, ClassVar

from popjax_bench import common
from popjax_bench import options as opt
from popjax_bench.common import log
from popjax_bench.train import CallTimer

STUDY = "frontier"
PRECISIONS = ("default", "tf32", "highest", "bf16")


@dataclasses.dataclass(frozen=True)
class Options(opt.StudyOptions):
    """``popjax bench frontier`` (and ``frontier.run(...)``)."""

    STUDY: ClassVar[str] = STUDY
    env: str = opt.text("probe:pendulum", "the env (a JAX env: brax:humanoid@mjx on a GPU)")
    learners: tuple[str, ...] = opt.names(("fast_td3",), "learners, comma-separated (td3 at the same widths: the "
                                          "cost of the distributional critic)", flag="--learner",
                                          allowed=("fast_td3", "td3"))
    pops: tuple[int, ...] = opt.ints((1, 4), "population sizes, comma-separated", flag="--pop")
    envs_per_member: tuple[int, ...] = opt.ints((16, 64), "envs per member, comma-separated",
                                                flag="--envs-per-member")
    precisions: tuple[str, ...] = opt.names(("default",), "matmul precisions, comma-separated",
                                            flag="--precision", allowed=PRECISIONS)
    iterations: int = opt.integer(60, "training iterations per point (one env step of every env each)")
    warmup_iterations: int = opt.integer(5, "warm-up iterations (random actions, no updates)")
    num_updates: int = opt.integer(2, "updates per iteration (FastTD3: 2)")
    batch_size: int = opt.integer(256, "transitions per update (FastTD3: 32768)")
    buffer_per_env: int = opt.integer(64, "replay rows per env (FastTD3: 10240)")
    critic_hidden: tuple[int, ...] = opt.ints((64, 64), "critic widths (FastTD3: 1024,512,256; td3 uses them for "
                                              "its actor and critics)")
    actor_hidden: tuple[int, ...] = opt.ints((64, 64), "actor widths (FastTD3: 512,256,128)")


def run_one(o: Options, learner: str, pop: int, envs: int, precision: str, work_dir: Path) -> dict[str, Any]:
    from popjax.experiment import train

    steps = o.iterations + o.warmup_iterations
    config = ({"critic_hidden": list(o.critic_hidden), "actor_hidden": list(o.actor_hidden)}
              if learner == "fast_td3" else {"hidden": list(o.critic_hidden)})
    options = dict(learner=learner, env=o.env, pop_size=pop, envs_per_member=envs, rollout_len=1,
                   update_ratio=o.num_updates / envs, total_env_steps=steps * envs,
                   warmup_steps=o.warmup_iterations * envs, batch_size=o.batch_size,
                   buffer_size=o.buffer_per_env * envs, eval_interval=steps * envs, eval_episodes=1, seed=o.seed,
                   progress=False, preset="none", matmul_precision=precision, learner_config=config)
    timer = CallTimer()
    started = time.perf_counter()
    run = train(out_dir=work_dir / f"{learner}-{pop}-{envs}-{precision}", instrument=timer, **options)
    calls = timer.iteration_times("iteration", o.warmup_iterations + 1)
    median = statistics.median(calls)
    summary = run.summary
    return {"learner": learner, "pop": pop, "envs_per_member": envs, "precision": precision,
            "agent_steps_per_s": pop * envs / median,
            "agent_steps_per_s_overall": pop * summary["env_steps"] / summary["wall_s"],
            "iteration_s": median, "iteration_iqr_s": common.summarize(calls)["iqr_s"],
            "iterations_timed": len(calls), "updates_per_iteration": o.num_updates,
            "compile_s": summary["compile_s"], "wall_s": summary["wall_s"],
            "total_s": time.perf_counter() - started, "config": options}


def add_ratios(results: list[dict[str, Any]]) -> None:
    """``vs_one_member``: each point's agent steps/s over N = 1's at the same learner, E and precision."""
    for row in results:
        alone = next((r for r in results if "skipped" not in r and r["pop"] == 1 and
                      (r["learner"], r["envs_per_member"], r["precision"]) ==
                      (row.get("learner"), row.get("envs_per_member"), row.get("precision"))), None)
        if "skipped" not in row and alone is not None:
            row["vs_one_member"] = row["agent_steps_per_s"] / alone["agent_steps_per_s"]


def run(options: Options | None = None, /, **overrides: Any) -> dict[str, Any]:
    """Runs the study and writes ``<out_dir>/frontier.json`` (and ``.png``); returns the payload."""
    o = Options.build(options, overrides)
    started = common.utc_now()
    sitting = common.Sitting(allow_busy=o.allow_busy, wait_quiet=o.wait_quiet, seed=o.seed)
    results = []
    params = {field.name: getattr(o, field.name) for field in dataclasses.fields(o)
              if field.name not in ("out_dir", "plot", "allow_busy", "wait_quiet")}
    payload = None
    with tempfile.TemporaryDirectory(prefix="popjax-bench-frontier-") as tmp:
        for learner, precision, envs, pop in itertools.product(o.learners, o.precisions, o.envs_per_member, o.pops):
            row = {"learner": learner, "pop": pop, "envs_per_member": envs, "precision": precision}
            where = f"{learner} {precision} N={pop:3d} E={envs:5d}"
            try:
                row = run_one(o, learner, pop, envs, precision, Path(tmp))
                log(f"  {where}: {row['agent_steps_per_s']:10.0f} agent steps/s (iteration "
                    f"{1e3 * row['iteration_s']:.2f} ms, compile {row['compile_s']:.1f}s)")
            except Exception as err:  # noqa: BLE001 - one point failing (out of memory) must not lose the study
                row["skipped"] = f"{type(err).__name__}: {str(err)[:300]}"
                log(f"  {where}: skipped ({row['skipped']})")
            results.append(row)
            add_ratios(results)
            payload = common.study_payload(STUDY, params, results, started, **sitting.record(final=False))
            common.write_study(o.out_dir, STUDY, payload, plot_frontier, plot=False)
    payload = common.study_payload(STUDY, params, results, started, **sitting.record())
    return common.write_study(o.out_dir, STUDY, payload, plot_frontier, o.plot)


def main(options: Options) -> dict[str, Any]:
    """``popjax bench frontier``."""
    return run(options)


def plot_frontier(payload: dict[str, Any], path) -> Any:
    plt = common.pyplot()
    rows = [r for r in payload["results"] if "skipped" not in r]
    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    for key in dict.fromkeys((r["learner"], r["precision"], r["envs_per_member"]) for r in rows):
        series = sorted((r for r in rows if (r["learner"], r["precision"], r["envs_per_member"]) == key),
                        key=lambda r: r["pop"])
        ax.plot([r["pop"] for r in series], [r["agent_steps_per_s"] for r in series], marker="o",
                label=f"{key[0]} {key[1]}, {key[2]} envs/member")
    ax.set(xscale="log", yscale="log", xlabel="population size N", ylabel="agent env steps/s (all members)",
           title=f"large-batch learners on {payload['params']['env']}")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)
    return common.save_figure(fig, path, payload["machine"])
