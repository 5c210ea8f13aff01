"""A pytree as a few flat buffers, one per dtype, for a compiled program called again and again.

Every array crossing a ``jit`` boundary costs the call some host work: a TD3 population's state has about 75
leaves, and handing them in and out is most of a small update's per-call overhead on a CPU. A program that takes
and returns the state as one buffer per dtype (``pack`` and ``unpack`` run inside it, the buffers donated) pays for
a handful of arrays instead; the values are the same bits (a ravel and a reshape of each leaf).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from popjax.types import PyTree


class Slot(NamedTuple):
    """Where one leaf lives: ``buffer`` indexes the program's arguments (the packed buffers first, then the leaves
    kept whole), ``offset`` is its first element in a packed buffer (0 for a whole leaf)."""

    buffer: int
    offset: int
    shape: tuple[int, ...]


class Layout(NamedTuple):
    """How a pytree's leaves sit in its arguments (static: hashable, no arrays): ``dtypes[i]`` and ``sizes[i]`` of
    packed buffer ``i``, then ``whole`` leaves passed as they are."""

    treedef: Any
    dtypes: tuple[np.dtype, ...]
    sizes: tuple[int, ...]
    whole: int
    slots: tuple[Slot, ...]

    @property
    def arguments(self) -> int:
        return len(self.dtypes) + self.whole


# Leaves of more bytes than this are passed whole. A packed leaf is copied out of its buffer and written back
# inside the program; a leaf passed whole costs the call a few microseconds (about 6.5 us per leaf in and out for
# TD3 on a 2-core CPU, about what copying 32 KiB twice costs), and a large leaf (a replay buffer, a 256-wide
# kernel) is updated in place as its own donated argument.
WHOLE_BYTES = 32 << 10


def layout_of(tree: PyTree, whole_bytes: int = WHOLE_BYTES) -> Layout:
    """The layout of ``tree`` (arrays or ``jax.ShapeDtypeStruct``s): leaves of up to ``whole_bytes`` bytes packed
    one buffer per dtype in leaf order, larger ones whole."""
    leaves, treedef = jax.tree.flatten(tree)
    big = [math.prod(leaf.shape) * np.dtype(leaf.dtype).itemsize > whole_bytes for leaf in leaves]
    dtypes = tuple(sorted({np.dtype(leaf.dtype) for leaf, b in zip(leaves, big, strict=True) if not b}, key=str))
    sizes = [0] * len(dtypes)
    slots, whole = [], 0
    for leaf, b in zip(leaves, big, strict=True):
        shape = tuple(leaf.shape)
        if b:
            slots.append(Slot(len(dtypes) + whole, 0, shape))
            whole += 1
            continue
        i = dtypes.index(np.dtype(leaf.dtype))
        slots.append(Slot(i, sizes[i], shape))
        sizes[i] += math.prod(shape)
    return Layout(treedef, dtypes, tuple(sizes), whole, tuple(slots))


def packable(tree: PyTree) -> bool:
    """Whether every leaf is a plain array (typed PRNG keys and other extended dtypes are not)."""
    return all(not jax.dtypes.issubdtype(leaf.dtype, jax.dtypes.extended) for leaf in jax.tree.leaves(tree))


def packed_leaves(layout: Layout, tree: PyTree) -> tuple[list[jax.Array], list[jax.Array]]:
    """``(leaves that go into the buffers, leaves kept whole)`` of ``tree``, each in leaf order."""
    small, whole = [], []
    for slot, leaf in zip(layout.slots, jax.tree.leaves(tree), strict=True):
        (whole if slot.buffer >= len(layout.dtypes) else small).append(leaf)
    return small, whole


def buffers(layout: Layout, small: list[jax.Array]) -> tuple[jax.Array, ...]:
    """The packed buffers of the leaves ``packed_leaves`` puts into them (new arrays: a concatenation)."""
    parts: list[list[jax.Array]] = [[] for _ in layout.dtypes]
    slots = [s for s in layout.slots if s.buffer < len(layout.dtypes)]
    for slot, leaf in zip(slots, small, strict=True):
        parts[slot.buffer].append(jnp.ravel(leaf))
    return tuple(p[0] if len(p) == 1 else jnp.concatenate(p) for p in parts)


def pack(layout: Layout, tree: PyTree) -> tuple[jax.Array, ...]:
    """``tree`` as ``layout``'s arguments: the packed buffers, then the whole leaves."""
    small, whole = packed_leaves(layout, tree)
    return buffers(layout, small) + tuple(whole)


def repack(layout: Layout, arguments: tuple[jax.Array, ...], tree: PyTree) -> tuple[jax.Array, ...]:
    """``pack(layout, tree)`` written into ``arguments`` slice by slice, for the end of a program that took
    ``arguments`` donated: XLA then updates the buffers in place (a concatenation would copy the whole state)."""
    out = list(arguments)
    for slot, leaf in zip(layout.slots, jax.tree.leaves(tree), strict=True):
        if slot.buffer >= len(layout.dtypes):
            out[slot.buffer] = leaf
        else:
            out[slot.buffer] = jax.lax.dynamic_update_slice(out[slot.buffer], jnp.ravel(leaf), (slot.offset,))
    return tuple(out)


def small_leaves(layout: Layout, buffers: tuple[jax.Array, ...]) -> list[jax.Array]:
    """The leaves packed into ``buffers``, in leaf order (slices, reshaped)."""
    return [buffers[s.buffer][s.offset:s.offset + math.prod(s.shape)].reshape(s.shape)
            for s in layout.slots if s.buffer < len(layout.dtypes)]


def tree_of(layout: Layout, small: list[jax.Array], whole: tuple[jax.Array, ...]) -> PyTree:
    """The pytree of its packed leaves ``small`` and its whole leaves, each in leaf order."""
    small, whole = iter(small), iter(whole)
    leaves = [next(whole) if s.buffer >= len(layout.dtypes) else next(small) for s in layout.slots]
    return jax.tree.unflatten(layout.treedef, leaves)


def unpack(layout: Layout, arguments: tuple[jax.Array, ...]) -> PyTree:
    """The pytree ``pack`` turned into ``arguments``."""
    n = len(layout.dtypes)
    return tree_of(layout, small_leaves(layout, arguments[:n]), arguments[n:])


@dataclasses.dataclass(frozen=True)
class Packed:
    """A pytree held as ``layout``'s arguments between calls of the programs that take it packed (not a pytree
    itself: it never enters a program as it is); ``name`` says which (the loop's ``state``, ``env_state``)."""

    arguments: tuple[jax.Array, ...]
    layout: Layout
    name: str
