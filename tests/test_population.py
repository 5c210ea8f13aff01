"""The population step: vmapped K-step training equals per-member training; it compiles once."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from popjax.buffers import make_uniform_buffer
from popjax.config import ConfigError, make_config
from popjax.drivers.base import BuildContext
from popjax.drivers.independent import make_population
from popjax.envs.runner import Experience
from popjax.learners import LEARNERS, td3
from popjax.learners.base import one_update
from popjax.population import tree
from popjax.population.hparams import population_hparams
from popjax.population.members import Members
from popjax.types import EnvSpec, Transition

SPEC = EnvSpec("test", (3,), action_dim=2, action_low=(-1.0, -1.0), action_high=(1.0, 1.0))
CONFIG = td3.TD3Config(hidden=(16, 16), batch_size=8)
POP, K = 3, 4


def filled_population(learner, pop_size=POP):
    """The independent driver of ``learner`` (K steps per learn), its state and a rollout of 32 steps.

    ``learn`` adds the rollout to the members' buffers, then trains (no warm-up)."""
    n = 32
    buffer = make_uniform_buffer(64, CONFIG.batch_size)
    config = make_config(learner="td3", env="probe:pendulum", pop_size=pop_size, rollout_len=n, update_ratio=K / n,
                         warmup_steps=0, batch_size=CONFIG.batch_size, buffer_size=64, progress=False)
    hp = population_hparams(td3.default_hparams(), pop_size,
                            {"actor_lr": [1e-3, 3e-4, 0.0][:pop_size], "policy_delay": [1, 2, 3][:pop_size]})
    ctx = BuildContext(config=config, spec=SPEC, learner_def=LEARNERS["td3"], learner_config=CONFIG, learner=learner,
                       hparams=hp, members=Members(pop_size), setup_key=jax.random.key(9))
    population = make_population(ctx)
    state = population.init(jax.random.key(0))
    k = jax.random.split(jax.random.key(1), 4)
    items = Transition(obs=jax.random.normal(k[0], (pop_size, n, 3)),
                       action=jax.random.uniform(k[1], (pop_size, n, 2), minval=-1, maxval=1),
                       reward=jax.random.normal(k[2], (pop_size, n)),
                       next_obs=jax.random.normal(k[3], (pop_size, n, 3)),
                       terminated=(jnp.arange(pop_size * n).reshape(pop_size, n) % 7 == 0).astype(jnp.float32))
    return population, state, Experience(items, jnp.zeros(pop_size), jnp.zeros(pop_size), items.terminated > 0), buffer


@pytest.mark.long
def test_population_train_equals_each_member_trained_alone():
    learner = td3.make_td3(CONFIG, SPEC)
    population, state, rollout, buffer = filled_population(learner)
    key = jax.random.key(7)
    new_state, metrics = jax.jit(population.learn)(key, state, rollout)
    assert metrics["critic_loss"].shape == (POP,)
    assert int(new_state.counters.env_steps) == 32 and int(new_state.counters.updates) == K
    state = state.replace(buffer=jax.vmap(buffer.add)(state.buffer, rollout.transitions))  # what learn trains on

    # Reference: replay the same key schedule member by member, one update per call.
    step_keys = jax.random.split(key, K)
    for m in range(POP):
        ls, hp, buf = tree.member(state.learner, m), tree.member(state.hparams, m), tree.member(state.buffer, m)
        update = jax.jit(one_update(learner))
        for sk in step_keys:
            key_sample, key_update = jax.random.split(sk)
            batch = buffer.sample(jax.random.split(key_sample, POP)[m], buf)
            ls, _ = update(jax.random.split(key_update, POP)[m], ls, batch, hp)
        got = tree.member(new_state.learner, m)
        for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(ls), strict=True):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    # member 2 has actor_lr 0: its actor never moves although its critic does
    for a, b in zip(jax.tree.leaves(new_state.learner.actor), jax.tree.leaves(state.learner.actor), strict=True):
        np.testing.assert_array_equal(a[2], b[2])
        assert not np.allclose(a[0], b[0])
    assert not np.allclose(jax.tree.leaves(new_state.learner.critic)[0][2], jax.tree.leaves(state.learner.critic)[0][2])


def test_population_step_traces_once_across_hparam_changes():
    traces = []
    base = td3.make_td3(CONFIG, SPEC)

    def counting_update(*args):
        traces.append(1)
        return base.step.update(*args)

    learner = base._replace(step=base.step._replace(update=counting_update))
    population, state, rollout, _ = filled_population(learner)
    train = jax.jit(population.learn)
    state, _ = train(jax.random.key(0), state, rollout)
    n_after_first = len(traces)
    # A PBT-style change of every hparam value (same dtypes) must not recompile.
    hp = state.hparams.replace(actor_lr=state.hparams.actor_lr * 2, discount=jnp.full((POP,), 0.9, jnp.float32),
                               policy_delay=jnp.array([3, 1, 2], jnp.int32))
    state, _ = train(jax.random.key(1), state.replace(hparams=hp), rollout)
    state, _ = train(jax.random.key(2), state, rollout)
    assert n_after_first >= 1
    assert len(traces) == n_after_first
    assert train._cache_size() == 1


@pytest.mark.long
def test_fixed_policy_delay_chunks_equal_the_traced_gate():
    """TD3 with ``fixed_policy_delay`` (d - 1 critic-only steps, then one full step) = the traced gate."""
    import dataclasses

    def learn(config):
        learner = td3.make_td3(config, SPEC)
        run = make_config(learner="td3", env="probe:pendulum", pop_size=POP, rollout_len=32, update_ratio=K / 32,
                          warmup_steps=0, batch_size=CONFIG.batch_size, buffer_size=64, progress=False)
        hp = population_hparams(td3.default_hparams(), POP, {"actor_lr": [1e-3, 3e-4, 0.0], "policy_delay": 2})
        ctx = BuildContext(config=run, spec=SPEC, learner_def=LEARNERS["td3"], learner_config=config, learner=learner,
                           hparams=hp, members=Members(POP), setup_key=jax.random.key(9))
        population = make_population(ctx)
        _, _, rollout, _ = filled_population(td3.make_td3(CONFIG, SPEC))
        state = population.init(jax.random.key(0))
        for i in range(2):  # two calls: the step counter stays aligned to the chunks
            state, metrics = jax.jit(population.learn)(jax.random.key(7 + i), state, rollout)
        return learner, state, metrics

    traced, traced_state, traced_metrics = learn(CONFIG)
    fixed, fixed_state, fixed_metrics = learn(dataclasses.replace(CONFIG, fixed_policy_delay=2))
    assert (traced.step.chunk, fixed.step.chunk) == (1, 2)
    for a, b in zip(jax.tree.leaves(fixed_state.learner), jax.tree.leaves(traced_state.learner), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)
    for name in ("critic_loss", "q_mean"):  # the chunk's actor_loss is the policy step's only
        np.testing.assert_allclose(fixed_metrics[name], traced_metrics[name], rtol=1e-5)
    assert int(fixed_state.learner.steps[0]) == 2 * K


def test_the_delay_is_fixed_only_when_no_member_or_driver_changes_it():
    from popjax.drivers import DRIVERS

    def fixed(delays, k=50, searched=frozenset()):
        hp = population_hparams(td3.default_hparams(), len(delays), {"policy_delay": delays})
        return td3.specialize(CONFIG, hp, k, searched).fixed_policy_delay

    assert fixed([2, 2]) == 2 and fixed([3, 3], k=51) == 3
    assert fixed([1, 2]) is None  # members differ
    assert fixed([2, 2], k=25) is None  # K is not a multiple of the delay
    assert fixed([1, 1]) is None  # delay 1: the traced update already wastes nothing
    assert fixed([2, 2], searched=frozenset({"policy_delay"})) is None
    run = dict(learner="td3", env="probe:pendulum", pop_size=4, driver="pbt")
    assert "policy_delay" in DRIVERS["pbt"].parse_options(make_config(**run)).searched_hparams()  # TD3's prior
    narrow = make_config(**run, pbt={"search_space": {"actor_lr": {"low": 1e-4, "high": 1e-3, "log": True}}})
    assert DRIVERS["pbt"].parse_options(narrow).searched_hparams() == {"actor_lr"}
    with pytest.raises(ConfigError, match="fixed_policy_delay: 2 needs every member"):
        td3.specialize(td3.TD3Config(fixed_policy_delay=2), population_hparams(td3.default_hparams(), 2,
                                                                                {"policy_delay": [1, 2]}), 50,
                       frozenset())
