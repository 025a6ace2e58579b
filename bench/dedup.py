"""Benchmark of the near-dedup stage on synthetic documents with planted near-duplicates.

Measures, on the same documents in one run:
  * MinHash signature throughput of ours (numpy, all cores and one process) against
    datasketch's per-document `MinHash.update` loop and its `update_batch` (on a subset;
    same permutations, same shingles; signatures are checked equal);
  * the full `near_dedup` stage on a Parquet file: LSH query+insert throughput,
    recall of the planted duplicates, and its peak memory (RSS of the stage's own
    process and of its signature workers, measured in a fresh process).

    python bench/dedup.py                  # 100,000 documents
    python bench/dedup.py --docs 20000 --json out.json
"""
from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import resource
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

from tasks.data.documents import Document, documents_table, write_table_atomic
from tasks.data.minhash_dedup import NearDedupConfig, compute_signatures, near_dedup, plan_workers, shingles


def generate(n_docs: int, dup_rate: float, seed: int) -> tuple[list[str], dict[int, tuple[int, float]]]:
    """Texts of 200-400 Zipf-distributed words; a `dup_rate` share are edited copies of an
    earlier text. Returns the texts and {copy index: (original index, exact 5-gram Jaccard)}."""
    rng = np.random.default_rng(seed)
    letters = np.array(list("abcdefghijklmnopqrstuvwxyz"))
    vocab = ["".join(rng.choice(letters, size=rng.integers(2, 10))) for _ in range(50000)]
    weights = 1.0 / np.arange(1, len(vocab) + 1) ** 0.9
    weights /= weights.sum()
    lengths = rng.integers(200, 401, size=n_docs)
    flat = rng.choice(len(vocab), size=int(lengths.sum()), p=weights)
    words = [vocab[i] for i in flat.tolist()]
    texts: list[str] = []
    originals: list[int] = []  # copies are made of originals only, so each copy has one true source
    truth: dict[int, tuple[int, float]] = {}
    pos = 0
    for i, length in enumerate(lengths.tolist()):
        doc = words[pos : pos + length]
        pos += length
        if not originals or rng.random() >= dup_rate:
            originals.append(i)
        else:
            src = originals[int(rng.integers(0, len(originals)))]
            doc = texts[src].split()
            for p in sorted(rng.choice(len(doc), size=int(rng.integers(0, 11)), replace=False).tolist(), reverse=True):
                if rng.random() < 0.5:
                    doc[p] = vocab[int(rng.integers(len(vocab)))]
                else:
                    doc.insert(p, vocab[int(rng.integers(len(vocab)))])
            a, b = set(shingles(texts[src], 5)), set(shingles(" ".join(doc), 5))
            truth[i] = (src, len(a & b) / len(a | b))
        texts.append(" ".join(doc))
    return texts, truth


def datasketch_loop(texts: list[str], cfg: NearDedupConfig) -> np.ndarray:
    """The plain way: one MinHash per document, `update` per shingle."""
    from datasketch import MinHash

    perms = MinHash(cfg.num_perm, seed=cfg.seed, scheme=cfg.scheme).permutations
    out = []
    for text in texts:
        m = MinHash(cfg.num_perm, seed=cfg.seed, permutations=perms, scheme=cfg.scheme)
        for gram in shingles(text, cfg.ngram):
            m.update(gram.encode("utf-8"))
        out.append(m.hashvalues)
    return np.stack(out)


def datasketch_batch(texts: list[str], cfg: NearDedupConfig) -> np.ndarray:
    """datasketch's own fastest CPU path: `MinHash.bulk` (update_batch per document)."""
    from datasketch import MinHash

    mhs = MinHash.bulk(
        ([g.encode("utf-8") for g in shingles(t, cfg.ngram)] for t in texts),
        num_perm=cfg.num_perm, seed=cfg.seed, scheme=cfg.scheme,
    )
    return np.stack([m.hashvalues for m in mhs])


def cpu_seconds() -> float:
    """CPU time of this process and of its joined children (worker pools are joined when closed)."""
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def timed(fn, *args):
    """Result, wall seconds and CPU seconds (all processes) of fn(*args).

    CPU seconds make the comparison meaningful on a shared machine, where wall time
    depends on what else runs."""
    start, cpu = time.perf_counter(), cpu_seconds()
    out = fn(*args)
    return out, time.perf_counter() - start, cpu_seconds() - cpu


def maxrss_mb(who: int) -> float:
    return resource.getrusage(who).ru_maxrss / 1024  # Linux reports KiB


def proc_status_mb(pid: int | str, field: str) -> float:
    """A memory field (VmRSS, VmHWM) of /proc/<pid>/status in MB; 0 if the process is gone."""
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) / 1024
    except (FileNotFoundError, ProcessLookupError):
        pass
    return 0.0


def children_rss_mb(parent: int) -> float:
    """Summed RSS of the direct children of `parent` (the signature workers)."""
    total = 0.0
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as fh:
                ppid = int(fh.read().rsplit(")", 1)[1].split()[1])
        except (FileNotFoundError, ProcessLookupError, IndexError, ValueError):
            continue
        if ppid == parent:
            total += proc_status_mb(pid, "VmRSS")
    return total


def stage_in_fresh_process(in_path: Path, out_dir: Path, cfg: NearDedupConfig) -> dict:
    """Run near_dedup; report its peak RSS and the peak of all its processes together.

    VmHWM, not ru_maxrss: a spawned process inherits ru_maxrss of the (large) parent it
    was forked from, while VmHWM belongs to its own address space. Workers are sampled
    every 0.1 s, so a shorter peak could be missed."""
    import threading

    before = proc_status_mb("self", "VmHWM")  # interpreter + imports (prefect, pyarrow, datasketch)
    peak_total = 0.0
    done = threading.Event()

    def sample() -> None:
        nonlocal peak_total
        while not done.wait(0.1):
            peak_total = max(peak_total, proc_status_mb("self", "VmRSS") + children_rss_mb(os.getpid()))

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    start = time.perf_counter()
    result = near_dedup(in_path, out_dir / "kept.parquet", out_dir / "removed.parquet", cfg)
    wall = time.perf_counter() - start
    done.set()
    sampler.join()
    return {
        "wall_s": wall,
        "stats": dict(result.stats),
        "counts": result.counts,
        "rss_imports_mb": before,
        "rss_self_mb": proc_status_mb("self", "VmHWM"),
        "rss_all_processes_mb": peak_total,
    }


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--docs", type=int, default=100_000, help="documents to generate (default 100000)")
    ap.add_argument("--dup-rate", type=float, default=0.1, help="share of documents that are edited copies (default 0.1)")
    ap.add_argument("--baseline-docs", type=int, default=1000, help="documents timed with the datasketch loops (default 1000)")
    ap.add_argument("--workers", type=int, default=0, help="signature processes, 0 = all cores (default)")
    ap.add_argument("--num-perm", type=int, default=128)
    ap.add_argument("--threshold", type=float, default=0.8)
    ap.add_argument("--seed", type=int, default=0, help="seed of the synthetic corpus (default 0)")
    ap.add_argument("--json", type=Path, help="also write the figures to this JSON file")
    return ap.parse_args(argv)


def signature_figures(texts: list[str], sub: list[str], cfg: NearDedupConfig) -> dict | None:
    """Signature throughput of ours (all cores, one process) vs datasketch's loops; None if they differ."""
    single = cfg.model_copy(update={"workers": 1})
    ours_all, t_all, c_all = timed(compute_signatures, texts, cfg)
    ours_one, t_one, c_one = timed(compute_signatures, sub, single)
    loop, t_loop, c_loop = timed(datasketch_loop, sub, cfg)
    batch, t_batch, c_batch = timed(datasketch_batch, sub, cfg)
    if not (np.array_equal(loop, ours_one) and np.array_equal(batch, ours_one) and np.array_equal(ours_all[: len(sub)], ours_one)):
        return None
    n, m = len(texts), len(sub)
    return {
        "ours_all_cores_docs_per_s": round(n / t_all, 1),
        "ours_one_process_docs_per_s": round(m / t_one, 1),
        "datasketch_update_loop_docs_per_s": round(m / t_loop, 1),
        "datasketch_update_batch_docs_per_s": round(m / t_batch, 1),
        "ratio_all_cores_vs_update_loop": round((n / t_all) / (m / t_loop), 2),
        "ratio_one_process_vs_update_loop": round((m / t_one) / (m / t_loop), 2),
        "ratio_all_cores_vs_update_batch": round((n / t_all) / (m / t_batch), 2),
        "ours_all_cores_docs_per_cpu_s": round(n / c_all, 1),  # includes the workers' start-up imports
        "ours_one_process_docs_per_cpu_s": round(m / c_one, 1),
        "datasketch_update_loop_docs_per_cpu_s": round(m / c_loop, 1),
        "datasketch_update_batch_docs_per_cpu_s": round(m / c_batch, 1),
        "cpu_ratio_ours_vs_update_loop": round((n / c_all) / (m / c_loop), 2),
        "cpu_ratio_ours_vs_update_batch": round((n / c_all) / (m / c_batch), 2),
    }


def stage_figures(texts: list[str], truth: dict, cfg: NearDedupConfig) -> dict:
    """The whole near_dedup stage in a fresh process: throughput, recall of the planted copies, memory."""
    import pyarrow.parquet as pq

    with tempfile.TemporaryDirectory(prefix="bench-dedup-") as tmp:
        tmp = Path(tmp)
        docs = [Document(doc_id=f"d{i}", source="synthetic", text=t) for i, t in enumerate(texts)]
        path = write_table_atomic(documents_table(docs), tmp / "docs.parquet")
        del docs
        cpu = cpu_seconds()
        with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as ex:
            stage = ex.submit(stage_in_fresh_process, path, tmp, cfg).result()
        stage_cpu = cpu_seconds() - cpu
        removed = pq.read_table(tmp / "removed.parquet", columns=["doc_id", "duplicate_of"]).to_pylist()
    found = {int(r["doc_id"][1:]) for r in removed}
    high = [i for i, (_, j) in truth.items() if j >= 0.9]
    n, stats = len(texts), stage["stats"]
    return {
        "stage_wall_s": round(stage["wall_s"], 2),
        "stage_cpu_s": round(stage_cpu, 2),
        "stage_docs_per_s": round(n / stage["wall_s"], 1),
        "lsh_query_insert_docs_per_s": round(n / stats["seconds_lsh"], 1),
        "lsh_query_insert_docs_per_cpu_s": round(n / stats["cpu_seconds_lsh"], 1),
        "stage_signature_docs_per_cpu_s": round(n / stats["cpu_seconds_signatures"], 1),
        "lsh_bands_rows": f"{stats['lsh_bands']}x{stats['lsh_rows']}",
        "removed_near_duplicates": len(found),
        "recall_planted_J>=0.9": round(sum(i in found for i in high) / max(len(high), 1), 4),
        "removed_not_planted": sum(i not in truth for i in found),
        "stage_rss_after_imports_mb": round(stage["rss_imports_mb"], 1),
        "stage_peak_rss_mb": round(stage["rss_self_mb"], 1),
        "stage_peak_rss_all_processes_mb": round(stage["rss_all_processes_mb"], 1),
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    cfg = NearDedupConfig(num_perm=args.num_perm, threshold=args.threshold, workers=args.workers)
    texts, truth = generate(args.docs, args.dup_rate, args.seed)
    sub = texts[: min(args.baseline_docs, len(texts))]
    print(f"{len(texts)} documents, {len(truth)} planted copies, {sum(len(t) for t in texts) / 1e6:.0f} MB of text")

    load_start = os.getloadavg()[0]
    signatures = signature_figures(texts, sub, cfg)
    if signatures is None:
        print("ERROR: our signatures differ from datasketch's", file=sys.stderr)
        return 1
    fig = {
        "docs": len(texts),
        "planted_copies": len(truth),
        "workers": plan_workers(cfg, len(texts)),
        "cpu_cores": os.cpu_count(),
        **signatures,
        **stage_figures(texts, truth, cfg),
        "bench_process_peak_rss_mb": round(maxrss_mb(resource.RUSAGE_SELF), 1),  # holds all texts and signatures
    }
    fig["load_avg_1m_start_end"] = f"{load_start:.2f} / {os.getloadavg()[0]:.2f}"
    width = max(map(len, fig))
    print(f"\n{'figure':<{width}}  value")
    for key, value in fig.items():
        print(f"{key:<{width}}  {value}")
    if args.json:
        args.json.write_text(json.dumps(fig, indent=2))
    return 0


if __name__ == "__main__":  # spawned workers re-import this file; only the parent runs the benchmark
    sys.exit(main())
