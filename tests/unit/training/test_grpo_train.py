"""The in-process GRPO trainer: rollout bookkeeping, evaluation, and learning on a tiny task.

Real DeepSpeed (one CPU rank in this process), a freshly initialised tiny Transformer, a
tiny byte-level BPE tokenizer trained here.
"""
from __future__ import annotations

import copy
import math
import os
from dataclasses import replace

import pytest
import torch
from tokenizers import Tokenizer

os.environ.setdefault("DS_ACCELERATOR", "cpu")

from models.chat_template import encode_prompt  # noqa: E402
from models.llama import Transformer  # noqa: E402
from models.losses import IGNORE_INDEX, token_logprobs  # noqa: E402
from tasks.eval.answers import greedy_answers, score_answers  # noqa: E402
from tasks.eval.arithmetic import make_problems  # noqa: E402
from tasks.eval.rewards import REWARDS, register_reward  # noqa: E402
from tasks.training.config import GrpoConfig  # noqa: E402
from tasks.training.grpo.rollouts import (Rollout, abstention_nll, guide_abstentions, informative_groups,  # noqa: E402
                                          own_logprobs, rollout_batch, sample_rollouts, unsure_groups)
from tests.conftest import grpo_config, small_alphabet_bpe, tiny_llama as tiny_model  # noqa: E402
from tests.helpers.training import grpo_train  # noqa: E402

TARGET = "a"
pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def tok() -> Tokenizer:
    """A byte-level BPE over a small alphabet, so the vocabulary is ~48 tokens."""
    return small_alphabet_bpe(48)


@pytest.fixture(scope="module")
def rewards():
    """Test rewards, registered for this module only."""

    def frac_target(completion: str, reference) -> float:
        return completion.count(TARGET) / len(completion) if completion else 0.0

    def always(completion: str, reference) -> float:
        return 1.0

    register_reward("test_frac_target")(frac_target)
    register_reward("test_always")(always)
    yield
    REWARDS.pop("test_frac_target", None)
    REWARDS.pop("test_always", None)


@pytest.mark.parametrize("max_batch_rows", [256, 4])
def test_rollouts_align_with_a_full_forward(tok, max_batch_rows):
    model = tiny_model(tok.get_vocab_size())
    problems = make_problems(5, seed=1)  # prompts of different lengths
    assert len({len(encode_prompt(tok, p.question)) for p in problems}) > 1
    gen = torch.Generator().manual_seed(0)
    rollouts = sample_rollouts(
        model, tok, problems, group_size=3, max_new_tokens=6, generator=gen, max_batch_rows=max_batch_rows
    )
    assert len(rollouts) == 15
    assert [r.group for r in rollouts] == [g for g in range(5) for _ in range(3)]
    for r in rollouts:
        assert r.prompt_ids == encode_prompt(tok, r.problem.question)
        assert 1 <= len(r.completion_ids) <= 6 and len(r.old_logprobs) == len(r.completion_ids)
        # Generation stops at <|end|>: it may only be the last token.
        assert 5 not in r.completion_ids[:-1]
    batch = rollout_batch(rollouts, pad_id=0)
    assert batch.mask.sum(1).tolist() == [len(r.completion_ids) for r in rollouts]
    for b, r in enumerate(rollouts):
        assert batch.targets[b][batch.mask[b]].tolist() == r.completion_ids
        assert (batch.targets[b][~batch.mask[b]] == IGNORE_INDEX).all()
    # The sampler's log-probs (KV cache, step by step) are the policy's log-probs on the
    # whole sequence: the importance ratio starts at 1.
    with torch.no_grad():
        full = token_logprobs(model(batch.input_ids), batch.targets)
    assert torch.allclose(full[batch.mask], batch.old_logprobs[batch.mask], atol=1e-4)


def test_the_first_updates_ratio_is_exactly_one_at_a_sampling_temperature(tok):
    """The sampler keeps the log-probs of the tempered policy it drew from, and the update divides the
    policy's logits by the same temperature (as TRL does): the first ratio is 1, not an approximation."""
    from models.grpo import grpo_loss
    from models.sampling import tempered

    model = tiny_model(tok.get_vocab_size())
    rollouts = sample_rollouts(model, tok, make_problems(4, seed=3), group_size=4, max_new_tokens=6, temperature=0.7,
                               generator=torch.Generator().manual_seed(0))
    batch = rollout_batch(rollouts, pad_id=0)
    with torch.no_grad():
        logits = model(batch.input_ids)
        logp = token_logprobs(tempered(logits, 0.7), batch.targets)
        untempered = token_logprobs(logits, batch.targets)
    ratio = torch.exp(logp - batch.old_logprobs)[batch.mask]
    assert torch.allclose(ratio, torch.ones_like(ratio), atol=1e-5)
    _, stats = grpo_loss(logp, batch.old_logprobs, logp, torch.ones(len(rollouts)), batch.mask, clip_eps=0.2, beta=0.0)
    assert stats["ratio_mean"] == pytest.approx(1.0, abs=1e-5) and stats["clip_fraction"] == 0.0
    # The temperature-1 log-probs the update used before are off by far more than rounding.
    assert (torch.exp(untempered - batch.old_logprobs)[batch.mask] - 1).abs().max() > 1e-2


def test_guided_abstentions_replace_the_last_of_each_group_and_start_at_ratio_one(tok):
    """abstain_guidance: the last k completions of every group become the abstention, scored as one, with the
    tempered policy's own log-probs as their old ones (ratio 1 at the first update, as for a sampled completion)."""
    from models.chat_template import decode_completion, special_ids
    from models.sampling import tempered
    from tasks.eval.rewards import ABSTENTION

    model = tiny_model(tok.get_vocab_size())
    rollouts = sample_rollouts(model, tok, make_problems(3, seed=3), group_size=4, max_new_tokens=6, temperature=0.7,
                               generator=torch.Generator().manual_seed(0))
    sampled = [r.text for r in rollouts]
    guided = guide_abstentions(rollouts, tok, group_size=4, per_group=1)
    assert guided == [3, 7, 11]
    # This test tokenizer's alphabet lacks some letters of "unknown": the text is what its tokens decode to.
    said = decode_completion(tok, tok.encode(ABSTENTION, add_special_tokens=False).ids)
    assert [r.text for r in rollouts] == [said if i in guided else t for i, t in enumerate(sampled)]
    assert [r.group for r in rollouts] == [0] * 4 + [1] * 4 + [2] * 4
    assert all(rollouts[i].completion_ids[-1] == special_ids(tok).end_turn for i in guided)
    batch = rollout_batch(rollouts, pad_id=0)
    assert (batch.old_logprobs[guided] == 0).all()  # not the policy's yet
    own_logprobs(model, batch, guided, temperature=0.7)
    with torch.no_grad():
        logp = token_logprobs(tempered(model(batch.input_ids), 0.7), batch.targets)
    ratio = torch.exp(logp - batch.old_logprobs)[batch.mask]
    assert torch.allclose(ratio, torch.ones_like(ratio), atol=1e-5)
    assert guide_abstentions(rollouts, tok, group_size=4, per_group=0) == []
    with pytest.raises(ValueError, match="abstain_guidance"):
        grpo_config(abstain_guidance=1)  # no abstain reward to score it
    with pytest.raises(ValueError, match="abstain_guidance"):
        grpo_config(abstain_guidance=8, group_size=8, rewards={"arithmetic_exact": 1.0, "abstain": 0.3})


def test_guidance_goes_only_to_the_groups_the_policy_mostly_gets_wrong(tok):
    """abstain_guidance_max_accuracy: a group is guided only when at most that share of the samples the guidance
    leaves is right, so the abstention scores above the group's mean there and is never pushed down on prompts the
    policy gets right."""
    def group(right: int) -> list[Rollout]:  # 4 samples, the first `right` of them right
        return [Rollout(0, None, [1], [2], [0.0], correct=i < right) for i in range(4)]

    rollouts = group(4) + group(1) + group(0) + group(2) + [replace(r, correct=i >= 2) for i, r in enumerate(group(0))]
    # The last group's two right samples are the ones two guided abstentions replace: it counts as all wrong.
    assert unsure_groups(rollouts, 4, max_accuracy=0.4, kept=2) == [2, 4]
    assert unsure_groups(rollouts, 4, max_accuracy=0.25, kept=4) == [1, 2]  # counting all four, it is half right
    assert unsure_groups(rollouts, 4, max_accuracy=0.0, kept=4) == [2]
    assert unsure_groups(rollouts, 4, max_accuracy=1.0, kept=3) == [0, 1, 2, 3, 4]
    third = [Rollout(0, None, [1], [2], [0.0], correct=i % 3 == 0) for i in range(9)]  # 1 of 3 right, 3 groups
    assert unsure_groups(third, 3, max_accuracy=1 / 3, kept=3) == [0, 1, 2]  # exactly at the share: guided
    texts = [r.text for r in rollouts]
    guided = guide_abstentions(rollouts, tok, group_size=4, per_group=2, groups=[1, 2])
    assert guided == [6, 7, 10, 11]
    assert [i for i, r in enumerate(rollouts) if r.text != texts[i]] == guided
    assert grpo_config(abstain_guidance=1, abstain_guidance_max_accuracy=0.25,
                       rewards={"arithmetic_exact": 1.0, "abstain": 0.3}).abstain_guidance_max_accuracy == 0.25


def test_abstention_nll_is_the_mean_nll_of_the_guided_rows_completion_tokens():
    """abstain_sft: the guided rows' completion tokens only (not their prompts, not the sampled rows), averaged."""
    logp = -torch.arange(12, dtype=torch.float32).view(3, 4)
    mask = torch.tensor([[0, 1, 1, 0], [0, 0, 1, 1], [1, 1, 1, 1]], dtype=torch.bool)
    assert float(abstention_nll(logp, mask, [1])) == pytest.approx((6 + 7) / 2)
    assert float(abstention_nll(logp, mask, [0, 1])) == pytest.approx((1 + 2 + 6 + 7) / 4)
    x = logp.clone().requires_grad_()
    abstention_nll(x, mask, [1]).backward()
    assert x.grad[1].tolist() == [0, 0, -0.5, -0.5] and not x.grad[[0, 2]].any()
    with pytest.raises(ValueError, match="abstain_sft"):
        grpo_config(abstain_sft=1.0, rewards={"arithmetic_exact": 1.0, "abstain": 0.3})  # nothing guided to weigh
    assert grpo_config(abstain_guidance=2, abstain_sft=1.0,
                       rewards={"arithmetic_exact": 1.0, "abstain": 0.3}).abstain_sft == 1.0


def test_informative_groups_keep_the_first_whose_rewards_differ():
    rewards = torch.tensor([1, 1, 0, 1, 0.5, 0.5, 1, 0, 2, 2, 0, 2], dtype=torch.float32)  # 6 groups of 2
    assert informative_groups(rewards, 2, want=2) == [1, 3]
    assert informative_groups(rewards, 2, want=9) == [1, 3, 5]
    assert informative_groups(torch.ones(6), 2, want=2) == [0, 1]  # none differs: a batch all the same


def test_oversampling_trains_only_on_groups_whose_rewards_differ(tok, rewards):
    """grpo.oversample (DAPO's dynamic sampling): a step draws prompts_per_step x oversample prompts and trains on the
    first prompts_per_step whose completions scored differently; the rest never reach the batch."""
    def odd_only(completion: str, problem) -> float:  # every completion of an even sum scores alike
        return completion.count(TARGET) / len(completion) if completion and problem.answer % 2 else 0.5

    register_reward("test_odd_only")(odd_only)
    try:
        policy = tiny_model(tok.get_vocab_size())
        cfg = grpo_config(group_size=4, prompts_per_step=2, oversample=4, max_new_tokens=6, lr=1e-2, steps=4,
                          rewards={"test_odd_only": 1.0}, accuracy_reward="test_odd_only", eval_prompts=0,
                          samples_every=1, samples_per_step=8)
        problems = make_problems(32, seed=0, split="grpo")
        assert {p.answer % 2 for p in problems} == {0, 1}
        result = grpo_train(policy, copy.deepcopy(policy), tok, problems, cfg)
    finally:
        REWARDS.pop("test_odd_only", None)
    answers = {p.question: p.answer for p in problems}
    trained = [s["question"] for s in result.samples]
    assert trained and all(answers[q] % 2 for q in trained)  # only the groups that could differ, odd sums
    assert all(h["trained_groups"] <= 2 and 0 < h["zero_std_groups"] < 1 for h in result.history)
    assert len(trained) == sum(h["trained_groups"] for h in result.history)


def test_greedy_answer_score_plumbing(tok, rewards):
    model = tiny_model(tok.get_vocab_size())
    problems = make_problems(6, seed=2, split="eval")

    def evaluate_accuracy(**scoring):
        score = score_answers(greedy_answers(model, tok, problems, max_new_tokens=4, batch_size=256), **scoring)
        return score.accuracy, score.mean_reward, score.n

    acc, mean_reward, n = evaluate_accuracy()
    assert n == 6 and acc == 0.0 and mean_reward == 0.0  # a random model does not answer arithmetic
    again = evaluate_accuracy()
    assert again == (acc, mean_reward, n)  # greedy is deterministic
    acc, mean_reward, n = evaluate_accuracy(accuracy_reward="test_always", rewards={"test_always": 0.5})
    assert (acc, mean_reward, n) == (1.0, 0.5, 6)
    assert model.training  # restored


def test_config_and_argument_errors(tok, rewards):
    with pytest.raises(ValueError, match="group_size"):
        grpo_config(group_size=1)
    with pytest.raises(ValueError, match="extra"):
        grpo_config(groupsize=4)
    model = tiny_model(tok.get_vocab_size())
    with pytest.raises(ValueError, match="separate frozen copy"):
        grpo_train(model, model, tok, make_problems(2, seed=0), grpo_config(steps=1))
    with pytest.raises(ValueError, match="unknown reward"):  # the config refuses it before a worker looks it up
        grpo_config(steps=1, rewards={"nope": 1.0})
    small = Transformer(model.cfg.model_copy(update={"vocab_size": 8}))
    with pytest.raises(ValueError, match="vocab_size"):
        grpo_train(small, copy.deepcopy(small), tok, make_problems(2, seed=0), grpo_config(steps=1))


def test_grpo_raises_mean_reward_on_a_learnable_task(tok, rewards):
    """Reward = share of completion characters that are TARGET; a fresh model must learn to emit it."""
    policy = tiny_model(tok.get_vocab_size())
    reference = copy.deepcopy(policy)
    ref_before = {k: v.clone() for k, v in reference.state_dict().items()}
    pol_before = {k: v.clone() for k, v in policy.state_dict().items()}
    cfg = grpo_config(
        group_size=8, prompts_per_step=4, max_new_tokens=8, lr=1e-2, beta=0.04, updates_per_batch=2, steps=12,
        rewards={"test_frac_target": 1.0}, accuracy_reward="test_frac_target", eval_prompts=4, samples_every=5,
    )
    logged: list[tuple[int, dict]] = []
    result = grpo_train(
        policy, reference, tok, make_problems(32, seed=0, split="grpo"), cfg,
        log=lambda m, s: logged.append((s, dict(m))), eval_problems=make_problems(4, seed=0, split="eval"),
    )
    rewards_by_step = [h["reward_mean"] for h in result.history]
    first, last = sum(rewards_by_step[:3]) / 3, sum(rewards_by_step[-3:]) / 3
    assert last > first + 0.1, f"mean reward did not rise: {rewards_by_step}"
    assert len(result.history) == 12 and result.skipped_steps == 0
    for h in result.history:
        for key in ("reward_mean", "reward_std", "accuracy", "kl", "clip_fraction", "completion_len", "entropy"):
            assert key in h
        assert h["kl"] >= 0 and 0 <= h["clip_fraction"] <= 1 and 1 <= h["completion_len"] <= 8
    assert result.history[-1]["kl"] > result.history[0]["kl"]  # the policy moved away from the reference
    assert result.history[-1]["entropy"] < result.history[0]["entropy"]  # and concentrated on the target
    # The log callable saw the eval before (step 0), every step (at the step count after it, as the one
    # loop logs every stage), and the eval after (step 12).
    assert [s for s, m in logged if "reward_mean" in m] == list(range(1, 13))
    assert result.eval_before is not None and result.eval_after is not None
    assert {s for s, m in logged if "heldout_accuracy" in m} == {0, 12}
    # Samples for a text artifact, from steps 0, 5, 10 and the last.
    assert sorted({s["step"] for s in result.samples}) == [0, 5, 10, 11]
    assert "[prompt] What is" in result.samples_text()
    # The reference is frozen; the policy (the very module passed in) was trained.
    assert all(torch.equal(v, ref_before[k]) for k, v in reference.state_dict().items())
    assert not all(torch.equal(v, pol_before[k]) for k, v in policy.state_dict().items())
    assert result.policy is policy
    assert all(not p.requires_grad for p in reference.parameters())


def test_the_supervised_abstention_term_teaches_the_guided_abstention(tok):
    """abstain_sft through the loop: a fresh model, every sample wrong, guided abstentions in every group. Its NLL is
    logged each step, and after the same steps the abstention is far more likely than where only the clipped policy
    term raised it (weight 0, which logs nothing)."""
    problems = make_problems(8, seed=0, split="grpo")
    flat = dict(group_size=4, prompts_per_step=2, max_new_tokens=6, lr=3e-3, beta=0.0, steps=6, eval_prompts=0,
                rewards={"arithmetic_exact": 1.0, "abstain": 0.3}, abstain_guidance=2)

    def abstention_nll_after(weight: float) -> tuple[float, list[dict]]:
        torch.manual_seed(0)
        policy = tiny_model(tok.get_vocab_size())
        result = grpo_train(policy, copy.deepcopy(policy), tok, problems, grpo_config(abstain_sft=weight, **flat))
        said = [Rollout(i, p, encode_prompt(tok, p.question), [0], [0.0]) for i, p in enumerate(problems)]
        rows = guide_abstentions(said, tok, group_size=1, per_group=1)
        batch = rollout_batch(said, pad_id=0)
        with torch.no_grad():
            logp = token_logprobs(policy(batch.input_ids), batch.targets)
        return float(abstention_nll(logp, batch.mask, rows)), result.history

    with_term, history = abstention_nll_after(1.0)
    assert [h["abstain_nll"] > 0 for h in history] == [True] * 6
    without, plain = abstention_nll_after(0.0)
    assert not any("abstain_nll" in h for h in plain)
    assert with_term < without - 1.0, (with_term, without)  # nats per token: 2.3 against 3.8 when written


@pytest.mark.parametrize("zero", ["zero1", "zero2"])
def test_grpo_runs_under_zero_stages(tok, rewards, zero):
    policy = tiny_model(tok.get_vocab_size())
    cfg = grpo_config(
        group_size=4, prompts_per_step=2, max_new_tokens=4, lr=1e-2, steps=2, zero=zero,
        rewards={"test_frac_target": 1.0}, accuracy_reward="test_frac_target", eval_prompts=0,
    )
    before = {k: v.clone() for k, v in policy.state_dict().items()}
    result = grpo_train(policy, copy.deepcopy(policy), tok, make_problems(8, seed=0), cfg)
    assert len(result.history) == 2 and result.skipped_steps == 0
    assert not all(torch.equal(v, before[k]) for k, v in result.policy.state_dict().items())


def test_right_padding_does_not_change_completion_logprobs(tok):
    """Causal attention + right padding: what sits in the padding never reaches a completion token."""
    model = tiny_model(tok.get_vocab_size())
    rollouts = sample_rollouts(model, tok, make_problems(4, seed=3), group_size=2, max_new_tokens=6,
                               generator=torch.Generator().manual_seed(1))
    a, b = rollout_batch(rollouts, pad_id=0), rollout_batch(rollouts, pad_id=7)
    assert not torch.equal(a.input_ids, b.input_ids)  # some rows are padded
    with torch.no_grad():
        la = token_logprobs(model(a.input_ids), a.targets)
        lb = token_logprobs(model(b.input_ids), b.targets)
    assert torch.allclose(la[a.mask], lb[b.mask], atol=1e-6)


class Crash(RuntimeError):
    pass


def _ckpt_cfg(**overrides) -> GrpoConfig:
    base = dict(group_size=4, prompts_per_step=3, max_new_tokens=6, lr=1e-2, updates_per_batch=2, steps=6,
                rewards={"test_frac_target": 1.0}, accuracy_reward="test_frac_target", eval_prompts=3,
                samples_every=2, ckpt_every=2, keep_checkpoints=2)
    return grpo_config(**{**base, **overrides})


def _comparable(result) -> tuple:
    """Everything a run ends with but its timings."""
    timings = ("step_seconds", "tokens_per_s", "mfu")
    history = [{k: v for k, v in h.items() if k not in timings} for h in result.history]
    weights = {k: v.clone() for k, v in result.policy.state_dict().items()}
    return history, result.samples, result.eval_before, result.eval_after, weights


def _same(a: tuple, b: tuple) -> None:
    assert a[:4] == b[:4]  # metrics, samples and held-out scores exactly
    assert a[4].keys() == b[4].keys() and all(torch.equal(a[4][k], b[4][k]) for k in a[4])


def test_checkpoints_change_nothing_and_a_crashed_run_resumes_exactly(tok, rewards, tmp_path):
    """Steps 0-5 with checkpoints after 2, 4, 6: same as without; a crash in step 5 resumes from 4 to the same end."""
    from tasks.training.checkpoint import checkpoint_tags, latest_checkpoint_step

    problems, evals = make_problems(7, seed=0, split="grpo"), make_problems(3, seed=0, split="eval")
    cfg = _ckpt_cfg()

    def run(ckpt_dir, log=None, seed=0):
        policy = tiny_model(tok.get_vocab_size(), seed=seed)
        reference = tiny_model(tok.get_vocab_size())  # the same initial model every time
        return grpo_train(policy, reference, tok, problems, cfg, log=log, eval_problems=evals, ckpt_dir=ckpt_dir,
                          echo=said.append)

    said: list[str] = []
    plain = _comparable(run(None))
    with_ckpts = run(tmp_path / "a")
    _same(plain, _comparable(with_ckpts))
    assert checkpoint_tags(tmp_path / "a") == ["step00000004", "step00000006"] and with_ckpts.resumed_from is None

    def crash_in_step_5(metrics, step):
        if step == 5 and "reward_mean" in metrics:  # logged after step 5's update, before any checkpoint of it
            raise Crash("killed during step 5")

    with pytest.raises(Crash):
        run(tmp_path / "b", log=crash_in_step_5)
    assert latest_checkpoint_step(tmp_path / "b") == 4
    torch.manual_seed(1234)  # the resumed run must not depend on the process' RNG state
    logged: list[int] = []
    resumed = run(tmp_path / "b", log=lambda m, s: logged.append(s), seed=99)  # the policy comes from the checkpoint
    assert resumed.resumed_from == 4 and any(line.startswith("resuming from step 4 ") for line in said)
    assert logged == [5, 6, 6]  # steps 5 and 6, then the held-out score after; the score before is not redone
    _same(plain, _comparable(resumed))
    # 7 problems, 3 per step: the resume continued mid-epoch, past a reshuffle.
    assert 2 * cfg.prompts_per_step < len(problems) < cfg.steps * cfg.prompts_per_step

    with pytest.raises(ValueError, match=r"trained against a reference model with sha256 .* delete .* to start over"):
        grpo_train(tiny_model(tok.get_vocab_size()), tiny_model(tok.get_vocab_size(), seed=5), tok, problems, cfg,
                   ckpt_dir=tmp_path / "b")


def test_grpo_resume_refuses_changed_settings(tmp_path):
    """A rerun into an out_dir with GRPO checkpoints may change only how it checkpoints and runs."""
    import json

    from infra.stages import CHECKPOINTS_DIR, check_resume_compatible
    from tasks.training.grpo.stage import Grpo

    def resolved(**changes):
        return {"grpo": grpo_config(**changes).model_dump(mode="json"), "sft_model": "/m"}

    stage = Grpo(grpo_config())
    (tmp_path / Grpo.config_file).write_text(json.dumps(resolved()))
    (tmp_path / CHECKPOINTS_DIR).mkdir()
    (tmp_path / CHECKPOINTS_DIR / "latest").write_text("step00000010")
    check_resume_compatible(stage, tmp_path, resolved(ckpt_every=5, keep_checkpoints=3, torch_threads=1))
    with pytest.raises(ValueError, match=r"different settings \(optim.lr\)"):
        check_resume_compatible(stage, tmp_path, resolved(lr=1e-3))
    other_model = {**resolved(), "sft_model": "/other"}
    with pytest.raises(ValueError, match=r"different settings \(sft_model\)"):
        check_resume_compatible(stage, tmp_path, other_model)


def test_the_lr_schedule_counts_optimizer_steps_and_ends_with_the_run():
    """A GRPO step makes updates_per_batch optimizer steps: warmup and cosine are sized on those, so the lr reaches
    its floor at the run's last optimizer step, not halfway through the run."""
    from models.optim import lr_at
    from tasks.training.engine import Schedule

    cfg = grpo_config(steps=10, updates_per_batch=3,
                      optim={"warmup_steps": 2, "schedule": "cosine", "min_lr_ratio": 0.1})
    schedule = Schedule.of(cfg.optim, cfg.steps, cfg.updates_per_batch)
    assert (schedule.warmup_steps, schedule.max_steps) == (6, 30)
    last = cfg.steps * cfg.updates_per_batch - 1  # the scheduler's step count at the last optimizer step
    assert lr_at(last, schedule) > 0.1 and lr_at(last + 1, schedule) == pytest.approx(0.1)
    assert lr_at(cfg.steps * cfg.updates_per_batch // 2, schedule) > 0.5  # halfway through the run: not at the floor
    assert Schedule.of(grpo_config().optim, 10, 3) is None  # GRPO's default: a constant lr, no scheduler


def test_grpo_lr_falls_through_the_whole_run(tok, rewards):
    """Through the loop: the lr each step logged falls to the end of the run and no earlier."""
    cfg = grpo_config(group_size=2, prompts_per_step=2, max_new_tokens=4, steps=6, updates_per_batch=2,
                      optim={"lr": 1e-3, "warmup_steps": 0, "schedule": "cosine", "min_lr_ratio": 0.0},
                      rewards={"test_frac_target": 1.0}, accuracy_reward="test_frac_target", eval_prompts=0,
                      log_every=1, precision="fp32")
    logged: list[tuple[int, dict]] = []
    policy = tiny_model(tok.get_vocab_size())
    grpo_train(policy, copy.deepcopy(policy), tok, make_problems(4, seed=0), cfg,
               log=lambda metrics, step: logged.append((step, metrics)))
    lrs = [m["lr"] for _, m in sorted(logged) if "lr" in m]
    assert len(lrs) == cfg.steps and lrs == sorted(lrs, reverse=True) and lrs[0] == pytest.approx(1e-3)
    # The last step starts at optimizer step 10 of 12: cosine there is (1 + cos(pi * 10 / 12)) / 2 of the peak.
    assert lrs[-1] == pytest.approx(1e-3 * 0.5 * (1 + math.cos(math.pi * 10 / 12)), rel=1e-6)
