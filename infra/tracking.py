"""The one MLflow logging helper: tracking URI, experiment, nested stage runs, safe params,
and every kind of logging the stages and reports do (metrics, files, text, tags, dataset
inputs, registered models).

Everything that logs goes to the active run and calls `active_run()` first, so logging
outside `stage_run` is a clear error instead of MLflow silently opening a stray run.

A new stage run says where it came from: the git commit (and whether the tree was dirty),
the entry point, and, inside a Prefect flow run, that flow run's id and UI link, with a
Prefect artifact on the flow run linking back to the MLflow run. It ends FINISHED, FAILED
(an exception) or KILLED (an interrupt, a signal, a Prefect cancellation). When MLflow's own
store is on a full disk, so that logging to the run or ending it fails, the run's code gets
an OSError(ENOSPC) that names the store (`StoreFullError`).
"""
from __future__ import annotations

import contextlib
import errno
import os
import re
import subprocess
import sys
import warnings
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from infra.config import flatten_params
from infra.paths import Workspace

DEFAULT_EXPERIMENT = "llmforge"
REPO_ROOT = Path(__file__).resolve().parents[1]
# Key segments that name a secret wherever they appear (`db.password`, `secret_sauce`, `client_secret`).
_SECRET_SEGMENTS = frozenset(
    {"password", "passwd", "passphrase", "secret", "secrets", "credential", "credentials", "apikey"}
)
_SECRET_PAIRS = frozenset({("api", "key"), ("private", "key")})
# `token` is a secret as the last segment of a key part (`hub.token`, `hf_token`, `accessToken`),
# except after these words, where it is a piece of the vocabulary (`bos_token`, `pad_token`).
_VOCAB_TOKEN_WORDS = frozenset(
    {"bos", "eos", "pad", "unk", "sep", "cls", "mask", "special", "start", "end", "stop", "eot", "im"}
)
_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])")
_URI_USERINFO = re.compile(r"(?P<scheme>[a-zA-Z][a-zA-Z0-9+.-]*://)[^/@\s]+@")


def tracking_uri(ws: Workspace) -> str:
    """`MLFLOW_TRACKING_URI` when set, else a SQLite store inside the workspace."""
    return os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{ws.mlflow_db}"


def is_secret_key(key: str) -> bool:
    """Whether a (dotted) config key names a secret, judged on whole segments of each part:
    `hub.token`, `hf_token`, `db.password`, `api_key`, `secret_sauce` are; `max_new_tokens`,
    `tokenizer.vocab_size`, `bos_token` are not."""
    for part in key.split("."):
        words = [w for w in re.split(r"[^a-z0-9]+", _CAMEL.sub("_", part).lower()) if w]
        if _SECRET_SEGMENTS.intersection(words) or _SECRET_PAIRS.intersection(zip(words, words[1:])):
            return True
        if words and words[-1] == "token" and (len(words) == 1 or words[-2] not in _VOCAB_TOKEN_WORDS):
            return True
    return False


def redact(key: str, value: str) -> str:
    """Never write secrets to MLflow: blank secret-named keys and user:password in URIs."""
    if is_secret_key(key):
        return "***"
    return _URI_USERINFO.sub(r"\g<scheme>***@", value)


def configure(ws: Workspace, experiment: str | None = None) -> str:
    """Point MLflow at the workspace store and make sure the experiment exists; returns its id."""
    import mlflow

    ws.root.mkdir(parents=True, exist_ok=True)
    user_uri = os.environ.get("MLFLOW_TRACKING_URI")
    mlflow.set_tracking_uri(tracking_uri(ws))
    if user_uri is None:
        # MLflow 3 also exports the URI to os.environ; undo that, or the next workspace
        # in this process would log to this one's store and lose its artifact location.
        os.environ.pop("MLFLOW_TRACKING_URI", None)
    name = experiment or os.environ.get("MLFLOW_EXPERIMENT_NAME") or DEFAULT_EXPERIMENT
    exp = mlflow.get_experiment_by_name(name)
    if exp is None:
        # With a SQLite backend MLflow would otherwise put artifacts under ./mlruns of the CWD.
        artifact_location = None
        if user_uri is None:
            ws.mlflow_artifacts.mkdir(parents=True, exist_ok=True)
            artifact_location = ws.mlflow_artifacts.as_uri()
        try:
            return mlflow.create_experiment(name, artifact_location=artifact_location)
        except Exception:
            # Another process created it between our check and create.
            exp = mlflow.get_experiment_by_name(name)
            if exp is None:
                raise
    return exp.experiment_id


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
) -> Iterator[Any]:
    """One MLflow run for a stage, nested under the active (pipeline) run when there is one.

    A new run is named `run_name` (default: the stage) and tagged with its origin (see
    `origin_tags`); inside a Prefect flow run, a Prefect artifact links back to it. `run_id`
    resumes an existing run (e.g. a DeepSpeed rank-0 process continuing the run its Prefect
    task opened) and leaves its name and tags alone. The run ends FINISHED, FAILED on an
    exception, KILLED on an interrupt, signal or Prefect cancellation (`end_status`).

    `run_key` names what the run computes (infra/stage_cache.flow_key): an earlier attempt
    with that key that did not finish is continued (one loss curve per model, not one per
    attempt); when one finished, the new run is tagged as a repeat of it, with a link.
    """
    import mlflow

    experiment_id = configure(ws)
    if run_id is None and run_key is not None:
        run_id, tags = _continue_or_link(experiment_id, run_key, tags)
    parent = mlflow.active_run()
    flow_run = {} if run_id else prefect_flow_run()
    all_tags = None if run_id else {"llmforge.stage": stage, **origin_tags(flow_run), **(tags or {})}
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
                log_config(config)
            _link_prefect_to_run(stage, run, flow_run)
        yield run
    except BaseException as exc:
        _end_run(ws, run, end_status(exc), after=exc)
        full = store_full_error(ws, run, exc)
        if full is not None:
            raise full from exc
        raise
    _end_run(ws, run, "FINISHED")


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
    import asyncio

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


class StoreFullError(OSError):
    """MLflow's store is on a full disk: an OSError with errno ENOSPC whose message names the store."""


def _store_location(ws: Workspace) -> str:
    """The store's file (a SQLite tracking URI), else the tracking URI with any credentials hidden."""
    uri = tracking_uri(ws)
    if uri.startswith("sqlite:///"):
        return uri.removeprefix("sqlite:///")
    return redact("uri", uri)


def _is_store_full(exc: BaseException, ws: Workspace, stop: BaseException | None = None) -> bool:
    """Whether `exc` (or what caused it, up to `stop`) says MLflow's store ran out of space:
    SQLite's "database or disk is full", or ENOSPC/EDQUOT on a file of the store or its artifacts."""
    store_files = (ws.mlflow_db, ws.mlflow_artifacts)
    seen: BaseException | None = exc
    while seen is not None and seen is not stop:
        if "database or disk is full" in str(seen):
            return True
        if isinstance(seen, OSError) and seen.errno in (errno.ENOSPC, errno.EDQUOT) and seen.filename:
            path = Path(os.fsdecode(seen.filename)).resolve()
            if any(path == f or f in path.parents for f in (Path(p).resolve() for p in store_files)):
                return True
        seen = seen.__cause__ or seen.__context__
    return False


def store_full_error(ws: Workspace, run: Any, exc: BaseException, status: str | None = None,
                     after: BaseException | None = None) -> StoreFullError | None:
    """A StoreFullError when `exc` is MLflow's store running out of space, else None.

    `status`: the status `run` could not be given; `after`: the error the run's code raised first.
    """
    if isinstance(exc, StoreFullError) or not _is_store_full(exc, ws, stop=after):
        return None
    logging_failed = after is not None and _is_store_full(after, ws)
    if status is None:
        what = f"logging to run {run.info.run_id} failed"
    else:
        what = f"{'logging to run failed and ' if logging_failed else ''}run {run.info.run_id} could not be marked {status}"
    first = f"; the run had failed with: {after}" if after is not None and not logging_failed else ""
    return StoreFullError(errno.ENOSPC, f"MLflow's store at {_store_location(ws)} is on a full disk (No space left "
                                        f"on device): {what}{first}. Make room there (or point MLFLOW_TRACKING_URI "
                                        "at another store) and rerun")


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
            full = store_full_error(ws, run, exc, status=status, after=after)
            if full is None:
                raise
            raise full from exc


def describe_overrides(overrides: list[str] | Mapping[str, Any], stage: str | None = None) -> str:
    """Config overrides as a run-name suffix: `["data.near.threshold=0.7"]` -> `near.threshold=0.7`.

    The leading part of each key is dropped when it is `stage`, or, without `stage`, when
    every key shares it; with `stage`, overrides of other stages are left out. Secret-named
    keys show `***`. Join with the stage yourself: `f"data {suffix}".strip()`.
    """
    pairs = list(overrides.items()) if isinstance(overrides, Mapping) else [_split_override(o) for o in overrides]
    heads = {key.split(".", 1)[0] for key, _ in pairs}
    if stage is not None:
        pairs = [(key, value) for key, value in pairs if key.split(".", 1)[0] == stage]
    drop = stage if stage is not None else (next(iter(heads)) if len(heads) == 1 else None)
    shown = []
    for key, value in pairs:
        short = key.split(".", 1)[1] if drop is not None and key.startswith(f"{drop}.") else key
        shown.append(f"{short}={redact(key, str(value))}")
    return " ".join(shown)[:200]  # MLflow caps run names at 250 characters


def _split_override(pair: str) -> tuple[str, str]:
    key, sep, value = pair.partition("=")
    if not sep or not key.strip():
        raise ValueError(f"override {pair!r} is not key=value (e.g. data.near.threshold=0.7)")
    return key.strip(), value.strip()


def git_state(root: Path | str | None = None) -> dict[str, str]:
    """`{"commit": sha, "dirty": "true"/"false"}` of the checkout at `root` (default: this
    repository); empty when it is not one or git is missing."""
    root = REPO_ROOT if root is None else root
    try:
        head = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10)
        if head.returncode != 0:
            return {}
        status = subprocess.run(
            ["git", "-C", str(root), "status", "--porcelain"], capture_output=True, text=True, timeout=30
        )
    except (OSError, subprocess.TimeoutExpired):
        return {}
    state = {"commit": head.stdout.strip()}
    if status.returncode == 0:
        state["dirty"] = "true" if status.stdout.strip() else "false"
    return state


def prefect_flow_run() -> dict[str, str]:
    """The Prefect flow run this code runs in: `id`, `flow_name` and `url` (when a UI URL is
    configured, `PREFECT_UI_URL` or derived from `PREFECT_API_URL`); empty outside a flow run."""
    try:
        from prefect.runtime import flow_run
        from prefect.utilities.urls import url_for

        run_id = flow_run.get_id()
        if not run_id:
            return {}
        found = {"id": str(run_id)}
        name = flow_run.get_flow_name()
        if name:
            found["flow_name"] = str(name)
        url = url_for("flow-run", obj_id=run_id)
        if url:
            found["url"] = url
        return found
    except Exception as exc:  # the link is a convenience; never fail a stage over it
        warnings.warn(f"could not read the Prefect flow run for MLflow tags: {exc}", stacklevel=2)
        return {}


def entry_point(flow_run: Mapping[str, str] | None = None) -> str:
    """What started this run, for `mlflow.source.name`: the Prefect flow's name inside a flow
    run, else the program (`llmforge`, or a script's path relative to the repository)."""
    flow_name = (prefect_flow_run() if flow_run is None else flow_run).get("flow_name")
    if flow_name:
        return flow_name
    program = Path(sys.argv[0]) if sys.argv and sys.argv[0] else Path("python")
    if program.name == "__main__.py":  # `python -m package`: the package says more than __main__.py
        program = program.parent
    try:
        return program.resolve().relative_to(REPO_ROOT).as_posix()
    except ValueError:
        return program.name


def origin_tags(flow_run: Mapping[str, str] | None = None) -> dict[str, str]:
    """Tags that say where a new run came from: git commit and dirty flag (when a git
    checkout), the entry point, and the Prefect flow run id and UI URL (inside one).

    `flow_run` is what `prefect_flow_run()` returned, when the caller already asked."""
    flow_run = prefect_flow_run() if flow_run is None else flow_run
    tags = {"mlflow.source.name": entry_point(flow_run)}
    git = git_state()
    if "commit" in git:
        tags["llmforge.git_commit"] = tags["mlflow.source.git.commit"] = git["commit"]
    if "dirty" in git:
        tags["llmforge.git_dirty"] = git["dirty"]
    if "id" in flow_run:
        tags["llmforge.prefect_flow_run_id"] = flow_run["id"]
    if "url" in flow_run:
        tags["llmforge.prefect_flow_run_url"] = flow_run["url"]
    return tags


def mlflow_run_url(experiment_id: str, run_id: str, uri: str | None = None) -> str | None:
    """The MLflow UI address of a run when the tracking URI is an http(s) server, else None."""
    import mlflow

    uri = uri or mlflow.get_tracking_uri()
    if not uri.lower().startswith(("http://", "https://")):
        return None
    return f"{uri.rstrip('/')}/#/experiments/{experiment_id}/runs/{run_id}"


def _link_prefect_to_run(stage: str, run: Any, flow_run: Mapping[str, str]) -> None:
    """Inside a Prefect flow run (`flow_run` not empty), attach an artifact that links to the MLflow run."""
    if not flow_run:
        return
    import mlflow

    exp_id, run_id = run.info.experiment_id, run.info.run_id
    slug = re.sub(r"[^a-z0-9]+", "-", stage.lower()).strip("-") or "stage"
    key = f"mlflow-{slug}-{run_id[:12]}"  # lowercase, digits and dashes, as Prefect requires
    description = f"MLflow run of stage {stage}"
    url = mlflow_run_url(exp_id, run_id)
    try:
        from prefect.artifacts import create_link_artifact, create_markdown_artifact

        if url:
            create_link_artifact(link=url, link_text=f"MLflow run {run_id}", key=key, description=description)
        else:
            store = redact("uri", mlflow.get_tracking_uri())
            create_markdown_artifact(
                key=key,
                description=description,
                markdown=(
                    f"MLflow run `{run_id}` (stage {stage}) is in a local store. To open it, run\n\n"
                    f"    mlflow ui --backend-store-uri {store}\n\n"
                    f"and go to `http://127.0.0.1:5000/#/experiments/{exp_id}/runs/{run_id}`."
                ),
            )
    except Exception as exc:  # the link is a convenience; never fail a stage over it
        warnings.warn(f"could not create the Prefect artifact linking MLflow run {run_id}: {exc}", stacklevel=2)


def active_run() -> Any:
    """The active MLflow run; a clear error instead of MLflow silently starting a stray run."""
    import mlflow

    run = mlflow.active_run()
    if run is None:
        raise RuntimeError("no active MLflow run: log inside `with infra.tracking.stage_run(...)`")
    return run


def log_metrics(metrics: dict[str, float | int | None], step: int | None = None) -> None:
    """Log the finite values of `metrics` to the active run (None and NaN/inf are left out)."""
    import math

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


def log_dataset_input(
    folder: Path, name: str, digest: str, context: str = "training", tags: dict[str, str] | None = None
) -> None:
    """Record the dataset in `folder` (by URI and digest, not its contents) as an input of the active run."""
    import warnings

    import mlflow
    from mlflow.data.dataset_source_registry import resolve_dataset_source
    from mlflow.data.meta_dataset import MetaDataset

    active_run()
    with warnings.catch_warnings():
        # MLflow registers the local-file source under two schemes and warns that they are ambiguous.
        warnings.simplefilter("ignore", UserWarning)
        source = resolve_dataset_source(Path(folder).resolve().as_uri())
    mlflow.log_input(MetaDataset(source=source, name=name, digest=digest), context=context, tags=tags)


def metric_history(run_id: str, key: str) -> list[tuple[int, float]]:
    """Every (step, value) logged for metric `key` in run `run_id`, by step; empty when never logged."""
    from mlflow.tracking import MlflowClient

    return [(m.step, m.value) for m in sorted(MlflowClient().get_metric_history(run_id, key), key=lambda m: m.step)]


CHAMPION = "champion"  # the registry alias that always names the newest registered version
_SERVING_PACKAGES = ("mlflow", "transformers", "torch", "tokenizers", "safetensors")


def register_model(
    hf_dir: Path,
    name: str,
    tags: dict[str, str],
    description: str,
    artifact_path: str = "model",
    *,
    prompt_template: str,
    input_example: str,
    max_new_tokens: int = 64,
    alias: str = CHAMPION,
) -> str:
    """Log the transformers folder `hf_dir` to the active run as an MLflow transformers model
    (a text-generation pipeline), register it as a new version of `name` and point `alias` at it.

    `prompt_template` (str.format with `prompt`) turns a plain question into the model's chat
    prompt, so `mlflow.pyfunc.load_model("models:/<name>@<alias>").predict(["..."])` answers
    without the caller knowing the template. The registered model is created on first use;
    returns the new version number.
    """
    from importlib.metadata import version

    import mlflow
    import transformers
    from huggingface_hub import ModelCard
    from mlflow.exceptions import MlflowException
    from mlflow.models import ModelSignature
    from mlflow.tracking import MlflowClient
    from mlflow.types.schema import ColSpec, ParamSchema, ParamSpec, Schema

    run = active_run()
    hf_dir = Path(hf_dir)
    if not (hf_dir / "config.json").is_file() or not (hf_dir / "tokenizer.json").is_file():
        raise FileNotFoundError(
            f"{hf_dir} is not a transformers model folder with a tokenizer (config.json, tokenizer.json): "
            "pass the folder models.export.export_hf_llama wrote with tokenizer_json"
        )
    pipe = transformers.pipeline("text-generation", model=str(hf_dir), tokenizer=str(hf_dir), device="cpu")
    signature = ModelSignature(
        inputs=Schema([ColSpec("string")]),
        outputs=Schema([ColSpec("string")]),
        params=ParamSchema([ParamSpec("max_new_tokens", "long", max_new_tokens), ParamSpec("do_sample", "boolean", False)]),
    )
    info = mlflow.transformers.log_model(
        pipe,
        name=artifact_path,
        task="text-generation",
        signature=signature,
        input_example=[input_example],
        prompt_template=prompt_template,
        model_config={"max_new_tokens": max_new_tokens, "do_sample": False},
        # A card of our own: MLflow would otherwise look the local folder up on the Hugging Face Hub.
        model_card=ModelCard(f"---\nlicense: other\n---\n{description}\n"),
        # Pinned here: MLflow's own default list asks for torchvision, which we do not install.
        pip_requirements=[f"{pkg}=={version(pkg)}" for pkg in _SERVING_PACKAGES],
    )
    client = MlflowClient()
    try:
        client.create_registered_model(name, description=description)
    except MlflowException as exc:
        if "already exists" not in str(exc).lower() and "RESOURCE_ALREADY_EXISTS" not in str(exc):
            raise
    version = client.create_model_version(
        name, source=info.model_uri, run_id=run.info.run_id, tags=tags, description=description
    )
    client.set_registered_model_alias(name, alias, version.version)
    return str(version.version)


def tag_active_run(key: str, value: str) -> None:
    """Tag the active MLflow run when there is one; stages also run outside any run (tests, notebooks)."""
    import mlflow

    if mlflow.active_run() is not None:
        mlflow.set_tag(key, value)


def workspace_runs(ws: Workspace) -> list[dict[str, Any]]:
    """Every run of the workspace's experiment, newest first: id, name, status, start, params, tags."""
    from mlflow.tracking import MlflowClient

    experiment_id = configure(ws)
    client = MlflowClient()
    runs, token = [], None
    while True:
        page = client.search_runs([experiment_id], max_results=1000, page_token=token, order_by=["attribute.start_time DESC"])
        runs += [
            {"run_id": r.info.run_id, "name": r.info.run_name, "status": r.info.status, "start_time": r.info.start_time,
             "params": dict(r.data.params), "tags": dict(r.data.tags)}
            for r in page
        ]
        token = page.token
        if not token:
            return runs


def registered_version_refs(ws: Workspace) -> list[dict[str, Any]]:
    """Every registered model version of the workspace's store: name, version, run id, tags."""
    from mlflow.tracking import MlflowClient

    configure(ws)
    return [
        {"name": v.name, "version": v.version, "run_id": v.run_id, "tags": dict(v.tags or {})}
        for v in MlflowClient().search_model_versions(max_results=10_000)
    ]


def where_to_see_run(ws: Workspace, run_id: str) -> str:
    """A line saying where a person opens this run: its URL on an MLflow server, or the local UI command and URL."""
    import mlflow

    experiment_id = mlflow.get_run(run_id).info.experiment_id
    url = mlflow_run_url(experiment_id, run_id)
    if url is not None:
        return f"MLflow run: {url}"
    return (f"MLflow run: http://127.0.0.1:5000/#/experiments/{experiment_id}/runs/{run_id} "
            f"(after `infra/scripts/start_mlflow_server.sh` or `mlflow ui --backend-store-uri {tracking_uri(ws)}`)")
