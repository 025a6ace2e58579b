"""In-process GRPO: sample groups, score them, update the policy with the clipped objective.

    engine = deepspeed.initialize(policy, AdamW)              # one rank, in this process
    for step in range(cfg.steps):
        problems = next prompts_per_step problems             # a seeded shuffle, cycled
        rollouts = G completions per prompt                    # KV-cache sampling; old log-probs kept
        rewards = sum(w * reward_fn(completion, problem))      # tasks/eval/rewards.py registry
        advantages = group_advantages(rewards)                 # no value model
        ref_logp = reference(batch)                            # frozen copy, for the KL term
        for _ in range(cfg.updates_per_batch):                 # reuse the batch; ratios move off 1
            loss = grpo_loss(policy_logp, old_logp, ref_logp, advantages, completion mask)
            engine.backward(loss); engine.step()
        log(reward_mean, reward_std, accuracy, kl, clip_fraction, completion_len, entropy, ...)

Prompts use the chat template (models/chat_template.py) and generation stops at <|end|>.
Old log-probs are the ones the sampler computed (temperature-1 policy log-probs); with a
rollout temperature other than 1 the tempered sampler is then treated as the policy
itself, the usual approximation, so use temperature 1.0 for exactly on-policy ratios.
"""
from __future__ import annotations

import math
import os
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any, Literal, Protocol

import torch
from pydantic import Field

from infra.config import StrictModel
from models.chat_template import IGNORE_INDEX, decode_completion, encode_prompt, special_ids
from models.grpo import group_advantages, grpo_loss
from models.losses import token_logprobs
from tasks.eval.rewards import combined_reward, get_reward


class Problem(Protocol):
    """What GRPO needs of a problem: the prompt text. The whole object is the rewards' reference."""

    question: str


MetricsLog = Callable[[dict, int], Any]


class GrpoConfig(StrictModel):
    """One GRPO run."""

    group_size: int = Field(default=8, ge=2)  # completions per prompt (G)
    prompts_per_step: int = Field(default=8, gt=0)
    max_new_tokens: int = Field(default=16, gt=0)
    temperature: float = Field(default=1.0, gt=0)  # > 0: a greedy group would hold G copies of one answer
    top_p: float = Field(default=1.0, gt=0, le=1)
    lr: float = Field(default=1e-5, gt=0)
    weight_decay: float = Field(default=0.0, ge=0)
    betas: tuple[float, float] = (0.9, 0.99)
    grad_clip: float = Field(default=1.0, ge=0)  # 0 disables clipping
    clip_eps: float = Field(default=0.2, gt=0, lt=1)
    beta: float = Field(default=0.04, ge=0)  # weight of the KL penalty towards the reference
    updates_per_batch: int = Field(default=2, gt=0)  # optimizer steps on each sampled batch
    steps: int = Field(default=50, gt=0)
    seed: int = 0
    rewards: dict[str, float] = Field(default_factory=lambda: {"arithmetic_exact": 1.0, "format": 0.1})
    accuracy_reward: str = "arithmetic_exact"  # a completion is correct when this reward is >= 1
    # ZeRO-3 is not offered: it partitions the weights, and the step-by-step KV-cache sampler
    # would then gather every layer on every token. The LR is constant (no schedule), as usual for GRPO.
    zero: Literal["zero0", "zero1", "zero2"] = "zero0"
    precision: Literal["fp32", "bf16", "auto"] = "fp32"
    eval_prompts: int = Field(default=64, ge=0)  # held-out prompts scored greedily before and after
    samples_every: int = Field(default=10, gt=0)  # keep sample completions every this many steps
    samples_per_step: int = Field(default=2, ge=0)


@dataclass
class Rollout:
    """One sampled completion of one prompt."""

    group: int  # index of the prompt within the step
    problem: Any
    prompt_ids: list[int]
    completion_ids: list[int]  # generated tokens that count (up to and including <|end|>)
    old_logprobs: list[float]  # sampling-time log-probs of completion_ids
    text: str = ""
    reward: float = 0.0
    correct: bool = False


@dataclass
class RolloutBatch:
    """Rollouts as next-token tensors; completion positions are where `mask` is True."""

    input_ids: torch.Tensor  # [B, T]
    targets: torch.Tensor  # [B, T], IGNORE_INDEX outside completions
    mask: torch.Tensor  # [B, T] bool
    old_logprobs: torch.Tensor  # [B, T], 0 outside completions

    def to(self, device: torch.device | str) -> "RolloutBatch":
        return RolloutBatch(*(t.to(device) for t in (self.input_ids, self.targets, self.mask, self.old_logprobs)))


@dataclass
class GrpoResult:
    """What a GRPO run ended with: the trained policy module, per-step metrics, sample completions."""

    policy: torch.nn.Module
    history: list[dict[str, float]] = field(default_factory=list)
    samples: list[dict[str, Any]] = field(default_factory=list)
    eval_before: dict[str, float] | None = None
    eval_after: dict[str, float] | None = None
    seconds: float = 0.0
    skipped_steps: int = 0  # steps whose loss was non-finite (their updates were skipped)

    def samples_text(self) -> str:
        """Sample completions as plain text, for an MLflow artifact."""
        blocks = []
        for s in self.samples:
            blocks.append(
                f"### step {s['step']}  reward {s['reward']:.3f}\n"
                f"[prompt] {s['question']}\n[completion] {s['completion']}\n"
            )
        return "\n".join(blocks)


# ----------------------------------------------------------------------------- rollouts


def _generate_groups(
    model: torch.nn.Module,
    prompts: Sequence[list[int]],
    n_samples: int,
    max_new_tokens: int,
    temperature: float,
    top_p: float,
    end_id: int,
    pad_id: int,
    generator: torch.Generator | None,
    max_rows: int = 256,
) -> list[list[tuple[list[int], list[float]]]]:
    """For each prompt, n_samples (completion ids, log-probs); prompts of equal length share a batch.

    generate() has no padding mask, so only equal-length prompts can share a forward pass.
    """
    from models.sampling import generate

    device = next(model.parameters()).device
    by_len: dict[int, list[int]] = {}
    for i, p in enumerate(prompts):
        by_len.setdefault(len(p), []).append(i)
    out: list[list[tuple[list[int], list[float]]]] = [[] for _ in prompts]
    per_call = max(1, max_rows // n_samples)  # prompts per generate call, bounding its memory
    chunks = [by_len[n][i : i + per_call] for n in sorted(by_len) for i in range(0, len(by_len[n]), per_call)]
    for idx in chunks:
        batch = torch.tensor([prompts[i] for i in idx], dtype=torch.long, device=device)
        batch = batch.repeat_interleave(n_samples, dim=0)
        gen = generate(
            model, batch, max_new_tokens, temperature=temperature, top_p=top_p,
            eos_id=end_id, pad_id=pad_id, generator=generator,
        )
        new, lp, mask = gen.new_tokens.cpu(), gen.logprobs.float().cpu(), gen.mask.cpu()
        for row in range(batch.shape[0]):
            n = int(mask[row].sum())
            out[idx[row // n_samples]].append((new[row, :n].tolist(), lp[row, :n].tolist()))
    return out


def sample_rollouts(
    model: torch.nn.Module,
    tokenizer: Any,
    problems: Sequence[Problem],
    group_size: int,
    max_new_tokens: int,
    temperature: float = 1.0,
    top_p: float = 1.0,
    generator: torch.Generator | None = None,
    max_batch_rows: int = 256,
) -> list[Rollout]:
    """`group_size` completions of each problem's chat prompt, grouped by problem in order.

    At most `max_batch_rows` sequences are generated in one batch.
    """
    sp = special_ids(tokenizer)
    prompts = [encode_prompt(tokenizer, p.question) for p in problems]
    was_training = model.training
    model.eval()
    try:
        groups = _generate_groups(
            model, prompts, group_size, max_new_tokens, temperature, top_p, sp.end_turn, sp.pad, generator,
            max_rows=max_batch_rows,
        )
    finally:
        model.train(was_training)
    rollouts = []
    for g, (problem, prompt, samples) in enumerate(zip(problems, prompts, groups)):
        for ids, lps in samples:
            rollouts.append(Rollout(g, problem, prompt, ids, lps, text=decode_completion(tokenizer, ids)))
    return rollouts


def rollout_batch(rollouts: Sequence[Rollout], pad_id: int) -> RolloutBatch:
    """Right-padded prompt+completion rows; targets and old log-probs aligned with the completion tokens."""
    seqs = [r.prompt_ids + r.completion_ids for r in rollouts]
    width = max(len(s) for s in seqs) - 1
    B = len(rollouts)
    input_ids = torch.full((B, width), pad_id, dtype=torch.long)
    targets = torch.full((B, width), IGNORE_INDEX, dtype=torch.long)
    mask = torch.zeros((B, width), dtype=torch.bool)
    old = torch.zeros((B, width), dtype=torch.float32)
    for b, (r, seq) in enumerate(zip(rollouts, seqs)):
        input_ids[b, : len(seq) - 1] = torch.tensor(seq[:-1], dtype=torch.long)
        start, end = len(r.prompt_ids) - 1, len(seq) - 1  # the target at start is the first completion token
        if end > start:
            targets[b, start:end] = torch.tensor(r.completion_ids, dtype=torch.long)
            mask[b, start:end] = True
            old[b, start:end] = torch.tensor(r.old_logprobs, dtype=torch.float32)
    return RolloutBatch(input_ids, targets, mask, old)


def masked_entropy(logits: torch.Tensor, mask: torch.Tensor) -> float:
    """Mean entropy (nats) of the next-token distributions at masked positions."""
    logp = torch.log_softmax(logits.float(), dim=-1)
    ent = -(logp.exp() * logp).sum(-1)
    return float((ent * mask).sum() / mask.sum().clamp_min(1))


# ----------------------------------------------------------------------------- DeepSpeed setup


def _make_engine(policy: torch.nn.Module, cfg: GrpoConfig, batch_size: int):
    if not torch.cuda.is_available():
        # DeepSpeed picks its accelerator at import; without CUDA only the CPU one works.
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    import deepspeed

    from infra.deepspeed_launch import build_ds_config, resolve_precision
    from models.optim import GuardedAdamW, build_adamw
    from tasks.training.loop import init_distributed

    init_distributed()
    # One micro-batch (the whole sampled batch) per optimizer step.
    run = SimpleNamespace(micro_batch_size=batch_size, grad_accum=1, grad_clip=cfg.grad_clip, precision=cfg.precision)
    ds_config = build_ds_config(cfg.zero, run)
    if cfg.zero == "zero0" and resolve_precision(cfg.precision) == "fp32":
        # Plain fp32 DeepSpeed steps the client optimizer as is; GuardedAdamW clips and skips non-finite steps.
        optimizer = GuardedAdamW(policy, lr=cfg.lr, weight_decay=cfg.weight_decay, betas=cfg.betas, max_grad_norm=cfg.grad_clip)
        ds_config["gradient_clipping"] = 0.0
    else:
        optimizer = build_adamw(policy, lr=cfg.lr, weight_decay=cfg.weight_decay, betas=cfg.betas)
    engine, _, _, _ = deepspeed.initialize(model=policy, optimizer=optimizer, config=ds_config)
    return engine


# ----------------------------------------------------------------------------- evaluation


@torch.no_grad()
def evaluate_accuracy(
    model: torch.nn.Module,
    tokenizer: Any,
    problems: Sequence[Problem],
    greedy: bool = True,
    max_new_tokens: int = 16,
    rewards: dict[str, float] | None = None,
    accuracy_reward: str = "arithmetic_exact",
    temperature: float = 1.0,
    seed: int = 0,
) -> tuple[float, float, int]:
    """(accuracy, mean reward, n) of one completion per problem, greedy unless `greedy` is False.

    A completion is correct when `accuracy_reward` gives it >= 1; the mean reward uses
    `rewards` (name -> weight; default: the accuracy reward alone).
    """
    if not problems:
        return float("nan"), float("nan"), 0
    reward_fn = combined_reward(rewards or {accuracy_reward: 1.0})
    acc_fn = get_reward(accuracy_reward)
    device = next(model.parameters()).device
    generator = None if greedy else torch.Generator(device=device).manual_seed(seed)
    rollouts = sample_rollouts(
        model, tokenizer, problems, 1, max_new_tokens, temperature=0.0 if greedy else temperature, generator=generator
    )
    correct = sum(acc_fn(r.text, r.problem) >= 1.0 for r in rollouts)
    total = sum(reward_fn(r.text, r.problem) for r in rollouts)
    return correct / len(rollouts), total / len(rollouts), len(rollouts)


# ----------------------------------------------------------------------------- the loop


def _check_models(policy: torch.nn.Module, reference: torch.nn.Module, tokenizer: Any, cfg: GrpoConfig) -> None:
    if policy is reference:
        raise ValueError("reference must be a separate frozen copy of the policy (e.g. copy.deepcopy(policy)), not the policy itself")
    vocab = tokenizer.get_vocab_size()
    for name, m in (("policy", policy), ("reference", reference)):
        mcfg = getattr(m, "cfg", None)
        if mcfg is not None and mcfg.vocab_size < vocab:
            raise ValueError(f"{name} vocab_size={mcfg.vocab_size} is smaller than the tokenizer's {vocab}")


def grpo_train(
    policy: torch.nn.Module,
    reference: torch.nn.Module,
    tokenizer: Any,
    problems: Sequence[Problem],
    cfg: GrpoConfig,
    log: MetricsLog | None = None,
    eval_problems: Sequence[Problem] | None = None,
) -> GrpoResult:
    """Train `policy` with GRPO on `problems`; `reference` stays frozen. Metrics go to `log(metrics, step)`.

    With `eval_problems`, the first cfg.eval_prompts of them are scored greedily before and
    after training (keys eval_accuracy / eval_reward). The returned result holds the trained
    module (the engine's), every step's metrics and sample completions.
    """
    if not problems:
        raise ValueError("grpo_train needs at least one problem")
    _check_models(policy, reference, tokenizer, cfg)
    reward_fn = combined_reward(cfg.rewards)
    acc_fn = get_reward(cfg.accuracy_reward)
    log = log or (lambda metrics, step: None)
    sp = special_ids(tokenizer)
    t_start = time.perf_counter()

    torch.manual_seed(cfg.seed)
    reference.eval()
    reference.requires_grad_(False)
    batch_size = cfg.prompts_per_step * cfg.group_size
    engine = _make_engine(policy, cfg, batch_size)
    module = engine.module
    device = engine.device
    reference.to(device)
    generator = torch.Generator(device=device)

    result = GrpoResult(policy=module)
    evals = list(eval_problems or [])[: cfg.eval_prompts]
    eval_kw = dict(max_new_tokens=cfg.max_new_tokens, rewards=cfg.rewards, accuracy_reward=cfg.accuracy_reward)
    if evals:
        acc, rew, n = evaluate_accuracy(module, tokenizer, evals, **eval_kw)
        result.eval_before = {"eval_accuracy": acc, "eval_reward": rew, "eval_n": n}
        log(dict(result.eval_before), 0)

    order = list(range(len(problems)))
    rng = random.Random(cfg.seed)
    rng.shuffle(order)
    cursor = 0
    for step in range(cfg.steps):
        t0 = time.perf_counter()
        picked = []
        for _ in range(cfg.prompts_per_step):
            if cursor == len(order):  # a new epoch over the problems, in a new order
                rng.shuffle(order)
                cursor = 0
            picked.append(problems[order[cursor]])
            cursor += 1

        generator.manual_seed(cfg.seed * 1_000_003 + step)
        rollouts = sample_rollouts(
            module, tokenizer, picked, cfg.group_size, cfg.max_new_tokens, cfg.temperature, cfg.top_p, generator
        )
        for r in rollouts:
            r.reward = float(reward_fn(r.text, r.problem))
            r.correct = acc_fn(r.text, r.problem) >= 1.0
        rewards = torch.tensor([r.reward for r in rollouts], dtype=torch.float32)
        advantages = group_advantages(rewards, group_size=cfg.group_size).to(device)
        batch = rollout_batch(rollouts, sp.pad).to(device)

        with torch.no_grad():
            ref_logp = token_logprobs(reference(batch.input_ids), batch.targets)

        stats_sum: dict[str, float] = {}
        losses, entropy = [], float("nan")
        for update in range(cfg.updates_per_batch):
            logits = engine(batch.input_ids)
            logp = token_logprobs(logits, batch.targets)
            loss, stats = grpo_loss(
                logp, batch.old_logprobs, ref_logp, advantages, batch.mask, clip_eps=cfg.clip_eps, beta=cfg.beta
            )
            if update == 0:
                entropy = masked_entropy(logits.detach(), batch.mask)
            engine.backward(loss)
            engine.step()
            losses.append(float(loss.detach()))
            for k in ("kl", "clip_fraction", "ratio_mean"):
                stats_sum[k] = stats_sum.get(k, 0.0) + stats[k]

        n_groups = len(picked)
        flat = rewards.view(n_groups, cfg.group_size)
        metrics = {
            "reward_mean": float(rewards.mean()),
            "reward_std": float(rewards.std(correction=0)),
            "accuracy": sum(r.correct for r in rollouts) / len(rollouts),
            "kl": stats_sum["kl"] / cfg.updates_per_batch,
            "clip_fraction": stats_sum["clip_fraction"] / cfg.updates_per_batch,
            "ratio_mean": stats_sum["ratio_mean"] / cfg.updates_per_batch,
            "completion_len": sum(len(r.completion_ids) for r in rollouts) / len(rollouts),
            "entropy": entropy,
            "loss": sum(losses) / len(losses),
            # Groups whose rewards are all equal give no gradient signal; many means the task is too hard or too easy.
            "zero_std_groups": float((flat == flat[:, :1]).all(dim=1).float().mean()),
            "step_seconds": time.perf_counter() - t0,
        }
        result.history.append({"step": step, **metrics})
        log(metrics, step)
        if step % cfg.samples_every == 0 or step == cfg.steps - 1:
            for g in range(min(cfg.samples_per_step, n_groups)):
                r = rollouts[g * cfg.group_size]
                result.samples.append({"step": step, "question": r.problem.question, "completion": r.text, "reward": r.reward})

    if evals:
        acc, rew, n = evaluate_accuracy(module, tokenizer, evals, **eval_kw)
        result.eval_after = {"eval_accuracy": acc, "eval_reward": rew, "eval_n": n}
        log(dict(result.eval_after), cfg.steps)
    result.seconds = time.perf_counter() - t_start
    # GuardedAdamW / ZeRO skip the update of a non-finite loss; count them so a caller can tell.
    result.skipped_steps = sum(not math.isfinite(h["loss"]) for h in result.history)
    return result
