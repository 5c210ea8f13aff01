"""Study ``envstep`` (fast-PBT paper Table 2): milliseconds per environment interaction.

Host path (gymnasium MuJoCo v5, ``gym:<id>``):

- ``single``: one ``gym.make`` env and one member's jitted exploration policy (TD3 / SAC
  actor, hidden 256x256), one action per call: the paper's Table 2 setting ("Xeon, JAX-jitted
  policy"); ``env_only`` is the same loop with a fixed action (no policy call), to separate
  the policy's share;
- ``vector``: popjax's ``HostCollector`` (what ``popjax train`` runs): a ``HostVecEnv`` of
  ``pop * envs_per_member`` envs and one jitted, vmapped population ``act`` per step,
  transitions stacked into the population layout.

JAX path (brax, ``brax:<name>``, popjax's default backend): popjax's ``JaxCollector``, a
jitted ``lax.scan`` of ``steps`` vmapped env steps with the population policy, adding the
transitions to the members' replay buffers (also what ``popjax train`` runs).

Reported: ms per call, per env interaction (one env stepped once) and per member step
(all of a member's envs stepped once).
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import jax
import numpy as np

from popjax.bench import common
from popjax.bench.common import log
from popjax.learners import LEARNERS

STUDY = "envstep"


def _learner(name: str, spec, hidden):
    definition = LEARNERS[name]
    fields = {"hidden": tuple(hidden or (256, 256))}
    config = definition.config_cls(**fields)
    return definition.make(config, spec), definition.default_hparams(config)


def _population(name: str, spec, hidden, pop: int, seed: int):
    from popjax.buffers import make_uniform_buffer
    from popjax.drivers.population import make_population
    from popjax.population.tree import broadcast

    learner, hp1 = _learner(name, spec, hidden)
    population = make_population(learner, make_uniform_buffer(1_000, 32), spec, pop, 1)
    state = jax.jit(population.init)(jax.random.key(seed), jax.tree.map(np.asarray, broadcast(hp1, pop)))
    return population, state


def gym_single(env_id: str, learner_name: str, hidden, steps: int, opts) -> dict[str, Any]:
    """One env, one member's jitted policy, one action per call (paper Table 2)."""
    import gymnasium as gym

    from popjax.envs.gymnasium import spec_from_gym_env

    env = gym.make(env_id)
    spec = spec_from_gym_env(env_id, env)
    learner, hp = _learner(learner_name, spec, hidden)
    state = jax.jit(learner.init)(jax.random.key(opts.seed), hp)
    act = jax.jit(lambda key, i, state, obs: learner.act(jax.random.fold_in(key, i), state, obs, hp))
    low, high = np.asarray(spec.action_low, np.float32), np.asarray(spec.action_high, np.float32)
    key = jax.random.key(opts.seed)
    obs, _ = env.reset(seed=opts.seed)
    start = time.perf_counter()
    common.block(act(key, 0, state, obs.astype(np.float32)))
    compile_s = time.perf_counter() - start
    counter = [0]

    def rollout(use_policy: bool):
        nonlocal obs
        fixed = np.zeros(spec.action_dim, np.float32)
        for _ in range(steps):
            if use_policy:
                counter[0] += 1
                a = np.asarray(act(key, counter[0], state, obs.astype(np.float32)))
            else:
                a = fixed
            obs, _, term, trunc, _ = env.step(low + 0.5 * (a + 1.0) * (high - low))
            if term or trunc:
                obs, _ = env.reset()

    kwargs = dict(warmup=1, min_repeats=opts.repeats, min_time=opts.min_time, sync=lambda _: None)
    with_policy = common.time_calls(lambda: rollout(True), **kwargs)
    env_only = common.time_calls(lambda: rollout(False), **kwargs)
    env.close()
    return {
        "compile_s": compile_s,
        "steps_per_call": steps,
        "timing": with_policy,
        "ms_per_interaction": 1e3 * with_policy["median_s"] / steps,
        "env_only_ms_per_interaction": 1e3 * env_only["median_s"] / steps,
        "env_only_timing": env_only,
    }


def gym_vector(
    env_id: str, learner_name: str, hidden, pop: int, envs_per_member: int, steps: int, opts
) -> dict[str, Any]:
    """popjax's HostCollector: pop*envs gymnasium envs, one jitted population ``act`` per step."""
    from popjax.drivers.collect import HostCollector
    from popjax.envs.registry import make_host_env

    name = f"gym:{env_id}"
    env = make_host_env(name, pop * envs_per_member, opts.seed)
    population, state = _population(learner_name, env.spec, hidden, pop, opts.seed)
    collector = HostCollector(
        population, env, lambda n: make_host_env(name, n, opts.seed), envs_per_member, steps
    )
    collector.reset(jax.random.key(0))
    start = time.perf_counter()
    common.block(collector.collect(jax.random.key(1), state, explore=True))
    first_s = time.perf_counter() - start
    calls = [0]

    def call():
        calls[0] += 1
        return collector.collect(jax.random.key(calls[0]), state, explore=True)

    timing = common.time_calls(call, warmup=1, min_repeats=max(2, opts.repeats // 2), min_time=opts.min_time)
    collector.close()
    n = pop * envs_per_member
    return {
        "first_call_s": first_s,
        "steps_per_call": steps,
        "timing": timing,
        "ms_per_vector_step": 1e3 * timing["median_s"] / steps,
        "ms_per_interaction": 1e3 * timing["median_s"] / steps / n,
        "ms_per_member_step": 1e3 * timing["median_s"] / steps / pop,
    }


def brax_vector(
    env_name: str, learner_name: str, hidden, pop: int, envs_per_member: int, steps: int, opts
) -> dict[str, Any]:
    """popjax's JaxCollector: a jitted scan of ``steps`` vmapped brax steps with the population policy."""
    from popjax.drivers.collect import JaxCollector
    from popjax.envs.base import make_vec_env
    from popjax.envs.registry import make_jax_env

    vec_env = make_vec_env(make_jax_env(env_name if ":" in env_name else f"brax:{env_name}"))
    population, state = _population(learner_name, vec_env.spec, hidden, pop, opts.seed)
    collector = JaxCollector(population, vec_env, envs_per_member, steps)
    env_state = jax.jit(collector.reset)(jax.random.key(opts.seed))
    collect = lambda key, state, env_state: collector.collect(key, state, env_state, True)
    compiled, compile_times = common.compile_timed(collect, jax.random.key(0), state, env_state)
    holder = {"env_state": env_state}
    calls = [0]

    def call():
        calls[0] += 1
        _, holder["env_state"], stats = compiled(jax.random.key(calls[0]), state, holder["env_state"])
        return holder["env_state"], stats

    timing = common.time_calls(call, warmup=1, min_repeats=max(2, opts.repeats // 2), min_time=opts.min_time)
    n = pop * envs_per_member
    return {
        "compile_s": compile_times["compile_s"],
        "steps_per_call": steps,
        "timing": timing,
        "ms_per_vector_step": 1e3 * timing["median_s"] / steps,
        "ms_per_interaction": 1e3 * timing["median_s"] / steps / n,
        "ms_per_member_step": 1e3 * timing["median_s"] / steps / pop,
    }


def run(
    learners=("td3", "sac"),
    gym_envs=("HalfCheetah-v5",),
    brax_envs=("halfcheetah",),
    pops=(1, 4, 16),
    envs_per_member=1,
    steps=200,
    hidden=None,
    repeats=5,
    min_time=1.0,
    out_dir=common.DEFAULT_OUT,
    seed=0,
    plot=True,
) -> dict[str, Any]:
    opts = argparse.Namespace(repeats=repeats, min_time=min_time, seed=seed)
    started = common.utc_now()
    load_before = common.load_average()
    results, notes = [], []

    def attempt(row: dict[str, Any], fn, *args):
        try:
            row.update(fn(*args))
            log(
                f"  {row['path']:4s} {row['env']:16s} {row['mode']:6s} {row['learner']} N={row['pop']:3d}: "
                f"{row['ms_per_interaction']:.4f} ms/interaction"
            )
        except Exception as err:  # noqa: BLE001 - record and continue: one missing env must not lose the study
            row["skipped"] = f"{type(err).__name__}: {err}"
            log(f"  {row['path']} {row['env']} {row['mode']} N={row['pop']}: skipped ({row['skipped']})")
        results.append(row)

    for env_id in gym_envs:
        for name in learners:
            attempt(
                {"path": "gym", "env": env_id, "mode": "single", "learner": name, "pop": 1, "envs": 1},
                gym_single,
                env_id,
                name,
                hidden,
                steps,
                opts,
            )
        for pop in pops:
            attempt(
                {
                    "path": "gym",
                    "env": env_id,
                    "mode": "vector",
                    "learner": learners[0],
                    "pop": pop,
                    "envs": pop * envs_per_member,
                },
                gym_vector,
                env_id,
                learners[0],
                hidden,
                pop,
                envs_per_member,
                steps,
                opts,
            )
    for env_name in brax_envs:
        for pop in pops:
            attempt(
                {
                    "path": env_name.split(":")[0] if ":" in env_name else "brax",
                    "env": env_name,
                    "mode": "vector",
                    "learner": learners[0],
                    "pop": pop,
                    "envs": pop * envs_per_member,
                },
                brax_vector,
                env_name,
                learners[0],
                hidden,
                pop,
                envs_per_member,
                steps,
                opts,
            )
    params = {
        "learners": list(learners),
        "gym_envs": list(gym_envs),
        "brax_envs": list(brax_envs),
        "pops": list(pops),
        "envs_per_member": envs_per_member,
        "steps_per_call": steps,
        "hidden": list(hidden or (256, 256)),
        "repeats": repeats,
        "min_time_s": min_time,
        "seed": seed,
    }
    try:
        from popjax.envs.brax import DEFAULT_BACKEND

        params["brax_backend"] = DEFAULT_BACKEND
    except ImportError as err:
        notes.append(f"brax path unavailable: {err}")
    payload = common.study_payload(
        STUDY, params, results, started, notes, load_before=load_before, load_after=common.load_average()
    )
    return common.write_study(out_dir, STUDY, payload, plot_envstep, plot)


def plot_envstep(payload: dict[str, Any], path) -> Any:
    plt = common.pyplot()
    rows = [r for r in payload["results"] if "skipped" not in r]
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    single = [r for r in rows if r["mode"] == "single"]
    labels = [f"{r['env']}\n{r['learner']}" for r in single]
    axes[0].bar(range(len(single)), [r["ms_per_interaction"] for r in single], label="env + jitted policy")
    axes[0].bar(
        range(len(single)), [r["env_only_ms_per_interaction"] for r in single], label="env only", alpha=0.7
    )
    axes[0].set_xticks(range(len(single)), labels, fontsize=6, rotation=45)
    axes[0].set(ylabel="ms per interaction", title="gym MuJoCo, one env, one member (paper Table 2)")
    axes[0].legend(fontsize=7)
    for p, env in dict.fromkeys((r["path"], r["env"]) for r in rows if r["mode"] == "vector"):
        series = sorted(
            (r for r in rows if r["mode"] == "vector" and r["path"] == p and r["env"] == env),
            key=lambda r: r["pop"],
        )
        axes[1].plot(
            [r["pop"] for r in series],
            [r["ms_per_interaction"] for r in series],
            marker="o",
            ls="-" if p == "brax" else "--",
            label=f"{p}:{env}",
        )
    axes[1].set(
        xscale="log",
        yscale="log",
        xlabel="population size N (envs per member fixed)",
        ylabel="ms per env interaction",
        title="vector envs with the jitted population policy",
    )
    axes[1].grid(True, which="both", alpha=0.3)
    axes[1].legend(fontsize=7)
    return common.save_figure(fig, path, payload["machine"])


def main(args: argparse.Namespace) -> dict[str, Any]:
    split = lambda text: [x for x in text.split(",") if x]
    return run(
        learners=split(args.learner),
        gym_envs=split(args.gym),
        brax_envs=split(args.brax),
        pops=common.parse_int_list(args.pop),
        envs_per_member=args.envs_per_member,
        steps=args.steps,
        hidden=common.parse_int_list(args.hidden) if args.hidden else None,
        repeats=args.repeats,
        min_time=args.min_time,
        out_dir=args.out,
        seed=args.seed,
        plot=not args.no_plot,
    )
