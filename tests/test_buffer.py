import jax
import jax.numpy as jnp
import numpy as np
import pytest

from popjax.buffers import make_uniform_buffer
from popjax.types import EnvSpec, Transition, dummy_transition

SPEC = EnvSpec("test", (2,), action_dim=1, action_low=(-1.0,), action_high=(1.0,))


def rows(start, n):
    """n transitions whose reward encodes their insertion index."""
    r = jnp.arange(start, start + n, dtype=jnp.float32)
    return Transition(obs=jnp.stack([r, r], 1), action=r[:, None], reward=r, next_obs=jnp.stack([r, r], 1),
                      terminated=jnp.zeros(n))


@pytest.mark.long
def test_wraps_around_overwriting_oldest_rows_first():
    buf = make_uniform_buffer(capacity=5, batch_size=2)
    state = buf.init(dummy_transition(SPEC))
    state = buf.add(state, rows(0, 3))
    assert int(state.size) == 3 and int(state.insert_pos) == 3
    state = buf.add(state, rows(3, 4))  # rows 3..6, wraps: positions 3,4,0,1
    assert int(state.size) == 5 and int(state.insert_pos) == 2
    np.testing.assert_array_equal(state.data.reward, [5, 6, 2, 3, 4])


@pytest.mark.long
def test_samples_only_valid_rows_and_keeps_dtypes():
    buf = make_uniform_buffer(capacity=100, batch_size=64)
    state = buf.init(dummy_transition(EnvSpec("d", (2,), num_actions=3)))
    assert state.data.action.dtype == jnp.int32
    items = rows(1, 3).replace(action=jnp.array([0, 1, 2], jnp.int32))
    state = buf.add(state, items)
    batch = buf.sample(jax.random.key(0), state)
    assert batch.reward.shape == (64,) and batch.action.dtype == jnp.int32
    assert set(np.asarray(batch.reward).tolist()) <= {1.0, 2.0, 3.0}  # never an empty (zero) row
    assert not bool(buf.can_sample(state))


@pytest.mark.long
def test_per_member_buffers_are_isolated_under_vmap():
    buf = make_uniform_buffer(capacity=8, batch_size=16)
    pop = 3
    states = jax.vmap(lambda _: buf.init(dummy_transition(SPEC)))(jnp.arange(pop))
    # member m receives rewards 100*m + [0, 1]
    items = jax.vmap(lambda m: rows(0, 2).replace(reward=100.0 * m + jnp.arange(2.0)))(jnp.arange(pop))
    states = jax.vmap(buf.add)(states, items)
    batches = jax.vmap(buf.sample)(jax.random.split(jax.random.key(1), pop), states)
    for m in range(pop):
        assert set(np.asarray(batches.reward[m]).tolist()) <= {100.0 * m, 100.0 * m + 1}


def test_rejects_bad_sizes():
    with pytest.raises(ValueError, match="positive"):
        make_uniform_buffer(0, 4)
    buf = make_uniform_buffer(2, 1)
    with pytest.raises(ValueError, match="capacity 2"):
        buf.add(buf.init(dummy_transition(SPEC)), rows(0, 3))
