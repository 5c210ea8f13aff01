"""Tiny jnp helpers over population pytrees (axis 0 is the member axis)."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from popjax.types import PyTree


def take(tree: PyTree, idx: jax.Array) -> PyTree:
    """Gathers members ``idx`` (int array) from every leaf along axis 0."""
    return jax.tree.map(lambda x: jnp.take(x, idx, axis=0), tree)


def member(tree: PyTree, i: int) -> PyTree:
    """The pytree of member ``i`` (leading axis removed)."""
    return jax.tree.map(lambda x: x[i], tree)


def where(mask: jax.Array, on_true: PyTree, on_false: PyTree) -> PyTree:
    """Per-member select: ``mask`` has shape ``[pop]`` and broadcasts over trailing axes."""

    def select(a, b):
        m = jnp.reshape(mask, mask.shape + (1,) * (a.ndim - mask.ndim))
        return jnp.where(m, a, b)

    return jax.tree.map(select, on_true, on_false)


def broadcast(tree: PyTree, n: int) -> PyTree:
    """Stacks ``n`` copies of a single-member pytree on a new axis 0."""
    return jax.tree.map(lambda x: jnp.broadcast_to(x, (n,) + jnp.shape(x)), tree)


def stack(trees: list[PyTree]) -> PyTree:
    """Stacks a list of same-structure pytrees on a new axis 0 (host-side helper)."""
    return jax.tree.map(lambda *xs: jnp.stack(xs), *trees)


def size(tree: PyTree) -> int:
    """The population size (length of axis 0 of the first leaf)."""
    return jax.tree.leaves(tree)[0].shape[0]


def get_path(tree: PyTree, path: str) -> PyTree:
    """The field at a dotted ``path`` of nested dataclasses (``"inner.actor"``)."""
    for name in path.split("."):
        tree = getattr(tree, name)
    return tree


def replace_path(tree: PyTree, path: str, value: PyTree) -> PyTree:
    """``tree`` with the field at the dotted ``path`` replaced (``flax.struct`` dataclasses: ``replace``)."""
    head, _, rest = path.partition(".")
    return tree.replace(**{head: replace_path(getattr(tree, head), rest, value) if rest else value})
