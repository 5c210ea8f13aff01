"""DvD (Parker-Holder et al. 2020) as in the fast-PBT paper: shared critic + diversity term (reference §6).

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
  The counts live in the driver (saved in checkpoints and ``summary.json``), the chosen weight
  in ``DvDState.bandit_weight``. Reward definition and arms follow Parker-Holder et al. 2020 as
  summarised in reference §6; that paper is not in ``shared/papers``, so details such as the
  number of uniform first draws are this library's choice.

The whole driver is a population of the standard kind (``init/act/policy/add/train`` over a
``DvDState`` pytree), so the base ``Trainer`` runs it unchanged, with its keys, evaluation,
metrics, checkpoints and exact resume. metrics.csv gains ``diversity_loss`` (``-log det``),
``diversity_weight`` and ``embedding_distance`` (mean RMS action difference between actor
pairs on the step's states).

Options (``RunConfig.dvd``): ``rbf_scale`` (0.5), ``jitter`` (1e-6), ``normalize`` (True: the
squared distance is divided by the embedding size; ``normalize: false, rbf_scale: 1.0`` is the
release's kernel, which is ~identity at B = 256 so its diversity gradient vanishes: see
experiments/RESULTS.md),
``embedding_states`` (0 = all ``pop * B``), ``thresholds``, ``weights``, ``schedule_scale``,
``weight_source`` (``"schedule"`` or ``"bandit"``), ``bandit_arms``, ``bandit_random`` (2).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from popjax.buffers import Buffer, BufferState, make_uniform_buffer
from popjax.config import ConfigError
from popjax.drivers.collect import HostCollector, JaxCollector
from popjax.drivers.population import Population
from popjax.experiment import Trainer
from popjax.learners.shared_critic import DiversityConfig, SharedCriticState, SharedCriticTD3, make_shared_critic_td3
from popjax.types import Key, Metrics, Transition, dummy_transition

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


def settings_from_config(config) -> DvDSettings:
    from popjax.drivers.cemrl import parse_options

    defaults = {"rbf_scale": 0.5, "jitter": 1e-6, "normalize": True, "embedding_states": 0,
                "thresholds": (5e4, 3e5, 7e5), "weights": (0.0, 0.3, 0.5, 0.2), "schedule_scale": 1.0,
                "weight_source": "schedule", "bandit_arms": (0.0, 0.5), "bandit_random": 2}
    given = dict(config.dvd)
    auto = given.get("schedule_scale") == "auto"
    if auto:
        given.pop("schedule_scale")
    opts = parse_options("dvd", given, defaults)
    if auto:
        opts["schedule_scale"] = config.pop_size * config.total_env_steps / RELEASE_TOTAL_STEPS
    if config.pop_size < 2:
        raise ConfigError(f"pop_size: dvd needs at least 2 members, got {config.pop_size}")
    if opts["rbf_scale"] <= 0 or opts["jitter"] <= 0 or opts["schedule_scale"] <= 0:
        raise ConfigError("dvd: rbf_scale, jitter and schedule_scale must be > 0")
    if opts["embedding_states"] < 0:
        raise ConfigError(f"dvd.embedding_states: must be >= 0, got {opts['embedding_states']}")
    if opts["weight_source"] not in ("schedule", "bandit"):
        raise ConfigError(f"dvd.weight_source: {opts['weight_source']!r} is not one of 'schedule', 'bandit'")
    try:
        arms = tuple(float(x) for x in opts["bandit_arms"])
    except (TypeError, ValueError):
        raise ConfigError(f"dvd.bandit_arms: expected a list of numbers, got {opts['bandit_arms']!r}") from None
    if len(arms) < 2 or min(arms) < 0:
        raise ConfigError(f"dvd.bandit_arms: needs at least two weights >= 0, got {list(arms)}")
    if int(opts["bandit_random"]) < 0:
        raise ConfigError(f"dvd.bandit_random: must be >= 0, got {opts['bandit_random']}")
    thresholds, weights = tuple(float(x) for x in opts["thresholds"]), tuple(float(x) for x in opts["weights"])
    if len(weights) != len(thresholds) + 1 or list(thresholds) != sorted(thresholds):
        raise ConfigError(f"dvd: needs increasing thresholds and one more weight than thresholds, got "
                          f"thresholds={list(thresholds)}, weights={list(weights)}")
    diversity = DiversityConfig(rbf_scale=opts["rbf_scale"], jitter=opts["jitter"],
                                embedding_states=int(opts["embedding_states"]), normalize=opts["normalize"])
    return DvDSettings(diversity=diversity, thresholds=thresholds, weights=weights,
                       schedule_scale=float(opts["schedule_scale"]), weight_source=opts["weight_source"],
                       bandit_arms=arms, bandit_random=int(opts["bandit_random"]))


@struct.dataclass
class DvDState:
    learner: SharedCriticState  # actors [pop], shared critic
    buffer: BufferState  # one buffer fed by all members
    hparams: Any  # TD3HParams [pop]
    env_steps: jax.Array  # int32, transitions added so far, summed over members (indexes the schedule)
    bandit_weight: jax.Array  # float32, the bandit's current weight (weight_source "bandit")


def make_dvd_population(shared: SharedCriticTD3, buffer: Buffer, spec, pop_size: int, updates_per_iter: int,
                        settings: DvDSettings) -> Population:
    """DvD as standard population functions over a ``DvDState`` (see module doc)."""
    v_sample = jax.vmap(buffer.sample, in_axes=(0, None))

    def init(key: Key, hparams) -> DvDState:
        return DvDState(learner=shared.init(key, hparams), buffer=buffer.init(dummy_transition(spec)),
                        hparams=hparams, env_steps=jnp.zeros((), jnp.int32),
                        bandit_weight=jnp.zeros((), jnp.float32))

    def act(key: Key, state: DvDState, obs: jax.Array) -> jax.Array:
        return shared.act(key, state.learner, obs, state.hparams)

    def random_act(key: Key, obs: jax.Array) -> jax.Array:
        return jax.random.uniform(key, obs.shape[:2] + (spec.action_dim,), minval=-1.0, maxval=1.0)

    def policy(state: DvDState, obs: jax.Array) -> jax.Array:
        return shared.policy(state.learner, obs)

    def add(state: DvDState, transitions: Transition) -> DvDState:
        """``[pop, n, ...]`` transitions, all into the shared buffer."""
        flat = jax.tree.map(lambda x: x.reshape((-1,) + x.shape[2:]), transitions)
        n = jax.tree.leaves(flat)[0].shape[0]
        return state.replace(buffer=buffer.add(state.buffer, flat), env_steps=state.env_steps + n)

    def train(key: Key, state: DvDState) -> tuple[DvDState, Metrics]:
        if settings.weight_source == "bandit":
            weight = state.bandit_weight
        else:
            weight = diversity_weight(state.env_steps, settings)

        def one_step(learner, step_key):
            key_sample, key_update = jax.random.split(step_key)
            batch = v_sample(jax.random.split(key_sample, pop_size), state.buffer)
            return shared.update(jax.random.split(key_update, pop_size), learner, batch, state.hparams, weight)

        learner, metrics = jax.lax.scan(one_step, state.learner, jax.random.split(key, updates_per_iter))
        return state.replace(learner=learner), jax.tree.map(lambda m: m.mean(axis=0), metrics)

    return Population(init, act, random_act, policy, add, train, pop_size)


def adapt_setup(setup):
    """Replaces the independent population of ``experiment.build`` by the DvD population."""
    config = setup.config
    if config.learner != "td3":
        raise ConfigError(f"learner: the dvd driver trains TD3 actors with a shared critic; got {config.learner!r}")
    if config.devices != 1:
        raise ConfigError("devices: the dvd driver runs on one device (its shared critic is not sharded yet)")
    settings = settings_from_config(config)
    shared = make_shared_critic_td3(setup.learner_config, setup.spec, config.pop_size, settings.diversity)
    buffer = make_uniform_buffer(config.buffer_size, config.batch_size)
    population = make_dvd_population(shared, buffer, setup.spec, config.pop_size, config.updates_per_iter, settings)
    old = setup.collector
    if isinstance(old, JaxCollector):
        collector = JaxCollector(population, old.vec_env, old.envs_per_member, old.rollout_len)
    elif isinstance(old, HostCollector):
        collector = HostCollector(population, old.env, old.eval_env_factory, old.envs_per_member, old.rollout_len)
    else:
        raise TypeError(f"unexpected collector {type(old).__name__}")
    return dataclasses.replace(setup, learner=shared, population=population, collector=collector)


@dataclasses.dataclass
class WeightBandit:
    """Bernoulli Thompson sampling over diversity weights (DvD's adaptation); host side, saved with the run."""

    arms: tuple[float, ...]
    random_draws: int
    successes: list[int] = dataclasses.field(default_factory=list)
    failures: list[int] = dataclasses.field(default_factory=list)
    arm: int = -1  # the arm played since the last evaluation; -1 before the first
    draws: int = 0
    last_best: float | None = None  # best member's return at the previous evaluation

    def __post_init__(self):
        self.successes = self.successes or [0] * len(self.arms)
        self.failures = self.failures or [0] * len(self.arms)

    def observe_and_choose(self, key: Key, best_return: float) -> float:
        """Rewards the arm just played (1 iff ``best_return`` beat the previous evaluation), draws the next."""
        if self.arm >= 0:
            improved = self.last_best is not None and best_return > self.last_best
            (self.successes if improved else self.failures)[self.arm] += 1
        self.last_best = best_return
        key_uniform, key_posterior = jax.random.split(key)
        if self.draws < self.random_draws:
            self.arm = int(jax.random.randint(key_uniform, (), 0, len(self.arms)))
        else:
            alpha = 1.0 + jnp.asarray(self.successes, jnp.float32)
            beta = 1.0 + jnp.asarray(self.failures, jnp.float32)
            self.arm = int(jnp.argmax(jax.random.beta(key_posterior, alpha, beta)))
        self.draws += 1
        return self.arms[self.arm]

    def state_dict(self) -> dict[str, Any]:
        return {"arms": list(self.arms), "successes": list(self.successes), "failures": list(self.failures),
                "arm": self.arm, "draws": self.draws, "last_best": self.last_best}


class DvDDriver:
    """Hook object for the base Trainer: the schedule lives in the state pytree, the bandit here."""

    name = "dvd"

    def __init__(self, settings: DvDSettings | None = None):
        self.settings = settings
        self.bandit = None
        if settings is not None and settings.weight_source == "bandit":
            self.bandit = WeightBandit(settings.bandit_arms, settings.bandit_random)

    def after_eval(self, key, state, returns, env_steps):
        del env_steps
        if self.bandit is None:
            return state
        finite = np.asarray(returns)[np.isfinite(returns)]
        best = float(finite.max()) if finite.size else -float("inf")  # all diverged: no improvement
        weight = self.bandit.observe_and_choose(key, best)
        return state.replace(bandit_weight=jnp.asarray(weight, jnp.float32))

    def state_dict(self) -> dict[str, Any]:
        if self.settings is None:
            return {}
        if self.bandit is not None:
            return {"dvd_bandit": self.bandit.state_dict()}
        s = self.settings
        return {"dvd_schedule": {"thresholds": [t * s.schedule_scale for t in s.thresholds],
                                 "weights": list(s.weights), "indexed_by": "env steps summed over members"}}

    def load_state_dict(self, data: dict[str, Any]) -> None:
        saved = data.get("dvd_bandit")
        if self.bandit is not None and saved is not None:
            if tuple(saved["arms"]) != self.bandit.arms:
                raise ConfigError(f"dvd.bandit_arms: the run was started with {saved['arms']}, "
                                  f"not {list(self.bandit.arms)}")
            self.bandit = WeightBandit(self.bandit.arms, self.bandit.random_draws, list(saved["successes"]),
                                       list(saved["failures"]), saved["arm"], saved["draws"], saved["last_best"])


class DvDTrainer(Trainer):
    """The base loop; evaluations before the first update log the DvD metrics as NaN, so every row
    of metrics.csv has them (and the plots find the columns from the first row on)."""

    def _log_eval(self, state, returns, metrics):
        filled = {name: np.full(self.config.pop_size, np.nan) for name in METRICS}
        filled.update(metrics)
        super()._log_eval(state, returns, filled)
