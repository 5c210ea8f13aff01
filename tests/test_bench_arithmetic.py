"""Equal arithmetic on both sides of a speed ratio (``popjax_bench.arithmetic``): the update study applies its
``--matmul-precision`` to the JAX programs and the matching settings to PyTorch, records both sides, and the report
prints them beside the ratios and withholds the ratios of unequal sides."""

from __future__ import annotations

import json

import pytest

from popjax_bench import arithmetic, report, update
from popjax_bench import torch_reference as tr

needs_torch = pytest.mark.skipif(not tr.available(), reason=tr.TORCH_ERROR or "")


@needs_torch
def test_torch_settings_compute_the_named_arithmetic_and_restore_the_flags():
    torch = tr.torch
    before = torch.get_float32_matmul_precision(), torch.backends.cudnn.allow_tf32
    a = torch.full((4, 8), 1 + 2**-10)  # bfloat16 rounds it to 1: products of 8 give 8.0 instead of 8.0078125
    b = torch.ones(8, 3)
    with arithmetic.torch_settings("bf16", "cpu") as settings:
        out = a @ b
        assert settings["autocast"] == "bfloat16" and out.dtype == torch.bfloat16 and float(out[0, 0]) == 8.0
    with arithmetic.torch_settings("tf32", "cpu"):
        assert torch.get_float32_matmul_precision() == "high" and torch.backends.cudnn.allow_tf32
    with arithmetic.torch_settings("fp32", "cpu"):
        assert torch.get_float32_matmul_precision() == "highest" and not torch.backends.cudnn.allow_tf32
        assert float((a @ b)[0, 0]) == 8.0078125
    assert (torch.get_float32_matmul_precision(), torch.backends.cudnn.allow_tf32) == before
    call = arithmetic.torch_call(lambda: a @ b, "bf16", "cpu")
    call.note = "kept"
    assert arithmetic.torch_call(call, "fp32", "cpu").note == "kept"  # attributes survive (update.cuda_graphs)
    assert call().dtype == torch.bfloat16 and (a @ b).dtype == torch.float32


def test_the_sides_of_a_cpu_study_and_of_an_old_payload():
    assert arithmetic.torch_arithmetic("default", "cpu") == "fp32"
    assert arithmetic.torch_arithmetic("default", "cuda:0") == "tf32"  # JAX's default on a GPU is TF32
    assert arithmetic.torch_arithmetic("bf16", "cpu") == "bf16"
    assert arithmetic.record("tf32", "cpu") == {"matmul_precision": "tf32", "jax": "fp32", "torch": "fp32",
                                                "torch_settings": {"float32_matmul_precision": "highest",
                                                                   "cudnn_allow_tf32": False, "autocast": None}}
    assert arithmetic.record("bf16")["torch"] is None  # no PyTorch side ran
    old_cpu = {"machine": {"backend": "cpu"}}
    assert arithmetic.paired(old_cpu) and "fp32 on both sides" in arithmetic.describe(old_cpu)
    old_gpu = {"machine": {"backend": "gpu"}}
    assert not arithmetic.paired(old_gpu) and "not recorded" in arithmetic.describe(old_gpu)
    mixed = {"arithmetic": {"matmul_precision": "default", "jax": "tf32", "torch": "fp32"}}
    assert not arithmetic.paired(mixed) and "JAX tf32, PyTorch fp32" in arithmetic.describe(mixed)


@needs_torch
def test_the_update_study_pairs_records_and_the_report_refuses_unequal_sides(tmp_path, monkeypatch):
    from popjax_bench import common

    monkeypatch.setattr(common, "load_average", lambda: [0.1, 0.1, 0.1])
    monkeypatch.setattr(common, "others_cpu_share", lambda since: 0.0)
    monkeypatch.setattr(common, "PEAK_N", 128)
    payload = update.run(learners=("td3",), pops=(2,), impls=("vmap", "torch_seq"), hidden=(8,), batch_size=4, k=2,
                         torch_threads=(1,), repeats=10, min_time=0.0, out_dir=tmp_path, plot=False,
                         matmul_precision="bf16")
    written = json.loads((tmp_path / "update.json").read_text())
    assert written["arithmetic"] == {"matmul_precision": "bf16", "jax": "bf16", "torch": "bf16",
                                     "torch_settings": {"float32_matmul_precision": "highest",
                                                        "cudnn_allow_tf32": False, "autocast": "bfloat16"}}
    compiled = next(c for key, (c, _) in update._VMAP_COMPILED.items() if key[-1] == "bf16" and key[1] == 2)
    assert "bf16" in compiled.as_text()  # the JAX program multiplies bfloat16 operands
    text = "\n".join(report.section_update(payload))
    assert "**arithmetic: bf16 on both sides (matmul_precision bf16)**" in text and "withheld" not in text
    unequal = payload | {"arithmetic": payload["arithmetic"] | {"torch": "fp32"}}
    text = "\n".join(report.section_update(unequal))
    assert "JAX bf16, PyTorch fp32" in text and "| withheld | withheld |" in text
    (row,) = [r for r in payload["results"] if r["impl"] == "vmap"]
    assert f"{row['speedup_vs_torch_seq']:.2f}×" not in text
