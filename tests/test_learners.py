"""Invariants every learner must pass (T1, T2, T5, T6)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from learner_helpers import (
    MEMBER_HPARAMS,
    PARAM_FIELDS,
    POPULATION_CONFIG,
    assert_trees_close,
    assert_trees_equal,
    compiled,
    fast_compile,  # noqa: F401  (autouse fixture)
    lr_fields,
    population,
    random_batch,
    trees_differ,
    update_keys,
    with_values,
)

from popjax.learners import LEARNERS
from popjax.learners.base import adam_init, adam_step, one_update
from popjax.population.tree import member, stack

NAMES = ["td3", "sac", "dqn"]
STEPS = 3


def setup(name):
    c = compiled(name, **POPULATION_CONFIG[name])
    return (c, *population(c))


def test_registry():
    assert set(NAMES) <= set(LEARNERS)
    assert LEARNERS["dqn"].action_kind == "discrete"
    assert LEARNERS["td3"].action_kind == LEARNERS["sac"].action_kind == "continuous"


@pytest.mark.long
@pytest.mark.parametrize("name", NAMES)
def test_vmapped_update_equals_per_member_update(name):
    c, states, batches, hparams = setup(name)
    n = len(MEMBER_HPARAMS[name])
    pop_states, per_member = states, [member(states, i) for i in range(n)]
    for step in range(STEPS):
        keys = update_keys(step, n)
        pop_states, pop_metrics = c.pop_update(keys, pop_states, batches, hparams)
        outs = [c.update(keys[i], per_member[i], member(batches, i), member(hparams, i)) for i in range(n)]
        per_member = [s for s, _ in outs]
        assert_trees_close(pop_metrics, stack([m for _, m in outs]))
    assert_trees_close(pop_states, stack(per_member))
    # The members really are different (otherwise the comparison proves little).
    for field in PARAM_FIELDS[name]:
        assert trees_differ(member(getattr(pop_states, field), 0), member(getattr(pop_states, field), 1))


@pytest.mark.parametrize("name", NAMES)
def test_zero_learning_rate_member_keeps_its_params(name):
    c, states, batches, hparams = setup(name)
    frozen = 1
    zero = {f: jnp.where(jnp.arange(3) == frozen, 0.0, getattr(hparams, f)) for f in lr_fields(hparams)}
    hparams = hparams.replace(**zero)
    new = states
    for step in range(STEPS):  # 3 steps: every TD3 member (delays 2, 1, 3) makes a policy step
        new, _ = c.pop_update(update_keys(step, 3), new, batches, hparams)
    for field in PARAM_FIELDS[name]:
        assert_trees_equal(member(getattr(new, field), frozen), member(getattr(states, field), frozen))
        for i in (0, 2):
            assert trees_differ(member(getattr(new, field), i), member(getattr(states, field), i)), (field, i)


@pytest.mark.parametrize("name", NAMES)
def test_keys(name):
    c, states, batches, hparams = setup(name)
    state, batch, hp = member(states, 0), member(batches, 0), member(hparams, 0)
    key_a, key_b = jax.random.key(7), jax.random.key(8)
    out_a = c.update(key_a, state, batch, hp)
    assert_trees_equal(out_a, c.update(key_a, state, batch, hp))
    out_b = c.update(key_b, state, batch, hp)
    if name == "dqn":
        assert_trees_equal(out_a, out_b)  # deterministic update; randomness only in act
    else:  # TD3 target smoothing noise / SAC action samples depend on the key
        assert trees_differ(out_a[0].critic, out_b[0].critic)
        assert not np.isclose(out_a[1]["critic_loss"], out_b[1]["critic_loss"])
    obs = jax.random.normal(jax.random.key(3), (64,) + c.spec.obs_shape)
    np.testing.assert_array_equal(c.act(key_a, state, obs, hp), c.act(key_a, state, obs, hp))
    assert trees_differ(c.act(key_a, state, obs, hp), c.act(key_b, state, obs, hp))


def _avals(tree):
    return [(x.shape, x.dtype, x.weak_type) for x in jax.tree.leaves(tree)]


@pytest.mark.parametrize("name", NAMES)
def test_init_and_update_types_identical(name):
    c = compiled(name)
    hp = c.definition.default_hparams(c.config)
    for leaf in jax.tree.leaves(hp):
        assert leaf.shape == () and leaf.dtype in (jnp.float32, jnp.int32) and not leaf.weak_type
    init_out = jax.eval_shape(c.learner.init, jax.random.key(0), hp)
    batch = random_batch(jax.random.key(1), c.spec)
    update_out, metrics = jax.eval_shape(one_update(c.learner), jax.random.key(2), init_out, batch, hp)
    assert jax.tree.structure(init_out) == jax.tree.structure(update_out)
    assert _avals(init_out) == _avals(update_out)
    assert all(m.shape == () and m.dtype == jnp.float32 for m in metrics.values())


@pytest.mark.parametrize("name", NAMES)
def test_act_and_policy_outputs(name):
    c, states, _, hparams = setup(name)
    spec = c.spec
    state, hp = member(states, 0), member(hparams, 0)
    for obs_batch in [(), (64,)]:
        obs = jax.random.normal(jax.random.key(4), obs_batch + spec.obs_shape)
        for action in (c.act(jax.random.key(5), state, obs, hp), c.policy(state, obs)):
            assert action.shape == obs_batch + spec.action_shape
            assert action.dtype == spec.action_dtype
            if spec.discrete:
                assert np.all((action >= 0) & (action < spec.num_actions))
            else:
                assert np.all(np.abs(action) <= 1.0)


@pytest.mark.parametrize("name", NAMES)
def test_population_update_traces_once_across_hparam_changes(name):
    c, states, batches, hparams = setup(name)
    new, _ = c.pop_update(update_keys(0, 3), states, batches, hparams)
    # A PBT-style change of values (same dtypes), fed back with the updated states.
    swapped = jax.tree.map(lambda x: x[::-1] * (2 if x.dtype == jnp.int32 else 0.5), hparams)
    swapped = swapped.replace(discount=hparams.discount)
    assert trees_differ(swapped, hparams)
    new, _ = c.pop_update(update_keys(1, 3), new, batches, swapped)
    new, _ = c.pop_update(update_keys(2, 3), new, batches, hparams)
    jax.block_until_ready(new)
    assert len(c.traces) == 1


def test_adam_step_with_traced_lr_equals_optax_adam():
    lr = 0.01
    target = jnp.array([1.0, -2.0, 3.0])
    params0 = {"w": jnp.array([0.5, 0.5, -0.5]), "b": jnp.array(0.3)}

    grads = jax.grad(lambda q: jnp.sum((q["w"] - target) ** 2) + q["b"] ** 4)
    optimizer = optax.adam(lr)

    @jax.jit
    def both_steps(ref, ref_opt, mine, mine_opt):
        updates, ref_opt = optimizer.update(grads(ref), ref_opt, ref)
        mine, mine_opt = adam_step(mine, grads(mine), mine_opt, jnp.float32(lr))
        return optax.apply_updates(ref, updates), ref_opt, mine, mine_opt

    ref, ref_opt = params0, optimizer.init(params0)
    mine, mine_opt = params0, adam_init(params0)
    for _ in range(10):
        ref, ref_opt, mine, mine_opt = both_steps(ref, ref_opt, mine, mine_opt)
    assert_trees_close(mine, ref, atol=1e-6, rtol=1e-6)
    # Ten Adam steps move each coordinate by about lr per step towards the optimum.
    np.testing.assert_allclose(mine["w"] - params0["w"], 10 * lr * np.sign(target - params0["w"]), rtol=0.05)
    # lr = 0 keeps the parameters exactly.
    frozen, _ = adam_step(params0, grads(params0), adam_init(params0), jnp.float32(0.0))
    assert_trees_equal(frozen, params0)


def test_member_hparams_really_differ():
    # Guards the population fixtures: each learner's members differ in hparam values.
    for name in NAMES:
        base = LEARNERS[name].default_hparams(None)
        hps = [with_values(base, **o) for o in MEMBER_HPARAMS[name]]
        assert trees_differ(hps[0], hps[1]) and trees_differ(hps[1], hps[2])


# --- PBTSupport.policy_state / optimizer_state against init's state (issue 37) ---------------------------------
def _env(name):
    return "probe:pendulum" if LEARNERS[name].action_kind == "continuous" else "probe:cartpole"


@pytest.mark.parametrize("name", sorted(LEARNERS))
def test_declared_policy_and_optimizer_fields_resolve_in_init_state(name):
    """Every learner's dotted ``policy_state`` paths and ``optimizer_state`` pairs name fields of its ``init``
    state, each optimizer state shaped after its params (what PBT's ``copy: policy``/``reset_optimizer`` touch)."""
    from popjax.config import make_config, make_learner_config
    from popjax.envs import registry
    from popjax.learners.base import declared_state_problem
    from popjax.population.tree import get_path

    definition = LEARNERS[name]
    config = make_learner_config(make_config(learner=name, env=_env(name)))
    learner = definition.make(config, registry.env_spec(_env(name)))
    state = jax.eval_shape(learner.init, jax.random.key(0), definition.default_hparams(config))
    assert declared_state_problem(definition, state) is None
    support = definition.pbt
    for path in (*support.policy_state, *support.optimizer_state, *support.optimizer_state.values()):
        assert jax.tree.leaves(get_path(state, path)), path


@pytest.mark.parametrize("change, message", [
    ({"policy_state": ("actor", "target_actr")},
     "learner td3: PBTSupport.policy_state 'target_actr': init's state has no field 'target_actr'"),
    ({"optimizer_state": {"actor_opt": "critic", "critic_opt": "actor"}},
     "learner td3: PBTSupport.optimizer_state 'actor_opt': holds no state shaped like the params 'critic' it is "
     "said to update"),
])
def test_a_wrong_declared_field_is_refused_when_the_run_is_built(monkeypatch, change, message):
    """A typo (or a swapped pair) is refused before anything compiles, not at the first ``copy: policy`` exploit."""
    import dataclasses

    from popjax.config import make_config
    from popjax.experiment import build

    td3 = LEARNERS["td3"]
    monkeypatch.setitem(LEARNERS, "td3", dataclasses.replace(td3, pbt=dataclasses.replace(td3.pbt, **change)))
    with pytest.raises(TypeError) as err:
        build(make_config(learner="td3", env="probe:pendulum", pop_size=2))
    assert str(err.value) == message
