"""How a run stops when told: Ctrl-C, SIGTERM, or a cancel from the Prefect UI.

    install_stop_handlers(protect)   the CLI: the first SIGINT/SIGTERM stops every child process
                                     and raises RunStopped; a second one kills them and exits
    shielded_prefect_server()        the CLI: Prefect's temporary API server, deaf to the terminal's
                                     Ctrl-C, so it is still up to record that the run crashed
    prefect_server_starting()        the same server started in a thread while the caller imports
                                     the flow; the function it returns waits and gives the pid
    stop_on_cancel()                 a flow: a cancel in Prefect (UI or `prefect flow-run cancel`)
                                     becomes a SIGTERM to the flow's own process

The processes themselves and how they die with the run live in infra/lifecycle/process_tree.py.
"""
from __future__ import annotations

import contextlib
import contextvars
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from infra.lifecycle.process_tree import STOP_GRACE_S, descendants, stop_processes

# prefect is imported inside the functions that use it: a rank, `llmforge --help` and the CLI's quick errors do not
# pay for its import.

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
CANCEL_POLL_S = 2.0
_STOPPING = threading.Event()  # set by the first stop signal: what ends now ends because the run was told to stop


def run_stopping() -> bool:
    """Whether this process was told to stop (a launch that ends now was stopped, it did not fail)."""
    return _STOPPING.is_set()


class RunStopped(KeyboardInterrupt):
    """The run was told to stop by a signal (a KeyboardInterrupt, so Prefect and MLflow record it as such)."""

    def __init__(self, signum: int) -> None:
        self.signum = signum
        super().__init__(f"stopped by {signal.Signals(signum).name}")

    @property
    def exit_code(self) -> int:
        """The shell's convention for death by a signal: 128 + its number."""
        return 128 + self.signum


@dataclass
class StopHandler:
    """The SIGINT/SIGTERM handler of a run's main process; `protect` are pids the first signal spares."""

    protect: set[int] = field(default_factory=set)
    grace_s: float = STOP_GRACE_S
    received: int = 0

    def __call__(self, signum: int, frame: Any) -> None:
        self.received += 1
        _STOPPING.set()
        name = signal.Signals(signum).name
        if self.received > 1:
            print(f"\n{name} again: killing every process of the run now", file=sys.stderr, flush=True)
            for proc in descendants():
                with contextlib.suppress(Exception):
                    proc.kill()
            os._exit(128 + signum)
        children = descendants(exclude=self.protect)
        print(f"\n{name}: stopping the run and its {len(children)} child process(es) "
              f"(SIGKILL after {self.grace_s:.0f} s); send it again to force", file=sys.stderr, flush=True)
        # In a thread: the main thread must unwind now (MLflow and Prefect record the stop on the way).
        threading.Thread(target=stop_processes, args=(children, self.grace_s), name="stop-children",
                         daemon=True).start()
        raise RunStopped(signum)


def install_stop_handlers(protect: Iterable[int] = ()) -> StopHandler:
    """Make SIGINT and SIGTERM stop this process and its children (call from the main thread)."""
    handler = StopHandler(protect=set(protect))
    for sig in STOP_SIGNALS:
        signal.signal(sig, handler)
    return handler


def shielded_prefect_server() -> int | None:
    """Start Prefect's temporary API server now, with SIGINT blocked in it; its pid, or None when a server is configured.

    A terminal's Ctrl-C goes to the whole foreground process group; Prefect's temporary server
    would die with it and the run could not record its own end (the client then retries for
    minutes). A blocked signal stays blocked across exec, and the server still stops on the
    SIGTERM Prefect sends it at exit.
    """
    from prefect.settings import PREFECT_API_URL, PREFECT_SERVER_EPHEMERAL_ENABLED

    if PREFECT_API_URL.value() or not PREFECT_SERVER_EPHEMERAL_ENABLED.value():
        return None
    from prefect.server.api.server import SubprocessASGIServer

    server = SubprocessASGIServer()  # the instance Prefect's own client uses
    old = signal.pthread_sigmask(signal.SIG_SETMASK, {signal.SIGINT})  # SIGTERM open: Prefect stops it so at exit
    try:
        server.start()
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)
    return server.server_process.pid if server.server_process else None


def reap_when_gone(pid: int) -> None:
    """A watcher that ends process `pid` once this process is gone, even SIGKILLed (infra/lifecycle/reaper.py)."""
    from infra.lifecycle import reaper

    subprocess.Popen([sys.executable, reaper.__file__, str(os.getpid()), str(pid)], stdin=subprocess.DEVNULL,
                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, close_fds=True)


def prefect_server_starting() -> Callable[[], int | None]:
    """`shielded_prefect_server()` in a thread: its seconds of start-up overlap the caller's imports (the flow's
    modules, seconds more on a small machine). Call the returned function to wait for it; it gives the
    server's pid, or raises what the start raised.

    The thread inherits the caller's signal mask (the CLI blocks SIGINT and SIGTERM around it: a
    signal that cuts an import short in one of two importing threads can deadlock them); the server,
    forked from that thread, gets SIGINT blocked and nothing else (`shielded_prefect_server`)."""
    outcome: dict[str, Any] = {}

    def start() -> None:
        try:
            outcome["pid"] = shielded_prefect_server()
            if outcome["pid"] is not None:
                reap_when_gone(outcome["pid"])
        except BaseException as exc:  # noqa: BLE001 - handed to the waiting caller
            outcome["error"] = exc

    # A daemon: a run that fails before waiting exits at once; Prefect's atexit stops a started server.
    # The caller's context goes with it (Prefect's settings live in context variables).
    thread = threading.Thread(target=contextvars.copy_context().run, args=(start,), name="prefect-server-start",
                              daemon=True)
    thread.start()

    def wait() -> int | None:
        thread.join()
        if "error" in outcome:
            raise outcome["error"]
        return outcome["pid"]

    return wait


def _cancel_requested(flow_run_id: str) -> bool:
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        state = client.read_flow_run(flow_run_id).state
    return state is not None and state.name in ("Cancelling", "Cancelled")


@contextlib.contextmanager
def stop_on_cancel(poll_s: float = CANCEL_POLL_S) -> Iterator[None]:
    """Inside a flow: poll its state, and SIGTERM this process once someone cancels it in Prefect.

    A flow run started from the CLI has no Prefect worker to enforce a cancel; the SIGTERM takes
    the same path as one from a terminal (Prefect marks the run, the handlers stop the children).
    """
    from prefect.runtime import flow_run

    run_id = flow_run.id
    if not run_id:
        yield
        return
    done = threading.Event()

    def watch() -> None:
        while not done.wait(poll_s):
            try:
                cancelled = _cancel_requested(run_id)
            except Exception:  # noqa: BLE001 - an API hiccup is not a cancel; look again next time
                continue
            if cancelled:
                print(f"flow run {run_id} was cancelled in Prefect: stopping", file=sys.stderr, flush=True)
                os.kill(os.getpid(), signal.SIGTERM)
                return

    thread = threading.Thread(target=watch, name="cancel-watch", daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
