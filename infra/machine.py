"""What machine this is: its CPU model and cores, and the accelerator the training stages get."""
from __future__ import annotations

import os
import platform
from pathlib import Path

# torch is imported inside the functions that need it: the CLI and the data flow import this module and never
# load torch (tests/unit/flows/test_data_flow_imports.py).


def cpu_model() -> str:
    """The CPU's model name ("AMD EPYC 7B13"), from /proc/cpuinfo where there is one."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine() -> str:
    """The accelerator the training stages get: "NVIDIA H100 80GB HBM3 (x1), ..." or "AMD EPYC 7B13, 2 cores"."""
    cpu = f"{cpu_model()}, {os.cpu_count() or 1} cores"
    if os.environ.get("DS_ACCELERATOR") == "cpu":
        return cpu
    try:
        import torch

        if torch.cuda.is_available():
            return f"{torch.cuda.get_device_name(0)} (x{torch.cuda.device_count()}), {cpu}"
    except Exception:  # no working CUDA is a CPU machine, whatever the reason
        pass
    return cpu
