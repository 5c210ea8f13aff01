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
  PyTorch is not installed).

``vmap``/``vmap_scan`` run once per requested device count (the member axis split over the
devices with a NamedSharding); the sequential baselines run on one device.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import time
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp

from popjax.bench import common
from popjax.bench.common import log
from popjax.learners import LEARNERS
from popjax.population.tree import broadcast, member
from popjax.types import EnvSpec, Transition

STUDY = "update"
IMPLS = ("vmap", "vmap_scan", "jax_seq", "torch_seq")
DEFAULT_POPS = (1, 2, 4, 8, 16, 32, 64)


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
    """``(learner, single-member default hparams)``, cached so jitted helpers compile once per problem."""
    definition = LEARNERS[p.learner]
    return definition.make(p.config, p.spec), definition.default_hparams(p.config)


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
    """K steps per call: ``scan`` over ``[K, pop, ...]`` batches and keys, ``vmap`` inside."""
    v_update = jax.vmap(learner.update)

    def step(keys, state, batches, hparams):
        def body(s, xs):
            k, b = xs
            return v_update(k, s, b, hparams)

        return jax.lax.scan(body, state, (keys, batches))

    return step


# --- one implementation at one size ---------------------------------------------------------------
def _timing_kwargs(opts, k: int) -> dict[str, Any]:
    # K-step calls average K steps each, so fewer calls are needed.
    if k > 1:
        return dict(warmup=1, min_repeats=max(2, opts.repeats // 4), min_time=opts.min_time, max_time=opts.max_seconds)
    return dict(warmup=2, min_repeats=opts.repeats, min_time=opts.min_time, max_time=opts.max_seconds)


def _ready(call, sync, opts, k: int, **fields) -> dict[str, Any]:
    """A prepared implementation: warmed up (inside the caller's memory measurement), ready to time."""
    kwargs = _timing_kwargs(opts, k)
    for _ in range(kwargs["warmup"]):
        sync(call())
    return {"call": call, "sync": sync, "steps_per_call": k, "min_repeats": kwargs["min_repeats"], **fields}


def measure(entries: list[dict[str, Any]], opts) -> list[dict[str, Any]]:
    """Times prepared implementations **interleaved** (one call of each in turn, round-robin), so that
    on a shared machine every implementation sees the same load; returns each entry with ``timing``."""
    timings = common.time_interleaved(
        [(e["call"], e["sync"], e["min_repeats"]) for e in entries], min_time=opts.min_time, max_time=opts.max_seconds
    )
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
    return entry | {
        "compile": compile_times,
        "memory": mem.result(),
        "xla_memory": common.memory_analysis(compiled),
        # With d devices XLA's cost analysis describes the partitioned (per-device) program.
        "xla_flops_per_call": None if flops is None else flops * devices,
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


def prepare_torch_seq(p: Problem, pop: int, opts) -> dict[str, Any]:
    """PyTorch, one member after another, one step per call (the paper's Torch (Sequential))."""
    import torch

    from popjax.bench import torch_reference as tr

    dev = tr.device()
    torch.manual_seed(opts.seed)
    threads = getattr(opts, "torch_threads", None) or tr.DEFAULT_THREADS
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

        def call():
            torch.set_num_threads(threads)  # per call: implementations are timed interleaved
            return [m.update(b) for m, b in zip(members, batches, strict=True)]

        entry = _ready(call, lambda _: tr.synchronize(dev), opts, 1)
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
        "ms_per_pop_step_mean": 1e3 * t["mean_s"] / k,  # paper-style mean (after dropping warm-up calls)
        "ms_per_member_step": 1e3 * t["median_s"] / k / pop,
        "compile_s": compile_s,
        **{key: v for key, v in out.items() if key not in ("timing", "steps_per_call")},
        "timing": t,
    }


def _skip(p: Problem, impl: str, pop: int, devices: int, reason: str) -> dict[str, Any]:
    log(f"  {p.learner} {impl:9s} N={pop:3d} d={devices}: skipped ({reason})")
    return {"learner": p.learner, "impl": impl, "pop": pop, "devices": devices, "skipped": reason}


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


def run(
    learners=("td3", "sac", "dqn"),
    pops=DEFAULT_POPS,
    devices=(1,),
    impls=IMPLS,
    out_dir=common.DEFAULT_OUT,
    hidden=None,
    batch_size=None,
    k=None,
    frame=84,
    repeats=10,
    min_time=1.0,
    max_seconds=120.0,
    seed=0,
    torch_threads=None,
    plot=True,
) -> dict[str, Any]:
    """Runs the study and writes ``<out_dir>/update.json`` and ``update.png``; returns the payload."""
    opts = argparse.Namespace(
        repeats=repeats, min_time=min_time, max_seconds=max_seconds, seed=seed, torch_threads=torch_threads
    )
    started = common.utc_now()
    impls = list(impls)
    unknown = sorted(set(impls) - set(IMPLS))
    if unknown:
        raise ValueError(f"--impl: unknown implementation(s) {', '.join(unknown)} (allowed: {', '.join(IMPLS)})")
    problems = [problem(name, hidden, batch_size, k, frame) for name in learners]  # names checked before timing
    common.request_devices(devices)
    notes: list[str] = []
    if "torch_seq" in impls:
        from popjax.bench import torch_reference as tr

        if not tr.available():
            notes.append(f"torch_seq skipped: {tr.TORCH_ERROR}")
            log(f"WARNING: {notes[-1]}")
    load_before = common.load_average()
    thread_counts = (
        [None]
        if torch_threads is None
        else ([torch_threads] if isinstance(torch_threads, int) else list(torch_threads))
    )
    results: list[dict[str, Any]] = []
    params = {
        "learners": list(learners),
        "pops": list(pops),
        "devices": list(devices),
        "impls": impls,
        "torch_threads": thread_counts,
        "repeats": repeats,
        "min_time_s": min_time,
        "max_seconds": max_seconds,
        "seed": seed,
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
        "statistic": "median of timed calls after warm-up, divided by steps per call",
        "baselines": "torch_seq = PyTorch sequential K=1 (paper's baseline; with several thread counts the fastest "
        "is the baseline); jax_seq = jitted single-member update called member after member, K=1",
    }
    json_path, png_path = common.output_paths(out_dir, STUDY)

    def write(plot: bool) -> dict[str, Any]:
        payload = common.study_payload(
            STUDY, params, results, started, notes, load_before=load_before, load_after=common.load_average()
        )
        common.write_json(json_path, payload)
        if plot:
            plot_update(payload, png_path)
        return payload

    for p in problems:
        last: dict[tuple, tuple[int, float]] = {}  # (impl, devices, threads) -> (pop, seconds of timed calls)
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
                estimate = None if prev is None else prev[1] * pop / prev[0]
                if estimate is not None and estimate > max_seconds:
                    reason = f"estimated {estimate:.0f}s of timed calls > --max-seconds {max_seconds:.0f}"
                    results.append(_skip(p, impl, pop, d, reason + (f" ({threads} threads)" if threads else "")))
                    continue
                if impl == "vmap":
                    entry = prepare_vmap(p, pop, d, 1, opts)
                elif impl == "vmap_scan":
                    entry = prepare_vmap(p, pop, d, p.k, opts)
                elif impl == "jax_seq":
                    entry = prepare_jax_seq(p, pop, opts)
                else:
                    entry = prepare_torch_seq(p, pop, argparse.Namespace(**{**vars(opts), "torch_threads": threads}))
                prepared.append((impl, d, threads, entry))
            if not prepared:
                continue
            start = time.perf_counter()
            outs = measure([entry for *_, entry in prepared], opts)
            spent = time.perf_counter() - start
            for (impl, d, threads, _), out in zip(prepared, outs, strict=True):
                timing = out["timing"]  # execution time only (compile excluded): it scales with N
                last[(impl, d, threads)] = (
                    pop,
                    sum(timing["times_s"]) + timing["median_s"] * (1 if out["steps_per_call"] > 1 else 2),
                )
                rec = _record(p, impl, pop, d, out)
                results.append(rec)
                log(
                    f"  {p.learner} {impl:9s} N={pop:3d} d={d}: {rec['ms_per_pop_step']:9.3f} ms/pop-step"
                    + (f"  compile {rec['compile_s']:.2f}s" if rec["compile_s"] is not None else "")
                    + (f"  threads {threads}" if threads else "")
                    + f"  ({timing['repeats']} calls)"
                )
            log(f"  {p.learner} N={pop}: {len(prepared)} implementations timed interleaved in {spent:.0f}s")
            add_ratios(results)
            write(plot=False)  # partial results survive an interrupted run
    add_ratios(results)
    payload = write(plot=plot)
    log(f"wrote {common.output_paths(out_dir, STUDY)[0]}")
    return payload


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


def main(args: argparse.Namespace) -> dict[str, Any]:
    return run(
        learners=[x for x in args.learner.split(",") if x],
        pops=common.parse_int_list(args.pop),
        devices=common.parse_int_list(args.devices),
        impls=[x for x in args.impl.split(",") if x],
        out_dir=args.out,
        hidden=common.parse_int_list(args.hidden) if args.hidden else None,
        batch_size=args.batch_size,
        k=args.k,
        frame=args.frame,
        repeats=args.repeats,
        min_time=args.min_time,
        max_seconds=args.max_seconds,
        seed=args.seed,
        torch_threads=common.parse_int_list(args.torch_threads) if args.torch_threads else None,
        plot=not args.no_plot,
    )
