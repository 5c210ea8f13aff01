"""Which members a compiled program holds, and the keys that belong to them.

A member's randomness depends only on its global index: its key is ``fold_in(key, index)``,
which equals ``jax.random.split(key, pop)[index]`` (JAX's partitionable threefry). So a
program that holds all members (one device, or the compiler splitting the member axis) and
a per-device program that holds a slice of them (``--parallel pmap``) draw the same numbers
for the same member, and their results agree.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from popjax.types import Key


@dataclasses.dataclass(frozen=True)
class Members:
    """The population as seen from inside one compiled program.

    Attributes:
      size: the population size.
      shards: number of per-device programs the population is split over (``pmap`` path).
      axis_name: the mesh axis of those programs; None when a program holds every member.
    """

    size: int
    shards: int = 1
    axis_name: str | None = None

    def __post_init__(self):
        if self.size < 1 or self.shards < 1 or self.size % self.shards:
            raise ValueError(f"{self.size} members do not split into {self.shards} equal shards")

    @property
    def local(self) -> int:
        """Members held by this program."""
        return self.size // self.shards if self.axis_name else self.size

    def ids(self) -> jax.Array:
        """Global indices ``[local]`` (int32) of this program's members."""
        local = jnp.arange(self.local, dtype=jnp.int32)
        if self.axis_name is None:
            return local
        return jax.lax.axis_index(self.axis_name).astype(jnp.int32) * self.local + local

    def keys(self, key: Key, per_member: int = 1) -> jax.Array:
        """Keys of this program's members, ``[local * per_member]``, member-major.

        Equal to the matching slice of ``jax.random.split(key, size * per_member)``.
        """
        ids = self.ids()
        if per_member > 1:
            ids = (ids[:, None] * per_member + jnp.arange(per_member, dtype=jnp.int32)).reshape(-1)
        return indexed_keys(key, ids)

    def gather(self, tree):
        """Every member's values of a pytree with a ``[local]`` leading axis, ``[size]`` in member order."""
        if self.axis_name is None:
            return tree
        return jax.tree.map(lambda x: jax.lax.all_gather(x, self.axis_name, tiled=True), tree)

    def take(self, tree):
        """This program's slice of a pytree with a ``[size]`` leading axis (e.g. initial hparams)."""
        if self.axis_name is None:
            return tree
        return jax.tree.map(lambda x: jnp.take(x, self.ids(), axis=0), tree)


def indexed_keys(key: Key, ids: jax.Array) -> jax.Array:
    """``fold_in(key, i)`` for every ``i`` in ``ids`` (= ``split(key, n)[ids]``)."""
    return jax.vmap(jax.random.fold_in, in_axes=(None, 0))(key, ids)
