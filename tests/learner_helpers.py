"""Shared helpers for the learner tests (tiny specs, batches, populations, tree asserts)."""

from __future__ import annotations

import dataclasses
import functools
from types import SimpleNamespace

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from popjax import compile_cache
from popjax.learners import LEARNERS
from popjax.learners.base import one_update
from popjax.population.tree import stack
from popjax.types import EnvSpec, Transition

HIDDEN = (16, 16)
BATCH = 4
OBS_DIM = 3
ACTION_DIM = 2  # continuous action dimension, and number of discrete actions

SPECS = {
    "continuous": EnvSpec(
        "test-continuous", (OBS_DIM,), action_dim=ACTION_DIM, action_low=(-1.0,) * 2, action_high=(1.0,) * 2
    ),
    "discrete": EnvSpec("test-discrete", (OBS_DIM,), num_actions=ACTION_DIM),
}


@pytest.fixture(autouse=True)
def fast_compile():
    """Compiles with most XLA optimizations off while a learner test runs.

    The programs are tiny, so XLA compile time dominates (about half the CPU time with the
    optimizations off). The flag is restored afterwards; import this fixture into a test
    module to apply it there.
    """
    previous = jax.config.values["jax_disable_most_optimizations"]
    jax.config.update("jax_disable_most_optimizations", True)
    yield
    jax.config.update("jax_disable_most_optimizations", previous)


# Trainable parameter groups of each learner's state (what a zero learning rate must freeze).
PARAM_FIELDS = {"td3": ("actor", "critic"), "sac": ("actor", "critic", "log_alpha"), "dqn": ("params",)}

# Per-member hparam overrides used by the population tests: members differ in learning
# rates, discount and one learner-specific value (TD3: the traced policy delay).
MEMBER_HPARAMS = {
    "td3": [
        dict(policy_delay=2),
        dict(actor_lr=1e-3, critic_lr=1e-3, discount=0.9, target_noise=0.3, policy_delay=1),
        dict(actor_lr=1e-4, critic_lr=3e-3, discount=0.95, tau=0.05, policy_delay=3),
    ],
    "sac": [
        dict(),
        dict(actor_lr=1e-3, critic_lr=1e-3, alpha_lr=1e-2, discount=0.9, reward_scale=2.0),
        dict(actor_lr=1e-4, critic_lr=3e-3, discount=0.95, tau=0.05, target_entropy_scale=0.5),
    ],
    "dqn": [
        dict(),
        dict(lr=1e-3, discount=0.9, epsilon_decay_steps=5.0),
        dict(lr=1e-4, discount=0.95, epsilon_end=0.2),
    ],
}


# Configs of the shared 3-member populations: DQN with a short target period, so that the
# hard copy happens inside the few tested steps.
POPULATION_CONFIG = {"td3": {}, "sac": {}, "dqn": {"target_update_period": 2}}


def compiled(name: str, **config_overrides) -> SimpleNamespace:
    """A tiny learner with jitted ``update``/``act``/``policy`` and ``pop_update`` (jit of vmap).

    Cached per (learner, config) so that every test file run in the same process shares the
    compilations (compile time dominates these tests). ``pop_update`` appends to ``traces``
    each time it is traced; the no-retrace test checks it.
    """
    definition = LEARNERS[name]
    return _compiled(name, definition.config_cls(hidden=HIDDEN, batch_size=BATCH, **config_overrides))


@functools.cache
def _compiled(name: str, config) -> SimpleNamespace:
    definition = LEARNERS[name]
    spec = SPECS[definition.action_kind]
    learner = definition.make(config, spec)
    traces = []

    def counted_update(key, state, batch, hp):
        traces.append(1)
        return one_update(learner)(key, state, batch, hp)

    return SimpleNamespace(
        name=name,
        definition=definition,
        config=config,
        spec=spec,
        learner=learner,
        update=jax.jit(one_update(learner)),
        act=jax.jit(lambda *args: learner.act(*args)[0]),  # the action (tests of learners that record no extras)
        policy=jax.jit(learner.policy),
        pop_update=jax.jit(jax.vmap(counted_update)),
        traces=traces,
    )


def with_values(hparams, **values):
    """``hparams`` with some fields replaced, each keeping its field's dtype."""
    return hparams.replace(**{k: jnp.asarray(v, getattr(hparams, k).dtype) for k, v in values.items()})


def lr_fields(hparams) -> list[str]:
    return [f.name for f in dataclasses.fields(hparams) if f.name == "lr" or f.name.endswith("_lr")]


def random_batch(key, spec: EnvSpec, batch_size: int = BATCH, terminated=None) -> Transition:
    """A random transition batch; ``terminated`` defaults to alternating 0/1."""
    k_obs, k_act, k_rew, k_next = jax.random.split(key, 4)
    if spec.discrete:
        action = jax.random.randint(k_act, (batch_size,), 0, spec.num_actions, jnp.int32)
    else:
        action = jax.random.uniform(k_act, (batch_size, spec.action_dim), jnp.float32, -1.0, 1.0)
    if terminated is None:
        terminated = jnp.arange(batch_size) % 2
    return Transition(
        obs=jax.random.normal(k_obs, (batch_size,) + spec.obs_shape),
        action=action,
        reward=2.0 * jax.random.normal(k_rew, (batch_size,)),
        next_obs=jax.random.normal(k_next, (batch_size,) + spec.obs_shape),
        terminated=jnp.broadcast_to(jnp.asarray(terminated, jnp.float32), (batch_size,)),
    )


def population(c: SimpleNamespace):
    """Three distinct members for ``c = compiled(...)``: states, batches and hparams
    (``MEMBER_HPARAMS[c.name]``), each stacked on axis 0."""
    return _population(c.name, c.config)


@functools.cache
def _population(name: str, config):
    c = _compiled(name, config)
    n = len(MEMBER_HPARAMS[name])
    base = c.definition.default_hparams(c.config)
    hparams = stack([with_values(base, **MEMBER_HPARAMS[name][i]) for i in range(n)])
    init_keys = jax.random.split(jax.random.key(0), n)
    states = jax.jit(jax.vmap(c.learner.init))(init_keys, hparams)
    batches = stack([random_batch(jax.random.key(100 + i), c.spec) for i in range(n)])
    return states, batches, hparams


def update_keys(step: int, n: int):
    return jax.random.split(jax.random.key(1000 + step), n)


def assert_trees_close(a, b, atol=1e-5, rtol=1e-5):
    assert jax.tree.structure(a) == jax.tree.structure(b)
    for path, x, y in zip(
        [jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_leaves_with_path(a)],
        jax.tree.leaves(a),
        jax.tree.leaves(b),
        strict=True,
    ):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), atol=atol, rtol=rtol, err_msg=path)


def assert_trees_equal(a, b):
    assert jax.tree.structure(a) == jax.tree.structure(b)
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def train_cut_and_resume(tmp_path, options: dict, cut_env_steps: int):
    """``(full, resumed)``: one uninterrupted ``popjax.train`` run and the same run stopped after
    ``cut_env_steps`` then resumed to the full budget (``tmp_path/full``, ``tmp_path/cut``)."""
    import popjax

    full = popjax.train(out_dir=tmp_path / "full", **options)
    popjax.train(out_dir=tmp_path / "cut", **{**options, "total_env_steps": cut_env_steps})
    resumed = popjax.experiment.resume(tmp_path / "cut", total_env_steps=options["total_env_steps"])
    return full, resumed


def trees_differ(a, b) -> bool:
    leaves = zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True)
    return any(not np.array_equal(np.asarray(x), np.asarray(y)) for x, y in leaves)


def np64(x) -> np.ndarray:
    return np.asarray(x, np.float64)


def use_shared_xla_cache() -> str:
    """The suite's own persistent compile cache (conftest.py), shared by its workers and the subprocesses they start
    (speed only; results are identical), switched back on after a test that moved it; returns its folder."""
    return str(compile_cache.enable())
