"""infra.tracking.redaction: secrets judged by whole key segments, credentials cut out of URIs."""
from __future__ import annotations

import pytest

from infra.tracking.redaction import redact

SECRET_KEYS = [
    "hub.token", "token", "hf_token", "HF_TOKEN", "auth_token", "access_token", "hub.accessToken",
    "api_key", "apiKey", "apikey", "openai.api_key", "db.password", "passwd", "secret", "secret_sauce",
    "secret_key", "client_secret", "credential", "aws.credentials", "ssh.private_key",
]
PLAIN_KEYS = [
    "pretrain.tokenizer.vocab_size", "pretrain.tokenizer.seed", "pretrain.tokenize.batch_size",
    "data.mix.tokenizer", "grpo.max_new_tokens", "eval.max_tokens", "eval.max_new_tokens",
    "eval.temperature_tokens", "tokenizer.bos_token", "model.pad_token_id", "train.tokens_per_step",
    "keyboard_layout", "db.port",
]


@pytest.mark.parametrize("key", SECRET_KEYS)
def test_secret_named_keys_are_redacted(key) -> None:
    assert redact(key, "s3cr3t") == "***"


@pytest.mark.parametrize("key", PLAIN_KEYS)
def test_keys_that_only_contain_a_secret_word_are_kept(key) -> None:
    assert redact(key, "512") == "512"


def test_uri_userinfo_is_still_redacted() -> None:
    assert redact("tracking.uri", "https://bob:pa55@mlflow.example/") == "https://***@mlflow.example/"
