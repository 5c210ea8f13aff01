"""DvD (Parker-Holder et al. 2020) as in the fast-PBT paper: shared critic + diversity term.

``pop`` TD3 actors share one critic (``popjax.learners.shared_critic``); every member acts in
its own envs with exploration noise and all transitions go into one shared replay buffer
(``buffer_size`` rows in total). Each compiled training call makes K vectorized steps: the
shared critic is updated once per step on all members' sub-batches (loss averaged over the
population), and each actor's DPG gradient gets ``weight * grad(-log det(K + eps I))`` added,
``K`` the RBF kernel over the actors' behaviour embeddings (their actions on all ``pop * B``
states of the step). Policy delay 2 (TD3's default, as in the release).

The diversity weight comes from one of two sources:

* ``schedule`` (default, the fast-PBT release): indexed by the env steps summed over members
  ``x``: 0 for ``x < 5e4``, 0.3 for ``x < 3e5``, 0.5 for ``x < 7e5``, then 0.2.
  ``schedule_scale`` multiplies the thresholds (``"auto"`` = this run's total budget / 3e6, the
  release's budget, to compress the schedule into a short run). The count ``x`` lives in the
  state (``DvDState.env_steps``), so the weight is computed inside the compiled step and a
  resumed run continues the schedule exactly.
* ``bandit`` (the original DvD paper's adaptation): a Bernoulli Thompson-sampling bandit over
  ``bandit_arms`` (default ``(0.0, 0.5)``), Beta(1, 1) priors. At every evaluation the arm
  played since the previous one is rewarded 1 if the best member's eval return improved on the
  previous evaluation's, else 0; then an arm is drawn for the next period (``bandit_random``
  first draws are uniform, to seed the posteriors). Until the first evaluation the weight is 0.
  The counts and the chosen weight live in the state (``DvDState.bandit``), so the draw is part
  of the compiled ``after_eval``; ``summary.json`` reports them. Reward definition and arms
  follow Parker-Holder et al. 2020; details the paper leaves open, such as the
  number of uniform first draws, are this library's choice.

Iterations are the independent driver's (rollout, add, K steps after warm-up), with one
shared buffer and the shared-critic step; on ``--parallel pmap`` each device's members add
the transitions of every member (gathered) so the replicated buffer stays identical, and the
shared critic's reductions span all devices. metrics.csv gains ``diversity_loss``
(``-log det``), ``diversity_weight`` and ``embedding_distance`` (mean RMS action difference
between actor pairs on the step's states); rows logged before the first update hold NaN.

Options (``RunConfig.dvd``): ``rbf_scale`` (0.5), ``jitter`` (1e-6), ``normalize`` (True: the
squared distance is divided by the embedding size; ``normalize: false, rbf_scale: 1.0`` is the
release's kernel, which is ~identity at B = 256 so its diversity gradient vanishes: see
experiments/RESULTS.md),
``embedding_states`` (0 = all ``pop * B``), ``thresholds``, ``weights``, ``schedule_scale``,
``weight_source`` (``"schedule"`` or ``"bandit"``), ``bandit_arms``, ``bandit_random`` (2).
"""

from __future__ import annotations

import dataclasses
from typing import Annotated, Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct
from pydantic import Field, ValidationInfo, model_validator

from popjax import plots
from popjax.buffers import BufferState, make_uniform_buffer
from popjax.distributed import fetch
from popjax.drivers.base import (
    BuildContext,
    Counters,
    Driver,
    DriverDef,
    DriverHost,
    DriverOptions,
    Episodes,
    Rollout,
    run_config,
    train_unless,
)
from popjax.drivers.independent import random_actions
from popjax.envs.runner import Experience
from popjax.learners.shared_critic import DiversityConfig, SharedCriticState
from popjax.schema import INT32_MAX, Bool, Either, Float, Int, Number, NumberList, OneOf, problem
from popjax.types import Key, dummy_transition

RELEASE_TOTAL_STEPS = 3_000_000
METRICS = ("critic_loss", "member_critic_loss", "actor_loss", "q_mean", "diversity_loss", "diversity_weight",
           "embedding_distance")


@dataclasses.dataclass(frozen=True)
class DvDSettings:
    diversity: DiversityConfig
    thresholds: tuple[float, ...] = (5e4, 3e5, 7e5)  # env steps summed over members
    weights: tuple[float, ...] = (0.0, 0.3, 0.5, 0.2)
    schedule_scale: float = 1.0
    weight_source: str = "schedule"  # or "bandit"
    bandit_arms: tuple[float, ...] = (0.0, 0.5)
    bandit_random: int = 2  # first bandit draws that are uniform over the arms


def diversity_weight(env_steps: jax.Array, settings: DvDSettings) -> jax.Array:
    """The scheduled weight at ``env_steps`` (summed over members): ``weights[#thresholds <= x]``."""
    thresholds = jnp.asarray(settings.thresholds, jnp.float32) * settings.schedule_scale
    index = jnp.searchsorted(thresholds, jnp.asarray(env_steps, jnp.float32), side="right")
    return jnp.asarray(settings.weights, jnp.float32)[index]


def _numbers(description: str, min_len: int = 0, increasing: bool = False, **bounds):
    return Annotated[tuple[float, ...], NumberList(Number(**bounds), description, min_len=min_len,
                                                   increasing=increasing)]


class DvDOptions(DriverOptions):
    """``dvd`` options (see the module docstring and ``DiversityConfig``)."""

    rbf_scale: Float(gt=0) = Field(0.5, description="RBF kernel scale, K = exp(-D / (2 rbf_scale))")
    jitter: Float(gt=0) = Field(1e-6, description="eps in log det(K + eps I)")
    normalize: Bool = Field(True, description="divide the squared embedding distance by the embedding size")
    embedding_states: Int(ge=0, le=1_000_000) = Field(
        0, description="observations forming the behaviour embedding; 0 = all pop x batch_size of the step")
    thresholds: _numbers("an increasing list of numbers >= 0", increasing=True, ge=0) = Field(
        (5e4, 3e5, 7e5), description="schedule: env steps summed over members where the weight changes")
    weights: _numbers("a list of numbers >= 0 (one more than thresholds)", min_len=1, ge=0) = Field(
        (0.0, 0.3, 0.5, 0.2), description="schedule: the diversity weight before, between and after the thresholds")
    schedule_scale: Annotated[Any, Either(("auto",), Number(gt=0))] = Field(
        1.0, description="multiplies the thresholds; auto = this run's budget / the release's 3e6 steps")
    weight_source: OneOf(("schedule", "bandit")) = Field(
        "schedule", description="the weight follows the schedule or a Thompson-sampling bandit")
    bandit_arms: _numbers("a list of numbers >= 0 (at least two)", min_len=2, ge=0) = Field(
        (0.0, 0.5), description="the bandit's weights")
    bandit_random: Int(ge=0, le=1_000_000) = Field(2, description="first bandit draws that are uniform over the arms")

    @model_validator(mode="after")
    def _check(self, info: ValidationInfo):
        config = run_config(info)
        if config.pop_size < 2:
            raise problem(f"dvd needs at least 2 members, got {config.pop_size}", at=("pop_size",), absolute=True)
        if config.pop_size * config.total_env_steps > INT32_MAX:
            raise problem(f"pop_size x total_env_steps = {config.pop_size * config.total_env_steps} env steps in "
                          f"total, more than the int32 counter holds ({INT32_MAX})", at=("total_env_steps",),
                          absolute=True)
        if len(self.weights) != len(self.thresholds) + 1:
            raise problem(f"needs one more weight than thresholds ({len(self.thresholds)}), got "
                          f"{len(self.weights)}: {list(self.weights)}", at=("weights",))
        return self

    def settings(self, config) -> DvDSettings:
        scale = self.schedule_scale
        if scale == "auto":
            scale = config.pop_size * config.total_env_steps / RELEASE_TOTAL_STEPS
        diversity = DiversityConfig(rbf_scale=self.rbf_scale, jitter=self.jitter,
                                    embedding_states=self.embedding_states, normalize=self.normalize)
        return DvDSettings(diversity=diversity, thresholds=self.thresholds, weights=self.weights,
                           schedule_scale=float(scale), weight_source=self.weight_source,
                           bandit_arms=self.bandit_arms, bandit_random=self.bandit_random)


@struct.dataclass
class BanditState:
    """DvD's Thompson-sampling weight bandit (Bernoulli arms, Beta(1, 1) priors)."""

    successes: jax.Array  # [arms] int32
    failures: jax.Array  # [arms] int32
    arm: jax.Array  # int32: the arm played since the last evaluation (-1 before the first)
    draws: jax.Array  # int32: arms drawn so far
    last_best: jax.Array  # float32: the best member's return at the previous evaluation (NaN: none yet)
    weight: jax.Array  # float32: the weight of ``arm`` (0 before the first evaluation)


def bandit_init(n_arms: int) -> BanditState:
    zeros = jnp.zeros(n_arms, jnp.int32)
    return BanditState(successes=zeros, failures=zeros, arm=jnp.asarray(-1, jnp.int32),
                       draws=jnp.zeros((), jnp.int32), last_best=jnp.asarray(jnp.nan, jnp.float32),
                       weight=jnp.zeros((), jnp.float32))


def bandit_step(key: Key, bandit: BanditState, best_return: jax.Array, arms: tuple[float, ...],
                random_draws: int) -> BanditState:
    """Rewards the arm just played (1 iff ``best_return`` beat the previous evaluation's), draws the next.

    The first ``random_draws`` draws are uniform over the arms; later ones take the arm whose
    ``Beta(1 + successes, 1 + failures)`` sample is largest.
    """
    best_return = jnp.asarray(best_return, jnp.float32)
    played = (jnp.arange(len(arms)) == bandit.arm) & (bandit.arm >= 0)
    improved = best_return > bandit.last_best  # False while there is no previous evaluation (NaN)
    successes = bandit.successes + (played & improved)
    failures = bandit.failures + (played & ~improved)
    key_uniform, key_posterior = jax.random.split(key)
    uniform = jax.random.randint(key_uniform, (), 0, len(arms))
    posterior = jnp.argmax(jax.random.beta(key_posterior, 1.0 + successes.astype(jnp.float32),
                                           1.0 + failures.astype(jnp.float32)))
    arm = jnp.where(bandit.draws < random_draws, uniform, posterior).astype(jnp.int32)
    return BanditState(successes=successes, failures=failures, arm=arm, draws=bandit.draws + 1,
                       last_best=best_return, weight=jnp.asarray(arms, jnp.float32)[arm])


@struct.dataclass
class DvDState:
    learner: SharedCriticState  # actors [pop], shared critic
    buffer: BufferState  # one buffer fed by all members
    hparams: Any  # TD3HParams [pop]
    bandit: BanditState  # weight_source "bandit" (unused with the schedule)
    counters: Counters


class DvDHost(DriverHost):
    """Reports the bandit (counts, arm, last best) or the schedule in summary.json."""

    def __init__(self, settings: DvDSettings):
        super().__init__(lambda state: state.hparams)
        self.settings = settings

    def summary(self, state) -> dict[str, Any]:
        s = self.settings
        if s.weight_source != "bandit":
            return {**super().summary(state), "dvd_schedule": {
                "thresholds": [t * s.schedule_scale for t in s.thresholds], "weights": list(s.weights),
                "indexed_by": "env steps summed over members"}}
        b = fetch(state.bandit)
        last_best = float(b.last_best)
        return {**super().summary(state), "dvd_bandit": {
            "arms": list(s.bandit_arms), "successes": np.asarray(b.successes).tolist(),
            "failures": np.asarray(b.failures).tolist(), "arm": int(b.arm), "draws": int(b.draws),
            "last_best": None if np.isnan(last_best) else last_best}}


def build(ctx: BuildContext, options: DvDOptions | DvDSettings) -> Driver:
    """Shared-critic TD3 actors with the diversity term, trained like the independent population."""
    cfg, spec, members = ctx.config, ctx.spec, ctx.members
    settings = options.settings(cfg) if isinstance(options, DvDOptions) else options
    shared = ctx.learner_def.shared_critic(ctx.learner_config, spec, members.local, settings.diversity,
                                    device_axis=members.axis_name)
    buffer = make_uniform_buffer(cfg.buffer_size, cfg.batch_size)
    v_sample = jax.vmap(buffer.sample, in_axes=(0, None))
    rollout, k = Rollout(cfg.rollout_len, cfg.envs_per_member), cfg.updates_per_iter
    bandit = settings.weight_source == "bandit"

    def warming_up(state) -> jax.Array:
        return state.counters.env_steps < cfg.warmup_steps

    def init(key: Key) -> DvDState:
        hparams = members.take(ctx.hparams)
        return DvDState(learner=shared.init(key, hparams), buffer=buffer.init(dummy_transition(spec)),
                        hparams=hparams, bandit=bandit_init(len(settings.bandit_arms)), counters=Counters.zeros())

    def act(key: Key, state: DvDState, obs: jax.Array):
        keys = members.keys(key)
        actions = jax.lax.cond(warming_up(state),
                               lambda: jax.vmap(lambda k_, o: random_actions(spec, k_, o))(keys, obs),
                               lambda: shared.act(keys, state.learner, obs, state.hparams))
        return actions, None

    def train(key: Key, state: DvDState, weight: jax.Array):
        def one_step(learner, step_key):
            key_sample, key_update = jax.random.split(step_key)
            batch = v_sample(members.keys(key_sample), state.buffer)
            return shared.update(members.keys(key_update), learner, batch, state.hparams, weight)

        learner, metrics = jax.lax.scan(one_step, state.learner, jax.random.split(key, k))
        return learner, jax.tree.map(lambda m: m.mean(axis=0), metrics)

    def learn(key: Key, state: DvDState, experience: Experience):
        """Every member's transitions into the shared buffer, then K steps (after warm-up)."""
        warm = warming_up(state)
        transitions = members.gather(experience.transitions)
        flat = jax.tree.map(lambda x: x.reshape((-1,) + x.shape[2:]), transitions)
        counters = state.counters.advance(rollout.steps_per_member, jnp.where(warm, 0, k))
        state = state.replace(buffer=buffer.add(state.buffer, flat), counters=counters)
        # The schedule is indexed by the transitions added so far, this iteration's included.
        weight = state.bandit.weight if bandit else diversity_weight(
            counters.env_steps.astype(jnp.float32) * cfg.pop_size, settings)
        learner, metrics = train_unless(warm, train, key, state, weight, kept=state.learner)
        return state.replace(learner=learner), metrics

    def after_eval(key: Key, state: DvDState, returns: jax.Array):
        best = jnp.max(jnp.where(jnp.isfinite(returns), returns, -jnp.inf))  # all diverged: no improvement
        new = bandit_step(key, state.bandit, best, settings.bandit_arms, settings.bandit_random)
        return state.replace(bandit=new), None

    member_axes = DvDState(learner=shared.member_axes, buffer=False, hparams=True, bandit=False, counters=False)
    return Driver(init=init, interaction=rollout, act=act, learn=learn, evaluation=Episodes(cfg.eval_episodes),
                  policy=lambda state, obs: shared.policy(state.learner, obs), member_axes=member_axes,
                  host=DvDHost(settings), after_eval=after_eval if bandit else None,
                  acting_view=lambda state: state.replace(buffer=None))


def dvd_run_plots(run_dir) -> list:
    """``plots/dvd_diversity.png``: the weight (schedule and logged), -log det K, embedding distance."""
    rows = run_dir.read_metrics()
    if not rows:
        return []
    cfg = run_dir.read_config()
    summary = run_dir.read_summary() if (run_dir.path / "summary.json").exists() else {}
    title = f"dvd: {cfg.get('learner')} on {cfg.get('env')}, pop {cfg.get('pop_size')}"
    if "dvd_bandit" in summary:
        title += f"\nweight: Thompson-sampling bandit over {summary['dvd_bandit']['arms']}"
    return [plots.dvd_plot(rows, run_dir.path / "plots" / "dvd_diversity.png", title, summary.get("dvd_schedule"),
                           int(cfg.get("pop_size", 1)))]


DEFINITION = DriverDef(name="dvd", build=build, options=DvDOptions, plots=dvd_run_plots,
                       replay_transitions=lambda config: config.buffer_size, shared_critic=True)
