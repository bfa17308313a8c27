#!/usr/bin/env bash
# The one entry point of the study.
#   ./run_all.sh                    set up, build the mini world if missing, run every unfinished cell of
#                                   params/mini.yaml, then the analysis; prints where the report is
#   ./run_all.sh --profile smoke --jobs 2 --cells 'outcome-*'   other profiles and options (see --help)
#   ./run_all.sh setup              only create .venv (if missing) and install the project
#   ./run_all.sh test [pytest args] set up, then run the unit tests and the nbval checks (what CI runs)
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

export TOKENIZERS_PARALLELISM=false

run_tests() {
  # Offline by design: nothing in the suite may reach a model hub (datasets reads these at import).
  # --nbval-lax re-runs the golden notebooks under tests/golden and compares the outputs of cells
  # marked NBVAL_CHECK_OUTPUT.
  HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 "$PY" -m pytest tests --nbval-lax --nbval-sanitize-with tests/golden/sanitize.cfg "$@"
}

run_study() {
  # Defaults: the mini profile, one cell per core; options given later override them (argparse: last wins).
  "$PY" -m reward_density.run --profile mini --jobs "$(nproc 2>/dev/null || echo 1)" "$@"
}

case "${1:-}" in
  setup) setup ;;
  test) shift; setup; run_tests "$@" ;;
  -h|--help) echo "usage: ./run_all.sh [setup | test [pytest args] | [runner options]]" >&2
             setup >/dev/null; "$PY" -m reward_density.run --help ;;
  ""|--*) setup; run_study "$@" ;;
  *) echo "usage: ./run_all.sh [setup | test [pytest args] | [--profile P] [--cells GLOBS] [--jobs N]]" >&2; exit 2 ;;
esac
