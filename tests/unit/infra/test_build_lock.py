"""A stale lock in torch's extension folder is found and cleared; a live build's is left (issue 26, item 5)."""
from __future__ import annotations

import os
import subprocess
import sys
import time

from infra.launch.build_lock import clear_lock_of_stopped_build, clear_stale_build_locks, extensions_root, stale_locks


def _lock(root, op="deepspeed_shm_comm", age_s=600.0):
    folder = root / op
    folder.mkdir(parents=True, exist_ok=True)
    lock = folder / "lock"
    lock.touch()
    then = time.time() - age_s
    os.utime(lock, (then, then))
    return lock


def test_a_lock_with_no_build_running_is_cleared_with_a_line(tmp_path):
    lock = _lock(tmp_path)
    lines: list[str] = []
    removed = clear_stale_build_locks({"TORCH_EXTENSIONS_DIR": str(tmp_path)}, lines.append)
    assert removed == [lock] and not lock.exists()
    assert len(lines) == 1 and f"removed a stale build lock {lock}" in lines[0] and "deepspeed_shm_comm" in lines[0]
    assert clear_stale_build_locks({"TORCH_EXTENSIONS_DIR": str(tmp_path)}, lines.append) == []  # nothing left


def test_a_young_lock_is_left_to_its_build(tmp_path):
    lock = _lock(tmp_path, age_s=5)
    assert stale_locks(tmp_path) == [] and lock.exists()


def test_a_lock_with_a_process_working_in_the_folder_is_left(tmp_path):
    # A build runs ninja and the compiler in the op's folder: any process there holds the lock.
    lock = _lock(tmp_path)
    builder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], cwd=lock.parent)
    try:
        time.sleep(0.2)
        assert stale_locks(tmp_path) == []
    finally:
        builder.kill()
        builder.wait()
    assert stale_locks(tmp_path) == [lock]


def test_a_stopped_builds_lock_waits_for_its_dying_compiler_and_a_live_build_keeps_it(tmp_path):
    # Ctrl-C reaches the compiler with the launch; it may still be exiting when the launch clears the lock (seen
    # in CI: the lock stayed). The launch waits for it; a build that outlives the wait is another launch's.
    env = {"TORCH_EXTENSIONS_DIR": str(tmp_path)}
    lock = _lock(tmp_path, age_s=0)
    dying = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(1.0)"], cwd=lock.parent)
    lines: list[str] = []
    try:
        time.sleep(0.2)
        assert clear_lock_of_stopped_build(env, lines.append, wait_s=10) == [lock] and not lock.exists()
        assert dying.poll() is not None and "removed the build lock" in lines[0]
    finally:
        dying.kill()
        dying.wait()
    lock = _lock(tmp_path, age_s=0)
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], cwd=lock.parent)
    try:
        time.sleep(0.2)
        assert clear_lock_of_stopped_build(env, lines.append, wait_s=0.5) == [] and lock.exists()
    finally:
        live.kill()
        live.wait()


def test_a_stopped_builds_own_late_compiler_is_stopped_and_its_lock_removed(tmp_path):
    # Ctrl-C as ninja starts a compiler: the new one missed the signal and the launch's last look at its processes,
    # and would have outlived the wait (seen in a loaded make test: the lock stayed, cc1plus still running 15 s on).
    # It carries the launch's supervisor token, which another launch's compiler does not.
    from infra.lifecycle.process_tree import SUPERVISOR_ENV

    env = {"TORCH_EXTENSIONS_DIR": str(tmp_path), SUPERVISOR_ENV: "ours"}
    lock = _lock(tmp_path, age_s=0)
    sleeper = [sys.executable, "-c", "import time; time.sleep(60)"]
    ours = subprocess.Popen(sleeper, cwd=lock.parent, env={**os.environ, SUPERVISOR_ENV: "ours"})
    theirs = subprocess.Popen(sleeper, cwd=lock.parent, env={**os.environ, SUPERVISOR_ENV: "theirs"})
    lines: list[str] = []
    try:
        time.sleep(0.3)
        assert clear_lock_of_stopped_build(env, lines.append, wait_s=0.5) == [] and lock.exists()  # theirs builds
        assert ours.wait(timeout=10) is not None and theirs.poll() is None
        theirs.kill()
        theirs.wait()
        assert clear_lock_of_stopped_build(env, lines.append, wait_s=0.5) == [lock] and not lock.exists()
    finally:
        for proc in (ours, theirs):
            proc.kill()
            proc.wait()


def test_the_root_is_torch_extensions_dir_else_torchs_cache_folder(tmp_path):
    assert extensions_root({"TORCH_EXTENSIONS_DIR": str(tmp_path)}) == tmp_path
    default = extensions_root({})
    assert default.parent.name == "torch_extensions" and default.name.startswith(f"py{sys.version_info.major}")
    assert stale_locks(tmp_path / "missing") == []
