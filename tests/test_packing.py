"""The loop's state as a few flat buffers (``popjax.population.packing``): exact round trips, in-place write-back
inside a donated program, and training runs whose every leaf equals the same run carried as pytrees."""

from __future__ import annotations

import tempfile

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import popjax
from popjax.loop import Loop
from popjax.population import packing


def mixed_tree():
    return {"w": jnp.arange(12.0, dtype=jnp.float32).reshape(3, 4), "b": jnp.float32(-2.5),
            "steps": jnp.int32(7), "mask": jnp.array([True, False, True]),
            "big": jnp.linspace(0.0, 1.0, 64, dtype=jnp.float32).reshape(8, 8),
            "ids": jnp.arange(5, dtype=jnp.uint32)}


def assert_same_leaves(a, b):
    la, lb = jax.tree.leaves(a), jax.tree.leaves(b)
    assert jax.tree.structure(a) == jax.tree.structure(b) and len(la) == len(lb)
    for x, y in zip(la, lb, strict=True):
        x, y = np.asarray(x), np.asarray(y)
        assert x.dtype == y.dtype and x.shape == y.shape and np.array_equal(x, y)


def test_layout_packs_small_leaves_per_dtype_and_keeps_big_ones_whole():
    tree = mixed_tree()
    layout = packing.layout_of(tree, whole_bytes=100)  # "big" is 256 bytes: passed whole
    assert [str(d) for d in layout.dtypes] == ["bool", "float32", "int32", "uint32"]
    assert layout.sizes == (3, 12 + 1, 1, 5) and layout.whole == 1 and layout.arguments == 5
    arguments = packing.pack(layout, tree)
    assert [a.shape for a in arguments] == [(3,), (13,), (1,), (5,), (8, 8)]
    # float32 buffer: the leaves in the tree's leaf order (b, then w; "big" is whole)
    np.testing.assert_array_equal(arguments[1], np.concatenate([[-2.5], np.arange(12.0)]).astype(np.float32))
    assert_same_leaves(packing.unpack(layout, arguments), tree)


def test_repack_inside_a_donated_program_writes_the_new_values():
    tree = mixed_tree()
    layout = packing.layout_of(tree, whole_bytes=100)

    def step(tree):
        return {**tree, "w": tree["w"] * 2 + 1, "steps": tree["steps"] + 1, "mask": ~tree["mask"],
                "big": tree["big"] - 1}

    def flat(arguments):
        return packing.repack(layout, arguments, step(packing.unpack(layout, arguments)))

    expected = step(tree)  # before the donation: a one-dimensional leaf may be its own buffer
    out = jax.jit(flat, donate_argnums=0)(packing.pack(layout, tree))
    assert_same_leaves(packing.unpack(layout, out), expected)


def test_keys_are_not_packable():
    assert packing.packable(mixed_tree())
    assert not packing.packable({"key": jax.random.key(0), "x": jnp.zeros(2)})


OWN_OPTIONS = {"memr_sac": {"buffer": "prioritized"}}  # its start states are drawn by priority


def train(learner: str, packed: bool, monkeypatch):
    """A short probe:pendulum run (evaluations and a checkpoint between them), packed or carried as pytrees;
    returns the run and the argument count of its iteration program."""
    if not packed:
        monkeypatch.setattr(Loop, "_packs", lambda self, state, env_state: False)
    seen = {}

    def instrument(name, compiled):
        def call(*args):
            if name == "iteration":
                seen["arguments"] = len(jax.tree.leaves(args))
            return compiled(*args)

        return call

    with tempfile.TemporaryDirectory() as tmp:
        run = popjax.train(learner=learner, env="probe:pendulum", pop_size=2, total_env_steps=300, eval_interval=100,
                           checkpoint_interval=150, warmup_steps=50, batch_size=16, buffer_size=1000, seed=3,
                           progress=False, out_dir=f"{tmp}/run", instrument=instrument, preset="none",
                           **OWN_OPTIONS.get(learner, {"learner_config": {"hidden": [16, 16]}}))
    monkeypatch.undo()
    return run, seen["arguments"]


@pytest.mark.parametrize("learner", ["td3", pytest.param("sac", marks=pytest.mark.long),
                                     pytest.param("refer_td3", marks=pytest.mark.long),
                                     pytest.param("memr_sac", marks=pytest.mark.long)])
def test_packed_loop_equals_the_pytree_loop_leaf_for_leaf(learner, monkeypatch):
    packed, packed_arguments = train(learner, True, monkeypatch)
    tree, tree_arguments = train(learner, False, monkeypatch)
    assert_same_leaves(packed.state, tree.state)
    assert packed.summary["final_returns"] == tree.summary["final_returns"]
    # 3 keys, a few buffers each for the state and env state, and the leaves over 32 KiB (MEMR's default 256-wide
    # networks) whole: a fraction of the pytrees' leaves
    assert packed_arguments < tree_arguments / 4
    if learner != "memr_sac":  # 16-wide networks: every leaf packed
        assert packed_arguments <= 3 + 2 * 4
