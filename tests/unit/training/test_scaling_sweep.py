"""The scaling sweep's plan, its pretraining configs, its fits and the prediction, on synthetic points drawn
from a known law (no launch: tests/integration/test_scale_flow.py runs the real flow)."""
from __future__ import annotations

import json

import numpy as np
import pytest

from models.family import ASPECT_RATIO, HEAD_DIM, family_config
from models.scaling import LossLaw
from tasks.reports.scaling import scale_report_markdown
from tasks.reports.scaling_plots import contours_png, frontier_png, isoflop_png
from tasks.training.config import PretrainConfig
from tasks.training.pretrain.stage import resolve_model_config
from tasks.training.scaling.config import ScaleConfig
from tasks.training.scaling.prediction import (PREDICTION_FILE, Prediction, fit_problem, fit_sweep, predict_run,
                                               write_prediction)
from tasks.training.scaling.sweep import (MeasuredPoint, epoch_warnings, plan_sweep, point_config, sweep_members,
                                          sweep_pretrain, sweep_tokenizer, world_size)

VOCAB = 4096
PRETRAIN = PretrainConfig.model_validate({"batch": {"seq_len": 128, "micro_batch_size": 16}, "optim": {"lr": 0.002}})
SCALE = ScaleConfig(budgets=[1e12, 2e12, 4e12], depths=list(range(1, 11)), aspect_ratio=32, head_dim=32,
                    tokens_per_param=4, resamples=20)
# A law whose optimum at these budgets lies inside the family, in bits per byte.
TRUTH = LossLaw(E=0.8, A=20.0, B=30.0, alpha=0.30, beta=0.32)


def measured(points, noise=0.0, seed=0):
    rng = np.random.default_rng(seed)
    return [MeasuredPoint(**p.model_dump(), final_val_bpb=float(TRUTH.loss(p.n_params, p.tokens) * np.exp(rng.normal(0, noise))),
                          final_val_loss=1.0, epochs=p.tokens / 1e6, mlflow_run_id=None, out_dir="x") for p in points]


def test_the_sweeps_own_micro_batch_gives_every_point_its_steps():
    assert sweep_pretrain(PRETRAIN, SCALE) is PRETRAIN  # None: the pretraining batch
    small = sweep_pretrain(PRETRAIN, SCALE.model_copy(update={"micro_batch_size": 4}))
    assert small.batch.micro_batch_size == 4 and PRETRAIN.batch.micro_batch_size == 16
    wide, narrow = plan_sweep(SCALE, PRETRAIN, VOCAB), plan_sweep(SCALE, small, VOCAB)
    assert [p.depth for p in wide] == [p.depth for p in narrow]
    for a, b in zip(wide, narrow):  # the same tokens, in four times the optimizer steps
        assert abs(b.steps - 4 * a.steps) <= 2 and abs(b.tokens - a.tokens) <= 2 * 128 * 16
        assert point_config(small, b, SCALE, 10_000).steps == b.steps


def test_a_point_short_of_min_steps_trains_the_same_tokens_on_a_smaller_micro_batch():
    plain = plan_sweep(SCALE, PRETRAIN, VOCAB)
    floor = sorted(p.steps for p in plain)[len(plain) // 2]  # half the points fall short of it
    stepped = plan_sweep(SCALE.model_copy(update={"min_steps": floor}), PRETRAIN, VOCAB)
    assert [p.depth for p in stepped] == [p.depth for p in plain]
    for a, b in zip(plain, stepped):
        if a.steps >= floor:
            assert b == a and b.micro_batch_size is None  # the sweep's micro-batch
            continue
        rows = b.micro_batch_size
        assert rows is not None and rows < 16 and (b.steps >= floor or rows == 1)
        assert b.steps // 2 < floor  # twice the micro-batch would have fallen short: the largest that gives it
        assert b.tokens % (rows * 128) == 0 and b.flops == pytest.approx(a.flops, rel=0.05)
        cfg = point_config(PRETRAIN, b, SCALE, 100_000)
        assert (cfg.batch.micro_batch_size, cfg.steps) == (rows, b.steps)
        assert cfg.steps * cfg.batch.tokens_per_step(1) == b.tokens


def test_the_sweeps_own_vocabulary():
    from tasks.tokenizer.train import TokenizerConfig

    pipeline = TokenizerConfig(vocab_size=4096, min_frequency=3)
    assert sweep_tokenizer(pipeline, SCALE) is pipeline
    own = sweep_tokenizer(pipeline, SCALE.model_copy(update={"vocab_size": 1024}))
    assert (own.vocab_size, own.min_frequency, pipeline.vocab_size) == (1024, 3, 4096)
    with pytest.raises(ValueError):  # too small to hold the special tokens and the 256 bytes: refused, not kept
        sweep_tokenizer(pipeline, SCALE.model_copy(update={"vocab_size": 100}))


def test_config_defaults_are_the_familys():
    assert (ScaleConfig().aspect_ratio, ScaleConfig().head_dim) == (ASPECT_RATIO, HEAD_DIM)
    with pytest.raises(ValueError, match="distinct positive FLOP counts"):
        ScaleConfig(budgets=[1e12, 1e12])


def test_plan_spends_each_budget_on_whole_steps_around_the_guess():
    points = plan_sweep(SCALE, PRETRAIN, VOCAB)
    per_step = PRETRAIN.batch.tokens_per_step(world_size(PRETRAIN))
    assert len(points) == 3 * SCALE.sizes_per_budget
    for p in points:
        assert p.tokens == p.steps * per_step and p.flops == p.tokens * p.flops_per_token
        # Rounded to the nearest whole step: within half a step's FLOPs of the budget.
        assert abs(p.flops - p.budget) <= 0.5 * per_step * p.flops_per_token
    for budget in SCALE.budgets:
        depths = [p.depth for p in points if p.budget == budget]
        assert depths == list(range(depths[0], depths[0] + 4))  # neighbouring members, smallest first
        ratios = [p.tokens_per_param for p in points if p.budget == budget]
        nearest = int(np.argmin([abs(np.log(r / SCALE.tokens_per_param)) for r in ratios]))
        assert nearest in (1, 2) or depths[0] == SCALE.depths[0] or depths[-1] == SCALE.depths[-1]
    with pytest.raises(ValueError, match="less than half a step"):
        plan_sweep(SCALE.model_copy(update={"budgets": [1e6]}), PRETRAIN, VOCAB)


def test_point_config_is_the_presets_pretraining_with_the_members_shape():
    point = plan_sweep(SCALE, PRETRAIN, VOCAB)[5]
    cfg = point_config(PRETRAIN, point, SCALE, val_tokens=31_423)
    arch = resolve_model_config(cfg, VOCAB)
    assert arch == family_config(point.depth, VOCAB, 128, 32, 32).model_dump(mode="json")
    assert cfg.steps == point.steps and cfg.optim.warmup_steps == round(0.05 * point.steps)
    assert cfg.optim.lr == PRETRAIN.optim.lr and cfg.batch == PRETRAIN.batch and cfg.export_hf is False
    assert cfg.log.eval_every == 0  # validated once, at the end, where the fits read it
    assert cfg.checkpoint.every == 0  # saved once, at the end (or where a stop lands)
    # over the whole val split: 245 windows of 128 tokens, in batches of the micro-batch's rows (no window twice)
    rows = PRETRAIN.batch.micro_batch_size
    assert cfg.log.eval_batches == 245 // rows and cfg.log.eval_batches * rows <= 245 < (cfg.log.eval_batches + 1) * rows


def test_epochs_past_four_are_warned():
    points = plan_sweep(SCALE, PRETRAIN, VOCAB)
    most = max(p.tokens for p in points)
    assert epoch_warnings(points, train_tokens=most) == []
    warned = epoch_warnings(points, train_tokens=most // 5)
    assert warned and all("epochs, past 4 (Muennighoff" in w for w in warned)


def test_too_small_a_sweep_says_why_it_is_not_fitted():
    points = plan_sweep(SCALE.model_copy(update={"sizes_per_budget": 3}), PRETRAIN, VOCAB)
    assert "one with 4" in fit_problem(points)
    assert "at least 2 budgets" in fit_problem(points[:4])
    assert fit_problem(plan_sweep(SCALE, PRETRAIN, VOCAB)) is None


@pytest.fixture(scope="module")
def fitted():
    members = sweep_members(SCALE, PRETRAIN, VOCAB)
    points = measured(plan_sweep(SCALE, PRETRAIN, VOCAB), noise=0.002, seed=1)
    return members, points, fit_sweep(points, members, SCALE)


def test_prediction_picks_the_true_best_member_and_covers_its_loss(fitted, tmp_path):
    members, points, sb = fitted
    budget = SCALE.predict_factor * max(SCALE.budgets)
    per_step = PRETRAIN.batch.tokens_per_step(1)
    pred = predict_run(sb, members, budget, PRETRAIN, SCALE)
    # The member the true law puts lowest at this budget, each trained on whole steps.
    truth = {m.depth: TRUTH.loss(m.n_params, round(budget / m.flops_per_token / per_step) * per_step) for m in members}
    assert pred.depth == min(truth, key=truth.get)
    low, high = pred.interval
    assert low <= truth[pred.depth] <= high and low < pred.predicted_bpb < high
    assert (high - low) / 2 / pred.predicted_bpb < 0.05
    assert pred.flops == pytest.approx(budget, rel=0.02) and pred.tokens % per_step == 0
    assert min(m.n_params for m in members) <= pred.law_n_params <= max(m.n_params for m in members)

    path = write_prediction(tmp_path, pred)
    data = json.loads(path.read_text())
    assert path.name == PREDICTION_FILE and data["measured_bpb"] is None
    assert {"flops", "n_params", "tokens", "predicted_bpb", "interval"} <= set(data) and len(data["interval"]) == 2

    class Trained:  # what a PretrainResult offers the prediction
        final_val_bpb, mlflow_run_id, out_dir = truth[pred.depth], "run", tmp_path

    done = pred.measured(Trained())
    write_prediction(tmp_path, done)
    again = Prediction.model_validate_json((tmp_path / PREDICTION_FILE).read_text())  # prediction.json reads back
    assert again.measured_bpb == truth[pred.depth] and again.inside and abs(again.error) < 0.05


def test_report_draws_the_sweep_and_tables_the_prediction(fitted, tmp_path):
    members, points, sb = fitted
    budget = SCALE.predict_factor * max(SCALE.budgets)
    pred = predict_run(sb, members, budget, PRETRAIN, SCALE)
    for draw, name in ((lambda p: isoflop_png(points, sb, p), "isoflop.png"),
                       (lambda p: frontier_png(points, sb, pred, p), "frontier.png"),
                       (lambda p: contours_png(points, sb, pred, p), "contours.png")):
        assert draw(tmp_path / name).stat().st_size > 5000
    md = scale_report_markdown(points, 10**6, sb, sb.intervals(budget), pred, ["a warning"], None)
    assert "| a (N_opt ~ C^a) |" in md and "optimal tokens per parameter" in md and "WARNING: a warning" in md
    assert "not trained yet" in md and f"depth {pred.depth}" in md
    small = scale_report_markdown(points[:2], 10**6, None, None, None, [], "too few")
    assert "Not fitted: too few" in small and "## Fits" not in small


def test_presets_sweeps_validate_and_the_cli_has_scale():
    from flows.cli import build_parser
    from flows.config import load_pipeline_config

    args = build_parser().parse_args(["scale", "--set", "scale.budgets=[1e12,2e12]"])
    assert args.command == "scale" and args.overrides == ["scale.budgets=[1e12,2e12]"]
    tiny = load_pipeline_config("tiny")
    assert tiny.scale.vocab_size == 1024  # the sweep's own vocabulary: small members are not mostly embedding
    tiny_points = plan_sweep(tiny.scale, tiny.pretrain, tiny.scale.vocab_size)
    assert len(tiny_points) == 12 and min(p.tokens_per_param for p in tiny_points) < 8 < max(p.tokens_per_param for p in tiny_points)
    gpu = load_pipeline_config("gpt-124m")
    points = plan_sweep(gpu.scale, gpu.pretrain, gpu.tokenizer.vocab_size)
    assert len(points) == 12 and all(p.steps >= 100 for p in points)  # whole schedules, not a few steps
