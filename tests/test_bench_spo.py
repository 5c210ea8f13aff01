"""``popjax bench spo``: SPO replicas over devices equal their one-device run; the study's JSON, its scaling
model columns (Zhang 2022, Eqs. 5.5-5.6) computed from the measured terms, its report section and its option
checks. The multi-device parts run in subprocesses with forced host devices."""

import json
import os
import subprocess
import sys
import textwrap

import pytest

from popjax_bench import report, spo

EQUAL = textwrap.dedent("""
    import json
    import jax, jax.numpy as jnp, numpy as np
    from popjax_bench import spo
    from popjax_bench.update import hlo_collectives
    from popjax.learners import spo as learners
    from popjax.learners.base import chunk_update
    from popjax.types import EnvSpec
    assert len(jax.devices()) == 4, jax.devices()
    spec = EnvSpec("t", (3,), action_dim=2, action_low=(-1.0,) * 2, action_high=(1.0,) * 2)
    out = {}
    for mode in ("local_sgd", "dp"):
        config = learners.SPOTD3Config(hidden=(16, 16), replicas=4, local_steps=3, batch_size=16, mode=mode,
                                       target_rounds=2)
        definition = learners.TD3_DEFINITION
        learner = definition.make(config, spec)
        hp = jax.tree.map(jnp.asarray, definition.default_hparams(config))
        start = jax.jit(learner.init)(jax.random.key(0), hp)
        rounds = [(jax.random.split(jax.random.key(10 + i), 3), spo.synthetic_batches(spec, 3, 16, 20 + i))
                  for i in range(4)]  # 4 rounds: the targets are copied after rounds 2 and 4
        one, state = jax.jit(chunk_update(learner)), start
        for keys, batches in rounds:
            state, _ = one(keys, state, batches, hp)
        mesh, placed, program = spo.replica_mesh(4), start, None
        for keys, batches in rounds:
            placed, batches, kwargs = spo.place_round(definition, config, spec, placed, batches, mesh)
            program = program or jax.jit(chunk_update(learner), **kwargs)
            placed, _ = program(keys, placed, batches, hp)
        mask = spo.replica_leaves(definition, config, spec)
        diff = lambda x, y: max(float(np.max(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64))))
                                for a, b in zip(jax.tree.leaves(x), jax.tree.leaves(y)))
        out[mode] = {
            "leaf_diff": diff(state, placed),
            "targets_moved": diff(state.target_critic, start.target_critic) > 0,
            "split": sorted({(m, len(x.sharding.device_set), x.addressable_shards[0].data.shape[0] if m and x.ndim
                              else None) for m, x in zip(jax.tree.leaves(mask), jax.tree.leaves(placed))}),
            "mask": [name for name in ("actor", "critic", "actor_opt", "critic_opt", "target_actor",
                                       "target_critic", "steps")
                     if all(jax.tree.leaves(getattr(mask, name)))],
            "collectives": hlo_collectives(program.lower(rounds[0][0], placed, batches, hp).compile())}
    print(json.dumps(out))
""")


def _forced(devices: int) -> dict[str, str]:
    return {**os.environ, "XLA_FLAGS": f"--xla_force_host_platform_device_count={devices}", "JAX_PLATFORMS": "cpu"}


@pytest.mark.processes
def test_replicas_over_four_devices_equal_the_one_device_run():
    proc = subprocess.run([sys.executable, "-c", EQUAL], capture_output=True, text=True, env=_forced(4), timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    for mode, r in out.items():
        # Not bitwise: the all-reduce sums the replicas in another order than one device's mean (measured: a few
        # 1e-8 on O(1) leaves after 4 rounds of Adam).
        assert r["leaf_diff"] < 1e-6, (mode, r)
        assert r["targets_moved"], mode  # the comparison covers target copies too
        assert r["mask"] == ["actor", "critic", "actor_opt", "critic_opt"], (mode, r["mask"])
        # Replica leaves are split in 4 (one replica of the leading axis per device), the others replicated.
        assert r["split"] == [[False, 4, None], [True, 4, 1]], (mode, r["split"])
        assert r["collectives"].get("all-reduce", 0) > 0, (mode, r["collectives"])


ARGS = ["--replicas", "1,2", "--local-steps", "1,3", "--batch-size", "8", "--hidden", "8", "--obs-dim", "3",
        "--action-dim", "2", "--min-time", "0", "--allow-busy"]


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    out = tmp_path_factory.mktemp("spo")
    argv = [sys.executable, "-m", "popjax.cli", "bench", "spo", "--out", str(out), *ARGS]
    proc = subprocess.run(argv, capture_output=True, text=True, env=_forced(2), timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    return out, json.loads((out / "spo.json").read_text())


@pytest.mark.processes
def test_spo_study_fields(study):
    out, data = study
    assert (out / "spo.png").exists()
    assert data["study"] == "spo" and data["busy"] is True and data["load"]["allow_busy"] is True
    assert data["load_before"] and data["ceilings"]["dense_matmul"]["after"]["timing"]["repeats"] >= 10
    assert data["machine"]["device_count"] == 2 and data["params"]["device_count"] == 2
    assert data["params"]["device_kind"] == data["machine"]["devices"][0]["kind"]
    rows = data["results"]
    timed = {(r["kind"], r["replicas"], r["local_steps"]): r for r in rows if r["kind"] != "terms"}
    assert set(timed) == {(k, n, h) for h in (1, 3) for k, n in (("single", 1), ("spo", 1), ("spo", 2), ("dp", 2),
                                                                  ("sub", 2))}
    for (kind, n, h), r in timed.items():
        assert r["repeats"] >= 10 and r["round_s"] > 0 and r["compile_s"] > 0
        assert r["step_s"] == pytest.approx(r["round_s"] / h)
        assert r["devices"] == (n if kind in ("spo", "dp") else 1)
        assert r["batch"] == (4 if kind == "sub" else 8)
        assert r["state_shards"] == r["devices"]  # the replica axis really is split over the devices
        assert (r["collectives"].get("all-reduce", 0) > 0) == (r["devices"] > 1), r["collectives"]
    terms = {r["replicas"]: r for r in rows if r["kind"] == "terms"}
    assert terms[1]["t_trans_s"] == 0.0 and terms[2]["t_trans_s"] > 0 and terms[2]["t_avg_s"] > 0
    assert terms[2]["t_trans"]["repeats"] >= 10 and terms[2]["t_avg"]["repeats"] >= 10
    assert [f["replicas"] for f in data["fits"]] == [1, 2]


@pytest.mark.processes
def test_model_columns_are_the_formulas_of_the_measured_terms(study):
    _, data = study
    rows = data["results"]
    single = {r["local_steps"]: r["step_s"] for r in rows if r["kind"] == "single"}
    sub = {(r["replicas"], r["local_steps"]): r["step_s"] for r in rows if r["kind"] == "sub"}
    terms = {r["replicas"]: r for r in rows if r["kind"] == "terms"}
    checked = 0
    for r in rows:
        if r["kind"] not in ("spo", "dp"):
            continue
        n, h, t_total = r["replicas"], r["local_steps"], single[r["local_steps"]]
        assert r["sf_measured"] == pytest.approx(t_total / (n * r["step_s"]), rel=1e-12)
        if r["kind"] == "spo":
            t = terms[n]
            overhead = 2 * t["t_trans_s"] + t["t_avg_s"]
            assert r["sf_model"] == pytest.approx(1 / (1 + overhead * n / (t_total * h)), rel=1e-12)
            t_b = t_total if n == 1 else sub[n, h]
            assert r["sf_eq55"] == pytest.approx(t_total / (n * (t_b + overhead / h)), rel=1e-12)
            checked += 1
    assert checked == 4


def test_add_model_by_hand():
    rows = [{"kind": "single", "replicas": 1, "local_steps": 5, "step_s": 2.0, "round_s": 10.0},
            {"kind": "sub", "replicas": 2, "local_steps": 5, "step_s": 1.1, "round_s": 5.5},
            {"kind": "spo", "replicas": 2, "local_steps": 5, "step_s": 1.25, "round_s": 6.25},
            {"kind": "dp", "replicas": 2, "local_steps": 5, "step_s": 2.5, "round_s": 12.5},
            {"kind": "terms", "replicas": 2, "t_avg_s": 1.0, "t_trans_s": 0.5}]
    assert spo.add_model(rows) == []  # one H: no line to fit
    row = rows[2]
    assert row["sf_measured"] == pytest.approx(0.8)  # 2 / (2 * 1.25)
    assert row["sf_model"] == pytest.approx(1 / 1.4)  # 1 / (1 + (2 * 0.5 + 1) * 2 / (2 * 5))
    assert row["t_spo_eq55_s"] == pytest.approx(1.5) and row["sf_eq55"] == pytest.approx(2 / 3)
    assert rows[3]["sf_measured"] == pytest.approx(0.4) and "sf_model" not in rows[3]
    rows += [{"kind": "spo", "replicas": 2, "local_steps": 15, "step_s": 0.9, "round_s": 13.5}]
    fit = spo.add_model(rows)
    assert fit[0]["step_s"] == pytest.approx(0.725) and fit[0]["round_overhead_s"] == pytest.approx(2.625)
    assert fit[0]["model_round_overhead_s"] == pytest.approx(2.0)


@pytest.mark.processes
def test_report_section(study):
    out, _ = study
    text = report.write_report(out, out / "RESULTS.md").read_text()
    assert "## spo" in text and "could not summarise" not in text and "Eq. 5.6" in text
    assert "| 2 | 3 |" in text  # the R = 2, H = 3 row


@pytest.mark.parametrize(("args", "message"), [
    (["--replicas", "3", "--batch-size", "8"], "--replicas: 3 does not divide --batch-size 8"),
    (["--local-steps", "0"], "--local-steps: expected a comma-separated list of positive integers"),
    (["--devices", "2"], "--devices: not an option of `popjax bench spo`"),
])
def test_bad_values_are_one_line_errors(args, message, tmp_path, capsys):
    from popjax import cli

    assert cli.main(["bench", "spo", "--out", str(tmp_path), *args]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err, err
    assert not list(tmp_path.iterdir())
