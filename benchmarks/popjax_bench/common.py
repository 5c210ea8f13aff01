"""Shared benchmark machinery: timing, machine description, devices, memory, JSON and plots.

Timing rules:

- compile time is measured separately (AOT ``lower().compile()``), never mixed into run time;
- every timed call blocks on **every leaf** of its output (``jax.block_until_ready``);
- the first ``warmup`` calls are dropped, then calls are repeated until both a minimum count
  (at least 10 in every study, K-step calls included) and a minimum wall time are reached;
  we report the median and the IQR (and the paper-style mean); a per-point time budget is
  kept by skipping larger N (recorded), never by timing fewer calls;
- all implementations of one comparison are timed in the same process, one after another,
  so that ratios are measured under the same machine load;
- every study runs in a ``Sitting``: it refuses to start when the 1-minute load average
  exceeds half the cores (unless ``--allow-busy``, which stamps the results ``busy``), and it
  measures the machine's ceilings in the same process (the dense-matmul peak before and after
  the study, and the N×[B,h]@[h,h] ceiling of the workload's dominant layer beside the points
  it bounds).
"""

from __future__ import annotations

import datetime
import json
import math
import os
import platform
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import jax
import numpy as np

DEFAULT_OUT = Path("benchmarks/results")


# --- timing ---------------------------------------------------------------------------------
def block(tree: Any) -> Any:
    """Blocks on every array leaf of ``tree`` (jax arrays; torch tensors are synchronous on CPU)."""
    return jax.block_until_ready(tree)


def time_calls(
    call: Callable[[], Any],
    *,
    warmup: int = 2,
    min_repeats: int = 10,
    max_repeats: int = 200,
    min_time: float = 1.0,
    sync: Callable[[Any], Any] = block,
) -> dict[str, Any]:
    """Times ``call()`` repeatedly; every call's output is synchronised with ``sync`` before the clock stops.

    Args:
      call: the thing to time; its return value is passed to ``sync``.
      warmup: untimed calls first (first execution, caches, allocator warm-up).
      min_repeats, max_repeats: bounds on the number of timed calls (``min_repeats`` is always reached).
      min_time: keep repeating (up to ``max_repeats``) until this much time was spent timing.
      sync: blocks until the output is computed (``jax.block_until_ready`` by default).

    Returns:
      ``{"median_s", "mean_s", "min_s", "max_s", "iqr_s", "repeats", "times_s"}``.
    """
    for _ in range(warmup):
        sync(call())
    times: list[float] = []
    spent = 0.0
    while len(times) < max(max_repeats, min_repeats):
        start = time.perf_counter()
        sync(call())
        elapsed = time.perf_counter() - start
        times.append(elapsed)
        spent += elapsed
        if len(times) >= min_repeats and spent >= min_time:
            break
    return summarize(times)


def time_interleaved(
    entries: Sequence[tuple[Callable[[], Any], Callable[[Any], Any], int]],
    *,
    min_time: float = 1.0,
    max_repeats: int = 200,
) -> list[dict[str, Any]]:
    """Times several (already warmed-up) calls **round-robin**: one call of each in turn.

    Each entry is ``(call, sync, min_repeats)``; an entry stops once it has ``min_repeats`` calls
    and ``min_time`` seconds (or ``max_repeats`` calls, never fewer than ``min_repeats``), the
    others go on. On a shared machine this exposes every implementation to the same load, so
    their ratio is meaningful even when the absolute times drift.
    """
    times: list[list[float]] = [[] for _ in entries]
    spent = [0.0] * len(entries)
    active = list(range(len(entries)))
    while active:
        for i in list(active):
            call, sync, min_repeats = entries[i]
            start = time.perf_counter()
            sync(call())
            elapsed = time.perf_counter() - start
            times[i].append(elapsed)
            spent[i] += elapsed
            n = len(times[i])
            if n >= min_repeats and (spent[i] >= min_time or n >= max_repeats):
                active.remove(i)
    return [summarize(t) for t in times]


def estimated_seconds(call_s: float, scale: float, *, repeats: int, min_time: float, warmup: int) -> float:
    """Seconds a point will take (warm-up and timed calls, compilation excluded) when one call took
    ``call_s`` at the previous size and the work grows by ``scale`` (the ratio of population sizes:
    linear, an over-estimate at small N)."""
    t = call_s * scale
    return warmup * t + max(repeats * t, min_time)


def summarize(times: Sequence[float]) -> dict[str, Any]:
    arr = np.asarray(times, np.float64)
    q1, q3 = np.percentile(arr, [25, 75])
    return {
        "median_s": float(np.median(arr)),
        "mean_s": float(arr.mean()),
        "min_s": float(arr.min()),
        "max_s": float(arr.max()),
        "iqr_s": float(q3 - q1),
        "repeats": int(arr.size),
        "times_s": [float(t) for t in arr],
    }


class Stopwatch:
    """``with Stopwatch() as sw: ...`` then ``sw.seconds``."""

    def __enter__(self):
        self.start = time.perf_counter()
        self.seconds = float("nan")
        return self

    def __exit__(self, *exc):
        self.seconds = time.perf_counter() - self.start
        return False


def compile_timed(fn: Callable, *args, donate_argnums: tuple[int, ...] = (), **jit_kwargs):
    """AOT-compiles ``jax.jit(fn)`` for ``args``; returns ``(compiled, {"lower_s", "compile_s"})``.

    ``compile_s`` is lowering + XLA compilation (what a user waits for before the first step).
    """
    jitted = jax.jit(fn, donate_argnums=donate_argnums, **jit_kwargs)
    start = time.perf_counter()
    lowered = jitted.lower(*args)
    lowered_at = time.perf_counter()
    compiled = lowered.compile()
    end = time.perf_counter()
    return compiled, {
        "lower_s": lowered_at - start,
        "xla_compile_s": end - lowered_at,
        "compile_s": end - start,
    }


def cost_flops(compiled) -> float | None:
    """FLOPs of one execution from XLA's cost analysis (None where the backend gives none).

    Note: XLA counts the body of a ``while`` loop (``lax.scan``) **once**, whatever the trip
    count, so take FLOPs from the 1-step program and multiply by K.
    """
    try:
        analysis = compiled.cost_analysis()
    except Exception:  # noqa: BLE001 - some backends do not implement it
        return None
    if isinstance(analysis, list | tuple):
        analysis = analysis[0] if analysis else None
    if not analysis or "flops" not in analysis:
        return None
    flops = float(analysis["flops"])
    return flops if flops > 0 else None


def memory_analysis(compiled) -> dict[str, float] | None:
    """XLA's static memory analysis of a compiled program, in MB (arguments, outputs, temporaries)."""
    try:
        stats = compiled.memory_analysis()
    except Exception:  # noqa: BLE001
        return None
    if stats is None:
        return None
    mb = lambda b: float(b) / 2**20
    return {
        "argument_mb": mb(stats.argument_size_in_bytes),
        "output_mb": mb(stats.output_size_in_bytes),
        "alias_mb": mb(stats.alias_size_in_bytes),
        "temp_mb": mb(stats.temp_size_in_bytes),
    }


def program_bytes(compiled) -> int | None:
    """Bytes a compiled program needs while it runs, from XLA's memory analysis: arguments + outputs +
    temporaries - aliased (a donated argument whose buffer is reused for an output counts once)."""
    try:
        stats = compiled.memory_analysis()
    except Exception:  # noqa: BLE001 - some backends do not implement it
        return None
    if stats is None:
        return None
    return int(stats.argument_size_in_bytes + stats.output_size_in_bytes + stats.temp_size_in_bytes
               - stats.alias_size_in_bytes)


def device_memory_limit(device=None) -> tuple[int | None, str]:
    """``(bytes, source)``: the memory a program may use on ``device`` (default: the first device).

    GPU/TPU: ``device.memory_stats()["bytes_limit"]`` when the backend reports it; CPU: the
    machine's available RAM (``psutil.virtual_memory().available``); else ``(None, reason)``.
    """
    device = device or jax.devices()[0]
    try:
        stats = device.memory_stats()
    except Exception:  # noqa: BLE001 - not every backend has memory stats
        stats = None
    if stats and stats.get("bytes_limit"):
        return int(stats["bytes_limit"]), f"{device.platform} device.memory_stats()['bytes_limit']"
    if device.platform == "cpu":
        import psutil

        return int(psutil.virtual_memory().available), "available RAM (psutil.virtual_memory().available)"
    return None, f"no memory limit reported by the {device.platform} device"


# --- memory -------------------------------------------------------------------------------------
def rss_mb() -> float:
    """Resident set size of this process in MB."""
    try:
        import psutil

        return psutil.Process().memory_info().rss / 2**20
    except ImportError:  # pragma: no cover - psutil ships with the dev environment
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


class PeakMemory:
    """Samples RSS (and device memory stats where the backend has them) while the block runs.

    ``rss_delta_mb`` = peak RSS during the block minus RSS when it started: what the timed
    implementation allocated on top of what already existed (inputs built before are excluded).
    ``device_peak_mb`` = the device allocator's peak bytes in use (GPU/TPU; None on CPU).
    """

    def __init__(self, interval: float = 0.005):
        self.interval = interval
        self._stop = threading.Event()

    def __enter__(self):
        self.start_mb = rss_mb()
        self.peak_mb = self.start_mb
        self._device_start = _device_bytes_in_use()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self):
        while not self._stop.wait(self.interval):
            self.peak_mb = max(self.peak_mb, rss_mb())

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self.peak_mb = max(self.peak_mb, rss_mb())
        return False

    def result(self) -> dict[str, Any]:
        device_peak = _device_peak_bytes()
        return {
            "rss_start_mb": round(self.start_mb, 2),
            "rss_peak_mb": round(self.peak_mb, 2),
            "rss_delta_mb": round(self.peak_mb - self.start_mb, 2),
            "device_peak_mb": None if device_peak is None else round(device_peak / 2**20, 2),
            "device_start_mb": None if self._device_start is None else round(self._device_start / 2**20, 2),
        }


def _device_stats():
    try:
        return jax.devices()[0].memory_stats()
    except Exception:  # noqa: BLE001
        return None


def _device_bytes_in_use():
    stats = _device_stats()
    return None if not stats else stats.get("bytes_in_use")


def _device_peak_bytes():
    stats = _device_stats()
    return None if not stats else stats.get("peak_bytes_in_use")


# --- devices ----------------------------------------------------------------------------------------
def backends_initialized() -> bool:
    try:
        from jax._src import xla_bridge

        return bool(xla_bridge._backends)
    except Exception:  # noqa: BLE001 - private API; assume initialised (the safe answer)
        return True


def request_devices(counts: Sequence[int]) -> None:
    """Makes ``max(counts)`` devices visible, forcing host (CPU) devices when needed.

    On a CPU JAX shows one device unless told otherwise; this sets ``jax_num_cpu_devices``
    (same effect as ``XLA_FLAGS=--xla_force_host_platform_device_count=N``) when the backend
    is not initialised yet. Raises ValueError if the devices cannot be had.
    """
    want = max(counts)
    forced = "xla_force_host_platform_device_count" in os.environ.get("XLA_FLAGS", "")
    if want > 1 and not forced and not backends_initialized():
        jax.config.update("jax_num_cpu_devices", want)
    have = len(jax.devices())
    if have < want:
        raise ValueError(
            f"--devices {want}: JAX sees {have} {jax.devices()[0].platform} device(s); on a CPU run with "
            f"XLA_FLAGS=--xla_force_host_platform_device_count={want} (set before JAX starts)"
        )


def mesh_sharding(devices: int, axis: int = 0, ndim: int | None = None):
    """A NamedSharding splitting ``axis`` over the first ``devices`` devices (None for 1 device)."""
    if devices <= 1:
        return None
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    mesh = Mesh(np.asarray(jax.devices()[:devices]), ("pop",))
    spec = (None,) * axis + ("pop",)
    return NamedSharding(mesh, PartitionSpec(*spec))


def place(tree: Any, devices: int, axis: int = 0) -> Any:
    """Puts every leaf on device (split over ``devices`` along ``axis``) and blocks.

    Over the devices of several processes (``jax.distributed``) every process passes the same values;
    PRNG key leaves go as their key data (``device_put`` takes only plain arrays there).
    """
    if devices <= 1:
        return block(jax.device_put(tree, jax.devices()[0]))
    sharding = mesh_sharding(devices, axis)

    def put(x):
        if not sharding.is_fully_addressable and jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
            return jax.random.wrap_key_data(jax.device_put(jax.random.key_data(x), sharding),
                                            impl=jax.random.key_impl(x))
        return jax.device_put(x, sharding)

    return block(jax.tree.map(put, tree))


def shards(tree: Any) -> int:
    """The most pieces any array leaf of ``tree`` is split into over devices (1: nothing is split).

    A replicated leaf counts 1 however many devices hold it: this shows whether a population
    state really is split over the devices, not merely copied to them.
    """
    most = 1
    for leaf in jax.tree.leaves(tree):
        if isinstance(leaf, jax.Array):
            most = max(most, len({repr(shard.index) for shard in leaf.addressable_shards}))
    return most


def parse_int_list(text: str | Sequence[int]) -> list[int]:
    """``"1,2,4"`` (or ``1e3``-style integers) -> ``[1, 2, 4]``; ValueError unless all are positive integers."""
    from popjax_bench.options import parse_int_list as parse

    if not isinstance(text, str):
        return [int(x) for x in text]
    return parse(text)


# --- machine description ---------------------------------------------------------------------------
def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _version(module: str) -> str | None:
    try:
        from importlib.metadata import version

        return version(module)
    except Exception:  # noqa: BLE001
        return None


def load_average() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def machine() -> dict[str, Any]:
    """Everything needed to interpret a timing: CPU, devices, library versions, flags, load."""
    devices = jax.devices()
    try:
        import psutil

        mem_gb = round(psutil.virtual_memory().total / 2**30, 1)
    except ImportError:  # pragma: no cover
        mem_gb = None
    return {
        "cpu": _cpu_model(),
        "cpu_count": os.cpu_count(),
        "cpu_affinity": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "memory_gb": mem_gb,
        "platform": platform.platform(),
        "python": sys.version.split()[0],
        "jax": jax.__version__,
        "jaxlib": _version("jaxlib"),
        "flax": _version("flax"),
        "optax": _version("optax"),
        "torch": _version("torch"),
        "numpy": np.__version__,
        "backend": jax.default_backend(),
        "devices": [{"id": d.id, "platform": d.platform, "kind": d.device_kind} for d in devices],
        "device_count": len(devices),
        "xla_flags": os.environ.get("XLA_FLAGS", ""),
        "jax_num_cpu_devices": jax.config.values.get("jax_num_cpu_devices"),
        "load_average": load_average(),
    }


# --- load discipline and ceilings -------------------------------------------------------------------------
BUSY_SHARE = 0.5  # a machine is busy when other work exceeds half its cores
PEAK_N = 2048  # the dense-matmul peak: [n, n] @ [n, n] float32


def busy_threshold() -> float:
    """The 1-minute load average above which a study refuses to start: half the cores."""
    return (os.cpu_count() or 1) * BUSY_SHARE


class BusyMachine(ValueError):
    """The machine is too busy for comparable timings (a one-line user error: exit status 2)."""


def wait_for_quiet(allow_busy: bool = False, wait_s: float = 0.0, poll_s: float = 5.0) -> list[float] | None:
    """The load average once it is at most ``busy_threshold()`` (waiting up to ``wait_s`` seconds for it).

    Raises ``BusyMachine`` if it is still above then, unless ``allow_busy``. ``None`` where the
    platform has no load average (nothing can be checked).
    """
    threshold = busy_threshold()
    load = load_average()
    if load is None:
        return None
    deadline = time.monotonic() + wait_s
    if load[0] > threshold and wait_s > 0:
        log(f"1-minute load average {load[0]:.2f} > {threshold:g}: waiting up to {wait_s:.0f}s for the machine "
            "to be quiet")
    while load[0] > threshold and time.monotonic() < deadline:
        time.sleep(max(0.0, min(poll_s, deadline - time.monotonic())))
        load = load_average()
    if load[0] > threshold and not allow_busy:
        raise BusyMachine(
            f"the machine is busy: 1-minute load average {load[0]:.2f} > {threshold:g} (half of its "
            f"{os.cpu_count()} cores), so timings would not be comparable; wait until it is quiet (--wait-quiet "
            "SECONDS waits for it), or pass --allow-busy to run anyway (the results are stamped busy and get no "
            "verdict)")
    return load


def cpu_snapshot() -> dict[str, float] | None:
    """Wall clock, the machine's busy CPU seconds and this process's (children included) CPU seconds."""
    try:
        import psutil
    except ImportError:  # pragma: no cover - psutil is a dependency
        return None
    machine_cpu = psutil.cpu_times()
    busy = sum(getattr(machine_cpu, name, 0.0) for name in ("user", "nice", "system", "irq", "softirq", "steal"))
    me = psutil.Process()
    own = sum(me.cpu_times()[:4])  # user, system, children_user, children_system (exited children)
    for child in me.children(recursive=True):
        try:
            own += sum(child.cpu_times()[:2])
        except psutil.Error:
            pass
    return {"wall": time.monotonic(), "machine_busy_s": busy, "own_s": own}


def others_cpu_share(since: dict[str, float] | None) -> float | None:
    """Share of the machine's CPU capacity (all cores) used by **other** processes since ``since``
    (``cpu_snapshot()``); steal time (another VM on the same host) counts as other work."""
    now = cpu_snapshot()
    if since is None or now is None:
        return None
    wall = now["wall"] - since["wall"]
    if wall <= 0:
        return None
    others = (now["machine_busy_s"] - since["machine_busy_s"]) - (now["own_s"] - since["own_s"])
    return max(0.0, others) / (wall * (os.cpu_count() or 1))


def matmul_gflops(n: int | None = None, devices: int = 1, *, repeats: int = 10, min_time: float = 1.0,
                  seed: int = 0) -> dict[str, Any]:
    """Dense float32 ``[n, n] @ [n, n]`` throughput (GFLOP/s), one product per device (``n``: ``PEAK_N``)."""
    import jax.numpy as jnp

    n = n or PEAK_N
    key_a, key_b = jax.random.split(jax.random.key(seed + n))
    a = place(jax.random.normal(key_a, (devices, n, n), jnp.float32), devices)
    b = place(jax.random.normal(key_b, (devices, n, n), jnp.float32), devices)
    compiled, _ = compile_timed(lambda x, y: jnp.einsum("dij,djk->dik", x, y), a, b)
    timing = time_calls(lambda: compiled(a, b), warmup=2, min_repeats=repeats, min_time=min_time)
    flops = 2.0 * devices * n**3
    return {"n": n, "devices": devices, "flops": flops, "xla_flops": cost_flops(compiled),
            "gflops": flops / timing["median_s"] / 1e9, "timing": timing}


def layer_gflops(pop: int, batch: int, width: int, devices: int = 1, *, repeats: int = 10, min_time: float = 1.0,
                 seed: int = 0) -> dict[str, Any]:
    """GFLOP/s of ``pop`` independent ``[batch, width] @ [width, width]`` products (one batched dot, the
    member axis split over ``devices``): the dominant layer of a population update at its real shapes,
    so the realistic ceiling of that workload."""
    import jax.numpy as jnp

    key_a, key_b = jax.random.split(jax.random.key(seed + pop))
    a = place(jax.random.normal(key_a, (pop, batch, width), jnp.float32), devices)
    b = place(jax.random.normal(key_b, (pop, width, width), jnp.float32), devices)
    compiled, _ = compile_timed(lambda x, y: jnp.einsum("nbi,nio->nbo", x, y), a, b)
    timing = time_calls(lambda: compiled(a, b), warmup=2, min_repeats=repeats, min_time=min_time)
    return {"pop": pop, "batch": batch, "width": width, "devices": devices,
            "gflops": 2.0 * pop * batch * width * width / timing["median_s"] / 1e9, "timing": timing}


class Sitting:
    """The conditions of one study's run, recorded beside its figures.

    Opening it refuses to start on a busy machine (``wait_for_quiet``: the 1-minute load average
    above half the cores) unless ``allow_busy``, starts counting the CPU time other processes use,
    and measures the dense-matmul peak (``PEAK_N``², float32, one device). ``layer(...)`` measures
    the N×[B,h]@[h,h] ceiling of the workload's dominant layer just before the points it bounds.
    ``record()`` measures the peak again and returns the payload fields: ``busy`` (true when the
    study started above the threshold, allowed by ``--allow-busy``, or when other processes used
    more than half the CPU while it ran), ``busy_reasons``, ``load_before`` / ``load_after``,
    ``load`` (threshold, others' CPU share) and ``ceilings``.
    """

    def __init__(self, *, allow_busy: bool = False, wait_quiet: float = 0.0, repeats: int = 10,
                 min_time: float = 1.0, seed: int = 0):
        self.allow_busy = allow_busy
        self.threshold = busy_threshold()
        self.load_before = wait_for_quiet(allow_busy, wait_quiet)
        self._cpu = cpu_snapshot()
        self.repeats, self.min_time, self.seed = repeats, min_time, seed
        peak = matmul_gflops(repeats=repeats, min_time=min_time, seed=seed)
        log(f"  sitting: load {self.load_before}, dense matmul {peak['n']}² f32 {peak['gflops']:.1f} GFLOP/s")
        self.ceilings: dict[str, Any] = {"dense_matmul": {"n": peak["n"], "before": peak}, "layers": []}
        self._layers: dict[tuple[int, int, int, int], dict[str, Any]] = {}

    def layer(self, pop: int, batch: int, width: int, devices: int = 1) -> float:
        """The N×[B,h]@[h,h] ceiling (GFLOP/s) for these shapes, measured now (once per shape and device count)."""
        key = (pop, batch, width, devices)
        if key not in self._layers:
            row = layer_gflops(pop, batch, width, devices, repeats=self.repeats, min_time=self.min_time,
                               seed=self.seed)
            self._layers[key] = row
            self.ceilings["layers"].append(row)
            log(f"  ceiling {pop}×[{batch},{width}]@[{width},{width}] d={devices}: {row['gflops']:.1f} GFLOP/s")
        return self._layers[key]["gflops"]

    def record(self, final: bool = True) -> dict[str, Any]:
        """The payload fields; ``final``: the study is over, the peak is measured again (else the fields of
        a partial result, written while the study runs, marked ``partial``)."""
        others = others_cpu_share(self._cpu)
        peak = self.ceilings["dense_matmul"]
        if final:
            peak["after"] = matmul_gflops(repeats=self.repeats, min_time=self.min_time, seed=self.seed)
        peak["gflops"] = max(peak["before"]["gflops"], peak.get("after", peak["before"])["gflops"])
        reasons = []
        if self.load_before is not None and self.load_before[0] > self.threshold:
            reasons.append(f"1-minute load average {self.load_before[0]:.2f} > {self.threshold:g} at the start "
                           "(run with --allow-busy)")
        if others is not None and others > BUSY_SHARE:
            reasons.append(f"other processes used {100 * others:.0f}% of the CPU while the study ran")
        if reasons and final:
            log("  BUSY: " + "; ".join(reasons))
        return {**({} if final else {"partial": True}), "busy": bool(reasons), "busy_reasons": reasons,
                "load_before": self.load_before,
                "load_after": load_average(),
                "load": {"threshold_1min": self.threshold, "others_cpu_share": others, "allow_busy": self.allow_busy},
                "ceilings": self.ceilings}


# --- results -----------------------------------------------------------------------------------------
def utc_now() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, Path):
        return str(value)
    return value


def output_paths(out: str | Path | None, study: str) -> tuple[Path, Path]:
    """``(json_path, png_path)``: ``out`` is a directory (``<out>/<study>.json``) or a ``.json`` file."""
    out = Path(out) if out is not None else DEFAULT_OUT
    if out.suffix == ".json":
        return out, out.with_suffix(".png")
    return out / f"{study}.json", out / f"{study}.png"


def write_study(out: str | Path | None, study: str, payload: dict[str, Any], plot_fn, plot: bool) -> dict[str, Any]:
    """Writes ``<study>.json`` (and its PNG via ``plot_fn(payload, png_path)`` when ``plot``); returns the payload."""
    json_path, png_path = output_paths(out, study)
    write_json(json_path, payload)
    if plot:
        plot_fn(payload, png_path)
    log(f"wrote {json_path}")
    return payload


def write_json(path: Path, payload: dict[str, Any]) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(_jsonable(payload), indent=1) + "\n")
    tmp.replace(path)
    return path


def study_payload(
    study: str,
    params: dict[str, Any],
    results: list[dict[str, Any]],
    started: str,
    notes: list[str] | None = None,
    **extra: Any,
) -> dict[str, Any]:
    """The common JSON layout of every study."""
    return {
        "study": study,
        "started_utc": started,
        "finished_utc": utc_now(),
        "machine": machine(),
        "params": params,
        "results": results,
        "notes": notes or [],
        # JAX's persistent compilation cache (popjax.compile_cache): compile times of programs it held are loads
        "compile_cache": jax.config.jax_compilation_cache_dir if jax.config.jax_enable_compilation_cache else None,
        **extra,
    }


def log(message: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", flush=True)


# --- plots -----------------------------------------------------------------------------------------
def pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def machine_caption(machine_info: dict[str, Any]) -> str:
    kinds = sorted({d["kind"] for d in machine_info["devices"]})
    return (
        f"{machine_info['cpu']} ({machine_info['cpu_count']} cores) · {machine_info['backend']} "
        f"{'/'.join(kinds)} ×{machine_info['device_count']} · jax {machine_info['jax']} · "
        f"load {machine_info['load_average']}"
    )


def save_figure(fig, path: Path, machine_info: dict[str, Any] | None = None) -> Path:
    if machine_info:
        fig.text(0.01, 0.005, machine_caption(machine_info), fontsize=7, color="0.4")
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    pyplot().close(fig)
    return path
