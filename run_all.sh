#!/usr/bin/env bash
# The one entry point of the study.
#   ./run_all.sh                    set up, build the mini world if missing, run every unfinished cell of
#                                   params/mini.yaml, then the analysis; prints where the report is
#   ./run_all.sh --profile smoke --jobs 2 --cells 'outcome-*'   other profiles and options (see --help)
#   ./run_all.sh setup              only create .venv (if missing) and install the project
#   ./run_all.sh test [pytest args] set up, then run the unit tests and the nbval checks (what CI runs)
#   ./run_all.sh lab [--port N]     set up, then open the study in JupyterLab (notebooks/*.py open as notebooks)
#   ./run_all.sh board [PROFILE]    set up, then TensorBoard on the cells of a profile (default mini), live
#   ./run_all.sh papers [options]   the default study, then every related paper's experiments (PAPERS), in order
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

pin_avx2_kernels() {
  # PyTorch, MKL and oneDNN pick their kernels by instruction set (AVX2, AVX-512) and each rounds its sums
  # differently. The golden notebooks are recorded (goldens) and checked (test) with the AVX2 kernels, all
  # three pinned where the CPU has AVX2. The study does not: it runs the CPU's own, faster kernels (README,
  # Reproducibility).
  if grep -qw avx2 /proc/cpuinfo 2>/dev/null; then
    export ATEN_CPU_CAPABILITY="${ATEN_CPU_CAPABILITY:-avx2}" MKL_CBWR="${MKL_CBWR:-AVX2}" \
           ONEDNN_MAX_CPU_ISA="${ONEDNN_MAX_CPU_ISA:-AVX2}"
  fi
}

run_tests() {
  pin_avx2_kernels
  if ! command -v chromium >/dev/null && ! command -v chromium-browser >/dev/null; then
    echo "[test] the browser test is skipped: Chromium is not installed (Debian: apt-get install chromium chromium-driver)"
  fi
  # Offline by design: nothing in the suite may reach a model hub (datasets reads these at import).
  # --nbval-lax re-runs the golden notebooks under tests/golden and compares the outputs of cells
  # marked NBVAL_CHECK_OUTPUT.
  # Test files or folders given (tests/test_loss.py, tests/golden, ...::test_name) replace the whole suite.
  local targets=(tests) arg
  for arg in "$@"; do [[ -e "${arg%%::*}" ]] && targets=(); done
  HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 "$PY" -m pytest "${targets[@]}" --nbval-lax \
    --nbval-sanitize-with tests/golden/sanitize.cfg "$@"
}

# The experiments of the related papers, each a profile run after the studies it is compared with (the default
# study first): KL-free GRPO, then the token-selection methods on arithmetic and on multiplication. Hours on a
# 2-core CPU, so not part of the default run; finished cells are skipped, so it resumes where it stopped.
PAPERS=(mini mini_klfree mini_sgrpo mini_tspmo mini_mult mini_mult_sgrpo mini_mult_tspmo mini_mult_tspmo_replay)

run_study() {
  # Defaults: the mini profile, one cell per core; options given later override them (argparse: last wins).
  "$PY" -m reward_density.run --profile mini --jobs "$(nproc 2>/dev/null || echo 1)" "$@"
}

case "${1:-}" in
  setup) setup ;;
  test) shift; setup; run_tests "$@" ;;
  goldens) setup; pin_avx2_kernels; exec "$PY" tests/golden/regenerate.py ;;
  lab) shift; setup; exec "$PY" -m reward_density.tools.lab "$@" ;;
  board) board_profile="${2:-mini}"
         if [ -f "$board_profile" ]; then  # a profile file's path: its outputs are under its name
           board_profile="$(basename "$board_profile" .yaml)"
         elif [ ! -f "params/$board_profile.yaml" ]; then  # a typo would serve an empty board, silently
           if [[ "$board_profile" == */* || "$board_profile" == *.yaml ]]; then
             echo "board: no profile file $board_profile" >&2
           else
             echo "board: no profile params/$board_profile.yaml; profiles: $(cd params && ls *.yaml | sed 's/\.yaml$//' | xargs)" >&2
           fi
           exit 2
         fi
         setup; exec "$VENV/bin/tensorboard" --logdir "outputs/$board_profile/cells" ;;
  papers) shift
          for arg in "$@"; do
            if [[ "$arg" == --profile* ]]; then  # the last --profile wins: it would replace every paper's
              echo "papers: runs its own profiles (${PAPERS[*]}); --profile cannot be given" >&2
              exit 2
            fi
          done
          setup
          for profile in "${PAPERS[@]}"; do
            status=0; run_study --profile "$profile" "$@" || status=$?
            if [ "$status" -ne 0 ]; then  # the profiles after it may compare with its results: stop here
              echo "papers: stopped after profile $profile (exit $status); rerun ./run_all.sh papers to resume" \
                   "(finished cells are skipped)" >&2
              exit "$status"
            fi
          done ;;
  -h|--help) echo "usage: ./run_all.sh [setup | test [pytest args] | goldens | lab | board [PROFILE] | papers | [runner options]]" >&2
             setup >/dev/null; "$PY" -m reward_density.run --help ;;
  ""|--*) setup; run_study "$@" ;;
  *) echo "usage: ./run_all.sh [setup | test [pytest args] | goldens | lab | board [PROFILE] | papers | [--profile P] [--cells GLOBS] [--jobs N]]" >&2; exit 2 ;;
esac
