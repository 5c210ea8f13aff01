"""Splitting a population over devices: member leaves are split, shared leaves replicated.

Two ways to run the population's programs on ``d`` devices (``--parallel``):

- ``sharding`` (default): every program is written for the whole population and the
  compiler (GSPMD) splits it, following the placement of its inputs: leaves with the member
  axis are split along axis 0, shared leaves (a shared critic, a shared buffer, counters)
  are replicated. Cross-member work (PBT's ranking and copies, a shared critic's mean
  gradient) becomes the needed collectives automatically.
- ``pmap``: one explicit program per device holding ``pop / d`` members (``Members`` with the
  mesh axis), collectives written by name. It is built with ``jax.shard_map``, the
  primitive ``jax.pmap`` itself is implemented with in JAX 0.10: the population keeps one
  layout (``[pop, ...]`` arrays placed as in ``sharding``), so checkpoints, PBT's exploit and
  every host read are the same on both paths.

A driver says which leaves carry the member axis with a prefix pytree of bools
(``Driver.member_axes``). A member leaf whose axis 0 does not divide over the devices (CEM-RL's
``n_trained`` actors, say) is replicated on the ``sharding`` path.
"""

from __future__ import annotations

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from popjax.distributed import processes
from popjax.population.members import Members
from popjax.types import PyTree

DEVICE_AXIS = "devices"


def device_mesh(devices: int) -> Mesh:
    """A 1-D mesh over the first ``devices`` devices; raises ValueError if JAX sees fewer."""
    available = jax.devices()
    if len(available) < devices:
        raise ValueError(f"devices: {devices} requested but JAX sees {len(available)} "
                         f"({available[0].platform}); on a CPU set "
                         f"XLA_FLAGS=--xla_force_host_platform_device_count={devices}")
    return Mesh(np.asarray(available[:devices]), (DEVICE_AXIS,))


def expand(member_axes: PyTree, tree: PyTree) -> PyTree:
    """The bool of ``member_axes`` (a prefix of ``tree``) for every leaf of ``tree``."""
    return jax.tree.map(lambda flag, sub: jax.tree.map(lambda _: bool(flag), sub), member_axes, tree)


class Placement:
    """Where the population's arrays live and how its programs are split (see module doc)."""

    def __init__(self, devices: int = 1, parallel: str = "sharding"):
        self.devices = devices
        self.parallel = parallel
        self.mesh = device_mesh(devices) if devices > 1 else None

    @property
    def per_device(self) -> bool:
        """One program per device (``pmap``)."""
        return self.parallel == "pmap" and self.mesh is not None

    def members(self, pop_size: int) -> Members:
        """The population as seen inside the per-device programs (all of it without ``pmap``)."""
        if self.per_device:
            return Members(pop_size, self.devices, DEVICE_AXIS)
        return Members(pop_size)

    def shardings(self, tree: PyTree, member_axes: PyTree) -> PyTree | None:
        """``NamedSharding`` per leaf of ``tree`` (arrays or shape structs); None on one device."""
        if self.mesh is None:
            return None

        def sharding(is_member: bool, leaf) -> NamedSharding:
            shape = getattr(leaf, "shape", ())
            split = is_member and len(shape) > 0 and shape[0] % self.devices == 0
            if is_member and not split and self.per_device:
                raise ValueError(f"a member leaf of shape {tuple(shape)} does not split over {self.devices} devices")
            return NamedSharding(self.mesh, PartitionSpec(DEVICE_AXIS) if split else PartitionSpec())

        return jax.tree.map(sharding, expand(member_axes, tree), tree)

    def put(self, tree: PyTree, member_axes: PyTree) -> PyTree:
        """``tree`` on the devices, member leaves split (a no-op on one device)."""
        shardings = self.shardings(tree, member_axes)
        return tree if shardings is None else jax.device_put(tree, shardings)

    # --- several processes: each holds the members on its own devices (host-path envs) ----------------
    @property
    def one_process(self) -> bool:
        """Every device of the placement belongs to this process."""
        return self.mesh is None or processes() == 1

    def local_members(self, pop_size: int) -> tuple[int, int]:
        """``(first, count)``: the members whose rows live on this process's devices (all of them on one
        process). Members are split in order over the mesh, whose devices are ordered by process."""
        if self.one_process:
            return 0, pop_size
        per_device = pop_size // self.devices
        mine = [i for i, d in enumerate(self.mesh.devices.flat) if d.process_index == jax.process_index()]
        return mine[0] * per_device, len(mine) * per_device

    def from_local(self, tree: PyTree) -> PyTree:
        """Host arrays of this process's members (axis 0) as global arrays split over the job's devices."""
        if self.one_process:
            return tree
        split = NamedSharding(self.mesh, PartitionSpec(DEVICE_AXIS))
        return jax.tree.map(lambda x: jax.make_array_from_process_local_data(split, np.asarray(x)), tree)

    def to_local(self, x: jax.Array, rows: tuple[int, int]) -> np.ndarray:
        """The rows ``(first, count)`` of this process's members of a global array, as numpy."""
        first, count = rows
        if x.is_fully_addressable:
            return np.asarray(x)[first:first + count]
        if x.is_fully_replicated:
            return np.asarray(x.addressable_data(0))[first:first + count]
        starts = {}
        for shard in x.addressable_shards:  # member-split: one block of rows per local device
            starts.setdefault(shard.index[0].start or 0, shard)
        block = np.concatenate([np.asarray(starts[k].data) for k in sorted(starts)])
        assert block.shape[0] == count and min(starts) == first, (block.shape, count, sorted(starts), first)
        return block

    def program(self, fn, in_axes: tuple, out_axes):
        """``fn`` as one program per device on the ``pmap`` path (unchanged otherwise).

        ``in_axes``/``out_axes``: per argument / for the output, a prefix pytree of bools (True =
        the member axis, split over the devices; False = replicated).
        """
        if not self.per_device:
            return fn
        spec = lambda axes: jax.tree.map(lambda flag: PartitionSpec(DEVICE_AXIS) if flag else PartitionSpec(), axes)
        # check_vma=False: JAX 0.10's replication typing fails on collectives over a vmap axis
        # (the population's ``pop``) inside shard_map; replicated outputs are equal by construction
        # (computed from replicated inputs or after a collective over the devices).
        return jax.shard_map(fn, mesh=self.mesh, in_specs=tuple(spec(a) for a in in_axes), out_specs=spec(out_axes),
                             check_vma=False)


def reserve_acting_device(training_devices: int) -> None:
    """Asks for one more CPU device than the training devices, if JAX has not started yet (else a no-op)."""
    from jax._src import xla_bridge

    if not xla_bridge.backends_are_initialized() and jax.config.values.get("jax_num_cpu_devices", -1) in (-1, 0, 1):
        jax.config.update("jax_num_cpu_devices", training_devices + 1)


def acting_device(training_devices: int):
    """A device for acting while the update runs on the first ``training_devices`` devices.

    A device computes one program at a time, so acting needs its own: the next device of the
    platform, else the host CPU next to an accelerator. On a CPU-only machine popjax forces one
    more host device when JAX has not started yet (``jax_num_cpu_devices``); otherwise it is a
    ValueError saying how to get one.
    """
    available = jax.devices()
    if len(available) > training_devices:
        return available[training_devices]
    if available[0].platform != "cpu":
        return jax.devices("cpu")[0]
    raise ValueError(f"overlap: acting needs a device besides the {training_devices} training device(s) and JAX "
                     f"already started with {len(available)}; start the process with "
                     f"XLA_FLAGS=--xla_force_host_platform_device_count={training_devices + 1}")
