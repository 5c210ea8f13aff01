"""The benchmark suite at tiny sizes: every study writes valid JSON with its documented fields (load,
busy stamp, the machine's ceilings measured in the same run, at least 10 timed calls per point),
the load discipline, the targets file driving the report, the memory-fit search, and the PyTorch
reference learners computing the same losses as the JAX learners (equal work)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from popjax.learners import dqn, sac, td3
from popjax.learners.base import one_update
from popjax.types import EnvSpec, Transition
from popjax_bench import common, compile, drivers, envstep, per, report, roofline, shared_critic, train, update
from popjax_bench import torch_reference as tr

TINY = dict(hidden=(16, 16), repeats=10, min_time=0.0, seed=0)
needs_torch = pytest.mark.skipif(not tr.available(), reason=tr.TORCH_ERROR or "")
QUIET = [0.1, 0.1, 0.1]


@pytest.fixture(scope="module", autouse=True)
def quiet_machine():
    """The in-process studies see a quiet machine (another process may load this one while the tests run)
    and measure their dense-matmul peak on a small product; the load tests below fake a busy one."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(common, "load_average", lambda: list(QUIET))
        mp.setattr(common, "others_cpu_share", lambda since: 0.0)
        mp.setattr(common, "PEAK_N", 128)
        yield


def positive(x) -> bool:
    return isinstance(x, int | float) and math.isfinite(x) and x > 0


def load(path, layers: bool = True):
    """A study's JSON: the common layout, the sitting (quiet, load, ceilings) and its PNG."""
    data = json.loads(path.read_text())
    for key in ("study", "started_utc", "finished_utc", "machine", "params", "results", "notes", "busy",
                "load_before", "load_after", "load", "ceilings"):
        assert key in data, key
    m = data["machine"]
    for key in ("cpu", "cpu_count", "jax", "jaxlib", "backend", "devices", "device_count", "load_average"):
        assert key in m, key
    assert m["jax"] == jax.__version__
    assert data["busy"] is False and data["busy_reasons"] == [] and data["load_before"] == QUIET
    peak = data["ceilings"]["dense_matmul"]
    assert peak["n"] == 128 and positive(peak["before"]["gflops"]) and positive(peak["after"]["gflops"])
    assert peak["before"]["timing"]["repeats"] >= 10
    if layers:  # the N×[B,h]@[h,h] ceiling of the workload's dominant layer
        assert data["ceilings"]["layers"] and all(positive(r["gflops"]) for r in data["ceilings"]["layers"])
    if data["params"].get("plot", True) and path.with_suffix(".png").exists():
        assert path.with_suffix(".png").stat().st_size > 1000
    return data


@pytest.fixture(scope="module")
def out(tmp_path_factory):
    return tmp_path_factory.mktemp("bench")


@pytest.fixture(scope="module")
def fake_memory():
    """A device memory of 2 tiny TD3 members (the memory-fit search stays short)."""
    p = update.problem("td3", (16, 16), 8, 2)
    limit = update.population_memory(p, 2)["program_bytes"]
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(common, "device_memory_limit", lambda device=None: (limit, "fake limit (test)"))
        yield limit


@pytest.fixture(scope="module")
def update_json(out, fake_memory):
    impls = ("vmap", "vmap_scan", "jax_seq") + (("torch_seq",) if tr.available() else ())
    update.run(learners=("td3",), pops=(2,), impls=impls, batch_size=8, k=2, out_dir=out, memory_fit=True, **TINY)
    return load(out / "update.json")


@pytest.mark.long
def test_update_study_fields(update_json):
    rows = update_json["results"]
    impls = {r["impl"] for r in rows}
    assert {"vmap", "vmap_scan", "jax_seq"} <= impls
    for r in rows:
        assert "skipped" not in r, r
        assert r["learner"] == "td3" and r["pop"] == 2 and r["devices"] == 1
        assert positive(r["ms_per_pop_step"]) and positive(r["ms_per_member_step"])
        # At least 10 timed calls at every point, K-step calls included; median and IQR reported.
        assert r["timing"]["repeats"] >= 10 and len(r["timing"]["times_s"]) == r["timing"]["repeats"]
        assert all(positive(t) for t in r["timing"]["times_s"]) and r["ms_per_pop_step_iqr"] >= 0
        assert r["memory"]["rss_peak_mb"] >= r["memory"]["rss_start_mb"] > 0
        assert positive(r["speedup_vs_jax_seq"])
        if r["impl"] != "torch_seq":
            assert positive(r["compile_s"])
        if r["impl"] == "vmap_scan":
            assert r["steps_per_call"] == 2
        if r["impl"].startswith("vmap"):  # throughput against the ceilings measured in the same run
            assert positive(r["gflops"]) and positive(r["layer_gflops"]) and positive(r["peak_gflops"])
            assert r["fraction_of_layer"] == pytest.approx(r["gflops"] / r["layer_gflops"])
    (layer,) = update_json["ceilings"]["layers"]
    assert (layer["pop"], layer["batch"], layer["width"], layer["devices"]) == (2, 8, 16, 1)
    if tr.available():
        assert all(positive(r["speedup_vs_torch_seq"]) for r in rows)
        assert {r["torch_threads"] for r in rows if r["impl"] == "torch_seq"} == {1, 2}  # the default 1,2
    assert update_json["params"]["problems"]["td3"]["config"]["hidden"] == [16, 16]
    assert update_json["params"]["torch_threads"] == [1, 2]


def test_update_reports_the_largest_population_that_fits(update_json, fake_memory):
    fit = update_json["memory_fit"]["td3"]
    assert fit["limit_bytes"] == fake_memory and fit["limit_source"] == "fake limit (test)"
    # The limit is the memory of the 2-member program: 1 and 2 fit, 4 does not, bisection between them ends at 2.
    assert fit["largest_pop"] == 2 and fit["program_bytes"] <= fake_memory
    tried = {r["pop"]: r for r in fit["tried"]}
    assert [r["pop"] for r in fit["tried"]] == [1, 2, 4, 3]  # doubling, then bisection
    assert tried[fit["first_too_large"]]["program_bytes"] > fake_memory and fit["first_too_large"] == 3
    assert all(r["fits"] == (r["program_bytes"] <= fake_memory) for r in fit["tried"])
    assert 0 < fit["state_bytes"] < fit["program_bytes"]


def test_memory_fit_search_with_a_given_limit(update_json):
    p = update.problem("td3", (16, 16), 8, 2)  # the update study's problem: its analyses are cached
    one, three, four = (update.population_memory(p, n)["program_bytes"] for n in (1, 3, 4))
    assert one < three < four  # memory grows with N
    fit = update.largest_population(p, limit_bytes=three)
    assert fit["largest_pop"] == 3 and fit["first_too_large"] == 4
    assert update.largest_population(p, limit_bytes=one - 1)["largest_pop"] == 0  # not even one member fits


@pytest.mark.long
def test_per_point_budget_skips_larger_n_never_times_fewer_calls(tmp_path):
    payload = update.run(learners=("td3",), pops=(1, 2, 4), impls=("vmap",), batch_size=8, k=2,
                         max_seconds=1e-6, memory_fit=False, out_dir=tmp_path, plot=False, **TINY)
    measured = [r for r in payload["results"] if "skipped" not in r]
    skipped = [r for r in payload["results"] if "skipped" in r]
    assert [r["pop"] for r in measured] == [1] and measured[0]["timing"]["repeats"] >= 10
    assert [r["pop"] for r in skipped] == [2, 4]
    assert all("10 timed calls > --max-seconds" in r["skipped"] for r in skipped)


def test_timing_never_stops_below_the_minimum_count():
    calls = []
    stats = common.time_calls(lambda: calls.append(1), warmup=0, min_repeats=10, min_time=0.0, sync=lambda _: None)
    assert stats["repeats"] == 10 == len(calls) and stats["iqr_s"] >= 0
    out = common.time_interleaved([(lambda: None, lambda _: None, 10), (lambda: None, lambda _: None, 12)],
                                  min_time=0.0, max_repeats=3)
    assert [s["repeats"] for s in out] == [10, 12]


@needs_torch
def test_update_study_dqn_cnn_torch(out):
    update.run(learners=("dqn",), pops=(1,), impls=("torch_seq",), frame=36, hidden=(16,), batch_size=4,
               k=2, repeats=10, min_time=0.0, memory_fit=False, out_dir=out / "dqn")
    rows = load(out / "dqn" / "update.json", layers=False)["results"]  # DQN: no dense-layer ceiling
    assert {r["impl"] for r in rows} == {"torch_seq"}
    assert all(positive(r["ms_per_pop_step"]) for r in rows)


def test_roofline_study_fields(out, update_json):
    # Same problem and N as the update study: the compiled update is reused (execution is what is timed).
    roofline.run(learners=("td3",), pops=(2,), batch_size=8, k=2, matmul_sizes=(64,), out_dir=out, **TINY)
    data = load(out / "roofline.json")
    assert positive(data["matmul"]["1"]["peak_gflops"])
    (row,) = data["results"]
    assert row["vmap"]["timing"]["repeats"] >= 10 and row["vmap"]["ms_per_pop_step_iqr"] >= 0
    assert row["fraction_of_layer"] == pytest.approx(row["gflops"] / row["layer_gflops"])
    assert positive(row["xla_flops_per_pop_step"]) and positive(row["analytic_flops_per_pop_step"])
    # XLA counts the matmuls plus elementwise work: never fewer FLOPs than the analytic matmul count.
    assert 0.9 < row["xla_over_analytic"] < 3.0
    assert positive(row["gflops"]) and positive(row["fraction_of_peak"]) and positive(row["layer_gflops"])


def test_analytic_flops_scale_with_width():
    small = roofline.analytic_flops(update.problem("td3", (16, 16), 8))["per_member_step"]
    big = roofline.analytic_flops(update.problem("td3", (32, 32), 8))["per_member_step"]
    assert 2.0 < big / small < 4.0  # dominated by the hidden x hidden layer (x4) and the input layers (x2)


def test_compile_study_fields(out):
    compile.run(learners=("td3",), pops=(2,), hidden=(16, 16), batch_size=8, k=2, min_time=0.0, out_dir=out)
    data = load(out / "compile.json", layers=False)  # nothing is executed: the peak only
    assert [r["pop"] for r in data["results"]] == [2]
    for r in data["results"]:
        assert r["k"] == 2 and positive(r["compile_s"]) and positive(r["xla_compile_s"])
        assert r["compile_s"] >= r["xla_compile_s"]


@pytest.mark.long
def test_envstep_study_fields(out):
    envstep.run(learners=("td3",), gym_envs=("Pendulum-v1",), brax_envs=("probe:pendulum",), pops=(2,), steps=5,
                out_dir=out, **TINY)
    data = load(out / "envstep.json", layers=False)  # env stepping has no layer ceiling
    modes = {(r["path"], r["mode"]) for r in data["results"]}
    assert modes == {("gym", "single"), ("gym", "vector"), ("probe", "vector")}
    assert data["params"]["devices"] == [1]
    for r in data["results"]:
        assert "skipped" not in r, r
        assert positive(r["ms_per_interaction"]) and r["devices"] == 1
        if r["mode"] == "vector":
            assert r["ms_per_member_step"] == pytest.approx(r["ms_per_interaction"] * r["envs"] / r["pop"])
            assert r["ms_per_vector_step"] == pytest.approx(r["ms_per_interaction"] * r["envs"])
            # The collect program (JAX path) / the acting program (host path) is compiled by the first call.
            assert positive(r["compile_s"]) and r["first_call_s"] >= r["compile_s"]
            assert r["steps_per_call"] == 5 and r["state_shards"] == 1
        assert r["timing"]["repeats"] >= 10 and r["ms_per_interaction_iqr"] >= 0


@pytest.mark.long
def test_train_study_fields(out):
    from popjax.config import make_config
    from popjax.experiment import build

    train.run(envs=("probe:pendulum",), pops=(2,), env_steps=240, warmup=40, rollout_len=20, batch_size=16,
              hidden=(16, 16), out_dir=out)
    # The timer was given to the study's runs only (train(..., instrument=...)): a loop built without
    # `instrument` hands out the compiled programs themselves, unwrapped.
    loop = build(make_config(learner="td3", env="probe:pendulum", pop_size=2, progress=False))
    assert loop.compiler.instrument is None
    program = loop.compiler("probe", lambda x: x + 1, jnp.zeros(()))
    assert isinstance(program, jax.stages.Compiled)
    data = load(out / "train.json")
    (row,) = data["results"]
    assert "skipped" not in row, row
    assert row["devices"] == 1 and row["state_shards"] == 1
    # JAX path: one compiled "iteration" program; its first ceil(40 / 20) calls are the warm-up (collect only).
    assert row["calls"]["iteration"]["count"] == 12 and row["warmup_calls"] == 2
    assert row["iterations_timed"] == 10 and positive(row["iteration_s"]) and row["iteration_iqr_s"] >= 0
    assert positive(row["env_steps_per_s"]) and positive(row["wall_s"])
    assert row["layer_gflops"] == data["ceilings"]["layers"][0]["gflops"]
    # On the JAX path the update share is (fused call - collect-only call): a difference of two timings,
    # which machine load can push to 0. Timing-derived values are checked for range, not size.
    assert 0.0 <= row["update_fraction"] <= 1.0 and 0.0 < row["compiled_fraction"] <= 1.0
    assert row["steady_state"]["iterations"] >= 1


def test_train_needs_ten_timed_iterations():
    with pytest.raises(ValueError, match="--env-steps: 120 env steps .* give 4 timed training iterations"):
        train.run(envs=("probe:pendulum",), env_steps=120, warmup=40, rollout_len=20)


@pytest.mark.long
def test_shared_critic_and_drivers_record_their_ceilings(out):
    shared_critic.run(pops=(2,), hidden=(8, 8), batch_size=4, impls=("vectorized", "sequential"), repeats=10,
                      min_time=0.0, out_dir=out, plot=False)
    (row,) = load(out / "shared_critic.json")["results"]
    assert row["vectorized_repeats"] >= 10 and row["sequential_repeats"] >= 10 and positive(row["layer_gflops"])
    drivers.run(drivers=("independent",), pop=2, env_steps=70, warmup=10, rollout_len=5, batch_size=8,
                hidden=(8, 8), out_dir=out, plot=False)
    (row,) = load(out / "drivers.json")["results"]
    assert row["iterations_timed"] >= 10 and positive(row["layer_gflops"])


@pytest.mark.long
def test_per_study_through_the_cli(tmp_path, capsys):
    from popjax import cli

    argv = ["bench", "per", "--branching", "2,4", "--capacity", "1000", "--batch", "32", "--population", "2",
            "--repeats", "10", "--min-time", "0", "--allow-busy", "--out", str(tmp_path)]
    assert cli.main(argv) == 0
    data = load(tmp_path / "per.json", layers=False)  # the sum tree is memory-bound: no layer ceiling
    rows = data["results"]
    points = {(r["op"], r["impl"], r["branching"], r["population"]) for r in rows}
    assert points == {(op, impl, k, pop) for op in ("sample", "update")
                      for impl, k, pop in [("numpy", None, 1), ("tree", 2, 1), ("tree", 4, 1),
                                           ("tree_vmap", 2, 2), ("tree_vmap", 4, 2)]}, points
    for r in rows:
        assert "skipped" not in r and r["capacity"] == 1000 and r["batch"] == 32, r
        assert positive(r["per_s"]) and r["repeats"] >= 10, r
        if r["impl"] != "numpy":
            assert positive(r["compile_s"]), r
        if r["impl"] == "tree_vmap":
            assert positive(r["vmap_cost"]), r
    # The tree and the NumPy oracle drew the same indices from the same uniform draws, at every tree point.
    samples = [r for r in rows if r["op"] == "sample" and r["impl"] != "numpy"]
    assert all(r["agrees_with_oracle"] is True for r in samples) and data["agrees_with_oracle"] is True
    assert cli.main(["bench", "report", "--results", str(tmp_path), "--output", str(tmp_path / "RESULTS.md")]) == 0
    text = (tmp_path / "RESULTS.md").read_text()
    assert "## per" in text and "could not summarise" not in text and "fastest K" in text
    assert "**the same indices**" in text and "vmap cost per tree" in text
    capsys.readouterr()
    assert cli.main(["bench", "per", "--branching", "1", "--out", str(tmp_path / "bad")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--branching: a sum tree needs K >= 2, got 1" in err, err
    assert not (tmp_path / "bad").exists()


@pytest.mark.long
def test_per_budget_skips_the_larger_batches(tmp_path):
    payload = per.run(branching=(2,), capacity=(100,), batch=(8, 64), population=2, max_seconds=0.0, min_time=0.0,
                      out_dir=tmp_path, plot=False)
    rows = {(r["op"], r["impl"], r["batch"]): r for r in payload["results"]}
    for op in ("sample", "update"):
        for impl in ("numpy", "tree"):
            assert positive(rows[op, impl, 8]["per_s"]) and rows[op, impl, 8]["repeats"] >= 10
            assert rows[op, impl, 64]["skipped"].endswith("> --max-seconds 0"), rows[op, impl, 64]
        assert positive(rows[op, "tree_vmap", 64]["per_s"])  # the population point is the first of its sweep
    text = report.write_report(tmp_path, tmp_path / "RESULTS.md").read_text()
    assert "## per" in text and "| 100 | 64 | skipped | skipped |" in text and "Skipped points: sample numpy" in text


@pytest.mark.long
def test_per_oracle_is_the_trees_definition():
    from popjax.buffers import prioritized

    rng = np.random.default_rng(0)
    p = rng.integers(0, 4, 50).astype(np.float32)  # zero priorities included: neither side may land on one
    targets = rng.random(200, dtype=np.float32) * p.sum()
    for k in (2, 3, 16):
        tree = prioritized.tree_from_leaves(per._leaves(p, k), k)
        assert np.array_equal(np.asarray(prioritized.tree_find(tree, jnp.asarray(targets))),
                              per.oracle_find(p, targets))


# --- load discipline ----------------------------------------------------------------------------------------
_STUDY_ARGS = {
    "update": ["--learner", "td3", "--impl", "vmap", "--hidden", "8", "--batch-size", "4", "--k", "2"],
    "roofline": ["--learner", "td3", "--hidden", "8", "--batch-size", "4", "--matmul-sizes", "32"],
    "compile": ["--learner", "td3", "--hidden", "8", "--batch-size", "4", "--k", "2"],
    "envstep": ["--gym", "", "--brax", "probe:pendulum", "--steps", "5"],
    "train": ["--env", "probe:pendulum", "--env-steps", "130", "--warmup", "20", "--rollout-len", "10"],
    "shared_critic": ["--hidden", "8", "--batch-size", "4"],
    "drivers": ["--driver", "independent", "--pop", "2", "--env-steps", "70", "--rollout-len", "5"],
    "per": ["--branching", "2", "--capacity", "100", "--batch", "8"],  # --pop 2 abbreviates --population
}


@pytest.mark.parametrize("study", sorted(_STUDY_ARGS))
def test_a_busy_machine_is_refused_in_one_line(study, tmp_path, capsys, monkeypatch):
    from popjax import cli

    monkeypatch.setattr(common, "load_average", lambda: [9.0, 8.0, 7.0])
    status = cli.main(["bench", study, "--pop", "2", "--out", str(tmp_path), *_STUDY_ARGS[study]])
    lines = capsys.readouterr().err.strip().splitlines()
    assert status == 2
    assert len(lines) == 1 and lines[0].startswith(
        f"popjax bench {study}: error: the machine is busy: 1-minute load average 9.00 > "
        f"{os.cpu_count() / 2:g} (half of its {os.cpu_count()} cores)"), lines
    assert "--allow-busy" in lines[0]
    assert not list(tmp_path.iterdir())  # nothing measured or written


@pytest.mark.long
def test_allow_busy_runs_and_stamps_the_results_busy(tmp_path, monkeypatch):
    monkeypatch.setattr(common, "load_average", lambda: [9.0, 8.0, 7.0])
    payload = compile.run(learners=("td3",), pops=(1,), hidden=(8,), batch_size=4, k=2, min_time=0.0,
                          allow_busy=True, out_dir=tmp_path, plot=False)
    assert payload["busy"] is True and payload["load"]["allow_busy"] is True
    assert payload["busy_reasons"][0].startswith("1-minute load average 9.00 >")
    stored = json.loads((tmp_path / "compile.json").read_text())
    assert stored["busy"] is True and stored["results"][0]["compile_s"] > 0


def test_other_processes_using_the_cpu_during_a_study_stamp_it_busy(tmp_path, monkeypatch):
    monkeypatch.setattr(common, "others_cpu_share", lambda since: 0.8)
    payload = compile.run(learners=("td3",), pops=(1,), hidden=(8,), batch_size=4, k=2, min_time=0.0,
                          out_dir=tmp_path, plot=False)
    assert payload["busy"] is True and payload["busy_reasons"] == [
        "other processes used 80% of the CPU while the study ran"]


def test_waiting_for_a_quiet_machine(monkeypatch):
    loads = iter([[3.0] * 3, [2.5] * 3, [0.2] * 3])
    monkeypatch.setattr(common, "load_average", lambda: next(loads))
    monkeypatch.setattr(common, "busy_threshold", lambda: 1.0)
    assert common.wait_for_quiet(wait_s=5.0, poll_s=0.0) == [0.2] * 3
    monkeypatch.setattr(common, "load_average", lambda: [3.0] * 3)
    with pytest.raises(common.BusyMachine, match="1-minute load average 3.00 > 1"):
        common.wait_for_quiet(wait_s=0.01, poll_s=0.001)
    assert common.wait_for_quiet(allow_busy=True) == [3.0] * 3


def test_report_lists_every_study(out, update_json):
    for name in ("roofline", "compile", "envstep", "train"):
        if not (out / f"{name}.json").exists():
            pytest.skip(f"{name} study did not run")
    path = report.write_report(out, out / "RESULTS.md")
    text = path.read_text()
    for heading in ("## update", "## roofline", "## compile", "## envstep", "## train", "## Machine"):
        assert heading in text
    assert "![update](update.png)" in text  # image paths relative to the report


def _fake(study: str, results: list, busy: bool = False, params: dict | None = None, **extra) -> dict:
    """A study's JSON as the studies write it (only what the report reads)."""
    return {"study": study, "started_utc": "2030-01-01T00:00:00+00:00", "finished_utc": "2030-01-01T00:10:00+00:00",
            "machine": common.machine(), "params": params or {}, "results": results, "notes": [], "busy": busy,
            "busy_reasons": ["1-minute load average 9.00 > 1 at the start (run with --allow-busy)"] if busy else [],
            "load_before": [9.0, 8.0, 7.0] if busy else [0.2, 0.3, 0.4], "load_after": [2.1, 1.0, 0.5],
            "load": {"threshold_1min": 1.0, "others_cpu_share": 0.01, "allow_busy": busy},
            "ceilings": {"dense_matmul": {"n": 2048, "before": {"gflops": 431.0}, "after": {"gflops": 440.0},
                                          "gflops": 440.0}, "layers": []}, **extra}


def _verdicts(text: str) -> dict[str, str]:
    table = text[text.index("## Targets"):].split("\n\n")[1].splitlines()[2:]
    return {row.split(" | ")[0].strip("| "): row.split(" | ")[-1].strip("| ") for row in table}


def test_the_targets_file_drives_the_report_verdicts(tmp_path):
    def vec(learner, pop, speedup, fraction=None):
        return {"learner": learner, "impl": "vmap_scan", "pop": pop, "devices": 1, "ms_per_pop_step": 10.0,
                "speedup_vs_torch_seq": speedup, "gflops": 300.0, "layer_gflops": 300.0 / (fraction or 1.0),
                "fraction_of_layer": fraction}

    # TD3's rows name the fastest PyTorch variant (speedup_vs_torch_best, which the target reads); SAC's are
    # results written before the compiled and vectorized variants existed (only the eager baseline).
    best = lambda row, ratio: row | {"speedup_vs_torch_best": ratio, "torch_best": "torch_vmap_compile"}
    update_rows = [best(vec("td3", 4, 9.0), 2.5), best(vec("td3", 16, 9.0, 0.95), 2.2),
                   best(vec("td3", 64, 9.0, 0.93), 2.1),
                   vec("sac", 4, 2.6), vec("sac", 16, 2.4, 0.91), vec("sac", 64, 1.9, 0.92)]
    # one-step rows against the JAX-sequential loop: SAC's is slower at N = 16 (the target "never slower")
    update_rows += [{"learner": learner, "impl": "vmap", "pop": pop, "devices": 1, "ms_per_pop_step": 12.0,
                     "speedup_vs_jax_seq": ratio} for learner, pop, ratio in (("td3", 16, 1.2), ("sac", 4, 1.1),
                                                                              ("sac", 16, 0.9))]
    fit = {"td3": {"k": 50, "largest_pop": 2400, "program_bytes": 22 * 2**30, "limit_bytes": 23 * 2**30,
                   "limit_source": "available RAM", "tried": []},
           "sac": {"k": 50, "largest_pop": 2000, "program_bytes": 22 * 2**30, "limit_bytes": 23 * 2**30,
                   "limit_source": "available RAM", "tried": []},
           "dqn": {"k": 10, "largest_pop": 300, "program_bytes": 22 * 2**30, "limit_bytes": 23 * 2**30,
                   "limit_source": "available RAM", "tried": []}}
    results = {
        "update": _fake("update", update_rows, params={"torch_threads": [1, 2], "problems": {}}, memory_fit=fit),
        "compile": _fake("compile", [{"learner": "td3", "pop": 64, "devices": 1, "k": 50, "compile_s": 12.0,
                                      "trace_lower_s": 2.0, "xla_compile_s": 10.0}], busy=True),
        "train": _fake("train", [{"env": "gym:HalfCheetah-v5", "pop": 4, "devices": 1, "env_steps_per_s": 900.0}],
                       params={"hidden": [256, 256]}),
    }
    for study, payload in results.items():
        (tmp_path / f"{study}.json").write_text(json.dumps(payload))
    targets = (Path(report.__file__).resolve().parents[2] / "benchmarks" / "targets.yaml").read_text()
    (tmp_path / "targets.yaml").write_text(targets)
    text = report.write_report(tmp_path, tmp_path / "RESULTS.md").read_text()
    verdicts = _verdicts(text)
    assert list(verdicts.values()) == ["**met**", "**missed**", "**met**", "**missed**", "not measured",
                                       "**busy** — not judged", "**met**"], verdicts
    assert "SAC (peak 440 GFLOP/s): slowest 0.90× at N=16; TD3 (peak 440 GFLOP/s): slowest 1.20× at N=16" in text
    assert ("N=4: 2.50× vs torch_vmap_compile, N=16: 2.20× vs torch_vmap_compile, N=64: 2.10× vs "
            "torch_vmap_compile") in text and "TD3: N = 2,400" in text
    assert "N=4: 2.60× vs torch_seq, N=16: 2.40× vs torch_seq, N=64: 1.90× vs torch_seq" in text
    assert "| 12.0 s |" in text  # a busy result is shown, with its conditions, but not judged
    assert "load 9.00→2.10, peak 440 GFLOP/s, **busy**" in text
    assert "**Busy — shown, not judged** (1-minute load average 9.00 > 1 at the start" in text
    # The thresholds are the file's: raise one and the verdict follows; overlap rows make train measurable.
    (tmp_path / "targets.yaml").write_text(targets.replace("min_speedup: 2.0", "min_speedup: 2.2", 1))
    results["train"]["results"] = [
        {"env": "gym:HalfCheetah-v5", "pop": 4, "devices": 1, "overlap": False, "env_steps_per_s_steady": 900.0},
        {"env": "gym:HalfCheetah-v5", "pop": 4, "devices": 1, "overlap": True, "env_steps_per_s_steady": 1260.0}]
    (tmp_path / "train.json").write_text(json.dumps(results["train"]))
    verdicts = _verdicts(report.write_report(tmp_path, tmp_path / "RESULTS.md").read_text())
    assert list(verdicts.values())[:5] == ["**missed**", "**missed**", "**met**", "**missed**", "**met**"], verdicts


def test_report_replaces_its_own_results_file(tmp_path):
    from popjax import cli

    output = tmp_path / "RESULTS.md"
    assert cli.main(["bench", "report", "--results", str(tmp_path), "--output", str(output)]) == 0
    first = output.read_text()
    assert first.startswith("# popjax benchmark results\n") and "No results yet" in first
    assert cli.main(["bench", "report", "--results", str(tmp_path), "--output", str(output)]) == 0
    assert output.read_text() == first


def test_report_refuses_a_malformed_targets_file(tmp_path, capsys):
    from popjax import cli

    (tmp_path / "targets.yaml").write_text("targets:\n  - kind: fastest_ever\n")
    status = cli.main(["bench", "report", "--results", str(tmp_path), "--output", str(tmp_path / "R.md"),
                       "--targets", str(tmp_path / "targets.yaml")])
    err = capsys.readouterr().err
    assert status == 2 and err.count("\n") == 1 and "unknown kind(s) fastest_ever" in err, err


def test_cli_parses_every_study():
    import argparse

    import popjax_bench as bench

    parser = argparse.ArgumentParser()
    bench.add_arguments(parser)
    for study in bench.STUDIES:
        args = parser.parse_args([study])
        assert args.study == study
        assert bench.options_class(study)().__class__.STUDY == study  # every option has a default
def test_cli_options_come_from_the_study_dataclass(tmp_path):
    import argparse

    import popjax_bench as bench

    parser = argparse.ArgumentParser()
    bench.add_arguments(parser)
    args = parser.parse_args(["update", "--pop", "1,4", "--learner", "td3", "--no-plot", "--out", str(tmp_path)])
    assert args.pops == "1,4" and args.learners == "td3" and args.plot is False
    options = bench.check_args(args)
    assert options == update.Options(pops=(1, 4), learners=("td3",), plot=False, out_dir=str(tmp_path))
    assert options.torch_threads == (1, 2) and options.repeats == 10  # the defaults, declared once


@pytest.mark.parametrize(("study", "flag"), [("envstep", "--k"), ("train", "--repeats"), ("drivers", "--k"),
                                             ("report", "--devices"), ("envstep", "--max-seconds"),
                                             ("per", "--k")])
def test_options_a_study_does_not_have_are_rejected(study, flag, capsys):
    from popjax import cli

    assert cli.main(["bench", study, flag, "3"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{flag}: not an option of `popjax bench {study}`" in err, err
    with pytest.raises(TypeError, match="unknown option"):
        update.run(no_such_option=1)


@pytest.mark.parametrize("study", ["update", "roofline", "compile", "envstep", "train", "shared_critic", "drivers",
                                   "per", "spo", "report"])
def test_every_option_of_a_study_has_a_flag_and_help(study, capsys):
    import dataclasses

    import popjax_bench as bench
    from popjax import cli
    from popjax_bench.options import flag_of

    assert cli.main(["bench", study, "--help"]) == 0
    text = capsys.readouterr().out
    for f in dataclasses.fields(bench.options_class(study)):
        assert flag_of(f) in text and f.metadata["help"], f.name


def test_options_are_checked_from_python_too():
    with pytest.raises(ValueError, match="--repeats: must be >= 10, got 3"):
        update.Options(repeats=3)
    with pytest.raises(ValueError, match="--learner: 'dqn' unknown learner"):
        roofline.run(learners=("dqn",))
    assert envstep.Options(gym_envs=[]).gym_envs == ()  # lists become tuples; '' means none


def test_too_many_devices_is_a_clear_error():
    with pytest.raises(ValueError, match="xla_force_host_platform_device_count"):
        common.request_devices([len(jax.devices()) + 1])


@pytest.mark.parametrize("study", ["update", "envstep", "train", "shared_critic"])
def test_cli_rejects_unavailable_devices_in_one_line(study, tmp_path, capsys):
    from popjax import cli

    too_many = str(len(jax.devices()) + 1)  # JAX is initialised in this process: no more devices can appear
    status = cli.main(["bench", study, "--devices", f"1,{too_many}", "--pop", "2", "--out", str(tmp_path)])
    lines = capsys.readouterr().err.strip().splitlines()
    assert status == 2
    assert len(lines) == 1 and lines[0].startswith(f"popjax bench {study}: error: --devices {too_many}"), lines
    assert not list(tmp_path.iterdir())  # nothing measured or written


# Tiny sizes: each study runs its points on 1 and then 2 (forced host) devices in a fresh process.
_DEVICE_RUNS = {
    "envstep": ["--gym", "", "--brax", "probe:pendulum", "--learner", "td3", "--steps", "5", "--min-time", "0"],
    "train": ["--env", "probe:pendulum", "--env-steps", "130", "--warmup", "20", "--rollout-len", "10",
              "--batch-size", "8"],
    "shared_critic": ["--batch-size", "4", "--min-time", "0"],  # all three implementations (the CEM-RL order port)
}


@pytest.mark.processes
@pytest.mark.parametrize("study", sorted(_DEVICE_RUNS))
def test_cli_devices_flag_splits_the_population(study, tmp_path):
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=2", "JAX_PLATFORMS": "cpu"}
    argv = [sys.executable, "-m", "popjax.cli", "bench", study, "--pop", "2", "--devices", "1,2", "--hidden", "8",
            "--out", str(tmp_path), "--no-plot", "--allow-busy", *_DEVICE_RUNS[study]]
    proc = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    data = json.loads((tmp_path / f"{study}.json").read_text())
    assert data["machine"]["device_count"] == 2 and data["params"]["devices"] == [1, 2]
    rows = data["results"]
    assert [r["devices"] for r in rows] == [1, 2] and all(r["pop"] == 2 for r in rows)
    assert "busy" in data and data["ceilings"]["dense_matmul"]["after"]["timing"]["repeats"] >= 10
    for r in rows:
        assert "skipped" not in r, r
        # The state really is split over the devices (a replicated copy would count as 1 shard).
        assert r["actor_shards" if study == "shared_critic" else "state_shards"] == r["devices"], r
    text = report.write_report(tmp_path, tmp_path / "RESULTS.md").read_text()
    assert f"## {study}" in text and "| devices |" in text and "could not summarise" not in text


def test_populations_that_do_not_divide_over_the_devices_are_recorded_as_skipped(tmp_path, monkeypatch):
    monkeypatch.setattr(common, "request_devices", lambda counts: None)  # nothing is placed: every point skips
    payloads = {
        "envstep": envstep.run(learners=("td3",), gym_envs=(), brax_envs=("probe:pendulum",), pops=(3,),
                               devices=(2,), out_dir=tmp_path, plot=False),
        "train": train.run(envs=("probe:pendulum",), pops=(3,), devices=(2,), out_dir=tmp_path, plot=False),
        "shared_critic": shared_critic.run(pops=(3,), devices=(2,), out_dir=tmp_path, plot=False),
    }
    for study, payload in payloads.items():
        (row,) = payload["results"]
        assert row["pop"] == 3 and row["devices"] == 2, study
        assert row["skipped"] == "3 members do not divide over 2 devices", study
    text = report.write_report(tmp_path, tmp_path / "RESULTS.md").read_text()
    assert "could not summarise" not in text and text.count("skipped: 3 members do not divide") == 3


# --- PyTorch reference == JAX learner (the baseline does the same work) ------------------------------------
def _batch(rng, b, obs_shape, action_dim=0, num_actions=0):
    if num_actions:
        obs = lambda: jnp.asarray(rng.integers(0, 256, (b, *obs_shape)), jnp.uint8)
        action = jnp.asarray(rng.integers(0, num_actions, b), jnp.int32)
    else:
        obs = lambda: jnp.asarray(rng.normal(size=(b, *obs_shape)), jnp.float32)
        action = jnp.asarray(rng.uniform(-1, 1, (b, action_dim)), jnp.float32)
    return Transition(obs=obs(), action=action, reward=jnp.asarray(rng.normal(size=b), jnp.float32), next_obs=obs(),
                      terminated=jnp.asarray(rng.uniform(size=b) < 0.3, jnp.float32))


def _close(a, b, tol=1e-4):
    return abs(float(a) - float(b)) <= tol * (1.0 + abs(float(a)))


@pytest.mark.long
@needs_torch
def test_torch_td3_matches_jax_td3():
    spec = EnvSpec("t", (5,), action_dim=3, action_low=(-1.0,) * 3, action_high=(1.0,) * 3)
    learner = td3.make_td3(td3.TD3Config(hidden=(16, 16), batch_size=8), spec)
    hp = td3.default_hparams()  # policy_delay 2: steps 2 and 4 are policy steps
    state = jax.jit(learner.init)(jax.random.key(0), hp)
    step_fn = jax.jit(one_update(learner))  # one compilation instead of op-by-op dispatch
    member = tr.TorchTD3(5, 3, (16, 16), tr.hparams_dict(hp))
    tr.load_td3_from_jax(member, state)
    rng = np.random.default_rng(0)
    for step in range(4):
        batch, key = _batch(rng, 8, (5,), action_dim=3), jax.random.key(100 + step)
        state, metrics = step_fn(key, state, batch, hp)
        # Same target-policy-smoothing noise: the JAX learner draws normal(key, action.shape).
        noise = tr.torch.from_numpy(np.array(jax.random.normal(key, batch.action.shape)))
        out = member.update(tr.batch_to_torch(batch, "cpu"), noise=noise)
        assert _close(metrics["critic_loss"], out["critic_loss"]), step
        if step % 2 == 1:  # a policy step: the actor loss is the same, computed through the updated critic
            assert _close(metrics["actor_loss"], out["actor_loss"]), step
        else:
            assert out["actor_loss"] is None
    # After 4 steps (2 of them policy steps) every network and target agrees.
    jax_kernel = np.asarray(state.target_actor["params"]["MLP_0"]["Dense_1"]["kernel"]).T
    np.testing.assert_allclose(jax_kernel, member.target_actor.layers[1].weight.detach().numpy(), atol=1e-5)
    jax_kernel = np.asarray(state.critic["params"]["q2"]["Dense_0"]["kernel"]).T
    np.testing.assert_allclose(jax_kernel, member.critic.q2.layers[0].weight.detach().numpy(), atol=1e-5)


@pytest.mark.long
@needs_torch
def test_torch_sac_matches_jax_sac():
    spec = EnvSpec("s", (5,), action_dim=3, action_low=(-1.0,) * 3, action_high=(1.0,) * 3)
    learner = sac.make_sac(sac.SACConfig(hidden=(16, 16), batch_size=8), spec)
    hp = sac.default_hparams()
    state = jax.jit(learner.init)(jax.random.key(1), hp)
    step_fn = jax.jit(one_update(learner))
    member = tr.TorchSAC(5, 3, (16, 16), tr.hparams_dict(hp))
    tr.load_sac_from_jax(member, state)
    rng = np.random.default_rng(1)
    for step in range(3):
        batch, key = _batch(rng, 8, (5,), action_dim=3), jax.random.key(200 + step)
        key_next, key_actor = jax.random.split(key)  # the SAC learner's documented key split
        state, metrics = step_fn(key, state, batch, hp)
        noise = lambda k: tr.torch.from_numpy(np.array(jax.random.normal(k, (8, 3))))
        out = member.update(tr.batch_to_torch(batch, "cpu"), noise_next=noise(key_next), noise_actor=noise(key_actor))
        for name in ("critic_loss", "actor_loss", "alpha_loss"):
            assert _close(metrics[name], out[name]), (step, name)


@pytest.mark.long
@needs_torch
def test_torch_dqn_matches_jax_dqn():
    spec = EnvSpec("a", (36, 36, 4), num_actions=5)
    config = dqn.DQNConfig(hidden=(16,), cnn=True, batch_size=4, target_update_period=2)
    learner = dqn.make_dqn(config, spec)
    hp = dqn.default_hparams()
    state = jax.jit(learner.init)(jax.random.key(2), hp)
    step_fn = jax.jit(one_update(learner))
    member = tr.TorchDQN(5, (16,), tr.hparams_dict(hp), target_update_period=2, frame=36)
    tr.load_dqn_from_jax(member, state)
    rng = np.random.default_rng(2)
    for step in range(3):  # crosses a hard target copy (period 2)
        batch = _batch(rng, 4, (36, 36, 4), num_actions=5)
        state, metrics = step_fn(jax.random.key(0), state, batch, hp)
        out = member.update(tr.batch_to_torch(batch, "cpu", channels_first=True))
        assert _close(metrics["loss"], out["loss"], 1e-3), step


@pytest.mark.processes
def test_train_compares_overlap_off_and_on_on_the_gym_path(tmp_path):
    """Both modes at the same point; the overlap row carries its share and its speed-up over the other."""
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    env.pop("XLA_FLAGS", None)  # the study adds the acting device itself
    argv = [sys.executable, "-m", "popjax.cli", "bench", "train", "--env", "gym:Pendulum-v1", "--pop", "2",
            "--overlap", "off,on", "--env-steps", "130", "--warmup", "20", "--rollout-len", "10", "--batch-size", "8",
            "--hidden", "8", "--out", str(tmp_path), "--no-plot", "--allow-busy"]
    proc = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    rows = json.loads((tmp_path / "train.json").read_text())["results"]
    assert [r["overlap"] for r in rows] == [False, True] and all("skipped" not in r for r in rows)
    off, on = rows
    assert on["updates"] == off["updates"] and on["env_steps_per_member"] == off["env_steps_per_member"] == 130
    assert on["speedup"] > 0 and 0 <= on["overlap_share"] <= 1
    text = report.write_report(tmp_path, tmp_path / "RESULTS.md").read_text()
    assert "| overlap |" in text or "overlap" in text
