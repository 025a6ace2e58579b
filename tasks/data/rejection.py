"""A record that cannot be used, and how it becomes a quarantined row.

Apart from the readers so the JSONL, text and Parquet readers share it without importing each other."""
from __future__ import annotations

from typing import Any

from tasks.data.documents import Removed


class Rejection(Exception):
    """A record that cannot be used; `reason` is a short machine-readable name.

    `raw` and `text` keep what was read, for the quarantine file."""

    def __init__(self, reason: str, detail: str = "", raw: bytes | None = None, text: str = ""):
        super().__init__(f"{reason}: {detail}")
        self.reason, self.detail, self.raw, self.text = reason, detail, raw, text

    @classmethod
    def with_prefix(cls, reason: str, detail: str, prefix: bytes) -> "Rejection":
        """A rejection that keeps the first bytes of what was read (raw, and as text for a reader)."""
        return cls(reason, detail, raw=prefix, text=prefix.decode("utf-8", "replace"))

    def removed(self, doc_id: str, source: Any, path: str, locator: str, stage: str) -> Removed:
        """This rejection as a quarantined row of `source` (a catalog source config)."""
        return Removed(
            doc_id=doc_id, source=source.name, text=self.text or "", stage=stage, reason=self.reason,
            licence=source.licence, path=path, locator=locator, detail=self.detail[:1000], raw=self.raw,
        )
