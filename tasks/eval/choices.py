"""The multiple-choice task: each question with its answer and near misses, scored by each option's likelihood.

    records = choice_records(model, tokenizer, problems, shots=None, batch_size=64)

Every model gives a probability to every option, whether or not it learned to write an
answer: nothing is parsed, so the base model, SFT and GRPO all have a comparable row
(accuracy, calibration, selective prediction) on the same questions and options. An option's
score is the log-probability of the whole response that states it, in the format the prompt
asks for (`<answer>n</answer><|end|>` after the chat template, ` n` and a newline after the
few-shot prompt); the confidence is the chosen option's share of the softmax over the options.
"""
from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
from pydantic import BaseModel

from models.chat_template import special_ids
from tasks.eval.answers import answer_ids, prompt_ids

N_OPTIONS = 4
# Near misses, the mistakes an adder makes: off by one or two, or by ten (a carry).
_NEAR_MISSES = (-10, -2, -1, 1, 2, 10)


class ChoiceRecord(BaseModel):
    """One multiple-choice question, its options and the model's probability of each."""

    question: str
    options: list[int]
    expected: int
    probs: list[float]  # softmax over the options' log-likelihoods

    @property
    def chosen(self) -> int:
        return self.options[int(np.argmax(self.probs))]

    @property
    def correct(self) -> bool:
        return self.chosen == self.expected

    @property
    def confidence(self) -> float:
        return float(max(self.probs))


def options_for(problem: Any, n_options: int = N_OPTIONS) -> list[int]:
    """The answer and n_options - 1 near misses (not negative when the answer is not), in an order fixed by the question."""
    if not 2 <= n_options <= 4:
        raise ValueError(f"n_options must be 2, 3 or 4, got {n_options}")
    answer = int(problem.answer)
    candidates = [answer + d for d in _NEAR_MISSES if answer < 0 or answer + d >= 0]
    rng = random.Random(f"choices\x1f{problem.question}")
    options = [answer, *rng.sample(candidates, n_options - 1)]
    rng.shuffle(options)
    return options


@torch.no_grad()
def sequence_logprobs(model: torch.nn.Module, prompts: Sequence[list[int]], continuations: Sequence[list[int]],
                      pad_id: int, batch_size: int, progress: Callable[[int, int], None] | None = None) -> np.ndarray:
    """Sum of log p(continuation | prompt) for each (prompt, continuation) pair, by teacher forcing.

    Rows are right-padded: under a causal mask no real token sees the padding after it. The
    vocabulary projection runs only at the positions that predict a continuation token.
    `progress(done, total)` after each batch.
    """
    device = next(model.parameters()).device
    max_seq_len = model.cfg.max_seq_len
    seqs = [list(p) + list(c) for p, c in zip(prompts, continuations)]
    too_long = max(len(s) for s in seqs)
    if too_long > max_seq_len:
        raise ValueError(f"a prompt and option of {too_long} tokens exceed max_seq_len={max_seq_len}; use fewer shots")
    if any(len(c) == 0 for c in continuations) or any(len(p) == 0 for p in prompts):
        raise ValueError("every prompt and every continuation needs at least one token")
    out = np.empty(len(seqs), dtype=np.float64)
    was_training = model.training
    model.eval()
    try:
        starts = range(0, len(seqs), batch_size)
        for done, start in enumerate(starts, 1):
            rows = range(start, min(start + batch_size, len(seqs)))
            width = max(len(seqs[k]) for k in rows)
            batch = torch.full((len(rows), width), pad_id, dtype=torch.long)
            for j, k in enumerate(rows):
                batch[j, : len(seqs[k])] = torch.tensor(seqs[k], dtype=torch.long)
            # Position t predicts token t + 1: a continuation's tokens are predicted at len(prompt) - 1 ...
            row_of = [j for j, k in enumerate(rows) for _ in continuations[k]]
            pos = [len(prompts[k]) - 1 + i for k in rows for i in range(len(continuations[k]))]
            target = torch.tensor([t for k in rows for t in continuations[k]], dtype=torch.long)
            hidden = model.hidden(batch[:, :-1].to(device))
            logits = model.lm_head(hidden[torch.tensor(row_of), torch.tensor(pos)]).float()
            token_logp = torch.log_softmax(logits, dim=-1).gather(-1, target.to(device)[:, None]).squeeze(-1)
            sums = torch.zeros(len(rows), dtype=torch.float64).index_add_(
                0, torch.tensor(row_of), token_logp.double().cpu())
            out[start : start + len(rows)] = sums.numpy()
            if progress is not None:
                progress(done, len(starts))
    finally:
        model.train(was_training)
    return out


def choice_records(model: torch.nn.Module, tokenizer: Any, problems: Sequence[Any], shots: Sequence[Any] | None = None,
                   batch_size: int = 64, n_options: int = N_OPTIONS,
                   progress: Callable[[int, int], None] | None = None) -> list[ChoiceRecord]:
    """Each problem as a multiple-choice question, asked with the chat template (or the few-shot prompt with `shots`)."""
    options = [options_for(p, n_options) for p in problems]
    prompts = [prompt_ids(tokenizer, p, shots) for p in problems]
    pairs = [(prompts[i], answer_ids(tokenizer, o, shots)) for i, opts in enumerate(options) for o in opts]
    scores = sequence_logprobs(model, [p for p, _ in pairs], [c for _, c in pairs], special_ids(tokenizer).pad,
                               batch_size, progress).reshape(len(problems), n_options)
    probs = np.exp(scores - scores.max(axis=1, keepdims=True))
    probs /= probs.sum(axis=1, keepdims=True)
    return [ChoiceRecord(question=p.question, options=opts, expected=int(p.answer), probs=row.tolist())
            for p, opts, row in zip(problems, options, probs)]
