"""Runs over several processes (machines) with JAX's multi-controller runtime, ``jax.distributed``.

Every process runs the same program: ``popjax train`` with the same configuration, plus its
place in the job (``--coordinator HOST:PORT --num-processes P --process-id I``, or the cluster
scheduler's environment, e.g. SLURM's, read by ``jax.distributed.initialize()``). Each process
drives its local devices; the population is one global array split over the devices of all
processes (``popjax.population.sharding``), so every driver's compiled programs are the ones of
a single machine and cross-member work (PBT's ranking and copies, CEM's update, DvD's kernel)
becomes collectives between machines.

What the host does with device values is the same on every process, in the same order, because
reading a member-split array gathers it from all processes (``fetch``, a collective): every
process computes the same rows, summary and checkpoint; only process 0 writes files
(``is_writer``), and orbax writes each checkpoint once.
"""

from __future__ import annotations

import dataclasses
import sys

import jax
import numpy as np

from popjax.types import PyTree

DEFAULT_TIMEOUT_S = 120


@dataclasses.dataclass(frozen=True)
class JobPlace:
    """Where this process sits in a multi-process job (all None: from the scheduler's environment)."""

    coordinator: str | None = None
    num_processes: int | None = None
    process_id: int | None = None
    timeout_s: int = DEFAULT_TIMEOUT_S

    def check(self) -> None:
        """ValueError (naming the flag) for an incomplete or out-of-range place."""
        given = [v is not None for v in (self.coordinator, self.num_processes, self.process_id)]
        if any(given) and not all(given):
            raise ValueError("coordinator: --coordinator, --num-processes and --process-id go together "
                             "(or give none of them and --distributed to read the cluster scheduler's environment)")
        if self.coordinator is not None:
            host, _, port = self.coordinator.rpartition(":")
            if not host or not port.isdigit() or not 0 < int(port) < 65536:
                raise ValueError(f"coordinator: expected HOST:PORT, got {self.coordinator!r}")
            if self.num_processes < 1:
                raise ValueError(f"num_processes: must be at least 1, got {self.num_processes}")
            if not 0 <= self.process_id < self.num_processes:
                raise ValueError(f"process_id: must be in [0, {self.num_processes}), got {self.process_id}")
        if self.timeout_s < 1:
            raise ValueError(f"timeout: must be at least 1 second, got {self.timeout_s}")


def initialize(place: JobPlace) -> None:
    """Joins the job (before anything else starts JAX's backends).

    A process that never joins makes the others fail after ``timeout_s``; a process that dies
    later is noticed by the coordination service's heartbeats within ``timeout_s`` and the
    others stop with an error instead of waiting forever.
    """
    place.check()
    from jax._src import xla_bridge

    if xla_bridge.backends_are_initialized():
        raise RuntimeError("popjax.distributed.initialize must run before JAX starts (before any JAX computation)")
    where = f"at {place.coordinator}" if place.coordinator else "described by the cluster scheduler's environment"
    who = f"process {place.process_id} of {place.num_processes}" if place.coordinator else "a process"
    # JAX ends a process whose job fails (a peer that never joins or stops answering) with its own message,
    # "Terminating process because the JAX distributed service detected fatal errors": say what to expect.
    print(f"popjax: {who} joining the job {where}; if another process does not join or stops answering "
          f"for {place.timeout_s} s, JAX stops this one", file=sys.stderr, flush=True)
    jax.distributed.initialize(place.coordinator, place.num_processes, place.process_id,
                               initialization_timeout=place.timeout_s,
                               heartbeat_timeout_seconds=place.timeout_s)
    print(f"popjax: joined as process {jax.process_index()} of {jax.process_count()}, "
          f"{jax.local_device_count()} of the job's {jax.device_count()} devices here", file=sys.stderr, flush=True)


def processes() -> int:
    """The job's number of processes (1 unless ``initialize`` ran; never starts JAX's backends)."""
    from jax._src import distributed

    return distributed.global_state.num_processes if jax.distributed.is_initialized() else 1


def is_writer() -> bool:
    """Whether this process writes the run's files (process 0; the only process of a single-process run)."""
    from jax._src import distributed

    return not jax.distributed.is_initialized() or distributed.global_state.process_id == 0


def fetch(tree: PyTree) -> PyTree:
    """``jax.device_get`` that also reads arrays split over several processes (gathering them from all
    processes: every process must call it at the same point)."""
    from jax.experimental import multihost_utils

    def one(x):
        if isinstance(x, jax.Array) and not x.is_fully_addressable and not x.is_fully_replicated:
            return np.asarray(multihost_utils.process_allgather(x, tiled=True))
        return jax.device_get(x)

    return jax.tree.map(one, tree)


def gather_rows(local: np.ndarray) -> np.ndarray:
    """Every process's rows (its members', in process order) as one array, on every process."""
    if processes() == 1:
        return np.asarray(local)
    from jax.experimental import multihost_utils

    # As 32-bit words: JAX without x64 would round float64 returns to float32 on the way.
    a = np.ascontiguousarray(local)
    words = a.reshape(a.shape[0], -1).view(np.uint32)
    gathered = np.asarray(multihost_utils.process_allgather(words, tiled=True))
    return gathered.view(a.dtype).reshape((-1,) + a.shape[1:])


def free_local_port() -> int:
    """A TCP port free on 127.0.0.1 now, for the coordinator of a job on this machine (tests, benchmarks)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def barrier(name: str) -> None:
    """Waits until every process reaches the barrier called ``name`` (a no-op for one process)."""
    if processes() > 1:
        from jax.experimental import multihost_utils

        multihost_utils.sync_global_devices(name)
