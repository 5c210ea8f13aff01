"""The ``popjax`` command: train | resume | bench | plot.

User errors (bad options, unknown names, unreadable config files) print one line and exit
with status 2, never a traceback.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import yaml

from popjax.config import ConfigError

# CLI flag -> RunConfig field (flags not listed use the field name with dashes).
_FLAGS = {
    "learner": "learner", "env": "env", "driver": "driver", "pop": "pop_size", "seed": "seed",
    "steps": "total_env_steps", "envs_per_member": "envs_per_member", "rollout_len": "rollout_len",
    "update_ratio": "update_ratio", "warmup": "warmup_steps", "batch_size": "batch_size",
    "buffer_size": "buffer_size", "eval_interval": "eval_interval", "eval_episodes": "eval_episodes",
    "devices": "devices", "parallel": "parallel", "checkpoint_interval": "checkpoint_interval",
}


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # argparse's own usage errors: one line, exit 2
        self.exit(2, f"popjax: error: {message}\n")


def _key_value(text: str) -> tuple[str, Any]:
    if "=" not in text:
        raise argparse.ArgumentTypeError(f"expected name=value, got {text!r}")
    name, value = text.split("=", 1)
    return name.strip(), yaml.safe_load(value)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="popjax", description="Train populations of deep-RL agents fast.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    train = sub.add_parser("train", help="train a population and write a run directory")
    train.add_argument("--config", type=Path, help="YAML file with any RunConfig option (flags override it)")
    train.add_argument("--out", type=Path, default=None, help="run directory (default runs/<learner>-<env>)")
    for flag in _FLAGS:
        train.add_argument("--" + flag.replace("_", "-"), dest=flag, default=None)
    train.add_argument("--hparam", action="append", type=_key_value, default=[], metavar="NAME=VALUE",
                       help="per-member hparam: a value for all members or a list [v1, v2, ...] (repeatable)")
    train.add_argument("--learner-config", action="append", type=_key_value, default=[], metavar="KEY=VALUE",
                       help="static learner option, e.g. hidden=[64,64] (repeatable)")
    train.add_argument("--set", action="append", type=_key_value, default=[], metavar="OPTION=VALUE",
                       help="any other RunConfig option, e.g. pbt={interval: 5000} (repeatable)")
    train.add_argument("--no-progress", action="store_true", help="no progress bar")
    train.add_argument("--preset", default=None, choices=("auto", "none"),
                       help="auto (default): tuned rl-zoo values for known learner/env pairs fill the options not "
                            "given (see popjax/presets.py); none: the library's bare defaults")
    train.add_argument("--overwrite", action="store_true",
                       help="replace the run in --out (only a directory popjax created; only its own files go)")

    resume = sub.add_parser("resume", help="continue a killed or finished run from its last checkpoint")
    resume.add_argument("run_dir", type=Path)
    resume.add_argument("--no-progress", action="store_true")

    plot = sub.add_parser("plot", help="(re)draw the plots of a run directory")
    plot.add_argument("run_dir", type=Path)

    # The benchmark parser is built only when `bench` runs: it imports heavier optional modules.
    bench = sub.add_parser("bench", help="speed benchmarks (see benchmarks/RESULTS.md)", add_help=False)
    bench.add_argument("bench_args", nargs=argparse.REMAINDER)
    return parser


def _bench(argv: list[str]) -> int:
    from popjax import bench as bench_module

    parser = _Parser(prog="popjax bench", description="Speed benchmarks; each study writes JSON and a plot.")
    bench_module.add_arguments(parser)
    return bench_module.main(parser.parse_args(argv))


def _load_yaml(path: Path) -> dict[str, Any]:
    try:
        data = yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"--config: file {path} not found") from None
    except yaml.YAMLError as err:
        raise ConfigError(f"--config: {path} is not valid YAML ({str(err).splitlines()[0]})") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"--config: {path} must hold a mapping of options, got {type(data).__name__}")
    return data


def train_options(args: argparse.Namespace) -> dict[str, Any]:
    """Merges --config, flags, --hparam, --learner-config and --set into RunConfig options."""
    options = _load_yaml(args.config) if args.config else {}
    for flag, field in _FLAGS.items():
        value = getattr(args, flag)
        if value is not None:
            options[field] = yaml.safe_load(value) if field not in ("env", "learner", "driver", "parallel") else value
    for key, _flag, pairs in (("hparams", "--hparam", args.hparam), ("learner_config", "--learner-config",
                                                                       args.learner_config)):
        if pairs:
            merged = dict(options.get(key) or {})
            merged.update(pairs)
            options[key] = merged
    options.update(dict(args.set))
    if args.preset is not None:
        options["preset"] = args.preset
    if args.no_progress:
        options["progress"] = False
    return options


def _print_results(run) -> None:
    """A results table: one row per member, columns for the hparams that differ between members."""
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
    for m, ret in enumerate(s["final_returns"]):
        table.add_row(str(m), f"{ret:.1f}", *(f"{hparams[n][m]:.4g}" for n in varying))
    console = Console()
    if not console.is_terminal or console.width < table_width(table, console):
        # A log file or a narrow terminal: render at the table's natural width, never cut numbers to "0.00…".
        console = Console(width=table_width(table, console), soft_wrap=True)
    console.print(title, style="bold")
    console.print(table)
    if shared:
        console.print(f"shared hparams: {shared}")
    console.print(f"best return {s['best_return']:.1f} · run directory [bold]{run.out_dir}[/bold]")


def table_width(table, console) -> int:
    """The width ``table`` needs to show every cell in full."""
    return console.measure(table, options=console.options.update(max_width=100_000)).maximum


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.command == "train":
            from popjax.experiment import train

            options = train_options(args)
            out = args.out or Path("runs") / f"{options.get('learner', 'td3')}-{options.get('env', 'default')}"
            _print_results(train(out_dir=str(out).replace(":", "_"), overwrite=args.overwrite, **options))
        elif args.command == "resume":
            from popjax.experiment import resume

            _print_results(resume(args.run_dir, **({"progress": False} if args.no_progress else {})))
        elif args.command == "plot":
            from popjax.experiment import plot_run

            for path in plot_run(args.run_dir):
                print(path)
        elif args.command == "bench":
            return _bench(args.bench_args)
    except ConfigError as err:
        print(f"popjax: error: {err}", file=sys.stderr)
        return 2
    except (FileNotFoundError, ValueError) as err:
        if args.command in ("plot", "resume"):  # bad run directory
            print(f"popjax: error: {err}", file=sys.stderr)
            return 2
        raise
    return 0


if __name__ == "__main__":
    sys.exit(main())
