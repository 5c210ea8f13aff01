"""Study ``spo``: time per local update of SPO-TD3 vs replicas R and local steps H, beside the scaling
model of Zhang (2022, PhD thesis, Ch. 5, Eqs. 5.5-5.6).

Replicas over devices (``replica_mesh``, ``replica_leaves``, ``replica_shardings``): the learner keeps its
replicas on a leading ``[R, ...]`` axis; here that axis of every such leaf (found from the state's shapes
at R and 2R, so no learner code is read or changed) is split over a mesh of R devices (axis ``replica``),
the other leaves (targets, step counter) are replicated, and the batches ``[H, B, ...]`` are split along
B, so that replica r's slice b = B/R lives on device r. ``jit`` then partitions the round (GSPMD): every
replica's local steps run on its own device, and the averages over the replica axis become cross-device
all-reduces. This is a benchmark utility, not a run option (a population's ``[N, R, ...]`` state is
placed by ``population.sharding.Placement`` along N).

Timed per (R, H), one round (H local steps + the averagings) per call, the state donated and fed back,
every output blocked on; compile time is booked apart; the programs of one H are timed interleaved
(round-robin), so their ratios see the same load:

- ``spo``: SPO-TD3 (two phases, ``opt_state: average``) with R replicas on R devices;
- ``dp``: the data-parallel baseline (``mode: dp``: gradients all-reduced at every step), R replicas
  on R devices (R > 1);
- ``single``: one learner at the full batch B on one device (R = 1, nothing to average): the thesis's
  ``T_ApeX``; its time per step is ``T_total``;
- ``sub``: one learner at the sub-batch b = B/R on one device (R > 1): the thesis's ``T^b`` terms.

The model's terms, per R: ``T_avg`` = one averaging of params and Adam state of actor and critic over
the R devices (``replica_mean``, the round's two syncs together; a jitted call, dispatch included);
``T_trans`` = one transfer of one replica's weights (actor and critic params) from device 0 to device 1
(0 at R = 1: nothing moves).

Derived, per ``spo`` row (``add_model``), with ``T_SPO`` = the round's time / H (all replicas step at
once, so this is one replica's time per step on b including its share of the averaging):

- measured scaling factor ``sf_measured = T_total / (R * T_SPO)`` (the thesis's ``T_ApeX / (L T_SPO)``,
  speed-up per learner; 1 = linear scaling);
- ``sf_model`` (Eq. 5.6, L = R): ``1 / (1 + (2 T_trans + T_avg) L / (T_total H))``, which assumes every
  per-replica term is ``T_total / L``;
- ``sf_eq55``: Eq. 5.5 with the measured ``T^b`` instead: ``T_SPO = T^b + (2 T_trans + T_avg) / H``,
  ``sf_eq55 = T_total / (L T_SPO)``.

``dp`` rows get ``sf_measured`` the same way. Per R a least-squares line ``round time = c + H s`` over
the ``spo`` rows (``fits``) gives the per-step time s and the per-round overhead c measured inside the
round, to set beside ``2 T_trans + T_avg``. In popjax the averaging is an all-reduce (no weight server),
so ``T_avg`` already includes the data movement: the model's ``2 T_trans`` is an over-estimate here.

On a CPU the R devices are forced host devices sharing its cores: R replicas of b do about the work of
one learner on B on the same cores, so the measured SF is near 1/R whatever the model says. The
bookkeeping (terms, formula, overhead per round) is what such a run checks; real scaling needs R
accelerators. ``--max-seconds``: a point whose estimated time (the previous H's time per step x H,
warm-up and timed calls) exceeds it is skipped and recorded as skipped.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from popjax.learners import spo as spo_learner
from popjax.learners.base import chunk_update
from popjax.types import EnvSpec, PyTree, Transition
from popjax_bench import common
from popjax_bench import options as opt
from popjax_bench.common import log

STUDY = "spo"
KINDS = ("single", "spo", "dp", "sub")
REPLICA = spo_learner.REPLICA


@dataclasses.dataclass(frozen=True)
class Options(opt.SittingOptions):
    """``popjax bench spo`` (and ``spo.run(...)``)."""

    STUDY: ClassVar[str] = STUDY
    replicas: tuple[int, ...] = opt.ints((1, 2, 4), "replica counts R (the thesis's learners L); replica r runs on "
                                         "device r, so R devices (forced host devices on a CPU)")
    local_steps: tuple[int, ...] = opt.ints((1, 5, 10, 25), "local steps H per round (one averaging every H steps)")
    batch_size: int = opt.integer(256, "global batch B per local step; each of the R replicas trains on b = B/R")
    obs_dim: int = opt.integer(17, "observation size (17: HalfCheetah)")
    action_dim: int = opt.integer(6, "action size (6: HalfCheetah)")
    hidden: tuple[int, ...] = opt.ints((256, 256), "hidden sizes of the actor and of each critic")
    repeats: int = opt.repeats()
    min_time: float = opt.min_time()
    max_seconds: float = opt.number(60.0, "per-point budget: a program whose estimated time at a larger H (its time "
                                    "per update at the previous H x H, warm-up and timed calls) exceeds it is "
                                    "skipped and recorded as skipped")

    def check(self) -> None:
        for r in self.replicas:
            if self.batch_size % r:
                raise ValueError(f"--replicas: {r} does not divide --batch-size {self.batch_size}")

    def devices_needed(self) -> list[int]:
        return [max(self.replicas)]


# --- replicas over devices ------------------------------------------------------------------------------------
def replica_mesh(replicas: int) -> Mesh:
    """A mesh of the first ``replicas`` devices, axis ``replica``."""
    devices = jax.devices()
    if len(devices) < replicas:
        raise ValueError(f"{replicas} replicas need {replicas} devices, JAX sees {len(devices)}")
    return Mesh(np.asarray(devices[:replicas]), (REPLICA,))


def replica_leaves(definition, config, spec: EnvSpec) -> PyTree:
    """``True`` on the state leaves with the leading replica axis: those whose shape changes from R to 2R
    replicas (found from the learner's ``init`` shapes, so no learner code is read)."""
    def shapes(r: int):
        cfg = dataclasses.replace(config, replicas=r, batch_size=r)  # state shapes do not depend on the batch
        return jax.eval_shape(definition.make(cfg, spec).init, jax.random.key(0), definition.default_hparams(cfg))

    return jax.tree.map(lambda a, b: a.shape != b.shape, shapes(config.replicas), shapes(2 * config.replicas))


def replica_shardings(mask: PyTree, mesh: Mesh) -> PyTree:
    """One ``NamedSharding`` per leaf of ``mask``: the leading axis over ``replica`` where True, else replicated."""
    split, whole = NamedSharding(mesh, PartitionSpec(REPLICA)), NamedSharding(mesh, PartitionSpec())
    return jax.tree.map(lambda m: split if m else whole, mask)


def batch_sharding(mesh: Mesh) -> NamedSharding:
    """Batches ``[H, B, ...]`` split along B: replica r's contiguous slice b = B/R on device r."""
    return NamedSharding(mesh, PartitionSpec(None, REPLICA))


def place_round(definition, config, spec: EnvSpec, state, batches: Transition, mesh: Mesh | None):
    """``(state, batches, jit kwargs)`` placed for one round on ``mesh`` (None: everything on device 0)."""
    if mesh is None:
        device = jax.devices()[0]
        return jax.device_put(state, device), jax.device_put(batches, device), {}
    shardings = replica_shardings(replica_leaves(definition, config, spec), mesh)
    whole = NamedSharding(mesh, PartitionSpec())
    state = jax.device_put(state, shardings)
    batches = jax.device_put(batches, batch_sharding(mesh))
    return state, batches, {"out_shardings": (shardings, whole)}


# --- the problem ----------------------------------------------------------------------------------------------
def env_spec(o: Options) -> EnvSpec:
    return EnvSpec("spo-shapes", (o.obs_dim,), action_dim=o.action_dim, action_low=(-1.0,) * o.action_dim,
                   action_high=(1.0,) * o.action_dim)


def learner_config(o: Options, kind: str, replicas: int, h: int) -> spo_learner.SPOTD3Config:
    """The SPO-TD3 config of one program: ``single``/``sub`` are one learner (R = 1) at B or B/R."""
    one = kind in ("single", "sub")
    batch = o.batch_size // replicas if kind == "sub" else o.batch_size
    return spo_learner.SPOTD3Config(hidden=o.hidden, replicas=1 if one else replicas, local_steps=h,
                                    batch_size=batch, mode="local_sgd" if kind == "spo" else "dp")


def synthetic_batches(spec: EnvSpec, h: int, batch: int, seed: int) -> Transition:
    ko, ka, kr, kn, kt = jax.random.split(jax.random.key(seed), 5)
    lead = (h, batch)
    return Transition(obs=jax.random.normal(ko, lead + spec.obs_shape),
                      action=jax.random.uniform(ka, lead + (spec.action_dim,), minval=-1.0, maxval=1.0),
                      reward=jax.random.normal(kr, lead), next_obs=jax.random.normal(kn, lead + spec.obs_shape),
                      terminated=(jax.random.uniform(kt, lead) < 0.01).astype(jnp.float32))


def prepare_round(o: Options, kind: str, replicas: int, h: int) -> dict[str, Any]:
    """One compiled round, warmed up and ready to time (its state donated and fed back)."""
    from popjax_bench.update import hlo_collectives

    config = learner_config(o, kind, replicas, h)
    spec, definition = env_spec(o), spo_learner.TD3_DEFINITION
    learner = definition.make(config, spec)
    hparams = jax.tree.map(jnp.asarray, definition.default_hparams(config))
    state = jax.jit(learner.init)(jax.random.key(o.seed), hparams)
    batches = synthetic_batches(spec, h, config.batch_size, o.seed + 1)
    keys = jax.random.split(jax.random.key(o.seed + 2), h)
    devices = config.replicas
    mesh = replica_mesh(devices) if devices > 1 else None
    state, batches, jit_kwargs = place_round(definition, config, spec, state, batches, mesh)
    compiled, times = common.compile_timed(chunk_update(learner), keys, state, batches, hparams, donate_argnums=(1,),
                                           **jit_kwargs)
    holder = {"state": state}

    def call():
        holder["state"], metrics = compiled(keys, holder["state"], batches, hparams)
        return holder["state"], metrics

    for _ in range(2):
        common.block(call())
    return {"kind": kind, "replicas": replicas, "local_steps": h, "devices": devices, "batch": config.batch_size,
            "mode": config.mode, "state_shards": common.shards(holder["state"]),
            "collectives": hlo_collectives(compiled), **times, "call": call}


def averaging_and_transfer(o: Options, replicas: int) -> dict[str, Any]:
    """The model's terms at R: ``T_avg`` (one ``replica_mean`` of params and Adam state over R devices) and
    ``T_trans`` (one replica's weights from device 0 to device 1; 0 at R = 1)."""
    config = learner_config(o, "spo", replicas, 1)
    spec, definition = env_spec(o), spo_learner.TD3_DEFINITION
    learner = definition.make(config, spec)
    hparams = jax.tree.map(jnp.asarray, definition.default_hparams(config))
    state = jax.jit(learner.init)(jax.random.key(o.seed), hparams)
    averaged = (state.actor, state.critic, state.actor_opt, state.critic_opt)  # what one round's two syncs average
    if replicas > 1:
        mesh = replica_mesh(replicas)
        shardings = jax.tree.map(lambda _: NamedSharding(mesh, PartitionSpec(REPLICA)), averaged)
        averaged = jax.device_put(averaged, shardings)
        kwargs = {"out_shardings": shardings}
    else:
        averaged, kwargs = jax.device_put(averaged, jax.devices()[0]), {}
    compiled, times = common.compile_timed(spo_learner.replica_mean, averaged, donate_argnums=(0,), **kwargs)
    holder = {"tree": averaged}

    def mean():
        holder["tree"] = compiled(holder["tree"])
        return holder["tree"]

    entries = [(mean, common.block, o.repeats)]
    weights = spo_learner.first((state.actor, state.critic))
    n_bytes = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(weights))
    if replicas > 1:
        source, target = jax.devices()[:2]
        on_source = common.block(jax.device_put(weights, source))
        entries.append((lambda: jax.device_put(on_source, target), common.block, o.repeats))
    for call, sync, _ in entries:
        for _ in range(2):
            sync(call())
    timings = common.time_interleaved(entries, min_time=o.min_time)
    trans = timings[1] if replicas > 1 else None
    return {"kind": "terms", "replicas": replicas, "devices": replicas, "t_avg_s": timings[0]["median_s"],
            "t_avg_iqr_s": timings[0]["iqr_s"], "t_avg": timings[0], "avg_compile_s": times["compile_s"],
            "t_trans_s": trans["median_s"] if trans else 0.0, "t_trans_iqr_s": trans["iqr_s"] if trans else 0.0,
            "t_trans": trans, "weights_bytes": int(n_bytes),
            "averaged_bytes": int(sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(averaged)) // replicas)}


# --- the model ---------------------------------------------------------------------------------------------------
def sf_model(t_total: float, t_avg: float, t_trans: float, learners: int, h: int) -> float:
    """Eq. 5.6 (Zhang 2022): ``SF_SPO = 1 / (1 + (2 T_trans + T_avg) L / (T_total H))``."""
    return 1.0 / (1.0 + (2.0 * t_trans + t_avg) * learners / (t_total * h))


def add_model(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Adds ``t_total_s``, ``sf_measured``, ``sf_model`` and the Eq. 5.5 columns to the ``spo`` rows (and
    ``sf_measured`` to the ``dp`` rows); returns the per-R fits of round time vs H."""
    measured = [r for r in results if "skipped" not in r]
    single = {r["local_steps"]: r for r in measured if r["kind"] == "single"}
    sub = {(r["replicas"], r["local_steps"]): r for r in measured if r["kind"] == "sub"}
    terms = {r["replicas"]: r for r in measured if r["kind"] == "terms"}
    for r in measured:
        if r["kind"] not in ("spo", "dp") or r["local_steps"] not in single:
            continue
        big, h, n = single[r["local_steps"]], r["local_steps"], r["replicas"]
        r["t_total_s"] = big["step_s"]
        r["speedup"] = big["step_s"] / r["step_s"]
        r["sf_measured"] = big["step_s"] / (n * r["step_s"])
        if r["kind"] != "spo" or n not in terms:
            continue
        t = terms[n]
        per_round = 2.0 * t["t_trans_s"] + t["t_avg_s"]
        r["sf_model"] = sf_model(big["step_s"], t["t_avg_s"], t["t_trans_s"], n, h)
        r["t_spo_model_s"] = big["step_s"] / n + per_round / h
        local = big if n == 1 else sub.get((n, h))
        if local is not None:
            r["t_b_s"] = local["step_s"]
            r["t_spo_eq55_s"] = local["step_s"] + per_round / h
            r["sf_eq55"] = big["step_s"] / (n * r["t_spo_eq55_s"])
    fits = []
    for n in sorted({r["replicas"] for r in measured if r["kind"] == "spo"}):
        rows = sorted((r for r in measured if r["kind"] == "spo" and r["replicas"] == n),
                      key=lambda r: r["local_steps"])
        if len({r["local_steps"] for r in rows}) < 2:
            continue
        slope, intercept = np.polyfit([r["local_steps"] for r in rows], [r["round_s"] for r in rows], 1)
        t = terms.get(n)
        fits.append({"replicas": n, "step_s": float(slope), "round_overhead_s": float(intercept),
                     "model_round_overhead_s": None if t is None else 2.0 * t["t_trans_s"] + t["t_avg_s"]})
    return fits


# --- the study ---------------------------------------------------------------------------------------------------
def _row(entry: dict[str, Any], timing: dict[str, Any]) -> dict[str, Any]:
    h = entry["local_steps"]
    row = {k: v for k, v in entry.items() if k != "call"}
    return row | {"round_s": timing["median_s"], "round_iqr_s": timing["iqr_s"], "step_s": timing["median_s"] / h,
                  "step_iqr_s": timing["iqr_s"] / h, "repeats": timing["repeats"], "timing": timing}


def programs(o: Options) -> list[tuple[str, int]]:
    """``(kind, R)`` of every program timed at each H: the single learner, then per R spo, dp and sub."""
    out = [("single", 1)]
    for n in sorted(o.replicas):
        out += [("spo", n)] + ([("dp", n), ("sub", n)] if n > 1 else [])
    return out


def run(options: Options | None = None, /, **overrides: Any) -> dict[str, Any]:
    """Runs the study and writes ``<out_dir>/spo.json`` (and ``.png``); returns the payload."""
    o = Options.build(options, overrides)
    started = common.utc_now()
    common.request_devices(o.devices_needed())
    sitting = common.Sitting(allow_busy=o.allow_busy, wait_quiet=o.wait_quiet, repeats=o.repeats,
                             min_time=o.min_time, seed=o.seed)
    width = max(o.hidden)
    for n in sorted(o.replicas):  # the dominant layer of one replica, on its own device
        sitting.layer(n, o.batch_size // n, width, n)
    results: list[dict[str, Any]] = []
    last: dict[tuple[str, int], tuple[int, float]] = {}  # (kind, R) -> (H, step seconds)
    for h in sorted(o.local_steps):
        entries = []
        for kind, n in programs(o):
            head = {"kind": kind, "replicas": n, "local_steps": h}
            if (kind, n) in last:
                estimate = common.estimated_seconds(last[kind, n][1] * h, 1.0, repeats=o.repeats, min_time=o.min_time,
                                                    warmup=2)
                if estimate > o.max_seconds:
                    results.append(head | {"skipped": f"estimated {estimate:.0f}s for warm-up and {o.repeats} timed "
                                                      f"calls > --max-seconds {o.max_seconds:.0f}"})
                    log(f"  {kind} R={n} H={h}: skipped")
                    continue
            entries.append(prepare_round(o, kind, n, h))
        timings = common.time_interleaved([(e["call"], common.block, o.repeats) for e in entries], min_time=o.min_time)
        for entry, timing in zip(entries, timings, strict=True):
            row = _row(entry, timing)
            last[row["kind"], row["replicas"]] = (h, row["step_s"])
            results.append(row)
            log(f"  {row['kind']:6s} R={row['replicas']} H={h:3d} d={row['devices']} b={row['batch']}: "
                f"{1e3 * row['step_s']:.3f} ms/update ({1e3 * row['round_s']:.2f} ms/round, "
                f"compile {row['compile_s']:.1f}s, collectives {row['collectives']})")
    for n in sorted(o.replicas):
        terms = averaging_and_transfer(o, n)
        results.append(terms)
        log(f"  terms  R={n}: T_avg {1e3 * terms['t_avg_s']:.3f} ms, T_trans {1e3 * terms['t_trans_s']:.3f} ms")
    fits = add_model(results)
    for r in results:
        if "sf_model" in r:
            log(f"  SF R={r['replicas']} H={r['local_steps']}: measured {r['sf_measured']:.3f}, Eq. 5.6 "
                f"{r['sf_model']:.3f}" + (f", Eq. 5.5 with measured T^b {r['sf_eq55']:.3f}" if "sf_eq55" in r else ""))
    params = {"replicas": list(o.replicas), "local_steps": list(o.local_steps), "batch_size": o.batch_size,
              "obs_dim": o.obs_dim, "action_dim": o.action_dim, "hidden": list(o.hidden), "repeats": o.repeats,
              "min_time": o.min_time, "max_seconds": o.max_seconds, "seed": o.seed, "learner": "spo_td3",
              "opt_state": "average", "device_kind": jax.devices()[0].device_kind,
              "device_count": len(jax.devices()),
              "measured": "one round (H local steps of critic and actor, the averagings) per jitted call, state "
                          "donated and fed back, outputs blocked on; per update = round / H; replica r on device r "
                          "(GSPMD all-reduces)",
              "model": "sf_model = 1 / (1 + (2 t_trans + t_avg) R / (t_total H)) (Zhang 2022, Eq. 5.6); "
                       "sf_measured = t_total / (R step_s); sf_eq55 = t_total / (R (t_b + (2 t_trans + t_avg) / H))"}
    payload = common.study_payload(STUDY, params, results, started, fits=fits, **sitting.record())
    return common.write_study(o.out_dir, STUDY, payload, plot_spo, o.plot)


def main(options: Options) -> dict[str, Any]:
    """``popjax bench spo``."""
    return run(options)


def plot_spo(payload: dict[str, Any], path) -> Any:
    plt = common.pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.5))
    rows = [r for r in payload["results"] if "skipped" not in r and r["kind"] in KINDS]
    series = lambda kind, n: sorted((r for r in rows if r["kind"] == kind and r["replicas"] == n),
                                    key=lambda r: r["local_steps"])
    xs = lambda rs: [r["local_steps"] for r in rs]
    single = series("single", 1)
    left.plot(xs(single), [1e3 * r["step_s"] for r in single], "k-o", markersize=3, label="single learner, B")
    for i, n in enumerate(sorted({r["replicas"] for r in rows if r["kind"] == "spo"})):
        for kind, style in (("spo", "-o"), ("dp", "--s")):
            rs = series(kind, n)
            if rs:
                left.plot(xs(rs), [1e3 * r["step_s"] for r in rs], style, color=f"C{i}", markersize=3,
                          label=f"{kind} R={n}")
        rs = [r for r in series("spo", n) if "sf_model" in r]
        if rs:
            right.plot(xs(rs), [r["sf_measured"] for r in rs], "-o", color=f"C{i}", markersize=3,
                       label=f"measured R={n}")
            right.plot(xs(rs), [r["sf_model"] for r in rs], ":", color=f"C{i}", label=f"Eq. 5.6 R={n}")
    left.set(xscale="log", xlabel="local steps H per round", ylabel="ms per local update",
             title="SPO-TD3: time per update (round / H)")
    right.set(xscale="log", xlabel="local steps H per round", ylabel="scaling factor", ylim=(0, 1.1),
              title="scaling factor: measured vs model")
    for ax in (left, right):
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout(rect=(0, 0.03, 1, 1))  # room for the machine caption
    return common.save_figure(fig, path, payload["machine"])
