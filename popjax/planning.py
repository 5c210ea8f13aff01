"""The memory and work of a run at its real shapes, before anything is allocated or written.

``plan_run`` reads a resolved run (``popjax.resolve``: names resolved, nothing compiled or allocated):

- **state bytes**, exact, from ``jax.eval_shape`` of the driver's ``init``: per member (leaves with the member axis,
  divided by the population) and shared, grouped by what they are: ``params`` and ``optimizer`` (the driver
  state's ``learner`` field; optimizer states are optax's state types and the fields the learner declares in
  ``PBTSupport.optimizer_state``), ``replay`` (the ``buffer`` field) and ``other`` (hparams, counters, driver
  variables); plus the JAX envs' state (``env``), one iteration's transitions (``experience``: the update's
  input) and the envs of one evaluation (``evaluation``, an estimate per env on the host path);
- **the update program** (``compile=True``): the driver's ``learn`` (add the iteration's transitions to replay,
  then K updates), lowered and compiled at those shapes without allocating them; XLA's ``memory_analysis``
  (arguments, outputs, aliased, temporaries) gives the bytes one device holds while it runs, and the FLOPs of
  one iteration are counted on its jaxpr with every loop's trip count (XLA's ``cost_analysis`` counts a loop's
  body once: its figure is reported beside);
- the device's memory (``device_memory``: the accelerator's ``bytes_limit``, the host's RAM on a CPU, or a
  given size, so a CPU machine can plan a run for a GPU) and a predicted iteration time at a peak FLOP/s
  (given, or measured with a dense matrix product).

``refusal(plan)`` is the one line a run that cannot fit is refused with: the option to lower
(``pop_size``, ``buffer_size``, ``envs_per_member``, ``batch_size`` or ``eval_episodes``, after the part that
dominates) and about the largest value that fits, extrapolated linearly within that part.
"""

from __future__ import annotations

import dataclasses
import math
import re
import time
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from popjax import config as run_config
from popjax import precision
from popjax.config import RunConfig
from popjax.drivers.base import Driver, Episodes, Rollout
from popjax.envs import registry
from popjax.envs.base import make_vec_env
from popjax.envs.runner import EpisodeBatch, Experience
from popjax.loop import KeyPurpose, key_for
from popjax.population.sharding import Placement, expand
from popjax.registry import LEARNERS
from popjax.schema import ConfigError
from popjax.types import EnvSpec, Transition

STATE_PARTS = ("params", "optimizer", "replay", "other")
PARTS = (*STATE_PARTS, "env", "experience", "evaluation")

def parse_flops(value: Any, field: str = "peak_flops") -> float:
    """A rate in FLOP/s from ``989e12``, ``989T`` or ``450G``; a one-line ``ConfigError`` otherwise."""
    scale = {"": 1, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12, "p": 1e15}
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([kKmMgGtTpP]?)(?:flop/?s)?\s*", str(value),
                         flags=re.IGNORECASE)
    if isinstance(value, bool) or match is None:
        raise ConfigError(f"{field}: expected FLOP/s such as 989e12 or 450G, got {value!r}")
    rate = float(match.group(1)) * scale[match.group(2).lower()]
    if not math.isfinite(rate) or rate <= 0:
        raise ConfigError(f"{field}: must be positive, got {value!r}")
    return rate


def size(n: float) -> str:
    """Bytes for people: ``141.0 GB`` (powers of 1000, as ``device_memory`` reads them and GPU makers count)."""
    for unit in ("B", "KB", "MB", "GB", "TB", "PB"):
        if abs(n) < 1000 or unit == "PB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    raise AssertionError


def device_memory(given: int | None = None) -> tuple[int, str]:
    """``(bytes, where from)``: ``given`` (``RunConfig.device_memory``), else this process's first device's
    ``bytes_limit`` (GPUs, TPUs), else the host's physical memory (a CPU's device memory is the host's)."""
    if given is not None:
        return int(given), "given"
    device = jax.local_devices()[0]  # another process's device has no stats to read
    stats = device.memory_stats() if hasattr(device, "memory_stats") else None
    if stats and stats.get("bytes_limit"):
        return int(stats["bytes_limit"]), f"{device.device_kind} bytes_limit"
    return run_config.machine_memory(), f"{device.platform}: host RAM"


def measure_peak_flops(repeats: int = 5) -> float:
    """FLOP/s of a dense float32 matrix product on the default device (best of ``repeats``; 2048² on a CPU,
    8192² on an accelerator)."""
    n = 2048 if jax.devices()[0].platform == "cpu" else 8192
    a = jnp.ones((n, n), jnp.float32)
    product = jax.jit(lambda x: x @ x).lower(a).compile()
    product(a).block_until_ready()
    best = math.inf
    for _ in range(repeats):
        start = time.perf_counter()
        product(a).block_until_ready()
        best = min(best, time.perf_counter() - start)
    return 2 * n**3 / best


# --- FLOPs of a program, loops counted with their trip counts ------------------------------------
_ELEMENTWISE_FREE = {"broadcast_in_dim", "reshape", "squeeze", "expand_dims", "transpose", "slice", "dynamic_slice",
                     "dynamic_update_slice", "concatenate", "pad", "gather", "scatter", "convert_element_type",
                     "iota", "copy", "copy_p", "select_n", "rev", "bitcast_convert_type", "device_put",
                     "random_bits", "random_seed", "random_wrap", "random_unwrap", "random_fold_in", "random_split",
                     "threefry2x32", "stop_gradient", "sharding_constraint", "pjit", "closed_call", "scan", "while",
                     "cond", "custom_jvp_call", "custom_vjp_call", "custom_vjp_call_jaxpr", "remat", "checkpoint",
                     "shard_map", "split", "clamp", "sort", "argsort"}


def _sub_jaxprs(params: Mapping[str, Any]):
    for value in params.values():
        for item in value if isinstance(value, tuple | list) else (value,):
            if isinstance(item, jax.extend.core.ClosedJaxpr):
                yield item.jaxpr
            elif isinstance(item, jax.extend.core.Jaxpr):
                yield item


def jaxpr_flops(jaxpr) -> float:
    """FLOPs of a jaxpr: ``2 m n k`` per matrix product (and convolution), one per element of every other
    arithmetic result and per input element of a reduction; a ``scan`` counts its body ``length`` times, a
    ``cond`` its costliest branch, a ``while`` its body once (its trip count is not static)."""
    total = 0.0
    for eqn in jaxpr.eqns:
        name = eqn.primitive.name
        if name == "scan":
            total += eqn.params["length"] * jaxpr_flops(eqn.params["jaxpr"].jaxpr)
        elif name == "cond":
            total += max(jaxpr_flops(branch.jaxpr) for branch in eqn.params["branches"])
        elif name == "dot_general":
            (contract, _), _ = eqn.params["dimension_numbers"]
            lhs = eqn.invars[0].aval.shape
            total += 2 * math.prod(eqn.outvars[0].aval.shape) * math.prod(lhs[d] for d in contract)
        elif name == "conv_general_dilated":
            rhs = eqn.invars[1].aval.shape
            out_features = rhs[eqn.params["dimension_numbers"].rhs_spec[0]]
            total += 2 * math.prod(eqn.outvars[0].aval.shape) * math.prod(rhs) / out_features
        elif name.startswith("reduce_") or name.startswith("arg") or name in ("cumsum", "cumprod", "cummax"):
            total += math.prod(getattr(eqn.invars[0].aval, "shape", ()))
        else:
            subs = list(_sub_jaxprs(eqn.params))
            if subs:  # pjit, custom_jvp/vjp calls, remat, while (body once): what they call
                total += sum(jaxpr_flops(sub) for sub in subs)
            elif name not in _ELEMENTWISE_FREE:
                total += sum(math.prod(getattr(v.aval, "shape", ())) for v in eqn.outvars)
    return total


# --- the plan --------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Program:
    """XLA's analysis of the compiled update program (bytes on one device) and its FLOPs per call."""

    name: str
    argument_bytes: int
    output_bytes: int
    alias_bytes: int
    temp_bytes: int
    code_bytes: int
    flops: float  # per call, every loop counted with its trip count (``jaxpr_flops``)
    xla_flops: float  # XLA's cost_analysis: a loop's body counted once
    xla_bytes_accessed: float
    compile_s: float

    @property
    def peak_bytes(self) -> int:
        """What the program holds while it runs: its arguments, its outputs not written in place of a donated
        argument, and its temporaries."""
        return self.argument_bytes + self.output_bytes - self.alias_bytes + self.temp_bytes


@dataclasses.dataclass(frozen=True)
class RunPlan:
    """The memory and work of a run (see the module docstring); bytes per device unless named per member."""

    learner: str
    env: str
    driver: str
    pop_size: int
    devices: int
    envs_per_member: int
    batch_size: int
    buffer_size: int
    eval_episodes: int
    updates_per_iter: int
    steps_per_iter: int
    per_member: Mapping[str, int]  # bytes per member, by part
    shared: Mapping[str, int]  # bytes of leaves without the member axis (every device holds them), by part
    host_parts: tuple[str, ...]  # parts that live in host memory, not on the device (gymnasium envs)
    program: Program | None
    device_memory: int
    memory_source: str
    peak_flops: float | None = None
    peak_source: str = ""
    note: str = ""

    def total(self, part: str) -> int:
        """Bytes of ``part`` over the whole population."""
        return self.per_member.get(part, 0) * self.pop_size + self.shared.get(part, 0)

    def on_device(self, part: str) -> int:
        """Bytes of ``part`` one device holds (members split over the devices, shared leaves on each)."""
        if part in self.host_parts:
            return 0
        return self.per_member.get(part, 0) * self.pop_size // self.devices + self.shared.get(part, 0)

    @property
    def need_bytes(self) -> int:
        """Bytes one device needs: the update program's peak (XLA's analysis: state, transitions, temporaries)
        plus what it does not hold (env state, evaluation); without a program, the parts' sum."""
        if self.program is None:
            return sum(self.on_device(part) for part in PARTS)
        return self.program.peak_bytes + self.on_device("env") + self.on_device("evaluation")

    @property
    def fits(self) -> bool:
        return self.need_bytes <= self.device_memory

    @property
    def flops_per_iter(self) -> float | None:
        return None if self.program is None else self.program.flops

    @property
    def step_s(self) -> float | None:
        """Predicted seconds of one iteration's update at ``peak_flops`` (a lower bound: FLOPs only)."""
        if self.program is None or not self.peak_flops:
            return None
        return self.program.flops / self.peak_flops

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out.update(need_bytes=self.need_bytes, fits=self.fits, step_s=self.step_s,
                   totals={part: self.total(part) for part in PARTS})
        return out

    def text(self) -> str:
        """The plan as ``popjax train --plan`` prints it."""
        lines = [f"plan: {self.learner} on {self.env}, {self.driver} driver, {self.pop_size} members x "
                 f"{self.envs_per_member} envs on {self.devices} device(s); per iteration {self.steps_per_iter} "
                 f"env steps and {self.updates_per_iter} updates of batch {self.batch_size} per member",
                 f"  {'part':<34}{'per member':>14}{'total':>14}"]
        names = {"params": "params", "optimizer": "optimizer", "replay": f"replay ({self.buffer_size} rows/member)",
                 "other": "other state (hparams, counters)", "env": "env state",
                 "experience": "one iteration's transitions",
                 "evaluation": f"evaluation ({self.eval_episodes} episodes, est.)"}
        for part in PARTS:
            where = " (host)" if part in self.host_parts else ""
            shared = f" + {size(self.shared[part])} shared" if self.shared.get(part) else ""
            lines.append(f"  {names[part] + where:<34}{size(self.per_member.get(part, 0)):>14}"
                         f"{size(self.total(part)):>14}{shared}")
        if self.program is not None:
            p = self.program
            lines.append(f"  update program (XLA, one device): arguments {size(p.argument_bytes)}, outputs "
                         f"{size(p.output_bytes)} ({size(p.alias_bytes)} in place of donated arguments), "
                         f"temporaries {size(p.temp_bytes)}; peak {size(p.peak_bytes)}; "
                         f"compiled in {p.compile_s:.1f} s")
        verdict = "fits" if self.fits else "does NOT fit"
        lines.append(f"  memory: needs about {size(self.need_bytes)} per device of {size(self.device_memory)} "
                     f"({self.memory_source}): {verdict} ({100 * self.need_bytes / self.device_memory:.1f} %)")
        if self.program is not None:
            flops = self.program.flops
            lines.append(f"  work: {flops:.3g} FLOPs per iteration, {flops / self.pop_size:.3g} "
                         f"per member (XLA's count, loop bodies once: {self.program.xla_flops:.3g})")
        if self.step_s is not None:
            rate = self.steps_per_iter * self.pop_size / self.step_s
            lines.append(f"  predicted update time: {self.step_s * 1e3:.3g} ms per iteration at {self.peak_flops:.3g} "
                         f"FLOP/s ({self.peak_source}); at most {rate:.3g} env steps/s in total (FLOPs bound only)")
        if self.note:
            lines.append(f"  note: {self.note}")
        return "\n".join(lines)


def _bytes(leaf) -> int:
    if jax.dtypes.issubdtype(leaf.dtype, jax.dtypes.prng_key):  # a typed key (jumanji keeps one in its env state)
        leaf = jax.eval_shape(jax.random.key_data, leaf)
    return math.prod(leaf.shape) * np.dtype(leaf.dtype).itemsize


def _is_optax(node) -> bool:
    return type(node).__module__.split(".")[0] == "optax"


def _optimizer_leaves(learner_state, declared: Mapping[str, str]) -> set[int]:
    """``id`` of every leaf of the learner state that belongs to an optimizer state: optax's state types (Adam
    moments, counts) and the fields the learner declares (``PBTSupport.optimizer_state``)."""
    nodes = [node for node in jax.tree.leaves(learner_state, is_leaf=_is_optax) if _is_optax(node)]
    for path in declared:
        node = learner_state
        for name in path.split("."):
            node = getattr(node, name, None)
        nodes.append(node)
    return {id(leaf) for node in nodes for leaf in jax.tree.leaves(node)}


def state_parts(state, member_axes, pop_size: int, learner_def) -> tuple[dict[str, int], dict[str, int]]:
    """``(per member, shared)`` bytes by part of a driver state's shape tree (``jax.eval_shape`` of ``init``)."""
    state = jax.tree.map(lambda s: jax.ShapeDtypeStruct(s.shape, s.dtype), state)  # one object per leaf
    flags = {id(leaf): flag for leaf, flag in zip(jax.tree.leaves(state), jax.tree.leaves(expand(member_axes, state)),
                                                   strict=True)}
    learner_state, buffer = getattr(state, "learner", None), getattr(state, "buffer", None)
    optimizer = _optimizer_leaves(learner_state, learner_def.pbt.optimizer_state)
    params = {id(leaf) for leaf in jax.tree.leaves(learner_state)}
    replay = {id(leaf) for leaf in jax.tree.leaves(buffer)}
    per_member, shared = dict.fromkeys(STATE_PARTS, 0), dict.fromkeys(STATE_PARTS, 0)
    for leaf in jax.tree.leaves(state):
        key = id(leaf)
        floating = jnp.issubdtype(leaf.dtype, jnp.floating)  # a learner's step counter is not a parameter
        part = ("optimizer" if key in optimizer else "params" if key in params and floating else
                "replay" if key in replay else "other")
        if flags[key] and leaf.shape and leaf.shape[0] == pop_size:
            per_member[part] += _bytes(leaf) // pop_size
        else:
            shared[part] += _bytes(leaf)
    return per_member, shared


def experience_shape(config: RunConfig, spec: EnvSpec, driver: Driver, state):
    """Shapes of what the interaction hands ``learn``: an ``Experience`` (rollout) or ``EpisodeBatch`` (episodes);
    None for a driver that runs its own interaction."""
    interaction = driver.interaction
    struct = lambda shape, dtype: jax.ShapeDtypeStruct(tuple(shape), dtype)  # noqa: E731
    if isinstance(interaction, Rollout):
        m, n = config.pop_size, interaction.steps * interaction.envs_per_member
        obs = struct((m, interaction.envs_per_member, *spec.obs_shape), jnp.float32)
        action, extras = jax.eval_shape(driver.act, key_for(config.seed, KeyPurpose.COLLECT), state, obs)
        rows = lambda x: struct((m, n, *x.shape[2:]), x.dtype)  # noqa: E731
        transition = Transition(struct((m, n, *spec.obs_shape), jnp.float32), rows(action), struct((m, n), jnp.float32),
                                struct((m, n, *spec.obs_shape), jnp.float32), struct((m, n), jnp.float32),
                                jax.tree.map(rows, extras))
        return Experience(transition, struct((m,), jnp.float32), struct((m,), jnp.float32), struct((m, n), jnp.bool_))
    if isinstance(interaction, Episodes):
        actors = config.pop_size if interaction.actors is None else interaction.actors
        n = spec.max_episode_steps * actors * interaction.episodes
        transition = Transition(struct((n, *spec.obs_shape), jnp.float32),
                                struct((n, *spec.action_shape), spec.action_dtype), struct((n,), jnp.float32),
                                struct((n, *spec.obs_shape), jnp.float32), struct((n,), jnp.float32))
        return EpisodeBatch(struct((actors,), jnp.float32), transition, struct((n,), jnp.bool_))
    return None


def compile_update(config: RunConfig, driver: Driver, local: Driver, placement: Placement, state,
                   experience) -> Program:
    """The driver's ``learn`` lowered and compiled at the run's shapes (nothing allocated), as the loop compiles it
    on the host path: XLA's memory and cost analysis, and the FLOPs of its jaxpr."""
    axes = driver.member_axes
    program = placement.program(local.learn, (False, axes, True), (axes, True))
    program = precision.apply(program, config.matmul_precision)  # the arithmetic the loop compiles with
    key = key_for(config.seed, KeyPurpose.LEARN)
    shardings = placement.shardings(state, axes)
    if shardings is not None:
        state = jax.tree.map(lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh), state, shardings)
    start = time.perf_counter()
    compiled = jax.jit(program, donate_argnums=(1,)).lower(key, state, experience).compile()
    compile_s = time.perf_counter() - start
    memory = compiled.memory_analysis()
    cost = compiled.cost_analysis() or {}
    cost = cost[0] if isinstance(cost, list) else cost
    flops = jaxpr_flops(jax.make_jaxpr(program)(key, state, experience).jaxpr)
    return Program("learn", int(memory.argument_size_in_bytes), int(memory.output_size_in_bytes),
                   int(memory.alias_size_in_bytes), int(memory.temp_size_in_bytes),
                   int(memory.generated_code_size_in_bytes), flops, float(cost.get("flops", 0.0)),
                   float(cost.get("bytes accessed", 0.0)), compile_s)


def env_parts(config: RunConfig) -> tuple[dict[str, int], tuple[str, ...]]:
    """Per-member bytes of the persistent envs' state and of one evaluation's envs (a JAX env's from
    ``jax.eval_shape`` of its reset; a gymnasium env's estimated, ``HOST_ENV_BYTES``), and the parts that live in
    host memory (gymnasium envs)."""
    if registry.is_jax_env(config.env):
        vec_env = make_vec_env(registry.make_jax_env(config.env))
        one = jax.eval_shape(vec_env.reset, key_for(config.seed, KeyPurpose.ENV_RESET), jnp.zeros((1,), jnp.int32))
        per_env, host = sum(_bytes(leaf) for leaf in jax.tree.leaves(one)), ()
    else:
        per_env, host = run_config.HOST_ENV_BYTES, ("env", "evaluation")
    return {"env": per_env * config.envs_per_member, "evaluation": per_env * config.eval_episodes}, host


def plan_run(config: RunConfig, spec: EnvSpec, driver: Driver, local: Driver | None = None,
             placement: Placement | None = None, *, compile: bool = False, peak_flops: Any = None,
             measure_peak: bool = True) -> RunPlan:
    """The run's ``RunPlan`` (see the module docstring), from what ``popjax.resolve`` made: ``driver`` (the whole
    population), ``local`` (one program's members; default ``driver``) and ``placement``. Plans against
    ``config.device_memory`` (``auto``: the device's own). ``compile``: also compile the update program (XLA's
    analysis; seconds to minutes), else the state's bytes only, nothing compiled. ``peak_flops``: FLOP/s of the
    predicted time (default: measured here when ``compile`` and ``measure_peak``)."""
    local = driver if local is None else local
    placement = Placement(config.devices, config.parallel) if placement is None else placement
    memory, source = device_memory(None if config.device_memory == "auto" else config.device_memory)
    state = jax.eval_shape(driver.init, key_for(config.seed, KeyPurpose.INIT, 0))
    per_member, shared = state_parts(state, driver.member_axes, config.pop_size, LEARNERS[config.learner])
    envs, host_parts = env_parts(config)
    per_member.update(envs)
    if "host RAM" in source:  # a CPU: the host's envs share the device's memory
        host_parts = ()
    experience = experience_shape(config, spec, driver, state)  # ``local`` acts only inside its sharded program
    per_member["experience"] = 0 if experience is None else \
        sum(_bytes(leaf) for leaf in jax.tree.leaves(experience)) // config.pop_size
    program, note = None, ""
    if compile and experience is not None:
        program = compile_update(config, driver, local, placement, state, experience)
    elif compile:
        note = f"the {config.driver} driver runs its own interaction: state bytes only, no update program compiled"
    rate, rate_source = None, ""
    if peak_flops is not None:
        rate, rate_source = parse_flops(peak_flops), "given"
    elif program is not None and measure_peak:
        rate, rate_source = measure_peak_flops(), f"measured on {jax.devices()[0].device_kind}"
    return RunPlan(config.learner, config.env, config.driver, config.pop_size, config.devices, config.envs_per_member,
                   config.batch_size, config.buffer_size, config.eval_episodes, config.updates_per_iter,
                   config.steps_per_iter, per_member, shared, host_parts, program, memory, source, rate, rate_source,
                   note)


class DoesNotFit(ConfigError):
    """A run refused because it cannot fit in the device's memory; ``plan`` is its ``RunPlan``."""

    def __init__(self, line: str, plan: RunPlan):
        super().__init__(line)
        self.plan = plan


def check_fits(plan: RunPlan) -> RunPlan:
    """``plan``, or ``DoesNotFit`` with its one-line ``refusal``."""
    line = refusal(plan)
    if line is not None:
        raise DoesNotFit(line, plan)
    return plan


# --- refusing what cannot fit ----------------------------------------------------------------------
# The option that shrinks each part (each part grows about linearly with it).
_KNOBS = {"params": "pop_size", "optimizer": "pop_size", "other": "pop_size", "replay": "buffer_size",
          "env": "envs_per_member", "experience": "envs_per_member", "temporaries": "batch_size",
          "evaluation": "eval_episodes"}


def _device_parts(plan: RunPlan) -> dict[str, int]:
    parts = {part: plan.on_device(part) for part in PARTS}
    if plan.program is not None:  # the program's temporaries (batches, activations, gradients)
        parts["temporaries"] = max(0, plan.need_bytes - sum(parts.values()))
    return parts


def _largest(plan: RunPlan, knob: str, scaled: int) -> int:
    """About the largest value of ``knob`` that fits, when ``scaled`` bytes of the need grow linearly with it (the
    whole need but the shared leaves, for ``pop_size``); below the smallest value allowed: 0."""
    current, need, memory = getattr(plan, knob), plan.need_bytes, plan.device_memory
    if knob == "pop_size":
        shared = sum(plan.shared.get(part, 0) for part in PARTS if part not in plan.host_parts)
        most = int(current * (memory - shared) / max(1, need - shared)) // plan.devices * plan.devices
        least = plan.devices
    else:
        most = int(current * (memory - (need - scaled)) / scaled) if scaled else 0
        least = max(plan.batch_size, plan.steps_per_iter) if knob == "buffer_size" else 1
    most = min(most, current - 1)
    return most if most >= least else 0


def refusal(plan: RunPlan) -> str | None:
    """The one line (``field: problem (allowed: ...)``) a run that cannot fit is refused with, or None: the option
    that shrinks the largest part, or ``pop_size`` when that option cannot shrink it enough."""
    if plan.fits:
        return None
    parts = _device_parts(plan)
    part = max(parts, key=parts.get)
    knob = _KNOBS[part]
    most = _largest(plan, knob, parts[part])
    if not most and knob != "pop_size":
        knob, part = "pop_size", "params"
        most = _largest(plan, knob, 0)
    p = plan
    what = {"pop_size": f"{p.pop_size} members:",
            "buffer_size": f"{p.pop_size} replay buffers of {p.buffer_size} transitions take about "
                           f"{size(parts[part])}, and",
            "envs_per_member": f"{p.envs_per_member} envs per member (their state and one iteration's transitions) "
                               f"take about {size(parts[part])}, and",
            "batch_size": f"the update's temporaries at batch {p.batch_size} take about {size(parts[part])}, and",
            "eval_episodes": f"{p.pop_size} members x {p.eval_episodes} episodes evaluated at once take about "
                             f"{size(parts[part])}, and"}[knob]
    unit = {"buffer_size": " transitions per member", "envs_per_member": " envs per member",
            "eval_episodes": " episodes"}.get(knob, "")
    allowed = f"at most about {most}{unit}" if most else "none fits: lower the other options too"
    return (f"{knob}: {what} the run needs about {size(p.need_bytes)} per device, more than the "
            f"{size(p.device_memory)} of device memory ({p.memory_source}) (allowed: {allowed}; popjax train --plan "
            "prints every part)")
