"""The evaluation flow: calibration of base, SFT and GRPO models, compared side by side."""
from __future__ import annotations

from pathlib import Path

from prefect import flow

from infra.lifecycle.signals import stop_on_cancel
from infra.stages import place
from infra.tracking.runs import stage_run
from infra.workspace.cache import flow_key
from infra.workspace.lock import workspace_lock
from infra.workspace.paths import Workspace
from tasks.eval.arithmetic import ArithmeticTask
from tasks.eval.config import EvalConfig
from tasks.eval.evaluate import EvalResult, Evaluate
from tasks.reports.eval import log_comparison


@flow(name="evaluate", log_prints=True)
def eval_flow(config: EvalConfig, models: dict[str, str], tokens: str, tokenizer: str, task: ArithmeticTask,
              workdir: str = "work", contaminated: str | None = None) -> dict[str, EvalResult]:
    """Evaluate each named model on the arithmetic `task`'s questions and eval.tasks (cached per model) and log their
    comparison; results by name. `contaminated`: the data flow's found.jsonl, whose items each task scores apart."""
    ws = Workspace.locate(workdir).ensure_writable()
    with stop_on_cancel(), workspace_lock(ws), stage_run(ws, "evaluate", config, config_key="eval", run_key=flow_key(
            "evaluate", __name__, config, {"models": [Path(m) for m in models.values()], "tokens": Path(tokens),
                                           "task": task})) as run:
        placed = {name: place(Evaluate(config), ws, model=Path(model_dir), tokens=Path(tokens), tokenizer=Path(tokenizer),
                              label=name, task=task, contaminated=Path(contaminated) if contaminated else None)
                  for name, model_dir in models.items()}
        results = {name: p.run() for name, p in placed.items()}
        print(log_comparison(results, {name: p.out_dir for name, p in placed.items()}, ws.run_reports(run.info.run_id)))
        return results
