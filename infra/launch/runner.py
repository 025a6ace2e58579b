"""DeepSpeed's launcher, the `deepspeed` script's `deepspeed.launcher.runner.main`, started with MLflow kept out.

    python -m infra.launch.runner --num_gpus 2 --master_port 29500 --module tasks.training.rank --job job.json

The same runner with the same flags as `deepspeed ...`: it reads the hostfile, starts DeepSpeed's per-node launcher
and waits for the ranks. Importing DeepSpeed imports its autotuner, which imports MLflow, and the runner never uses
either: a large part of the runner's start-up, paid by every launch. `import_deepspeed` does the same for a rank.
The per-node launcher the runner starts on each node (`python -u -m deepspeed.launcher.launch ...`, locally or
through pdsh) is started as `python -u -m infra.launch.runner --node-launcher ...`: DeepSpeed's
`deepspeed.launcher.launch.main` with the same flags, MLflow kept out. That launcher looks at its ranks every
0.2 s instead of every 1 s, and both processes end without the interpreter's teardown of torch and DeepSpeed: a
launch's caller waits for both after its ranks are done. What each of these saves:
docs/experiments/2026-12-06-launch-cost-where-ours-saves.md; a launch's cost now: BENCHMARKS.md "A launch's own cost".
"""
from __future__ import annotations

import importlib
import logging
import os
import subprocess
import sys
import time
from collections.abc import Callable
from types import ModuleType, SimpleNamespace
from typing import Any, NoReturn

MODULE = "infra.launch.runner"
LAUNCH = "deepspeed.launcher.launch"  # DeepSpeed's per-node launcher module
NODE_LAUNCHER = "--node-launcher"  # `python -m infra.launch.runner --node-launcher ...`: that launcher, without MLflow
POLL_S = 0.2  # how often the per-node launcher looks at its ranks (DeepSpeed's own: 1 s)


def import_deepspeed(module: str = "deepspeed") -> ModuleType:
    """`module` (DeepSpeed or one of its modules), imported with MLflow kept out; `import mlflow` works again after.

    Where DeepSpeed or MLflow is already imported there is nothing to save, and this is a plain import."""
    if "deepspeed" in sys.modules or "mlflow" in sys.modules:
        return importlib.import_module(module)
    sys.modules["mlflow"] = None  # type: ignore[assignment]  # `import mlflow` raises ImportError meanwhile
    try:
        return importlib.import_module(module)
    finally:
        del sys.modules["mlflow"]


# pdsh's stop (DeepSpeed's multinode_runner): `pkill -f` of the launch command's words joined by escaped spaces, cut
# two characters short. Rewritten alike, so that a stop still finds the launchers this module started.
_KILL_PATTERN = "-m\\ " + LAUNCH[:-1]
_OUR_KILL_PATTERN = f"-m\\ {MODULE}\\ {NODE_LAUNCHER}"


def node_launcher(cmd: Any) -> Any:
    """The runner's command with DeepSpeed's per-node launcher (`-m deepspeed.launcher.launch`) started through this
    module, which imports it without MLflow, and pdsh's `pkill -f` pattern for it rewritten to match; any other
    command as it is. A list, as the runner passes to Popen, for its local launch and for pdsh's remote command line."""
    if not isinstance(cmd, (list, tuple)) or not all(isinstance(a, str) for a in cmd):
        return cmd
    out = [a.replace(_KILL_PATTERN, _OUR_KILL_PATTERN) for a in cmd]
    at = out.index(LAUNCH) if LAUNCH in out else -1
    if at > 0 and out[at - 1] == "-m":
        out[at:at + 1] = [MODULE, NODE_LAUNCHER]
    return out if out != list(cmd) else cmd


class _Popen(subprocess.Popen):
    """subprocess.Popen for the runner's process: its per-node launcher started through node_launcher. The runner
    logged the command before this rewrote it; the command as started is logged after it, in the same log."""

    def __init__(self, args, *rest, **kwargs):
        started = node_launcher(args)
        if started is not args:
            logging.getLogger("DeepSpeed").info("cmd as started (infra/launch/runner.py): %s", " ".join(started))
        super().__init__(started, *rest, **kwargs)


def exit_now(main: Callable[[], int | str | None]) -> NoReturn:
    """Run `main` and end the process with its exit code, as sys.exit would, but without the interpreter's teardown
    (its streams and logging flushed first). For the runner and the launcher only, which hold nothing to close: the
    ranks, which save and close their work, end as usual."""
    try:
        code = main()
    except SystemExit as exc:  # DeepSpeed's own exits, also from its signal handlers
        code = exc.code
    if isinstance(code, str):
        print(code, file=sys.stderr)
        code = 1
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code or 0)


def _launch_on_this_node() -> int | None:
    launch = import_deepspeed(LAUNCH)
    # Its loop sleeps 1 s between looks at the ranks: the module's own `time`, with a shorter sleep.
    launch.time = SimpleNamespace(**{**{k: getattr(time, k) for k in dir(time) if not k.startswith("_")},
                                     "sleep": lambda s: time.sleep(min(s, POLL_S))})
    return launch.main()


def main() -> int | None:
    if sys.argv[1:2] == [NODE_LAUNCHER]:  # on a node: DeepSpeed's launcher, with its own flags
        del sys.argv[1]
        return _launch_on_this_node()
    runner = import_deepspeed("deepspeed.launcher.runner")
    # The runner's process runs nothing else: its Popen (the local launcher, pdsh, pdsh's kill) is ours.
    runner.subprocess.Popen = _Popen
    return runner.main()


if __name__ == "__main__":
    exit_now(main)
