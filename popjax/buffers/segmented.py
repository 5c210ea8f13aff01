"""MEMR's segmented model buffer (Zhang 2022, Ch. 3, Fig. 3.4): ``segments`` segments of ``rows`` model rollouts.

Each write fills the next segment (circularly) with one generation of rollouts and their importance weights.
Because each generation's start states come from a different sampling distribution (priorities change after every
sampling), importance weights are valid only within a segment: a batch picks one written segment uniformly and
draws its rows uniformly (with replacement) inside it, so it never mixes segments. Pure functions over a pytree of
static shapes (one member; population code vmaps).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct

from popjax.types import Key, PyTree


@struct.dataclass
class SegmentedState:
    data: PyTree  # every leaf [segments, rows, ...]
    weights: jax.Array  # float32 [segments, rows]
    next: jax.Array  # int32, the segment the next write fills
    filled: jax.Array  # int32, segments written so far (at most ``segments``)


def segmented_init(segments: int, rows: int, example: PyTree) -> SegmentedState:
    """An empty buffer of ``segments`` x ``rows`` items shaped like ``example``."""
    data = jax.tree.map(lambda x: jnp.zeros((segments, rows) + jnp.shape(x), jnp.asarray(x).dtype), example)
    return SegmentedState(data=data, weights=jnp.zeros((segments, rows), jnp.float32),
                          next=jnp.zeros((), jnp.int32), filled=jnp.zeros((), jnp.int32))


def segmented_write(state: SegmentedState, items: PyTree, weights: jax.Array) -> SegmentedState:
    """Writes one generation (``items [rows, ...]``, ``weights [rows]``) as the next segment."""
    segments = state.weights.shape[0]
    data = jax.tree.map(lambda buf, x: buf.at[state.next].set(x.astype(buf.dtype)), state.data, items)
    return SegmentedState(data=data, weights=state.weights.at[state.next].set(weights),
                          next=(state.next + 1) % segments, filled=jnp.minimum(state.filled + 1, segments))


def segmented_sample(key: Key, state: SegmentedState, batch: int) -> tuple[PyTree, jax.Array, jax.Array]:
    """``(items [batch, ...], weights [batch], segment)``: one written segment drawn uniformly, rows uniformly inside
    it. Undefined before the first write."""
    key_segment, key_rows = jax.random.split(key)
    rows = state.weights.shape[1]
    segment = jax.random.randint(key_segment, (), 0, jnp.maximum(state.filled, 1))
    # Segments fill 0, 1, ... until full, so the written ones are [0, filled).
    index = jax.random.randint(key_rows, (batch,), 0, rows)
    items = jax.tree.map(lambda buf: buf[segment, index], state.data)
    return items, state.weights[segment, index], segment
