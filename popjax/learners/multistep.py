"""Multi-step returns over windows of consecutive transitions of one env (``popjax.types.Windows``).

A window's rewards add up to the first step whose episode ended (inclusive: terminated or truncated); the return
bootstraps from that step's ``next_obs`` (the true last observation on a truncation) with ``gamma**m``, m the steps
used, unless that step was a true termination.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from popjax.types import PyTree, Transition, Windows


def window_steps(windows: Windows, steps_used: jax.Array | int | None = None
                 ) -> tuple[jax.Array, jax.Array, Transition]:
    """``(used [B, n], m [B], last)``: which window steps count (up to the first episode end, inclusive, and at
    most ``steps_used``; None: the whole window), how many, and the transition of the last one (the bootstrap
    step)."""
    k = jnp.arange(windows.ended.shape[1])
    ended_before = jnp.cumsum(windows.ended, axis=1) - windows.ended
    used = ended_before == 0  # step 0 always
    if steps_used is not None:
        used = used & (k < steps_used)
    m = used.sum(axis=1)
    return used, m, at_step(windows.transitions, m - 1)


def at_step(tree: PyTree, index: jax.Array) -> PyTree:
    """Leaves ``[B, n, ...]`` -> ``[B, ...]`` at step ``index[b]`` of each window."""
    return jax.tree.map(lambda x: jnp.take_along_axis(x, index.reshape((-1,) + (1,) * (x.ndim - 1)), axis=1)[:, 0],
                        tree)


def n_step_return(windows: Windows, discount: jax.Array) -> tuple[jax.Array, jax.Array, Transition]:
    """``(returns [B], bootstrap discount [B], last)``: the discounted rewards of the used steps, ``gamma**m`` times
    ``1 - terminated`` of the last used step (0: no bootstrap), and that step's transition (its ``next_obs`` is
    where the target bootstraps)."""
    used, m, last = window_steps(windows)
    k = jnp.arange(used.shape[1])
    returns = jnp.sum(jnp.where(used, discount ** k * windows.transitions.reward, 0.0), axis=1)
    return returns, discount ** m * (1.0 - last.terminated), last
