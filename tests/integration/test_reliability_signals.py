"""A run stops when told and leaks nothing: Ctrl-C, SIGTERM and SIGKILL against real DeepSpeed launches.

Each test starts a driver process (the CLI's signal handlers around `infra.launch.launcher.launch`
of two idle ranks, tests/helpers/idle_rank.py) in a session of its own, as a terminal would
start a command, signals it, and then counts what is left: processes of the tree and
/dev/shm files. The clean launch is the shared 2-rank ZeRO-2 pretraining of
tests/helpers/references.py, counted the same way.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from infra.launch.launcher import SHM_DIR, free_port, shm_buffers
from tests.helpers.processes import alive, new_shm_files, process_tree, shm_files, wait_gone
from tests.helpers.references import leak_checks, zero2_two_rank  # noqa: F401 - the clean 2-rank launch

REPO = Path(__file__).resolve().parents[2]
STOP_WITHIN_S = 30.0  # the bound for a stop
DRIVER = textwrap.dedent("""
    import json, sys
    from pathlib import Path
    from infra.launch.launcher import launch
    from infra.lifecycle.signals import RunStopped, install_stop_handlers

    out, ranks, wait_s, port = Path(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4])
    job = out / "job.json"
    job.write_text(json.dumps({"stage": "tests.helpers.idle_rank:Idle", "config": {"wait_s": wait_s},
                               "inputs": {}, "out_dir": str(out), "ws_root": str(out), "mlflow_run_id": None,
                               "precision": "fp32", "precision_reason": "test"}))
    install_stop_handlers()
    try:
        launch("tasks.training.rank", ["--job", str(job)], num_procs=ranks, master_port=port, cwd=Path.cwd())
    except RunStopped as exc:
        print("driver:", exc, flush=True)
        sys.exit(exc.exit_code)
    print("driver: done", flush=True)
""")


def _start_driver(tmp_path: Path, ranks: int, wait_s: float) -> tuple[subprocess.Popen, int, list[str]]:
    """The driver running `ranks` idle ranks; returns once every rank said it is ready (its output so far)."""
    script = tmp_path / "driver.py"
    script.write_text(DRIVER, encoding="utf-8")
    port = free_port()
    # A private temp folder: whatever the launch leaves in it outlived the launch.
    (tmp_path / "tmp").mkdir()
    env = {**os.environ, "DS_ACCELERATOR": "cpu", "PYTHONUNBUFFERED": "1", "TMPDIR": str(tmp_path / "tmp")}
    proc = subprocess.Popen(
        [sys.executable, str(script), str(tmp_path), str(ranks), str(wait_s), str(port)],
        cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
    )
    lines: list[str] = []
    assert proc.stdout is not None
    for line in proc.stdout:
        lines.append(line)
        if sum(chunk.count(" ready") for chunk in lines) >= ranks or "driver: done" in line:
            break
    return proc, port, lines


def _no_temp_left(tmp_path: Path) -> list[str]:
    return sorted(os.listdir(tmp_path / "tmp"))


@pytest.fixture
def no_new_shm():
    """Fails the test when it leaves a /dev/shm file behind."""
    before = shm_files()
    yield
    new = new_shm_files(before)
    assert not new, f"left in {SHM_DIR}: {sorted(new)}"


@pytest.mark.slow
def test_clean_launch_leaves_no_shm_buffer(zero2_two_rank):  # noqa: F811
    """The shared 2-rank ZeRO-2 pretraining (tests/helpers/references.py) ran with a private TMPDIR and
    /dev/shm counted before and after: nothing of it stayed."""
    checks = leak_checks(zero2_two_rank)
    assert zero2_two_rank.result.world_size == 2  # both ranks mapped their all-reduce buffer
    assert checks["new_shm_files"] == [], f"left in {SHM_DIR}: {checks['new_shm_files']}"
    assert checks["shm_buffers_of_the_port"] == []
    assert checks["left_in_tmpdir"] == []


# SIGTERM to the driver, the case that was here too: test_reliability_stop_saves[sigterm] (2 ranks, the same
# checks of the tree, /dev/shm and TMPDIR, around a real pretraining that saves on the stop).
@pytest.mark.slow
@pytest.mark.parametrize("how", [
    "ctrl-c to the process group",
    "SIGKILL to the driver",  # no handler runs: the ranks' supervisor watch and the launcher's parent-death signal
])
def test_signal_stops_launcher_and_every_rank(tmp_path, no_new_shm, how):
    proc, port, lines = _start_driver(tmp_path, ranks=2, wait_s=600.0)
    tree = process_tree(proc)
    assert len(tree) >= 5, f"driver, wrapper/launcher, launch.py and 2 ranks expected: {tree}"
    if how == "SIGKILL to the driver":
        proc.kill()
        proc.wait()
        assert wait_gone(tree, 10.0) == []  # all gone 10 s later
    else:
        os.killpg(proc.pid, signal.SIGINT)  # what a terminal does on Ctrl-C
        t0 = time.monotonic()
        out = proc.communicate(timeout=STOP_WITHIN_S)[0]
        assert proc.returncode == 130, out
        assert "stopping the run" in out and "driver: stopped by SIGINT" in out
        assert wait_gone(tree, STOP_WITHIN_S - (time.monotonic() - t0)) == []
    assert shm_buffers(port) == []
    assert _no_temp_left(tmp_path) == []


def test_second_signal_forces_a_stop(tmp_path):
    """A child that ignores SIGTERM would hold the first stop for its grace period; a second Ctrl-C ends it now."""
    script = tmp_path / "stubborn.py"
    script.write_text(textwrap.dedent("""
        import subprocess, sys, time
        from infra.lifecycle.signals import install_stop_handlers
        child = subprocess.Popen([sys.executable, "-c",
            "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
            "signal.signal(signal.SIGINT, signal.SIG_IGN); print('child ready', flush=True); time.sleep(600)"])
        install_stop_handlers()
        print(f"child {child.pid}", flush=True)
        try:
            while True:
                time.sleep(0.1)
        except KeyboardInterrupt:
            time.sleep(600)  # a cleanup that would take too long
    """), encoding="utf-8")
    proc = subprocess.Popen([sys.executable, str(script)], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)
    assert proc.stdout is not None
    child_pid = None
    for line in proc.stdout:
        if line.startswith("child ") and line.split()[1].isdigit():
            child_pid = int(line.split()[1])
        if "child ready" in line:
            break
    assert child_pid is not None
    proc.send_signal(signal.SIGINT)
    time.sleep(1.0)
    assert alive([child_pid]), "the child ignores SIGTERM, so the first stop is still waiting"
    proc.send_signal(signal.SIGINT)
    out = proc.communicate(timeout=5)[0]
    assert proc.returncode == 128 + signal.SIGINT, out
    assert "killing every process of the run now" in out
    assert wait_gone([child_pid], 5.0) == []


POOL_DRIVER = textwrap.dedent("""
    import sys, time
    from infra.lifecycle.signals import RunStopped, install_stop_handlers
    from tasks.data.parallel import ordered_map

    if __name__ == "__main__":
        install_stop_handlers()
        try:
            for _ in ordered_map(time.sleep, [(i, (600,)) for i in range(4)], workers=2):
                pass
        except RunStopped as exc:
            sys.exit(exc.exit_code)
""")


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGKILL])
def test_data_workers_end_with_the_stage(tmp_path, sig):
    """A data stage's process pool: Ctrl-C stops it at once (not after the batches in flight); SIGKILL takes it too."""
    script = tmp_path / "pool.py"
    script.write_text(POOL_DRIVER, encoding="utf-8")
    proc = subprocess.Popen([sys.executable, str(script)], cwd=REPO, start_new_session=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        workers = [c for c in psutil.Process(proc.pid).children(recursive=True) if "spawn_main" in " ".join(c.cmdline())]
        if len(workers) >= 2:
            break
        time.sleep(0.2)
    tree = process_tree(proc)
    assert len(tree) >= 3, tree
    time.sleep(2.0)  # the workers are inside their first batch
    if sig == signal.SIGINT:
        os.killpg(proc.pid, sig)
    else:
        proc.kill()
    out = proc.communicate(timeout=STOP_WITHIN_S)[0]
    assert proc.returncode == (130 if sig == signal.SIGINT else -9), out
    assert "KeyboardInterrupt" not in out  # workers leave Ctrl-C to the stage: no traceback per worker
    assert wait_gone(tree, 10.0) == []
