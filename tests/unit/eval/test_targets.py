"""Targets: read raw, tokenized with EOS between texts into whole windows, scored per window in nats and bytes."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from models.bpb import token_bytes
from models.losses import next_token_loss
from models.special_tokens import EOS
from tasks.eval.target_files import read_target
from tasks.eval.targets import score_windows, target_windows
from tests.conftest import bpe_tokenizer_on, tiny_llama

TEXTS = ["The river rose in the night and the town woke to water.", "Prices fell for a third month.",
         "A play in three acts, <|eos|> written as text.", "Rain again on Tuesday; the roads closed."] * 6


def test_reads_jsonl_text_fields_and_txt_paragraphs(tmp_path):
    (tmp_path / "t.jsonl").write_text("\n".join(json.dumps({"text": t, "id": i}) for i, t in enumerate(TEXTS[:3])) + "\n\n")
    assert read_target(tmp_path / "t.jsonl") == TEXTS[:3]
    (tmp_path / "t.txt").write_text("first paragraph\nstill first\n\nsecond\n\n\n")
    assert read_target(tmp_path / "t.txt") == ["first paragraph\nstill first", "second"]


@pytest.mark.parametrize("content, suffix, match", [
    ('{"txt": "x"}\n', ".jsonl", "string `text` field"), ("not json\n", ".jsonl", "not a JSON line"),
    ("x", ".csv", "unknown kind"), ("\n\n", ".txt", "holds no text")])
def test_a_bad_target_names_what_to_fix(tmp_path, content, suffix, match):
    path = tmp_path / f"t{suffix}"
    path.write_text(content)
    with pytest.raises(ValueError, match=match):
        read_target(path)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        read_target(tmp_path / "missing.jsonl")


def test_windows_are_whole_with_eos_after_each_text_and_special_text_kept():
    tok = bpe_tokenizer_on(TEXTS, 300)
    windows = target_windows(TEXTS, tok, seq_len=15)
    eos = tok.token_to_id(EOS)
    flat = [i for t in TEXTS for i in (*tok.encode(t).ids, eos)]
    assert windows.shape[1] == 16 and windows.shape[0] == len(flat) // 16
    assert windows.reshape(-1).tolist() == flat[: windows.size]
    assert (windows == eos).sum() <= len(TEXTS)  # "<|eos|>" inside a text did not become a separator
    with pytest.raises(ValueError, match="fill no window"):
        target_windows(["short"], tok, seq_len=500)


def test_scores_sum_to_the_models_mean_loss():
    tok = bpe_tokenizer_on(TEXTS, 300)
    windows = target_windows(TEXTS, tok, seq_len=15)
    model = tiny_llama(vocab=tok.get_vocab_size(), seed=0)
    table = token_bytes(tok)
    scores = score_windows(model, windows, table, batch=4)
    assert scores.shape == (len(windows), 2) and (scores[:, 1] > 0).all()
    rows = torch.as_tensor(windows)
    targets = rows[:, 1:].clone()
    targets[torch.as_tensor(table)[targets] == 0] = -100  # special tokens count neither nats nor bytes
    with torch.no_grad():
        mean_nats = float(next_token_loss(model(rows[:, :-1]), targets))
    counted = int((targets != -100).sum())
    assert scores[:, 0].sum() / counted == pytest.approx(mean_nats, rel=1e-5)
    assert np.isfinite(scores).all() and scores[:, 0].sum() / (math.log(2) * scores[:, 1].sum()) > 0
