"""What an SFT read made of each source: records read, examples kept, and one count per rejection reason."""
from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from tasks.training.sft.data import SftExample


def sft_counts(examples: Sequence[SftExample], rejected: Sequence[dict]) -> dict[str, dict[str, int]]:
    """Per source: records read ("in"), examples kept ("out") and one count per rejection reason."""
    kept = Counter(e.source for e in examples)
    reasons: dict[str, Counter] = {}
    for r in rejected:
        reasons.setdefault(r["source"], Counter())[r["reason"]] += 1
    out: dict[str, dict[str, int]] = {}
    for src in sorted(set(kept) | set(reasons)):
        c = reasons.get(src, Counter())
        out[src] = {"in": kept[src] + sum(c.values()), "out": kept[src], **dict(sorted(c.items()))}
    return out
