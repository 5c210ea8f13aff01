"""Priority-write delay D (``per_delay``): a FIFO of pending writes in the prioritized buffer state."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from popjax.buffers import make_prioritized_buffer, per_hyperparams
from popjax.buffers.prioritized import tree_leaves
from popjax.config import ConfigError, make_config
from popjax.types import EnvSpec, Transition, dummy_transition

SPEC = EnvSpec("test", (2,), action_dim=1, action_low=(-1.0,), action_high=(1.0,))
EPS = 0.25


def rows(n):
    r = jnp.arange(n, dtype=jnp.float32)
    return Transition(obs=jnp.stack([r, r], 1), action=r[:, None], reward=r, next_obs=jnp.stack([r, r], 1),
                      terminated=jnp.zeros(n))


def leaves_of(state, capacity):
    return np.asarray(jax.vmap(lambda tree: tree_leaves(tree, capacity))(state.tree))


@pytest.mark.long
@pytest.mark.parametrize("delay", [1, 3])
def test_each_write_lands_exactly_d_minus_1_updates_later(delay):
    """Against a Python loop: the write made at update t is visible after update t + D - 1 and not before."""
    capacity, banks, steps = 12, 2, 9
    buf = make_prioritized_buffer(capacity, batch_size=4, banks=banks, delay=delay)
    # alpha = 1: priority = |td| + eps, exact in float32 for these values
    state = buf.add(buf.init(dummy_transition(SPEC), per_hyperparams(alpha=1.0, eps=EPS)), rows(capacity))
    rng = np.random.default_rng(delay)
    writes = [(rng.integers(0, capacity // banks, (banks, 2)).astype(np.int32),
               rng.integers(-8, 9, (banks, 2)).astype(np.float32)) for _ in range(steps)]
    expected = np.ones((banks, capacity // banks), np.float32)  # new rows enter at priority 1
    max_priority = np.ones(banks, np.float32)  # the largest priority written so far
    update = jax.jit(buf.update)
    for t, (indices, td) in enumerate(writes):
        state = update(state, jnp.asarray(indices), jnp.asarray(td))
        landed = t - (delay - 1)  # the write of update t - D + 1 lands at update t
        if landed >= 0:
            idx, err = writes[landed]
            for bank in range(banks):
                for i, e in zip(idx[bank], err[bank], strict=True):  # the last write of a duplicate wins
                    expected[bank, i] = abs(e) + EPS
                    max_priority[bank] = max(max_priority[bank], abs(e) + EPS)
        np.testing.assert_array_equal(leaves_of(state, capacity // banks), expected, err_msg=f"after update {t}")
        np.testing.assert_array_equal(state.max_priority, max_priority)
    if delay == 1:
        assert state.pending is None
    else:  # the last D - 1 writes are still pending, oldest first
        np.testing.assert_array_equal(state.pending.indices, np.stack([w[0] for w in writes[-(delay - 1):]]))
        np.testing.assert_array_equal(state.pending.td_errors, np.stack([w[1] for w in writes[-(delay - 1):]]))
        assert int(state.pending.count) == delay - 1


@pytest.mark.long
def test_delay_one_is_the_immediate_write():
    """D = 1 keeps the buffer state of before (no FIFO leaves) and writes at once."""
    buf = make_prioritized_buffer(8, batch_size=4)
    state = buf.add(buf.init(dummy_transition(SPEC)), rows(8))
    assert state.pending is None and len(jax.tree.leaves(state)) == len(jax.tree.leaves(state.replace(pending=None)))
    state = buf.update(state, jnp.array([[1, 2, 3, 1]]), jnp.array([4.0, 0.0, 1.0, 2.0]))
    leaves = leaves_of(state, 8)[0]
    expected = np.power(np.array([2.0, 0.0, 1.0]) + 1e-6, 0.6).astype(np.float32)
    np.testing.assert_allclose(leaves[1:4], expected, rtol=1e-6)
    np.testing.assert_array_equal(leaves[[0, 4, 5, 6, 7]], 1.0)


def test_per_delay_is_validated():
    base = dict(learner="dqn", env="probe:cartpole", buffer="prioritized")
    assert make_config(per_delay=10, **base).per_delay == 10
    for bad in (0, -1, 2.5, "x"):
        with pytest.raises(ConfigError, match="^per_delay: ") as err:
            make_config(per_delay=bad, **base)
        assert "\n" not in str(err.value)
    with pytest.raises(ConfigError, match="^per_delay: only applies to buffer: prioritized"):
        make_config(learner="dqn", env="probe:cartpole", per_delay=3)
    with pytest.raises(ValueError, match="delay"):
        make_prioritized_buffer(8, 4, delay=0)
