#!/usr/bin/env bash
# Create the Ray venv (default .venv-ray) for the tests marked `ray` (learner_client.RayFleet on a
# local Ray cluster the tests start): torch 2.13.0 (the CPU wheel where pip finds one), rlfleet
# with its test and ray extras (ray 2.60.0), pinned together so pip cannot swap torch, then a
# check that ray and torch import side by side.
#   scripts/ray_venv.sh [VENV]        PYTHON=python3.11 to choose the interpreter
set -euo pipefail
VENV=${1:-.venv-ray}
PYTHON=${PYTHON:-python3}
PINS=(torch==2.13.0 ray==2.60.0)
EXTRAS="test,ray"
STAMP="$VENV/.installed"
if [[ -f "$STAMP" && "$(cat "$STAMP")" == "${PINS[*]} [$EXTRAS]" ]]; then
    exit 0
fi
"$PYTHON" -m venv "$VENV"
PIP=("$VENV/bin/pip" install --quiet)
"${PIP[@]}" --upgrade pip
"${PIP[@]}" torch==2.13.0
"${PIP[@]}" "${PINS[@]}" -e ".[$EXTRAS]"
"$VENV/bin/python" -c "import ray, torch; print('ray', ray.__version__, 'torch', torch.__version__)"
echo "${PINS[*]} [$EXTRAS]" > "$STAMP"
