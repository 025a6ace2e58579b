"""DeepSpeed start-up: the run's JSON config and the real `deepspeed` launcher as a subprocess.

The JSON files next to this module (`infra/launch/deepspeed/zero*.json`) hold what depends on
the ZeRO stage only; `build_ds_config` adds what depends on the run (batch sizes,
clipping, precision). DeepSpeed never builds the optimizer or the LR schedule: the
training loop passes its own (models/optim.py), so both are identical across stages.
"""
from __future__ import annotations

import collections
import contextlib
import errno
import importlib.util
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

from infra.launch.build_lock import BUILDING_SHM_OP, clear_lock_of_stopped_build, clear_stale_build_locks
from infra.launch.precision import choose_precision
from infra.launch.rank_watch import DEFAULT_TIMEOUT_S, RankWatch
from infra.lifecycle.process_tree import STOP_GRACE_S, SUPERVISOR_ENV, TrackedTree, stop_processes, supervisor_token
from infra.lifecycle.signals import run_stopping

# torch is imported inside the functions that need it: the CLI and the data flow import this module and never
# load torch (tests/unit/flows/test_data_flow_imports.py).

DS_CONFIG_DIR = Path(__file__).parent / "deepspeed"
ZERO_STAGES = ("zero0", "zero1", "zero2", "zero3", "zero2_offload")
Precision = Literal["fp32", "bf16", "auto"]

# DeepSpeed prints throughput every `steps_per_print` steps; we log our own metrics.
_QUIET_STEPS_PER_PRINT = 10**9
_LOG_TAIL_LINES = 60
# DeepSpeed's CPU all-reduce maps one /dev/shm file per rank, named
# deepspeed_allreduce_buffer_<uid>_<master addr>_<master port>_<rank>, and never unlinks it.
SHM_DIR = Path("/dev/shm")
SHM_PREFIX = "deepspeed_allreduce_buffer"
# DeepSpeed's own INFO lines ("[2026-01-01 12:00:00,000] [INFO] [launch.py:174:main] Setting CUDA_VISIBLE_DEVICES=0"):
# with a log file they go there only; its warnings, errors and every line of the ranks stay on screen.
DS_INFO = re.compile(r"^\[[^\]]*\] \[INFO\] ")
_RANK_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_SIZE", "MASTER_ADDR", "MASTER_PORT", "CROSS_RANK", "CROSS_SIZE")


def resolve_precision(precision: str) -> Literal["fp32", "bf16"]:
    """The precision to train in: "fp32"/"bf16" as given; "auto" as measured (infra/launch/precision.py)."""
    return choose_precision(precision).precision


def load_zero_json(zero: str) -> dict[str, Any]:
    """The stage's JSON from infra/launch/deepspeed/, with an error listing the stages that exist."""
    path = DS_CONFIG_DIR / f"{zero}.json"
    if zero not in ZERO_STAGES or not path.is_file():
        raise ValueError(f"unknown ZeRO config '{zero}'; choose one of {list(ZERO_STAGES)} (files in {DS_CONFIG_DIR})")
    data = json.loads(path.read_text(encoding="utf-8"))
    for key in ("optimizer", "scheduler"):
        if key in data:
            raise ValueError(f"{path}: remove '{key}': the training loop passes its own optimizer and LR schedule")
    return data


def build_ds_config(zero: str, precision: Literal["fp32", "bf16"], micro_batch_size: int, grad_accum: int,
                    grad_clip: float) -> dict[str, Any]:
    """Merge infra/launch/deepspeed/<zero>.json with the run's batch shape, clipping and (resolved) precision."""
    import torch

    cfg = load_zero_json(zero)
    cfg.update(
        {
            "train_micro_batch_size_per_gpu": int(micro_batch_size),
            "gradient_accumulation_steps": int(grad_accum),
            "gradient_clipping": float(grad_clip),
            "bf16": {"enabled": precision == "bf16"},
            "fp16": {"enabled": False},
            "steps_per_print": _QUIET_STEPS_PER_PRINT,
        }
    )
    offload = cfg.get("zero_optimization", {}).get("offload_optimizer")
    if offload is not None:
        # Pinned host memory speeds GPU<->CPU copies but cannot be allocated without CUDA.
        offload["pin_memory"] = bool(torch.cuda.is_available() and os.environ.get("DS_ACCELERATOR") != "cpu")
    return cfg


def free_port() -> int:
    """A TCP port that was free a moment ago (the OS picks it), for the rendezvous."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def runner_command() -> list[str]:
    """DeepSpeed's launcher as this interpreter runs it (same venv, same packages): `deepspeed`'s own runner, started
    through infra/launch/runner.py, which keeps DeepSpeed's unused MLflow import out of its start-up."""
    if importlib.util.find_spec("deepspeed") is None:
        raise FileNotFoundError(f"DeepSpeed is not installed for {sys.executable}; install it in this environment "
                                "(pip install deepspeed)")
    return [sys.executable, "-m", "infra.launch.runner"]


def launch_command(module: str, args: list[str], num_procs: int = 1, hostfile: Path | None = None,
                   master_port: int | None = None, launcher_args: list[str] | None = None) -> list[str]:
    """DeepSpeed's launcher command line (runner_command: `deepspeed ...`): N ranks per node (CPU processes or
    GPUs) running `python -m module`.

    `launcher_args` are more of the runner's own flags, for multi-node runs (e.g. `--master_addr`,
    `--ssh_port`, `--launcher openmpi`)."""
    if num_procs < 1:
        raise ValueError(f"num_procs must be >= 1, got {num_procs}")
    cmd = runner_command()
    if hostfile is not None:
        if not Path(hostfile).is_file():
            raise FileNotFoundError(f"hostfile {hostfile} does not exist; write one line per node: '<host> slots=<n>'")
        cmd += ["--hostfile", str(hostfile)]
    cmd += list(launcher_args or [])
    cmd += [
        "--num_gpus", str(num_procs),
        "--master_port", str(master_port or free_port()),
        # The worker reads LOCAL_RANK from the environment instead of a --local_rank flag.
        "--no_local_rank",
        "--module", module,
    ]
    return cmd + list(args)


def launch_env(num_procs: int, env: dict[str, str] | None = None) -> dict[str, str]:
    """Environment of the launcher: CPU accelerator without CUDA, one share of the cores per rank."""
    import torch

    full = dict(os.environ)
    # A process that is itself a rank (e.g. a test that initialised a one-rank group) must not
    # hand its rank variables down: the launcher assigns them per child.
    for key in _RANK_VARS:
        full.pop(key, None)
    full.update(env or {})
    full.setdefault("PYTHONUNBUFFERED", "1")
    if not torch.cuda.is_available():
        full["DS_ACCELERATOR"] = "cpu"
    if full.get("DS_ACCELERATOR") == "cpu" and "OMP_NUM_THREADS" not in full:
        # N ranks each using every core thrash each other; give each its share.
        full["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // num_procs))
    return full


# What the ranks on other nodes need of this environment. DeepSpeed's pdsh runner exports
# only variables starting with MLFLOW, PYTHON, MV2 or UCX (plus NCCL ones on CUDA) and the
# lines of a `.deepspeed_env` file; ranks also need the accelerator, their thread count and
# our workspace settings. LLMFORGE_SUPERVISOR names a process of this machine: a remote
# rank would find it missing and stop, so it stays here.
_REMOTE_ENV_PREFIXES = ("DS_ACCELERATOR", "OMP_NUM_THREADS", "LLMFORGE_", "TORCH_", "TOKENIZERS_", "HF_", "XDG_CACHE_HOME")


def write_remote_env(env: dict[str, str], path: Path, cwd: Path | None = None) -> Path:
    """Write the `.deepspeed_env` that DeepSpeed's runner exports on every node (DS_ENV_FILE):
    the user's own `.deepspeed_env` lines (home, then the launch folder), then ours."""
    lines: list[str] = []
    for folder in (Path.home(), Path(cwd or ".")):
        own = folder / ".deepspeed_env"
        if own.is_file():
            lines += [line for line in own.read_text(encoding="utf-8").splitlines() if "=" in line]
    for key in sorted(env):
        if key.startswith(_REMOTE_ENV_PREFIXES) and key != SUPERVISOR_ENV and "\n" not in env[key]:
            lines.append(f"{key}={env[key]}")
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


def shm_buffers(master_port: int, rank: int | None = None) -> list[Path]:
    """The /dev/shm all-reduce buffers of the launch on `master_port` (one rank's, or all)."""
    if not SHM_DIR.is_dir():
        return []
    tail = f"_{master_port}_{rank}" if rank is not None else f"_{master_port}_*"
    return sorted(SHM_DIR.glob(f"{SHM_PREFIX}_{os.getuid()}_*{tail}"))


def remove_shm_buffers(master_port: int, rank: int | None = None) -> int:
    """Unlink those buffers (memory already mapped stays valid until unmapped); how many there were."""
    found = shm_buffers(master_port, rank)
    for path in found:
        path.unlink(missing_ok=True)
    return len(found)


def launch(
    module: str,
    args: list[str],
    num_procs: int = 1,
    hostfile: Path | None = None,
    master_port: int | None = None,
    env: dict[str, str] | None = None,
    log: Callable[[str], Any] = print,
    cwd: Path | None = None,
    launcher_args: list[str] | None = None,
    timeout_s: float | None = DEFAULT_TIMEOUT_S,
    log_file: Path | None = None,
) -> None:
    """Run `deepspeed --module module args...`, streaming its output line by line to `log`.

    With `log_file`, every line is appended there too, and DeepSpeed's INFO lines go there only.

    Raises RuntimeError with the last lines of output when the launcher exits non-zero, or
    naming the rank when one of this machine's ranks is silent (no CPU work) for `timeout_s`
    seconds (infra/launch/rank_watch.py; None: no watch).
    """
    master_port = master_port or free_port()
    cmd = launch_command(module, args, num_procs=num_procs, hostfile=hostfile, master_port=master_port,
                         launcher_args=launcher_args)
    full_env = launch_env(num_procs, env)
    env_dir = None
    if hostfile is not None:
        env_dir = Path(tempfile.mkdtemp(prefix="llmforge-ds-env-"))
        full_env["DS_ENV_FILE"] = str(write_remote_env(full_env, env_dir / ".deepspeed_env", cwd))
    # The ranks watch this process and exit when it is gone, even SIGKILLed (infra/lifecycle/process_tree.py).
    full_env[SUPERVISOR_ENV] = supervisor_token()
    # A launch killed while building DeepSpeed's op leaves torch's lock; the next would wait on it forever.
    clear_stale_build_locks(full_env, log)
    tail: collections.deque[str] = collections.deque(maxlen=_LOG_TAIL_LINES)
    building = threading.Event()  # a rank said BUILDING_SHM_OP, however many lines followed
    with _launch_log(log, log_file) as show, subprocess.Popen(
        # The launcher gets SIGTERM when this process dies: set through an exec wrapper, as
        # preexec_fn is unsafe in a threaded process (Prefect runs tasks in threads).
        [sys.executable, "-m", "infra.lifecycle.process_tree", *cmd],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        bufsize=1,
        env=full_env,
        cwd=str(cwd) if cwd else None,
        errors="replace",
        # Not a session of its own: Ctrl-C in a terminal reaches the launcher and every rank
        # together with this process, and a kill of this process group takes them all.
    ) as proc:
        assert proc.stdout is not None
        show(f"launching: {' '.join(cmd)}")

        def keep(line: str) -> None:
            tail.append(line)
            if BUILDING_SHM_OP in line:
                building.set()
            show(line)

        watch = RankWatch(proc.pid, timeout_s) if timeout_s is not None else contextlib.nullcontext()
        tree = TrackedTree(proc.pid)
        try:
            with tree, watch:
                for line in proc.stdout:
                    keep(line.rstrip("\n"))
                rc = proc.wait()
        except BaseException:
            # Interrupted (Ctrl-C, SIGTERM, a cancel): the ranks finish their step and save it meanwhile
            # (tasks/training/stop.py); wait for them, showing what they say, SIGKILL after the grace period.
            # Their lines are kept too: on a loaded machine, the rank's BUILDING_SHM_OP can still be unread in
            # the pipe when the stop comes.
            _stop_showing(tree, proc.stdout, keep)
            raise
        finally:
            # After a clean exit or an error: stragglers, also those the runner's death left to init.
            stop_processes(tree.alive())
            if building.is_set():  # stopped while building, it may have left torch's lock
                clear_lock_of_stopped_build(full_env, log)
            remove_shm_buffers(master_port)
            if env_dir is not None:
                shutil.rmtree(env_dir, ignore_errors=True)
    silent = getattr(watch, "silent", None)
    if silent is not None:
        raise RuntimeError(f"deepspeed launch of '{module}': {silent}")
    if rc != 0:
        raise launch_failure(module, num_procs, rc, list(tail))


def _stop_showing(tree: TrackedTree, out: Any, show: Callable[[str], Any]) -> None:
    """Stop the launch's processes (SIGTERM, SIGKILL after STOP_GRACE_S) while passing their last lines to `show`."""
    stopper = threading.Thread(target=stop_processes, args=(tree.alive(), STOP_GRACE_S), name="stop-launch", daemon=True)
    stopper.start()

    def drain() -> None:
        with contextlib.suppress(Exception):  # a closed pipe or a bad line: what was said is said
            for line in out:
                show(line.rstrip("\n"))

    reader = threading.Thread(target=drain, name="launch-last-lines", daemon=True)
    reader.start()
    stopper.join()
    reader.join(timeout=2.0)  # a process outside the tree may hold the pipe open: do not wait on it


@contextlib.contextmanager
def _launch_log(log: Callable[[str], Any], log_file: Path | None) -> Any:
    """The launch's line sink: `log` alone, or `log_file` for every line and `log` for all but DeepSpeed's INFO."""
    if log_file is None:
        yield log
        return
    Path(log_file).parent.mkdir(parents=True, exist_ok=True)
    log(f"launcher log (DeepSpeed's INFO lines): {Path(log_file).resolve()}")
    with open(log_file, "a", encoding="utf-8", buffering=1) as file:
        def show(line: str) -> None:
            file.write(line + "\n")
            if not DS_INFO.match(line):
                log(line)
        yield show


class LaunchStopped(RuntimeError):
    """A launch whose ranks ended because the run was told to stop: not a failure to show a traceback for."""


class LaunchDiskFull(OSError, RuntimeError):
    """A launch failed because a rank ran out of disk space: an OSError(ENOSPC), so the CLI exits 4 as for
    the data flow, and still the RuntimeError every other launch failure is."""


# A rank's last words when its disk filled: Python's "[Errno 28]" (ENOSPC, e.g. a checkpoint save) or SQLite's.
_DISK_FULL = re.compile(r"\[Errno 28\] (.*)|(database or disk is full.*)")


def launch_failure(module: str, num_procs: int, rc: int, tail: list[str]) -> RuntimeError:
    """The error of a launch that exited `rc`: its last lines, as a LaunchDiskFull when a rank's disk filled; a
    LaunchStopped when the run was told to stop (a launch of a queue, beside the one the signal interrupted)."""
    if run_stopping():
        return LaunchStopped(f"deepspeed launch of '{module}' stopped with the run (exit code {rc})")
    joined = "\n".join(tail)
    message = (f"deepspeed launch of '{module}' with {num_procs} process(es) failed with exit code {rc}; "
               f"last {len(tail)} lines of its output:\n{joined}")
    for line in reversed(tail):
        found = _DISK_FULL.search(line)
        if found:
            reason = found.group(1) or found.group(2)
            return LaunchDiskFull(errno.ENOSPC, f"deepspeed launch of '{module}' stopped: a rank ran out of disk "
                                                f"space: {reason}")
    return RuntimeError(message)
