"""Quality filter speed: the current rules against the implementation before the batch rewrite, in one run.

    python bench/quality.py                 # ~10k documents, 3 rounds, prints docs per CPU-second
    python bench/quality.py --prose 4000 --rounds 5

The baseline is the quality-rule package as of BASELINE_COMMIT, read from git into a
temporary package (no copy of it lives in the tree). Both judge the same documents in
batches of the stage's size, alternating round by round, timed in CPU seconds of this
process. The corpus is the built-in one (python_docs under its catalog filters,
python_stdlib under the code set) plus generated prose, clean and repetitive, under the
default prose set, so every rule runs on many documents.
"""
from __future__ import annotations

import argparse
import importlib
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType
from typing import Any, Callable

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tasks.data.quality_filter import BATCH_ROWS  # noqa: E402

# The baseline: a commit whose tasks/data/quality_rules judges documents one at a time (before the batch rewrite).
BASELINE_COMMIT = "afaffc92a7a2b1364d1eb3c3730e9b702df5cb00"
_MODULES = ["__init__", "rule", "gopher", "c4", "fineweb", "code"]
STOP_WORDS = ["the", "be", "to", "of", "and", "that", "have", "with", "a", "in", "is", "it", "for", "on", "as", "was"]


def load_baseline(commit: str = BASELINE_COMMIT) -> ModuleType:
    """The quality_rules package as of `commit`, imported as `baseline_quality_rules`.

    Raises FileNotFoundError naming the commit when the checkout lacks it (a shallow clone).
    """
    name = "baseline_quality_rules"
    if name in sys.modules:
        return sys.modules[name]
    folder = Path(tempfile.mkdtemp(prefix="quality-baseline-")) / name
    folder.mkdir()
    for mod in _MODULES:
        path = f"tasks/data/quality_rules/{mod}.py"
        done = subprocess.run(["git", "-C", str(ROOT), "show", f"{commit}:{path}"], capture_output=True, text=True)
        if done.returncode != 0:
            raise FileNotFoundError(f"{path} at commit {commit} is not in this checkout: fetch the full history ({done.stderr.strip()})")
        (folder / f"{mod}.py").write_text(done.stdout.replace("tasks.data.quality_rules", name))
    sys.path.insert(0, str(folder.parent))
    try:
        return importlib.import_module(name)
    finally:
        sys.path.remove(str(folder.parent))


def synthetic_prose(n: int, seed: int = 0) -> list[str]:
    """`n` English-like pages, one paragraph per line; a fifth of them repetitive in one of Gopher's ways."""
    rng = np.random.default_rng(seed)
    letters = np.array(list("abcdefghijklmnopqrstuvwxyz"))
    vocab = STOP_WORDS + ["".join(rng.choice(letters, size=int(rng.integers(2, 11)))) for _ in range(20000)]
    weights = 1.0 / np.arange(1, len(vocab) + 1) ** 1.0
    weights /= weights.sum()
    flat = rng.choice(len(vocab), size=n * 400, p=weights).tolist()
    pos = 0

    def sentence() -> str:
        nonlocal pos
        k = int(rng.integers(6, 22))
        words = [vocab[i] for i in flat[pos : pos + k]]
        pos = (pos + k) % (len(flat) - 30)
        end = "." if rng.random() < 0.85 else rng.choice(["?", "!", '"', ""])
        return " ".join(words).capitalize() + end

    out = []
    for _ in range(n):
        lines = [" ".join(sentence() for _ in range(int(rng.integers(1, 4)))) for _ in range(int(rng.integers(4, 14)))]
        kind = rng.random()
        if kind < 0.05:  # repeated lines
            lines = lines + lines[: len(lines) // 2]
        elif kind < 0.10:  # a spammed phrase
            lines.insert(1, " ".join(["buy cheap pills now"] * int(rng.integers(5, 30))) + ".")
        elif kind < 0.15:  # a repeated passage inside a line
            lines[0] = lines[0] + " " + lines[0]
        elif kind < 0.20:  # a menu
            lines = [f"Home {i}" for i in range(8)] + lines
        out.append("\n".join(lines))
    return out


def corpus(n_prose: int, seed: int = 0) -> tuple[list[str], list[str], dict[str, dict[str, Any]]]:
    """(sources, texts, filter specs as dicts): built-in docs and stdlib, and generated web prose."""
    import yaml

    from tasks.data.builtin_corpus import python_docs, python_stdlib

    docs = [t for _, _, t in python_docs()]
    code = [b.decode("utf-8", errors="replace") for _, _, b in python_stdlib()]
    prose = synthetic_prose(n_prose, seed)
    specs = {
        "python_docs": yaml.safe_load((ROOT / "data_catalog/python_docs.yaml").read_text())["filters"],
        "python_stdlib": {"filter_set": "code"},
        "web": {},
    }
    sources = ["python_docs"] * len(docs) + ["python_stdlib"] * len(code) + ["web"] * len(prose)
    return sources, docs + code + prose, specs


def batches(sources: list[str], texts: list[str]):
    for a in range(0, len(texts), BATCH_ROWS):
        yield sources[a : a + BATCH_ROWS], texts[a : a + BATCH_ROWS]


def decisions_new(sources: list[str], texts: list[str], specs: dict[str, dict[str, Any]]) -> list:
    from tasks.data.quality_rules import FilterSpec, judge_batch

    typed = {k: FilterSpec.model_validate(v) for k, v in specs.items()}
    out = []
    for s, t in batches(sources, texts):
        out += judge_batch(typed, s, t).verdicts
    return out


def decisions_old(sources: list[str], texts: list[str], specs: dict[str, dict[str, Any]]) -> list:
    old = load_baseline()
    typed = {k: old.FilterSpec.model_validate(v) for k, v in specs.items()}
    out = []
    for s, t in batches(sources, texts):
        out += old.judge_batch(typed, s, t)
    return out


def cpu_seconds(fn: Callable, *args) -> tuple[float, Any]:
    start = time.process_time()
    result = fn(*args)
    return time.process_time() - start, result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--prose", type=int, default=8000, help="generated web pages (beside the built-in corpus)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--min-speedup", type=float, default=0.0, help="exit 1 when new/old docs per CPU-second is below this")
    args = p.parse_args(argv)
    sources, texts, specs = corpus(args.prose, args.seed)
    load_baseline()
    decisions_new(sources[:50], texts[:50], specs)  # warm up imports and caches of both
    decisions_old(sources[:50], texts[:50], specs)
    old_s = new_s = 0.0
    for _ in range(args.rounds):
        s, old = cpu_seconds(decisions_old, sources, texts, specs)
        old_s += s
        s, new = cpu_seconds(decisions_new, sources, texts, specs)
        new_s += s
    n = len(texts) * args.rounds
    same = sum((a or (None,))[0] == (b or (None,))[0] for a, b in zip(old, new))
    print(f"documents: {len(texts)} ({sources.count('python_docs')} python_docs, {sources.count('python_stdlib')} "
          f"python_stdlib, {sources.count('web')} generated prose), {args.rounds} rounds, batches of {BATCH_ROWS}")
    print(f"baseline ({BASELINE_COMMIT[:8]}): {n / old_s:,.0f} docs per CPU-second ({old_s:.2f} CPU-s)")
    print(f"current:            {n / new_s:,.0f} docs per CPU-second ({new_s:.2f} CPU-s)")
    speedup = old_s / new_s
    print(f"speedup: {speedup:.2f}x; same first failing rule on {same}/{len(texts)} documents "
          "(differences: the stop-word and C4 sentence corrections)")
    return 1 if speedup < args.min_speedup else 0


if __name__ == "__main__":
    sys.exit(main())
