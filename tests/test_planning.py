"""The run's plan (popjax.planning): its bytes agree with the live state after init and with XLA's analysis of the
compiled update at pop 1 and pop 4; its FLOPs count loops; a run that cannot fit is refused in one line, exit 2,
nothing written, at about the largest value that fits."""

from __future__ import annotations

import math
import re
import shlex

import jax
import jax.numpy as jnp
import pytest

from popjax import cli, planning
from popjax.config import ConfigError, make_config
from popjax.experiment import build
from popjax.resolve import resolve

SMALL = {"env": "probe:pendulum", "envs_per_member": 2, "rollout_len": 4, "batch_size": 32, "buffer_size": 2_000,
         "total_env_steps": 2_000, "warmup_steps": 100, "eval_episodes": 2}
LEARNER_CASES = {
    "td3": {"learner_config": {"hidden": [16, 16]}},
    "sac": {"learner_config": {"hidden": [16, 16]}},
    "dqn": {"env": "probe:cartpole", "learner_config": {"hidden": [16, 16]}},
    "fast_td3": {"learner_config": {"critic_hidden": [32, 16], "actor_hidden": [16], "num_atoms": 11}},
}


def _config(learner: str, pop: int = 4, **options):
    return make_config(**{**SMALL, "learner": learner, "pop_size": pop, **LEARNER_CASES[learner], **options})


def _plan(config, **options):
    resolved = resolve(config)
    return planning.plan_run(config, resolved.spec, resolved.driver, resolved.local, resolved.placement, **options)


def _nbytes(tree) -> int:
    return sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(tree))


@pytest.mark.parametrize("learner", list(LEARNER_CASES))
def test_the_plan_counts_the_live_state_after_init(learner):
    """Per member: learner state (params + optimizer), replay and env state within 10 % of the arrays init made."""
    config = _config(learner)
    plan = _plan(config)
    loop = build(resolve(config))
    state, env_state = loop.initial_state()
    pop = config.pop_size
    live = {"learner": _nbytes(state.learner) / pop, "replay": _nbytes(state.buffer) / pop,
            "env": _nbytes(env_state) / pop}
    planned = {"learner": plan.per_member["params"] + plan.per_member["optimizer"],
               "replay": plan.per_member["replay"], "env": plan.per_member["env"]}
    for part, value in live.items():
        assert value > 0 and abs(planned[part] - value) <= 0.1 * value, (part, planned[part], value)
    assert plan.per_member["optimizer"] > 0 and plan.per_member["params"] > 0
    total = sum(plan.total(part) for part in planning.STATE_PARTS)
    assert abs(total - _nbytes(state)) <= 0.1 * _nbytes(state)


def test_td3_params_and_adam_moments_by_hand():
    """TD3 on pendulum (3 obs, 1 action), hidden [16, 16]: actor 3*16+16 + 16*16+16 + 16+1 = 353 weights, each of
    the twin critics 4*16+16 + 272 + 17 = 369; params = actor, critics and their targets; Adam keeps two moments
    of the actor and the critics (and an int32 count each)."""
    plan = _plan(_config("td3"))
    weights = 353 + 2 * 369
    assert plan.per_member["params"] == 2 * weights * 4
    assert plan.per_member["optimizer"] == 2 * weights * 4 + 2 * 4
    assert plan.per_member["other"] == 4 + 8 * 4  # the int32 step counter; 8 hparams
    row = (2 * 3 + 1 + 1 + 1) * 4  # obs, next_obs, action, reward, terminated: float32
    assert plan.per_member["replay"] >= 2_000 * row


@pytest.mark.parametrize("learner", ["td3", "fast_td3"])
def test_the_plan_agrees_with_xla_at_pop_1_and_4(learner):
    """XLA's argument bytes of the compiled update grow by the planned per-member bytes (state and one iteration's
    transitions), within 10 %; the FLOPs per iteration grow 4x."""
    one, four = (_plan(_config(learner, pop), compile=True, peak_flops="1e11") for pop in (1, 4))
    for plan in (one, four):
        assert plan.program is not None and plan.program.alias_bytes > 0  # the state is updated in place
    per_member = sum(one.per_member[part] for part in (*planning.STATE_PARTS, "experience"))
    grown = (four.program.argument_bytes - one.program.argument_bytes) / 3
    assert abs(grown - per_member) <= 0.1 * per_member, (grown, per_member)
    assert abs(one.program.argument_bytes - per_member) <= 0.1 * per_member
    assert four.program.flops == pytest.approx(4 * one.program.flops, rel=0.1)
    assert one.step_s == pytest.approx(one.program.flops / 1e11)
    assert one.fits and one.need_bytes >= one.program.peak_bytes


def test_the_flops_count_every_loop_iteration():
    """A matrix product counts 2 m n k; a scan its body times its length (XLA's cost_analysis counts it once)."""
    x = jax.ShapeDtypeStruct((64, 32), jnp.float32)
    w = jax.ShapeDtypeStruct((32, 32), jnp.float32)
    dot = lambda x, w: x @ w  # noqa: E731
    assert planning.jaxpr_flops(jax.make_jaxpr(dot)(x, w).jaxpr) == 2 * 64 * 32 * 32

    def layers(x, w):
        return jax.lax.scan(lambda c, _: (jnp.tanh(c @ w), None), x, None, length=8)[0]

    one_layer = planning.jaxpr_flops(jax.make_jaxpr(lambda x, w: jnp.tanh(x @ w))(x, w).jaxpr)
    assert planning.jaxpr_flops(jax.make_jaxpr(layers)(x, w).jaxpr) == 8 * one_layer
    xla = jax.jit(lambda x, w: jnp.tanh(x @ w)).lower(x, w).compile().cost_analysis()
    xla = xla[0] if isinstance(xla, list) else xla
    assert one_layer == pytest.approx(xla["flops"], rel=0.1)


def test_device_memory_is_the_devices_own_or_the_option():
    memory, source = planning.device_memory()
    device = jax.devices()[0]
    stats = device.memory_stats() or {}
    if "bytes_limit" in stats:
        assert memory == stats["bytes_limit"]
    else:
        from popjax.config import machine_memory

        assert (memory, source) == (machine_memory(), f"{device.platform}: host RAM")
    assert make_config(device_memory="141GB").device_memory == 141 * 10**9
    assert make_config(device_memory="80 GiB").device_memory == 80 * 2**30
    assert make_config(device_memory=1.5e9).device_memory == 1_500_000_000
    assert make_config().device_memory == "auto"
    plan = _plan(_config("td3", device_memory="141GB"))
    assert (plan.device_memory, plan.memory_source) == (141 * 10**9, "given")
    for bad in ("lots", "0GB", -5, True, "12 parsecs"):
        with pytest.raises(ConfigError, match=r"^device_memory: "):
            make_config(device_memory=bad)


def _refusal(config) -> str:
    with pytest.raises(planning.DoesNotFit) as err:
        resolve(config)
    assert err.value.plan.need_bytes > err.value.plan.device_memory
    return str(err.value)


def _most(line: str) -> int:
    return int(line.split("at most about ")[1].split()[0].rstrip(";"))


@pytest.mark.parametrize(("field", "options"), [
    ("buffer_size", {"buffer_size": 1_000_000}),
    ("pop_size", {"learner_config": {"hidden": [512, 512]}, "pop_size": 8}),
])
def test_a_run_that_cannot_fit_names_the_option_and_the_largest_value_that_fits(field, options):
    config = _config("td3", **{"device_memory": "40MB", **options})
    line = _refusal(config)
    assert line.startswith(f"{field}: ") and "\n" not in line and "of device memory (given)" in line, line
    most = _most(line)
    assert 0 < most < getattr(config, field)
    resolve(make_config(**{**config.to_dict(), field: most}))  # the largest value fits
    _refusal(make_config(**{**config.to_dict(), field: math.ceil(most * 1.1) + 1}))  # 10 % more does not


def test_plan_prints_the_plan_and_writes_nothing(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    argv = ["train", "--learner", "td3", "--env", "probe:pendulum", "--pop", "2", "--envs-per-member", "4",
            "--rollout-len", "4", "--batch-size", "32", "--buffer-size", "1000", "--steps", "1000",
            "--warmup", "100", "--learner-config", "hidden=[16, 16]", "--plan", "--peak-flops", "100G"]
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    for text in ("params", "optimizer", "replay (1000 rows/member)", "update program (XLA, one device)",
                 "FLOPs per iteration", "predicted update time", "(given)", ": fits"):
        assert text in out, (text, out)
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("plan", [True, False])
def test_a_population_that_cannot_fit_is_refused_in_one_line_exit_2_nothing_written(plan, tmp_path, monkeypatch,
                                                                                      capsys):
    monkeypatch.chdir(tmp_path)
    argv = ["train", "--learner", "td3", "--env", "probe:pendulum", "--pop", "16", "--envs-per-member", "4",
            "--buffer-size", "1e6", "--device-memory", "500MB", *(["--plan"] if plan else [])]
    assert cli.main(argv) == 2
    captured = capsys.readouterr()
    assert captured.err.count("\n") == 1 and captured.err.startswith("popjax: error: buffer_size: 16 replay buffers"), \
        captured.err
    assert "(allowed: at most about" in captured.err and "of device memory (given)" in captured.err
    assert ("does NOT fit" in captured.out) == plan  # --plan shows the plan it refused
    assert not list(tmp_path.iterdir())


def test_peak_flops_is_checked_and_only_with_plan(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert cli.main(["train", "--peak-flops", "1e12"]) == 2
    assert capsys.readouterr().err.startswith("popjax: error: peak_flops: only with --plan")
    assert planning.parse_flops("989T") == 989e12 and planning.parse_flops(4.5e11) == 4.5e11
    with pytest.raises(ConfigError, match=r"^peak_flops: "):
        planning.parse_flops("fast")
    assert not list(tmp_path.iterdir())


def test_the_guide_plan_examples_print_what_they_show(tmp_path, monkeypatch, capsys):
    """docs/planning.md: the plan of "Planning a run: memory and work before anything runs" prints the parts it
    shows (its figures depend on the machine), and "A run that cannot fit" prints its line exactly; nothing written."""
    from docs_blocks import block

    def argv(example):  # the block's first line; the others are what it prints
        return shlex.split(example.text.splitlines()[0].removeprefix("$ popjax "))

    monkeypatch.chdir(tmp_path)
    shown = block("docs/planning.md", "Planning a run: memory and work before anything runs", 0)
    assert cli.main(argv(shown)) == 0
    printed = capsys.readouterr().out.splitlines()
    expected = shown.text.splitlines()[1:]
    figures = lambda line: re.sub(r"[\d.]+(e[+-]?\d+)?( [KMGTP]?B)?", "#", " ".join(line.split()))  # noqa: E731
    assert [figures(line) for line in printed] == [figures(line) for line in expected]
    refused = block("docs/planning.md", "A run that cannot fit", 0)
    assert cli.main(argv(refused)) == 2
    assert capsys.readouterr().err == refused.text.splitlines()[1] + "\n"
    assert not list(tmp_path.iterdir())
