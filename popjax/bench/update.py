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

``vmap``/``vmap_scan`` run once per requested device count (the member axis split over the
devices with a NamedSharding); the sequential baselines run on one device.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from pathlib import Path
from typing import Any, ClassVar

import jax
import jax.numpy as jnp

from popjax.bench import common
from popjax.bench import options as opt
from popjax.bench.common import log
from popjax.learners import LEARNERS
from popjax.learners.base import chunk_update
from popjax.population.tree import broadcast, member
from popjax.types import EnvSpec, Transition

STUDY = "update"
IMPLS = ("vmap", "vmap_scan", "jax_seq", "torch_seq")
DEFAULT_POPS = (1, 2, 4, 8, 16, 32, 64)
PROBLEMS = ("td3", "sac", "dqn")  # learners with the paper's timing shapes (``problem``)


@dataclasses.dataclass(frozen=True)
class Options(opt.StudyOptions):
    """``popjax bench update`` (and ``update.run(...)``)."""

    STUDY: ClassVar[str] = STUDY
    learners: tuple[str, ...] = opt.names(("td3", "sac", "dqn"), "comma-separated learners", flag="--learner",
                                          allowed=PROBLEMS, what=" learner")
    pops: tuple[int, ...] = opt.ints(DEFAULT_POPS, "population sizes, comma-separated", flag="--pop")
    impls: tuple[str, ...] = opt.names(IMPLS, "comma-separated subset of " + ",".join(IMPLS), flag="--impl",
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
    memory_fit: bool = opt.switch(True, "skip the search of the largest population whose compiled K-step update "
                                  "fits in the device's memory", flag="--no-memory-fit")


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
        # Nature DQN head (512,), double Q, Huber; the paper's timing config (reference §3.3).
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
    work); the 1-step program uses ``update``, the traced gate.
    """
    definition = LEARNERS[p.learner]
    hparams = definition.default_hparams(p.config)
    config = p.config
    if definition.specialize is not None:
        config = definition.specialize(config, broadcast(hparams, 1), p.k, frozenset())
    return definition.make(config, p.spec), hparams


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
    v_update = jax.vmap(learner.update)

    def step(keys, state, batch, hparams):
        return v_update(keys, state, batch, hparams)

    return step


def scanned_step(learner):
    """K steps per call: ``scan`` over ``[K, pop, ...]`` batches and keys in the learner's chunks (as
    popjax's drivers run them), ``vmap`` over members inside."""
    chunk = learner.chunk
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
    learner, _ = make_learner(p)
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
        point = (p, pop, devices, k)
        if not (reuse and point in _VMAP_COMPILED):
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
    steps_counted = 1 if k == 1 else learner.chunk
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
    learner, _ = make_learner(p)
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
        if p not in _SEQ_COMPILED:
            _SEQ_COMPILED[p] = common.compile_timed(
                learner.update, keys[0], states[0], batches[0], hps[0], donate_argnums=(1,)
            )
        compiled, compile_times = _SEQ_COMPILED[p]

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

    from popjax.bench import torch_reference as tr

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

        entry = _ready(call, lambda _: tr.synchronize(dev), opts, period)
    return entry | {"compile": None, "memory": mem.result(), "torch_device": dev, "torch_threads": threads}


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
    """Adds speed-ups vs the sequential baselines measured at the same (learner, N).

    With several PyTorch thread counts the fastest PyTorch run at that N is the baseline
    (the conservative choice for popjax).
    """
    base: dict[tuple[str, str, int], float] = {}
    for r in results:
        if "skipped" not in r and r["impl"] in ("jax_seq", "torch_seq"):
            key = (r["learner"], r["impl"], r["pop"])
            base[key] = min(base.get(key, float("inf")), r["ms_per_pop_step"])
    for r in results:
        if "skipped" in r:
            continue
        for name in ("torch_seq", "jax_seq"):
            ref = base.get((r["learner"], name, r["pop"]))
            r[f"speedup_vs_{name}"] = None if ref is None else ref / r["ms_per_pop_step"]


def run(options: Options | None = None, /, **overrides: Any) -> dict[str, Any]:
    """Runs the study and writes ``<out_dir>/update.json`` and ``update.png``; returns the payload.

    ``options``: an ``Options`` (the command line's); ``overrides``: any of its fields, e.g.
    ``run(learners=("td3",), pops=(1, 4))``.
    """
    o = Options.build(options, overrides)
    learners, pops, devices, impls = o.learners, o.pops, o.devices, list(o.impls)
    max_seconds = o.max_seconds
    started = common.utc_now()
    problems = [problem(name, o.hidden, o.batch_size, o.k, o.frame) for name in learners]
    common.request_devices(devices)
    notes: list[str] = []
    if "torch_seq" in impls:
        from popjax.bench import torch_reference as tr

        if not tr.available():
            notes.append(f"torch_seq skipped: {tr.TORCH_ERROR}")
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
        "at each N is the baseline); jax_seq = jitted single-member update called member after member, K=1",
        "ceilings": "dense matmul peak (2048² f32) before and after the study; N×[B,h]@[h,h] (B = batch, h = the "
        "widest hidden layer) measured just before each TD3/SAC point; DQN has none (its dominant work is the "
        "convolutions)",
    }
    json_path, png_path = common.output_paths(o.out_dir, STUDY)

    def write(plot: bool, final: bool = False) -> dict[str, Any]:
        extra = sitting.record(final)
        payload = common.study_payload(STUDY, params, results, started, notes, memory_fit=memory_fit, **extra)
        common.write_json(json_path, payload)
        if plot:
            plot_update(payload, png_path)
        return payload

    for p in problems:
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
            if "torch_seq" in impls:
                variants += [("torch_seq", 1, t) for t in thread_counts]
            prepared = []  # (impl, devices, threads, entry): all compiled and warmed up, then timed interleaved
            for impl, d, threads in variants:
                if impl == "torch_seq" and notes and any(n.startswith("torch_seq skipped") for n in notes):
                    results.append(_skip(p, impl, pop, d, "PyTorch not installed"))
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
                else:
                    entry = prepare_torch_seq(p, pop, o, threads)
                prepared.append((impl, d, threads, entry))
            if not prepared:
                continue
            layer = {}  # the dominant layer's ceiling at this N, measured just before the point
            if p.learner in ("td3", "sac"):
                for d in dict.fromkeys(d for impl, d, _, _ in prepared if impl.startswith("vmap")):
                    layer[d] = sitting.layer(pop, p.batch_size, max(p.config.hidden), d)
            start = time.perf_counter()
            outs = measure([entry for *_, entry in prepared], o)
            spent = time.perf_counter() - start
            point = []
            for (impl, d, threads, _), out in zip(prepared, outs, strict=True):
                timing = out["timing"]  # execution time only (compile excluded): it scales with N
                last[(impl, d, threads)] = (pop, timing["median_s"], out["warmup_calls"])
                rec = _record(p, impl, pop, d, out)
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
    return r["impl"] + (f" ({r['devices']} dev)" if r["impl"].startswith("vmap") else "")


def plot_update(payload: dict[str, Any], path: Path) -> Path:
    plt = common.pyplot()
    results = [r for r in payload["results"] if "skipped" not in r]
    learners = list(dict.fromkeys(r["learner"] for r in results)) or ["-"]
    fig, axes = plt.subplots(2, len(learners), figsize=(5 * len(learners), 7.5), squeeze=False)
    for col, name in enumerate(learners):
        rows = [r for r in results if r["learner"] == name]
        for label in dict.fromkeys(_label(r) for r in rows):
            series = sorted((r for r in rows if _label(r) == label), key=lambda r: r["pop"])
            pops = [r["pop"] for r in series]
            style = "--" if "seq" in label else "-"
            axes[0, col].plot(pops, [r["ms_per_pop_step"] for r in series], style, marker="o", label=label)
            speed = [(r["pop"], r.get("speedup_vs_torch_seq")) for r in series]
            speed = [(n, s) for n, s in speed if s]
            if speed and label != "torch_seq":
                axes[1, col].plot(*zip(*speed, strict=True), style, marker="o", label=label)
        axes[0, col].set(
            xscale="log",
            yscale="log",
            title=f"{name}: one population update step",
            xlabel="population size N",
            ylabel="ms per population step (median)",
        )
        axes[1, col].axhline(1.0, color="0.5", lw=0.8)
        axes[1, col].set(xscale="log", xlabel="population size N", ylabel="speed-up vs PyTorch sequential")
        for ax in axes[:, col]:
            ax.grid(True, which="both", alpha=0.3)
            if ax.get_legend_handles_labels()[0]:  # the speed-up panel is empty when only torch ran
                ax.legend(fontsize=7)
    return common.save_figure(fig, path, payload["machine"])
