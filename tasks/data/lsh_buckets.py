"""Out-of-core LSH: band records, candidate pairs and signatures spilled to disk.

Every structure here lives in files of a spill folder and is read back in bounded pieces,
so the memory of near dedup does not grow with the corpus:
- `SignatureFile`: fixed-width signature rows, appended in document order, read back by
  range (`np.fromfile` at an offset) or by row (`os.pread`): a memmap would do too, but
  every page it touches counts in the process's RSS until it is unmapped.
- `BandSpill`: one (band hash, document index) record per band of each indexed document,
  split into partition files by hash, so a partition holds whole buckets.
- `candidate_pairs`: per partition, the (earlier, later) pairs of documents sharing a bucket;
  a bucket of k members would give k(k-1)/2 pairs, so each member is paired with at most
  the `cap` earliest members before it (and the times that cut anything are counted).
- `PairSpill`: candidate pairs split into files by the later document's range of rows,
  so that the keep rule can visit later documents in input order.
- `ShingleSetFile`: each document's sorted distinct 64-bit shingle hashes, appended in
  document order, with a file of uint64 offsets; the sets of a piece of candidate pairs are
  read back (not mapped) to compute the exact Jaccard of many pairs at once.
"""
from __future__ import annotations

import os
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

import numpy as np

BAND_RECORD = np.dtype([("h", "<u8"), ("d", "<u4")])
PAIR_RECORD = np.dtype([("earlier", "<u4"), ("later", "<u4")])
# Buffered bytes across all files of a spill before they are appended to disk.
_BUFFER_BYTES = 8 << 20
# Candidate pairs generated (and verified) at once: bounds the pair arrays and the earlier
# documents' signatures read for them (at most this many rows).
PAIR_CHUNK = 1 << 17
_FOLD = np.uint64(0x9E3779B97F4A7C15)
# Shingle hashes of both sides of the pairs whose exact Jaccard is computed at once (8 bytes each
# as keys, a few arrays of them): bounds the memory of pass 3 whatever the documents' lengths,
# and the bytes of the sets one piece reads; larger pieces save no CPU.
_SET_CELLS = 1 << 20


def fmix64(h: np.ndarray) -> np.ndarray:
    """MurmurHash3's 64-bit finaliser, on a copy."""
    with np.errstate(over="ignore"):
        h = h ^ (h >> np.uint64(33))
        h *= np.uint64(0xFF51AFD7ED558CCD)
        h ^= h >> np.uint64(33)
        h *= np.uint64(0xC4CEB9FE1A85EC53)
        return h ^ (h >> np.uint64(33))


def band_hashes(sigs: np.ndarray, bands: int, rows: int) -> np.ndarray:
    """[n, bands] uint64: a hash of each band's `rows` signature values, and of the band's
    number, so that equal values in different bands are different buckets."""
    out = np.empty((len(sigs), bands), dtype=np.uint64)
    with np.errstate(over="ignore"):
        for k in range(bands):
            h = np.full(len(sigs), fmix64(np.array([k + 1], dtype=np.uint64))[0], dtype=np.uint64)
            for c in range(k * rows, (k + 1) * rows):
                h ^= sigs[:, c].astype(np.uint64)
                h *= _FOLD
            out[:, k] = fmix64(h)
    return out


class _AppendFiles:
    """Appends byte chunks to many files through one bounded buffer."""

    def __init__(self, paths: list[Path]):
        self.paths = paths
        self._pending: dict[int, list[bytes]] = defaultdict(list)
        self._size = 0
        self.bytes_written = 0
        for p in paths:
            p.touch()

    def append(self, key: int, data: bytes) -> None:
        self._pending[key].append(data)
        self._size += len(data)
        if self._size >= _BUFFER_BYTES:
            self.flush()

    def append_runs(self, keys: np.ndarray, rec: np.ndarray) -> None:
        """Append each run of equal `keys` (`rec` is sorted by them) to the file of that key."""
        bounds = np.flatnonzero(np.r_[True, keys[1:] != keys[:-1], True])
        for s, e in zip(bounds[:-1], bounds[1:]):
            self.append(int(keys[s]), rec[s:e].tobytes())

    def flush(self) -> None:
        for key, parts in self._pending.items():
            with open(self.paths[key], "ab") as fh:
                fh.write(b"".join(parts))
        self.bytes_written += self._size
        self._pending.clear()
        self._size = 0


class SignatureFile:
    """Signature rows of `num_perm` values of `dtype`, one per document, in input order."""

    def __init__(self, path: Path, num_perm: int, dtype: np.dtype):
        self.path, self.num_perm, self.dtype = path, num_perm, np.dtype(dtype)
        self.row_bytes = num_perm * self.dtype.itemsize
        self.rows = 0
        self._fh = open(path, "wb")

    def append(self, sigs: np.ndarray) -> None:
        self._fh.write(np.ascontiguousarray(sigs, dtype=self.dtype).tobytes())
        self.rows += len(sigs)

    def close_writing(self) -> None:
        self._fh.close()

    def read_range(self, start: int, stop: int) -> np.ndarray:
        """Rows start..stop-1."""
        count = (stop - start) * self.num_perm
        out = np.fromfile(self.path, dtype=self.dtype, count=count, offset=start * self.row_bytes)
        return out.reshape(stop - start, self.num_perm)

    def read_rows(self, rows: np.ndarray) -> np.ndarray:
        """The given rows (any order), one pread each."""
        rb = self.row_bytes
        fd = os.open(self.path, os.O_RDONLY)
        try:
            buf = b"".join([os.pread(fd, rb, r * rb) for r in rows.tolist()])
        finally:
            os.close(fd)
        return np.frombuffer(buf, dtype=self.dtype).reshape(len(rows), self.num_perm)


class BandSpill:
    """Band records of indexed documents, in `partitions` files chosen by hash bits."""

    def __init__(self, folder: Path, partitions: int):
        self.partitions = partitions
        self.files = _AppendFiles([folder / f"bands-{p:04d}.bin" for p in range(partitions)])
        self.records = 0

    def add(self, hashes: np.ndarray, doc_index: np.ndarray) -> None:
        """Records of `hashes` [n, bands] for documents `doc_index` [n] (document-major, so every
        partition file stays in document order)."""
        rec = np.empty(hashes.size, dtype=BAND_RECORD)
        rec["h"] = hashes.ravel()
        rec["d"] = np.repeat(doc_index.astype(np.uint32), hashes.shape[1])
        part = ((rec["h"] >> np.uint64(40)) % np.uint64(self.partitions)).astype(np.int64)
        order = np.argsort(part, kind="stable")
        rec, part = rec[order], part[order]
        self.files.append_runs(part, rec)
        self.records += len(rec)

    def close(self) -> list[Path]:
        self.files.flush()
        return self.files.paths


def candidate_pairs(path: Path, cap: int) -> Iterator[tuple[np.ndarray, np.ndarray, int]]:
    """(earlier, later, cap_hits) chunks of the pairs of documents sharing a bucket of one
    band partition file; each member meets at most the `cap` earliest members before it."""
    rec = np.fromfile(path, dtype=BAND_RECORD)
    if len(rec) < 2:
        return
    # Files are in document order, so a stable sort by hash keeps each bucket in document order.
    order = np.argsort(rec["h"], kind="stable")
    h, d = rec["h"][order], rec["d"][order]
    del rec, order
    starts = np.flatnonzero(np.r_[True, h[1:] != h[:-1]])
    sizes = np.diff(np.r_[starts, len(h)])
    multi = sizes > 1
    if not multi.any():
        return
    # Keep only buckets with two or more members.
    keep = np.repeat(multi, sizes)
    d = d[keep]
    sizes = sizes[multi]
    bucket_start = np.repeat(np.cumsum(sizes) - sizes, sizes)
    rank = np.arange(len(d)) - bucket_start
    m = np.minimum(rank, cap)
    hits = int(np.count_nonzero(rank > cap))
    cm = np.cumsum(m)
    cuts = np.searchsorted(cm, np.arange(PAIR_CHUNK, int(cm[-1]), PAIR_CHUNK), side="left")
    bounds = np.unique(np.r_[0, cuts, len(d)])
    for t0, t1 in zip(bounds[:-1], bounds[1:]):
        mm = m[t0:t1]
        total = int(mm.sum())
        if total == 0:
            continue
        later = np.repeat(d[t0:t1], mm)
        first = np.repeat(bucket_start[t0:t1] - (np.cumsum(mm) - mm), mm)
        earlier = d[first + np.arange(total)]
        same = earlier != later  # a document's two bands in one bucket only by a hash collision
        yield earlier[same], later[same], hits
        hits = 0  # counted once per file


class PairSpill:
    """Candidate pairs in files by the later document's block of `block_rows` rows."""

    def __init__(self, folder: Path, n_docs: int, block_rows: int):
        self.block_rows = block_rows
        self.blocks = max(1, -(-n_docs // block_rows))
        self.files = _AppendFiles([folder / f"pairs-{q:05d}.bin" for q in range(self.blocks)])
        self.pairs = 0

    def add(self, earlier: np.ndarray, later: np.ndarray) -> None:
        key = np.unique((later.astype(np.uint64) << np.uint64(32)) | earlier.astype(np.uint64))  # sorted by later
        rec = np.empty(len(key), dtype=PAIR_RECORD)
        rec["later"] = (key >> np.uint64(32)).astype(np.uint32)
        rec["earlier"] = (key & np.uint64(0xFFFFFFFF)).astype(np.uint32)
        block = rec["later"] // np.uint32(self.block_rows)
        self.files.append_runs(block, rec)
        self.pairs += len(rec)

    def close(self) -> list[Path]:
        self.files.flush()
        return self.files.paths


def read_pair_chunks(path: Path) -> Iterator[np.ndarray]:
    """The pair records of one block file, PAIR_CHUNK at a time."""
    total = path.stat().st_size // PAIR_RECORD.itemsize
    for start in range(0, total, PAIR_CHUNK):
        yield np.fromfile(path, dtype=PAIR_RECORD, count=min(PAIR_CHUNK, total - start), offset=start * PAIR_RECORD.itemsize)


class ShingleSetFile:
    """Sorted distinct uint64 shingle hashes of each document, in input order (`path`), and the
    uint64 offset of each document's first one plus a final end (`path` + ".offsets")."""

    def __init__(self, path: Path):
        self.path, self.offsets_path = path, path.with_name(path.name + ".offsets")
        self.rows = 0
        self.values = 0
        self._fh = open(path, "wb")
        self._off = open(self.offsets_path, "wb")
        self._off.write(np.zeros(1, dtype="<u8").tobytes())

    @property
    def bytes_written(self) -> int:
        return self.values * 8 + (self.rows + 1) * 8

    def append(self, hashes: np.ndarray, counts: np.ndarray) -> None:
        """Sets of len(counts) documents: `hashes` flat, `counts` per document."""
        self._fh.write(np.ascontiguousarray(hashes, dtype="<u8").tobytes())
        ends = self.values + np.cumsum(counts, dtype=np.uint64)
        self._off.write(ends.astype("<u8").tobytes())
        self.values += len(hashes)
        self.rows += len(counts)

    def close_writing(self) -> None:
        self._fh.close()
        self._off.close()

    def jaccard(self, first: np.ndarray, second: np.ndarray) -> np.ndarray:
        """|A∩B| / |A∪B| of the sets of documents first[i] and second[i] (none empty), float64."""
        if len(first) == 0:
            return np.empty(0, dtype=np.float64)
        first, second = first.astype(np.int64), second.astype(np.int64)
        offsets = np.memmap(self.offsets_path, dtype="<u8", mode="r")
        a0, b0 = offsets[first].astype(np.int64), offsets[second].astype(np.int64)
        a_len, b_len = offsets[first + 1].astype(np.int64) - a0, offsets[second + 1].astype(np.int64) - b0
        del offsets
        inter = np.zeros(len(first), dtype=np.int64)
        cum = np.cumsum(a_len + b_len)
        cuts = np.searchsorted(cum, np.arange(_SET_CELLS, int(cum[-1]), _SET_CELLS), side="left")
        bounds = np.unique(np.r_[0, cuts, len(first)])
        fd = os.open(self.path, os.O_RDONLY)
        try:
            for s, e in zip(bounds[:-1].tolist(), bounds[1:].tolist()):
                inter[s:e] = self._intersections(fd, a0[s:e], a_len[s:e], b0[s:e], b_len[s:e])
        finally:
            os.close(fd)
        return inter / (a_len + b_len - inter)

    @staticmethod
    def _read_sets(fd: int, start: np.ndarray, length: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The sets at `start` of `length`, read into one array (adjacent sets in one read),
        and where each set begins in it.

        Read, not mapped: the kernel maps 64 KB around every page fault of a file map, so a
        few thousand random sets would map most of the file into the process's RSS."""
        starts, first_of = np.unique(start, return_index=True)
        lengths = length[first_of]
        ends = starts + lengths
        new_run = np.r_[True, starts[1:] != ends[:-1]]
        run_starts, run_ends = starts[new_run], ends[np.r_[new_run[1:], True]]
        raw = b"".join([os.pread(fd, (e - s) * 8, s * 8) for s, e in zip(run_starts.tolist(), run_ends.tolist())])
        # Dense ranks in place of the 64-bit hashes: equal iff the hashes are, ordered as they
        # are, and under 2^32, so (pair << 32 | rank) keys still sort and match in one uint64.
        values = np.unique(np.frombuffer(raw, dtype="<u8"), return_inverse=True)[1].astype(np.uint64)
        placed = np.cumsum(lengths) - lengths
        return values, placed[np.searchsorted(starts, start)]

    @staticmethod
    def _keys(values: np.ndarray, start: np.ndarray, length: np.ndarray) -> np.ndarray:
        """Keys (pair << 32 | hash rank) of the sets at `start` of `length` in `values`, sorted: sets
        are sorted and pairs ascend."""
        total = int(length.sum())
        index = np.repeat(start - (np.cumsum(length) - length), length) + np.arange(total)
        pair = np.repeat(np.arange(len(length), dtype=np.uint64), length)
        return (pair << np.uint64(32)) | values[index].astype(np.uint64)

    def _intersections(self, fd: int, a0: np.ndarray, a_len: np.ndarray, b0: np.ndarray, b_len: np.ndarray) -> np.ndarray:
        n = len(a0)
        values, placed = self._read_sets(fd, np.r_[a0, b0], np.r_[a_len, b_len])
        ka, kb = self._keys(values, placed[:n], a_len), self._keys(values, placed[n:], b_len)
        # Each key of B found in A is one shared shingle of its pair (keys are distinct within a side).
        pos = np.searchsorted(ka, kb)
        np.minimum(pos, len(ka) - 1, out=pos)
        hit = ka[pos] == kb
        return np.bincount((kb[hit] >> np.uint64(32)).astype(np.int64), minlength=n)


def resolve_block(edges: np.ndarray, kept: np.ndarray) -> np.ndarray:
    """The greedy keep rule over one block's verified edges, in document order: a document
    with a kept earlier neighbour is removed (marked in `kept`); its target is the most
    similar kept neighbour, earliest on ties. Returns the block's removals."""
    if len(edges) == 0:
        return edges
    docs, targets, sims = edges["doc"], edges["target"], edges["similarity"]
    bounds = np.flatnonzero(np.r_[True, docs[1:] != docs[:-1], True]).tolist()
    out = []
    for s, e in zip(bounds[:-1], bounds[1:]):
        alive = kept[targets[s:e]]
        if not alive.any():
            continue
        cand = np.where(alive, sims[s:e], -1.0)
        best = s + int(np.argmax(cand))  # first maximum: earliest target on ties
        kept[docs[s]] = False
        out.append(best)
    return edges[np.asarray(out, dtype=np.int64)]
