"""Diagonal cross-entropy method (sep-CEM) as pure ``ask`` / ``tell`` functions over a jnp state.

Semantics are those of the CEM-RL release (Pourchot & Sigaud 2019, ``sepCEM`` in ``ES.py``)
as used by the fast-PBT paper, which produced the published curves:

- ``init_var`` (1e-2 in the fast-PBT paper, raised from CEM-RL's 1e-3) is a **variance**
  (the release calls it ``sigma_init`` / ``initial_diagonal_std`` but uses it as one);
- mirrored (antithetic) sampling: ``eps_j = sqrt(var) * N(0, I)`` for ``j < N/2`` and the
  samples are ``[mu + eps_1 .. mu + eps_{N/2}, mu - eps_1 .. mu - eps_{N/2}]``, so samples
  ``i`` and ``i + N/2`` are symmetric about ``mu``;
- elites = the ``n_e`` best samples (ties broken by index), weighted
  ``w_i = log((n_e + 1) / i)``, ``i = 1..n_e``, normalised to sum 1 (``weighting="log"``;
  ``"uniform"`` gives ``1 / n_e``);
- ``tell``: ``mu' = sum_i w_i z_i``; ``cov_noise' = decay * cov_noise + (1 - decay) * final``
  (0.95 toward 1e-5, so ``cov_noise_t - final = (init - final) * 0.95^t``);
  ``var' = sum_i w_i (z_i - mu)^2 / n_e + cov_noise'`` with the **old** mean ``mu``
  (Hansen's tutorial, Eq. 12) and an extra ``/ n_e`` (``var_div_elites=True``) that the
  release has and the textbook does not; set it False for the textbook variance.

Everything is jnp: ``ask`` and ``tell`` jit, and the state is a pytree (checkpointable, no
keys inside). Parameters are flat vectors; use ``jax.flatten_util.ravel_pytree`` to map a
policy pytree to one and back.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from popjax.types import Key

WEIGHTINGS = ("log", "uniform")


@dataclasses.dataclass(frozen=True)
class CEMConfig:
    """Static CEM settings (shapes and constants; defaults = the fast-PBT CEM-RL release)."""

    pop_size: int
    n_elites: int
    init_var: float = 1e-2
    cov_noise_init: float = 1e-2
    cov_noise_final: float = 1e-5
    cov_noise_decay: float = 0.95
    mirrored: bool = True
    weighting: str = "log"
    var_div_elites: bool = True

    def __post_init__(self):
        if self.pop_size < 1 or not 1 <= self.n_elites <= self.pop_size:
            raise ValueError(f"CEM needs 1 <= n_elites <= pop_size, got n_elites={self.n_elites}, "
                             f"pop_size={self.pop_size}")
        if self.mirrored and self.pop_size % 2:
            raise ValueError(f"mirrored (antithetic) sampling needs an even pop_size, got {self.pop_size}")
        if self.weighting not in WEIGHTINGS:
            raise ValueError(f"weighting must be one of {', '.join(WEIGHTINGS)}, got {self.weighting!r}")
        if self.init_var <= 0 or self.cov_noise_init < 0 or self.cov_noise_final < 0:
            raise ValueError("init_var must be > 0 and the cov noise values >= 0")
        if not 0.0 <= self.cov_noise_decay <= 1.0:
            raise ValueError(f"cov_noise_decay must be in [0, 1], got {self.cov_noise_decay}")


@struct.dataclass
class CEMState:
    mean: jax.Array  # [dim] float32
    var: jax.Array  # [dim] float32, a variance
    cov_noise: jax.Array  # float32 scalar, added to var at every tell
    generation: jax.Array  # int32, tells done


def elite_weights(n_elites: int, weighting: str = "log") -> np.ndarray:
    """Normalised elite weights, best first: ``log((n_e + 1) / i)`` or uniform."""
    if weighting == "uniform":
        return np.full(n_elites, 1.0 / n_elites)
    w = np.log((n_elites + 1) / np.arange(1, n_elites + 1))
    return w / w.sum()


def init(mean: jax.Array, config: CEMConfig) -> CEMState:
    """A CEM state centred on ``mean`` (flat float vector) with variance ``init_var`` everywhere."""
    mean = jnp.asarray(mean, jnp.float32)
    return CEMState(mean=mean, var=jnp.full_like(mean, config.init_var),
                    cov_noise=jnp.asarray(config.cov_noise_init, jnp.float32),
                    generation=jnp.zeros((), jnp.int32))


def ask(key: Key, state: CEMState, config: CEMConfig) -> jax.Array:
    """``pop_size`` samples ``[pop, dim]``; mirrored: sample ``i + pop/2`` is ``2 mu - sample i``."""
    n = config.pop_size // 2 if config.mirrored else config.pop_size
    eps = jnp.sqrt(state.var) * jax.random.normal(key, (n,) + state.mean.shape, state.mean.dtype)
    if config.mirrored:
        eps = jnp.concatenate([eps, -eps])
    return state.mean + eps


def rank(fitness: jax.Array) -> jax.Array:
    """Indices from best to worst (higher fitness first; ties by index; NaN counts as worst)."""
    fitness = jnp.where(jnp.isnan(fitness), -jnp.inf, fitness)
    return jnp.argsort(-fitness, stable=True)


def tell(state: CEMState, samples: jax.Array, fitness: jax.Array, config: CEMConfig) -> CEMState:
    """Updates mean, variance and cov noise from ``samples [pop, dim]`` and ``fitness [pop]``."""
    elites = samples[rank(fitness)[: config.n_elites]]
    w = jnp.asarray(elite_weights(config.n_elites, config.weighting), samples.dtype)
    mean = w @ elites
    cov_noise = config.cov_noise_decay * state.cov_noise + (1.0 - config.cov_noise_decay) * config.cov_noise_final
    var = w @ jnp.square(elites - state.mean)  # old mean (Hansen Eq. 12)
    if config.var_div_elites:
        var = var / config.n_elites  # the release's extra 1/n_e
    return CEMState(mean=mean, var=var + cov_noise, cov_noise=cov_noise.astype(jnp.float32),
                    generation=state.generation + 1)
