"""A sweep's fit, kept in its folder so that later runs on the same data and tokenizer can use it.

    write_fit(folder, sb, index)     <sweep folder>/fit.json: the bootstrapped fits and the token shards they came from
    find_fit(tokens_dir)             the newest sweep fit on the same data and tokenizer as these shards, or None
    fit.optimal_ratio(compute)       the law's compute-optimal tokens per parameter at `compute`, with its interval

The pretraining report reads it (tasks/reports/pretrain.py): its Chinchilla line then compares the
run with the ratio measured on this data, model family and tokenizer instead of Chinchilla's 20.
"Same" is the token index's tokenizer and data-manifest sha256: a sweep on its own vocabulary
(scale.vocab_size) fits another tokenizer, and its ratio is not used.
"""
from __future__ import annotations

import logging
from pathlib import Path

from pydantic import BaseModel

from infra.workspace.record import summed_problem, write_json_summed
from models.scaling_bootstrap import Interval, ScalingBootstrap
from tasks.tokenizer.tokenize_shards import TokenShards, load_token_index

log = logging.getLogger(__name__)
FIT_FILE = "fit.json"
SWEEPS = "scale"  # the workspace store of the sweeps (flows/scale_flow.py writes them there)


class SweepFit(BaseModel):
    """fit.json: both fits with their bootstrap resamples, and what they were fitted on."""

    folder: str
    tokenizer_sha256: str
    manifest_sha256: str
    bootstrap: ScalingBootstrap

    def optimal_ratio(self, compute: float) -> Interval:
        """Approach 3's D_opt / N_opt at `compute` (C = 6 N D, N with embeddings), with its bootstrap interval."""
        return self.bootstrap.intervals(compute).tokens_per_param

    def source(self, ratio: Interval) -> str:
        """How a report names a ratio of optimal_ratio(): fitted, by which sweep, its interval."""
        return (f"fitted at this compute by the sweep in {self.folder}, "
                f"{self.bootstrap.level:.0%} interval [{ratio.low:.3g}, {ratio.high:.3g}]")


def write_fit(folder: Path, sb: ScalingBootstrap, index: TokenShards) -> Path:
    fit = SweepFit(folder=str(folder), tokenizer_sha256=index.tokenizer_sha256,
                   manifest_sha256=index.manifest_sha256, bootstrap=sb)
    return write_json_summed(Path(folder) / FIT_FILE, fit)


def find_fit(tokens_dir: Path) -> SweepFit | None:
    """The newest fit.json among the workspace's sweeps whose shards share these shards' tokenizer and data.

    The workspace is the one holding `tokens_dir` (<workspace>/tokens/<key>); a fit.json that cannot be
    read, or is not the file its sweep wrote (its sha256, SHA256SUMS.json), is passed over with a line saying so,
    as if that sweep had not finished: the next `llmforge scale` of it writes it again.
    """
    index = load_token_index(tokens_dir)
    sweeps = Path(tokens_dir).resolve().parent.parent / SWEEPS
    files = sorted(sweeps.glob(f"*/{FIT_FILE}"), key=lambda p: p.stat().st_mtime, reverse=True)
    for path in files:
        if problem := summed_problem(path):
            log.warning("%s; passed over (the next `llmforge scale` of that sweep writes it again)", problem)
            continue
        try:
            fit = SweepFit.model_validate_json(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if (fit.tokenizer_sha256, fit.manifest_sha256) == (index.tokenizer_sha256, index.manifest_sha256):
            return fit
    return None
