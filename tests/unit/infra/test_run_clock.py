"""The whole run's ETA: the preset's stage times scaled by the pace measured so far; ranks add it to their own."""
from __future__ import annotations

from infra.lifecycle.clock import RUN_AFTER_ENV, RunClock, clock_text, run_left_text


class Ticks:
    def __init__(self):
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def test_stages_announce_the_run_so_far_and_the_rest_at_the_measured_pace(monkeypatch):
    monkeypatch.delenv(RUN_AFTER_ENV, raising=False)
    lines, now = [], Ticks()
    clock = RunClock({"data": 1, "pretrain": 4, "sft": 2, "evaluate": 1}, out=lines.append, now=now)
    with clock.stage("data", "collect"):
        assert lines[-1] == "stage 1/4 data: collect (run: 0s so far, about 8m00s left)"
        assert run_left_text(30) == ", run ~7m30s left"  # 30 s of this stage, then 7 minutes at pace 1
        now.t += 120  # twice the reference: the rest is expected to take twice as long too
    with clock.stage("pretrain", "train"):
        assert lines[-1] == "stage 2/4 pretrain: train (run: 2m00s so far, about 14m00s left)"
        now.t += 2  # reused from the cache: says nothing about this machine's pace
    with clock.stage("sft", "tune"):
        assert clock.pace() == 2.0 and lines[-1].endswith("(run: 2m02s so far, about 6m00s left)")
    # A rerun whose data stage was reused in 15 s (a quarter of its minute): a few seconds set no pace.
    rerun = RunClock({"data": 1, "pretrain": 4}, out=lines.append, now=now)
    with rerun.stage("data", "collect"):
        now.t += 15
    assert rerun.pace() == 1.0
    assert RUN_AFTER_ENV not in __import__("os").environ  # outside a stage the ranks add nothing
    assert run_left_text(30) == ""


def test_clock_text():
    assert [clock_text(s) for s in (4.4, 65, 3725, -3)] == ["4s", "1m05s", "1h02m", "0s"]


def test_a_training_rank_adds_the_rest_of_the_run_to_its_own_eta(monkeypatch):
    from tasks.training.metrics import StepClock

    monkeypatch.setenv(RUN_AFTER_ENV, "300")  # set by the pipeline around the stage; the rank inherits it
    clock = StepClock(first_step=0, total=10)
    clock.started -= 10.0  # 5 steps in 10 s: 10 s of this stage left
    assert clock.text(5) == "elapsed 10s, ETA 10s, run ~5m10s left"
