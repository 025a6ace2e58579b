"""A flow of many runs (infra/run_queue.py) on real DeepSpeed launches: several runs in one launch train exactly as
each alone does, a run two items share trains once, a rerun reuses them, and a run trained but never recorded is
recorded without training again."""
from __future__ import annotations

import json

import pytest

from infra.run_queue import Queued, RunQueue, RunsConfig
from infra.stages import LAUNCH_LOG, place, run
from infra.workspace.paths import Workspace
from infra.workspace.record import RECORD_FILE
from tasks.training.pretrain.stage import Pretrain
from tests.conftest import tiny_pretrain_config


def pretrain(seed: int, steps: int = 6) -> Pretrain:
    # One thread per rank everywhere: a run's losses then depend on nothing but its config.
    return Pretrain(tiny_pretrain_config(seed=seed, max_steps=steps, log_every=1, **{"launch.torch_threads": 1}))


@pytest.mark.slow
def test_queued_runs_train_as_alone_and_are_reused(tmp_path, pretrain_inputs, capsys):
    tokenizer, tokens = pretrain_inputs
    inputs = {"tokens": tokens, "tokenizer": tokenizer}
    ws = Workspace.locate(tmp_path / "queue")
    queue = RunQueue(ws, RunsConfig(slots=2))
    stages = [pretrain(0), pretrain(1), pretrain(2, steps=9)]
    items = [Queued(s, inputs, f"run {i}", cost=s.config.steps) for i, s in enumerate(stages)]

    # A fourth item that is the first's run (the same stage and inputs: two variants sharing their pretraining).
    results = queue.run(items + [Queued(pretrain(0), inputs, "run 0 again", cost=6)])
    out = capsys.readouterr().out
    assert results[3].out_dir == results[0].out_dir and results[3].final_train_loss == results[0].final_train_loss
    results = results[:3]
    # Three runs, two launches side by side, each taking the next run from the queue.
    assert out.count("launching: ") == 2, out[-3000:]
    assert "3 run(s) to train in 2 launch(es) side by side, 1 thread(s) per rank" in out
    assert out.count("llmforge: run started:") == 3 and "run 3/3 done" in out and "ETA" in out
    assert [r.steps for r in results] == [6, 6, 9]
    for r in results:  # each its own folder, record, result and launch log
        assert (r.out_dir / RECORD_FILE).is_file() and (r.out_dir / LAUNCH_LOG).is_file()
    # The second run of a launch trains exactly as a launch of its own does.
    alone = run(pretrain(1), Workspace.locate(tmp_path / "alone"), **inputs)
    assert results[1].final_train_loss == pytest.approx(alone.final_train_loss, rel=1e-6)
    assert results[1].final_val_loss == pytest.approx(alone.final_val_loss, rel=1e-6)
    assert results[0].final_train_loss != pytest.approx(results[1].final_train_loss, rel=1e-6)  # seeds differ
    capsys.readouterr()

    # Trained, but the flow stopped before recording it: recorded now, not trained again.
    (results[0].out_dir / RECORD_FILE).unlink()
    again = queue.run(items)
    out = capsys.readouterr().out
    assert "launching: " not in out, out[-3000:]
    assert "finished training before the flow stopped; recording it" in out
    assert out.count("stage pretrain: reused") == 2
    assert [r.final_train_loss for r in again] == [r.final_train_loss for r in results]
    assert json.loads((results[0].out_dir / RECORD_FILE).read_text())["stage"] == "pretrain"


def test_a_bad_run_fails_before_any_launch(tmp_path, pretrain_inputs, capsys):
    tokenizer, tokens = pretrain_inputs
    ws = Workspace.locate(tmp_path / "ws")
    good = pretrain(0)
    bad = Pretrain(tiny_pretrain_config(micro_batch_size=10**6))  # more windows than the corpus gives: refused in prepare
    with pytest.raises(ValueError, match="fewer than one micro-batch"):
        RunQueue(ws, RunsConfig(slots=2)).run([Queued(s, {"tokens": tokens, "tokenizer": tokenizer}, f"run {i}")
                                               for i, s in enumerate((good, bad))])
    assert "launching: " not in capsys.readouterr().out
    assert not (place(good, ws, tokens=tokens, tokenizer=tokenizer).out_dir / RECORD_FILE).exists()
