"""Study ``dispatch``: what a call of a compiled population program costs beyond its arithmetic, and what
popjax's training loop adds per iteration on top of its compiled programs.

Two parts, measured in one process (written as ``dispatch_<backend>.json``, e.g. ``dispatch_cpu.json``):

- ``update`` rows, per N: the one-step population update (the ``update`` study's ``vmap`` program,
  ``jit(vmap(update))``, the state donated) timed round-robin with programs that compute nothing:

  - ``noop``: the same arguments (same pytrees, shapes and dtypes, the state donated) and the same outputs
    (the state handed back, zero metrics): the per-call overhead of this call (``overhead_s``);
  - ``noop_packed``: the same bytes as one buffer per dtype (state donated, handed back): what JAX charges
    for these bytes without the pytree;
  - ``noop_scalar``: one scalar in and out: JAX's own floor;
  - ``update_flat`` / ``noop_flat``: the update and its no-op on the loop's layout, the state as a few flat
    buffers (``popjax.population.packing``: one per dtype, unpacked and written back inside the program, donated),
    as the training loop calls it; ``flat_overhead_s`` is ``noop_flat``, the per-call overhead the loop pays.

  ``pytree_s = noop - noop_packed`` is what the arguments' leaf count costs, ``overhead_share`` the no-op's
  share of the update's time; ``flat_equal`` says whether ``update_flat``'s state, unpacked, equals
  ``update``'s leaf for leaf after one call from the same state.
- ``loop`` rows: a short ``popjax.experiment.train`` run (the JAX env path, one compiled ``iteration``
  program per iteration) observed through ``train(..., instrument=...)``:

  - ``iteration_s``: loop wall time per training iteration in steady state: from the start of an iteration
    program's call after the warm-up iterations to the start of the call ``iterations`` later, both once their
    inputs are computed, divided by ``iterations`` (whole iterations: host work and programs; no compilation);
  - ``program_s``: the loop's own compiled ``iteration`` program called back to back with the same arguments
    (its last call's keys, the final state), without the loop, as many calls as the window, blocked at the end
    (median of rounds); ``program_noop_s``: the same for a program that computes nothing with those arguments
    and outputs;
  - ``loop_overhead_s = iteration_s - program_s``: what the loop adds per iteration;
  - per iteration, from a second, untimed run of the same configuration: ``eager_executions`` (XLA executions
    outside the loop's compiled programs: eager ``jnp``/``jax.random`` ops and small jitted helpers, counted
    with JAX's C++ fast path switched off so that each goes through ``ExecuteReplicated``), ``host_reads``
    (device arrays read on the host: ``device_get``, ``int()``, ``np.asarray``) and ``program_calls``.

The update rows block on every output leaf of every call (``common.time_interleaved``, round-robin); the loop
window and the program timings block only at their two ends, as a user's run does.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import tempfile
import time
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import numpy as np

from popjax.population import packing
from popjax_bench import common, update
from popjax_bench import options as opt
from popjax_bench.common import log

STUDY = "dispatch"
PROGRAM = "iteration"  # the loop's compiled program on the JAX env path
UPDATE_IMPLS = ("update", "update_flat", "noop", "noop_flat", "noop_packed", "noop_scalar")


@dataclasses.dataclass(frozen=True)
class Options(opt.SittingOptions):
    """``popjax bench dispatch`` (and ``dispatch.run(...)``)."""

    STUDY: ClassVar[str] = STUDY
    learner: str = opt.text("td3", "the learner of both parts", allowed=update.FUNCTIONAL_LEARNERS, what=" learner")
    pops: tuple[int, ...] = opt.ints((1,), "population sizes of the update part, comma-separated", flag="--pop")
    hidden: tuple[int, ...] | None = opt.ints(None, "hidden sizes (default: the learner's, 256,256)")
    batch_size: int = opt.integer(256, "batch size of both parts")
    env: str = opt.text("probe:pendulum", "env of the loop part (a JAX env: probe: or brax:)",
                        check=opt.env_check(jax_only=True))
    loop_pop: int = opt.integer(1, "population size of the loop part")
    rollout_len: int = opt.integer(1, "env steps per iteration of the loop part (1: one update per iteration, "
                                      "where the loop's own cost matters most)")
    iterations: int = opt.integer(200, "timed training iterations of the loop part", ge=10)
    count_iterations: int = opt.integer(20, "iterations of the untimed counting run", ge=1)
    repeats: int = opt.repeats()
    min_time: float = opt.min_time()


def output_path(out_dir: str) -> str:
    """A ``.json`` path as given, else ``<out_dir>/dispatch_<backend>.json``."""
    return out_dir if out_dir.endswith(".json") else f"{out_dir.rstrip('/')}/{STUDY}_{jax.default_backend()}.json"


# --- part 1: one update call against programs that compute nothing ------------------------------------------
def leaf_stats(tree: Any) -> dict[str, int]:
    leaves = jax.tree.leaves(tree)
    return {"leaves": len(leaves), "bytes": int(sum(x.nbytes for x in leaves))}


def _data(x: jax.Array) -> jax.Array:
    return jax.random.key_data(x) if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key) else x


def pack(tree: Any) -> dict[str, jax.Array]:
    """``tree``'s leaves raveled into one buffer per dtype (key arrays as their key data)."""
    groups: dict[str, list[jax.Array]] = collections.defaultdict(list)
    for leaf in jax.tree.leaves(tree):
        leaf = _data(leaf)
        groups[str(leaf.dtype)].append(leaf.ravel())
    return common.block({dtype: jnp.concatenate(parts) for dtype, parts in sorted(groups.items())})


class Carried:
    """A compiled program called again and again, each donated argument replaced by the output that holds it
    (``carry``: ``{argument index: output -> the argument's next value}``)."""

    def __init__(self, compiled, args: tuple, carry: dict[int, Any]):
        self.compiled, self.args, self.carry = compiled, list(args), carry

    def __call__(self):
        out = self.compiled(*self.args)
        for index, pick in self.carry.items():
            self.args[index] = pick(out)
        return out


def _zeros(shapes: Any) -> Any:
    return jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)


def _copy(tree: Any) -> Any:
    """Fresh buffers (each program donates its own)."""
    return common.block(jax.tree.map(jnp.copy, tree))


def update_point(p: update.Problem, pop: int, o: Options) -> dict[str, Any]:
    """The one-step update at ``pop`` and the three no-op programs, timed round-robin."""
    one = update.single_step(p)
    learner, _ = update.make_learner(one)
    state, hparams = update.population_state(p, pop, o.seed)
    batch = update.synthetic_batches(p, None, pop, o.seed)
    keys = jax.random.split(jax.random.key(o.seed + 1), pop)
    step = update.vmapped_step(learner)
    metrics_shape = jax.eval_shape(step, keys, state, batch, hparams)[1]

    def noop(keys, state, batch, hparams):
        return state, _zeros(metrics_shape)

    layout = packing.layout_of(state)

    def flat(keys, arguments, batch, hparams):
        new_state, metrics = step(keys, packing.unpack(layout, arguments), batch, hparams)
        return packing.repack(layout, arguments, new_state), metrics

    entries, compile_s = {}, {}
    flat_state = packing.pack(layout, state)
    for name, fn, start in (("update", step, state), ("update_flat", flat, flat_state), ("noop", noop, state),
                            ("noop_flat", noop, flat_state)):
        args = (keys, _copy(start), batch, hparams)
        compiled, times = common.compile_timed(fn, *args, donate_argnums=(1,))
        entries[name], compile_s[name] = Carried(compiled, args, {1: lambda out: out[0]}), times["compile_s"]
    after_one = [np.asarray(x) for x in jax.tree.leaves(entries["update"]()[0])]
    flat_one = [np.asarray(x) for x in jax.tree.leaves(packing.unpack(layout, entries["update_flat"]()[0]))]
    flat_equal = len(after_one) == len(flat_one) and all(
        a.dtype == b.dtype and np.array_equal(a, b) for a, b in zip(after_one, flat_one, strict=True))
    packed_state, packed_rest = pack(state), pack((keys, batch, hparams))
    compiled, _ = common.compile_timed(lambda s, rest: s, packed_state, packed_rest, donate_argnums=(0,))
    entries["noop_packed"] = Carried(compiled, (packed_state, packed_rest), {0: lambda out: out})
    compiled, _ = common.compile_timed(lambda x: x, jnp.zeros((), jnp.float32), donate_argnums=(0,))
    entries["noop_scalar"] = Carried(compiled, (jnp.zeros((), jnp.float32),), {0: lambda out: out})
    for entry in entries.values():
        for _ in range(3):  # first executions, allocator warm-up
            common.block(entry())
    timings = common.time_interleaved([(entries[n], common.block, o.repeats) for n in UPDATE_IMPLS],
                                      min_time=o.min_time)
    t = {name: timing for name, timing in zip(UPDATE_IMPLS, timings, strict=True)}
    median = {name: t[name]["median_s"] for name in UPDATE_IMPLS}
    return {
        "part": "update", "learner": p.learner, "pop": pop, "batch_size": p.batch_size,
        "hidden": list(p.config.hidden),
        "args": {"keys": leaf_stats(keys), "state": leaf_stats(state), "batch": leaf_stats(batch),
                 "hparams": leaf_stats(hparams), "packed_buffers": len(packed_state) + len(packed_rest),
                 "flat_state": leaf_stats(flat_state)},
        **{f"{name}_s": median[name] for name in UPDATE_IMPLS},
        "overhead_s": median["noop"],
        "flat_overhead_s": median["noop_flat"],
        "flat_equal": flat_equal,
        "pytree_s": median["noop"] - median["noop_packed"],
        "overhead_share": median["noop"] / median["update"],
        "compile_s": compile_s,
        "timing": t,
    }


# --- part 2: the training loop ------------------------------------------------------------------------------
class Observer:
    """An ``instrument`` of ``popjax.experiment.train``: counts every compiled call by name and marks a window of
    whole iterations: it opens at the ``start``-th ``iteration`` call and closes at the ``stop``-th, each time
    once the call's inputs are computed (blocking on them), so the window holds ``stop - start`` iterations, their
    host work and their programs, and no compilation. It keeps the last ``iteration`` program, its keys and its
    outputs."""

    def __init__(self, start: int, stop: int):
        self.start, self.stop = start, stop
        self.calls: collections.Counter[str] = collections.Counter()
        self.opened = self.closed = None
        self.program = self.keys = self.outputs = None
        self.on_open = self.on_close = lambda: None

    def __call__(self, name: str, compiled):
        def observed(*args):
            if name == PROGRAM and self.calls[name] in (self.start, self.stop):
                common.block(args)
                if self.calls[name] == self.start:
                    self.opened = time.perf_counter()
                    self.on_open()
                else:
                    self.closed = time.perf_counter()
                    self.on_close()
            self.calls[name] += 1
            out = compiled(*args)
            if name == PROGRAM:
                self.program, self.keys, self.outputs = compiled, args[:-2], out
            return out

        return observed

    @property
    def iterations(self) -> int:
        return self.stop - self.start


class ExecutionCounter:
    """Counts XLA executions outside AOT-compiled programs and host reads of device arrays, while ``active``.

    JAX's C++ fast path runs cached jitted calls (eager ops included) without Python; inside ``enabled()`` it is
    switched off (``_get_fastpath_data`` answers None and the caches are cleared), so every such execution goes
    through ``pxla.ExecuteReplicated.__call__``, counted here. The loop's AOT-compiled programs keep their own C++
    path and are counted by the ``Observer``. Host reads are first reads of an array's value (``_value``: what
    ``device_get``, ``int()``, ``float()`` and ``np.asarray`` go through)."""

    def __init__(self):
        self.active = False
        self.executions = self.host_reads = 0

    @contextlib.contextmanager
    def enabled(self):
        from jax._src import array, pjit
        from jax._src.interpreters import pxla

        execute, fastpath, value = pxla.ExecuteReplicated.__call__, pjit._get_fastpath_data, array.ArrayImpl._value
        counter = self

        def counted_execute(self, *args):
            if counter.active:
                counter.executions += 1
            return execute(self, *args)

        def counted_value(self):
            if counter.active and self._npy_value is None:
                counter.host_reads += 1
            return value.fget(self)

        pxla.ExecuteReplicated.__call__ = counted_execute
        pjit._get_fastpath_data = lambda *args, **kwargs: None
        array.ArrayImpl._value = property(counted_value)
        jax.clear_caches()
        try:
            yield self
        finally:
            pxla.ExecuteReplicated.__call__, pjit._get_fastpath_data = execute, fastpath
            array.ArrayImpl._value = value
            jax.clear_caches()


def loop_config(o: Options, iterations: int) -> dict[str, Any]:
    """``train`` options: ``iterations`` iterations, the first a random warm-up (updates start at the second),
    one evaluation at the end, no preset (the study's sizes are the ones given)."""
    steps = o.rollout_len * iterations
    config = dict(learner=o.learner, env=o.env, pop_size=o.loop_pop, total_env_steps=steps,
                  warmup_steps=o.rollout_len, rollout_len=o.rollout_len, batch_size=o.batch_size,
                  buffer_size=max(steps, o.batch_size), eval_interval=steps, eval_episodes=1, seed=o.seed,
                  progress=False, preset="none")
    if o.hidden is not None:
        config["learner_config"] = {"hidden": list(o.hidden)}
    return config


WARMUP_ITERATIONS = 3  # program calls before the window: the random warm-up one, then updates settling in
PIPELINE_ROUNDS = 3  # rounds of back-to-back program calls (each as many calls as the loop's window)


def pipelined(calls: list[Carried], count: int, rounds: int) -> list[dict[str, Any]]:
    """Seconds per call of ``count`` back-to-back calls blocked only at the end, as the loop runs its program
    (blocking every call would add a wake-up per call that the loop does not pay); ``rounds`` rounds of each
    call in turn, summarised over rounds."""
    per_call: list[list[float]] = [[] for _ in calls]
    for _ in range(rounds):
        for call, times in zip(calls, per_call, strict=True):
            common.block(call.args)
            start = time.perf_counter()
            for _ in range(count):
                out = call()
            common.block(out)
            times.append((time.perf_counter() - start) / count)
    return [common.summarize(times) | {"calls_per_round": count} for times in per_call]


def loop_point(o: Options) -> dict[str, Any]:
    """The loop part: the timed run, the program alone, its no-op, and the counted run."""
    from popjax.experiment import train

    observer = Observer(WARMUP_ITERATIONS, WARMUP_ITERATIONS + o.iterations)
    with tempfile.TemporaryDirectory() as tmp:
        run = train(out_dir=f"{tmp}/timed", instrument=observer, **loop_config(o, observer.stop + 1))
    iterations = observer.iterations
    iteration_s = (observer.closed - observer.opened) / iterations
    state, env_state, metrics = observer.outputs
    del run
    carry = {len(observer.keys): lambda out: out[0], len(observer.keys) + 1: lambda out: out[1]}
    metrics_shape = jax.eval_shape(lambda m: m, metrics)

    def noop(*args):
        return args[-2], args[-1], _zeros(metrics_shape)

    copies = _copy((state, env_state))
    noop_compiled, _ = common.compile_timed(noop, *observer.keys, *copies, donate_argnums=tuple(carry))
    calls = [Carried(observer.program, (*observer.keys, state, env_state), carry),
             Carried(noop_compiled, (*observer.keys, *copies), carry)]
    for call in calls:
        common.block(call())
    program_t, noop_t = pipelined(calls, iterations, PIPELINE_ROUNDS)
    counts = count_loop(o)
    return {
        "part": "loop", "learner": o.learner, "env": o.env, "pop": o.loop_pop, "batch_size": o.batch_size,
        "rollout_len": o.rollout_len, "iterations_timed": iterations,
        "args": {"keys": leaf_stats(observer.keys), "state": leaf_stats(state), "env_state": leaf_stats(env_state),
                 "metrics": leaf_stats(metrics)},
        "iteration_s": iteration_s,
        "program_s": program_t["median_s"],
        "program_noop_s": noop_t["median_s"],
        "loop_overhead_s": iteration_s - program_t["median_s"],
        "calls": dict(observer.calls),
        **counts,
        "timing": {"program": program_t, "program_noop": noop_t},
    }


def count_loop(o: Options) -> dict[str, Any]:
    """Per iteration of a short untimed run: executions outside the compiled programs, host reads, program
    calls (between the same marks as the timed window: whole iterations)."""
    from popjax.experiment import train

    counter = ExecutionCounter()
    observer = Observer(WARMUP_ITERATIONS, WARMUP_ITERATIONS + o.count_iterations)
    before: dict[str, int] = {}
    after: dict[str, int] = {}

    def opened():
        counter.active = True
        before.update(observer.calls)

    def closed():
        counter.active = False
        after.update(observer.calls)

    observer.on_open, observer.on_close = opened, closed
    with counter.enabled(), tempfile.TemporaryDirectory() as tmp:
        train(out_dir=f"{tmp}/counted", instrument=observer, **loop_config(o, observer.stop + 1))
    n = observer.iterations
    programs = {name: (count - before.get(name, 0)) / n for name, count in after.items()
                if count > before.get(name, 0)}
    return {"iterations_counted": n, "eager_executions": counter.executions / n, "host_reads": counter.host_reads / n,
            "program_calls": programs}


# --- the study ----------------------------------------------------------------------------------------------
def run(options: Options | None = None, /, **overrides: Any) -> dict[str, Any]:
    """Runs both parts and writes ``dispatch_<backend>.json`` (and ``.png``); returns the payload."""
    o = Options.build(options, overrides)
    started = common.utc_now()
    sitting = common.Sitting(allow_busy=o.allow_busy, wait_quiet=o.wait_quiet, repeats=o.repeats,
                             min_time=o.min_time, seed=o.seed)
    p = update.problem(o.learner, o.hidden, o.batch_size, 1)
    results = []
    for pop in o.pops:
        row = update_point(p, pop, o)
        results.append(row)
        log(f"  update {o.learner} N={pop}: update {1e6 * row['update_s']:.0f} us (flat state "
            f"{1e6 * row['update_flat_s']:.0f} us, same leaves: {row['flat_equal']}), no-op same args "
            f"{1e6 * row['noop_s']:.1f} us ({row['args']['state']['leaves']} state leaves), on the flat state "
            f"{1e6 * row['noop_flat_s']:.1f} us ({row['args']['flat_state']['leaves']} buffers), packed "
            f"{1e6 * row['noop_packed_s']:.1f} us, scalar {1e6 * row['noop_scalar_s']:.1f} us")
    row = loop_point(o)
    results.append(row)
    log(f"  loop {o.env} N={o.loop_pop}: {1e6 * row['iteration_s']:.0f} us per iteration, program alone "
        f"{1e6 * row['program_s']:.0f} us, loop overhead {1e6 * row['loop_overhead_s']:.0f} us; per iteration "
        f"{row['eager_executions']:.1f} eager executions, {row['host_reads']:.1f} host reads")
    params = {**{f.name: getattr(o, f.name) for f in dataclasses.fields(o)},
              "warmup_iterations": WARMUP_ITERATIONS, "quiet_load": _quiet_load()}
    payload = common.study_payload(STUDY, params, results, started, **sitting.record())
    return common.write_study(output_path(o.out_dir), STUDY, payload, plot_dispatch, o.plot)


def _quiet_load() -> float | None:
    """``QUIET_LOAD`` from the environment (the load a ``heavy --quiet`` window started at), if set."""
    import os

    value = os.environ.get("QUIET_LOAD")
    try:
        return None if value is None else float(value)
    except ValueError:
        return None


def main(options: Options) -> dict[str, Any]:
    """``popjax bench dispatch``."""
    return run(options)


def plot_dispatch(payload: dict[str, Any], path) -> Any:
    plt = common.pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    updates = [r for r in payload["results"] if r["part"] == "update"]
    labels = [f"{r['learner']} N={r['pop']}" for r in updates]
    x = np.arange(len(updates))
    width = 0.8 / len(UPDATE_IMPLS)
    for i, name in enumerate(UPDATE_IMPLS):
        left.bar(x + (i - (len(UPDATE_IMPLS) - 1) / 2) * width, [1e6 * r.get(f"{name}_s", np.nan) for r in updates],
                 width, label=name)
    left.set(xticks=x, xticklabels=labels, yscale="log", ylabel="µs per call (median)",
             title="One update call vs no-op programs")
    left.legend(fontsize=7)
    (loop,) = [r for r in payload["results"] if r["part"] == "loop"]
    parts = {"loop iteration": loop["iteration_s"], "program alone": loop["program_s"],
             "program's no-op": loop["program_noop_s"]}
    right.bar(list(parts), [1e6 * v for v in parts.values()], color=["C0", "C1", "C2"])
    right.set(ylabel="µs per iteration", title=f"Training loop, {loop['env']} N={loop['pop']} "
                                               f"(overhead {1e6 * loop['loop_overhead_s']:.0f} µs)")
    right.tick_params(axis="x", labelsize=8)
    fig.tight_layout()
    return common.save_figure(fig, path, payload["machine"])
