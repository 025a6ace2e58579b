"""DeepSpeed checkpoints of the training loop: per-rank RNG states, sha256 sums, resume and pruning.

    ckpt_dir/step00000040/   DeepSpeed's files + SHA256SUMS.json (written last: its presence means complete)
    ckpt_dir/latest          DeepSpeed's pointer to the newest folder, replaced atomically after the sums

A checkpoint's client state holds the step, the loop's counters and loss curve, and every
rank's RNG states, so a resumed run continues exactly as an uninterrupted one.

A save that fails (a full disk, most often) removes its partial folder on every rank and
leaves 'latest' naming the previous checkpoint; a full disk is reported as ENOSPC with the
folder, the bytes it needs and the bytes free, before anything is written when the free
space is already too small.
"""
from __future__ import annotations

import errno
import json
import random
import shutil
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from infra.workspace.atomic import write_text_atomic
from infra.workspace.record import sha256_file
from tasks.data.manifest import ChecksumError
from tasks.training.distributed import all_gather

CKPT_TAG_PREFIX = "step"
CKPT_SUMS_FILE = "SHA256SUMS.json"  # per checkpoint folder: DeepSpeed itself records no checksums
LATEST_FILE = "latest"  # DeepSpeed's name; holds the tag of the checkpoint a resume loads
# What torch.save says when the disk fills under it: its C++ writer drops the errno.
_TORCH_WRITE_FAILURES = ("basic_ios::clear", "iostream error", "PytorchStreamWriter failed", "file write failed",
                         "unexpected pos")


def tag_of(step: int) -> str:
    """The folder name of the checkpoint taken after `step` optimizer steps."""
    return f"{CKPT_TAG_PREFIX}{step:08d}"


# ----------------------------------------------------------------------------- RNG


def rng_state() -> dict[str, Any]:
    """This process' Python, NumPy, torch (and CUDA) RNG states."""
    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore what `rng_state` returned."""
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def seed_all(seed: int) -> None:
    """Seed Python, NumPy and torch."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


# ----------------------------------------------------------------------------- folders and sums


def checkpoint_tags(ckpt_dir: Path) -> list[str]:
    """Checkpoint folders written by `train`, oldest first."""
    if not Path(ckpt_dir).is_dir():
        return []
    return sorted(p.name for p in Path(ckpt_dir).iterdir() if p.is_dir() and p.name.startswith(CKPT_TAG_PREFIX))


def latest_checkpoint_step(ckpt_dir: Path) -> int | None:
    """The step of the checkpoint a resume would load (DeepSpeed's `latest` file), or None."""
    latest = Path(ckpt_dir) / LATEST_FILE
    if not latest.is_file():
        return None
    return int(latest.read_text().strip().removeprefix(CKPT_TAG_PREFIX))


def write_checkpoint_sums(tag_dir: Path) -> Path:
    """Record the sha256 of every file of a finished checkpoint folder in its SHA256SUMS.json."""
    tag_dir = Path(tag_dir)
    sums = {
        p.relative_to(tag_dir).as_posix(): sha256_file(p)
        for p in sorted(tag_dir.rglob("*"))
        if p.is_file() and p.name != CKPT_SUMS_FILE
    }
    # Written last and atomically: its presence means the save completed.
    return write_text_atomic(tag_dir / CKPT_SUMS_FILE, json.dumps(sums, indent=1, sort_keys=True) + "\n")


def verify_checkpoint(tag_dir: Path) -> None:
    """Raise ChecksumError naming the first missing, changed or unlisted-truncated file of a checkpoint."""
    tag_dir = Path(tag_dir)
    sums_path = tag_dir / CKPT_SUMS_FILE
    if not sums_path.is_file():
        raise ChecksumError(f"{sums_path}: missing, so {tag_dir} may be incomplete; delete that folder "
                            "(and fix 'latest') to resume from an earlier checkpoint, or delete the "
                            "checkpoints folder to start over")
    for rel, expected in json.loads(sums_path.read_text(encoding="utf-8")).items():
        path = tag_dir / rel
        if not path.is_file():
            raise ChecksumError(f"{path}: listed in {sums_path} but missing; the checkpoint is damaged")
        actual = sha256_file(path)
        if actual != expected:
            raise ChecksumError(f"{path}: sha256 {actual[:12]}… != {expected[:12]}… in {sums_path}; "
                                "the checkpoint file is corrupted or truncated")


def resume_tag(ckpt_dir: Path) -> str | None:
    """The checkpoint folder a resume loads: the one 'latest' names, or None if there is none.

    A run killed after DeepSpeed wrote 'latest' but before SHA256SUMS.json leaves a newest
    folder without sums; the resume then falls back to the newest older folder that has them.
    A folder whose sums do not match raises ChecksumError (never silently skipped).
    """
    ckpt_dir = Path(ckpt_dir)
    step = latest_checkpoint_step(ckpt_dir)
    if step is None:
        return None
    tag = tag_of(step)
    if not (ckpt_dir / tag / CKPT_SUMS_FILE).is_file():
        older = [t for t in checkpoint_tags(ckpt_dir) if t < tag and (ckpt_dir / t / CKPT_SUMS_FILE).is_file()]
        if older:
            tag = older[-1]
    verify_checkpoint(ckpt_dir / tag)
    return tag


# ----------------------------------------------------------------------------- disk space


def _folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def _complete_tags(ckpt_dir: Path) -> list[str]:
    """Checkpoint folders that have their sums, oldest first."""
    return [t for t in checkpoint_tags(ckpt_dir) if (Path(ckpt_dir) / t / CKPT_SUMS_FILE).is_file()]


def state_bytes(engine) -> int:
    """About what a checkpoint of `engine` takes: the weights in their dtype, AdamW's two fp32
    moments, and the fp32 master copy that ZeRO or a 16-bit model keeps."""
    total = 0
    zero = engine.zero_optimization_stage() if hasattr(engine, "zero_optimization_stage") else 0
    for p in engine.module.parameters():
        n, size = getattr(p, "ds_numel", p.numel()), p.element_size()
        total += n * (size + 8 + (4 if zero or size != 4 else 0))
    return total


def checkpoint_bytes_needed(engine, ckpt_dir: Path, skip: str | None = None) -> int:
    """What the next checkpoint will take: the newest complete one's size, or (for the first) `state_bytes`."""
    done = [t for t in _complete_tags(ckpt_dir) if t != skip]
    return _folder_bytes(Path(ckpt_dir) / done[-1]) if done else state_bytes(engine)


def _size(n: int) -> str:
    return f"{n:,} bytes ({n / 2**20:.1f} MiB)"


def disk_full_error(tag_dir: Path, needed: int, free: int, previous: Path | None, keep: int,
                    written: int | None = None) -> OSError:
    """The OSError(ENOSPC) of a checkpoint that does not fit: the folder, the bytes it needs and
    the bytes free, what became of the partial folder (`written` bytes of it, None: nothing was
    written) and of the previous checkpoint, and what to do."""
    if written is None:
        what = f"it needs about {_size(needed)} and {_size(free)} are free there; nothing was written"
    else:
        what = (f"the disk filled after {_size(written)} of it (about {_size(needed)} expected, {_size(free)} "
                "free when the save began); the partial folder was removed")
    kept = (f"{previous} is intact and a rerun resumes from it" if previous is not None
            else "there is no earlier checkpoint, so a rerun starts from step 0")
    return OSError(errno.ENOSPC, f"No space left on device (ENOSPC) saving checkpoint {tag_dir}: {what}; {kept}. "
                                 f"Free space on that filesystem, lower keep_checkpoints (now {keep}) or move the "
                                 "run's out_dir")


def _looks_like_disk_full(exc: BaseException, path: Path, needed: int) -> bool:
    """ENOSPC/EDQUOT anywhere in the chain, or torch's errno-less write failure with too little space left."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, OSError) and seen.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        seen = seen.__cause__ or seen.__context__
    return (any(m in str(exc) for m in _TORCH_WRITE_FAILURES)
            and shutil.disk_usage(path).free < needed)


def _release_frames(exc: BaseException) -> None:
    """Clear the locals of the frames of `exc` and what it chains: they hold torch's open file
    writer, and until it closes, a removed partial checkpoint's space is not given back."""
    seen: BaseException | None = exc
    while seen is not None:
        traceback.clear_frames(seen.__traceback__)
        seen = seen.__cause__ or seen.__context__


def _agree(failure: BaseException | None, rank: int, world: int) -> BaseException | None:
    """Every rank's view of a step some ranks may have failed: this rank's own error, else the
    first failing rank's (as an OSError with its errno, or a RuntimeError), else None."""
    if world == 1:
        return failure
    report = None if failure is None else (getattr(failure, "errno", None), str(failure))
    reports = all_gather(report, world)
    if failure is not None:
        return failure
    for other, found in enumerate(reports):
        if found is not None:
            code, message = found
            return OSError(code, message) if code else RuntimeError(f"rank {other}: {message}")
    return None


# ----------------------------------------------------------------------------- save and load


def save_checkpoint(engine, ckpt_dir: Path, step: int, client_state: dict[str, Any], rank: int, world: int,
                    keep: int) -> Path:
    """Save the engine and `client_state` (+ every rank's RNG) as ckpt_dir/stepNNNNNNNN; keep the newest `keep`.

    Raises OSError(ENOSPC) naming the folder, the bytes needed and free when the disk is
    already too full (nothing written) or fills during the save (the partial folder removed,
    on every rank); 'latest' then still names the previous checkpoint.
    """
    ckpt_dir = Path(ckpt_dir)
    tag = tag_of(step)
    tag_dir = ckpt_dir / tag
    previous = next((ckpt_dir / t for t in reversed(_complete_tags(ckpt_dir)) if t != tag), None)
    needed = checkpoint_bytes_needed(engine, ckpt_dir, skip=tag)
    if rank == 0 and tag_dir.exists():
        shutil.rmtree(tag_dir)  # the leftover of a save that was killed (the agreement below waits for this)
    free = shutil.disk_usage(ckpt_dir).free
    early = disk_full_error(tag_dir, needed, free, previous, keep) if free < needed else None
    agreed = _agree(early, rank, world)
    if agreed is not None:
        raise agreed

    # Every rank's RNG goes into the one client_state file that rank 0 writes.
    state = dict(client_state, rng=all_gather(rng_state(), world))
    failure: BaseException | None = None
    try:
        # No 'latest' from DeepSpeed: it truncates and rewrites that file in place, which a full
        # disk leaves empty; it is replaced atomically below, once the sums exist.
        engine.save_checkpoint(str(ckpt_dir), tag=tag, client_state=state, save_latest=False)
    except Exception as exc:  # noqa: BLE001 - every rank must reach the agreement below
        failure = exc
        _release_frames(exc)
        # A failed write skips only the barrier DeepSpeed's save ends with (its collectives all
        # come before the writes); this one stands in for it, so the ranks stay in step.
        dist.barrier()
    if failure is None and rank == 0:
        try:
            write_checkpoint_sums(tag_dir)
            write_text_atomic(ckpt_dir / LATEST_FILE, tag)
        except Exception as exc:  # noqa: BLE001
            failure = exc
    agreed = _agree(failure, rank, world)
    if agreed is not None:
        disk_full = _looks_like_disk_full(agreed, ckpt_dir, needed)
        written = _folder_bytes(tag_dir) if tag_dir.is_dir() else 0
        dist.barrier()  # every rank has looked before rank 0 removes the folder
        if rank == 0:
            shutil.rmtree(tag_dir, ignore_errors=True)
        dist.barrier()
        if disk_full:
            raise disk_full_error(tag_dir, needed, free, previous, keep, written) from agreed
        raise agreed
    if rank == 0:
        complete = _complete_tags(ckpt_dir)
        # Folders without sums are what killed saves left; 'latest' never names one of them.
        unfinished = [t for t in checkpoint_tags(ckpt_dir) if t not in complete]
        for old in unfinished + complete[:-keep]:
            shutil.rmtree(ckpt_dir / old, ignore_errors=True)
    dist.barrier()
    return tag_dir


def load_latest(engine, ckpt_dir: Path, rank: int, world: int,
                echo: Callable[[str], Any] | None = None) -> dict[str, Any]:
    """Load the checkpoint a resume continues from into `engine`, restore this rank's RNG; its client state.

    Returns {} when there is nothing to resume. Every rank checks the sums, so a bad
    checkpoint fails all ranks alike. Keys that older checkpoints carry and the loop no
    longer reads (e.g. `data_position`) are ignored.
    """
    tag = resume_tag(ckpt_dir)
    if tag is None:
        return {}
    load_path, client = engine.load_checkpoint(str(ckpt_dir), tag=tag)
    if load_path is None:
        raise RuntimeError(f"{ckpt_dir}: 'latest' names a checkpoint DeepSpeed could not load; delete it to start over")
    client = client or {}
    if client.get("world_size", world) != world and rank == 0 and echo:
        echo(f"resuming a {client['world_size']}-rank checkpoint with {world} ranks: the data order changes")
    rngs = client.get("rng") or []
    if rank < len(rngs):
        set_rng_state(rngs[rank])
    return client
