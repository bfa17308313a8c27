#!/usr/bin/env bash
# The one entry point of the study.
#   ./run_all.sh          set up .venv (if missing) and install the project
#   ./run_all.sh setup    the same, explicitly
#   ./run_all.sh test     set up, then run the test suite (what CI runs)
set -euo pipefail
cd "$(dirname "$0")"

VENV="${VENV:-.venv}"
PY="$VENV/bin/python"
STAMP="$VENV/.reward-density-installed"

setup() {
  if [ ! -x "$PY" ]; then
    local python
    python="$(command -v python3.11 || command -v python3)"
    echo "[setup] creating $VENV with $("$python" --version)"
    "$python" -m venv "$VENV"
    "$PY" -m pip install --quiet --upgrade pip
  fi
  # Pin the CPU build only where no torch exists: a GPU box keeps the CUDA build it already has.
  if ! "$PY" -c "import torch" 2>/dev/null; then
    echo "[setup] installing torch==2.13.0"
    "$PY" -m pip install --quiet torch==2.13.0
  fi
  if [ ! -f "$STAMP" ] || [ pyproject.toml -nt "$STAMP" ]; then
    echo "[setup] installing the project and its dependencies"
    "$PY" -m pip install --quiet -e ".[notebooks,test]"
    touch "$STAMP"
  fi
}

run_tests() {
  # Offline by design: nothing in the suite may reach a model hub.
  HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false \
    "$PY" -m pytest tests "$@"
}

command="${1:-setup}"
case "$command" in
  setup) setup ;;
  test) shift; setup; run_tests "$@" ;;
  *) echo "usage: ./run_all.sh [setup|test [pytest args...]]" >&2; exit 2 ;;
esac
