"""The ``family`` rows of ``popjax bench envstep`` (``--family``): env steps per second of a JAX env family
through popjax's adapter against the package's own vmapped, auto-resetting step.

Both sides run one compiled ``lax.scan`` of ``steps`` steps of ``n`` envs with the same uniformly random actions
(drawn inside the scan from the step's key); no policy. The adapter is ``make_vec_env`` of the family's
``JaxEnv`` (episode clock, termination/truncation, the true last observation, auto-reset). The package's own:

- ``gymnax:`` / ``craftax:``: ``jax.vmap(env.step)`` (gymnax's and craftax's auto-resetting ``step``);
- ``jumanji:``: ``jax.vmap`` of ``jumanji.wrappers.AutoResetWrapper(env).step``;
- ``playground:``: ``mujoco_playground.wrapper.wrap_for_brax_training`` (vmap, episode length, auto-reset);
- ``brax:``: ``brax.envs.wrappers.training.wrap`` (the same wrappers in brax).

Each side's scan carries everything its step returns (popjax: the vec env state and the ``StepOutput``; gymnax:
observation, state, reward, flags and info; jumanji: state and ``TimeStep``; brax / playground: the ``State``), so
the compiler drops nothing a learner would read: a carry of the env state alone lets XLA skip the package's
observation, which the adapter must compute. jumanji's wrapper keeps the episode's last observation
(``next_obs_in_extras=True``), as popjax's ``StepOutput.next_obs`` and gymnax's ``info["final_observation"]`` do.

``steps_per_s`` = ``n * steps / median call time``; ``ratio`` = adapter / package (1.0: the adapter costs nothing).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from popjax_bench import common


def _random_action(spec, key, n):
    if spec.discrete:
        return jax.random.randint(key, (n,), 0, spec.num_actions)
    return jax.random.uniform(key, (n, spec.action_dim), minval=-1.0, maxval=1.0)


def _carrying_outputs(reset, step, state_of):
    """``(init(key) -> outputs, step(key, outputs) -> outputs)``: a scan whose carry is everything ``step``
    returns (``state_of(outputs)`` is the env state the next step reads), so nothing it computes is dropped."""
    return (lambda key: step(key, reset(key))), (lambda key, outputs: step(key, state_of(outputs)))


def adapter(name: str, n: int):
    """``(spec, init(key) -> carry, step(key, carry) -> carry)`` of popjax's vec env of ``name``."""
    from popjax.envs import registry
    from popjax.envs.base import make_vec_env

    vec = make_vec_env(registry.make_jax_env(name))

    def step(key, state):
        return vec.step(key, state, _random_action(vec.spec, jax.random.fold_in(key, 1), n))

    return (vec.spec, *_carrying_outputs(lambda key: vec.reset(key, n), step, lambda out: out[0]))


def native(name: str, n: int):
    """``(init(key) -> carry, step(key, carry) -> carry)`` of the package's own vmapped auto-resetting step."""
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
        return _carrying_outputs(lambda key: reset(keys(key), params)[1],
                                 lambda key, state: stepper(keys(key), state, act(key), params), lambda out: out[1])
    if prefix == "jumanji":
        import jumanji
        from jumanji.wrappers import AutoResetWrapper

        from popjax.envs.jumanji import _actions

        env = AutoResetWrapper(jumanji.make(env_id), next_obs_in_extras=True)
        to_env = _actions(name, env.action_spec)[1]
        return _carrying_outputs(lambda key: jax.vmap(env.reset)(keys(key))[0],
                                 lambda key, state: jax.vmap(env.step)(state, jax.vmap(to_env)(act(key))),
                                 lambda out: out[0])
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


ROUNDS = 3  # the two sides' timed calls alternate in this many rounds: a shared machine's load shifts over minutes


def _compile(init, step, steps: int, opts):
    """``(compile_s, call() -> carry)``: one compiled scan of ``steps`` steps, each call continuing the last."""
    def scan(state, key):
        return jax.lax.scan(lambda s, t: (step(jax.random.fold_in(key, t), s), None), state, jnp.arange(steps))[0]

    key = jax.random.key(opts.seed)
    state = common.block(jax.jit(init)(key))
    with common.Stopwatch() as watch:
        compiled = jax.jit(scan).lower(state, key).compile()
    holder = {"state": state, "i": 0}

    def call():
        holder["i"] += 1
        holder["state"] = compiled(holder["state"], jax.random.fold_in(key, holder["i"]))
        return holder["state"]

    return watch.seconds, call


def family_row(name: str, n: int, steps: int, opts) -> dict[str, Any]:
    """One ``--family`` row: the adapter's and the package's steps/s for ``n`` envs."""
    spec, init, step = adapter(name, n)
    sides = {"adapter": _compile(init, step, steps, opts), "package": _compile(*native(name, n), steps, opts)}
    times = {side: [] for side in sides}
    for _ in range(ROUNDS):
        for side, (_, call) in sides.items():
            timing = common.time_calls(call, warmup=1, min_repeats=max(1, -(-opts.repeats // ROUNDS)),
                                       min_time=opts.min_time / ROUNDS)
            times[side] += timing["times_s"]
    ours, theirs = ({"compile_s": sides[side][0], "timing": common.summarize(times[side]),
                     "steps_per_s": n * steps / float(np.median(times[side]))} for side in sides)
    return {"steps_per_call": steps, "adapter": ours, "package": theirs,
            "steps_per_s": ours["steps_per_s"], "package_steps_per_s": theirs["steps_per_s"],
            "ratio": ours["steps_per_s"] / theirs["steps_per_s"],
            "ms_per_interaction": 1e3 / ours["steps_per_s"], "obs_dim": spec.obs_shape[0],
            "actions": spec.describe_actions()}
