"""Secrets never reach MLflow: which config keys name a secret, and how a value is hidden.

A key is judged on whole segments of each of its parts, so `hub.token` and `db.password`
are secrets while `max_new_tokens` and `bos_token` are not; a URI keeps everything but its
`user:password@`.
"""
from __future__ import annotations

import re

# Key segments that name a secret wherever they appear (`db.password`, `secret_sauce`, `client_secret`).
_SECRET_SEGMENTS = frozenset(
    {"password", "passwd", "passphrase", "secret", "secrets", "credential", "credentials", "apikey"}
)
_SECRET_PAIRS = frozenset({("api", "key"), ("private", "key")})
# `token` is a secret as the last segment of a key part (`hub.token`, `hf_token`, `accessToken`),
# except after these words, where it is a piece of the vocabulary (`bos_token`, `pad_token`).
_VOCAB_TOKEN_WORDS = frozenset(
    {"bos", "eos", "pad", "unk", "sep", "cls", "mask", "special", "start", "end", "stop", "eot", "im"}
)
_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])")
_URI_USERINFO = re.compile(r"(?P<scheme>[a-zA-Z][a-zA-Z0-9+.-]*://)[^/@\s]+@")


def is_secret_key(key: str) -> bool:
    """Whether a (dotted) config key names a secret, judged on whole segments of each part:
    `hub.token`, `hf_token`, `db.password`, `api_key`, `secret_sauce` are; `max_new_tokens`,
    `tokenizer.vocab_size`, `bos_token` are not."""
    for part in key.split("."):
        words = [w for w in re.split(r"[^a-z0-9]+", _CAMEL.sub("_", part).lower()) if w]
        if _SECRET_SEGMENTS.intersection(words) or _SECRET_PAIRS.intersection(zip(words, words[1:])):
            return True
        if words and words[-1] == "token" and (len(words) == 1 or words[-2] not in _VOCAB_TOKEN_WORDS):
            return True
    return False


def redact(key: str, value: str) -> str:
    """Never write secrets to MLflow: blank secret-named keys and user:password in URIs."""
    if is_secret_key(key):
        return "***"
    return _URI_USERINFO.sub(r"\g<scheme>***@", value)
