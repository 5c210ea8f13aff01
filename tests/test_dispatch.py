"""What the training loop dispatches per iteration, and the ``dispatch`` study at tiny size (its fields, not its
timings): one compiled call derives an iteration's keys (the same bits as the eager derivation), and on the JAX
env path an iteration reads nothing back from the device."""

from __future__ import annotations

import json
import math

import jax
import numpy as np
import pytest

from popjax.loop import KeyPurpose, key_for, keys_for
from popjax_bench import common, dispatch, update

TINY = dict(hidden=(8, 8), batch_size=4, repeats=10, min_time=0.0, seed=0)


@pytest.fixture(autouse=True)
def quiet_machine(monkeypatch):
    """The study sees a quiet machine (other processes may load this one) and a small dense-matmul peak."""
    monkeypatch.setattr(common, "load_average", lambda: [0.1, 0.1, 0.1])
    monkeypatch.setattr(common, "others_cpu_share", lambda since: 0.0)
    monkeypatch.setattr(common, "PEAK_N", 128)


def eager_key(seed: int, purpose: KeyPurpose, iteration: int):
    return jax.random.fold_in(jax.random.fold_in(jax.random.key(seed), int(purpose)), iteration)


@pytest.mark.parametrize("seed", [0, 7, 2**31 - 1])
def test_keys_derived_in_one_call_are_the_eager_keys(seed):
    purposes = (KeyPurpose.PREPARE, KeyPurpose.COLLECT, KeyPurpose.LEARN)
    for iteration in (0, 1, 12345):
        derived = keys_for(seed, purposes, iteration)
        assert len(derived) == 3
        for key, purpose in zip(derived, purposes, strict=True):
            np.testing.assert_array_equal(jax.random.key_data(key),
                                          jax.random.key_data(eager_key(seed, purpose, iteration)))
        np.testing.assert_array_equal(jax.random.key_data(key_for(seed, KeyPurpose.LEARN, iteration)),
                                      jax.random.key_data(derived[2]))
    assert not np.array_equal(jax.random.key_data(derived[0]), jax.random.key_data(derived[1]))


@pytest.mark.long
def test_counter_sees_eager_ops_and_host_reads():
    """The counting mode itself: three eager ops and one read are three executions and one host read."""
    counter = dispatch.ExecutionCounter()
    x = jax.numpy.arange(4.0)
    with counter.enabled():
        counter.active = True
        y = (x + 1) * 2  # two executions
        total = float(y.sum())  # one execution, one host read
        counter.active = False
    assert total == 2 * (0 + 1 + 2 + 3 + 4)
    assert (counter.executions, counter.host_reads) == (3, 1)


@pytest.mark.long
def test_dispatch_study_fields(tmp_path):
    payload = dispatch.run(pops=(1,), iterations=10, count_iterations=3, out_dir=str(tmp_path), **TINY)
    path = tmp_path / f"dispatch_{jax.default_backend()}.json"
    stored = json.loads(path.read_text())
    assert stored["study"] == "dispatch" and stored["busy"] is False
    assert path.with_suffix(".png").stat().st_size > 1000
    assert stored["ceilings"]["dense_matmul"]["before"]["gflops"] > 0
    (upd,) = [r for r in payload["results"] if r["part"] == "update"]
    (loop,) = [r for r in payload["results"] if r["part"] == "loop"]

    # The update part: the no-op programs take the update's own arguments (leaf counts of the real state).
    p = update.problem("td3", (8, 8), 4, 1)
    state, hparams = update.population_state(p, 1)
    assert upd["args"]["state"] == {"leaves": len(jax.tree.leaves(state)),
                                    "bytes": sum(x.nbytes for x in jax.tree.leaves(state))}
    assert upd["args"]["hparams"]["leaves"] == len(jax.tree.leaves(hparams))
    assert upd["args"]["batch"]["leaves"] == 5 and upd["args"]["keys"]["leaves"] == 1
    dtypes = {str(dispatch._data(x).dtype) for x in jax.tree.leaves((state, hparams, update.synthetic_batches(
        p, None, 1), jax.random.split(jax.random.key(0), 1)))}
    assert 1 < upd["args"]["packed_buffers"] <= 2 * len(dtypes)  # state and the rest, one buffer per dtype each
    for name in dispatch.UPDATE_IMPLS:
        assert upd[f"{name}_s"] > 0 and upd["timing"][name]["repeats"] >= 10
    assert upd["overhead_s"] == upd["noop_s"]
    assert upd["pytree_s"] == pytest.approx(upd["noop_s"] - upd["noop_packed_s"])
    assert upd["overhead_share"] == pytest.approx(upd["noop_s"] / upd["update_s"])
    # The loop's layout: the state as one buffer per dtype, the same leaves after a call as the pytree update's.
    state_dtypes = {str(x.dtype) for x in jax.tree.leaves(state)}
    assert upd["args"]["flat_state"] == {"leaves": len(state_dtypes), "bytes": upd["args"]["state"]["bytes"]}
    assert upd["flat_equal"] is True and upd["flat_overhead_s"] == upd["noop_flat_s"]

    # The loop part: a window of exactly the timed iterations, each one call of the compiled iteration program.
    assert loop["iterations_timed"] == 10
    assert loop["calls"]["iteration"] == dispatch.WARMUP_ITERATIONS + 10 + 1  # the window closes at a call
    assert loop["iteration_s"] > 0 and loop["program_s"] > 0 and loop["program_noop_s"] > 0
    assert loop["loop_overhead_s"] == pytest.approx(loop["iteration_s"] - loop["program_s"])
    for name in ("program", "program_noop"):  # as many back-to-back calls as the window, in rounds
        assert loop["timing"][name]["calls_per_round"] == 10
        assert loop["timing"][name]["repeats"] == dispatch.PIPELINE_ROUNDS
    assert loop["args"]["keys"]["leaves"] == 3
    # The loop carries its state and env state packed: a few buffers each, not the pytrees' leaves.
    assert loop["args"]["state"]["leaves"] <= 4 and loop["args"]["env_state"]["leaves"] <= 4
    # Per iteration: one compiled key derivation, nothing read back from the device.
    assert loop["iterations_counted"] == 3
    assert loop["program_calls"] == {"iteration": 1.0}
    assert loop["eager_executions"] == 1.0 and loop["host_reads"] == 0.0
    assert all(math.isfinite(v) for v in (loop["iteration_s"], loop["program_s"]))
