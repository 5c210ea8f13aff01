"""The actor-critic core: what TD3 and SAC both offer, and what ReF-ER, RLx2, MEMR and SPO wrap.

A core (``td3.td3_core``, ``sac.sac_core``) is a ``Core`` of pure functions over its own state. Its update is
written once and takes a ``Steps``, the few places a wrapper may change it:

- how the networks step (``critic``, ``actor``: ``(params, grads, opt_state, lr) -> (params, opt_state)``; RLx2:
  masked gradients) and what happens to the targets after each Polyak average (``critic_targets``,
  ``actor_targets``; RLx2: re-mask);
- the TD target (``target(key, state, batch, hp) -> y [B]``; None: the core's one-step target; RLx2: multi-step
  over windows) and the transitions ``[B, ...]`` the losses are about (``sample(batch)``; windows: the first);
- the actor's objective from its **per-sample** losses, one signature for every core: ``actor_objective(actor
  params, terms [B]) -> loss`` (default: the mean; ReF-ER masks far samples and adds its KL penalty).

The critic's per-sample weights (importance weights, ReF-ER's near mask, MEMR's segment weights) are the
update's ``weights`` argument, and the update returns the per-sample ``|TD error|`` (the larger twin's).
``critic_grads`` and ``actor_grads`` are the update's two gradients on their own, for wrappers that step the
networks themselves (SPO's local steps, RLx2's dense topology scores, the shared critic of CEM-RL and DvD).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, NamedTuple

import jax

from popjax.learners.base import adam_step, identity
from popjax.types import PyTree


def mean_objective(actor: PyTree, terms: jax.Array) -> jax.Array:
    """The plain actor objective: the mean of its per-sample losses."""
    del actor
    return terms.mean()


@dataclasses.dataclass(frozen=True)
class Steps:
    """How a core's update changes the networks; the defaults are the plain algorithm (see the module doc)."""

    critic: Callable = adam_step
    actor: Callable = adam_step
    critic_targets: Callable[[PyTree], PyTree] = identity
    actor_targets: Callable[[PyTree], PyTree] = identity
    target: Callable | None = None
    sample: Callable = identity
    actor_objective: Callable[[PyTree, jax.Array], jax.Array] = mean_objective


PLAIN = Steps()


class Behaviour(NamedTuple):
    """An exploring action and the diagonal Gaussian it was drawn from, in the network's (pre-squash) action
    space: ``action = squash(u)``, ``u ~ N(mean, exp(log_std)^2)`` (TD3: clip; SAC: tanh)."""

    action: jax.Array
    mean: jax.Array
    log_std: jax.Array
    u: jax.Array


class Core(NamedTuple):
    """One actor-critic algorithm's functions over its state (``TD3State``, ``SACState``).

    init(key, hp) -> state;  policy(state, obs) -> action
    act(key, state, obs, hp) -> Behaviour: the exploring action with the Gaussian it was drawn from
    gaussian(actor params, obs, hp) -> (mean, log_std): the exploring Gaussian of any actor params
    critic_grads(key, state, batch, weights [B] | None, hp, steps=PLAIN) -> ((loss, q [2, B], y [B]), grads): the TD
        target (``steps.target`` or the core's one-step one), the critic loss over ``steps.sample(batch)`` and its
        gradient at ``state.critic``; ``key`` is the update's (the core takes its own share of it)
    actor_grads(key, state, critic params, obs, hp, steps=PLAIN) -> ((loss, aux), grads): ``steps.actor_objective``
        over the per-sample actor losses through ``critic``, and its gradient at ``state.actor``
    update(key, state, batch, weights, hp, steps=PLAIN) -> (state, metrics, |td| [B])
    update_chunk(keys [H], state, batches [H, B, ...], weights [H, B] | None, hp, steps=PLAIN) -> (.., |td| [H, B]):
        a chunk of H updates that only equals H single updates under the run's fixed settings (TD3: H = a fixed
        policy delay, d - 1 critic-only steps and a policy step); None: the core's smallest update is one step
    actor_period(hp) -> actor updates every this many updates (TD3: the policy delay; SAC: 1)
    targets: {target network field: the online field it follows}
    """

    actor_net: Any
    critic_net: Any
    init: Callable
    policy: Callable
    act: Callable
    gaussian: Callable
    critic_grads: Callable
    actor_grads: Callable
    update: Callable
    update_chunk: Callable | None
    actor_period: Callable
    targets: dict[str, str]


def exploring(core: Core) -> Callable:
    """A learner's ``act`` that records nothing: ``(the core's exploring action, None)``."""
    return lambda key, state, obs, hp: (core.act(key, state, obs, hp).action, None)
