"""A target file's texts (a .jsonl with a `text` per line, or a .txt of blank-line separated paragraphs), read and
checked without torch, so that a command refuses a bad target before any work (flows/ablation_spec.py, the mix
search's targets)."""
from __future__ import annotations

import json
from pathlib import Path

from infra.config import ConfigError


def read_target(path: Path) -> list[str]:
    """The texts of a target file: each line's `text` of a .jsonl, or a .txt file's paragraphs (blank-line separated)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"target {path} does not exist: give a .jsonl with a `text` field or a .txt file")
    if path.suffix == ".txt":
        texts = [p.strip() for p in path.read_text(encoding="utf-8").split("\n\n")]
    elif path.suffix in (".jsonl", ".json"):
        texts = []
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}:{n}: not a JSON line ({exc.msg})") from exc
            if not isinstance(row, dict) or not isinstance(row.get("text"), str):
                raise ValueError(f"{path}:{n}: a target line needs a string `text` field")
            texts.append(row["text"])
    else:
        raise ValueError(f"target {path}: unknown kind '{path.suffix}'; give a .jsonl (a `text` field per line) or .txt")
    texts = [t for t in texts if t]
    if not texts:
        raise ValueError(f"target {path} holds no text")
    return texts


def check_target_file(path: Path, what: str) -> None:
    """A ConfigError starting with `what` unless `path` reads as a target with text."""
    try:
        read_target(path)
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{what}: {exc}") from None
