"""Ray for the data flow (`data.executor=ray`): Prefect's Ray task runner, and what a cluster must share.

    ray_task_runner(None)              a local Ray with this machine's cores, shut down when the flow ends
    ray_task_runner("auto")            the cluster this machine belongs to (`ray start` ran here)
    ray_task_runner("ray://head:10001")  a remote cluster through Ray Client (or "host:6379" as a node)
    prefect_api_for_workers()          Ray workers report to this run's Prefect API, even a temporary one
    check_cluster(workspace)           every node sees the workspace and the code, and can reach the API

Every stage writes files under the workspace and Prefect keeps task results there too, so on a
cluster of several machines the workspace (and the checkout, which workers import from) must be
one shared filesystem mounted at the same path on every node: `check_cluster` fails naming the
nodes that do not see it.
"""
from __future__ import annotations

import contextlib
import ipaddress
import os
import socket
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from infra.lifecycle.process_tree import usable_cores

# ray and prefect_ray are imported only with data.executor=ray: the optional extra `pip install -e '.[ray]'`.
# prefect is imported inside the functions that use it: a rank, `llmforge --help` and the CLI's quick errors do not
# pay for its import.

CHECKOUT = Path(__file__).resolve().parents[2]
_LOOPBACK = ("127.0.0.1", "localhost", "::1", "0.0.0.0")


class RayClusterError(RuntimeError):
    """The Ray cluster cannot run the data flow as it is set up (the message says what to change)."""


def ray_task_runner(address: str | None) -> Any:
    """A `prefect_ray.RayTaskRunner` for `address` (see the module docstring); workers import the project from this checkout.

    A local Ray (address None) is started fresh even where RAY_ADDRESS is set, without its
    dashboard, and the runner shuts it down (its raylet, GCS and workers) when the flow ends,
    failed or interrupted included.
    """
    try:
        from prefect_ray import RayTaskRunner
    except ImportError as exc:
        raise RayClusterError("data.executor=ray needs Ray and prefect-ray: pip install -e '.[ray]'") from exc
    path = os.pathsep.join(p for p in (str(CHECKOUT), os.environ.get("PYTHONPATH", "")) if p)
    init: dict[str, Any] = {"runtime_env": {"env_vars": {"PYTHONPATH": path}}, "log_to_driver": True}
    if address is None:
        init |= {"address": "local", "num_cpus": len(usable_cores()), "include_dashboard": False}
        return RayTaskRunner(init_kwargs=init)
    if address == "auto":
        init["address"] = "auto"
        return RayTaskRunner(init_kwargs=init)
    return RayTaskRunner(address=address, init_kwargs=init)


def on_ray_task_runner() -> bool:
    """Whether the running flow submits its tasks to Ray."""
    from prefect.context import FlowRunContext

    ctx = FlowRunContext.get()
    runner = getattr(ctx, "task_runner", None)
    return type(runner).__name__ == "RayTaskRunner"


@contextlib.contextmanager
def prefect_api_for_workers() -> Iterator[str | None]:
    """Inside a flow: tasks submitted here carry an explicit Prefect API URL; yields it (None: none known).

    With no PREFECT_API_URL, this process talks to a temporary server it started; a Ray worker
    given no URL would start a server of its own. The URL travels in the settings Prefect
    serialises with each task.
    """
    from prefect.settings import PREFECT_API_URL, temporary_settings

    url = PREFECT_API_URL.value()
    if url:
        yield url
        return
    from prefect.server.api.server import SubprocessASGIServer

    server = SubprocessASGIServer()  # the instance Prefect's own client started
    if not server.running:
        yield None
        return
    with temporary_settings(updates={PREFECT_API_URL: server.api_url}):
        yield server.api_url


def _sees(marker: str, token: str) -> dict[str, Any]:
    """On one node: can it read the driver's marker file, and import the project?"""
    import ray

    try:
        seen = Path(marker).read_text() == token
    except OSError:
        seen = False
    try:
        import infra.workspace.paths  # noqa: F401  (the project's code at the same path)
        code = True
    except ImportError:
        code = False
    return {"node": ray.get_runtime_context().get_node_id(), "host": socket.gethostname(), "sees": seen, "code": code}


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def check_cluster(workspace: Path, api_url: str | None, timeout_s: float = 120.0) -> list[str]:
    """Fail unless every alive node sees `workspace` (a marker file written here) and can reach `api_url`; the node ids.

    Call with Ray connected (inside a flow on `ray_task_runner`). One small task per node,
    pinned to it.
    """
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    nodes = [n for n in ray.nodes() if n.get("Alive")]
    # Nodes on loopback addresses (127.x, as in a one-machine test cluster) are all this machine.
    hosts = {"this machine" if _is_loopback(a) else a for a in (n["NodeManagerAddress"] for n in nodes)}
    if len(hosts) > 1 and api_url and (urlparse(api_url).hostname or "") in _LOOPBACK:
        raise RayClusterError(
            f"the Ray cluster spans {len(hosts)} machines ({', '.join(sorted(hosts))}) but the Prefect API is {api_url}, "
            "which only this machine can reach; start a Prefect server the nodes can reach and set PREFECT_API_URL to it")
    marker = Path(workspace) / f".ray-check-{uuid.uuid4().hex}"
    token = uuid.uuid4().hex
    marker.write_text(token)
    try:
        probe = ray.remote(num_cpus=0, max_retries=0)(_sees)
        refs = [probe.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False))
                .remote(str(marker), token) for n in nodes]
        try:
            answers = ray.get(refs, timeout=timeout_s)
        except ray.exceptions.GetTimeoutError as exc:
            raise RayClusterError(f"{len(nodes)} Ray node(s) did not answer the workspace check within {timeout_s:.0f} s; "
                                  "see `ray status`") from exc
        except ray.exceptions.RayError as exc:  # the check itself could not be loaded: no project code there
            raise RayClusterError(
                f"a Ray node could not run the workspace check ({type(exc).__name__}): the checkout {CHECKOUT} and this "
                f"Python environment must be at the same paths on every node; first lines: {str(exc)[:300]}") from exc
    finally:
        marker.unlink(missing_ok=True)
    blind = [f"{a['host']} (node {a['node'][:12]})" for a in answers if not a["sees"]]
    if blind:
        raise RayClusterError(
            f"Ray node(s) {', '.join(blind)} cannot read the workspace {workspace}: on a cluster the workspace must be one "
            "shared filesystem (NFS, a mounted bucket, ...) at the same path on every node; set --workdir/LLMFORGE_HOME to it")
    no_code = [f"{a['host']} (node {a['node'][:12]})" for a in answers if not a["code"]]
    if no_code:
        raise RayClusterError(
            f"Ray node(s) {', '.join(no_code)} cannot import the project from {CHECKOUT}: the checkout must be at the same "
            "path on every node (or install it there: pip install -e .)")
    return [a["node"] for a in answers]
