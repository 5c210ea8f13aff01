"""Population-based training (Jaderberg et al. 2017) as a transformer of a driver (``with_pbt``) and the ``pbt``
driver (the transformer around the independent population).

The parts live beside it: ``pbt_options`` (the ``pbt`` block and the static ``PBTConfig``), ``pbt_round`` (the pure
round and the compiled ``after_eval``), ``pbt_host`` (lineage and PB2's proposals).

``exploit_and_explore`` is pure jnp: rank the members by fitness, replace the bottom
``quantile`` (a static count ``int(quantile * N) >= 1``) by full copies of parents drawn
uniformly from the top ``quantile``, then explore the copied hyperparameters (resample from
the prior, the fast-PBT paper's choice, or perturb). The driver trains like ``independent``;
its state adds a ``PBTRecord`` (fitness window, counts, last round), so the whole decision
after an evaluation (record the returns, check readiness, exploit and explore) is one
compiled ``after_eval``; only the lineage is written on the host.

Every part of the round is an option (``PBTConfig``), so a strategy is data, not a branch elsewhere:
  * who is replaced and from whom: ``selection`` (``truncation``, or Isaac Lab's ``sigma`` threshold), ``parents``
    (``top`` or the release's ``non_bottom``), or multi-frequency PBT's ``subpopulations``/``frequencies``
    (``popjax.population.selection``);
  * what is copied: ``copy`` (``full`` or the release's ``policy``, the learner's declared ``policy_state``) and
    ``reset_optimizer`` (its declared ``optimizer_state``);
  * the new hparams: ``explore`` (``resample``, ``perturb``, or ``pb2``: proposed on the host by
    ``PBTHost.propose`` with ``popjax.population.pb2`` and written by the compiled ``set_hparams``), kept inside
    the ``constraints`` (``popjax.population.constraints``).

Choices:
  * The loser copies the parent's **whole learner state**: networks, targets, optimizer
    states and step counters (the release copies only the policy). The replay buffer is
    copied too with ``copy_buffer=True``; by default each member keeps its own data.
  * Ranking is a stable sort: members with equal fitness keep index order, so the lower
    index ranks higher. A member whose fitness is NaN or whose learner state holds a
    non-finite value ranks below every valid member and is always replaced (even beyond
    the static loser count).
  * Hyperparameters are traced arrays with fixed dtypes (``policy_delay`` is int32 in TD3),
    so neither the exploit nor the training step is retraced after an exploit.
  * Perturbation multiplies by a factor f drawn from ``perturb_factors`` (default 0.8 /
    1.2): for a log-uniform range the value itself (``log x + log f`` in log space), for a
    linear range the offset from its lower bound (``low + (x - low) f``; identical for
    ranges starting at 0, and it keeps U[0.9, 1] discounts moving inside the range). A step
    that would leave the range is reflected (divided by f instead) and then clipped; an
    integer that rounds back to its old value moves one unit in f's direction. With
    probability ``resample_probability`` a value is resampled from the prior instead.
  * No exploit runs at the final evaluation (it would replace members after their last
    evaluation, so the final returns would no longer describe the final state).
"""

from __future__ import annotations

import csv
import dataclasses
from collections.abc import Callable

import jax
import jax.numpy as jnp

from popjax import plots
from popjax.drivers.base import BuildContext, Driver, DriverDef
from popjax.drivers.independent import make_population
from popjax.drivers.pbt_host import PBTHost
from popjax.drivers.pbt_options import PBTConfig, PBTOptions
from popjax.drivers.pbt_round import MEMBER_AXES, PBTState, initial_hparams, initial_record, pbt_after_eval
from popjax.drivers.schedule import ancestry, best_member
from popjax.learners.base import ReplayStep, RolloutStep
from popjax.registry import LEARNERS
from popjax.schema import ConfigError


def with_prior_hparams(ctx: BuildContext, config: PBTConfig) -> BuildContext:
    """``ctx`` with the initial hparams of the PBT space drawn from the prior, except those the user fixed
    (``hparams``) or sampled (``search_space``)."""
    keep = set(ctx.config.hparams) | set(ctx.config.search_space)
    return dataclasses.replace(ctx, hparams=initial_hparams(ctx.setup_key, ctx.hparams, config.space, keep, config))


def with_pbt(build_inner: Callable[[BuildContext], Driver], config: PBTConfig,
             carried: tuple[str, ...] = ("learner",)) -> Callable[[BuildContext], Driver]:
    """PBT as a transformer of a driver: ``ctx -> Driver`` of ``build_inner`` with exploit/explore after its
    evaluations.

    The inner driver is built from the context with the PBT space's initial hparams drawn from the prior (except
    those the user fixed or sampled); its ``init(key, pbt=record)`` must keep the ``PBTRecord`` in its state's
    ``pbt`` field, and its state must have ``counters``, ``hparams`` and the member-axis fields named in
    ``carried`` (what a loser copies from its parent). Its ``after_eval`` becomes PBT's and its host is wrapped by
    ``PBTHost`` (the lineage). Used by ``pbt`` (around the independent population) and ``hts`` (at barriers).
    """
    def build(ctx: BuildContext) -> Driver:
        ctx = with_prior_hparams(ctx, config)
        inner = build_inner(ctx)
        pop, total = ctx.config.pop_size, ctx.config.total_env_steps
        return inner._replace(
            init=lambda key: inner.init(key, pbt=initial_record(config.fitness_window, pop)),
            after_eval=lambda key, state, returns: pbt_after_eval(key, state, returns, config, total, carried,
                                                                  inner.on_replace),
            host=PBTHost(inner.host, config, ctx.config.seed),
            set_hparams=lambda state, hparams: write_hparams(state, hparams, inner.on_replace))

    return build


def write_hparams(state, hparams, on_replace: Callable | None = None):
    """``state`` with the host's ``hparams`` (PB2's proposals), and ``on_replace`` re-run for every member whose
    hparams changed: what a member derives from its learner state may depend on them (ReF-ER's ratios on TD3's
    sigma), and the round ran it with the parent's hparams, before the host proposed."""
    old, new = jax.tree.leaves(state.hparams), jax.tree.leaves(hparams)
    changed = [(a != b).reshape(a.shape[0], -1).any(axis=1) for a, b in zip(old, new, strict=True)]
    state = state.replace(hparams=hparams)
    return state if on_replace is None else on_replace(state, jnp.any(jnp.stack(changed), axis=0))


def build(ctx: BuildContext, options: PBTOptions) -> Driver:
    """The independent population, started from the prior and exploited after evaluations."""
    return with_pbt(lambda c: make_population(c, PBTState, MEMBER_AXES), options.pbt_config())(ctx)


def pbt_run_plots(run_dir) -> list:
    """``pbt_hparams.png`` (schedules from metrics.csv) and ``pbt_lineage.png`` (from summary.json)."""
    cfg, rows = run_dir.read_config(), run_dir.read_metrics()
    summary = run_dir.read_summary() if (run_dir.path / "summary.json").exists() else {}
    definition = LEARNERS.get(cfg.get("learner"))
    names = [f.name for f in dataclasses.fields(definition.hparams_cls)] if definition else []
    written = []
    if rows and names:
        written.append(plots.pbt_hparams_plot(rows, names, run_dir.path / "plots" / "pbt_hparams.png",
                                              f"PBT hyperparameters: {cfg.get('learner')} on {cfg.get('env')}"))
    if summary:
        written.append(plots.pbt_lineage_plot(summary.get("lineage", []), int(cfg["pop_size"]),
                                              float(summary.get("env_steps", cfg["total_env_steps"])),
                                              run_dir.path / "plots" / "pbt_lineage.png",
                                              final_returns=summary.get("final_returns"),
                                              winner=_winner_line(run_dir, summary)))
    return written


def _winner_line(run_dir, summary) -> list[tuple[float, int]] | None:
    """``[(env steps, member)]``: the best final member's line through every copy (from lineage.csv), or None."""
    path = run_dir.path / "lineage.csv"
    try:
        with path.open(newline="") as f:
            rows = list(csv.DictReader(f))
        member = best_member(summary.get("final_returns", []))
    except (OSError, ConfigError):
        return None
    return [(float(row["env_steps"]), int(row["member"])) for row in ancestry(rows, member)] if rows else None


DEFINITION = DriverDef(name="pbt", build=build, options=PBTOptions, plots=pbt_run_plots,
                       steps=(ReplayStep, RolloutStep), sources=None, policy_copy=True)
