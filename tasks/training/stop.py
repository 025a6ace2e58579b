"""A stop keeps the work: a signal on a training rank ends the loop after the current step, checkpointed.

SIGINT or SIGTERM ends the loop after the current step, with a checkpoint of that step, so the rerun
continues from it instead of from the last scheduled checkpoint.

How the signal gets here: Ctrl-C reaches every process of the terminal's group (the CLI, DeepSpeed's
launcher, the ranks); `kill <pid>` and a Prefect cancel reach the CLI, whose stop handler SIGTERMs its
descendants (infra/lifecycle/signals.py); DeepSpeed's launcher SIGTERMs its ranks on either signal. So one stop
is several signals on a rank within milliseconds: the first asks for the stop, the rest change nothing.
A rank that does not stop in time is SIGKILLed by whoever sent the first signal (infra/lifecycle/process_tree.py
STOP_GRACE_S, DeepSpeed's launcher after 30 s); a second Ctrl-C at the CLI does it at once.

    with StopRequest.installed() as stop:       # inside fit, around the steps
        ...step...
        if stop.agreed(world): save a checkpoint, raise TrainingStopped
"""
from __future__ import annotations

import contextlib
import signal
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

SIGNALS = (signal.SIGINT, signal.SIGTERM)


class TrainingStopped(KeyboardInterrupt):
    """The loop stopped on a signal after step `step`, its state saved in `checkpoint` (None: nothing to save)."""

    def __init__(self, signum: int, step: int, checkpoint: Path | None) -> None:
        self.signum, self.step, self.checkpoint = signum, step, checkpoint
        where = f"checkpoint {checkpoint}; the rerun continues from step {step}" if checkpoint else "no checkpoint folder"
        super().__init__(f"stopped by {signal.Signals(signum).name} after step {step} ({where})")


class StopRequest:
    """The first SIGINT/SIGTERM while the loop runs: remembered, for the loop to act on after the step."""

    def __init__(self) -> None:
        self.signum: int | None = None

    def __call__(self, signum: int, frame: Any) -> None:
        if self.signum is None:
            self.signum = signum
            print(f"{signal.Signals(signum).name}: finishing this step, saving a checkpoint, then stopping",
                  file=sys.stderr, flush=True)

    def agreed(self, world: int) -> int | None:
        """The signal any rank received (every rank calls this after each step, so all stop at the same one)."""
        if world <= 1:
            return self.signum

        flag = torch.tensor([float(self.signum or 0)])
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return int(flag.item()) or None

    @classmethod
    @contextlib.contextmanager
    def installed(cls) -> Iterator["StopRequest"]:
        """This request as the SIGINT/SIGTERM handler for the block; the previous handlers after it. Outside the
        main thread (signals cannot be handled there) nothing is installed and no stop is ever requested."""
        request = cls()
        if threading.current_thread() is not threading.main_thread():
            yield request
            return
        previous = {sig: signal.signal(sig, request) for sig in SIGNALS}
        try:
            yield request
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
