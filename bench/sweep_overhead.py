"""How much of a flow of many runs is training: `llmforge scale` timed whole, beside a baseline commit's.

    python bench/sweep_overhead.py --flows scale --baseline 69cebfb --json sweep.json
    python bench/sweep_overhead.py --flows scale --baseline 69cebfb --set "scale.budgets=[1e11]" \
        --new-set runs.threads=2 --new-set runs.slots=1        # as the baseline trains: the same losses?

Each tree (this checkout, and the baseline commit read from git into a temporary worktree) runs in
its own fresh workspace, with this venv's Python and PYTHONPATH on the tree. A one-point sweep first
builds that workspace's data, tokenizer and token shards (untimed: they are the flow's inputs, not its
runs); then `scale --preset tiny` (plus --set) is timed whole, from the command's start to its exit.

    parts     where the runs' time outside their training steps went, part by part (from the log's timestamps)
    train_s   the sum, over every run of the sweep (its points and the predicted run), of the seconds that
              run spent inside its training steps: tokens_seen / train_tokens_per_s of its result.json
    slots     the runs in flight at once (the most launches the run queue started side by side; 1 before it)
    share     train_s / (wall_s x slots): the share of the machine's run slots spent training
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WARM_UP = ["--set", "scale.budgets=[1e10]", "--set", "scale.depths=[1]", "--set", "scale.sizes_per_budget=1",
           "--set", "scale.min_steps=0"]
_SIDE_BY_SIDE = re.compile(r"(\d+) launch\(es\) side by side")


def cpu_name() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines() if Path("/proc/cpuinfo").is_file() else []:
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown CPU"


def worktree(commit: str) -> Path:
    """`commit` checked out into a temporary folder (a detached git worktree)."""
    folder = Path(tempfile.mkdtemp(prefix=f"sweep-baseline-{commit[:8]}-"))
    done = subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(folder), commit],
                          capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"cannot check out {commit}: {done.stderr.strip()} (fetch the full history)")
    return folder


def cli(tree: Path, home: Path, args: list[str], log: Path) -> float:
    """`llmforge` of `tree` in workspace `home`; its wall seconds (raises with the log's tail on failure)."""
    env = {**os.environ, "LLMFORGE_HOME": str(home), "PYTHONPATH": str(tree)}
    env.pop("PREFECT_API_URL", None)
    start = time.perf_counter()
    with open(log, "a", encoding="utf-8") as out:
        rc = subprocess.run([sys.executable, "-m", "flows.cli", *args], cwd=tree, env=env, stdout=out,
                            stderr=subprocess.STDOUT).returncode
    wall = time.perf_counter() - start
    if rc != 0:
        tail = log.read_text(encoding="utf-8", errors="replace")[-3000:]
        raise SystemExit(f"`llmforge {' '.join(args)}` in {tree} failed ({rc}); {log}:\n{tail}")
    return wall


def sweep_runs(home: Path) -> list[dict]:
    """Every run's result.json of the workspace's latest sweep: its points, then the predicted run."""
    folder = home / "scale" / "latest"
    out_dirs = [p["out_dir"] for p in json.loads((folder / "points.json").read_text())]
    prediction = folder / "prediction.json"
    if prediction.is_file() and json.loads(prediction.read_text()).get("out_dir"):
        out_dirs.append(json.loads(prediction.read_text())["out_dir"])
    return [json.loads((Path(d) / "result.json").read_text()) for d in out_dirs]


_STAMP = re.compile(r"^(\d\d):(\d\d):(\d\d)\.(\d+) \|")
_LAST_STEP = re.compile(r"step (\d+)/(\d+) loss .*elapsed (?:(\d+)m)?(\d+)s")
PARTS = ("process start (runner, launcher, rank imports, init)", "engine build and first step", "final validation",
         "export, checkpoint, MLflow, exit", "stage side between runs")


def parts(log_text: str) -> dict[str, dict[str, float]]:
    """Where the timed sweep's runs spent their time outside their training steps, part by part, from Prefect's
    timestamps: each part's count, sum and median seconds. With the run queue the process start is once per
    launch, and a run's record is written beside the next run's training (no part of its own)."""
    lines = log_text.splitlines()
    lines = lines[max(i for i, line in enumerate(lines) if "Starting temporary server" in line):]
    queued = any("run(s) to train" in line for line in lines)
    runs: list[dict[str, float]] = []
    current: dict[str, float] = {}
    launched: list[float] = []  # launches not yet heard from, oldest first
    last = 0.0
    for line in lines:
        stamp = _STAMP.match(line)
        t = int(stamp[1]) * 3600 + int(stamp[2]) * 60 + int(stamp[3]) + int(stamp[4]) / 1000 if stamp else last
        last = t
        if "launching:" in line:
            launched.append(t)
            if not queued:
                launched.clear()
                current = {"launch": t}
                runs.append(current)
        elif re.search(r"training in (fp32|bf16)", line):
            if queued:
                current = {"ready": t} | ({"launch": launched.pop(0)} if launched else {})
                runs.append(current)
            else:
                current["ready"] = t
        elif (step := _LAST_STEP.search(line)) and step[1] == step[2] and current:
            current["last_step"], current["elapsed"] = t, int(step[3] or 0) * 60 + int(step[4])
        elif "val_loss" in line and current:
            current["val"] = t
        elif "run finished:" in line and current:
            current["done"] = t
        elif re.search(r"Task run 'pretrain-launch(-\d+)?' - Finished", line) and current:
            current["task_end"] = t
        elif re.search(r"(point \d+/\d+|predicted run) at C=.*depth", line) and runs and not queued:
            runs[-1]["next"] = t
    spans: dict[str, list[float]] = {name: [] for name in PARTS}
    for r in runs:
        end = r.get("done", r.get("task_end"))
        pairs = ((PARTS[0], r.get("launch"), r.get("ready")), (PARTS[2], r.get("last_step"), r.get("val")),
                 (PARTS[3], r.get("val"), end), (PARTS[4], r.get("task_end"), r.get("next")))
        for name, a, b in pairs:
            if a is not None and b is not None:
                spans[name].append(b - a)
        if "last_step" in r and "ready" in r:
            spans[PARTS[1]].append(max(0.0, r["last_step"] - r["ready"] - r["elapsed"]))
    return {name: {"n": len(v), "sum_s": round(sum(v), 1), "median_s": round(statistics.median(v), 2) if v else 0.0}
            for name, v in spans.items()}


def measure(tree: Path, sets: list[str], label: str, keep: Path) -> dict:
    home = Path(tempfile.mkdtemp(prefix=f"sweep-{label}-"))
    log = keep / f"{label}.log"
    log.unlink(missing_ok=True)
    try:
        cli(tree, home, ["scale", "--preset", "tiny", *WARM_UP], log)
        wall = cli(tree, home, ["scale", "--preset", "tiny", *[a for s in sets for a in ("--set", s)]], log)
        runs = [{**r, "train_tokens_per_s": r.get("train_tokens_per_s", r.get("tokens_per_s")),  # 69cebfb's names
                 "final_val_bpb": r.get("final_val_bpb", r.get("val_bpb"))} for r in sweep_runs(home)]
        train = sum(r["tokens_seen"] / r["train_tokens_per_s"] for r in runs if r.get("train_tokens_per_s"))
        prediction = json.loads((home / "scale" / "latest" / "prediction.json").read_text()) \
            if (home / "scale" / "latest" / "prediction.json").is_file() else {}
        slots = max([int(m) for m in _SIDE_BY_SIDE.findall(log.read_text(encoding="utf-8"))] or [1])
        return {"wall_s": round(wall, 1), "train_s": round(train, 1), "slots": slots,
                "share": round(train / (wall * slots), 3), "runs": len(runs),
                "runs_per_hour": round(len(runs) / wall * 3600, 1),
                "predicted_bpb": prediction.get("predicted_bpb"), "interval": prediction.get("interval"),
                "measured_bpb": prediction.get("measured_bpb"),
                "final_val_bpb": [r.get("final_val_bpb") for r in runs],
                "parts": parts(log.read_text(encoding="utf-8", errors="replace"))}
    finally:
        shutil.rmtree(home, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Time `llmforge scale` whole and the share of it spent training, "
                                                 "beside a baseline commit's, on this machine.")
    parser.add_argument("--flows", nargs="+", default=["scale"], choices=["scale"],
                        help="the flows of many runs to time (ablate and mix join when they exist)")
    parser.add_argument("--baseline", help="a commit whose code runs the same flow in the same session (e.g. 69cebfb)")
    parser.add_argument("--set", action="append", default=[], dest="sets", metavar="KEY=VALUE",
                        help="a config override for both runs (e.g. scale.budgets=[1e11])")
    parser.add_argument("--new-set", action="append", default=[], dest="new_sets", metavar="KEY=VALUE",
                        help="an override for this code's run only (e.g. runs.slots=1, a key the baseline lacks)")
    parser.add_argument("--json", type=Path, help="write the figures here")
    parser.add_argument("--logs", type=Path, default=Path(tempfile.gettempdir()) / "sweep_overhead",
                        help="where each run's output goes (default: %(default)s)")
    args = parser.parse_args(argv)
    args.logs.mkdir(parents=True, exist_ok=True)
    print(f"machine: {cpu_name()}, {os.cpu_count()} CPUs", flush=True)
    figures: dict = {"cpu": cpu_name(), "cpus": os.cpu_count(), "flows": {}}
    base_tree = worktree(args.baseline) if args.baseline else None
    try:
        for name in args.flows:
            base = measure(base_tree, args.sets, f"{name}-baseline", args.logs) if base_tree else None
            if base:
                print(f"{name} at {args.baseline}: {json.dumps(base)}", flush=True)
            new = measure(ROOT, args.sets + args.new_sets, f"{name}-new", args.logs)
            print(f"{name} now: {json.dumps(new)}", flush=True)
            row = {k: new[k] for k in ("wall_s", "train_s", "slots", "share", "runs_per_hour")}
            if base:
                row |= {"baseline_wall_s": base["wall_s"], "baseline_train_s": base["train_s"],
                        "baseline_share": base["share"], "speedup": round(base["wall_s"] / new["wall_s"], 2)}
                pairs = list(zip(new["final_val_bpb"], base["final_val_bpb"]))
                if len(new["final_val_bpb"]) == len(base["final_val_bpb"]) and all(a and b for a, b in pairs):
                    row["val_bpb_max_rel_diff"] = max(abs(a - b) / b for a, b in pairs)
                print(f"{name}: wall {new['wall_s']:.0f} s against {base['wall_s']:.0f} s "
                      f"({new['wall_s'] / base['wall_s']:.2f}x the time); share {new['share']:.2f} against "
                      f"{base['share']:.2f}; prediction {new['predicted_bpb']} {new['interval']} against "
                      f"{base['predicted_bpb']} {base['interval']}", flush=True)
            figures["flows"][name] = row
            figures.setdefault("detail", {})[name] = {"new": new, "baseline": base}
    finally:
        if base_tree is not None:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(base_tree)], capture_output=True)
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
