"""The one chat template, shared by SFT, GRPO and evaluation.

    <|bos|><|user|>{instruction}<|end|><|assistant|>{response}<|end|>[<|user|>...<|end|><|assistant|>...<|end|>]

Special tokens are added by id, never by parsing text, and message contents that spell a
special token are refused: otherwise a training record (or a user) could forge a turn
boundary. The model is trained on exactly the assistant content and the `<|end|>` that
closes each assistant turn, so it learns to answer and to stop; generation stops at
`<|end|>`.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from models.losses import IGNORE_INDEX
from models.special_tokens import ASSISTANT, BOS, END_TURN, EOS, PAD, SPECIAL_TOKENS, USER

ROLES = ("user", "assistant")


@dataclass(frozen=True)
class ChatEncoding:
    """Token ids of a conversation and, per token, whether the model is trained to produce it."""

    ids: list[int]
    loss_mask: list[bool]

    def __post_init__(self) -> None:
        if len(self.ids) != len(self.loss_mask):
            raise ValueError(f"ChatEncoding: {len(self.ids)} ids but {len(self.loss_mask)} mask entries")


@dataclass(frozen=True)
class SpecialIds:
    pad: int
    bos: int
    eos: int
    user: int
    assistant: int
    end_turn: int


def special_ids(tokenizer: Any) -> SpecialIds:
    """Ids of the special tokens in `tokenizer`; raises if one is missing (not a llmforge tokenizer)."""
    ids = {}
    for name, token in zip(("pad", "bos", "eos", "user", "assistant", "end_turn"), (PAD, BOS, EOS, USER, ASSISTANT, END_TURN)):
        tid = tokenizer.token_to_id(token)
        if tid is None:
            raise ValueError(
                f"tokenizer has no special token {token!r}; train it with tasks/tokenizer/train.py "
                f"(special tokens {SPECIAL_TOKENS} at ids 0..{len(SPECIAL_TOKENS) - 1})"
            )
        ids[name] = tid
    return SpecialIds(**ids)


def encode_text(tokenizer: Any, text: str) -> list[int]:
    """Ids of plain text, without special tokens; refuses text that spells a special token."""
    for token in SPECIAL_TOKENS:
        if token in text:
            raise ValueError(f"message text contains the special token {token!r}; remove it from the data")
    return list(tokenizer.encode(text, add_special_tokens=False).ids)


def check_messages(messages: Sequence[dict]) -> None:
    """Raise ValueError unless messages alternate user, assistant, user, ... with string contents."""
    if not messages:
        raise ValueError("conversation has no messages")
    for i, msg in enumerate(messages):
        if not isinstance(msg, dict):
            raise ValueError(f"message {i} is {type(msg).__name__}, expected a dict with 'role' and 'content'")
        role, content = msg.get("role"), msg.get("content")
        if role not in ROLES:
            raise ValueError(f"message {i}: role {role!r} is not one of {ROLES}")
        expected = ROLES[i % 2]
        if role != expected:
            raise ValueError(f"message {i}: role {role!r} out of order, expected {expected!r} (turns alternate, user first)")
        if not isinstance(content, str):
            raise ValueError(f"message {i}: content is {type(content).__name__}, expected a string")


def encode_chat(tokenizer: Any, messages: Sequence[dict], add_generation_prompt: bool = False) -> ChatEncoding:
    """Encode a conversation with the chat template; loss_mask is True on assistant content and its closing <|end|>.

    With `add_generation_prompt`, the conversation must end with a user turn and the
    encoding ends with the assistant header, ready for generation.
    """
    check_messages(messages)
    if add_generation_prompt and messages[-1]["role"] != "user":
        raise ValueError("add_generation_prompt needs the conversation to end with a user message")
    sp = special_ids(tokenizer)
    ids: list[int] = [sp.bos]
    mask: list[bool] = [False]
    for msg in messages:
        content = encode_text(tokenizer, msg["content"])
        if msg["role"] == "user":
            ids += [sp.user, *content, sp.end_turn]
            mask += [False] * (len(content) + 2)
        else:
            ids += [sp.assistant, *content, sp.end_turn]
            mask += [False] + [True] * (len(content) + 1)
    if add_generation_prompt:
        ids.append(sp.assistant)
        mask.append(False)
    return ChatEncoding(ids=ids, loss_mask=mask)


def encode_prompt(tokenizer: Any, instruction: str) -> list[int]:
    """Prompt ids for one instruction, ending with the assistant header; generate until <|end|>."""
    return encode_chat(tokenizer, [{"role": "user", "content": instruction}], add_generation_prompt=True).ids


def decode_completion(tokenizer: Any, new_ids: Sequence[int]) -> str:
    """Text of a generated completion, cut at the first <|end|>, <|eos|> or <|pad|>.

    Other special tokens stay visible in the text, so a reward never sees a cleaned-up
    version of what the model actually wrote.
    """
    sp = special_ids(tokenizer)
    stop = {sp.end_turn, sp.eos, sp.pad}
    kept: list[int] = []
    for t in new_ids:
        t = int(t)
        if t in stop:
            break
        kept.append(t)
    return tokenizer.decode(kept, skip_special_tokens=False)


def _jinja_chat_template() -> str:
    # The same checks as check_messages and encode_text, so a conversation that our encoder
    # refuses is refused by transformers' apply_chat_template too.
    specials = "[" + ", ".join(f"'{t}'" for t in SPECIAL_TOKENS) + "]"
    return (
        "{%- if not messages -%}{{ raise_exception('conversation has no messages') }}{%- endif -%}"
        f"{BOS}"
        "{%- for message in messages -%}"
        "{%- if message['role'] != ['user', 'assistant'][loop.index0 % 2] -%}"
        "{{ raise_exception('roles must alternate user, assistant, user, ... (user first)') }}{%- endif -%}"
        f"{{%- for token in {specials} -%}}"
        "{%- if token in message['content'] -%}"
        "{{ raise_exception('message text contains the special token ' ~ token) }}{%- endif -%}"
        "{%- endfor -%}"
        f"{{%- if message['role'] == 'user' -%}}{USER}{{%- else -%}}{ASSISTANT}{{%- endif -%}}"
        f"{{{{ message['content'] }}}}{END_TURN}"
        "{%- endfor -%}"
        "{%- if add_generation_prompt -%}"
        "{%- if messages[-1]['role'] != 'user' -%}"
        "{{ raise_exception('add_generation_prompt needs the conversation to end with a user message') }}{%- endif -%}"
        f"{ASSISTANT}"
        "{%- endif -%}"
    )


# transformers' `tokenizer.chat_template`: renders, as text, exactly what encode_chat encodes
# (special tokens spelled out, which the tokenizer maps back to their ids).
JINJA_CHAT_TEMPLATE = _jinja_chat_template()
# One instruction as a text prompt (str.format with `prompt`), the same as encode_prompt's ids.
PROMPT_TEMPLATE = f"{BOS}{USER}{{prompt}}{END_TURN}{ASSISTANT}"


def collate(encodings: Sequence[ChatEncoding], pad_id: int, max_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Batch encodings into (input_ids [B, T], targets [B, T]) for next-token training.

    targets[b, t] is the token after input_ids[b, t], or IGNORE_INDEX (-100) where it is
    not trained (prompt tokens, padding). Each example is its own row, right-padded to
    the longest row (at most `max_len`; longer examples are truncated at the end). A
    causal mask is then enough: a real token only attends to earlier positions of its own
    row, which are never padding, and the padded positions' outputs are ignored by the
    -100 targets, so no attention mask is needed and nothing crosses examples.
    """
    if max_len < 1:
        raise ValueError(f"max_len must be >= 1, got {max_len}")
    if not encodings:
        raise ValueError("collate needs at least one encoding")
    rows_in: list[list[int]] = []
    rows_tgt: list[list[int]] = []
    for enc in encodings:
        ids = enc.ids[: max_len + 1]
        mask = enc.loss_mask[: max_len + 1]
        rows_in.append(ids[:-1])
        rows_tgt.append([tok if m else IGNORE_INDEX for tok, m in zip(ids[1:], mask[1:])])
    width = max(1, max(len(r) for r in rows_in))
    input_ids = torch.full((len(rows_in), width), pad_id, dtype=torch.long)
    targets = torch.full((len(rows_in), width), IGNORE_INDEX, dtype=torch.long)
    for b, (inp, tgt) in enumerate(zip(rows_in, rows_tgt)):
        input_ids[b, : len(inp)] = torch.tensor(inp, dtype=torch.long)
        targets[b, : len(tgt)] = torch.tensor(tgt, dtype=torch.long)
    return input_ids, targets
