"""SFT with replayed pretraining text: which tokens carry loss, how the two losses combine and are logged."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from pydantic import ValidationError

from models.losses import IGNORE_INDEX
from tasks.eval.arithmetic import make_problems
from tasks.tokenizer.tokenize_shards import load_token_split
from tasks.training.metrics import ListSink
from tasks.training.sft.data import SftExample
from tasks.training.sft.stage import (SftExamples, check_replay_tokens, encode_examples, example_batches,
                                      sft_batch_tokens, sft_loss)
from tests.conftest import (sft_config, small_alphabet_bpe, tiny_llama, train_config, train_config_for,
                            write_token_shards)
from tests.helpers.training import train

pytestmark = pytest.mark.usefixtures("one_torch_thread")

VOCAB, SEQ, PAD = 64, 32, 0


@pytest.fixture(scope="module")
def examples() -> SftExamples:
    tok = small_alphabet_bpe(VOCAB)
    problems = make_problems(12, seed=0, max_operand=9, ops="+", split="sft")
    sft = [SftExample(source="arith", messages=p.messages(), locator=str(i)) for i, p in enumerate(problems)]
    encs, kept, rejected = encode_examples(tok, sft, seq_len=SEQ)
    assert len(encs) == 12 and not rejected
    return SftExamples(train=encs[:9], val=encs[9:], kept=kept, rejected=[])


@pytest.fixture
def tokens(tmp_path):
    return write_token_shards(tmp_path / "tokens", VOCAB)


def is_window_of(row: list[int], corpus: np.ndarray) -> bool:
    """Whether `row` appears contiguously in `corpus`."""
    starts = np.flatnonzero(corpus[: len(corpus) - len(row) + 1] == row[0])
    return any(corpus[s : s + len(row)].tolist() == row for s in starts)


def test_replay_rows_carry_loss_on_every_token_and_sft_rows_only_on_responses(examples, tokens):
    tcfg = train_config(seq_len=SEQ, micro_batch_size=8)
    train_batches, eval_batches = example_batches(examples, tcfg, PAD, replay_rows=3, replay_tokens_dir=tokens)
    train_tokens = np.asarray(load_token_split(tokens, "train"))
    val_tokens = np.asarray(load_token_split(tokens, "val"))
    for batches, corpus, encs in ((train_batches, train_tokens, examples.train), (eval_batches, val_tokens, examples.val)):
        batch = batches(1, 0, 1)
        (chat_in, chat_tgt), (replay_in, replay_tgt) = batch["chat"], batch["replay"]
        # 5 SFT rows padded to their longest, 3 full windows of the split's pretraining text.
        assert chat_in.shape[0] == 5 and chat_in.shape[1] < SEQ and replay_in.shape == replay_tgt.shape == (3, SEQ)
        assert bool((replay_tgt != IGNORE_INDEX).all())
        assert torch.equal(replay_in[:, 1:], replay_tgt[:, :-1])  # plain next-token targets
        assert all(is_window_of(row + [t[-1]], corpus) for row, t in zip(replay_in.tolist(), replay_tgt.tolist()))
        for row, tgt in zip(chat_in.tolist(), chat_tgt.tolist()):
            enc = next(e for e in encs if e.ids[:-1] == row[: len(e.ids) - 1])
            expected = [enc.ids[t + 1] if enc.loss_mask[t + 1] else IGNORE_INDEX for t in range(len(enc.ids) - 1)]
            assert tgt == expected + [IGNORE_INDEX] * (len(row) - len(expected))
            assert 0 < sum(t != IGNORE_INDEX for t in tgt) < len(enc.ids) - 1  # the answer and <|end|>, not the prompt
        assert sft_batch_tokens(batch) == chat_in.numel() + replay_in.numel()
    # Without replay the batches are what SFT always made: micro_batch_size conversations.
    plain, _ = example_batches(examples, tcfg, PAD)
    assert isinstance(plain(0, 0, 1), tuple) and plain(0, 0, 1)[0].shape[0] == 8


def test_loss_weighs_the_two_means_by_their_rows(examples, tokens):
    tcfg = train_config(seq_len=SEQ, micro_batch_size=8)
    batch = example_batches(examples, tcfg, PAD, replay_rows=2, replay_tokens_dir=tokens)[0](0, 0, 1)
    model = tiny_llama(VOCAB)
    loss, parts = sft_loss(model, batch)
    assert set(parts) == {"sft_loss", "replay_loss"} and not any(p.requires_grad for p in parts.values())

    def ce(inputs, targets):
        logits, valid = model(inputs), targets != IGNORE_INDEX
        return F.cross_entropy(logits[valid], targets[valid])

    chat, replay = ce(*batch["chat"]), ce(*batch["replay"])
    assert parts["sft_loss"] == pytest.approx(chat.item(), abs=1e-5)
    assert parts["replay_loss"] == pytest.approx(replay.item(), abs=1e-5)
    assert loss.item() == pytest.approx((6 * chat.item() + 2 * replay.item()) / 8, abs=1e-5)
    loss.backward()
    assert model.embed.weight.grad is not None


def test_the_loop_logs_both_losses_by_step(examples, tokens, tmp_path):
    cfg = train_config_for(seq_len=SEQ, micro_batch_size=4, max_steps=4, log_every=1, eval_every=2)
    batches = example_batches(examples, cfg, PAD, replay_rows=1, replay_tokens_dir=tokens)
    sink = ListSink()
    result = train(tiny_llama(VOCAB, max_seq_len=SEQ), cfg, *batches, sft_loss, tmp_path / "ckpt", sink,
                   batch_tokens=sft_batch_tokens)
    steps, losses = sink.series("loss")
    _, sft = sink.series("sft_loss")
    _, replay = sink.series("replay_loss")
    assert steps == [1, 2, 3, 4] and len(sft) == len(replay) == 4
    for loss, s, r in zip(losses, sft, replay):
        assert loss == pytest.approx((3 * s + r) / 4)
    val_steps, val_replay = sink.series("val_replay_loss")
    assert val_steps == [2, 4] and len(sink.series("val_sft_loss")[1]) == 2
    assert result.final_val_parts == {"sft_loss": sink.series("val_sft_loss")[1][-1], "replay_loss": val_replay[-1]}


def test_replay_settings_are_checked(tokens, tmp_path):
    assert sft_config(micro_batch_size=16, replay_fraction=0.25).replay_rows == 4
    assert sft_config().replay_fraction == 0 and sft_config().replay_rows == 0
    with pytest.raises(ValidationError, match="0 replayed sequence"):
        sft_config(micro_batch_size=16, replay_fraction=0.01)
    with pytest.raises(ValidationError, match="4 replayed sequence"):
        sft_config(micro_batch_size=4, replay_fraction=0.9)  # no SFT row left
    cfg = sft_config(micro_batch_size=8, replay_fraction=0.5)
    assert check_replay_tokens(sft_config(), None, VOCAB) is None
    assert check_replay_tokens(cfg, tokens, VOCAB) == tokens.resolve()
    with pytest.raises(ValueError, match="no token shards were given"):
        check_replay_tokens(cfg, None, VOCAB)
    with pytest.raises(ValueError, match="64-token vocabulary but the base model has 32"):
        check_replay_tokens(cfg, tokens, 32)
    with pytest.raises(FileNotFoundError, match="index.json"):
        check_replay_tokens(cfg, tmp_path, VOCAB)
