"""The ``popjax`` command: train | resume | sweep | plot | export | compare | export-returns | pbt-schedule | bench.

User errors (bad options, unknown names, malformed YAML, unreadable config files) print one
line and exit with status 2, never a traceback; internal errors keep their traceback (status 1).
``popjax train --help`` is generated from the configuration schema (``popjax.config.RunConfig``,
the learners' ``Config`` and ``HParams`` declarations, the drivers' options schemas).
"""

from __future__ import annotations

import argparse
import sys
import textwrap
from pathlib import Path
from typing import Any

import yaml

from popjax.config import ConfigError
from popjax.drivers.base import InteractionFailed

# CLI flag -> RunConfig field (the other fields are set with --set or in the --config file).
_FLAGS = {
    "learner": "learner", "env": "env", "driver": "driver", "pop": "pop_size", "seed": "seed",
    "steps": "total_env_steps", "envs_per_member": "envs_per_member", "rollout_len": "rollout_len",
    "update_ratio": "update_ratio", "warmup": "warmup_steps", "batch_size": "batch_size",
    "buffer_size": "buffer_size", "eval_interval": "eval_interval", "eval_episodes": "eval_episodes",
    "devices": "devices", "parallel": "parallel", "overlap": "overlap", "checkpoint_interval": "checkpoint_interval",
    "matmul_precision": "matmul_precision", "device_memory": "device_memory",
}


class _Parser(argparse.ArgumentParser):
    describe = None  # optional (parser) -> None: fills in help texts when help is asked for
    refusal = None  # optional one-line reason: any use of this command (--help too) prints it and exits 2

    def error(self, message):  # argparse's own usage errors: one line, exit 2
        listing = self._missing_choice(str(message))
        if listing is not None:  # `popjax` / `popjax bench` alone: what exists, then exit 2 (a usage error)
            self.exit(2, listing)
        self.exit(2, f"popjax: error: {' '.join(str(message).split())}\n")

    def _missing_choice(self, message: str) -> str | None:
        """For a missing sub-command (``popjax`` or ``popjax bench`` alone): one error line naming what is
        allowed, then each choice with its one-line help; None for any other error."""
        for action in self._actions:
            if isinstance(action, argparse._SubParsersAction) and action.dest in message.split(": ", 1)[-1].split(", "):
                names = [choice.dest for choice in action._choices_actions]
                width = max(map(len, names), default=0)
                rows = "".join(f"  {choice.dest:<{width}}  {choice.help or ''}\n" for choice in action._choices_actions)
                return (f"{self.prog}: error: {action.dest}: missing (allowed: {', '.join(names)})\n{rows}"
                        f"see {self.prog} <{action.dest}> --help\n")
        return None

    def parse_known_args(self, args=None, namespace=None):
        if self.refusal is not None:
            self.exit(2, f"{self.prog}: error: {self.refusal}\n")
        return super().parse_known_args(args, namespace)

    def format_help(self):
        if self.describe is not None:
            self.describe(self)  # from the schema, only when asked (it imports the registries)
            self.describe = None
        return super().format_help()


def _key_value(text: str) -> tuple[str, str]:
    """``NAME=VALUE`` (the value is YAML, read by ``train_options``)."""
    name, sep, value = text.partition("=")
    if not sep or not name.strip():
        raise argparse.ArgumentTypeError(f"expected NAME=VALUE, got {text!r}")
    return name.strip(), value


class DuplicateKey(yaml.YAMLError):
    """A mapping of a YAML document names the same key twice (``key``: its dotted path; ``line``: 1-based,
    of the second one)."""

    def __init__(self, key: str, line: int):
        super().__init__(f"duplicate key {key} (line {line})")
        self.key, self.line = key, line


class StrictLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that refuses a key given twice in one mapping (PyYAML keeps the last value
    silently; a user who wrote the key twice meant one of them)."""

    def construct_document(self, node):
        _check_duplicates(node, (), set())
        return super().construct_document(node)


def _check_duplicates(node, path: tuple[str, ...], visited: set[int]) -> None:
    if id(node) in visited:  # an alias seen before (anchors may even be recursive)
        return
    visited.add(id(node))
    if isinstance(node, yaml.MappingNode):
        seen = set()
        for key_node, value_node in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":  # ``<<: *base``: its keys may be overridden
                continue
            key = key_node.value if isinstance(key_node, yaml.ScalarNode) else None
            if key is not None and (key_node.tag, key) in seen:
                dotted = "".join(part if part.startswith("[") else "." + part for part in (*path, key))
                raise DuplicateKey(dotted.lstrip("."), key_node.start_mark.line + 1)
            seen.add((key_node.tag, key))
            _check_duplicates(value_node, (*path, str(key)), visited)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            _check_duplicates(item, (*path, f"[{i}]"), visited)


def load_yaml_text(text: str) -> Any:
    """``text`` read as YAML like ``yaml.safe_load``, but a duplicated key raises ``DuplicateKey``."""
    return yaml.load(text, Loader=StrictLoader)  # noqa: S506 - a SafeLoader subclass


def _yaml_value(field: str, text: str) -> Any:
    """A flag value parsed as YAML (``1e4``, ``[64, 64]``, ``{interval: 5000}``); one-line error if malformed."""
    try:
        return load_yaml_text(text)
    except DuplicateKey as err:
        raise ConfigError(f"{field}.{err.key}: duplicate key in {text!r}") from None
    except yaml.YAMLError as err:
        problem = getattr(err, "problem", None) or str(err).splitlines()[0]
        raise ConfigError(f"{field}: {text!r} is not valid YAML ({problem})") from None


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="popjax", description="Train populations of deep-RL agents fast.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    train = sub.add_parser("train", help="train a population and write a run directory",
                           description="Train a population and write a run directory.\n\nEvery option can also "
                           "live in a YAML file (--config); flags override it.\nA bad value is one line naming "
                           "the option and what is allowed (exit status 2);\nnothing is written before every "
                           "check has passed.", formatter_class=argparse.RawDescriptionHelpFormatter)
    train.describe = _describe_train
    train.add_argument("--config", type=Path, metavar="FILE",
                       help="YAML file with any option below (flags override it)")
    train.add_argument("--out", type=Path, default=None, help="run directory (default runs/<learner>-<env>)")
    for flag, field in _FLAGS.items():
        train.add_argument("--" + flag.replace("_", "-"), dest=flag, default=None, metavar=field.upper())
    train.add_argument("--hparam", action="append", type=_key_value, default=[], metavar="NAME=VALUE",
                       help="per-member hparam: a value for all members or a list [v1, v2, ...] of pop_size values "
                       "(repeatable; names and bounds below)")
    train.add_argument("--learner-config", action="append", type=_key_value, default=[], metavar="KEY=VALUE",
                       help="static learner option, e.g. hidden=[64,64] (repeatable; keys below)")
    train.add_argument("--set", action="append", type=_key_value, default=[], metavar="OPTION=VALUE",
                       help="any other option, e.g. logger=[tensorboard,wandb] or pbt={interval: 5000} (repeatable; "
                       "options and driver blocks below)")
    train.add_argument("--no-progress", action="store_true", help="no progress bar or progress lines")
    train.add_argument("--preset", default=None, choices=("auto", "none"),
                       help="auto (default): tuned rl-zoo values for known learner/env pairs fill the options not "
                            "given (see popjax/presets.py); none: the library's bare defaults")
    train.add_argument("--schedule", type=Path, default=None, metavar="FILE",
                       help="replay a PBT winner's hparam schedule (written by popjax pbt-schedule) without PBT: "
                            "the independent driver's schedule option")
    train.add_argument("--overwrite", action="store_true",
                       help="replace the run in --out (only a directory popjax created; only its own files go)")
    train.add_argument("--plan", action="store_true",
                       help="print the run's memory (per member and in total: params, optimizer, replay, envs) and "
                            "work (FLOPs per iteration, predicted update time) at its real shapes, from XLA's "
                            "analysis of its compiled update, and write nothing; exit 2 when it cannot fit "
                            "(docs/planning.md)")
    train.add_argument("--peak-flops", default=None, metavar="FLOP/S",
                       help="with --plan: the FLOP/s the update time is predicted at, e.g. 989T (default: a matrix "
                            "product measured on this machine's device)")

    resume = sub.add_parser("resume", help="continue a killed or finished run from its last checkpoint")
    resume.add_argument("run_dir", type=Path)
    resume.add_argument("--no-progress", action="store_true")
    for command in (train, resume):
        command.add_argument("--compile-cache", default=None, metavar="DIR|off",
                             help="JAX's persistent compilation cache: a folder, or off (default: "
                                  "$POPJAX_COMPILE_CACHE, else ~/.cache/popjax/jax; never inside the run directory)")
        _add_job_arguments(command)

    _add_sweep_parser(sub)

    plot = sub.add_parser("plot", help="(re)draw the plots of a run directory")
    plot.add_argument("run_dir", type=Path)

    export = sub.add_parser("export", help="write a member's actor as a compact file (sparse links only)",
                            description="Write a trained member's deterministic actor (td3, rlx2_td3) as an .npz of "
                                        "compact layers; load it with popjax.export.load_policy.")
    export.add_argument("run_dir", type=Path)
    export.add_argument("--member", type=int, default=None, help="member index (default: the best final return)")
    export.add_argument("--out", type=Path, default=None, help="file to write (default <run_dir>/policy-member<m>.npz;"
                                                               " never overwritten)")

    compare = sub.add_parser("compare", help="compare runs: IQM with bootstrap CIs, P(improvement), plots",
                             description="Group run directories by a label and compare their final evaluation "
                             "returns (IQM with stratified bootstrap CIs, mean ± SD, P(improvement) against a "
                             "baseline), aligning the curves on env steps and wall time; prints the table and "
                             "writes compare.json, compare.csv and plots into --out. Never writes into a run.")
    compare.add_argument("run_dirs", type=Path, nargs="*", metavar="RUN_DIR")
    compare.add_argument("--label", default=None, metavar="KEY",
                         help="config key that names a run's group (learner, driver, seed, pbt.interval, ...) or "
                              "name (the directory's name); default: the first of learner, driver, env, pop_size, "
                              "seed that differs")
    compare.add_argument("--baseline", default=None, metavar="LABEL", help="group to compare against (default: "
                                                                           "the first run's)")
    compare.add_argument("--out", type=Path, default=Path("compare"), help="output directory (default compare)")
    compare.add_argument("--reference", type=Path, default=None, metavar="FILE",
                         help="YAML {env: {low, high}}: normalise the returns of runs of different envs")
    compare.add_argument("--score", default="mean", choices=("mean", "best"),
                         help="score of a run whose members interact (PBT, CEM-RL, DvD): population mean or best")

    returns = sub.add_parser("export-returns", help="write a run's evaluation returns as marl-eval JSON",
                             description="Write a run's evaluation returns in the JSON layout of the marl-eval/"
                             "Stoix tools (env -> task -> algorithm -> seed_<member> -> step_<k>).")
    returns.add_argument("run_dir", type=Path)
    returns.add_argument("--format", default="marl-eval", choices=("marl-eval",))
    returns.add_argument("--algorithm", default=None, help="algorithm name in the file (default: the learner)")
    returns.add_argument("--out", type=Path, default=None,
                         help="file to write (default <run name>-marl-eval.json here; never overwritten)")

    schedule = sub.add_parser("pbt-schedule", help="write the best PBT member's hparam schedule as YAML",
                              description="Follow the best final member of a PBT run back through every copy "
                              "(lineage.csv) and write the hparams it trained with at every round as YAML; "
                              "replay it with popjax train --schedule FILE.")
    schedule.add_argument("run_dir", type=Path)
    schedule.add_argument("--out", type=Path, default=None, help="file to write (default <run_dir>/schedule.yaml)")

    # `popjax bench --help` lists the studies; `popjax bench <study> --help` its options. The studies are
    # the separate popjax-bench distribution (benchmarks/ in the repository), found when it is installed.
    # Building these parsers imports no JAX (popjax_bench keeps its option tables import-free).
    bench = sub.add_parser("bench", help="speed benchmarks (popjax-bench; see benchmarks/RESULTS.md)",
                           description="Speed benchmarks; each study writes JSON and a plot.")
    bench_module = bench_plugin()
    if bench_module is None:
        bench.refusal = BENCH_MISSING
    else:
        bench_module.add_arguments(bench)
    return parser


def _add_sweep_parser(sub) -> None:
    """``popjax sweep``: the run options of ``train`` plus the study's (``popjax.sweeps``)."""
    from popjax.sweeps.options import OBJECTIVES, PRUNERS, SAMPLERS

    sweep = sub.add_parser("sweep", help="an Optuna study whose trials train pop_size at a time as one population",
                           description="Tune a learner's traced hparams with an Optuna study: trials are asked "
                           "pop_size at a time and trained as one population (independent driver); pruned slots "
                           "are refilled in place. The study lives in --storage (default <out>/study.db); "
                           "optuna-dashboard <storage> shows it. Run options as for popjax train.")
    sweep.add_argument("--config", type=Path, metavar="FILE", help="YAML file of run options (as for train)")
    sweep.add_argument("--out", type=Path, default=None, help="sweep directory (default sweeps/<learner>-<env>)")
    sweep.add_argument("--resume", type=Path, default=None, metavar="DIR",
                       help="continue a killed sweep (its running trials are failed and re-queued)")
    for flag, field in _FLAGS.items():
        sweep.add_argument("--" + flag.replace("_", "-"), dest=flag, default=None, metavar=field.upper())
    for option, metavar in (("--hparam", "NAME=VALUE"), ("--learner-config", "KEY=VALUE"), ("--set", "OPTION=VALUE")):
        sweep.add_argument(option, action="append", type=_key_value, default=[], metavar=metavar)
    sweep.add_argument("--trials", type=int, default=None, help="trials this sweep finishes (default pop_size)")
    sweep.add_argument("--space", default=None, metavar="NAME|FILE",
                       help="search space: a name (td3, sac, ...) or a YAML file {hparam: {type, low, high, log} | "
                            "{type: categorical, choices}} (default: the config's search_space, else the learner's)")
    sweep.add_argument("--sampler", default="tpe", help=f"allowed: {', '.join(SAMPLERS)}")
    sweep.add_argument("--pruner", default="none", help=f"allowed: {', '.join(PRUNERS)}")
    sweep.add_argument("--objective", default="final", help=f"allowed: {', '.join(OBJECTIVES)}")
    sweep.add_argument("--last-k", type=int, default=3, help="evaluations averaged by --objective last_k")
    sweep.add_argument("--storage", default=None, metavar="URL", help="SQLAlchemy URL of the study (shared by "
                                                                      "processes that name it)")
    sweep.add_argument("--study", default=None, metavar="NAME", help="study name (default popjax-<learner>-<env>)")
    sweep.add_argument("--top", type=int, default=0, metavar="K", help="retrain the K best trials as runs in <out>/top "
                       "and popjax compare them into <out>/compare (default 0: none)")
    sweep.add_argument("--top-seeds", type=int, default=4, metavar="N", help="seeds of each retrained trial (4)")
    sweep.add_argument("--preset", default=None, choices=("auto", "none"))
    sweep.add_argument("--no-progress", action="store_true")
    sweep.add_argument("--compile-cache", default=None, metavar="DIR|off")
    sweep.set_defaults(schedule=None)


def _run_sweep(args: argparse.Namespace) -> None:
    from popjax.sweeps import resume_sweep, sweep

    def report(trial, state, value):
        if not args.no_progress:
            print(f"trial {trial.number}: {state.lower()} {value:.4g} (slot {trial.user_attrs.get('slot')}, "
                  f"{trial.user_attrs.get('env_steps')} env steps)", flush=True)

    if args.resume is not None:
        result = resume_sweep(args.resume, compile_cache=args.compile_cache, on_trial=report, top=args.top,
                              top_seeds=args.top_seeds)
    else:
        options = train_options(args)
        space = args.space
        if space is not None and Path(space).suffix in (".yaml", ".yml"):
            space = _load_yaml(Path(space), "--space")
        out = args.out or Path("sweeps") / f"{options.get('learner', 'td3')}-{options.get('env', 'default')}"
        result = sweep(options, out_dir=str(out).replace(":", "_"), n_trials=args.trials, search_space=space,
                       sampler=args.sampler, pruner=args.pruner, objective=args.objective, last_k=args.last_k,
                       storage=args.storage, study=args.study, compile_cache=args.compile_cache, on_trial=report,
                       top=args.top, top_seeds=args.top_seeds)
    try:
        best = result.best
        print(f"best trial {best.number}: {best.value:.4g} {best.params}")
    except ValueError:
        print("no completed trial")
    for path in result.written:
        print(path)
    if result.top is not None:
        print(result.top.comparison.text)
        print(*(result.top.comparison.written or []), sep="\n")


BENCH_MISSING = ("the benchmarks are a separate distribution, popjax-bench: pip install -e benchmarks "
                 "(from the popjax repository)")


def bench_plugin():
    """The speed studies (the ``popjax_bench`` package of the popjax-bench distribution), or None when it is
    not installed."""
    try:
        import popjax_bench
    except ModuleNotFoundError as err:
        if err.name != "popjax_bench":  # installed but broken: the real error
            raise
        return None
    return popjax_bench


def _add_job_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of a multi-process run (one process per machine, started with the same command)."""
    job = parser.add_argument_group("several processes (machines); see README 'Many machines'")
    job.add_argument("--coordinator", metavar="HOST:PORT", help="address of process 0, where the job meets")
    job.add_argument("--num-processes", type=int, metavar="P", help="number of processes in the job")
    job.add_argument("--process-id", type=int, metavar="I", help="this process's index, 0 to P-1")
    job.add_argument("--distributed", action="store_true",
                     help="join a job described by the cluster scheduler's environment (e.g. SLURM's srun)")
    job.add_argument("--timeout", type=int, default=None, metavar="SECONDS",
                     help="give up when a process has not joined, or stopped answering, for this long (default 120)")


def _join_job(args: argparse.Namespace) -> None:
    """Joins the multi-process job the flags describe (before JAX starts); nothing for a single process."""
    from popjax import distributed

    if not (args.distributed or args.coordinator or args.num_processes is not None or args.process_id is not None):
        if args.timeout is not None:
            raise ConfigError("timeout: only for a run over several processes (--coordinator or --distributed)")
        return
    place = distributed.JobPlace(args.coordinator, args.num_processes, args.process_id,
                                 args.timeout if args.timeout is not None else distributed.DEFAULT_TIMEOUT_S)
    if args.distributed and args.coordinator is not None:
        raise ConfigError("distributed: give either --distributed (the scheduler's environment) or --coordinator, "
                          "--num-processes and --process-id")
    try:
        place.check()
    except ValueError as err:
        raise ConfigError(str(err)) from None
    distributed.initialize(place)


def _describe_train(parser: argparse.ArgumentParser) -> None:
    """Help texts of ``popjax train`` from the schema: meaning, default and allowed values of every option."""
    from popjax import schema
    from popjax.config import RunConfig

    docs = {doc.name: doc for doc in schema.describe(RunConfig)}
    for action in parser._actions:
        if action.dest in _FLAGS:
            action.help = _help_line(docs[_FLAGS[action.dest]])
    parser.epilog = "\n".join(_schema_epilog(docs, set(_FLAGS.values())))


def _help_line(doc) -> str:
    return f"{doc.help} (default: {doc.default}; allowed: {doc.allowed})".replace("%", "%%")


def _schema_epilog(docs, flagged: set[str]) -> list[str]:
    import jax

    from popjax import schema
    from popjax.population.hparams import hparam_bounds, hparam_help
    from popjax.registry import DRIVERS, LEARNERS

    def block(rows, indent="  "):
        return [textwrap.fill(_help_line(doc).replace("%%", "%"), width=110, initial_indent=f"{indent}{doc.name:22s} ",
                              subsequent_indent=" " * (len(indent) + 23)) for doc in rows]

    lines = [f"learners: {', '.join(LEARNERS)}", f"drivers: {', '.join(DRIVERS)}",
             textwrap.fill(f"environments: {docs['env'].allowed}", width=110, subsequent_indent="  "), "",
             "other options (--set NAME=VALUE, or a key of the --config file):"]
    lines += block(doc for name, doc in docs.items() if name not in flagged and name != "driver_options")
    lines += ["", "learner_config keys (--learner-config KEY=VALUE; learner_config: {...} in YAML):"]
    for name, definition in LEARNERS.items():
        lines.append(f"  {name}:")
        lines += block((d for d in schema.describe(definition.config_cls) if d.name not in docs), "    ")
        run_set = [d.name for d in schema.describe(definition.config_cls) if d.name in docs]
        if run_set:
            lines.append(f"    ({', '.join(run_set)}: set by the run option of the same name)")
    lines += ["", "hparams (--hparam NAME=VALUE: one value for all members, or a list of pop_size values;",
              "search_space ranges {low, high, log, integer} and PBT priors must stay within the bounds too):"]
    for name, definition in LEARNERS.items():
        defaults = jax.device_get(definition.default_hparams(None))
        helps = hparam_help(definition.hparams_cls)
        rows = [schema.FieldDoc(h, helps[h], f"{getattr(defaults, h).item():.7g}", n.describe())
                for h, n in hparam_bounds(definition.hparams_cls).items()]
        lines += [f"  {name}:", *block(rows, "    ")]
    lines += ["", "driver options (--set DRIVER={key: value, ...}, or a YAML block named after the driver):"]
    for name, definition in DRIVERS.items():
        rows = schema.describe(definition.options)
        lines += [f"  {name}:{'' if rows else ' no options'}", *block(rows, "    ")]
    return lines


def _load_yaml(path: Path, flag: str = "--config") -> dict[str, Any]:
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise ConfigError(f"{flag}: file {path} not found") from None
    except IsADirectoryError:
        raise ConfigError(f"{flag}: {path} is a directory, not a YAML file") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{flag}: {path} is not a text file") from None
    except OSError as err:
        raise ConfigError(f"{flag}: cannot read {path} ({err.strerror or err})") from None
    try:
        data = load_yaml_text(text)
    except DuplicateKey as err:
        raise ConfigError(f"{err.key}: duplicate key in {path} (line {err.line})") from None
    except yaml.YAMLError as err:
        raise ConfigError(f"{flag}: {path} is not valid YAML ({str(err).splitlines()[0]})") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{flag}: {path} must hold a mapping of options, got {type(data).__name__}")
    for key in data:
        if not isinstance(key, str):
            raise ConfigError(f"{flag}: {path}: option names are strings, got {key!r}")
    return data


_NAMED = ("env", "learner", "driver", "parallel", "matmul_precision")  # taken as written, not read as YAML


def train_options(args: argparse.Namespace) -> dict[str, Any]:
    """Merges --config, flags, --hparam, --learner-config and --set into RunConfig options."""
    options = _load_yaml(args.config) if args.config else {}
    for flag, field in _FLAGS.items():
        value = getattr(args, flag)
        if value is not None:
            options[field] = _yaml_value(field, value) if field not in _NAMED \
                else value
    for key, pairs in (("hparams", args.hparam), ("learner_config", args.learner_config)):
        if pairs:
            merged = dict(options.get(key) or {}) if isinstance(options.get(key) or {}, dict) else {}
            merged.update((name, _yaml_value(f"{key}.{name}", text)) for name, text in pairs)
            options[key] = merged
    args.set = [(name, _yaml_value(name, text)) for name, text in args.set]  # YAML values, one-line errors

    options.update(dict(args.set))
    if args.schedule is not None:
        from popjax.drivers.schedule import schedule_options
        from popjax.registry import DRIVERS

        replaying = [name for name, d in DRIVERS.items() if "schedule" in d.options.model_fields]
        driver = options.get("driver", replaying[0])  # the drivers whose options replay a schedule
        if driver not in replaying:
            raise ConfigError(f"driver: --schedule trains without PBT (allowed: {', '.join(replaying)}), got "
                              f"{driver!r}")
        options["driver"] = driver
        options[driver] = schedule_options(_load_yaml(args.schedule, "--schedule"), args.schedule)
    if args.preset is not None:
        options["preset"] = args.preset
    if args.no_progress:
        options["progress"] = False
    return options


def _print_results(run) -> None:
    """A results table: one row per member, columns for the hparams that differ between members."""
    from popjax import distributed

    if not distributed.is_writer():  # a multi-process job prints its results once, from process 0
        return
    from rich.console import Console
    from rich.table import Table

    s = run.summary
    hparams = s["hparams"]
    varying = [n for n, values in hparams.items() if len(set(values)) > 1]
    shared = ", ".join(f"{n}={values[0]:.4g}" for n, values in hparams.items() if n not in varying)
    title = (f"{s['learner']} on {s['env']} · {s['driver']} · pop {s['pop_size']} · "
                        f"{s['env_steps']:,} env steps/member · {s['wall_s']:.0f} s (+{s['compile_s']:.0f} s compile)")
    table = Table()
    table.add_column("member", justify="right")
    table.add_column("final return", justify="right")
    for name in varying:
        table.add_column(name, justify="right")
    costs = {name: values for name, values in s.get("costs", {}).items() if name in COST_COLUMNS}
    for name in costs:
        table.add_column(COST_COLUMNS[name], justify="right")
    for m, ret in enumerate(s["final_returns"]):
        table.add_row(str(m), f"{ret:.1f}", *(f"{hparams[n][m]:.4g}" for n in varying),
                      *(f"{values[m]:.3g}x" for values in costs.values()))
    console = Console()
    if not console.is_terminal or console.width < table_width(table, console):
        # A log file or a narrow terminal: render at the table's natural width, never cut numbers to "0.00…".
        console = Console(width=table_width(table, console), soft_wrap=True)
    console.print(title, style="bold")
    console.print(table)
    if shared:
        console.print(f"shared hparams: {shared}")
    console.print(f"best return {s['best_return']:.1f} · run directory [bold]{run.out_dir}[/bold]")


def _print_plan(args: argparse.Namespace, options: dict[str, Any]) -> int:
    """``popjax train --plan``: the plan on stdout, nothing written; a run that cannot fit: the plan, then its
    one-line refusal (``ConfigError``, exit 2)."""
    from popjax.experiment import plan
    from popjax.planning import DoesNotFit

    if not args.plan:
        raise ConfigError("peak_flops: only with --plan (the FLOP/s the plan's update time is predicted at)")
    try:
        run_plan = plan(peak_flops=args.peak_flops, **options)
    except DoesNotFit as err:
        print(err.plan.text())
        raise
    print(run_plan.text())
    return 0


# The learner costs (summary.json "costs") the results table shows, as reductions against the dense model.
COST_COLUMNS = {"size_reduction": "size /", "train_flops_reduction": "train FLOPs /",
                "inference_flops_reduction": "inference FLOPs /"}


def table_width(table, console) -> int:
    """The width ``table`` needs to show every cell in full."""
    return console.measure(table, options=console.options.update(max_width=100_000)).maximum


def main(argv: list[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as exit_:  # --help (0), or a usage error already printed as one line (2)
        return exit_.code if isinstance(exit_.code, int) else 0
    try:
        if args.command in ("train", "resume"):
            _join_job(args)
        if args.command == "train":
            from popjax.experiment import train

            options = train_options(args)
            if args.plan or args.peak_flops is not None:
                return _print_plan(args, options)
            out = args.out or Path("runs") / f"{options.get('learner', 'td3')}-{options.get('env', 'default')}"
            _print_results(train(out_dir=str(out).replace(":", "_"), overwrite=args.overwrite,
                                 compile_cache=args.compile_cache, **options))
        elif args.command == "resume":
            from popjax.experiment import resume

            _print_results(resume(args.run_dir, compile_cache=args.compile_cache,
                                  **({"progress": False} if args.no_progress else {})))
        elif args.command == "sweep":
            _run_sweep(args)
        elif args.command == "pbt-schedule":
            from popjax.experiment import pbt_schedule

            print(pbt_schedule(args.run_dir, args.out))
        elif args.command == "plot":
            from popjax.experiment import plot_run

            for path in plot_run(args.run_dir):
                print(path)
        elif args.command == "export":
            from popjax.export import export_policy, read_meta

            path = export_policy(args.run_dir, args.out, args.member)
            meta = read_meta(path)
            print(f"{path}: member {meta['member']} of {meta['learner']} on {meta['env']}, "
                  f"{meta['active_weights']:,} of {meta['dense_weights']:,} weights")
        elif args.command == "compare":
            from popjax.comparison import compare

            reference = _load_yaml(args.reference, "--reference") if args.reference else None
            result = compare(args.run_dirs, label=args.label, baseline=args.baseline, out=args.out,
                             reference=reference, score=args.score)
            print(result.text, end="")
            for path in result.written:
                print(path)
        elif args.command == "export-returns":
            from popjax.comparison import export_returns

            print(export_returns(args.run_dir, args.out, args.format, args.algorithm))
        elif args.command == "bench":
            return bench_plugin().main(args)
    except ConfigError as err:
        print(f"popjax: error: {err}", file=sys.stderr)
        return 2
    except InteractionFailed as err:  # an env raised or hung: the run stopped with a checkpoint
        print(f"popjax: error: {err}", file=sys.stderr)
        return 1
    except (FileNotFoundError, ValueError) as err:
        if args.command in ("plot", "resume", "export", "compare", "export-returns", "pbt-schedule"):  # bad run dir
            print(f"popjax: error: {err}", file=sys.stderr)
            return 2
        raise
    except OSError as err:  # the file system failed a write (read-only, full, a file in the way): one line
        kept = "; the last checkpoint is kept: `popjax resume` continues once this is fixed" \
            if args.command in ("train", "resume") else ""
        print(f"popjax: error: {err.filename or 'file system'}: {err.strerror or err}{kept}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
