# The preamble every infra/scripts/*.sh shares; sourced, not run.
#
# Prints the calling script's header comment on -h/--help, then sets:
#   ROOT  the repository root (and cd's there: relative LLMFORGE_HOME / PREFECT_HOME and
#         the entrypoints in infra/prefect.yaml mean the same as for the flows)
#   BIN   the venv's bin folder (LLMFORGE_VENV, default <repo>/.venv)
#   WORK  the workspace as an absolute path (LLMFORGE_HOME, default <repo>/work), created;
#         absolute because MLflow stores artifact locations as given
#   PREFECT_HOME  exported, default $WORK/prefect
if [[ "${1:-}" == "-h" || "${1:-}" == "--help" ]]; then
    sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'
    exit 0
fi

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
BIN="${LLMFORGE_VENV:-$ROOT/.venv}/bin"
cd "$ROOT"
WORK="$(mkdir -p "${LLMFORGE_HOME:-$ROOT/work}" && cd "${LLMFORGE_HOME:-$ROOT/work}" && pwd)"
export PREFECT_HOME="${PREFECT_HOME:-$WORK/prefect}"

# Prefect scripts call this: PORT (default 4200) is the server's port for the server,
# the worker and deploy.sh alike. PREFECT_API_URL is derived from it; one given by
# hand (a remote server) is kept only when PORT is not set.
prefect_api_from_port() {
    if [[ -n "${PORT:-}" || -z "${PREFECT_API_URL:-}" ]]; then
        export PREFECT_API_URL="http://127.0.0.1:${PORT:-4200}/api"
    fi
}

# One line naming the URL and what to do, instead of a client's long connection traceback.
require_prefect_api() {
    if ! "$BIN/python" - "$PREFECT_API_URL/health" <<'PY'
import sys, httpx
try:
    sys.exit(0 if httpx.get(sys.argv[1], timeout=5).status_code == 200 else 1)
except httpx.HTTPError:
    sys.exit(1)
PY
    then
        echo "error: no Prefect server answers at $PREFECT_API_URL/health;" \
             "start one with \`PORT=${PORT:-4200} infra/scripts/start_prefect_server.sh\`" \
             "or set PORT to the port of the one that runs" >&2
        exit 1
    fi
}
