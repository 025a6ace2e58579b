"""`llmforge ablate` past pretraining: two post-training settings compared through SFT, GRPO and the evaluation on
tiny budgets, the evaluation's metrics paired by seed with their direction, every run tagged under one parent."""
from __future__ import annotations

import json

import pytest

from tests.conftest import run_cli
from tests.helpers import seeds
from tests.helpers.flow_runs import parent_and_children

small_stage_seed = seeds.small_stage_seed  # its data, tokenizer and tokens: the keys of SMALL's data and tokenizer


@pytest.mark.slow
@pytest.mark.timeout(2400)
def test_two_post_training_settings_through_the_evaluation(tmp_path, prefect_env, small_stage_seed):
    work = seeds.seed_workspace(small_stage_seed, tmp_path / "work")
    (tmp_path / "target.txt").write_text("\n\n".join(f"{a} + {b} = {a + b}. The sum of two numbers is a number."
                                                     for a in range(40) for b in range(3)))
    spec = {"variants": {"short_sft": {"sft.steps": 2}}, "seeds": 2, "until": "evaluate",
            "targets": {"sums": "target.txt"},
            "metrics": {"grpo.token.accuracy": "higher", "sft.token.ece": "lower", "grpo.token.temperature": "lower",
                        "grpo.answer.accuracy": "higher"}}
    (tmp_path / "ablation.yaml").write_text(json.dumps(spec))
    out = run_cli(["ablate", str(tmp_path / "ablation.yaml"), "--preset", "tiny", "--workdir", str(work)]
                  + [a for kv in seeds.SMALL for a in ("--set", kv)], prefect_env, timeout=2400)
    log = out.stdout + out.stderr
    assert "4 proxies: 2 variant(s) x 2 seed(s), until evaluate" in log, log[-3000:]
    document = json.loads((work / "ablate" / "latest" / "ablation.json").read_text())
    assert document["metrics"] == {"grpo.token.accuracy": "higher", "sft.token.ece": "lower",
                                   "grpo.token.temperature": "lower", "grpo.answer.accuracy": "higher"}
    short = document["variants"]["short_sft"]
    # Six questions to a few-step GRPO model: no response states an answer, so answer calibration is not computed;
    # the comparison says so instead of failing after the training.
    if None in short["values"]["grpo.answer.accuracy"]:
        assert "not compute" in log and short["vs_baseline"]["grpo.answer.accuracy"]["verdict"] == "indistinguishable"
    for key in ("sums", "grpo.token.accuracy", "sft.token.ece", "grpo.token.temperature"):
        assert len(short["values"][key]) == 2 and len(document["variants"]["baseline"]["values"][key]) == 2
        assert short["vs_baseline"][key]["verdict"] in ("better", "worse", "indistinguishable")
    # Paired by seed: the difference is the mean of the seeds' differences.
    ece = [v - b for v, b in zip(short["values"]["sft.token.ece"], document["variants"]["baseline"]["values"]["sft.token.ece"])]
    assert short["vs_baseline"]["sft.token.ece"]["diff"] == pytest.approx(sum(ece) / 2)
    assert short["values"]["sft.token.ece"] != document["variants"]["baseline"]["values"]["sft.token.ece"]
    report = (work / "ablate" / "latest" / "report.md").read_text()
    assert "## grpo.token.accuracy (higher is better)" in report and "| short_sft |" in report

    tagged = sorted((stage, r.data.tags["variant"], r.data.tags["seed"]) for stage in ("pretrain", "sft", "grpo")
                    for r in parent_and_children(work, "ablate", stage)[1])
    # The two settings share their pretraining: one run per seed, trained once, tagged with both.
    assert [(v, s) for st, v, s in tagged if st == "pretrain"] == [("baseline,short_sft", "0"),
                                                                    ("baseline,short_sft", "1")], tagged
    for stage in ("sft", "grpo"):
        assert [(v, s) for st, v, s in tagged if st == stage] == [("baseline", "0"), ("baseline", "1"),
                                                                   ("short_sft", "0"), ("short_sft", "1")], tagged
