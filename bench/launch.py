"""A launch's own cost: ranks that only join the process group, started through our runner and through DeepSpeed's.

    DS_ACCELERATOR=cpu .venv/bin/python bench/launch.py             # 5 pairs of 2-rank launches, about 2 minutes
    DS_ACCELERATOR=cpu .venv/bin/python bench/launch.py --reps 3 --procs 1

Each pair runs the same command line twice, alternating which goes first: once with `python -m deepspeed.launcher.runner`
(the `deepspeed` script), once with `python -m infra.launch.runner` (what every stage launches: MLflow kept out of
the runner and the per-node launcher, the launcher looking at its ranks every 0.2 s, both ending without the
interpreter's teardown). The ranks are tests/helpers/op_loading_rank.py: they import DeepSpeed, join, and exit.
Prints each launch's wall seconds, the medians, and ours over DeepSpeed's with the pairs' spread.
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DS_ACCELERATOR", "cpu")

from infra.launch.launcher import free_port, launch_command, launch_env  # noqa: E402

RANK = "tests.helpers.op_loading_rank"
RUNNERS = {"deepspeed": [sys.executable, "-m", "deepspeed.launcher.runner"],
           "ours": [sys.executable, "-m", "infra.launch.runner"]}


def timed(runner: str, procs: int) -> float:
    cmd = launch_command(RANK, [], num_procs=procs, master_port=free_port())
    cmd = RUNNERS[runner] + cmd[3:]  # launch_command starts with our runner's three words
    t0 = time.perf_counter()
    out = subprocess.run(cmd, cwd=ROOT, env=launch_env(procs), capture_output=True, text=True, timeout=600)
    took = time.perf_counter() - t0
    if out.returncode != 0 or out.stdout.count(" joined") != procs:
        raise SystemExit(f"{runner} launch failed ({out.returncode}):\n{out.stdout[-2000:]}\n{out.stderr[-2000:]}")
    return took


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--reps", type=int, default=5, help="pairs of launches (default 5)")
    p.add_argument("--procs", type=int, default=2, help="ranks per launch (default 2)")
    args = p.parse_args(argv)
    assert launch_command(RANK, [])[:3] == RUNNERS["ours"]
    timed("ours", args.procs)  # warm-up: page cache, the op's build check
    seconds: dict[str, list[float]] = {"deepspeed": [], "ours": []}
    for rep in range(args.reps):
        order = ["deepspeed", "ours"] if rep % 2 == 0 else ["ours", "deepspeed"]
        for runner in order:
            seconds[runner].append(timed(runner, args.procs))
        print(f"pair {rep + 1}/{args.reps}: deepspeed {seconds['deepspeed'][-1]:.2f} s, ours {seconds['ours'][-1]:.2f} s",
              flush=True)
    ratios = [o / d for o, d in zip(seconds["ours"], seconds["deepspeed"])]
    med = {k: statistics.median(v) for k, v in seconds.items()}
    print(f"{args.procs}-rank launch, median of {args.reps}: DeepSpeed's runner {med['deepspeed']:.2f} s, ours "
          f"{med['ours']:.2f} s; ours / DeepSpeed's {statistics.median(ratios):.2f} (pairs {min(ratios):.2f}-"
          f"{max(ratios):.2f}), {med['deepspeed'] - med['ours']:.1f} s saved a launch; load "
          f"{os.getloadavg()[0]:.1f}, {os.cpu_count()} CPUs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
