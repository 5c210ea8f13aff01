"""Study ``envstep`` (fast-PBT paper Table 2): milliseconds per environment interaction.

Host path (gymnasium MuJoCo v5, ``gym:<id>``):

- ``single``: one ``gym.make`` env and one member's jitted exploration policy (TD3 / SAC
  actor, hidden 256x256), one action per call: the paper's Table 2 setting ("Xeon, JAX-jitted
  policy"); ``env_only`` is the same loop with a fixed action (no policy call), to separate
  the policy's share;
- ``vector``: what ``popjax train`` runs: the interaction of one training iteration (``collect``
  below, put together from the loop's runner, placement, driver and compiler as ``Loop.step``
  runs it; ``HostRunner``: ``pop * envs_per_member`` gymnasium envs and one compiled population
  ``act`` per step, transitions stacked into the population layout).

JAX path (brax, ``brax:<name>``, popjax's default backend; ``probe:<name>``): the same
interaction, here one compiled call (``JaxRunner``: a ``lax.scan`` of ``steps`` vmapped
env steps with the population policy). Adding the transitions to the replay buffers belongs
to the ``learn`` stage and is not timed.

JAX env families (``--family gymnax:CartPole-v1,jumanji:Snake-v1,...``): env steps/s of popjax's adapter
against the package's own vmapped step at each env count of ``--envs``, random actions, no policy
(``envstep_families.py``).

The population is built as ``popjax train`` builds it (``popjax.experiment.build``, the
independent driver, no warm-up so the learner's exploration policy acts); with ``--devices d``
its state is split over ``d`` devices (``state_shards`` records into how many pieces).

Reported: ms per call, per env interaction (one env stepped once) and per member step
(all of a member's envs stepped once), median and IQR of at least ``--repeats`` (>= 10) timed
calls; ``compile_s`` (the acting / collect program) and ``first_call_s`` (first call,
compilation included) apart from the timed calls. The study runs in a ``common.Sitting``
(load check, the dense-matmul peak before and after); env stepping has no layer ceiling.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, ClassVar

import jax
import numpy as np

from popjax.learners import LEARNERS
from popjax_bench import common
from popjax_bench import options as opt
from popjax_bench.common import log

STUDY = "envstep"


@dataclasses.dataclass(frozen=True)
class Options(opt.StudyOptions):
    """``popjax bench envstep`` (and ``envstep.run(...)``)."""

    STUDY: ClassVar[str] = STUDY
    learners: tuple[str, ...] = opt.names(("td3", "sac"), "comma-separated learners (their exploration policy "
                                          "acts; the vector rows use the first)", flag="--learner",
                                          allowed=("td3", "sac"), what=" learner")
    gym_envs: tuple[str, ...] = opt.names(("HalfCheetah-v5", "Hopper-v5", "Walker2d-v5", "Ant-v5", "Humanoid-v5",
                                           "Swimmer-v5"), "gymnasium ids ('' for none)", flag="--gym", empty=True,
                                          check=opt.env_check(prefix="gym"))
    brax_envs: tuple[str, ...] = opt.names(("halfcheetah", "hopper", "walker2d", "ant", "humanoid"),
                                           "brax names, or probe:<name> ('' for none)", flag="--brax", empty=True,
                                           check=opt.env_check(jax_only=True, prefix="brax"))
    families: tuple[str, ...] = opt.names((), "JAX env family names (gymnax:<id>, craftax:<name>, jumanji:<id>, "
                                          "playground:<name>, brax:<name>@mjx): adapter vs the package's own step "
                                          "('' for none)", flag="--family", empty=True,
                                          check=opt.env_check(jax_only=True))
    family_envs: tuple[int, ...] = opt.ints((16, 256), "env counts of the --family rows", flag="--envs")
    pops: tuple[int, ...] = opt.ints((1, 4, 16), "population sizes, comma-separated", flag="--pop")
    envs_per_member: int = opt.integer(1, "envs per member of the vector rows")
    steps: int = opt.integer(200, "env steps per timed call (brax: per scan)")
    hidden: tuple[int, ...] | None = opt.ints(None, "policy hidden sizes (default 256,256)")
    repeats: int = opt.repeats()
    min_time: float = opt.min_time()


def _learner(name: str, spec, hidden):
    definition = LEARNERS[name]
    fields = {"hidden": tuple(hidden or (256, 256))}
    config = definition.config_cls(**fields)
    return definition.make(config, spec), definition.default_hparams(config)


def _loop(env: str, learner_name: str, hidden, pop: int, envs_per_member: int, steps: int, devices: int,
          seed: int):
    """The ``popjax.loop.Loop`` of ``popjax train`` for this population (one iteration = ``steps`` steps)."""
    from popjax.config import make_config
    from popjax.experiment import build

    per_iteration = steps * envs_per_member
    config = make_config(learner=learner_name, env=env, pop_size=pop, envs_per_member=envs_per_member,
                         rollout_len=steps, warmup_steps=0, total_env_steps=2 * per_iteration,
                         buffer_size=per_iteration, batch_size=min(32, per_iteration),
                         learner_config={"hidden": list(hidden or (256, 256))}, eval_episodes=1, seed=seed,
                         progress=False, devices=devices)
    return build(config)


def collect(loop):
    """One training iteration's env interaction of ``loop`` (a ``Rollout`` driver such as ``independent``)
    alone, as ``Loop.step`` runs it: ``(state, env_state, iteration) -> (env_state, experience)``.

    Built from the loop's public parts: the driver's ``act`` with the key of step ``t``, the runner's
    ``rollout``, the placement's ``program`` and the loop's compiler (where compile time is booked).
    JAX path: one compiled program (nothing donated); host path: the runner steps the envs on the host,
    one compiled population ``act`` per step (compiled at its first call, when the observations are known).
    """
    from popjax.drivers.base import Rollout
    from popjax.loop import KeyPurpose

    interaction = loop.local.interaction
    if not isinstance(interaction, Rollout):
        raise ValueError(f"envstep: the {loop.config.driver} driver's interaction is not a rollout")
    steps, placement, compiler, axes = interaction.steps, loop.placement, loop.compiler, loop.axes

    def act(key, t, state, obs):  # the key of step t, derived inside the compiled call
        return loop.local.act(jax.random.fold_in(key, t), state, obs)

    def rollout(key, state, env_state):
        return loop.runner.rollout(key, act, state, env_state, steps)

    if loop.runner.jax_path:
        program = placement.program(rollout, (False, axes, True), (True, True))

        def call(state, env_state, iteration):
            key = loop.key(KeyPurpose.COLLECT, iteration)
            return compiler("collect", program, key, state, env_state)(key, state, env_state)

        return call
    act_program = placement.program(act, (False, False, axes, True), True)

    def host_act(key, t, actor, obs):
        obs = placement.from_local(obs)
        acted = compiler("act", act_program, key, t, actor, obs)(key, t, actor, obs)
        return jax.tree.map(lambda x: placement.to_local(x, loop.local_rows), acted)  # (actions, extras)

    def call(state, env_state, iteration):
        return loop.runner.rollout(loop.key(KeyPurpose.COLLECT, iteration), host_act, state, None, steps)

    return call


def _time_collect(loop, pop: int, envs_per_member: int, steps: int, opts) -> dict[str, Any]:
    """Times ``collect(loop)`` (the env state of each call feeds the next); compilation booked apart."""
    state, env_state = loop.initial_state()
    holder = {"env_state": env_state, "iteration": 0}
    interact = collect(loop)

    def call():
        holder["iteration"] += 1
        holder["env_state"], experience = interact(state, holder["env_state"], holder["iteration"])
        return holder["env_state"], experience

    compile_before = loop.compiler.compile_s
    start = time.perf_counter()
    common.block(call())
    first_s = time.perf_counter() - start
    timing = common.time_calls(call, warmup=1, min_repeats=opts.repeats, min_time=opts.min_time)
    n = pop * envs_per_member
    return {
        "compile_s": loop.compiler.compile_s - compile_before,
        "first_call_s": first_s,
        "steps_per_call": steps,
        "timing": timing,
        "ms_per_vector_step": 1e3 * timing["median_s"] / steps,
        "ms_per_interaction": 1e3 * timing["median_s"] / steps / n,
        "ms_per_interaction_iqr": 1e3 * timing["iqr_s"] / steps / n,
        "ms_per_member_step": 1e3 * timing["median_s"] / steps / pop,
        "state_shards": common.shards(state),
    }


def gym_single(env_id: str, learner_name: str, hidden, steps: int, opts) -> dict[str, Any]:
    """One env, one member's jitted policy, one action per call (paper Table 2)."""
    import gymnasium as gym

    from popjax.envs.gymnasium import spec_from_gym_env

    env = gym.make(env_id)
    spec = spec_from_gym_env(env_id, env)
    learner, hp = _learner(learner_name, spec, hidden)
    state = jax.jit(learner.init)(jax.random.key(opts.seed), hp)
    act = jax.jit(lambda key, i, state, obs: learner.act(jax.random.fold_in(key, i), state, obs, hp)[0])
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
        "ms_per_interaction_iqr": 1e3 * with_policy["iqr_s"] / steps,
        "env_only_ms_per_interaction": 1e3 * env_only["median_s"] / steps,
        "env_only_timing": env_only,
    }


def gym_vector(
    env_id: str, learner_name: str, hidden, pop: int, envs_per_member: int, steps: int, opts, devices: int = 1
) -> dict[str, Any]:
    """``collect`` on the host path: pop*envs gymnasium envs, one compiled population ``act`` per step."""
    loop = _loop(f"gym:{env_id}", learner_name, hidden, pop, envs_per_member, steps, devices, opts.seed)
    try:
        return _time_collect(loop, pop, envs_per_member, steps, opts)
    finally:
        loop.runner.close()


def brax_vector(
    env_name: str, learner_name: str, hidden, pop: int, envs_per_member: int, steps: int, opts, devices: int = 1
) -> dict[str, Any]:
    """``collect`` on the JAX path: one compiled scan of ``steps`` vmapped env steps with the population policy."""
    env = env_name if ":" in env_name else f"brax:{env_name}"
    loop = _loop(env, learner_name, hidden, pop, envs_per_member, steps, devices, opts.seed)
    return _time_collect(loop, pop, envs_per_member, steps, opts)


def run(options: Options | None = None, /, **overrides: Any) -> dict[str, Any]:
    """Runs the study and writes ``<out_dir>/envstep.json`` (and ``.png``); returns the payload.

    ``devices``: device counts the population of the ``vector`` rows is split over (one row per
    count; a population that does not divide is recorded as skipped). ``single`` rows run once,
    on one device.
    """
    o = Options.build(options, overrides)
    learners, gym_envs, brax_envs, pops = o.learners, o.gym_envs, o.brax_envs, o.pops
    envs_per_member, steps, hidden, opts = o.envs_per_member, o.steps, o.hidden, o
    devices = list(o.devices)
    common.request_devices(devices)
    started = common.utc_now()
    sitting = common.Sitting(allow_busy=o.allow_busy, wait_quiet=o.wait_quiet, repeats=o.repeats,
                             min_time=o.min_time, seed=o.seed)
    results, notes = [], []

    def attempt(row: dict[str, Any], fn, *args, **kwargs):
        where = f"{row['path']} {row['env']} {row['mode']} {row['learner']} N={row['pop']} d={row['devices']}"
        if row["pop"] % row["devices"]:
            row["skipped"] = f"{row['pop']} members do not divide over {row['devices']} devices"
        else:
            try:
                row.update(fn(*args, **kwargs))
                log(f"  {where}: {row['ms_per_interaction']:.4f} ms/interaction")
            except Exception as err:  # noqa: BLE001 - record and continue: one missing env must not lose the study
                row["skipped"] = f"{type(err).__name__}: {err}"
        if "skipped" in row:
            log(f"  {where}: skipped ({row['skipped']})")
        results.append(row)

    def vector_row(path: str, env: str, pop: int, d: int) -> dict[str, Any]:
        return {"path": path, "env": env, "mode": "vector", "learner": learners[0], "pop": pop,
                "envs": pop * envs_per_member, "devices": d}

    for env_id in gym_envs:
        for name in learners:
            attempt({"path": "gym", "env": env_id, "mode": "single", "learner": name, "pop": 1, "envs": 1,
                     "devices": 1}, gym_single, env_id, name, hidden, steps, opts)
        for d in devices:
            for pop in pops:
                attempt(vector_row("gym", env_id, pop, d), gym_vector, env_id, learners[0], hidden, pop,
                        envs_per_member, steps, opts, devices=d)
    for env_name in brax_envs:
        path = env_name.split(":")[0] if ":" in env_name else "brax"
        for d in devices:
            for pop in pops:
                attempt(vector_row(path, env_name, pop, d), brax_vector, env_name, learners[0], hidden, pop,
                        envs_per_member, steps, opts, devices=d)
    for name in o.families:
        from popjax_bench.envstep_families import family_row

        for n in o.family_envs:
            attempt({"path": name.split(":")[0], "env": name, "mode": "family", "learner": "random", "pop": 1,
                     "envs": n, "devices": 1}, family_row, name, n, steps, opts)
    params = {
        "learners": list(learners),
        "families": list(o.families),
        "family_envs": list(o.family_envs),
        "gym_envs": list(gym_envs),
        "brax_envs": list(brax_envs),
        "pops": list(pops),
        "devices": devices,
        "envs_per_member": envs_per_member,
        "steps_per_call": steps,
        "hidden": list(hidden or (256, 256)),
        "repeats": o.repeats,
        "min_time_s": o.min_time,
        "seed": o.seed,
        "timed": "envstep.collect: one iteration's env interaction as popjax train runs it (no replay-buffer add)",
    }
    try:
        from popjax.envs.brax import DEFAULT_BACKEND

        params["brax_backend"] = DEFAULT_BACKEND
    except ImportError as err:
        notes.append(f"brax path unavailable: {err}")
    payload = common.study_payload(STUDY, params, results, started, notes, **sitting.record())
    return common.write_study(o.out_dir, STUDY, payload, plot_envstep, o.plot)


def main(options: Options) -> dict[str, Any]:
    """``popjax bench envstep``."""
    return run(options)


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
    vector = [r for r in rows if r["mode"] == "vector"]
    for env in dict.fromkeys(r["env"] for r in rows if r["mode"] == "family"):
        series = sorted((r for r in rows if r["mode"] == "family" and r["env"] == env), key=lambda r: r["envs"])
        axes[1].plot([r["envs"] for r in series], [r["ms_per_interaction"] for r in series], marker="s", ls=":",
                     label=f"{env} (adapter, random actions; x = envs)")
    for p, env, d in dict.fromkeys((r["path"], r["env"], r.get("devices", 1)) for r in vector):
        series = sorted(
            (r for r in vector if r["path"] == p and r["env"] == env and r.get("devices", 1) == d),
            key=lambda r: r["pop"],
        )
        axes[1].plot(
            [r["pop"] for r in series],
            [r["ms_per_interaction"] for r in series],
            marker="o",
            ls="-" if p == "brax" else "--",
            label=f"{p}:{env}" + (f" ({d} devices)" if d > 1 else ""),
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
