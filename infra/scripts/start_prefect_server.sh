#!/usr/bin/env bash
# Start a local Prefect server (API + UI) on SQLite, bound to loopback.
#
# Usage: infra/scripts/start_prefect_server.sh [extra `prefect server start` options]
#
# Environment (all optional):
#   PORT           port of the API and UI (default 4200): http://127.0.0.1:$PORT
#   LLMFORGE_HOME  workspace folder (default <repo>/work)
#   PREFECT_HOME   Prefect's state folder (default $LLMFORGE_HOME/prefect); the SQLite
#                  database is $PREFECT_HOME/prefect.db unless
#                  PREFECT_SERVER_DATABASE_CONNECTION_URL says otherwise
#
# Then point clients at it: export PREFECT_API_URL=http://127.0.0.1:4200/api
# (start_prefect_worker.sh and deploy.sh do this for you).
set -euo pipefail

source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
mkdir -p "$PREFECT_HOME"
export PREFECT_SERVER_DATABASE_CONNECTION_URL="${PREFECT_SERVER_DATABASE_CONNECTION_URL:-sqlite+aiosqlite:///$PREFECT_HOME/prefect.db}"
export PREFECT_SERVER_ANALYTICS_ENABLED="${PREFECT_SERVER_ANALYTICS_ENABLED:-false}"

echo "Prefect server: http://127.0.0.1:${PORT:-4200}  (PREFECT_HOME=$PREFECT_HOME)" >&2
exec "$BIN/prefect" server start --host 127.0.0.1 --port "${PORT:-4200}" "$@"
