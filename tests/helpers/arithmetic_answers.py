"""What the answer tests evaluate: Parrot, a model that says a fixed script, and a BPE tokenizer of arithmetic."""
from __future__ import annotations

import torch

from models.llama import model_config
from tasks.eval.arithmetic import few_shot_prompt, make_problems
from tests.conftest import bpe_tokenizer_on


def tokenizer():
    """A 300-token BPE trained on arithmetic questions, chat responses and few-shot prompts."""
    texts = [p.question + " " + p.response for p in make_problems(200, 0)]
    texts += [few_shot_prompt(p, make_problems(3, 1)) + f" {p.answer}\n" for p in make_problems(50, 2)]
    return bpe_tokenizer_on(texts, vocab_size=300)


class Parrot(torch.nn.Module):
    """Says `script` whatever the prompt, each token with logit 3 against 0 for all others."""

    def __init__(self, vocab: int, script: list[int]):
        super().__init__()
        self.cfg = model_config("demo", vocab_size=vocab, dim=32, n_layers=1, n_heads=2, n_kv_heads=1,
                                ffn_hidden=64, max_seq_len=128)
        self.anchor = torch.nn.Parameter(torch.zeros(1))  # gives the sampler a device
        self.script, self.prompt_len = script, 0

    def forward(self, idx: torch.Tensor, cache=None) -> torch.Tensor:
        start = cache.length if cache is not None else 0
        if start == 0:
            self.prompt_len = idx.shape[1]
        if cache is not None:
            cache.length = start + idx.shape[1]
        step = start + idx.shape[1] - self.prompt_len
        logits = torch.zeros(idx.shape[0], idx.shape[1], self.cfg.vocab_size)
        logits[:, -1, self.script[min(step, len(self.script) - 1)]] = 3.0
        return logits
