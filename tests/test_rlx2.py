"""RLx2-TD3 (Tan et al., ICLR 2023): masked-dense updates, masked targets, topology steps with exact nnz,
members with different sparsities under vmap, PBT sparsity changes, bad inputs, resume."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from learner_helpers import (
    SPECS,
    assert_trees_close,
    assert_trees_equal,
    fast_compile,  # noqa: F401  (autouse fixture)
    random_batch,
    train_cut_and_resume,
    with_values,
)

import popjax
from popjax.config import ConfigError, make_config
from popjax.learners import rlx2, td3
from popjax.learners.base import one_update, polyak
from popjax.networks import sparse
from popjax.population.tree import member, stack
from popjax.rundir import RunDir

SPEC = SPECS["continuous"]


def make(kind="td3", **overrides):
    config_cls, make_fn = {"td3": (rlx2.RLx2TD3Config, rlx2.make_rlx2_td3),
                           "sac": (rlx2.RLx2Config, rlx2.make_rlx2_sac)}[kind]
    config = config_cls(**{"hidden": (32, 32), "batch_size": 16, "dst_interval": 10, "dst_end": 100, "n_step": 1,
                           **overrides})
    return make_fn(config, SPEC), config


def hparams(kind="td3", **values):
    defaults = {"td3": rlx2.default_hparams, "sac": rlx2.default_sac_hparams}[kind]()
    return with_values(defaults, **{"actor_sparsity": 0.8, "critic_sparsity": 0.7, **values})


def batch(i: int = 0):
    return random_batch(jax.random.key(50 + i), SPEC, 16)


def counts_of(state, hp):
    return (rlx2.layer_counts(state.inner.actor, hp.actor_sparsity),
            rlx2.layer_counts(state.inner.critic, hp.critic_sparsity))


def assert_exact_nnz(state, hp):
    actor_counts, critic_counts = counts_of(state, hp)
    np.testing.assert_array_equal(sparse.active_counts(state.actor_mask), actor_counts)
    np.testing.assert_array_equal(sparse.active_counts(state.critic_mask), critic_counts)
    targets = [(getattr(state.inner, t), m) for t, m in (("target_actor", state.actor_mask),
                                                          ("target_critic", state.critic_mask))
               if hasattr(state.inner, t)]  # SAC has no target actor
    for params, mask in [(state.inner.actor, state.actor_mask), (state.inner.critic, state.critic_mask), *targets]:
        for w, m in zip(jax.tree.leaves(params), jax.tree.leaves(mask), strict=True):
            assert not np.asarray(w)[~np.asarray(m)].any()  # exactly 0 where masked


@pytest.mark.long
def test_init_masks_follow_er_and_targets_start_masked():
    learner, _ = make()
    hp = hparams()
    state = learner.init(jax.random.key(0), hp)
    assert_exact_nnz(state, hp)
    # The critic's two Q-nets: the first and hidden layers are sparse, the 1-wide heads saturate to dense.
    _, critic_counts = counts_of(state, hp)
    sizes = np.asarray([i * o for i, o in sparse.kernel_shapes(state.inner.critic)])
    assert (np.asarray(critic_counts) == sizes).tolist() == [False, False, True] * 2
    assert_trees_equal(state.inner.target_actor, state.inner.actor)


@pytest.mark.long
def test_optimizer_sees_only_masked_gradients():  # U4
    learner, _ = make()
    hp = hparams(policy_delay=1)
    state = learner.init(jax.random.key(0), hp)
    new, _ = jax.jit(one_update(learner))(jax.random.key(1), state, batch(), hp)
    assert_exact_nnz(new, hp)
    # From a fresh Adam state, the first moments of masked links stay exactly 0 (their gradients were masked),
    # while the dense gradient of the critic loss is non-zero on those links (what growing reads).
    mu = new.inner.critic_opt.mu  # optax ScaleByAdamState
    for m, mask in zip(jax.tree.leaves(mu), jax.tree.leaves(state.critic_mask), strict=True):
        assert not np.asarray(m)[~np.asarray(mask)].any()
    c = td3.TwinCritic((32, 32))
    a = td3.DeterministicActor((32, 32), SPEC.action_dim)
    y = td3.target_q(jax.random.key(1), a, c, state.inner.target_actor, state.inner.target_critic, batch(), hp)
    grads = jax.grad(lambda p: td3.critic_loss_fn(p, c, batch(), y)[0])(state.inner.critic)
    hidden_grad = np.asarray(grads["params"]["q1"]["Dense_1"]["kernel"])
    hidden_mask = np.asarray(state.critic_mask["params"]["q1"]["Dense_1"]["kernel"])
    assert np.abs(hidden_grad[~hidden_mask]).sum() > 0


@pytest.mark.long
def test_targets_are_masked_polyak_averages():  # U5
    learner, _ = make()
    hp = hparams(policy_delay=1, tau=0.3)
    state = learner.init(jax.random.key(0), hp)
    state = state.replace(inner=state.inner.replace(  # targets that differ from the online nets, as later in training
        target_actor=jax.tree.map(lambda x: x + 0.5, state.inner.target_actor),
        target_critic=jax.tree.map(lambda x: x - 0.25, state.inner.target_critic)))
    new, _ = jax.jit(one_update(learner))(jax.random.key(1), state, batch(), hp)
    want_actor = sparse.apply_masks(polyak(state.inner.target_actor, new.inner.actor, hp.tau), state.actor_mask)
    want_critic = sparse.apply_masks(polyak(state.inner.target_critic, new.inner.critic, hp.tau), state.critic_mask)
    np.testing.assert_allclose(jax.tree.leaves(new.inner.target_actor)[0], jax.tree.leaves(want_actor)[0], rtol=1e-6)
    for got, want in zip(jax.tree.leaves((new.inner.target_actor, new.inner.target_critic)),
                         jax.tree.leaves((want_actor, want_critic)), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)


@pytest.mark.long
@pytest.mark.parametrize("topology", ["rigl", "set"])
def test_topology_steps_keep_exact_nnz_and_change_the_support(topology):  # U2/U3 inside the learner
    learner, config = make(topology=topology)
    hp = hparams(policy_delay=2)
    state = learner.init(jax.random.key(0), hp)
    update, maintain = jax.jit(one_update(learner)), jax.jit(learner.maintain.run)
    start_masks = (state.actor_mask, state.critic_mask)
    fractions = []
    for i in range(40):
        state, _ = update(jax.random.key(i), state, batch(i), hp)
        if (i + 1) % config.dst_interval == 0:
            state, metrics = maintain(jax.random.key(100 + i), state, batch(100 + i), hp)
            fractions.append((float(metrics["critic_drop_fraction"]), float(metrics["actor_drop_fraction"])))
            assert_exact_nnz(state, hp)
    # Critic fraction cos-annealed over its updates (10, 20, 30, 40 of dst_end 100); the actor evolves at every
    # second call (its counter counts actor updates: 10 and 20 of them), with its own annealing.
    zeta = lambda t: 0.25 * (1 + np.cos(np.pi * t / 100))  # noqa: E731
    np.testing.assert_allclose([f[0] for f in fractions], [zeta(10), zeta(20), zeta(30), zeta(40)], rtol=1e-5)
    np.testing.assert_allclose([f[1] for f in fractions], [0.0, zeta(10), 0.0, zeta(20)], rtol=1e-5)
    for before, after in zip(jax.tree.leaves(start_masks), jax.tree.leaves((state.actor_mask, state.critic_mask)),
                             strict=True):
        if not np.asarray(before).all():  # every sparse layer's support moved
            assert (np.asarray(before) != np.asarray(after)).any()


@pytest.mark.long
def test_no_topology_step_after_the_end():  # U3
    learner, _ = make(dst_end=5)
    hp = hparams()
    state = learner.init(jax.random.key(0), hp)
    state = state.replace(inner=state.inner.replace(steps=jnp.int32(10)))
    new, metrics = jax.jit(learner.maintain.run)(jax.random.key(1), state, batch(), hp)
    assert float(metrics["critic_drop_fraction"]) == 0.0
    assert_trees_equal(new, state)


def test_static_sparse_has_no_maintenance():
    learner, _ = make(topology="static")
    assert learner.maintain is None


def member_run(key, hp):
    """Two rounds of 10 updates then a topology step, one member (batches drawn from ``key``)."""
    learner, config = make()

    def one_round(state, round_key):
        def update_once(state, i):
            k = jax.random.fold_in(round_key, i)
            return one_update(learner)(k, state, random_batch(k, SPEC, 16), hp)[0], None

        state, _ = jax.lax.scan(update_once, state, jnp.arange(config.dst_interval))
        k = jax.random.fold_in(round_key, 99)
        return learner.maintain.run(k, state, random_batch(k, SPEC, 16), hp)[0], None

    state, _ = jax.lax.scan(one_round, learner.init(key, hp), jax.random.split(key, 2))
    return state


@pytest.mark.long
def test_vmap_over_members_with_different_sparsities_equals_per_member_runs():  # U9
    hps = [hparams(actor_sparsity=0.5, drop_fraction=0.1), hparams(actor_sparsity=0.9, critic_sparsity=0.95),
           hparams(actor_sparsity=0.95, critic_sparsity=0.5, drop_fraction=0.9, policy_delay=1)]
    keys = jax.random.split(jax.random.key(3), 3)
    batched = jax.jit(jax.vmap(member_run))(keys, stack(hps))
    for m, hp in enumerate(hps):
        single = jax.jit(member_run)(keys[m], hp)
        # Masks (the discrete selections) are identical; weights agree to float rounding (a batched matmul may
        # round differently from an unbatched one).
        assert_trees_equal((member(batched, m).actor_mask, member(batched, m).critic_mask),
                           (single.actor_mask, single.critic_mask))
        assert_trees_close(member(batched, m), single, atol=1e-6, rtol=1e-5)
        assert_exact_nnz(single, hp)


def test_a_changed_sparsity_redraws_masks_of_the_new_size_at_the_next_topology_step():
    learner, _ = make()
    hp = hparams()
    state = learner.init(jax.random.key(0), hp)
    explored = with_values(hp, actor_sparsity=0.95)  # what a PBT explore does to the hparam
    new, _ = jax.jit(learner.maintain.run)(jax.random.key(1), state, batch(), explored)
    assert_exact_nnz(new, explored)
    kernel = np.abs(np.asarray(state.inner.actor["params"]["MLP_0"]["Dense_1"]["kernel"]))
    kept = np.asarray(new.actor_mask["params"]["MLP_0"]["Dense_1"]["kernel"])
    assert kernel[kept].min() >= kernel[~kept].max()  # the largest surviving weights


RUN = dict(learner="rlx2_td3", env="probe:pendulum", pop_size=2, total_env_steps=400, warmup_steps=100,
           rollout_len=10, envs_per_member=2, eval_interval=200, eval_episodes=1, batch_size=16, buffer_size=1000,
           progress=False,
           # dst_end and T0 given: not from the (cut) total; n = 3 from update 100 on, inside the runs
           # the dynamic buffer checks every 100 env steps and shrinks above 150 rows at any distance
           learner_config={"hidden": [16, 16], "dst_interval": 40, "dst_end": 300, "n_step_start": 100,
                           "buffer_check_interval": 100, "buffer_min": 150, "buffer_threshold": 1e-9},
           hparams={"actor_sparsity": [0.6, 0.9], "critic_sparsity": 0.8})


@pytest.mark.long
def test_a_population_trains_with_exact_masks_and_resumes_bit_identically(tmp_path):
    full, resumed = train_cut_and_resume(tmp_path, RUN, cut_env_steps=200)
    assert_trees_equal(resumed.state, full.state)
    learner = full.state.learner
    for m, s in enumerate((0.6, 0.9)):
        state = member(learner, m)
        assert_exact_nnz(state, with_values(rlx2.default_hparams(), actor_sparsity=s, critic_sparsity=0.8))
    assert int(learner.inner.steps[0]) == 300  # topology steps are not updates
    # Checks at 100, 200, 300, 400 env steps, each after adding 100 rows; above 150 rows 10 % go:
    # 100, 200 -> 180, 280 -> 252, 352 -> 317.
    np.testing.assert_array_equal(full.state.buffer.size, [317, 317])


@pytest.mark.long
def test_rows_show_the_latest_topology_steps_drop_fractions(tmp_path):
    # Evaluations at 100 and 300 updates; topology steps every 40 updates, the latest at 80 and 280 (dst_end 300).
    run = popjax.train(out_dir=tmp_path / "run", **RUN)
    rows = [r for r in RunDir(run.out_dir).read_metrics() if r["member"] == 0]
    expected = [float(sparse.drop_fraction(t, 0.5, 300)) for t in (80, 280)]
    np.testing.assert_allclose([r["critic_drop_fraction"] for r in rows], expected, atol=1e-7)


@pytest.mark.long
def test_pbt_exploits_keep_exact_masks(tmp_path):
    # Members start with different actor sparsities; an exploit copies the parent's masks with its sparsity.
    space = {"actor_lr": {"low": 1e-4, "high": 1e-3, "log": True}}
    run = popjax.train(out_dir=tmp_path / "pbt", **{**RUN, "driver": "pbt", "pop_size": 4, "eval_interval": 100,
                                                      "hparams": {"actor_sparsity": [0.5, 0.6, 0.8, 0.9]},
                                                      "pbt": {"interval": 100, "quantile": 0.5,
                                                              "search_space": space}})
    sparsities = np.asarray(run.state.hparams.actor_sparsity).tolist()
    assert sparsities != [0.5, 0.6, 0.8, 0.9]  # exploits happened
    for m in range(4):
        state = member(run.state.learner, m)
        hp = member(run.state.hparams, m)
        assert_exact_nnz(state, hp)


@pytest.mark.parametrize(("change", "field"), [
    ({"hparams": {"actor_sparsity": 1.0}}, "actor_sparsity"),
    ({"hparams": {"critic_sparsity": -0.1}}, "critic_sparsity"),
    ({"hparams": {"drop_fraction": 0.0}}, "drop_fraction"),
    ({"hparams": {"drop_fraction": 1.0}}, "drop_fraction"),
    ({"learner_config": {"dst_interval": 0}}, "learner_config.dst_interval"),
    ({"learner_config": {"dst_interval": 2.5}}, "learner_config.dst_interval"),
    ({"learner_config": {"dst_interval": 5}}, "learner_config.dst_interval"),  # shorter than K = 20 updates
    ({"env": "probe:cartpole"}, "env: rlx2_td3 needs continuous actions"),
    ({"learner_config": {"n_step": 0}}, "learner_config.n_step"),
    ({"learner_config": {"n_step": 500}}, "learner_config.n_step: 500 is longer than the episode limit"),
    ({"buffer_size": 999}, "buffer_size: multi-step windows"),
    ({"driver": "hts", "env": "gym:Pendulum-v1"}, "learner: rlx2_td3 needs multi-step windows"),
])
def test_bad_input_is_one_line_naming_the_field(change, field, tmp_path):
    options = {**RUN, **change}
    with pytest.raises(ConfigError) as error:
        config = make_config(**{k: v for k, v in options.items() if k != "progress"})
        popjax.train(config=config, out_dir=tmp_path / "run")
    assert field in str(error.value) and "\n" not in str(error.value)
    assert not (tmp_path / "run").exists()


def test_tiny_matches_the_sparse_parameter_count():
    width = rlx2.tiny_hidden(17, 6, 2, 0.9)
    shapes = lambda w: [(17, w), (w, w), (w, 6)]  # noqa: E731
    target = 0.1 * sparse.model_size(shapes(256), [1, 1, 1])
    assert sparse.model_size(shapes(width), [1, 1, 1]) <= target < sparse.model_size(shapes(width + 1), [1, 1, 1])


def test_costs_against_hand_counts():  # U8 through the learner: sizes and FLOPs in summary.json
    _, config = make()
    hp = jax.tree.map(lambda x: np.asarray([x, x]), hparams())
    hp = hp.replace(actor_sparsity=np.asarray([0.0, 0.9], np.float32), policy_delay=np.asarray([2, 2], np.int32))
    costs = rlx2.costs(config, SPEC, hp)
    # Dense member: actor 3 -> 32 -> 32 -> 2, each Q-net 5 -> 32 -> 32 -> 1 (hand counts).
    f_actor = 5 * 32 + 63 * 32 + 63 * 2
    f_q = 9 * 32 + 63 * 32 + 63 * 1
    assert costs["inference_flops"][0] == f_actor
    assert costs["actor_weights"][0] == 3 * 32 + 32 * 32 + 32 * 2
    critic_dense = 2 * (5 * 32 + 32 * 32 + 32)
    assert costs["train_flops_reduction"][0] != 1.0  # the critic is 70 % sparse in both members
    assert costs["actor_weights"][1] == pytest.approx(0.1 * costs["actor_weights"][0], rel=1e-5)
    assert costs["critic_weights"][0] == pytest.approx(0.3 * critic_dense, rel=1e-5)
    dense_train = 16 * (f_actor + 8 * f_q) + 16 * (3 * f_actor + f_q) / 2
    assert costs["train_flops"][0] * costs["train_flops_reduction"][0] == pytest.approx(dense_train)
    assert costs["inference_flops_reduction"][1] > 5


@pytest.mark.long
def test_multi_step_target_by_hand():  # U6: termination and truncation inside the window, and n = 1 before T0
    actor, critic = td3.DeterministicActor((8,), SPEC.action_dim), td3.TwinCritic((8,))
    key_init = jax.random.split(jax.random.key(0))
    ta = actor.init(key_init[0], jnp.zeros((1, 3)))
    tc = critic.init(key_init[1], jnp.zeros((1, 3)), jnp.zeros((1, 2)))
    hp = with_values(rlx2.default_hparams(), discount=0.5)
    obs = jax.random.normal(jax.random.key(1), (4, 3, 3))
    next_obs = jax.random.normal(jax.random.key(2), (4, 3, 3))
    reward = jnp.broadcast_to(jnp.asarray([1.0, 2.0, 4.0]), (4, 3))
    # row 0: no end; row 1: truncated at step 1; row 2: terminated at step 1; row 3: terminated at step 0
    ended = jnp.asarray([[0, 0, 0], [0, 1, 0], [0, 1, 0], [1, 0, 0]], bool)
    terminated = jnp.asarray([[0, 0, 0], [0, 0, 0], [0, 1, 0], [1, 0, 0]], jnp.float32)
    windows = rlx2.Windows(td3.Transition(obs=obs, action=jnp.zeros((4, 3, 2)), reward=reward, next_obs=next_obs,
                                          terminated=terminated), ended)
    key = jax.random.key(3)

    def bootstrap(step_per_row):  # Q'(s'_k, noisy pi'(s'_k)) of each row's step k, with the target's noise draw
        rows = td3.Transition(obs=obs[jnp.arange(4), step_per_row], action=jnp.zeros((4, 2)),
                              reward=jnp.zeros(4), next_obs=next_obs[jnp.arange(4), step_per_row],
                              terminated=jnp.zeros(4))
        return np.asarray(td3.target_q(key, actor, critic, ta, tc, rows, with_values(hp, discount=1.0)))

    q = bootstrap(jnp.asarray([2, 1, 1, 0]))
    want = [1 + 0.5 * 2 + 0.25 * 4 + 0.125 * q[0], 1 + 0.5 * 2 + 0.25 * q[1], 1 + 0.5 * 2, 1.0]
    got = rlx2.multi_step_target(key, actor, critic, ta, tc, windows, hp, jnp.int32(3))
    np.testing.assert_allclose(got, want, rtol=1e-6)
    q0 = bootstrap(jnp.zeros(4, jnp.int32))
    want_one = [1 + 0.5 * q0[0], 1 + 0.5 * q0[1], 1 + 0.5 * q0[2], 1.0]
    np.testing.assert_allclose(rlx2.multi_step_target(key, actor, critic, ta, tc, windows, hp, jnp.int32(1)),
                               want_one, rtol=1e-6)


@pytest.mark.long
def test_windows_are_consecutive_steps_of_one_env_and_never_cross_the_write_position():
    from popjax.buffers import make_uniform_buffer, sample_windows
    envs, capacity = 2, 12
    buffer = make_uniform_buffer(capacity, 4)
    state = buffer.init(jnp.zeros((2,), jnp.int32))  # rows hold (t, env)
    for t0 in range(0, 10, 2):  # 5 adds of 2 steps x 2 envs: 20 rows into 12, so the ring has wrapped
        t = jnp.repeat(jnp.arange(t0, t0 + 2), envs)
        state = buffer.add(state, jnp.stack([t, jnp.tile(jnp.arange(envs), 2)], axis=1))
    windows = np.asarray(sample_windows(jax.random.key(0), state, 4000, 3, envs))
    assert windows.shape == (4000, 3, 2)
    assert (windows[:, :, 1] == windows[:, :1, 1]).all()  # one env per window
    assert (np.diff(windows[:, :, 0], axis=1) == 1).all()  # consecutive steps
    assert windows[:, 0, 0].min() == 4 and windows[:, -1, 0].max() == 9  # only the 12 newest rows (t 4..9)


def test_dynamic_buffer_distance_and_shrink_by_hand():  # U7
    learner, config = make(buffer_threshold=0.2, buffer_min=100)
    hp = hparams()
    state = learner.init(jax.random.key(0), hp)
    rows = random_batch(jax.random.key(1), SPEC, 16)
    valid = jnp.arange(16) < 12  # four of the oldest slots not filled yet
    count, distance = learner.shrink.run(state, rows, valid, jnp.int32(500), hp)
    pi = np.asarray(learner.policy(state, rows.obs))
    want = 0.5 * np.mean(((pi - np.asarray(rows.action)) ** 2)[:12])
    assert float(distance) == pytest.approx(want, rel=1e-5) and want > 0.2
    assert int(count) == 50  # floor(0.1 * 500), once
    assert int(learner.shrink.run(state, rows, valid, jnp.int32(100), hp)[0]) == 0  # not above buffer_min
    close = rows.replace(action=jnp.asarray(pi))  # stored actions equal to today's policy: distance 0
    assert int(learner.shrink.run(state, close, valid, jnp.int32(500), hp)[0]) == 0


@pytest.mark.long
def test_a_shrunk_buffer_samples_only_its_newest_rows():
    from popjax.buffers import drop_oldest, make_uniform_buffer, oldest_items
    buffer = make_uniform_buffer(10, 2000)
    state = buffer.add(buffer.init(jnp.zeros((), jnp.int32)), jnp.arange(7))
    state = drop_oldest(state, jnp.int32(3))
    assert set(np.asarray(buffer.sample(jax.random.key(0), state)).tolist()) == {3, 4, 5, 6}
    items, valid = oldest_items(state, 6)
    np.testing.assert_array_equal(items[np.asarray(valid)], [3, 4, 5, 6])
    state = drop_oldest(buffer.add(state, jnp.arange(7, 14)), jnp.int32(2))  # wrapped: rows 10..13 overwrote 0..3
    assert set(np.asarray(buffer.sample(jax.random.key(1), state)).tolist()) == set(range(6, 14))


@pytest.mark.long
def test_export_writes_the_compact_actor_that_acts_like_the_trained_one(tmp_path):
    from popjax import cli
    from popjax.export import load_policy, read_meta

    run = popjax.train(out_dir=tmp_path / "run", **{**RUN, "total_env_steps": 200})
    path = tmp_path / "actor.npz"
    assert cli.main(["export", str(tmp_path / "run"), "--member", "1", "--out", str(path)]) == 0
    meta = read_meta(path)
    assert meta["member"] == 1 and meta["obs_size"] == 3 and meta["action_size"] == 1
    state = member(run.state.learner, 1)
    # Only non-zero links are kept (a link grown this step is active at exactly 0 and contributes nothing).
    kernels = [np.asarray(x) for x in jax.tree.leaves(state.inner.actor) if np.ndim(x) == 2]
    assert meta["active_weights"] == sum(np.count_nonzero(k) for k in kernels) < sum(k.size for k in kernels)
    obs = np.asarray(jax.random.normal(jax.random.key(0), (5, 3)))
    learner, _ = rlx2.make_rlx2_td3(rlx2.RLx2TD3Config(hidden=(16, 16)), popjax.envs.registry.env_spec(
        "probe:pendulum")), None
    np.testing.assert_allclose(load_policy(path)(obs), np.asarray(learner.policy(state, obs)), atol=1e-6)
    before = path.read_bytes()
    assert cli.main(["export", str(tmp_path / "run"), "--member", "1", "--out", str(path)]) == 2  # never overwrites
    assert path.read_bytes() == before
    assert cli.main(["export", str(tmp_path / "run"), "--member", "7", "--out", str(tmp_path / "x.npz")]) == 2
    assert not (tmp_path / "x.npz").exists()


@pytest.mark.long
def test_sparse_inference_bench_checks_outputs_and_writes_its_fields(tmp_path):
    from popjax_bench import sparse_inference

    payload = sparse_inference.run(out_dir=tmp_path, sparsity_percent=(90,), batch=(1, 8), hidden=(32, 32),
                                   repeats=10, min_time=0.0, allow_busy=True, plot=False)
    rows = payload["results"]
    assert {(r["impl"], r["batch"]) for r in rows} == {(i, b) for i in sparse_inference.IMPLS for b in (1, 8)}
    assert all(r["max_abs_error"] < 1e-5 for r in rows)
    dense = {r["batch"]: r["median_s"] for r in rows if r["impl"] == "dense"}
    assert all(r["speedup"] == pytest.approx(dense[r["batch"]] / r["median_s"]) for r in rows)
    assert rows[0]["flops_reduction"] > 5 and (tmp_path / "sparse_inference.json").exists()


@pytest.mark.long
def test_sac_multi_step_target_by_hand():  # U6, SAC form: entropy terms at the next states inside the window
    from popjax.learners import sac as sac_module

    core = sac_module.sac_core(sac_module.SACConfig(hidden=(8,)), SPEC)
    sample = functools.partial(sac_module.sample_action, core.actor_net)
    keys = jax.random.split(jax.random.key(0))
    actor = core.actor_net.init(keys[0], jnp.zeros((1, 3)))
    target_critic = core.critic_net.init(keys[1], jnp.zeros((1, 3)), jnp.zeros((1, 2)))
    hp = with_values(rlx2.default_sac_hparams(), discount=0.5, reward_scale=2.0)
    alpha = jnp.float32(0.3)
    next_obs = jax.random.normal(jax.random.key(2), (3, 3, 3))
    reward = jnp.broadcast_to(jnp.asarray([1.0, 2.0, 4.0]), (3, 3))
    ended = jnp.asarray([[0, 0, 0], [0, 1, 0], [0, 1, 0]], bool)  # none; truncated at 1; terminated at 1
    terminated = jnp.asarray([[0, 0, 0], [0, 0, 0], [0, 1, 0]], jnp.float32)
    windows = rlx2.Windows(td3.Transition(obs=jnp.zeros((3, 3, 3)), action=jnp.zeros((3, 3, 2)), reward=reward,
                                          next_obs=next_obs, terminated=terminated), ended)
    key = jax.random.key(3)
    actions, log_probs = sample(key, actor, next_obs)  # the draws the target makes, [3, 3, 2] and [3, 3]
    q = lambda b, k: float(core.critic_net.apply(target_critic, next_obs[b, k][None],  # noqa: E731
                                                 actions[b, k][None]).min(axis=0)[0])
    lp = np.asarray(log_probs)
    want = [2 * (1 + 0.5 * 2 + 0.25 * 4) - 0.3 * (0.5 * lp[0, 0] + 0.25 * lp[0, 1])
            + 0.125 * (q(0, 2) - 0.3 * lp[0, 2]),
            2 * (1 + 0.5 * 2) - 0.3 * 0.5 * lp[1, 0] + 0.25 * (q(1, 1) - 0.3 * lp[1, 1]),
            2 * (1 + 0.5 * 2) - 0.3 * 0.5 * lp[2, 0]]
    got = rlx2.sac_multi_step_target(key, sample, target_critic, core.critic_net, actor, windows, alpha, hp,
                                     jnp.int32(3))
    np.testing.assert_allclose(got, want, rtol=1e-5)


@pytest.mark.long
def test_rlx2_sac_keeps_exact_masks_through_updates_and_topology_steps():
    learner, config = make("sac", n_step=3, n_step_start=5)
    hp = hparams("sac")
    state = learner.init(jax.random.key(0), hp)
    assert_exact_nnz(state, hp)
    update, maintain = jax.jit(one_update(learner)), jax.jit(learner.maintain.run)
    windows = lambda i: rlx2.Windows(  # noqa: E731
        jax.tree.map(lambda x: jnp.stack([x, x, x], axis=1), batch(i)), jnp.zeros((16, 3), bool))
    start = (state.actor_mask, state.critic_mask)
    for i in range(20):
        state, metrics = update(jax.random.key(i), state, windows(i), hp)
        if (i + 1) % config.dst_interval == 0:
            state, _ = maintain(jax.random.key(100 + i), state, windows(100 + i), hp)
        assert_exact_nnz(state, hp)
    assert np.isfinite(float(metrics["critic_loss"]))
    moved = [(np.asarray(a) != np.asarray(b)).any() for a, b in
             zip(jax.tree.leaves(start), jax.tree.leaves((state.actor_mask, state.critic_mask)), strict=True)]
    assert any(moved)  # the actor evolves at every call (SAC updates it at every step)


@pytest.mark.long
def test_rlx2_sac_population_run_with_costs(tmp_path):
    run = popjax.train(out_dir=tmp_path / "sac", **{**RUN, "learner": "rlx2_sac", "total_env_steps": 300})
    for m, sparsity in enumerate((0.6, 0.9)):
        assert float(run.state.hparams.actor_sparsity[m]) == pytest.approx(sparsity)
        assert_exact_nnz(member(run.state.learner, m), member(run.state.hparams, m))
    costs = run.summary["costs"]
    assert costs["size_reduction"][1] > costs["size_reduction"][0] > 1
