"""The CLI takes the workspace lock before anything starts: a second run on a held workspace says within
2 s that it waits and who holds it (no config loaded, no Prefect server started), and a SIGTERM or
Ctrl-C while it waits ends it at once, with one line and the shell's exit status for the signal."""
from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import time

import pytest

from tests.conftest import CLI, ROOT

pytestmark = pytest.mark.slow


def _holder(work) -> subprocess.Popen:
    code = textwrap.dedent(f"""
        import time
        from infra.workspace.paths import Workspace
        from infra.workspace.lock import workspace_lock
        with workspace_lock(Workspace.locate({str(work)!r})):
            print("held", flush=True)
            time.sleep(120)
    """)
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "held"
    return proc


@pytest.mark.parametrize("sig, status", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_a_run_on_a_held_workspace_says_it_waits_and_stops_at_once(tmp_path, isolated_env, sig, status):
    work = tmp_path / "work"
    holder = _holder(work)
    try:
        started = time.monotonic()
        cli = subprocess.Popen(CLI + ["run", "--workdir", str(work)], cwd=ROOT, env=isolated_env,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        said = cli.stderr.readline()
        to_message = time.monotonic() - started
        assert f"in use by pid {holder.pid}" in said and "waiting for it to finish" in said, said
        assert to_message < 2.0, f"the waiting message came after {to_message:.1f} s"

        cli.send_signal(sig)
        signalled = time.monotonic()
        assert cli.wait(timeout=10) == status
        to_exit = time.monotonic() - signalled
        rest = cli.stderr.read()
        print(f"waiting message after {to_message:.2f} s; {sig.name} -> exit {status} after {to_exit:.2f} s")
        assert to_exit < 2.0
        assert rest.count("\n") == 1 and f"stopped by {sig.name} while waiting for workspace" in rest, rest
        assert "Traceback" not in rest and cli.stdout.read() == ""
        assert not (tmp_path / "prefect-home").exists()  # Prefect never started
    finally:
        holder.kill()
        holder.wait()
