"""``wall_s`` counts the device time of every iteration, also of those that end in a checkpoint between
evaluations (issue 49: the checkpoint waited for the device after the iteration's time was taken)."""

import time

import jax
import jax.numpy as jnp
from rundir_helpers import TINY

import popjax


@jax.jit
def _burn(leaf, x):
    """Device work that the host does not wait for (dispatch is asynchronous): ``leaf`` once it is done."""
    y = jax.lax.fori_loop(0, 150, lambda i, a: jnp.tanh(a @ x), x)
    return leaf + (0 * y[0, 0]).astype(leaf.dtype)


def test_wall_s_counts_device_time_at_checkpoints_between_evaluations(tmp_path):
    x = jnp.ones((600, 600)) / 600
    probe = jnp.zeros(())
    _burn(probe, x).block_until_ready()  # compiled
    burn_s = []
    for _ in range(3):
        start = time.perf_counter()
        _burn(probe, x).block_until_ready()
        burn_s.append(time.perf_counter() - start)
    calls = []

    def slow_iterations(name, program):
        if name not in ("iteration", "learn"):
            return program

        def call(*args):
            state, *rest = program(*args)
            leaves, tree = jax.tree.flatten(state)
            calls.append(name)
            return (jax.tree.unflatten(tree, [_burn(leaves[0], x)] + leaves[1:]), *rest)

        return call

    # 6 iterations of 50 env steps, a checkpoint after each, one evaluation at the end
    run = popjax.train(out_dir=tmp_path / "run", instrument=slow_iterations,
                       **{**TINY, "eval_interval": 300, "checkpoint_interval": 50})
    assert len(calls) == 6
    # every iteration's device work is in wall_s (before the fix only the evaluated one's was: about one burn)
    assert run.summary["wall_s"] >= 0.6 * len(calls) * min(burn_s), (run.summary["wall_s"], burn_s)
