"""One compiled ``independent`` population whose member slots are handed from trial to trial.

The loop (``popjax.loop.Loop``) runs iterations and evaluations as for any run. What a sweep adds is one compiled
``refill`` program: for the slots in a mask it writes a trial's hparams, freshly initialised learner state (params
and optimizer, from a key of the trial's number), an empty replay slice, and optionally zeroes the counters (a new
generation: every slot refilled, so the random warm-up runs again). Hparams are traced arrays, so a refill changes
values, never shapes: nothing recompiles (``traces`` counts every tracing).

Acting and learning keys are ``(seed, purpose, iteration)`` folded with the slot: after a refill at iteration t the
slot draws the keys of iterations > t, which no earlier trial drew. The counters are the population's: a trial's own
env steps and updates are counted from the values at its refill. A slot refilled mid-generation (after a pruned
trial) starts after the warm-up: it learns from its own transitions at once, without uniform random actions.
The persistent envs are not reset by a refill (a trial's first training episode may start mid-way; evaluation
episodes are separate and always start afresh).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from popjax.config import ConfigError, RunConfig, make_learner_config
from popjax.distributed import fetch, processes
from popjax.drivers import DRIVERS
from popjax.drivers.base import BuildContext, Rollout
from popjax.drivers.replay import make_source
from popjax.experiment import build
from popjax.learners import LEARNERS
from popjax.learners.base import ReplayStep
from popjax.loop import KeyPurpose, Loop, key_for
from popjax.population.hparams import hparam_names, population_hparams
from popjax.population.members import Members, indexed_keys


class SlotPopulation:
    """``pop_size`` slots trained together; ``refill`` hands slots to new trials in place."""

    def __init__(self, config: RunConfig, instrument: Callable[[str, Any], Callable] | None = None):
        checked = build(config, instrument=instrument)  # every check of the run, nothing compiled
        if processes() > 1 or checked.placement.per_device or checked.overlap:
            raise ConfigError("sweep: one process, one program (parallel: pmap and overlap are not available)")
        if not isinstance(checked.local.interaction, Rollout):
            raise ConfigError(f"driver: a sweep trains with {config.driver}'s rollouts only")
        # The learner is made again without ``RunFit.specialize``: a sweep changes every searched hparam per member
        # (TD3 would otherwise fix the policy delay when the first trials happen to share one).
        definition = LEARNERS[config.learner]
        learner_config = make_learner_config(config)
        spec = checked.runner.spec
        learner = definition.make(learner_config, spec)
        template = population_hparams(definition.default_hparams(learner_config), config.pop_size, config.hparams)
        self.context = BuildContext(config=config, spec=spec, learner_def=definition, learner_config=learner_config,
                                    learner=learner, hparams=template, members=Members(config.pop_size),
                                    setup_key=key_for(config.seed, KeyPurpose.DRIVER_SETUP))
        driver_def = DRIVERS[config.driver]
        driver = driver_def.build(self.context, driver_def.parse_options(config))
        self.loop = Loop(config, driver, driver, checked.runner, checked.placement, instrument=instrument)
        self.config = config
        self.size = config.pop_size
        self.steps_per_iteration = driver.interaction.steps_per_member
        self.env_steps = 0  # the population's counter (host copy): env steps per member since the generation began
        self.names = hparam_names(template)
        self._dtypes = {name: np.asarray(getattr(template, name)).dtype for name in self.names}
        self._refill_fn = _refill_program(self.context)
        self.state, self.env_state = self.loop.initial_state()

    @property
    def traces(self) -> dict[str, int]:
        """How often each compiled program was traced (1 each: nothing recompiled)."""
        return dict(self.loop.compiler.traces)

    def _plain_state(self) -> None:
        """The state and env state as pytrees: a loop that keeps them packed between iterations
        (``Loop.unpacked``) unpacks them for reads beyond an iteration, as it does at evaluations."""
        unpacked = getattr(self.loop, "unpacked", None)
        if unpacked is not None:
            self.state, self.env_state = unpacked(self.state), unpacked(self.env_state)

    def hparams(self) -> dict[str, np.ndarray]:
        """``{name: [pop] values}`` of the state (host copies)."""
        self._plain_state()
        table = fetch(self.loop.driver.host.hparams(self.state))
        return {name: np.array(getattr(table, name)) for name in self.names}

    def refill(self, assignments: Mapping[int, tuple[int, Mapping[str, float]]], new_generation: bool) -> None:
        """Hands each slot of ``assignments`` (``slot -> (trial number, {hparam: value})``) to its trial."""
        mask = np.zeros(self.size, bool)
        trials = np.zeros(self.size, np.int32)
        columns = self.hparams()
        for slot, (number, values) in assignments.items():
            mask[slot], trials[slot] = True, number
            for name, value in values.items():
                columns[name][slot] = value
        hparams = type(self.context.hparams)(**{n: jnp.asarray(columns[n], self._dtypes[n]) for n in self.names})
        key = jax.random.fold_in(key_for(self.config.seed, KeyPurpose.INIT, 0), 1)  # not the first init's key
        args = (key, self.state, jnp.asarray(mask), hparams, jnp.asarray(trials), jnp.asarray(new_generation))
        program = self.loop.compiler("refill", self._refill_fn, *args, donate=(1,),
                                     out_shardings=self.loop.state_shardings)
        self.state = program(*args)
        if new_generation:
            self.env_steps = 0
            self.loop.maintained_at = 0

    def step(self) -> None:
        """One iteration of every slot."""
        self.state, self.env_state, _ = self.loop.step(self.state, self.env_state)
        self.env_steps += self.steps_per_iteration

    def evaluate(self) -> np.ndarray:
        """Every slot's mean deterministic return (the run's evaluation protocol)."""
        self._plain_state()
        return self.loop.evaluate(self.state)

    def updates(self) -> int:
        """Updates per member since the generation began (read from the state)."""
        return self.loop.counters(self.state)[1]

    def close(self) -> None:
        if not self.loop.runner.jax_path:
            self.loop.runner.close()


def _refill_program(ctx: BuildContext):
    """``(key, state, mask [pop], hparams [pop], trial numbers [pop], new generation) -> state``."""
    learner = ctx.learner
    source = make_source(ctx) if isinstance(learner.step, ReplayStep) else None

    def refill(key, state, mask, hparams, trials, new_generation):
        fresh = jax.lax.map(lambda member: learner.init(*member), (indexed_keys(key, trials), hparams))
        pick = lambda new, old: jnp.where(mask.reshape(mask.shape + (1,) * (old.ndim - 1)), new, old)  # noqa: E731
        replay = state.buffer
        if source is not None:
            empty = jax.vmap(lambda _: source.init())(jnp.arange(mask.shape[0]))
            replay = jax.tree.map(pick, empty, replay)
        counters = jax.tree.map(lambda c: jnp.where(new_generation, jnp.zeros_like(c), c), state.counters)
        return state.replace(learner=jax.tree.map(pick, fresh, state.learner), buffer=replay,
                             hparams=jax.tree.map(pick, hparams, state.hparams), counters=counters)

    return refill


def trial_key(seed: int, number: int):
    """The key a trial's learner state is initialised from (``refill``): for tests and checks."""
    key = jax.random.fold_in(key_for(seed, KeyPurpose.INIT, 0), 1)
    return indexed_keys(key, jnp.asarray([number], jnp.int32))[0]


def values_of(params: Mapping[str, Any], names: Sequence[str]) -> dict[str, float]:
    """A trial's params restricted to hparam names (floats)."""
    return {name: float(params[name]) for name in names if name in params}
