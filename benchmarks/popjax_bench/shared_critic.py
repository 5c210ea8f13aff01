"""Shared-critic TD3 update vs population size: vectorized vs the sequential CEM-RL order (paper Fig. 4).

One **population update step** = one update of the shared critic plus one update of each of
the N actors (``popjax.learners.shared_critic``). Three implementations, timed in the same
process one after another (so ratios share the machine load):

- ``vectorized``: the fast-PBT modification, ``jit(train)``: per step one critic update on
  all N sub-batches (loss averaged over the population) and the N actor updates vmapped;
- ``sequential``: the original CEM-RL order (one actor after the other; member ``i`` makes
  its share of the critic updates on its own sub-batch, then its actor updates), compiled
  as one program (``jit`` of ``popjax_bench.cemrl_order.make_sequential_order(...).update``);
  same number of critic and actor updates;
- ``sequential_loop``: the same order as a Python loop of jitted single-member calls (one
  critic or actor update per call, ``critic_step`` / ``actor_step`` of the same module), the
  paper's "Jax (Sequential)" style with dispatch.

Synthetic batches already on the device (HalfCheetah sizes: obs 17, action 6), hidden
(256, 256), B = 256 per member, as in the paper. Each timed call runs ``k`` steps (default 1,
the paper's "one update step"); the reported time per step is ``call time / k``, the median
after warm-up with every output leaf blocked on; the implementations are timed round-robin (one
call of each per round) so that a varying machine load hits them alike; compile time (lower +
XLA) is reported separately, and FLOPs per step come from XLA's cost analysis. The paper
compares against PyTorch sequential on GPUs; there is no PyTorch baseline here (the
JAX-sequential baselines are named as such). The vectorized critic update sees N sub-batches
where a sequential one sees one, so it does more FLOPs per step (about 2x at N = 8): a GPU
absorbs that in parallel, a 2-core CPU does not (the paper: "no speedup when using one CPU core").

``devices`` (``popjax bench shared_critic --devices 1,2``): with ``d > 1`` the vectorized step
runs with the actors (and their hparams, keys and sub-batches, member axis) split over ``d``
devices and the shared critic replicated, as ``popjax train --devices`` places a shared-critic
state; XLA inserts the all-reduce of the critic gradient. The sequential orders are one
member after the other by definition and always run on one device, so ``speedup_vs_*`` at
``d > 1`` compares the split vectorized step with the one-device sequential reference.
``actor_shards`` records into how many pieces the vectorized step's output actors are split.

The study runs in a ``common.Sitting`` (load check, the dense-matmul peak before and after, and
the N×[B,h]@[h,h] ceiling of the actors' dominant layer at each N and device count).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from popjax.learners import td3
from popjax.learners.shared_critic import make_shared_critic_td3
from popjax.population.hparams import population_hparams
from popjax.types import EnvSpec, Transition
from popjax_bench import common
from popjax_bench import options as opt
from popjax_bench.cemrl_order import make_sequential_order

STUDY = "shared_critic"
IMPLS = ("vectorized", "sequential", "sequential_loop")
OBS_DIM, ACTION_DIM = 17, 6  # HalfCheetah


@dataclasses.dataclass(frozen=True)
class Options(opt.StudyOptions):
    """``popjax bench shared_critic`` (and ``shared_critic.run(...)``)."""

    STUDY: ClassVar[str] = STUDY
    pops: tuple[int, ...] = opt.ints((1, 2, 4, 8, 16), "population sizes, comma-separated", flag="--pop")
    impls: tuple[str, ...] = opt.names(IMPLS, "comma-separated subset of " + ",".join(IMPLS), flag="--impl",
                                       allowed=IMPLS, what=" implementation")
    k: int = opt.integer(1, "update steps per compiled call (time per step = call time / k)")
    hidden: tuple[int, ...] = opt.ints((256, 256), "hidden sizes")
    batch_size: int = opt.integer(256, "batch size per member")
    repeats: int = opt.repeats()
    min_time: float = opt.min_time()

    def check(self) -> None:
        if max(self.devices) > 1 and "vectorized" not in self.impls:
            raise ValueError("--devices: above 1 splits only the vectorized step: add vectorized to --impl")


def _batches(key, k: int, pop: int, batch: int, obs_dim: int, action_dim: int) -> Transition:
    ks = jax.random.split(key, 5)
    shape = (k, pop, batch)
    return Transition(obs=jax.random.normal(ks[0], shape + (obs_dim,)),
                      action=jax.random.uniform(ks[1], shape + (action_dim,), minval=-1, maxval=1),
                      reward=jax.random.normal(ks[2], shape),
                      next_obs=jax.random.normal(ks[3], shape + (obs_dim,)),
                      terminated=(jax.random.uniform(ks[4], shape) < 0.01).astype(jnp.float32))


def _loop_runner(order, state, batches, keys, hparams):
    """The CEM-RL order as a Python loop of jitted single-update calls; returns ``(call, compile_s)``."""
    critic_step, actor_step = jax.jit(order.critic_step), jax.jit(order.actor_step)
    k, pop = keys.shape
    member = lambda tree, i: jax.tree.map(lambda x: x[i], tree)
    members = [(member(hparams, i), member(state.target_actor, i),
                (member(state.actor, i), member(state.actor_opt, i), member(state.target_actor, i)),
                jax.tree.map(lambda x, i=i: x[:, i], batches), keys[:, i])
               for i in range(pop)]
    counts = [k // pop + (i < k % pop) for i in range(pop)]
    starts = np.cumsum([0] + counts[:-1]).tolist()
    # compile both single-member programs (timed separately from the runs)
    with common.Stopwatch() as sw:
        hp0, ta0, part0, b0, k0 = members[0]
        one = jax.tree.map(lambda x: x[0], b0)
        critic_part = (state.critic, state.critic_opt, state.target_critic)
        common.block(critic_step(k0[0], critic_part, ta0, one, hp0))
        common.block(actor_step(part0, state.critic, one.obs, hp0))

    def call():
        cpart = (state.critic, state.critic_opt, state.target_critic)
        actors = []
        for i, (hp, target_actor, part, b, ks) in enumerate(members):
            for s in range(starts[i], starts[i] + counts[i]):
                cpart, _ = critic_step(ks[s], cpart, target_actor, jax.tree.map(lambda x, s=s: x[s], b), hp)
            for s in range(k):
                part, _ = actor_step(part, cpart[0], b.obs[s], hp)
            actors.append(part)
        return cpart, actors

    return call, sw.seconds


def interleaved_times(calls: dict[str, Any], *, warmup: int = 2, min_repeats: int = 10, min_time: float = 1.0,
                      max_repeats: int = 200) -> dict[str, dict[str, Any]]:
    """Times several calls round-robin (one call of each per round, outputs blocked on), so a
    machine load that changes over time affects every implementation alike (shared machines)."""
    for call in calls.values():
        for _ in range(warmup):
            common.block(call())
    times: dict[str, list[float]] = {name: [] for name in calls}
    spent = 0.0
    while True:
        for name, call in calls.items():
            start = time.perf_counter()
            common.block(call())
            elapsed = time.perf_counter() - start
            times[name].append(elapsed)
            spent += elapsed
        rounds = len(next(iter(times.values())))
        if rounds >= max_repeats or (rounds >= min_repeats and spent >= min_time * len(calls)):
            break
    return {name: common.summarize(t) for name, t in times.items()}


def _split(tree, devices: int, axis: int = 0):
    """``tree`` with ``axis`` split over the mesh of ``common.mesh_sharding(devices)``."""
    sharding = common.mesh_sharding(devices, axis)
    return jax.tree.map(lambda x: jax.device_put(x, sharding), tree)


def place_state(state, devices: int):
    """A shared-critic state with the actors split over ``devices`` and the critic replicated."""
    mesh = common.mesh_sharding(devices).mesh
    replicated = NamedSharding(mesh, PartitionSpec())
    put = lambda tree: jax.tree.map(lambda x: jax.device_put(x, replicated), tree)
    return state.replace(actor=_split(state.actor, devices), target_actor=_split(state.target_actor, devices),
                         actor_opt=_split(state.actor_opt, devices), critic=put(state.critic),
                         target_critic=put(state.target_critic), critic_opt=put(state.critic_opt),
                         steps=put(state.steps))


def measure(pop: int, *, k: int = 1, hidden: Sequence[int] = (256, 256), batch_size: int = 256, obs_dim: int = 17,
            action_dim: int = 6, impls: Sequence[str] = IMPLS, min_repeats: int = 10, min_time: float = 1.0,
            seed: int = 0, devices: int = 1) -> dict[str, Any]:
    """Per-step times of the implementations at one population size (see module doc).

    ``devices > 1``: the vectorized step runs split over that many devices (actors split,
    critic replicated, batches and keys split along their member axis 1); the sequential
    orders stay on one device.
    """
    spec = EnvSpec("bench", (obs_dim,), action_dim=action_dim, action_low=(-1.0,) * action_dim,
                   action_high=(1.0,) * action_dim)
    shared = make_shared_critic_td3(td3.TD3Config(hidden=tuple(hidden), batch_size=batch_size), spec, pop)
    hparams = population_hparams(td3.default_hparams(), pop, {"policy_delay": 1})  # CEM-RL's TD3 delay
    key_init, key_batch, key_steps = jax.random.split(jax.random.key(seed), 3)
    state = jax.jit(shared.init)(key_init, hparams)
    batches = common.block(_batches(key_batch, k, pop, batch_size, obs_dim, action_dim))
    keys = jax.random.split(key_steps, k * pop).reshape(k, pop)
    order = make_sequential_order(shared, tuple(hidden), action_dim)
    out: dict[str, Any] = {"pop": pop, "k": k, "devices": devices}
    calls = {}
    for impl in impls:
        if impl == "sequential_loop":
            calls[impl], compile_s = _loop_runner(order, state, batches, keys, hparams)
            flops = None
        elif impl == "sequential":
            args = (keys, state, batches, hparams)
            compiled, times = common.compile_timed(order.update, *args)
            compile_s, flops = times["compile_s"], common.cost_flops(compiled) if k == 1 else None
            calls[impl] = lambda compiled=compiled, args=args: compiled(*args)
        else:  # vectorized, split over the devices when devices > 1
            args = (keys, state, batches, hparams)
            if devices > 1:
                args = common.block((_split(keys, devices, 1), place_state(state, devices),
                                     _split(batches, devices, 1), _split(hparams, devices)))
            compiled, times = common.compile_timed(shared.train, *args)
            # With d devices XLA's cost analysis describes one device's share (the replicated critic
            # update counted on every device): FLOPs are reported on one device only.
            compile_s, flops = times["compile_s"], common.cost_flops(compiled) if k == 1 and devices == 1 else None
            calls[impl] = lambda compiled=compiled, args=args: compiled(*args)
            out["actor_shards"] = common.shards(calls[impl]()[0].actor)
        out[f"{impl}_compile_s"] = compile_s
        if flops:
            out[f"{impl}_gflop_per_step"] = flops / 1e9
    stats = interleaved_times(calls, min_repeats=min_repeats, min_time=min_time)
    for impl in impls:
        out[f"{impl}_step_s"] = stats[impl]["median_s"] / k
        out[f"{impl}_mean_step_s"] = stats[impl]["mean_s"] / k
        out[f"{impl}_iqr_step_s"] = stats[impl]["iqr_s"] / k
        out[f"{impl}_repeats"] = stats[impl]["repeats"]
        if f"{impl}_gflop_per_step" in out:
            out[f"{impl}_gflops_per_s"] = out[f"{impl}_gflop_per_step"] / out[f"{impl}_step_s"]
        common.log(f"shared_critic N={pop} d={devices} {impl}: {1e3 * out[f'{impl}_step_s']:.2f} ms/step "
                   f"(compile {out[f'{impl}_compile_s']:.1f} s, {stats[impl]['repeats']} calls)")
    for impl in impls:
        if impl != "vectorized" and "vectorized" in impls:
            out[f"speedup_vs_{impl}"] = out[f"{impl}_step_s"] / out["vectorized_step_s"]
    return out


def plot_shared_critic(payload: dict[str, Any], path) -> Any:
    plt = common.pyplot()
    measured = [r for r in payload["results"] if "skipped" not in r]
    by_devices: dict[int, list[dict[str, Any]]] = {}
    for r in measured:
        by_devices.setdefault(r.get("devices", 1), []).append(r)
    fig, (ax, ax2, ax3) = plt.subplots(1, 3, figsize=(15, 4.2))
    labels = {"vectorized": "vectorized (fast-PBT: critic loss averaged over N)",
              "sequential": "sequential CEM-RL order, one compiled program",
              "sequential_loop": "sequential CEM-RL order, loop of jitted calls"}
    for i, (d, rows) in enumerate(sorted(by_devices.items())):
        pops = [r["pop"] for r in rows]
        suffix = f", vectorized on {d} devices" if d > 1 else ""
        for impl, style in zip(IMPLS, ("o-", "s-", "^--"), strict=True):
            if f"{impl}_step_s" not in rows[0] or (i and impl != "vectorized"):
                continue  # the sequential references run on one device: drawn once
            color = f"C{IMPLS.index(impl) + (3 + i if i else 0)}"
            ax.plot(pops, [1e3 * r[f"{impl}_step_s"] for r in rows], color + style,
                    label=labels[impl] + (f" ({d} devices)" if d > 1 else ""))
        for impl, style in zip(IMPLS[1:], ("s-", "^--"), strict=True):
            if f"speedup_vs_{impl}" in rows[0]:
                ax2.plot(pops, [r[f"speedup_vs_{impl}"] for r in rows], f"C{IMPLS.index(impl) + 3 * i}{style}",
                         label=f"vs {impl}{suffix}")
        for impl, style in zip(("vectorized", "sequential"), ("o-", "s-"), strict=True):
            if not i and f"{impl}_gflop_per_step" in rows[0]:
                ax3.plot(pops, [r[f"{impl}_gflop_per_step"] for r in rows], f"C{IMPLS.index(impl)}{style}",
                         label=impl)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("population size N")
    ax.set_ylabel("ms per population update step")
    p = payload["params"]
    ax.set_title(f"shared-critic TD3, hidden {tuple(p['hidden'])}, B {p['batch_size']}, K {p['k']}", fontsize=10)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7)
    ax2.axhline(1.0, color="0.5", lw=1)
    ax2.set_xscale("log", base=2)
    ax2.set_xlabel("population size N")
    ax2.set_ylabel("speed-up of the vectorized step")
    ax2.grid(alpha=0.3)
    ax2.legend(fontsize=8)
    ax3.set_xscale("log", base=2)
    ax3.set_xlabel("population size N")
    ax3.set_ylabel("GFLOP per population update step (XLA, one device)")
    ax3.grid(alpha=0.3)
    ax3.legend(fontsize=8)
    fig.tight_layout()
    return common.save_figure(fig, path, payload["machine"])


def run(options: Options | None = None, /, **overrides: Any) -> dict[str, Any]:
    """Times one shared-critic population update step vs N; writes ``<out_dir>/shared_critic.json`` and ``.png``.

    ``options``: an ``Options`` (``pops``, ``devices``, ``impls``, ``k`` steps per call, ``hidden``,
    ``batch_size``, ``repeats`` (minimum timed calls per point), ``min_time``, ``seed``, ...);
    ``overrides``: any of its fields. ``devices``: device counts the vectorized step is split over
    (one row per N and count; an N that does not divide over a count is recorded as skipped).

    Returns:
      The JSON payload: ``machine`` (CPU, devices, jax version, load), ``params``, ``results``
      (one dict per N and device count: ``<impl>_step_s`` medians, IQRs, means, compile times,
      ``speedup_vs_<impl>``, ``devices``, ``layer_gflops``), the sitting (``busy``, ``ceilings``).

    Raises:
      ValueError: bad options, a busy machine, or more devices than JAX can provide.
    """
    o = Options.build(options, overrides)
    pops, repeats, k, hidden, batch_size, impls = o.pops, o.repeats, o.k, o.hidden, o.batch_size, o.impls
    min_time, seed, devices = o.min_time, o.seed, list(o.devices)
    obs_dim, action_dim = OBS_DIM, ACTION_DIM
    common.request_devices(devices)
    started = common.utc_now()
    sitting = common.Sitting(allow_busy=o.allow_busy, wait_quiet=o.wait_quiet, repeats=repeats, min_time=min_time,
                             seed=seed)
    params = {"pops": list(pops), "devices": devices, "repeats": repeats, "k": k, "hidden": list(hidden),
              "batch_size": batch_size, "obs_dim": obs_dim, "action_dim": action_dim, "impls": list(impls),
              "min_time": min_time, "seed": seed, "policy_delay": 1}
    results = []
    for d in devices:
        for n in pops:
            if n % d:
                reason = f"{n} members do not divide over {d} devices"
                common.log(f"shared_critic N={n} d={d}: skipped ({reason})")
                results.append({"pop": n, "k": k, "devices": d, "skipped": reason})
                continue
            layer = sitting.layer(n, batch_size, max(hidden), d)
            results.append(measure(n, k=k, hidden=hidden, batch_size=batch_size, obs_dim=obs_dim,
                                   action_dim=action_dim, impls=impls, min_repeats=repeats, min_time=min_time,
                                   seed=seed, devices=d) | {"layer_gflops": layer})
    notes = ["time per population update step (1 shared-critic update + N actor updates), median of timed "
             "calls / k; compile time separate; all implementations timed in the same process",
             "sequential = original CEM-RL order (per member: its critic updates, then its actor updates); "
             "same numbers of critic and actor updates as the vectorized step",
             "the vectorized critic update sees all N sub-batches (N*B samples), the sequential one B: per step "
             "the vectorized program does more FLOPs (see <impl>_gflop_per_step, XLA cost analysis, k=1 and one "
             "device only), which a GPU absorbs in parallel and a CPU core does not",
             "devices > 1: only the vectorized step is split over the devices (actors split, critic replicated); "
             "the sequential references run on one device",
             "no PyTorch baseline: the paper's Fig. 4 baseline is PyTorch sequential on a GPU"]
    payload = common.study_payload(STUDY, params, results, started, notes, **sitting.record())
    json_path, png_path = common.output_paths(o.out_dir, STUDY)
    common.write_json(json_path, payload)
    if o.plot:
        plot_shared_critic(payload, png_path)
    common.log(f"wrote {json_path}")
    payload["paths"] = {"json": str(json_path), "png": str(png_path) if o.plot else None}
    return payload


def main(options: Options) -> dict[str, Any]:
    """``popjax bench shared_critic``."""
    return run(options)
