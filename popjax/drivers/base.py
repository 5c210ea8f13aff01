"""The driver contract: how a population is trained, as pure functions over one state pytree.

A driver is registered as a ``DriverDef`` in ``popjax.drivers.DRIVERS`` (like ``LEARNERS``).
Its ``build`` returns a ``Driver``: pure functions over **one driver-state pytree** that holds
everything that evolves (learner states, buffers, hparams, driver variables) and its own
``counters``. The generic loop (``popjax.loop``) composes them into one iteration:

    state, metrics  = prepare(key, state)                        # optional (CEM-RL: ask + train)
    experience      = <interaction>(act, state)                   # env stepping, done by a runner
    state, metrics  = learn(key, state, experience)               # add to buffers, train, tell
    ...at evaluations:
    returns         = <evaluation>(policy, state)                 # deterministic episodes
    state, info     = after_eval(key, state, returns)             # optional (PBT exploit, bandit)
    hparams         = host.propose(state, info)                   # optional host decision (PB2)
    state           = set_hparams(state, hparams)                 #   written by a compiled call
    host.record(state, env_steps, returns, info)                  # untraceable records (lineage)

On the JAX env path the first three are traced into one compiled call; on the host path
(gymnasium) ``prepare`` and ``learn`` are compiled and the envs are stepped on the host
between them. That is why the iteration is given in stages rather than as one function:
the same driver runs unchanged on both paths. ``after_eval`` is compiled too (a ``cond``
outside any ``vmap``, so PBT's exploit costs nothing when it is not due).

Rules: no PRNG keys in the state (every key is an argument); hyperparameters are traced
arrays; population-level code uses ``vmap``/``scan``, never a Python loop over members;
every metric is an array with a leading member axis. ``member_axes`` says which leaves have
the member axis (split over devices) and which are shared (replicated on every device).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from popjax.config import RunConfig
from popjax.distributed import fetch
from popjax.learners.base import ReplayStep
from popjax.population.hparams import hparams_table
from popjax.population.members import Members
from popjax.schema import Schema, validate
from popjax.types import EnvSpec, Key, Metrics, PyTree


@struct.dataclass
class Counters:
    """Progress counters every driver state carries (int32 scalars, replicated)."""

    env_steps: jax.Array  # env steps per member so far
    updates: jax.Array  # gradient steps per member so far

    @classmethod
    def zeros(cls) -> Counters:
        return cls(env_steps=jnp.zeros((), jnp.int32), updates=jnp.zeros((), jnp.int32))

    def advance(self, env_steps=0, updates=0) -> Counters:
        return Counters(env_steps=self.env_steps + env_steps, updates=self.updates + updates)


@dataclasses.dataclass(frozen=True)
class Rollout:
    """Interaction: continue the persistent envs (``envs_per_member`` per member) for ``steps``
    steps with the driver's ``act``; ``learn`` receives a ``popjax.envs.runner.Experience``."""

    steps: int
    envs_per_member: int

    @property
    def steps_per_member(self) -> int:
        return self.steps * self.envs_per_member


@dataclasses.dataclass(frozen=True)
class Episodes:
    """Interaction or evaluation: one episode in each of ``episodes`` fresh envs per actor.

    ``actors``: how many policies act (``None``: every member, in the order of the member
    axis; an int: that many actors not tied to members, e.g. 1 for CEM-RL's mean actor).
    As an interaction, ``learn`` receives a ``popjax.envs.runner.EpisodeBatch``.
    """

    episodes: int
    actors: int | None = None


class OwnInteraction:
    """Interaction a driver brings itself, when stepping envs between ``prepare`` and ``learn`` does not fit
    (HTS-RL: executor and actor threads with their own env replicas, learning while they step).

    The loop calls ``iterate`` instead of prepare/interaction/learn; it stays the loop's iteration: keys,
    evaluation, checkpoints and resume are the loop's. Evaluation still uses the loop's runner.
    ``iterate`` returns at a point where a checkpoint of the returned state is complete (the driver's
    host ``state_dict`` holds what lives outside the state, e.g. env snapshots). A failure of the
    interaction raises ``InteractionFailed``; the loop then checkpoints the state it passed in.
    """

    steps_per_member: int  # env steps per member per iteration

    def iterate(self, compiler, keys: tuple[Key, Key, Key], state) -> tuple[Any, Metrics]:
        """One iteration: ``keys`` = (prepare, collect, learn) keys of the loop's iteration; ``compiler``
        = the loop's ``Compiler`` (``compiler(name, fn, *args)`` -> compiled program)."""
        raise NotImplementedError

    def close(self) -> None:
        """Stops whatever the interaction started (threads, envs)."""


class InteractionFailed(RuntimeError):
    """An ``OwnInteraction`` could not finish its iteration (an env raised or hung)."""


class DriverHost:
    """The host-side part of a driver: what cannot be traced, and what gets logged.

    The default logs one row per member at each evaluation (``member``, ``eval_return``, the
    member's hparams and its learner metrics) and the hparams in the summary. Drivers with
    host records (PBT lineage) or other rows (CEM-RL's per generation) extend it.
    """

    def __init__(self, hparams: Callable[[Any], Any]):
        self.hparams = hparams  # state -> [pop] HParams

    def record(self, state, env_steps: int, returns: np.ndarray, info) -> None:
        """After each evaluation and ``after_eval``, with ``info`` on the host (numpy)."""

    def rows(self, state, metrics: Mapping[str, np.ndarray], returns: np.ndarray | None) -> list[dict[str, Any]]:
        """Rows for metrics.csv after an iteration; ``returns`` is None when it was not evaluated.

        The loop prefixes ``env_steps``, ``updates`` and ``wall_s``.
        """
        if returns is None:
            return []
        return member_rows(returns, self.hparams(state), metrics)

    def summary(self, state) -> dict[str, Any]:
        """Fields of summary.json beyond the loop's own (they override the loop's on a clash)."""
        return {"hparams": hparams_table(self.hparams(state))}

    def tables(self, state) -> dict[str, list[dict[str, Any]]]:
        """CSV files the run directory gets at the end of the run (``{file name: rows}``; PBT's lineage.csv)."""
        del state
        return {}

    def propose(self, state, info) -> Any | None:
        """Hparams ``[pop]`` the host chose after ``after_eval`` (PB2's GP bandit), which the loop writes into the
        state with the driver's compiled ``set_hparams`` before ``record``; None: nothing to change."""
        del state, info
        return None

    def state_dict(self) -> dict[str, Any]:
        """Host records to checkpoint (JSON)."""
        return {}

    def load_state_dict(self, data: Mapping[str, Any]) -> None:
        del data


class Maintenance(NamedTuple):
    """A rare population call the loop runs after an iteration in which ``counters.updates`` crossed a
    multiple of ``every`` (RLx2's topology step every ΔT updates): its own compiled program, outside the
    K-step scan, so the K-step program carries no branch for it. ``run(key, state) -> (state, metrics)``;
    its metrics join the iteration's."""

    every: int
    run: Callable[[Key, Any], tuple[Any, Metrics]]


class Driver(NamedTuple):
    """What ``DriverDef.build`` returns (see the module docstring for how the loop uses it).

    Attributes:
      init: ``key -> state``; the state has a ``counters: Counters`` field.
      interaction: ``Rollout`` or ``Episodes``: what the iteration does in the envs; or an
        ``OwnInteraction`` that runs the whole iteration itself (and needs no ``act``/``learn``).
      evaluation: ``Episodes``: how the policies are evaluated.
      policy: ``(state, obs [actors, episodes, ...]) -> actions``, deterministic.
      member_axes: prefix pytree of the state with ``True`` where leaves have the member axis.
      host: the ``DriverHost``.
      act: ``(key, state, obs [actors, envs, ...]) -> (actions, extras)`` while interacting (extras: what the
        learner records with each transition, ``ReplayStep.extras``; None: nothing); with a ``Rollout`` or
        ``Episodes`` interaction.
      learn: ``(key, state, experience) -> (state, metrics)``; advances ``counters``; with a ``Rollout`` or
        ``Episodes`` interaction.
      prepare: optional ``(key, state) -> (state, metrics)`` run before interacting.
      after_eval: optional ``(key, state, returns) -> (state, info)`` run after each evaluation.
      acting_view: optional ``state -> state``: the state with only what ``act`` reads (e.g. no
        replay buffer); the loop snapshots it to act while ``learn`` runs (``overlap``).
      maintenance: optional ``Maintenance``, run every ``every`` updates per member.
      set_hparams: optional ``(state, hparams [pop]) -> state``: writes the hparams ``host.propose`` chose.
      on_replace: optional ``(state, replaced [pop] bool) -> state``: brings what a member derives from its learner
        state up to date after another member's was copied into it (PBT's exploit; ReF-ER's stored ratios).
    """

    init: Callable[[Key], Any]
    interaction: Rollout | Episodes | OwnInteraction
    evaluation: Episodes
    policy: Callable[[Any, jax.Array], jax.Array]
    member_axes: PyTree
    host: DriverHost
    act: Callable[[Key, Any, jax.Array], tuple[jax.Array, Any]] | None = None
    learn: Callable[[Key, Any, Any], tuple[Any, Metrics]] | None = None
    prepare: Callable[[Key, Any], tuple[Any, Metrics]] | None = None
    after_eval: Callable[[Key, Any, jax.Array], tuple[Any, Any]] | None = None
    acting_view: Callable[[Any], Any] | None = None
    maintenance: Maintenance | None = None
    set_hparams: Callable[[Any, Any], Any] | None = None
    on_replace: Callable[[Any, jax.Array], Any] | None = None


@dataclasses.dataclass(frozen=True)
class BuildContext:
    """Everything a driver is built from (resolved and validated by ``popjax.experiment``).

    ``members`` is the population as seen by the compiled programs the driver's functions run
    in: all of it, or one device's slice on the ``pmap`` path (then ``members.local`` sets the
    shapes and ``members.keys`` the member keys). ``hparams`` are the initial ``[pop]``
    hyperparameters; ``setup_key`` is for the driver's own set-up randomness.
    """

    config: RunConfig
    spec: EnvSpec
    learner_def: Any  # popjax.learners.LearnerDef
    learner_config: Any
    learner: Any  # the single-member popjax.learners.Learner
    hparams: Any
    members: Members
    setup_key: Key


class DriverOptions(Schema):
    """A driver's options block (``--set <driver>={...}``, a YAML block named after the driver).

    A ``popjax.schema.Schema``: declare each option as a field with its kind, default and
    description (they are the CLI help); unknown keys and bad values are one-line
    ``ConfigError``s named ``<driver>.<key>``. Validators read the run's ``RunConfig`` with
    ``run_config(info)``; a check about a run field raises ``problem(..., at=("pop_size",),
    absolute=True)``. ``build(ctx, options)`` receives the validated instance.
    """

    def given(self, raw: Mapping[str, Any]) -> dict[str, Any]:
        """The keys the user gave, with their validated values (what ``config.yaml`` holds)."""
        return {key: _plain(getattr(self, key)) for key in raw}

    def searched_hparams(self) -> frozenset[str]:
        """The hparams this driver changes during the run (PBT: its search space); none by default."""
        return frozenset()

    def couples_members(self) -> bool:
        """Whether these options make the members of a driver whose members are independent interact (HTS's
        ``population: pbt``); no by default."""
        return False


class NoOptions(DriverOptions):
    """The options of a driver that takes none."""


def run_config(info) -> RunConfig:
    """The run's config inside a ``DriverOptions`` validator (``info``: pydantic's ValidationInfo)."""
    return (info.context or {})["config"]


def _plain(value):
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, tuple | list):
        return [_plain(v) for v in value]
    return value


def no_plots(run_dir) -> list[Path]:
    del run_dir
    return []


def per_member_buffers(config: RunConfig) -> int:
    """Replay transitions held when every member has its own ``buffer_size`` buffer."""
    return config.pop_size * config.buffer_size


@dataclasses.dataclass(frozen=True)
class DriverDef:
    """Registry entry of a driver.

    Attributes:
      name: ``--driver`` value; its options come from the config block of the same name.
      build: ``(ctx, options) -> Driver``; ``options`` is the validated ``options`` instance;
        raises ``ConfigError`` for set-ups that need the env (e.g. a buffer too small for episodes).
      options: the options schema, a ``DriverOptions`` subclass (``NoOptions``: none).
      plots: ``run_dir -> [paths]``: the driver's plots (learning curves are drawn for all).
      pmap: whether the driver runs on ``--parallel pmap`` (one program per device).
      replay_transitions: ``config -> int``, replay transitions held in total (memory check).
      steps: the kinds of learner step it trains (``ReplayStep``, ``RolloutStep``); drivers built on one
        replay buffer (CEM-RL, DvD) train replay steps only.
      sources: the replay sources (the run's ``buffer``) it samples from; None: every registered one.
      shared_critic: whether it trains actors against one shared critic (CEM-RL, DvD): the learner must offer
        that population (``LearnerDef.shared_critic``).
      learner_hooks: whether it runs every replay step the learners offer: multi-step windows, ``maintain`` and
        ``shrink`` hooks (HTS-RL's segment replay does not: a learner that needs them is refused at build).
      policy_copy: whether PBT's ``copy: policy`` fits it (nothing else a member carries depends on the learner
        state it copies: HTS-RL's lagged behaviour state and staged segment do).
      independent_members: whether its members never interact (no copies, no shared parts), unless its options
        couple them (``DriverOptions.couples_members``): only then is each member an independent sample, and
        ``summary.json``'s ``final_iqm`` bootstraps over members.
    """

    name: str
    build: Callable[[BuildContext, Any], Driver]
    options: type[DriverOptions] = NoOptions
    plots: Callable[[Any], list[Path]] = no_plots
    pmap: bool = True
    replay_transitions: Callable[[RunConfig], int] = per_member_buffers
    steps: tuple[type, ...] = (ReplayStep,)
    sources: tuple[str, ...] | None = ("uniform",)
    shared_critic: bool = False
    learner_hooks: bool = True
    policy_copy: bool = False
    independent_members: bool = False

    def members_independent(self, options: DriverOptions) -> bool:
        """Whether a run with these (validated) options has independent members (``independent_members``)."""
        return self.independent_members and not options.couples_members()

    def accepts_step(self, kind: type) -> bool:
        return kind in self.steps

    def accepts_source(self, name: str) -> bool:
        return self.sources is None or name in self.sources

    def parse_options(self, config: RunConfig, nested: bool = False) -> DriverOptions:
        """The run's options block of this driver, validated (``ConfigError`` naming ``<name>.<key>``)."""
        return validate(self.options, config.driver_options.get(self.name, {}), at=(self.name,),
                        context={"config": config}, nested=nested)


def member_rows(returns: np.ndarray, hparams, metrics: Mapping[str, np.ndarray]) -> list[dict[str, Any]]:
    """One row per member: ``member``, ``eval_return``, its hparams and its metrics."""
    table = hparams_table(hparams)
    metrics = fetch(dict(metrics))  # one transfer per metric
    rows = []
    for m, ret in enumerate(np.asarray(returns).tolist()):
        row = {"member": m, "eval_return": ret}
        row.update({name: values[m] for name, values in table.items()})
        row.update({name: float(values[m]) for name, values in sorted(metrics.items())})
        rows.append(row)
    return rows


def train_unless(skip: jax.Array, train: Callable, *args, kept):
    """``train(*args) -> (new, metrics)``, or ``(kept, NaN metrics)`` when the traced scalar ``skip``.

    A ``cond`` outside any ``vmap`` (only the taken branch runs). ``train`` is traced once: its
    output structure comes from a nested ``jit`` whose trace the call then reuses.
    """
    train = jax.jit(train)
    metrics = train.eval_shape(*args)[1]
    nan = jax.tree.map(lambda s: jnp.full(s.shape, jnp.nan, s.dtype), metrics)
    return jax.lax.cond(skip, lambda: (kept, nan), lambda: train(*args))
