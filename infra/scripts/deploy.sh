#!/usr/bin/env bash
# Register (or update) the deployments of infra/prefect.yaml on the Prefect server.
#
# Usage: infra/scripts/deploy.sh [deployment name ...]   (default: all of them)
#   e.g. infra/scripts/deploy.sh data-tiny
#
# Environment (all optional):
#   PORT             the server's port, as given to start_prefect_server.sh (default 4200);
#                    PREFECT_API_URL, used only without PORT, points at another host
#   LLMFORGE_HOME    workspace folder (default <repo>/work); PREFECT_HOME defaults to
#                    $LLMFORGE_HOME/prefect like the server's
# The work pool must exist: start_prefect_worker.sh creates it.
set -euo pipefail

source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
prefect_api_from_port
require_prefect_api
# `prefect deploy` would bake an exported LLMFORGE_ROOT into the pull step; left unset,
# the placeholder stays and each worker fills in its own checkout at run time.
unset LLMFORGE_ROOT

if [[ $# -eq 0 ]]; then
    exec "$BIN/prefect" --no-prompt deploy --all --prefect-file infra/prefect.yaml
fi
names=()
for n in "$@"; do names+=(--name "$n"); done
exec "$BIN/prefect" --no-prompt deploy --prefect-file infra/prefect.yaml "${names[@]}"
