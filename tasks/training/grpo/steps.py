"""GRPO: sample groups, score them, update the policy with the clipped objective, as the one loop's step.

    fit(policy, cfg, GrpoSteps(...))                          # tasks/training/loop.py: resume, log, checkpoint
      GrpoSteps.step(engine, step):                           # grpo_step, tasks/training/grpo/rollouts.py
        problems = next prompts_per_step x oversample problems  # a seeded shuffle, cycled
        rollouts = G completions per prompt                    # KV-cache sampling; old log-probs kept
        rewards = sum(w * reward_fn(completion, problem))      # tasks/eval/rewards.py registry
        oversample > 1: keep prompts_per_step groups whose rewards differ  # DAPO's dynamic sampling
        advantages = group_advantages(rewards)                 # no value model
        ref_logp = reference(batch)                            # frozen copy, for the KL term
        for _ in range(cfg.updates_per_batch):                 # reuse the batch; ratios move off 1
            loss = grpo_loss(policy_logp, old_logp, ref_logp, advantages, completion mask)
            engine.backward(loss); engine.step()
      GrpoSteps.validate: greedy held-out score (before the first step too)

Prompts use the chat template (models/chat_template.py) and generation stops at <|end|>.
Old log-probs are the ones the sampler computed, of the tempered policy it drew from
(logits / temperature); the update and the reference divide their logits by the same
temperature (as TRL does), so the first update's importance ratio is exactly 1 at any temperature.

A checkpoint holds the policy and optimizer (DeepSpeed), the RNG states, the loop's counters and
metrics, and GrpoSteps.state(): the problem cycle's position, the samples and held-out score so far
and the reference model's sha256, so a resumed run ends exactly where an uninterrupted one does,
and never against another reference.
"""
from __future__ import annotations

import hashlib
import math
import random
import time
from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

import torch

from tasks.eval.answers import AnswerScore, greedy_answers, score_answers
from tasks.eval.rewards import combined_reward, get_reward
from tasks.training.config import GrpoConfig
from tasks.training.grpo.rollouts import MAX_BATCH_ROWS, Problem, Rollout, Scorer, grpo_step
from tasks.training.types import StepStats

# ----------------------------------------------------------------------------- held-out score


def heldout_score(model: torch.nn.Module, tokenizer: Any, problems: Sequence[Problem], cfg: GrpoConfig) -> AnswerScore:
    """Greedy answers to `problems` (cfg.max_new_tokens each), scored with cfg's rewards."""
    answers = greedy_answers(model, tokenizer, problems, cfg.max_new_tokens, batch_size=MAX_BATCH_ROWS)
    return score_answers(answers, cfg.accuracy_reward, cfg.rewards)


def eval_metrics(score: AnswerScore) -> dict[str, float]:
    """A held-out score as the metrics GRPO logs (heldout_accuracy / heldout_reward / heldout_problems)."""
    return {"heldout_accuracy": score.accuracy, "heldout_reward": score.mean_reward, "heldout_problems": score.n}


# ----------------------------------------------------------------------------- one step


class _ProblemCycle:
    """The problems in a seeded shuffled order, reshuffled for every new epoch."""

    def __init__(self, problems: Sequence[Problem], seed: int) -> None:
        self.problems = problems
        self.order = list(range(len(problems)))
        self.rng = random.Random(seed)
        self.rng.shuffle(self.order)
        self.cursor = 0

    def state(self) -> dict[str, Any]:
        """Where the cycle stands: the current order, the position in it and the shuffling RNG."""
        return {"order": list(self.order), "cursor": self.cursor, "rng": self.rng.getstate()}

    def restore(self, state: dict[str, Any]) -> None:
        if len(state["order"]) != len(self.problems):
            raise ValueError(f"the checkpoint cycles {len(state['order'])} problems, this run has "
                             f"{len(self.problems)}; resume with the same problems or start over")
        self.order, self.cursor = list(state["order"]), int(state["cursor"])
        self.rng.setstate(state["rng"])

    def take(self, k: int) -> list[Problem]:
        picked = []
        for _ in range(k):
            if self.cursor == len(self.order):  # a new epoch over the problems, in a new order
                self.rng.shuffle(self.order)
                self.cursor = 0
            picked.append(self.problems[self.order[self.cursor]])
            self.cursor += 1
        return picked


def module_sha256(module: torch.nn.Module) -> str:
    """sha256 of a module's state (names, dtypes, shapes and bytes), e.g. to recognise the reference model."""
    h = hashlib.sha256()
    for name, tensor in sorted(module.state_dict().items()):
        t = tensor.detach().cpu().contiguous()
        h.update(f"{name}:{t.dtype}:{tuple(t.shape)}\n".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def samples_text(samples: Sequence[dict[str, Any]]) -> str:
    """Sample completions as plain text, for an MLflow artifact."""
    return "\n".join(f"### step {s['step']}  reward {s['reward']:.3f}\n"
                     f"[prompt] {s['question']}\n[completion] {s['completion']}\n" for s in samples)


class GrpoSteps:
    """GRPO as the one loop's step (tasks/training/loop.fit): each step samples groups of completions,
    scores them and makes cfg.updates_per_batch clipped updates; validation is the greedy held-out score.

    What it keeps for the stage's result: `samples` (the first completion of the first cfg.samples_per_step groups,
    every cfg.samples_every steps and at the last), the held-out scores `eval_before` and `eval_after`, and
    `seconds()`. Its checkpoint state: the problem cycle, the sampler's generator, the samples, the held-out score
    before training, the seconds so far and the reference model's sha256 (a resume refuses another
    reference), so a resumed run ends exactly where an uninterrupted one does.
    """

    echoed = ("reward_mean", "accuracy", "kl", "completion_len")

    def __init__(self, reference: torch.nn.Module, tokenizer: Any, problems: Sequence[Problem], cfg: GrpoConfig,
                 eval_problems: Sequence[Problem] | None = None) -> None:
        self.reference, self.tokenizer, self.cfg = reference, tokenizer, cfg
        reference.eval()
        reference.requires_grad_(False)
        self.updates_per_step = cfg.updates_per_batch  # the lr schedule counts these optimizer steps
        self.scorer = Scorer(combined_reward(cfg.rewards), get_reward(cfg.accuracy_reward))
        self.cycle = _ProblemCycle(problems, cfg.seed)
        self.evals = list(eval_problems or [])[: cfg.eval_prompts]
        self.samples: list[dict[str, Any]] = []
        self.eval_before: AnswerScore | None = None  # greedy, on the held-out problems
        self.eval_after: AnswerScore | None = None
        self.reference_sha256 = module_sha256(reference)
        self.generator: torch.Generator | None = None
        self._generator_state: torch.Tensor | None = None
        self._started, self._seconds_before = time.perf_counter(), 0.0

    def _on(self, engine) -> torch.Generator:
        """The sampler's generator on the engine's device (the reference moved there too)."""
        if self.generator is None:
            self.reference.to(engine.device)
            self.generator = torch.Generator(device=engine.device)
            if self._generator_state is not None:
                self.generator.set_state(self._generator_state)
        return self.generator

    def step(self, engine, step: int, rank: int, world: int) -> StepStats:
        lr = float(engine.get_lr()[0])
        picked = self.cycle.take(self.cfg.prompts_per_step * self.cfg.oversample)
        metrics, rollouts = grpo_step(engine, self.reference, self.tokenizer, picked, self.cfg, self.scorer,
                                      self._on(engine), step)
        self._keep_samples(rollouts, step)
        loss = metrics.pop("loss")
        bad = not math.isfinite(loss) or not engine.was_step_applied()
        tokens = sum(len(r.prompt_ids) + len(r.completion_ids) for r in rollouts)
        return StepStats(lr, None if bad else loss, int(not math.isfinite(loss)), tokens, metrics["step_seconds"],
                         {} if bad else metrics)

    def start(self, engine) -> dict[str, float] | None:
        self._on(engine)
        if not self.evals:
            return None
        self.eval_before = heldout_score(engine.module, self.tokenizer, self.evals, self.cfg)
        return eval_metrics(self.eval_before)

    def validate(self, engine, rank: int, world: int) -> dict[str, float] | None:
        if not self.evals:
            return None
        self.eval_after = heldout_score(engine.module, self.tokenizer, self.evals, self.cfg)
        return eval_metrics(self.eval_after)

    def _keep_samples(self, rollouts: Sequence[Rollout], step: int) -> None:
        """The first completion of the first cfg.samples_per_step groups, every cfg.samples_every steps and at the end."""
        cfg = self.cfg
        if step % cfg.samples_every == 0 or step == cfg.steps - 1:
            for g in range(min(cfg.samples_per_step, len(rollouts) // cfg.group_size)):
                r = rollouts[g * cfg.group_size]
                self.samples.append({"step": step, "question": r.problem.question, "completion": r.text,
                                     "reward": r.reward})

    def seconds(self) -> float:
        """Training and scoring time, summed over the launches of a resumed run."""
        return self._seconds_before + time.perf_counter() - self._started

    def state(self) -> dict[str, Any]:
        before = self.eval_before
        return {
            "reference_sha256": self.reference_sha256, "cycle": self.cycle.state(),
            # Reseeded from (seed, step) before every step; kept anyway, so a resume stays exact if that changes.
            "generator": self.generator.get_state() if self.generator is not None else None,
            "samples": self.samples, "seconds": self.seconds(),
            "eval_before": asdict(before) if before is not None else None,
        }

    def load_state(self, state: dict[str, Any]) -> None:
        if state["reference_sha256"] != self.reference_sha256:
            raise ValueError(
                f"the checkpoint holds a GRPO run trained against a reference model with sha256 "
                f"{state['reference_sha256'][:12]}…, but this run's reference has {self.reference_sha256[:12]}…; "
                "resume with the model the run started from, or delete its checkpoints folder to start over"
            )
        self.cycle.restore(state["cycle"])
        self._generator_state = state["generator"]
        self.samples = list(state["samples"])
        before = state.get("eval_before")
        self.eval_before = AnswerScore(**before) if before is not None else None
        self._seconds_before = float(state["seconds"])


def grpo_shape(cfg: GrpoConfig) -> dict[str, int]:
    """The engine's batch: one micro-batch (the whole sampled batch) per optimizer step."""
    return {"micro_batch_size": cfg.prompts_per_step * cfg.group_size, "grad_accum": 1, "seq_len": cfg.max_new_tokens}
