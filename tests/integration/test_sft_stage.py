"""SFT stage: the masked chat batches, and a tiny end-to-end run through the real DeepSpeed launcher.

The end-to-end run is tests/helpers/references.py's `sft_reference` (a tiny byte-level BPE tokenizer and
a tiny Transformer, real DeepSpeed on one CPU rank, a real MLflow SQLite store in its workspace), shared
with the SFT kill test.
"""
from __future__ import annotations

import json
import os

import pytest
import torch
from tokenizers import Tokenizer

os.environ.setdefault("DS_ACCELERATOR", "cpu")

from models.chat_template import encode_chat  # noqa: E402
from models.export import load_model  # noqa: E402
from models.llama import ModelConfig, Transformer  # noqa: E402
from models.losses import IGNORE_INDEX  # noqa: E402
from tasks.eval.arithmetic import make_problems  # noqa: E402
from tasks.training.config import ArithmeticSftOptions  # noqa: E402
from tasks.training.config import SftDataConfig  # noqa: E402
from tasks.training.sft.data import SftExample  # noqa: E402
from tasks.training.sft.stage import chat_batches, encode_examples, sft_loss, sft_sources  # noqa: E402
from tests.conftest import sft_config, small_alphabet_bpe  # noqa: E402
from tests.helpers.references import sft_reference  # noqa: E402,F401 - the shared SFT run

PAD = 0


@pytest.fixture(scope="module")
def tok() -> Tokenizer:
    return small_alphabet_bpe(64)


def arithmetic_examples(n: int) -> list[SftExample]:
    return [SftExample(source="arith", messages=p.messages(), locator=str(i))
            for i, p in enumerate(make_problems(n, seed=0, max_operand=9, ops="+-", split="sft"))]


def test_batches_mask_everything_but_assistant_tokens(tok):
    examples = arithmetic_examples(10)
    # A two-turn conversation: the first answer is trained on too, the second question is not.
    examples.append(SftExample(source="chat", messages=[
        {"role": "user", "content": "What is 1 + 1?"}, {"role": "assistant", "content": "<answer>2</answer>"},
        {"role": "user", "content": "abc"}, {"role": "assistant", "content": "xyz"}]))
    encs, kept, rejected = encode_examples(tok, examples, seq_len=64)
    assert len(encs) == 11 and not rejected
    lengths = {len(e.ids) for e in encs}
    assert len(lengths) > 1  # rows of different lengths, so some are padded
    batches = chat_batches(encs, batch_size=11, pad_id=PAD, seq_len=64, seed=3)
    inputs, targets = batches(0, 0, 1)
    assert inputs.shape == targets.shape and inputs.shape[1] == max(lengths) - 1
    seen = 0
    for b in range(inputs.shape[0]):
        row = inputs[b].tolist()
        # Identify the encoding by its prefix (each example appears exactly once in an epoch).
        enc = next(e for e in encs if e.ids[:-1] == row[: len(e.ids) - 1] and all(t == PAD for t in row[len(e.ids) - 1:]))
        n = len(enc.ids) - 1
        expected = [enc.ids[t + 1] if enc.loss_mask[t + 1] else IGNORE_INDEX for t in range(n)] + [IGNORE_INDEX] * (len(row) - n)
        assert targets[b].tolist() == expected
        # Trained positions are exactly the assistant contents and their closing <|end|>.
        answers = [m["content"] for m in enc_messages(examples, enc, tok) if m["role"] == "assistant"]
        n_assistant = sum(len(tok.encode(a, add_special_tokens=False).ids) + 1 for a in answers)
        assert int((targets[b] != IGNORE_INDEX).sum()) == n_assistant
        seen += 1
    assert seen == 11

    # The loss is the mean cross-entropy over those positions only.
    torch.manual_seed(0)
    model = Transformer(ModelConfig(vocab_size=tok.get_vocab_size(), dim=32, n_layers=1, n_heads=2, n_kv_heads=1,
                                    ffn_hidden=64, max_seq_len=64))
    with torch.no_grad():
        logits = model(inputs)
        valid = targets != IGNORE_INDEX
        ce = torch.nn.functional.cross_entropy(logits[valid], targets[valid])
        assert torch.allclose(sft_loss(model, (inputs, targets)), ce, atol=1e-5)
        # What sits in the padding never reaches a trained position (causal attention, right padding).
        repadded = inputs.masked_fill(inputs == PAD, 7)
        assert torch.allclose(sft_loss(model, (repadded, targets)), sft_loss(model, (inputs, targets)), atol=1e-6)


def enc_messages(examples: list[SftExample], enc, tok) -> list[dict]:
    return next(ex.messages for ex in examples if encode_chat(tok, ex.messages).ids == enc.ids)


def test_batches_are_pure_and_cover_each_epoch(tok):
    encs, _, _ = encode_examples(tok, arithmetic_examples(12), seq_len=64)
    batches = chat_batches(encs, batch_size=3, pad_id=PAD, seq_len=64, seed=1)
    again = chat_batches(encs, batch_size=3, pad_id=PAD, seq_len=64, seed=1)
    # Pure in (i, rank, world): a fresh function (as after a resume) gives the same tensors.
    for i in (0, 5, 2):
        for rank in (0, 1):
            assert all(torch.equal(x, y) for x, y in zip(batches(i, rank, 2), again(i, rank, 2)))
    # Two ranks x 2 micro-batches x 3 rows = one epoch of 12: every example exactly once.
    rows = []
    for i in range(2):
        for rank in range(2):
            inputs, _ = batches(i, rank, 2)
            rows += [tuple(t for t in r.tolist()) for r in inputs]
    prefixes = sorted(tuple(e.ids[:-1]) for e in encs)
    assert sorted(tuple(r[: len(p)]) for r, p in zip(sorted(rows), prefixes)) == prefixes
    assert not all(torch.equal(x, y) for x, y in zip(batches(0, 0, 1), chat_batches(encs, 3, PAD, 64, seed=2)(0, 0, 1)))


def test_too_long_examples_are_rejected_not_truncated(tok):
    long = SftExample(source="s", messages=[{"role": "user", "content": "abc " * 40},
                                            {"role": "assistant", "content": "xyz"}], locator="long")
    forged = SftExample(source="s", messages=[{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}],
                        locator="ok")
    encs, kept, rejected = encode_examples(tok, [long, forged], seq_len=16)
    assert kept == [forged] and [r["reason"] for r in rejected] == ["exceeds_seq_len"]
    assert rejected[0]["locator"] == "long"


def test_source_selection():
    data = SftDataConfig(builtin=["arithmetic"], arithmetic=ArithmeticSftOptions(n=30, abstain_n=2), max_examples=10)
    (src,) = sft_sources(data)
    assert src.arithmetic.n == 30 and src.arithmetic.abstain_n == 2 and src.max_examples == 10
    with pytest.raises(ValueError, match="not defined"):
        sft_sources(SftDataConfig(builtin=["arithmetic"], sources=["nope"]))
    with pytest.raises(ValueError, match="extra"):
        sft_config(lr=1e-3, learning_rate=1)
    cfg = sft_config()
    assert cfg.optim.lr < 3e-4 and cfg.optim.warmup_steps <= 10  # fine-tuning defaults below pretraining's


@pytest.mark.slow
def test_sft_end_to_end_through_the_launcher(sft_reference):  # noqa: F811
    """The shared SFT run (tests/helpers/references.py): a catalog with good records, a malformed line and one
    record too long for seq_len; two of each micro-batch's eight rows replay pretraining text."""
    ref = sft_reference
    result, out, lines_seen = ref.result, ref.out, ref.lines
    base = load_model(ref.inputs["base"])

    saved = json.loads((out / "result.json").read_text())
    assert saved["steps"] == 30 and saved["world_size"] == 1
    assert result.examples_train + result.examples_val == 40 and result.examples_val > 0
    assert result.rejected == {"exceeds_seq_len": 1, "malformed_json": 1}
    reasons = [json.loads(line)["reason"] for line in (out / "rejected.jsonl").read_text().splitlines()]
    assert sorted(reasons) == ["exceeds_seq_len", "malformed_json"]
    assert result.final_train_loss is not None and result.final_val_loss is not None
    assert result.final_replay_val_loss is not None and result.final_replay_val_ppl is not None
    first_loss = next(float(s.split("loss ")[1].split()[0]) for s in lines_seen if s.startswith("step 10/"))
    assert result.final_train_loss < first_loss  # it learned something
    tuned = load_model(result.model_dir)
    assert not torch.equal(tuned.embed.weight, base.embed.weight)
    assert (result.hf_dir / "config.json").is_file() and (result.hf_dir / "tokenizer.json").is_file()

    import mlflow

    from infra.tracking.store import tracking_uri
    from infra.workspace.paths import Workspace

    client = mlflow.MlflowClient(tracking_uri(Workspace.locate(ref.ws)))
    run = client.get_run(result.mlflow_run_id)
    assert {"loss", "lr", "grad_norm", "tokens_per_s", "val_loss", "final_val_loss"} <= set(run.data.metrics)
    assert {"sft_loss", "replay_loss", "val_sft_loss", "val_replay_loss", "final_replay_val_ppl"} <= set(run.data.metrics)
    assert run.data.tags["llmforge.stage"] == "sft"
