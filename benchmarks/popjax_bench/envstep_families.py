"""The ``family`` rows of ``popjax bench envstep`` (``--family``): env steps per second of a JAX env family
through popjax's adapter against the package's own vmapped, auto-resetting step.

Both sides run one compiled ``lax.scan`` of ``steps`` steps of ``n`` envs with the same uniformly random actions
(drawn inside the scan from the step's key); no policy. The adapter is ``make_vec_env`` of the family's
``JaxEnv`` (episode clock, termination/truncation, the true last observation, auto-reset). The package's own:

- ``gymnax:`` / ``craftax:``: ``jax.vmap(env.step)`` (gymnax's and craftax's auto-resetting ``step``);
- ``jumanji:``: ``jax.vmap`` of ``jumanji.wrappers.AutoResetWrapper(env).step``;
- ``playground:``: ``mujoco_playground.wrapper.wrap_for_brax_training`` (vmap, episode length, auto-reset);
- ``brax:``: ``brax.envs.wrappers.training.wrap`` (the same wrappers in brax).

``steps_per_s`` = ``n * steps / median call time``; ``ratio`` = adapter / package (1.0: the adapter costs nothing).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from popjax_bench import common


def _random_action(spec, key, n):
    if spec.discrete:
        return jax.random.randint(key, (n,), 0, spec.num_actions)
    return jax.random.uniform(key, (n, spec.action_dim), minval=-1.0, maxval=1.0)


def adapter(name: str, n: int):
    """``(spec, init(key) -> state, step(key, state) -> state)`` of popjax's vec env of ``name``."""
    from popjax.envs import registry
    from popjax.envs.base import make_vec_env

    vec = make_vec_env(registry.make_jax_env(name))

    def step(key, state):
        return vec.step(key, state, _random_action(vec.spec, jax.random.fold_in(key, 1), n))[0]

    return vec.spec, lambda key: vec.reset(key, n), step


def native(name: str, n: int):
    """``(init(key) -> state, step(key, state) -> state)`` of the package's own vmapped auto-resetting step."""
    from popjax.envs import registry
    from popjax.envs.base import to_native

    spec = registry.env_spec(name)
    prefix, env_id = registry.parse(name)
    act = lambda key: to_native(spec, _random_action(spec, jax.random.fold_in(key, 1), n))
    keys = lambda key: jax.random.split(key, n)
    if prefix in ("gymnax", "craftax"):
        if prefix == "gymnax":
            import gymnax

            env, params = gymnax.make(env_id)
        else:
            from craftax.craftax_env import make_craftax_env_from_name

            env = make_craftax_env_from_name(env_id, auto_reset=True)
            params = env.default_params
        reset = jax.vmap(env.reset, in_axes=(0, None))
        stepper = jax.vmap(env.step, in_axes=(0, 0, 0, None))
        return (lambda key: reset(keys(key), params)[1],
                lambda key, state: stepper(keys(key), state, act(key), params)[1])
    if prefix == "jumanji":
        import jumanji
        from jumanji.wrappers import AutoResetWrapper

        from popjax.envs.jumanji import _actions

        env = AutoResetWrapper(jumanji.make(env_id))
        to_env = _actions(name, env.action_spec)[1]
        return (lambda key: jax.vmap(env.reset)(keys(key))[0],
                lambda key, state: jax.vmap(env.step)(state, jax.vmap(to_env)(act(key)))[0])
    if prefix == "playground":
        from mujoco_playground import wrapper

        from popjax.envs.playground import _load

        env, episode_length = _load(env_id)
        env = wrapper.wrap_for_brax_training(env, episode_length=episode_length)
    elif prefix == "brax":
        from brax.envs.wrappers import training

        from popjax.envs.brax import _get_environment

        env = training.wrap(_get_environment(env_id, None), episode_length=spec.max_episode_steps)
    else:
        raise ValueError(f"--family: {name!r} has no package step to compare with (allowed: gymnax:, craftax:, "
                         "jumanji:, playground:, brax:)")
    return lambda key: env.reset(keys(key)), lambda key, state: env.step(state, act(key))


def _time(init, step, n: int, steps: int, opts) -> dict[str, Any]:
    def scan(state, key):
        return jax.lax.scan(lambda s, t: (step(jax.random.fold_in(key, t), s), None), state, jnp.arange(steps))[0]

    program = jax.jit(scan)
    key = jax.random.key(opts.seed)
    state = common.block(jax.jit(init)(key))
    import time

    start = time.perf_counter()
    compiled = program.lower(state, key).compile()
    compile_s = time.perf_counter() - start
    holder = {"state": state, "i": 0}

    def call():
        holder["i"] += 1
        holder["state"] = compiled(holder["state"], jax.random.fold_in(key, holder["i"]))
        return holder["state"]

    timing = common.time_calls(call, warmup=1, min_repeats=opts.repeats, min_time=opts.min_time)
    return {"compile_s": compile_s, "timing": timing, "steps_per_s": n * steps / timing["median_s"]}


def family_row(name: str, n: int, steps: int, opts) -> dict[str, Any]:
    """One ``--family`` row: the adapter's and the package's steps/s for ``n`` envs."""
    spec, init, step = adapter(name, n)
    ours = _time(init, step, n, steps, opts)
    theirs = _time(*native(name, n), n, steps, opts)
    return {"steps_per_call": steps, "adapter": ours, "package": theirs,
            "steps_per_s": ours["steps_per_s"], "package_steps_per_s": theirs["steps_per_s"],
            "ratio": ours["steps_per_s"] / theirs["steps_per_s"],
            "ms_per_interaction": 1e3 / ours["steps_per_s"], "obs_dim": spec.obs_shape[0],
            "actions": spec.describe_actions()}
