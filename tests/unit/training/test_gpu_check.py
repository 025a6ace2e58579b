"""bench/gpu_check.py --tiny: the GPU check's code path (the preset's loop, MFU, one GRPO step) on the CPU."""
from __future__ import annotations

import json

import pytest

from bench import gpu_check

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_tiny_check_runs_to_completion(tmp_path, capsys):
    out = tmp_path / "gpu.json"
    assert gpu_check.main(["--tiny", "--steps", "2", "--json", str(out)]) == 0
    figures = json.loads(out.read_text())
    assert figures["steps"] == 2 and figures["skipped_steps"] == 0 and figures["tokens_per_s"] > 0
    assert 0 < figures["mfu_measured_peak"] and figures["grpo"]["skipped_steps"] == 0
    assert figures["torch_compile"] is False and figures["precision"] == "fp32"  # the CPU's choices
    printed = capsys.readouterr().out
    assert "tokens/s" in printed and "MFU" in printed and "GRPO step" in printed


def test_the_full_check_uses_the_presets_settings():
    mcfg, tcfg = gpu_check.check_setup(gpu_check.parse_args(["--steps", "30"]), cuda=True)
    assert 123e6 < gpu_check.num_params(mcfg) < 125e6
    assert tcfg.batch.tokens_per_step(1) == 524_288 and tcfg.steps == 30
    assert (tcfg.launch.precision, tcfg.launch.torch_compile) == ("bf16", True)
    _, eager = gpu_check.check_setup(gpu_check.parse_args(["--no-compile"]), cuda=True)
    assert eager.launch.torch_compile is False


def test_nominal_peaks():
    assert gpu_check.nominal_peak("NVIDIA H100 80GB HBM3", None) == 989e12
    assert gpu_check.nominal_peak("NVIDIA H100 PCIe", None) == 756e12
    assert gpu_check.nominal_peak("NVIDIA L40S", None) == 362e12
    assert gpu_check.nominal_peak("NVIDIA L4", None) == 121e12
    assert gpu_check.nominal_peak("Some GPU", None) is None
    assert gpu_check.nominal_peak("Some GPU", 100.0) == 100e12
