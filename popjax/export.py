"""``popjax export``: a trained member's deterministic actor as a compact file, and a loader to run it.

The file is an ``.npz`` of ``popjax.networks.compact`` layers (active links only for sparse kernels, so an RLx2
actor at 98 % sparsity is about 50 times smaller than its dense kernels) plus ``meta.json``-like fields: learner,
env, member, return, observation and action sizes, active weights. ``load_policy(path)`` gives a jitted
``policy(obs [B, obs] or [obs]) -> actions in [-1, 1]`` that needs nothing of the run but this file.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from popjax import precision
from popjax.config import ConfigError
from popjax.networks import compact


def export_policy(run_dir: str | Path, out: str | Path | None = None, member: int | None = None) -> Path:
    """Writes member ``member``'s actor (default: the best final return) of a run to ``out`` (default
    ``<run_dir>/policy-member<m>.npz``); refuses to overwrite any file. Returns the path."""
    from popjax import experiment
    from popjax.population.tree import member as take_member
    from popjax.registry import LEARNERS

    run = experiment.load(run_dir)
    definition = LEARNERS[run.config.learner]
    if definition.report.actor_params is None:
        offering = ", ".join(n for n, d in LEARNERS.items() if d.report.actor_params is not None)
        raise ConfigError(f"export: the {run.config.learner} learner has no deterministic MLP actor to export "
                          f"(allowed: {offering})")
    returns = run.summary.get("final_returns") or []
    if member is None:
        member = int(np.nanargmax(returns)) if returns else 0
    if not 0 <= member < run.config.pop_size:
        raise ConfigError(f"member: {member} is not a member of this population (allowed: 0 to "
                          f"{run.config.pop_size - 1})")
    out = Path(out) if out is not None else Path(run_dir) / f"policy-member{member}.npz"
    if out.exists():
        raise ConfigError(f"out: {out} exists; popjax never overwrites a file (choose another --out)")
    params = jax.device_get(definition.report.actor_params(take_member(run.state.learner, member)))
    dense = params["params"]["MLP_0"]
    names = sorted(dense, key=lambda n: int(n.split("_")[-1]))
    layers = compact.compact_layers([dense[n]["kernel"] for n in names], [dense[n]["bias"] for n in names])
    meta = {"format": "popjax compact MLP actor, ReLU hidden layers, tanh output", "learner": run.config.learner,
            "env": run.config.env, "member": member, "run": str(Path(run_dir).resolve()),
            "matmul_precision": run.config.matmul_precision,
            "final_return": returns[member] if member < len(returns) else None,
            "obs_size": layers[0].shape[0], "action_size": layers[-1].shape[1],
            "active_weights": compact.active_links(layers),
            "dense_weights": sum(layer.shape[0] * layer.shape[1] for layer in layers)}
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out, "xb") as f:  # exclusive: never replaces a file that appeared meanwhile
        np.savez(f, meta=np.asarray(json.dumps(meta)), **compact.to_arrays(layers))
    return out


def read_meta(path: str | Path) -> dict:
    with np.load(path) as data:
        return json.loads(str(data["meta"]))


def load_policy(path: str | Path) -> Callable[[np.ndarray], np.ndarray]:
    """The exported actor as ``policy(obs) -> actions`` (one observation or a batch), jitted, with the products of
    the run's ``matmul_precision`` (files written before it was recorded: ``default``)."""
    with np.load(path) as data:
        layers = compact.from_arrays({k: data[k] for k in data.files if k != "meta"})
        name = json.loads(str(data["meta"])).get("matmul_precision", "default")
    network = precision.network(lambda x: compact.forward(layers, x))
    forward = jax.jit(precision.apply(network, precision.check(name)))

    def policy(obs):
        obs = jnp.asarray(obs, jnp.float32)
        return np.asarray(forward(obs[None]))[0] if obs.ndim == 1 else np.asarray(forward(obs))

    return policy
