"""Special tokens shared by the tokenizer, the chat template, SFT, GRPO and evaluation."""
from __future__ import annotations

PAD = "<|pad|>"
BOS = "<|bos|>"  # beginning of a document or conversation
EOS = "<|eos|>"  # end of a document; also separates documents in token shards
USER = "<|user|>"
ASSISTANT = "<|assistant|>"
END_TURN = "<|end|>"  # closes one chat turn

# Order fixes their ids (0..5) in every tokenizer we train.
SPECIAL_TOKENS: list[str] = [PAD, BOS, EOS, USER, ASSISTANT, END_TURN]
