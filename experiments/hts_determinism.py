"""H1: the HTS-RL driver is deterministic whatever the thread timing (Liu, Yeh & Schwing 2020, Sec. 4.1).

    PYTHONPATH=. .venv/bin/python experiments/hts_determinism.py [--learners a2c,dqn] [--segments 12]

8 executor threads (pop 2 x 4 envs, one env each), alpha 16, 12 segments, on the toy env with
exponential step times (mean 1 ms) drawn from an unseeded source, so every run interleaves
differently. For each learner: a serial single-threaded run of the same schedule, then 1, 2, 3 and 4
actor threads; pass when the final parameters, every action and every stored value (a SHA-256 of
each segment's storage) equal the serial run's bit for bit, and seed + 1 differs. Negative controls
(expected to break equality): ``shape``, actors run each member's available rows alone (a batch whose
shape depends on timing), and ``keys``, one key per member and actor call (randomness from arrival
order). Writes experiments/results/hts_determinism.json.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from popjax.config import make_config
from popjax.experiment import build
from popjax.learners import LEARNERS

HERE = Path(__file__).parent


def digest(tree) -> str:
    h = hashlib.sha256()
    for leaf in jax.tree.leaves(tree):
        a = np.asarray(leaf)
        h.update(str(a.dtype).encode() + str(a.shape).encode() + np.ascontiguousarray(a).tobytes())
    return h.hexdigest()


# Compiled per number of rows: under the "shape" control the batch shape depends on timing.
_ACT_MEMBER = jax.jit(lambda f, *a: f(*a), static_argnums=0)


def negative_control(mode: str, spec, warmup: int):
    """The driver's act replaced by a control expected to break equality (``HtsInteraction.act_override``):
    ``shape``: each member's available rows alone (a batch whose shape depends on timing); ``keys``: one key per
    member and call, whatever the rows (randomness from arrival order)."""
    def act(programs, key, acting, obs, t, valid) -> tuple[np.ndarray, None]:
        out = np.zeros(valid.shape + spec.action_shape, np.dtype(spec.action_dtype))
        keys = programs["row_keys"](key, jnp.asarray(t))
        for m in np.flatnonzero(valid.any(axis=1)):
            rows = np.flatnonzero(valid[m])
            params, hparams = jax.tree.map(lambda x, m=m: x[m], (acting.learner, acting.hparams))
            if mode == "shape":
                got, _ = _ACT_MEMBER(programs["act_rows"], keys[m][rows], params, hparams, jnp.asarray(obs[m][rows]),
                                     acting.counters.env_steps < warmup)
            else:
                k_ = jax.random.fold_in(key, time.perf_counter_ns() % 2**31)
                got, _ = programs["learner_act"](k_, params, jnp.asarray(obs[m][rows]), hparams)
            out[m, rows] = np.asarray(got)
        return out, None

    return act


def run(learner: str, seed: int, segments: int, alpha: int, actors: int, serial: bool = False,
        control: str | None = None) -> dict:
    config = make_config(learner=learner, env="gym:popjax/HtsToySleep-v0", driver="hts", pop_size=2,
                         envs_per_member=4, seed=seed, total_env_steps=segments * alpha * 4, progress=False,
                         warmup_steps=64, batch_size=32, buffer_size=10_000,
                         hparams={"epsilon_start": 0.1} if learner == "dqn" else {},
                         hts={"alpha": alpha, "executors": 8, "actors": actors, "serial": serial})
    loop = build(config)
    interaction = loop.driver.interaction
    if control is not None:
        warmup = 0 if LEARNERS[learner].on_policy else config.warmup_steps
        interaction.act_override = negative_control(control, loop.runner.spec, warmup)
    batch_rows = []
    interaction.on_act = lambda acting, obs, t, valid: batch_rows.append(int(valid.sum()))
    state, _ = loop.initial_state()
    stored = []
    start = time.perf_counter()
    try:
        for s in range(segments):
            state, _, _ = loop.step(state, None)
            stored.append(digest(interaction.executors.storage[s % 2].arrays()))
    finally:
        interaction.close()
        loop.runner.close()
    return {"learner": learner, "seed": seed, "actors": actors, "serial": serial, "control": control,
            "params": digest(state.learner), "segments": stored, "act_calls": len(batch_rows),
            "rows_per_call": sorted(set(batch_rows)), "wall_s": round(time.perf_counter() - start, 3)}


def batch_shape_bits() -> int:
    """How many batch sizes k in 1..64 give an A2C forward pass (logits and value) whose first k rows differ in
    any bit from the same rows of the batch-64 pass (why the driver pads to a fixed shape)."""
    from popjax.envs.registry import env_spec
    from popjax.learners import onpolicy

    spec = env_spec("gym:popjax/HtsToy-v0")
    definition = LEARNERS["a2c"]
    config = definition.config_cls()
    params = definition.make(config, spec).init(jax.random.key(0), definition.default_hparams(config)).params
    net = onpolicy.network(config.hidden, spec)
    forward = jax.jit(lambda o: net.apply(params, o))
    obs = np.random.default_rng(0).normal(size=(64, 16)).astype(np.float32)
    full = [np.asarray(x) for x in jax.tree.leaves(forward(obs))]
    return sum(any(np.any(np.asarray(a) != b[:k]) for a, b in zip(jax.tree.leaves(forward(obs[:k])), full,
                                                                     strict=True)) for k in range(1, 65))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--learners", default="a2c,dqn")
    parser.add_argument("--segments", type=int, default=12)
    parser.add_argument("--alpha", type=int, default=16)
    parser.add_argument("--out", type=Path, default=HERE / "results" / "hts_determinism.json")
    args = parser.parse_args()
    results = {"runs": [], "checks": {}, "a2c_batch_sizes_with_other_bits": batch_shape_bits()}
    print(f"A2C forward: {results['a2c_batch_sizes_with_other_bits']} of 64 batch sizes change some bit of a row")
    for learner in args.learners.split(","):
        reference = run(learner, 0, args.segments, args.alpha, 1, serial=True)
        results["runs"].append(reference)
        def same(r, reference=reference):
            return r["params"] == reference["params"] and r["segments"] == reference["segments"]

        for actors in (1, 2, 3, 4):
            r = run(learner, 0, args.segments, args.alpha, actors)
            results["runs"].append(r)
            results["checks"][f"{learner}: {actors} actors == serial"] = same(r)
        other = run(learner, 1, args.segments, args.alpha, 2)
        results["runs"].append(other)
        results["checks"][f"{learner}: seed 1 differs"] = other["params"] != reference["params"]
        for control in ("shape", "keys"):
            r = run(learner, 0, args.segments, args.alpha, 2, control=control)
            results["runs"].append(r)
            first = next((i for i, (a, b) in enumerate(zip(r["segments"], reference["segments"], strict=True))
                          if a != b), None)
            results["checks"][f"{learner}: control {control} breaks equality"] = not same(r)
            results["checks"][f"{learner}: control {control} first differing segment"] = first
        for name, value in results["checks"].items():
            if name.startswith(learner):
                print(f"{name}: {value}")
    gate = all(v for k, v in results["checks"].items() if "==" in k or "differs" in k)
    results["pass"] = gate
    print("H1", "PASS" if gate else "FAIL")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
