"""``popjax bench accelerator``: the fast-PBT paper's Fig. 2 on whatever accelerator JAX sees, in one command.

The ``update`` study at the paper's range of population sizes (N = 1, 4, 16, 64, 256), TD3 and SAC, every
implementation (popjax one-step and K-step, JAX sequential, and the five PyTorch variants on the same device:
eager and compiled, sequential and vectorized, and CUDA graphs), sized to finish in under 10 minutes on one GPU:

- popjax's programs are compiled ahead of the timing, several at a time in threads (``--compile-workers``; GPU
  compilation of one program takes 6-30 s, most of a naive study's time), and each is compiled once;
- a per-point budget (``--max-seconds``) skips a slow baseline at the sizes it cannot time in it (PyTorch
  member after member at N = 256), and a study budget (``--budget``) skips the points not started once it is
  spent, every learner at one N before the next N (so what is left out is the largest sizes);
- PyTorch runs with one thread count (on a GPU its host threads barely matter), and the memory-fit search
  (minutes of compilation on a GPU) only with ``--memory-fit``.

At the end it prints one table (``summary``): every implementation's ms per population step at each (learner,
N), the fastest PyTorch variant, popjax's K-step speed-up over it, the arithmetic of both sides, and what was
skipped and why. The results go to ``<out>/update_<backend>_<device kind>.json``
(``update_gpu_nvidia-h100-80gb-hbm3.json``), so runs on different devices sit side by side in
``benchmarks/results/``. On a CPU it runs as well (tests run it at tiny sizes).
"""

from __future__ import annotations

import dataclasses
import re
import time
from typing import Any, ClassVar

from popjax_bench import arithmetic, update
from popjax_bench import options as opt

STUDY = "accelerator"
POPS = (1, 4, 16, 64, 256)


@dataclasses.dataclass(frozen=True)
class Options(update.Options):
    """``popjax bench accelerator``: ``update``'s options with the paper's sizes and a GPU's budgets as defaults."""

    STUDY: ClassVar[str] = STUDY
    learners: tuple[str, ...] = opt.names(("td3", "sac"), "comma-separated learners", flag="--learner",
                                          allowed=update.PROBLEMS, what=" learner")
    pops: tuple[int, ...] = opt.ints(POPS, "population sizes, comma-separated", flag="--pop")
    torch_threads: tuple[int, ...] = opt.ints((4,), "torch.set_num_threads of the PyTorch variants: one run per "
                                              "value, the fastest at each N is the baseline")
    min_time: float = opt.number(0.5, "minimum seconds of timed calls per point")
    max_seconds: float = opt.max_seconds(20.0)
    compile_workers: int = opt.integer(8, "compile popjax's programs ahead of the timing, this many at a time in "
                                       "threads (1: each when its point is timed)")
    budget: float = opt.number(540.0, "seconds for the whole study (0: no limit): once spent, the points not yet "
                               "started are skipped and recorded as skipped")
    memory_fit: bool = opt.memory_fit(False)


def device_slug() -> str:
    """``<backend>_<device kind>`` of JAX's first device, lower case, safe in a file name."""
    import jax

    device = jax.devices()[0]
    name = device.platform if device.platform == "cpu" else f"{jax.default_backend()}_{device.device_kind}"
    return re.sub(r"[^a-z0-9_]+", "-", name.lower()).strip("-")


def output_path(out_dir: str) -> str:
    """Where the study writes: a ``.json`` path as given, else ``<out_dir>/update_<device>.json``."""
    return out_dir if out_dir.endswith(".json") else f"{out_dir.rstrip('/')}/update_{device_slug()}.json"


def run(options: Options | None = None, /, **overrides: Any) -> dict[str, Any]:
    """Runs the ``update`` study with these options, prints ``summary`` of it; returns its payload."""
    o = Options.build(options, overrides)
    fields = {f.name: getattr(o, f.name) for f in dataclasses.fields(update.Options)}
    start = time.perf_counter()
    payload = update.run(update.Options(**{**fields, "out_dir": output_path(o.out_dir)}))
    print(summary(payload, time.perf_counter() - start), flush=True)
    return payload


def main(options: Options) -> dict[str, Any]:
    """``popjax bench accelerator``."""
    return run(options)


def _ms(x: float) -> str:
    return f"{x:.0f}" if x >= 100 else f"{x:.1f}" if x >= 10 else f"{x:.2f}" if x >= 1 else f"{x:.3f}"


def summary(payload: dict[str, Any], seconds: float | None = None) -> str:
    """The study as one table: ms per population step of every implementation at each (learner, N) (the fastest
    thread count), the fastest PyTorch variant and popjax's K-step speed-up over it (its ms ÷ popjax's), then the
    arithmetic of both sides and every skipped point with its reason."""
    params = payload["params"]
    impls = [i for i in update.IMPLS if i in params["impls"]]
    rows = payload["results"]
    best: dict[tuple, float] = {}
    for r in rows:
        if "skipped" not in r and r.get("devices", 1) == 1:
            key = (r["learner"], r["impl"], r["pop"])
            best[key] = min(best.get(key, float("inf")), r["ms_per_pop_step"])
    skipped = {(r["learner"], r["impl"], r["pop"]) for r in rows if "skipped" in r}
    paired = arithmetic.paired(payload)  # a speed-up only between equal arithmetic
    header = ["learner", "N", *impls, "fastest PyTorch", "K-step speed-up"]
    table = []
    for learner in params["learners"]:
        for pop in params["pops"]:
            cells = [learner, str(pop)]
            for impl in impls:
                key = (learner, impl, pop)
                cells.append(_ms(best[key]) if key in best else "skipped" if key in skipped else "-")
            torch_ms = {i: best[(learner, i, pop)] for i in update.TORCH_IMPLS if (learner, i, pop) in best}
            fastest = min(torch_ms, key=torch_ms.get) if torch_ms else None
            scan = best.get((learner, "vmap_scan", pop))
            ratio = "-" if not (fastest and scan) else f"{torch_ms[fastest] / scan:.2f}x" if paired else "withheld"
            cells += [fastest or "-", ratio]
            table.append(cells)
    widths = [max(len(c) for c in column) for column in zip(header, *table, strict=True)]
    line = lambda cells: "  ".join(c.rjust(w) for c, w in zip(cells, widths, strict=True))
    out = ["", f"popjax bench accelerator: ms per population step (median), "
               f"{'/'.join(sorted({d['kind'] for d in payload['machine']['devices']}))}"
           + (f", {seconds:.0f}s in all" if seconds is not None else ""),
           line(header), *map(line, table),
           "K-step speed-up = the fastest PyTorch variant's ms / popjax vmap_scan's ms, measured in this run; "
           + arithmetic.describe(payload)]
    reasons = [f"  {r['learner']} {r['impl']} N={r['pop']}: {r['skipped']}" for r in rows if "skipped" in r]
    out += [f"skipped ({len(reasons)}):", *reasons] if reasons else ["skipped: none"]
    return "\n".join(out)
