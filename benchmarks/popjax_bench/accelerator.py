"""``popjax bench accelerator``: the fast-PBT paper's Fig. 2 on whatever accelerator JAX sees, in one command.

The ``update`` study with the paper's range of population sizes (N = 1 to 256), TD3 and SAC, every
implementation (popjax one-step and K-step, JAX sequential, and the four PyTorch variants on the same device:
eager and compiled, sequential and vectorized) and the memory-fit search. The results go to
``<out>/update_<backend>_<device kind>.json`` (``update_gpu_nvidia-h100-80gb-hbm3.json``), so runs on
different devices sit side by side in ``benchmarks/results/`` and ``popjax bench report`` shows each with the
device it names. On a CPU it runs as well (tests run it at tiny sizes); the per-point budget
(``--max-seconds``) skips the sizes a slow device cannot time in it.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any, ClassVar

from popjax_bench import options as opt
from popjax_bench import update

STUDY = "accelerator"
POPS = (1, 2, 4, 8, 16, 32, 64, 128, 256)


@dataclasses.dataclass(frozen=True)
class Options(update.Options):
    """``popjax bench accelerator``: ``update``'s options with the paper's sizes as defaults."""

    STUDY: ClassVar[str] = STUDY
    learners: tuple[str, ...] = opt.names(("td3", "sac"), "comma-separated learners", flag="--learner",
                                          allowed=update.PROBLEMS, what=" learner")
    pops: tuple[int, ...] = opt.ints(POPS, "population sizes, comma-separated", flag="--pop")
    max_seconds: float = opt.max_seconds(300.0)
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
    """Runs the ``update`` study with these options; returns its payload."""
    o = Options.build(options, overrides)
    fields = {f.name: getattr(o, f.name) for f in dataclasses.fields(update.Options)}
    return update.run(update.Options(**{**fields, "out_dir": output_path(o.out_dir)}))


def main(options: Options) -> dict[str, Any]:
    """``popjax bench accelerator``."""
    return run(options)
