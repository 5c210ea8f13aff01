"""ReF-ER (refer_td3, refer_sac): the mechanism pinned by values (spec E1-E10), its replay and its refusals."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from learner_helpers import (
    BATCH,
    HIDDEN,
    OBS_DIM,
    SPECS,
    assert_trees_equal,
    fast_compile,  # noqa: F401  (autouse fixture)
)
from scipy import stats

from popjax.buffers.sources import make_uniform_source
from popjax.config import ConfigError, make_config
from popjax.learners import refer, sac, td3
from popjax.learners.base import adam_step, replay_step
from popjax.population.tree import member, stack
from popjax.types import Replayed, Transition, dummy_transition

SPEC = SPECS["continuous"]
CONFIG = refer.ReferConfig(hidden=HIDDEN, batch_size=BATCH)
N_STORED = 16


def _hparams(kind: str, **values):
    defaults = refer.default_td3_hparams() if kind == "td3" else refer.default_sac_hparams()
    return defaults.replace(**{k: jnp.asarray(v, getattr(defaults, k).dtype) for k, v in values.items()})


def _learner(kind: str, config=CONFIG):
    return (refer.make_refer_td3 if kind == "td3" else refer.make_refer_sac)(config, SPEC)


def _replayed(key, learner, state, hp, offset: float = 0.0, stored=None) -> Replayed:
    """A batch acted by ``state``'s own behaviour (its ``act`` on random obs), the behaviour means shifted by
    ``offset`` (0: on-policy), with ``N_STORED`` stored ratios (default all 1)."""
    k_obs, k_act, k_rest = jax.random.split(key, 3)
    obs = jax.random.normal(k_obs, (BATCH, OBS_DIM))
    action, extras = learner.act(k_act, state, obs, hp)
    extras = {**extras, "mean": extras["mean"] + offset, "u": extras["u"] + offset}
    k_r, k_n, k_t = jax.random.split(k_rest, 3)
    batch = Transition(obs, action, jax.random.normal(k_r, (BATCH,)), jax.random.normal(k_n, (BATCH, OBS_DIM)),
                       (jax.random.uniform(k_t, (BATCH,)) < 0.2).astype(jnp.float32), extras)
    stored = jnp.ones(N_STORED) if stored is None else stored
    return Replayed(batch, stored, jnp.ones(N_STORED, bool))


# --- E1: rho against scipy ------------------------------------------------------------------------------
@pytest.mark.long
def test_e1_rho_matches_scipy_densities_and_is_clipped():
    rng = np.random.default_rng(0)
    u, m_pi, m_mu = (rng.normal(size=(5, 3)) * 0.3 for _ in range(3))
    s_pi, s_mu = rng.uniform(0.2, 0.6, (5, 3)), rng.uniform(0.2, 0.6, (5, 3))
    rho = refer.importance_ratio(*(jnp.asarray(x, jnp.float32) for x in (u, m_pi, np.log(s_pi), m_mu, np.log(s_mu))))
    expected = np.exp(stats.norm.logpdf(u, m_pi, s_pi).sum(-1) - stats.norm.logpdf(u, m_mu, s_mu).sum(-1))
    np.testing.assert_allclose(np.asarray(rho), expected, rtol=1e-5)
    same = refer.importance_ratio(*(jnp.asarray(x, jnp.float32) for x in (u, m_mu, np.log(s_mu), m_mu, np.log(s_mu))))
    np.testing.assert_array_equal(np.asarray(same), np.ones(5, np.float32))
    zeros, one = jnp.zeros((1, 3)), jnp.zeros((1, 3))
    high = refer.importance_ratio(zeros, zeros, jnp.log(0.1) + one, zeros + 2.0, one)  # log rho = 46.6 -> 7
    low = refer.importance_ratio(zeros + 2.0, zeros, jnp.log(0.1) + one, zeros + 2.0, one)  # -> -7
    np.testing.assert_allclose(np.asarray([high[0], low[0]]), [np.exp(7.0), np.exp(-7.0)], rtol=1e-6)


# --- E2: the strict near mask ------------------------------------------------------------------------------
def test_e2_near_mask_is_strict_and_c_max_at_most_one_disables_it():
    c = jnp.float32(4.0)
    rho = jnp.array([0.25, np.nextafter(np.float32(0.25), 1), 1.0, np.nextafter(np.float32(4), 0), 4.0, 100.0],
                    jnp.float32)
    np.testing.assert_array_equal(np.asarray(refer.near_mask(rho, c)), [False, True, True, True, False, False])
    np.testing.assert_array_equal(np.asarray(refer.near_mask(rho, jnp.float32(1.0))), [True] * 6)
    np.testing.assert_array_equal(np.asarray(refer.near_mask(rho, jnp.float32(0.5))), [True] * 6)


# --- E3: beta = 1 and c_max = inf reproduce the base update bit for bit ------------------------------------
@pytest.mark.long
@pytest.mark.parametrize("kind", ["td3", "sac"])
def test_e3_reduction_to_the_base_update_bit_for_bit(kind):
    learner = _learner(kind)
    hp = _hparams(kind, refer_c=1e30, refer_a=0.0, beta_init=1.0, **({"policy_delay": 1} if kind == "td3" else {}))
    if kind == "td3":
        base_def = td3.make_td3(td3.TD3Config(hidden=HIDDEN, batch_size=BATCH), SPEC)
        base_hp = td3.TD3HParams(**{f: getattr(hp, f) for f in td3.TD3HParams.__dataclass_fields__})
    else:
        base_def = sac.make_sac(sac.SACConfig(hidden=HIDDEN, batch_size=BATCH), SPEC)
        base_hp = sac.SACHParams(**{f: getattr(hp, f) for f in sac.SACHParams.__dataclass_fields__})
    state = learner.init(jax.random.key(0), hp)
    base_state = base_def.init(jax.random.key(0), base_hp)
    assert_trees_equal(state.base, base_state)
    refer_update = jax.jit(lambda k, s, b: learner.step.update(k[None], s, jax.tree.map(lambda x: x[None], b),
                                                               None, hp))
    base_update = jax.jit(lambda k, s, b: base_def.step.update(k[None], s, jax.tree.map(lambda x: x[None], b),
                                                               None, base_hp))
    for i in range(3):
        replayed = _replayed(jax.random.key(10 + i), learner, state, hp, offset=0.05)
        key = jax.random.key(100 + i)
        state, metrics, _ = refer_update(key, state, replayed)
        base_state, _, _ = base_update(key, base_state, replayed.transitions.replace(extras=None))
        assert float(metrics["beta"]) == 1.0
        assert_trees_equal(state.base, base_state)
    assert float(state.beta) == 1.0


def test_e3_act_is_the_base_act_and_records_the_behaviour():
    """TD3: the clipped action from the pre-clip u = mean + sigma * noise; SAC: tanh(u); rho = 1 on insert."""
    obs = jax.random.normal(jax.random.key(1), (BATCH, OBS_DIM))
    for kind, base in (("td3", td3.td3_core), ("sac", sac.sac_core)):
        hp = _hparams(kind, exploration_noise=2.0) if kind == "td3" else _hparams(kind)
        learner = _learner(kind)
        state = learner.init(jax.random.key(0), hp)
        core = base((td3.TD3Config if kind == "td3" else sac.SACConfig)(hidden=HIDDEN, batch_size=BATCH), SPEC)
        action, extras = learner.act(jax.random.key(3), state, obs, hp)
        base_action = core.act(jax.random.key(3), state.base, obs, hp).action
        np.testing.assert_array_equal(np.asarray(action), np.asarray(base_action))
        squash = (lambda u: jnp.clip(u, -1, 1)) if kind == "td3" else jnp.tanh
        np.testing.assert_array_equal(np.asarray(squash(extras["u"])), np.asarray(action))
        np.testing.assert_array_equal(np.asarray(extras["rho"]), np.ones(BATCH, np.float32))
        if kind == "td3":
            assert float(jnp.abs(extras["u"]).max()) > 1.0  # sigma 2: some pre-clip actions leave [-1, 1]
            np.testing.assert_allclose(np.asarray(extras["log_std"]), np.log(2.0), rtol=1e-6)


# --- E4: an all-far batch --------------------------------------------------------------------------------------
@pytest.mark.long
def test_e4_all_far_batch_gives_no_gradient_at_beta_one_and_only_kl_below():
    learner = _learner("td3")
    for beta in (1.0, 0.5):
        hp = _hparams("td3", beta_init=beta, policy_delay=1)
        state = learner.init(jax.random.key(0), hp)
        replayed = _replayed(jax.random.key(1), learner, state, hp, offset=3.0)  # log rho = -7: all far
        new, metrics, rho = learner.step.update(jax.random.key(2)[None], state,
                                                jax.tree.map(lambda x: x[None], replayed), None, hp)
        np.testing.assert_allclose(np.asarray(rho[0]), np.exp(-7.0), rtol=1e-6)
        assert float(metrics["batch_near"]) == 0.0
        assert_trees_equal(new.base.critic, state.base.critic)  # Rule 1: no critic gradient
        core = td3.td3_core(td3.TD3Config(hidden=HIDDEN, batch_size=BATCH), SPEC)
        mu = replayed.transitions.extras

        def kl_loss(actor, core=core, obs=replayed.transitions.obs, mu=mu, beta=beta):
            mean = core.actor_net.apply(actor, obs)
            return (1.0 - beta) * refer.kl_gaussian(mu["mean"], mu["log_std"], mean, mu["log_std"]).mean()

        grads = jax.grad(kl_loss)(state.base.actor)
        expected, _ = adam_step(state.base.actor, grads, state.base.actor_opt, hp.actor_lr)
        if beta == 1.0:
            assert_trees_equal(new.base.actor, state.base.actor)
        else:
            np.testing.assert_allclose(np.concatenate([np.ravel(x) for x in jax.tree.leaves(new.base.actor)]),
                                       np.concatenate([np.ravel(x) for x in jax.tree.leaves(expected)]), atol=1e-7)
            assert any(not np.array_equal(a, b) for a, b in zip(jax.tree.leaves(new.base.actor),
                                                                 jax.tree.leaves(state.base.actor), strict=True))


# --- E5: divided by B, not by the near count ----------------------------------------------------------------
@pytest.mark.long
def test_e5_task_gradient_is_the_near_sum_over_b():
    core = td3.td3_core(td3.TD3Config(hidden=HIDDEN, batch_size=BATCH), SPEC)
    state = core.init(jax.random.key(0), td3.default_hparams())
    obs = jax.random.normal(jax.random.key(1), (BATCH, OBS_DIM))
    near = jnp.array([1.0, 0.0, 1.0, 0.0])

    def objective(actor):
        task = -td3.dpg_values(core.actor_net, core.critic_net, actor, state.critic, obs)
        return refer.refer_objective(task, near, jnp.zeros(BATCH), jnp.float32(1.0))

    got = jax.grad(objective)(state.actor)
    per_sample = [jax.grad(lambda a, i=i: -td3.dpg_values(core.actor_net, core.critic_net, a, state.critic,
                                                           obs[i:i + 1])[0])(state.actor) for i in range(BATCH)]
    manual = jax.tree.map(lambda g0, g2: (g0 + g2) / BATCH, per_sample[0], per_sample[2])  # near 0 and 2, over B = 4
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(manual), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-8)
    over_near = jax.tree.map(lambda g: g * BATCH / 2, manual)  # what dividing by n_near would give
    assert not np.allclose(np.asarray(jax.tree.leaves(got)[1]), np.asarray(jax.tree.leaves(over_near)[1]))


# --- E6: the KL ---------------------------------------------------------------------------------------------------
@pytest.mark.long
def test_e6_kl_closed_form_against_monte_carlo_grad_and_the_papers_bounds():
    rng = np.random.default_rng(1)
    m_p, m_q = rng.normal(size=3) * 0.5, rng.normal(size=3) * 0.5
    ls_p, ls_q = np.log(rng.uniform(0.2, 0.6, 3)), np.log(rng.uniform(0.2, 0.6, 3))
    kl = float(refer.kl_gaussian(*(jnp.asarray(x, jnp.float32) for x in (m_p, ls_p, m_q, ls_q))))
    x = rng.normal(size=(400_000, 3)) * np.exp(ls_p) + m_p
    mc = np.mean(stats.norm.logpdf(x, m_p, np.exp(ls_p)).sum(-1) - stats.norm.logpdf(x, m_q, np.exp(ls_q)).sum(-1))
    assert abs(kl - mc) < 0.02 * max(1.0, kl)
    g_m, g_ls = jax.grad(lambda m, ls: refer.kl_gaussian(jnp.asarray(m_p, jnp.float32), jnp.asarray(ls_p, jnp.float32),
                                                         m, ls), argnums=(0, 1))(jnp.asarray(m_q, jnp.float32),
                                                                                 jnp.asarray(ls_q, jnp.float32))
    var_q = np.exp(2 * ls_q)
    np.testing.assert_allclose(np.asarray(g_m), (m_q - m_p) / var_q, rtol=1e-4)
    np.testing.assert_allclose(np.asarray(g_ls), 1.0 - (np.exp(2 * ls_p) + (m_p - m_q) ** 2) / var_q, rtol=1e-4,
                               atol=1e-5)
    # equal sigma: |dm|^2 / (2 sigma^2); the paper's maxima 2 dA / sigma^2 at sigma 0.2 for means in (-1, 1)
    log02 = jnp.log(jnp.float32(0.2))
    same = refer.kl_gaussian(jnp.asarray(m_p, jnp.float32), log02 + jnp.zeros(3), jnp.asarray(m_q, jnp.float32),
                             log02 + jnp.zeros(3))
    np.testing.assert_allclose(float(same), np.sum((m_p - m_q) ** 2) / (2 * 0.04), rtol=1e-5)
    for d_a, bound in ((17, 850.0), (6, 300.0)):
        corner = refer.kl_gaussian(-jnp.ones(d_a), log02 + jnp.zeros(d_a), jnp.ones(d_a), log02 + jnp.zeros(d_a))
        np.testing.assert_allclose(float(corner), bound, rtol=1e-5)


# --- E7: the beta recursion and the annealing table -----------------------------------------------------------------
def test_e7_beta_recursion_and_annealing_table():
    eta, beta0, k = jnp.float32(1e-4), jnp.float32(0.3), 50_000

    def run(far):
        return jax.lax.scan(lambda b, _: (refer.beta_step(b, far, jnp.float32(0.1), eta), b), beta0, None, length=k)

    near_last, near_path = run(jnp.float32(0.05))
    far_last, _ = run(jnp.float32(0.5))
    np.testing.assert_allclose(float(near_last), 1 - (1 - 1e-4) ** k * (1 - 0.3), rtol=1e-4)
    np.testing.assert_allclose(float(far_last), (1 - 1e-4) ** k * 0.3, rtol=2e-3)
    from_zero = 1 - (1 - 1e-4) ** np.array([1e3, 1e4, 2.3e4, 5e4])  # the spec's implicit warm-up from beta0 = 0
    np.testing.assert_allclose(from_zero, [0.095, 0.632, 0.900, 0.993], atol=6e-4)
    one = refer.beta_step(jnp.float32(1.0), jnp.float32(0.0), jnp.float32(0.1), jnp.float32(1e-3))
    assert float(one) == 1.0  # plain ER (nothing far) keeps beta exactly 1
    t = jnp.array([0, 1e5, 1e6, 2e6, 5e6, 1e7], jnp.float32)
    c = refer.c_max(jnp.float32(4.0), jnp.float32(5e-7), t)
    np.testing.assert_allclose(np.asarray(c), [5.000, 4.810, 3.667, 3.000, 2.143, 1.667], atol=6e-4)
    np.testing.assert_allclose(np.asarray(1 / (1 + 5e-7 * t)), [1.0, 0.952, 0.667, 0.5, 0.286, 0.167], atol=6e-4)


def test_e7_learner_anneals_c_max_and_optionally_the_lr():
    for anneal in (False, True):
        config = refer.ReferConfig(hidden=HIDDEN, batch_size=BATCH, anneal_lr=anneal)
        learner = _learner("td3", config)
        hp = _hparams("td3", refer_a=0.5, policy_delay=1)
        state = learner.init(jax.random.key(0), hp).replace(t=jnp.int32(2))  # c_max = 1 + 4 / 2 = 3, lr / 2
        replayed = _replayed(jax.random.key(1), learner, state, hp)
        new, metrics, _ = learner.step.update(jax.random.key(2)[None], state,
                                              jax.tree.map(lambda x: x[None], replayed), None, hp)
        assert float(metrics["c_max"]) == 3.0 and int(new.t) == 3
        lr_hp = hp.replace(actor_lr=hp.actor_lr / 2, critic_lr=hp.critic_lr / 2) if anneal else hp
        # the same update with the lr given explicitly and no annealing
        fixed = _learner("td3", refer.ReferConfig(hidden=HIDDEN, batch_size=BATCH))
        ref, _, _ = fixed.step.update(jax.random.key(2)[None], state, jax.tree.map(lambda x: x[None], replayed),
                                      None, lr_hp)
        assert_trees_equal(new.base, ref.base)


# --- E8: the delta* table -----------------------------------------------------------------------------------------
@pytest.mark.long
def test_e8_delta_star_table_by_sampling():
    sigma, n = 0.2, 400_000
    a = jax.random.normal(jax.random.key(0), (n, 1)) * sigma  # a ~ mu = N(0, sigma^2)
    log_s = jnp.log(jnp.float32(sigma)) + jnp.zeros((n, 1))
    for cmax, delta in ((5, 0.893), (3.667, 0.741), (3, 0.636), (2.143, 0.452), (1.667, 0.307)):
        rho = refer.importance_ratio(a, jnp.full((n, 1), delta * sigma), log_s, jnp.zeros((n, 1)), log_s)
        far = 1.0 - float(refer.near_mask(rho, jnp.float32(cmax)).mean())
        assert abs(far - 0.1) < 0.004, (cmax, far)
        kl = float(refer.kl_gaussian(jnp.zeros(1), log_s[0], jnp.full(1, delta * sigma), log_s[0]))
        np.testing.assert_allclose(kl, delta ** 2 / 2, rtol=1e-5)


# --- E9: stored rho refreshed at the sampled rows only ------------------------------------------------------------
@pytest.mark.long
def test_e9_rho_refreshed_only_at_sampled_rows_and_far_fraction_with_current_c_max():
    learner = _learner("td3")
    config = make_config(learner="refer_td3", env="probe:pendulum", buffer_size=N_STORED, batch_size=BATCH,
                         warmup_steps=0, rollout_len=1)
    source = make_uniform_source(config, SPEC, learner.step)
    hp = _hparams("td3", policy_delay=1)
    state = learner.init(jax.random.key(0), hp)
    obs = jax.random.normal(jax.random.key(1), (10, OBS_DIM))
    action, extras = learner.act(jax.random.key(2), state, obs, hp)
    rows = Transition(obs, action, jnp.zeros(10), obs, jnp.zeros(10), extras)
    replay = source.add(source.init(), rows, jnp.zeros(10, bool))
    batch, weights, handle = source.sample(jax.random.key(3), replay)
    assert weights is None and isinstance(batch, Replayed)
    np.testing.assert_array_equal(np.asarray(batch.stored), np.r_[np.ones(10), np.zeros(6)])  # inserts: rho = 1
    np.testing.assert_array_equal(np.asarray(batch.valid), np.arange(N_STORED) < 10)
    trained, _, rho = learner.step.update(jax.random.key(4)[None], state, jax.tree.map(lambda x: x[None], batch),
                                          None, hp)
    np.testing.assert_allclose(np.asarray(rho[0]), np.asarray(learner.step.refresh.rows(state, batch.transitions, hp)),
                               rtol=1e-6)
    written = source.write_back(replay, handle, rho[0])
    stored = np.asarray(written.data.extras["rho"])
    sampled = np.unique(np.asarray(handle))
    np.testing.assert_allclose(stored[np.asarray(handle)], np.asarray(rho[0]), rtol=1e-6)
    others = np.setdiff1d(np.arange(N_STORED), sampled)
    np.testing.assert_array_equal(stored[others], np.asarray(replay.data.extras["rho"])[others])
    # every row recomputed (after an exploit): the sampled rows' values come back, the rest move too
    rewritten = source.rewrite(written, lambda data: learner.step.refresh.rows(trained, data, hp))
    np.testing.assert_allclose(np.asarray(rewritten.data.extras["rho"])[:10],
                               np.asarray(learner.step.refresh.rows(trained, jax.tree.map(lambda x: x[:10],
                                                                                          written.data), hp)),
                               rtol=1e-6)
    # the far fraction counts valid rows only, with the c_max given
    ratios = jnp.array([1.0, 3.5, 0.2, 6.0, 1.0, 1.0, 9.0, 9.0])
    valid = jnp.array([True] * 6 + [False] * 2)
    assert float(refer.far_fraction(ratios, valid, jnp.float32(5.0))) == pytest.approx(2 / 6)
    assert float(refer.far_fraction(ratios, valid, jnp.float32(3.0))) == pytest.approx(3 / 6)


# --- E10: members with different (C, D, beta) under vmap equal a loop ----------------------------------------------
@pytest.mark.long
@pytest.mark.parametrize("kind", ["td3", "sac"])
def test_e10_vmapped_members_equal_a_loop(kind):
    learner = _learner(kind)
    members = [_hparams(kind, refer_c=c, refer_d=d, beta_init=b, beta_lr=0.3)
               for c, d, b in ((1.5, 0.1, 0.0), (4.0, 0.3, 0.5), (30.0, 0.05, 1.0))]
    states = [learner.init(jax.random.key(i), hp) for i, hp in enumerate(members)]
    stored = jnp.linspace(0.1, 5.0, N_STORED)
    batches = [_replayed(jax.random.key(20 + i), learner, s, hp, offset=0.2, stored=stored)
               for i, (s, hp) in enumerate(zip(states, members, strict=True))]

    def two(key, state, replayed, hp):
        for i in range(2):
            state, metrics, rho = learner.step.update(jax.random.fold_in(key, i)[None], state,
                                                      jax.tree.map(lambda x: x[None], replayed), None, hp)
        return state, metrics, rho

    keys = jnp.stack([jax.random.key_data(jax.random.key(50 + i)) for i in range(3)])
    together = jax.jit(jax.vmap(lambda k, s, b, h: two(jax.random.wrap_key_data(k), s, b, h)))(
        keys, stack(states), stack(batches), stack(members))
    betas = []
    for i in range(3):
        alone = jax.jit(two)(jax.random.key(50 + i), states[i], batches[i], members[i])
        for a, b in zip(jax.tree.leaves(alone), jax.tree.leaves(member(together, i)), strict=True):
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)
        betas.append(float(alone[0].beta))
    assert len(set(betas)) == 3  # the members' controllers moved differently


# --- replay layout and refusals -------------------------------------------------------------------------------------
def test_other_learners_keep_their_replay_layout():
    """No extras for learners that record none: the replay's leaves are the five transition fields, as before."""
    paths = [jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_leaves_with_path(dummy_transition(SPEC))]
    assert paths == [".obs", ".action", ".reward", ".next_obs", ".terminated"]
    config = make_config(learner="td3", env="probe:pendulum", buffer_size=8, batch_size=BATCH, rollout_len=1,
                         warmup_steps=0)
    plain = make_uniform_source(config, SPEC, replay_step(lambda *a: None))
    assert len(jax.tree.leaves(plain.init())) == 5 + 2  # the transition fields, insert_pos and size


@pytest.mark.parametrize("field, value, allowed", [
    ("refer_c", 1.0, "> 1"), ("refer_d", 0.0, "(0, 1)"), ("refer_d", 1.0, "(0, 1)"), ("refer_a", -1e-3, ">= 0"),
    ("exploration_noise", 0.0, "> 0"), ("beta_lr", 1.0, "(0, 1)"), ("beta_lr", 0.0, "(0, 1)")])
def test_bad_hparams_are_one_line(field, value, allowed):
    with pytest.raises(ConfigError) as err:
        make_config(learner="refer_td3", env="probe:pendulum", hparams={field: value})
    message = str(err.value)
    assert "\n" not in message and message.startswith(f"hparams.{field}:") and allowed in message


def test_refused_combinations_are_one_line():
    for options, field in (({"buffer": "prioritized"}, "buffer"), ({"driver": "cemrl"}, "learner"),
                           ({"driver": "dvd"}, "learner")):
        with pytest.raises(ConfigError) as err:
            from popjax.experiment import build
            build(make_config(learner="refer_td3", env="probe:pendulum", **options))
        assert "\n" not in str(err.value) and str(err.value).startswith(field), str(err.value)
        if options.get("driver"):
            assert "needs each member's own replay" in str(err.value) and "allowed drivers: " in str(err.value)
    with pytest.raises(ConfigError) as err:
        from popjax.experiment import build
        build(make_config(learner="refer_sac", env="probe:cartpole"))
    assert str(err.value) == "env: refer_sac needs continuous actions but probe:cartpole has 2 discrete actions"


# --- drivers: PBT's recompute after an exploit, HTS's stored behaviour -------------------------------------------
@pytest.mark.long
def test_exploited_members_recompute_every_stored_rho():
    """``refresh_replaced``: a replaced member's whole replay gets the ratios of its new learner state (one call),
    the others keep theirs."""
    from popjax.drivers.independent import PopState
    from popjax.drivers.replay import refresh_replaced

    learner = _learner("td3")
    config = make_config(learner="refer_td3", env="probe:pendulum", buffer_size=N_STORED, batch_size=BATCH,
                         warmup_steps=0, rollout_len=1)
    source = make_uniform_source(config, SPEC, learner.step)
    hps = [_hparams("td3"), _hparams("td3", exploration_noise=0.3)]
    states, replays = [], []
    for i, hp in enumerate(hps):
        state = learner.init(jax.random.key(i), hp)
        obs = jax.random.normal(jax.random.key(10 + i), (12, OBS_DIM))
        action, extras = learner.act(jax.random.key(20 + i), learner.init(jax.random.key(9), hp), obs, hp)
        rows = Transition(obs, action, jnp.zeros(12), obs, jnp.zeros(12), extras)
        states.append(state)
        replays.append(source.add(source.init(), rows, jnp.zeros(12, bool)))
    pop = PopState(learner=stack(states), buffer=stack(replays), hparams=stack(hps), counters=None)
    out = refresh_replaced(learner, source, pop, jnp.array([True, False]))
    fresh = learner.step.refresh.rows(states[0], replays[0].data, hps[0])
    np.testing.assert_allclose(np.asarray(out.buffer.data.extras["rho"][0]), np.asarray(fresh), rtol=1e-6)
    assert not np.allclose(np.asarray(fresh)[:12], 1.0)  # another policy acted: the ratios moved off 1
    assert_trees_equal(member(out.buffer, 1), replays[1])


@pytest.mark.long
def test_hts_driver_stores_the_behaviour_and_writes_rho_back(tmp_path):
    import popjax

    run = popjax.train(learner="refer_td3", env="gym:Pendulum-v1", driver="hts", pop_size=2, total_env_steps=60,
                       rollout_len=5, envs_per_member=2, eval_interval=60, eval_episodes=1, warmup_steps=20,
                       batch_size=8, buffer_size=100, progress=False, learner_config={"hidden": [8]},
                       hts={"alpha": 5, "executors": 2, "actors": 1}, hparams={"beta_lr": 0.1},
                       out_dir=tmp_path / "hts")
    data = jax.tree.map(np.asarray, run.state.buffer.data)
    valid = np.arange(100) < 60
    extras = data.extras
    np.testing.assert_array_equal(np.clip(extras["u"], -1, 1)[:, valid], data.action[:, valid])
    np.testing.assert_allclose(extras["log_std"][:, valid], np.log(0.2), rtol=1e-6)
    assert np.any(extras["rho"][:, valid] != 1.0)  # sampled rows were refreshed
    assert np.all(extras["rho"][:, ~valid] == 0.0)
    summary = run.summary["learner_metrics"]
    assert set(summary) == {"far_fraction", "beta", "c_max", "kl"} and len(summary["beta"]) == 2
    assert 0.0 < summary["beta"][0] < 1.0


@pytest.mark.processes  # CLI runs of whole examples, as tests/test_docs.py's
def test_the_guide_commands_run(tmp_path, monkeypatch):
    """The guide's two ReF-ER commands (docs/learners.md), at tiny sizes, with the far fraction and beta in
    summary.json."""
    import json

    from docs_blocks import block, commands

    from popjax import cli

    found = [c.argv for c in commands(block("docs/learners.md", "ReF-ER: remember and forget experience replay"))]
    assert [c[2] for c in found] == ["refer_td3", "refer_sac"]
    monkeypatch.chdir(tmp_path)
    tiny = ["--steps", "200", "--warmup", "50", "--rollout-len", "25", "--eval-interval", "100", "--eval-episodes",
            "1", "--batch-size", "16", "--buffer-size", "500", "--learner-config", "hidden=[8]", "--no-progress",
            "--set", "pbt={interval: 100}"]
    for i, argv in enumerate(found):
        assert cli.main(argv + tiny + ["--out", f"run{i}"]) == 0
        summary = json.loads((tmp_path / f"run{i}" / "summary.json").read_text())
        assert len(summary["learner_metrics"]["beta"]) == 4 and 0 < summary["learner_metrics"]["beta"][0] < 1
    assert json.loads((tmp_path / "run1" / "summary.json").read_text())["pbt"]["rounds"] == 1


PB2_RUN = dict(learner="refer_td3", pop_size=4, seed=3, total_env_steps=400, warmup_steps=40, eval_interval=40,
               rollout_len=10, envs_per_member=2, batch_size=BATCH, buffer_size=200, eval_episodes=1,
               learner_config={"hidden": [8]}, progress=False,
               pbt={"explore": "pb2", "interval": 40, "quantile": 0.25,
                    "search_space": {"exploration_noise": {"low": 0.05, "high": 0.5}}})


@pytest.mark.long
@pytest.mark.parametrize("driver", ["pbt", "hts"])
def test_pb2_proposal_reaches_the_replaced_members_ratios(driver):
    """Issue 37: under ``explore: pb2`` a replaced member's stored ratios are those of its learner state *and* the
    sigma PB2 proposed for it (written after the compiled round), not of its parent's sigma."""
    from popjax.drivers.replay import refresh_replaced
    from popjax.experiment import build
    from popjax.registry import LEARNERS

    options = dict(PB2_RUN, driver=driver, env="probe:pendulum" if driver == "pbt" else "gym:Pendulum-v1")
    if driver == "hts":
        options["hts"] = {"alpha": 10, "executors": 2, "population": "pbt", "serial": True}
    config = make_config(**options)
    loop = build(config)
    state, env_state = loop.initial_state()
    while loop.counters(state)[0] < 80:  # past the warm-up: ratios stored by two policies
        state, env_state, _ = loop.step(state, env_state)
    state = loop.unpacked(state)  # the JAX path keeps it packed between iterations
    before = jax.tree.map(np.asarray, state.hparams)
    state, info = loop.after_eval(state, np.arange(4.0))
    loser = np.asarray(info["loser"])
    assert info["ready"] and loser.tolist() == [True, False, False, False]
    noise = np.asarray(state.hparams.exploration_noise)
    assert noise[0] != before.exploration_noise[int(info["parent"][0])]  # PB2 proposed another sigma
    definition = LEARNERS["refer_td3"]
    learner = definition.make(loop.plan.learner_config, loop.runner.spec)
    source = make_uniform_source(config, loop.runner.spec, learner.step)
    expected = refresh_replaced(learner, source, state, jnp.asarray(loser))  # a fixed point when right
    np.testing.assert_allclose(np.asarray(state.buffer.data.extras["rho"][0]),
                               np.asarray(expected.buffer.data.extras["rho"][0]), rtol=1e-6)
