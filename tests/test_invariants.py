"""Invariants of every registered learner under every driver that accepts it, generated from the registries.

The parametrization is computed when this module is collected, from ``popjax.registry`` (``LEARNERS``,
``DRIVERS``): a learner (or driver) is covered by registering it.

1. **vmap == per-member loop** (per learner): three members with different in-bounds hparams; ``jit(vmap)`` of a
   member's two updates (a ``scan``: a ``ReplayStep`` on ``[H, B]`` batches, ``Windows`` for windowed learners; a
   ``RolloutStep`` on a ``Trajectory``, synchronous, then with the previous state as behaviour), ``act`` and
   ``policy`` equals each member's alone, leaf for leaf. Slow variants: the other action kind of a learner that
   takes both, importance-weighted replay updates, and the ``maintain``/``shrink`` hooks.
2. **Traces once across hparam changes** (per accepted (learner, driver) pair): after a tiny run, a new loop reuses
   that run's compiled programs, every member's every hparam is changed (same dtypes, in bounds), and the same
   compiled iteration keeps training with them; every program of the run (PBT exploits included) was traced once.
3. **Kill-and-resume exact** (the same runs): the run directory without its newest checkpoints and its summary,
   resumed with a fresh compile cache, equals the uninterrupted run: the state leaf for leaf, the summary and the
   metrics.csv rows (nothing lost, nothing duplicated).
4. **Bad hparams refused** (per learner): every hparam outside its declared bounds (and NaN, inf, a non-integer
   for integer hparams, one bad member of a list) is a one-line ``ConfigError`` starting ``hparams.<name>``, with
   no warning before it, and nothing is written. The registry entry is checked too: defaults and the PBT prior
   inside the bounds.

Every (learner, driver) pair is in the matrix: an accepted pair builds, a refused one is a one-line ``ConfigError``
naming the field ``expected_refusal`` predicts (nothing written); a refusal the rules do not predict, or an
acceptance they do not, fails. The runs of 2 and 3 are tiny (2 members, 6 iterations of 10 env steps on a probe
env; CEM-RL 3 generations; hts 6 segments on a toy gym env, continuous actions on ``ContinuousToy``). The runs of
``DEFAULT_PAIRS`` are in the default selection, those of every other accepted pair behind ``slow``
(``make test-slow``). Compiled programs go to the persistent XLA cache the other run tests use (speed only).
"""

from __future__ import annotations

import csv
import dataclasses
import shutil
import warnings
from typing import Any

import gymnasium as gym
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from learner_helpers import fast_compile, use_shared_xla_cache  # noqa: F401  (fast_compile: an autouse fixture)

import popjax
from popjax.checkpoint import Checkpointer
from popjax.config import ConfigError, make_config, make_learner_config
from popjax.drivers.base import OwnInteraction
from popjax.envs.registry import env_spec
from popjax.envs.toy import EPISODE_STEPS, OBS_DIM, SleepyToyEnv
from popjax.experiment import build
from popjax.learners.base import ReplayStep, RolloutStep
from popjax.loop import Compiler
from popjax.population.hparams import hparam_bounds, hparams_table, population_hparams, validate_space
from popjax.population.tree import member, stack
from popjax.registry import DRIVERS, LEARNERS
from popjax.types import Replayed, Trajectory, Transition, Windows


# --- a continuous toy gym env for the hts driver ---------------------------------------------------
class ContinuousToy(SleepyToyEnv):
    """``gym:popjax/HtsToy-v0`` with actions in [-1, 1]^2 that mix two fixed matrices; snapshotted like it
    (``get_state``/``set_state``), so an hts run on it resumes exactly."""

    MATRICES = (np.random.default_rng(7).normal(size=(2, OBS_DIM, OBS_DIM)) / np.sqrt(OBS_DIM)).astype(np.float32)

    def __init__(self):
        super().__init__()
        self.action_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)

    def step(self, action):
        a = np.clip(np.asarray(action, np.float32).reshape(2), -1.0, 1.0)
        mix = 0.5 * (1.0 + a[0]) * self.MATRICES[0] + 0.5 * (1.0 + a[1]) * self.MATRICES[1]
        self._t += 1
        self._obs = np.tanh(mix @ self._obs + np.float32(0.1) * self._noise()).astype(np.float32)
        return self._obs.copy(), float(self._obs[0] - 0.1 * a @ a), False, self._t >= EPISODE_STEPS, {}


CONTINUOUS_TOY = "popjax-test/ContinuousToy-v0"
if CONTINUOUS_TOY not in gym.registry:
    gym.register(id=CONTINUOUS_TOY, entry_point=ContinuousToy, max_episode_steps=EPISODE_STEPS)

# --- the matrix, from the registries ----------------------------------------------------------------
LEARNER_NAMES = sorted(LEARNERS)
DRIVER_NAMES = sorted(DRIVERS)
SHARED_CRITIC_DRIVERS = ("cemrl", "dvd")  # they train a LearnerDef.shared_critic population

# Small static settings that make each known learner's mechanisms act within a tiny run (target copies, SPO
# rounds and target rounds, PPO minibatches, RLx2 topology steps, n-step targets and replay shrinks). A learner
# not listed runs with its defaults (and ``hidden: [8]`` when its Config has ``hidden``).
LEARNER_CONFIG: dict[str, dict[str, Any]] = {
    "dqn": {"target_update_period": 2},
    "spo_dqn": {"replicas": 2, "local_steps": 2, "target_rounds": 1},
    "spo_td3": {"replicas": 2, "local_steps": 2, "target_rounds": 1},
    "ppo": {"epochs": 2, "minibatches": 2},
    "rlx2_td3": {"dst_interval": 10, "n_step": 2, "n_step_start": 10, "buffer_check_interval": 20,
                 "buffer_min": 50, "buffer_threshold": 1e-9, "buffer_oldest": 16},
    "rlx2_sac": {"dst_interval": 10, "n_step": 2, "n_step_start": 10, "buffer_check_interval": 20,
                 "buffer_min": 50, "buffer_threshold": 1e-9, "buffer_oldest": 16},
    "fast_td3": {"critic_hidden": [8], "actor_hidden": [8], "num_atoms": 5, "n_step": 2},
    "memr_sac": {"model_buffer": 16, "sac_batch": 8, "ensemble": 2, "elites": 1, "model_hidden": [8],
                 "psi_hidden": [8], "model_steps": 1, "psi_epochs": 1, "real_ratio": 0.25, "priority_lag": 5},
}
# Run options a learner needs (MEMR's prioritized start states are drawn by the prioritized source).
LEARNER_RUN: dict[str, dict[str, Any]] = {"memr_sac": {"buffer": "prioritized"}}
# 2 members, 6 iterations of 5 steps x 2 envs, evaluations (and checkpoints) after iterations 2, 4 and 6.
RUN = dict(pop_size=2, seed=3, total_env_steps=60, rollout_len=5, envs_per_member=2, eval_interval=20,
           eval_episodes=1, warmup_steps=10, batch_size=8, buffer_size=200, progress=False)
DRIVER_RUN: dict[str, dict[str, Any]] = {
    # one generation per iteration: every actor runs one 200-step episode; 3 generations
    "cemrl": {"envs_per_member": 1, "total_env_steps": 600, "eval_interval": 200, "warmup_steps": 100,
              "buffer_size": 1000, "update_ratio": 0.05, "cemrl": {"updates_per_call": 10}},
    "dvd": {"dvd": {"weight_source": "bandit", "bandit_random": 1}},
    # 6 segments of alpha = 5 steps x 2 envs per member, in 2 executor threads answered by 1 actor thread
    "hts": {"hts": {"alpha": 5, "executors": 2, "actors": 1}},
}
# The pairs whose run (invariants 2 and 3) is in the default selection: a replay learner with chunked updates and
# an on-policy learner with PBT's exploits, a learner that refreshes stored values (ReF-ER: its replay recomputed
# after exploits); every other accepted pair runs with ``make test-slow``
# (tests/test_drivers.py also runs TD3 under every driver, and DQN under hts, in the default selection).
DEFAULT_PAIRS = {("spo_dqn", "independent"), ("a2c", "pbt")}  # ReF-ER under PBT: test_refer.py by default


def jax_env(learner: str) -> str:
    return "probe:pendulum" if LEARNERS[learner].action_kind == "continuous" else "probe:cartpole"


def env_for(learner: str, driver: str) -> str:
    if driver == "hts":  # gymnasium envs stepped in host threads
        return f"gym:{CONTINUOUS_TOY}" if LEARNERS[learner].action_kind == "continuous" else "gym:popjax/HtsToy-v0"
    return jax_env(learner)


def learner_config(learner: str) -> dict[str, Any]:
    fields = {f.name for f in dataclasses.fields(LEARNERS[learner].config_cls)}
    return {**({"hidden": [8]} if "hidden" in fields else {}), **LEARNER_CONFIG.get(learner, {})}


def candidates(learner: str, count: int) -> dict[str, list]:
    """``{hparam: count distinct values inside its declared bounds}``, the first its default: scaled defaults for
    floats (offsets from 0 for a zero default), default + 0, 1, 2, -1, ... for integers."""
    definition = LEARNERS[learner]
    defaults = definition.default_hparams(None)
    out = {}
    for name, number in hparam_bounds(definition.hparams_cls).items():
        default = np.asarray(getattr(defaults, name)).item()
        if number.integer:
            values = [int(default) + s for s in (0, 1, 2, -1, 3, -2, 4, 5)]
        elif default != 0:
            values = [float(np.float32(default * f)) for f in (1.0, 0.5, 1.5, 0.75, 1.25, 0.25, 2.0)]
        else:
            values = [0.0, 0.01, 0.02, 0.03, -0.01, -0.02, -0.03]
        inside = list(dict.fromkeys(v for v in values if number.inside(v)))
        assert len(inside) >= count, f"{learner}: fewer than {count} in-bounds values of {name} near {default}"
        out[name] = inside[:count]
    return out


def pbt_options(learner: str) -> dict[str, Any]:
    """PBT every evaluation, one loser of two; the learner's own prior, or one built from an hparam's bounds."""
    options: dict[str, Any] = {"interval": 20, "quantile": 0.5}
    if LEARNERS[learner].pbt.search_space is None:
        bounds = hparam_bounds(LEARNERS[learner].hparams_cls)
        name = next(n for n in bounds if not bounds[n].integer)
        values = candidates(learner, 3)[name]
        options["search_space"] = {name: {"low": min(values), "high": max(values)}}
    return options


def run_options(learner: str, driver: str) -> dict[str, Any]:
    """The tiny run of a pair; member m has the values ``candidates(...)[name][m]``."""
    hparams = {name: values[:2] for name, values in candidates(learner, 3).items()}
    options = {**RUN, "learner": learner, "driver": driver, "env": env_for(learner, driver),
               "learner_config": learner_config(learner), "hparams": hparams, **LEARNER_RUN.get(learner, {}),
               **DRIVER_RUN.get(driver, {})}
    if driver == "pbt":
        options["pbt"] = pbt_options(learner)
    return options


def tiny_learner(learner: str, driver: str = "independent"):
    """``(learner, its Config, the spec)`` of the pair's run, made as ``popjax.experiment.build`` makes it."""
    config = make_config(**run_options(learner, driver))
    spec = env_spec(config.env)
    return LEARNERS[learner].make(make_learner_config(config), spec), config, spec


def expected_refusal(learner: str, driver: str) -> str | None:
    """The field a driver's refusal of a learner names, or None when it accepts it: a step kind the driver does
    not train, a shared-critic driver with a learner that offers none, a driver without the replay source the learner's
    run needs (``LEARNER_RUN``), hts with multi-step windows or hooks."""
    definition = LEARNERS[learner]
    if not DRIVERS[driver].accepts_step(definition.step_kind):
        return "driver"
    if driver in SHARED_CRITIC_DRIVERS and definition.shared_critic is None:
        return "learner"
    if not DRIVERS[driver].accepts_source(LEARNER_RUN.get(learner, {}).get("buffer", "uniform")):
        return "buffer"
    if driver == "hts" and definition.step_kind is ReplayStep:
        made, _, _ = tiny_learner(learner, "hts")
        if made.step.window > 1 or made.maintain is not None or made.shrink is not None:
            return "learner"
    return None


PAIRS = [(learner, driver) for learner in LEARNER_NAMES for driver in DRIVER_NAMES]
REFUSED = {pair: field for pair in PAIRS if (field := expected_refusal(*pair)) is not None}
ACCEPTED = [pair for pair in PAIRS if pair not in REFUSED]


def pair_param(learner: str, driver: str):
    slow = () if (learner, driver) in DEFAULT_PAIRS else (pytest.mark.slow,)
    return pytest.param(learner, driver, id=f"{learner}-{driver}", marks=slow)


@pytest.fixture(autouse=True)
def xla_cache():
    use_shared_xla_cache()


# --- tree comparisons ---------------------------------------------------------------------------------
def assert_members_equal(a, b, what: str, atol=1e-6, rtol=1e-5):
    """Leaf for leaf: floats to float rounding (a batched matmul may round differently from an unbatched one),
    everything else (ints, bools, keys) exactly."""
    assert jax.tree.structure(a) == jax.tree.structure(b), what
    for (path, x), y in zip(jax.tree_util.tree_leaves_with_path(a), jax.tree.leaves(b), strict=True):
        x, y = np.asarray(x), np.asarray(y)
        where = f"{what}{jax.tree_util.keystr(path)}"
        assert x.shape == y.shape and x.dtype == y.dtype, where
        if np.issubdtype(x.dtype, np.inexact):
            np.testing.assert_allclose(x, y, atol=atol, rtol=rtol, err_msg=where)
        else:
            np.testing.assert_array_equal(x, y, err_msg=where)


def assert_trees_identical(a, b):
    assert jax.tree.structure(a) == jax.tree.structure(b)
    for (path, x), y in zip(jax.tree_util.tree_leaves_with_path(a), jax.tree.leaves(b), strict=True):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y), err_msg=jax.tree_util.keystr(path))


def float_leaves_differ(a, b) -> bool:
    return any(np.issubdtype(np.asarray(x).dtype, np.inexact) and not np.array_equal(np.asarray(x), np.asarray(y))
               for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True))


# --- random data of a spec ------------------------------------------------------------------------------
def random_transitions(key, spec, shape: tuple[int, ...]) -> Transition:
    k_obs, k_act, k_rew, k_next, k_term = jax.random.split(key, 5)
    if spec.discrete:
        action = jax.random.randint(k_act, shape, 0, spec.num_actions, jnp.int32)
    else:
        action = jax.random.uniform(k_act, shape + (spec.action_dim,), jnp.float32, -1.0, 1.0)
    return Transition(obs=jax.random.normal(k_obs, shape + spec.obs_shape),
                      action=action,
                      reward=jax.random.normal(k_rew, shape),
                      next_obs=jax.random.normal(k_next, shape + spec.obs_shape),
                      terminated=(jax.random.uniform(k_term, shape) < 0.2).astype(jnp.float32))


def random_extras(key, example, shape: tuple[int, ...]):
    """A learner's per-transition record (``ReplayStep.extras``): positive values near 1 for a ``rho`` or a
    ``log_std`` (its exp), normal draws (scaled) for the rest."""
    leaves, treedef = jax.tree.flatten(example)
    keys = jax.random.split(key, len(leaves))
    drawn = [jax.random.uniform(k, shape + x.shape, minval=0.3, maxval=2.0) if x.ndim == 0
             else 0.3 * jax.random.normal(k, shape + x.shape) for k, x in zip(keys, leaves, strict=True)]
    return jax.tree.unflatten(treedef, drawn)


def random_replay_batches(key, spec, step: ReplayStep, batch: int, leading: tuple[int, ...]):
    """Batches ``leading + [B, ...]`` as a replay source hands them to ``step``: transitions, or ``Windows`` of
    ``step.window`` consecutive steps with their episode-end flags; with the learner's ``extras``, and as
    ``Replayed`` (the refreshed value of a 32-row replay beside them) for a step that refreshes one."""
    if step.extras is not None:
        k_tr, k_ex, k_stored = jax.random.split(key, 3)
        transitions = random_transitions(k_tr, spec, leading + (batch,))
        transitions = transitions.replace(extras=random_extras(k_ex, step.extras, leading + (batch,)))
        if step.refresh is None:
            return transitions
        stored = jax.random.uniform(k_stored, leading + (32,), minval=0.1, maxval=8.0)
        return Replayed(transitions, stored, jnp.broadcast_to(jnp.arange(32) < 24, leading + (32,)))
    if step.window == 1:
        return random_transitions(key, spec, leading + (batch,))
    k_tr, k_end = jax.random.split(key)
    shape = leading + (batch, step.window)
    return Windows(random_transitions(k_tr, spec, shape), jax.random.uniform(k_end, shape) < 0.2)


def random_trajectory(key, spec, steps: int, envs: int) -> Trajectory:
    k_tr, k_end = jax.random.split(key)
    transitions = random_transitions(k_tr, spec, (steps, envs))
    ended = (transitions.terminated > 0) | (jax.random.uniform(k_end, (steps, envs)) < 0.1)
    return Trajectory(transitions, ended)


# --- 1. vmap == per-member loop -----------------------------------------------------------------------------
def vmap_cases():
    """Per learner: its (first) action kind, unweighted updates, in the default selection; slow: the other action
    kind of a learner that takes both, and importance-weighted replay updates (learners with TD magnitudes) with
    the learner's hooks (``maintain``, ``shrink``)."""
    for learner in LEARNER_NAMES:
        definition = LEARNERS[learner]
        envs = ("probe:cartpole", "probe:pendulum") if definition.action_kind == "any" else (jax_env(learner),)
        for i, env in enumerate(envs):
            yield pytest.param(learner, env, False, id=f"{learner}-{env.split(':')[1]}",
                               marks=(pytest.mark.slow,) if i else ())
        made = tiny_learner(learner)[0]
        replay = isinstance(made.step, ReplayStep)
        extra = [what for what, has in (("weighted", replay and made.step.priorities),
                                        ("hooks", replay and (made.maintain or made.shrink))) if has]
        if extra:
            yield pytest.param(learner, envs[0], True, id=f"{learner}-{envs[0].split(':')[1]}-{'-'.join(extra)}",
                               marks=pytest.mark.slow)


def member_program(learner, spec, config, extended: bool = False):
    """One member's two updates (a ``scan``) and its acting, as one function of ``(key, state, hparams)`` (the
    data drawn inside from the member's key), for ``jit`` and ``jit(vmap)`` alike. ``extended``: replay updates
    with importance weights (a prioritized source's; else None, a uniform source's) when the learner returns TD
    magnitudes, and the learner's hooks on the updated state."""
    step = learner.step

    def program(key, state, hp):
        k_data, k_update, k_act, k_hook = jax.random.split(key, 4)
        out = {}
        if isinstance(step, RolloutStep):
            trajectories = stack([random_trajectory(jax.random.fold_in(k_data, i), spec, config.rollout_len,
                                                    config.envs_per_member) for i in range(2)])

            def rollout_update(carry, xs):  # behaviour: the state itself, then the one before (HTS's lag)
                now, behaviour = carry
                key, trajectory = xs
                new, metrics = step.update(key, now, trajectory, hp, behaviour)
                return (new, now), (new, metrics)

            (last, _), (out["states"], out["metrics"]) = jax.lax.scan(
                rollout_update, (state, state), (jax.random.split(k_update, 2), trajectories))
        else:
            h, b = step.chunk, config.batch_size
            batches = random_replay_batches(k_data, spec, step, b, (2, h))
            weights = jax.random.uniform(jax.random.fold_in(k_data, 1), (2, h, b), minval=0.1, maxval=1.0)

            def replay_update(now, xs):
                keys, batch, w = xs
                new, metrics, td = step.update(keys, now, batch, w if extended and step.priorities else None, hp)
                return new, (new, metrics, td)

            keys = jax.random.split(k_update, 2 * h).reshape(2, h)
            last, (out["states"], out["metrics"], out["td"]) = jax.lax.scan(replay_update, state,
                                                                          (keys, batches, weights))
            if extended and learner.maintain is not None:
                out["maintained"] = learner.maintain.run(k_hook, last, member(member(batches, 0), 0), hp)
            if extended and learner.shrink is not None:
                rows = random_transitions(jax.random.fold_in(k_hook, 1), spec, (learner.shrink.oldest,))
                valid = jnp.arange(learner.shrink.oldest) < learner.shrink.oldest - 2
                out["shrink"] = learner.shrink.run(last, rows, valid, jnp.int32(150), hp)
        obs = jax.random.normal(jax.random.fold_in(k_act, 1), (3,) + spec.obs_shape)
        out["act"] = learner.act(k_act, last, obs, hp)
        out["policy"] = learner.policy(last, obs)
        return out

    return program


@pytest.mark.long
@pytest.mark.parametrize(("name", "env", "extended"), list(vmap_cases()))
def test_vmap_equals_the_per_member_loop(name, env, extended):
    definition = LEARNERS[name]
    config = make_config(**{**run_options(name, "independent"), "env": env})
    spec = env_spec(env)
    values = candidates(name, 3)
    hparams = population_hparams(definition.default_hparams(None), 3, {k: v[:3] for k, v in values.items()})
    cfg = make_learner_config(config)
    if definition.fit.specialize is not None:  # as a driver builds it for a population with these hparams
        cfg = definition.fit.specialize(cfg, hparams, config.updates_per_iter, frozenset())
    learner = definition.make(cfg, spec)
    assert isinstance(learner.step, definition.step_kind)

    keys = jax.random.split(jax.random.key(11), 3)
    init = jax.jit(learner.init)  # each member alone (a vmapped init is not what drivers run, see init_members)
    states = [init(jax.random.fold_in(keys[m], 0), member(hparams, m)) for m in range(3)]
    program = member_program(learner, spec, config, extended)
    vmapped = jax.jit(jax.vmap(program))(keys, stack(states), hparams)
    single = jax.jit(program)
    for m in range(3):
        assert_members_equal(member(vmapped, m), single(keys[m], states[m], member(hparams, m)), f"member {m}: ")
    # The members really differ (otherwise the comparison proves little), and each update changed the state.
    first, last = (jax.tree.map(lambda x, i=i: x[:, i], vmapped["states"]) for i in (0, 1))
    assert float_leaves_differ(member(last, 0), member(last, 1))
    assert float_leaves_differ(first, stack(states)) and float_leaves_differ(last, first)


# --- 2 and 3. traces once across hparam changes; kill-and-resume exact --------------------------------------
def metric_rows(run_dir) -> list[dict[str, str]]:
    with (run_dir / "metrics.csv").open(newline="") as f:
        return [{k: v for k, v in row.items() if k != "wall_s"} for row in csv.DictReader(f)]


def changed_hparams(learner: str, hparams):
    """Every member's every hparam moved to the next in-bounds value (member m: value m + 1), same dtypes."""
    values = candidates(learner, 3)
    pop = len(np.asarray(jax.tree.leaves(hparams)[0]))
    new = {name: jnp.asarray(values[name][1:1 + pop], getattr(hparams, name).dtype) for name in values}
    changed = hparams.replace(**new)
    assert all(a != b for old, now in zip(hparams_table(hparams).values(), hparams_table(changed).values(),
                                          strict=True) for a, b in zip(old, now, strict=True))
    return jax.device_put(changed, jax.tree.map(lambda x: x.sharding, hparams))


def close(loop) -> None:
    """Stops what a built loop started besides its programs (HTS threads, host envs)."""
    if isinstance(loop.driver.interaction, OwnInteraction):
        loop.driver.interaction.close()
    if not loop.runner.jax_path:
        loop.runner.close()


def train_on_with_changed_hparams(learner: str, options: dict[str, Any], compiler: Compiler) -> None:
    """A new loop of the same run on ``compiler`` (the run's compiled programs): an iteration, every hparam
    changed, two more iterations; the changed hparams stay and training goes on with them."""
    loop = build(make_config(**options))
    loop.compiler = compiler
    try:
        state, env_state = loop.initial_state()
        state, env_state, _ = loop.step(state, env_state)
        state, env_state = loop.unpacked(state), loop.unpacked(env_state)  # the JAX path may keep them packed
        changed = changed_hparams(learner, state.hparams)
        expected = hparams_table(changed)
        state = state.replace(hparams=changed)
        before = jax.device_get(state.learner)
        for _ in range(2):
            state, env_state, _ = loop.step(state, env_state)
        state = loop.unpacked(state)
        assert hparams_table(state.hparams) == expected
        assert float_leaves_differ(jax.device_get(state.learner), before)
        assert all(np.isfinite(x).all() for x in jax.tree.leaves(jax.device_get(state.learner))
                   if np.issubdtype(np.asarray(x).dtype, np.inexact))
    finally:
        close(loop)


@pytest.mark.long
@pytest.mark.parametrize(("learner", "driver"), [pair_param(*pair) for pair in ACCEPTED])
def test_traces_once_across_hparam_changes_and_resume_is_exact(learner, driver, compilers, tmp_path):
    options = run_options(learner, driver)
    full = popjax.train(out_dir=tmp_path / "full", **options)
    run_compiler = compilers[-1]
    train_on_with_changed_hparams(learner, options, run_compiler)
    traces = run_compiler.traces
    iteration = "iteration" if "iteration" in traces else "hts_update"
    assert traces[iteration] == 1 and set(traces.values()) == {1}, traces
    if driver == "pbt":  # exploits changed hparams within the run, without a retrace
        assert full.summary["lineage"] and traces["after_eval"] == 1
    if tiny_learner(learner, driver)[0].maintain is not None:  # the learner's periodic hook ran, its own program
        assert traces["maintain"] == 1

    # A kill: the newest checkpoints and the summary are gone, the later metrics rows are not.
    cut = tmp_path / "cut"
    shutil.copytree(full.out_dir, cut)
    (cut / "summary.json").unlink()
    checkpoints = Checkpointer(cut / "checkpoints")
    kept = checkpoints.steps()
    assert len(kept) >= 2, kept
    for step in kept[1:]:
        checkpoints.delete(step)
    checkpoints.close()
    if driver == "pbt":  # an exploit falls after the checkpoint resumed from: the driver's state must carry it
        resumed_at = kept[0] * make_config(**options).steps_per_iter
        assert any(entry["env_steps"] > resumed_at for entry in full.summary["lineage"]), full.summary["lineage"]
    resumed = popjax.resume(cut)
    assert compilers[-1] is not run_compiler and set(compilers[-1].traces.values()) == {1}, compilers[-1].traces
    assert_trees_identical(resumed.state, full.state)
    timing = ("wall_s", "compile_s")
    assert {k: v for k, v in resumed.summary.items() if k not in timing} == \
        {k: v for k, v in full.summary.items() if k not in timing}
    rows = metric_rows(cut)
    assert rows == metric_rows(full.out_dir) and rows
    keys = [(r["env_steps"], r["member"]) for r in rows]
    assert len(keys) == len(set(keys))


@pytest.mark.parametrize(("learner", "driver"), [pytest.param(*pair, id="-".join(pair)) for pair in PAIRS])
def test_every_pair_is_accepted_or_refused_in_one_line(learner, driver, tmp_path):
    """The whole matrix: an accepted pair's run is built (every check of the config, the env and the made learner
    passes; nothing is compiled); a refused one is a one-line ``ConfigError`` naming the field the rules predict,
    raised before anything is written."""
    field = REFUSED.get((learner, driver))
    out = tmp_path / "run"
    if field is None:
        loop = build(make_config(**run_options(learner, driver)))
        close(loop)
        assert loop.config.learner == learner and loop.config.driver == driver
        return
    with pytest.raises(ConfigError) as error:
        popjax.train(out_dir=out, **run_options(learner, driver))
    message = str(error.value)
    assert "\n" not in message and message.startswith(f"{field}:"), message
    assert learner in message or driver in message, message
    assert not out.exists()


def test_the_matrix_is_complete():
    """Every learner runs under independent and pbt, TD3-style learners with a shared critic under cemrl and dvd,
    and hts takes at least one learner of each step kind; ``DEFAULT_PAIRS`` are accepted pairs."""
    for learner in LEARNER_NAMES:
        assert (learner, "independent") in ACCEPTED and (learner, "pbt") in ACCEPTED
        for driver in SHARED_CRITIC_DRIVERS:
            assert ((learner, driver) in ACCEPTED) == (LEARNERS[learner].shared_critic is not None)
    hts_kinds = {LEARNERS[learner].step_kind for learner, driver in ACCEPTED if driver == "hts"}
    assert hts_kinds == {ReplayStep, RolloutStep}
    assert DEFAULT_PAIRS <= set(ACCEPTED)
    assert len(PAIRS) == len(ACCEPTED) + len(REFUSED)


# --- 4. bad hparams refused ----------------------------------------------------------------------------------
def bad_values(number) -> list:
    """Values outside a declared ``Number``: its bounds, just past them, non-finite, a non-integer for integers,
    and a float32 overflow for floats without an upper bound."""
    bad: list = [float("nan"), float("inf"), -float("inf")]
    span = lambda x: 1e-3 * max(1.0, abs(x))  # noqa: E731
    if number.gt is not None:
        bad += [number.gt, number.gt - 1]
    if number.ge is not None:
        bad += [number.ge - 1 if number.integer else number.ge - span(number.ge)]
    if number.lt is not None:
        bad += [number.lt, number.lt + 1]
    if number.le is not None:
        bad += [number.le + 1 if number.integer else number.le + span(number.le)]
    if number.integer:
        bad += [(number.ge if number.ge is not None else 1) + 0.5]
    elif number.lt is None and number.le is None:
        bad += [1e39]  # inf as a float32
    return bad


@pytest.mark.parametrize("learner", LEARNER_NAMES)
def test_bad_hparams_are_refused_in_one_line_and_nothing_is_written(learner, tmp_path):
    definition = LEARNERS[learner]
    bounds = hparam_bounds(definition.hparams_cls)
    # The registry entry keeps its own bounds: defaults and the PBT prior inside them, dtypes as declared.
    defaults = definition.default_hparams(None)
    for name, number in bounds.items():
        leaf = getattr(defaults, name)
        assert leaf.shape == () and leaf.dtype == (jnp.int32 if number.integer else jnp.float32), name
        assert number.inside(np.asarray(leaf).item()), name
    if definition.pbt.search_space is not None:
        validate_space(definition.pbt.search_space, definition.hparams_cls, at=("search_space",))

    options = {**run_options(learner, "independent"), "hparams": {}}
    good = candidates(learner, 1)
    out = tmp_path / "run"
    checked = 0
    for name, number in bounds.items():
        for value in bad_values(number):
            for given, prefix in ((value, f"hparams.{name}:"), ([good[name][0], value], f"hparams.{name}[1]:")):
                with warnings.catch_warnings(record=True) as warned, pytest.raises(ConfigError) as error:
                    warnings.simplefilter("always")
                    popjax.train(out_dir=out, **{**options, "hparams": {name: given}})
                warned = [str(w.message) for w in warned if not issubclass(w.category, DeprecationWarning)]
                assert not warned, warned  # the error is the only line the user sees (no RuntimeWarning before it)
                message = str(error.value)
                assert "\n" not in message and message.startswith(prefix), (name, value, message)
                assert "got " in message or "allowed: " in message, message  # the bad value, what is allowed
                assert not out.exists() and not any(tmp_path.iterdir())
                checked += 1
    assert checked >= 2 * 4 * len(bounds)
