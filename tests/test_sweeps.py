"""``popjax sweep`` (issue 47): Optuna trials asked pop_size at a time and trained as one population.

The sweeps train TD3 on ``probe:pendulum`` at tiny sizes (a few hundred env steps); values are checked against the
members' returns measured by the compiled evaluation itself (recorded through ``instrument``), never against the
sweep's own bookkeeping.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import jax
import numpy as np
import pytest

optuna = pytest.importorskip("optuna")

from popjax import cli  # noqa: E402
from popjax.config import ConfigError  # noqa: E402
from popjax.population.search_spaces import SEARCH_SPACES  # noqa: E402
from popjax.rundir import RunLock  # noqa: E402
from popjax.sweeps import OWNER, requeue_interrupted, resume_sweep, sweep  # noqa: E402
from popjax.sweeps.options import objective_value  # noqa: E402
from popjax.sweeps.slots import trial_key  # noqa: E402
from popjax.sweeps.space import distributions, resolve_space  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
TINY = dict(learner="td3", env="probe:pendulum", total_env_steps=200, rollout_len=50, warmup_steps=100,
            eval_interval=100, eval_episodes=1, batch_size=16, buffer_size=500, learner_config={"hidden": [8, 8]},
            progress=False)
SPACE = {"actor_lr": {"type": "float", "low": 1e-4, "high": 1e-2, "log": True},
         "policy_delay": {"type": "int", "low": 1, "high": 3},
         "discount": {"type": "categorical", "choices": [0.9, 0.95, 0.99]}}


class Recorder:
    """An ``instrument`` that keeps every evaluation's returns and every refill's inputs and outputs (host copies,
    taken before the call donates its state)."""

    def __init__(self):
        self.evaluations, self.refills = [], []

    def __call__(self, name, program):
        if name == "evaluate":
            def evaluate(*args):
                out = program(*args)
                self.evaluations.append(np.asarray(jax.device_get(out)))
                return out
            return evaluate
        if name == "refill":
            def refill(key, state, mask, hparams, trials, new_generation):
                before = jax.device_get((state.learner, state.buffer))
                out = program(key, state, mask, hparams, trials, new_generation)
                after = jax.device_get((out.learner, out.buffer, out.hparams))
                self.refills.append({"mask": np.asarray(mask), "trials": np.asarray(trials), "before": before,
                                     "after": after, "new_generation": bool(new_generation)})
                return out
            return refill
        return program


@pytest.fixture(scope="module")
def eight(tmp_path_factory):
    """A sweep of 8 TD3 trials, pop 8 (one population), recorded."""
    recorder = Recorder()
    out = tmp_path_factory.mktemp("sweeps") / "eight"
    result = sweep(out_dir=out, pop_size=8, n_trials=8, search_space=SPACE, instrument=recorder, **TINY)
    return result, recorder


def test_eight_trials_are_completed_in_sqlite_with_the_members_measured_objectives(eight):
    result, recorder = eight
    study = optuna.load_study(study_name=result.study.study_name, storage=f"sqlite:///{result.out_dir / 'study.db'}")
    trials = study.get_trials()
    assert [t.state for t in trials] == [optuna.trial.TrialState.COMPLETE] * 8
    final = recorder.evaluations[-1]  # one population: every trial's last evaluation is the last call
    assert len(recorder.evaluations) == 2  # at 100 and 200 env steps
    for t in trials:
        slot = t.user_attrs["slot"]
        assert t.value == pytest.approx(float(final[slot]), abs=0)
        assert t.user_attrs["env_steps"] == 200 and t.user_attrs["updates"] == 100  # after 100 warm-up steps
        assert [r for _, r in t.user_attrs["evaluations"]] == [float(e[slot]) for e in recorder.evaluations]
    # the population trained each trial's own hparams
    (generation,) = recorder.refills
    hp = generation["after"][2]
    for t in trials:
        slot = t.user_attrs["slot"]
        assert float(hp.actor_lr[slot]) == np.float32(t.params["actor_lr"])
        assert int(hp.policy_delay[slot]) == t.params["policy_delay"]
        assert float(hp.discount[slot]) == np.float32(t.params["discount"])
    assert sorted(t.user_attrs["slot"] for t in trials) == list(range(8))
    assert set(result.traces.values()) == {1}  # nothing was traced twice


def test_outputs_best_yaml_is_a_runnable_config_of_the_best_trial(eight):
    result, _ = eight
    out = result.out_dir
    best = max(result.study.get_trials(), key=lambda t: t.value)
    options = cli._load_yaml(out / "best.yaml")
    assert options["hparams"] == best.params and options["pop_size"] == 1 and "search_space" not in options
    from popjax.config import make_config

    assert make_config(**options).hparams == best.params  # a valid popjax train config
    assert set(json.loads((out / "importances.json").read_text())) == set(SPACE)
    for name in ("optimization_history.png", "parallel_coordinates.png"):
        assert (out / "plots" / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    rows = (out / "trials.csv").read_text().splitlines()
    assert len(rows) == 9 and rows[0].startswith("number,state,value")


class PruneTrial(optuna.pruners.BasePruner):
    """Prunes the given trial numbers at their first report."""

    def __init__(self, numbers):
        self.numbers = set(numbers)

    def prune(self, study, trial):
        return trial.number in self.numbers


def test_a_pruned_slot_is_refilled_in_place_with_fresh_params_and_nothing_recompiles(tmp_path):
    recorder = Recorder()
    opts = {**TINY, "total_env_steps": 300}
    result = sweep(out_dir=tmp_path / "s", pop_size=2, n_trials=3, search_space=SPACE, pruner=PruneTrial({0}),
                   instrument=recorder, **opts)
    trials = {t.number: t for t in result.study.get_trials()}
    states = {n: t.state.name for n, t in trials.items()}
    assert states == {0: "PRUNED", 1: "COMPLETE", 2: "COMPLETE"}
    refill = recorder.refills[1]  # after the generation's own
    assert not refill["new_generation"] and refill["mask"].tolist() == [True, False]
    assert refill["trials"][0] == 2
    # the new member's hparams are its trial's
    hp = refill["after"][2]
    assert float(hp.actor_lr[0]) == np.float32(trials[2].params["actor_lr"])
    assert int(hp.policy_delay[0]) == trials[2].params["policy_delay"]
    # its params are freshly initialised from the trial's key (not the pruned member's); slot 1 is untouched
    from popjax.config import make_config, make_learner_config
    from popjax.envs import registry
    from popjax.learners import LEARNERS

    config = make_config(**opts, pop_size=2)
    learner = LEARNERS["td3"].make(make_learner_config(config), registry.env_spec("probe:pendulum"))
    fresh = jax.jit(learner.init)(trial_key(0, 2), None)
    (before_learner, before_buffer), (after_learner, after_buffer, _) = refill["before"], refill["after"]
    for new, expect, old in zip(jax.tree.leaves(after_learner), jax.tree.leaves(fresh), jax.tree.leaves(before_learner),
                                strict=True):
        # to float32 rounding: an init compiled inside the refill program and alone can differ in the last bit,
        # depending on which XLA flags the process compiled its eager ops with before (test order)
        np.testing.assert_allclose(new[0], np.asarray(expect), rtol=1e-6, atol=1e-7)
        np.testing.assert_array_equal(new[1], old[1])
    pairs = zip(jax.tree.leaves(after_learner.actor), jax.tree.leaves(before_learner.actor), strict=True)
    assert not all(np.array_equal(new[0], old[0]) for new, old in pairs)
    # its replay slice is empty again; the other member's is kept
    assert int(after_buffer.size[0]) == 0 and int(after_buffer.size[1]) == int(before_buffer.size[1]) > 0
    # budgets: trial 2 started at 100 env steps of the population (after the warm-up) and trained its own 300
    t2 = trials[2].user_attrs
    assert (t2["slot"], t2["refilled"], t2["start_env_steps"], t2["env_steps"]) == (0, True, 100, 300)
    assert t2["updates"] == 300  # no warm-up left for a refilled member: 6 iterations x 50 updates
    assert trials[1].user_attrs["env_steps"] == 300 and trials[1].user_attrs["updates"] == 200
    assert trials[0].user_attrs["env_steps"] == 100 and trials[0].intermediate_values == {
        100: pytest.approx(float(recorder.evaluations[0][0]), abs=0)}
    assert set(result.traces.values()) == {1} and result.traces["refill"] == 1


def test_objectives_final_last_k_and_auc():
    returns = [1.0, 2.0, 6.0, 3.0]
    assert objective_value("final", 3, returns) == 3.0
    assert objective_value("last_k", 2, returns) == 4.5
    assert objective_value("last_k", 9, returns) == 3.0
    assert objective_value("auc", 3, returns) == 3.0


def test_optuna_words_become_optuna_distributions():
    from popjax.learners import LEARNERS

    space = distributions(resolve_space(SPACE, "td3", LEARNERS["td3"]))
    d = optuna.distributions
    assert space["actor_lr"] == d.FloatDistribution(1e-4, 1e-2, log=True)
    assert space["policy_delay"] == d.IntDistribution(1, 3)
    assert space["discount"] == d.CategoricalDistribution([0.9, 0.95, 0.99])


def _bad_space(tmp_path, space):
    path = tmp_path / "space.yaml"
    path.write_text(json.dumps(space))
    return ["--space", str(path)]


@pytest.mark.parametrize("case, expected", [
    ("unknown_hparam", "search_space.foo: unknown hparam (allowed: "),
    ("empty_range", "search_space.actor_lr.high: must be >= low"),
    ("structural", "search_space.hidden: a static option of td3"),
    ("storage", "storage: 'nosuchdb://x/y' is not a usable SQLAlchemy URL"),
    ("sampler", "sampler: 'annealing' unknown (allowed: tpe, cmaes, random, qmc, gp)"),
    ("pruner", "pruner: 'patient' unknown (allowed: none, median, successive_halving, hyperband)"),
])
def test_bad_input_is_one_line_exit_2_and_nothing_written(tmp_path, capsys, case, expected):
    spaces = {"unknown_hparam": {"foo": {"low": 0, "high": 1}},
              "empty_range": {"actor_lr": {"type": "float", "low": 1e-2, "high": 1e-4}},
              "structural": {"hidden": {"low": 8, "high": 16}}}  # a static option takes a list of choices
    args = _bad_space(tmp_path, spaces[case]) if case in spaces else {
        "storage": ["--storage", "nosuchdb://x/y"], "sampler": ["--sampler", "annealing"],
        "pruner": ["--pruner", "patient"]}[case]
    out = tmp_path / "sweep"
    code = cli.main(["sweep", "--out", str(out), "--steps", "200", "--warmup", "100", "--rollout-len", "50",
                     "--eval-interval", "100", "--pop", "2", "--no-progress", *args])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1 and expected in err, err
    assert not out.exists()


def test_a_sweep_directory_in_use_is_refused(eight):
    result, _ = eight
    with RunLock(result.out_dir), pytest.raises(ConfigError, match="is in use by pid"):
        resume_sweep(result.out_dir)


def test_interrupted_trials_are_failed_and_requeued_other_sweeps_trials_untouched(tmp_path):
    study = optuna.create_study(storage=f"sqlite:///{tmp_path / 's.db'}", direction="maximize")
    dist = {"x": optuna.distributions.FloatDistribution(0, 1)}
    done, killed, other = study.ask(dist), study.ask(dist), study.ask(dist)
    for trial, owner in ((done, "me"), (killed, "me"), (other, "them")):
        trial.set_user_attr(OWNER, owner)
    study.tell(done, 1.0)
    assert requeue_interrupted(study, "me") == [killed.number]
    by_number = {t.number: t for t in study.get_trials()}
    assert by_number[done.number].state.name == "COMPLETE" and by_number[done.number].value == 1.0
    assert by_number[killed.number].state.name == "FAIL" and by_number[other.number].state.name == "RUNNING"
    assert len(study.get_trials(states=(optuna.trial.TrialState.WAITING,))) == 1
    again = study.ask(dist)  # the next trial asked is the re-queued one
    assert again.params == by_number[killed.number].params and again.user_attrs["requeued_from"] == killed.number


def _sweep_command(out, *extra):
    return [sys.executable, "-m", "popjax", "sweep", "--out", str(out), "--learner", "td3", "--env", "probe:pendulum",
            "--rollout-len", "50", "--warmup", "100", "--eval-interval", "100", "--eval-episodes", "1",
            "--batch-size", "16", "--buffer-size", "2000", "--learner-config", "hidden=[8, 8]", *extra]


def _states(db, name="popjax-td3-probe:pendulum"):
    try:
        study = optuna.load_study(study_name=name, storage=f"sqlite:///{db}")
    except KeyError:  # not created yet
        return []
    return study.get_trials()


@pytest.mark.long
@pytest.mark.processes
@pytest.mark.parametrize("static", [False, True], ids=["traced", "static_hidden"])
def test_kill_mid_generation_then_resume(tmp_path, static):
    """static_hidden: hidden over two values, so the second generation is the second group's population; the
    re-queued trials train in it (their hidden is its own)."""
    out = tmp_path / "sweep"
    extra = []
    if static:
        (tmp_path / "space.yaml").write_text(json.dumps({"actor_lr": SPACE["actor_lr"],
                                                         "hidden": {"choices": [[8], [16, 16]]}}))
        extra = ["--space", str(tmp_path / "space.yaml")]
    # 4,000 env steps a trial: the second generation must outlast a poll of the study (a quiet machine trained
    # 1,500 in less, and the kill found all four trials complete)
    proc = subprocess.Popen(_sweep_command(out, "--pop", "2", "--trials", "4", "--steps", "4000", *extra),
                            cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.time() + 300
    while time.time() < deadline:  # the second generation is running once two trials completed
        trials = _states(out / "study.db") if (out / "study.db").exists() else []
        states = [t.state.name for t in trials]
        if states.count("COMPLETE") == 2 and states.count("RUNNING") == 2:
            break
        assert proc.poll() is None, proc.stderr.read().decode()
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    before = {t.number: t for t in _states(out / "study.db")}
    completed = {n: (t.value, t.params) for n, t in before.items() if t.state.name == "COMPLETE"}
    running = {n: t.params for n, t in before.items() if t.state.name == "RUNNING"}
    assert len(completed) == 2 and len(running) == 2
    if static:  # group 0 done, group 1 killed
        assert [p["hidden"] for _, p in completed.values()] == ["[8]"] * 2
        assert [p["hidden"] for p in running.values()] == ["[16, 16]"] * 2
    done = subprocess.run([sys.executable, "-m", "popjax", "sweep", "--resume", str(out), "--no-progress"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    after = {t.number: t for t in _states(out / "study.db")}
    for n, (value, params) in completed.items():  # unchanged
        assert (after[n].state.name, after[n].value, after[n].params) == ("COMPLETE", value, params)
    for n, params in running.items():  # failed, and trained again from their start as new trials
        assert after[n].state.name == "FAIL"
        (again,) = [t for t in after.values() if t.user_attrs.get("requeued_from") == n]
        assert again.state.name == "COMPLETE" and again.params == params and again.user_attrs["env_steps"] == 4000
    assert sum(t.state.name == "COMPLETE" for t in after.values()) == 4  # exactly the requested trials


@pytest.mark.processes
def test_two_processes_share_one_sqlite_study(tmp_path):
    url = f"sqlite:///{tmp_path / 'shared.db'}"
    procs = [subprocess.Popen(_sweep_command(tmp_path / f"s{i}", "--pop", "2", "--trials", "2", "--steps", "200",
                                             "--storage", url, "--study", "shared", "--seed", str(i)),
                              cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE) for i in range(2)]
    for proc in procs:
        assert proc.wait(timeout=600) == 0, proc.stderr.read().decode()
    trials = _states(tmp_path / "shared.db", "shared")
    owners = {t.user_attrs[OWNER] for t in trials}
    assert len(trials) == 4 and len(owners) == 2 and all(t.state.name == "COMPLETE" for t in trials)


def _open_after(barrier, url, results):
    from popjax.sweeps import _open_storage

    barrier.wait()
    try:
        _open_storage(url)
        results.put("ok")
    except ConfigError as err:
        results.put(str(err))


@pytest.mark.processes
def test_processes_opening_one_new_database_at_once_all_succeed(tmp_path):
    """Released together onto a new SQLite file, each process creates the schema; without the retry about a third
    of them failed ("table studies already exists", a duplicate alembic version)."""
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")
    outcomes = []
    for round_ in range(6):
        url, barrier, results = f"sqlite:///{tmp_path / f'r{round_}.db'}", ctx.Barrier(4), ctx.Queue()
        procs = [ctx.Process(target=_open_after, args=(barrier, url, results)) for _ in range(4)]
        for proc in procs:
            proc.start()
        for proc in procs:
            proc.join(timeout=120)
        outcomes += [results.get(timeout=5) for _ in procs]
    assert outcomes == ["ok"] * 24


def test_a_storage_that_is_not_a_schema_race_fails_at_once(monkeypatch):
    from sqlalchemy.exc import OperationalError

    from popjax.sweeps import _open_storage

    calls = []

    def refuse(url, engine_kwargs):
        calls.append(url)
        raise OperationalError("connect", {}, Exception("unable to open database file"))

    monkeypatch.setattr(optuna.storages, "RDBStorage", refuse)
    with pytest.raises(ConfigError, match="^storage: 'sqlite:///x.db' cannot be opened"):
        _open_storage("sqlite:///x.db")
    assert len(calls) == 1


@pytest.mark.long
def test_the_guide_sweep_commands_run(tmp_path, monkeypatch, capsys):
    """docs/tuning.md, "Sweeps": the YAML space (block 1) as space.yaml, then the CLI block (block 0) in order with
    the tiny flags (a finished sweep resumed trains nothing more), then the Python block (block 2) at tiny sizes."""
    from docs_blocks import TINY_OPTIONS, block, commands, tiny_argv
    from learner_helpers import use_shared_xla_cache

    import popjax

    use_shared_xla_cache()
    monkeypatch.chdir(tmp_path)
    (tmp_path / "space.yaml").write_text(block("docs/tuning.md", "Sweeps", 1).text)
    for command in commands(block("docs/tuning.md", "Sweeps", 0)):
        assert cli.main(tiny_argv(command.argv)) == 0, (command.argv, capsys.readouterr().err[-2000:])
    for name, space in (("td3", set(SEARCH_SPACES["td3"])), ("td3-space", {"actor_lr", "critic_lr", "policy_delay",
                                                                         "discount"})):
        trials = _states(tmp_path / "sweeps" / name / "study.db")
        assert sum(t.state.name in ("COMPLETE", "PRUNED") for t in trials) == 32, name
        assert all(set(t.params) == space for t in trials)
        assert (tmp_path / "sweeps" / name / "best.yaml").exists()
    sweep_ = popjax.sweep
    monkeypatch.setattr(popjax, "sweep", lambda **kw: sweep_(**{**kw, **TINY_OPTIONS, "rollout_len": 25}))
    namespace = {}
    exec(compile(block("docs/tuning.md", "Sweeps", 2).text, "docs/tuning.md", "exec"), namespace)
    assert namespace["result"].best.value == max(t.value for t in namespace["result"].study.get_trials()
                                                 if t.state.name == "COMPLETE")


def test_the_top_trials_are_retrained_as_runs_and_compared(tmp_path, monkeypatch, capsys):
    """docs/tuning.md, "Comparing the top trials": a finished sweep resumed with --top 3 --top-seeds 4 retrains its
    three best completed trials as popjax train runs (the trial's hparams over 4 members) and compares them; the
    comparison's values are the retrained runs' own final returns, paired by seed, the best trial the baseline."""
    from docs_blocks import block, commands, tiny_argv

    monkeypatch.chdir(tmp_path)
    sweep(out_dir="sweeps/td3", pop_size=2, n_trials=4, search_space=SPACE, **TINY)
    (command,) = commands(block("docs/tuning.md", "Comparing the top trials", 0))
    assert cli.main(tiny_argv(command.argv)) == 0, capsys.readouterr().err[-2000:]
    capsys.readouterr()
    out = tmp_path / "sweeps" / "td3"
    study = optuna.load_study(study_name="popjax-td3-probe:pendulum", storage=f"sqlite:///{out / 'study.db'}")
    assert len(study.get_trials()) == 4  # resuming a finished sweep trained no more trials
    best3 = sorted(study.get_trials(), key=lambda t: -t.value)[:3]
    assert sorted(p.name for p in (out / "top").iterdir()) == sorted(f"trial{t.number}" for t in best3)
    finals = {}
    for t in best3:
        run = out / "top" / f"trial{t.number}"
        config = cli._load_yaml(run / "config.yaml")
        assert config["hparams"] == t.params and config["pop_size"] == 4 and config["driver"] == "independent"
        assert (config["total_env_steps"], config["learner_config"]["hidden"]) == (200, [8, 8])  # the sweep's run
        finals[f"trial{t.number}"] = json.loads((run / "summary.json").read_text())["final_returns"]
        assert len(finals[f"trial{t.number}"]) == 4
    report = json.loads((out / "compare" / "compare.json").read_text())
    assert report["label"] == "name" and report["baseline"] == f"trial{best3[0].number}"
    assert [r["group"] for r in report["rows"]] == [f"trial{t.number}" for t in best3]  # best first
    base = finals[report["baseline"]]
    for row in report["rows"]:
        assert row["runs"] == 4 and row["seeds"] == ["0:0", "0:1", "0:2", "0:3"]
        assert row["mean"] == pytest.approx(np.mean(finals[row["group"]]), rel=1e-6)
        if not row["baseline"]:  # paired by seed: the mean of the per-seed differences
            assert row["paired_diff"] == pytest.approx(np.mean(finals[row["group"]]) - np.mean(base), abs=1e-4)
    before = sorted(p.relative_to(out) for p in out.rglob("*"))
    code = cli.main(tiny_argv(command.argv))  # a second retraining is refused: one line, exit 2, nothing written
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1 and "top: " in err and "exists" in err, err
    assert sorted(p.relative_to(out) for p in out.rglob("*")) == before


@pytest.mark.parametrize("top, seeds, expected", [(-1, 4, "top: expected an integer >= 0, got -1"),
                                                  (2, 0, "top_seeds: expected an integer >= 1, got 0")])
def test_a_bad_top_is_refused_before_anything_is_written(tmp_path, top, seeds, expected):
    with pytest.raises(ConfigError, match=expected):
        sweep(out_dir=tmp_path / "s", pop_size=2, n_trials=2, top=top, top_seeds=seeds, **TINY)
    assert not (tmp_path / "s").exists()


def test_a_static_option_trains_one_population_per_value_compiled_once_each(tmp_path):
    """hidden over two choices: the trials of each value train in a population of its own (the networks have the
    trial's widths), each population's programs traced once, and best.yaml puts hidden in learner_config."""
    from popjax.config import make_config
    from popjax.sweeps.space import decode

    recorder = Recorder()
    space = {"actor_lr": SPACE["actor_lr"], "hidden": {"type": "categorical", "choices": [[8], [16, 16]]}}
    result = sweep(out_dir=tmp_path / "s", pop_size=2, n_trials=4, search_space=space, instrument=recorder, **TINY)
    trials = result.study.get_trials()
    assert [t.state.name for t in trials] == ["COMPLETE"] * 4
    assert [decode(t.params["hidden"]) for t in trials] == [[8], [8], [16, 16], [16, 16]]  # one group, then the next
    widths = [{leaf.shape[-1] for leaf in jax.tree.leaves(r["after"][0].actor) if leaf.ndim == 3}
              for r in recorder.refills]
    assert widths == [{8, 1}, {16, 1}]  # kernels [pop, in, out]: hidden widths and the 1-d pendulum action
    assert set(result.traces.values()) == {1} and {k.rpartition("@")[2] for k in result.traces} == {"0", "1"}
    best = max(trials, key=lambda t: t.value)
    options = cli._load_yaml(tmp_path / "s" / "best.yaml")
    assert options["learner_config"]["hidden"] == decode(best.params["hidden"])
    assert options["hparams"] == {"actor_lr": best.params["actor_lr"]}
    assert list(make_config(**options).learner_config["hidden"]) == decode(best.params["hidden"])
    saved = cli._load_yaml(tmp_path / "s" / "sweep.yaml")
    assert saved["static"] == {"hidden": [[8], [16, 16]]} and set(saved["search_space"]) == {"actor_lr"}
    again = resume_sweep(tmp_path / "s")  # finished: both groups are done, nothing trains
    assert len(again.study.get_trials()) == 4 and again.traces == {}
