"""The learner contract and the small pure helpers every learner shares."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Annotated, Any, NamedTuple, Protocol

import jax
import jax.numpy as jnp
import optax

from popjax.schema import Int, Number, NumberList
from popjax.types import EnvSpec, Key, Metrics, PyTree, Transition

# Schema types of the learners' static Configs (see ``popjax.schema``).
Hidden = Annotated[tuple[int, ...], NumberList(
    Number(integer=True, ge=1, le=65_536), "a list of positive integers (1 to 32 layers of at most 65536 units)",
    min_len=1, max_len=32)]
BatchSize = Int(ge=1, le=1_048_576)


class Learner(NamedTuple):
    """Pure single-member functions; population code vmaps them over axis 0.

    init(key, hparams) -> state
    update(key, state, batch, hparams) -> (state, metrics)     # ONE member, one gradient step
    act(key, state, obs, hparams) -> action                    # exploration (obs may be batched)
    policy(state, obs) -> action                                # greedy / evaluation

    Optional: ``update_chunk(keys [chunk], state, batches [chunk, B, ...], hparams)`` does
    ``chunk`` consecutive updates at once, equal in result to ``chunk`` calls of ``update`` with
    those keys and batches but free to skip work ``update`` would discard (TD3 with a fixed
    policy delay); its metrics are means over the chunk. Population code scans chunks.

    ``update`` is None when a chunk is the learner's smallest state transition (SPO: a round of
    ``chunk`` local steps and an averaging); population code then calls ``update_chunk`` only,
    through ``chunk_update``, and K updates per call must be a multiple of ``chunk``.

    Optional, for prioritized replay: ``update_weighted(key, state, batch, weights [B], hparams)
    -> (state, metrics, td_abs [B])`` is ``update`` with the TD loss of sample ``i`` weighted by
    ``weights[i]`` (importance weights) and returning ``|TD error|`` per sample (the new priorities).
    ``update_chunk_weighted(keys [chunk], state, batches [chunk, B, ...], weights [chunk, B], hparams)
    -> (state, metrics, td_abs [chunk, B])`` is the same for ``update_chunk`` (a learner offering it is
    driven by chunks under prioritized replay too; the weights enter TD losses only, never actor losses).
    ``banks`` is the number of replay banks the learner reads (SPO: one per replica, replica r reading
    the r-th ``B / banks`` rows of every batch, which a banked buffer fills from bank r); 1 otherwise.

    On-policy learners (PPO, A2C) offer ``update_rollout(key, state, trajectory, hparams, behaviour)
    -> (state, metrics)`` instead of ``update`` (which is then None): one on-policy update from a
    ``popjax.types.Trajectory`` ``[T, envs, ...]`` of this member. ``behaviour`` is the learner state
    whose policy collected the trajectory: the state itself for a synchronous loop, the previous one
    under a one-step lag (HTS-RL), where the learner corrects for the lag (A2C: the gradient at the
    behaviour parameters applied to the current ones; PPO: old log-probabilities from ``behaviour``).
    Such a learner keeps no replay buffer; its ``LearnerDef.on_policy`` is True. ``rollout_updates`` is
    the number of gradient steps one ``update_rollout`` makes (PPO: epochs x minibatches; A2C: 1), what
    drivers add to ``Counters.updates``.

    Optional, for rare state changes outside the K-step scan (RLx2's topology steps): ``maintain(key, state,
    batch, hparams) -> (state, metrics)``, which drivers run as their own compiled call (``Maintenance``) every
    ``maintain_every`` updates, on a freshly sampled batch.

    ``window`` > 1: the learner's batches are ``popjax.types.Windows`` of that many consecutive transitions of
    one env (multi-step targets) instead of transitions.

    Optional, a dynamic-capacity replay (RLx2): every ``replay_check_every`` env steps drivers call
    ``replay_shrink(state, oldest [replay_oldest, ...], valid [replay_oldest], size, hparams) -> (count, distance)``
    with the member's oldest transitions and forget its ``count`` oldest ones.
    """

    init: Callable[[Key, Any], Any]
    update: Callable[[Key, Any, Transition, Any], tuple[Any, Metrics]] | None
    act: Callable[[Key, Any, jax.Array, Any], jax.Array]
    policy: Callable[[Any, jax.Array], jax.Array]
    chunk: int = 1
    update_chunk: Callable[[Key, Any, Transition, Any], tuple[Any, Metrics]] | None = None
    update_weighted: Callable[[Key, Any, Transition, jax.Array, Any], tuple[Any, Metrics, jax.Array]] | None = None
    update_rollout: Callable[[Key, Any, Any, Any, Any], tuple[Any, Metrics]] | None = None
    update_chunk_weighted: Callable[[Key, Any, Transition, jax.Array, Any],
                                    tuple[Any, Metrics, jax.Array]] | None = None
    banks: int = 1
    rollout_updates: int = 1
    maintain: Callable[[Key, Any, Transition, Any], tuple[Any, Metrics]] | None = None
    maintain_every: int = 0
    window: int = 1
    replay_shrink: Callable[[Any, Transition, jax.Array, jax.Array, Any], tuple[jax.Array, jax.Array]] | None = None
    replay_check_every: int = 0
    replay_oldest: int = 0


def chunk_update(learner: Learner) -> Callable:
    """``learner.update_chunk``, or one ``update`` over a chunk of 1."""
    if learner.update_chunk is not None:
        return learner.update_chunk
    return lambda keys, state, batches, hp: learner.update(keys[0], state, jax.tree.map(lambda b: b[0], batches), hp)


class PopulationLearner(Protocol):
    """A learner whose members share parts (e.g. one critic): functions over the whole population.

    init(key, hparams [pop]) -> state          # member leaves [pop, ...] and shared leaves
    update(keys [pop], state, batch [pop, B, ...], hparams [pop], ...) -> (state, metrics [pop])
    act(keys [pop], state, obs [pop, ...], hparams [pop]) -> actions
    policy(state, obs [pop, ...]) -> actions
    member_axes: a prefix pytree of the state, True where leaves have the member axis

    Written per member and vmapped with ``axis_name="pop"``; every reduction over members is a
    collective on that axis (and on the device axis when each device holds a slice), so one
    function serves one device, the compiler's sharding and per-device programs.
    """

    init: Callable
    update: Callable
    act: Callable
    policy: Callable
    member_axes: Any


@dataclasses.dataclass(frozen=True)
class LearnerDef:
    """Registry entry: how to build a learner by name.

    ``config_cls`` is a ``popjax.schema.dataclass`` (its fields validate user values); every
    field of ``hparams_cls`` is declared with ``popjax.population.hparams.hparam`` (its bounds).
    A ``config_cls`` field named like a ``RunConfig`` field (``batch_size``) is set from the run.
    """

    name: str
    config_cls: type
    hparams_cls: type
    make: Callable[[Any, EnvSpec], Learner]
    default_hparams: Callable[[Any], Any]
    action_kind: str  # "continuous", "discrete" or "any" (both: the action head follows the env)
    # (config, initial hparams [pop], updates per call K, hparams a driver may change) -> config: a learner
    # may fix a static setting the run allows (TD3: a policy delay no member will change).
    specialize: Callable[[Any, Any, int, frozenset[str]], Any] | None = None
    # An on-policy learner (``Learner.update_rollout``): trained on each iteration's trajectories,
    # no replay buffer; only drivers whose ``DriverDef.on_policy`` is True accept it.
    on_policy: bool = False
    # (config, spec, hparams [pop] on the host) -> {name: [value per member]}: the learner's compute and memory
    # costs (RLx2: model sizes and FLOPs against dense), written to summary.json's "costs" and the results table.
    costs: Callable[[Any, EnvSpec, Any], dict[str, list[float]]] | None = None
    # state -> the params of a deterministic MLP actor (``popjax export``); None: nothing to export.
    actor_params: Callable[[Any], PyTree] | None = None


# Adam without its learning rate: `params - lr * scale_by_adam(grads)` equals Adam(lr)
# exactly, and keeps lr a traced per-member value (no optimizer rebuilt per member).
_ADAM = optax.scale_by_adam()


def adam_init(params: PyTree) -> optax.OptState:
    return _ADAM.init(params)


def adam_step(params: PyTree, grads: PyTree, opt_state: optax.OptState, lr: jax.Array):
    """One Adam step with a traced learning rate. Returns ``(params, opt_state)``."""
    updates, opt_state = _ADAM.update(grads, opt_state, params)
    params = jax.tree.map(lambda p, u: p - lr * u, params, updates)
    return params, opt_state


def polyak(target: PyTree, online: PyTree, tau: jax.Array) -> PyTree:
    """target <- (1 - tau) * target + tau * online."""
    return jax.tree.map(lambda t, o: t + tau * (o - t), target, online)


def identity(tree: PyTree) -> PyTree:
    return tree


def select(pred: jax.Array, on_true: PyTree, on_false: PyTree) -> PyTree:
    """Leafwise ``where`` on a scalar predicate.

    Used instead of ``lax.cond`` for member-dependent predicates: under vmap a cond
    becomes a select anyway, and this keeps both branches' dtypes identical.
    """
    return jax.tree.map(lambda a, b: jnp.where(pred, a, b), on_true, on_false)


def init_actor_critic(key: Key, actor_net, critic_net, spec: EnvSpec) -> tuple[PyTree, PyTree]:
    """Parameters of an ``actor(obs)`` and a ``critic(obs, action)`` network for ``spec``."""
    key_actor, key_critic = jax.random.split(key)
    obs = jnp.zeros((1,) + spec.obs_shape, jnp.float32)
    action = jnp.zeros((1, spec.action_dim), jnp.float32)
    return actor_net.init(key_actor, obs), critic_net.init(key_critic, obs, action)


def scalar(value, dtype=jnp.float32) -> jax.Array:
    return jnp.asarray(value, dtype)
