"""One resolve step: a ``RunConfig`` in, a checked ``Plan`` out (docs/design.md, "Planning a run").

``resolve`` turns the configuration into everything a run is built from (the env spec, the learner config and
made learner, the population's hparams, the driver's options and driver functions, the placement, the memory plan)
and runs every check of the run there, once, before anything is written or compiled: a refusal is one
``ConfigError`` line naming the field. ``popjax.experiment.build`` consumes the plan and checks nothing.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax

from popjax import distributed, planning
from popjax.config import ConfigError, RunConfig, make_learner_config
from popjax.drivers import DRIVERS
from popjax.drivers.base import BuildContext, Driver, DriverDef, DriverOptions, Rollout
from popjax.envs import registry
from popjax.learners import LEARNERS
from popjax.learners.base import Learner, LearnerDef, declared_state_problem
from popjax.loop import KeyPurpose, key_for
from popjax.population.hparams import Range, check_hparams, population_hparams
from popjax.population.members import Members
from popjax.population.sharding import Placement, acting_device, reserve_acting_device
from popjax.registry import SOURCES
from popjax.types import EnvSpec


@dataclasses.dataclass(frozen=True)
class Plan:
    """A checked run: what ``build`` makes the runner and the loop from (nothing in it is compiled).

    ``learner_config`` is the config the learner was made with (after ``RunFit.specialize``); ``driver`` holds the
    whole population, ``local`` the members of one program (the same object unless ``placement`` runs one program
    per device); ``memory`` is the run's memory plan (``memory_plan``)."""

    config: RunConfig
    spec: EnvSpec
    learner_def: LearnerDef
    learner_config: Any
    learner: Learner
    hparams: Any
    driver_def: DriverDef
    options: DriverOptions
    placement: Placement
    memory: planning.RunPlan
    driver: Driver
    local: Driver

    @property
    def members_independent(self) -> bool:
        """Whether the members are independent samples (``DriverDef.members_independent``)."""
        return self.driver_def.members_independent(self.options)


def memory_plan(config: RunConfig, spec: EnvSpec, driver: Driver, local: Driver, placement: Placement
                ) -> planning.RunPlan:
    """The run's memory plan (``popjax.planning``: the state's bytes from ``jax.eval_shape`` of the driver's init,
    the envs, one iteration's transitions, the evaluation) against the device's memory (``device_memory``), refused
    in one line naming what to lower when it does not fit (``planning.DoesNotFit``). Nothing is compiled here:
    ``popjax train --plan`` adds XLA's analysis of the compiled update."""
    return planning.check_fits(planning.plan_run(config, spec, driver, local, placement))


def resolve(config: RunConfig) -> Plan:
    """Checks ``config`` against the env, the learner, the driver and the machine, and returns its ``Plan``.

    Raises:
      ConfigError: one line naming the field to change; nothing has been written or compiled.
    """
    if config.overlap and registry.is_jax_env(config.env):
        raise ConfigError(f"overlap: only the gymnasium path steps envs on the host; on {config.env} acting and "
                          "learning are already one compiled call")
    check_processes(config)
    if config.overlap:
        reserve_acting_device(config.devices)  # before anything starts JAX
    definition = LEARNERS[config.learner]
    try:
        spec = registry.env_spec(config.env)
    except ValueError as err:
        raise ConfigError(f"env: {err}") from None
    if definition.action_kind != "any" and (definition.action_kind == "discrete") != spec.discrete:
        raise ConfigError(f"env: {config.learner} needs {definition.action_kind} actions but {config.env} has "
                          f"{spec.describe_actions()}")
    learner_config = make_learner_config(config)
    if definition.fit.check_env is not None and (found := definition.fit.check_env(learner_config, spec)) is not None:
        key, why = found  # an option the env cannot serve: one line now, not a traceback when first traced
        raise ConfigError(f"learner_config.{key}: {why}")
    try:
        placement = Placement(config.devices, config.parallel)
        if config.overlap:
            acting_device(config.devices)
        space = {name: Range.from_dict(r) for name, r in config.search_space.items()}
        hparams = population_hparams(definition.default_hparams(learner_config), config.pop_size, config.hparams,
                                     space, key_for(config.seed, KeyPurpose.HPARAMS))
        check_hparams(hparams)
    except ValueError as err:
        raise ConfigError(str(err)) from None
    driver_def = DRIVERS[config.driver]
    options = driver_def.parse_options(config)
    # A static setting the run allows (TD3: a fixed policy delay). ``writes_back``: the source writes back for every
    # learner; one that writes back only a refreshing learner's values (``keeps_refreshed``) serves learners whose
    # step refreshes, which is known once made (ReF-ER: chunk 1, nothing to specialize).
    if definition.fit.specialize is not None:
        learner_config = definition.fit.specialize(learner_config, hparams, config.updates_per_iter,
                                                   options.searched_hparams(),
                                                   exact_chunks=not SOURCES[config.buffer].writes_back)
    learner = definition.make(learner_config, spec)
    check_hooks(config, driver_def, learner)
    if not isinstance(learner.step, definition.step_kind):  # a registry entry that contradicts its learner
        raise TypeError(f"learner {config.learner}: make returned a {type(learner.step).__name__}, its LearnerDef "
                        f"declares {definition.step_kind.__name__}")
    if definition.pbt.policy_state or definition.pbt.optimizer_state:  # what copy: policy / reset_optimizer touch
        first = jax.tree.map(lambda x: x[0], hparams)
        state = jax.eval_shape(learner.init, key_for(config.seed, KeyPurpose.INIT), first)  # shapes only
        if (why := declared_state_problem(definition, state)) is not None:
            raise TypeError(f"learner {config.learner}: {why}")
    ctx = BuildContext(config=config, spec=spec, learner_def=definition, learner_config=learner_config,
                       learner=learner, hparams=hparams, members=Members(config.pop_size),
                       setup_key=key_for(config.seed, KeyPurpose.DRIVER_SETUP))
    driver = driver_def.build(ctx, options)
    local = (driver_def.build(dataclasses.replace(ctx, members=placement.members(config.pop_size)), options)
             if placement.per_device else driver)
    if not registry.is_jax_env(config.env):
        check_host_envs_split(config, driver)
    memory = memory_plan(config, spec, driver, local, placement)  # shapes only: before anything is allocated
    return Plan(config=config, spec=spec, learner_def=definition, learner_config=learner_config, learner=learner,
                hparams=hparams, driver_def=driver_def, options=options, placement=placement, memory=memory,
                driver=driver, local=local)


def check_hooks(config: RunConfig, driver_def: DriverDef, learner: Learner) -> None:
    """A driver that does not run the learner's replay hooks refuses it (never skips them)."""
    hooks = [what for what, used in (("multi-step windows", getattr(learner.step, "window", 1) > 1),
                                     ("maintenance steps", learner.maintain is not None),
                                     ("a dynamic replay", learner.shrink is not None),
                                     ("an observe hook", learner.observe is not None)) if used]
    if hooks and not driver_def.learner_hooks:
        allowed = ", ".join(name for name, d in DRIVERS.items()
                            if d.learner_hooks and d.accepts_step(type(learner.step)))
        raise ConfigError(f"learner: {config.learner} needs {' and '.join(hooks)}, which the {config.driver} driver "
                          f"does not run (allowed drivers: {allowed})")


def check_processes(config: RunConfig) -> None:
    """Over several processes the population is split over every device of the job."""
    if distributed.processes() > 1:
        if config.devices != jax.device_count():
            raise ConfigError(f"devices: a run over {distributed.processes()} processes uses every device of the job: "
                              f"set devices to {jax.device_count()}, or leave it out (got {config.devices})")
        if config.overlap:
            raise ConfigError("overlap: not available in a run over several processes")


def check_host_envs_split(config: RunConfig, driver: Driver) -> None:
    """Over several processes each one steps the gymnasium envs of its own members: the members must split
    evenly over the devices, and the driver must act and evaluate per member."""
    if distributed.processes() == 1:
        return
    if config.pop_size % config.devices:
        raise ConfigError(f"pop_size: over several processes the gymnasium envs are stepped where their members "
                          f"live, so pop_size must be a multiple of the {config.devices} devices "
                          f"(got {config.pop_size})")
    if not isinstance(driver.interaction, Rollout) or driver.evaluation.actors is not None:
        raise ConfigError(f"driver: {config.driver} acts with other policies than the members' own, which a run "
                          "over several processes supports only on JAX envs (probe:, brax:)")
