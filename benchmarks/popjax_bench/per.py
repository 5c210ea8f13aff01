"""Study ``per``: throughput of the K-ary sum tree of prioritized replay (``popjax.buffers.prioritized``).

For every branching K, capacity N and batch B: the jitted batched ``tree_sample`` (samples/s) and
``tree_update`` (updates/s; the tree is donated and fed back, as inside a training step, so no call copies
it), median and IQR of at least ``--repeats`` timed calls, every output blocked on; compile time is booked
apart. Every timed call includes the jit dispatch (tens of µs on a CPU), which bounds the small-B figures.

Baseline: a NumPy oracle timed the same way: sampling is ``searchsorted(cumsum(p), u * total)`` (the cumsum
is rebuilt per call, as a flat array must be after any write), an update writes ``p[idx]`` and rebuilds the
cumsum. Population: ``--population`` P trees under ``vmap`` at one (N, B) (``--vmap-capacity``,
``--vmap-batch``), split over ``--devices``; ``vmap_cost`` = (time per tree in the population) / (time of
one tree alone).

Exactness: before timing, each tree (priorities are small integers, so every partial sum is exact in
float32) gets one batched update and then samples with a fixed key; the oracle, given the same uniform
draws, must return the same indices (``agrees_with_oracle`` per row and for the whole run).

``--max-seconds``: along each B sweep, a point whose estimated time (the previous B's call time scaled by
the B ratio, warm-up and timed calls) exceeds it is skipped, and so are the larger B (recorded as skipped).
The sum tree is memory-bound: the ``Sitting`` records the dense-matmul peak only, no layer ceiling.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import numpy as np

from popjax.buffers import prioritized as per
from popjax_bench import common
from popjax_bench import options as opt
from popjax_bench.common import log

STUDY = "per"
OPS = ("sample", "update")
MAX_PRIORITY = 8  # integer priorities 1..8: sums stay exact in float32 while N * 8 < 2**24


@dataclasses.dataclass(frozen=True)
class Options(opt.StudyOptions):
    """``popjax bench per`` (and ``per.run(...)``)."""

    STUDY: ClassVar[str] = STUDY
    SPLIT: ClassVar[str] = "population"
    branching: tuple[int, ...] = opt.ints((2, 4, 8, 16), "branching factors K of the sum tree (each >= 2)")
    capacity: tuple[int, ...] = opt.ints((10_000, 100_000, 1_000_000), "tree capacities N (leaves)")
    batch: tuple[int, ...] = opt.ints((32, 256, 2048, 16384), "batch sizes B (samples or updates per call)")
    population: int = opt.integer(8, "trees P of the vmapped population", ge=2)
    vmap_capacity: int | None = opt.integer(None, "capacity of the population's trees (default: the middle "
                                            "--capacity)")
    vmap_batch: int | None = opt.integer(None, "batch of the population's trees (default: the middle --batch)")
    repeats: int = opt.repeats()
    min_time: float = opt.number(0.2, "minimum seconds of timed calls per point (0.2, not 1: the default "
                                  "grid has 128 points)")
    max_seconds: float = opt.max_seconds(30.0)

    def check(self) -> None:
        small = [k for k in self.branching if k < 2]
        if small:
            raise ValueError(f"--branching: a sum tree needs K >= 2, got {small[0]}")
        too_big = [n for n in self.capacity + (self.vmap_capacity or 1,) if n * MAX_PRIORITY >= 2**24]
        if too_big:
            raise ValueError(f"--capacity: at most {2**24 // MAX_PRIORITY - 1} (float32 sums must stay exact for "
                             f"the oracle check), got {too_big[0]}")

    def vmap_point(self) -> tuple[int, int]:
        middle = lambda xs: sorted(xs)[len(xs) // 2]
        return self.vmap_capacity or middle(self.capacity), self.vmap_batch or middle(self.batch)


def _leaves(priorities: np.ndarray, branching: int) -> jax.Array:
    """The priorities padded with zero leaves to ``K**H``."""
    size = branching ** per.tree_height(priorities.shape[-1], branching)
    pad = [(0, 0)] * (priorities.ndim - 1) + [(0, size - priorities.shape[-1])]
    return jnp.asarray(np.pad(priorities, pad))


def oracle_find(p: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """Leaf of each absolute target, as the tree defines it (side='right'; clipped like the tree's clamp)."""
    return np.minimum(np.searchsorted(np.cumsum(p), targets, side="right"), p.shape[-1] - 1)


def oracle_sample_targets(key: jax.Array, p: np.ndarray, batch: int) -> np.ndarray:
    """The uniform draws ``tree_sample`` makes with ``key``, scaled by the total in float32 as it does."""
    u = np.asarray(jax.random.uniform(key, (batch,)))
    return u * np.float32(np.sum(p, dtype=np.float32))


def _rates(timing: dict[str, Any], items: int) -> dict[str, Any]:
    q1, q3 = np.percentile(timing["times_s"], [25, 75])
    return {"median_s": timing["median_s"], "iqr_s": timing["iqr_s"], "repeats": timing["repeats"],
            "per_s": items / timing["median_s"], "per_s_iqr": items / q1 - items / q3, "timing": timing}


def _time(o: Options, call, items: int, sync=common.block) -> dict[str, Any]:
    return _rates(common.time_calls(call, warmup=2, min_repeats=o.repeats, min_time=o.min_time, sync=sync), items)


def tree_point(o: Options, head: dict[str, Any], p: np.ndarray, rng: np.random.Generator) -> list[dict]:
    """The sample and update rows of one point ``head`` (K, N, B, P, devices); P > 1: P trees under vmap."""
    k, n, b, population, devices = (head[f] for f in ("branching", "capacity", "batch", "population", "devices"))
    mapped = (lambda f, *axes: jax.vmap(f, in_axes=axes)) if population > 1 else (lambda f, *axes: f)
    place = (lambda x: common.place(x, devices)) if population > 1 else jax.device_put
    squeeze = (lambda x: x) if population > 1 else (lambda x: x[0])
    arrays = lambda x, dtype: place(jnp.asarray(squeeze(x.astype(dtype))))
    trees = place(jax.vmap(per.tree_from_leaves, (0, None))(_leaves(p, k), k) if population > 1
                  else per.tree_from_leaves(_leaves(p[0], k), k))
    update, update_times = common.compile_timed(mapped(per.tree_update, 0, 0, 0), trees,
                                                arrays(np.zeros((population, b)), np.int32),
                                                arrays(np.ones((population, b)), np.float32), donate_argnums=(0,))
    # The exactness check, with the timed update program: one update of distinct rows (tiled when B > N: a
    # repeated row gets the same value, so the oracle's p[idx] = v is unambiguous), then a sample with a fixed
    # key, against searchsorted on the same float32 draws.
    written = np.stack([np.resize(rng.permutation(n)[:b], b) for _ in range(population)])
    values = np.take_along_axis(rng.integers(1, MAX_PRIORITY + 1, (population, n)), written, axis=1)
    trees = update(trees, arrays(written, np.int32), arrays(values, np.float32))
    after = p.copy()
    np.put_along_axis(after, written, values.astype(np.float32), axis=1)
    keys = jax.random.split(jax.random.key(o.seed + b), population)
    keys_in = place(squeeze(keys))
    sample, sample_times = common.compile_timed(mapped(lambda key, tree: per.tree_sample(key, tree, b), 0, 0),
                                                keys_in, trees)
    got = np.asarray(sample(keys_in, trees)[0]).reshape(population, b)
    want = np.stack([oracle_find(after[i], oracle_sample_targets(keys[i], after[i], b)) for i in range(population)])
    agrees = bool(np.array_equal(got, want))
    if not agrees:
        log(f"  K={k} N={n} B={b}: the tree and the oracle disagree on {int((got != want).sum())} of {got.size}")
    sample_row = {"op": "sample", **head, "agrees_with_oracle": agrees, **sample_times,
                  **_time(o, lambda: sample(keys_in, trees), population * b)}
    # Update: indices drawn with replacement (as a sampled batch is), the tree donated and fed back.
    idx = arrays(rng.integers(0, n, (population, b)), np.int32)
    new = arrays(rng.integers(1, MAX_PRIORITY + 1, (population, b)), np.float32)
    holder = {"tree": trees}

    def call():
        holder["tree"] = update(holder["tree"], idx, new)
        return holder["tree"]

    return [sample_row, {"op": "update", **head, **update_times, **_time(o, call, population * b)}]


def oracle_point(o: Options, head: dict[str, Any], p: np.ndarray, rng: np.random.Generator) -> list[dict]:
    """The NumPy sample and update rows of one (N, B)."""
    n, b = head["capacity"], head["batch"]
    flat, u = p.copy(), rng.random(b, dtype=np.float32)
    idx, new = rng.integers(0, n, b), rng.integers(1, MAX_PRIORITY + 1, b).astype(np.float32)

    def sample():
        c = np.cumsum(flat)
        return np.searchsorted(c, u * c[-1], side="right")

    def update():
        flat[idx] = new
        return np.cumsum(flat)

    return [{"op": op, **head, **_time(o, call, b, sync=lambda x: x)} for op, call in (("sample", sample),
                                                                                      ("update", update))]


def sweep(o: Options, impl: str, k: int | None, n: int, p: np.ndarray, rng: np.random.Generator,
          batches: tuple[int, ...], population: int = 1, devices: int = 1) -> list[dict]:
    """The rows of one (impl, K, N) over ``batches`` (ascending): a point whose estimated time (the previous
    point's slower call scaled by the B ratio) exceeds ``--max-seconds`` is skipped, and so are the larger B."""
    rows, last, over = [], None, None
    for b in sorted(batches):
        head = {"impl": impl, "branching": k, "capacity": n, "batch": b, "population": population, "devices": devices}
        if over is None and last is not None:
            estimate = common.estimated_seconds(last[1], b / last[0], repeats=o.repeats, min_time=o.min_time,
                                                warmup=2)
            if estimate > o.max_seconds:
                over = (f"estimated {estimate:.0f}s for warm-up and {o.repeats} timed calls at B={b} > "
                        f"--max-seconds {o.max_seconds:.0f}")
        if over:
            rows += [{"op": op, **head, "skipped": over} for op in OPS]
            log(f"  {impl} K={k} N={n} B={b} P={population}: skipped ({over})")
            continue
        point = oracle_point(o, head, p[0], rng) if impl == "numpy" else tree_point(o, head, p, rng)
        for row in point:
            log(f"  {row['op']:6s} {impl:9s} K={k} N={n:8d} B={b:6d} P={population} d={devices}: "
                f"{row['per_s'] / 1e6:8.3f} M/s ({1e3 * row['median_s']:.3f} ms/call)")
        rows += point
        last = (b, max(r["median_s"] for r in point))
    return rows


def _vmap_costs(rows: list[dict]) -> None:
    """``vmap_cost`` of each population row: its time per tree over the single tree's time at the same point."""
    single = {(r["op"], r["branching"], r["capacity"], r["batch"]): r["median_s"] for r in rows
              if r["impl"] == "tree" and "skipped" not in r}
    for r in rows:
        alone = single.get((r["op"], r["branching"], r["capacity"], r["batch"]))
        if r["impl"] == "tree_vmap" and "skipped" not in r and alone:
            r["vmap_cost"] = r["median_s"] / r["population"] / alone


def run(options: Options | None = None, /, **overrides: Any) -> dict[str, Any]:
    """Runs the study and writes ``<out_dir>/per.json`` (and ``.png``); returns the payload."""
    o = Options.build(options, overrides)
    started = common.utc_now()
    common.request_devices(o.devices)
    sitting = common.Sitting(allow_busy=o.allow_busy, wait_quiet=o.wait_quiet, repeats=o.repeats,
                             min_time=o.min_time, seed=o.seed)
    rng = np.random.default_rng(o.seed)
    vn, vb = o.vmap_point()
    capacities = sorted(set(o.capacity) | {vn})
    priorities = {n: rng.integers(1, MAX_PRIORITY + 1, (max(o.population, 1), n)).astype(np.float32)
                  for n in capacities}
    results = []
    for n in sorted(o.capacity):
        results += sweep(o, "numpy", None, n, priorities[n][:1], rng, o.batch)
        for k in o.branching:
            results += sweep(o, "tree", k, n, priorities[n][:1], rng, o.batch)
    for k in o.branching:
        if vn not in o.capacity or vb not in o.batch:  # the single tree the population is compared with
            results += sweep(o, "tree", k, vn, priorities[vn][:1], rng, (vb,))
        for d in o.devices:
            if o.population % d:
                results += [{"op": op, "impl": "tree_vmap", "branching": k, "capacity": vn, "batch": vb,
                             "population": o.population, "devices": d,
                             "skipped": f"{o.population} trees do not divide over {d} devices"} for op in OPS]
                continue
            results += sweep(o, "tree_vmap", k, vn, priorities[vn][:o.population], rng, (vb,), o.population, d)
    _vmap_costs(results)
    checked = [r["agrees_with_oracle"] for r in results if "agrees_with_oracle" in r]
    params = {"branching": list(o.branching), "capacity": list(o.capacity), "batch": list(o.batch),
              "population": o.population, "vmap_capacity": vn, "vmap_batch": vb, "devices": list(o.devices),
              "repeats": o.repeats, "min_time": o.min_time, "max_seconds": o.max_seconds, "seed": o.seed,
              "priorities": f"integers 1..{MAX_PRIORITY} (float32 sums exact)",
              "measured": "jitted tree_sample / tree_update (tree donated) per call, outputs blocked on; "
                          "NumPy: searchsorted(cumsum(p), u * total) / p[idx] = v then cumsum(p)"}
    payload = common.study_payload(STUDY, params, results, started, agrees_with_oracle=bool(checked) and all(checked),
                                   **sitting.record())
    return common.write_study(o.out_dir, STUDY, payload, plot_per, o.plot)


def main(options: Options) -> dict[str, Any]:
    """``popjax bench per``."""
    return run(options)


def plot_per(payload: dict[str, Any], path) -> Any:
    plt = common.pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.5))
    rows = [r for r in payload["results"] if "skipped" not in r and r["impl"] in ("tree", "numpy")]
    capacities = sorted({r["capacity"] for r in rows})
    styles = dict(zip(reversed(capacities), ("-", "--", ":", "-."), strict=False))
    for ax, op in zip(axes, OPS, strict=True):
        for i, k in enumerate(sorted({r["branching"] for r in rows if r["branching"]}) + [None]):
            for n in capacities:
                series = sorted((r for r in rows if r["op"] == op and r["branching"] == k and r["capacity"] == n),
                                key=lambda r: r["batch"])
                if series:
                    ax.plot([r["batch"] for r in series], [r["per_s"] for r in series], marker="o", markersize=3,
                            linestyle=styles.get(n, "-"), color="black" if k is None else f"C{i}",
                            label=f"{'NumPy' if k is None else f'K={k}'}, N={n:g}")
        ax.set(xscale="log", yscale="log", xlabel="batch B", ylabel=f"{op}s / s", title=f"sum tree {op}")
        ax.grid(True, which="both", alpha=0.3)
    axes[1].legend(fontsize=6, ncol=2)
    return common.save_figure(fig, path, payload["machine"])
