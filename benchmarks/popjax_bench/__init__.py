"""``popjax bench <study>``: the fast-PBT paper's speed studies, on whatever devices JAX sees.

A distribution of its own, popjax-bench (``benchmarks/pyproject.toml`` in the popjax repository,
``pip install -e benchmarks``), not part of the popjax package: ``popjax bench`` imports this
package when it is installed (``popjax.cli.bench_plugin``), and the studies use popjax's public
pieces only (the ``train`` study times the loop through ``train(..., instrument=...)``).

Each study writes ``<out>/<study>.json`` (raw timings, every parameter, the machine and
device description, library versions, load averages) and ``<out>/<study>.png``;
``popjax bench report`` turns the JSON files into ``benchmarks/RESULTS.md``.

Studies:

- ``update``: one population-wide update step vs N: popjax vmap (1 and K steps per call),
  JAX sequential, PyTorch sequential (paper Fig. 2); ``--processes P``: vmap over the devices of P
  local processes (``jax.distributed``) against 1 process with as many devices;
- ``accelerator``: ``update`` with the paper's sizes (N up to 256, TD3 and SAC, every implementation) on
  whatever accelerator JAX sees, written as ``update_<backend>_<device kind>.json`` (``make bench-accelerator``);
- ``roofline``: dense-matmul GFLOP/s vs achieved GFLOP/s of the TD3/SAC population update;
- ``compile``: compile time of the K-step population update vs N (paper Table 3);
- ``envstep``: ms per env interaction, gym MuJoCo (host) and brax (jitted, vmapped) (Table 2);
- ``train``: end-to-end env steps/s of ``popjax.experiment.train`` and the share of wall time
  spent in the compiled update;
- ``frontier``: agent env steps/s of the large-batch learner ``fast_td3`` (and ``td3`` at its widths) vs N, envs per
  member and matmul precision (``popjax_bench.frontier``);
- ``shared_critic``: shared-critic TD3 (CEM-RL/DvD) update vs N (``popjax_bench.shared_critic``);
- ``drivers``: time per training iteration of every driver, on 1 and more devices, both
  ``--parallel`` paths (``popjax_bench.drivers``);
- ``per``: samples/s and updates/s of the prioritized-replay sum tree vs K, N and B, a vmapped population
  of trees, and a NumPy searchsorted/cumsum oracle (``popjax_bench.per``);
- ``spo``: SPO-TD3 time per local update vs replicas R (replica r on device r) and local steps H, the
  data-parallel baseline and the single learner, with the terms and prediction of the thesis's scaling
  model (Zhang 2022, Eq. 5.6) beside the measured scaling factor (``popjax_bench.spo``);
- ``hts``: env steps/s of the HTS-RL driver's threads vs the lock-step baseline under constant, exponential
  and gamma step times, beside the runtime model (``popjax_bench.hts``);
- ``dispatch``: the per-call overhead of the one-step population update against no-op programs with the same
  arguments, and the training loop's own cost per iteration (eager dispatches, host reads), written as
  ``dispatch_<backend>.json`` (``popjax_bench.dispatch``);
- ``report``: regenerate ``benchmarks/RESULTS.md`` from the JSON results.

``--devices 1,2`` splits the population over 1 and then 2 devices (on a CPU, host devices
are forced through ``jax_num_cpu_devices`` before JAX starts); every result row records its
``devices`` (every study honours the flag; ``envstep``'s ``single`` rows and the sequential
baselines of ``update`` and ``shared_critic`` run on one device). Asking for more devices than
JAX can provide is a one-line error (exit status 2).

Options: each study module declares its options once, as the frozen dataclass
``popjax_bench.<study>.Options`` (``popjax_bench.options``); the parser, the checks and the
``run(options)`` call come from it, and an option a study does not declare is rejected.

Load discipline: a study refuses to start when the 1-minute load average exceeds half the
cores (one line, exit status 2) unless ``--allow-busy``, which stamps its JSON ``"busy": true``
(``popjax bench report`` shows such results but gives them no verdict); ``--wait-quiet
SECONDS`` waits for the load to fall first. Every study measures the machine's ceilings in the
same process (``popjax_bench.common.Sitting``). The targets the report judges live in
``benchmarks/targets.yaml``.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import tempfile
from pathlib import Path

STUDIES = ("update", "accelerator", "roofline", "compile", "envstep", "train", "frontier", "shared_critic", "drivers",
           "per", "spo", "hts", "sparse_inference", "dispatch", "report")

_HELP = {
    "update": "population update step time vs N: vmap, vmap+scan, JAX sequential, PyTorch sequential",
    "accelerator": "the paper's Fig. 2 (update vs N up to 256, every implementation, PyTorch on the same device) "
                   "on whatever accelerator JAX sees, written as update_<device>.json",
    "roofline": "matmul peak GFLOP/s vs achieved GFLOP/s of the TD3/SAC population update",
    "compile": "compile time of the K-step population update vs N",
    "envstep": "ms per env interaction, gym MuJoCo and brax",
    "train": "end-to-end env steps/s of popjax.experiment.train and the share of time in the compiled update",
    "frontier": "agent env steps/s of the large-batch learner fast_td3 (and td3 at its widths) vs N, envs per "
                "member and matmul precision, in whole training runs",
    "shared_critic": "shared-critic TD3 update vs N (popjax_bench.shared_critic)",
    "drivers": "time per training iteration of every driver on 1 and more devices (sharding and pmap)",
    "per": "prioritized-replay sum tree: sample and update throughput vs K, N, B, a vmapped population, NumPy",
    "spo": "SPO-TD3 time per local update vs replicas R (one per device) and local steps H, beside the thesis's "
           "scaling model (Eq. 5.6)",
    "hts": "HTS-RL env steps/s vs lock-step: step-time distributions, alpha, actor threads, beside the runtime model",
    "sparse_inference": "CPU latency of a sparse RLx2 actor executed sparsely (compact, BCOO) vs dense",
    "dispatch": "per-call overhead of a compiled population update (against no-op programs with the same "
                "arguments) and what the training loop adds per iteration, written as dispatch_<backend>.json",
    "report": "regenerate benchmarks/RESULTS.md from the JSON results",
}


def _module(study: str):
    return importlib.import_module(f"popjax_bench.{study}")


def options_class(study: str):
    """The study's options dataclass (``popjax_bench.<study>.Options``; imports the study module)."""
    return importlib.import_module(f"popjax_bench.{study}").Options


def _study_parser_class(base: type[argparse.ArgumentParser]) -> type[argparse.ArgumentParser]:
    """Parsers whose options are added from ``options_class(study)`` when first used (parsing or help),
    so that building ``popjax``'s parser imports no study module (and no JAX)."""

    class StudyParser(base):
        study: str | None = None
        _completed = False

        def _complete(self) -> None:
            if self.study and not self._completed:
                from popjax_bench.options import add_to_parser

                self._completed = True
                add_to_parser(self, options_class(self.study))

        def parse_known_args(self, args=None, namespace=None):
            self._complete()
            namespace, extras = super().parse_known_args(args, namespace)
            if extras:  # an option this study does not have: rejected, never ignored
                self.error(f"{extras[0]}: not an option of `popjax bench {self.study}` "
                           f"(see popjax bench {self.study} --help)")
            return namespace, extras

        def format_help(self):
            self._complete()
            return super().format_help()

    return StudyParser


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Adds ``<study> [options]`` sub-commands to the ``popjax bench`` parser (imports no JAX)."""
    sub = parser.add_subparsers(dest="study", required=True, metavar="study",
                                parser_class=_study_parser_class(type(parser)))
    for study in STUDIES:
        p = sub.add_parser(study, help=_HELP[study], description=_HELP[study])
        p.study = study


def _is_bench_result(path: Path) -> bool:
    """A JSON file a study wrote (its payload names the study and the machine)."""
    import json

    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError):
        return False
    return isinstance(data, dict) and {"study", "machine"} <= set(data)


REPORT_HEADING = "# popjax benchmark results"  # the first line of every RESULTS.md `bench report` writes


def _is_bench_report(path: Path) -> bool:
    """A Markdown file ``bench report`` wrote (it starts with its heading)."""
    try:
        with path.open(encoding="utf-8") as f:
            return f.readline().rstrip("\n") == REPORT_HEADING
    except (OSError, UnicodeDecodeError):
        return False


def _is_own_output(path: Path) -> bool:
    """A file a study or the report wrote: a study's JSON, the plot beside it, or a report."""
    return _is_bench_result(path.with_suffix(".json")) or _is_bench_report(path)


def _writable(flag: str, path: Path) -> None:
    """``path`` can be written: not a directory, its nearest existing ancestor a writable directory."""
    if path.is_dir():
        raise ValueError(f"{flag}: {path} is a directory; give a directory for the results or a .json path")
    if path.exists() and not os.access(path, os.W_OK):
        raise ValueError(f"{flag}: {path} is not writable")
    # An existing file is replaced only when popjax wrote it: a study's JSON, the plot beside it, a report.
    if path.exists() and not _is_own_output(path):
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


def check_args(args: argparse.Namespace):
    """The options of ``args.study`` converted and checked before anything is timed; returns the study's
    ``Options`` (ValueError, one line).

    Names (learners, implementations, drivers, envs), integer lists, numbers (``<study>.Options``),
    the output path (an existing file, an unwritable directory) and the device count (forcing host
    devices when needed, which must happen before JAX starts).
    """
    from popjax_bench.options import from_namespace

    study = args.study
    options = from_namespace(options_class(study), args)
    if study == "report":
        if not Path(options.results).is_dir():
            raise ValueError(f"--results: {options.results} is not a directory of <study>.json files")
        _writable("--output", Path(options.output))
        return options
    from popjax_bench import common

    options.check_split()  # a device count no population divides: refused before anything is written
    json_path, png_path = common.output_paths(options.out_dir, study)
    _writable("--out", json_path)
    if options.plot:
        _writable("--out", png_path)
    common.request_devices(options.devices_needed())
    return options


def main(args: argparse.Namespace) -> int:
    """Runs ``args.study``; returns the process exit status (2 and one line on stderr for a bad option)."""
    study = args.study
    if study not in STUDIES:
        print(f"popjax bench: error: study {study!r} unknown (allowed: {', '.join(STUDIES)})", file=sys.stderr)
        return 2
    try:
        options = check_args(args)  # before anything is timed or written
    except ValueError as err:
        print(f"popjax bench {study}: error: {' '.join(str(err).split())}", file=sys.stderr)
        return 2
    if study != "report":  # compile once (popjax.compile_cache); the compile study times fresh compilations
        from popjax import compile_cache

        compile_cache.enable("off" if study == "compile" else None)
    try:
        result = _module(study).main(options)
    except ValueError as err:  # a bad option value found by the study itself, or a busy machine: one line
        print(f"popjax bench {study}: error: {' '.join(str(err).split())}", file=sys.stderr)
        return 2
    if study == "report":
        print(f"wrote {result}")
        return 0
    why = nothing_timed(result)
    if why is not None:  # a study that timed nothing is a failed run, not a result: exit 1, one line
        print(f"popjax bench {study}: error: nothing was timed: {' '.join(why.split())}", file=sys.stderr)
        return 1
    return 0


def nothing_timed(payload) -> str | None:
    """Why a study's payload holds no timed point (no rows, or every row skipped), or None when it has one."""
    rows = payload.get("results") if isinstance(payload, dict) else None
    if rows is None:
        return None
    if not rows:
        return "the study produced no rows (no point matched the options)"
    skipped = [r for r in rows if isinstance(r, dict) and "skipped" in r]
    if len(skipped) < len(rows):
        return None
    reasons = sorted({str(r["skipped"]) for r in skipped})
    return (f"all {len(rows)} points were skipped ({reasons[0]}" + (f"; and {len(reasons) - 1} other reason(s)"
            if len(reasons) > 1 else "") + "); raise --max-seconds or ask for fewer/smaller points")
