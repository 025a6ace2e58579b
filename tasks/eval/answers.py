"""The one greedy-answer scorer: one greedy response per problem through the chat template, scored by rewards.

    answers = greedy_answers(model, tokenizer, problems, max_new_tokens, batch_size)
    score = score_answers(answers, accuracy_reward="arithmetic_exact", rewards={...})

Used by the evaluation stage (answer-level calibration), by GRPO for its held-out accuracy
before and after training, and for the count of distinct answers a policy gives.

A model that never saw the chat template (the pretrained base) is asked with a few-shot
completion prompt instead (`shots`: `3 + 4 = 7` lines, then `a + b =`); its answer is the
text up to the first newline, scored by the `integer_exact` reward.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from models.chat_template import decode_completion, encode_prompt, encode_text, special_ids
from models.sampling import equal_length_batches, generate
from tasks.eval.arithmetic import few_shot_prompt, format_answer
from tasks.eval.rewards import combined_reward, get_reward, parse_answer


@dataclass
class GreedyAnswer:
    """The greedy response to one problem."""

    problem: Any
    completion_ids: list[int]  # generated tokens that count (up to and including <|end|>)
    text: str  # decoded, cut at <|end|>
    logprob: float  # sum of the completion tokens' log-probabilities (float64)
    finished: bool  # ended with <|end|> within the token budget

    @property
    def n_tokens(self) -> int:
        return len(self.completion_ids)


@dataclass(frozen=True)
class AnswerScore:
    """Greedy answers to a set of problems, scored."""

    accuracy: float  # nan without problems
    mean_reward: float  # nan without problems
    n_correct: int
    n: int
    # How many different integers the answers hold: 1 means one answer for every problem,
    # whose accuracy is then the share of problems with that answer, not arithmetic.
    distinct_answers: int


def prompt_ids(tokenizer: Any, problem: Any, shots: Sequence[Any] | None = None) -> list[int]:
    """The prompt for one problem: the chat template, or with `shots` the few-shot completion prompt."""
    if shots is None:
        return encode_prompt(tokenizer, problem.question)
    return encode_text(tokenizer, few_shot_prompt(problem, shots))


def answer_ids(tokenizer: Any, answer: int, shots: Sequence[Any] | None = None) -> list[int]:
    """The tokens of a response stating `answer` in the format the prompt asks for, with what ends it."""
    if shots is None:
        return [*encode_text(tokenizer, format_answer(answer)), special_ids(tokenizer).end_turn]
    return encode_text(tokenizer, f" {answer}\n")


def _first_line(tokenizer: Any, ids: list[int], stop_ids: set[int]) -> tuple[list[int], bool]:
    """The tokens up to and including the one that ends the first line (a newline or a stop token), and
    whether one did."""
    for k in range(1, len(ids) + 1):
        if ids[k - 1] in stop_ids or "\n" in tokenizer.decode(ids[:k], skip_special_tokens=False):
            return ids[:k], True
    return ids, False


@torch.no_grad()
def greedy_answers(model: torch.nn.Module, tokenizer: Any, problems: Sequence[Any], max_new_tokens: int,
                   batch_size: int, shots: Sequence[Any] | None = None,
                   progress: Callable[[int, int], None] | None = None) -> list[GreedyAnswer]:
    """Greedy response to each problem's chat prompt (`problem.question`), in problem order.

    With `shots`, each problem is asked with the few-shot completion prompt instead, and the
    response is the first line of the continuation. At most max_new_tokens are generated, fewer
    where the prompt leaves less room in the model's max_seq_len. The model is put in eval mode
    and restored afterwards. `progress(done, total)` after each batch.
    """
    sp = special_ids(tokenizer)
    newline = encode_text(tokenizer, "\n")
    # The chat stops at <|end|>; a completion at its newline (when that is one token, else at the budget).
    stop = sp.end_turn if shots is None else (newline[0] if len(newline) == 1 else None)
    device = next(model.parameters()).device
    max_seq_len = model.cfg.max_seq_len
    prompts = [prompt_ids(tokenizer, p, shots) for p in problems]
    answers: list[GreedyAnswer | None] = [None] * len(problems)
    was_training = model.training
    model.eval()
    try:
        batches = list(equal_length_batches(prompts, batch_size))
        for done, idx in enumerate(batches, 1):
            length = len(prompts[idx[0]])
            max_new = min(max_new_tokens, max_seq_len - length)
            if max_new < 1:
                raise ValueError(
                    f"prompt of {length} tokens leaves no room to answer within max_seq_len={max_seq_len}; "
                    "use shorter questions or a model with a longer context"
                )
            batch = torch.tensor([prompts[i] for i in idx], dtype=torch.long, device=device)
            gen = generate(model, batch, max_new, temperature=0.0, eos_id=stop, pad_id=sp.pad)
            logprobs = gen.logprobs.double().cpu()
            n_tok = gen.mask.sum(dim=1).cpu()
            new = gen.new_tokens.cpu()
            for row, i in enumerate(idx):
                ids = new[row, : int(n_tok[row])].tolist()
                if shots is None:
                    text, finished = decode_completion(tokenizer, ids), sp.end_turn in ids
                else:
                    ids, finished = _first_line(tokenizer, ids, {sp.end_turn, sp.eos, sp.pad})
                    text = decode_completion(tokenizer, ids).split("\n", 1)[0]
                answers[i] = GreedyAnswer(problems[i], ids, text, float(logprobs[row, : len(ids)].sum()), finished)
            if progress is not None:
                progress(done, len(batches))
    finally:
        model.train(was_training)
    return [a for a in answers if a is not None]


def score_answers(answers: Sequence[GreedyAnswer], accuracy_reward: str = "arithmetic_exact",
                  rewards: Mapping[str, float] | None = None) -> AnswerScore:
    """Accuracy (`accuracy_reward` >= 1), mean of the weighted `rewards` (default: the accuracy reward alone)
    and the number of distinct parsed answers."""
    acc_fn = get_reward(accuracy_reward)
    reward_fn = combined_reward(dict(rewards or {accuracy_reward: 1.0}))
    n = len(answers)
    correct = sum(acc_fn(a.text, a.problem) >= 1.0 for a in answers)
    total = sum(reward_fn(a.text, a.problem) for a in answers)
    distinct = len({parse_answer(a.text) for a in answers} - {None})
    if n == 0:
        return AnswerScore(float("nan"), float("nan"), 0, 0, 0)
    return AnswerScore(correct / n, total / n, int(correct), n, distinct)
