"""Replay as a source: one member's replay as pure functions, interchangeable under every replay-based driver.

A ``ReplaySource`` is built for one run (``SourceDef.make(config, spec, step)``, where ``step`` is the learner's
``popjax.learners.base.ReplayStep``) and is single-member: drivers vmap it over the population.

    init() -> state
    add(state, transitions [n, ...], ended [n]) -> state          # rows in the order they were stepped
    sample(key, state) -> (batch [B, ...], weights [B] | None, handle)
    write_back(state, handle, values [B]) -> state               # optional: what the learner computed per sample
    rewrite(state, values_of) -> state                           # optional: recompute a refreshed value of all rows

``weights`` are importance weights for the learner's TD losses (None: uniform); ``handle`` names the sampled
rows for ``write_back`` (the prioritized source writes |TD| back as priorities; the uniform source writes a learner's
refreshed value back, ``ReplayStep.refresh``: ReF-ER's importance ratios). ``shrink`` is optional: the FIFO view a
dynamic replay capacity needs.

A new source is a ``SourceDef`` and one line in ``popjax.buffers.SOURCES`` (or ``register_source``); the run's
``buffer`` field names it. A source refuses what it cannot serve (windows, banks, a learner without TD
magnitudes) with a ``ConfigError`` from ``make``, before anything is compiled or written.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from popjax.buffers.prioritized import make_prioritized_buffer, per_hyperparams
from popjax.buffers.uniform import (
    drop_oldest,
    make_uniform_buffer,
    oldest_items,
    sample_rows,
    sample_windows,
    valid_rows,
)
from popjax.schema import ConfigError
from popjax.types import EnvSpec, Key, PyTree, Replayed, Windows, dummy_transition


class FifoView(NamedTuple):
    """What a dynamic replay capacity reads and changes: ``oldest(state, count) -> (rows [count, ...], valid
    [count])``, ``drop_oldest(state, count) -> state`` and ``size(state) -> int32``."""

    oldest: Callable[[Any, int], tuple[PyTree, jax.Array]]
    drop_oldest: Callable[[Any, jax.Array], Any]
    size: Callable[[Any], jax.Array]


class ReplaySource(NamedTuple):
    """One member's replay (see the module docstring)."""

    init: Callable[[], Any]
    add: Callable[[Any, PyTree, jax.Array], Any]
    sample: Callable[[Key, Any], tuple[PyTree, jax.Array | None, Any]]
    write_back: Callable[[Any, Any, jax.Array], Any] | None = None
    shrink: FifoView | None = None
    # rewrite(state, values_of(rows [N, ...]) -> [N]) -> state: recomputes the learner's refreshed value
    # (``ReplayStep.refresh``) of every row in one call; None: the source keeps no refreshed value.
    rewrite: Callable[[Any, Callable], Any] | None = None


@dataclasses.dataclass(frozen=True)
class SourceDef:
    """Registry entry of a replay source: ``make(config, spec, step) -> ReplaySource`` (``config``: the run's
    ``RunConfig``); ``description`` says what it samples; ``row_bytes``: what it keeps per row beyond the
    transition (the memory check)."""

    name: str
    make: Callable[[Any, EnvSpec, Any], ReplaySource]
    description: str
    row_bytes: int = 0
    # Whether its sources write values back between samplings for every learner (priorities; then a chunk of
    # updates, whose batches are drawn together, differs from the same updates made one at a time: learners chunk
    # only where they must).
    writes_back: bool = False
    # Whether it samples by the priorities the learner writes back (what a step with ``by_priority`` needs).
    prioritized: bool = False
    # The run options it reads beyond buffer_size and batch_size: a non-default value of one with a source that
    # does not read it is refused.
    options: tuple[str, ...] = ()
    # Whether it keeps a learner's refreshed value per row (``ReplayStep.refresh``: ReF-ER's ratios), written back
    # at the sampled rows and rewritten for the whole replay (``ReplaySource.rewrite``).
    keeps_refreshed: bool = False

    def writes_back_for(self, step) -> bool:
        """Whether the source it makes for a learner's replay ``step`` writes values back between samplings."""
        return self.writes_back or (self.keeps_refreshed and step.refresh is not None)


def _check_windows(config, step, serves_windows: bool) -> None:
    """Multi-step windows need a source that serves them and rows that stay aligned to the envs."""
    if step.window > 1 and (not serves_windows or config.buffer_size % config.envs_per_member):
        raise ConfigError(f"buffer_size: multi-step windows need a uniform buffer whose size is a multiple of "
                          f"envs_per_member ({config.envs_per_member}), got {config.buffer_size} ({config.buffer})")


def make_uniform_source(config, spec: EnvSpec, step) -> ReplaySource:
    """Uniform sampling from a ring buffer of ``buffer_size`` rows; windows of ``step.window`` consecutive steps of
    one env when the learner reads multi-step windows (rows then keep their episode-end flags)."""
    _check_windows(config, step, serves_windows=True)
    buffer = make_uniform_buffer(config.buffer_size, config.batch_size)
    window, stride = step.window, config.envs_per_member
    if step.refresh is not None:
        if window > 1:
            raise ConfigError(f"learner: {config.learner} refreshes a stored value per transition, which the uniform "
                              "source keeps for single transitions only (allowed: window 1)")
        return _refreshing_source(buffer, config, spec, step)
    if window > 1:
        def sample(key, state):
            return Windows(*sample_windows(key, state, config.batch_size, window, stride)), None, None

        return ReplaySource(
            init=lambda: buffer.init((dummy_transition(spec, step.extras), jnp.zeros((), bool))),
            add=lambda state, transitions, ended: buffer.add(state, (transitions, ended)),
            sample=sample,
            shrink=FifoView(lambda state, count: _first_of_rows(oldest_items(state, count)), drop_oldest,
                            lambda state: state.size))
    return ReplaySource(
        init=lambda: buffer.init(dummy_transition(spec, step.extras)),
        add=lambda state, transitions, ended: buffer.add(state, transitions),
        sample=lambda key, state: (buffer.sample(key, state), None, None),
        shrink=FifoView(oldest_items, drop_oldest, lambda state: state.size))


def _refreshing_source(buffer, config, spec: EnvSpec, step) -> ReplaySource:
    """Uniform sampling of transitions with the learner's ``extras``, whose ``step.refresh.field`` the learner
    recomputes: batches are ``Replayed`` (the field of every row beside the sample), ``write_back`` stores the new
    values at the sampled rows and ``rewrite`` recomputes every row."""
    field = step.refresh.field

    def stored(state):
        return state.data.extras[field]

    def with_field(state, values):
        extras = {**state.data.extras, field: values.astype(stored(state).dtype)}
        return state.replace(data=state.data.replace(extras=extras))

    def sample(key, state):
        rows = sample_rows(key, state, config.batch_size)
        batch = jax.tree.map(lambda buf: buf[rows], state.data)
        return Replayed(batch, stored(state), valid_rows(state)), None, rows

    return ReplaySource(
        init=lambda: buffer.init(dummy_transition(spec, step.extras)),
        add=lambda state, transitions, ended: buffer.add(state, transitions),
        sample=sample,
        write_back=lambda state, rows, values: with_field(state, stored(state).at[rows].set(values)),
        shrink=FifoView(oldest_items, drop_oldest, lambda state: state.size),
        rewrite=lambda state, values_of: with_field(state, values_of(state.data)))


def _first_of_rows(found):
    """``oldest_items`` of a windowed buffer holds ``(transition, ended)`` rows: the transitions."""
    rows, valid = found
    return rows[0], valid


def make_prioritized_source(config, spec: EnvSpec, step) -> ReplaySource:
    """Sampling by |TD error| (a K-ary sum tree per bank, ``popjax.buffers.prioritized``) with importance weights;
    the learner's TD magnitudes are written back as the sampled rows' priorities (through the ``per_delay`` FIFO).
    One bank per replica of a learner that reads ``step.banks`` banks (SPO)."""
    if not step.priorities:
        raise ConfigError(f"buffer: the {config.learner} learner returns no priorities (allowed: a source that does "
                          "not sample by priority)")
    banks = step.banks
    if config.buffer_size % banks:
        raise ConfigError(f"buffer_size: must be a multiple of the {banks} replay banks (one per replica) with "
                          f"buffer: prioritized, got {config.buffer_size}")
    if config.steps_per_iter % banks:
        raise ConfigError(f"rollout_len: rollout_len x envs_per_member ({config.steps_per_iter}) must be a multiple "
                          f"of the {banks} replay banks (one per replica) with buffer: prioritized")
    _check_windows(config, step, serves_windows=False)
    buffer = make_prioritized_buffer(config.buffer_size, config.batch_size, banks=banks, delay=config.per_delay)

    def sample(key, state):
        batch, info = buffer.sample(key, state)
        return batch, info.weights.reshape(-1), info.indices  # weights bank-major, as the batch's rows

    return ReplaySource(init=lambda: buffer.init(dummy_transition(spec, step.extras), per_hyperparams(config.per_alpha,
                                                                                        config.per_beta,
                                                                                        config.per_eps)),
                        add=lambda state, transitions, ended: buffer.add(state, transitions),
                        sample=sample, write_back=buffer.update)


UNIFORM = SourceDef("uniform", make_uniform_source, "uniform sampling", keeps_refreshed=True)
# The K = 4 sum tree: one float32 leaf and a third of one in inner nodes (more with padding).
PRIORITIZED = SourceDef("prioritized", make_prioritized_source,
                        "prioritized by |TD error| (K-ary sum tree; learners that return TD magnitudes)", row_bytes=6,
                        writes_back=True, prioritized=True, options=("per_alpha", "per_beta", "per_eps", "per_delay"))
