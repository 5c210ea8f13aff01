"""Study ``update`` (fast-PBT paper Fig. 2): one population-wide update step vs population size.

For TD3 and SAC (MLP 256x256, B 256, HalfCheetah shapes obs 17 / act 6) and DQN (Nature
CNN on 84x84x4 uint8 frames, B 32, 18 actions), with synthetic batches already on the
device, the implementations timed in the same process are:

- ``vmap``: popjax, ``jit(vmap(update))``, one step per call;
- ``vmap_scan``: popjax, K steps per call (``lax.scan`` over K pre-sampled batches; K=50
  TD3/SAC, 10 DQN) — the paper's "num_steps" trick, time reported per step;
- ``jax_seq``: the same single-member update jitted and called member after member (one
  step per call, dispatch is asynchronous, we block once per population step);
- ``torch_seq``: the same networks and losses in PyTorch (``torch_reference``), one member
  after another, one step per call — the paper's baseline (skipped with a message when
  PyTorch is not installed). TD3's timed call is one policy-delay period of such steps (its
  cost alternates between critic-only and critic+actor steps), divided by the period.
- ``torch_compile``, ``torch_vmap``, ``torch_vmap_compile``, ``torch_vmap_cudagraph`` (TD3 and SAC): the
  strongest PyTorch a user can write (``torch_functional``): one member's functional step under
  ``torch.compile`` called member after member, the step vectorized over members with ``torch.func.vmap`` (the
  paper's "Torch (Vectorized)"), that under ``torch.compile``, and that captured as CUDA graphs
  (``mode="reduce-overhead"``; on a CPU it falls back to the default mode, and its rows say so:
  ``cuda_graphs``, ``torch_compile_mode``); their compile time (the first calls) is reported apart. Each ratio names
  its baseline; ``speedup_vs_torch_best`` is against the fastest PyTorch variant at that N.

``vmap``/``vmap_scan`` run once per requested device count (the member axis split over the
devices with a NamedSharding); the sequential baselines run on one device.

``--processes P`` (``run_processes``): the same ``vmap``/``vmap_scan`` points with the population
split over the CPU devices of P local processes joined with ``jax.distributed`` (coordinator and
gloo collectives over 127.0.0.1), each process forcing ``--devices d`` devices, against 1 process
forcing P×d devices; both are jobs of subprocesses (``popjax_bench.update_worker``), bounded in
time and killed with the study. Rows carry ``processes``, ``devices`` (P×d) and
``devices_per_process``; the P-process rows ``vs_one_process`` (time ÷ the 1-process time) and
``communication_share`` (``(t_P - t_1) / t_P`` when positive); every row the collective ops of its
compiled update (``hlo_collectives``: none, the members being independent) and ``fetch_ms`` (a host
read of one value per member, an all-gather across processes). The sequential baselines are not run
there (refused when named in ``--impl``).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import numpy as np

from popjax import distributed, precision
from popjax.learners import LEARNERS
from popjax.learners.base import chunk_update, one_update
from popjax.population.tree import broadcast, member
from popjax.types import EnvSpec, Transition
from popjax_bench import arithmetic, common
from popjax_bench import options as opt
from popjax_bench.common import log

STUDY = "update"
TORCH_IMPLS = ("torch_seq", "torch_compile", "torch_vmap", "torch_vmap_compile", "torch_vmap_cudagraph")
IMPLS = ("vmap", "vmap_scan", "jax_seq", *TORCH_IMPLS)
VECTORIZED = ("vmap", "vmap_scan")
FUNCTIONAL_LEARNERS = ("td3", "sac")  # the functional PyTorch variants (torch_functional) exist for these
DEFAULT_POPS = (1, 2, 4, 8, 16, 32, 64)
PROBLEMS = ("td3", "sac", "dqn")  # learners with the paper's timing shapes (``problem``)
CUDA_GRAPH_FALLBACK = ("torch_vmap_cudagraph ran without CUDA graphs (PyTorch's device is not CUDA): torch.compile's "
                       "default mode, the same program as torch_vmap_compile; its rows say cuda_graphs false")


@dataclasses.dataclass(frozen=True)
class Options(opt.StudyOptions):
    """``popjax bench update`` (and ``update.run(...)``)."""

    STUDY: ClassVar[str] = STUDY
    learners: tuple[str, ...] = opt.names(("td3", "sac", "dqn"), "comma-separated learners", flag="--learner",
                                          allowed=PROBLEMS, what=" learner")
    pops: tuple[int, ...] = opt.ints(DEFAULT_POPS, "population sizes, comma-separated", flag="--pop")
    impls: tuple[str, ...] | None = opt.names(None, "comma-separated subset of " + ",".join(IMPLS) + " (default: "
                                              "all; with --processes > 1: vmap,vmap_scan)", flag="--impl",
                                              allowed=IMPLS, what=" implementation")
    k: int | None = opt.integer(None, "update steps per compiled call of vmap_scan (default: 50 TD3/SAC, 10 DQN)")
    hidden: tuple[int, ...] | None = opt.ints(None, "override hidden sizes, e.g. 64,64 (DQN: its MLP head)")
    batch_size: int | None = opt.integer(None, "override the batch size")
    frame: int = opt.integer(84, "DQN frame side (84 = Atari)", ge=36)
    torch_threads: tuple[int, ...] = opt.ints((1, 2), "torch.set_num_threads of the PyTorch baseline: one run "
                                              "per value, the fastest at each N is the baseline")
    repeats: int = opt.repeats()
    min_time: float = opt.min_time()
    max_seconds: float = opt.max_seconds()
    memory_fit: bool = opt.memory_fit(False)
    processes: int = opt.integer(1, "P > 1: time vmap/vmap_scan with the population split over the CPU devices of "
                                 "P local processes joined with jax.distributed (CPU collectives over 127.0.0.1), "
                                 "each process with --devices devices, against 1 process with as many devices in "
                                 "all (P x --devices); both run as subprocesses; the sequential baselines "
                                 "(jax_seq, torch_seq) run in one process only and are refused")
    matmul_precision: str = opt.text("default", "arithmetic of matrix products on both sides: JAX's (popjax's "
                                     "matmul_precision) and PyTorch set to compute the same (fp32, TF32 or bf16)",
                                     allowed=precision.MATMUL_PRECISIONS, what=" precision")

    def check(self) -> None:
        if self.processes > 1 and self.impls is not None:
            sequential = [i for i in self.impls if i not in VECTORIZED]
            if sequential:
                raise ValueError(f"--impl: {', '.join(sequential)} run(s) member after member on one device of one "
                                 f"process; with --processes {self.processes} give vmap and/or vmap_scan")

    def device_splits(self) -> list[int]:
        return [self.processes * d for d in self.devices]  # with --processes: P x d devices in all

    def devices_needed(self) -> list[int]:
        # With --processes the points run in subprocesses that force their own devices.
        return [1] if self.processes > 1 else list(self.devices)

    @property
    def implementations(self) -> tuple[str, ...]:
        """``impls``, or the study's own choice: all of them in one process, the vectorized ones with processes."""
        if self.impls is not None:
            return self.impls
        return IMPLS if self.processes == 1 else VECTORIZED


@dataclasses.dataclass(frozen=True)
class Problem:
    """A learner with the paper's timing shapes."""

    learner: str
    spec: EnvSpec
    config: Any
    k: int

    @property
    def batch_size(self) -> int:
        return self.config.batch_size


def problem(
    name: str,
    hidden: tuple[int, ...] | None = None,
    batch_size: int | None = None,
    k: int | None = None,
    frame: int = 84,
) -> Problem:
    """The paper's shapes for ``name`` (td3, sac: HalfCheetah; dqn: Atari), optionally shrunk (tests)."""
    if name not in LEARNERS:
        raise ValueError(f"--learner: {name!r} unknown learner (allowed: {', '.join(LEARNERS)})")
    definition = LEARNERS[name]
    if name in ("td3", "sac"):
        spec = EnvSpec(
            f"{name}-halfcheetah-shapes", (17,), action_dim=6, action_low=(-1.0,) * 6, action_high=(1.0,) * 6
        )
        config = definition.config_cls(hidden=tuple(hidden or (256, 256)), batch_size=batch_size or 256)
        return Problem(name, spec, config, k or 50)
    if name == "dqn":
        spec = EnvSpec("dqn-atari-shapes", (frame, frame, 4), num_actions=18)
        # Nature DQN head (512,), double Q, Huber; the paper's timing config.
        config = definition.config_cls(
            hidden=tuple(hidden or (512,)),
            batch_size=batch_size or 32,
            cnn=True,
            double_q=True,
            dueling=False,
            huber=True,
        )
        return Problem(name, spec, config, k or 10)
    raise ValueError(f"learner {name!r}: the update benchmark knows td3, sac, dqn")


@functools.cache
def make_learner(p: Problem):
    """``(learner, single-member default hparams)``, cached so jitted helpers compile once per problem.

    The config is specialized as ``popjax.train`` does for a population whose members share the
    default hparams (TD3: its policy delay is fixed, so the K-step program does no discarded actor
    work); the 1-step program uses ``single_step(p)``'s learner, the traced gate.
    """
    definition = LEARNERS[p.learner]
    hparams = definition.default_hparams(p.config)
    config = p.config
    if definition.fit.specialize is not None:
        config = definition.fit.specialize(config, broadcast(hparams, 1), p.k, frozenset())
    return definition.make(config, p.spec), hparams


def single_step(p: Problem) -> Problem:
    """``p`` for one update per call: nothing specialized for K (TD3's policy delay stays the traced gate)."""
    return dataclasses.replace(p, k=1)


@functools.cache
def _batch_maker(p: Problem):
    spec, b = p.spec, p.batch_size

    @functools.partial(jax.jit, static_argnums=(1, 2))
    def make(key, k: int | None, pop: int) -> Transition:
        lead = (pop, b) if k is None else (k, pop, b)
        ko, ka, kr, kn, kt = jax.random.split(key, 5)
        if spec.discrete:  # Atari frames are stored as uint8, as in a replay buffer
            obs = jax.random.randint(ko, lead + spec.obs_shape, 0, 256, jnp.int32).astype(jnp.uint8)
            next_obs = jax.random.randint(kn, lead + spec.obs_shape, 0, 256, jnp.int32).astype(jnp.uint8)
            action = jax.random.randint(ka, lead, 0, spec.num_actions, jnp.int32)
        else:
            obs = jax.random.normal(ko, lead + spec.obs_shape)
            next_obs = jax.random.normal(kn, lead + spec.obs_shape)
            action = jax.random.uniform(ka, lead + (spec.action_dim,), minval=-1.0, maxval=1.0)
        reward = jax.random.normal(kr, lead)
        terminated = (jax.random.uniform(kt, lead) < 0.01).astype(jnp.float32)
        return Transition(obs, action, reward, next_obs, terminated)

    return make


def synthetic_batches(p: Problem, k: int | None, pop: int, seed: int = 0) -> Transition:
    """Random batches ``[k, pop, B, ...]`` (``[pop, B, ...]`` if ``k`` is None) with the problem's shapes
    and dtypes, made on device."""
    return _batch_maker(p)(jax.random.key(seed), k, pop)


@functools.cache
def _pop_init(p: Problem):
    learner, _ = make_learner(p)
    return jax.jit(jax.vmap(learner.init))


def population_state(p: Problem, pop: int, seed: int = 0):
    """A fresh ``[pop]`` learner state and hparams (defaults for every member)."""
    _, hparams1 = make_learner(p)
    hparams = jax.tree.map(jnp.asarray, broadcast(hparams1, pop))
    return _pop_init(p)(jax.random.split(jax.random.key(seed), pop), hparams), hparams


def vmapped_step(learner):
    v_update = jax.vmap(one_update(learner))

    def step(keys, state, batch, hparams):
        return v_update(keys, state, batch, hparams)

    return step


def scanned_step(learner):
    """K steps per call: ``scan`` over ``[K, pop, ...]`` batches and keys in the learner's chunks (as
    popjax's drivers run them), ``vmap`` over members inside."""
    chunk = learner.step.chunk
    v_chunk = jax.vmap(chunk_update(learner), in_axes=(1, 0, 1, 0))

    def step(keys, state, batches, hparams):
        k = keys.shape[0]
        chunks = jax.tree.map(lambda x: x.reshape((k // chunk, chunk) + x.shape[1:]), (keys, batches))
        return jax.lax.scan(lambda s, xs: v_chunk(xs[0], s, xs[1], hparams), state, chunks)

    return step


# --- one implementation at one size ---------------------------------------------------------------
def _timing_kwargs(opts, k: int) -> dict[str, Any]:
    # Every point gets at least ``opts.repeats`` (>= 10) timed calls, K-step calls included.
    return dict(warmup=1 if k > 1 else 2, min_repeats=opts.repeats, min_time=opts.min_time)


def _ready(call, sync, opts, k: int, **fields) -> dict[str, Any]:
    """A prepared implementation: warmed up (inside the caller's memory measurement), ready to time."""
    kwargs = _timing_kwargs(opts, k)
    for _ in range(kwargs["warmup"]):
        sync(call())
    return {"call": call, "sync": sync, "steps_per_call": k, "min_repeats": kwargs["min_repeats"],
            "warmup_calls": kwargs["warmup"], **fields}


def measure(entries: list[dict[str, Any]], opts) -> list[dict[str, Any]]:
    """Times prepared implementations **interleaved** (one call of each in turn, round-robin), so that
    on a shared machine every implementation sees the same load; returns each entry with ``timing``."""
    timings = common.time_interleaved([(e["call"], e["sync"], e["min_repeats"]) for e in entries],
                                      min_time=opts.min_time)
    out = []
    for entry, timing in zip(entries, timings, strict=True):
        out.append(
            {key: v for key, v in entry.items() if key not in ("call", "sync", "min_repeats")} | {"timing": timing}
        )
    return out


_VMAP_COMPILED: dict[tuple, Any] = {}


def run_vmap(p: Problem, pop: int, devices: int, k: int, opts, reuse: bool = False) -> dict[str, Any]:
    """``prepare_vmap`` timed alone."""
    return measure([prepare_vmap(p, pop, devices, k, opts, reuse)], opts)[0]


def prepare_vmap(p: Problem, pop: int, devices: int, k: int, opts, reuse: bool = False) -> dict[str, Any]:
    """popjax vectorized: ``jit(vmap(update))`` (k == 1) or ``jit(scan(vmap(update)))`` (k > 1).

    ``reuse``: take the executable this process already compiled for the same point, if any
    (the roofline study times execution only; its compile time is then the original one).
    """
    learner, _ = make_learner(p if k > 1 else single_step(p))
    state, hparams = population_state(p, pop, opts.seed)
    # No eager slicing here: every eager op is a small compilation of its own.
    batches = synthetic_batches(p, None if k == 1 else k, pop, opts.seed)
    keys = jax.random.split(jax.random.key(opts.seed + 1), pop if k == 1 else (k, pop))
    if k == 1:
        fn, member_axis = vmapped_step(learner), 0
    else:
        fn, member_axis = scanned_step(learner), 1
    state = common.place(state, devices)
    hparams = common.place(hparams, devices)
    batches = common.place(batches, devices, member_axis)
    keys = common.place(keys, devices, member_axis)
    with common.PeakMemory() as mem:
        point = (p, pop, devices, k, arithmetic.choice(opts))
        if not (reuse and point in _VMAP_COMPILED):
            fn = arithmetic.jax_program(fn, arithmetic.choice(opts))
            _VMAP_COMPILED[point] = common.compile_timed(fn, keys, state, batches, hparams, donate_argnums=(1,))
        compiled, compile_times = _VMAP_COMPILED[point]
        holder = {"state": state}

        def call():
            new_state, metrics = compiled(keys, holder["state"], batches, hparams)
            holder["state"] = new_state
            return new_state, metrics

        entry = _ready(call, common.block, opts, k)
    flops = common.cost_flops(compiled)
    # XLA counts a scan body once: the K-step program's count is one chunk of the learner's updates.
    steps_counted = 1 if k == 1 else learner.step.chunk
    return entry | {
        "compile": compile_times,
        "memory": mem.result(),
        "xla_memory": common.memory_analysis(compiled),
        # With d devices XLA's cost analysis describes the partitioned (per-device) program.
        "xla_flops_per_call": None if flops is None else flops * devices,
        "xla_flops_per_step": None if flops is None else flops * devices / steps_counted,
        "chunk": steps_counted,
    }


_SEQ_COMPILED: dict[Problem, Any] = {}


def prepare_jax_seq(p: Problem, pop: int, opts) -> dict[str, Any]:
    """The single-member update jitted once and called for member 0, 1, ..., pop-1 (one step each)."""
    learner, _ = make_learner(single_step(p))
    state, hparams = population_state(p, pop, opts.seed)
    # Split members on the host (numpy): eager device slicing would compile one program per leaf shape.
    state, hparams, batch = jax.device_get((state, hparams, synthetic_batches(p, None, pop, opts.seed)))
    keys = jax.random.split(jax.random.key(opts.seed + 1), pop)
    dev = jax.devices()[0]
    states = [jax.device_put(member(state, i), dev) for i in range(pop)]
    batches = [jax.device_put(member(batch, i), dev) for i in range(pop)]
    hps = [jax.device_put(member(hparams, i), dev) for i in range(pop)]
    keys = [keys[i] for i in range(pop)]
    common.block((states, batches, hps, keys))
    del state, batch
    with common.PeakMemory() as mem:
        # The single-member program is the same for every N: compile it once per problem.
        if (p, arithmetic.choice(opts)) not in _SEQ_COMPILED:
            _SEQ_COMPILED[p, arithmetic.choice(opts)] = common.compile_timed(
                arithmetic.jax_program(one_update(learner), arithmetic.choice(opts)), keys[0],
                states[0], batches[0], hps[0], donate_argnums=(1,)
            )
        compiled, compile_times = _SEQ_COMPILED[p, arithmetic.choice(opts)]

        def call():
            outs = []
            for i in range(pop):
                states[i], metrics = compiled(keys[i], states[i], batches[i], hps[i])
                outs.append((states[i], metrics))
            return outs

        entry = _ready(call, common.block, opts, 1)
    return entry | {
        "compile": compile_times,
        "memory": mem.result(),
        "xla_memory": common.memory_analysis(compiled),
        "xla_flops_per_call": common.cost_flops(compiled),
    }


def prepare_torch_seq(p: Problem, pop: int, opts, threads: int | None = None) -> dict[str, Any]:
    """PyTorch, one member after another, one step per call (the paper's Torch (Sequential));
    ``threads``: ``torch.set_num_threads`` (default: torch's own, the number of cores)."""
    import torch

    from popjax_bench import torch_reference as tr

    dev = tr.device()
    torch.manual_seed(opts.seed)
    threads = threads or tr.DEFAULT_THREADS
    _, hp1 = make_learner(p)
    hp = tr.hparams_dict(hp1)
    batch = jax.device_get(synthetic_batches(p, None, pop, opts.seed))
    batches = [tr.batch_to_torch(member(batch, i), dev, channels_first=p.spec.discrete) for i in range(pop)]
    del batch
    with common.PeakMemory() as mem:
        if p.learner == "td3":
            members = [
                tr.TorchTD3(p.spec.obs_shape[0], p.spec.action_dim, p.config.hidden, hp, dev) for _ in range(pop)
            ]
        elif p.learner == "sac":
            members = [
                tr.TorchSAC(p.spec.obs_shape[0], p.spec.action_dim, p.config.hidden, hp, dev) for _ in range(pop)
            ]
        else:
            members = [
                tr.TorchDQN(
                    p.spec.num_actions,
                    p.config.hidden,
                    hp,
                    p.config.target_update_period,
                    p.config.double_q,
                    dev,
                    frame=p.spec.obs_shape[0],
                )
                for _ in range(pop)
            ]

        # A TD3 step costs twice as much every policy_delay-th step (it adds the actor update), so one
        # timed call is a whole period of steps: a median of single steps would land in either mode.
        period = int(hp["policy_delay"]) if p.learner == "td3" else 1

        def call():
            torch.set_num_threads(threads)  # per call: implementations are timed interleaved
            return [[m.update(b) for m, b in zip(members, batches, strict=True)] for _ in range(period)]

        call = arithmetic.torch_call(call, arithmetic.torch_arithmetic(arithmetic.choice(opts), dev), dev)

        entry = _ready(call, lambda _: tr.synchronize(dev), opts, period)
    return entry | {"compile": None, "memory": mem.result(), "torch_device": dev, "torch_threads": threads}


def torch_layer_gflops(pop: int, batch: int, width: int, threads: int, opts) -> dict[str, Any]:
    """PyTorch's ceiling for the same dominant layer as ``common.layer_gflops``: ``torch.bmm`` of ``pop``
    independent ``[batch, width] @ [width, width]`` products with ``threads`` threads (the GEMM library the
    PyTorch variants run on, against XLA's batched dot)."""
    import torch

    generator = torch.Generator().manual_seed(opts.seed + pop)
    a = torch.randn(pop, batch, width, generator=generator)
    b = torch.randn(pop, width, width, generator=generator)

    def call():
        torch.set_num_threads(threads)
        return torch.bmm(a, b)

    call = arithmetic.torch_call(call, arithmetic.torch_arithmetic(arithmetic.choice(opts), "cpu"), "cpu")

    timing = common.time_calls(call, warmup=2, min_repeats=opts.repeats, min_time=opts.min_time, sync=lambda _: None)
    return {"pop": pop, "batch": batch, "width": width, "threads": threads,
            "gflops": 2.0 * pop * batch * width * width / timing["median_s"] / 1e9, "timing": timing}


_TORCH_FUNCTIONS: dict[Problem, Any] = {}


def prepare_torch_functional(p: Problem, pop: int, opts, variant: str, threads: int | None = None) -> dict[str, Any]:
    """A functional PyTorch variant (``torch_functional.VARIANTS``) at ``pop`` members, compiled and warmed up.

    Members start from the same modules as ``torch_seq``; one timed call is one population step (TD3: one
    policy-delay period of steps, as for ``torch_seq``); the noise is drawn with ``torch.randn`` each step, as
    the eager modules do. ``compile``: the time of the first two calls (compilation; none for eager vmap)."""
    import torch

    from popjax_bench import torch_functional as tf
    from popjax_bench import torch_reference as tr

    dev = tr.device()
    torch.manual_seed(opts.seed)
    threads = threads or tr.DEFAULT_THREADS
    torch.set_num_threads(threads)
    _, hp1 = make_learner(p)
    hp = tr.hparams_dict(hp1)
    batch = jax.device_get(synthetic_batches(p, None, pop, opts.seed))
    batches = [tr.batch_to_torch(member(batch, i), dev) for i in range(pop)]
    del batch
    obs_dim, act = p.spec.obs_shape[0], p.spec.action_dim
    with common.PeakMemory() as mem:
        module = tr.TorchTD3 if p.learner == "td3" else tr.TorchSAC
        members = [module(obs_dim, act, p.config.hidden, hp, dev) for _ in range(pop)]
        # One functions object per problem: torch_compile's member graph then compiles once for every N.
        fns = _TORCH_FUNCTIONS.setdefault(p, tf.FUNCTIONS[p.learner](members[0]))
        update = arithmetic.torch_call(tf.population(variant, fns, [fns.init_state(m) for m in members], hp, dev),
                                       arithmetic.torch_arithmetic(arithmetic.choice(opts), dev), dev)
        del members
        vectorized = variant != "torch_compile"
        if vectorized:
            batches = tf.stack(batches)
        draws = 1 if p.learner == "td3" else 2  # TD3: target smoothing; SAC: next action and actor sample

        def noise():
            draw = [torch.randn((pop, p.batch_size, act), device=dev) for _ in range(draws)]
            return _per_member(draw[0] if draws == 1 else tuple(draw), pop, vectorized)

        period = int(hp["policy_delay"]) if p.learner == "td3" else 1

        def call():
            torch.set_num_threads(threads)  # per call: implementations are timed interleaved
            return [update(batches, noise(), t == period - 1) for t in range(period)]

        start = time.perf_counter()
        for _ in range(3 if update.cuda_graphs else 2):  # compiles each graph (TD3: critic-only and policy
            call()                                         # steps); CUDA graphs: a warm-up run, then the capture
        first_calls_s = time.perf_counter() - start
        entry = _ready(call, lambda _: tr.synchronize(dev), opts, period)
    compiled = update.compile_mode is not None
    return entry | {"compile": {"compile_s": first_calls_s} if compiled else None, "memory": mem.result(),
                    "torch_device": dev, "torch_threads": threads, "torch_compile_mode": update.compile_mode,
                    "cuda_graphs": update.cuda_graphs}


def _per_member(noise, pop: int, vectorized: bool):
    """``noise`` (a tensor or a tuple of tensors ``[pop, ...]``) as it is passed: stacked, or one per member."""
    if vectorized:
        return noise
    if isinstance(noise, tuple):
        return [tuple(n[i] for n in noise) for i in range(pop)]
    return [noise[i] for i in range(pop)]


# --- the study ---------------------------------------------------------------------------------------
def _record(p: Problem, impl: str, pop: int, devices: int, out: dict[str, Any]) -> dict[str, Any]:
    k = out["steps_per_call"]
    t = out["timing"]
    compile_s = None if out["compile"] is None else out["compile"]["compile_s"]
    return {
        "learner": p.learner,
        "impl": impl,
        "pop": pop,
        "devices": devices,
        "steps_per_call": k,
        "ms_per_pop_step": 1e3 * t["median_s"] / k,
        "ms_per_pop_step_iqr": 1e3 * t["iqr_s"] / k,
        "ms_per_pop_step_mean": 1e3 * t["mean_s"] / k,  # paper-style mean (after dropping warm-up calls)
        "ms_per_member_step": 1e3 * t["median_s"] / k / pop,
        "compile_s": compile_s,
        **{key: v for key, v in out.items() if key not in ("timing", "steps_per_call")},
        "timing": t,
    }


def _skip(p: Problem, impl: str, pop: int, devices: int, reason: str) -> dict[str, Any]:
    log(f"  {p.learner} {impl:9s} N={pop:3d} d={devices}: skipped ({reason})")
    return {"learner": p.learner, "impl": impl, "pop": pop, "devices": devices, "skipped": reason}


def add_throughput(rows: list[dict[str, Any]], peak_gflops: float | None, layer_gflops: float | None) -> None:
    """GFLOP/s of the vmap / vmap_scan rows of one (learner, N, devices) point, against the ceilings.

    FLOPs per population step come from XLA's cost analysis of each row's own program: the 1-step
    program (``vmap``, TD3's traced delay gate: it computes the actor step on every update) or one chunk
    of the K-step program (``vmap_scan``: XLA counts the scan body, one chunk, once), divided by the
    chunk's updates. So both count the work they do, and TD3's chunked updates do no discarded work.
    """
    vectorized = [r for r in rows if r["impl"] in ("vmap", "vmap_scan")]
    for r in vectorized:
        r["xla_flops_per_pop_step"] = flops = r.get("xla_flops_per_step")
        r["gflops"] = None if not flops else flops / (r["ms_per_pop_step"] / 1e3) / 1e9
        r["peak_gflops"] = peak_gflops
        r["layer_gflops"] = layer_gflops
        r["fraction_of_peak"] = None if not (r["gflops"] and peak_gflops) else r["gflops"] / peak_gflops
        r["fraction_of_layer"] = None if not (r["gflops"] and layer_gflops) else r["gflops"] / layer_gflops


# --- the largest population that fits in memory ------------------------------------------------------
def _abstract_args(p: Problem, pop: int, k: int):
    """``(keys, state, batches, hparams)`` of the K-step update as shapes only: nothing is allocated."""
    learner, hparams1 = make_learner(p)
    hparams = jax.eval_shape(lambda: jax.tree.map(jnp.asarray, broadcast(hparams1, pop)))
    keys = jax.eval_shape(lambda: jax.random.split(jax.random.key(0), (k, pop)))
    state = jax.eval_shape(lambda key, hp: jax.vmap(learner.init)(jax.random.split(key, pop), hp),
                           jax.random.key(0), hparams)
    batches = jax.eval_shape(lambda: _batch_maker(p)(jax.random.key(0), k, pop))
    return keys, state, batches, hparams


@functools.cache
def population_memory(p: Problem, pop: int, k: int | None = None) -> dict[str, Any]:
    """Memory of the compiled K-step update ``jit(scan(vmap(update)))`` at ``pop`` members (state donated),
    from XLA's memory analysis of a program compiled for shapes only (nothing is run or allocated; cached:
    the same program always has the same analysis)."""
    learner, _ = make_learner(p)
    args = _abstract_args(p, pop, k or p.k)
    compiled = jax.jit(scanned_step(learner), donate_argnums=(1,)).lower(*args).compile()
    nbytes = lambda tree: sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(tree))
    return {"pop": pop, "program_bytes": common.program_bytes(compiled), "state_bytes": nbytes(args[1]),
            "batches_bytes": nbytes(args[2]), "xla_memory": common.memory_analysis(compiled)}


def largest_population(p: Problem, k: int | None = None, limit_bytes: int | None = None,
                       max_pop: int = 1 << 20, precision: float = 1 / 64) -> dict[str, Any]:
    """The largest population whose compiled K-step update fits in the device's memory.

    The update's memory is XLA's analysis of the compiled program (``common.program_bytes``:
    arguments + outputs + temporaries - aliased; the population state is an argument, donated, so
    the new state reuses its buffers and it counts once), compared with ``limit_bytes`` (default
    ``common.device_memory_limit()``: the device's ``bytes_limit``, on a CPU the available RAM).
    Search: N = 1, 2, 4, ... until one does not fit (or ``max_pop``), then bisection until the
    bracket is within ``precision`` of its lower end. Compilation only: nothing runs out of memory.
    """
    k = k or p.k
    source = "given"
    if limit_bytes is None:
        limit_bytes, source = common.device_memory_limit()
    out: dict[str, Any] = {"learner": p.learner, "k": k, "limit_bytes": limit_bytes, "limit_source": source,
                           "counted": "XLA memory analysis of the compiled K-step update: arguments (population "
                           "state, hparams, K batches, keys) + outputs + temporaries - aliased (the donated "
                           "state), compiled for shapes only", "tried": []}
    if limit_bytes is None:
        return out | {"largest_pop": None, "reason": source}
    start = time.perf_counter()

    def fits(pop: int) -> bool:
        row = dict(population_memory(p, pop, k))
        if row["program_bytes"] is None:
            raise LookupError("this backend gives no memory analysis of compiled programs")
        row["fits"] = row["program_bytes"] <= limit_bytes
        out["tried"].append(row)
        return row["fits"]

    try:
        lo, hi = 0, None
        pop = 1
        while hi is None and lo < max_pop:
            if fits(pop):
                lo, pop = pop, min(2 * pop, max_pop)
            else:
                hi = pop
        while hi is not None and hi - lo > max(1, int(lo * precision)):
            mid = (lo + hi) // 2
            if fits(mid):
                lo = mid
            else:
                hi = mid
    except LookupError as err:
        return out | {"largest_pop": None, "reason": str(err)}
    best = next((r for r in reversed(out["tried"]) if r["pop"] == lo), None)
    out |= {"largest_pop": lo, "first_too_large": hi, "capped_at_max_pop": hi is None,
            "program_bytes": best and best["program_bytes"], "state_bytes": best and best["state_bytes"],
            "precision": precision, "search_s": time.perf_counter() - start}
    log(f"  {p.learner}: largest population that fits: N = {lo} "
        f"({(best['program_bytes'] if best else 0) / 2**30:.2f} GiB of {limit_bytes / 2**30:.2f} GiB, {source}; "
        f"{len(out['tried'])} compilations)")
    return out


def add_ratios(results: list[dict[str, Any]]) -> None:
    """Adds speed-ups vs the baselines measured at the same (learner, N): ``speedup_vs_<impl>`` for each
    sequential and PyTorch implementation, and ``speedup_vs_torch_best`` against the fastest PyTorch variant
    at that N, named in ``torch_best``.

    With several PyTorch thread counts the fastest run of each variant is its baseline (the conservative
    choice for popjax).
    """
    base: dict[tuple[str, str, int], float] = {}
    for r in results:
        if "skipped" not in r and r["impl"] in ("jax_seq", *TORCH_IMPLS):
            key = (r["learner"], r["impl"], r["pop"])
            base[key] = min(base.get(key, float("inf")), r["ms_per_pop_step"])
    for r in results:
        if "skipped" in r:
            continue
        for name in ("jax_seq", *TORCH_IMPLS):
            ref = base.get((r["learner"], name, r["pop"]))
            r[f"speedup_vs_{name}"] = None if ref is None else ref / r["ms_per_pop_step"]
        torch_runs = {name: base[(r["learner"], name, r["pop"])] for name in TORCH_IMPLS
                      if (r["learner"], name, r["pop"]) in base}
        best = min(torch_runs, key=torch_runs.get) if torch_runs else None
        r["torch_best"] = best
        r["speedup_vs_torch_best"] = None if best is None else torch_runs[best] / r["ms_per_pop_step"]


# --- the population over several processes (--processes) -------------------------------------------------
JOB_DESCRIPTION = (
    "--processes P: for each --devices value d, the points run in two jobs of fresh subprocesses "
    "(python -m popjax_bench.update_worker, JAX_PLATFORMS=cpu): first 1 process forcing P×d CPU devices (the "
    "reference), then P local processes joined with jax.distributed (coordinator and gloo CPU collectives over "
    "127.0.0.1), each forcing d CPU devices; in both the population is one array split over all P×d devices "
    "(the same prepare_vmap as in one process). Every process makes the same number of timed calls, "
    "max(repeats, min(200, min_time ÷ the slowest process's probe call)), the implementations "
    "of one N round-robin after a barrier; a call's time is the slowest process's time for it (the population "
    "has taken the step when every process has). Memory and compile times are process 0's; the N×[B,h]@[h,h] "
    "ceiling is measured in the 1-process job."
)
JOB_START_S = 120.0  # starting the processes, importing JAX, joining the job
POINT_ALLOWANCE_S = 180.0  # compiling and warming up one implementation at one N, on top of --max-seconds
JOB_TIMEOUT_S = 60  # jax.distributed: joining the job, and noticing a process that died (heartbeats)
MAX_CALLS = 200
_COLLECTIVE = re.compile(r"\b(all-reduce|all-gather|reduce-scatter|all-to-all|collective-permute|"
                         r"collective-broadcast)(?:-start)?\(")


def hlo_collectives(compiled) -> dict[str, int] | None:
    """Collective ops in a compiled program's HLO, by kind ({}: none; None: no HLO text)."""
    try:
        text = compiled.as_text()
    except Exception:  # noqa: BLE001 - not every backend gives the text
        return None
    counts: dict[str, int] = {}
    for m in _COLLECTIVE.finditer(text or ""):
        counts[m.group(1)] = counts.get(m.group(1), 0) + 1
    return counts


def _slowest(times: list[float]) -> dict[str, Any]:
    """Timing statistics of the slowest process's time of each call (every process passes as many times)."""
    every = distributed.gather_rows(np.asarray(times, np.float64)[None])  # [processes, calls], exact float64
    return common.summarize(every.max(axis=0)) | {"per_process_median_s": [float(np.median(t)) for t in every]}


def _time_job_point(p: Problem, pop: int, devices: int, prepared: list[tuple[str, dict[str, Any]]],
                    opts) -> list[dict[str, Any]]:
    """Times prepared implementations of one N in every process of the job in step (see ``JOB_DESCRIPTION``)."""
    probes = []
    for _, entry in prepared:
        start = time.perf_counter()
        entry["sync"](entry["call"]())
        probes.append(time.perf_counter() - start)
    # the slowest process's probe, the same on every process: so are the counts
    probe = distributed.gather_rows(np.asarray(probes)[None]).max(axis=0)
    counts = [max(entry["min_repeats"], min(MAX_CALLS, math.ceil(opts.min_time / max(float(s), 1e-9))))
              for (_, entry), s in zip(prepared, probe, strict=True)]
    distributed.barrier(f"popjax-bench-update-{p.learner}-{pop}")
    timings = common.time_interleaved([(e["call"], e["sync"], n) for (_, e), n in zip(prepared, counts, strict=True)],
                                      min_time=0.0, max_repeats=MAX_CALLS)
    # Reading one value per member on the host: an all-gather over loopback across processes.
    values = common.place(np.arange(pop, dtype=np.float32), devices)
    read = common.time_calls(lambda: distributed.fetch(values), warmup=2, min_repeats=opts.repeats,
                             max_repeats=opts.repeats, min_time=0.0, sync=lambda v: v)
    read = _slowest(read["times_s"])
    rows = []
    for (impl, entry), timing in zip(prepared, timings, strict=True):
        fields = {key: v for key, v in entry.items() if key not in ("call", "sync", "min_repeats")}
        rec = _record(p, impl, pop, devices, fields | {"timing": _slowest(timing["times_s"])})
        compiled = _VMAP_COMPILED[(p, pop, devices, entry["steps_per_call"], arithmetic.choice(opts))][0]
        rec |= {"hlo_collectives": hlo_collectives(compiled), "fetch_ms": 1e3 * read["median_s"],
                "fetch_iqr_ms": 1e3 * read["iqr_s"]}
        rows.append(rec)
    return rows


def job_main(spec: dict[str, Any]) -> None:
    """One process of a job started by ``run_job`` (``python -m popjax_bench.update_worker``), once JAX has its
    devices and the job is joined: times every point of ``spec`` (see ``JOB_DESCRIPTION``); process 0 writes
    the rows to ``spec["result"]`` after every N (partial results survive a failure)."""
    o = Options(**spec["options"])
    impls = [i for i in o.implementations if i in VECTORIZED]
    total, local, processes = jax.device_count(), jax.local_device_count(), distributed.processes()
    out: dict[str, Any] = {"processes": processes, "devices": total, "devices_per_process": local, "rows": [],
                           "layers": [], "machine": common.machine()}
    tag = {"processes": processes, "devices_per_process": local}
    for name in o.learners:
        p = problem(name, o.hidden, o.batch_size, o.k, o.frame)
        last: dict[str, tuple[int, float, int]] = {}  # impl -> (pop, s per call, warm-up calls)
        for pop in spec["pops"]:
            if spec["measure_layer"] and p.learner in ("td3", "sac"):
                out["layers"].append(common.layer_gflops(pop, p.batch_size, max(p.config.hidden), total,
                                                         repeats=o.repeats, min_time=o.min_time, seed=o.seed)
                                     | {"processes": processes})
            prepared = []
            for impl in impls:
                prev = last.get(impl)
                if prev is not None:  # the same on every process: the times are the slowest process's
                    estimate = common.estimated_seconds(prev[1], pop / prev[0], repeats=o.repeats,
                                                        min_time=o.min_time, warmup=prev[2])
                    if estimate > o.max_seconds:
                        reason = (f"estimated {estimate:.0f}s for warm-up and {o.repeats} timed calls > "
                                  f"--max-seconds {o.max_seconds:.0f}")
                        out["rows"].append(_skip(p, impl, pop, total, reason) | tag)
                        continue
                prepared.append((impl, prepare_vmap(p, pop, total, 1 if impl == "vmap" else p.k, o)))
            if prepared:
                for rec in _time_job_point(p, pop, total, prepared, o):
                    last[rec["impl"]] = (pop, rec["timing"]["median_s"], rec["warmup_calls"])
                    out["rows"].append(rec | tag)
            if distributed.is_writer():
                common.write_json(Path(spec["result"]), out)


def _job_env() -> dict[str, str]:
    """The workers' environment: CPU only, no forced device count (each forces its own), this popjax_bench and
    this popjax first."""
    import popjax

    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONUNBUFFERED="1")
    flags = [f for f in env.pop("XLA_FLAGS", "").split() if "xla_force_host_platform_device_count" not in f]
    if flags:
        env["XLA_FLAGS"] = " ".join(flags)
    roots = dict.fromkeys(str(Path(path).resolve().parents[1]) for path in (__file__, popjax.__file__))
    env["PYTHONPATH"] = os.pathsep.join([*roots, *([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])])
    return env


def _tail(path: Path, lines: int = 15) -> list[str]:
    try:
        return [line for line in path.read_text(errors="replace").splitlines() if line.strip()][-lines:]
    except OSError:
        return []


def job_timeout(o: Options, pops: list[int]) -> float:
    """Seconds a job may take before it counts as hung: start-up, then per N the per-point budget
    (``--max-seconds``) plus compilation and warm-up of each implementation."""
    impls = [i for i in o.implementations if i in VECTORIZED]
    return JOB_START_S + len(o.learners) * len(pops) * (o.max_seconds + len(impls) * POINT_ALLOWANCE_S)


def run_job(o: Options, pops: list[int], processes: int, per_process: int, measure_layer: bool, work: Path,
            timeout_s: float | None = None) -> tuple[dict[str, Any] | None, str | None]:
    """Runs the points at ``pops`` in a job of ``processes`` local processes with ``per_process`` CPU devices each.

    Returns ``(result, None)``, or ``(what process 0 wrote before, why the job failed)``. Every process is
    killed when one fails, when the job outlives ``timeout_s`` (default ``job_timeout``), or when this process
    is interrupted; a worker whose parent is gone stops by itself (``update_worker``).
    """
    work.mkdir(parents=True, exist_ok=True)
    result = work / "result.json"
    spec = {"options": dataclasses.asdict(o), "pops": list(pops), "processes": processes,
            "devices_per_process": per_process, "coordinator": f"127.0.0.1:{distributed.free_local_port()}",
            "timeout_s": JOB_TIMEOUT_S, "measure_layer": measure_layer, "result": str(result),
            "parent_pid": os.getpid()}
    spec_path = work / "spec.json"
    spec_path.write_text(json.dumps(spec))
    timeout_s = job_timeout(o, pops) if timeout_s is None else timeout_s
    env = _job_env()
    procs: list[subprocess.Popen] = []
    logs = []
    failure = None
    try:
        for i in range(processes):
            logs.append(open(work / f"process{i}.log", "w"))  # noqa: SIM115 - closed below
            procs.append(subprocess.Popen([sys.executable, "-m", "popjax_bench.update_worker", str(spec_path), str(i)],
                                          stdin=subprocess.DEVNULL, stdout=logs[-1], stderr=subprocess.STDOUT,
                                          env=env))
        deadline = time.monotonic() + timeout_s
        while True:
            codes = [proc.poll() for proc in procs]
            failed = [(i, c) for i, c in enumerate(codes) if c not in (None, 0)]
            if failed:
                i, code = failed[0]
                failure = f"process {i} of {processes} exited with status {code}"
                tail = _tail(work / f"process{i}.log")
                failure += f" ({tail[-1].strip()[:200]})" if tail else ""
                for line in tail:
                    log(f"    process {i}: {line}")
                break
            if all(c == 0 for c in codes):
                break
            if time.monotonic() > deadline:
                failure = f"the job of {processes} process(es) did not finish within {timeout_s:.0f}s"
                break
            time.sleep(0.1)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
        for proc in procs:
            proc.wait()
        for f in logs:
            f.close()
    data = json.loads(result.read_text()) if result.exists() else None
    return data, failure


def add_process_ratios(rows: list[dict[str, Any]]) -> None:
    """``vs_one_process`` (time over the 1-process time at the same N, implementation and devices) and the
    communication share estimated from it, ``max(0, (t_P - t_1) / t_P)``, on the rows of a processes study."""
    one = {(r["learner"], r["impl"], r["pop"], r["devices"]): r for r in rows
           if "skipped" not in r and r.get("processes") == 1}
    for r in rows:
        if "skipped" in r or "processes" not in r:
            continue
        ref = one.get((r["learner"], r["impl"], r["pop"], r["devices"]))
        if r["processes"] == 1 or ref is None:
            r |= {"vs_one_process": 1.0 if r["processes"] == 1 else None, "one_process_ms": None,
                  "extra_time_share": None, "communication_share": None}
            continue
        t, t1 = r["ms_per_pop_step"], ref["ms_per_pop_step"]
        extra = (t - t1) / t
        r |= {"vs_one_process": t / t1, "one_process_ms": t1, "extra_time_share": extra,
              "communication_share": max(0.0, extra)}


def _collectives_note(rows: list[dict[str, Any]], processes: int) -> str | None:
    measured = [r for r in rows if "skipped" not in r and r.get("processes", 1) > 1]
    if not measured or any(r.get("hlo_collectives") is None for r in measured):
        return None
    found = {f"{r['impl']} N={r['pop']}": r["hlo_collectives"] for r in measured if r["hlo_collectives"]}
    if not found:
        return ("communication: the compiled update has no collective ops (members are independent and each "
                "member's arrays live on one device), so during a step nothing crosses processes; a run over "
                f"{processes} processes communicates only to place its inputs and to read results on the host "
                "(fetch_ms: reading one value per member, an all-gather over loopback). The communication share "
                "is therefore the extra time over one process with as many devices, (t_P - t_1) / t_P when "
                f"positive: the cost of {processes} JAX runtimes sharing the cores, not of messages.")
    listed = "; ".join(f"{k}: " + ", ".join(f"{n} {op}" for op, n in v.items()) for k, v in found.items())
    return (f"communication: the compiled update has collective ops ({listed}); over {processes} processes they "
            "cross loopback. The communication share is estimated as the extra time over one process with as "
            "many devices, (t_P - t_1) / t_P when positive.")


def run_processes(o: Options, problems: list[Problem], impls: list[str], sitting: common.Sitting,
                  peak: float | None, results: list[dict[str, Any]], notes: list[str], save,
                  jobs: list[dict[str, Any]]) -> None:
    """The points of a ``--processes P`` study (see ``JOB_DESCRIPTION``), appended to ``results``; one
    record per job (its processes, devices, seconds, failure, and process 0's view of the machine) in ``jobs``."""
    procs = o.processes
    notes.append(JOB_DESCRIPTION)
    notes.append("jax_seq and torch_seq (member after member on one device of one process) are not run with "
                 "--processes.")
    with tempfile.TemporaryDirectory(prefix="popjax-bench-update-") as tmp:
        for d in o.devices:
            total = procs * d
            pops = [n for n in o.pops if n % total == 0]
            for p in problems:
                for n in o.pops:
                    if n % total:
                        for impl in impls:
                            results.append(_skip(p, impl, n, total, f"{n} members do not divide over {procs}×{d} "
                                                 "devices") | {"processes": procs, "devices_per_process": d})
            if not pops:
                continue
            point: list[dict[str, Any]] = []
            layers: dict[int, float] = {}
            for processes, per_process in ((1, total), (procs, d)):
                log(f"  job: {processes} process(es) × {per_process} CPU device(s), {','.join(o.learners)} "
                    f"N={','.join(map(str, pops))}, {','.join(impls)}")
                start = time.perf_counter()
                data, failure = run_job(o, pops, processes, per_process, processes == 1,
                                        Path(tmp) / f"d{d}-p{processes}")
                rows = list((data or {}).get("rows", []))
                for layer in (data or {}).get("layers", []):
                    sitting.ceilings["layers"].append(layer)
                    layers[layer["pop"]] = layer["gflops"]
                done = {(r["learner"], r["impl"], r["pop"]) for r in rows}
                for p in problems:
                    for n in pops:
                        for impl in impls:
                            if (p.learner, impl, n) not in done:
                                rows.append(_skip(p, impl, n, total, f"the job failed: {failure}")
                                            | {"processes": processes, "devices_per_process": per_process})
                for r in rows:
                    if "skipped" not in r:
                        log(f"  {r['learner']} {r['impl']:9s} N={r['pop']:3d} {processes}×{per_process} dev: "
                            f"{r['ms_per_pop_step']:9.3f} ms/pop-step (IQR {r['ms_per_pop_step_iqr']:.3f})  "
                            f"compile {r['compile_s']:.2f}s  ({r['timing']['repeats']} calls)")
                seconds = time.perf_counter() - start
                log(f"  job of {processes} process(es) done in {seconds:.0f}s" + (f": FAILED, {failure}" if failure
                                                                                  else ""))
                jobs.append({"processes": processes, "devices_per_process": per_process, "devices": total,
                             "pops": pops, "seconds": seconds, "failure": failure,
                             "machine": (data or {}).get("machine")})
                point += rows
                results.extend(rows)
                save()
            add_process_ratios(point)
            for r in point:
                if "skipped" not in r:
                    add_throughput([r], peak, layers.get(r["pop"]))
                    if r["processes"] > 1 and r["vs_one_process"] is not None:
                        log(f"  {r['learner']} {r['impl']:9s} N={r['pop']:3d}: {procs} processes / 1 process = "
                            f"{r['vs_one_process']:.3f} (communication share {100 * r['communication_share']:.0f}%)")
            save()
    note = _collectives_note(results, procs)
    if note:
        notes.append(note)


def run(options: Options | None = None, /, **overrides: Any) -> dict[str, Any]:
    """Runs the study and writes ``<out_dir>/update.json`` and ``update.png``; returns the payload.

    ``options``: an ``Options`` (the command line's); ``overrides``: any of its fields, e.g.
    ``run(learners=("td3",), pops=(1, 4))``.
    """
    o = Options.build(options, overrides)
    learners, pops, devices, impls = o.learners, o.pops, o.devices, list(o.implementations)
    max_seconds = o.max_seconds
    started = common.utc_now()
    problems = [problem(name, o.hidden, o.batch_size, o.k, o.frame) for name in learners]
    common.request_devices(o.devices_needed())
    notes: list[str] = []
    torch_missing = None
    if any(impl in TORCH_IMPLS for impl in impls):
        from popjax_bench import torch_reference as tr

        if not tr.available():
            torch_missing = "PyTorch not installed"
            notes.append(f"PyTorch baselines skipped: {tr.TORCH_ERROR}")
            log(f"WARNING: {notes[-1]}")
    sitting = common.Sitting(allow_busy=o.allow_busy, wait_quiet=o.wait_quiet, repeats=o.repeats,
                             min_time=o.min_time, seed=o.seed)
    peak = sitting.ceilings["dense_matmul"]["before"]["gflops"]
    thread_counts = list(o.torch_threads)
    results: list[dict[str, Any]] = []
    memory_fit: dict[str, Any] = {}
    params = {
        "learners": list(learners),
        "pops": list(pops),
        "devices": list(devices),
        "impls": impls,
        "torch_threads": thread_counts,
        "repeats": o.repeats,
        "min_time_s": o.min_time,
        "max_seconds": max_seconds,
        "seed": o.seed,
        "processes": o.processes,
        "problems": {
            p.learner: {
                "obs_shape": p.spec.obs_shape,
                "action_dim": p.spec.action_dim,
                "num_actions": p.spec.num_actions,
                "config": dataclasses.asdict(p.config),
                "k": p.k,
            }
            for p in problems
        },
        "statistic": "median (and IQR) of at least `repeats` timed calls after warm-up, K-step calls included, "
        "divided by steps per call",
        "baselines": "torch_seq = PyTorch sequential K=1 (paper's baseline; one run per thread count, the fastest "
        "at each N is the baseline); torch_compile = one member's functional step under torch.compile, member "
        "after member; torch_vmap = members vectorized with torch.func.vmap (the paper's Torch (Vectorized)); "
        "torch_vmap_compile = that under torch.compile; torch_vmap_cudagraph = that under torch.compile(mode="
        "'reduce-overhead') (CUDA graphs, step marking and clones of the kept state included; on a CPU "
        "torch.compile's default mode, rows say cuda_graphs false); torch_best = the fastest of the PyTorch "
        "variants at each N; jax_seq = jitted single-member update called member after member, K=1",
        "ceilings": "dense matmul peak (2048² f32) before and after the study; N×[B,h]@[h,h] (B = batch, h = the "
        "widest hidden layer) measured just before each TD3/SAC point, in XLA (the update's batched dot) and, where "
        "PyTorch variants run, in PyTorch (torch.bmm, the faster of the thread counts); DQN has none (its dominant "
        "work is the convolutions)",
    }
    json_path, png_path = common.output_paths(o.out_dir, STUDY)

    def write(plot: bool, final: bool = False) -> dict[str, Any]:
        extra = sitting.record(final)
        torch_device = next((r["torch_device"] for r in results if r.get("torch_device")), None)
        payload = common.study_payload(STUDY, params, results, started, notes, memory_fit=memory_fit,
                                       arithmetic=arithmetic.record(o.matmul_precision, torch_device), **extra)
        common.write_json(json_path, payload)
        if plot:
            plot_update(payload, png_path)
        return payload

    if o.processes > 1:
        params |= {"devices_per_process": list(devices), "jobs": []}
        run_processes(o, problems, impls, sitting, peak, results, notes, lambda: write(plot=False), params["jobs"])
    for p in problems if o.processes == 1 else ():  # with processes every point ran in the jobs
        last: dict[tuple, tuple[int, float, int]] = {}  # (impl, devices, threads) -> (pop, s per call, warm-up)
        for pop in pops:
            variants = []
            for d in devices:
                if pop % d:
                    continue
                if "vmap" in impls:
                    variants.append(("vmap", d))
                if "vmap_scan" in impls:
                    variants.append(("vmap_scan", d))
            variants = [(impl, d, None) for impl, d in variants]
            if "jax_seq" in impls:
                variants.append(("jax_seq", 1, None))
            variants += [(impl, 1, t) for impl in TORCH_IMPLS if impl in impls for t in thread_counts]
            prepared = []  # (impl, devices, threads, entry): all compiled and warmed up, then timed interleaved
            for impl, d, threads in variants:
                functional = impl in TORCH_IMPLS and impl != "torch_seq"
                if impl in TORCH_IMPLS and (torch_missing or (functional and p.learner not in FUNCTIONAL_LEARNERS)):
                    why = torch_missing or f"the functional PyTorch variants cover {', '.join(FUNCTIONAL_LEARNERS)}"
                    results.append(_skip(p, impl, pop, d, why + (f" ({threads} threads)" if threads else "")))
                    continue
                prev = last.get((impl, d, threads))
                if prev is not None:
                    estimate = common.estimated_seconds(prev[1], pop / prev[0], repeats=o.repeats,
                                                        min_time=o.min_time, warmup=prev[2])
                    if estimate > max_seconds:
                        reason = (f"estimated {estimate:.0f}s for warm-up and {o.repeats} timed calls > --max-seconds "
                                  f"{max_seconds:.0f}")
                        results.append(_skip(p, impl, pop, d, reason + (f" ({threads} threads)" if threads else "")))
                        continue
                if impl == "vmap":
                    entry = prepare_vmap(p, pop, d, 1, o)
                elif impl == "vmap_scan":
                    entry = prepare_vmap(p, pop, d, p.k, o)
                elif impl == "jax_seq":
                    entry = prepare_jax_seq(p, pop, o)
                elif impl == "torch_seq":
                    entry = prepare_torch_seq(p, pop, o, threads)
                else:
                    entry = prepare_torch_functional(p, pop, o, impl, threads)
                prepared.append((impl, d, threads, entry))
            if not prepared:
                continue
            layer = {}  # the dominant layer's ceiling at this N, measured just before the point
            torch_layer = None  # the same layer in PyTorch (torch.bmm), the fastest thread count
            if p.learner in ("td3", "sac"):
                for d in dict.fromkeys(d for impl, d, _, _ in prepared if impl.startswith("vmap")):
                    layer[d] = sitting.layer(pop, p.batch_size, max(p.config.hidden), d)
                for threads in dict.fromkeys(t for impl, _, t, _ in prepared if impl.startswith("torch")):
                    row = torch_layer_gflops(pop, p.batch_size, max(p.config.hidden), threads, o)
                    sitting.ceilings.setdefault("torch_layers", []).append(row)
                    torch_layer = max(torch_layer or 0.0, row["gflops"])
            start = time.perf_counter()
            outs = measure([entry for *_, entry in prepared], o)
            spent = time.perf_counter() - start
            point = []
            for (impl, d, threads, _), out in zip(prepared, outs, strict=True):
                timing = out["timing"]  # execution time only (compile excluded): it scales with N
                last[(impl, d, threads)] = (pop, timing["median_s"], out["warmup_calls"])
                rec = _record(p, impl, pop, d, out)
                if impl == "torch_vmap_cudagraph" and not rec["cuda_graphs"] and CUDA_GRAPH_FALLBACK not in notes:
                    notes.append(CUDA_GRAPH_FALLBACK)
                results.append(rec)
                point.append(rec)
                log(
                    f"  {p.learner} {impl:9s} N={pop:3d} d={d}: {rec['ms_per_pop_step']:9.3f} ms/pop-step"
                    f" (IQR {rec['ms_per_pop_step_iqr']:.3f})"
                    + (f"  compile {rec['compile_s']:.2f}s" if rec["compile_s"] is not None else "")
                    + (f"  threads {threads}" if threads else "")
                    + f"  ({timing['repeats']} calls)"
                )
            for d in devices:
                add_throughput([r for r in point if r["devices"] == d], peak, layer.get(d))
            for r in point:
                r["torch_layer_gflops"] = torch_layer
            log(f"  {p.learner} N={pop}: {len(prepared)} implementations timed interleaved in {spent:.0f}s")
            add_ratios(results)
            write(plot=False)  # partial results survive an interrupted run
    if o.memory_fit:
        for p in problems:
            memory_fit[p.learner] = largest_population(p)
    add_ratios(results)
    payload = write(plot=o.plot, final=True)
    log(f"wrote {json_path}")
    return payload


def main(options: Options) -> dict[str, Any]:
    """``popjax bench update``."""
    return run(options)


def _label(r: dict[str, Any]) -> str:
    if r.get("processes") is not None:  # a --processes study
        return f"{r['impl']} ({r['processes']} proc × {r['devices_per_process']} dev)"
    return r["impl"] + (f" ({r['devices']} dev)" if r["impl"].startswith("vmap") else "")


def plot_update(payload: dict[str, Any], path: Path) -> Path:
    plt = common.pyplot()
    results = [r for r in payload["results"] if "skipped" not in r]
    learners = list(dict.fromkeys(r["learner"] for r in results)) or ["-"]
    processes = any(r.get("processes", 1) > 1 for r in results)
    fig, axes = plt.subplots(2, len(learners), figsize=(5 * len(learners), 7.5), squeeze=False)
    for col, name in enumerate(learners):
        rows = [r for r in results if r["learner"] == name]
        for label in dict.fromkeys(_label(r) for r in rows):
            series = sorted((r for r in rows if _label(r) == label), key=lambda r: r["pop"])
            pops = [r["pop"] for r in series]
            style = "--" if "seq" in label or label.startswith("torch") else "-"
            (line,) = axes[0, col].plot(pops, [r["ms_per_pop_step"] for r in series], style, marker="o", label=label)
            # The lower panel: speed-up vs PyTorch, or with --processes the time over 1 process (same devices).
            key = "vs_one_process" if processes else "speedup_vs_torch_best"
            speed = [(r["pop"], r.get(key)) for r in series if not processes or r.get("processes", 1) > 1]
            speed = [(n, s) for n, s in speed if s]
            if speed and not label.startswith("torch"):
                axes[1, col].plot(*zip(*speed, strict=True), style, marker="o", label=label, color=line.get_color())
        axes[0, col].set(
            xscale="log",
            yscale="log",
            title=f"{name}: one population update step",
            xlabel="population size N",
            ylabel="ms per population step (median)",
        )
        axes[1, col].axhline(1.0, color="0.5", lw=0.8)
        axes[1, col].set(xscale="log", xlabel="population size N",
                         ylabel="time / 1 process (as many devices)" if processes else "speed-up vs fastest PyTorch")
        for ax in axes[:, col]:
            ax.grid(True, which="both", alpha=0.3)
            if ax.get_legend_handles_labels()[0]:  # the speed-up panel is empty when only torch ran
                ax.legend(fontsize=7)
    return common.save_figure(fig, path, payload["machine"])
