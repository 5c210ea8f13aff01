"""Proof of the actor-critic contract: a wrapper learner written here, outside popjax, trains under the independent
and pbt drivers with no edit to popjax.

``spread_td3`` reweights TD3's per-sample losses by a statistic of its own that it keeps in the replay: the twin
critics' disagreement ``|Q1(s, a) - Q2(s, a)|`` of each transition (0 on insert, written back at the sampled rows
after each update, recomputed for the whole replay when a PBT exploit replaces the member's learner state).
Sample i's critic and actor losses are weighted by ``w_i = (1 + s_i / mean(s)) / 2`` (the mean over the replay's
stored values): transitions the critics disagree on count more. Everything it needs is the core's
(``td3.td3_core``: the update with per-sample critic weights, the per-sample actor losses through
``Steps.actor_objective``) and the replay contract (``ReplayStep.extras`` and ``refresh``).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import popjax
from popjax.envs.registry import env_spec
from popjax.learners import LEARNERS, register, td3
from popjax.learners.actor_critic import Steps
from popjax.learners.base import Learner, LearnerDef, PBTSupport, Refresh, ReplayStep, one_step_chunk
from popjax.types import Replayed, Transition

FIELD = "spread"


def spread(core, state, transitions) -> jax.Array:
    """``|Q1(s, a) - Q2(s, a)|`` per transition under the state's critic."""
    q = core.critic_net.apply(state.critic, transitions.obs, transitions.action)
    return jnp.abs(q[0] - q[1])


def weights_of(stored_rows: jax.Array, stored: jax.Array, valid: jax.Array) -> jax.Array:
    """``(1 + s_i / mean(s)) / 2``, the mean over the valid rows (1 for every row while nothing was written)."""
    mean = jnp.sum(jnp.where(valid, stored, 0.0)) / jnp.maximum(valid.sum(), 1)
    return jnp.where(mean > 0, 0.5 * (1.0 + stored_rows / jnp.maximum(mean, 1e-12)), 1.0)


def make_spread_td3(config: td3.TD3Config, spec) -> Learner:
    core = td3.td3_core(config, spec)

    def act(key, state, obs, hp):
        action = core.act(key, state, obs, hp).action
        return action, {FIELD: jnp.zeros(action.shape[:-1], jnp.float32)}

    def update(key, state, replayed: Replayed, weights, hp):
        del weights  # a refreshing learner is served by an unweighted source
        batch = replayed.transitions
        w = weights_of(batch.extras[FIELD], replayed.stored, replayed.valid)
        steps = Steps(actor_objective=lambda actor, terms: jnp.mean(w * terms))
        state, metrics, _ = core.update(key, state, batch, w, hp, steps)
        return state, {**metrics, "weight_max": w.max()}, spread(core, state, batch)

    step = ReplayStep(one_step_chunk(update), priorities=False, extras={FIELD: jnp.zeros((), jnp.float32)},
                      refresh=Refresh(FIELD, lambda state, transitions, hp: spread(core, state, transitions)))
    return Learner(init=core.init, act=act, policy=core.policy, step=step)


SPREAD_TD3 = LearnerDef(name="spread_td3", config_cls=td3.TD3Config, hparams_cls=td3.TD3HParams,
                        make=make_spread_td3, default_hparams=td3.default_hparams, action_kind="continuous",
                        pbt=PBTSupport(search_space={"actor_lr": {"low": 1e-4, "high": 1e-3, "log": True}}))


@pytest.fixture
def registered():
    register(SPREAD_TD3)
    yield
    del LEARNERS[SPREAD_TD3.name]


@pytest.mark.long
def test_the_update_is_td3_with_hand_computed_weights():
    """One update equals TD3's core update with the weights computed by hand (to float32 rounding: the learner
    computes the weights inside its compiled chunk, the test from Python floats, and they differ in the last bit)."""
    spec = env_spec("probe:pendulum")
    config = td3.TD3Config(hidden=(8,), batch_size=4)
    learner, core = make_spread_td3(config, spec), td3.td3_core(config, spec)
    hp = td3.default_hparams()
    state = learner.init(jax.random.key(0), hp)
    keys = jax.random.split(jax.random.key(1), 4)
    obs = jax.random.normal(keys[0], (4,) + spec.obs_shape)
    action = jax.random.uniform(keys[1], (4, spec.action_dim), minval=-1, maxval=1)
    stored_rows = jnp.array([0.0, 1.0, 2.0, 3.0])
    batch = Transition(obs=obs, action=action, reward=jnp.arange(4.0), next_obs=obs[::-1],
                                    terminated=jnp.zeros(4), extras={FIELD: stored_rows})
    stored, valid = jnp.array([0.0, 1.0, 2.0, 3.0, 9.0, 7.0]), jnp.array([True] * 4 + [False] * 2)
    new, metrics, written = learner.step.update(keys[2][None], state, jax.tree.map(lambda x: x[None],
                                                Replayed(batch, stored, valid)), None, hp)
    w = jnp.array([0.5, 0.5 * (1 + 1 / 1.5), 0.5 * (1 + 2 / 1.5), 0.5 * (1 + 3 / 1.5)])  # mean of valid = 1.5
    expected, _, _ = core.update(keys[2], state, batch, w, hp,
                                 Steps(actor_objective=lambda actor, terms: jnp.mean(w * terms)))
    for a, b in zip(jax.tree.leaves(new), jax.tree.leaves(expected), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(float(metrics["weight_max"]), 0.5 * (1 + 3 / 1.5), rtol=1e-6)
    np.testing.assert_allclose(np.asarray(written[0]), np.asarray(spread(core, new, batch)), rtol=0)
    assert float(jnp.abs(written).max()) > 0  # twin critics of different inits disagree


RUN = dict(learner="spread_td3", env="probe:pendulum", total_env_steps=400, rollout_len=50, warmup_steps=100,
           batch_size=16, buffer_size=400, eval_interval=200, eval_episodes=1, progress=False,
           learner_config={"hidden": [16]})


@pytest.mark.parametrize("driver, extra", [
    ("independent", {"pop_size": 2}),
    ("pbt", {"pop_size": 4, "pbt": {"interval": 200, "quantile": 0.25}}),
])
@pytest.mark.long
def test_the_wrapper_trains_under_independent_and_pbt(registered, tmp_path, driver, extra):
    after_eval = []  # the state right after each evaluation's driver step (PBT: after its exploit), copied to the host

    def observe(name, program):
        if name != "after_eval":
            return program

        def call(*args):
            out = program(*args)
            after_eval.append(jax.device_get(out[0]))
            return out

        return call

    run = popjax.train(driver=driver, out_dir=tmp_path / driver, instrument=observe, **RUN, **extra)
    pop = extra["pop_size"]
    assert np.isfinite(run.summary["final_returns"]).all() and len(run.summary["final_returns"]) == pop
    buffer = run.state.buffer
    for m in range(pop):
        size = int(buffer.size[m])
        stored = np.asarray(buffer.data.extras[FIELD][m])[:size]
        assert size == 400 and (stored >= 0).all()
        written = stored > 0  # sampled rows got the statistic written back; never-sampled rows keep 0
        assert 0 < written.sum() < size, (m, written.sum())
    if driver == "pbt":  # an exploit round replaced a member: its replay's statistic was recomputed
        replaced = [entry["member"] for entry in run.summary["lineage"] if entry["env_steps"] == 200]
        assert replaced, "no exploit at the first evaluation"
        state = after_eval[0]  # after the exploit at 200 env steps, before any later update wrote back
        core = td3.td3_core(td3.TD3Config(hidden=(16,), batch_size=16), env_spec("probe:pendulum"))
        for m in range(pop):
            size = int(state.buffer.size[m])
            rows = jax.tree.map(lambda x, m=m, size=size: np.asarray(x[m])[:size], state.buffer.data)
            stored = rows.extras[FIELD]
            expected = np.asarray(spread(core, jax.tree.map(lambda x, m=m: x[m], state.learner), rows))
            if m in replaced:  # every row, sampled or not, holds the new critics' disagreement
                np.testing.assert_allclose(stored, expected, rtol=1e-5, atol=1e-6)
                assert (stored > 0).all()
            else:  # a member kept: its rows hold what earlier critics wrote back when they were sampled
                assert not np.allclose(stored, expected, rtol=1e-5, atol=1e-6)
