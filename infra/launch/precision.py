"""What `precision: auto` means on the machine at hand, decided by measuring it.

On CUDA, auto is bf16 where the GPU supports it. On the CPU it depends on the chip: a bf16
matmul runs several times as fast as an fp32 one with AMX or AVX512-BF16, and slower than
fp32 where bf16 is emulated. So auto times both once, on square matmuls of
the sizes a small model multiplies, and picks bf16 (weights and activations in bf16,
DeepSpeed keeping fp32 master weights) when bf16 is at least BF16_MIN_SPEEDUP times faster:
below that, the casts and the fp32 master copy eat the gain.

The measurement is kept per machine (CPU model, torch version, thread count) in
`$XDG_CACHE_HOME/llmforge/precision.json`, so every run and every rank on one machine
makes the same choice, and a resumed run does not flip precision halfway.

The CPU's practical peak FLOP/s, which MFU divides by, is kept the same way (`peak_flops.json`, per
machine key and dtype): measured once, the best of a few matmuls (noise only slows), instead of at
every launch, which would cost each launch a second or more and give a low figure (and MFU above
100%) whenever another process shared the CPU at that moment. A figure kept from a busy moment shows itself when
training runs faster than it: the rank then measures again and keeps the higher (`remeasure_cpu_peak`).
"""
from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Literal

from infra.machine import cpu_model
from infra.workspace.atomic import write_json_atomic

# torch is imported inside the functions that need it: the CLI and the data flow import this module and never
# load torch (tests/unit/flows/test_data_flow_imports.py).

BF16_MIN_SPEEDUP = 2.0
_SIZES = (256, 512, 1024)
_REPEATS = 3
_PEAK_N = 1024  # a fraction of a second per fp32 matmul on a small CPU; large enough to reach the BLAS peak
_PEAK_REPEATS = 5


@dataclass(frozen=True)
class PrecisionChoice:
    """The precision a run trains in, and why (logged with the run)."""

    precision: Literal["fp32", "bf16"]
    reason: str


def choose_precision(precision: str) -> PrecisionChoice:
    """`precision` as given ("fp32"/"bf16"), or what "auto" means here, with the reason."""
    if precision in ("fp32", "bf16"):
        return PrecisionChoice(precision, "set in the config")  # type: ignore[arg-type]
    if precision != "auto":
        raise ValueError(f"precision '{precision}' is not one of 'fp32', 'bf16', 'auto'")
    import torch

    if os.environ.get("DS_ACCELERATOR", "") != "cpu" and torch.cuda.is_available():
        if torch.cuda.is_bf16_supported():
            return PrecisionChoice("bf16", f"auto: {torch.cuda.get_device_name()} supports bf16")
        return PrecisionChoice("fp32", f"auto: {torch.cuda.get_device_name()} has no bf16")
    speedup = cpu_bf16_speedup()
    if speedup >= BF16_MIN_SPEEDUP:
        return PrecisionChoice("bf16", f"auto: a bf16 matmul ran {ratio_text(speedup)} an fp32 one on this CPU "
                                       f"(bf16 from {ratio_text(BF16_MIN_SPEEDUP)})")
    return PrecisionChoice("fp32", f"auto: a bf16 matmul ran only {ratio_text(speedup)} an fp32 one on this CPU "
                                   f"(bf16 from {ratio_text(BF16_MIN_SPEEDUP)})")


def ratio_text(ratio: float) -> str:
    """A speed ratio with two significant digits, however small: 0.025x, 0.5x, 1.7x, 7.3x, 12x."""
    return f"{ratio:.2g}x" if ratio < 10 else f"{ratio:.0f}x"


def _machine_key() -> str:
    import torch

    return f"{cpu_model()} | torch {torch.__version__} | {torch.get_num_threads()} threads"


def _cache_file(name: str = "precision.json") -> Path:
    root = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return root / "llmforge" / name


def _read_cache(path: Path) -> dict:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}


def _keep(name: str, key: str, value: float) -> None:
    """Keep `value` under `key` in the cache file `name`, beside what the file holds."""
    path = _cache_file(name)
    try:
        write_json_atomic(path, {**_read_cache(path), key: float(f"{value:.4g}")})
    except OSError:
        pass  # a read-only home only costs the measurement again next time


def _cached(name: str, key: str, measure) -> float:
    """The number kept under `key` in the cache file `name`, measured (and kept) when missing."""
    kept = _read_cache(_cache_file(name)).get(key)
    if isinstance(kept, (int, float)):
        return float(kept)
    value = measure()
    _keep(name, key, value)
    return value


@lru_cache(maxsize=1)
def cpu_bf16_speedup() -> float:
    """fp32 time / bf16 time of the same matmuls on this CPU (measured once per machine, ~0.5 s)."""
    return _cached("precision.json", _machine_key(), lambda: round(measure_bf16_speedup(), 3))


@lru_cache(maxsize=2)
def cpu_peak_flops(dtype_name: str = "float32") -> float:
    """Practical peak FLOP/s of this CPU at its thread count in `dtype_name` ("float32" or "bfloat16"):
    the fastest of _PEAK_REPEATS square matmuls of _PEAK_N, measured once per machine and kept."""
    return _cached("peak_flops.json", _peak_key(dtype_name), lambda: measure_cpu_peak_flops(dtype_name))


def _peak_key(dtype_name: str) -> str:
    return f"{_machine_key()} | {dtype_name}"


def remeasure_cpu_peak(dtype_name: str, at_least: float) -> float:
    """The kept peak replaced after training ran faster than it (`at_least` FLOP/s per rank), which shows it was
    measured while something else used the CPU: measured again now, and never below what training reached."""
    value = max(measure_cpu_peak_flops(dtype_name), at_least)
    _keep("peak_flops.json", _peak_key(dtype_name), value)
    cpu_peak_flops.cache_clear()
    return value


def measure_cpu_peak_flops(dtype_name: str = "float32", n: int | None = None, repeats: int | None = None) -> float:
    """2 n^3 / the fastest of `repeats` n x n matmuls in `dtype_name` (the first, warm-up, not counted)."""
    import torch

    n, repeats = n or _PEAK_N, repeats or _PEAK_REPEATS
    dtype = getattr(torch, dtype_name)
    a, b = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
    a @ b
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - t0)
    return 2.0 * n**3 / best


def measure_bf16_speedup() -> float:
    """fp32 time / bf16 time of square matmuls of _SIZES, best of _REPEATS each (noise only slows).

    The two dtypes take turns, so a clock still ramping up or a neighbour's burst slows both, not whichever ran first.
    """
    import torch

    fp32 = bf16 = 0.0
    for n in _SIZES:
        dtypes = (torch.float32, torch.bfloat16)
        pairs = [(torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)) for dtype in dtypes]
        for a, b in pairs:
            a @ b  # first call: kernel selection, page faults
        best = [float("inf"), float("inf")]
        for _ in range(_REPEATS):
            for i, (a, b) in enumerate(pairs):
                t0 = time.perf_counter()
                a @ b
                best[i] = min(best[i], time.perf_counter() - t0)
        fp32, bf16 = fp32 + best[0], bf16 + best[1]
    return fp32 / bf16
