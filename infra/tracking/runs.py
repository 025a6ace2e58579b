"""The one MLflow logging helper: the stage run's lifecycle, and every kind of logging the stages do.

The stage run's lifecycle, safe params, and every kind of logging the stages and reports do (metrics,
files, text, tags); the store's URI and experiment are infra/tracking/store.py's, the data a run read
(its dataset inputs) infra/tracking/datasets.py's.

Everything that logs goes to the active run and calls `active_run()` first, so logging
outside `stage_run` is a clear error instead of MLflow silently opening a stray run.

A new stage run is tagged with where it came from (infra/tracking/provenance.py). It ends FINISHED,
FAILED (an exception) or KILLED (an interrupt, a signal, a Prefect cancellation). When
MLflow's own store is on a full disk, so that logging to the run or ending it fails, the
run's code gets an OSError(ENOSPC) that names the store (infra/tracking/store_errors.py). Params and
run names never carry a secret (infra/tracking/redaction.py).
"""
from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from infra.config import flatten_params
from infra.tracking.provenance import link_prefect_to_run, mlflow_run_url, origin_tags, prefect_flow_run
from infra.tracking.redaction import redact
from infra.tracking.store import configure, tracking_uri
from infra.tracking.store_errors import store_full_error
from infra.workspace.paths import Workspace, mlflow_command

# mlflow is imported inside the functions that use it: a rank that never logs, a data worker and `llmforge --help`
# do not pay for its import.
# So is prefect, for the same reason.



def log_config(cfg: BaseModel | dict[str, Any], prefix: str = "") -> None:
    """Log a (nested) config as flat, redacted MLflow params."""
    import mlflow

    active_run()
    params = {k: redact(k, v)[:6000] for k, v in flatten_params(cfg, prefix).items()}
    items = list(params.items())
    for i in range(0, len(items), 100):  # MLflow caps params per batch
        mlflow.log_params(dict(items[i : i + 100]))


@contextlib.contextmanager
def stage_run(
    ws: Workspace,
    stage: str,
    config: BaseModel | dict[str, Any] | None = None,
    tags: dict[str, str] | None = None,
    run_id: str | None = None,
    run_name: str | None = None,
    run_key: str | None = None,
    config_key: str | None = None,
    status: str = "FINISHED",
) -> Iterator[Any]:
    """One MLflow run for a stage, nested under the active (pipeline) run when there is one.

    A new run is named `run_name` (default: the stage) and tagged with its origin
    (infra/tracking/provenance.py `origin_tags`); inside a Prefect flow run, a Prefect artifact links back
    to it. `run_id` resumes an existing run (e.g. a DeepSpeed rank-0 process continuing the
    run its Prefect task opened) and leaves its name and tags alone. The run ends FINISHED,
    FAILED on an exception, KILLED on an interrupt, signal or Prefect cancellation (`end_status`).

    `config_key` is where `config` sits in the pipeline's config (`data`, `pretrain`, `eval`): its params are
    logged under it (`data.near.threshold`, as the pipeline run logs it), so every run has one key space.

    `run_key` names what the run computes (infra/workspace/cache.py `flow_key`): an earlier attempt
    with that key that did not finish is continued (one loss curve per model, not one per
    attempt); when one finished, the new run is tagged as a repeat of it, with a link.

    `status` is what a clean exit ends the run with: "SCHEDULED" for a run whose work is queued for later
    (infra/run_queue.py), continued then by whoever does it.
    """
    import mlflow

    experiment_id = configure(ws)
    if run_id is None and run_key is not None:
        run_id, tags = _continue_or_link(experiment_id, run_key, tags)
    parent = mlflow.active_run()
    flow_run = {} if run_id else prefect_flow_run()
    all_tags = None if run_id else {"llmforge.stage": stage, **origin_tags(flow_run), **(tags or {})}
    if all_tags is not None and config_key:
        all_tags[CONFIG_KEY_TAG] = config_key
    run = mlflow.start_run(
        run_id=run_id,
        # Without it a new run lands in MLflow's "Default" experiment, not ours.
        experiment_id=None if run_id else experiment_id,
        run_name=None if run_id else (run_name or stage),
        nested=parent is not None,
        tags=all_tags,
    )
    try:
        if run_id is None:
            if config is not None:
                log_config(config, f"{config_key}." if config_key else "")
            link_prefect_to_run(stage, run, flow_run)
        yield run
    except BaseException as exc:
        _end_run(ws, run, end_status(exc), after=exc)
        full = store_full_error(ws, tracking_uri(ws), run, exc)
        if full is not None:
            raise full from exc
        raise
    _end_run(ws, run, status)


def _continue_or_link(experiment_id: str, run_key: str, tags: dict[str, str] | None) -> tuple[str | None, dict[str, str]]:
    """(the run id of an unfinished earlier attempt to continue, or None; the tags of a new run)."""
    from mlflow.tracking import MlflowClient

    tags = {**(tags or {}), "llmforge.run_key": run_key}
    earlier = MlflowClient().search_runs(
        [experiment_id], filter_string=f"tags.`llmforge.run_key` = '{run_key}'",
        order_by=["attribute.start_time DESC"], max_results=1,
    )
    if not earlier:
        return None, tags
    last = earlier[0]
    if last.info.status != "FINISHED":
        # The workspace lock means no other process is writing it: it was killed or failed.
        print(f"continuing MLflow run {last.info.run_id} ({last.info.run_name}), whose last attempt ended {last.info.status}")
        return last.info.run_id, tags
    tags["llmforge.repeat_of"] = last.info.run_id
    tags["mlflow.note.content"] = (
        f"Same inputs, config and code as run {last.info.run_id} ({last.info.run_name}): its stage outputs were "
        f"reused where they verified (tags `llmforge.cache.*`). See #/experiments/{experiment_id}/runs/{last.info.run_id}"
    )
    return None, tags


def end_status(exc: BaseException) -> str:
    """The MLflow status of a run its code left by raising `exc`: KILLED when it was stopped
    from outside (Ctrl-C, a signal, a Prefect cancellation or termination), else FAILED."""
    if isinstance(exc, SystemExit):
        code = exc.code
        if code is None or code == 0:
            return "FINISHED"
        # 128+N is how a signal handler (and the shell) reports signal N; -N how subprocess does.
        return "KILLED" if isinstance(code, int) and (code > 128 or code < 0) else "FAILED"
    if isinstance(exc, (KeyboardInterrupt, asyncio.CancelledError)):
        return "KILLED"
    try:
        from prefect.exceptions import CancelledRun, ExternalSignal, PrefectSignal
    except ImportError:  # pragma: no cover - Prefect is a dependency
        return "FAILED"
    # ExternalSignal: TerminationSignal (SIGTERM of a cancelled flow run); PrefectSignal: Abort, Pause.
    return "KILLED" if isinstance(exc, (ExternalSignal, PrefectSignal, CancelledRun)) else "FAILED"


def _end_run(ws: Workspace, run: Any, status: str, after: BaseException | None = None) -> None:
    """End `run` with `status` if it is still the active run (a worker may have ended it already).

    A store on a full disk raises StoreFullError; `after` is the error the run's code raised, if any.
    """
    import mlflow

    active = mlflow.active_run()
    if active is not None and active.info.run_id == run.info.run_id:
        try:
            mlflow.end_run(status)
        except Exception as exc:
            full = store_full_error(ws, tracking_uri(ws), run, exc, status=status, after=after)
            if full is None:
                raise
            raise full from exc


NOTE_TAG = "mlflow.note.content"  # MLflow shows it as the run's description
CONFIG_KEY_TAG = "llmforge.config_key"  # where a stage run's config sits in the pipeline's (stage_run's config_key)


def describe_run(run: Any, identity: Any, config_key: str | None = None) -> None:
    """Give `run` what `identity` (infra/tracking/identity.py `RunIdentity`) says: its params (the ones the run lacks:
    a continued run keeps its own) and, first in its description, the preset and what differs from it (the keys
    under `config_key` only, when given: a stage run)."""
    from mlflow.entities import Param
    from mlflow.tracking import MlflowClient

    client, run_id = MlflowClient(), run.info.run_id
    current = client.get_run(run_id).data
    if config_key is None:
        params = {k: v for k, v in identity.params().items() if k not in current.params}
        if params:
            client.log_batch(run_id, params=[Param(k, v) for k, v in params.items()])
    text = identity.description(config_key)
    note = current.tags.get(NOTE_TAG, "")
    if not note.startswith(text):
        client.set_tag(run_id, NOTE_TAG, text + (f"\n\n{note}" if note else ""))


def describe_stage_runs(parent_run_id: str, identity: Any) -> None:
    """Describe every stage run nested under `parent_run_id` (`describe_run` with its config's keys)."""
    import mlflow
    from mlflow.tracking import MlflowClient

    experiment_id = mlflow.get_run(parent_run_id).info.experiment_id
    for child in MlflowClient().search_runs([experiment_id], filter_string=f"tags.`mlflow.parentRunId` = '{parent_run_id}'"):
        describe_run(child, identity, child.data.tags.get(CONFIG_KEY_TAG, ""))


def describe_overrides(overrides: list[str] | Mapping[str, Any], stage: str | None = None) -> str:
    """Config overrides as a run-name suffix: `["grpo.optim.lr=2e-5"]` -> `grpo.optim.lr=2e-5`.

    With `stage`, the leading part of each key is dropped when it is `stage` (a stage's own run:
    `data` -> `near.threshold=0.7`) and overrides of other stages are left out. Without it (a
    pipeline or sweep run) keys stay whole: `optim.lr` alone could be any training stage's.
    Secret-named keys show `***`. Join with the stage yourself: `f"data {suffix}".strip()`.
    """
    pairs = list(overrides.items()) if isinstance(overrides, Mapping) else [_split_override(o) for o in overrides]
    if stage is not None:
        pairs = [(key, value) for key, value in pairs if key.split(".", 1)[0] == stage]
    shown = []
    for key, value in pairs:
        short = key.removeprefix(f"{stage}.") if stage is not None else key
        shown.append(f"{short}={redact(key, str(value))}")
    return " ".join(shown)[:200]  # MLflow caps run names at 250 characters


def _split_override(pair: str) -> tuple[str, str]:
    key, sep, value = pair.partition("=")
    if not sep or not key.strip():
        raise ValueError(f"override {pair!r} is not key=value (e.g. data.near.threshold=0.7)")
    return key.strip(), value.strip()


def active_run() -> Any:
    """The active MLflow run; a clear error instead of MLflow silently starting a stray run."""
    import mlflow

    run = mlflow.active_run()
    if run is None:
        raise RuntimeError("no active MLflow run: log inside `with infra.tracking.runs.stage_run(...)`")
    return run


def log_metrics(metrics: dict[str, float | int | None], step: int | None = None) -> None:
    """Log the finite values of `metrics` to the active run (None and NaN/inf are left out)."""
    import mlflow

    active_run()
    clean = {k: float(v) for k, v in metrics.items() if v is not None and math.isfinite(float(v))}
    if clean:
        mlflow.log_metrics(clean, step=step)


def log_artifact(path: Path | str, artifact_path: str | None = None) -> None:
    """Copy a file into the active run's artifacts."""
    import mlflow

    active_run()
    mlflow.log_artifact(str(path), artifact_path=artifact_path)


def log_artifacts(folder: Path | str, artifact_path: str | None = None) -> None:
    """Copy every file of `folder` into the active run's artifacts."""
    import mlflow

    active_run()
    mlflow.log_artifacts(str(folder), artifact_path=artifact_path)


def log_text(text: str, artifact_file: str) -> None:
    """Write `text` as the artifact `artifact_file` (e.g. "pretrain/token_index.json") of the active run."""
    import mlflow

    active_run()
    mlflow.log_text(text, artifact_file)


def set_tag(key: str, value: str) -> None:
    """Tag the active run."""
    import mlflow

    active_run()
    mlflow.set_tag(key, value)


def metric_history(run_id: str, key: str) -> list[tuple[int, float]]:
    """Every (step, value) logged for metric `key` in run `run_id`, by step; empty when never logged."""
    from mlflow.tracking import MlflowClient

    return [(m.step, m.value) for m in sorted(MlflowClient().get_metric_history(run_id, key), key=lambda m: m.step)]


def tag_active_run(key: str, value: str) -> None:
    """Tag the active MLflow run when there is one; stages also run outside any run (tests, notebooks)."""
    import mlflow

    if mlflow.active_run() is not None:
        mlflow.set_tag(key, value)


def where_to_see_run(ws: Workspace, run_id: str) -> str:
    """A line saying where a person opens this run: its URL on an MLflow server, or the local UI command and URL."""
    import mlflow

    experiment_id = mlflow.get_run(run_id).info.experiment_id
    url = mlflow_run_url(experiment_id, run_id)
    if url is not None:
        return f"MLflow run: {url}"
    # Absolute paths throughout: the line is copied into another terminal, often in another directory.
    script = Path(__file__).resolve().parents[1] / "scripts" / "start_mlflow_server.sh"
    return (f"MLflow run: http://127.0.0.1:5000/#/experiments/{experiment_id}/runs/{run_id} "
            f"(after `{script}` or `{mlflow_command()} ui --backend-store-uri {tracking_uri(ws)}`)")
