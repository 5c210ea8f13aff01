"""Uniform ring replay buffer as pure functions over a typed pytree.

One buffer is a single-member object; a per-member population of buffers is
``jax.vmap(buffer.add)`` over stacked states, and a shared buffer is one state fed with
the transitions of all members (flattened to ``[pop * envs]``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
from flax import struct

from popjax.types import Key, PyTree


@struct.dataclass
class BufferState:
    data: PyTree  # every leaf [capacity, ...], dtype of the example item
    insert_pos: jax.Array  # int32, next row to write
    size: jax.Array  # int32, number of valid rows (<= capacity)


class Buffer(NamedTuple):
    init: Callable[[PyTree], BufferState]
    add: Callable[[BufferState, PyTree], BufferState]
    sample: Callable[[Key, BufferState], PyTree]
    can_sample: Callable[[BufferState], jax.Array]
    capacity: int
    batch_size: int


def make_uniform_buffer(capacity: int, batch_size: int) -> Buffer:
    """A ring buffer of ``capacity`` rows that samples ``batch_size`` rows uniformly.

    ``add`` takes a batch of items with a leading axis (any length <= capacity); older rows
    are overwritten first. ``sample`` draws only among valid rows.
    """
    if capacity <= 0 or batch_size <= 0:
        raise ValueError(f"capacity and batch_size must be positive, got {capacity} and {batch_size}")

    def init(example_item: PyTree) -> BufferState:
        data = jax.tree.map(lambda x: jnp.zeros((capacity,) + jnp.shape(x), jnp.asarray(x).dtype), example_item)
        return BufferState(data=data, insert_pos=jnp.zeros((), jnp.int32), size=jnp.zeros((), jnp.int32))

    def add(state: BufferState, items: PyTree) -> BufferState:
        n = jax.tree.leaves(items)[0].shape[0]
        if n > capacity:
            raise ValueError(f"cannot add {n} rows to a buffer of capacity {capacity}")
        rows = (state.insert_pos + jnp.arange(n)) % capacity
        data = jax.tree.map(lambda buf, x: buf.at[rows].set(x.astype(buf.dtype)), state.data, items)
        return BufferState(
            data=data,
            insert_pos=(state.insert_pos + n) % capacity,
            size=jnp.minimum(state.size + n, capacity),
        )

    def sample(key: Key, state: BufferState) -> PyTree:
        idx = sample_rows(key, state, batch_size)
        return jax.tree.map(lambda buf: buf[idx], state.data)

    def can_sample(state: BufferState) -> jax.Array:
        return state.size >= batch_size

    return Buffer(init, add, sample, can_sample, capacity, batch_size)


def sample_rows(key: Key, state: BufferState, batch_size: int) -> jax.Array:
    """``[batch_size]`` rows drawn uniformly among the valid ones (what ``Buffer.sample`` gathers)."""
    capacity = jax.tree.leaves(state.data)[0].shape[0]
    idx = jax.random.randint(key, (batch_size,), 0, jnp.maximum(state.size, 1))
    # Valid rows are the ``size`` before ``insert_pos``; for a buffer never shrunk (``drop_oldest``) that is
    # rows [0, size) or all of them, so those draws stay the rows they always were.
    return jnp.where(state.size == capacity, idx, (oldest_row(state) + idx) % capacity)


def valid_rows(state: BufferState) -> jax.Array:
    """``[capacity]`` bool: the rows that hold an item (the ``size`` rows before ``insert_pos``)."""
    capacity = jax.tree.leaves(state.data)[0].shape[0]
    return (jnp.arange(capacity) - oldest_row(state)) % capacity < state.size


def oldest_row(state: BufferState) -> jax.Array:
    """Row of the oldest valid item."""
    capacity = jax.tree.leaves(state.data)[0].shape[0]
    return (state.insert_pos - state.size) % capacity


def oldest_items(state: BufferState, count: int) -> tuple[PyTree, jax.Array]:
    """The ``count`` oldest items (leaves ``[count, ...]``) and which of them are valid (fewer when not full)."""
    capacity = jax.tree.leaves(state.data)[0].shape[0]
    rows = (oldest_row(state) + jnp.arange(count)) % capacity
    return jax.tree.map(lambda buf: buf[rows], state.data), jnp.arange(count) < state.size


def drop_oldest(state: BufferState, count: jax.Array) -> BufferState:
    """Forgets the ``count`` oldest items (FIFO eviction; ``count`` may be traced, at most ``size``)."""
    return state.replace(size=state.size - jnp.clip(count, 0, state.size).astype(state.size.dtype))


def sample_windows(key: Key, state: BufferState, batch_size: int, length: int, stride: int) -> PyTree:
    """``batch_size`` windows of ``length`` rows ``start, start + stride, ...``: leaves ``[batch_size, length, ...]``.

    With rows added time-major for ``stride`` envs (row ``t * stride + e``) and a capacity that is a multiple of
    ``stride``, a window is ``length`` consecutive steps of one env. Starts are uniform over the valid rows whose
    whole window is valid (oldest first, so a window never runs into rows not yet written or overwritten).
    """
    capacity = jax.tree.leaves(state.data)[0].shape[0]
    span = (length - 1) * stride
    start = oldest_row(state) + jax.random.randint(key, (batch_size,), 0, jnp.maximum(state.size - span, 1))
    rows = (start[:, None] + stride * jnp.arange(length)) % capacity
    return jax.tree.map(lambda buf: buf[rows], state.data)
