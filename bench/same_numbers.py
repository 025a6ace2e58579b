"""Did a change keep a run's numbers? Two `llmforge run` outputs compared step by step, and their report cards.

    llmforge run --preset tiny > before.log 2>&1      # at the old commit, in its own clone
    llmforge run --preset tiny > after.log 2>&1       # at the new commit (the same settings in its keys)
    .venv/bin/python bench/same_numbers.py before.log after.log --reports OLD/report.md NEW/report.md

For pretraining, SFT and GRPO it compares every value both logs printed for the same step (training
lines and validations), at the fewer digits of the two; the learning rate, throughput and times
are left out. With `--reports` it checks that every number of the first report card (its wall
time aside) is also in the second, which may have more rows. Exit status 1 when anything differs.
"""
from __future__ import annotations

import argparse
import re
import sys
from collections import Counter
from pathlib import Path

STAGES = ("pretrain", "sft", "grpo")
ALIAS = {"reward": "reward_mean", "acc": "accuracy", "len": "completion_len"}  # GRPO's names in older logs
SKIP = {"lr", "elapsed", "mfu"}
STEP = re.compile(r"Task run '(pretrain|sft|grpo)[^']*' - step (\d+)(/\d+)?:? (.*)")
VALUE = re.compile(r"([a-z_]+) (-?\d+\.\d+(?:e-?\d+)?)")


def logged_steps(log: Path) -> dict[str, dict[tuple[str, int], dict[str, str]]]:
    """Per stage, per (train|eval, step): the values the log printed, as printed."""
    out: dict[str, dict[tuple[str, int], dict[str, str]]] = {s: {} for s in STAGES}
    for line in log.read_text(errors="replace").splitlines():
        m = STEP.search(line)
        if not m:
            continue
        stage, step, kind = m.group(1), int(m.group(2)), "train" if m.group(3) else "eval"
        rest = re.split(r" [\d,]+ tok/s| \d+\.\d+s \(| \(elapsed", m.group(4))[0]
        values = {ALIAS.get(k, k): v for k, v in VALUE.findall(rest) if k not in SKIP}
        out[stage].setdefault((kind, step), {}).update(values)
    return out


def same(x: str, y: str) -> bool:
    """Equal at the fewer decimal digits of the two printed values."""
    digits = min(len(v.split(".")[1]) if "." in v and "e" not in v else 6 for v in (x, y))
    return round(float(x), digits) == round(float(y), digits)


def compare_steps(before: Path, after: Path) -> int:
    a, b = logged_steps(before), logged_steps(after)
    differing = 0
    for stage in STAGES:
        both = sorted(k for k in a[stage] if k in b[stage])
        pairs = [(k, n, a[stage][k][n], b[stage][k][n]) for k in both for n in sorted(set(a[stage][k]) & set(b[stage][k]))]
        diffs = [p for p in pairs if not same(p[2], p[3])]
        differing += len(diffs)
        print(f"{stage}: {len(a[stage])} and {len(b[stage])} logged steps and validations, {len(both)} in both, "
              f"{len(pairs)} values compared, {len(diffs)} differ")
        for (kind, step), name, x, y in diffs[:8]:
            print(f"    {kind} step {step} {name}: {x} -> {y}")
    return differing


def report_numbers(path: Path) -> Counter[str]:
    text = re.sub(r"pipeline wall time[^\n]*|\| [a-z]+ \| \d+\.\d+ min \|[^\n]*", "", path.read_text())
    return Counter(re.findall(r"-?\d+\.\d+|\b\d+/\d+\b", text))


def compare_reports(before: Path, after: Path) -> int:
    a, b = report_numbers(before), report_numbers(after)
    missing = a - b
    print(f"report cards: {sum(a.values())} numbers in the first, {sum(missing.values())} of them not in the second"
          + (f": {dict(missing)}" if missing else ""))
    return sum(missing.values())


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("before", type=Path, help="the first run's output (llmforge run ... > before.log 2>&1)")
    p.add_argument("after", type=Path, help="the second run's output")
    p.add_argument("--reports", type=Path, nargs=2, metavar=("BEFORE", "AFTER"), help="their report.md files")
    args = p.parse_args(argv)
    differing = compare_steps(args.before, args.after)
    if args.reports:
        differing += compare_reports(*args.reports)
    return 1 if differing else 0


if __name__ == "__main__":
    sys.exit(main())
