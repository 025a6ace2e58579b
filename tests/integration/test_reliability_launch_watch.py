"""A launch never waits forever: a silent rank ends it named, a stale build lock is cleared (issue 26, item 5)."""
from __future__ import annotations

import os
import shutil
import time

import pytest

from infra.build_lock import extensions_root
from infra.deepspeed_launch import launch

OP = "deepspeed_shm_comm"


@pytest.mark.slow
def test_a_stopped_rank_ends_the_launch_naming_it():
    seen: dict[str, float] = {}

    def log(line: str) -> None:
        if "rank 1 started" in line:
            seen["stopped"] = time.monotonic()

    with pytest.raises(RuntimeError, match=r"rank 1 \(pid \d+\) was silent for 4 s \(stopped: SIGSTOP") as info:
        launch("tests.integration.silent_rank", ["1", "120"], num_procs=2, log=log, timeout_s=4.0)
    took = time.monotonic() - seen["stopped"]
    assert "timeout_s" in str(info.value)
    # the timeout + a poll + the launcher's stop (the other rank would have worked 120 s); was: forever
    assert took < 4.0 + 10, took


@pytest.mark.slow
@pytest.mark.skipif(not (extensions_root({}) / OP / f"{OP}.so").is_file(),
                    reason="DeepSpeed's CPU op is not built here; the test copies it rather than build it (minutes)")
def test_a_launch_after_a_stale_build_lock_clears_it_and_joins(tmp_path):
    # A copy of the built op (mtimes kept, so ninja finds nothing to do), with the lock a killed build leaves.
    root = tmp_path / "torch_extensions"
    shutil.copytree(extensions_root({}) / OP, root / OP, symlinks=True)
    lock = root / OP / "lock"
    lock.touch()
    old = time.time() - 600
    os.utime(lock, (old, old))
    lines: list[str] = []
    launch("tests.integration.op_loading_rank", [], num_procs=1, log=lines.append,
           env={"TORCH_EXTENSIONS_DIR": str(root)}, timeout_s=120)
    assert any(f"removed a stale build lock {lock}" in line for line in lines), lines
    assert any("rank 0/1 joined" in line for line in lines), lines[-20:]
    assert not lock.exists()
