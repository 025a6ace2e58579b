"""Evaluation progress: a line per part at most every `every_s`, with batches done and an ETA."""
from __future__ import annotations

from infra.lifecycle.clock import clock_text
from tasks.eval.progress import EvalProgress


def test_progress_lines_carry_counts_and_an_eta_and_are_rate_limited():
    now = [100.0]
    lines: list[str] = []
    progress = EvalProgress("sft", ["tokens", "answers"], every_s=10.0, out=lines.append, clock=lambda: now[0])
    track = progress.part("tokens")
    for done in range(1, 10):  # one batch every 4 s: a line after 12 s, 24 s, 36 s, not at every batch
        now[0] += 4.0
        track(done, 10)
    assert lines[0] == "evaluate sft: tokens, answers"
    assert lines[1:] == [
        "evaluate sft: tokens 3/10 batches (30%), ETA 28s for tokens, then answers",
        "evaluate sft: tokens 6/10 batches (60%), ETA 16s for tokens, then answers",
        "evaluate sft: tokens 9/10 batches (90%), ETA 4s for tokens, then answers",
    ]
    now[0] += 4.0
    track(10, 10)
    assert lines[-1] == "evaluate sft: tokens done (10 batches in 40s); next: answers"
    progress.part("answers")(1, 1)
    progress.done()
    assert lines[-2:] == ["evaluate sft: answers done (1 batches in 0s)", "evaluate sft: finished in 40s"]


def test_clock_text():
    assert [clock_text(s) for s in (4.4, 65, 3725)] == ["4s", "1m05s", "1h02m"]
