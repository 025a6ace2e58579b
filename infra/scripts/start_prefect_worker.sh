#!/usr/bin/env bash
# Create the local `process` work pool if it is missing, then run a worker on it.
# The worker runs each flow run as a subprocess from this repository's checkout.
#
# Usage: infra/scripts/start_prefect_worker.sh [extra `prefect worker start` options]
#
# Environment (all optional):
#   POOL             work pool name (default llmforge-local, as in infra/prefect.yaml)
#   PORT             the server's port, as given to start_prefect_server.sh (default 4200);
#                    the API is http://127.0.0.1:$PORT/api (PREFECT_API_URL, used only
#                    without PORT, points at another host)
#   LLMFORGE_ROOT    the checkout flow runs execute in (default: this repository); the
#                    deployments' pull step reads it at run time
#   LLMFORGE_HOME    workspace folder (default <repo>/work), exported to flow runs: a
#                    deployment without a `workdir` parameter writes there; PREFECT_HOME
#                    defaults to $LLMFORGE_HOME/prefect like the server's
#   DS_ACCELERATOR   passed to flow runs (default cpu, as in the Makefile)
#   MLFLOW_TRACKING_URI  unset: each run logs to sqlite:///<workdir>/mlflow.db;
#                    set it (e.g. http://127.0.0.1:5000) to log to an MLflow server
set -euo pipefail

source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
POOL="${POOL:-llmforge-local}"
prefect_api_from_port
require_prefect_api
export LLMFORGE_ROOT="${LLMFORGE_ROOT:-$ROOT}"
export LLMFORGE_HOME="$WORK"
export DS_ACCELERATOR="${DS_ACCELERATOR:-cpu}"
export PYTHONUNBUFFERED=1

if ! "$BIN/prefect" work-pool inspect "$POOL" >/dev/null 2>&1; then
    # The server answered above, so the pool is missing.
    "$BIN/prefect" work-pool create "$POOL" --type process
fi

echo "Worker on pool '$POOL' -> $PREFECT_API_URL (flow runs in $LLMFORGE_ROOT, workspace $LLMFORGE_HOME)" >&2
exec "$BIN/prefect" worker start --pool "$POOL" --type process "$@"
