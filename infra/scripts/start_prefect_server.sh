#!/usr/bin/env bash
# Start a local Prefect server (API + UI) on SQLite, bound to loopback.
#
# Usage: infra/scripts/start_prefect_server.sh [extra `prefect server start` options]
#
# Environment (all optional):
#   PORT           port of the API and UI (default 4200): http://127.0.0.1:$PORT; the UI
#                  calls the API on the same port. Give the worker and deploy.sh the same PORT.
#   LLMFORGE_HOME  workspace folder (default <repo>/work)
#   PREFECT_HOME   Prefect's state folder (default $LLMFORGE_HOME/prefect); the SQLite
#                  database is $PREFECT_HOME/prefect.db unless
#                  PREFECT_SERVER_DATABASE_CONNECTION_URL says otherwise
#
# Other clients (`prefect deployment run ...`): export PREFECT_API_URL=http://127.0.0.1:$PORT/api
# (start_prefect_worker.sh and deploy.sh derive it from PORT themselves).
set -euo pipefail

source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
mkdir -p "$PREFECT_HOME"
export PREFECT_SERVER_DATABASE_CONNECTION_URL="${PREFECT_SERVER_DATABASE_CONNECTION_URL:-sqlite+aiosqlite:///$PREFECT_HOME/prefect.db}"
export PREFECT_SERVER_ANALYTICS_ENABLED="${PREFECT_SERVER_ANALYTICS_ENABLED:-false}"
PORT="${PORT:-4200}"
# `--port` alone moves the API but not the UI: the UI asks PREFECT_UI_API_URL, which
# defaults to PREFECT_API_URL or else to PREFECT_SERVER_API_HOST:PREFECT_SERVER_API_PORT.
export PREFECT_SERVER_API_HOST=127.0.0.1 PREFECT_SERVER_API_PORT="$PORT"
export PREFECT_API_URL="http://127.0.0.1:$PORT/api"
export PREFECT_UI_API_URL="$PREFECT_API_URL" PREFECT_UI_URL="http://127.0.0.1:$PORT"

echo "Prefect server: http://127.0.0.1:$PORT  (PREFECT_HOME=$PREFECT_HOME)" >&2
exec "$BIN/prefect" server start --host 127.0.0.1 --port "$PORT" "$@"
