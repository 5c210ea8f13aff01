"""One validated schema: every bad input is one line naming the field, exit status 2 (or ``ConfigError``),
and nothing is written, from the CLI, a YAML file, ``popjax.train`` keywords or a ``RunConfig``.

The table covers the classes of bad input (types, integers, ranges, non-finite numbers, unknown
names and keys, per-member lists, search ranges, every driver's options, malformed YAML, config
files that are not YAML, memory); the property test draws random configs: invalid ones fail
before ``popjax.experiment.build`` is reached (so before anything is compiled), valid ones build.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import tempfile
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import jax
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import popjax
from popjax import cli
from popjax.config import RunConfig, check_memory, make_config, make_learner_config, memory_estimate
from popjax.drivers import DRIVERS
from popjax.learners import LEARNERS
from popjax.population.hparams import hparam_bounds
from popjax.schema import ConfigError
from popjax.types import EnvSpec

GIB = 2**30
BASE = ["--no-progress", "--steps", "2000", "--eval-interval", "1000"]


@dataclasses.dataclass(frozen=True)
class Case:
    how: str  # cli | yaml | api | direct
    payload: Any
    field: str  # the line starts with it
    build: bool = False  # caught once the env is known (memory, action kind), not by the schema alone

    def __str__(self):  # stable across processes (xdist workers compare ids): no object addresses
        payload = "RunConfig(...)" if callable(self.payload) else str(self.payload)[:40]
        return f"{self.how}:{self.field}:{payload}"


def cli_case(*argv, field, build=False):
    return Case("cli", list(argv), field, build)


def yaml_case(text, *argv, field):
    return Case("yaml", (text, list(argv)), field)


def api_case(field, build=False, **options):
    return Case("api", options, field, build)


def direct_case(field, make):
    return Case("direct", make, field)


CARTPOLE_DQN = ["--learner", "dqn", "--env", "probe:cartpole"]
CASES = [
    # names
    cli_case("--learner", "ppo2", field="learner"),
    cli_case("--env", "atari:Pong", field="env"),
    cli_case("--env", "gym:NoSuchEnv-v0", field="env"),
    cli_case("--env", "brax:nope", field="env"),
    cli_case("--env", "pendulum", field="env"),
    cli_case("--driver", "magic", field="driver"),
    cli_case("--parallel", "mpi", field="parallel"),
    cli_case("--driver", "cemrl", "--parallel", "pmap", field="parallel"),
    cli_case("--env", "probe:cartpole", field="env", build=True),  # td3 needs continuous actions
    # integers stay integers, ranges, non-finite numbers
    cli_case("--pop", "0", field="pop_size"),
    cli_case("--pop", "2.5", field="pop_size"),
    cli_case("--pop", "-3", field="pop_size"),
    cli_case("--pop", "[1", field="pop_size"),  # malformed YAML in a flag
    cli_case("--steps", "ten", field="total_env_steps"),
    cli_case("--steps", "1e20", field="total_env_steps"),
    cli_case("--seed", "1e20", field="seed"),
    cli_case("--seed", "-1", field="seed"),
    cli_case("--batch-size", "-4", field="batch_size"),
    cli_case("--buffer-size", "1e12", field="buffer_size"),
    cli_case("--buffer-size", "1e9", field="buffer_size", build=True),  # memory estimate (16 GiB machine)
    cli_case("--eval-episodes", "0", field="eval_episodes"),
    cli_case("--set", "eval_episodes=1e9", field="eval_episodes"),
    cli_case("--update-ratio", "0", field="update_ratio"),
    cli_case("--update-ratio", "nan", field="update_ratio"),
    cli_case("--warmup", "5000", field="warmup_steps"),
    cli_case("--rollout-len", "0", field="rollout_len"),
    cli_case("--envs-per-member", "2.5", field="envs_per_member"),
    cli_case("--eval-interval", "-5", field="eval_interval"),
    cli_case("--devices", "0", field="devices"),
    cli_case("--pop", "3", "--devices", "2", field="pop_size"),
    cli_case("--checkpoint-interval", "-1", field="checkpoint_interval"),
    cli_case("--set", "logger=maybe", field="logger"),
    cli_case("--set", "colour=red", field="colour"),
    cli_case("--set", "=3", field="argument --set"),
    # per-member hyperparameters
    cli_case("--hparam", "policy_delay=1.5", field="hparams.policy_delay"),
    cli_case("--hparam", "discount=1.5", field="hparams.discount"),
    cli_case("--hparam", "actor_lr=[1e-4,", field="hparams.actor_lr"),
    cli_case("--hparam", "actor_lr=[0.1, 0.2]", field="hparams.actor_lr"),
    cli_case("--hparam", "nope=1", field="hparams.nope"),
    cli_case("--hparam", "actor_lr=-1", field="hparams.actor_lr"),
    cli_case("--hparam", "actor_lr=[1e-3, 1e-3, abc, 1e-3]", field="hparams.actor_lr[2]"),
    cli_case("--hparam", "tau=.inf", field="hparams.tau"),
    cli_case("--hparam", "exploration_noise=true", field="hparams.exploration_noise"),
    # the learner's static config
    cli_case("--learner-config", "hidden=abc", field="learner_config.hidden"),
    cli_case("--learner-config", "hidden=[64, -1]", field="learner_config.hidden"),
    cli_case("--learner-config", "hidden=[]", field="learner_config.hidden"),
    cli_case("--learner-config", "widths=[3]", field="learner_config.widths"),
    cli_case("--learner-config", "batch_size=64", field="learner_config.batch_size"),
    cli_case(*CARTPOLE_DQN, "--learner-config", "target_update_period=0", field="learner_config.target_update_period"),
    cli_case(*CARTPOLE_DQN, "--learner-config", "dueling=maybe", field="learner_config.dueling"),
    # search spaces and driver options
    cli_case("--set", "search_space={discount: {low: 0.5, high: 1.5}}", field="search_space.discount.high"),
    cli_case("--set", "search_space={policy_delay: {low: 1, high: 5}}", field="search_space.policy_delay.integer"),
    cli_case("--set", "search_space={actor_lr: {low: 1e-3, high: 1e-4}}", field="search_space.actor_lr.high"),
    cli_case("--set", "pbt=[1, 2]", field="pbt"),
    cli_case("--driver", "pbt", "--set", "pbt={quantile: 0.6}", field="pbt.quantile"),
    cli_case("--driver", "pbt", "--set", "pbt={intervall: 5}", field="pbt.intervall"),
    cli_case("--driver", "pbt", "--set", "pbt={interval: 5", field="pbt"),
    cli_case("--driver", "pbt", "--set", "pbt={search_space: ppo3}", field="pbt.search_space"),
    cli_case("--driver", "pbt", "--set", "pbt={search_space: {actor_lr: {low: 0, high: 1e-3, log: true}}}",
             field="pbt.search_space.actor_lr.low"),
    cli_case("--driver", "pbt", "--set", "pbt={explore: mutate}", field="pbt.explore"),
    cli_case("--driver", "cemrl", "--pop", "5", field="pop_size"),
    cli_case("--driver", "cemrl", "--set", "cemrl={updates_per_call: 0}", field="cemrl.updates_per_call"),
    cli_case("--driver", "dvd", "--set", "dvd={jitter: 0}", field="dvd.jitter"),
    cli_case("--driver", "dvd", "--learner", "sac", field="learner"),
    cli_case("--driver", "dvd", "--set", "dvd={schedule_scale: soon}", field="dvd.schedule_scale"),
    # config files
    cli_case("--config", "{tmp}", field="--config"),  # a directory
    cli_case("--config", "{tmp}/missing.yaml", field="--config"),
    cli_case("--config", "{binary}", field="--config"),
    yaml_case("pop_size: [1,\n", field="--config"),
    yaml_case("- 1\n- 2\n", field="--config"),
    yaml_case("1: 2\n", field="--config"),
    yaml_case("pop_size: 0\n", field="pop_size"),
    yaml_case("learner_config:\n  hidden: abc\n", field="learner_config.hidden"),
    yaml_case("hparams: {policy_delay: 1.5}\n", field="hparams.policy_delay"),
    yaml_case("driver: pbt\npbt: {quantile: 0.6}\n", field="pbt.quantile"),
    yaml_case("driver: dvd\ndvd: {bandit_arms: [0.5]}\n", field="dvd.bandit_arms"),
    yaml_case("driver: cemrl\ncemrl: {n_elite: 2}\n", field="cemrl.n_elite"),
    yaml_case("seed: 1e20\n", field="seed"),
    yaml_case("search_space: {actor_lr: {low: 1e-4}}\n", field="search_space.actor_lr.high"),
    yaml_case("colour: red\n", field="colour"),
    yaml_case("logger: [tensorboard, mlflow]\n", field="logger"),
    yaml_case("hparams: [1, 2]\n", field="hparams"),
    yaml_case("pop_size: 4\n", "--pop", "0", field="pop_size"),  # the flag overrides the file
    # a key written without a value, or twice, meant something: never the default or the last value
    yaml_case("pop_size:\n", field="pop_size"),
    yaml_case("learner: null\n", field="learner"),
    yaml_case("driver: pbt\npbt:\n", field="pbt"),
    yaml_case("pop_size: 2\nseed: 1\npop_size: 4\n", field="pop_size"),
    yaml_case("driver: pbt\npbt:\n  interval: 1000\n  interval: 2000\n", field="pbt.interval"),
    cli_case("--set", "pbt={interval: 1000, interval: 2000}", field="pbt.interval"),
    api_case("env", env=None),
    api_case("learner", learner=None),
    api_case("hparams", hparams=None),
    api_case("pbt", driver="pbt", pbt=None),
    # Python keywords
    api_case("pop_size", pop_size=-1),
    api_case("pop_size", pop_size=True),
    api_case("seed", seed=2**31),
    api_case("total_env_steps", total_env_steps=math.inf),
    api_case("hparams.actor_lr", hparams={"actor_lr": math.nan}),
    api_case("hparams.actor_lr", hparams={"actor_lr": 1e-50}),  # 0 as a float32
    api_case("hparams.policy_delay[2]", hparams={"policy_delay": [1, 2, 2.5, 3]}),
    api_case("learner_config.hidden", learner_config={"hidden": (64, 0)}),
    api_case("learner_config.target_update_period", learner="dqn", env="probe:cartpole",
             learner_config={"target_update_period": 0}),
    api_case("pbt.perturb_factors", driver="pbt", pbt={"perturb_factors": [1.0]}),
    api_case("pbt.quantile", driver="pbt", pbt={"quantile": 0.1}),
    api_case("pbt.copy_buffer", driver="pbt", pbt={"copy_buffer": "yes"}),
    api_case("dvd.thresholds", driver="dvd", dvd={"thresholds": [3, 2, 1], "weights": [0, 0, 0, 0]}),
    api_case("dvd.weights", driver="dvd", dvd={"thresholds": [1, 2], "weights": [0.1]}),
    api_case("cemrl.n_trained", driver="cemrl", cemrl={"n_trained": 9}),
    api_case("independent.x", independent={"x": 1}),
    api_case("pbt.intervall", pbt={"intervall": 1}),  # the block of a driver not in use: its keys
    api_case("nope", driver_options={"nope": {}}),
    api_case("env", env=5),
    api_case("search_space.actor_lr", search_space={"actor_lr": [1e-4, 1e-3]}),
    api_case("search_space.actor_lr", hparams={"actor_lr": 1e-3},
             search_space={"actor_lr": {"low": 1e-4, "high": 1e-3}}),
    api_case("buffer_size", build=True, buffer_size=10**9),
    # the members' params and optimizer states (TD3 256 x 256: 3.3 MB each) are most of the 16 GiB machine's need
    api_case("pop_size", build=True, pop_size=65_536, buffer_size=1_000, eval_episodes=10_000),
    api_case("eval_episodes", build=True, pop_size=65_536, buffer_size=1, batch_size=1, rollout_len=1,
             eval_episodes=10_000, learner_config={"hidden": [1]}),  # tiny members: their evaluation is most of it
    api_case("update_ratio", total_env_steps=2**30, update_ratio=1000),
    api_case("total_env_steps", driver="dvd", pop_size=4, total_env_steps=2**30),
    # a RunConfig passed to popjax.train (or built and replaced) is the same schema
    direct_case("pop_size", lambda: RunConfig(pop_size=-1)),
    direct_case("hparams.discount", lambda: RunConfig(hparams={"discount": 2.0})),
    direct_case("pbt.quantile", lambda: RunConfig(driver="pbt", driver_options={"pbt": {"quantile": 0.6}})),
    direct_case("seed", lambda: dataclasses.replace(RunConfig(), seed=-5)),
    direct_case("learner_config.hidden", lambda: RunConfig(learner_config={"hidden": "64,64"})),
]


def snapshot(root: Path) -> dict[str, bytes | None]:
    """Every path under ``root`` with its bytes (None for directories)."""
    return {str(p.relative_to(root)): None if p.is_dir() else p.read_bytes() for p in sorted(root.rglob("*"))}


def attempt(case: Case, out: Path, tmp: Path, capsys) -> str:
    """Runs the case; returns its error line (and checks the CLI's exit status and streams)."""
    if case.how in ("cli", "yaml"):
        if case.how == "yaml":
            argv = ["--config", str(tmp / "config.yaml"), *case.payload[1]]
        else:
            argv = [a.replace("{tmp}", str(tmp)).replace("{binary}", str(tmp / "binary.yaml")) for a in case.payload]
        capsys.readouterr()
        status = cli.main(["train", "--out", str(out), *BASE, *argv])
        captured = capsys.readouterr()
        assert status == 2, captured
        assert captured.out == "" and captured.err.count("\n") == 1 and "Traceback" not in captured.err, captured
        assert captured.err.startswith("popjax: error: ")
        return captured.err[len("popjax: error: "):].rstrip("\n")
    with pytest.raises(ConfigError) as err:
        if case.how == "api":
            popjax.train(out_dir=out, **{"progress": False, **case.payload})
        else:
            popjax.train(case.payload(), out_dir=out)
    assert isinstance(err.value, ValueError)
    return str(err.value)


def variants():
    for i, case in enumerate(CASES):
        yield pytest.param(case, "missing", id=f"{i}-{case}-missing")
        if not case.build:  # schema errors come before anything looks at --out
            yield pytest.param(case, "existing", id=f"{i}-{case}-existing")


def test_the_table_has_at_least_60_bad_inputs():
    assert len(CASES) >= 60
    assert {case.how for case in CASES} == {"cli", "yaml", "api", "direct"}


@pytest.mark.parametrize(("case", "variant"), list(variants()))  # a list: pytest deprecates generators
def test_bad_input_is_one_line_naming_the_field_and_nothing_is_written(case, variant, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("popjax.config.machine_memory", lambda: 16 * GIB)
    (tmp_path / "binary.yaml").write_bytes(bytes(range(256)) * 4)
    existing = tmp_path / "existing"
    existing.mkdir()
    (existing / "notes.txt").write_text("not popjax's\n")
    if case.how == "yaml":
        (tmp_path / "config.yaml").write_text(case.payload[0])
    out = existing / "run" if variant == "missing" else existing
    before = snapshot(tmp_path)

    line = attempt(case, out, tmp_path, capsys)

    assert "\n" not in line
    assert line.startswith(f"{case.field}:") or line.startswith(f"{case.field} "), line
    assert snapshot(tmp_path) == before  # byte for byte
    assert variant == "existing" or not out.exists()


# --- the messages themselves ---------------------------------------------------------------------
@pytest.mark.parametrize(("options", "message"), [
    ({"driver": "pbt", "pbt": {"quantile": 0.6}}, "pbt.quantile: must lie in (0, 0.5], got 0.6"),
    ({"hparams": {"policy_delay": 1.5}}, "hparams.policy_delay: expected an integer in [1, 1000000], got 1.5"),
    ({"learner_config": {"hidden": "abc"}},
     "learner_config.hidden: expected a list of positive integers (1 to 32 layers of at most 65536 units), got 'abc'"),
    ({"seed": "1e20"}, "seed: must lie in [0, 2147483647], got 1e+20"),
    ({"learner": "ppo3"}, f"learner: 'ppo3' unknown (allowed: {', '.join(LEARNERS)})"),
    ({"learner": "dqn", "env": "probe:cartpole", "learner_config": {"target_update_period": 0}},
     "learner_config.target_update_period: must lie in [1, 1000000000], got 0"),
    ({"search_space": {"actor_lr": {"low": 1e-4, "high": 1e-3, "lg": True}}},
     "search_space.actor_lr.lg: unknown key (allowed: low, high, log, integer, choices)"),
    ({"hparams": {"actor_lr": [1e-3, 1e-3, -1, 1e-3]}}, "hparams.actor_lr[2]: must lie in (0, 1], got -1.0"),
    ({"learner_config": {"widths": [3]}}, "learner_config.widths: unknown key (allowed: hidden, fixed_policy_delay)"),
])
def test_messages_say_the_field_the_problem_and_what_is_allowed(options, message):
    with pytest.raises(ConfigError) as err:
        make_config(**options)
    assert str(err.value) == message


def test_integers_stay_integers_and_numbers_come_in_any_spelling():
    config = make_config(total_env_steps="1e4", pop_size=4.0, seed="7", buffer_size=1e5, update_ratio="0.5",
                         hparams={"policy_delay": 3.0, "actor_lr": "3e-4"}, learner_config={"hidden": [8, 8.0]},
                         driver="pbt", pbt={"interval": "2e3"})
    assert (config.total_env_steps, config.pop_size, config.seed, config.buffer_size) == (10_000, 4, 7, 100_000)
    assert all(type(v) is int for v in (config.total_env_steps, config.pop_size, config.seed, config.buffer_size))
    assert config.update_ratio == 0.5
    assert config.hparams == {"policy_delay": 3, "actor_lr": 3e-4} and type(config.hparams["policy_delay"]) is int
    assert config.learner_config == {"hidden": [8, 8]} and config.options == {"interval": 2000}
    assert make_config(**config.to_dict()) == config  # config.yaml round-trips to the same config


def test_every_learner_declares_bounds_on_every_hparam_field():
    for definition in LEARNERS.values():
        bounds = hparam_bounds(definition.hparams_cls)
        assert set(bounds) == {f.name for f in dataclasses.fields(definition.hparams_cls)}
        defaults = jax.device_get(definition.default_hparams(None))
        for name, number in bounds.items():
            number.convert(getattr(defaults, name).item())  # the defaults are allowed


def test_an_hparams_class_without_declared_bounds_is_refused():
    from flax import struct

    @struct.dataclass
    class Loose:
        lr: jax.Array

    with pytest.raises(TypeError, match="lr declare no allowed values"):
        hparam_bounds(Loose)


def test_memory_estimate_names_the_field_and_the_largest_allowed_value():
    spec = EnvSpec("probe:pendulum", (3,), action_dim=1, action_low=(-2.0,), action_high=(2.0,), max_episode_steps=200)
    config = make_config(buffer_size=10**9)
    assert memory_estimate(config, spec)["row"] == 2 * 12 + 4 + 8
    with pytest.raises(ConfigError, match=r"^buffer_size: 4 replay buffers of 1000000000 transitions \(36 B each\) "
                                          r"need about 134\.1 GB, more than this machine's 16\.0 GB of memory "
                                          r"\(allowed: at most about \d+ transitions per member\)$"):
        check_memory(config, spec, memory=16 * GIB)
    most = int(str(pytest.raises(ConfigError, check_memory, config, spec, memory=16 * GIB).value).split()[-4])
    check_memory(make_config(buffer_size=most), spec, memory=16 * GIB)  # the largest allowed value fits
    shared = make_config(driver="dvd", buffer_size=10**9)
    with pytest.raises(ConfigError, match=r"^buffer_size: a replay buffer of 1000000000 transitions"):
        check_memory(shared, spec, memory=16 * GIB)
    with pytest.raises(ConfigError, match=r"^eval_episodes: 4 members x 10000 episodes evaluated at once"):
        check_memory(make_config(eval_episodes=10_000), spec, memory=64 * 2**20)
    check_memory(make_config(), spec, memory=16 * GIB)


def test_driver_options_are_the_drivers_own_schemas():
    for name, definition in DRIVERS.items():
        options = definition.parse_options(make_config(driver=name, pop_size=4))
        assert isinstance(options, definition.options)
    pbt = DRIVERS["pbt"].parse_options(make_config(driver="pbt", pop_size=8, total_env_steps=100_000))
    assert pbt.interval == 10_000 and pbt.pbt_config().space["policy_delay"].integer
    assert DRIVERS["cemrl"].parse_options(make_config(driver="cemrl", pop_size=6)).n_trained == 3


# --- the CLI -------------------------------------------------------------------------------------
def test_train_help_shows_meaning_default_and_allowed_values_of_every_option(capsys):
    assert cli.main(["train", "--help"]) == 0
    text = capsys.readouterr().out
    flat = " ".join(text.split())
    for phrase in ("members in the population (default: 4; allowed: an integer in [1, 65536])",
                   f"(default: td3; allowed: one of {', '.join(LEARNERS)})",
                   "(default: independent; allowed: one of independent, pbt, cemrl, dvd, hts)",
                   "gym:<id> (HalfCheetah-v5", "brax:<name>[@backend]", "probe:<name> (pendulum",
                   "quantile fraction replaced at the bottom", "(default: 0.3; allowed: a number in (0, 0.5])",
                   "policy_delay critic steps per actor and target step (int32) (default: 2; allowed: an integer",
                   "target_update_period updates between two hard copies of the target network (default: 500",
                   "logger where every metric also goes: tensorboard"):
        assert phrase in flat, phrase
    parser = cli.build_parser()
    train = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices["train"]
    train.format_help()  # fills in the help texts from the schema
    for action in train._actions:
        if action.dest in cli._FLAGS:
            assert "default: " in action.help and "allowed: " in action.help


def test_bench_help_lists_the_studies(capsys):
    assert cli.main(["bench", "--help"]) == 0
    text = capsys.readouterr().out
    from popjax_bench import STUDIES

    assert all(study in text for study in STUDIES)
    assert cli.main(["bench", "update", "--help"]) == 0 and "--impl" in capsys.readouterr().out


@pytest.mark.parametrize(("argv", "message"), [
    (["update", "--learner", "ppo"], "--learner: 'ppo' unknown learner (allowed: td3, sac, dqn)"),
    (["update", "--impl", "vmap,fast"], "--impl: 'fast' unknown implementation (allowed: vmap, vmap_scan"),
    (["roofline", "--impl", "jax_seq"], "--impl: 'jax_seq' unknown implementation (allowed: vmap, vmap_scan)"),
    (["shared_critic", "--impl", "fast"], "--impl: 'fast' unknown implementation"),
    (["drivers", "--driver", "magic"], "--driver: 'magic' unknown driver"),
    (["drivers", "--env", "gym:Pendulum-v1"], "--env: 'gym:Pendulum-v1' is a gymnasium env"),
    (["train", "--env", "probe:nope"], "--env: env 'probe:nope' unknown"),
    (["envstep", "--brax", "nope"], "--brax: env 'brax:nope' unknown"),
    (["update", "--pop", "2.5"], "--pop: expected a comma-separated list of positive integers, got '2.5'"),
    (["update", "--devices", "0"], "--devices: expected a comma-separated list of positive integers"),
    (["compile", "--min-time", "nan"], "--min-time: expected a finite number >= 0, got nan"),
    (["per", "--branching", "2,1"], "--branching: a sum tree needs K >= 2, got 1"),
    (["per", "--capacity", "1e7"], "--capacity: at most 2097151"),
    (["update", "--out", "{file}"], "--out: {file} is an existing file, not a directory"),
    (["update", "--out", "{file}/deeper"], "--out: {file} is an existing file, not a directory"),
    (["update", "--out", "{dir}/update.json"], "--out: {dir}/update.json is a directory"),
    (["update", "--out", "{tmp}/mine.json"], "--out: {tmp}/mine.json exists and is not a popjax benchmark result"),
    (["update", "--out", "{tmp}/theirs.json"], "--out: {tmp}/theirs.png exists and is not a popjax benchmark result"),
    (["update", "--out", "/proc/popjax"], "--out: /proc is not writable"),
    (["report", "--results", "{tmp}/none"], "--results: {tmp}/none is not a directory"),
    (["report", "--results", "{tmp}", "--output", "{tmp}/notes.md"],
     "--output: {tmp}/notes.md exists and is not a popjax benchmark result"),
])
def test_bench_checks_its_options_before_timing_anything(argv, message, tmp_path, capsys, monkeypatch):
    import popjax_bench as bench

    real = bench._module  # the implementation names come from the study modules; no study may run
    monkeypatch.setattr(bench, "_module", lambda study: SimpleNamespace(
        IMPLS=getattr(real(study), "IMPLS", ()), main=lambda args: pytest.fail("a study ran")))
    (tmp_path / "file").write_text("keep\n")
    (tmp_path / "mine.json").write_text('{"my": "data"}\n')
    (tmp_path / "theirs.png").write_bytes(b"a picture")  # no study result beside it
    (tmp_path / "notes.md").write_text("# my notes\n")  # not a report
    (tmp_path / "dir" / "update.json").mkdir(parents=True)
    fill = lambda s: s.replace("{file}", str(tmp_path / "file")).replace("{dir}", str(tmp_path / "dir")).replace(
        "{tmp}", str(tmp_path))
    before = snapshot(tmp_path)
    assert cli.main(["bench", *map(fill, argv)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and fill(message) in err, err
    assert snapshot(tmp_path) == before


def test_internal_errors_keep_their_traceback(monkeypatch, tmp_path):
    def broken(**kwargs):
        raise RuntimeError("a bug")

    monkeypatch.setattr("popjax.experiment.train", broken)
    with pytest.raises(RuntimeError, match="a bug"):
        cli.main(["train", "--out", str(tmp_path / "run")])


# --- property test: random configs ------------------------------------------------------------------
def number_in(number, integer_cap: int = 8, float_cap: float = 4.0):
    """A strategy of values allowed by a declared ``Number`` (kept small)."""
    if number.integer:
        low = int(number.ge if number.ge is not None else 0)
        return st.integers(low, min(int(number.le if number.le is not None else integer_cap), low + integer_cap))
    low = number.ge if number.ge is not None else (number.gt if number.gt is not None else -float_cap)
    high = number.le if number.le is not None else (number.lt if number.lt is not None else float_cap)
    high = min(high, low + float_cap)
    return st.floats(max(low, 1e-6) if number.gt is not None else low, high, allow_nan=False)


@st.composite
def valid_options(draw) -> dict[str, Any]:
    driver = draw(st.sampled_from(["independent", "pbt", "cemrl", "dvd"]))
    learner = "td3" if driver in ("cemrl", "dvd") else draw(st.sampled_from(["td3", "sac", "dqn"]))
    env = "probe:cartpole" if learner == "dqn" else "probe:pendulum"
    pop = draw(st.sampled_from([2, 4, 6]) if driver in ("cemrl", "pbt") else st.integers(2, 5))
    total = draw(st.integers(200, 2_000))
    rollout = draw(st.integers(1, 50))
    envs = draw(st.integers(1, 2))
    batch = draw(st.integers(1, 64))
    low_buffer = max(batch, rollout * envs, pop * envs * 500 if driver == "cemrl" else 0)
    options = dict(learner=learner, env=env, driver=driver, pop_size=pop, total_env_steps=total,
                   warmup_steps=draw(st.integers(0, total - 1)), rollout_len=rollout, envs_per_member=envs,
                   batch_size=batch, buffer_size=draw(st.integers(low_buffer, low_buffer + 5_000)),
                   eval_interval=draw(st.integers(1, total)), eval_episodes=draw(st.integers(1, 3)),
                   seed=draw(st.integers(0, 2**31 - 1)), update_ratio=draw(st.floats(0.01, 2.0)),
                   learner_config={"hidden": draw(st.lists(st.integers(1, 16), min_size=1, max_size=2))})
    bounds = hparam_bounds(LEARNERS[learner].hparams_cls)
    chosen = draw(st.lists(st.sampled_from(sorted(bounds)), unique=True, max_size=3))
    hparams = {}
    for name in chosen:
        one = number_in(bounds[name])
        value = draw(st.one_of(one, st.lists(one, min_size=pop, max_size=pop)))
        spelled = draw(st.sampled_from(["as is", "string"]))
        hparams[name] = str(value) if spelled == "string" and not isinstance(value, list) else value
    options["hparams"] = hparams
    free = [n for n in sorted(bounds) if n not in hparams]
    if free and draw(st.booleans()):
        name = draw(st.sampled_from(free))
        a, b = sorted(draw(st.lists(number_in(bounds[name]), min_size=2, max_size=2)))
        options["search_space"] = {name: {"low": a, "high": b, "integer": bounds[name].integer}}
    if driver == "pbt":
        options["pbt"] = {"quantile": 0.5, "explore": draw(st.sampled_from(["resample", "perturb"]))}
    if driver == "dvd":
        options["dvd"] = {"weight_source": draw(st.sampled_from(["schedule", "bandit"])), "schedule_scale": "auto"}
    return options


# Each mutation makes any valid options invalid; the message must name the field it changed.
MUTATIONS = [
    ("pop_size", lambda o: {**o, "pop_size": 0}),
    ("pop_size", lambda o: {**o, "pop_size": 2.5}),
    ("seed", lambda o: {**o, "seed": -1}),
    ("seed", lambda o: {**o, "seed": 2**31}),
    ("total_env_steps", lambda o: {**o, "total_env_steps": "many"}),
    ("warmup_steps", lambda o: {**o, "warmup_steps": o["total_env_steps"]}),
    ("batch_size", lambda o: {**o, "batch_size": True}),
    ("buffer_size", lambda o: {**o, "buffer_size": 1e12}),
    ("eval_episodes", lambda o: {**o, "eval_episodes": 1e9}),
    ("update_ratio", lambda o: {**o, "update_ratio": math.inf}),
    ("learner", lambda o: {**o, "learner": "ppo3"}),
    ("env", lambda o: {**o, "env": "atari:Pong"}),
    ("driver", lambda o: {**o, "driver": "magic"}),
    ("colour", lambda o: {**o, "colour": "red"}),
    ("learner_config.hidden", lambda o: {**o, "learner_config": {"hidden": "abc"}}),
    ("learner_config.widths", lambda o: {**o, "learner_config": {"widths": [3]}}),
    ("hparams.discount", lambda o: {**o, "hparams": {**o["hparams"], "discount": 1.5}}),
    ("hparams.nope", lambda o: {**o, "hparams": {**o["hparams"], "nope": 1}}),
    ("hparams.discount", lambda o: {**o, "hparams": {**o["hparams"], "discount": [0.9] * (o["pop_size"] + 1)}}),
    ("search_space.discount.high", lambda o: {
        **o, "hparams": {k: v for k, v in o["hparams"].items() if k != "discount"},
        "search_space": {"discount": {"low": 0.5, "high": 2.0}}}),
    ("progress", lambda o: {**o, "progress": "maybe"}),
]


@st.composite
def invalid_options(draw) -> tuple[str, dict[str, Any]]:
    field, mutate = draw(st.sampled_from(MUTATIONS))
    return field, mutate(draw(valid_options()))


@settings(max_examples=60, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(invalid_options())
def test_random_invalid_configs_fail_before_anything_is_built_or_compiled(case):
    field, options = case
    reached = []
    with pytest.MonkeyPatch.context() as mp, tempfile.TemporaryDirectory() as tmp:
        mp.setattr("popjax.experiment.build", lambda config: reached.append("build"))
        mp.setattr(jax, "jit", lambda *a, **k: reached.append("jit"))
        out = Path(tmp) / "run"
        with pytest.raises(ConfigError) as err:
            popjax.train(out_dir=out, **{"progress": False, **options})
        assert not out.exists() and not list(Path(tmp).iterdir())
    message = str(err.value)
    assert "\n" not in message and message.startswith(f"{field}:"), (message, options)
    assert reached == []


@pytest.mark.long
@settings(max_examples=12, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(valid_options())
def test_random_valid_configs_build(options):
    from popjax.experiment import build

    config = make_config(**options)
    loop = build(config)  # env, learner, hparams, driver and loop; nothing is compiled yet
    assert loop.config == config and loop.members.size == config.pop_size
    assert make_config(**config.to_dict()) == config


@pytest.mark.parametrize("learner", list(LEARNERS))
def test_every_key_the_learner_config_message_allows_is_accepted(learner):
    """The unknown-key message lists what learner_config really takes: no run option (batch_size) that
    would then be refused as set by the run (issue 29, item 8)."""
    with pytest.raises(ConfigError) as err:
        make_config(learner=learner, learner_config={"no_such_key": 1})
    line = str(err.value)
    assert line.startswith("learner_config.no_such_key: unknown key (allowed: "), line
    allowed = line.split("(allowed: ", 1)[1].rstrip(")").split(", ")
    defaults = make_learner_config(make_config(learner=learner))
    run_fields = {f.name for f in dataclasses.fields(RunConfig)}
    for key in allowed:
        assert key not in run_fields, line
        make_config(learner=learner, learner_config={key: getattr(defaults, key)})  # accepted


def test_a_run_over_several_processes_uses_every_device_of_the_job_by_default(monkeypatch):
    """Issue 29, item 1: no --devices over several processes means every device of the job (the only value
    allowed there); one process keeps the default 1, and devices given are kept (and checked by build)."""
    from popjax import distributed

    assert make_config(pop_size=4).devices == 1
    job = 2 * jax.device_count()  # 2 processes with this process's devices each
    monkeypatch.setattr(distributed, "processes", lambda: 2)
    monkeypatch.setattr(jax, "device_count", lambda backend=None: job)
    assert make_config(pop_size=4 * job).devices == job
    assert make_config(pop_size=4 * job, devices=1).devices == 1
    assert make_config(**make_config(pop_size=4 * job).to_dict()).devices == job  # config.yaml keeps it


def _learner_choices() -> list[tuple[str, str, Any, str]]:
    """(learner, learner_config key, value, probe env): every value of every boolean and choice option of every
    registered learner (read from its Config schema), on each probe env whose action kind it accepts."""
    from popjax import schema

    cases = []
    for name, definition in LEARNERS.items():
        envs = [env for env, discrete in (("probe:pendulum", False), ("probe:cartpole", True))
                if definition.action_kind in ("any", "discrete" if discrete else "continuous")]
        for key, field in schema.schema_fields(definition.config_cls).items():
            kind = schema.kind_of(field)
            values = (True, False) if isinstance(kind, schema.Flag) else \
                kind.allowed() if isinstance(kind, schema.Choice) else ()
            cases += [(name, key, value, env) for value in values for env in envs]
    return cases


@pytest.mark.parametrize(("learner", "key", "value", "env"), _learner_choices())
def test_learner_options_fit_the_env_or_are_refused_when_built(learner, key, value, env):
    """Issue 29, item 4: a learner option that cannot work with the env is refused by ``build`` with one line naming
    ``learner_config.<key>``, not by a JAX traceback when the networks are first traced. A combination that builds
    initialises, acts and evaluates on the env's observations (traced abstractly: nothing is compiled)."""
    from popjax import schema
    from popjax.envs import registry
    from popjax.experiment import build

    definition = LEARNERS[learner]
    tiny = {k: [8] for k, f in schema.schema_fields(definition.config_cls).items()
            if isinstance(schema.kind_of(f), schema.NumberList)}
    # the replay source the learner's preset picks for the env (memr_sac's start states need theirs)
    source = {k: v for k, v in definition.presets.get(env, {}).items() if k == "buffer"}
    config = make_config(learner=learner, env=env, pop_size=1, total_env_steps=200, warmup_steps=20,
                         rollout_len=20, batch_size=8, buffer_size=1_000, **source,
                         learner_config={**tiny, key: value})
    try:
        build(config)
    except ConfigError as err:
        message = str(err)
        # an option that conflicts with the run's replay source (memr_sac's start states) is named at the source
        fields = (f"learner_config.{key}: ", "buffer: ") if "buffer" in source else (f"learner_config.{key}: ",)
        assert "\n" not in message and message.startswith(fields), message
        return
    spec = registry.env_spec(env)
    learner_config = make_learner_config(config)
    made = definition.make(learner_config, spec)
    hparams = definition.default_hparams(learner_config)
    key_ = jax.random.key(0)
    state = jax.eval_shape(made.init, key_, hparams)
    obs = jax.ShapeDtypeStruct((2, *spec.obs_shape), jax.numpy.float32)
    jax.eval_shape(made.act, key_, state, obs, hparams)
    jax.eval_shape(made.policy, state, obs)


def test_a_convolutional_torso_on_vector_observations_is_one_line_and_nothing_written(tmp_path, capsys):
    from popjax.networks.mlp import NatureTorso, nature_torso_problem

    out = tmp_path / "run"
    code = cli.main(["train", "--learner", "dqn", "--env", "probe:cartpole", "--learner-config", "cnn=true",
                     "--out", str(out), "--no-progress"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "\n" not in err, err
    assert err.startswith("popjax: error: learner_config.cnn: ") and "(allowed: false)" in err, err
    assert not out.exists()
    # the check is the torso's own limit: smaller frames than 36 x 36 leave it no feature (or fail to trace)
    torso = NatureTorso()
    for shape, fits in (((84, 84, 4), True), ((36, 36, 1), True), ((35, 84, 4), False), ((84, 84), False)):
        assert (nature_torso_problem(shape) is None) == fits, shape
        try:
            obs = jax.ShapeDtypeStruct((1, *shape), "float32")
            params = jax.eval_shape(torso.init, jax.random.key(0), obs)
            features = jax.eval_shape(torso.apply, params, obs).shape[-1]
        except (ValueError, TypeError, ZeroDivisionError):  # rank or size the convolutions cannot take
            features = 0
        assert (features > 0) == fits, shape
