"""The GPU section of ``popjax bench report`` (``popjax_bench.report_gpu``): its figures come from the JSON files.

The committed H200 files (the first GPU run, one NVIDIA H200, 2026-11-26) render with ratios checked by hand;
an edited copy renders the edited time and the ratio computed from it; a run whose sides ran different
arithmetic, or whose precision is not described, gets no ratio.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

pytest.importorskip("popjax_bench")
from popjax_bench import report, report_gpu  # noqa: E402

RESULTS = Path(__file__).resolve().parents[1] / "benchmarks" / "results"
FP32 = "update_gpu_nvidia-h200_fp32"
TF32 = "update_gpu_nvidia-h200_tf32_compiled"


def _render(results_dir: Path, tmp_path: Path) -> str:
    return report.write_report(results_dir, tmp_path / "RESULTS.md", targets_path=tmp_path / "none.yaml").read_text()


def _gpu_section(text: str) -> str:
    start = text.index("## GPU")
    end = text.find("\n## ", start + 1)
    return text[start:end if end > 0 else None]


def test_the_committed_h200_runs_render_with_hand_checked_ratios(tmp_path):
    section = _gpu_section(_render(RESULTS, tmp_path))
    assert section.startswith("## GPU — the first GPU run, one NVIDIA H200, 2026-11-26")
    assert "driver 580.159.04" in section and "Python 3.12.3, JAX 0.11.2 (jaxlib 0.11.2)" in section
    # TD3 N = 16, fp32: torch_seq 96.825 ms, torch_vmap 18.048 ms, popjax K = 50 0.46315 ms
    assert ("| TD3 | 16 | 0.463 | 1.36 | 35.9 | 96.8 | 18.0 | torch_vmap | 39.0× (18.0 ÷ 0.463) | 209× (96.8 ÷ 0.463) "
            in section)
    # TD3 N = 64, TF32: torch_vmap_compile 1.668 ms, popjax 0.598 ms: 2.79×
    assert "| TD3 | 64 | 0.598 | 322 | 139 | 1.67 | torch_vmap_compile | 2.79× (1.67 ÷ 0.598) |" in section
    assert "tf32 both sides" in section and "fp32 both sides" in section
    # what was not timed: the partial fp32 run's SAC, the budget's torch_seq at N = 256
    assert "**partial**: the run was stopped before its end; SAC not timed." in section
    assert "TD3 torch_seq N=256 skipped (estimated 32s" in section
    # end to end: 256 members × 10,000 steps ÷ 19.425 s
    assert "| TD3 | probe:pendulum | 256 | 10,000 | 9,000 | 16.4 | 19.4 | 131,789 (256 × 10,000 ÷ 19.4) |" in section
    assert "Not measured in this run: the CUDA-graph PyTorch baseline" in section


def test_the_gpu_section_reads_its_numbers_from_the_json(tmp_path):
    """Change a time in a copy of the H200 JSON: the table and the ratio follow; the CPU sections never show the
    GPU runs."""
    results = tmp_path / "results"
    results.mkdir()
    for path in RESULTS.glob("*gpu*"):
        shutil.copy(path, results / path.name)
    payload = json.loads((results / f"{FP32}.json").read_text())
    (row,) = [r for r in payload["results"] if r["impl"] == "vmap_scan" and r["pop"] == 16]
    row["ms_per_pop_step"] = 0.5  # 96.825 ÷ 0.5 = 193.65; 18.048 ÷ 0.5 = 36.1
    (results / f"{FP32}.json").write_text(json.dumps(payload))
    text = _render(results, tmp_path)
    section = _gpu_section(text)
    assert "| TD3 | 16 | 0.500 | 1.36 | 35.9 | 96.8 | 18.0 | torch_vmap | 36.1× (18.0 ÷ 0.500) | 194× (96.8 ÷ 0.500) " \
        in section
    assert "0.463" not in section.split(f"`{TF32}.json`")[0].split(f"`{FP32}.json`")[1]
    assert "## update —" not in text and "update_gpu" not in text.replace(section, "")


def test_unequal_or_unknown_arithmetic_gets_no_ratio(tmp_path):
    results = tmp_path / "results"
    results.mkdir()
    shutil.copy(RESULTS / f"{TF32}.json", results / f"{TF32}.json")
    section = _gpu_section(_render(results, tmp_path))  # no gpu_provenance.yaml: precision not described
    assert section.startswith("## GPU — runs not described in gpu_provenance.yaml")
    assert "precision not recorded" in section and "driver not recorded" in section
    assert section.count("not compared (unequal arithmetic)") == 4  # 2 N × (fastest, torch_seq)
    (results / report_gpu.PROVENANCE).write_text(
        "runs:\n  - name: a test run\n    files:\n"
        f"      {TF32}:\n        arithmetic: {{jax: tf32, torch: fp32}}\n        precision: JAX TF32; PyTorch fp32\n")
    section = _gpu_section(_render(results, tmp_path))
    assert section.startswith("## GPU — a test run") and "JAX tf32, PyTorch fp32" in section
    assert section.count("not compared (unequal arithmetic)") == 4 and "2.79×" not in section
    (results / report_gpu.PROVENANCE).write_text("runs: 3\n")
    with pytest.raises(ValueError, match="gpu_provenance.yaml must hold `runs:`"):
        _render(results, tmp_path)


def test_the_h200_files_are_the_runs_own():
    """The committed files are the run's JSON as written (device and precision in their names)."""
    payload = json.loads((RESULTS / f"{FP32}.json").read_text())
    assert payload["machine"]["devices"][0]["kind"] == "NVIDIA H200" and payload["partial"] is True
    assert report_gpu.on_accelerator(payload)
    summaries = sorted(p.name for p in RESULTS.glob(report_gpu.ENDTOEND))
    assert summaries == ["endtoend_gpu_nvidia-h200_probe-pendulum_pop16.json",
                         "endtoend_gpu_nvidia-h200_probe-pendulum_pop256.json"]
