"""The learner contract and the small pure helpers every learner shares."""

from __future__ import annotations

import dataclasses
import functools
from collections import Counter
from collections.abc import Callable, Mapping
from typing import Annotated, Any, NamedTuple, Protocol

import jax
import jax.numpy as jnp
import optax

from popjax import precision
from popjax.population.tree import member
from popjax.schema import Int, Number, NumberList
from popjax.types import EnvSpec, Key, Metrics, PyTree

# Schema types of the learners' static Configs (see ``popjax.schema``).
Hidden = Annotated[tuple[int, ...], NumberList(
    Number(integer=True, ge=1, le=65_536), "a list of positive integers (1 to 32 layers of at most 65536 units)",
    min_len=1, max_len=32)]
BatchSize = Int(ge=1, le=1_048_576)

# The MuJoCo tasks the learners' presets (``LearnerDef.presets``, tuned RL Baselines3 Zoo values) cover.
MUJOCO_V5 = ("HalfCheetah-v5", "Hopper-v5", "Walker2d-v5", "Ant-v5", "Humanoid-v5")


class Refresh(NamedTuple):
    """A per-transition value a learner keeps in its replay and recomputes (ReF-ER's last importance ratio).

    ``field``: its key in the transitions' ``extras`` (``act`` writes its first value). The step's per-sample output
    is then this value at the sampled rows (not a TD magnitude), which the replay source writes back, and its
    batches are ``popjax.types.Replayed`` (the sample plus the stored value of every row). ``rows(state, transitions
    [N, ...], hparams) -> values [N]`` recomputes it for any rows in one batched call (after a PBT exploit replaced
    the member's learner state).
    """

    field: str
    rows: Callable[[Any, Any, Any], jax.Array]


class ReplayStep(NamedTuple):
    """An off-policy learner's one update: ``chunk`` consecutive gradient steps of one member from replay.

    ``update(keys [H], state, batches [H, B, ...], weights [H, B] | None, hparams) -> (state, metrics, values [H, B]
    | None)``, H = ``chunk``. ``weights`` are per-sample weights of the critic/TD losses (importance weights; never of
    actor losses; None: unweighted); ``values`` are what the step computed per sample for the replay source to write
    back: new priorities (TD3, SAC, DQN: |TD error|; MEMR: its Eq. 3.7 entropy priorities) when ``priorities``, the
    refreshed value with a ``refresh``, else None. Metrics are means over the chunk.

    ``chunk`` is the learner's smallest state transition (TD3 with a fixed policy delay d: d - 1 critic steps and a
    policy step; SPO: a round of local steps and an averaging); drivers make K updates per call as K / H calls.
    ``banks``: replay banks the learner reads (SPO: replica r reads the r-th ``B / banks`` rows of each batch, which
    a banked source fills from bank r). ``window`` > 1: batches are ``popjax.types.Windows`` of that many consecutive
    transitions of one env (multi-step targets). ``priorities``: whether ``values`` are priorities (sources that
    sample by priority need them).

    ``extras``: an example (no batch axis) of what the learner's ``act`` records with each transition (the second
    of the pair ``act`` returns; the replay stores it in ``Transition.extras``), and warm-up acts with ``act`` too
    (uniform random actions carry no record of their behaviour). ``refresh``: a ``Refresh``, a stored value the
    update recomputes at the sampled rows (then ``priorities`` is False). ``by_priority``: the step's samples must
    be drawn by its priorities (MEMR's start states): only a ``SourceDef.prioritized`` source serves it.
    """

    update: Callable[[Key, Any, Any, jax.Array | None, Any], tuple[Any, Metrics, jax.Array | None]]
    chunk: int = 1
    banks: int = 1
    window: int = 1
    priorities: bool = True
    extras: Any = None
    refresh: Refresh | None = None
    by_priority: bool = False


class RolloutStep(NamedTuple):
    """An on-policy learner's one update from a trajectory of its own.

    ``update(key, state, trajectory [T, envs, ...], hparams, behaviour) -> (state, metrics)``: ``trajectory`` is a
    ``popjax.types.Trajectory``; ``behaviour`` is the learner state whose policy collected it (the state itself in a
    synchronous loop, the previous one under HTS-RL's one-step lag, which the learner corrects for). ``updates``:
    the gradient steps one call makes (PPO: epochs x minibatches), what drivers add to ``Counters.updates``.
    """

    update: Callable[[Key, Any, Any, Any, Any], tuple[Any, Metrics]]
    updates: int = 1


class Periodic(NamedTuple):
    """A rare state change outside the K-step scan (RLx2's topology step), run every ``every`` updates on a freshly
    sampled batch: ``run(key, state, batch, hparams) -> (state, metrics)``."""

    every: int
    run: Callable[[Key, Any, Any, Any], tuple[Any, Metrics]]


class ReplayShrink(NamedTuple):
    """A dynamic replay capacity (RLx2): every ``every`` env steps, ``run(state, oldest [oldest, ...], valid
    [oldest], size, hparams) -> (count, distance)`` sees the member's ``oldest`` oldest transitions and says how many
    of them to forget."""

    every: int
    oldest: int
    run: Callable[[Any, Any, jax.Array, jax.Array, Any], tuple[jax.Array, jax.Array]]


class Learner(NamedTuple):
    """Pure single-member functions; population code vmaps them over axis 0.

    init(key, hparams) -> state
    act(key, state, obs, hparams) -> (action, extras)  # exploration (obs may be batched); extras: what the
                                                       # replay step records per transition (None: nothing)
    policy(state, obs) -> action                 # greedy / evaluation
    step: a ``ReplayStep`` (off-policy, trained from a replay source) or a ``RolloutStep`` (on-policy)
    maintain: an optional ``Periodic`` hook; shrink: an optional ``ReplayShrink`` hook (replay steps only)
    observe(key, state, transitions [T * envs, ...], ended [T * envs], hparams) -> state: optional (replay steps
        only), what the state learns from each rollout besides the replay, before the updates and during warm-up
        too (running observation statistics, a per-env exploration std redrawn when its episode ended);
        transitions are time-major, ``envs`` the member's envs
    """

    init: Callable[[Key, Any], Any]
    act: Callable[[Key, Any, jax.Array, Any], tuple[jax.Array, Any]]
    policy: Callable[[Any, jax.Array], jax.Array]
    step: ReplayStep | RolloutStep
    maintain: Periodic | None = None
    shrink: ReplayShrink | None = None
    observe: Callable[[Key, Any, Any, jax.Array, Any], Any] | None = None


def network_passes(learner: Learner) -> Learner:
    """``learner`` with every function that runs its networks marked as a network pass (``popjax.precision``):
    ``act``, ``policy``, the step's update, a refresh's ``rows`` and the hooks; ``init`` is not (it draws
    parameters). What ``LearnerDef`` does to every learner it makes, so a new learner is rounded under
    ``matmul_precision: bf16`` without a word about it, and nothing outside its networks is."""
    step = learner.step._replace(update=precision.network(learner.step.update))
    if isinstance(step, ReplayStep) and step.refresh is not None:
        step = step._replace(refresh=step.refresh._replace(rows=precision.network(step.refresh.rows)))
    hook = lambda h: None if h is None else h._replace(run=precision.network(h.run))  # noqa: E731
    return learner._replace(act=precision.network(learner.act), policy=precision.network(learner.policy), step=step,
                            maintain=hook(learner.maintain), shrink=hook(learner.shrink))


def without_extras(act: Callable) -> Callable:
    """A learner's ``act`` from one that returns only the action: ``(action, None)``, nothing recorded."""
    return lambda key, state, obs, hparams: (act(key, state, obs, hparams), None)


def one_step_chunk(update: Callable) -> Callable:
    """A chunk-1 ``ReplayStep.update`` from a one-step ``update(key, state, batch, weights [B] | None, hparams) ->
    (state, metrics, values [B] | None)``."""

    def chunk(keys, state, batches, weights, hparams):
        state, metrics, values = update(keys[0], state, member(batches, 0),
                                        None if weights is None else weights[0], hparams)
        return state, metrics, None if values is None else values[None]

    return chunk


def replay_step(update: Callable, **options) -> ReplayStep:
    """A ``ReplayStep`` of chunk 1 from a one-step ``update`` (``one_step_chunk``): what TD3, SAC and DQN write."""
    return ReplayStep(one_step_chunk(update), chunk=1, **options)


def chunk_update(learner: Learner) -> Callable:
    """The unweighted replay update ``(keys [H], state, batches [H, B, ...], hparams) -> (state, metrics)``."""
    update = learner.step.update
    return lambda keys, state, batches, hparams: update(keys, state, batches, None, hparams)[:2]


def one_update(learner: Learner) -> Callable:
    """One gradient step ``(key, state, batch, hparams) -> (state, metrics)`` of a learner whose chunk is 1."""
    if learner.step.chunk != 1:
        raise ValueError(f"one_update: the learner's replay step is a chunk of {learner.step.chunk} updates")
    update = chunk_update(learner)
    return lambda key, state, batch, hparams: update(key[None], state, jax.tree.map(lambda x: x[None], batch), hparams)


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
class PBTSupport:
    """What PBT may do with a learner's members.

    ``search_space``: the learner's PBT prior ``{hparam: {low, high, log, integer}}``, what ``pbt`` explores unless
    the run names another (None: the run must give one). ``policy_state``: the state's policy fields (dotted paths),
    all that ``copy: policy`` copies from a parent (empty: no policy-only copy). ``optimizer_state``: ``{optimizer
    state field: the params field it updates}`` (dotted paths), what ``reset_optimizer`` starts afresh (an Adam
    state of zeros is a fresh one).
    """

    search_space: Mapping[str, Mapping[str, Any]] | None = None
    policy_state: tuple[str, ...] = ()
    optimizer_state: Mapping[str, str] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class Report:
    """What a run writes about a learner besides its returns.

    ``costs(config, spec, hparams [pop] on the host) -> {name: [value per member]}``: compute and memory costs
    (RLx2: model sizes and FLOPs against dense), summary.json's ``costs`` and the results table.
    ``counts(config, updates per member) -> {name: count}``: what the learner did in that many updates (SAC: policy
    updates; MEMR: policy updates, model rollouts, model fits), summary.json's ``counts``. ``summary_metrics``:
    metrics whose last logged value per member goes to summary.json's ``learner_metrics`` (ReF-ER's far fraction,
    beta, c_max, KL). ``actor_params(state)``: the params of a deterministic MLP actor (``popjax export``).
    """

    costs: Callable[[Any, EnvSpec, Any], dict[str, list[float]]] | None = None
    counts: Callable[[Any, int], dict[str, int]] | None = None
    summary_metrics: tuple[str, ...] = ()
    actor_params: Callable[[Any], PyTree] | None = None


@dataclasses.dataclass(frozen=True)
class RunFit:
    """How a learner fits a run: read when the run is built, before anything is allocated.

    ``specialize(config, initial hparams [pop], updates per call K, hparams a driver may change, exact_chunks=...)
    -> config``: a static setting the run allows (TD3: a policy delay no member will change, chunking its updates
    only where a chunk equals the same updates one at a time: ``exact_chunks``), or a ``ConfigError``.
    ``check_env(config, spec) -> (learner_config key, problem) | None``: what the learner's options cannot do with
    the env (a convolutional torso on vector observations), one line instead of a failure when first traced.
    ``own_replay``: why the members must learn from their own replay only (drivers that share one buffer refuse
    the learner with this reason); None: any replay.
    """

    specialize: Callable[..., Any] | None = None
    check_env: Callable[[Any, EnvSpec], tuple[str, str] | None] | None = None
    own_replay: str | None = None


@dataclasses.dataclass(frozen=True)
class LearnerDef:
    """Registry entry: how to build a learner by name, and what it offers a run.

    ``config_cls`` is a ``popjax.schema.dataclass`` (its fields validate user values; a field named like a
    ``RunConfig`` field, ``batch_size``, is set from the run); every field of ``hparams_cls`` is declared with
    ``popjax.population.hparams.hparam`` (its bounds). ``action_kind``: "continuous", "discrete" or "any" (the action
    head follows the env). ``step_kind``: the kind of ``Learner.step`` ``make`` returns (``ReplayStep`` or
    ``RolloutStep``), known before the env is, so a run is checked against its driver and replay source when built.
    ``presets``: tuned options per env (``popjax.presets`` fills what the user did not give). ``shared_critic(config,
    spec, actors, diversity=None, device_axis=None)``: a ``PopulationLearner`` whose actors share one critic (TD3's,
    for the cemrl and dvd drivers); None: none offered. The learners ``make`` returns have their network passes
    marked (``network_passes``); a ``PopulationLearner`` marks its networks itself (``precision.network_module``).
    The capabilities: ``pbt`` (``PBTSupport``), ``report`` (``Report``), ``fit`` (``RunFit``).
    """

    name: str
    config_cls: type
    hparams_cls: type
    make: Callable[[Any, EnvSpec], Learner]
    default_hparams: Callable[[Any], Any]
    action_kind: str
    step_kind: type = ReplayStep
    presets: Mapping[str, Mapping[str, Any]] = dataclasses.field(default_factory=dict)
    pbt: PBTSupport = PBTSupport()
    report: Report = Report()
    fit: RunFit = RunFit()
    shared_critic: Callable[..., Any] | None = None

    def __post_init__(self):
        if not getattr(self.make, "_network_passes", False):  # dataclasses.replace makes the entry again
            object.__setattr__(self, "make", _making_network_passes(self.make))

    @property
    def on_policy(self) -> bool:
        """Trained on each iteration's trajectories (a ``RolloutStep``), with no replay."""
        return self.step_kind is RolloutStep


def _making_network_passes(make: Callable[[Any, EnvSpec], Learner]) -> Callable[[Any, EnvSpec], Learner]:
    @functools.wraps(make)
    def made(config, spec):
        return network_passes(make(config, spec))

    made._network_passes = True
    return made


def declared_state_problem(definition: LearnerDef, state: PyTree) -> str | None:
    """Why ``definition.pbt``'s ``policy_state``/``optimizer_state`` do not fit ``state`` (its learner's ``init``
    output; shapes suffice), or None: every dotted path names a field, and each optimizer state holds a tree
    shaped like the params it updates (what PBT's ``copy: policy`` and ``reset_optimizer`` act on)."""
    def field(path: str, what: str):
        node = state
        for name in path.split("."):
            if not hasattr(node, name):
                return None, f"PBTSupport.{what} {path!r}: init's state has no field {name!r}"
            node = getattr(node, name)
        return node, None

    for path in definition.pbt.policy_state:
        if (why := field(path, "policy_state")[1]) is not None:
            return why
    for opt_path, params_path in definition.pbt.optimizer_state.items():
        (opt, why), (params, why_params) = field(opt_path, "optimizer_state"), field(params_path, "optimizer_state")
        if why or why_params:
            return why or why_params
        shapes = lambda tree: Counter(tuple(x.shape) for x in jax.tree.leaves(tree))  # noqa: E731
        if shapes(params) - shapes(opt):
            return (f"PBTSupport.optimizer_state {opt_path!r}: holds no state shaped like the params "
                    f"{params_path!r} it is said to update")
    return None


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
