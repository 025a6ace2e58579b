"""The evaluation flow: calibration of base, SFT and GRPO models, compared side by side."""
from __future__ import annotations

from pathlib import Path

from prefect import flow

from infra.paths import Workspace
from infra.stage_cache import run_cached
from infra.tracking import stage_run
from tasks.eval.evaluate import EVAL_FILE, EvalConfig, EvalResult, evaluate_checkpoint_task
from tasks.reports.eval import log_comparison


@flow(name="evaluate", log_prints=True)
def eval_flow(config: EvalConfig, models: dict[str, str], tokens: str, tokenizer: str, workdir: str = "work") -> dict[str, EvalResult]:
    """Evaluate each named model (cached per model) and log their comparison; results by name."""
    ws = Workspace.locate(workdir).ensure_writable()
    with stage_run(ws, "evaluate", config):
        results = {
            name: run_cached(
                evaluate_checkpoint_task, ws, Path(model_dir), Path(tokens), Path(tokenizer), config,
                ws.eval_dir / name, name, outputs=lambda _, n=name: [ws.eval_dir / n / EVAL_FILE],
            )
            for name, model_dir in models.items()
        }
        print(log_comparison(results, ws.eval_dir))
        return results
