"""Prioritized experience replay over a K-ary sum tree, in pure JAX, with R banks per member.

Sum tree (K-ary, as in Zhang's 2022 thesis, Ch. 3-4): a tuple of per-level arrays, ``levels[0]`` the root ``[1]``
and ``levels[-1]`` the ``K**H`` leaves; the capacity is padded up to ``K**H`` and padded leaves keep priority 0.
Shapes are static, so one tree, a population of trees ``[N, ...]`` and banked trees ``[N, R, ...]`` are the same
code under ``vmap``.

- ``tree_sample``/``tree_find``: prefix-sum descent. At each level the K children of the current node are gathered
  and cumulated; the child is the number of cumulated sums ``<= target`` (so a leading zero-priority child is skipped
  even for target 0), clamped to the last positive child (so fp32 overshoot at the upper edge never lands on a
  zero-priority or padded leaf), and the partial sum before it is subtracted.
- ``tree_update``: sets leaves (the last write of a duplicated index wins), then recomputes every touched parent from
  its K children, level by level up to and including the root. Unlike delta propagation with scatter-add (the
  thesis's Alg. 1), this is exact with duplicate indices and idempotent; ``tree_from_leaves`` rebuilds with the same
  left-to-right child sum, so the two agree bit for bit.

Replay buffer: ``make_prioritized_buffer`` mirrors ``make_uniform_buffer`` (``init(example_item)``, ``add(state,
items)`` with circular insertion and size tracking, ``sample(key, state)``, ``can_sample``) and adds
``update(state, indices, td_errors)``. ``sample`` returns ``(batch, info)``: the batch is bank-major ``[batch_size,
...]`` like the uniform buffer's, ``info`` carries what a learner needs to weight its loss and write priorities back
(possibly later: the indices are explicit, so a FIFO of them gives the thesis's priority-update delay D, Ch. 4).

Priority-write delay D (``delay``; the thesis's "number of samplings performed ahead of priority update", Ch. 4):
``update`` pushes its write onto a FIFO of D - 1 pending writes (indices and raw TD errors, in the buffer state, so it
is vmapped and checkpointed with the buffer) and applies the oldest one, so the write of sampling t lands just before
sampling t + D. D = 1 (no FIFO, ``pending`` is None) applies the write at once. Pending writes are converted with the
alpha/eps current when they land; writes still pending at any point simply stay pending.

popjax's choices (the thesis gives none of these for Ch. 4-5): priority ``(|delta| + eps)**alpha`` with defaults
alpha=0.6, beta=0.4, eps=1e-6 (the usual Schaul et al. recipe), held as traced arrays in the buffer state so that
each member has its own and PBT may change them; new rows enter with the bank's largest priority so far (initially
1); IS weights ``(N * P(i))**-beta / max w`` with N the bank's valid rows, P the bank-local probability and the max
taken over the sampled batch of that bank (not over the whole buffer).

Banks (SPO, thesis Ch. 5): each member has R banks of ``capacity // R`` rows, each with its own tree and its own
max priority (priorities are per bank); each bank draws ``batch_size // R`` rows. ``add`` splits the items into R
contiguous slices (env slice r -> bank r) and rotates that assignment by one bank per call, so every bank sees every
env. The bank-local probability times ``info.bank_share`` (bank sum / global sum, the factor of the thesis's
Eq. 5.4) is the global one.

Why not flashbax (0.1.3, the registry's JAX replay library; inspected, not installed): it imports and runs with jax
0.10.2 (it only asks for jax>=0.4.25, but pulls in tensorstore), yet its sum tree is binary only (flat array, depth
``ceil(log2 capacity)``), its priority exponent is a static Python float (no per-member traced alpha), it has no
banks, its batched update propagates deltas (bincount-divided scatter-add or a sequential scan), and its descent has
no clamp: a query at the upper edge lands on a padded leaf (capacity 5, query 1.0 -> leaf 7).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
from flax import struct

from popjax.types import Key, PyTree

DEFAULT_ALPHA = 0.6  # popjax defaults, not thesis values
DEFAULT_BETA = 0.4
DEFAULT_EPS = 1e-6


# ----------------------------------------------------------------------------------------------------------- tree


@struct.dataclass
class SumTree:
    """``levels[h]`` has ``branching**h`` nodes (float32), ``levels[-1]`` are the leaves, those past the capacity
    padding (priority 0 forever). No static fields (popjax state rule): the branching is the size of level 1."""

    levels: tuple[jax.Array, ...]

    @property
    def branching(self) -> int:
        return self.levels[1].shape[-1]


def tree_height(capacity: int, branching: int) -> int:
    """Smallest H >= 1 with branching**H >= capacity."""
    if capacity <= 0 or branching < 2:
        raise ValueError(f"need capacity >= 1 and branching >= 2, got {capacity} and {branching}")
    height = 1
    while branching**height < capacity:
        height += 1
    return height


def _sum_children(blocks: jax.Array) -> jax.Array:
    # A fixed left-to-right fold (not a reduction XLA may reorder) so a touched-parent recompute and a full rebuild
    # give bitwise-equal sums.
    total = blocks[..., 0]
    for k in range(1, blocks.shape[-1]):
        total = total + blocks[..., k]
    return total


def tree_from_leaves(leaves: jax.Array, branching: int) -> SumTree:
    """Builds every level from the leaves ``[branching**H]``."""
    levels = [leaves]
    while levels[0].shape[0] > 1:
        levels.insert(0, _sum_children(levels[0].reshape(-1, branching)))
    return SumTree(tuple(levels))


def tree_init(capacity: int, branching: int = 4) -> SumTree:
    """An all-zero tree with ``capacity`` usable leaves."""
    leaves = jnp.zeros(branching ** tree_height(capacity, branching), jnp.float32)
    return tree_from_leaves(leaves, branching)


def tree_total(tree: SumTree) -> jax.Array:
    return tree.levels[0][0]


def tree_leaves(tree: SumTree, capacity: int) -> jax.Array:
    """The ``capacity`` usable leaves (without padding)."""
    return tree.levels[-1][:capacity]


def tree_update(tree: SumTree, indices: jax.Array, priorities: jax.Array) -> SumTree:
    """Sets ``leaves[indices] = priorities`` and recomputes every touched ancestor from its children."""
    k = tree.branching
    leaves = tree.levels[-1]
    indices = indices.astype(jnp.int32)
    order = jnp.arange(indices.shape[0], dtype=jnp.int32)
    # Scatter-set order with duplicate indices is unspecified; pick the last write explicitly and drop the others.
    last_write = jnp.full(leaves.shape, -1, jnp.int32).at[indices].max(order)
    write_at = jnp.where(last_write[indices] == order, indices, leaves.shape[0])
    levels = [leaves.at[write_at].set(priorities.astype(leaves.dtype), mode="drop")]
    touched = indices
    for level in reversed(tree.levels[:-1]):
        touched = touched // k
        sums = _sum_children(levels[0].reshape(-1, k)[touched])
        levels.insert(0, level.at[touched].set(sums))  # duplicates write equal sums
    return tree.replace(levels=tuple(levels))


def tree_find(tree: SumTree, targets: jax.Array) -> jax.Array:
    """Leaf indices of prefix-sum targets (absolute mass in ``[0, total)``), as ``searchsorted(cumsum, side='right')``.

    Never returns a zero-priority leaf while the total is positive, even for targets >= total (fp32 overshoot).
    """
    k = tree.branching

    def descend(target):
        node = jnp.zeros((), jnp.int32)
        for level in tree.levels[1:]:
            children = jax.lax.dynamic_slice(level, (node * k,), (k,))
            prefix = jnp.cumsum(children)
            child = jnp.sum(prefix <= target).astype(jnp.int32)
            last_positive = k - 1 - jnp.argmax(children[::-1] > 0).astype(jnp.int32)
            child = jnp.minimum(child, last_positive)
            target = target - jnp.where(child > 0, prefix[jnp.maximum(child - 1, 0)], 0.0)
            node = node * k + child
        return node

    return jax.vmap(descend)(targets.astype(jnp.float32))


def tree_sample(key: Key, tree: SumTree, batch: int) -> tuple[jax.Array, jax.Array]:
    """``batch`` leaf indices drawn with probability leaf / total, and those probabilities.

    Undefined for an empty tree (total 0); the buffer guards with ``can_sample``.
    """
    total = tree_total(tree)
    indices = tree_find(tree, jax.random.uniform(key, (batch,)) * total)
    return indices, tree.levels[-1][indices] / total


# ------------------------------------------------------------------------------------------------ priorities, IS


@struct.dataclass
class PERHyperparams:
    alpha: jax.Array  # priority exponent; 0 = uniform
    beta: jax.Array  # IS-correction exponent; 1 = full correction
    eps: jax.Array  # keeps zero-error transitions sampleable


def per_hyperparams(alpha: float = DEFAULT_ALPHA, beta: float = DEFAULT_BETA, eps: float = DEFAULT_EPS):
    f32 = lambda x: jnp.asarray(x, jnp.float32)
    return PERHyperparams(alpha=f32(alpha), beta=f32(beta), eps=f32(eps))


def priority_from_td(td_error: jax.Array, alpha: jax.Array, eps: jax.Array) -> jax.Array:
    """``(|delta| + eps)**alpha``: the leaf value, already raised to alpha."""
    return jnp.power(jnp.abs(td_error) + eps, alpha)


def importance_weights(probabilities: jax.Array, num_valid: jax.Array, beta: jax.Array) -> jax.Array:
    """``(N * P(i))**-beta / max w``, the max over the last (batch) axis, so the largest weight is 1."""
    w = jnp.power(num_valid * probabilities, -beta)
    return w / jnp.max(w, axis=-1, keepdims=True)


# ---------------------------------------------------------------------------------------------------------- buffer


@struct.dataclass
class PendingWrites:
    """A FIFO of the last D - 1 priority writes not yet applied; slot 0 is the oldest."""

    indices: jax.Array  # int32 [D - 1, banks, b]
    td_errors: jax.Array  # float32 [D - 1, banks, b]
    count: jax.Array  # int32, filled slots (saturates at D - 1; only a full FIFO has a write to apply)


@struct.dataclass
class PrioritizedBufferState:
    data: PyTree  # every leaf [banks, bank_capacity, ...]
    tree: SumTree  # levels [banks, K**h]
    insert_pos: jax.Array  # int32 [banks], next row to write in each bank
    size: jax.Array  # int32 [banks], valid rows per bank
    max_priority: jax.Array  # float32 [banks], largest leaf written so far (new rows get it)
    next_bank: jax.Array  # int32, bank that receives env slice 0 at the next add
    hyper: PERHyperparams
    pending: PendingWrites | None = None  # delay D > 1 only


class SampleInfo(NamedTuple):
    indices: jax.Array  # int32 [banks, batch_size // banks], rows inside each bank
    probabilities: jax.Array  # [banks, b], bank-local P(i)
    weights: jax.Array  # [banks, b], IS weights, max 1 per bank
    bank_share: jax.Array  # [banks], bank sum / global sum: global P(i) = probabilities * bank_share[:, None]


class PrioritizedBuffer(NamedTuple):
    init: Callable[..., PrioritizedBufferState]
    add: Callable[[PrioritizedBufferState, PyTree], PrioritizedBufferState]
    sample: Callable[[Key, PrioritizedBufferState], tuple[PyTree, SampleInfo]]
    update: Callable[[PrioritizedBufferState, jax.Array, jax.Array], PrioritizedBufferState]
    can_sample: Callable[[PrioritizedBufferState], jax.Array]
    capacity: int
    batch_size: int
    banks: int
    delay: int = 1


def make_prioritized_buffer(capacity: int, batch_size: int, banks: int = 1, branching: int = 4,
                            delay: int = 1) -> PrioritizedBuffer:
    """A prioritized ring buffer of ``capacity`` rows split into ``banks`` equal banks; ``update`` writes land
    ``delay`` samplings after they are made (1: before the next sampling).

    ``capacity`` and ``batch_size`` must be multiples of ``banks``; ``add`` takes a multiple of ``banks`` items.
    ``branching`` K = 4 by default: a rough timing on the 2-core CPU (jitted ``tree_sample`` + ``tree_update``,
    N in {1e5, 1e6}, B in {256, 4096}, K in {2, 4, 8, 16, 32}) put K = 4 among the fastest everywhere; K = 2
    updates up to 2x slower, K >= 16 samples up to 3x slower at B = 4096.
    """
    if capacity <= 0 or batch_size <= 0 or banks <= 0:
        raise ValueError(f"capacity, batch_size and banks must be positive, got {capacity}, {batch_size}, {banks}")
    if capacity % banks or batch_size % banks:
        raise ValueError(f"capacity {capacity} and batch_size {batch_size} must be multiples of banks {banks}")
    if delay < 1:
        raise ValueError(f"delay must be >= 1, got {delay}")
    bank_capacity, bank_batch = capacity // banks, batch_size // banks
    tree_height(bank_capacity, branching)  # validates branching

    def init(example_item: PyTree, hyper: PERHyperparams | None = None) -> PrioritizedBufferState:
        def rows(x):
            return jnp.zeros((banks, bank_capacity) + jnp.shape(x), jnp.asarray(x).dtype)

        one_tree = tree_init(bank_capacity, branching)
        return PrioritizedBufferState(
            data=jax.tree.map(rows, example_item),
            tree=jax.tree.map(lambda x: jnp.broadcast_to(x, (banks,) + x.shape), one_tree),
            insert_pos=jnp.zeros((banks,), jnp.int32),
            size=jnp.zeros((banks,), jnp.int32),
            max_priority=jnp.ones((banks,), jnp.float32),
            next_bank=jnp.zeros((), jnp.int32),
            hyper=per_hyperparams() if hyper is None else hyper,
            pending=None if delay == 1 else PendingWrites(
                indices=jnp.zeros((delay - 1, banks, bank_batch), jnp.int32),
                td_errors=jnp.zeros((delay - 1, banks, bank_batch), jnp.float32),
                count=jnp.zeros((), jnp.int32)),
        )

    def add_to_bank(data, tree, insert_pos, size, max_priority, items):
        n = jax.tree.leaves(items)[0].shape[0]
        rows = (insert_pos + jnp.arange(n)) % bank_capacity
        data = jax.tree.map(lambda buf, x: buf.at[rows].set(x.astype(buf.dtype)), data, items)
        tree = tree_update(tree, rows, jnp.full((n,), max_priority))
        return data, tree, (insert_pos + n) % bank_capacity, jnp.minimum(size + n, bank_capacity)

    def add(state: PrioritizedBufferState, items: PyTree) -> PrioritizedBufferState:
        n = jax.tree.leaves(items)[0].shape[0]
        if n % banks or n // banks > bank_capacity:
            raise ValueError(f"cannot add {n} rows to {banks} banks of capacity {bank_capacity} each")
        # Slice r of the items goes to bank (next_bank + r) mod banks; roll puts it at that position.
        sliced = jax.tree.map(lambda x: jnp.roll(x.reshape((banks, n // banks) + x.shape[1:]), state.next_bank, 0),
                              items)
        data, tree, insert_pos, size = jax.vmap(add_to_bank)(
            state.data, state.tree, state.insert_pos, state.size, state.max_priority, sliced)
        return state.replace(data=data, tree=tree, insert_pos=insert_pos, size=size,
                             next_bank=(state.next_bank + 1) % banks)

    def sample(key: Key, state: PrioritizedBufferState) -> tuple[PyTree, SampleInfo]:
        def sample_bank(bank_key, data, tree, size):
            indices, probabilities = tree_sample(bank_key, tree, bank_batch)
            weights = importance_weights(probabilities, size, state.hyper.beta)
            return jax.tree.map(lambda buf: buf[indices], data), indices, probabilities, weights

        batch, indices, probabilities, weights = jax.vmap(sample_bank)(
            jax.random.split(key, banks), state.data, state.tree, state.size)
        totals = state.tree.levels[0][:, 0]
        batch = jax.tree.map(lambda x: x.reshape((batch_size,) + x.shape[2:]), batch)
        return batch, SampleInfo(indices, probabilities, weights, totals / jnp.sum(totals))

    def write(state: PrioritizedBufferState, indices: jax.Array, td_errors: jax.Array,
              valid: jax.Array | bool = True) -> PrioritizedBufferState:
        """Sets the priorities of ``indices`` from ``td_errors`` now (``valid`` False: leaves the buffer as it is)."""
        priorities = priority_from_td(td_errors, state.hyper.alpha, state.hyper.eps)
        priorities = jnp.where(jnp.isfinite(priorities), priorities, state.max_priority[:, None])
        if valid is not True:
            # An empty FIFO slot rewrites the current leaves: the same tree, bit for bit, without a cond.
            current = jax.vmap(lambda leaves, i: leaves[i])(state.tree.levels[-1], indices)
            priorities = jnp.where(valid, priorities, current)
        tree = jax.vmap(tree_update)(state.tree, indices, priorities)
        written = priorities.max(axis=-1) if valid is True else jnp.where(valid, priorities.max(axis=-1), 0.0)
        return state.replace(tree=tree, max_priority=jnp.maximum(state.max_priority, written))

    def update(state: PrioritizedBufferState, indices: jax.Array, td_errors: jax.Array) -> PrioritizedBufferState:
        """Writes ``(|td| + eps)**alpha`` at ``indices`` (``[banks, b]``, as in ``SampleInfo``; td may be ``[B]``),
        or with ``delay`` D > 1 queues this write and applies the one queued D - 1 updates ago (if any).

        A non-finite TD error (a diverged member) writes the bank's max priority instead: one NaN leaf would make
        every later sum NaN, and the tree would stay poisoned after PBT replaced the member's learner. A delayed
        write lands on the row's current occupant: rows added since the sample get the old row's priority.
        """
        indices = indices.astype(jnp.int32)
        td_errors = td_errors.reshape(indices.shape).astype(jnp.float32)
        if delay == 1:
            return write(state, indices, td_errors)
        fifo = state.pending
        state = write(state, fifo.indices[0], fifo.td_errors[0], fifo.count == delay - 1)
        shift = lambda queue, new: jnp.concatenate([queue[1:], new[None]], axis=0)
        # Slots fill from the end, so the oldest write always sits in slot 0 once the FIFO is full.
        fifo = PendingWrites(indices=shift(fifo.indices, indices), td_errors=shift(fifo.td_errors, td_errors),
                             count=jnp.minimum(fifo.count + 1, delay - 1))
        return state.replace(pending=fifo)

    def can_sample(state: PrioritizedBufferState) -> jax.Array:
        return (jnp.sum(state.size) >= batch_size) & jnp.all(state.size > 0)

    return PrioritizedBuffer(init, add, sample, update, can_sample, capacity, batch_size, banks, delay)
