"""GRPO stage: a tiny run through the real DeepSpeed launcher (one CPU rank) and a real MLflow store
(tests/helpers/references.py's `grpo_reference`, shared with the GRPO kill test)."""
from __future__ import annotations

import json
import os

import pytest
import torch
from tokenizers import Tokenizer

os.environ.setdefault("DS_ACCELERATOR", "cpu")

from models.export import load_model, save_model  # noqa: E402
from models.llama import ModelConfig, Transformer  # noqa: E402
from tasks.eval.arithmetic import ArithmeticTask, make_problems  # noqa: E402
from tasks.training.grpo.stage import Grpo  # noqa: E402
from tests.conftest import grpo_config, launch_into, saved_tokenizer, small_alphabet_bpe  # noqa: E402
from tests.helpers.references import grpo_reference  # noqa: E402,F401 - the shared GRPO run

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def tok() -> Tokenizer:
    return small_alphabet_bpe(64)


def test_stage_config_checks(tmp_path, tok):
    with pytest.raises(ValueError, match="num_procs"):
        grpo_config(num_procs=2)
    cfg = grpo_config()
    assert cfg.max_new_tokens >= 17
    tok_path = saved_tokenizer(tok, tmp_path)
    model_dir = save_model(Transformer(ModelConfig(vocab_size=tok.get_vocab_size(), dim=16, n_layers=1, n_heads=2,
                                                   n_kv_heads=1, ffn_hidden=32, max_seq_len=64)), tmp_path / "m")
    with pytest.raises(ValueError, match="distinct problems"):  # before anything is launched
        launch_into(Grpo(grpo_config(n_train_problems=500)), tmp_path / "out", tmp_path / "ws",
                    sft=model_dir, tokenizer=tok_path, task=ArithmeticTask(max_operand=5))
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_grpo_stage_through_the_launcher(grpo_reference):  # noqa: F811
    """The shared GRPO run (tests/helpers/references.py): 6 steps from a quick SFT model, samples every step."""
    ref = grpo_reference
    result, out, sft_dir, tok = ref.result, ref.out, ref.inputs["sft"], Tokenizer.from_file(str(ref.inputs["tokenizer"]))
    sft = load_model(sft_dir)
    steps = ref.cfg.steps
    assert steps == 6 and ref.cfg.samples_every == 1

    saved = json.loads((out / "result.json").read_text())
    assert saved["steps"] == steps and saved["n_train_problems"] == 10
    for side in ("before", "after"):
        score = saved[side]
        assert score["n"] == 6 and 0 <= score["n_correct"] <= 6
        assert score["accuracy"] == pytest.approx(score["n_correct"] / 6)
        assert 0 <= score["distinct_answers"] <= 6
    # The SFT model writes the format (reward >= the 0.1 format weight) but is often wrong.
    assert result.before.mean_reward >= 0.1 * 0.5
    assert result.skipped_steps == 0
    # distinct_answers counts the different integers in the greedy answers; recount them here.
    from tasks.eval.rewards import parse_answer
    from tasks.training.grpo.rollouts import sample_rollouts

    for side, model_dir in (("before", sft_dir), ("after", result.model_dir)):
        greedy = sample_rollouts(load_model(model_dir), tok, make_problems(6, 0, 9, "+", split="eval"), 1, 12,
                                 temperature=0.0)
        assert saved[side]["distinct_answers"] == len({parse_answer(r.text) for r in greedy} - {None})
    samples = (out / "samples.txt").read_text()
    assert samples.count("[prompt] What is") == steps * 2  # samples_per_step=2 at each step
    policy = load_model(result.model_dir)
    assert not torch.equal(policy.embed.weight, sft.embed.weight)  # trained
    assert (result.hf_dir / "tokenizer.json").is_file()

    import mlflow

    from infra.tracking.store import tracking_uri
    from infra.workspace.paths import Workspace

    client = mlflow.MlflowClient(tracking_uri(Workspace.locate(ref.ws)))
    run = client.get_run(result.mlflow_run_id)
    for key in ("reward_mean", "reward_std", "accuracy", "kl", "clip_fraction", "completion_len", "entropy",
                "heldout_accuracy_before", "heldout_accuracy_after", "heldout_distinct_answers_after"):
        assert key in run.data.metrics, key
    assert run.data.metrics["heldout_correct_before"] == saved["before"]["n_correct"]
    assert run.data.metrics["heldout_correct_after"] == saved["after"]["n_correct"]
    assert run.data.metrics["heldout_problems"] == saved["after"]["n"]
    assert len(client.get_metric_history(run.info.run_id, "reward_mean")) == steps
    assert len(client.get_metric_history(run.info.run_id, "heldout_accuracy")) == 2  # before and after
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {"samples.txt", "result.json"} <= artifacts
