"""The completion record of a stage's output folder: which files it holds, with their sha256.

A stage writes into `work/<part>/<stage>/<key>/`; once it returns, `write_record` lists
every file there (bytes + sha256) in `_stage.json`, written last and atomically, so its
presence means the folder is complete. A later run that would reuse the folder checks
it with `verify_record` first: a missing, changed or extra-truncated file is named and the
stage reruns. DeepSpeed checkpoints are left out: they carry their own SHA256SUMS and
change while a stage resumes.
"""
from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path
from typing import Any

from infra.workspace.atomic import write_json_atomic

RECORD_FILE = "_stage.json"
# Subfolders a record does not cover (verified by their own sums, or scratch).
UNRECORDED = ("checkpoints",)


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    """Hex sha256 of a file, read in chunks."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(chunk):
            h.update(block)
    return h.hexdigest()


def _recorded_files(out_dir: Path) -> list[Path]:
    files = []
    for p in sorted(out_dir.rglob("*")):
        rel = p.relative_to(out_dir)
        if not p.is_file() or rel.parts[0] in UNRECORDED or p.name == RECORD_FILE:
            continue
        if any(part.startswith(".") for part in rel.parts):  # staging and temporary files
            continue
        files.append(p)
    return files


def write_record(out_dir: Path, key: str, stage: str, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """List out_dir's files with their size and sha256 in out_dir/_stage.json; returns the record."""
    out_dir = Path(out_dir)
    files = {str(p.relative_to(out_dir)): {"bytes": p.stat().st_size, "sha256": sha256_file(p)} for p in _recorded_files(out_dir)}
    record = {
        "key": key,
        "stage": stage,
        "completed_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "files": files,
        # One hash of the whole content: what a downstream stage's key uses for this folder.
        "digest": hashlib.sha256(json.dumps(files, sort_keys=True).encode()).hexdigest(),
        **(extra or {}),
    }
    write_json_atomic(out_dir / RECORD_FILE, record)
    return record


def read_record(out_dir: Path) -> dict[str, Any] | None:
    """out_dir's completion record, or None when there is none (not complete) or it is unreadable."""
    path = Path(out_dir) / RECORD_FILE
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def verify_record(out_dir: Path) -> str | None:
    """None when out_dir matches its record; else what is wrong, naming the file."""
    out_dir = Path(out_dir)
    record = read_record(out_dir)
    if record is None:
        return f"{out_dir} has no readable {RECORD_FILE} (incomplete or removed)"
    for rel, want in record["files"].items():
        path = out_dir / rel
        if not path.is_file():
            return f"{path} is missing"
        size = path.stat().st_size
        if size != want["bytes"]:
            return f"{path} has {size} bytes, recorded {want['bytes']}"
        if sha256_file(path) != want["sha256"]:
            return f"{path} does not match its recorded sha256"
    return None


def record_root(path: Path, stop: Path | None = None) -> Path | None:
    """The nearest folder at or above `path` that holds a completion record (below `stop`)."""
    path = Path(path).resolve()
    for candidate in (path, *path.parents):
        if stop is not None and candidate == stop.resolve():
            return None
        if (candidate / RECORD_FILE).is_file():
            return candidate
    return None


# Files a flow rewrites in its own folder (a sweep's fit.json and prediction.json): their sha256 in one file beside
# them, so an edited or damaged file is never read as it is.
SUMS_FILE = "SHA256SUMS.json"


def write_json_summed(path: Path, obj: Any) -> Path:
    """`obj` as JSON at `path`, atomically, its sha256 then recorded in SUMS_FILE beside it."""
    path = Path(path)
    write_json_atomic(path, obj)
    sums = _sums(path.parent)
    sums[path.name] = sha256_file(path)
    write_json_atomic(path.parent / SUMS_FILE, sums)
    return path


def summed_problem(path: Path) -> str | None:
    """Why `path` may not be read as it is (no sum recorded beside it, or not the recorded sum), None when it may."""
    path = Path(path)
    recorded = _sums(path.parent).get(path.name)
    if recorded is None:
        return f"{path} has no sha256 recorded in {SUMS_FILE} beside it"
    if not path.is_file() or sha256_file(path) != recorded:
        return f"{path} is not the file that was written (its sha256 differs from the one recorded): edited or damaged"
    return None


def _sums(folder: Path) -> dict[str, str]:
    try:
        data = json.loads((Path(folder) / SUMS_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return {k: v for k, v in data.items() if isinstance(k, str) and isinstance(v, str)} if isinstance(data, dict) else {}
