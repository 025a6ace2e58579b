#!/usr/bin/env bash
# Start an MLflow tracking server (UI + API) on the workspace's SQLite store.
#
# Usage: infra/scripts/start_mlflow_server.sh [extra `mlflow server` options]
#
# It reads the same store the flows write when MLFLOW_TRACKING_URI is unset
# (infra/tracking/store.py: sqlite:///<workdir>/mlflow.db, artifacts in <workdir>/mlartifacts),
# so runs logged by the pipeline show with their artifacts, with or without the server.
#
# Environment (all optional):
#   PORT           port of the UI and API (default 5000): http://127.0.0.1:$PORT
#   LLMFORGE_HOME  workspace folder (default <repo>/work); use the same --workdir as the runs
#   MLFLOW_WORKERS gunicorn/uvicorn workers (default 2)
set -euo pipefail

source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
mkdir -p "$WORK/mlartifacts"

echo "MLflow server: http://127.0.0.1:${PORT:-5000}  (store $WORK/mlflow.db)" >&2
exec "$BIN/mlflow" server \
    --backend-store-uri "sqlite:///$WORK/mlflow.db" \
    --default-artifact-root "$WORK/mlartifacts" \
    --artifacts-destination "$WORK/mlartifacts" \
    --host 127.0.0.1 --port "${PORT:-5000}" \
    --workers "${MLFLOW_WORKERS:-2}" "$@"
