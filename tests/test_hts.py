"""The HTS-RL driver: determinism, lag bookkeeping, barriers, the runtime models, failures and resume."""

from __future__ import annotations

import hashlib
import threading
import time

import gymnasium as gym
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import popjax
from popjax.config import ConfigError, make_config
from popjax.drivers import DRIVERS, hts
from popjax.drivers.base import BuildContext, InteractionFailed
from popjax.envs.registry import env_spec
from popjax.envs.runner import HostRunner
from popjax.envs.toy import SleepyToyEnv
from popjax.learners import LEARNERS
from popjax.learners.base import Learner, RolloutStep, without_extras
from popjax.loop import KeyPurpose, Loop, key_for
from popjax.population.hparams import population_hparams
from popjax.population.members import Members
from popjax.population.sharding import Placement
from popjax_bench import hts_model

ALPHA, POP, ENVS = 8, 2, 4  # 8 envs: 8 executors with one env each
LR = 0.05


# --- a tiny on-policy learner (the on-policy contract, Eq. 6) -------------------------------------
def tiny_learner(versioned: bool = False) -> Learner:
    """Linear softmax policy, REINFORCE on the immediate reward, plain SGD; the rollout step evaluates the
    gradient at the behaviour parameters and applies it to the current ones (Liu et al. 2020, Eq. 6).

    ``versioned``: the state counts its updates; ``act`` returns ``version % 4`` and every update logs
    (new version, behaviour version, the action of the data's first row), for the lag bookkeeping."""

    def init(key, hp):
        del hp
        return {"w": 0.1 * jax.random.normal(key, (16, 4)), "version": jnp.zeros((), jnp.int32),
                "log": jnp.full((32, 3), -1, jnp.int32)}

    def act(key, state, obs, hp):
        del hp
        if versioned:
            return jnp.full(obs.shape[:1], state["version"] % 4, jnp.int32)
        return jax.random.categorical(key, obs @ state["w"])

    def policy(state, obs):
        return jnp.argmax(obs @ state["w"], axis=-1)

    def loss(w, trajectory):
        tr = trajectory.transitions
        logp = jax.nn.log_softmax(tr.obs @ w)
        chosen = jnp.take_along_axis(logp, tr.action[..., None], axis=-1)[..., 0]
        return -jnp.mean(chosen * tr.reward)

    def update_rollout(key, state, trajectory, hp, behaviour):
        del key, hp
        grad = jax.grad(loss)(behaviour["w"], trajectory)
        version = state["version"] + 1
        entry = jnp.stack([version, behaviour["version"], trajectory.transitions.action[0, 0]])
        log = state["log"].at[state["version"]].set(entry)
        return {"w": state["w"] - LR * grad, "version": version, "log": log}, {"loss": loss(state["w"], trajectory)}

    return Learner(init=init, act=without_extras(act), policy=policy, step=RolloutStep(update_rollout))


def toy_factory(kind="exponential", mean_s=2e-4):
    return lambda g: gym.wrappers.TimeLimit(SleepyToyEnv(kind, mean_s), 50)


def make_loop(learner=None, seed=0, segments=4, factory=None, compiler=None, **options):
    """A Loop over the HTS driver with ``learner`` (the tiny one by default) on the toy env."""
    config = make_config(learner="dqn", env="gym:popjax/HtsToy-v0", driver="hts", pop_size=POP,
                         envs_per_member=ENVS, seed=seed, total_env_steps=segments * options.get("alpha", ALPHA) * ENVS,
                         batch_size=16, buffer_size=4096, warmup_steps=0, progress=False, eval_episodes=1,
                         hts={"alpha": ALPHA, "executors": 8, **options})
    spec = env_spec(config.env)
    definition = LEARNERS["dqn"]
    learner_config = definition.config_cls(batch_size=16)
    hparams = population_hparams(definition.default_hparams(learner_config), POP, {}, {},
                                 key_for(seed, KeyPurpose.HPARAMS))
    learner = learner if learner is not None else tiny_learner()
    ctx = BuildContext(config=config, spec=spec, learner_def=definition, learner_config=learner_config,
                       learner=learner, hparams=hparams, members=Members(POP),
                       setup_key=key_for(seed, KeyPurpose.DRIVER_SETUP))
    driver = hts.build(ctx, DRIVERS["hts"].parse_options(config), factory or toy_factory())
    runner = HostRunner(lambda n, s, f: popjax.envs.registry.make_host_env(config.env, n, s, f), POP, ENVS, seed)
    loop = Loop(config, driver, driver, runner, Placement(1, "sharding"))
    if compiler is not None:
        loop.compiler = compiler
    return loop


def digest(*trees) -> str:
    h = hashlib.sha256()
    for leaf in jax.tree.leaves(trees):
        a = np.asarray(leaf)
        h.update(str(a.dtype).encode() + str(a.shape).encode())
        h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()


def run_hashes(loop, segments):
    """Runs ``segments`` iterations; returns (hash of every segment's stored values, hash of the final state)."""
    state, _ = loop.initial_state()
    stored = []
    try:
        for s in range(segments):
            state, _, _ = loop.step(state, None)
            store = loop.driver.interaction.executors.storage[s % 2]
            stored.append(digest(store.arrays()))
    finally:
        loop.driver.interaction.close()
    return stored, digest(state.learner)


@pytest.fixture(scope="module")
def compiler():
    from popjax.loop import Compiler

    return Compiler()  # the programs do not depend on seed, actors or threads: compiled once for the file


# --- D1, D2, D3: determinism ---------------------------------------------------------------------
@pytest.mark.long
def test_d1_threads_equal_serial_schedule_bitwise(compiler):
    serial = run_hashes(make_loop(serial=True, compiler=compiler), 4)
    for actors in (1, 2, 3, 4):
        threaded = run_hashes(make_loop(actors=actors, compiler=compiler), 4)
        assert threaded == serial, f"{actors} actors"
    assert len(set(serial[0])) == 4  # the segments differ from each other (the hashes see the data)


def test_d2_seed_decides(compiler):
    first = run_hashes(make_loop(seed=3, actors=2, compiler=compiler), 3)
    again = run_hashes(make_loop(seed=3, actors=3, compiler=compiler), 3)
    other = run_hashes(make_loop(seed=4, actors=2, compiler=compiler), 3)
    assert first == again
    assert first[1] != other[1] and first[0][0] != other[0][0]


@pytest.mark.long
def test_d3_alpha_changes_results():
    a = run_hashes(make_loop(alpha=4, segments=4, actors=2), 4)
    b = run_hashes(make_loop(alpha=8, segments=2, actors=2), 2)
    assert a[1] != b[1]


# --- D4: row independence of the fixed-shape act --------------------------------------------------
def test_d4_act_rows_independent():
    loop = make_loop()
    state, _ = loop.initial_state()
    p = loop.driver.interaction.programs
    acting = p["acting_view"](state)
    act = jax.jit(p["act"])
    key = jax.random.key(0)
    rng = np.random.default_rng(0)
    obs = rng.normal(size=(POP, ENVS, 16)).astype(np.float32)
    t = rng.integers(0, ALPHA, (POP, ENVS)).astype(np.int32)
    # logits of the fixed-shape batch: the policy's float outputs, not only the sampled actions
    logits = jax.jit(lambda o: jax.vmap(lambda w, x: x @ w)(state.learner["w"], o))
    base, base_logits = np.asarray(act(key, acting, obs, t)[0]), np.asarray(logits(obs))  # act: (actions, extras)
    for _ in range(5):
        other = rng.normal(size=obs.shape).astype(np.float32)
        other[1, 2] = obs[1, 2]
        t2 = rng.integers(0, ALPHA, t.shape).astype(np.int32)
        t2[1, 2] = t[1, 2]
        assert np.asarray(act(key, acting, other, t2)[0])[1, 2] == base[1, 2]
        assert np.asarray(logits(other))[1, 2].tobytes() == base_logits[1, 2].tobytes()
    loop.driver.interaction.close()


# --- D5, D6, D9: lag bookkeeping, Eq. 6, publishing only at barriers -------------------------------
def versioned_run(segments=5, **options):
    loop = make_loop(learner=tiny_learner(versioned=True), segments=segments, actors=2, **options)
    seen = []  # (segment, acting version of every row of every act call)
    segment = [0]
    loop.driver.interaction.on_act = lambda acting, obs, t, valid: seen.append(
        (segment[0], int(acting.learner["version"][0])))
    state, _ = loop.initial_state()
    for s in range(segments):
        segment[0] = s
        state, _, _ = loop.step(state, None)
    loop.driver.interaction.close()
    return np.asarray(state.learner["log"][0]), int(state.learner["version"][0]), int(state.counters.updates), seen


def test_d5_lag_bookkeeping_and_d9_barrier_publishing():
    segments = 5
    log, version, updates, seen = versioned_run(segments)
    assert version == segments and updates == segments  # #updates = #segments (the final update ran)
    for s in range(1, segments + 1):  # the update producing theta_s: behaviour theta_{s-2} on D_{s-1}
        new, behaviour, data_action = log[s - 1]
        assert new == s and behaviour == max(s - 2, 0) and data_action == max(s - 2, 0) % 4, (s, log[s - 1])
    for s in range(segments):  # segment s acts with theta_{s-1}, and only with it (D9)
        versions = {v for seg, v in seen if seg == s}
        assert versions == {max(s - 1, 0)}, (s, versions)
    assert len(seen) >= segments * ALPHA  # every step asked the actors at least once


def test_d5_without_correction_and_lockstep():
    log, version, _, _ = versioned_run(4, delayed_gradient="none")
    for s in range(2, 5):  # the current state, theta_{s-1}, is passed as behaviour
        assert tuple(log[s - 1][:2]) == (s, s - 1)
    log, version, updates, seen = versioned_run(4, lockstep=True)
    assert version == 4 and updates == 4
    for s in range(1, 5):  # lock-step: D_{s-1} collected by theta_{s-1} and updated right away, no lag
        assert tuple(log[s - 1]) == (s, s - 1, (s - 1) % 4)
    assert {(seg, v) for seg, v in seen} == {(s, s) for s in range(4)}


@pytest.mark.long
def test_d6_eq6_update():
    learner = tiny_learner()
    key = jax.random.key(1)
    state = learner.init(key, None)
    behaviour = learner.init(jax.random.key(2), None)
    loop = make_loop()
    zero = loop.initial_state()[0].pending
    rng = np.random.default_rng(1)
    trajectory = jax.tree.map(lambda x: x[0], zero)
    trajectory = trajectory.replace(transitions=trajectory.transitions.replace(
        obs=jnp.asarray(rng.normal(size=(ALPHA, ENVS, 16)), jnp.float32),
        action=jnp.asarray(rng.integers(0, 4, (ALPHA, ENVS)), jnp.int32),
        reward=jnp.asarray(rng.normal(size=(ALPHA, ENVS)), jnp.float32)))
    loop.driver.interaction.close()

    def plain(w):  # the synchronous update by hand: w - lr * grad at w
        def loss(w):
            tr = trajectory.transitions
            logp = jax.nn.log_softmax(tr.obs @ w)
            return -jnp.mean(jnp.take_along_axis(logp, tr.action[..., None], -1)[..., 0] * tr.reward)
        return w - LR * jax.grad(loss)(w)

    lag0, _ = learner.step.update(key, state, trajectory, None, state)
    np.testing.assert_array_equal(lag0["w"], plain(state["w"]))
    lag1, _ = learner.step.update(key, state, trajectory, None, behaviour)
    expected = state["w"] + (plain(behaviour["w"]) - behaviour["w"])  # gradient at the behaviour copy
    np.testing.assert_allclose(lag1["w"], expected, rtol=0, atol=1e-6)
    assert not np.allclose(lag1["w"], lag0["w"])


# --- D7, D8: the runtime and latency models -----------------------------------------------------------
@pytest.mark.parametrize("n, alpha", [(8, 1), (8, 4), (8, 16), (8, 128), (16, 1), (16, 64)])
def test_d7_claim1_against_monte_carlo(n, alpha):
    beta = 2.0
    model = hts_model.expected_max_gamma(n, alpha, beta)
    mc = hts_model.monte_carlo_max_gamma(n, alpha, beta, samples=100_000)
    assert abs(model - mc) / mc < 0.03
    if alpha == 1:
        assert abs(mc - hts_model.expected_max_exponential(n, beta)) / mc < 0.01


def test_d7_small_n_underestimates():
    exact = hts_model.expected_max_exponential(2, 2.0)
    assert exact == 0.75 and hts_model.expected_max_gamma(2, 1, 2.0) < 0.9 * exact


@pytest.mark.parametrize("load", [0.25, 0.5, 0.75])
def test_d8_claim2_mm1(load):
    simulated = hts_model.simulate_mm1(load * 4000.0, 4000.0, 150_000, seed=2)
    assert abs(simulated - hts_model.mm1_mean_length(load)) / hts_model.mm1_mean_length(load) < 0.08


# --- off-policy learners --------------------------------------------------------------------------
@pytest.mark.long
def test_off_policy_dqn_threads_equal_serial(compiler):
    dqn = LEARNERS["dqn"].make(LEARNERS["dqn"].config_cls(batch_size=16), env_spec("gym:popjax/HtsToy-v0"))
    serial = run_hashes(make_loop(learner=dqn, serial=True), 3)
    threaded = run_hashes(make_loop(learner=dqn, actors=3), 3)
    assert threaded == serial


# --- options, failures, resume ----------------------------------------------------------------------
@pytest.mark.parametrize("options, field", [({"alpha": 0}, "hts.alpha"), ({"executors": 1.5}, "hts.executors"),
                                            ({"actors": 0}, "hts.actors"),
                                            ({"actors": 3, "executors": 2}, "hts.actors"),
                                            ({"executors": 9}, "hts.executors"),
                                            ({"delayed_gradient": "ratio"}, "hts.delayed_gradient")])
def test_bad_options(tmp_path, options, field):
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
        popjax.train(learner="dqn", env="gym:popjax/HtsToy-v0", driver="hts", pop_size=2, envs_per_member=4,
                     out_dir=tmp_path / "run", hts=options)
    assert not (tmp_path / "run").exists()


class FailingToy(SleepyToyEnv):
    """The toy env that raises (or hangs) at its ``at``-th step on an executor thread while ``armed``."""

    armed, mode, at = False, "raise", 20

    def __init__(self):
        super().__init__("exponential", 1e-4)
        self._steps = 0

    def step(self, action):
        self._steps += 1
        if FailingToy.armed and self._steps == FailingToy.at and threading.current_thread() is not \
                threading.main_thread():
            if FailingToy.mode == "raise":
                raise RuntimeError("simulated env crash")
            time.sleep(3600)
        return super().step(action)


gym.register(id="popjax-test/FailingToy-v0", entry_point=FailingToy, max_episode_steps=50)
FAILING = dict(learner="dqn", env="gym:popjax-test/FailingToy-v0", driver="hts", pop_size=2, envs_per_member=4,
               total_env_steps=6 * 8 * 4, eval_interval=8 * 4, checkpoint_interval=8 * 4, warmup_steps=32,
               batch_size=16, buffer_size=2048, eval_episodes=1, progress=False)


@pytest.mark.long
@pytest.mark.parametrize("mode", ["raise", "hang"])
def test_executor_failure_stops_with_checkpoint_and_resume_is_exact(tmp_path, mode):
    FailingToy.armed, FailingToy.mode, FailingToy.at = False, mode, 8 * 3 + 5  # in segment 3
    options = {"alpha": 8, "executors": 4, "actors": 2, "timeout_s": 1.0}
    whole = popjax.train(out_dir=tmp_path / "whole", hts=options, **FAILING)
    FailingToy.armed = True
    start = time.monotonic()
    with pytest.raises(InteractionFailed, match="simulated env crash" if mode == "raise" else "hangs"):
        popjax.train(out_dir=tmp_path / "cut", hts=options, **FAILING)
    assert time.monotonic() - start < 30
    FailingToy.armed = False
    resumed = popjax.resume(tmp_path / "cut")
    assert resumed.summary["env_steps"] == whole.summary["env_steps"]
    assert digest(resumed.state.learner, resumed.state.buffer) == digest(whole.state.learner, whole.state.buffer)
    assert resumed.summary["final_returns"] == whole.summary["final_returns"]


@pytest.mark.long
def test_cli_reports_failure(tmp_path, capsys):
    from popjax.cli import main

    FailingToy.armed, FailingToy.mode, FailingToy.at = True, "raise", 3
    try:
        code = main(["train", "--learner", "dqn", "--env", "gym:popjax-test/FailingToy-v0", "--driver", "hts",
                     "--pop", "2", "--envs-per-member", "4", "--steps", "256", "--out", str(tmp_path / "run"),
                     "--no-progress", "--set", "hts={alpha: 8, executors: 4}", "--set", "warmup_steps=32"])
    finally:
        FailingToy.armed = False
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1 and len(err) == 1 and "simulated env crash" in err[0] and "last barrier" in err[0]


# --- popjax bench hts ---------------------------------------------------------------------------------
@pytest.mark.long
def test_bench_hts_tiny(tmp_path):
    from popjax_bench import hts as bench_hts
    from popjax_bench import report

    payload = bench_hts.run(step_times=("constant", "exponential"), alpha=(2, 4), actors=(1,), executors=4,
                            mean_ms=0.5, repeats=10, steps_per_point=8, real_update=False, allow_busy=True,
                            out_dir=str(tmp_path), plot=True)
    assert {(r["step_time"], r["alpha"], r["mode"]) for r in payload["results"]} == {
        (k, a, m) for k in ("constant", "exponential") for a in (2, 4) for m in ("lockstep", "hts")}
    for r in payload["results"]:
        assert r["segments"] >= 10 and r["steps_per_s"] > 0 and r["predicted_steps_per_s"] > 0
        lock, hts_ = hts_model.segment_times(4, r["alpha"], r["step_time"], 5e-4, r["learner_s"])
        assert r["predicted_segment_s"] == (lock if r["mode"] == "lockstep" else hts_)
    assert len(payload["ratios"]) == 4 and "pass" in payload["h2"]
    assert (tmp_path / "hts.json").exists() and (tmp_path / "hts.png").exists()
    assert "HTS / lock-step" in "\n".join(report.section_hts({**payload, "_file": "hts"}))


# --- PBT at barriers (population: pbt) ----------------------------------------------------------------
PBT_HTS = dict(learner="a2c", env="gym:popjax/HtsToy-v0", driver="hts", pop_size=4, envs_per_member=2,
               total_env_steps=12 * 8 * 2, eval_interval=2 * 8 * 2, eval_episodes=1, progress=False,
               learner_config={"hidden": [8]}, pbt={"interval": 2 * 8 * 2, "quantile": 0.25})


def hts_pbt(**hts_options):
    return {**PBT_HTS, "hts": {"alpha": 8, "executors": 4, "population": "pbt", **hts_options}}


@pytest.mark.long
def test_pbt_at_barriers_is_deterministic_whatever_the_threads(tmp_path):
    serial = popjax.train(out_dir=tmp_path / "serial", **hts_pbt(serial=True))
    threaded = popjax.train(out_dir=tmp_path / "threaded", **hts_pbt(actors=2))
    lineage = serial.summary["lineage"]
    assert serial.summary["pbt"]["rounds"] == 5 and len(lineage) == 5  # one loser per round, none at the end
    assert {e["member"] for e in lineage} != {e["parent"] for e in lineage}
    assert any(e["new_hparams"] != e["old_hparams"] for e in lineage)
    assert threaded.summary["lineage"] == lineage
    assert digest(threaded.state) == digest(serial.state)
    assert (serial.out_dir / "plots" / "pbt_lineage.png").exists()


def test_pbt_loser_copies_learner_behaviour_and_staged_segment_of_its_parent():
    from popjax.experiment import build

    loop = build(make_config(**hts_pbt()))
    state, _ = loop.initial_state()
    try:
        for _ in range(2):  # two segments: 32 env steps per member, the PBT interval
            state, _, _ = loop.step(state, None)
    finally:
        loop.driver.interaction.close()
    before = jax.device_get(state)
    after, info = loop.after_eval(state, np.array([0.0, 3.0, 2.0, 1.0]))  # member 0 is the loser
    assert info["ready"] and info["loser"].tolist() == [True, False, False, False]
    parent = int(info["parent"][0])
    assert parent == 1  # the top quarter is member 1 alone
    take = lambda tree, m: jax.tree.map(lambda x: np.asarray(x)[m], tree)  # noqa: E731
    for field in hts.PBT_CARRIED:
        assert digest(take(getattr(after, field), 0)) == digest(take(getattr(before, field), parent)), field
        assert digest(take(getattr(after, field), 1)) == digest(take(getattr(before, field), 1)), field
        assert digest(take(getattr(before, field), 0)) != digest(take(getattr(before, field), 1)), field
    assert digest(take(after.hparams, 0)) != digest(take(before.hparams, 1))  # explored
    assert int(after.pbt.rounds) == 1 and int(after.pbt.last_ready) == 32


@pytest.mark.long
def test_pbt_at_barriers_resumes_exactly_after_an_env_crash(tmp_path):
    options = {**FAILING, "learner": "a2c", "pop_size": 4, "envs_per_member": 2, "warmup_steps": 0,
               "eval_interval": 16, "checkpoint_interval": 16, "total_env_steps": 8 * 8 * 2,
               "pbt": {"interval": 16, "quantile": 0.25},
               "hts": {"alpha": 8, "executors": 4, "actors": 2, "timeout_s": 1.0, "population": "pbt"}}
    FailingToy.armed, FailingToy.mode, FailingToy.at = False, "raise", 8 * 5 + 3  # in segment 5
    whole = popjax.train(out_dir=tmp_path / "whole", **options)
    FailingToy.armed = True
    try:
        with pytest.raises(InteractionFailed, match="simulated env crash"):
            popjax.train(out_dir=tmp_path / "cut", **options)
    finally:
        FailingToy.armed = False
    resumed = popjax.resume(tmp_path / "cut")
    assert len(whole.summary["lineage"]) >= 3
    assert resumed.summary["lineage"] == whole.summary["lineage"]
    assert digest(resumed.state) == digest(whole.state)


@pytest.mark.parametrize("options, field", [({"hts": {"population": "cem"}}, "hts.population"),
                                            ({"hts": {"population": "pbt"}, "pbt": {"quantile": 0.1}},
                                             "pbt.quantile"),
                                            ({"hts": {"population": "pbt"}, "pbt": {"interval": 0}},
                                             "pbt.interval")])
def test_bad_population_options(tmp_path, options, field):
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
        base = {k: v for k, v in PBT_HTS.items() if k != "pbt"}  # no pbt block (pbt=None is refused)
        popjax.train(**{**base, **options}, out_dir=tmp_path / "run")
    assert not (tmp_path / "run").exists()


@pytest.mark.long
def test_update_counter_counts_the_learners_gradient_steps_as_the_synchronous_loop(tmp_path):
    run = popjax.train(out_dir=tmp_path / "run", learner="ppo", env="gym:popjax/HtsToy-v0", driver="hts", pop_size=2,
                       envs_per_member=2, total_env_steps=3 * 8 * 2, eval_interval=3 * 8 * 2, eval_episodes=1,
                       progress=False, learner_config={"hidden": [8], "epochs": 2, "minibatches": 2},
                       hts={"alpha": 8, "executors": 2})
    assert run.summary["updates"] == 3 * 2 * 2  # 3 segments (#updates = #segments), 2 epochs x 2 minibatches
