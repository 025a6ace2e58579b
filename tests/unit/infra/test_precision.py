"""precision: auto decides by a measurement kept per machine, and says why."""
from __future__ import annotations

import json

import pytest

from infra.launch import precision


@pytest.fixture
def cache_home(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setenv("DS_ACCELERATOR", "cpu")
    precision.cpu_bf16_speedup.cache_clear()
    yield tmp_path
    precision.cpu_bf16_speedup.cache_clear()


def test_explicit_precision_is_kept():
    assert precision.choose_precision("fp32") == precision.PrecisionChoice("fp32", "set in the config")
    assert precision.choose_precision("bf16").precision == "bf16"
    with pytest.raises(ValueError, match="fp8"):
        precision.choose_precision("fp8")


@pytest.mark.parametrize(("speedup", "expected", "shown"), [
    (4.1, "bf16", "4.1x"), (2.0, "bf16", "2x"), (1.9, "fp32", "1.9x"), (0.3, "fp32", "0.3x"),
    (0.025, "fp32", "0.025x"),  # emulated bf16 (an AVX2 CPU): printed as 0.0x before
])
def test_auto_on_the_cpu_follows_the_measured_speedup(cache_home, monkeypatch, speedup, expected, shown):
    monkeypatch.setattr(precision, "measure_bf16_speedup", lambda: speedup)
    choice = precision.choose_precision("auto")
    assert choice.precision == expected
    assert f" {shown} an fp32 one" in choice.reason and "auto" in choice.reason


def test_ratios_print_two_significant_digits():
    assert [precision.ratio_text(r) for r in (0.0254, 0.5, 1.74, 7.3, 12.4)] == ["0.025x", "0.5x", "1.7x", "7.3x", "12x"]


def test_measurement_is_kept_per_machine(cache_home, monkeypatch):
    calls = []
    monkeypatch.setattr(precision, "measure_bf16_speedup", lambda: calls.append(1) or 3.0)
    assert precision.cpu_bf16_speedup() == 3.0
    precision.cpu_bf16_speedup.cache_clear()  # a new process reads the file instead of measuring
    assert precision.cpu_bf16_speedup() == 3.0
    assert len(calls) == 1
    saved = json.loads((cache_home / "llmforge" / "precision.json").read_text())
    assert list(saved.values()) == [3.0] and "torch" in next(iter(saved))


def test_measurement_is_a_real_ratio(monkeypatch):
    # One size: bf16 is emulated on many CPUs, and the 1024^3 matmuls alone took ~20 s here. The function reads
    # _SIZES at call time, so this is still a real fp32/bf16 measurement, only of fewer matmuls.
    monkeypatch.setattr(precision, "_SIZES", (256,))
    speedup = precision.measure_bf16_speedup()
    # Wide on purpose: emulated bf16 ran at 0.025x here (AVX2 EPYC), and CI's CPU once timed 256^3 at 119.6x. The
    # bounds only catch a broken timer or a constant (0, inf, nan), not an unusual machine.
    assert 1e-3 < speedup < 1e4


def test_cpu_peak_is_measured_once_per_machine_and_dtype(cache_home, monkeypatch):
    precision.cpu_peak_flops.cache_clear()
    calls = []
    monkeypatch.setattr(precision, "measure_cpu_peak_flops", lambda name: calls.append(name) or 5e10)
    assert precision.cpu_peak_flops("float32") == 5e10
    precision.cpu_peak_flops.cache_clear()  # a new process reads the file instead of measuring
    assert precision.cpu_peak_flops("float32") == 5e10 and calls == ["float32"]
    kept = json.loads((cache_home / "llmforge" / "peak_flops.json").read_text())
    assert list(kept.values()) == [5e10] and next(iter(kept)).endswith("| float32")
    precision.cpu_peak_flops.cache_clear()


def test_cpu_peak_measurement_is_a_real_rate():
    flops = precision.measure_cpu_peak_flops("float32", n=256, repeats=3)
    assert 1e8 < flops < 1e13  # between a slow emulator and a many-core server


def test_a_peak_kept_from_a_busy_moment_is_replaced_when_training_beats_it(cache_home, monkeypatch):
    from tasks.training.metrics import Throughput

    precision.cpu_peak_flops.cache_clear()
    measured = iter([6e9, 4e10])  # kept while the CPU was shared, then measured again on a quiet one
    monkeypatch.setattr(precision, "measure_cpu_peak_flops", lambda name: next(measured))
    peak = precision.cpu_peak_flops("float32")
    tp = Throughput(flops_per_token=1e7, peak_flops=peak, cpu_peak_dtype="float32")
    tp.add(1.0, 2_000, 3.0)  # 2e10 FLOP/s: more than the kept 6e9 could allow
    assert tp.window_metrics(world=1)["mfu"] == pytest.approx(0.5)
    precision.cpu_peak_flops.cache_clear()
    assert precision.cpu_peak_flops("float32") == 4e10  # kept for the next launch
    # A measurement that is still below what training reached keeps the training's rate instead.
    monkeypatch.setattr(precision, "measure_cpu_peak_flops", lambda name: 1e9)
    assert precision.remeasure_cpu_peak("float32", at_least=3e10) == 3e10
    precision.cpu_peak_flops.cache_clear()
