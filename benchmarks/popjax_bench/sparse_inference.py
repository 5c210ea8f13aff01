"""Study ``sparse_inference``: CPU latency of a sparse RLx2 actor executed sparsely, against dense.

The actor is popjax's TD3/RLx2 deterministic actor (``--obs``, ``--action``, ``--hidden``; default the
HalfCheetah shapes 17 -> 256 -> 256 -> 6) with Erdos-Renyi masks at each ``--sparsity`` (largest |w| of the
init kept, as ``rlx2_td3`` starts). Implementations, each jitted and timed per call at every ``--batch``:

- ``dense``: the masked kernels as dense matrices (zeros multiplied; what training runs);
- ``compact``: active links only, gather + ``segment_sum`` per layer (``popjax.networks.compact``, the
  ``popjax export`` format; dense layers stay dense);
- ``bcoo``: ``jax.experimental.sparse`` BCOO kernels (``x @ W`` with a sparse ``W``).

Every implementation's output is checked against the dense one (``max_abs_error``) before timing. A row's
``speedup`` is dense time / its time (> 1: faster than dense). The paper counts FLOPs (``flops_reduction``:
dense FLOPs / sparse FLOPs of one forward, App. C.3); this measures what a CPU makes of them.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import sparse as jsparse

from popjax.networks import compact, sparse
from popjax.networks.mlp import DeterministicActor
from popjax_bench import common
from popjax_bench import options as opt
from popjax_bench.common import log

STUDY = "sparse_inference"
IMPLS = ("dense", "compact", "bcoo")


@dataclasses.dataclass(frozen=True)
class Options(opt.StudyOptions):
    """``popjax bench sparse_inference`` (and ``sparse_inference.run(...)``)."""

    STUDY: ClassVar[str] = STUDY
    sparsity_percent: tuple[int, ...] = opt.ints((90, 98), "actor sparsities in percent of weights masked (< 100)")
    batch: tuple[int, ...] = opt.ints((1, 256), "observations per forward call")
    obs: int = opt.integer(17, "observation size")
    action: int = opt.integer(6, "action size")
    hidden: tuple[int, ...] = opt.ints((256, 256), "hidden layer widths")
    repeats: int = opt.repeats()
    min_time: float = opt.number(0.5, "minimum seconds of timed calls per point")

    def check(self) -> None:
        bad = [s for s in self.sparsity_percent if s >= 100]
        if bad:
            raise ValueError(f"--sparsity-percent: each must be below 100, got {bad[0]}")

    @property
    def sparsity(self) -> tuple[float, ...]:
        return tuple(p / 100 for p in self.sparsity_percent)


def sparse_actor(o: Options, sparsity: float):
    """``(net, params)``: the actor with ER masks of ``sparsity`` applied (largest |w| kept)."""
    net = DeterministicActor(o.hidden, o.action)
    params = net.init(jax.random.key(o.seed), jnp.zeros((1, o.obs)))
    shapes = sparse.kernel_shapes(params)
    masks = sparse.magnitude_masks(params, sparse.kept_counts(shapes, sparse.er_densities(shapes, sparsity)))
    return net, sparse.apply_masks(params, masks)


def implementations(net, params) -> dict[str, tuple[Any, Any]]:
    """``{impl: (jitted forward(weights, x), weights)}``."""
    layers = params["params"]["MLP_0"]
    names = sorted(layers, key=lambda n: int(n.split("_")[-1]))
    kernels = [np.asarray(layers[n]["kernel"]) for n in names]
    biases = [np.asarray(layers[n]["bias"]) for n in names]
    compact_layers = compact.compact_layers(kernels, biases)

    def bcoo_forward(weights, x):
        for i, (kernel, bias) in enumerate(weights):
            x = x @ kernel + bias
            x = jnp.tanh(x) if i == len(weights) - 1 else jax.nn.relu(x)
        return x

    bcoo = [(jsparse.BCOO.fromdense(jnp.asarray(k)), jnp.asarray(b)) for k, b in zip(kernels, biases, strict=True)]
    return {"dense": (jax.jit(net.apply), params),
            "compact": (jax.jit(lambda layers_, x: compact.forward(layers_, x)), compact_layers),
            "bcoo": (jax.jit(bcoo_forward), bcoo)}


def point(o: Options, sparsity: float, batch: int) -> list[dict[str, Any]]:
    net, params = sparse_actor(o, sparsity)
    shapes = sparse.kernel_shapes(params)
    densities = np.asarray(sparse.er_densities(shapes, sparsity), np.float64)
    flops = sparse.forward_flops(shapes, densities)
    dense_flops = sparse.forward_flops(shapes, [1.0] * len(shapes))
    x = jax.random.normal(jax.random.key(o.seed + batch), (batch, o.obs))
    reference = np.asarray(net.apply(params, x))
    rows = []
    for impl, (fn, weights) in implementations(net, params).items():
        error = float(np.max(np.abs(np.asarray(fn(weights, x)) - reference)))
        timing = common.time_calls(lambda fn=fn, weights=weights: fn(weights, x), warmup=3, min_repeats=o.repeats,
                                   min_time=o.min_time)
        rows.append({"impl": impl, "sparsity": sparsity, "batch": batch, "max_abs_error": error,
                     "active_weights": sparse.model_size(shapes, densities), "flops_reduction": dense_flops / flops,
                     "median_s": timing["median_s"], "iqr_s": timing["iqr_s"], "repeats": timing["repeats"],
                     "timing": timing})
    dense = rows[0]["median_s"]
    for row in rows:
        row["speedup"] = dense / row["median_s"]
        log(f"  S={sparsity:.2f} B={batch:4d} {row['impl']:8s} {1e6 * row['median_s']:9.1f} µs "
            f"(x{row['speedup']:.2f} vs dense; FLOPs /{row['flops_reduction']:.1f}; error {row['max_abs_error']:.1e})")
    return rows


def run(options: Options | None = None, /, **overrides: Any) -> dict[str, Any]:
    """Runs the study and writes ``<out_dir>/sparse_inference.json`` (and ``.png``); returns the payload."""
    o = Options.build(options, overrides)
    started = common.utc_now()
    sitting = common.Sitting(allow_busy=o.allow_busy, wait_quiet=o.wait_quiet, repeats=o.repeats,
                             min_time=o.min_time, seed=o.seed)
    results = [row for s in o.sparsity for b in o.batch for row in point(o, s, b)]
    params = {"sparsity": list(o.sparsity), "batch": list(o.batch), "obs": o.obs, "action": o.action,
              "hidden": list(o.hidden), "repeats": o.repeats, "min_time": o.min_time, "seed": o.seed,
              "measured": "one jitted actor forward per call (batch of observations), output blocked on"}
    payload = common.study_payload(STUDY, params, results, started, **sitting.record())
    return common.write_study(o.out_dir, STUDY, payload, plot_sparse_inference, o.plot)


def main(options: Options) -> dict[str, Any]:
    """``popjax bench sparse_inference``."""
    return run(options)


def plot_sparse_inference(payload: dict[str, Any], path) -> Any:
    plt = common.pyplot()
    batches = payload["params"]["batch"]
    fig, axes = plt.subplots(1, len(batches), figsize=(5 * len(batches), 4), squeeze=False)
    for ax, batch in zip(axes[0], batches, strict=True):
        rows = [r for r in payload["results"] if r["batch"] == batch]
        sparsities = sorted({r["sparsity"] for r in rows})
        width = 0.8 / len(IMPLS)
        for i, impl in enumerate(IMPLS):
            values = [next(1e6 * r["median_s"] for r in rows if r["sparsity"] == s and r["impl"] == impl)
                      for s in sparsities]
            ax.bar(np.arange(len(sparsities)) + i * width, values, width, label=impl)
        ax.set_xticks(np.arange(len(sparsities)) + width, [f"{100 * s:g} % sparse" for s in sparsities])
        ax.set(ylabel="µs per forward (median)", title=f"actor inference, batch {batch}")
        ax.grid(True, axis="y", alpha=0.3)
        ax.legend(fontsize=8)
    return common.save_figure(fig, path, payload["machine"])
