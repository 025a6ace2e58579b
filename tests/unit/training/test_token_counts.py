"""Pretraining refuses a corpus too small for what it asks before any launch: one micro-batch of training windows,
and validation tokens (a window's worth when it validates), each message naming the setting to change."""
from __future__ import annotations

import pytest

from flows.config import load_pipeline_config
from infra.config import ConfigError
from tasks.training.pretrain.stage import check_token_counts


def test_too_few_training_tokens_for_one_micro_batch_is_refused_naming_the_batch():
    tiny = load_pipeline_config("tiny").pretrain  # 16 windows of 128 + 1 tokens
    with pytest.raises(ConfigError, match=r"554 training tokens: 4 window\(s\).*pretrain.batch.micro_batch_size=16"):
        check_token_counts(tiny, 554, 500, 0.05)
    check_token_counts(tiny, 16 * 128 + 1, 500, 0.05)


def test_validation_tokens_are_needed_and_a_window_of_them_when_it_validates():
    tiny = load_pipeline_config("tiny").pretrain
    with pytest.raises(ConfigError, match="0 validation tokens.*raise tokenize.val_fraction"):
        check_token_counts(tiny, 10_000, 0, 0.05)
    with pytest.raises(ConfigError, match="50 validation tokens.*pretrain.log.eval_every=0"):
        check_token_counts(tiny, 10_000, 50, 0.05)
    no_eval = load_pipeline_config("tiny", {"pretrain.log.eval_every": 0}).pretrain
    check_token_counts(no_eval, 10_000, 50, 0.05)  # the unigram baseline needs a token, not a window
