#!/usr/bin/env bash
# Create (or reuse) a virtual environment and install ftorch into it, editable: the README's install route.
#   scripts/setup.sh [EXTRAS]     EXTRAS defaults to "test" (what the test suite needs); e.g. s3,plot,skypilot
# FTORCH_VENV chooses the environment's folder (default .venv in the repository).
# torch is installed first, pinned to the tested set's release (FTORCH_TORCH overrides, e.g.
# FTORCH_TORCH="torch==2.9.1"), unless the venv already has one. On a machine without an NVIDIA GPU it
# comes from PyTorch's CPU index: PyPI's Linux torch is the CUDA build, several GB of CUDA libraries a CPU
# machine cannot use.
# ftorch is installed with the tested set as pip constraints (scripts/constraints-tested.txt: the versions
# of torch, transformers, peft, ... that the suite runs and the shipped GPU lock pins, and the pins that keep
# SkyPilot 0.14's click<8.2 free of conflicts), so a local run uses what was tested, with any extras.
set -euo pipefail
cd "$(dirname "$0")/.."
extras="${1:-test}"
python="${PYTHON:-python3}"
venv="${FTORCH_VENV:-.venv}"
if [ ! -x "$venv/bin/python" ]; then
  "$python" -m venv "$venv"
fi
"$venv/bin/python" -m pip install --quiet --upgrade pip
if ! "$venv/bin/python" -c "import torch" >/dev/null 2>&1; then
  torch_index=()
  if ! command -v nvidia-smi >/dev/null 2>&1; then
    torch_index=(--index-url "${FTORCH_TORCH_INDEX:-https://download.pytorch.org/whl/cpu}")
  fi
  tested_torch=$(grep -m1 '^torch==' scripts/constraints-tested.txt)
  "$venv/bin/python" -m pip install --quiet "${FTORCH_TORCH:-$tested_torch}" "${torch_index[@]}"
fi
"$venv/bin/python" -m pip install --quiet -e ".[${extras}]" -c scripts/constraints-tested.txt
"$venv/bin/python" -c "import torch, transformers, peft, orchestrator, trainer" \
  || { echo "setup failed: the venv cannot import ftorch's dependencies" >&2; exit 1; }
echo "ftorch is set up in $venv ($("$venv/bin/ftorch" --help >/dev/null && echo "$venv/bin/ftorch works"))"
