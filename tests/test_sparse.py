"""Sparse-layer mechanics of RLx2 (Tan et al., ICLR 2023): allocation, masks, drop/grow, schedule, FLOPs."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from popjax.networks import sparse
from popjax.networks.mlp import DeterministicActor


def td3_shapes(obs, act, hidden=256):
    actor = [(obs, hidden), (hidden, hidden), (hidden, act)]
    q = [(obs + act, hidden), (hidden, hidden), (hidden, 1)]
    return actor, q + q  # the critic's two Q-nets are allocated jointly


# Per-layer sparsities of the ER allocation worked out by hand from the paper's App. B formula (hidden 256).
ER_TABLE = [
    ((17, 6), 0.90, [0.552, 0.944, 0.0], [0.586, 0.932, 0.0]),
    ((17, 6), 0.95, [0.786, 0.973, 0.418], [0.801, 0.967, 0.0]),
    ((17, 6), 0.98, [0.914, 0.989, 0.767], [0.929, 0.988, 0.0]),
    ((11, 3), 0.90, [0.252, 0.938, 0.0], [0.356, 0.933, 0.0]),
    ((11, 3), 0.98, [0.874, 0.990, 0.551], [0.891, 0.989, 0.0]),
    ((111, 8), 0.90, [0.889, 0.933, 0.0], [0.870, 0.917, 0.0]),
    ((376, 17), 0.90, [0.923, 0.908, 0.264], [0.909, 0.890, 0.0]),
]


@pytest.mark.long
@pytest.mark.parametrize(("dims", "target", "actor_s", "q_s"), ER_TABLE)
def test_er_allocation_matches_the_worked_table(dims, target, actor_s, q_s):  # U1
    actor, critic = td3_shapes(*dims)
    a = 1 - np.asarray(sparse.er_densities(actor, target))
    c = 1 - np.asarray(sparse.er_densities(critic, target))
    np.testing.assert_allclose(a, actor_s, atol=1e-3)
    np.testing.assert_allclose(c[:3], q_s, atol=1e-3)
    np.testing.assert_array_equal(c[:3], c[3:])  # Q1 and Q2 get the same allocation
    # Saturated layers come out exactly dense, and the total kept matches (1 - S) of all weights.
    assert (a == 0).sum() == actor_s.count(0.0)
    for shapes, dens in ((actor, 1 - a), (critic, 1 - c)):
        total = sum(i * o for i, o in shapes)
        assert sparse.model_size(shapes, dens) == pytest.approx((1 - target) * total, rel=1e-5)


def test_dense_weight_counts():  # U1: the dense counts the table is relative to
    for dims, actor_n, critic_n in (((17, 6), 71_424, 143_360), ((11, 3), 69_120, 138_752),
                                    ((111, 8), 96_000, 192_512), ((376, 17), 166_144, 332_800)):
        actor, critic = td3_shapes(*dims)
        assert sparse.model_size(actor, np.ones(3)) == actor_n
        assert sparse.model_size(critic, np.ones(6)) == critic_n


def test_kept_counts_floor_the_masked_entries():
    shapes = [(10, 10), (10, 3)]
    counts = np.asarray(sparse.kept_counts(shapes, jnp.asarray([0.255, 1.0])))
    np.testing.assert_array_equal(counts, [100 - int(0.745 * 100), 30])


@pytest.mark.long
def test_keep_largest_with_traced_count_and_stable_ties():
    scores = jnp.asarray([[3.0, 1.0, 3.0], [0.0, 5.0, -1.0]])
    picked = jax.jit(sparse.keep_largest)(scores, jnp.int32(3))
    np.testing.assert_array_equal(picked, [[True, False, True], [False, True, False]])
    # Ties go to the lower flat index: of the two 3.0s only the first is among the top 2.
    np.testing.assert_array_equal(sparse.keep_largest(scores, 2), [[True, False, False], [False, True, False]])
    assert not sparse.keep_largest(scores, 0).any()


def drop_grow_case():
    weight = jnp.asarray([[0.0, -0.9, 0.0, 0.2], [0.5, 0.0, 0.0, -0.1]])
    mask = jnp.asarray([[True, True, False, True], [True, False, False, True]])  # 5 active, one of them 0.0
    grad = jnp.asarray([[9.0, 0.1, 0.3, 0.2], [0.1, 7.0, 0.4, 8.0]])
    return weight, mask, grad


@pytest.mark.long
def test_drop_and_grow_by_hand():  # U2
    weight, mask, grad = drop_grow_case()
    new_w, new_m = sparse.drop_and_grow(weight, mask, grad, 0.5)
    # n_drop = floor(5 * 0.5) = 2: the active 0.0 at (0, 0) and -0.1 at (1, 3) (smallest |w| among active links).
    # Grow the 2 largest |grad| outside the kept set {(0,1), (0,3), (1,0)}: (0,0) 9.0 and (1,3) 8.0, i.e. the two
    # just-dropped links, regrown in place with their old values.
    np.testing.assert_array_equal(new_m, mask)
    np.testing.assert_array_equal(new_w, weight)
    # With forbid_regrow the dropped links are excluded: grow (1,1) 7.0 and (1,2) 0.4, both new, so 0.
    new_w, new_m = sparse.drop_and_grow(weight, mask, grad, 0.5, forbid_regrow=True)
    np.testing.assert_array_equal(new_m, [[False, True, False, True], [True, True, True, False]])
    np.testing.assert_array_equal(new_w, np.float32([[0.0, -0.9, 0.0, 0.2], [0.5, 0.0, 0.0, 0.0]]))


@pytest.mark.long
def test_drop_and_grow_new_links_start_at_zero_and_nnz_is_kept():  # U2 (forbid_regrow: every grown link is new)
    key = jax.random.PRNGKey(0)
    weight = jax.random.normal(key, (32, 16))
    mask = sparse.keep_largest(jax.random.uniform(jax.random.PRNGKey(1), weight.shape), 100)
    weight = jnp.where(mask, weight, 0.0)
    grad = jax.random.normal(jax.random.PRNGKey(2), weight.shape)
    new_w, new_m = sparse.drop_and_grow(weight, mask, jnp.abs(grad), 0.3, forbid_regrow=True)
    assert int(new_m.sum()) == 100
    kept = mask & new_m
    grown = new_m & ~mask
    assert int(grown.sum()) == 30
    np.testing.assert_array_equal(new_w[grown], 0.0)
    np.testing.assert_array_equal(new_w[kept], weight[kept])
    np.testing.assert_array_equal(new_w[~new_m], 0.0)
    # The dropped links are the 30 smallest |w| among the active ones.
    dropped = mask & ~new_m
    active_abs = np.sort(np.abs(np.asarray(weight))[np.asarray(mask)])
    np.testing.assert_allclose(np.sort(np.abs(np.asarray(weight))[np.asarray(dropped)]), active_abs[:30])
    # The grown links are the 30 largest |grad| among the links inactive before the step.
    outside = np.abs(np.asarray(grad))[~np.asarray(mask)]
    np.testing.assert_allclose(np.sort(np.abs(np.asarray(grad))[np.asarray(grown)]), np.sort(outside)[-30:])


def test_drop_fraction_schedule():  # U3
    assert float(sparse.drop_fraction(0, 0.5, 1000)) == pytest.approx(0.5)
    assert float(sparse.drop_fraction(500, 0.5, 1000)) == pytest.approx(0.25)
    assert float(sparse.drop_fraction(1000, 0.5, 1000)) == 0.0
    assert float(sparse.drop_fraction(5000, 0.5, 1000)) == 0.0
    # The worked values for the paper's run: t = 1e6 of T_end = 2.975e6 -> 0.373.
    assert float(sparse.drop_fraction(1e6, 0.5, 2.975e6)) == pytest.approx(0.373, abs=1e-3)


def test_flops_and_size_of_a_toy_net():  # U8
    shapes = [(4, 8), (8, 8), (8, 2)]
    dens = [0.5, 0.25, 1.0]
    assert sparse.model_size(shapes, dens) == 0.5 * 32 + 0.25 * 64 + 16
    assert sparse.forward_flops(shapes, dens) == 0.5 * 7 * 8 + 0.25 * 15 * 8 + 15 * 2
    fa, fc = 100.0, 40.0
    assert sparse.train_flops(fa, fc, 256, 2, "td3") == 256 * ((fa + 8 * fc) + (3 * fa + fc) / 2)
    assert sparse.train_flops(fa, fc, 256, 1, "sac") == 256 * ((2 * fa + 8 * fc) + (3 * fa + 2 * fc))


def init_actor(key):
    net = DeterministicActor((64, 64), 3)
    return net.init(key, jnp.zeros((1, 11)))


def member_masks(key, sparsity):
    params = init_actor(key)
    counts = sparse.kept_counts(sparse.kernel_shapes(params), sparse.er_densities(sparse.kernel_shapes(params),
                                                                                    sparsity))
    masks = sparse.magnitude_masks(params, counts)
    return sparse.apply_masks(params, masks), masks, counts


def member_evolve(key, sparsity, fraction):
    params, masks, counts = member_masks(key, sparsity)
    scores = jax.tree.map(lambda p: jnp.abs(jax.random.normal(jax.random.fold_in(key, 7), p.shape)), params)
    evolving = counts < jnp.asarray([i * o for i, o in sparse.kernel_shapes(params)])
    params, masks = sparse.evolve(params, masks, scores, fraction, evolving)
    return params, masks, sparse.active_counts(masks), counts


@pytest.mark.long
def test_magnitude_masks_keep_exact_counts_and_the_largest_weights():
    params = init_actor(jax.random.PRNGKey(3))
    shapes = sparse.kernel_shapes(params)
    assert shapes == [(11, 64), (64, 64), (64, 3)]
    counts = sparse.kept_counts(shapes, sparse.er_densities(shapes, 0.9))
    masks = sparse.magnitude_masks(params, counts)
    np.testing.assert_array_equal(sparse.active_counts(masks), counts)
    kernel = np.abs(np.asarray(params["params"]["MLP_0"]["Dense_0"]["kernel"]))
    m = np.asarray(masks["params"]["MLP_0"]["Dense_0"]["kernel"])
    assert kernel[m].min() >= kernel[~m].max()
    assert np.asarray(masks["params"]["MLP_0"]["Dense_0"]["bias"]).all()  # biases stay dense


@pytest.mark.long
def test_vmap_over_members_with_different_sparsities_equals_per_member():  # U9
    keys = jax.random.split(jax.random.PRNGKey(4), 3)
    sparsities = jnp.asarray([0.5, 0.9, 0.98])
    fractions = jnp.asarray([0.1, 0.5, 0.3])
    batched = jax.jit(jax.vmap(member_evolve))(keys, sparsities, fractions)
    for m in range(3):
        single = jax.jit(member_evolve)(keys[m], sparsities[m], fractions[m])
        for got, want in zip(jax.tree.leaves(batched), jax.tree.leaves(single), strict=True):
            np.testing.assert_array_equal(got[m], want)
        np.testing.assert_array_equal(single[2], single[3])  # evolution kept every layer's nnz exactly
    assert len({tuple(np.asarray(batched[3][m]).tolist()) for m in range(3)}) == 3  # the members really differ
