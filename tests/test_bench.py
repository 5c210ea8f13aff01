"""The benchmark suite at tiny sizes: every study writes valid JSON with its documented fields,
and the PyTorch reference learners compute the same losses as the JAX learners (equal work)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from popjax.bench import common, compile, envstep, report, roofline, train, update
from popjax.bench import torch_reference as tr
from popjax.learners import dqn, sac, td3
from popjax.types import EnvSpec, Transition

TINY = dict(hidden=(16, 16), repeats=2, min_time=0.0, seed=0)
needs_torch = pytest.mark.skipif(not tr.available(), reason=tr.TORCH_ERROR or "")


def positive(x) -> bool:
    return isinstance(x, int | float) and math.isfinite(x) and x > 0


def load(path):
    data = json.loads(path.read_text())
    for key in ("study", "started_utc", "finished_utc", "machine", "params", "results", "notes"):
        assert key in data, key
    m = data["machine"]
    for key in ("cpu", "cpu_count", "jax", "jaxlib", "backend", "devices", "device_count", "load_average"):
        assert key in m, key
    assert m["jax"] == jax.__version__
    assert path.with_suffix(".png").stat().st_size > 1000
    return data


@pytest.fixture(scope="module")
def out(tmp_path_factory):
    return tmp_path_factory.mktemp("bench")


@pytest.fixture(scope="module")
def update_json(out):
    impls = ("vmap", "vmap_scan", "jax_seq") + (("torch_seq",) if tr.available() else ())
    update.run(learners=("td3",), pops=(2,), impls=impls, batch_size=8, k=2, out_dir=out, **TINY)
    return load(out / "update.json")


def test_update_study_fields(update_json):
    rows = update_json["results"]
    impls = {r["impl"] for r in rows}
    assert {"vmap", "vmap_scan", "jax_seq"} <= impls
    for r in rows:
        assert "skipped" not in r, r
        assert r["learner"] == "td3" and r["pop"] == 2 and r["devices"] == 1
        assert positive(r["ms_per_pop_step"]) and positive(r["ms_per_member_step"])
        assert r["timing"]["repeats"] >= 1 and all(positive(t) for t in r["timing"]["times_s"])
        assert r["memory"]["rss_peak_mb"] >= r["memory"]["rss_start_mb"] > 0
        assert positive(r["speedup_vs_jax_seq"])
        if r["impl"] != "torch_seq":
            assert positive(r["compile_s"])
        if r["impl"] == "vmap_scan":
            assert r["steps_per_call"] == 2
    if tr.available():
        assert all(positive(r["speedup_vs_torch_seq"]) for r in rows)
    assert update_json["params"]["problems"]["td3"]["config"]["hidden"] == [16, 16]


@needs_torch
def test_update_study_dqn_cnn_torch(out):
    update.run(learners=("dqn",), pops=(1,), impls=("torch_seq",), frame=36, hidden=(16,), batch_size=4,
               k=2, repeats=1, min_time=0.0, out_dir=out / "dqn")
    rows = load(out / "dqn" / "update.json")["results"]
    assert {r["impl"] for r in rows} == {"torch_seq"}
    assert all(positive(r["ms_per_pop_step"]) for r in rows)


def test_roofline_study_fields(out, update_json):
    # Same problem and N as the update study: the compiled update is reused (execution is what is timed).
    roofline.run(learners=("td3",), pops=(2,), batch_size=8, k=2, matmul_sizes=(64,), out_dir=out, **TINY)
    data = load(out / "roofline.json")
    assert positive(data["matmul"]["1"]["peak_gflops"])
    (row,) = data["results"]
    assert positive(row["xla_flops_per_pop_step"]) and positive(row["analytic_flops_per_pop_step"])
    # XLA counts the matmuls plus elementwise work: never fewer FLOPs than the analytic matmul count.
    assert 0.9 < row["xla_over_analytic"] < 3.0
    assert positive(row["gflops"]) and positive(row["fraction_of_peak"]) and positive(row["layer_gflops"])


def test_analytic_flops_scale_with_width():
    small = roofline.analytic_flops(update.problem("td3", (16, 16), 8))["per_member_step"]
    big = roofline.analytic_flops(update.problem("td3", (32, 32), 8))["per_member_step"]
    assert 2.0 < big / small < 4.0  # dominated by the hidden x hidden layer (x4) and the input layers (x2)


def test_compile_study_fields(out):
    compile.run(learners=("td3",), pops=(2,), hidden=(16, 16), batch_size=8, k=2, out_dir=out)
    data = load(out / "compile.json")
    assert [r["pop"] for r in data["results"]] == [2]
    for r in data["results"]:
        assert r["k"] == 2 and positive(r["compile_s"]) and positive(r["xla_compile_s"])
        assert r["compile_s"] >= r["xla_compile_s"]


def test_envstep_study_fields(out):
    envstep.run(learners=("td3",), gym_envs=("Pendulum-v1",), brax_envs=("probe:pendulum",), pops=(2,), steps=5,
                out_dir=out, **TINY)
    data = load(out / "envstep.json")
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
            assert r["timing"]["repeats"] >= 1 and r["steps_per_call"] == 5 and r["state_shards"] == 1


def test_train_study_fields(out):
    from popjax.loop import Compiler

    train.run(envs=("probe:pendulum",), pops=(2,), env_steps=120, warmup=40, rollout_len=20, batch_size=16,
              hidden=(16, 16), out_dir=out)
    assert Compiler.call_wrapper is None  # the timing hook is removed afterwards
    (row,) = load(out / "train.json")["results"]
    assert "skipped" not in row, row
    assert row["devices"] == 1 and row["state_shards"] == 1
    # JAX path: one compiled "iteration" program; its first ceil(40 / 20) calls are the warm-up (collect only).
    assert row["calls"]["iteration"]["count"] == 6 and row["warmup_calls"] == 2
    assert positive(row["env_steps_per_s"]) and positive(row["wall_s"])
    # On the JAX path the update share is (fused call - collect-only call): a difference of two timings,
    # which machine load can push to 0. Timing-derived values are checked for range, not size.
    assert 0.0 <= row["update_fraction"] <= 1.0 and 0.0 < row["compiled_fraction"] <= 1.0
    assert row["steady_state"]["iterations"] >= 1


def test_report_lists_every_study(out, update_json):
    for name in ("roofline", "compile", "envstep", "train"):
        if not (out / f"{name}.json").exists():
            pytest.skip(f"{name} study did not run")
    path = report.write_report(out, out / "RESULTS.md")
    text = path.read_text()
    for heading in ("## update", "## roofline", "## compile", "## envstep", "## train", "## Machine"):
        assert heading in text
    assert "![update](update.png)" in text  # image paths relative to the report


def test_cli_parses_every_study():
    import argparse

    from popjax import bench

    parser = argparse.ArgumentParser()
    bench.add_arguments(parser)
    for study in bench.STUDIES:
        args = parser.parse_args([study])
        assert args.study == study
    args = parser.parse_args(["update", "--pop", "1,4", "--devices", "1,2", "--learner", "td3"])
    assert common.parse_int_list(args.pop) == [1, 4] and args.learner == "td3"


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
    "envstep": ["--gym", "", "--brax", "probe:pendulum", "--learner", "td3", "--steps", "5"],
    "train": ["--env", "probe:pendulum", "--env-steps", "40", "--warmup", "20", "--rollout-len", "10",
              "--batch-size", "8"],
    "shared_critic": ["--batch-size", "4"],  # all three implementations (the CEM-RL order port)
}


@pytest.mark.parametrize("study", sorted(_DEVICE_RUNS))
def test_cli_devices_flag_splits_the_population(study, tmp_path):
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=2", "JAX_PLATFORMS": "cpu"}
    argv = [sys.executable, "-m", "popjax.cli", "bench", study, "--pop", "2", "--devices", "1,2", "--hidden", "8",
            "--repeats", "2", "--min-time", "0", "--out", str(tmp_path), "--no-plot", *_DEVICE_RUNS[study]]
    proc = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    data = json.loads((tmp_path / f"{study}.json").read_text())
    assert data["machine"]["device_count"] == 2 and data["params"]["devices"] == [1, 2]
    rows = data["results"]
    assert [r["devices"] for r in rows] == [1, 2] and all(r["pop"] == 2 for r in rows)
    for r in rows:
        assert "skipped" not in r, r
        # The state really is split over the devices (a replicated copy would count as 1 shard).
        assert r["actor_shards" if study == "shared_critic" else "state_shards"] == r["devices"], r
    text = report.write_report(tmp_path, tmp_path / "RESULTS.md").read_text()
    assert f"## {study}" in text and "| devices |" in text and "could not summarise" not in text


def test_populations_that_do_not_divide_over_the_devices_are_recorded_as_skipped(tmp_path, monkeypatch):
    from popjax.bench import shared_critic

    monkeypatch.setattr(common, "request_devices", lambda counts: None)  # nothing is placed: every point skips
    payloads = {
        "envstep": envstep.run(learners=("td3",), gym_envs=(), brax_envs=("probe:pendulum",), pops=(3,),
                               devices=(2,), out_dir=tmp_path, plot=False),
        "train": train.run(envs=("probe:pendulum",), pops=(3,), devices=(2,), out_dir=tmp_path, plot=False),
        "shared_critic": shared_critic.run(pops=(3,), devices=(2,), out_dir=tmp_path, make_plot=False),
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


@needs_torch
def test_torch_td3_matches_jax_td3():
    spec = EnvSpec("t", (5,), action_dim=3, action_low=(-1.0,) * 3, action_high=(1.0,) * 3)
    learner = td3.make_td3(td3.TD3Config(hidden=(16, 16), batch_size=8), spec)
    hp = td3.default_hparams()  # policy_delay 2: steps 2 and 4 are policy steps
    state = jax.jit(learner.init)(jax.random.key(0), hp)
    step_fn = jax.jit(learner.update)  # one compilation instead of op-by-op dispatch
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


@needs_torch
def test_torch_sac_matches_jax_sac():
    spec = EnvSpec("s", (5,), action_dim=3, action_low=(-1.0,) * 3, action_high=(1.0,) * 3)
    learner = sac.make_sac(sac.SACConfig(hidden=(16, 16), batch_size=8), spec)
    hp = sac.default_hparams()
    state = jax.jit(learner.init)(jax.random.key(1), hp)
    step_fn = jax.jit(learner.update)
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


@needs_torch
def test_torch_dqn_matches_jax_dqn():
    spec = EnvSpec("a", (36, 36, 4), num_actions=5)
    config = dqn.DQNConfig(hidden=(16,), cnn=True, batch_size=4, target_update_period=2)
    learner = dqn.make_dqn(config, spec)
    hp = dqn.default_hparams()
    state = jax.jit(learner.init)(jax.random.key(2), hp)
    step_fn = jax.jit(learner.update)
    member = tr.TorchDQN(5, (16,), tr.hparams_dict(hp), target_update_period=2, frame=36)
    tr.load_dqn_from_jax(member, state)
    rng = np.random.default_rng(2)
    for step in range(3):  # crosses a hard target copy (period 2)
        batch = _batch(rng, 4, (36, 36, 4), num_actions=5)
        state, metrics = step_fn(jax.random.key(0), state, batch, hp)
        out = member.update(tr.batch_to_torch(batch, "cpu", channels_first=True))
        assert _close(metrics["loss"], out["loss"], 1e-3), step
