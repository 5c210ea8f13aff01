"""``popjax bench <study>``: the fast-PBT paper's speed studies, on whatever devices JAX sees.

Each study writes ``<out>/<study>.json`` (raw timings, every parameter, the machine and
device description, library versions, load averages) and ``<out>/<study>.png``;
``popjax bench report`` turns the JSON files into ``benchmarks/RESULTS.md``.

| study | what |
| --- | --- |
- ``update``: one population-wide update step vs N: popjax vmap (1 and K steps per call),
  JAX sequential, PyTorch sequential (paper Fig. 2);
- ``roofline``: dense-matmul GFLOP/s vs achieved GFLOP/s of the TD3/SAC population update;
- ``compile``: compile time of the K-step population update vs N (paper Table 3);
- ``envstep``: ms per env interaction, gym MuJoCo (host) and brax (jitted, vmapped) (Table 2);
- ``train``: end-to-end env steps/s of ``popjax.experiment.train`` and the share of wall time
  spent in the compiled update;
- ``shared_critic``: shared-critic TD3 (CEM-RL/DvD) update vs N (``popjax.bench.shared_critic``);
- ``drivers``: time per training iteration of every driver, on 1 and more devices, both
  ``--parallel`` paths (``popjax.bench.drivers``);
- ``report``: regenerate ``benchmarks/RESULTS.md`` from the JSON results.

``--devices 1,2`` splits the population over 1 and then 2 devices (on a CPU, host devices
are forced through ``jax_num_cpu_devices`` before JAX starts); every result row records its
``devices`` (every study honours the flag; ``envstep``'s ``single`` rows and the sequential
baselines of ``update`` and ``shared_critic`` run on one device). Asking for more devices than
JAX can provide is a one-line error (exit status 2).
"""

from __future__ import annotations

import argparse
import importlib
import math
import os
import sys
import tempfile
from pathlib import Path

STUDIES = ("update", "roofline", "compile", "envstep", "train", "shared_critic", "drivers", "report")

_DEFAULT_POPS = {
    "update": "1,2,4,8,16,32,64",
    "roofline": "1,2,4,8,16,32,64",
    "compile": "1,2,4,8,16,32,64",
    "envstep": "1,4,16",
    "train": "1,4,16",
    "shared_critic": "1,2,4,8,16",
    "drivers": "4",
}
_HELP = {
    "update": "population update step time vs N: vmap, vmap+scan, JAX sequential, PyTorch sequential",
    "roofline": "matmul peak GFLOP/s vs achieved GFLOP/s of the TD3/SAC population update",
    "compile": "compile time of the K-step population update vs N",
    "envstep": "ms per env interaction, gym MuJoCo and brax",
    "train": "end-to-end env steps/s of popjax.experiment.train and the share of time in the compiled update",
    "shared_critic": "shared-critic TD3 update vs N (popjax.bench.shared_critic)",
    "drivers": "time per training iteration of every driver on 1 and more devices (sharding and pmap)",
    "report": "regenerate benchmarks/RESULTS.md from the JSON results",
}


_LEARNER = lambda default: (("--learner",), {"default": default, "help": "comma-separated learners"})
_HIDDEN = (("--hidden",), {"default": None, "help": "override hidden sizes, e.g. 64,64 (DQN: its MLP head)"})
_BATCH = (("--batch-size",), {"type": int, "default": None, "help": "override the batch size"})
# Study-specific options (kept here so that building the CLI parser imports no JAX).
_EXTRA: dict[str, tuple] = {
    "update": (
        _LEARNER("td3,sac,dqn"),
        _HIDDEN,
        _BATCH,
        (
            ("--impl",),
            {
                "default": "vmap,vmap_scan,jax_seq,torch_seq",
                "help": "comma-separated subset of vmap,vmap_scan,jax_seq,torch_seq",
            },
        ),
        (("--frame",), {"type": int, "default": 84, "help": "DQN frame side (84 = Atari)"}),
        (
            ("--torch-threads",),
            {
                "default": None,
                "help": "torch.set_num_threads, or a list such as 2,1: one PyTorch run per value, the "
                "fastest is the baseline (default: torch's own, the number of cores)",
            },
        ),
    ),
    "roofline": (
        _LEARNER("td3,sac"),
        _HIDDEN,
        _BATCH,
        (("--impl",), {"default": "vmap", "help": "vmap and/or vmap_scan (K steps per call)"}),
        (("--matmul-sizes",), {"default": "1024,2048", "help": "square matmul sizes for the peak"}),
    ),
    "compile": (
        _LEARNER("td3,sac"),
        _HIDDEN,
        _BATCH,
        (
            ("--compile-repeats",),
            {"type": int, "default": 1, "help": "fresh compilations per point (median)"},
        ),
    ),
    "envstep": (
        _LEARNER("td3,sac"),
        _HIDDEN,
        (
            ("--gym",),
            {
                "default": "HalfCheetah-v5,Hopper-v5,Walker2d-v5,Ant-v5,Humanoid-v5,Swimmer-v5",
                "help": "gymnasium ids ('' for none)",
            },
        ),
        (
            ("--brax",),
            {"default": "halfcheetah,hopper,walker2d,ant,humanoid", "help": "brax names ('' for none)"},
        ),
        (("--envs-per-member",), {"type": int, "default": 1}),
        (("--steps",), {"type": int, "default": 200, "help": "env steps per timed call (brax: per scan)"}),
    ),
    "train": (
        _LEARNER("td3"),
        _HIDDEN,
        _BATCH,
        (("--env",), {"default": "gym:HalfCheetah-v5,brax:halfcheetah", "help": "comma-separated env names"}),
        (("--env-steps",), {"type": int, "default": 3000, "help": "env steps per member"}),
        (("--warmup",), {"type": int, "default": 500, "help": "random warm-up env steps per member"}),
        (("--rollout-len",), {"type": int, "default": 50, "help": "env steps per env per iteration (K)"}),
    ),
    "drivers": (
        _HIDDEN,
        _BATCH,
        (("--driver",), {"default": "independent,pbt,cemrl,dvd", "help": "comma-separated drivers"}),
        (("--parallel",), {"default": "sharding,pmap", "help": "parallel paths for device counts > 1"}),
        (("--env",), {"default": "probe:pendulum", "help": "a JAX env (the iteration is one compiled call)"}),
        (("--env-steps",), {"type": int, "default": 2000, "help": "env steps per member"}),
        (("--warmup",), {"type": int, "default": 200, "help": "random warm-up env steps per member"}),
        (("--rollout-len",), {"type": int, "default": 50, "help": "env steps per env per iteration (K)"}),
    ),
    "shared_critic": (
        (("--hidden",), {"default": None, "help": "hidden sizes (default 256,256)"}),
        (("--batch-size",), {"type": int, "default": None, "help": "batch size per member (default 256)"}),
        (
            ("--impl",),
            {
                "default": "vectorized,sequential,sequential_loop",
                "help": "comma-separated subset of vectorized,sequential,sequential_loop",
            },
        ),
    ),
}


def _module(study: str):
    return importlib.import_module(f"popjax.bench.{study}")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Adds ``<study> [options]`` sub-commands to the ``popjax bench`` parser (imports no JAX)."""
    sub = parser.add_subparsers(dest="study", required=True, metavar="study")
    for study in STUDIES:
        p = sub.add_parser(study, help=_HELP[study], description=_HELP[study])
        if study == "report":
            p.add_argument("--results", default="benchmarks/results", help="directory of <study>.json files")
            p.add_argument("--output", default="benchmarks/RESULTS.md", help="Markdown file to write")
            continue
        p.add_argument("--pop", default=_DEFAULT_POPS[study], help="population sizes, comma-separated")
        p.add_argument("--devices", default="1", help="device counts to split the population over, e.g. 1,2")
        p.add_argument(
            "--k", type=int, default=None, help="update steps per compiled call (default: 50 TD3/SAC, 10 DQN)"
        )
        p.add_argument("--repeats", type=int, default=10, help="minimum timed calls (K-step calls: a quarter)")
        p.add_argument("--min-time", type=float, default=1.0, help="minimum seconds of timed calls per point")
        p.add_argument(
            "--max-seconds",
            type=float,
            default=120.0,
            help="per-point budget: larger N whose estimated time exceeds it are skipped (recorded)",
        )
        p.add_argument("--seed", type=int, default=0)
        p.add_argument(
            "--out",
            default="benchmarks/results",
            help="output directory (or a .json file path) for <study>.json and <study>.png",
        )
        p.add_argument("--no-plot", action="store_true", help="write the JSON only")
        for flags, kwargs in _EXTRA.get(study, ()):
            p.add_argument(*flags, **kwargs)


def _names(flag: str, text: str, allowed, what: str = "") -> list[str]:
    names = [x for x in str(text).replace(" ", "").split(",") if x]
    if not names:
        raise ValueError(f"{flag}: expected a comma-separated list, got {text!r}")
    for name in names:
        if name not in allowed:
            raise ValueError(f"{flag}: {name!r} unknown{what} (allowed: {', '.join(allowed)})")
    return names


def _ints(flag: str, text) -> list[int]:
    from popjax.bench.common import parse_int_list

    try:
        return parse_int_list(text)
    except ValueError as err:
        raise ValueError(f"{flag}: {err}") from None


def _is_bench_result(path: Path) -> bool:
    """A JSON file a study wrote (its payload names the study and the machine)."""
    import json

    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError):
        return False
    return isinstance(data, dict) and {"study", "machine"} <= set(data)


def _writable(flag: str, path: Path) -> None:
    """``path`` can be written: not a directory, its nearest existing ancestor a writable directory."""
    if path.is_dir():
        raise ValueError(f"{flag}: {path} is a directory; give a directory for the results or a .json path")
    if path.exists() and not os.access(path, os.W_OK):
        raise ValueError(f"{flag}: {path} is not writable")
    if path.exists() and not _is_bench_result(path):
        raise ValueError(f"{flag}: {path} exists and is not a popjax benchmark result; popjax does not overwrite it")
    parent = path.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir():
        raise ValueError(f"{flag}: {parent} is an existing file, not a directory; give a directory or a .json path")
    try:  # os.access says yes to root everywhere: probe with a file that is removed at once
        if not os.access(parent, os.W_OK | os.X_OK):
            raise PermissionError
        with tempfile.TemporaryFile(dir=parent):
            pass
    except OSError:
        raise ValueError(f"{flag}: {parent} is not writable") from None


def check_args(args: argparse.Namespace) -> None:
    """Every option of ``args.study`` checked before anything is timed (ValueError, one line).

    Names (learners, implementations, drivers, envs), integer lists, numbers, the output path
    (an existing file, an unwritable directory) and the device count (forcing host devices
    when needed, which must happen before JAX starts).
    """
    study = args.study
    if study == "report":
        if not Path(args.results).is_dir():
            raise ValueError(f"--results: {args.results} is not a directory of <study>.json files")
        _writable("--output", Path(args.output))
        return
    from popjax.bench import common

    _ints("--pop", args.pop)
    devices = _ints("--devices", args.devices)
    for flag, value, low in (("--k", args.k, 1), ("--repeats", args.repeats, 1),
                             ("--batch-size", getattr(args, "batch_size", None), 1),
                             ("--compile-repeats", getattr(args, "compile_repeats", None), 1),
                             ("--steps", getattr(args, "steps", None), 1),
                             ("--env-steps", getattr(args, "env_steps", None), 1),
                             ("--rollout-len", getattr(args, "rollout_len", None), 1),
                             ("--envs-per-member", getattr(args, "envs_per_member", None), 1),
                             ("--frame", getattr(args, "frame", None), 36),
                             ("--warmup", getattr(args, "warmup", None), 0)):
        if value is not None and value < low:
            raise ValueError(f"{flag}: must be >= {low}, got {value}")
    for flag, value in (("--min-time", args.min_time), ("--max-seconds", args.max_seconds)):
        if not (math.isfinite(value) and value >= 0):
            raise ValueError(f"{flag}: expected a finite number >= 0, got {value}")
    if getattr(args, "hidden", None):
        _ints("--hidden", args.hidden)
    if getattr(args, "torch_threads", None):
        _ints("--torch-threads", args.torch_threads)
    if getattr(args, "matmul_sizes", None):
        _ints("--matmul-sizes", args.matmul_sizes)
    if hasattr(args, "learner"):
        from popjax.learners import LEARNERS

        _names("--learner", args.learner, LEARNERS, " learner")
    if hasattr(args, "impl"):
        _names("--impl", args.impl, _module(study).IMPLS, " implementation")
    if hasattr(args, "driver"):
        from popjax.drivers import DRIVERS

        _names("--driver", args.driver, DRIVERS, " driver")
    if hasattr(args, "parallel"):
        _names("--parallel", args.parallel, ("sharding", "pmap"))
    from popjax.envs import registry

    def check_env(flag: str, name: str, jax_only: bool = False) -> None:
        try:
            registry.parse(name)
        except ValueError as err:
            raise ValueError(f"{flag}: {err}") from None
        if jax_only and not registry.is_jax_env(name):
            raise ValueError(f"{flag}: {name!r} is a gymnasium env; this study needs a JAX env (brax:, probe:)")

    if study in ("train", "drivers"):
        for name in _names("--env", args.env, _Any()):
            check_env("--env", name, jax_only=study == "drivers")
    if study == "envstep":
        for name in [x for x in args.gym.split(",") if x]:
            check_env("--gym", name if ":" in name else f"gym:{name}")
        for name in [x for x in args.brax.split(",") if x]:
            check_env("--brax", name if ":" in name else f"brax:{name}", jax_only=True)
    json_path, png_path = common.output_paths(args.out, study)
    _writable("--out", json_path)
    if not args.no_plot:
        _writable("--out", png_path)
    common.request_devices(devices)


class _Any:
    def __contains__(self, item) -> bool:
        return True


def main(args: argparse.Namespace) -> int:
    """Runs ``args.study``; returns the process exit status (2 and one line on stderr for a bad option)."""
    study = args.study
    if study not in STUDIES:
        print(f"popjax bench: error: study {study!r} unknown (allowed: {', '.join(STUDIES)})", file=sys.stderr)
        return 2
    try:
        check_args(args)  # before anything is timed or written
    except ValueError as err:
        print(f"popjax bench {study}: error: {' '.join(str(err).split())}", file=sys.stderr)
        return 2
    if study == "report":
        from popjax.bench import report

        path = report.write_report(args.results, args.output)
        print(f"wrote {path}")
        return 0
    try:
        _module(study).main(args)
    except ValueError as err:  # a bad option value found by the study itself: one line, no traceback
        print(f"popjax bench {study}: error: {' '.join(str(err).split())}", file=sys.stderr)
        return 2
    return 0
