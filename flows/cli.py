"""`llmforge`: run the pipeline or one of its flows from the command line."""
from __future__ import annotations

import argparse
import contextlib
import errno
import json
import logging
import os
import signal
import sys
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

# Each command imports what it needs inside its own function: the config and the flows import every stage (pydantic,
# pyarrow, prefect, and torch for the training flows), which `llmforge --help`, a wrong argument and `llmforge runs`
# never need, and the data flow's process never loads torch (tests/unit/flows/test_cli_errors.py times the quick ones).


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--preset", default="tiny", help="preset name in infra/presets/ or a YAML path (default: tiny)")
    _workdir(p)
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE", help="override a config key, e.g. --set data.near.threshold=0.7 (repeatable)")


class _Parser(argparse.ArgumentParser):
    """argparse, with its errors in one line (they print the whole usage by default)."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="llmforge",
        description="An end-to-end LLM training pipeline as Prefect flows, tracked in MLflow.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("run", help="run the whole pipeline on a preset", description="Run every stage of the pipeline; completed stages are skipped on rerun.")
    _common(p)
    p = sub.add_parser("data", help="collect, dedup, filter, mix and shard the catalog's sources", description="Run the data flow: collect → exact dedup → MinHash near-dedup → quality filters → PII redaction → mix → Parquet shards.")
    _common(p)
    p.add_argument("--catalog", help="catalog folder of source YAML files (default: from the preset)")
    p = sub.add_parser("scale", help="IsoFLOP sweep, scaling-law fits, and a larger run predicted then trained",
                       description="Train the preset's `scale:` sweep (budgets x model sizes of one family, each an ordinary "
                                   "cached pretraining run), fit Chinchilla's approaches 2 and 3 with bootstrap intervals, "
                                   "predict the run at scale.predict_factor x the largest budget, train it and compare "
                                   "(work/scale/<key>/prediction.json, report.md).")
    _common(p)
    p = sub.add_parser("ablate", help="one proxy model per data variant and seed, compared beyond seed noise",
                       description="Train a proxy per variant x seed of FILE (YAML: variants, seeds, targets or holdout, proxy, "
                                   "tokenizer, aa, until, metrics), score each on held-out targets in bits per byte "
                                   "(with until: evaluate, also on the evaluation's metrics), and say which variants "
                                   "differ from the baseline beyond seed noise, with 95% intervals "
                                   "(work/ablate/<key>/ablation.json, report.md). --preset and --set apply to every "
                                   "variant.")
    p.add_argument("file", nargs="?", default=None,
                   help="the ablation file (docs/ablations.md); none: the built-in ablation (quality filters off, near "
                        "dedup off, a code-heavy mix, and the A/A check, on the held-out slice of every source)")
    _common(p)
    p = sub.add_parser("mix", help="proxies on sampled mixes, a mixing law, and the mix it proposes, checked over seeds",
                       description="Train a proxy per mix drawn around the catalog's weights (the preset's `mix:` "
                                   "section: per_source, concentration, floor, seeds, proxy), fit a mixing law of the "
                                   "targets' bits per byte on the shares (log-linear, or quadratic where it predicts "
                                   "left-out proxies better), write down the mix it predicts best with an interval, "
                                   "then train it and the catalog's mix over seeds and compare them "
                                   "(work/mix/<key>/mix.json, report.md, preset.yaml for `llmforge run --preset`).")
    p.add_argument("--target", dest="targets", action="append", default=[], metavar="NAME=PATH",
                   help="a held-out text to choose the mix for: .jsonl (a `text` per line) or .txt (repeatable; "
                        "default: the held-out slice of every source, weighted equally)")
    p.add_argument("--confirm-scale", type=_bounded(float, 1, 1000), metavar="K",
                   help="also train the proposal and the catalog's mix at K x the proxy's parameters and tokens, and "
                        "say whether the ranking holds")
    _common(p)
    p = sub.add_parser("show-config", help="print the resolved config of a preset", description="Validate a preset and print it with overrides applied.")
    _common(p)
    p = sub.add_parser("runs", help="list the workspace's MLflow runs, grouped by pipeline run",
                       description="List the workspace's runs, newest pipeline run first with its stage runs under it: "
                                   "start, status, wall time, what varied, the headline metric, the output folders' size "
                                   "on disk; --diff A B prints the config keys that differ between two runs.")
    _workdir(p)
    p.add_argument("--outputs", action="store_true", help="also list each run's output folders")
    p.add_argument("--diff", nargs=2, metavar=("RUN_A", "RUN_B"), help="config keys that differ between two runs (ids or unique prefixes)")
    p = sub.add_parser("gc", help="remove output folders no MLflow run or registered model refers to",
                       description="Garbage-collect stage output folders that no MLflow run (any status, not deleted) or "
                                   "registered model version refers to. A dry run unless --apply is given.")
    _workdir(p)
    p.add_argument("--apply", action="store_true", help="really remove them (default: only list them)")
    p = sub.add_parser("plan", help="per-device memory of every dp x tp x pp x ZeRO layout of N devices",
                       description="Estimate per-device bytes (weights, gradients, optimizer state, activations with and "
                                   "without checkpointing, communication buffers) of every layout DeepSpeed can run on N "
                                   "devices, and name the fastest that fits (models/memory_plan.py says how).")
    p.add_argument("--model", required=True, help="model preset (models/presets.py) or a Hugging Face config.json")
    p.add_argument("--devices", type=_bounded(int, 1, MAX_DEVICES), required=True, help="number of devices (GPUs) in the cluster")
    p.add_argument("--device-mem", type=_bounded(float, 1e-3, 1e6), default=80.0, help="memory per device in GB of 2**30 bytes (default: 80)")
    p.add_argument("--seq-len", type=_bounded(int, 1, 10**7), help="tokens per sequence (default: the model's max positions)")
    p.add_argument("--micro-batch", type=_bounded(int, 1, 10**6), default=1, help="sequences per device per micro-batch (default: 1)")
    p.add_argument("--precision", choices=["bf16", "fp32"], default="bf16", help="weights and activations (default: bf16)")
    p.add_argument("--vocab-size", type=_bounded(int, 1, 10**8), help="override the vocabulary (a preset's default: the one its size is quoted at)")
    p.add_argument("--devices-per-node", type=_bounded(int, 1, MAX_DEVICES), default=8, help="devices per node: tp beyond it ranks last (default: 8)")
    p.add_argument("--json", action="store_true", help="print the plan as JSON")
    return parser


MAX_DEVICES = 10**6  # `plan`'s search is over the divisors of the device count: bounded, it stays under a second


def _bounded(kind: type, low: float, high: float) -> Callable[[str], Any]:
    """An argparse type: a finite `kind` in [low, high], else an error naming the range."""
    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {'an integer' if kind is int else 'a number'}") from None
        if not (low <= value <= high):  # NaN fails both comparisons; inf the upper one
            raise argparse.ArgumentTypeError(f"{text} must lie in [{low:g}, {high:g}]")
        return value
    return parse


def _workdir(p: argparse.ArgumentParser) -> None:
    p.add_argument("--workdir", default=os.environ.get("LLMFORGE_HOME", "work"), help="workspace folder for all outputs (default: $LLMFORGE_HOME, else ./work)")


def _say_where(workdir: str, run_id: str, what: str) -> None:
    from infra.tracking.runs import where_to_see_run
    from infra.tracking.store import configure
    from infra.workspace.paths import Workspace

    ws = Workspace.locate(workdir)
    configure(ws)
    print(what)
    print(where_to_see_run(ws, run_id))


def _mb(n: int) -> str:
    return f"{n / 1e6:,.1f} MB"


def _runs(args: argparse.Namespace) -> int:
    from flows.runs_view import render_diff, render_runs
    from infra.workspace.paths import Workspace

    ws = Workspace.locate(args.workdir)
    lines = render_diff(ws, *args.diff) if args.diff else render_runs(ws, show_outputs=args.outputs)
    print("\n".join(lines))
    return 0


def _gc(args: argparse.Namespace) -> int:
    from infra.tracking.index import check_store_exists
    from infra.tracking.outputs import apply_gc, plan_gc
    from infra.workspace.lock import workspace_lock
    from infra.workspace.paths import Workspace

    ws = Workspace.locate(args.workdir)
    check_store_exists(ws)  # a mistyped --workdir must not become a new, empty workspace
    with workspace_lock(ws, wait=False):
        plan = plan_gc(ws)
        for folder in plan.remove:
            print(f"{'removing' if args.apply else 'would remove'} {folder.relative_to(ws.root)}")
        verb = "removed" if args.apply else "would free"
        if args.apply:
            apply_gc(ws, plan)
        print(f"{len(plan.remove)} unreferenced folder(s), {verb} {_mb(plan.bytes)}; {plan.keep} in use kept"
              + ("" if args.apply or not plan.remove else "; run with --apply to remove them"))
    return 0


def _plan(args: argparse.Namespace) -> int:
    from infra.config import ConfigError
    from models.flops import count
    from models.memory_plan import GiB, load_model, plan

    try:
        cfg = load_model(args.model, args.vocab_size)
        result = plan(cfg, args.devices, seq_len=args.seq_len, micro_batch=args.micro_batch, precision=args.precision,
                      device_mem_bytes=int(args.device_mem * GiB), devices_per_node=args.devices_per_node)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    if args.json:
        print(json.dumps({"n_params": result.n_params, "layouts": [p.as_dict() for p in result.layouts]}, indent=1))
        return 0
    # GB of 2**30 bytes, or MB of 2**20 for a model too small to show in GB
    unit, name = (GiB, "GB") if max(p.total_bytes for p in result.layouts) >= GiB else (2**20, "MB")

    def size(n: int) -> str:
        return f"{n / unit:.1f}"

    print(f"{args.model}: {count(result.n_params)} params, seq len {result.seq_len}, micro-batch "
          f"{result.micro_batch}, {result.precision}, {args.devices} devices of {args.device_mem:g} GB "
          f"({name} per device, of 2**{30 if unit == GiB else 20} bytes; ckpt = full activation checkpointing)")
    cols = ("dp", "tp", "pp", "zero", "params", "grads", "optim", "act", "act ckpt", "comm", "total", "total ckpt", "fits")
    rows = [(p.dp, p.tp, p.pp, p.zero, *map(size, (p.params_bytes, p.grads_bytes, p.optimizer_bytes, p.activations_bytes,
             p.activations_checkpointed_bytes, p.comm_bytes, p.total_bytes, p.total_checkpointed_bytes)),
             "yes" if p.fits else "ckpt" if p.fits_checkpointed else "no") for p in result.layouts]
    print("| " + " | ".join(cols) + " |")
    print("|" + "|".join("---:" for _ in cols) + "|")
    for row in rows:
        print("| " + " | ".join(str(v) for v in row) + " |")
    best = result.fastest
    if best is None:
        print(f"no layout fits {args.devices} devices of {args.device_mem:g} GB, even with activation checkpointing; "
              "add devices, lower --seq-len or --micro-batch")
    else:
        print(f"fastest that fits: dp {best.dp} x tp {best.tp} x pp {best.pp}, ZeRO-{best.zero}"
              f"{'' if best.fits else ' with full activation checkpointing'}, "
              f"{size(best.total_bytes if best.fits else best.total_checkpointed_bytes)} {name} per device")
    return 0


# Prefect defaults for a local run; the user's own settings win. The ephemeral API's
# start-up can take a while on a small, busy machine, and telemetry is not ours to send.
PREFECT_DEFAULTS = {
    "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "180",
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
}


def _start_flow_services(server_started: Callable[[], int | None]) -> None:
    """Ctrl-C/SIGTERM handlers that stop the whole run, once Prefect's temporary server (shielded from Ctrl-C,
    started by `infra.lifecycle.signals.prefect_server_starting`) is up, and a watch on Prefect's API."""
    from infra.lifecycle.signals import install_stop_handlers

    server_pid = server_started()
    # The server is spared by the first signal: it records the run's end, and Prefect stops it at exit.
    install_stop_handlers(protect=[server_pid] if server_pid else [])
    from infra.lifecycle.api_watch import watch_prefect_api

    watch_prefect_api()  # a server lost mid-run ends the run (exit 3) instead of retries without end


class UsageError(ValueError):
    """A command-line argument is wrong (exit 2): checked before anything heavy is imported."""


def _check_catalog_arg(args: argparse.Namespace) -> None:
    """`--catalog` must be a folder: said at once, before the config's imports, the lock and Prefect's server."""
    folder = getattr(args, "catalog", None)
    if folder and not Path(folder).is_dir():
        raise UsageError(f"--catalog {folder}: no such folder ({Path(folder).resolve()}); give the folder of "
                         "the catalog's source YAML files")


class StoppedWaiting(KeyboardInterrupt):
    """A signal while the run waited for the workspace: nothing had started, so there is nothing to stop."""

    def __init__(self, signum: int, workspace: Path) -> None:
        self.exit_code = 128 + signum  # the shell's convention for death by a signal
        super().__init__(f"stopped by {signal.Signals(signum).name} while waiting for workspace {workspace}; "
                         "nothing had started")


@contextlib.contextmanager
def _signals_raise() -> Iterator[None]:
    """SIGINT and SIGTERM raise RunStopped in the block (SIGTERM would otherwise end Python without a word)."""
    from infra.lifecycle.signals import STOP_SIGNALS, RunStopped

    def stop(signum: int, frame: Any) -> None:
        raise RunStopped(signum)

    before = {sig: signal.signal(sig, stop) for sig in STOP_SIGNALS}
    try:
        yield
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)


@contextlib.contextmanager
def _workspace_held(workdir: str) -> Iterator[None]:
    """Hold the workspace for the whole command, taken before anything starts (the config's imports, Prefect's
    server): a second run says within a second that it waits and for whom, and a signal while it waits ends it."""
    from infra.lifecycle.signals import RunStopped
    from infra.workspace.lock import workspace_lock
    from infra.workspace.paths import Workspace

    ws = Workspace.locate(workdir).ensure_writable()
    with contextlib.ExitStack() as held:
        try:
            with _signals_raise():
                held.enter_context(workspace_lock(ws, log=lambda line: print(line, file=sys.stderr, flush=True)))
        except RunStopped as exc:
            raise StoppedWaiting(exc.signum, ws.root) from None
        yield  # the flows take the same lock again: a no-op in this process (infra/workspace/lock.py)


def _run_flow(args: argparse.Namespace) -> int:
    """`data`, `run`, `scale` or `ablate`: validate, check the services, start Prefect's server, run the flow, say where to see it."""
    # From here (the workspace held) until the stop handlers are in place, Ctrl-C and SIGTERM wait, a few seconds:
    # two threads import meanwhile (the config and flow modules here, Prefect's server beside them), and a signal
    # that cuts an import short can leave Python's import lock held, so that the other thread, then this one,
    # waits forever. Blocked here before the thread starts, in both; then delivered to the stop handlers.
    deferred = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
    try:
        cfg, flow = _flow_ready(args)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, deferred)
    # The flows get the override strings too: they name the MLflow runs after them.
    pairs = list(args.overrides) + ([f"data.catalog={args.catalog}"] if getattr(args, "catalog", None) else [])
    if args.command == "ablate":
        done = flow(args.file, workdir=args.workdir, preset=args.preset, overrides=pairs)
        _say_where(args.workdir, done.mlflow_run_id, f"report: {Path(done.report).resolve()}")
    elif args.command == "mix":
        done = flow(cfg, workdir=args.workdir, overrides=pairs)
        _say_where(args.workdir, done.mlflow_run_id, f"report: {Path(done.report).resolve()}; the proposal as a "
                                                     f"preset: {Path(done.preset).resolve()}")
    elif args.command == "scale":
        sweep = flow(cfg, workdir=args.workdir, overrides=pairs)
        _say_where(args.workdir, sweep.mlflow_run_id, f"report: {Path(sweep.report).resolve()}")
    elif args.command == "data":
        data = flow(cfg.data, workdir=args.workdir, overrides=[p for p in pairs if p.startswith("data.")])
        _say_where(args.workdir, data.mlflow_run_id, f"manifest: {Path(data.manifest).resolve()}")
    else:
        result = flow(cfg, workdir=args.workdir, preset=args.preset, overrides=pairs)  # the run says its preset
        _say_where(args.workdir, result.mlflow_run_id, f"report: {Path(result.report).resolve()}")
    return 0


def _flow_ready(args: argparse.Namespace) -> tuple[Any, Any]:
    """The validated config and the command's flow, with Prefect's server up (started while the flow imports) and
    the stop handlers installed."""
    from flows.config import check_paths, load_pipeline_config
    from infra.lifecycle.signals import prefect_server_starting

    cfg = load_pipeline_config(args.preset, _overrides(args))
    check_paths(cfg)  # the catalog and its sources: fail before any work starts
    server_started = prefect_server_starting()
    if args.command == "ablate":
        from flows.ablate_flow import ablate_flow as flow
    elif args.command == "scale":
        from flows.scale_flow import scale_flow as flow
    elif args.command == "mix":
        from flows.mix_flow import mix_flow as flow
    elif args.command == "data":
        from flows.data_flow import flow_for

        flow = flow_for(cfg.data)  # the task runner of data.executor set here: no second flow run to switch it
    else:
        from flows.pipeline_flow import pipeline_flow as flow
    _start_flow_services(server_started)
    return cfg, flow


def _overrides(args: argparse.Namespace) -> dict[str, Any]:
    """The `--set key=value` pairs, parsed like a deployment's `overrides` (flows/config.py), and --catalog."""
    from flows.config import parse_overrides

    overrides = parse_overrides(args.overrides)
    if getattr(args, "catalog", None):
        overrides["data.catalog"] = args.catalog
    return overrides


def _show_config(args: argparse.Namespace) -> int:
    import yaml

    from flows.config import check_paths, load_pipeline_config

    cfg = load_pipeline_config(args.preset, _overrides(args))
    check_paths(cfg)
    print(yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False))
    return 0


def _run(args: argparse.Namespace) -> int:
    """The command, with the workspace held first where it writes outputs."""
    if args.command in ("data", "run", "scale", "ablate", "mix"):
        from infra.lifecycle.preflight import check_services

        _check_catalog_arg(args)
        if args.command == "ablate":  # a bad file or variant is refused at once, before the services and the workspace
            from flows.ablation_spec import BUILTIN, check_metrics, load_spec, variant_overrides
            from flows.config import check_paths, load_pipeline_config, parse_overrides

            from infra.config import ConfigError

            args.file = args.file or str(BUILTIN)
            spec = load_spec(Path(args.file))
            for name, sets in variant_overrides(spec, args.overrides).items():
                try:
                    config = load_pipeline_config(args.preset, parse_overrides(sets))
                    check_paths(config)
                except ConfigError as exc:
                    raise ConfigError(f"{args.file}, variant '{name}': {exc}") from None
                check_metrics(spec, args.file, config.eval.tasks)
        if args.command == "mix":  # targets and the factor, before the services and the workspace
            _mix_settings(args)
        check_services()  # a service down is said before anything is made, the workspace included
        with _workspace_held(args.workdir):
            return _run_flow(args)
    if args.command in ("runs", "gc"):
        from infra.lifecycle.preflight import check_tracking_store

        check_tracking_store()  # MLflow would retry a dead server for minutes, then print a traceback
    return {"runs": _runs, "gc": _gc, "plan": _plan, "show-config": _show_config}[args.command](args)


def _mix_settings(args: argparse.Namespace) -> None:
    """`--target NAME=PATH` as `--set mix.targets.NAME=<absolute path>`, `--confirm-scale K` as
    `--set mix.confirm_scale=K`: checked with the config, and each target file checked to exist."""
    from flows.config import load_pipeline_config

    from infra.config import ConfigError
    from tasks.training.mix_search import mix_targets

    for pair in args.targets:
        name, sep, path = pair.partition("=")
        if not sep or not name or not path:
            raise ConfigError(f"--target {pair!r}: give NAME=PATH, e.g. --target news=held_out/news.jsonl")
        if "." in name:  # NAME becomes a key of mix.targets, where a dot would nest it
            raise ConfigError(f"--target {pair!r}: a target's NAME has no '.', e.g. --target news_2024=PATH")
        args.overrides.append(f"mix.targets.{name}={Path(path).expanduser().resolve()}")
    if args.confirm_scale is not None:
        args.overrides.append(f"mix.confirm_scale={args.confirm_scale}")
    mix_targets(load_pipeline_config(args.preset, _overrides(args)).mix.targets)


# LLMFORGE_DEBUG=1: the traceback of an error the CLI otherwise says in one line, and Prefect's of it too.
DEBUG = os.environ.get("LLMFORGE_DEBUG", "") not in ("", "0")


class _UserErrorsInOneLine(logging.Filter):
    """Prefect logs a failed task's or flow's exception with its traceback; for an error the user can act on (a
    config, a service, a path: `_error_exit_code`) the CLI says it in one line, and a launch the run's stop ended is
    no failure, so the traceback is dropped and the record's message kept."""

    def filter(self, record: logging.LogRecord) -> bool:
        from infra.launch.launcher import LaunchStopped

        exc = record.exc_info[1] if record.exc_info else None
        if exc is not None and (_error_exit_code(exc) is not None or isinstance(exc, LaunchStopped)):
            record.exc_info, record.exc_text = None, None
        return True


def quiet_user_error_tracebacks() -> None:
    """The filter on the loggers Prefect's engine reports failed runs with (their records, not their children's)."""
    for name in ("prefect.flow_runs", "prefect.task_runs", "prefect.flow_engine", "prefect.task_engine"):
        logging.getLogger(name).addFilter(_UserErrorsInOneLine())


def _error_exit_code(exc: BaseException) -> int | None:
    """The exit status of an error the user can act on (shown as one line), None for a bug (its traceback)."""
    if isinstance(exc, UsageError):
        return 2
    from infra.config import ConfigError
    from infra.lifecycle.preflight import ServiceUnavailable
    from infra.tracking.index import RunNotFound
    from infra.workspace.lock import WorkspaceBusy

    if isinstance(exc, (ConfigError, RunNotFound)):
        return 2
    if isinstance(exc, (ServiceUnavailable, PermissionError, WorkspaceBusy)):
        return 3
    if isinstance(exc, OSError) and exc.errno == errno.ENOSPC:
        return 4
    if isinstance(exc, OSError) and exc.errno == errno.ENAMETOOLONG:  # a path the user gave, too long to name a file
        return 2
    return None


def _said(exc: BaseException) -> str:
    """The error's message; a path too long to name a file shortened, with what to do."""
    if isinstance(exc, OSError) and exc.errno == errno.ENAMETOOLONG:
        name = str(exc.filename or "")
        shown = name if len(name) <= 120 else f"{name[:60]}...{name[-40:]} ({len(name)} characters)"
        return f"{shown}: file name too long (a name in a path is at most 255 bytes); give a shorter path"
    return str(exc)


def one_line(message: str) -> str:
    """A message of several lines (a config with several wrong keys) as one."""
    return "; ".join(part.strip() for part in str(message).splitlines() if part.strip())


def main(argv: list[str] | None = None) -> int:
    """Exit codes: 0 done; 1 anything unforeseen (with its traceback); 2 a config error (a preset, a key, a
    catalog, an MLflow store that cannot be opened); 3 a service down or lost, no permission or busy (the
    workspace, MLflow's store locked or read-only); 4 a full disk; 128+N stopped by signal N."""
    args = build_parser().parse_args(argv)
    for key, value in PREFECT_DEFAULTS.items():
        os.environ.setdefault(key, value)
    from infra.tracking.store_errors import quiet_store_tracebacks

    quiet_store_tracebacks()
    if not DEBUG:
        quiet_user_error_tracebacks()
    try:
        return _run(args)
    except BrokenPipeError:  # `llmforge runs | head`: the reader has all it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # nor a traceback when Python flushes at exit
        return 0
    except KeyboardInterrupt as exc:
        # Imported here, as every module an error needs: a quick command or a quick error stays quick.
        from infra.lifecycle.signals import RunStopped

        if isinstance(exc, StoppedWaiting):
            print(exc, file=sys.stderr)
        elif isinstance(exc, RunStopped):
            print(f"{exc}: the run's processes are stopped; run the same command again to resume", file=sys.stderr)
        else:
            raise
        return exc.exit_code
    except Exception as exc:
        code = _error_exit_code(exc)
        if code is None:
            return _store_fault_or_raise(exc, args)
        if DEBUG:
            traceback.print_exception(exc)
        print(f"error: {one_line(_said(exc))}", file=sys.stderr)
        return code


def _store_fault_or_raise(exc: Exception, args: argparse.Namespace) -> int:
    """MLflow's store locked (3), read-only (3) or not openable (2): one line and its exit code; else re-raise."""
    from infra.tracking.store import tracking_uri
    from infra.tracking.store_errors import store_fault
    from infra.workspace.paths import Workspace

    found = store_fault(exc, tracking_uri(Workspace.locate(getattr(args, "workdir", None))))
    if found is None:
        raise exc
    print(f"error: {found[1]}", file=sys.stderr)
    return found[0]


if __name__ == "__main__":
    sys.exit(main())
