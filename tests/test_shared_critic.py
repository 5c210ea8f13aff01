"""The vectorized shared-critic TD3 step (CEM-RL / DvD): test T7."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from popjax.learners import td3
from popjax.learners.base import adam_step, one_update
from popjax.learners.shared_critic import from_member_states, make_shared_critic_td3
from popjax.networks.mlp import DeterministicActor, TwinCritic
from popjax.population import tree
from popjax.population.hparams import population_hparams
from popjax.types import EnvSpec, Transition
from popjax_bench.cemrl_order import make_sequential_order

SPEC = EnvSpec("test", (3,), action_dim=2, action_low=(-1.0, -1.0), action_high=(1.0, 1.0))
CONFIG = td3.TD3Config(hidden=(16, 16), batch_size=8)
ACTOR = DeterministicActor(CONFIG.hidden, SPEC.action_dim)
CRITIC = TwinCritic(CONFIG.hidden)
POP, K = 3, 4

# Module-level learners and jitted functions: every test reuses the same compilations, and
# XLA's backend optimisations are off (halves compile time; these programs are tiny).
JIT = functools.partial(jax.jit, compiler_options={"xla_backend_optimization_level": 0})
SINGLE = td3.make_td3(CONFIG, SPEC)
SHARED1 = make_shared_critic_td3(CONFIG, SPEC, 1)
SHARED = make_shared_critic_td3(CONFIG, SPEC, POP)
SEQUENTIAL1 = make_sequential_order(SHARED1, CONFIG.hidden, SPEC.action_dim)  # the CEM-RL order (reference)
SEQUENTIAL = make_sequential_order(SHARED, CONFIG.hidden, SPEC.action_dim)
TRACES = []


def _counted_train(keys, state, b, hp):
    TRACES.append(1)
    return SHARED.train(keys, state, b, hp)


TRAIN = JIT(_counted_train)
UPDATE = JIT(SHARED.update)


def batches(seed, shape):
    """Random transitions with leading axes ``shape`` (numpy RNG: nothing to compile)."""
    rng = np.random.default_rng(seed)
    f32 = lambda x: jnp.asarray(x, jnp.float32)
    return Transition(obs=f32(rng.normal(size=shape + (3,))), action=f32(rng.uniform(-1, 1, shape + (2,))),
                      reward=f32(rng.normal(size=shape)), next_obs=f32(rng.normal(size=shape + (3,))),
                      terminated=f32(rng.uniform(size=shape) < 0.2))


def step_keys(seed, shape):
    return jax.random.split(jax.random.key(seed), int(np.prod(shape))).reshape(shape)


def assert_trees_close(a, b, rtol=1e-5, atol=1e-6):
    leaves_a, leaves_b = jax.tree.leaves(a), jax.tree.leaves(b)
    assert len(leaves_a) == len(leaves_b)
    for x, y in zip(leaves_a, leaves_b, strict=True):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=rtol, atol=atol)


SINGLE_UPDATE, SHARED1_UPDATE = JIT(one_update(SINGLE)), JIT(SHARED1.update)


def numpy_td3_state(seed):
    """A single-agent TD3State with random numpy weights (scaled 1/sqrt(fan_in)), zero biases and
    Adam moments: no init program to compile."""
    rng = np.random.default_rng(seed)
    shapes = jax.eval_shape(SINGLE.init, jax.random.key(0), td3.default_hparams())
    weights = lambda tree: jax.tree.map(lambda s: (rng.normal(size=s.shape) / np.sqrt(s.shape[0])).astype(s.dtype)
                                        if len(s.shape) == 2 else np.zeros(s.shape, s.dtype), tree)
    zeros = lambda tree: jax.tree.map(lambda s: np.zeros(s.shape, s.dtype), tree)
    actor, critic = weights(shapes.actor), weights(shapes.critic)
    return shapes.replace(actor=actor, critic=critic, target_actor=actor, target_critic=critic,
                          actor_opt=zeros(shapes.actor_opt), critic_opt=zeros(shapes.critic_opt),
                          steps=np.zeros((), np.int32))


def initial_state(hp, seed=0):
    """Members' actors and member 0's critic from single-agent TD3 states."""
    n = hp.actor_lr.shape[0]
    return from_member_states(tree.stack([numpy_td3_state(seed * 100 + i) for i in range(n)]))


def trained_state(hp):
    """A 3-member state whose critic, targets and Adam moments are off their initial values."""
    return TRAIN(step_keys(1, (K, POP)), initial_state(hp), batches(2, (K, POP, CONFIG.batch_size)), hp)[0]


@pytest.mark.long
@pytest.mark.parametrize("delay", [1, 2])
def test_one_member_equals_single_agent_td3(delay):
    hp = population_hparams(td3.default_hparams(), 1, {"policy_delay": delay, "discount": 0.9, "tau": 0.05})
    ref = jax.tree.map(jnp.asarray, numpy_td3_state(3))
    state = from_member_states(tree.stack([ref]))
    update_single, update_shared = SINGLE_UPDATE, SHARED1_UPDATE
    for t in range(4):
        key = jax.random.key(10 + t)
        b = batches(20 + t, (1, CONFIG.batch_size))
        ref, ref_metrics = update_single(key, ref, tree.member(b, 0), tree.member(hp, 0))
        state, metrics = update_shared(key[None], state, b, hp)
        np.testing.assert_allclose(metrics["critic_loss"][0], ref_metrics["critic_loss"], rtol=1e-6)
        np.testing.assert_allclose(metrics["actor_loss"][0], ref_metrics["actor_loss"], rtol=1e-6)
    assert int(state.steps) == int(ref.steps) == 4
    assert_trees_close(tree.member(state.actor, 0), ref.actor)
    assert_trees_close(tree.member(state.target_actor, 0), ref.target_actor)
    assert_trees_close(tree.member(state.actor_opt, 0), ref.actor_opt)
    assert_trees_close(state.critic, ref.critic)
    assert_trees_close(state.target_critic, ref.target_critic)
    assert_trees_close(state.critic_opt, ref.critic_opt)
    # the critic moved every step, the actor on policy steps only (4 steps / delay)
    assert int(state.critic_opt.count) == 4
    assert int(tree.member(state.actor_opt, 0).count) == 4 // delay


def hand_member_loss(critic, target_actor, target_critic, batch, hp, key):
    """TD3's critic loss for one member, written out (y with the member's own noise draw)."""
    noise = hp.target_noise * jax.random.normal(key, batch.action.shape)
    noise = jnp.clip(noise, -hp.noise_clip, hp.noise_clip)
    next_action = jnp.clip(ACTOR.apply(target_actor, batch.next_obs) + noise, -1.0, 1.0)
    next_q = jnp.min(CRITIC.apply(target_critic, batch.next_obs, next_action), axis=0)
    y = jax.lax.stop_gradient(batch.reward + hp.discount * (1.0 - batch.terminated) * next_q)
    q = CRITIC.apply(critic, batch.obs, batch.action)
    return jnp.sum(jnp.mean((q - y) ** 2, axis=-1))


@pytest.mark.long
def test_population_critic_loss_and_gradient_are_member_means():
    hp = population_hparams(td3.default_hparams(), POP, {"discount": [0.99, 0.9, 0.5],
                                                          "target_noise": [0.2, 0.0, 0.5]})
    state = trained_state(hp)
    b = batches(5, (POP, CONFIG.batch_size))
    keys = step_keys(6, (POP,))
    loss, grads, member_losses = JIT(SHARED.critic_grads)(keys, state, b, hp)

    hand = JIT(jax.value_and_grad(hand_member_loss))
    by_hand = [hand(state.critic, tree.member(state.target_actor, i), state.target_critic, tree.member(b, i),
                    tree.member(hp, i), keys[i]) for i in range(POP)]
    losses = np.array([float(v) for v, _ in by_hand])
    np.testing.assert_allclose(member_losses, losses, rtol=1e-5)
    np.testing.assert_allclose(loss, losses.mean(), rtol=1e-5)
    assert np.ptp(losses) > 1e-3  # members really differ, so a sum or a single member would fail
    mean_grads = jax.tree.map(lambda *g: sum(g) / POP, *[g for _, g in by_hand])
    assert_trees_close(grads, mean_grads, rtol=1e-4, atol=1e-6)

    # The update applies exactly that gradient once (Adam, lr = the population's critic lr).
    new_state, metrics = UPDATE(keys, state, b, hp)
    np.testing.assert_allclose(metrics["critic_loss"], np.full(POP, losses.mean()), rtol=1e-5)
    np.testing.assert_allclose(metrics["member_critic_loss"], losses, rtol=1e-5)
    expected, _ = adam_step(state.critic, mean_grads, state.critic_opt, hp.critic_lr[0])
    assert_trees_close(new_state.critic, expected, rtol=1e-4, atol=1e-6)


def test_actor_step_is_each_members_dpg_through_the_updated_critic():
    hp = population_hparams(td3.default_hparams(), POP, {"policy_delay": 1, "actor_lr": [1e-3, 3e-4, 0.0]})
    state = trained_state(hp)
    b = batches(8, (POP, CONFIG.batch_size))
    new_state, _ = UPDATE(step_keys(9, (POP,)), state, b, hp)

    @jax.jit
    def expected_actor(actor, opt, obs, lr):
        dpg = lambda actor: -CRITIC.apply(new_state.critic, obs, ACTOR.apply(actor, obs))[0].mean()
        return adam_step(actor, jax.grad(dpg)(actor), opt, lr)[0]

    for i in range(POP):
        expected = expected_actor(tree.member(state.actor, i), tree.member(state.actor_opt, i), b.obs[i],
                                  hp.actor_lr[i])
        assert_trees_close(tree.member(new_state.actor, i), expected, rtol=1e-4, atol=1e-6)
    # member 2 has actor_lr 0: its actor is unchanged while the others moved
    assert_trees_close(tree.member(new_state.actor, 2), tree.member(state.actor, 2), rtol=0, atol=0)
    assert not np.allclose(jax.tree.leaves(new_state.actor)[0][0], jax.tree.leaves(state.actor)[0][0])


@pytest.mark.long
def test_sequential_reference_counts_and_one_step_equivalence():
    # K = 1, one member: the CEM-RL order and the vectorized step coincide.
    hp1 = population_hparams(td3.default_hparams(), 1, {"policy_delay": 1})
    state1 = initial_state(hp1, seed=4)
    b1, keys1 = batches(11, (1, 1, CONFIG.batch_size)), step_keys(12, (1, 1))
    seq, _ = JIT(SEQUENTIAL1.update)(keys1, state1, b1, hp1)
    vec, _ = SHARED1_UPDATE(keys1[0], state1, tree.member(b1, 0), hp1)
    assert_trees_close(seq, vec)

    # K = 4 steps, 3 members (critic shares 2/1/1): both orders make exactly K critic updates
    # and K updates per actor; the vectorized one compiles once for new hparam values.
    hp = population_hparams(td3.default_hparams(), POP, {"policy_delay": 1})
    state = trained_state(hp)
    b, keys = batches(13, (K, POP, CONFIG.batch_size)), step_keys(14, (K, POP))
    seq, seq_metrics = JIT(SEQUENTIAL.update)(keys, state, b, hp)
    vec, _ = TRAIN(keys, state, b, hp)
    for s in (seq, vec):
        assert int(s.steps) == 2 * K
        assert int(s.critic_opt.count) == 2 * K
        np.testing.assert_array_equal(s.actor_opt.count, [2 * K] * POP)
        assert all(np.isfinite(x).all() for x in jax.tree.leaves(s))
    assert np.isfinite(seq_metrics["member_critic_loss"]).all()
    # the orders differ (the paper's second-order change)
    assert not np.allclose(jax.tree.leaves(seq.critic)[0], jax.tree.leaves(vec.critic)[0])
    new_values = {"actor_lr": [1e-2, 1e-5, 0.0], "policy_delay": [1, 3, 2]}
    hp2 = population_hparams(td3.default_hparams(), POP, new_values)
    TRAIN(keys, state, b, hp2)
    assert len(TRACES) == 1


@pytest.mark.slow
def test_interleaved_sequential_order_has_the_same_update_counts():
    hp = population_hparams(td3.default_hparams(), POP, {"policy_delay": 1})
    state = initial_state(hp)
    b, keys = batches(15, (K, POP, CONFIG.batch_size)), step_keys(16, (K, POP))
    inter, metrics = JIT(functools.partial(SEQUENTIAL.update, interleave=True))(keys, state, b, hp)
    block, _ = JIT(SEQUENTIAL.update)(keys, state, b, hp)
    assert int(inter.critic_opt.count) == K
    np.testing.assert_array_equal(inter.actor_opt.count, [K] * POP)
    assert np.isfinite(metrics["member_critic_loss"]).all()
    assert not np.allclose(jax.tree.leaves(inter.critic)[0], jax.tree.leaves(block.critic)[0])


SHARDED_SCRIPT = """
import json, jax, jax.numpy as jnp, numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P
from popjax.learners import td3
from popjax.learners.shared_critic import DiversityConfig, make_shared_critic_td3
from popjax.population.hparams import population_hparams
from popjax.types import EnvSpec, Transition
assert len(jax.devices()) == 2
spec = EnvSpec("t", (3,), action_dim=2, action_low=(-1.0, -1.0), action_high=(1.0, 1.0))
pop = 4
shared = make_shared_critic_td3(td3.TD3Config(hidden=(16, 16), batch_size=8), spec, pop, DiversityConfig())
hp = population_hparams(td3.default_hparams(), pop, {"discount": [0.99, 0.9, 0.95, 0.8]})
state = jax.jit(shared.init)(jax.random.key(0), hp)
rng = np.random.default_rng(0)
f = lambda *s: jnp.asarray(rng.normal(size=s), jnp.float32)
b = Transition(f(3, pop, 8, 3), jnp.tanh(f(3, pop, 8, 2)), f(3, pop, 8), f(3, pop, 8, 3), jnp.zeros((3, pop, 8)))
keys = jax.random.split(jax.random.key(1), 3 * pop).reshape(3, pop)
train = jax.jit(shared.train)
one, m1 = train(keys, state, b, hp, 0.3)
mesh = jax.sharding.Mesh(jax.devices(), ("pop",))
members = NamedSharding(mesh, P("pop"))
rep = NamedSharding(mesh, P())
put = lambda tree, s: jax.tree.map(lambda x: jax.device_put(x, s), tree)
sharded = state.replace(actor=put(state.actor, members), target_actor=put(state.target_actor, members),
                        actor_opt=put(state.actor_opt, members), critic=put(state.critic, rep),
                        target_critic=put(state.target_critic, rep), critic_opt=put(state.critic_opt, rep))
b2 = put(b, NamedSharding(mesh, P(None, "pop")))
two, m2 = train(put(keys, NamedSharding(mesh, P(None, "pop"))), sharded, b2, put(hp, members), 0.3)
leaf = jax.tree.leaves(two.actor)[0]
pairs = zip(jax.tree.leaves(one), jax.tree.leaves(two))
diff = max(float(np.max(np.abs(np.asarray(x) - np.asarray(y)))) for x, y in pairs)
print(json.dumps({"devices": len(leaf.sharding.device_set), "max_diff": diff,
                  "loss_diff": float(np.max(np.abs(np.asarray(m1["critic_loss"]) - np.asarray(m2["critic_loss"]))))}))
"""


@pytest.mark.slow
def test_shared_critic_step_runs_sharded_over_two_devices():
    import json
    import os
    import subprocess
    import sys

    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=2", "JAX_PLATFORMS": "cpu"}
    proc = subprocess.run([sys.executable, "-c", SHARDED_SCRIPT], capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["devices"] == 2  # the actors really are split over the two devices
    assert result["max_diff"] < 1e-5 and result["loss_diff"] < 1e-5
