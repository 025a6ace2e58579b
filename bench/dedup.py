"""Near-dedup benchmark: ours side by side with rensa, datatrove and datasketch, in CPU seconds.

The corpus is synthetic: texts of 200-400 Zipf-distributed words, of which a --dup-rate share
are edited copies (0-10 words substituted or inserted) of an earlier original, so the planted
pairs' exact word-5-gram Jaccard spreads over about 0.6-1.0 (about half of them in
[0.8, 0.95)). Every tool gets the same texts, the same shingles (word 5-grams of the
whitespace split) and 128 permutations. Times are CPU seconds (process plus joined child
processes; all threads), so the figures hold on a shared machine; wall seconds are shown
for reference only.

1. Signatures per CPU-second, from the raw texts (each tool's shingling included):
   ours (xxh3 scheme, one process; affine32 scheme, bit-identical to datasketch; and with
   --workers processes), rensa `RMinHash` per document (`update(shingles)`, `digest()`) and
   rensa's batch `digest_matrix_from_token_sets` (for reference), datasketch's `update` loop
   and `MinHash.bulk` (checked bit-identical to our affine32) and datatrove 0.10's
   `MinhashDedupSignature.run` (16 buckets x 8 hashes, whitespace word tokenizer, writing
   to a temporary folder). The slow ones (datasketch, datatrove) run on --baseline-docs.
2. Whole near-dedup of one Parquet file, each tool in a fresh spawned process, reading the
   file and writing kept and removed documents:
   ours: the near_dedup stage (tasks/data/near_dedup.py);
   rensa: `RMinHash.from_token_sets` per batch + `RMinHashLSH(threshold, 128, --rensa-bands)`
     with our keep rule (documents in input order; removed when an already-kept LSH
     candidate has rensa's estimated Jaccard >= threshold, else inserted and kept);
   datatrove: its four MinHash stages (signature, buckets, cluster, filter) on local
     folders, 5-grams, --datatrove-banding (default 16x8 = 128 hashes).
   Per tool: docs per CPU-second (imports excluded, the stage's worker processes included),
   peak RSS (VmHWM of the fresh process; with workers, the sampled sum of all processes),
   recall of the planted pairs at true Jaccard >= 0.8 and >= 0.9 (a pair counts as found
   when either of its two documents is removed) and false removals (removed documents that
   are not planted copies).
3. Goals, printed PASS/FAIL: our signatures >= rensa RMinHash's per CPU-second; our whole
   near-dedup within 1.5x of rensa's CPU seconds; our recall at J >= 0.8 >= rensa's.

    .venv/bin/python bench/dedup.py                          # 20,000 documents, a few minutes on 2 cores
    .venv/bin/python bench/dedup.py --docs 2000              # quick check
    .venv/bin/python bench/dedup.py --docs 100000 --json /tmp/dedup.json
    .venv/bin/python bench/dedup.py --skip-datatrove --profile 25   # + cProfile of our stage, top 25
"""
from __future__ import annotations

# Top-level imports stay light: the whole-dedup runs spawn fresh interpreters that import this
# file, and a rensa or datatrove run must not carry our stack's imports (prefect, ...) in its RSS.
import argparse
import json
import multiprocessing
import os
import resource
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

METHODS = ("ours", "rensa", "datatrove")
CPU_GOAL_RATIO = 1.5  # whole near-dedup: our CPU seconds at most this times rensa's


# ---------------------------------------------------------------------------------------------
# corpus


def word_shingles(text: str, n: int) -> list[str]:
    """Word n-grams joined by one space: the same as tasks.data.minhash_signatures.shingles
    (checked in main), here so that the rensa child does not import our package."""
    words = text.split()
    if len(words) <= n:
        return [" ".join(words)] if words else []
    return [" ".join(words[i : i + n]) for i in range(len(words) - n + 1)]


def generate(n_docs: int, dup_rate: float, seed: int, ngram: int = 5) -> tuple[list[str], dict[int, tuple[int, float]]]:
    """Texts of 200-400 Zipf-distributed words; a `dup_rate` share are edited copies of an
    earlier text. Returns the texts and {copy index: (original index, exact n-gram Jaccard)}."""
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
            a, b = set(word_shingles(texts[src], ngram)), set(word_shingles(" ".join(doc), ngram))
            truth[i] = (src, len(a & b) / len(a | b))
        texts.append(" ".join(doc))
    return texts, truth


# ---------------------------------------------------------------------------------------------
# measurement


def cpu_seconds() -> float:
    """CPU time of this process (all threads) and of its joined children (worker pools are joined when closed)."""
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def children_cpu_seconds() -> float:
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return kids.ru_utime + kids.ru_stime


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


def best_of(fn: Callable[[], object], repeats: int, warm: Callable[[], object] | None = None) -> tuple[object, float, float]:
    """(result, CPU seconds, wall seconds) of the run of `fn` with the least CPU among `repeats`,
    after one untimed `warm` call (first-call costs: imports, caches, lazy tables)."""
    if warm is not None:
        warm()
    best = None
    for _ in range(max(1, repeats)):
        cpu0, wall0 = cpu_seconds(), time.perf_counter()
        out = fn()
        cpu, wall = cpu_seconds() - cpu0, time.perf_counter() - wall0
        if best is None or cpu < best[1]:
            best = (out, cpu, wall)
        del out
    return best


# ---------------------------------------------------------------------------------------------
# signatures, each tool's way, from raw texts


def sig_ours(texts: list[str], cfg) -> np.ndarray:
    from tasks.data.near_dedup import compute_signatures

    return compute_signatures(texts, cfg)


def sig_rensa_objects(texts: list[str], num_perm: int, seed: int, ngram: int) -> list[list[int]]:
    """rensa's plain way: one RMinHash per document, update with its shingles, digest."""
    from rensa import RMinHash

    out = []
    for text in texts:
        m = RMinHash(num_perm, seed)
        m.update(word_shingles(text, ngram))
        out.append(m.digest())
    return out


def sig_rensa_batch(texts: list[str], num_perm: int, seed: int, ngram: int, batch: int) -> list:
    """rensa's bulk path: a digest matrix per batch of token lists."""
    from rensa import RMinHash

    return [
        RMinHash.digest_matrix_from_token_sets([word_shingles(t, ngram) for t in texts[i : i + batch]], num_perm, seed)
        for i in range(0, len(texts), batch)
    ]


def datasketch_loop(texts: list[str], cfg) -> np.ndarray:
    """The plain way: one MinHash per document, `update` per shingle."""
    from datasketch import MinHash

    perms = MinHash(cfg.num_perm, seed=cfg.seed, scheme=cfg.scheme).permutations
    out = []
    for text in texts:
        m = MinHash(cfg.num_perm, seed=cfg.seed, permutations=perms, scheme=cfg.scheme)
        for gram in word_shingles(text, cfg.ngram):
            m.update(gram.encode("utf-8"))
        out.append(m.hashvalues)
    return np.stack(out)


def datasketch_batch(texts: list[str], cfg) -> np.ndarray:
    """datasketch's own fastest CPU path: `MinHash.bulk` (update_batch per document)."""
    from datasketch import MinHash

    mhs = MinHash.bulk(
        ([g.encode("utf-8") for g in word_shingles(t, cfg.ngram)] for t in texts),
        num_perm=cfg.num_perm, seed=cfg.seed, scheme=cfg.scheme,
    )
    return np.stack([m.hashvalues for m in mhs])


def whitespace_tokenizer():
    """A datatrove WordTokenizer that splits on whitespace (its English default needs spacy)."""
    from datatrove.utils.word_tokenizers import WordTokenizer

    class Whitespace(WordTokenizer):
        def word_tokenize(self, text: str) -> list[str]:
            return text.split()

        def sent_tokenize(self, text: str) -> list[str]:
            return [text]

        def span_tokenize(self, text: str) -> list[tuple[int, int]]:
            return [(0, len(text))]

    return Whitespace("en")


def datatrove_config(p: dict):
    from datatrove.pipeline.dedup.minhash import MinhashConfig

    return MinhashConfig(n_grams=p["ngram"], num_buckets=p["dt_buckets"], hashes_per_bucket=p["dt_rows"], seed=p["seed"])


def quiet_datatrove() -> None:
    """No INFO lines on stderr for every datatrove step, no tqdm bar of its cluster stage."""
    os.environ["TQDM_DISABLE"] = "1"  # read by tqdm when a bar is made
    import datatrove.pipeline.dedup.minhash  # noqa: F401  (its import adds the log handler)
    from loguru import logger

    logger.remove()


def sig_datatrove(texts: list[str], p: dict) -> int:
    """datatrove's stage 1 (signatures into bucket files, sorted) on `texts`, in a temporary folder."""
    from datatrove.data import Document as DTDocument
    from datatrove.pipeline.dedup.minhash import MinhashDedupSignature

    with tempfile.TemporaryDirectory(prefix="bench-dt-sig-") as tmp:
        step = MinhashDedupSignature(tmp, config=datatrove_config(p), language=whitespace_tokenizer())
        step.run((DTDocument(text=t, id=str(i)) for i, t in enumerate(texts)), rank=0, world_size=1)
    return len(texts)


def signature_section(texts: list[str], sub: list[str], args: argparse.Namespace, p: dict) -> tuple[list[dict], dict]:
    """Rows (tool, docs, CPU s, docs per CPU-second) and summary figures; raises if signatures differ."""
    from tasks.data.near_dedup import NearDedupConfig, plan_workers

    base = NearDedupConfig(num_perm=p["num_perm"], threshold=p["threshold"], ngram=p["ngram"], seed=p["seed"], workers=1)
    one = base
    affine = base.model_copy(update={"scheme": "affine32"})
    pooled = base.model_copy(update={"workers": args.workers})
    warm_n = min(256, len(texts))
    rows: list[dict] = []
    reps = args.repeats

    def row(name: str, n: int, cpu: float, wall: float, note: str = "") -> None:
        rows.append({"tool": name, "docs": n, "cpu_s": round(cpu, 3), "wall_s": round(wall, 3),
                     "docs_per_cpu_s": round(n / cpu, 1) if cpu > 0 else float("inf"), "note": note})

    ours_one, c, w = best_of(lambda: sig_ours(texts, one), reps, lambda: sig_ours(texts[:warm_n], one))
    row("ours xxh3, 1 process", len(texts), c, w, "compute_signatures(workers=1)")
    ours_aff, c, w = best_of(lambda: sig_ours(texts, affine), reps, lambda: sig_ours(texts[:warm_n], affine))
    row("ours affine32, 1 process", len(texts), c, w, "bit-identical to datasketch")
    if args.workers != 1:
        ours_pool, c, w = best_of(lambda: sig_ours(texts, pooled), 1)
        if not np.array_equal(ours_pool, ours_one):
            raise RuntimeError("signatures with workers differ from one process's")
        row(f"ours xxh3, workers={args.workers}", len(texts), c, w,
            f"plan {plan_workers(pooled, len(texts))} (0 = auto); incl. worker start-up")
        del ours_pool
    _, c, w = best_of(lambda: sig_rensa_objects(texts, p["num_perm"], p["rensa_seed"], p["ngram"]), reps,
                      lambda: sig_rensa_objects(texts[:warm_n], p["num_perm"], p["rensa_seed"], p["ngram"]))
    row("rensa RMinHash, per doc", len(texts), c, w, "RMinHash(128, seed).update(shingles); digest()")
    _, c, w = best_of(lambda: sig_rensa_batch(texts, p["num_perm"], p["rensa_seed"], p["ngram"], p["batch_size"]), reps,
                      lambda: sig_rensa_batch(texts[:warm_n], p["num_perm"], p["rensa_seed"], p["ngram"], p["batch_size"]))
    row("rensa digest_matrix (batch)", len(texts), c, w, "RMinHash.digest_matrix_from_token_sets per 2048 docs")
    loop, c, w = best_of(lambda: datasketch_loop(sub, affine), reps, lambda: datasketch_loop(sub[:20], affine))
    row("datasketch update loop", len(sub), c, w, "MinHash.update per shingle, affine32")
    bulk, c, w = best_of(lambda: datasketch_batch(sub, affine), reps, lambda: datasketch_batch(sub[:20], affine))
    row("datasketch MinHash.bulk", len(sub), c, w, "update_batch per doc, affine32")
    if not (np.array_equal(loop, ours_aff[: len(sub)]) and np.array_equal(bulk, ours_aff[: len(sub)])):
        raise RuntimeError("our affine32 signatures differ from datasketch's")
    if not args.skip_datatrove:
        quiet_datatrove()
        _, c, w = best_of(lambda: sig_datatrove(sub, p), reps, lambda: sig_datatrove(sub[:20], p))
        row("datatrove MinhashDedupSignature", len(sub), c, w,
            f"{p['dt_buckets']}x{p['dt_rows']} hashes, 64-bit xxhash, incl. bucket sort")
    rate = {r["tool"]: r["docs_per_cpu_s"] for r in rows}
    rensa = rate["rensa RMinHash, per doc"]
    for r in rows:
        r["vs_rensa"] = round(r["docs_per_cpu_s"] / rensa, 2)
    ours = rate["ours xxh3, 1 process"]
    summary = {
        "sig_ours_docs_per_cpu_s": ours,
        "sig_rensa_docs_per_cpu_s": rensa,
        "sig_ratio_ours_vs_rensa": round(ours / rensa, 2),
        "sig_ratio_ours_vs_rensa_batch": round(ours / rate["rensa digest_matrix (batch)"], 2),
        "sig_ratio_affine32_vs_datasketch_bulk": round(rate["ours affine32, 1 process"] / rate["datasketch MinHash.bulk"], 2),
    }
    return rows, summary


# ---------------------------------------------------------------------------------------------
# whole near-dedup, one tool per fresh process


def write_split(in_path: str, out_dir: Path, removed: np.ndarray, batch_size: int) -> None:
    """Stream `in_path` once more, writing kept and removed documents (all columns) to Parquet."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    pf = pq.ParquetFile(in_path)
    drop = np.zeros(pf.metadata.num_rows, dtype=np.bool_)
    drop[removed] = True
    start = 0
    with pq.ParquetWriter(out_dir / "kept.parquet", pf.schema_arrow) as kept, \
            pq.ParquetWriter(out_dir / "removed.parquet", pf.schema_arrow) as gone:
        for batch in pf.iter_batches(batch_size):
            mask = drop[start : start + batch.num_rows]
            start += batch.num_rows
            table = pa.Table.from_batches([batch])
            kept.write_table(table.filter(pa.array(~mask)))
            if mask.any():
                gone.write_table(table.filter(pa.array(mask)))


def rensa_dedup(in_path: str, out_dir: Path, p: dict) -> tuple[np.ndarray, dict]:
    """Our keep rule with rensa: RMinHash sketches (batch-built), RMinHashLSH, rensa's Jaccard estimate."""
    import pyarrow.parquet as pq
    from rensa import RMinHash, RMinHashLSH

    num_perm, seed, ngram, threshold = p["num_perm"], p["rensa_seed"], p["ngram"], p["threshold"]
    lsh = RMinHashLSH(threshold, num_perm, p["rensa_bands"])
    kept: dict[int, RMinHash] = {}
    removed: list[int] = []
    candidates = 0
    i = 0
    for batch in pq.ParquetFile(in_path).iter_batches(p["batch_size"], columns=["text"]):
        grams = [word_shingles(t, ngram) for t in batch.column(0).to_pylist()]
        for g, m in zip(grams, RMinHash.from_token_sets(grams, num_perm, seed)):
            if g:  # documents without words are kept and not indexed, as ours
                found = lsh.query(m)
                candidates += len(found)
                if any(kept[k].jaccard(m) >= threshold for k in found):
                    removed.append(i)
                else:
                    lsh.insert(i, m)
                    kept[i] = m
            i += 1
    removed_arr = np.asarray(removed, dtype=np.int64)
    write_split(in_path, out_dir, removed_arr, p["batch_size"])
    return removed_arr, {"bands": f"{p['rensa_bands']}x{num_perm // p['rensa_bands']}", "candidates": candidates}


def datatrove_dedup(in_path: str, out_dir: Path, p: dict) -> tuple[np.ndarray, dict]:
    """datatrove's four MinHash stages on local folders (one task; buckets stage: one task per bucket)."""
    import pyarrow.parquet as pq
    from datatrove.data import Document as DTDocument
    from datatrove.pipeline.dedup.minhash import (MinhashDedupBuckets, MinhashDedupCluster, MinhashDedupFilter,
                                                  MinhashDedupSignature)

    cfg = datatrove_config(p)
    root = out_dir / "datatrove"

    def documents():
        for batch in pq.ParquetFile(in_path).iter_batches(p["batch_size"], columns=["doc_id", "text"]):
            for doc_id, text in zip(batch.column(0).to_pylist(), batch.column(1).to_pylist()):
                yield DTDocument(text=text, id=doc_id)

    MinhashDedupSignature(str(root / "sigs"), config=cfg, language=whitespace_tokenizer()).run(documents(), 0, 1)
    buckets = MinhashDedupBuckets(str(root / "sigs"), str(root / "buckets"), config=cfg)
    for bucket in range(cfg.num_buckets):
        buckets.run(None, bucket, cfg.num_buckets)
    MinhashDedupCluster(str(root / "buckets"), str(root / "remove"), config=cfg).run(None, 0, 1)
    n_docs = pq.ParquetFile(in_path).metadata.num_rows
    kept = np.zeros(n_docs, dtype=np.bool_)
    for doc in MinhashDedupFilter(str(root / "remove")).run(documents(), 0, 1):
        kept[int(doc.id[1:])] = True  # ids are "d<index>"
    removed = np.flatnonzero(~kept)
    write_split(in_path, out_dir, removed, p["batch_size"])
    return removed, {"bands": f"{cfg.num_buckets}x{cfg.hashes_per_bucket}"}


def ours_dedup(in_path: str, out_dir: Path, p: dict) -> tuple[np.ndarray, dict]:
    from tasks.data.near_dedup import NearDedupConfig, near_dedup

    bands, rows = p.get("ours_banding") or (None, None)
    cfg = NearDedupConfig(num_perm=p["num_perm"], threshold=p["threshold"], ngram=p["ngram"], seed=p["seed"],
                          workers=p["workers"], batch_size=p["batch_size"], bands=bands, rows=rows)
    result = near_dedup(Path(in_path), out_dir / "kept.parquet", out_dir / "removed.parquet", cfg)
    stats = dict(result.stats)
    return np.empty(0, dtype=np.int64), {  # removed ids are read from removed.parquet after the timing
        "bands": f"{stats['lsh_bands']}x{stats['lsh_rows']}",
        "candidates": stats["candidate_pairs"],
        "workers": stats["workers"],
        "worker_plan": stats["worker_plan"],
        "cpu_s_signatures": stats["cpu_seconds_signatures"],
        "cpu_s_lsh_keep_rule": stats["cpu_seconds_lsh"],
    }


def _preload(method: str) -> None:
    """Imports of a tool, done before its timing starts."""
    import pyarrow.parquet  # noqa: F401

    if method == "ours":
        import tasks.data.near_dedup  # noqa: F401
    elif method == "rensa":
        import rensa  # noqa: F401
    else:
        quiet_datatrove()


def dedup_child(method: str, in_path: str, out_dir: str, p: dict) -> dict:
    """Runs in a fresh spawned process: one tool's whole near-dedup, its CPU seconds (this
    process and its joined children, imports excluded) and memory.

    VmHWM, not ru_maxrss: a spawned process inherits the ru_maxrss of the (large) parent it
    was forked from, while VmHWM belongs to its own address space. Worker processes (ours
    only) are sampled every 0.1 s, so a shorter peak could be missed; the sampler's own CPU
    time is subtracted."""
    _preload(method)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    rss_imports = proc_status_mb("self", "VmHWM")
    peak_total = 0.0
    sampler_cpu = 0.0
    done = threading.Event()

    def sample() -> None:
        nonlocal peak_total, sampler_cpu
        t0 = time.thread_time()
        while not done.wait(0.1):
            peak_total = max(peak_total, proc_status_mb("self", "VmRSS") + children_rss_mb(os.getpid()))
        sampler_cpu = time.thread_time() - t0

    sampler = threading.Thread(target=sample, daemon=True)
    if method == "ours":
        sampler.start()
    run = {"ours": ours_dedup, "rensa": rensa_dedup, "datatrove": datatrove_dedup}[method]
    cpu0, wall0 = cpu_seconds(), time.perf_counter()
    removed, extra = run(in_path, out, p)
    cpu, wall = cpu_seconds() - cpu0, time.perf_counter() - wall0
    done.set()
    if sampler.is_alive():
        sampler.join()
    if method == "ours":
        import pyarrow.parquet as pq

        ids = pq.read_table(out / "removed.parquet", columns=["doc_id"]).column(0).to_pylist()
        removed = np.asarray([int(d[1:]) for d in ids], dtype=np.int64)
    rss_self = proc_status_mb("self", "VmHWM")
    return {
        "cpu_s": cpu - sampler_cpu,
        "wall_s": wall,
        "rss_imports_mb": rss_imports,
        "peak_rss_mb": rss_self,
        "peak_rss_all_processes_mb": max(peak_total, rss_self) if method == "ours" else rss_self,
        "removed": removed.tolist(),
        **extra,
    }


def score(removed: list[int], truth: dict[int, tuple[int, float]], n_docs: int) -> dict:
    """Recall of planted pairs (found: either document removed) at true Jaccard >= 0.8 and >= 0.9,
    and false removals (removed documents that are not planted copies)."""
    gone = np.zeros(n_docs, dtype=np.bool_)
    gone[np.asarray(removed, dtype=np.int64)] = True
    copies = np.fromiter(truth.keys(), dtype=np.int64, count=len(truth))
    sources = np.fromiter((s for s, _ in truth.values()), dtype=np.int64, count=len(truth))
    jac = np.fromiter((j for _, j in truth.values()), dtype=np.float64, count=len(truth))
    found = gone[copies] | gone[sources]
    planted = np.zeros(n_docs, dtype=np.bool_)
    planted[copies] = True
    false = gone & ~planted
    return {
        "removed": int(gone.sum()),
        "recall_J>=0.8": round(float(found[jac >= 0.8].mean()) if (jac >= 0.8).any() else 1.0, 4),
        "recall_J>=0.9": round(float(found[jac >= 0.9].mean()) if (jac >= 0.9).any() else 1.0, 4),
        "recall_J_0.8-0.9": round(float(found[(jac >= 0.8) & (jac < 0.9)].mean()) if ((jac >= 0.8) & (jac < 0.9)).any() else 1.0, 4),
        "removed_planted_J<0.8": int((gone[copies] & (jac < 0.8)).sum()),
        "false_removals": int(false.sum()),
        "false_removals_that_are_sources": int(false[np.unique(sources)].sum()),
    }


def dedup_section(texts: list[str], truth: dict, args: argparse.Namespace, p: dict) -> dict[str, dict]:
    import pyarrow.parquet as pq

    from tasks.data.documents import Document, documents_table

    runs = [(m, m, p) for m in METHODS if not (m == "datatrove" and args.skip_datatrove)]
    for b, r in args.ours_banding_extra:  # our stage again with an explicit banding, for comparison
        runs.append((f"ours {b}x{r}", "ours", {**p, "ours_banding": (b, r)}))
    results: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="bench-dedup-") as tmp:
        tmp = Path(tmp)
        docs = [Document(doc_id=f"d{i}", source="synthetic", text=t) for i, t in enumerate(texts)]
        path = tmp / "docs.parquet"
        pq.write_table(documents_table(docs), path, compression="zstd")
        del docs
        for label, method, params in runs:
            print(f"  near-dedup: {label} ...", flush=True)
            kids0 = children_cpu_seconds()
            with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as ex:
                r = ex.submit(dedup_child, method, str(path), str(tmp / label.replace(" ", "_")), params).result()
            r["cpu_s_incl_startup"] = children_cpu_seconds() - kids0  # interpreter start and imports too
            r.update(score(r.pop("removed"), truth, len(texts)))
            r["docs_per_cpu_s"] = len(texts) / r["cpu_s"]
            results[label] = r
        if args.profile:
            profile_ours(path, tmp / "profile", p, args.profile)
    return results


def profile_ours(path: Path, out: Path, p: dict, top: int) -> None:
    """cProfile of our near_dedup in this process (one worker), top functions by own time."""
    import cProfile
    import pstats

    from tasks.data.near_dedup import NearDedupConfig, near_dedup

    cfg = NearDedupConfig(num_perm=p["num_perm"], threshold=p["threshold"], ngram=p["ngram"], seed=p["seed"],
                          workers=1, batch_size=p["batch_size"])
    out.mkdir(parents=True, exist_ok=True)
    prof = cProfile.Profile(time.process_time)
    prof.enable()
    near_dedup(path, out / "kept.parquet", out / "removed.parquet", cfg)
    prof.disable()
    stats = pstats.Stats(prof)
    total = stats.total_tt
    print(f"\ncProfile of our near_dedup (workers=1, CPU clock): {total:.2f} CPU s")
    entries = sorted(stats.stats.items(), key=lambda kv: kv[1][2], reverse=True)[:top]
    print(f"  {'own s':>7} {'share':>6} {'cum s':>7}  function")
    for (file, line, name), (_, calls, tt, ct, _) in entries:
        where = file.replace(str(ROOT) + "/", "").replace(sys.prefix + "/", "")
        print(f"  {tt:7.3f} {tt / total:6.1%} {ct:7.3f}  {name} ({where}:{line}, {calls} calls)")
    ours = sorted(((k, v) for k, v in stats.stats.items() if k[0].startswith(str(ROOT / "tasks"))),
                  key=lambda kv: kv[1][3], reverse=True)[:top]
    print(f"\n  our functions by cumulative time:\n  {'cum s':>7} {'share':>6}  function")
    for (file, line, name), (_, _, _, ct, _) in ours:
        print(f"  {ct:7.3f} {ct / total:6.1%}  {name} ({file.replace(str(ROOT) + '/', '')}:{line})")


# ---------------------------------------------------------------------------------------------
# report


def print_table(rows: list[dict], columns: list[tuple[str, str]]) -> None:
    cells = [[h for _, h in columns]] + [[_fmt(r.get(k, "")) for k, _ in columns] for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(columns))]
    for j, row in enumerate(cells):
        print("  " + "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths))))
        if j == 0:
            print("  " + "  ".join("-" * w for w in widths))


def _fmt(v) -> str:
    if isinstance(v, float):
        return f"{v:,.0f}" if abs(v) >= 1000 else f"{v:.4g}" if abs(v) < 10 else f"{v:,.1f}"
    return f"{v:,}" if isinstance(v, int) else str(v)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--docs", type=int, default=20_000, help="documents to generate (default 20000: a few minutes on 2 cores)")
    ap.add_argument("--dup-rate", type=float, default=0.1, help="share of documents that are edited copies (default 0.1)")
    ap.add_argument("--baseline-docs", type=int, default=2000,
                    help="documents for the slow signature baselines, datasketch and datatrove (default 2000)")
    ap.add_argument("--workers", type=int, default=0,
                    help="our signature processes in the whole near-dedup and the pooled signature row; 0 = auto (default)")
    ap.add_argument("--num-perm", type=int, default=128, help="permutations of every tool (default 128)")
    ap.add_argument("--threshold", type=float, default=0.8, help="Jaccard threshold of ours and rensa (default 0.8)")
    ap.add_argument("--rensa-bands", type=int, default=16,
                    help="bands of RMinHashLSH; must divide --num-perm (default 16: 16x8 at 128 permutations)")
    ap.add_argument("--datatrove-banding", default=None, metavar="BxR",
                    help="datatrove buckets x hashes per bucket (default: num_perm/8 x 8, i.e. 16x8)")
    ap.add_argument("--ours-banding", action="append", default=[], metavar="BxR",
                    help="also run our stage with this explicit LSH banding (repeatable), e.g. 16x8 as rensa's; "
                         "the goals use our default banding")
    ap.add_argument("--repeats", type=int, default=2, help="timed runs per signature row, the least CPU counts (default 2)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the synthetic corpus (default 0)")
    ap.add_argument("--skip-datatrove", action="store_true", help="leave datatrove out of both sections")
    ap.add_argument("--skip-signatures", action="store_true", help="only the whole near-dedup section")
    ap.add_argument("--skip-near-dedup", action="store_true", help="only the signature section")
    ap.add_argument("--profile", type=int, default=0, metavar="TOP",
                    help="also cProfile our near_dedup in-process (workers=1) and print the TOP hot spots")
    ap.add_argument("--json", type=Path, help="also write all figures to this JSON file")
    args = ap.parse_args(argv)
    if args.num_perm % args.rensa_bands:
        ap.error(f"--rensa-bands {args.rensa_bands} must divide --num-perm {args.num_perm}")
    if args.datatrove_banding is None:
        args.datatrove_banding = f"{max(1, args.num_perm // 8)}x{min(8, args.num_perm)}"
    try:
        args.dt_buckets, args.dt_rows = map(int, args.datatrove_banding.lower().split("x"))
    except ValueError:
        ap.error(f"--datatrove-banding {args.datatrove_banding!r}: expected BxR, e.g. 16x8")
    args.ours_banding_extra = []
    for spec in args.ours_banding:
        try:
            b, r = map(int, spec.lower().split("x"))
        except ValueError:
            ap.error(f"--ours-banding {spec!r}: expected BxR, e.g. 16x8")
        if b < 2 or r < 1 or b * r > args.num_perm:
            ap.error(f"--ours-banding {spec}: needs bands >= 2, rows >= 1 and bands * rows <= --num-perm")
        args.ours_banding_extra.append((b, r))
    return args


def goal(name: str, ok: bool, detail: str) -> dict:
    print(f"  {'PASS' if ok else 'FAIL'}  {name}: {detail}")
    return {"goal": name, "pass": ok, "detail": detail}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from tasks.data.minhash_signatures import shingles
    from tasks.data.near_dedup import NearDedupConfig, banding

    cfg = NearDedupConfig(num_perm=args.num_perm, threshold=args.threshold)
    p = {
        "num_perm": args.num_perm, "threshold": args.threshold, "ngram": cfg.ngram, "seed": cfg.seed,
        "rensa_seed": cfg.seed, "rensa_bands": args.rensa_bands, "dt_buckets": args.dt_buckets, "dt_rows": args.dt_rows,
        "workers": args.workers, "batch_size": cfg.batch_size,
    }
    texts, truth = generate(args.docs, args.dup_rate, args.seed, cfg.ngram)
    if any(word_shingles(t, cfg.ngram) != shingles(t, cfg.ngram) for t in texts[:200]):
        raise RuntimeError("word_shingles differs from tasks.data.minhash_signatures.shingles")
    sub = texts[: min(args.baseline_docs, len(texts))]
    jac = np.array([j for _, j in truth.values()])
    b, r = banding(cfg)
    print(f"{len(texts):,} documents, {sum(len(t) for t in texts) / 1e6:.0f} MB of text, {len(truth):,} planted copies: "
          f"{(jac >= 0.9).sum()} at J >= 0.9, {((jac >= 0.8) & (jac < 0.9)).sum()} in [0.8, 0.9), "
          f"{((jac >= 0.8) & (jac < 0.95)).sum()} in [0.8, 0.95), {(jac < 0.8).sum()} below 0.8")
    print(f"{args.num_perm} permutations, word {cfg.ngram}-grams, threshold {args.threshold}; LSH banding: ours {b}x{r}, "
          f"rensa {args.rensa_bands}x{args.num_perm // args.rensa_bands}, datatrove {args.dt_buckets}x{args.dt_rows}")
    load_start = os.getloadavg()[0]
    fig: dict = {"docs": len(texts), "planted_copies": len(truth), "cpu_cores": os.cpu_count(), "params": p}
    goals: list[dict] = []

    if not args.skip_signatures:
        print("\nsignatures ...", flush=True)
        rows, summary = signature_section(texts, sub, args, p)
        print(f"\n1. MinHash signatures from raw text, {args.num_perm} permutations (best of {args.repeats} by CPU)")
        print_table(rows, [("tool", "tool"), ("docs", "docs"), ("cpu_s", "CPU s"), ("docs_per_cpu_s", "docs/CPU-s"),
                           ("vs_rensa", "x rensa"), ("wall_s", "wall s"), ("note", "note")])
        print(f"  ours / rensa RMinHash per CPU-second: {summary['sig_ratio_ours_vs_rensa']:.2f}x "
              f"(vs rensa's batch digest matrix: {summary['sig_ratio_ours_vs_rensa_batch']:.2f}x)")
        fig["signatures"] = rows
        fig.update(summary)

    if not args.skip_near_dedup:
        print("\nwhole near-dedup ...", flush=True)
        res = dedup_section(texts, truth, args, p)
        rows = [{"tool": m, **v} for m, v in res.items()]
        print(f"\n2. Whole near-dedup of {len(texts):,} documents (fresh process each; CPU excludes imports)")
        print_table(rows, [("tool", "tool"), ("bands", "bands"), ("cpu_s", "CPU s"), ("docs_per_cpu_s", "docs/CPU-s"),
                           ("cpu_s_incl_startup", "CPU s +start"), ("wall_s", "wall s"), ("peak_rss_mb", "peak RSS MB"),
                           ("rss_imports_mb", "of it imports"), ("peak_rss_all_processes_mb", "RSS all procs")])
        print()
        print_table(rows, [("tool", "tool"), ("removed", "removed"), ("recall_J>=0.8", "recall J>=0.8"),
                           ("recall_J>=0.9", "recall J>=0.9"), ("recall_J_0.8-0.9", "recall J 0.8-0.9"),
                           ("removed_planted_J<0.8", "planted J<0.8 removed"), ("false_removals", "false removals")])
        if "ours" in res:
            o = res["ours"]
            print(f"  ours: workers {o['workers']} ({o['worker_plan']}); CPU s in signatures {o['cpu_s_signatures']}, "
                  f"LSH + keep rule {o['cpu_s_lsh_keep_rule']}, {o['candidates']:,} candidate pairs")
        if "datatrove" in res and res["datatrove"]["false_removals_that_are_sources"]:
            print(f"  datatrove: {res['datatrove']['false_removals_that_are_sources']} of its false removals are "
                  "originals dropped for a copy (its clusters keep the root, not the first document)")
        fig["near_dedup"] = res
        if "rensa" in res:
            ratio = res["ours"]["cpu_s"] / res["rensa"]["cpu_s"]
            fig["near_dedup_cpu_ratio_ours_vs_rensa"] = round(ratio, 2)
            fig["recall_J>=0.8_ours_ge_rensa"] = res["ours"]["recall_J>=0.8"] >= res["rensa"]["recall_J>=0.8"]
            print(f"  CPU ours / rensa: {ratio:.2f}x; our recall at J >= 0.8 >= rensa's: "
                  f"{fig['recall_J>=0.8_ours_ge_rensa']}")

    print("\n3. Goals")
    if "sig_ratio_ours_vs_rensa" in fig:
        s = fig
        goals.append(goal("signatures >= rensa RMinHash per CPU-second", s["sig_ratio_ours_vs_rensa"] >= 1.0,
                          f"{s['sig_ours_docs_per_cpu_s']:,.0f} vs {s['sig_rensa_docs_per_cpu_s']:,.0f} docs/CPU-s "
                          f"({s['sig_ratio_ours_vs_rensa']:.2f}x)"))
    if "near_dedup_cpu_ratio_ours_vs_rensa" in fig:
        res = fig["near_dedup"]
        goals.append(goal(f"whole near-dedup within {CPU_GOAL_RATIO}x of rensa's CPU",
                          fig["near_dedup_cpu_ratio_ours_vs_rensa"] <= CPU_GOAL_RATIO,
                          f"{res['ours']['cpu_s']:.2f} vs {res['rensa']['cpu_s']:.2f} CPU s "
                          f"({fig['near_dedup_cpu_ratio_ours_vs_rensa']:.2f}x)"))
        goals.append(goal("recall at J >= 0.8 at least rensa's", fig["recall_J>=0.8_ours_ge_rensa"],
                          f"{res['ours']['recall_J>=0.8']:.4f} vs {res['rensa']['recall_J>=0.8']:.4f}"))
    fig["goals"] = goals
    fig["bench_process_peak_rss_mb"] = round(maxrss_mb(resource.RUSAGE_SELF), 1)
    fig["load_avg_1m_start_end"] = f"{load_start:.2f} / {os.getloadavg()[0]:.2f}"
    print(f"\nload average (1 min) start / end: {fig['load_avg_1m_start_end']}")
    if args.json:
        args.json.write_text(json.dumps(fig, indent=2, default=float))
    return 0


if __name__ == "__main__":  # spawned children re-import this file; only the parent runs the benchmark
    sys.exit(main())
