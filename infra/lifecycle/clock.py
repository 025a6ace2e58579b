"""The whole run's clock: how long a pipeline has run, and about how long it has left.

    clock = RunClock(config.expected_minutes)        # the preset's stage times, measured on its reference machine
    with clock.stage("sft", "supervised fine-tuning"):   # "stage 3/5 sft: ... (run: 5m10s so far, about 4m30s left)"
        ...                                          # training ranks add "run ~Xm left" to their own ETA lines

The estimate of the stages still to come is the preset's reference times scaled by this machine's measured
pace: the time the stages that ran here took over their reference times. Stages reused from the cache (done in
well under their reference time) and stages of a few seconds do not count towards the pace (a few seconds more
or less would swing it); before any stage has counted the pace is 1.
A training rank reads the seconds expected after its stage from RUN_AFTER_ENV and adds them to its own ETA.
"""
from __future__ import annotations

import os
import time
from contextlib import contextmanager
from typing import Callable, Iterator

RUN_AFTER_ENV = "LLMFORGE_RUN_AFTER_S"  # seconds the run is expected to take after the current stage
CACHED_BELOW = 0.2  # a stage done in under this fraction of its reference time was reused, not run
PACE_MIN_S = 30.0  # nor does a stage shorter than this count: a few seconds more or less would swing the pace


def clock_text(seconds: float) -> str:
    """`42s`, `1m05s`, `1h02m`: every progress line's durations."""
    seconds = max(int(round(seconds)), 0)
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"


def run_left_text(stage_left_s: float) -> str:
    """", run ~4m30s left" for a training rank whose stage has `stage_left_s` to go ("" outside a pipeline)."""
    after = os.environ.get(RUN_AFTER_ENV)
    if after is None:
        return ""
    try:
        return f", run ~{clock_text(stage_left_s + float(after))} left"
    except ValueError:
        return ""


class RunClock:
    """Elapsed time of a pipeline run and an estimate of what is left, stage by stage."""

    def __init__(self, expected_minutes: dict[str, float], out: Callable[[str], object] = print,
                 now: Callable[[], float] = time.monotonic):
        self.expected = {name: minutes * 60 for name, minutes in expected_minutes.items()}
        self.out, self.now = out, now
        self.started = now()
        self.done: dict[str, float] = {}  # stage -> seconds it took here

    def pace(self) -> float:
        """This machine's time over the reference time, over the stages that ran here (1.0 before any did)."""
        ran = {n: s for n, s in self.done.items()
               if self.expected.get(n) and s >= max(CACHED_BELOW * self.expected[n], PACE_MIN_S)}
        reference = sum(self.expected[n] for n in ran)
        return sum(ran.values()) / reference if reference else 1.0

    def left_after(self, name: str) -> float:
        """Seconds expected for the stages after `name`, at this machine's pace."""
        names = list(self.expected)
        later = names[names.index(name) + 1:] if name in names else []
        return sum(self.expected[n] for n in later) * self.pace()

    def left_from(self, name: str) -> float:
        """Seconds expected for `name` and every stage after it."""
        return self.expected.get(name, 0.0) * self.pace() + self.left_after(name)

    @contextmanager
    def stage(self, name: str, what: str) -> Iterator[None]:
        """Announce stage `name` with the run's elapsed time and estimate; time it; tell training ranks the rest."""
        names = list(self.expected)
        number = f"{names.index(name) + 1}/{len(names)} " if name in names else ""
        self.out(f"stage {number}{name}: {what} (run: {clock_text(self.now() - self.started)} so far, "
                 f"about {clock_text(self.left_from(name))} left)")
        before = os.environ.get(RUN_AFTER_ENV)
        os.environ[RUN_AFTER_ENV] = f"{self.left_after(name):.0f}"
        began = self.now()
        try:
            yield
        finally:
            self.done[name] = self.now() - began
            if before is None:
                os.environ.pop(RUN_AFTER_ENV, None)
            else:
                os.environ[RUN_AFTER_ENV] = before
