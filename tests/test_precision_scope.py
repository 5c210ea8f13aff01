"""``matmul_precision: bf16`` rounds the learners' network passes and nothing else (issue 49).

Env physics (brax multiplies with ``jnp.dot``), CEM-RL's distribution update and DvD's kernel and Cholesky are full
float32 under ``bf16``, bit for bit what ``highest`` computes; the networks of every learner, including one defined
here that popjax has never seen, and of the shared critic take bfloat16-rounded operands.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from rundir_helpers import TINY

import popjax
from popjax import precision
from popjax.drivers import cem
from popjax.envs import registry
from popjax.learners.base import Learner, LearnerDef, RolloutStep
from popjax.learners.shared_critic import diversity_loss, make_shared_critic_td3
from popjax.learners.td3 import TD3Config
from popjax.loop import Compiler
from popjax.population.tree import member
from popjax.registry import LEARNERS

# 1 + 2**-10 is a float32 number that bfloat16 (8 significant bits) rounds to 1: a row of 8 of them times ones
# sums to 8.0078125 in float32 and to exactly 8.0 from bfloat16 operands.
ODD = 1 + 2**-10
X = jnp.full((4, 8), ODD, jnp.float32)
W = jnp.ones((8, 3), jnp.float32)


def compiled(name, fn, *args):
    """``fn(*args)`` compiled as the loop compiles a run's programs under ``matmul_precision`` ``name``."""
    return Compiler(matmul_precision=name)("program", fn, *args)(*args)


def test_inside_a_bf16_program_only_network_passes_round_forward_and_backward():
    net = precision.network(lambda w, x: x @ w)

    def program(w, x):
        grad = jax.grad(lambda v: jnp.sum(net(v, x)))(w)  # differentiated outside the pass: rounded too
        return net(w, x), grad, x @ w

    rounded, grad, plain = compiled("bf16", program, W, X)
    np.testing.assert_array_equal(rounded, np.full((4, 3), 8.0))
    np.testing.assert_array_equal(grad, np.full((8, 3), 4.0))  # 4 rows of x = 1 + 2**-10 -> 1 each
    np.testing.assert_array_equal(plain, np.full((4, 3), 8 * ODD, np.float32))
    for name in ("default", "highest"):
        rounded, grad, plain = compiled(name, program, W, X)
        np.testing.assert_array_equal(rounded, np.full((4, 3), 8 * ODD, np.float32))
        np.testing.assert_array_equal(grad, np.full((8, 3), 4 * ODD, np.float32))


def test_a_network_pass_differentiated_by_its_caller_equals_the_whole_program_rewrite():
    # what bf16 computed before it was scoped (every product of the traced program rewritten), for a program that
    # is one network pass and its gradient
    def loss(w, x):
        return jnp.sum(jnp.tanh(x @ w) @ w.T)

    key_w, key_x = jax.random.split(jax.random.key(0))
    w, x = jax.random.normal(key_w, (8, 8)), jax.random.normal(key_x, (5, 8))
    whole = jax.jit(precision.bf16_products(jax.value_and_grad(loss)))(w, x)
    scoped = compiled("bf16", jax.value_and_grad(precision.network(loss)), w, x)
    jax.tree.map(np.testing.assert_array_equal, whole, scoped)
    float32 = compiled("highest", jax.value_and_grad(loss), w, x)
    assert not np.array_equal(whole[1], float32[1])


def _physics(state, action):
    """A probe env step that multiplies matrices as brax's physics does (``jnp.dot``)."""
    inertia = jnp.full((8, 8), ODD, jnp.float32)
    state = state + 0.01 * jnp.dot(inertia, state) + jnp.dot(jnp.full((8, 1), ODD, jnp.float32), action)
    return state, jnp.sum(state)


def test_env_physics_is_bit_for_bit_the_same_under_bf16_as_under_highest():
    state, action = jnp.full(8, ODD, jnp.float32), jnp.full(1, ODD, jnp.float32)
    bf16 = compiled("bf16", _physics, state, action)
    jax.tree.map(np.testing.assert_array_equal, bf16, compiled("highest", _physics, state, action))
    rounded = compiled("bf16", precision.network(_physics), state, action)  # what the old rewrite computed
    assert not np.array_equal(bf16[0], rounded[0])


@pytest.mark.long
def test_a_brax_step_is_bit_for_bit_the_same_under_bf16_as_under_highest():
    env = registry.make_jax_env("brax:inverted_pendulum")
    env_state, _ = jax.jit(env.reset)(jax.random.key(0))
    action = jnp.full(env.spec.action_shape, 0.3, jnp.float32)
    step = lambda s, a: env.step(s, a)  # noqa: E731
    results = {name: compiled(name, step, env_state, action) for name in ("bf16", "highest")}
    jax.tree.map(np.testing.assert_array_equal, results["bf16"], results["highest"])


def test_cem_updates_its_distribution_in_float32_under_bf16():
    config = cem.CEMConfig(pop_size=4, n_elites=2)
    state = cem.init(jnp.zeros(8), config)
    samples = jnp.stack([jnp.full(8, ODD + i, jnp.float32) for i in range(4)])
    fitness = jnp.asarray([0.0, 3.0, 1.0, 2.0], jnp.float32)
    told = {name: compiled(name, lambda s, x, f: cem.tell(s, x, f, config), state, samples, fitness)
            for name in ("bf16", "highest")}
    jax.tree.map(np.testing.assert_array_equal, told["bf16"], told["highest"])
    w = cem.elite_weights(2)
    np.testing.assert_allclose(told["bf16"].mean, np.full(8, w[0] * (ODD + 1) + w[1] * (ODD + 3)), rtol=1e-6)


def test_dvd_diversity_gradient_is_float32_and_the_shared_critic_networks_round():
    embeddings = jax.random.normal(jax.random.key(1), (4, 6)) * ODD
    grads = {name: compiled(name, jax.value_and_grad(diversity_loss), embeddings) for name in ("bf16", "highest")}
    jax.tree.map(np.testing.assert_array_equal, grads["bf16"], grads["highest"])

    spec = registry.env_spec("probe:pendulum")
    shared = make_shared_critic_td3(TD3Config(hidden=(8,)), spec, pop_size=2)
    actor = shared.init_actor(jax.random.key(2))
    obs = jax.random.normal(jax.random.key(3), (5, 3))
    actions = {name: compiled(name, shared.actor_apply, actor, obs) for name in ("bf16", "highest")}
    assert not np.array_equal(actions["bf16"], actions["highest"])
    lowered = jax.jit(precision.apply(shared.actor_apply, "bf16")).lower(actor, obs).as_text()
    assert _all_products_bf16(lowered)


def _all_products_bf16(lowered: str) -> bool:
    dots = [line for line in lowered.splitlines() if "stablehlo.dot_general" in line]
    return bool(dots) and all("xbf16>, tensor<" in line and "xf32>" in line.rsplit("->", 1)[1] for line in dots)


def test_a_new_learner_is_rounded_without_a_word_about_precision():
    # a learner popjax has never seen: its policy, act and update are network passes because a LearnerDef made it
    def make(config, spec):
        del config, spec
        return Learner(init=lambda key, hp: W, act=lambda key, w, obs, hp: (obs @ w, None),
                       policy=lambda w, obs: obs @ w,
                       step=RolloutStep(lambda key, w, traj, hp, behaviour: (w, {"q": jnp.sum(traj @ w)})))

    definition = LearnerDef(name="probe_linear", config_cls=object, hparams_cls=object, make=make,
                            default_hparams=lambda c: None, action_kind="continuous", step_kind=RolloutStep)
    learner = definition.make(None, None)
    key = jax.random.key(0)
    for name, product in (("bf16", 8.0), ("highest", 8 * ODD)):
        np.testing.assert_array_equal(compiled(name, learner.policy, W, X), np.full((4, 3), product, np.float32))
        np.testing.assert_array_equal(compiled(name, learner.act, key, W, X, None)[0], np.full((4, 3), product,
                                                                                            np.float32))
        metrics = compiled(name, learner.step.update, key, W, X, None, W)[1]
        np.testing.assert_array_equal(metrics["q"], np.float32(12 * product))


@pytest.mark.parametrize("name", ["td3", "sac"])
def test_every_product_of_a_learner_update_is_rounded(name):
    definition = LEARNERS[name]
    config = definition.config_cls(hidden=(8, 8), batch_size=4)
    learner = definition.make(config, registry.env_spec("probe:pendulum"))
    hparams = definition.default_hparams(config)
    state = learner.init(jax.random.key(0), hparams)
    batch = jax.tree.map(lambda x: jnp.broadcast_to(x, (1, 4) + x.shape),
                         popjax.types.dummy_transition(registry.env_spec("probe:pendulum")))
    keys = jax.random.split(jax.random.key(1), 1)
    lowered = jax.jit(precision.apply(learner.step.update, "bf16")).lower(keys, state, batch, None,
                                                                          hparams).as_text()
    assert _all_products_bf16(lowered)


def test_the_exported_policy_computes_with_its_runs_precision(tmp_path):
    from popjax.export import export_policy, load_policy, read_meta

    obs = np.asarray(jax.random.normal(jax.random.key(0), (5, 3)) * 3)
    outputs = {}
    for name in ("bf16", "highest"):
        run = popjax.train(out_dir=tmp_path / name, **{**TINY, "total_env_steps": 100, "eval_interval": 100,
                                                       "warmup_steps": 50, "matmul_precision": name})
        path = export_policy(run.out_dir, tmp_path / f"{name}.npz", member=0)
        assert read_meta(path)["matmul_precision"] == name
        learner = LEARNERS["td3"].make(LEARNERS["td3"].config_cls(hidden=(8, 8)), registry.env_spec("probe:pendulum"))
        state = member(run.state.learner, 0)
        outputs[name] = load_policy(path)(obs)
        np.testing.assert_allclose(outputs[name], compiled(name, learner.policy, state, jnp.asarray(obs)), rtol=0,
                                   atol=1e-6)
        if name == "bf16":  # the same weights multiplied in float32 act differently
            assert np.abs(outputs[name] - compiled("highest", learner.policy, state, jnp.asarray(obs))).max() > 1e-4
