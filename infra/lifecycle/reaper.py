"""`python -m infra.lifecycle.reaper OWNER TARGET`: end TARGET when OWNER is gone, however OWNER ended.

The CLI starts Prefect's temporary API server from a helper thread; the kernel's parent-death signal follows the
thread that forked, which ends at once, so it cannot be used, and a SIGKILLed CLI runs no atexit to stop the
server. This watcher, started beside the server, polls OWNER (pid and start time, so a recycled pid is not taken
for it) and, once OWNER is gone, sends TARGET SIGTERM, then SIGKILL after a grace. It ignores SIGINT (a terminal's
Ctrl-C reaches the whole process group: the CLI handles it, and the watcher must outlive it to finish the job) and
imports nothing but the standard library, so it starts in tens of milliseconds.
"""
from __future__ import annotations

import os
import signal
import sys
import time

POLL_S = 0.5
GRACE_S = 5.0


def _stat(pid: int) -> tuple[str, str] | None:
    """(state, start time in clock ticks since boot) from /proc/PID/stat (fields 3 and 22), None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return fields[0], fields[19]
    except (OSError, IndexError):
        return None


def start_time(pid: int) -> str | None:
    stat = _stat(pid)
    return stat[1] if stat else None


def alive(pid: int, started: str | None) -> bool:
    """The process that started at `started` is still running (not gone, recycled or a zombie)."""
    stat = _stat(pid)
    return stat is not None and stat[1] == started and stat[0] != "Z"


def main(owner: int, target: int) -> int:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    owner_started, target_started = start_time(owner), start_time(target)
    while alive(owner, owner_started):
        if not alive(target, target_started):
            return 0  # the server ended first (the CLI stopped it): nothing to do
        time.sleep(POLL_S)
    for sig, wait in ((signal.SIGTERM, GRACE_S), (signal.SIGKILL, 0.0)):
        if not alive(target, target_started):
            return 0
        try:
            os.kill(target, sig)
        except ProcessLookupError:
            return 0
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline and alive(target, target_started):
            time.sleep(0.1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(int(sys.argv[1]), int(sys.argv[2])))
