"""The data flow's process does not import torch: 218 MB and 1.3 CPU-s it never uses."""
from __future__ import annotations

import subprocess
import sys

from tests.conftest import ROOT


def test_data_flow_and_pipeline_config_import_without_torch():
    code = "import sys, flows.cli, flows.config, flows.data_flow; print(sorted(m for m in ('torch', 'deepspeed') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "[]", f"imported by the data flow: {out.stdout.strip()}"
