"""DeepSpeed checkpoints of the training loop: per-rank RNG states, sha256 sums, resume and pruning.

    ckpt_dir/step00000040/   DeepSpeed's files + SHA256SUMS.json (written last: its presence means complete)
    ckpt_dir/latest          DeepSpeed's pointer to the newest folder

A checkpoint's client state holds the step, the loop's counters and loss curve, and every
rank's RNG states, so a resumed run continues exactly as an uninterrupted one.
"""
from __future__ import annotations

import json
import random
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from infra.atomic import write_text_atomic
from tasks.data.manifest import ChecksumError, sha256_file
from tasks.training.engine import all_gather

CKPT_TAG_PREFIX = "step"
CKPT_SUMS_FILE = "SHA256SUMS.json"  # per checkpoint folder: DeepSpeed itself records no checksums


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
    latest = Path(ckpt_dir) / "latest"
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


# ----------------------------------------------------------------------------- save and load


def save_checkpoint(engine, ckpt_dir: Path, step: int, client_state: dict[str, Any], rank: int, world: int,
                    keep: int) -> Path:
    """Save the engine and `client_state` (+ every rank's RNG) as ckpt_dir/stepNNNNNNNN; keep the newest `keep`."""
    import torch.distributed as dist

    # Every rank's RNG goes into the one client_state file that rank 0 writes.
    state = dict(client_state, rng=all_gather(rng_state(), world))
    tag = tag_of(step)
    engine.save_checkpoint(str(ckpt_dir), tag=tag, client_state=state)
    dist.barrier()
    if rank == 0:
        write_checkpoint_sums(Path(ckpt_dir) / tag)
        for old in checkpoint_tags(ckpt_dir)[:-keep]:
            shutil.rmtree(Path(ckpt_dir) / old, ignore_errors=True)
    dist.barrier()
    return Path(ckpt_dir) / tag


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
