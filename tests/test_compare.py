"""popjax compare and export-returns on run directories written by popjax's own RunDir (synthetic returns, so
every figure of the table is computed by hand): values, alignment, bad input, and that runs are never touched."""

import csv
import json
from pathlib import Path

import numpy as np
import pytest

import popjax
from popjax import cli, comparison
from popjax.config import ConfigError, make_config
from popjax.rundir import RunDir


def fake_run(path, returns, learner="td3", env="probe:pendulum", driver="independent", seed=0, steps=(100, 200, 300),
             total=300, finished=True, extra_rows=()):
    """A run directory as popjax writes it: ``returns[m][k]`` is member m's return at ``steps[k]`` (a shorter
    list: the member missed the later evaluations)."""
    config = make_config(learner=learner, env=env, driver=driver, seed=seed, pop_size=len(returns),
                         total_env_steps=total, eval_interval=100, warmup_steps=50, rollout_len=50,
                         progress=False).to_dict()
    rd = RunDir(path)
    rd.start()
    rd.write_config(config)
    rows = [{"env_steps": s, "updates": s, "wall_s": 0.5 * s, "member": m, "eval_return": float(r[k])}
            for k, s in enumerate(steps) for m, r in enumerate(returns) if k < len(r)]
    rd.append_metrics(rows + list(extra_rows))
    if finished:
        rd.write_summary({"final_returns": [float(r[-1]) for r in returns]})
    return rd.path


def snapshot(*dirs):
    return {p: (p.stat().st_mtime_ns, p.read_bytes()) for d in dirs for p in Path(d).rglob("*") if p.is_file()}


@pytest.fixture
def three(tmp_path):
    """td3 (seed 0) and two sac runs (seeds 0 and 1), 4 independent members each, final returns by hand."""
    a = fake_run(tmp_path / "td3", [[0, 1, 1], [0, 1, 2], [0, 2, 3], [0, 3, 4]])
    b = fake_run(tmp_path / "sac0", [[0, 1, 2], [0, 2, 3], [0, 3, 4], [0, 4, 5]], learner="sac")
    c = fake_run(tmp_path / "sac1", [[0, 1, 6], [0, 1, 7], [0, 1, 8], [0, 1, 9]], learner="sac", seed=1)
    return a, b, c


def test_the_table_holds_hand_computed_figures(three, tmp_path):
    a, b, _ = three
    before = snapshot(a, b)
    result = popjax.compare([a, b], out=tmp_path / "cmp", reps=2000)
    assert snapshot(a, b) == before  # compare never modifies a run directory
    td3, sac = result.rows
    assert (result.label, result.baseline, result.final_step) == ("learner", "td3", 300)
    assert td3["iqm"] == 2.5 and sac["iqm"] == 3.5  # middle two of 1..4 and 2..5
    assert td3["sd"] == pytest.approx(np.std([1, 2, 3, 4], ddof=1))
    assert sac["p_improvement"] == pytest.approx(11.5 / 16)  # 10 wins and 3 ties out of 16 pairs
    assert sac["paired_diff"] == 1.0 and sac["paired_ci"] == [1.0, 1.0]  # same seeds, every pair +1
    assert td3["ci"][0] <= 2.5 <= td3["ci"][1]
    written = {p.name for p in result.written}
    assert written == {"compare.json", "compare.csv", "curves_env_steps.png", "curves_wall_time.png", "profile.png",
                       "improvement.png"}
    report = json.loads((tmp_path / "cmp" / "compare.json").read_text())
    assert report["rows"][1]["iqm"] == 3.5 and report["baseline"] == "td3"
    with (tmp_path / "cmp" / "compare.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert [(r["group"], float(r["iqm"])) for r in rows] == [("td3", 2.5), ("sac", 3.5)]
    assert "td3" in result.text and "baseline" in result.text and "0.719" in result.text


def test_few_runs_list_their_seeds_instead_of_a_ci(tmp_path):
    a = fake_run(tmp_path / "pbt", [[0, 5], [0, 7], [0, 6], [0, 6]], driver="pbt", steps=(100, 200), total=200)
    b = fake_run(tmp_path / "ind", [[0, 1], [0, 3]], steps=(100, 200), total=200)
    result = popjax.compare([a, b], label="driver", baseline="independent", out=None)
    pbt, ind = result.rows
    assert pbt["runs"] == 1 and pbt["values"] == [6.0] and pbt["ci"] is None  # the population mean, one run
    assert ind["values"] == [1.0, 3.0] and ind["sd"] == pytest.approx(2 ** 0.5)
    assert pbt["p_improvement"] == 1.0 and pbt["p_ci"] is None
    best = popjax.compare([a, b], label="driver", out=None, score="best")
    assert best.rows[0]["values"] == [7.0]


def test_unfinished_resumed_and_gappy_runs_are_read_and_named(tmp_path):
    done = fake_run(tmp_path / "done", [[1, 2, 3]] * 4)
    partial = fake_run(tmp_path / "partial", [[2, 4]] * 4, learner="sac", finished=False)
    again = {"env_steps": 100, "updates": 100, "wall_s": 50.0, "member": 0, "eval_return": 9.0}
    gappy = fake_run(tmp_path / "gappy", [[1, 2, 3], [1, 2, 3], [1, 2, 3], [1, 3]], learner="dqn",
                     env="probe:cartpole", extra_rows=[again])
    result = popjax.compare([done, partial], out=None)
    assert result.final_step == 200 and [r["iqm"] for r in result.rows] == [2.0, 4.0]
    assert any("partial: in progress or stopped at 200 of 300" in n for n in result.notes)
    assert any("env step 200" in n for n in result.notes)
    run = comparison.read_run(gappy)
    assert run.curves[0][0, 2] == 9.0 and any("logged twice" in n for n in run.notes)
    assert any("members [3] miss some evaluations" in n for n in run.notes)


def test_runs_of_different_envs_need_a_reference(tmp_path):
    td3 = [fake_run(tmp_path / "td3p", [[0, 0, -200]] * 4), fake_run(tmp_path / "td3c", [[0, 0, 250]] * 4,
                                                                     env="probe:cartpole")]
    sac = [fake_run(tmp_path / "sacp", [[0, 0, -150]] * 4, learner="sac"),
           fake_run(tmp_path / "sacc", [[0, 0, 500]] * 4, env="probe:cartpole", learner="sac")]
    with pytest.raises(ConfigError, match="different envs"):
        popjax.compare([*td3, *sac], out=None)
    ref = {"probe:pendulum": {"low": -1400, "high": -150}, "probe:cartpole": {"low": 0, "high": 500}}
    with pytest.raises(ConfigError, match="reference: no low/high for probe:pendulum"):
        popjax.compare([*td3, *sac], out=None, reference={"probe:cartpole": ref["probe:cartpole"]})
    with pytest.raises(ConfigError, match=r"group sac has \{'probe:cartpole': 4, 'probe:pendulum': 0\}"):
        popjax.compare([*td3, sac[1]], out=None, reference=ref)
    result = popjax.compare([*td3, *sac], out=None, reference=ref)
    td3_row, sac_row = result.rows
    assert (td3_row["runs"], td3_row["tasks"]) == (4, 2)
    assert td3_row["iqm"] == pytest.approx((0.5 + 0.96) / 2)  # pooled 4 x 0.5 and 4 x 0.96, middle 4
    assert sac_row["iqm"] == 1.0 and sac_row["p_improvement"] == 1.0
    assert result.text.startswith("normalised return")


def fails(argv, capsys, tmp_path, word):
    code = cli.main(argv)
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1 and word in err, err
    assert not (tmp_path / "out").exists()  # nothing written
    return err


def test_bad_input_is_one_line_exit_2_and_nothing_written(three, tmp_path, capsys, monkeypatch):
    a, b, c = map(str, three)
    out = ["--out", str(tmp_path / "out")]
    (tmp_path / "plain").mkdir()
    fails(["compare", a, str(tmp_path / "plain"), *out], capsys, tmp_path, "plain is not a run directory")
    fails(["compare", a, b, "--label", "colour", *out], capsys, tmp_path, "label: 'colour' is not a config key")
    fails(["compare", *out], capsys, tmp_path, "run_dir: no run directories given")
    fails(["compare", b, c, "--label", "learner", "--baseline", "td3", *out], capsys, tmp_path, "baseline: 'td3'")
    twin = fake_run(tmp_path / "twin", [[0, 1, 1]] * 4)  # the same config as td3's
    fails(["compare", a, str(twin), *out], capsys, tmp_path, "label: the runs differ in none of")
    fails(["compare", a, b, a, *out], capsys, tmp_path, "td3 is given twice")
    late = fake_run(tmp_path / "late", [[1, 2]] * 4, learner="sac", steps=(400, 500), total=500)
    fails(["compare", a, str(late), *out], capsys, tmp_path, "evaluations do not overlap")
    fails(["compare", a, b, "--out", a], capsys, tmp_path, "compare never writes there")
    nan = fake_run(tmp_path / "nan", [[1, float("nan"), 2]] * 2)
    err = fails(["compare", a, str(nan), *out], capsys, tmp_path, "eval_return: NaN in")
    assert "nan (member 0 at env step 200)" in err
    damaged = fake_run(tmp_path / "damaged", [[0, 1, 2]] * 4, learner="sac")
    lines = (damaged / "metrics.csv").read_text().splitlines(keepends=True)
    (damaged / "metrics.csv").write_text("".join(lines[:3] + ["200,x\n"] + lines[3:]))
    fails(["compare", a, str(damaged), *out], capsys, tmp_path, "metrics.csv line 4 (2 cells, the header has 5) "
                                                                "cannot be read")


def test_export_returns_round_trips_through_the_marl_eval_layout(tmp_path, monkeypatch):
    path = fake_run(tmp_path / "run", [[1, 2, 3], [4, 5, 6]])
    before = snapshot(path)
    out = popjax.export_returns(path, tmp_path / "returns.json")
    data = json.loads(out.read_text())
    run0 = data["probe"]["pendulum"]["td3"]["seed_0"]
    assert run0["step_1"] == {"step_count": 200, "elapsed_time": 100.0, "mean_episode_return": [2.0]}
    assert run0["absolute_metrics"] == {"mean_episode_return": [3.0]}
    back = comparison.read_marl_eval(out)
    original = comparison.read_run(path).curves
    assert set(back) == {("probe", "pendulum", "td3")}
    for m in (0, 1):
        np.testing.assert_array_equal(back["probe", "pendulum", "td3"][f"seed_{m}"], original[m])
    with pytest.raises(ConfigError, match="never overwrites"):
        popjax.export_returns(path, out)
    monkeypatch.chdir(tmp_path)
    assert cli.main(["export-returns", str(path)]) == 0 and (tmp_path / "run-marl-eval.json").exists()
    broken = json.loads(out.read_text())
    del broken["probe"]["pendulum"]["td3"]["seed_1"]["step_2"]
    (tmp_path / "broken.json").write_text(json.dumps(broken))
    with pytest.raises(ValueError, match="steps differ"):
        comparison.read_marl_eval(tmp_path / "broken.json")
    assert snapshot(path) == before


def test_the_guide_compare_command_runs_on_three_runs(tmp_path, monkeypatch, capsys):
    """docs/experiments.md "Comparing runs": compare and export-returns on three runs (written here; the block
    that trains them is run by tests/test_docs.py)."""
    from docs_blocks import block
    from docs_blocks import commands as block_commands

    commands = [["popjax", *c.argv] for c in block_commands(block("docs/experiments.md", "Comparing runs", 1))]
    assert [c[:2] for c in commands] == [["popjax", "compare"], ["popjax", "export-returns"]]
    monkeypatch.chdir(tmp_path)
    rng = np.random.default_rng(0)
    for path in commands[0][2:5]:  # the guide's three run directories, with a learner and seed each
        learner, seed = Path(path).name.split("-s")
        fake_run(path, rng.normal(-300, 50, (4, 3)).cumsum(1) * -0.5, learner=learner, seed=int(seed))
    assert cli.main(commands[0][1:]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[1].split()[:3] == ["group", "n", "IQM"] and "td3    8" in out and "sac    4" in out
    assert {p.name for p in Path("runs/compare").iterdir()} >= {"compare.json", "curves_env_steps.png",
                                                                "profile.png", "improvement.png"}
    assert cli.main(commands[1][1:]) == 0 and Path(commands[1][-1]).exists()
