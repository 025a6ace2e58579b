"""Benchmark of the data stages: docs per CPU-second and peak memory of each, per corpus size.

Generates a deterministic synthetic catalog (three JSONL sources of English-like prose of
varied length, with mix weights, planted exact and near duplicates, junk the quality
rules drop, e-mail and IP addresses, a few malformed lines), then runs the stages one by
one, each in a fresh process, and measures per stage: documents in, documents per
CPU-second (the stage's own CPU and its workers', imports not counted), peak RSS of the
whole process tree (the stage's process and its descendants, summed, sampled every
~50 ms; a child between fork and exec, still its parent's image, is not counted twice)
and wall time; for the flow, which processes made up its peak. Prints a table per corpus size and the ratio of peak RSS between
the largest and the smallest size.

    python bench/data_flow.py                         # 25,000 and 200,000 documents
    python bench/data_flow.py --docs 25000 --json out.json
    python bench/data_flow.py --docs 25000 200000 1000000
    python bench/data_flow.py --docs 25000 --flow     # also the real Prefect data flow, end to end
    python bench/data_flow.py --docs 200000 --flow-only
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
STAGES = ["collect", "merge", "exact", "near", "quality", "pii", "mix", "shards"]

# name: (share of documents, mix weight, median sentences per document)
SOURCES = {"web": (0.6, 0.5, 16), "books": (0.25, 0.35, 40), "forum": (0.15, 0.15, 6)}
_STOP = "the and to of that with have be in for it on as was at by from this not or but".split()
_SYLLABLES = "ka ri to ne sa mo lu pe da vi or an el is un ter ing ed ly er st pl gr tr ch".split()


def _vocabulary(rng: np.random.Generator, n: int = 4000) -> list[str]:
    words = set()
    while len(words) < n:
        words.add("".join(rng.choice(_SYLLABLES, size=int(rng.integers(1, 4)))))
    return sorted(words)


def _prose(rng: np.random.Generator, vocab: list[str], p: np.ndarray, sentences: int) -> str:
    """Sentences of 6-20 words, a third of them stop words, in paragraphs of 2-6 sentences."""
    lengths = rng.integers(6, 21, size=sentences)
    idx = rng.choice(len(vocab), size=int(lengths.sum()), p=p).tolist()
    stops = (rng.random(len(idx)) < 0.33).tolist()
    stop_idx = rng.integers(0, len(_STOP), size=len(idx)).tolist()
    words = [_STOP[s] if is_stop else vocab[i] for i, is_stop, s in zip(idx, stops, stop_idx)]
    out, pos, para = [], 0, []
    for n in lengths.tolist():
        sent = " ".join(words[pos : pos + n])
        pos += n
        para.append(sent[0].upper() + sent[1:] + ".")
        if len(para) >= int(rng.integers(2, 7)):
            out.append(" ".join(para))
            para = []
    if para:
        out.append(" ".join(para))
    return "\n\n".join(out)


def _junk(rng: np.random.Generator, i: int) -> str:
    kind = i % 4
    if kind == 0:
        return "Click here"
    if kind == 1:
        return " ".join("#$%&*@!"[int(k)] * int(rng.integers(3, 9)) for k in rng.integers(0, 7, 80))
    if kind == 2:
        return "BUY NOW LIMITED OFFER\n" * 40
    return "lorem\n" * 200


def generate_catalog(root: Path, n_docs: int, seed: int = 0) -> Path:
    """A catalog folder of JSONL sources totalling `n_docs` records; the same bytes for a seed."""
    import orjson

    cat = root / "catalog"
    cat.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    vocab = _vocabulary(rng)
    p = 1.0 / np.arange(1, len(vocab) + 1) ** 1.0
    p /= p.sum()
    for name, (share, weight, median) in SOURCES.items():
        n = int(round(n_docs * share))
        srng = np.random.default_rng([seed, len(name), ord(name[0])])
        originals: list[str] = []
        with open(cat / f"{name}.jsonl", "wb") as fh:
            for i in range(n):
                r = srng.random()
                if originals and r < 0.04:  # exact copy, sometimes with other line endings or trailing blanks
                    text = originals[int(srng.integers(len(originals)))]
                    text = text.replace("\n", "\r\n") if srng.random() < 0.3 else text + "  "
                elif originals and r < 0.08:  # near copy: a few words changed
                    ws = originals[int(srng.integers(len(originals)))].split(" ")
                    for k in srng.integers(0, len(ws), size=max(1, len(ws) // 100)).tolist():
                        ws[k] = vocab[int(srng.integers(len(vocab)))]
                    text = " ".join(ws)
                elif r < 0.11:
                    text = _junk(srng, i)
                else:
                    sentences = int(np.clip(srng.lognormal(np.log(median), 0.7), 2, 400))
                    text = _prose(srng, vocab, p, sentences)
                    if srng.random() < 0.02:
                        text += f" Write to user{i}@mail{i % 97}.com or connect to 84.{i % 250}.{i % 199}.{i % 173}."
                    if len(originals) < 5000 or srng.random() < 0.01:
                        originals.append(text)
                if i % 5000 == 4999:
                    fh.write(b'{"text": "unterminated\n')
                fh.write(orjson.dumps({"id": f"{name}{i}", "text": text}) + b"\n")
        (cat / f"{name}.yaml").write_text(
            f"name: {name}\nkind: jsonl\npath: {name}.jsonl\nid_field: id\nlicence: CC0-1.0\nweight: {weight}\nmax_epochs: 4\n"
        )
    return cat


# ---------------------------------------------------------------- one stage, in a child process


def _stage_paths(work: Path, stage: str) -> tuple[Path, Path, Path]:
    """(input, output, removed) of a stage inside the bench's work folder."""
    prev = {"merge": None, "exact": "merge", "near": "exact", "quality": "near", "pii": "quality", "mix": "pii", "shards": "mix"}[stage]
    return work / f"{prev}.parquet", work / f"{stage}.parquet", work / f"{stage}.removed.parquet"


def run_stage(stage: str, catalog_dir: Path, work: Path) -> dict:
    """Run one stage on the previous stage's output; return docs in and the stage's CPU seconds."""
    import pyarrow.parquet as pq

    from tasks.data import (collect, exact_dedup, mix, near_dedup,  # noqa: F401 (imports are not the stage's cost)
                            pii_redact, quality_filter, shards)
    from tasks.data.catalog import load_catalog

    catalog = load_catalog(catalog_dir)
    catalog.filter_specs()
    cpu0, child0 = time.process_time(), resource.getrusage(resource.RUSAGE_CHILDREN)

    if stage == "collect":
        from tasks.data.collect import collect_source

        results = [collect_source(catalog, s, work / "collect") for s in catalog.sources]
        (work / "collect.json").write_text(json.dumps([r.model_dump(mode="json") for r in results]))
        n_in = sum(c["in"] for r in results for c in r.counts.values())
    else:
        inp, out, removed = _stage_paths(work, stage)
        n_in = pq.ParquetFile(inp).metadata.num_rows if stage != "merge" else 0
        if stage == "merge":
            from tasks.data.collect import merge_results
            from tasks.data.step import StageResult

            results = [StageResult.model_validate(r) for r in json.loads((work / "collect.json").read_text())]
            merge_results(results, out, removed)
            n_in = sum(pq.ParquetFile(r.output).metadata.num_rows for r in results)
        elif stage == "exact":
            from tasks.data.exact_dedup import ExactDedupConfig, exact_dedup

            exact_dedup(inp, out, removed, ExactDedupConfig())
        elif stage == "near":
            from tasks.data.near_dedup import NearDedupConfig, near_dedup

            near_dedup(inp, out, removed, NearDedupConfig())
        elif stage == "quality":
            from tasks.data.quality_filter import quality_filter

            quality_filter(inp, out, removed, catalog.filter_specs())
        elif stage == "pii":
            from tasks.data.pii_redact import PiiConfig, pii_redact

            pii_redact(inp, out, PiiConfig())
        elif stage == "mix":
            from tasks.data.mix import MixConfig, rebalance_mix

            res = rebalance_mix(inp, out, removed, catalog.weights(), {s.name: s.max_epochs for s in catalog.sources}, MixConfig())
            (work / "mix.json").write_text(json.dumps(res.report))
        elif stage == "shards":
            from tasks.data.shards import ShardConfig, write_shards

            write_shards(inp, work / "shards", ShardConfig(), {}, json.loads((work / "mix.json").read_text()), [])
    child1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = time.process_time() - cpu0 + (child1.ru_utime + child1.ru_stime) - (child0.ru_utime + child0.ru_stime)
    return {"docs_in": n_in, "stage_cpu_s": cpu}


# ---------------------------------------------------------------- the parent: watch a process tree


def _short_cmd(p) -> str:
    """A process's command line, short enough for a table: the interpreter's path dropped."""
    try:
        args = p.cmdline()
    except Exception:  # noqa: BLE001 - it may have exited
        return "?"
    if args and "python" in Path(args[0]).name:
        args = args[1:]
    return " ".join(a if len(a) < 60 else "..." + a[-40:] for a in args)[:160]


def watch(cmd: list[str], env: dict | None = None, interval: float = 0.05) -> dict:
    """Run `cmd`; return its wall time, peak RSS of its whole process tree and the tree's CPU seconds."""
    import psutil

    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    root = psutil.Process(proc.pid)
    peak = 0
    at_peak: list[tuple[str, float]] = []
    while proc.poll() is None:
        total = 0
        parts = []
        try:
            for p in [root, *root.children(recursive=True)]:
                try:
                    if p is not root and p.cmdline() == p.parent().cmdline():
                        # Between fork and exec a child is its parent's image (vfork shares its very
                        # pages): counting it would count the parent twice for that instant.
                        continue
                    rss = p.memory_info().rss
                    total += rss
                    parts.append((_short_cmd(p), rss / 2**20))
                except (psutil.NoSuchProcess, psutil.AccessDenied):
                    pass
        except psutil.NoSuchProcess:
            pass
        if total > peak:
            peak, at_peak = total, parts
        time.sleep(interval)
    out, err = proc.communicate()
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed (rc={proc.returncode}):\n{out[-3000:]}\n{err[-3000:]}")
    return {
        "wall_s": wall,
        "peak_rss_mb": peak / 2**20,
        "tree_cpu_s": (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime),
        "at_peak": [{"process": c, "rss_mb": round(m, 1)} for c, m in at_peak],
        "stdout": out,
    }


def bench_size(n_docs: int, tmp: Path, flow: bool, keep: bool, skip: frozenset[str] = frozenset(),
               flow_only: bool = False) -> dict:
    root = tmp / f"docs{n_docs}"
    t0 = time.perf_counter()
    catalog = generate_catalog(root, n_docs)
    print(f"[{n_docs}] generated {sum(f.stat().st_size for f in catalog.glob('*.jsonl')) / 2**20:.0f} MB of JSONL "
          f"in {time.perf_counter() - t0:.0f} s", flush=True)
    work = root / "work"
    work.mkdir(exist_ok=True)
    rows = {}
    for stage in STAGES[:1] if flow_only else STAGES:
        if stage in skip:
            inp, out, _ = _stage_paths(work, stage)
            shutil.copyfile(inp, out)
            rows[stage] = {"docs_in": 0, "stage_cpu_s": 0.0, "wall_s": 0.0, "peak_rss_mb": 0.0, "tree_cpu_s": 0.0,
                           "docs_per_cpu_s": 0.0, "failed": True}
            continue
        try:
            m = watch([sys.executable, __file__, "--child", stage, str(catalog), str(work)])
        except RuntimeError as exc:
            if stage in ("collect", "merge", "shards"):
                raise
            # A stage being rebuilt elsewhere must not hide the others: pass its input on, unmeasured.
            print(f"[{n_docs}] {stage} FAILED, its input is passed on: {str(exc).strip().splitlines()[-1]}", flush=True)
            inp, out, _ = _stage_paths(work, stage)
            shutil.copyfile(inp, out)
            rows[stage] = {"docs_in": 0, "stage_cpu_s": 0.0, "wall_s": 0.0, "peak_rss_mb": 0.0, "tree_cpu_s": 0.0,
                           "docs_per_cpu_s": 0.0, "failed": True}
            continue
        res = json.loads(m.pop("stdout").strip().splitlines()[-1])
        res |= m
        res["docs_per_cpu_s"] = res["docs_in"] / max(res["stage_cpu_s"], 1e-9)
        rows[stage] = res
        print(f"[{n_docs}] {stage:8s} {res['docs_in']:>9,d} docs  {res['docs_per_cpu_s']:>9,.0f} docs/CPU-s  "
              f"peak {res['peak_rss_mb']:>7,.0f} MB  wall {res['wall_s']:6.1f} s", flush=True)
    collected = rows["collect"]["docs_in"]
    stage_cpu = sum(r["stage_cpu_s"] for r in rows.values())
    out = {"docs": n_docs, "collected": collected, "stages": rows,
           "stages_total": {"docs_per_cpu_s": collected / stage_cpu, "cpu_s": stage_cpu,
                            "peak_rss_mb": max(r["peak_rss_mb"] for r in rows.values()),
                            "complete": not any(r.get("failed") for r in rows.values())}}
    if flow:
        out["flow"] = bench_flow(catalog, root, collected)
        print(f"[{n_docs}] flow     {collected:>9,d} docs  {out['flow']['docs_per_cpu_s']:>9,.0f} docs/CPU-s  "
              f"peak {out['flow']['peak_rss_mb']:>7,.0f} MB  wall {out['flow']['wall_s']:6.1f} s", flush=True)
        for part in sorted(out["flow"]["at_peak"], key=lambda d: -d["rss_mb"]):
            print(f"[{n_docs}]     at the peak: {part['rss_mb']:7,.0f} MB  {part['process']}", flush=True)
    if not keep:
        shutil.rmtree(root, ignore_errors=True)
    return out


def bench_flow(catalog: Path, root: Path, collected: int) -> dict:
    """The real Prefect data flow (flows/data_flow.py) through the CLI, on an ephemeral Prefect API.

    Prefect's database is created (migrated) before the measured run, unmeasured: a user's
    PREFECT_HOME has it after the first run, and creating it costs CPU seconds once.
    """
    preset = root / "preset.yaml"
    preset.write_text(f"data:\n  catalog: {catalog}\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "MLFLOW_"))}
    env.update(PREFECT_HOME=str(root / "prefect-home"), PREFECT_SERVER_ANALYTICS_ENABLED="false",
               PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS="180", LLMFORGE_HOME=str(root / "flow-work"),
               PYTHONPATH=str(ROOT))
    subprocess.run([sys.executable, "-m", "prefect", "server", "database", "upgrade", "-y"], env=env, check=True,
                   capture_output=True, timeout=300)
    m = watch([sys.executable, "-m", "flows.cli", "data", "--preset", str(preset), "--workdir", str(root / "flow-work")], env=env)
    m.pop("stdout")
    m["docs_per_cpu_s"] = collected / m["tree_cpu_s"]
    return m


def table(res: dict) -> str:
    lines = [f"#### {res['docs']:,} documents ({res['collected']:,} records collected)", "",
             "| stage | docs in | docs/CPU-s | CPU s | peak RSS of the tree (MB) | wall s |", "|---|---:|---:|---:|---:|---:|"]
    for stage, r in res["stages"].items():
        if r.get("failed"):
            lines.append(f"| {stage} | skipped or failed (input passed on) | | | | |")
            continue
        lines.append(f"| {stage} | {r['docs_in']:,} | {r['docs_per_cpu_s']:,.0f} | {r['stage_cpu_s']:.1f} | "
                     f"{r['peak_rss_mb']:,.0f} | {r['wall_s']:.1f} |")
    t = res["stages_total"]
    lines.append(f"| all stages | {res['collected']:,} | {t['docs_per_cpu_s']:,.0f} | {t['cpu_s']:.1f} | {t['peak_rss_mb']:,.0f} (max) | |")
    if "flow" in res:
        f = res["flow"]
        lines.append(f"| data_flow (Prefect, whole tree incl. imports and its API server; database created beforehand) | {res['collected']:,} | {f['docs_per_cpu_s']:,.0f} | "
                     f"{f['tree_cpu_s']:.1f} | {f['peak_rss_mb']:,.0f} | {f['wall_s']:.1f} |")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--docs", type=int, nargs="+", default=[25_000, 200_000], help="corpus sizes (records)")
    p.add_argument("--flow", action="store_true", help="also run the real Prefect data flow on each corpus")
    p.add_argument("--flow-only", action="store_true",
                   help="only the flow (and collect, which counts the records): its peak and what made it up")
    p.add_argument("--json", type=Path, help="write the results here")
    p.add_argument("--tmp", type=Path, help="work folder (default: a temporary one)")
    p.add_argument("--keep", action="store_true", help="keep the generated corpora and stage outputs")
    p.add_argument("--skip", default="", help="comma-separated stages to pass through unmeasured (e.g. near,quality)")
    p.add_argument("--child", nargs=3, metavar=("STAGE", "CATALOG", "WORK"), help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        stage, catalog, work = args.child
        print(json.dumps(run_stage(stage, Path(catalog), Path(work))))
        return
    skip = frozenset(s for s in args.skip.split(",") if s)
    unknown = skip - set(STAGES[2:-1])
    if unknown:
        p.error(f"--skip {sorted(unknown)}: only {STAGES[2:-1]} can be skipped")
    if args.keep:
        tmp = Path(tempfile.mkdtemp(prefix="bench-data-flow-", dir=args.tmp))
        print(f"keeping the corpora and outputs in {tmp}")
        results = [bench_size(n, tmp, args.flow or args.flow_only, args.keep, skip, args.flow_only) for n in args.docs]
    else:
        with tempfile.TemporaryDirectory(dir=args.tmp) as tmp:
            results = [bench_size(n, Path(tmp), args.flow or args.flow_only, args.keep, skip, args.flow_only) for n in args.docs]
    for r in results:
        print()
        print(table(r))
    if len(results) > 1:
        lo, hi = results[0], results[-1]
        print()
        print(f"peak RSS ratio {hi['docs']:,} / {lo['docs']:,} documents, per stage:")
        for stage in lo["stages"]:
            if lo["stages"][stage]["peak_rss_mb"] and hi["stages"][stage]["peak_rss_mb"]:
                print(f"  {stage:8s} {hi['stages'][stage]['peak_rss_mb'] / lo['stages'][stage]['peak_rss_mb']:.2f}x")
        if "flow" in lo and "flow" in hi:
            print(f"  flow     {hi['flow']['peak_rss_mb'] / lo['flow']['peak_rss_mb']:.2f}x")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    main()
