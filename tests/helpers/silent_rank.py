"""A rank that goes silent: what the launch's rank watch must find and name.

    deepspeed --module tests.helpers.silent_rank <silent rank> <seconds the others work>

The silent rank prints, then stops itself with SIGSTOP; the others keep a core busy (a rank
computing), so only the stopped one is silent. No torch: the launch starts in seconds.
"""
from __future__ import annotations

import os
import signal
import sys
import time

if __name__ == "__main__":
    rank, silent, work_s = int(os.environ["RANK"]), int(sys.argv[1]), float(sys.argv[2])
    print(f"rank {rank} started", flush=True)
    if rank == silent:
        os.kill(os.getpid(), signal.SIGSTOP)
    deadline = time.monotonic() + work_s
    while time.monotonic() < deadline:
        pass
