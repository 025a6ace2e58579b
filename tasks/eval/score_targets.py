"""A trained model scored on held-out targets, window by window: the stage a data comparison reads.

    scores = run(ScoreTargets(ScoreTargetsConfig(seq_len=128)), ws, model=result.model_dir, tokenizer=tok,
                 targets={"news": Path("held_out/news.jsonl")})
    scores.bpb["news"], np.load(scores.files["news"])       bits per byte; [windows, (nats, bytes)]

In-process and cached like any stage: keyed on the model's folder (its record), the tokenizer and each
target file, so a variant's model is scored once however often a comparison is rerun. The windows are
the same for every model scored with the same tokenizer and seq_len (tasks/eval/targets.py), which is what
pairs them window by window in tasks/eval/seed_differences.py.
"""
from __future__ import annotations

import functools
from pathlib import Path

import numpy as np
from pydantic import BaseModel, Field

from infra.config import StrictModel
from infra.stages import Stage
from models.bpb import token_bytes
from models.export import load_model
from tasks.eval.seed_differences import bits_per_byte
from tasks.eval.target_files import read_target
from tasks.eval.targets import score_windows, target_windows
from tasks.tokenizer.train import load_tokenizer


class ScoreTargetsConfig(StrictModel):
    seq_len: int = Field(128, ge=1)  # tokens predicted per window (the proxy's training seq_len)
    batch: int = Field(16, ge=1)  # windows per forward pass
    # At most this many windows per target, evenly spaced through it: scoring costs in proportion, and past a few
    # hundred windows the seeds' scatter, not the windows' sampling, sets an ablation's interval
    max_windows: int = Field(512, ge=2)


class TargetScores(BaseModel):
    """Where each target's per-window scores went, its windows and its bits per byte."""

    out_dir: Path
    files: dict[str, Path]  # name -> scores .npy, float64 [windows, (nats, bytes)]
    windows: dict[str, int]
    bpb: dict[str, float]

    def arrays(self) -> dict[str, np.ndarray]:
        """Each target's [windows, (nats, bytes)], read from its file."""
        return {name: np.load(path) for name, path in self.files.items()}


@functools.lru_cache(maxsize=16)
def _windows(target: Path, tokenizer: Path, seq_len: int, max_windows: int, stamps: tuple) -> np.ndarray:
    rows = target_windows(read_target(target), load_tokenizer(tokenizer), seq_len)
    if len(rows) > max_windows:
        rows = rows[np.linspace(0, len(rows) - 1, max_windows).round().astype(int)]
    return rows


def windows_of(target: Path, tokenizer: Path, seq_len: int, max_windows: int) -> np.ndarray:
    """A target's windows (at most `max_windows`, evenly spaced), made once per process for every model a flow
    scores on it with the same tokenizer; keyed on the files' sizes and mtimes too, so an edited file is read again."""
    stamps = tuple((st.st_size, st.st_mtime_ns) for st in (target.stat(), tokenizer.stat()))
    return _windows(target.resolve(), tokenizer.resolve(), seq_len, max_windows, stamps)


class ScoreTargets(Stage):
    name, store, Config, Result = "score_targets", "eval/targets", ScoreTargetsConfig, TargetScores
    inputs = ("model", "tokenizer", "targets")
    config: ScoreTargetsConfig

    def compute(self, inputs: dict, out_dir: Path) -> TargetScores:
        out_dir.mkdir(parents=True, exist_ok=True)
        tokenizer = load_tokenizer(Path(inputs["tokenizer"]))
        table = token_bytes(tokenizer)
        model = load_model(Path(inputs["model"])).float()
        files, windows, bpb = {}, {}, {}
        for name, path in sorted(inputs["targets"].items()):
            rows = windows_of(Path(path), Path(inputs["tokenizer"]), self.config.seq_len, self.config.max_windows)
            scores = score_windows(model, rows, table, self.config.batch)
            files[name] = out_dir / f"{name}.npy"
            np.save(files[name], scores)
            windows[name], bpb[name] = len(rows), bits_per_byte(scores)
        return TargetScores(out_dir=out_dir, files=files, windows=windows, bpb=bpb)
