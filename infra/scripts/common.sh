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
