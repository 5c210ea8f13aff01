"""MEMR's segmented model buffer (Zhang 2022, Ch. 3, Fig. 3.4): ``segments`` segments of ``rows`` model rollouts.

Each write fills the next segment (circularly) with one generation of rollouts and their importance weights.
Because each generation's start states come from a different sampling distribution (priorities change after every
sampling), an importance weight is valid only relative to its own segment's distribution: each row keeps the
weight of its segment's generation. A batch draws rows uniformly (with replacement) across every written segment
(so a batch is many start-state batches' rollouts, not a handful of one), which picks each segment with the same
probability, as the thesis's "a segment uniformly, then rows inside it" does; the writer makes weights comparable
across segments (MEMR divides each generation's weights by their mean). Pure functions over a pytree of static
shapes (one member; population code vmaps).
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
    """``(items [batch, ...], weights [batch], segments [batch])``: rows drawn uniformly across the written
    segments, each with its own segment's weight. Undefined before the first write."""
    rows = state.weights.shape[1]
    # Segments fill 0, 1, ... until full, so the written rows are the first ``filled x rows`` of the flat buffer.
    flat = jax.random.randint(key, (batch,), 0, jnp.maximum(state.filled, 1) * rows)
    segment, index = flat // rows, flat % rows
    items = jax.tree.map(lambda buf: buf[segment, index], state.data)
    return items, state.weights[segment, index], segment
