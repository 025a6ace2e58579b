"""Do `llmforge ablate`'s intervals hold their coverage? The same comparison repeated on disjoint seeds.

    python bench/ablation_coverage.py --repeats 20 --json coverage.json          # about 45 minutes on 2 cores

One ablation through the real flow trains, on tiny proxies, `repeats x seeds` seeds of three arms: the baseline
(the embedded corpus), a variant whose catalog adds a source of shuffled-word junk at `--junk` of the mix, and the
A/A arm (the baseline again, on other seeds). Every proxy is scored on the held-out slice of every source. Then
repeat r compares seeds [r*seeds, (r+1)*seeds) of each arm with the baseline's same block, exactly as the flow
does for one ablation (tasks/eval/seed_differences.py: paired by seed and window, a 95% interval):

    aa_indistinguishable   per target, repeats whose A/A comparison says `indistinguishable` (goal >= 18 of 20)
    junk_caught            per target, repeats whose junk variant comes out `worse` (goal >= 18 of 20)

and the same on every target at once (two 95% intervals: about 10% of A/A repeats may flag one by chance).

The blocks are disjoint, so the repeats are independent draws of the seed noise; the targets' windows are the same
in all of them (their sampling is in each interval, not varied here).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import random
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tasks.eval.seed_differences import bpb_difference  # noqa: E402

# One layer of width 64 on 128-token windows, 300 steps of 8 windows, ~20 s on a core. At 120 steps the seeds
# scattered by as much as a 30% junk share moved the targets (BENCHMARKS.md "Ablations").
PROXY = {"pretrain.steps": 300, "pretrain.model_overrides": {"dim": 64, "n_layers": 1, "n_heads": 4, "n_kv_heads": 2,
                                                              "ffn_hidden": 192},
         "pretrain.batch.micro_batch_size": 8, "pretrain.optim.warmup_steps": 10, "pretrain.log.every": 60}
SETS = ["data.mix.total=400000", "tokenizer.vocab_size=1024"]


def cpu_name() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines() if Path("/proc/cpuinfo").is_file() else []:
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown CPU"


# Junk words: English-like words outside the embedded corpus's kind (as tests/integration/test_ablate_flow.py plants).
JUNK_WORDS = ("the and to of that with have be in for river market garden window letter village station harvest "
              "winter summer teacher doctor engine paper music story bridge forest castle kitchen island mountain "
              "ocean valley careful bright quiet ancient modern simple narrow gentle heavy rapid silver golden builds "
              "carries describes follows gathers measures opens reaches repairs studies travels visits watches "
              "writes answers borrows collects counts covers crosses").split()


def junk_catalog(folder: Path, share: float, kind: str) -> Path:
    """The embedded catalog plus a source of shuffled-word junk at `share` of the mix: `prose`, words drawn from a
    small English vocabulary in random order (text unlike the corpus: the mix is diluted), or `docs`, Python's
    documentation topics with their words shuffled within each (the corpus's own words out of order)."""
    from pydoc_data.topics import topics

    folder.mkdir(parents=True, exist_ok=True)
    for source in (ROOT / "data_catalog").glob("*.yaml"):
        shutil.copy(source, folder / source.name)
    rng = random.Random(7)
    rows = []
    if kind == "docs":
        for i, key in enumerate(sorted(topics)):
            words = topics[key].split()
            rng.shuffle(words)
            rows.append(json.dumps({"text": " ".join(words), "id": f"junk{i}"}))
    else:
        for i in range(2000):
            rows.append(json.dumps({"text": " ".join(rng.choice(JUNK_WORDS) for _ in range(rng.randint(100, 300))),
                                    "id": f"junk{i}"}))
    (folder / "junk.jsonl").write_text("\n".join(rows) + "\n")
    weight = share / (1 - share)  # the embedded sources weigh 0.5 each
    (folder / "junk.yaml").write_text(f"name: junk\nkind: jsonl\npath: junk.jsonl\nid_field: id\nlicence: PSF-2.0\n"
                                      f"weight: {weight:.4f}\nmax_epochs: 1000\nfilters:\n  filter_set: none\n")
    return folder


def verdicts(document: dict, arm: dict, block: slice) -> dict[str, str]:
    """Each target's verdict of `arm` against the baseline on the seeds of `block`."""
    base = document["variants"]["baseline"]
    out = {}
    for target in document["targets"]:
        mine = [np.load(f) for f in arm["scores"][target][block]]
        theirs = [np.load(f) for f in base["scores"][target][block]]
        out[target] = bpb_difference(mine, theirs).verdict
    return out


def train(work: Path, args: argparse.Namespace) -> float:
    """The ablation of `repeats x seeds` seeds per arm through the real flow; its wall seconds (-1: it failed)."""
    work.mkdir(parents=True, exist_ok=True)
    spec = {"variants": {"junk": {"data.catalog": str(junk_catalog(work / "junk_catalog", args.junk, args.junk_kind))}},
            "seeds": args.repeats * args.seeds, "aa": True, "holdout": 0.1,
            "proxy": {**PROXY, "pretrain.steps": args.steps}}
    (work / "coverage.yaml").write_text(json.dumps(spec))
    cmd = [str(Path(sys.executable).parent / "llmforge"), "ablate", str(work / "coverage.yaml"), "--preset", "tiny",
           "--workdir", str(work / "work")] + [a for kv in SETS for a in ("--set", kv)]
    started = time.time()
    done = subprocess.run(cmd, cwd=ROOT, env={**os.environ, "DS_ACCELERATOR": "cpu"}, capture_output=True, text=True)
    (work / "ablate.log").write_text(done.stdout + done.stderr)
    if done.returncode != 0:
        print(f"llmforge ablate failed ({done.returncode}); its log: {work / 'ablate.log'}")
        return -1.0
    return time.time() - started


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--seeds", type=int, default=3, help="seeds per arm in one comparison (the flow's default)")
    parser.add_argument("--junk", type=float, default=0.3, help="the junk source's share of the variant's mix")
    parser.add_argument("--junk-kind", choices=("prose", "docs"), default="prose",
                        help="prose: shuffled words unlike the corpus; docs: the corpus's documentation, words shuffled")
    parser.add_argument("--steps", type=int, default=PROXY["pretrain.steps"], help="each proxy's steps")
    parser.add_argument("--workdir", type=Path, default=None, help="the workspace (default: a fresh folder)")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--document", type=Path, default=None,
                        help="an earlier run's ablation.json: its proxies' scores compared again, nothing trained")
    args = parser.parse_args()
    work = args.workdir or Path(f"/tmp/ablation-coverage-{os.getpid()}")
    wall = 0.0
    if args.document is None:
        wall = train(work, args)
        if wall < 0:
            return 1
    path = args.document or work / "work" / "ablate" / "latest" / "ablation.json"
    document = json.loads(path.read_text())
    blocks = [slice(r * args.seeds, (r + 1) * args.seeds) for r in range(args.repeats)]
    aa = [verdicts(document, document["aa"], b) for b in blocks]
    junk = [verdicts(document, document["variants"]["junk"], b) for b in blocks]
    aa_ok = sum(all(v == "indistinguishable" for v in r.values()) for r in aa)
    caught = sum(all(v == "worse" for v in r.values()) for r in junk)
    per_target = {t: {"aa_indistinguishable": sum(r[t] == "indistinguishable" for r in aa),
                      "junk_caught": sum(r[t] == "worse" for r in junk)} for t in document["targets"]}
    need = int(np.ceil(0.9 * args.repeats))
    met = all(c["aa_indistinguishable"] >= need and c["junk_caught"] >= need for c in per_target.values())
    result = {"repeats": args.repeats, "seeds": args.seeds, "junk_share": args.junk, "junk_kind": args.junk_kind,
              "steps": args.steps,
              "targets": document["targets"], "per_target": per_target, "aa_indistinguishable_every_target": aa_ok,
              "junk_caught_every_target": caught, "goal": f">= {need} of {args.repeats} on each target", "met": met,
              "wall_s": round(wall, 1), "proxies": 3 * args.repeats * args.seeds, "cpu": cpu_name(),
              "cores": os.cpu_count(), "command": " ".join(sys.argv), "aa_verdicts": aa, "junk_verdicts": junk}
    for target in document["targets"]:
        base = np.array(document["variants"]["baseline"]["values"][target])
        for arm_name, arm in (("junk", document["variants"]["junk"]), ("aa", document["aa"])):
            d = np.array(arm["values"][target]) - base
            result.setdefault("per_seed_differences", {}).setdefault(target, {})[arm_name] = {
                "mean": round(float(d.mean()), 4), "sd": round(float(d.std(ddof=1)), 4) if len(d) > 1 else None}
            print(f"{target}: {arm_name} - baseline per seed {d.mean():+.4f} (sd {d.std(ddof=1) if len(d) > 1 else 0:.4f})")
    for target, counts in per_target.items():
        print(f"{target}: A/A indistinguishable {counts['aa_indistinguishable']}/{args.repeats}, {args.junk:.0%} junk "
              f"caught (worse) {counts['junk_caught']}/{args.repeats}")
    print(f"goal >= {need} of {args.repeats} on each target: {'met' if met else 'NOT met'}; on every target at once: "
          f"A/A {aa_ok}/{args.repeats}, junk {caught}/{args.repeats}")
    print(f"{result['proxies']} proxies " + (f"in {wall / 60:.1f} min" if wall else f"of {path}, compared again")
          + f" on {result['cpu']} ({result['cores']} cores)")
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
