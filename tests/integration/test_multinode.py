"""Multi-node pretraining, simulated on this machine: two "nodes" reached by ssh.

A DeepSpeed hostfile names node1 and node2, one rank each; DeepSpeed's pdsh runner starts
the ranks over ssh, exactly as on a cluster, except that both names lead back here: a
private sshd listens on 127.0.0.1 and 127.0.0.2 and an ssh client config maps node1 and
node2 onto them (handed to pdsh through PDSH_SSH_ARGS_APPEND). The loss curve of ZeRO-2 on
the two nodes must match one node running the same two ranks.

sshd and pdsh come from Debian's packages: the fixture installs them with apt-get when they
are missing and this runs as root (as in CI); elsewhere the test is skipped, saying why.
"""
from __future__ import annotations

import getpass
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from infra.launch.launcher import free_port
from tests.conftest import stop_process
from tests.helpers.references import zero2_config, zero2_two_rank  # noqa: F401 - the one-node run

pytestmark = pytest.mark.slow

SSHD = Path("/usr/sbin/sshd")
PACKAGES = ["pdsh", "openssh-server", "openssh-client"]


def _tools_missing() -> list[str]:
    return [name for name, ok in (("pdsh", shutil.which("pdsh")), ("sshd", SSHD.is_file()),
                                  ("ssh", shutil.which("ssh")), ("ssh-keygen", shutil.which("ssh-keygen"))) if not ok]


def _install_tools() -> list[str]:
    """Install pdsh and OpenSSH from Debian's packages if missing (root only); what is still missing."""
    if not _tools_missing() or os.geteuid() != 0 or not shutil.which("apt-get"):
        return _tools_missing()
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    install = ["apt-get", "install", "-y", "-q", "--no-install-recommends", *PACKAGES]
    if subprocess.run(install, env=env, capture_output=True, timeout=900).returncode != 0:
        subprocess.run(["apt-get", "update", "-q"], env=env, capture_output=True, timeout=900)
        subprocess.run(install, env=env, capture_output=True, timeout=900)
    return _tools_missing()


@pytest.fixture(scope="module")
def loopback_nodes(tmp_path_factory):
    """An sshd on 127.0.0.1 and 127.0.0.2; yields the ssh client config that names them node1 and node2."""
    missing = _install_tools()
    if missing:
        pytest.skip(f"{', '.join(missing)} not installed and cannot be installed here "
                    f"(run as root with apt-get, or: apt-get install {' '.join(PACKAGES)})")
    d = tmp_path_factory.mktemp("ssh")
    for key in ("host_key", "client_key"):
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(d / key)], check=True)
    shutil.copyfile(d / "client_key.pub", d / "authorized_keys")
    (d / "authorized_keys").chmod(0o600)
    port = free_port()
    (d / "sshd_config").write_text(
        f"Port {port}\nListenAddress 127.0.0.1\nListenAddress 127.0.0.2\nHostKey {d}/host_key\n"
        f"AuthorizedKeysFile {d}/authorized_keys\nPubkeyAuthentication yes\nPasswordAuthentication no\n"
        "KbdInteractiveAuthentication no\nPermitRootLogin prohibit-password\nStrictModes no\nUsePAM no\n"
        f"PidFile {d}/sshd.pid\n"
    )
    (d / "ssh_config").write_text(
        "Host node1\n  HostName 127.0.0.1\nHost node2\n  HostName 127.0.0.2\n"
        f"Host node1 node2\n  Port {port}\n  User {getpass.getuser()}\n  IdentityFile {d}/client_key\n"
        "  IdentitiesOnly yes\n  StrictHostKeyChecking no\n  UserKnownHostsFile /dev/null\n  LogLevel ERROR\n"
        "  BatchMode yes\n"
    )
    Path("/run/sshd").mkdir(parents=True, exist_ok=True)  # sshd's privilege-separation folder
    sshd = subprocess.Popen([str(SSHD), "-D", "-e", "-f", str(d / "sshd_config")],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 30
        while True:
            probe = subprocess.run(["ssh", "-F", str(d / "ssh_config"), "node2", "true"], capture_output=True, text=True)
            if probe.returncode == 0:
                break
            if sshd.poll() is not None or time.monotonic() > deadline:
                sshd.kill()
                out = sshd.communicate()[0]
                pytest.fail(f"sshd on port {port} did not accept node2: {probe.stderr.strip()}\n{out}")
            time.sleep(0.3)
        yield d / "ssh_config"
    finally:
        stop_process(sshd, timeout=10)


def _loss_curve(ws: Path, run_id: str) -> list[tuple[int, float]]:
    import mlflow

    from infra.tracking.store import tracking_uri
    from infra.workspace.paths import Workspace

    client = mlflow.tracking.MlflowClient(tracking_uri(Workspace(ws)))
    return [(m.step, m.value) for m in client.get_metric_history(run_id, "loss")]


def test_two_node_zero2_pretraining_matches_one_node(tmp_path, zero2_two_rank, loopback_nodes, monkeypatch):  # noqa: F811
    """The two-node run against the shared one-node run (tests/helpers/references.py): the same config, apart
    from where the two ranks run, on the same input files."""
    from tasks.training.pretrain.stage import Pretrain
    from tests.conftest import launch_into

    one_node = zero2_two_rank.result

    hostfile = tmp_path / "hostfile"
    hostfile.write_text("node1 slots=1\nnode2 slots=1\n")
    monkeypatch.setenv("PDSH_SSH_ARGS_APPEND", f"-F {loopback_nodes}")
    lines: list[str] = []
    cfg = zero2_config(num_procs=1, hostfile=hostfile, launcher_args=["--master_addr", "127.0.0.1", "--no_ssh_check"])
    assert cfg.model_copy(update={"launch": zero2_two_rank.cfg.launch}) == zero2_two_rank.cfg
    two_nodes = launch_into(Pretrain(cfg), tmp_path / "two-nodes", tmp_path / "ws-two", lines.append,
                            **zero2_two_rank.inputs)

    assert two_nodes.world_size == 2 == one_node.world_size
    assert any(line.startswith("node1: ") for line in lines)  # the ranks ran through pdsh, one node each
    assert any(line.startswith("node2: ") for line in lines)
    launched = next(line for line in lines if line.startswith("launching: "))
    assert "--hostfile" in launched and "--master_addr 127.0.0.1" in launched
    one, two = _loss_curve(zero2_two_rank.ws, one_node.mlflow_run_id), _loss_curve(tmp_path / "ws-two", two_nodes.mlflow_run_id)
    assert [s for s, _ in two] == [s for s, _ in one] == list(range(1, 7))
    assert [v for _, v in two] == pytest.approx([v for _, v in one], rel=1e-4)
    assert two_nodes.final_val_loss == pytest.approx(one_node.final_val_loss, rel=1e-4)
