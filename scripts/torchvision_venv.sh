#!/usr/bin/env bash
# Create the torchvision venv (default .venv-tv) for the tests that need TorchRL's
# torchvision-backed transforms (`Resize`) and the scripts that use it (dqn_with_rnn.py, and
# dqn_atari.py, which also needs Atari: ale-py, whose wheel holds the ROMs):
# torchvision has no build that imports beside the CPU torch 2.13.0 wheel the project pins,
# so this venv takes torch 2.14.1 with its matching torchvision 0.29.1 (a CUDA build that
# runs on the CPU), then rlfleet with its test and train extras (the tutorials use tqdm), and checks that torchvision's ops load.
#   scripts/torchvision_venv.sh [VENV]        PYTHON=python3.11 to choose the interpreter
set -euo pipefail
VENV=${1:-.venv-tv}
PYTHON=${PYTHON:-python3}
PINS=(torch==2.14.1 torchvision==0.29.1 ale-py==0.12.1)
STAMP="$VENV/.installed"
if [[ -f "$STAMP" && "$(cat "$STAMP")" == "${PINS[*]}" ]]; then
    exit 0
fi
"$PYTHON" -m venv "$VENV"
PIP=("$VENV/bin/pip" install --quiet)
"${PIP[@]}" --upgrade pip
"${PIP[@]}" "${PINS[@]}"
"${PIP[@]}" "${PINS[@]}" -e '.[test,train]'
"$VENV/bin/python" -c "import torch, torchvision.ops; print('torch', torch.__version__, 'torchvision', torchvision.__version__)"
echo "${PINS[*]}" > "$STAMP"
