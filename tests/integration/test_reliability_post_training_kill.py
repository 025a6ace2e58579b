"""SIGKILL SFT and GRPO through the real DeepSpeed launcher after a checkpoint; each rerun resumes to the
uninterrupted run's result (machinery: tests/helpers/killed_runs.py).

The uninterrupted runs are the shared references of test_sft_stage and test_grpo_stage
(tests/helpers/references.py): the killed run and its resume use the same config and the same input
files, in a folder and workspace of their own.
"""
from __future__ import annotations

import json
import os

import pytest
import torch

os.environ.setdefault("DS_ACCELERATOR", "cpu")

from models.export import load_model  # noqa: E402
from tasks.training.grpo.stage import Grpo  # noqa: E402
from tasks.training.sft.stage import Sft  # noqa: E402
from tests.conftest import launch_into  # noqa: E402
from tests.helpers.killed_runs import resumed_like, run_killed  # noqa: E402
from tests.helpers.references import grpo_reference, sft_reference  # noqa: E402,F401 - the uninterrupted runs

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_torch_thread")]


@pytest.fixture(autouse=True)
def _no_outside_mlflow(monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)


def _same_weights(a, b, atol: float) -> None:
    sa, sb = load_model(a).state_dict(), load_model(b).state_dict()
    assert sa.keys() == sb.keys()
    for k in sa:
        assert torch.allclose(sa[k], sb[k], atol=atol, rtol=0), k


def test_sigkilled_sft_resumes_to_the_uninterrupted_loss(tmp_path, sft_reference):  # noqa: F811
    straight, cfg, inputs = sft_reference.result, sft_reference.cfg, sft_reference.inputs
    assert cfg.checkpoint.every < cfg.steps and cfg.replay_fraction > 0  # replayed rows' order must survive too
    out, ws = tmp_path / "killed", tmp_path / "ws"
    killed_at = run_killed(Sft.path(), cfg, inputs, out, ws, cfg.steps)
    resumed = resumed_like(Sft, cfg, inputs, out, ws, killed_at, straight)
    _same_weights(resumed.model_dir, straight.model_dir, atol=1e-5)
    assert resumed.rejected == straight.rejected
    assert resumed.final_replay_val_loss == pytest.approx(straight.final_replay_val_loss, abs=1e-5)
    print(f"SFT killed with checkpoint step {killed_at} of {cfg.steps}; final loss "
          f"{resumed.final_train_loss:.6f} vs {straight.final_train_loss:.6f} uninterrupted")


def test_sigkilled_grpo_resumes_to_the_uninterrupted_rewards(tmp_path, grpo_reference):  # noqa: F811
    straight, cfg, inputs = grpo_reference.result, grpo_reference.cfg, grpo_reference.inputs
    assert cfg.checkpoint.every < cfg.steps
    out, ws = tmp_path / "killed", tmp_path / "ws"
    killed_at = run_killed(Grpo.path(), cfg, inputs, out, ws, cfg.steps)

    resumed = launch_into(Grpo(cfg), out, ws, **inputs)
    assert resumed.resumed_from == killed_at and straight.resumed_from is None
    # Rewards, held-out scores and the samples kept before the kill: exactly the uninterrupted run's.
    assert resumed.final_train_reward == straight.final_train_reward
    assert resumed.before == straight.before and resumed.after == straight.after
    assert (out / "samples.txt").read_text() == (grpo_reference.out / "samples.txt").read_text()
    _same_weights(resumed.model_dir, straight.model_dir, atol=1e-6)
    saved = json.loads((out / "result.json").read_text())
    assert saved["steps"] == cfg.steps and saved["resumed_from"] == killed_at
    print(f"GRPO killed with checkpoint step {killed_at} of {cfg.steps}; final reward {resumed.final_train_reward:.4f}"
          f" vs {straight.final_train_reward:.4f}, held-out {resumed.after.n_correct}/{resumed.after.n} vs "
          f"{straight.after.n_correct}/{straight.after.n} uninterrupted")
