"""How well does `llmforge mix`'s law rank mixes it did not see, and does its proposal hold? One mix search through
the real flow, on a corpus where the answer is known, or on the embedded one.

    python bench/mix_law.py --proxies 12                 # three sources, ~15 minutes on 2 cores
    python bench/mix_law.py --corpus builtin             # the embedded corpus with the tiny preset's `mix:` section

`three` (default): prose from a word chain, random letter strings and digit strings at equal weights, and a target
of unseen prose from the same chain (tests/integration/test_mix_flow.py runs the same corpus on fewer proxies).
It prints:

    loo_spearman          the chosen law's left-out predictions against the proxies' measures, ranked (goal >= 0.9)
    loo_mse_vs_mean       the law's left-out squared error over a constant's (each proxy predicted by the others'
                          mean): the baseline, measured on the same proxies
    inside                the proposal's measure inside the interval written before it was trained
    diff_ci               catalog - proposed, paired by seed and window (above 0: the proposal is better)
"""
from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from infra.machine import cpu_model  # noqa: E402

# One layer of width 64 on 128-token windows, 200 steps of 8 windows.
PROXY = {"pretrain.steps": 200, "pretrain.model_overrides": {"dim": 64, "n_layers": 1, "n_heads": 4, "n_kv_heads": 2,
                                                              "ffn_hidden": 192},
         "pretrain.batch.micro_batch_size": 8, "pretrain.optim.warmup_steps": 10, "pretrain.log.every": 50}
SETS = ["data.mix.total=400000", "tokenizer.vocab_size=1024"]
SYLLABLES = [c + v for c in "bcdfghklmnprstvz" for v in "aeiou"]


class MarkovProse:
    """English-like text with structure to learn: 2,000 made-up words, Zipfian, each followed mostly by a few
    favoured successors. A model keeps improving on it with more of it, so the share it gets in a mix shows."""

    def __init__(self, seed: int = 5, words: int = 2000):
        rng = random.Random(seed)
        self.words = list(dict.fromkeys("".join(rng.choice(SYLLABLES) for _ in range(rng.randint(1, 3)))
                                        for _ in range(words * 2)))[:words]
        self.weights = [1 / (i + 1) for i in range(len(self.words))]
        self.next = {w: rng.sample(range(len(self.words)), 4) for w in self.words}

    def text(self, rng: random.Random, length: int = 150) -> str:
        out = [rng.choices(self.words, self.weights)[0]]
        for _ in range(length - 1):
            out.append(self.words[rng.choice(self.next[out[-1]])] if rng.random() < 0.7
                       else rng.choices(self.words, self.weights)[0])
        return " ".join(out).capitalize() + "."


def three_sources(root: Path) -> tuple[Path, Path]:
    """A catalog of structured prose, random letter strings and digit strings at equal weights, and a target of
    unseen prose from the same chain: only the prose teaches the target."""
    catalog = root / "catalog"
    catalog.mkdir(parents=True, exist_ok=True)
    rng = random.Random(3)
    chain = MarkovProse()
    letters = "abcdefghijklmnopqrstuvwxyz"
    texts = {
        "prose": [chain.text(rng) for _ in range(300)],
        "letters": [" ".join("".join(rng.choice(letters) for _ in range(rng.randint(2, 8))) for _ in range(150))
                    for _ in range(300)],
        "digits": [" ".join(f"{rng.randrange(10 ** 6):06d}" for _ in range(120)) for _ in range(300)],
    }
    for name, docs in texts.items():
        (catalog / f"{name}.jsonl").write_text("\n".join(json.dumps({"text": t, "id": f"{name}{i}"})
                                                         for i, t in enumerate(docs)) + "\n")
        (catalog / f"{name}.yaml").write_text(f"name: {name}\nkind: jsonl\npath: {name}.jsonl\nid_field: id\n"
                                              "licence: CC0-1.0\nweight: 1\nmax_epochs: 100\nfilters:\n"
                                              "  filter_set: none\n")
    target = root / "prose_target.jsonl"
    other = random.Random(11)
    target.write_text("\n".join(json.dumps({"text": chain.text(other)}) for _ in range(60)) + "\n")
    return catalog, target


def summary(document: dict) -> dict:
    """The fit's and the check's figures, with the constant baseline's left-out error beside the law's."""
    measured = np.array([p["bpb"] for p in document["proxies"]])
    law = np.array([p["loo_predicted"] for p in document["proxies"]])
    n = len(measured)
    mean_of_others = (measured.sum() - measured) / (n - 1)
    mse_law, mse_mean = float(np.mean((law - measured) ** 2)), float(np.mean((mean_of_others - measured) ** 2))
    return {"proxies": n, "law": document["fit"]["model"], "loo_spearman": document["fit"]["loo_spearman"],
            "loo_mse_law": mse_law, "loo_mse_mean": mse_mean, "loo_mse_vs_mean": mse_law / mse_mean,
            "proposed": document["proposed"], "predicted_bpb": document["predicted_bpb"],
            "interval": document["interval"], "measured_bpb": document["measured_bpb"],
            "catalog_bpb": document["catalog_bpb"], "inside": document["inside"], "diff_ci": document["diff_ci"]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--corpus", choices=["three", "builtin"], default="three")
    parser.add_argument("--proxies", type=int, default=12, help="M, the proxies on sampled mixes (three: default 12)")
    parser.add_argument("--seeds", type=int, default=3, help="the proposal and the catalog's mix, each (default 3)")
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/bench_mix_law"))
    parser.add_argument("--json", type=Path, help="also write the summary here")
    args = parser.parse_args()
    args.workdir.mkdir(parents=True, exist_ok=True)
    sets = [f"mix.seeds={args.seeds}"]
    if args.corpus == "three":
        catalog, target = three_sources(args.workdir)
        sets += SETS + [f"data.catalog={catalog}", f"mix.proxies={args.proxies}", f"mix.proxy={json.dumps(PROXY)}"]
        extra = ["--target", f"prose={target}"]
    else:
        extra = []
    command = [sys.executable, "-m", "flows.cli", "mix", "--preset", "tiny", "--workdir", str(args.workdir / "work"),
               *extra, *[a for s in sets for a in ("--set", s)]]
    env = {**os.environ, "DS_ACCELERATOR": os.environ.get("DS_ACCELERATOR", "cpu")}
    start, load = time.time(), os.getloadavg()[0]
    proc = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)
    if proc.returncode:
        print(proc.stdout[-4000:] + proc.stderr[-4000:])
        return proc.returncode
    document = json.loads((args.workdir / "work" / "mix" / "latest" / "mix.json").read_text())
    result = {"corpus": args.corpus, "cpu": cpu_model(), "cores": os.cpu_count(), "wall_s": round(time.time() - start),
              "load_at_start": load, **summary(document)}
    print(json.dumps(result, indent=1))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
