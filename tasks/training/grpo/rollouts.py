"""GRPO's rollouts and updates: sample groups of completions, score them, make the clipped updates.

    rollouts = sample_rollouts(policy, tokenizer, problems, G, ...)   # KV-cache sampling; old log-probs kept
    batch = rollout_batch(rollouts, pad)                               # next-token tensors, completion mask
    metrics, rollouts = grpo_step(engine, reference, ...)              # one step: sample, score, update

Old log-probs are the ones the sampler computed, of the tempered policy it drew from
(logits / temperature); the update and the reference divide their logits by the same
temperature (as TRL does), so the first update's importance ratio is exactly 1 at any temperature.
"""
from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol

import torch

from models.chat_template import decode_completion, encode_prompt, special_ids
from models.grpo import group_advantages, grpo_loss
from models.losses import IGNORE_INDEX, token_logprobs
from models.sampling import equal_length_batches, generate, tempered
from tasks.eval.rewards import ABSTENTION
from tasks.training.config import GrpoConfig


class Problem(Protocol):
    """What GRPO needs of a problem: the prompt text. The whole object is the rewards' reference."""

    question: str


MAX_BATCH_ROWS = 256  # sequences generated in one batch, bounding the sampler's memory


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
    max_rows: int = MAX_BATCH_ROWS,
) -> list[list[tuple[list[int], list[float]]]]:
    """For each prompt, n_samples (completion ids, log-probs); prompts of equal length share a batch.

    generate() has no padding mask, so only equal-length prompts can share a forward pass.
    """
    device = next(model.parameters()).device
    out: list[list[tuple[list[int], list[float]]]] = [[] for _ in prompts]
    per_call = max(1, max_rows // n_samples)  # prompts per generate call, bounding its memory
    for idx in equal_length_batches(prompts, per_call):
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
    max_batch_rows: int = MAX_BATCH_ROWS,
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


def guide_abstentions(rollouts: list[Rollout], tokenizer: Any, group_size: int, per_group: int,
                      groups: Sequence[int] | None = None) -> list[int]:
    """Replace the last `per_group` completions of each group in `groups` (default: every group) by the abstention
    (`<answer>unknown</answer>`); their indices. Off-policy guidance (as LUFFY, Yan et al. 2025, mixes off-policy
    completions into GRPO's groups): a policy that almost never says "I don't know" inside the range it was trained
    on never samples it there, so it cannot learn that abstaining beats its likely-wrong answers. With the abstention
    scored beside its own samples, the group-relative advantage raises it where the group did worse than abstaining
    and lowers it elsewhere. Their old log-probs are left to the caller (the policy's own, from a forward pass)."""
    if per_group <= 0:
        return []
    ids = tokenizer.encode(ABSTENTION, add_special_tokens=False).ids + [special_ids(tokenizer).end_turn]
    chosen = range(len(rollouts) // group_size) if groups is None else groups
    guided = [g * group_size + j for g in chosen for j in range(group_size - per_group, group_size)]
    text = decode_completion(tokenizer, ids)
    for i in guided:
        rollouts[i] = replace(rollouts[i], completion_ids=list(ids), old_logprobs=[0.0] * len(ids), text=text)
    return guided


def unsure_groups(rollouts: Sequence[Rollout], group_size: int, max_accuracy: float, kept: int) -> list[int]:
    """The groups whose first `kept` sampled completions (those guide_abstentions leaves) are right at most
    `max_accuracy` of the time: the prompts where the policy's own samples say it is likely wrong. With max_accuracy
    under the abstain reward's share of a right answer's, the abstention then scores above the group's mean."""
    n_groups = len(rollouts) // group_size
    return [g for g in range(n_groups)
            if sum(r.correct for r in rollouts[g * group_size:g * group_size + kept]) / kept <= max_accuracy]


def alike_groups(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    """[n_groups] bool: True where every completion of the group scored the same (its advantages are all zero)."""
    flat = rewards.view(-1, group_size)
    return (flat == flat[:, :1]).all(dim=1)


def informative_groups(rewards: torch.Tensor, group_size: int, want: int) -> list[int]:
    """The first `want` groups whose rewards are not all equal, in order (DAPO's dynamic sampling, Yu et al. 2025):
    a group whose completions all scored alike gets zero advantages and teaches nothing but the KL term. When no
    group differs, the first `want` groups, so that a step still has a batch (it then moves only by the KL term)."""
    alike = alike_groups(rewards, group_size)
    varied = (~alike).nonzero().flatten().tolist()
    return (varied or list(range(alike.numel())))[:want]


@torch.no_grad()
def own_logprobs(model: torch.nn.Module, batch: RolloutBatch, rows: Sequence[int], temperature: float) -> None:
    """Set the old log-probs of `rows` (completions the policy did not sample) to the tempered policy's own, so their
    first update's ratio is 1 as a sampled completion's is."""
    if not rows:
        return
    idx = torch.tensor(list(rows), device=batch.input_ids.device)
    own = token_logprobs(tempered(model(batch.input_ids[idx]), temperature), batch.targets[idx]).float()
    batch.old_logprobs[idx] = torch.where(batch.mask[idx], own, batch.old_logprobs[idx])


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


def abstention_nll(logp: torch.Tensor, mask: torch.Tensor, rows: Sequence[int]) -> torch.Tensor:
    """The mean negative log-likelihood of the completion tokens of `rows` (the guided abstentions): a supervised
    term on the prompts where the policy's own samples are mostly wrong, as R-Tuning (Zhang et al. 2024) teaches
    "I don't know" on the questions a model gets wrong, and ReLIFT (Ma et al. 2025) interleaves SFT on the questions
    RL fails. Unlike the clipped policy term it does not shrink where the abstention is improbable."""
    idx = torch.tensor(list(rows), device=logp.device)
    m = mask[idx].to(logp.dtype)
    return -(logp[idx] * m).sum() / m.sum().clamp_min(1)


def _policy_updates(engine, batch: RolloutBatch, ref_logp: torch.Tensor, advantages: torch.Tensor,
                    cfg: GrpoConfig, guided: Sequence[int] = ()) -> dict[str, float]:
    """cfg.updates_per_batch optimizer steps on one sampled batch; mean loss, KL, clip fraction, ratio, entropy (and
    the guided abstentions' NLL where cfg.abstain_sft weighs it in)."""
    stats_sum: dict[str, float] = {}
    losses, entropy = [], float("nan")
    supervised = bool(cfg.abstain_sft and guided)
    for update in range(cfg.updates_per_batch):
        logits = tempered(engine(batch.input_ids), cfg.temperature)
        logp = token_logprobs(logits, batch.targets)
        loss, stats = grpo_loss(
            logp, batch.old_logprobs, ref_logp, advantages, batch.mask, clip_eps=cfg.clip_eps, beta=cfg.beta
        )
        if supervised:
            nll = abstention_nll(logp, batch.mask, guided)
            loss = loss + cfg.abstain_sft * nll
            stats["abstain_nll"] = float(nll.detach())
        if update == 0:
            entropy = masked_entropy(logits.detach(), batch.mask)
        engine.backward(loss)
        engine.step()
        losses.append(float(loss.detach()))
        for k in ("kl", "clip_fraction", "ratio_mean", "abstain_nll"):
            if k in stats:
                stats_sum[k] = stats_sum.get(k, 0.0) + stats[k]
    means = {k: v / cfg.updates_per_batch for k, v in stats_sum.items()}
    return {**means, "entropy": entropy, "loss": sum(losses) / len(losses)}


def _rollout_metrics(rollouts: Sequence[Rollout], rewards: torch.Tensor, group_size: int) -> dict:
    """Reward mean/std, accuracy, completion length and the share of groups whose rewards are all equal."""
    return {
        "reward_mean": float(rewards.mean()),
        "reward_std": float(rewards.std(correction=0)),
        "accuracy": sum(r.correct for r in rollouts) / len(rollouts),
        "completion_len": sum(len(r.completion_ids) for r in rollouts) / len(rollouts),
        # Groups whose rewards are all equal give no gradient signal; many means the task is too hard or too easy.
        "zero_std_groups": float(alike_groups(rewards, group_size).float().mean()),
    }


@dataclass
class Scorer:
    """The rewards of a run: the weighted sum, and the one that says whether a completion is correct."""

    reward_fn: Callable[[str, Any], float]
    acc_fn: Callable[[str, Any], float]

    def score(self, rollouts: Sequence[Rollout]) -> torch.Tensor:
        for r in rollouts:
            r.reward = float(self.reward_fn(r.text, r.problem))
            r.correct = self.acc_fn(r.text, r.problem) >= 1.0
        return torch.tensor([r.reward for r in rollouts], dtype=torch.float32)


def grpo_step(engine, reference: torch.nn.Module, tokenizer: Any, picked: Sequence[Problem], cfg: GrpoConfig,
              scorer: Scorer, generator: torch.Generator, step: int) -> tuple[dict[str, float], list[Rollout]]:
    """Sample cfg.group_size completions of each picked problem, score them, update the policy; metrics, rollouts."""
    t0 = time.perf_counter()
    device = engine.device
    generator.manual_seed(cfg.seed * 1_000_003 + step)
    rollouts = sample_rollouts(
        engine.module, tokenizer, picked, cfg.group_size, cfg.max_new_tokens, cfg.temperature, cfg.top_p, generator
    )
    rewards = scorer.score(rollouts)
    if cfg.abstain_guidance:
        unsure = unsure_groups(rollouts, cfg.group_size, cfg.abstain_guidance_max_accuracy,
                               kept=cfg.group_size - cfg.abstain_guidance)
        guided = guide_abstentions(rollouts, tokenizer, cfg.group_size, cfg.abstain_guidance, unsure)
        rewards = scorer.score(rollouts)
    else:
        guided = []
    rollout = _rollout_metrics(rollouts, rewards, cfg.group_size)  # of every group sampled
    G = cfg.group_size
    if cfg.oversample > 1:  # train on the groups that carry a signal, at most prompts_per_step of them
        keep = informative_groups(rewards, G, cfg.prompts_per_step)
        rows = [g * G + j for g in keep for j in range(G)]
        rollouts = [replace(rollouts[i], group=n // G) for n, i in enumerate(rows)]
        rewards = rewards[rows]
        was_guided = set(guided)
        guided = [n for n, i in enumerate(rows) if i in was_guided]
    advantages = group_advantages(rewards, group_size=G).to(device)
    batch = rollout_batch(rollouts, special_ids(tokenizer).pad).to(device)
    with torch.no_grad():
        ref_logp = token_logprobs(tempered(reference(batch.input_ids), cfg.temperature), batch.targets)
    own_logprobs(engine.module, batch, guided, cfg.temperature)
    updates = _policy_updates(engine, batch, ref_logp, advantages, cfg, guided)
    metrics = {
        **{k: rollout[k] for k in ("reward_mean", "reward_std", "accuracy")},
        **{k: updates[k] for k in ("kl", "clip_fraction", "ratio_mean")},
        "completion_len": rollout["completion_len"],
        "entropy": updates["entropy"],
        "loss": updates["loss"],
        "zero_std_groups": rollout["zero_std_groups"],
        **({"abstain_nll": updates["abstain_nll"]} if "abstain_nll" in updates else {}),
        **({"trained_groups": float(len(rollouts) // G)} if cfg.oversample > 1 else {}),
        "step_seconds": time.perf_counter() - t0,
    }
    return metrics, rollouts

