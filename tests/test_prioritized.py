"""Prioritized replay: K-ary sum tree (tests Q1-Q4), banks (B1), the buffer API, vmap over members."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from popjax.buffers import make_prioritized_buffer, per_hyperparams
from popjax.buffers.prioritized import (
    importance_weights,
    priority_from_td,
    tree_find,
    tree_from_leaves,
    tree_init,
    tree_leaves,
    tree_sample,
    tree_total,
    tree_update,
)
from popjax.types import EnvSpec, Transition, dummy_transition

SPEC = EnvSpec("test", (2,), action_dim=1, action_low=(-1.0,), action_high=(1.0,))
BRANCHINGS = [2, 4, 16]
CAPACITIES = [1, 5, 16, 37, 100, 257]  # powers and non-powers of every branching
HYP = settings(max_examples=25, deadline=None)

find = jax.jit(tree_find)
update = jax.jit(tree_update)


def tree_with(leaves, branching):
    """A tree whose first len(leaves) leaves are set through the batched update."""
    leaves = np.asarray(leaves, np.float32)
    return update(tree_init(len(leaves), branching), jnp.arange(len(leaves)), jnp.asarray(leaves))


def rows(start, n):
    """n transitions whose reward encodes their insertion index."""
    r = jnp.arange(start, start + n, dtype=jnp.float32)
    return Transition(obs=jnp.stack([r, r], 1), action=r[:, None], reward=r, next_obs=jnp.stack([r, r], 1),
                      terminated=jnp.zeros(n))


# ------------------------------------------------------------------------------------------------------ sum tree


@pytest.mark.long
@HYP
@given(branching=st.sampled_from(BRANCHINGS), capacity=st.sampled_from(CAPACITIES), data=st.data())
def test_find_matches_numpy_searchsorted_oracle(branching, capacity, data):
    # Integer priorities and half-integer targets keep fp32 exact, so the descent must equal the oracle exactly.
    priorities = np.array(data.draw(st.lists(st.integers(0, 5), min_size=capacity, max_size=capacity)), np.float32)
    priorities[data.draw(st.integers(0, capacity - 1))] = 1.0  # a positive total
    total = int(priorities.sum())
    targets = np.array(data.draw(st.lists(st.integers(0, total - 1), min_size=1, max_size=64)), np.float32) + 0.5
    tree = tree_with(priorities, branching)
    expected = np.searchsorted(np.cumsum(priorities), targets, side="right")
    np.testing.assert_array_equal(find(tree, jnp.asarray(targets)), expected)
    assert float(tree_total(tree)) == total


@pytest.mark.parametrize("branching", BRANCHINGS)
@pytest.mark.parametrize("alpha", [0.0, 0.6, 1.0])
def test_q1_sampled_histogram_matches_priorities_to_the_alpha(branching, alpha):
    rng = np.random.default_rng(int(alpha * 10) + branching)
    td = rng.uniform(0.0, 3.0, 37).astype(np.float32)
    leaves = np.array(priority_from_td(jnp.asarray(td), alpha, 1e-6))
    leaves[[3, 20]] = 0.0  # rows not yet written stay at 0 whatever alpha is
    tree = tree_with(leaves, branching)
    indices, probabilities = jax.jit(tree_sample, static_argnums=2)(jax.random.key(7), tree, 1_000_000)
    counts = np.bincount(np.asarray(indices), minlength=tree.levels[-1].shape[0])
    expected = leaves.astype(np.float64) / leaves.sum(dtype=np.float64)
    assert counts[37:].sum() == 0 and counts[[3, 20]].sum() == 0
    positive = expected > 0
    _, p_value = stats.chisquare(counts[:37][positive], 1_000_000 * expected[positive])
    assert p_value > 1e-3
    np.testing.assert_allclose(probabilities, expected[np.asarray(indices)], rtol=1e-5)


@pytest.mark.long
@HYP
@given(branching=st.sampled_from(BRANCHINGS), capacity=st.sampled_from(CAPACITIES[1:]), data=st.data())
def test_q2_zero_priority_and_padded_leaves_are_never_sampled(branching, capacity, data):
    magnitudes = st.one_of(st.just(0.0), st.floats(2.0**-20, 2.0**20, width=32))
    priorities = np.array(data.draw(st.lists(magnitudes, min_size=capacity, max_size=capacity)), np.float32)
    priorities[data.draw(st.integers(0, capacity - 1))] = data.draw(st.floats(2.0**-10, 2.0**10, width=32))
    tree = tree_with(priorities, branching)
    total = np.float32(tree_total(tree))
    # Upper edge: the total itself, just above it (fp32 overshoot), and the largest uniform draw times the total.
    edges = [0.0, total, np.nextafter(total, np.float32(np.inf)), np.float32(np.nextafter(np.float32(1), 0) * total)]
    targets = np.concatenate([np.asarray(edges, np.float32), np.random.default_rng(0).uniform(0, total, 4096)])
    picked = np.asarray(find(tree, jnp.asarray(targets, jnp.float32)))
    leaves = np.asarray(tree.levels[-1])
    assert (picked < capacity).all() and (leaves[picked] > 0).all()


def test_q2_upper_edge_lands_on_the_last_positive_leaf():
    tree = tree_with([0.0, 2.0, 1.0, 0.0, 0.0], 4)  # trailing zeros, then padding up to 8 leaves
    np.testing.assert_array_equal(find(tree, jnp.array([0.0, 3.0, 3.5, 1e9])), [1, 2, 2, 2])


@pytest.mark.long
@HYP
@given(branching=st.sampled_from(BRANCHINGS), capacity=st.sampled_from(CAPACITIES), data=st.data())
def test_q3_root_is_sum_of_leaves_after_updates_with_duplicates(branching, capacity, data):
    tree = tree_init(capacity, branching)
    reference = np.zeros(capacity)
    for _ in range(data.draw(st.integers(1, 4))):
        indices = data.draw(st.lists(st.integers(0, capacity - 1), min_size=32, max_size=32))  # repeats likely
        values = data.draw(st.lists(st.floats(0, 100, width=32), min_size=len(indices), max_size=len(indices)))
        tree = update(tree, jnp.asarray(indices), jnp.asarray(values, jnp.float32))
        for i, v in zip(indices, values, strict=True):
            reference[i] = v  # the last write of a duplicated index wins
    np.testing.assert_array_equal(tree_leaves(tree, capacity), reference.astype(np.float32))
    np.testing.assert_allclose(float(tree_total(tree)), reference.sum(), rtol=1e-5, atol=1e-5)
    # Every parent equals the rebuild from its children, bit for bit, and recomputing again changes nothing.
    chex.assert_trees_all_equal(tree, tree_from_leaves(tree.levels[-1], branching))
    everything = jnp.arange(capacity)
    chex.assert_trees_all_equal(tree, update(tree, everything, tree_leaves(tree, capacity)))


def test_update_touches_only_the_written_paths():
    tree = tree_with(np.arange(1.0, 17.0), 4)
    tree = update(tree, jnp.array([5, 5]), jnp.array([100.0, 0.0]))
    assert float(tree.levels[-1][5]) == 0.0  # last write wins
    assert float(tree_total(tree)) == sum(range(1, 17)) - 6
    np.testing.assert_array_equal(tree.levels[1], [1 + 2 + 3 + 4, 5 + 7 + 8, 9 + 10 + 11 + 12, 13 + 14 + 15 + 16])


def test_tree_shapes_pad_to_a_power_of_the_branching():
    tree = tree_init(37, 4)
    assert [level.shape[0] for level in tree.levels] == [1, 4, 16, 64]
    assert tree_leaves(tree, 37).shape == (37,)
    with pytest.raises(ValueError, match="branching"):
        tree_init(10, 1)


# --------------------------------------------------------------------------------------------------- IS weights


def test_q4_importance_weights():
    probabilities = jnp.array([0.5, 0.25, 0.125, 0.125])
    for beta in [0.0, 0.4, 1.0]:
        w = np.asarray(importance_weights(probabilities, 10, beta))
        raw = (10 * np.asarray(probabilities, np.float64)) ** -beta
        np.testing.assert_allclose(w, raw / raw.max(), rtol=1e-6)
        assert w.max() == 1.0
    np.testing.assert_allclose(importance_weights(probabilities, 10, 1.0), [0.25, 0.5, 1.0, 1.0])
    # batched over banks: the max is taken per bank (last axis)
    w = importance_weights(jnp.stack([probabilities, probabilities / 2]), jnp.array([[10], [20]]), 0.4)
    np.testing.assert_allclose(w.max(axis=-1), [1.0, 1.0])


def test_priority_from_td_is_abs_plus_eps_to_the_alpha():
    td = jnp.array([-2.0, 0.0, 3.0])
    np.testing.assert_allclose(priority_from_td(td, 0.6, 1e-6), (np.abs(td) + 1e-6) ** 0.6, rtol=1e-6)
    np.testing.assert_array_equal(priority_from_td(td, 0.0, 1e-6), [1.0, 1.0, 1.0])
    assert float(priority_from_td(jnp.array(0.0), 1.0, 1e-6)) > 0  # eps keeps zero-error rows sampleable


# -------------------------------------------------------------------------------------------------------- buffer


@pytest.mark.long
def test_circular_insertion_size_tracking_and_new_rows_at_max_priority():
    buf = make_prioritized_buffer(capacity=5, batch_size=2, branching=2)
    state = buf.init(dummy_transition(SPEC))
    state = buf.add(state, rows(0, 3))
    assert state.size.tolist() == [3] and state.insert_pos.tolist() == [3]
    np.testing.assert_array_equal(tree_leaves(jax.tree.map(lambda x: x[0], state.tree), 5), [1, 1, 1, 0, 0])
    state = buf.update(state, jnp.array([[0, 1]]), jnp.array([4.0, 0.0]))
    max_p = float(priority_from_td(jnp.array(4.0), 0.6, 1e-6))
    assert float(state.max_priority[0]) == pytest.approx(max_p)
    state = buf.add(state, rows(3, 4))  # rows 3..6 at positions 3, 4, 0, 1
    assert state.size.tolist() == [5] and state.insert_pos.tolist() == [2]
    np.testing.assert_array_equal(state.data.reward[0], [5, 6, 2, 3, 4])
    leaves = np.array(tree_leaves(jax.tree.map(lambda x: x[0], state.tree), 5))
    np.testing.assert_allclose(leaves, [max_p, max_p, 1, max_p, max_p], rtol=1e-6)


@pytest.mark.long
def test_samples_only_valid_rows_and_priorities_drive_sampling():
    buf = make_prioritized_buffer(capacity=64, batch_size=256)
    state = buf.init(dummy_transition(SPEC))
    state = buf.add(state, rows(1, 4))
    assert not bool(buf.can_sample(state))
    batch, info = buf.sample(jax.random.key(0), state)
    assert batch.reward.shape == (256,) and info.indices.shape == (1, 256)
    assert set(np.asarray(batch.reward).tolist()) <= {1.0, 2.0, 3.0, 4.0}
    state = buf.update(state, jnp.array([[0, 1, 2, 3]]), jnp.array([0.0, 0.0, 0.0, 100.0]))
    state = state.replace(hyper=per_hyperparams(alpha=1.0, eps=0.0))  # PBT-style change; alpha is only data
    state = buf.update(state, jnp.array([[0, 1, 2]]), jnp.zeros(3))  # zero error, zero eps: never drawn again
    batch, info = jax.jit(buf.sample)(jax.random.key(1), state)
    assert set(np.asarray(batch.reward).tolist()) == {4.0}
    np.testing.assert_allclose(info.weights, 1.0)


@pytest.mark.long
def test_non_finite_td_errors_write_the_max_priority():
    buf = make_prioritized_buffer(capacity=8, batch_size=4)
    state = buf.add(buf.init(dummy_transition(SPEC)), rows(0, 8))
    state = buf.update(state, jnp.array([[0, 1, 2]]), jnp.array([jnp.nan, jnp.inf, 2.0]))
    leaves = np.asarray(tree_leaves(jax.tree.map(lambda x: x[0], state.tree), 8))
    max_p = float(priority_from_td(jnp.array(2.0), 0.6, 1e-6))
    np.testing.assert_allclose(leaves[:3], [1.0, 1.0, max_p], rtol=1e-6)
    assert np.isfinite(np.asarray(state.tree.levels[0])).all() and float(state.max_priority[0]) == max_p


@pytest.mark.long
def test_banks_take_env_slices_round_robin():
    buf = make_prioritized_buffer(capacity=12, batch_size=6, banks=3)
    state = buf.init(dummy_transition(SPEC))
    state = buf.add(state, rows(0, 6))  # slice r = rows 2r, 2r+1 -> bank r
    state = buf.add(state, rows(6, 6))  # rotated: slice r -> bank r+1
    np.testing.assert_array_equal(state.data.reward[:, :4], [[0, 1, 10, 11], [2, 3, 6, 7], [4, 5, 8, 9]])
    assert state.size.tolist() == [4, 4, 4]
    batch, info = buf.sample(jax.random.key(0), state)
    assert info.indices.shape == (3, 2) and batch.reward.shape == (6,)
    for bank in range(3):  # the bank-major batch holds each bank's own rows
        np.testing.assert_array_equal(batch.reward[2 * bank:2 * bank + 2], state.data.reward[bank, info.indices[bank]])
    with pytest.raises(ValueError, match="multiples of banks"):
        make_prioritized_buffer(capacity=10, batch_size=6, banks=4)
    with pytest.raises(ValueError, match="3 banks"):
        buf.add(state, rows(0, 4))


@pytest.mark.long
def test_b1_bank_share_turns_bank_local_into_global_probabilities():
    banks = 4
    buf = make_prioritized_buffer(capacity=32, batch_size=64, banks=banks)
    state = buf.add(buf.init(dummy_transition(SPEC), per_hyperparams(alpha=1.0, eps=0.0)), rows(0, 32))
    td = jnp.tile(jnp.array([1.0, 2.0, 3.0, 4.0, 0.5, 0.5, 0.5, 0.5]), (banks, 1))  # equal bank sums
    state = buf.update(state, jnp.tile(jnp.arange(8), (banks, 1)), td)
    _, info = buf.sample(jax.random.key(0), state)
    np.testing.assert_allclose(info.bank_share, 1 / banks)
    global_probabilities = np.asarray(td)[np.arange(banks)[:, None], np.asarray(info.indices)] / float(td.sum())
    np.testing.assert_allclose(info.probabilities * info.bank_share[:, None], global_probabilities, rtol=1e-6)
    np.testing.assert_allclose(banks * global_probabilities, info.probabilities, rtol=1e-6)
    # Unequal sums: the factor is bank sum / global sum.
    state = buf.update(state, jnp.tile(jnp.arange(8), (banks, 1)), td * jnp.arange(1.0, banks + 1)[:, None])
    _, info = buf.sample(jax.random.key(0), state)
    np.testing.assert_allclose(info.bank_share, np.arange(1, banks + 1) / np.arange(1, banks + 1).sum(), rtol=1e-6)


@pytest.mark.long
def test_vmap_over_members_equals_a_loop_leaf_for_leaf():
    pop, banks = 3, 2
    buf = make_prioritized_buffer(capacity=16, batch_size=8, banks=banks)
    hyper = per_hyperparams(alpha=jnp.array([0.0, 0.6, 1.0]), beta=jnp.array([0.4, 0.7, 1.0]), eps=jnp.full(3, 1e-6))
    items = jax.vmap(lambda m: rows(0, 6).replace(reward=100.0 * m + jnp.arange(6.0)))(jnp.arange(pop))
    keys = jax.random.split(jax.random.key(3), pop)

    def run(key, hyper, items):
        state = buf.add(buf.init(dummy_transition(SPEC), hyper), items)
        _, info = buf.sample(key, state)
        state = buf.update(state, info.indices, info.indices * 0.5 - 1.0)  # duplicates likely
        state = buf.add(state, items)
        batch, info = buf.sample(key, state)
        return state, batch, info

    vmapped = jax.jit(jax.vmap(run))(keys, hyper, items)
    looped = [jax.jit(run)(keys[m], jax.tree.map(lambda x, m=m: x[m], hyper), jax.tree.map(lambda x, m=m: x[m], items))
              for m in range(pop)]
    chex.assert_trees_all_equal(vmapped, jax.tree.map(lambda *xs: jnp.stack(xs), *looped))
    for m in range(pop):  # members stay isolated
        assert set(np.asarray(vmapped[1].reward[m]).tolist()) <= set((100.0 * m + np.arange(6)).tolist())


def test_rejects_bad_sizes():
    with pytest.raises(ValueError, match="positive"):
        make_prioritized_buffer(0, 4)
    buf = make_prioritized_buffer(2, 1)
    with pytest.raises(ValueError, match="capacity 2"):
        buf.add(buf.init(dummy_transition(SPEC)), rows(0, 3))
