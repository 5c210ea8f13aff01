"""``matmul_precision``: the arithmetic of matrix products, applied to every compiled program of a run and recorded.

On a CPU, ``default``, ``tf32`` and ``highest`` all compute float32 products (a CPU has no TF32), so their runs are
bit-identical; ``bf16`` rounds the operands of every product of the networks' passes to bfloat16 and so changes the
results (and still learns); what it leaves float32 is tested in test_precision_scope.py.
"""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import yaml
from rundir_helpers import TINY

import popjax
from popjax import precision
from popjax.cli import main

# 1 + 2**-10 is a float32 number that bfloat16 (8 significant bits) rounds to 1: a row of 8 of them times ones
# sums to 8.0078125 in float32 and to exactly 8.0 from bfloat16 operands.
X = jnp.full((4, 8), 1 + 2**-10, jnp.float32)
W = jnp.ones((8, 3), jnp.float32)


def nested(w, x):
    """Products at the top, under vmap, grad and a scan body, and in a cond branch."""
    def body(carry, _):
        grad = jax.grad(lambda v: jnp.sum(jax.nn.relu(x @ v)))(carry)
        rows = jax.vmap(lambda xi: xi @ carry)(x)
        branch = jax.lax.cond(rows.sum() > 0, lambda: (x @ carry).sum(), lambda: 0.0)
        return carry, (rows[0, 0], grad[0, 0], branch)

    return x @ w, jax.lax.scan(body, w, None, length=2)[1]


def test_bf16_rounds_the_operands_of_every_product_of_a_network_pass_and_float32_keeps_them():
    top, (rows, grad, branch) = jax.jit(precision.apply(precision.network(nested), "bf16"))(W, X)
    np.testing.assert_array_equal(top, np.full((4, 3), 8.0))
    np.testing.assert_array_equal(rows, [8.0, 8.0])
    np.testing.assert_array_equal(grad, [4.0, 4.0])  # d/dw of sum(x @ w): 4 rows of x[:, 0] = 1 + 2**-10 -> 1
    np.testing.assert_array_equal(branch, [96.0, 96.0])
    assert top.dtype == jnp.float32  # float32 results: only the operands are rounded
    for name in ("default", "tf32", "highest"):  # the CPU computes each in float32
        top, (rows, grad, branch) = jax.jit(precision.apply(nested, name))(W, X)
        np.testing.assert_allclose(top, np.full((4, 3), 8 + 8 * 2**-10), rtol=0, atol=1e-6)
        np.testing.assert_allclose(grad, [4 + 4 * 2**-10] * 2, rtol=0, atol=1e-6)


def test_tf32_and_highest_reach_jax_as_its_precision_option():
    lowered = {name: jax.jit(precision.apply(precision.network(nested), name)).lower(W, X).as_text()
               for name in precision.MATMUL_PRECISIONS}
    assert "precision = [HIGH, HIGH]" in lowered["tf32"] and "HIGHEST" not in lowered["tf32"]
    assert "precision = [HIGHEST, HIGHEST]" in lowered["highest"]
    assert "HIGH" not in lowered["default"] and "bf16" not in lowered["default"]
    # every product of the bf16 network pass (5 in the forward pass and the scan body, 2 more for the gradient)
    # takes bfloat16 operands and gives float32
    assert lowered["bf16"].count("stablehlo.dot_general") == lowered["default"].count("stablehlo.dot_general")
    dots = [line for line in lowered["bf16"].splitlines() if "stablehlo.dot_general" in line]
    assert dots and all("xbf16>, tensor<" in line and "xf32>" in line.rsplit("->", 1)[1] for line in dots)


def test_arithmetic_names_what_each_device_computes_and_torch_settings_match_it():
    assert [precision.arithmetic(n, "cpu") for n in precision.MATMUL_PRECISIONS] == ["fp32", "fp32", "fp32", "bf16"]
    assert [precision.arithmetic(n, "gpu") for n in precision.MATMUL_PRECISIONS] == ["tf32", "tf32", "fp32", "bf16"]
    assert precision.arithmetic("default", "cuda") == "tf32"
    assert precision.torch_settings("tf32") == {"float32_matmul_precision": "high", "cudnn_allow_tf32": True,
                                                "autocast": None}
    assert precision.torch_settings("bf16")["autocast"] == "bfloat16"
    assert precision.torch_settings("fp32")["float32_matmul_precision"] == "highest"
    with pytest.raises(ValueError, match=r"matmul_precision: unknown precision 'fp8' \(allowed: default, tf32, "):
        precision.apply(nested, "fp8")


def _params(run):
    """Every float of the final state (parameters, optimizer moments, replay)."""
    leaves = [np.ravel(leaf) for leaf in jax.tree.leaves(run.state) if jnp.issubdtype(leaf.dtype, jnp.floating)]
    return np.concatenate(leaves)


@pytest.mark.long
def test_a_run_records_and_applies_its_precision(tmp_path):
    runs = {name: popjax.train(out_dir=tmp_path / name, **{**TINY, "matmul_precision": name})
            for name in ("default", "highest", "bf16")}
    for name, run in runs.items():
        summary = json.loads((run.out_dir / "summary.json").read_text())
        assert summary["matmul_precision"] == name
        assert summary["matmul_arithmetic"] == ("bf16" if name == "bf16" else "fp32")
        assert yaml.safe_load((run.out_dir / "config.yaml").read_text())["matmul_precision"] == name
    # the CPU's float32 products: default and highest are the same program arithmetic, bit for bit
    np.testing.assert_array_equal(_params(runs["default"]), _params(runs["highest"]))
    assert not np.array_equal(_params(runs["default"]), _params(runs["bf16"]))
    assert np.isfinite(_params(runs["bf16"])).all()


def test_a_bad_precision_is_one_line_and_writes_nothing(tmp_path, capsys):
    out = tmp_path / "run"
    code = main(["train", "--env", "probe:pendulum", "--matmul-precision", "fp16", "--out", str(out)])
    err = capsys.readouterr().err.strip()
    assert code == 2 and not out.exists()
    assert err.count("\n") == 0 and "matmul_precision" in err and "default, tf32, highest, bf16" in err


@pytest.mark.slow
def test_td3_still_solves_probe_pendulum_with_bf16_products(tmp_path):
    # The same run as float32 but every product from bfloat16 operands: it must still swing the pendulum up.
    run = popjax.train(learner="td3", env="probe:pendulum", pop_size=4, total_env_steps=20_000, warmup_steps=1_000,
                       eval_interval=2_000, eval_episodes=5, batch_size=256, buffer_size=20_000,
                       learner_config={"hidden": [64, 64]}, progress=False, preset="none", matmul_precision="bf16",
                       out_dir=tmp_path)
    print("bf16", run.summary["best_return"], run.summary["final_returns"], run.summary["wall_s"])
    assert run.summary["matmul_arithmetic"] == "bf16"
    assert run.summary["best_return"] >= -200
