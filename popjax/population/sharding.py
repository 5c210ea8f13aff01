"""Splitting the member axis over several devices (GSPMD: jit propagates the sharding)."""

from __future__ import annotations

import jax
from jax.sharding import NamedSharding, PartitionSpec

from popjax.types import PyTree


def member_sharding(devices: int) -> NamedSharding | None:
    """A sharding that splits axis 0 over the first ``devices`` devices (None for one device)."""
    if devices <= 1:
        return None
    available = jax.devices()
    if len(available) < devices:
        raise ValueError(f"devices: {devices} requested but JAX sees {len(available)} "
                         f"({available[0].platform}); on a CPU set "
                         f"XLA_FLAGS=--xla_force_host_platform_device_count={devices}")
    mesh = jax.sharding.Mesh(available[:devices], ("pop",))
    return NamedSharding(mesh, PartitionSpec("pop"))


def shard_members(tree: PyTree, sharding: NamedSharding | None) -> PyTree:
    """Places every leaf with its axis 0 split over the mesh (no-op without a sharding)."""
    if sharding is None:
        return tree
    return jax.tree.map(lambda x: jax.device_put(x, sharding), tree)
